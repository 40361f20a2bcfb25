// nightshift: times in the reader's own zone (the server writes UTC; the
// UTC time stays in the tooltip), and the timeline's live tail.
function nsLocalTimes(root) {
  (root || document).querySelectorAll('time[datetime]').forEach(function (t) {
    var d = new Date(t.getAttribute('datetime'));
    if (isNaN(d.getTime())) return;
    if (!t.title) t.title = t.textContent + ' (UTC)';
    t.textContent = d.toLocaleString(undefined, {
      year: 'numeric', month: 'short', day: 'numeric',
      hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short'
    });
  });
}
nsLocalTimes(document);

// The timeline's live tail. New and finished runs appear
// without a reload: every run event refreshes the table body from the server
// (the same filters, rendered and escaped there).
(function () {
  var table = document.querySelector('table.runs[data-live="1"]');
  var live = document.getElementById('live');
  if (!table || !window.EventSource) {
    if (live) live.remove();
    return;
  }
  var es = new EventSource('/api/v1/events/stream');
  var busy = false;
  function refresh() {
    if (busy) return;
    busy = true;
    setTimeout(function () {
      var url = new URL(window.location.href);
      url.searchParams.set('partial', '1');
      fetch(url, { credentials: 'same-origin' })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html !== null) {
            var body = document.getElementById('runs');
            body.innerHTML = html;
            nsLocalTimes(body);
          }
          busy = false;
        })
        .catch(function () { busy = false; });
    }, 150);
  }
  ['run_queued', 'run_started', 'run_finished', 'approved', 'rejected', 'action_result'].forEach(function (k) {
    es.addEventListener(k, refresh);
  });
  es.onopen = function () { if (live) live.classList.add('on'); };
  es.onerror = function () { if (live) live.classList.remove('on'); };
})();

// A control that changes a node or a run asks first: a form with
// data-confirm submits only if the person says yes.
document.querySelectorAll('form[data-confirm]').forEach(function (f) {
  f.addEventListener('submit', function (e) {
    if (!window.confirm(f.getAttribute('data-confirm'))) e.preventDefault();
  });
});
