//! The one shutdown story of `serve` and `demo`: the foreground part (the probe) runs
//! until the process's token (SIGINT, SIGTERM) fires or its cycles are done; the parts
//! it needs meanwhile (the reference service its locks are released through, the
//! monitor that must see its last migration) run as [`Background`] tasks on one
//! `TaskTracker` and one token, asked to stop only after the foreground has returned,
//! and given [`GRACE`] to finish.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// How long background tasks get to finish once asked to stop.
pub const GRACE: Duration = Duration::from_secs(10);

/// Tasks that outlive the foreground part of a command, stopped together.
#[derive(Debug, Default)]
pub struct Background {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Background {
    /// No tasks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The token every background task stops on.
    pub fn token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `task` in the background, in a span named `name`; it must end soon after
    /// [`Background::token`] fires.
    pub fn spawn<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(task.instrument(tracing::info_span!("background", task = name)));
    }

    /// Asks every task to stop and waits for them, at most `grace`; returns whether all
    /// of them finished (the others are left to the runtime's end).
    pub async fn stop(self, grace: Duration) -> bool {
        self.stop.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait()).await.is_ok() {
            return true;
        }
        tracing::warn!(unfinished = self.tracker.len(), grace = ?grace, "background tasks did not stop within the grace period");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_waits_for_tasks_that_stop_and_gives_up_on_the_others() {
        let background = Background::new();
        let token = background.token();
        background.spawn("polite", async move { token.cancelled().await });
        assert!(background.stop(GRACE).await);

        let background = Background::new();
        background.spawn("stubborn", std::future::pending());
        let started = tokio::time::Instant::now();
        assert!(!background.stop(GRACE).await);
        assert_eq!(started.elapsed(), GRACE);
    }
}
