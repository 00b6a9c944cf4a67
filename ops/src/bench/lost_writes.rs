//! Acknowledged writes lost with a server: the write load every system of the loss
//! comparison runs until the kill, and the count of what it acknowledged that is missing
//! once the system serves again (issue 41's honest comparison).
//!
//! The load is the Sentinel stability phase's: [`LOSS_WRITERS`] closed-loop writers
//! overwriting [`LOSS_KEYS`] keys with 1 KB values. Write `n` (numbered across writers:
//! writer `w` issues `w`, `w + 16`, `w + 32`, ...) goes to key `n % LOSS_KEYS` with `n`
//! in its value's first 8 bytes. [`LOSS_KEYS`] is a multiple of [`LOSS_WRITERS`], so a
//! key has one writer and the numbers written to it only grow: the value read back says
//! which of the key's acknowledged writes survived (those numbered up to it) and which
//! are lost (those above it, or all of them when the key is gone). An acknowledged write
//! overwritten by a later acknowledged write that survived is not lost: its successor
//! holds everything it said.
//!
//! [`write_until`] is the writers' loop, given each system's write; [`LostWrites::count`]
//! is the decision, tested alone.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

/// Closed-loop writers of the load.
pub(crate) const LOSS_WRITERS: u64 = 16;

/// Keys the load overwrites (a multiple of [`LOSS_WRITERS`]; bounded, so the load adds at
/// most this many live objects to the server).
pub(crate) const LOSS_KEYS: u64 = 10_000;

/// Bytes of each value written.
const LOSS_VALUE_BYTES: usize = 1024;

/// The prefix of the load's keys (no loaded key starts with it).
pub(crate) const LOSS_KEY_PREFIX: &[u8] = b"loss-write-";

/// The key of write `n`, and of key index `n % LOSS_KEYS`.
pub(crate) fn loss_key(n: u64) -> Vec<u8> {
    let mut key = LOSS_KEY_PREFIX.to_vec();
    key.extend_from_slice(format!("{:05}", n % LOSS_KEYS).as_bytes());
    key
}

/// The value of write `n`: `n` (little-endian) then filler.
pub(crate) fn loss_value(n: u64) -> Vec<u8> {
    let mut value = vec![b'w'; LOSS_VALUE_BYTES];
    value[..8].copy_from_slice(&n.to_le_bytes());
    value
}

/// The write number a value read back carries; `None` if it is not one of the load's.
pub(crate) fn written_number(value: &[u8]) -> Option<u64> {
    let n = u64::from_le_bytes(value.get(..8)?.try_into().ok()?);
    (value.len() == LOSS_VALUE_BYTES && value[8..].iter().all(|&b| b == b'w')).then_some(n)
}

/// Writer `writer`'s loop: writes `writer`, `writer + LOSS_WRITERS`, ... through `write`
/// (which says whether the system acknowledged it), one at a time, until `stop` is set
/// or a write fails (the server is gone); returns the numbers acknowledged.
pub(crate) async fn write_until<F, Fut>(writer: u64, stop: &AtomicBool, write: F) -> Vec<u64>
where
    F: Fn(Vec<u8>, Vec<u8>) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut acknowledged = Vec::new();
    let mut n = writer;
    while !stop.load(Ordering::Acquire) {
        if !write(loss_key(n), loss_value(n)).await {
            break;
        }
        acknowledged.push(n);
        n += LOSS_WRITERS;
    }
    acknowledged
}

/// The load's outcome on one system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LostWrites {
    /// Writes the system acknowledged.
    pub(crate) acknowledged: u64,
    /// Of those, the ones whose effect is missing once it serves again.
    pub(crate) lost: u64,
    /// Keys that read back a value no write of the load wrote, or a write numbered for
    /// another key: corruption, not loss.
    pub(crate) foreign: u64,
}

impl LostWrites {
    /// Counts the acknowledged writes missing from `read_back` (key index → what a read
    /// of `loss_key(index)` returned once the system served again: `None` for no object,
    /// else its value).
    pub(crate) fn count(
        acknowledged: &[u64],
        read_back: &BTreeMap<u64, Option<Vec<u8>>>,
    ) -> LostWrites {
        let mut outcome = LostWrites {
            acknowledged: acknowledged.len() as u64,
            ..LostWrites::default()
        };
        let survived: BTreeMap<u64, Option<u64>> = read_back
            .iter()
            .map(|(&index, value)| {
                let number = match value {
                    None => None,
                    Some(value) => match written_number(value) {
                        Some(n) if n % LOSS_KEYS == index => Some(n),
                        _ => {
                            outcome.foreign += 1;
                            None
                        }
                    },
                };
                (index, number)
            })
            .collect();
        outcome.lost = acknowledged
            .iter()
            .filter(|&&n| {
                let survivor = survived.get(&(n % LOSS_KEYS)).copied().flatten();
                survivor.map_or(true, |s| n > s)
            })
            .count() as u64;
        outcome
    }
}

impl std::fmt::Display for LostWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} acknowledged writes lost",
            self.lost, self.acknowledged
        )?;
        if self.foreign > 0 {
            write!(f, ", {} keys read back a value never written", self.foreign)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(pairs: &[(u64, Option<u64>)]) -> BTreeMap<u64, Option<Vec<u8>>> {
        pairs
            .iter()
            .map(|&(index, n)| (index, n.map(loss_value)))
            .collect()
    }

    #[test]
    fn a_key_is_one_writers_and_its_numbers_grow() {
        assert_eq!(LOSS_KEYS % LOSS_WRITERS, 0);
        assert_eq!(loss_key(7), loss_key(7 + LOSS_KEYS));
        assert_ne!(loss_key(7), loss_key(8));
        assert_eq!(written_number(&loss_value(123_456)), Some(123_456));
        assert_eq!(written_number(b"short"), None);
        let mut tampered = loss_value(5);
        tampered[100] = b'x';
        assert_eq!(written_number(&tampered), None);
    }

    #[test]
    fn writes_above_the_survivor_are_lost_and_those_below_are_not() {
        let k = LOSS_KEYS;
        // Key 3 acknowledged 3, 3 + k, 3 + 2k; 3 + k survived: 3 + 2k is lost.
        // Key 4 acknowledged 4; gone: lost. Key 5 acknowledged 5; survived.
        let acknowledged = [3, 3 + k, 3 + 2 * k, 4, 5];
        let outcome = LostWrites::count(
            &acknowledged,
            &read_back(&[(3, Some(3 + k)), (4, None), (5, Some(5))]),
        );
        assert_eq!(
            outcome,
            LostWrites {
                acknowledged: 5,
                lost: 2,
                foreign: 0
            }
        );
        // A write in flight at the kill that was applied but never acknowledged holds
        // everything acknowledged before it.
        let outcome = LostWrites::count(&[3, 3 + k], &read_back(&[(3, Some(3 + 2 * k))]));
        assert_eq!(outcome.lost, 0);
    }

    #[test]
    fn a_value_of_another_key_is_foreign_and_loses_the_keys_writes() {
        let outcome = LostWrites::count(&[3], &read_back(&[(3, Some(4))]));
        assert_eq!(
            outcome,
            LostWrites {
                acknowledged: 1,
                lost: 1,
                foreign: 1
            }
        );
    }

    #[test]
    fn a_key_never_read_back_loses_its_writes() {
        let outcome = LostWrites::count(&[3, 4], &read_back(&[(3, Some(3))]));
        assert_eq!(outcome.lost, 1);
    }

    #[tokio::test]
    async fn writers_stop_at_the_flag_or_at_the_first_failed_write() {
        let stop = AtomicBool::new(false);
        let writes = std::sync::atomic::AtomicU64::new(0);
        let acknowledged = write_until(2, &stop, |key, value| {
            let done = writes.fetch_add(1, Ordering::Relaxed);
            let expected_n = 2 + done * LOSS_WRITERS;
            assert_eq!(key, loss_key(expected_n));
            assert_eq!(written_number(&value), Some(expected_n));
            if done == 2 {
                stop.store(true, Ordering::Release);
            }
            async { true }
        })
        .await;
        assert_eq!(acknowledged, [2, 18, 34]);
        let stop = AtomicBool::new(false);
        let acknowledged = write_until(0, &stop, |_, value| {
            let ok = written_number(&value) != Some(2 * LOSS_WRITERS);
            async move { ok }
        })
        .await;
        assert_eq!(acknowledged, [0, LOSS_WRITERS]);
    }
}
