//! [`Lifecycle`]: whether the engine is stopping, and the background tasks
//! a stop ends. Its state is its own: a stop is one call
//! ([`Lifecycle::stop`]), and nothing else can un-stop an engine or forget a
//! task.

use std::sync::Mutex;

use tokio::task::JoinHandle;

/// The stop flag and the tasks it ends.
pub(crate) struct Lifecycle {
    stopping: tokio::sync::watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Default for Lifecycle {
    fn default() -> Lifecycle {
        Lifecycle { stopping: tokio::sync::watch::channel(false).0, tasks: Mutex::new(Vec::new()) }
    }
}

impl Lifecycle {
    /// A receiver that flips to true when the engine stops.
    pub(crate) fn signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Whether the engine stops.
    pub(crate) fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// A background task to end when the engine stops.
    pub(crate) fn add(&self, t: JoinHandle<()>) {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(t);
    }

    /// Say the engine stops, and end every task added. `send_replace`, not
    /// `send`: with no receiver left `send` stores nothing, and a run ending
    /// now would not know the engine stops.
    pub(crate) fn stop(&self) {
        self.stopping.send_replace(true);
        for t in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_is_seen_by_every_receiver_and_ends_the_tasks() {
        let l = Lifecycle::default();
        let before = l.signal();
        assert!(!l.stopping());
        let task = tokio::spawn(std::future::pending::<()>());
        let probe = task.abort_handle();
        l.add(task);
        l.stop();
        assert!(l.stopping() && *before.borrow() && *l.signal().borrow(), "seen before and after");
        for _ in 0..100 {
            if probe.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(probe.is_finished(), "the task was ended");
    }
}
