//! Invocation ids: unique, and sortable by the time they were made.
//!
//! An id is 24 hex digits: 16 for a 64-bit value whose top 44 bits are
//! milliseconds since the Unix epoch and whose low 20 bits count ids within a
//! millisecond, then 8 for a random salt chosen once per process. The value is
//! strictly increasing within a process (a burst of more than a million ids in
//! one millisecond borrows from the next millisecond rather than repeating), and
//! the salt keeps two processes (a restarted server, say) from making the same id.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of the value counting ids within one millisecond.
const COUNTER_BITS: u32 = 20;

static LAST: AtomicU64 = AtomicU64::new(0);
static SALT: OnceLock<u32> = OnceLock::new();

/// A new invocation id.
pub fn new_id() -> String {
    let millis = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let value = next_value(&LAST, millis);
    let salt = *SALT.get_or_init(rand::random::<u32>);
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&value.to_be_bytes());
    bytes[8..].copy_from_slice(&salt.to_be_bytes());
    let mut hex = [0u8; 24];
    // 12 bytes always fit 24 hex digits, which are ASCII.
    let _ = hex::encode_to_slice(bytes, &mut hex);
    String::from_utf8_lossy(&hex).into_owned()
}

/// The next value after the last one handed out, and no earlier than `millis`.
fn next_value(last: &AtomicU64, millis: u64) -> u64 {
    let floor = millis << COUNTER_BITS;
    let mut prev = last.load(Ordering::Relaxed);
    loop {
        let next = floor.max(prev + 1);
        match last.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => prev = seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_increase_within_and_across_milliseconds() {
        let last = AtomicU64::new(0);
        let a = next_value(&last, 1000);
        let b = next_value(&last, 1000);
        assert_eq!((a, b), (1000 << COUNTER_BITS, (1000 << COUNTER_BITS) + 1));
        let c = next_value(&last, 1001);
        assert_eq!(c, 1001 << COUNTER_BITS);
        // A clock stepping back never makes an earlier value.
        assert!(next_value(&last, 900) > c);
    }

    #[test]
    fn ids_are_unique_sorted_and_fixed_width() {
        let ids: Vec<String> = (0..20_000).map(|_| new_id()).collect();
        assert!(ids.iter().all(|id| id.len() == 24));
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids sort by creation");
        let time_part = u64::from_str_radix(&ids[0][..16], 16).unwrap() >> COUNTER_BITS;
        let now = chrono::Utc::now().timestamp_millis() as u64;
        assert!(
            now - time_part < 10_000,
            "the id carries the time it was made"
        );
    }

    #[test]
    fn threads_never_share_an_id() {
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..5000).map(|_| new_id()).collect::<Vec<_>>()))
            .collect();
        let mut all: Vec<String> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
