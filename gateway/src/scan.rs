//! `ScanWalk`: how much of the table one `SCAN` call examines, and the cursor it
//! answers (pure: the gateway feeds it the enumeration's pages).
//!
//! A `SCAN` cursor is a key hash: the enumeration (`Client::enumerate_from`) returns
//! objects in key-hash order, a page at a time, every object of one hash in one page.
//! One call examines keys until it has `COUNT` matches or has examined
//! [`SCAN_EXAMINED_PER_COUNT`] × `COUNT` keys (Redis's bound on one call's work, 10 ×
//! `COUNT`), then answers the hash of the first key it did not examine. Without the
//! second bound a pattern that matches nothing walked the whole table in one call:
//! minutes of a gateway task, and a page of the table in memory at a time, for one short
//! request. It stops only between hashes, so that resuming from the cursor (a hash)
//! returns no key twice.
//!
//! A page holds many more keys than a call takes (up to a megabyte of objects), so a
//! connection keeps the keys of the page a call stopped inside ([`ScanRest`]): the next
//! call from that cursor starts from them instead of fetching the page again. A key
//! present for the whole scan is in that page, so it is still returned; one deleted
//! since may be too, which `SCAN` allows.

use bytes::Bytes;
use rampart_common::ids::key_hash;

use crate::glob::glob_match;

/// Keys one `SCAN` call examines per key it may return (`COUNT`): Redis's ratio (its
/// `scan` visits at most 10 × `COUNT` buckets per call).
pub const SCAN_EXAMINED_PER_COUNT: usize = 10;

/// One `SCAN` call's walk over the keys of its pages.
#[derive(Debug)]
pub struct ScanWalk<'a> {
    pattern: Option<&'a [u8]>,
    /// `COUNT`: matches that end the call.
    count: usize,
    /// Keys examined that end the call: [`SCAN_EXAMINED_PER_COUNT`] × `count`.
    examined_max: usize,
    examined: usize,
    matched: Vec<Bytes>,
    /// The key hash function: [`key_hash`], but for tests of hash collisions.
    hash: fn(&[u8]) -> u64,
}

/// Where a call stopped inside a page: the cursor it answers, and the index of the
/// first key it did not examine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanStop {
    /// The cursor to answer: the hash of the first key not examined.
    pub cursor: u64,
    /// That key's index in the keys given to [`ScanWalk::take`].
    pub at: usize,
}

/// The keys of a page a call stopped inside, kept by the connection for its next call
/// from that cursor (one page's keys at most: `ENUMERATE_PAGE_BYTES` of the client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRest {
    /// The cursor answered: the hash of `keys[next]`.
    cursor: u64,
    /// The page's keys from the first not examined on, in key-hash order; copied out of
    /// the page, so that keeping them does not keep its values.
    keys: Vec<Bytes>,
    /// The first not examined yet.
    next: usize,
    /// Where the enumeration goes on after them; `None`: the table ends with them.
    then: Option<u64>,
}

impl ScanRest {
    /// The keys of `page` from where `stop` says on; `then`: where the enumeration goes
    /// on after the page.
    pub fn new(page: &[Bytes], stop: ScanStop, then: Option<u64>) -> ScanRest {
        ScanRest {
            cursor: stop.cursor,
            keys: page[stop.at..]
                .iter()
                .map(|key| Bytes::copy_from_slice(key))
                .collect(),
            next: 0,
            then,
        }
    }

    /// The cursor a call resumes these keys from.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The keys not examined yet.
    pub fn keys(&self) -> &[Bytes] {
        &self.keys[self.next..]
    }

    /// Where the enumeration goes on after [`keys`](Self::keys).
    pub fn then(&self) -> Option<u64> {
        self.then
    }

    /// A later call stopped at `stop` within [`keys`](Self::keys).
    pub fn advance(&mut self, stop: ScanStop) {
        self.next += stop.at;
        self.cursor = stop.cursor;
    }
}

impl<'a> ScanWalk<'a> {
    /// A call keeping keys that match `pattern` (all if `None`), `count` of them at
    /// most (at least 1).
    pub fn new(pattern: Option<&'a [u8]>, count: usize) -> ScanWalk<'a> {
        let count = count.max(1);
        ScanWalk {
            pattern,
            count,
            examined_max: count.saturating_mul(SCAN_EXAMINED_PER_COUNT),
            examined: 0,
            matched: Vec::new(),
            hash: |key| key_hash(key).0,
        }
    }

    /// Whether the call has done its work: `COUNT` matches, or its bound examined.
    pub fn is_done(&self) -> bool {
        self.matched.len() >= self.count || self.examined >= self.examined_max
    }

    /// Examines `keys` (a page's, or the rest of one, in key-hash order, every key of
    /// one hash among them) in order until the call is done, then the rest of the last
    /// examined key's hash. `None` if it examined them all; otherwise where it stopped.
    pub fn take(&mut self, keys: &[Bytes]) -> Option<ScanStop> {
        let mut next = 0;
        while next < keys.len() && !self.is_done() {
            self.examine(&keys[next]);
            next += 1;
        }
        if next > 0 && next < keys.len() {
            // Keys of one hash are examined together: the cursor (a hash) resumes after
            // all of them.
            let last = (self.hash)(&keys[next - 1]);
            while next < keys.len() && (self.hash)(&keys[next]) == last {
                self.examine(&keys[next]);
                next += 1;
            }
        }
        let stop = keys.get(next)?;
        Some(ScanStop {
            cursor: (self.hash)(stop),
            at: next,
        })
    }

    /// The keys that matched, in key-hash order.
    pub fn into_matched(self) -> Vec<Bytes> {
        self.matched
    }

    fn examine(&mut self, key: &Bytes) {
        self.examined += 1;
        if self.pattern.map_or(true, |p| glob_match(p, key)) {
            self.matched.push(key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys `k0000`... in key-hash order.
    fn page(n: usize) -> Vec<Bytes> {
        let mut keys: Vec<Bytes> = (0..n).map(|i| Bytes::from(format!("k{i:04}"))).collect();
        keys.sort_by_key(|k| key_hash(k));
        keys
    }

    #[test]
    fn scan_walk_with_a_pattern_matching_nothing_stops_after_ten_times_count() {
        let keys = page(1000);
        let mut walk = ScanWalk::new(Some(b"nothing*"), 10);
        let stop = walk.take(&keys).expect("stops inside the page");
        assert_eq!(stop.at, 100, "examined 10 × COUNT");
        assert_eq!(stop.cursor, key_hash(&keys[100]).0);
        assert!(walk.is_done());
        assert!(walk.into_matched().is_empty());
    }

    #[test]
    fn scan_walk_stops_at_count_matches_and_its_rest_resumes_where_it_stopped() {
        let keys = page(100);
        let mut walk = ScanWalk::new(None, 7);
        let stop = walk.take(&keys).expect("stops inside the page");
        let mut returned = walk.into_matched();
        let mut rest = ScanRest::new(&keys, stop, Some(42));
        let mut calls = 1;
        loop {
            assert_eq!(rest.cursor(), key_hash(&rest.keys()[0]).0);
            calls += 1;
            let mut walk = ScanWalk::new(None, 7);
            let stopped = walk.take(rest.keys());
            let matched = walk.into_matched();
            assert!(matched.len() <= 7);
            returned.extend(matched);
            match stopped {
                Some(stop) => rest.advance(stop),
                None => break,
            }
        }
        assert_eq!(rest.then(), Some(42));
        assert_eq!(calls, 15, "100 keys, 7 a call");
        assert_eq!(returned, keys, "every key once, in order");
    }

    #[test]
    fn scan_walk_never_splits_the_keys_of_one_hash() {
        // A hash of the first byte: "a1", "a2", "a3" collide.
        let keys: Vec<Bytes> = ["a1", "a2", "a3", "b1", "c1"]
            .iter()
            .map(|k| Bytes::from(*k))
            .collect();
        let mut walk = ScanWalk::new(None, 1);
        walk.hash = |key| u64::from(key[0]);
        let stop = walk.take(&keys).expect("stops before b");
        assert_eq!(
            stop,
            ScanStop {
                cursor: u64::from(b'b'),
                at: 3
            }
        );
        assert_eq!(walk.into_matched(), keys[..3]);
        // Done exactly at the end of the keys: nothing left, the enumeration goes on.
        let mut walk = ScanWalk::new(None, 5);
        assert_eq!(walk.take(&keys), None);
        assert!(walk.is_done());
    }
}
