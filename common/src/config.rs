//! Validated configuration of a storage server's master, and byte-size parsing for
//! flags such as `--memory 4GiB`.
//!
//! Every node is built from a config that passed [`MasterConfig::validate`]; a bad value
//! is a clear error at start-up, never a panic or a surprise later.

use crate::limits::{KEY_BYTES_MAX, VALUE_BYTES_LIMIT, VALUE_BYTES_MAX_DEFAULT};
use crate::log::{
    digest_entry_bytes, object_entry_bytes, CHECKSUM_ENTRY_BYTES, COMPLETION_ENTRY_BYTES,
    FOOTER_ENTRY_BYTES,
};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Default segment size (docs/design.md §4): large enough that a disk writes a replica in
/// one efficient I/O, small enough that recovery splits a log into many pieces.
pub const SEGMENT_BYTES_DEFAULT: u32 = 8 * 1024 * 1024;

/// Smallest segment allowed: tests use small segments to exercise rollover often.
pub const SEGMENT_BYTES_MIN: u32 = 4 * 1024;

/// Largest segment: replicas move in one piece and offsets are u32.
pub const SEGMENT_BYTES_MAX: u32 = 256 * 1024 * 1024;

/// Default master memory for its log.
pub const MEMORY_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;

/// Bytes a segment needs besides its digest and one object: header, safe version,
/// two batch checksums and the footer with its checksum, rounded up generously.
pub const SEGMENT_FIXED_OVERHEAD_BYTES: usize = 128 + 2 * CHECKSUM_ENTRY_BYTES + FOOTER_ENTRY_BYTES;

/// Configuration of one master.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterConfig {
    /// Bytes of one segment of the log.
    pub segment_bytes: u32,
    /// Bytes of DRAM the log may use in all (rounded down to whole segments).
    pub memory_bytes: u64,
    /// Largest value accepted, in bytes.
    pub value_bytes_max: usize,
    /// Percent of the memory's segments in use from which an idle master cleans its
    /// log (under load it cleans once few segments are free, whatever this says).
    #[serde(default = "cleaner_threshold_pct_default")]
    pub cleaner_threshold_pct: u8,
}

/// Default of [`MasterConfig::cleaner_threshold_pct`].
pub const CLEANER_THRESHOLD_PCT_DEFAULT: u8 = 90;

fn cleaner_threshold_pct_default() -> u8 {
    CLEANER_THRESHOLD_PCT_DEFAULT
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            memory_bytes: MEMORY_BYTES_DEFAULT,
            value_bytes_max: VALUE_BYTES_MAX_DEFAULT,
            cleaner_threshold_pct: CLEANER_THRESHOLD_PCT_DEFAULT,
        }
    }
}

/// A configuration value that cannot work, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl MasterConfig {
    /// Checks every field and the relations between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes) {
            return Err(ConfigError(format!(
                "segment size {} is outside {}..={}",
                ByteSize(u64::from(self.segment_bytes)),
                ByteSize(u64::from(SEGMENT_BYTES_MIN)),
                ByteSize(u64::from(SEGMENT_BYTES_MAX))
            )));
        }
        if !(1..=99).contains(&self.cleaner_threshold_pct) {
            return Err(ConfigError(format!(
                "cleaner threshold {} % is outside 1..=99",
                self.cleaner_threshold_pct
            )));
        }
        if self.value_bytes_max > VALUE_BYTES_LIMIT {
            return Err(ConfigError(format!(
                "value limit {} exceeds the protocol limit {}",
                ByteSize(self.value_bytes_max as u64),
                ByteSize(VALUE_BYTES_LIMIT as u64)
            )));
        }
        // A fresh segment must hold its digest (one id per segment the memory allows)
        // and still take the largest object, or some write could never be stored.
        // An object and its completion record are one append (`crate::rifl`).
        let largest =
            object_entry_bytes(KEY_BYTES_MAX, self.value_bytes_max) + COMPLETION_ENTRY_BYTES;
        let digest = digest_entry_bytes(usize::try_from(self.segments_max()).unwrap_or(usize::MAX));
        if largest.saturating_add(digest) + SEGMENT_FIXED_OVERHEAD_BYTES
            > self.segment_bytes as usize
        {
            return Err(ConfigError(format!(
                "segment size {} cannot hold its digest of {} segments and the largest \
                 object ({} key + {} value); raise --segment-bytes or lower --value-bytes-max",
                ByteSize(u64::from(self.segment_bytes)),
                self.segments_max(),
                ByteSize(KEY_BYTES_MAX as u64),
                ByteSize(self.value_bytes_max as u64)
            )));
        }
        if self.segments_max() < 2 {
            return Err(ConfigError(format!(
                "memory {} holds fewer than two segments of {}",
                ByteSize(self.memory_bytes),
                ByteSize(u64::from(self.segment_bytes))
            )));
        }
        Ok(())
    }

    /// How many segments the memory limit allows.
    pub fn segments_max(&self) -> u64 {
        self.memory_bytes / u64::from(self.segment_bytes)
    }
}

/// A byte count that parses and prints with binary units (`512KiB`, `4GiB`, `100MB`
/// is read as MiB too: operators mean powers of two for memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let number: u64 = digits
            .parse()
            .map_err(|_| ConfigError(format!("'{text}' is not a byte size such as 4GiB")))?;
        let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => {
                return Err(ConfigError(format!(
                    "unknown byte unit '{other}' in '{text}'"
                )))
            }
        };
        number
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| ConfigError(format!("'{text}' is too large")))
    }
}

/// Binary units, largest first.
const BYTE_UNITS: [(&str, u64); 4] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

impl ByteSize {
    /// The size for a person: in the largest unit it reaches, with one decimal when it
    /// is not whole (`Display` is exact, so that it parses back: `46255000B`).
    pub fn readable(self) -> String {
        for (name, size) in BYTE_UNITS {
            if self.0 >= size {
                return if self.0 % size == 0 {
                    format!("{}{name}", self.0 / size)
                } else {
                    format!("{:.1}{name}", self.0 as f64 / size as f64)
                };
            }
        }
        format!("{}B", self.0)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, size) in BYTE_UNITS {
            if self.0 >= size && self.0 % size == 0 {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!("4GiB".parse::<ByteSize>(), Ok(ByteSize(4 << 30)));
        assert_eq!("512k".parse::<ByteSize>(), Ok(ByteSize(512 << 10)));
        assert_eq!("100".parse::<ByteSize>(), Ok(ByteSize(100)));
        assert_eq!("8 MiB".parse::<ByteSize>(), Ok(ByteSize(8 << 20)));
        assert!("lots".parse::<ByteSize>().is_err());
        assert!("5XB".parse::<ByteSize>().is_err());
        assert!("99999999999999TiB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(4 << 30).to_string(), "4GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }

    #[test]
    fn readable_sizes_are_in_the_largest_unit() {
        assert_eq!(ByteSize(46_255_000).readable(), "44.1MiB");
        assert_eq!(ByteSize(64 << 20).readable(), "64MiB");
        assert_eq!(ByteSize(1536).readable(), "1.5KiB");
        assert_eq!(ByteSize(999).readable(), "999B");
    }

    #[test]
    fn default_config_is_valid() {
        assert_eq!(MasterConfig::default().validate(), Ok(()));
    }

    #[test]
    fn the_cleaner_threshold_is_a_percentage_below_100() {
        for (pct, ok) in [(0, false), (1, true), (90, true), (99, true), (100, false)] {
            let config = MasterConfig {
                cleaner_threshold_pct: pct,
                ..MasterConfig::default()
            };
            assert_eq!(config.validate().is_ok(), ok, "{pct} %");
        }
    }

    #[test]
    fn config_rejects_segments_too_small_for_the_largest_object() {
        let config = MasterConfig {
            segment_bytes: 128 * 1024,
            memory_bytes: 64 << 20,
            ..MasterConfig::default()
        };
        assert!(
            config.validate().is_err(),
            "a 1 MiB value cannot fit a 128 KiB segment"
        );
        let small_values = MasterConfig {
            value_bytes_max: 1024,
            ..config.clone()
        };
        assert_eq!(small_values.validate(), Ok(()));
        // The digest names every segment the memory allows: 1 GiB of 128 KiB segments
        // needs a 64 KiB digest, which leaves no room for a 64 KiB key.
        let huge_digest = MasterConfig {
            memory_bytes: 1 << 30,
            ..small_values
        };
        assert!(huge_digest.validate().is_err());
    }

    #[test]
    fn config_rejects_memory_below_two_segments() {
        let config = MasterConfig {
            memory_bytes: 8 << 20,
            ..MasterConfig::default()
        };
        assert!(config.validate().is_err());
    }
}
