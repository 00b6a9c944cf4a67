//! [`Batch`]: the effects of one append batch, staged but not yet published — each
//! key's staged state, the completion records and acknowledgements — in a hash map
//! keyed by the key hash each operation computed already ([`StagedKey`], hashed by
//! [`SeededKeyHash`]).

use bytes::Bytes;
use rampart_common::ids::{ClientId, KeyHash, TableId, Version};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

use crate::completions::Record;
use crate::object_index::LogRef;

/// What a staged operation did to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Staged {
    /// The key now holds the object at `at`.
    Live { version: Version, at: LogRef },
    /// The key was removed.
    Removed,
}

/// The effects of one append batch, staged but not yet published.
#[derive(Debug, Default)]
pub struct Batch {
    /// Final staged state per key; later operations of the batch read it.
    pub(super) staged: HashMap<StagedKey, Staged, SeededKeyHash>,
    /// Keys staged that the index does not hold yet: it grows by at most this many at
    /// publish (counted against the memory, `ObjectStore::new_key_fits`).
    pub(super) new_keys: u64,
    /// Completion records appended by this batch, by (client, number): held at publish.
    pub(super) completions: HashMap<(ClientId, u64), Record>,
    /// The highest acknowledgement each client sent in this batch: applied at publish.
    pub(super) acks: HashMap<ClientId, u64>,
    /// Records in `completions` per client (the per-client limit is checked per op).
    pub(super) records_per_client: HashMap<ClientId, usize>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Whether nothing was staged (no effect, no record, no acknowledgement).
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty() && self.completions.is_empty() && self.acks.is_empty()
    }

    pub(super) fn note_ack(&mut self, client: ClientId, ack: u64) {
        let held = self.acks.entry(client).or_default();
        *held = (*held).max(ack);
    }

    /// Records of `client` staged in this batch.
    pub(super) fn records_of(&self, client: ClientId) -> usize {
        self.records_per_client.get(&client).copied().unwrap_or(0)
    }

    /// Stages the record of `client`'s operation `seq`.
    pub(super) fn add_record(&mut self, client: ClientId, seq: u64, record: Record) {
        if self.completions.insert((client, seq), record).is_none() {
            *self.records_per_client.entry(client).or_default() += 1;
        }
    }

    pub(super) fn get(&self, table: TableId, hash: KeyHash, key: &Bytes) -> Option<Staged> {
        let key = StagedKey {
            table,
            hash,
            key: key.clone(),
        };
        self.staged.get(&key).copied()
    }

    pub(super) fn insert(&mut self, table: TableId, hash: KeyHash, key: &Bytes, staged: Staged) {
        let key = StagedKey {
            table,
            hash,
            key: key.clone(),
        };
        self.staged.insert(key, staged);
    }
}

/// A key of a [`Batch`], with the `key_hash` its operation computed already. The map
/// hashes that instead of the key's bytes: replay stages every object of a recovery,
/// and SipHash over each key, twice, plus `key_hash` again at publish, cost more than
/// the lookups themselves. `key_hash` is unseeded and a batch's keys often share a
/// tablet (a narrow range of hashes), so [`SeededKeyHash`] mixes it with a random seed.
#[derive(Clone, Debug)]
pub(super) struct StagedKey {
    pub(super) table: TableId,
    /// `key_hash(&key)`.
    pub(super) hash: KeyHash,
    pub(super) key: Bytes,
}

impl PartialEq for StagedKey {
    fn eq(&self, other: &Self) -> bool {
        self.table == other.table && self.hash == other.hash && self.key == other.key
    }
}

impl Eq for StagedKey {}

impl Hash for StagedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equal keys have equal hashes, so this agrees with `eq`.
        state.write_u64(self.hash.0 ^ self.table.0.wrapping_mul(MIX));
    }
}

/// An odd constant with well-spread bits (2⁶⁴ / φ).
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// Builds the hashers of [`StagedKey`]s, seeded once per process at random: the hash
/// table's bucket and control bits then depend on every bit of the key hash and on
/// the seed, so neither keys that share a tablet nor keys a client chose to share low
/// hash bits pile up in a few buckets.
#[derive(Clone, Copy, Debug)]
pub(super) struct SeededKeyHash(u64);

impl Default for SeededKeyHash {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        SeededKeyHash(
            *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(MIX)),
        )
    }
}

impl BuildHasher for SeededKeyHash {
    type Hasher = KeyHashHasher;

    fn build_hasher(&self) -> KeyHashHasher {
        KeyHashHasher(self.0)
    }
}

/// A [`SeededKeyHash`] hasher: each `u64` written (a `StagedKey` writes one) is folded
/// into the state with a 64 × 64 → 128-bit multiply, whose halves are xored.
/// Anything else written (no caller does) is folded in eight bytes at a time.
#[derive(Debug)]
pub(super) struct KeyHashHasher(u64);

impl Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, value: u64) {
        let product = u128::from(self.0 ^ value) * u128::from(MIX);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rampart_common::ids::SegmentId;

    #[test]
    fn a_batch_tells_apart_keys_that_share_a_hash_or_a_key_in_two_tables() {
        let mut batch = Batch::new();
        let at = |offset: u32| Staged::Live {
            version: Version(offset.into()),
            at: LogRef {
                segment: SegmentId(1),
                offset,
            },
        };
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        // A collision of 64-bit key hashes, forced: the keys still decide.
        batch.insert(TableId(1), KeyHash(7), &a, at(1));
        batch.insert(TableId(1), KeyHash(7), &b, at(2));
        batch.insert(TableId(2), KeyHash(7), &a, Staged::Removed);
        assert_eq!(batch.get(TableId(1), KeyHash(7), &a), Some(at(1)));
        assert_eq!(batch.get(TableId(1), KeyHash(7), &b), Some(at(2)));
        assert_eq!(batch.get(TableId(2), KeyHash(7), &a), Some(Staged::Removed));
        assert_eq!(batch.get(TableId(2), KeyHash(7), &b), None);
        batch.insert(TableId(1), KeyHash(7), &a, at(3));
        assert_eq!(
            batch.get(TableId(1), KeyHash(7), &a),
            Some(at(3)),
            "replaced"
        );
        assert_eq!(batch.staged.len(), 3);
    }
}
