//! [`VerifyCache`]: one walk of the whole chain at a time, and its report
//! served again while the chain's head has not moved (for at most
//! [`VERIFY_CACHE_SECS`]) — page loads cannot stack up full-chain walks.
//! The last report is its own: only a walk it ran replaces it.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::audit::VerifyReport;

/// How long a verify report is served again while the chain's head has not
/// moved.
pub const VERIFY_CACHE_SECS: u64 = 60;

/// The last walk's report: (head seq, when, report).
#[derive(Default)]
pub(crate) struct VerifyCache {
    last: tokio::sync::Mutex<Option<(u64, Instant, VerifyReport)>>,
}

impl VerifyCache {
    /// The report for a chain whose head is `head`: the last one if it was
    /// for this head and is fresh, else `walk`'s (callers meanwhile wait
    /// for it, then take it). A failed walk keeps nothing.
    pub(crate) async fn report<E, F, Fut>(&self, head: u64, walk: F) -> Result<VerifyReport, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<VerifyReport, E>>,
    {
        let mut last = self.last.lock().await;
        if let Some((h, at, r)) = last.as_ref()
            && *h == head
            && at.elapsed() < Duration::from_secs(VERIFY_CACHE_SECS)
        {
            return Ok(r.clone());
        }
        let r = walk().await?;
        *last = Some((head, Instant::now(), r.clone()));
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> VerifyReport {
        VerifyReport {
            ok: true,
            verified_up_to: 0,
            records: 0,
            first_bad_seq: None,
            problem: None,
            excused: Vec::new(),
            notes: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_report_is_walked_again_only_when_the_head_moved_or_a_walk_failed() {
        let c = VerifyCache::default();
        let walks = std::cell::Cell::new(0);
        let walk = || async {
            walks.set(walks.get() + 1);
            Ok::<_, ()>(report())
        };
        c.report(5, walk).await.unwrap();
        c.report(5, walk).await.unwrap();
        assert_eq!(walks.get(), 1, "the same head: served again");
        c.report(6, walk).await.unwrap();
        assert_eq!(walks.get(), 2, "the head moved: walked again");
        assert!(c.report(7, || async { Err::<VerifyReport, _>("broken") }).await.is_err());
        c.report(7, walk).await.unwrap();
        assert_eq!(walks.get(), 3, "a failed walk kept nothing");
    }
}
