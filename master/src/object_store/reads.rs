//! Reads of published objects: one key ([`ObjectStore::read`], or
//! [`ObjectStore::read_with`] without a copy), or a page of a tablet's objects in
//! key-hash order ([`ObjectStore::enumerate`]).

use bytes::Bytes;
use rampart_common::ids::{TableId, Version};
use rampart_common::limits::ENUMERATE_PAGE_BYTES_MAX;
use rampart_common::status::Status;
use std::ops::RangeInclusive;

use super::ops::{EnumeratePage, Object};
use super::store::ObjectStore;

impl ObjectStore {
    /// Reads the published object `key`: `UnknownTablet` when this master does not own
    /// it, `KeyTooLarge`, or `ObjectDoesntExist`.
    pub fn read(&self, table: TableId, key: &[u8]) -> Result<Object, Status> {
        self.read_with(table, key, |status, version, value| match status {
            Status::Ok => Ok(Object {
                version,
                value: Bytes::copy_from_slice(value),
            }),
            status => Err(status),
        })
    }

    /// Like [`read`](Self::read) but hands the value to `f` without copying it first
    /// (the RPC service encodes it straight into the reply frame).
    pub fn read_with<R>(
        &self,
        table: TableId,
        key: &[u8],
        f: impl FnOnce(Status, Version, &[u8]) -> R,
    ) -> R {
        let hash = match self.check_key(table, key) {
            Ok(hash) => hash,
            Err(status) => return f(status, Version(0), &[]),
        };
        let log = &self.log;
        match self.index.lookup(table, hash, key, |r| log.key(r)) {
            Some(at) => {
                let object = log.object(at);
                f(Status::Ok, object.version, object.value)
            }
            None => f(Status::ObjectDoesntExist, Version(0), &[]),
        }
    }

    /// One page of the objects of `table` whose key hashes lie in `hashes`, of about
    /// `max_bytes` (clamped to 1..=[`ENUMERATE_PAGE_BYTES_MAX`]; whole hash buckets, so
    /// a page may go past it by one bucket). The range's start must be owned here
    /// (`UnknownTablet`) and not past its end (`InvalidArgument`); past the tablet
    /// that owns the start, the page stops and `next_hash` sends the caller on.
    pub fn enumerate(
        &self,
        table: TableId,
        hashes: RangeInclusive<u64>,
        max_bytes: u32,
    ) -> Result<EnumeratePage, Status> {
        let (resume_hash, end_hash) = hashes.into_inner();
        let (_, owned_end) = self
            .tablets
            .range_of(table, resume_hash)
            .ok_or(Status::UnknownTablet)?;
        if end_hash < resume_hash {
            return Err(Status::InvalidArgument);
        }

        // The client may think this master owns more than it does now; serve what it
        // owns and send the client elsewhere for the rest.
        let end = self.before_frozen(table, resume_hash, end_hash.min(owned_end))?;
        let max_bytes = (max_bytes as usize).clamp(1, ENUMERATE_PAGE_BYTES_MAX);
        let mut objects = Vec::new();
        let mut bytes = 0usize;
        let mut next_hash = None;
        // A page ends between two hashes, never inside the objects of one (colliding
        // keys): the cursor is a hash.
        let mut last = None;
        for (hash, at) in self.index.range(table, resume_hash..=end) {
            if bytes >= max_bytes && last != Some(hash) {
                next_hash = Some(hash.0);
                break;
            }
            last = Some(hash);
            let object = self.log.object(at);
            bytes += object.key.len() + object.value.len() + 16;
            objects.push((
                Bytes::copy_from_slice(object.key),
                Object {
                    version: object.version,
                    value: Bytes::copy_from_slice(object.value),
                },
            ));
        }
        if next_hash.is_none() && end < end_hash {
            next_hash = Some(end + 1);
        }
        Ok(EnumeratePage { objects, next_hash })
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rampart_common::ids::{key_hash, ServerId};
    use std::collections::HashSet;

    use super::super::test_support::{apply, config, put, store, tablet, write, ReadResult, TABLE};

    /// Enumerates `[resume, end]` of `TABLE` page by page, checking each page's bounds.
    fn enumerate_all(store: &ObjectStore, end: u64, max_bytes: u32) -> Vec<(Bytes, Object)> {
        let mut all = Vec::new();
        let mut resume = Some(0u64);
        let mut pages = 0;
        while let Some(resume_hash) = resume {
            pages += 1;
            assert!(pages <= 100_000, "enumeration does not terminate");
            let page = store
                .enumerate(TABLE, resume_hash..=end, max_bytes)
                .unwrap();
            assert!(
                !page.objects.is_empty() || page.next_hash.is_none(),
                "no progress"
            );
            let sizes: Vec<usize> = page
                .objects
                .iter()
                .map(|(key, o)| key.len() + o.value.len() + 16)
                .collect();
            // Soft bound: everything but the last object fits under max_bytes.
            let before_last: usize = sizes.iter().rev().skip(1).sum();
            assert!(
                before_last < (max_bytes as usize).max(1),
                "page over its bound"
            );
            let hashes: Vec<u64> = page
                .objects
                .iter()
                .map(|(key, _)| key_hash(key).0)
                .collect();
            assert!(hashes.iter().all(|h| (resume_hash..=end).contains(h)));
            if let Some(next) = page.next_hash {
                assert!(next > resume_hash);
                assert!(hashes.iter().all(|h| *h < next));
            }
            all.extend(page.objects);
            resume = page.next_hash;
        }
        all
    }

    #[test]
    fn read_with_hands_over_the_same_object_as_read() {
        let mut store = store();
        let version = put(&mut store, b"k", b"hello");
        let (status, got_version, value) =
            store.read_with(TABLE, b"k", |s, v, bytes| (s, v, bytes.to_vec()));
        assert_eq!(
            (status, got_version, &value[..]),
            (Status::Ok, version, &b"hello"[..])
        );
        let missing = store.read_with(TABLE, b"nope", |s, v, bytes| (s, v, bytes.len()));
        assert_eq!(missing, (Status::ObjectDoesntExist, Version(0), 0));
    }

    #[test]
    fn read_of_a_missing_key_is_object_doesnt_exist() {
        let mut store = store();
        put(&mut store, b"present", b"x");
        let read = store.read(TABLE, b"absent");
        assert_eq!(read.status(), Status::ObjectDoesntExist);
        assert_eq!(read.version(), Version(0));
        assert!(read.value().is_empty());
    }

    #[test]
    fn enumerate_returns_objects_in_key_hash_order() {
        let mut store = store();
        for i in 0..200 {
            put(
                &mut store,
                format!("key-{i}").as_bytes(),
                format!("value-{i}").as_bytes(),
            );
        }
        let page = store.enumerate(TABLE, 0..=u64::MAX, u32::MAX).unwrap();
        assert_eq!(page.next_hash, None);
        assert_eq!(page.objects.len(), 200);
        let hashes: Vec<u64> = page
            .objects
            .iter()
            .map(|(key, _)| key_hash(key).0)
            .collect();
        assert!(hashes.windows(2).all(|w| w[0] < w[1]), "hash order");
        for (key, object) in &page.objects {
            let read = store.read(TABLE, key);
            assert_eq!(read.as_ref(), Ok(object));
        }
    }

    #[test]
    fn enumerate_pages_respect_max_bytes_and_cover_every_object_once() {
        let mut store = store();
        let mut expected = HashSet::new();
        for i in 0..300 {
            let key = format!("key-{i}");
            put(&mut store, key.as_bytes(), &vec![b'v'; i % 50]);
            expected.insert(key.into_bytes());
        }
        for max_bytes in [0, 1, 100, 500, 4096, u32::MAX] {
            let all = enumerate_all(&store, u64::MAX, max_bytes);
            let keys: Vec<Vec<u8>> = all.iter().map(|(key, _)| key.to_vec()).collect();
            let unique: HashSet<Vec<u8>> = keys.iter().cloned().collect();
            assert_eq!(
                keys.len(),
                unique.len(),
                "max_bytes {max_bytes}: duplicates"
            );
            assert_eq!(unique, expected, "max_bytes {max_bytes}");
            let hashes: Vec<u64> = all.iter().map(|(key, _)| key_hash(key).0).collect();
            assert!(hashes.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn enumerate_past_the_owned_range_resumes_after_its_end() {
        let split = u64::MAX / 3;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 0, split)]);
        let mut owned = 0;
        for i in 0..100 {
            let key = format!("key-{i}");
            let status = apply(&mut store, &write(key.as_bytes(), b"v")).status;
            if key_hash(key.as_bytes()).0 <= split {
                assert_eq!(status, Status::Ok);
                owned += 1;
            } else {
                assert_eq!(status, Status::UnknownTablet);
            }
        }
        assert!(owned > 0);
        let page = store.enumerate(TABLE, 0..=u64::MAX, u32::MAX).unwrap();
        assert_eq!(page.objects.len(), owned);
        assert_eq!(page.next_hash, Some(split + 1));
        // A request that stays inside the owned range ends there.
        let inside = store.enumerate(TABLE, 0..=split, u32::MAX).unwrap();
        assert_eq!(inside.next_hash, None);
        assert_eq!(inside.objects.len(), owned);
    }

    #[test]
    fn enumerate_from_outside_the_owned_range_is_unknown_tablet() {
        let split = u64::MAX / 3;
        let mut store = ObjectStore::new(ServerId(1), config());
        store.take_tablets(&[tablet(TABLE, 100, split)]);
        let request =
            |table: TableId, resume_hash: u64| store.enumerate(table, resume_hash..=u64::MAX, 1024);
        for resume in [0, 99, split + 1, u64::MAX] {
            assert_eq!(request(TABLE, resume), Err(Status::UnknownTablet));
        }
        assert_eq!(request(TableId(9), 100), Err(Status::UnknownTablet));
        assert!(request(TABLE, 100).is_ok());
        assert!(request(TABLE, split).is_ok());
        assert_eq!(
            store.enumerate(TABLE, RangeInclusive::new(200, 150), 1024),
            Err(Status::InvalidArgument)
        );
    }
}
