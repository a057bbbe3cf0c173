//! Liveness of busy instances: finds an instance whose serving loop stopped answering
//! while the process lives on.
//!
//! A handler can block the shim's own loop (a Python `async def` handler calling
//! `time.sleep`, a synchronous busy loop in Node): the process is alive, its requests
//! never get an answer, and at `timeout_sec: 0` nothing else would ever end them. While
//! requests are in flight and no answer has come back for a whole period, the monitor
//! asks the instance `GET /_sless/ready` on another connection; the shims answer it from
//! their serving loop even while handlers run (Python `def` handlers run off the loop,
//! Node handlers that `await`), so only a loop that is really stuck fails the check.
//! An idle instance, or one whose requests keep being answered, is never asked.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Default of [`crate::ExecutorConfig::liveness_period`].
pub const LIVENESS_PERIOD: Duration = Duration::from_secs(5);

/// Liveness checks in a row that must go unanswered (each waits one period) before an
/// instance counts as stopped.
pub const LIVENESS_FAILURES: u32 = 3;

/// What the monitor samples of an instance once per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Activity {
    /// Requests in flight.
    pub inflight: u32,
    /// Requests it has answered so far.
    pub answered: u64,
}

/// How monitoring an instance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The instance stopped (or is being stopped) for another reason.
    Stopped,
    /// `threshold` checks in a row went unanswered over `silent_for`.
    Unresponsive { silent_for: Duration },
}

/// Watches one instance until it stops or stops answering. `sample` returns its
/// activity, or `None` once it is stopping; `probe` asks it whether its loop still
/// answers (`true`: it does). A probe that takes longer than `period` has failed.
pub(crate) async fn monitor<S, P, F>(
    period: Duration,
    threshold: u32,
    mut sample: S,
    mut probe: P,
) -> Outcome
where
    S: FnMut() -> Option<Activity>,
    P: FnMut() -> F,
    F: Future<Output = bool>,
{
    let mut tick = tokio::time::interval(period);
    // A probe that times out uses up its tick, so the next one starts right after it.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last: Option<Activity> = None;
    let mut failed = 0u32;
    let mut first_failure: Option<Instant> = None;
    loop {
        tick.tick().await;
        let Some(now) = sample() else {
            return Outcome::Stopped;
        };
        // Requests in flight over a whole period with no answer coming back: any answer
        // proves the loop alive, so only then is it worth asking.
        let stalled =
            now.inflight > 0 && last.is_some_and(|l| l.inflight > 0 && l.answered == now.answered);
        last = Some(now);
        if !stalled {
            failed = 0;
            first_failure = None;
            continue;
        }
        let started = Instant::now();
        let answered = tokio::time::timeout(period, probe()).await.unwrap_or(false);
        if answered {
            failed = 0;
            first_failure = None;
            continue;
        }
        failed += 1;
        let since = *first_failure.get_or_insert(started);
        if failed >= threshold {
            return Outcome::Unresponsive {
                silent_for: since.elapsed(),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    const P: Duration = Duration::from_secs(5);

    /// A probe that never answers, counting how often it was asked.
    fn deaf(asked: &Rc<Cell<u32>>) -> impl FnMut() -> std::future::Pending<bool> {
        let asked = asked.clone();
        move || {
            asked.set(asked.get() + 1);
            std::future::pending()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_instance_that_never_answers_is_unresponsive_after_threshold_checks() {
        let asked = Rc::new(Cell::new(0));
        let t0 = Instant::now();
        let outcome = monitor(
            P,
            3,
            || {
                Some(Activity {
                    inflight: 2,
                    answered: 7,
                })
            },
            deaf(&asked),
        )
        .await;
        // Busy at P and again at 2P: checks at 2P, 3P and 4P, each waiting a period.
        assert_eq!(outcome, Outcome::Unresponsive { silent_for: 3 * P });
        assert_eq!(asked.get(), 3);
        assert_eq!(t0.elapsed(), 5 * P);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_request_on_a_loop_that_answers_is_left_alone() {
        let asked = Rc::new(Cell::new(0));
        let t0 = Instant::now();
        let counter = asked.clone();
        let outcome = monitor(
            P,
            3,
            // One request that runs for 100 periods, then the instance is stopped.
            || {
                (t0.elapsed() < 100 * P).then_some(Activity {
                    inflight: 1,
                    answered: 0,
                })
            },
            move || {
                counter.set(counter.get() + 1);
                async {
                    // Answers, slowly but within the period.
                    tokio::time::sleep(P / 2).await;
                    true
                }
            },
        )
        .await;
        assert_eq!(outcome, Outcome::Stopped);
        assert!(asked.get() >= 90, "asked {} times", asked.get());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_instances_and_ones_that_keep_answering_are_never_asked() {
        let asked = Rc::new(Cell::new(0));
        let t0 = Instant::now();
        let answered = Cell::new(0u64);
        let outcome = monitor(
            P,
            3,
            || {
                if t0.elapsed() >= 50 * P {
                    return None;
                }
                // Busy all the time but answering a request every period; idle in between.
                answered.set(answered.get() + 1);
                let inflight = if t0.elapsed() < 25 * P { 4 } else { 0 };
                Some(Activity {
                    inflight,
                    answered: answered.get(),
                })
            },
            deaf(&asked),
        )
        .await;
        assert_eq!(outcome, Outcome::Stopped);
        assert_eq!(asked.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_between_starts_the_count_again() {
        let asked = Rc::new(Cell::new(0u32));
        let counter = asked.clone();
        let t0 = Instant::now();
        let outcome = monitor(
            P,
            3,
            || {
                Some(Activity {
                    inflight: 1,
                    answered: 0,
                })
            },
            move || {
                let n = counter.get() + 1;
                counter.set(n);
                async move {
                    if n == 3 {
                        // The third check is answered; the first two failures are forgotten.
                        return true;
                    }
                    std::future::pending::<()>().await;
                    false
                }
            },
        )
        .await;
        assert!(matches!(outcome, Outcome::Unresponsive { .. }));
        // Two failures, one answer, then three more failures.
        assert_eq!(asked.get(), 6);
        assert!(t0.elapsed() >= 7 * P, "{:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_fails_at_once_waits_for_the_next_period() {
        let asked = Rc::new(Cell::new(0u32));
        let counter = asked.clone();
        let t0 = Instant::now();
        let outcome = monitor(
            P,
            3,
            || {
                Some(Activity {
                    inflight: 1,
                    answered: 0,
                })
            },
            // Connection refused: fails without waiting.
            move || {
                counter.set(counter.get() + 1);
                std::future::ready(false)
            },
        )
        .await;
        assert_eq!(outcome, Outcome::Unresponsive { silent_for: 2 * P });
        assert_eq!(asked.get(), 3);
        assert_eq!(t0.elapsed(), 4 * P);
    }
}
