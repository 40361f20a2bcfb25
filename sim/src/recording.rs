//! Recordings read as streams, for backtests of any length in flat memory.
//!
//! - [`SeriesTable`]: every series seen is interned once — its name and
//!   labels become an id, mapped once to the replay node, GPU and metric
//!   (the live sources' DCGM mapping). A step is then `(ts, [(id, value)])`
//!   and turning it into the engine's samples allocates per step, never per
//!   sample (node names are shared `Arc<str>`).
//! - [`OpenMetricsFile`]: an OpenMetrics export read twice, never held. The
//!   first pass checks every line (file:line on the first bad one), interns
//!   the series, collects the hosts and the timestamps, and notes where the
//!   file's *runs* start — stretches whose timestamps do not go back (one
//!   per series in a `promtool tsdb dump-openmetrics` export, one per field
//!   in a time-major one, one in a time-sorted file). The second pass
//!   merges the runs by time with one small positioned reader each, so
//!   what is held is the table, the cursors and one step.
//!
//! Within a timestamp, samples come in file order (the merge takes the
//! lowest run first and drains it while the time holds), as the in-memory
//! reader gave them: the replay sees the same order either way.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nightshift_engine::embed::{DcgmField, PromSample, dcgm_metric, host_of};
use nightshift_engine::embed::{MetricId, ids};

/// Why a recording cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{what}:{line}: expected `name{{labels}} value timestamp` with the timestamp in seconds, found {found:?}")]
    Line { what: String, line: usize, found: String },
    #[error("{0}: no samples of the fields nightshift reads (DCGM_FI_DEV_GPU_TEMP, …) in it")]
    Empty(String),
    #[error("{what}: {message}")]
    Response { what: String, message: String },
    #[error("{what}:{line}: {message}")]
    Label { what: String, line: usize, message: String },
}

/// The simulator profile closest to a GPU model name.
pub fn profile_for(model: &str) -> &'static str {
    let m = model.to_ascii_uppercase();
    if m.contains("B200") {
        "b200"
    } else if m.contains("MI300") {
        "mi300x"
    } else if m.contains("A100") {
        "a100-sxm"
    } else if m.contains("V100") {
        "v100-sxm"
    } else if m.contains("RTX 6000") || m.contains("RTX6000") {
        "rtx6000-ada"
    } else {
        "h100-sxm"
    }
}

/// A sample as the engine takes it: `(node, gpu, metric, ts_ms, value)`.
pub type Mapped = (Arc<str>, Option<u32>, MetricId, i64, f64);

/// One step of a recording: its time and `(series id, value)` pairs.
pub type Step = (i64, Vec<(u32, f64)>);

/// What one series is, once.
#[derive(Debug, Clone)]
struct SeriesInfo {
    node: Arc<str>,
    /// The node's index in the table (framebuffer pairs are keyed by it).
    node_idx: u32,
    gpu: Option<u32>,
    field: DcgmField,
}

/// Every series of a recording, interned.
#[derive(Debug, Default)]
pub struct SeriesTable {
    ids: HashMap<String, u32>,
    series: Vec<Option<SeriesInfo>>,
    nodes: HashMap<String, u32>,
    node_names: Vec<Arc<str>>,
    hosts: BTreeMap<String, (u32, String)>,
}

impl SeriesTable {
    pub fn new() -> SeriesTable {
        SeriesTable::default()
    }

    /// Series interned.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Every host seen, with its GPU count and a simulator profile for its
    /// model (the replay node's envelope), as the in-memory reader gives them.
    pub fn hosts(&self) -> BTreeMap<String, (u32, String)> {
        self.hosts.clone()
    }

    /// The id of the series written `key` (`name{labels}` as in the file),
    /// if it was interned.
    pub fn id_of(&self, key: &str) -> Option<u32> {
        self.ids.get(key).copied()
    }

    /// Intern a series by its key and parsed name and labels. A host label
    /// that is no node name is refused (it would become a replay node).
    pub fn intern(&mut self, key: &str, name: &str, labels: &BTreeMap<String, String>) -> Result<u32, String> {
        if let Some(id) = self.ids.get(key) {
            return Ok(*id);
        }
        let host = host_of(labels);
        if let Some(h) = &host {
            nightshift_proto::names::check_node_name(h)?;
        }
        let info = match (dcgm_metric(name), host) {
            (Some(field), Some(h)) => {
                let gpu = labels.get("gpu").and_then(|g| g.parse::<u32>().ok());
                let e = self.hosts.entry(h.clone()).or_insert((1, "h100-sxm".into()));
                if let Some(g) = gpu {
                    e.0 = e.0.max(g.saturating_add(1)).min(16);
                }
                if let Some(m) = labels.get("modelName").or_else(|| labels.get("model_name")) {
                    e.1 = profile_for(m).into();
                }
                let node_idx = match self.nodes.get(&h) {
                    Some(i) => *i,
                    None => {
                        let i = self.node_names.len() as u32;
                        self.nodes.insert(h.clone(), i);
                        self.node_names.push(Arc::from(h.as_str()));
                        i
                    }
                };
                let gpu_scoped = match field {
                    DcgmField::Metric(m) | DcgmField::Ratio(m) => nightshift_engine::embed::metric(m).gpu_scoped,
                    DcgmField::LastProgress => false,
                    DcgmField::FbUsed | DcgmField::FbFree | DcgmField::ClockReasons => true,
                };
                // A GPU series without a gpu label cannot be placed (the
                // replay nodes' UUIDs are not the recorded ones).
                if gpu_scoped && gpu.is_none() {
                    None
                } else {
                    Some(SeriesInfo {
                        node: self.node_names[node_idx as usize].clone(),
                        node_idx,
                        gpu: if gpu_scoped { gpu } else { None },
                        field,
                    })
                }
            }
            _ => None,
        };
        let id = self.series.len() as u32;
        self.series.push(info);
        self.ids.insert(key.to_string(), id);
        Ok(id)
    }

    /// Whether a series is one the replay reads.
    pub fn is_read(&self, id: u32) -> bool {
        self.series.get(id as usize).is_some_and(Option::is_some)
    }

    /// A step's samples as the engine takes them, appended to `out`: in
    /// order, then each GPU's memory share from its framebuffer pair (as
    /// the live mapping does). Returns the samples of the step the replay
    /// reads.
    pub fn map_step(&self, ts: i64, samples: &[(u32, f64)], out: &mut Vec<Mapped>) -> usize {
        let mut fb: BTreeMap<(u32, u32), (Option<f64>, Option<f64>)> = BTreeMap::new();
        let mut read = 0;
        let first = out.len();
        for (id, v) in samples {
            let Some(Some(s)) = self.series.get(*id as usize) else { continue };
            if !v.is_finite() {
                continue;
            }
            read += 1;
            match s.field {
                DcgmField::Metric(m) => out.push((s.node.clone(), s.gpu, m, ts, *v)),
                DcgmField::Ratio(m) => out.push((s.node.clone(), s.gpu, m, ts, *v * 100.0)),
                DcgmField::ClockReasons => {
                    let hot = *v >= 0.0 && nightshift_engine::embed::thermal_slowdown(*v as u64);
                    out.push((s.node.clone(), s.gpu, ids::THROTTLED, ts, hot as u8 as f64))
                }
                DcgmField::LastProgress => {
                    out.push((s.node.clone(), None, ids::JOB_STALLED, ts, (ts as f64 / 1000.0 - v).max(0.0).floor()))
                }
                DcgmField::FbUsed => fb.entry((s.node_idx, s.gpu.unwrap_or(0))).or_default().0 = Some(*v),
                DcgmField::FbFree => fb.entry((s.node_idx, s.gpu.unwrap_or(0))).or_default().1 = Some(*v),
            }
        }
        let mut pairs: Vec<_> = fb.into_iter().collect();
        // By node name, then GPU: the live mapping's order.
        pairs.sort_by(|a, b| {
            self.node_names[a.0.0 as usize].cmp(&self.node_names[b.0.0 as usize]).then(a.0.1.cmp(&b.0.1))
        });
        for ((node, gpu), (used, free)) in pairs {
            if let (Some(u), Some(f)) = (used, free)
                && u + f > 0.0
            {
                out.push((self.node_names[node as usize].clone(), Some(gpu), ids::MEM_USED, ts, u / (u + f) * 100.0));
            }
        }
        nightshift_engine::embed::add_memory_need(out, first);
        read
    }

    /// Steps of samples as a source gives them (`PromSample`s grouped by
    /// time) as interned steps.
    pub fn intern_step(&mut self, batch: &[PromSample]) -> Result<Vec<(u32, f64)>, String> {
        let mut out = Vec::with_capacity(batch.len());
        let mut key = String::new();
        for s in batch {
            key.clear();
            key.push_str(&s.name);
            key.push('{');
            for (i, (k, v)) in s.labels.iter().enumerate() {
                if i > 0 {
                    key.push(',');
                }
                key.push_str(k);
                key.push_str("=\"");
                key.push_str(v);
                key.push('"');
            }
            key.push('}');
            let id = self.intern(&key.clone(), &s.name, &s.labels)?;
            out.push((id, s.value));
        }
        Ok(out)
    }
}

/// `head value timestamp` → (head, value, ts_ms), or `None`.
fn split_line(l: &str) -> Option<(&str, f64, i64)> {
    let (rest, ts) = l.rsplit_once(' ')?;
    let (head, value) = rest.rsplit_once(' ')?;
    let ts: f64 = ts.parse().ok()?;
    if !ts.is_finite() {
        return None;
    }
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((head.trim_end(), value, (ts * 1000.0).round() as i64))
}

/// An OpenMetrics export, checked and indexed by a first pass.
#[derive(Debug)]
pub struct OpenMetricsFile {
    path: PathBuf,
    /// Byte offsets where runs start, and the file's length.
    runs: Vec<u64>,
    len: u64,
    pub table: SeriesTable,
    /// Timestamps with a sample the replay reads, in order.
    steps: usize,
    pub first_ms: i64,
    pub last_ms: i64,
    /// Samples of series the replay reads.
    pub samples: u64,
}

impl OpenMetricsFile {
    /// The first pass: every line checked (timestamps in seconds; `#`
    /// lines and `# EOF` skipped; a sample without a timestamp refused).
    pub fn scan(path: &Path) -> Result<OpenMetricsFile, RecordingError> {
        let what = path.display().to_string();
        let file = File::open(path)
            .map_err(|e| RecordingError::Response { what: what.clone(), message: format!("cannot read it: {e}") })?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut r = BufReader::with_capacity(1 << 20, file);
        let mut table = SeriesTable::new();
        let mut runs = Vec::new();
        let mut times: BTreeSet<i64> = BTreeSet::new();
        let (mut first, mut last) = (i64::MAX, i64::MIN);
        let mut samples = 0u64;
        let mut prev_ts = i64::MAX;
        let mut line = String::new();
        let (mut offset, mut n) = (0u64, 0usize);
        loop {
            line.clear();
            let got = r.read_line(&mut line).map_err(|e| RecordingError::Response {
                what: what.clone(),
                message: format!("line {}: cannot read it: {e}", n + 1),
            })?;
            if got == 0 {
                break;
            }
            let start = offset;
            offset += got as u64;
            n += 1;
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let bad = || RecordingError::Line { what: what.clone(), line: n, found: l.chars().take(120).collect() };
            let (head, value, ts) = split_line(l).ok_or_else(bad)?;
            let id = match table.id_of(head) {
                Some(id) => id,
                None => {
                    let (parsed, badn) = nightshift_engine::embed::parse_exposition(&format!("{head} 0"));
                    let (Some(s), 0) = (parsed.into_iter().next(), badn) else { return Err(bad()) };
                    table.intern(head, &s.name, &s.labels).map_err(|message| RecordingError::Label {
                        what: what.clone(),
                        line: n,
                        message,
                    })?
                }
            };
            let _ = value;
            if runs.is_empty() || ts < prev_ts {
                runs.push(start);
            }
            prev_ts = ts;
            if table.is_read(id) {
                times.insert(ts);
                first = first.min(ts);
                last = last.max(ts);
                samples += 1;
            }
        }
        if times.is_empty() {
            return Err(RecordingError::Empty(what));
        }
        Ok(OpenMetricsFile {
            path: path.to_path_buf(),
            runs,
            len,
            table,
            steps: times.len(),
            first_ms: first,
            last_ms: last,
            samples,
        })
    }

    /// Steps with a sample the replay reads.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Runs found by the first pass (readers the second pass opens).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// The second pass: the steps in time order.
    pub fn stream(&self) -> Result<StepStream<'_>, RecordingError> {
        let file = File::open(&self.path).map_err(|e| RecordingError::Response {
            what: self.path.display().to_string(),
            message: format!("cannot read it again: {e}"),
        })?;
        let mut cursors: Vec<Cursor> = self
            .runs
            .iter()
            .enumerate()
            .map(|(i, start)| Cursor {
                pos: *start,
                end: self.runs.get(i + 1).copied().unwrap_or(self.len),
                buf: Vec::new(),
                at: 0,
                next: None,
            })
            .collect();
        let mut heap = BinaryHeap::new();
        for (i, c) in cursors.iter_mut().enumerate() {
            c.advance(&file, &self.table)?;
            if let Some((ts, _, _)) = c.next {
                heap.push(Reverse((ts, i)));
            }
        }
        Ok(StepStream { om: self, file, cursors, heap })
    }
}

/// One run's reader: positioned reads into a small buffer.
struct Cursor {
    pos: u64,
    end: u64,
    buf: Vec<u8>,
    at: usize,
    /// The next sample: (ts, series, value).
    next: Option<(i64, u32, f64)>,
}

/// Bytes read per refill (one per run: 24,000 runs hold 96 MiB).
const CURSOR_BUF: usize = 4096;

impl Cursor {
    /// The next line's bytes, refilling from the file; `None` at the run's end.
    fn line<'b>(&'b mut self, file: &File) -> Result<Option<&'b [u8]>, std::io::Error> {
        loop {
            if let Some(nl) = self.buf[self.at..].iter().position(|b| *b == b'\n') {
                let s = self.at;
                self.at += nl + 1;
                return Ok(Some(&self.buf[s..s + nl]));
            }
            if self.pos >= self.end {
                if self.at < self.buf.len() {
                    // The file's last line without a newline.
                    let s = self.at;
                    self.at = self.buf.len();
                    return Ok(Some(&self.buf[s..]));
                }
                return Ok(None);
            }
            // Keep the partial line, read more.
            self.buf.drain(..self.at);
            self.at = 0;
            let want = (CURSOR_BUF.max(self.buf.len() * 2) as u64).min(self.end - self.pos) as usize;
            let old = self.buf.len();
            self.buf.resize(old + want, 0);
            let got = file.read_at(&mut self.buf[old..], self.pos)?;
            self.buf.truncate(old + got);
            if got == 0 {
                self.pos = self.end;
            }
            self.pos += got as u64;
        }
    }

    fn advance(&mut self, file: &File, table: &SeriesTable) -> Result<(), RecordingError> {
        self.next = None;
        loop {
            let Some(bytes) = self.line(file).map_err(|e| RecordingError::Response {
                what: "the recording".into(),
                message: format!("cannot read it again: {e}"),
            })?
            else {
                return Ok(());
            };
            let l = std::str::from_utf8(bytes).unwrap_or("").trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            // Checked by the first pass: a line that changed since is skipped.
            let Some((head, value, ts)) = split_line(l) else { continue };
            let Some(id) = table.id_of(head) else { continue };
            self.next = Some((ts, id, value));
            return Ok(());
        }
    }
}

/// The steps of an [`OpenMetricsFile`], in time order.
pub struct StepStream<'a> {
    om: &'a OpenMetricsFile,
    file: File,
    cursors: Vec<Cursor>,
    heap: BinaryHeap<Reverse<(i64, usize)>>,
}

impl Iterator for StepStream<'_> {
    type Item = Result<Step, RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Reverse((ts, _)) = *self.heap.peek()?;
            let mut step = Vec::new();
            while let Some(Reverse((t, i))) = self.heap.peek().copied() {
                if t != ts {
                    break;
                }
                self.heap.pop();
                let c = &mut self.cursors[i];
                while let Some((t2, id, v)) = c.next {
                    if t2 != ts {
                        break;
                    }
                    if self.om.table.is_read(id) {
                        step.push((id, v));
                    }
                    if let Err(e) = c.advance(&self.file, &self.om.table) {
                        return Some(Err(e));
                    }
                }
                if let Some((t2, _, _)) = c.next {
                    self.heap.push(Reverse((t2, i)));
                }
            }
            if !step.is_empty() {
                return Some(Ok((ts, step)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rec.om");
        std::fs::write(&p, text).unwrap();
        (d, p)
    }

    /// Series-major (a Prometheus dump), time-major and field-major files
    /// stream the same steps, in time order, each in file order, as the
    /// in-memory reader groups them.
    #[test]
    fn any_layout_streams_the_steps_in_time_order() {
        let line = |f: &str, g: u32, v: f64, t: i64| format!("{f}{{gpu=\"{g}\",Hostname=\"n1\"}} {v} {t}\n");
        let fields = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"];
        let mut series_major = String::new();
        let mut time_major = String::new();
        let mut field_major = String::new();
        for f in fields {
            for g in 0..3 {
                for t in 0..5 {
                    series_major.push_str(&line(f, g, (g * 10 + t as u32) as f64, 1000 + t * 15));
                }
            }
            for t in 0..5 {
                for g in 0..3 {
                    field_major.push_str(&line(f, g, (g * 10 + t as u32) as f64, 1000 + t * 15));
                }
            }
        }
        for t in 0..5 {
            for f in fields {
                for g in 0..3 {
                    time_major.push_str(&line(f, g, (g * 10 + t as u32) as f64, 1000 + t * 15));
                }
            }
        }
        let mut seen = Vec::new();
        for (text, runs) in [(&series_major, 6), (&time_major, 1), (&field_major, 2)] {
            let (_d, p) = write(&format!("# TYPE x gauge\n{text}# EOF\n"));
            let om = OpenMetricsFile::scan(&p).unwrap();
            assert_eq!((om.runs(), om.steps(), om.samples), (runs, 5, 30));
            let steps: Vec<Step> = om.stream().unwrap().map(Result::unwrap).collect();
            assert_eq!(
                steps.iter().map(|s| s.0).collect::<Vec<_>>(),
                [1_000_000, 1_015_000, 1_030_000, 1_045_000, 1_060_000]
            );
            // As the engine gets them: the same set at each time.
            type Seen = Vec<(String, Option<u32>, MetricId, f64)>;
            let mapped: Vec<Seen> = steps
                .iter()
                .map(|(ts, s)| {
                    let mut out = Vec::new();
                    om.table.map_step(*ts, s, &mut out);
                    let mut v: Vec<_> = out.into_iter().map(|m| (m.0.to_string(), m.1, m.2, m.4)).collect();
                    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                    v
                })
                .collect();
            seen.push(mapped);
        }
        assert_eq!(seen[0], seen[1]);
        assert_eq!(seen[1], seen[2]);
    }

    #[test]
    fn the_first_pass_refuses_a_bad_line_with_its_number() {
        let (_d, p) = write(
            "# TYPE t gauge\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"n1\"} 60 100\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"n1\"} 61\n",
        );
        let e = OpenMetricsFile::scan(&p).unwrap_err().to_string();
        assert!(e.ends_with(":3: expected `name{labels} value timestamp` with the timestamp in seconds, found \"DCGM_FI_DEV_GPU_TEMP{gpu=\\\"0\\\",Hostname=\\\"n1\\\"} 61\""), "{e}");
        let (_d, p) = write("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"bad host\"} 60 100\n");
        let e = OpenMetricsFile::scan(&p).unwrap_err().to_string();
        assert!(e.contains(":1: "), "{e}");
        let (_d, p) = write("other_metric{Hostname=\"n1\"} 1 100\n");
        assert!(matches!(OpenMetricsFile::scan(&p), Err(RecordingError::Empty(_))));
    }

    /// Memory as a GPU's framebuffer share, as the live mapping computes it.
    #[test]
    fn the_framebuffer_pair_makes_memory() {
        let mut t = SeriesTable::new();
        let batch = vec![
            PromSample {
                name: "DCGM_FI_DEV_FB_USED".into(),
                labels: [("gpu".into(), "1".into()), ("Hostname".into(), "n1".into())].into(),
                value: 60.0,
                ts_ms: Some(5),
            },
            PromSample {
                name: "DCGM_FI_DEV_FB_FREE".into(),
                labels: [("gpu".into(), "1".into()), ("Hostname".into(), "n1".into())].into(),
                value: 20.0,
                ts_ms: Some(5),
            },
        ];
        let step = t.intern_step(&batch).unwrap();
        let mut out = Vec::new();
        assert_eq!(t.map_step(5, &step, &mut out), 2);
        // The share, and what the work needs: the share itself, the job
        // exporting no peak allocated memory — as the live mapping gives.
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].1, out[0].2, out[0].4), (Some(1), ids::MEM_USED, 75.0));
        assert_eq!((out[1].1, out[1].2, out[1].4), (Some(1), ids::MEM_NEED, 75.0));
        let (live, _) = nightshift_engine::embed::map_samples(&batch, 5, &|_| true, &|_, _| None);
        let live: Vec<_> = live.iter().map(|s| (s.1, s.2, s.4)).collect();
        let replayed: Vec<_> = out.iter().map(|s| (s.1, s.2, s.4)).collect();
        assert_eq!(live, replayed);
    }
}
