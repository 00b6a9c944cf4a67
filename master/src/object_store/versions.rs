//! Versions: the safe version a new object gets, and the version ceiling reserved at
//! the coordinator that every version handed out stays below (the rules:
//! `object_store`'s module doc, "Versions").

use rampart_common::ids::Version;

use super::store::ObjectStore;

/// Versions a master reserves at the coordinator at a time (`ReserveVersions`, one Raft
/// commit): at a million writes a second, an hour and more of writing.
pub const VERSION_RESERVATION: u64 = 1 << 32;

/// A reservation is made once fewer than this many versions are left below the ceiling:
/// half a reservation, so it is in place long before the versions run out.
pub const VERSION_LOW_WATER: u64 = VERSION_RESERVATION / 2;

const _: () = assert!(VERSION_LOW_WATER < VERSION_RESERVATION);

impl ObjectStore {
    /// The version a new object would get now.
    pub fn safe_version(&self) -> Version {
        self.safe_version
    }

    /// Makes this master hand out only versions below a ceiling reserved at the
    /// coordinator, starting from none: call before it serves anything.
    pub fn enforce_version_ceiling(&mut self) {
        self.version_ceiling = Version(0);
    }

    /// The version ceiling this master knows.
    pub fn version_ceiling(&self) -> Version {
        self.version_ceiling
    }

    /// Raises the version ceiling to `ceiling` (reserved at the coordinator, or reported
    /// by it); a lower one changes nothing.
    pub fn raise_version_ceiling(&mut self, ceiling: Version) {
        self.version_ceiling = self.version_ceiling.max(ceiling);
    }

    /// The ceiling to reserve now, if fewer than [`VERSION_LOW_WATER`] versions are left
    /// below the one held: the highest version held plus [`VERSION_RESERVATION`].
    pub fn ceiling_wanted(&self) -> Option<Version> {
        let left = self.version_ceiling.0.saturating_sub(self.version_max.0);
        (left < VERSION_LOW_WATER)
            .then(|| Version(self.version_max.0.saturating_add(VERSION_RESERVATION)))
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with its location: exactly what a test wants.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rampart_common::status::Status;

    use super::super::test_support::{
        apply, apply_batch, delete, put, remove, store, write, ReadResult, TABLE,
    };

    #[test]
    fn remove_then_recreate_gets_a_higher_version() {
        let mut store = store();
        let first = put(&mut store, b"k", b"one");
        let second = put(&mut store, b"k", b"two");
        assert_eq!(delete(&mut store, b"k"), second);
        assert_eq!(store.read(TABLE, b"k").status(), Status::ObjectDoesntExist);
        let recreated = put(&mut store, b"k", b"three");
        assert!(recreated > second, "{recreated} after removing {second}");
        assert!(recreated > first);
        let read = store.read(TABLE, b"k");
        assert_eq!(
            (read.version(), &read.value()[..]),
            (recreated, &b"three"[..])
        );
    }

    #[test]
    fn recreated_key_outranks_every_version_ever_removed() {
        let mut store = store();
        let low = put(&mut store, b"low", b"x");
        let mut high = put(&mut store, b"high", b"x");
        for _ in 0..20 {
            high = put(&mut store, b"high", b"x");
        }
        assert!(high > low);
        // The safe version is master-wide: removing "high" raises the floor for every
        // key, so "low" re-created afterwards must not reuse a version "high" had.
        let mut removed = vec![delete(&mut store, b"high"), delete(&mut store, b"low")];
        let low_again = put(&mut store, b"low", b"y");
        assert!(
            removed.iter().all(|v| low_again > *v),
            "{low_again} vs {removed:?}"
        );
        // And a brand-new key too, and again after a remove in the same batch.
        let fresh = put(&mut store, b"fresh", b"z");
        assert!(removed.iter().all(|v| fresh > *v));
        let outcomes = apply_batch(
            &mut store,
            &[remove(b"fresh"), remove(b"low"), write(b"low", b"w")],
        );
        assert!(outcomes.iter().all(|o| o.status == Status::Ok));
        removed.extend(outcomes[..2].iter().map(|o| o.version));
        let last = outcomes[2].version;
        assert!(removed.iter().all(|v| last > *v), "{last} vs {removed:?}");
        assert!(removed.iter().all(|v| store.safe_version() > *v));
    }

    #[test]
    fn writes_stay_below_the_version_ceiling_and_ask_for_more_ahead() {
        let mut store = store();
        store.enforce_version_ceiling();
        // Nothing reserved yet: a write is answered Retry and changes nothing.
        let refused = apply(&mut store, &write(b"k", b"v"));
        assert_eq!(refused.status, Status::Retry);
        assert_eq!(store.read(TABLE, b"k").status(), Status::ObjectDoesntExist);
        let wanted = store.ceiling_wanted().expect("a reservation is due");
        assert_eq!(wanted, Version(Version::FIRST.0 + VERSION_RESERVATION));
        store.raise_version_ceiling(Version(3));
        assert_eq!(put(&mut store, b"k", b"v1"), Version(1));
        assert_eq!(put(&mut store, b"k", b"v2"), Version(2));
        // Version 3 is not below the ceiling.
        assert_eq!(apply(&mut store, &write(b"k", b"v3")).status, Status::Retry);
        store.raise_version_ceiling(wanted);
        assert_eq!(store.ceiling_wanted(), None, "far from the ceiling");
        assert_eq!(put(&mut store, b"k", b"v3"), Version(3));
        // A lower ceiling (a stale report) changes nothing.
        store.raise_version_ceiling(Version(2));
        assert_eq!(store.version_ceiling(), wanted);
    }
}
