//! Capped exponential back-off, the one rule every retry in sless follows
//! (instance restarts, the warm pool, reconciles, job attempts, deliveries).

use std::time::Duration;

/// Delays that double from `initial` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the first retry.
    pub initial: Duration,
    /// No delay is longer than this.
    pub max: Duration,
}

impl Backoff {
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The delay before retry number `retry` (1 is the first retry):
    /// `initial · 2^(retry − 1)`, at most `max`. Retry 0 (the first try) waits nothing.
    pub fn delay(&self, retry: u32) -> Duration {
        if retry == 0 {
            return Duration::ZERO;
        }
        // 2^31 times any useful initial delay is far past any useful cap.
        let factor = 1u32 << (retry - 1).min(31);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// [`Backoff::delay`] spread over its upper half, so that many retries started
    /// together do not stay in step: `unit` is a random number in `[0, 1)`.
    pub fn jittered(&self, retry: u32, unit: f64) -> Duration {
        let full = self.delay(retry);
        let half = full / 2;
        half + half.mul_f64(unit.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));

    #[test]
    fn doubles_from_initial_and_stops_at_the_cap() {
        assert_eq!(B.delay(0), Duration::ZERO);
        assert_eq!(B.delay(1), Duration::from_millis(100));
        assert_eq!(B.delay(2), Duration::from_millis(200));
        assert_eq!(B.delay(4), Duration::from_millis(800));
        assert_eq!(B.delay(9), Duration::from_millis(25_600));
        assert_eq!(B.delay(10), Duration::from_secs(30));
        assert_eq!(B.delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_within_the_upper_half() {
        assert_eq!(B.jittered(3, 0.0), Duration::from_millis(200));
        assert_eq!(B.jittered(3, 1.0), Duration::from_millis(400));
        let mid = B.jittered(3, 0.5);
        assert!(mid > Duration::from_millis(200) && mid < Duration::from_millis(400));
        assert_eq!(B.jittered(0, 0.7), Duration::ZERO);
    }
}
