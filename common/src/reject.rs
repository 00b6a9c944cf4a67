//! `RejectRules`: the conditions under which a write-type operation is refused
//! (docs/design.md §3), and their evaluation against the object's current version.

use crate::ids::Version;
use crate::status::Status;
use serde::{Deserialize, Serialize};

/// Conditions on the current object that make a write, remove or increment fail instead
/// of applying. All false (the default) means "always apply".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RejectRules {
    /// The version the `version_*` rules compare against.
    pub given_version: Version,
    /// Reject if the object does not exist (→ `ObjectDoesntExist`).
    pub doesnt_exist: bool,
    /// Reject if the object exists (→ `ObjectExists`).
    pub exists: bool,
    /// Reject if the object exists and its version ≤ `given_version` (→ `WrongVersion`).
    pub version_le_given: bool,
    /// Reject if the object exists and its version ≠ `given_version` (→ `WrongVersion`).
    pub version_ne_given: bool,
}

impl RejectRules {
    /// Apply only if the object does not exist yet (create).
    pub fn create_only() -> Self {
        RejectRules {
            exists: true,
            ..Self::default()
        }
    }

    /// Apply only if the object exists with exactly `version` (compare-and-swap).
    pub fn version_is(version: Version) -> Self {
        RejectRules {
            given_version: version,
            doesnt_exist: true,
            version_ne_given: true,
            ..Self::default()
        }
    }

    /// Checks the rules against the current version (`None`: no object). Returns the
    /// status that rejects the operation, or `None` when it may proceed.
    pub fn check(&self, current: Option<Version>) -> Option<Status> {
        match current {
            None if self.doesnt_exist => Some(Status::ObjectDoesntExist),
            None => None,
            Some(_) if self.exists => Some(Status::ObjectExists),
            Some(v) if self.version_le_given && v <= self.given_version => {
                Some(Status::WrongVersion)
            }
            Some(v) if self.version_ne_given && v != self.given_version => {
                Some(Status::WrongVersion)
            }
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rules_never_reject() {
        let rules = RejectRules::default();
        assert_eq!(rules.check(None), None);
        assert_eq!(rules.check(Some(Version(5))), None);
    }

    #[test]
    fn each_rule_rejects_with_its_status() {
        let v = Version(5);
        let r = |f: fn(&mut RejectRules)| {
            let mut rules = RejectRules {
                given_version: v,
                ..RejectRules::default()
            };
            f(&mut rules);
            rules
        };
        assert_eq!(
            r(|r| r.doesnt_exist = true).check(None),
            Some(Status::ObjectDoesntExist)
        );
        assert_eq!(r(|r| r.doesnt_exist = true).check(Some(v)), None);
        assert_eq!(
            r(|r| r.exists = true).check(Some(v)),
            Some(Status::ObjectExists)
        );
        assert_eq!(r(|r| r.exists = true).check(None), None);
        assert_eq!(
            r(|r| r.version_le_given = true).check(Some(v)),
            Some(Status::WrongVersion)
        );
        assert_eq!(
            r(|r| r.version_le_given = true).check(Some(Version(4))),
            Some(Status::WrongVersion)
        );
        assert_eq!(
            r(|r| r.version_le_given = true).check(Some(Version(6))),
            None
        );
        assert_eq!(r(|r| r.version_le_given = true).check(None), None);
        assert_eq!(
            r(|r| r.version_ne_given = true).check(Some(Version(6))),
            Some(Status::WrongVersion)
        );
        assert_eq!(r(|r| r.version_ne_given = true).check(Some(v)), None);
    }

    #[test]
    fn version_is_acts_as_compare_and_swap() {
        let rules = RejectRules::version_is(Version(3));
        assert_eq!(rules.check(None), Some(Status::ObjectDoesntExist));
        assert_eq!(rules.check(Some(Version(2))), Some(Status::WrongVersion));
        assert_eq!(rules.check(Some(Version(3))), None);
    }
}
