//! Starting from a data directory: the member file (which member and group a directory
//! belongs to), a fresh directory's initialization, exporting and reading a [`Seed`], the
//! group id, and decoding the state held in a snapshot.

use super::config::{NodeConfig, Seed, StartError, MAX_SIZE_PER_MSG};
use crate::raft_storage::RaftStorage;
use crate::state::{Command, CoordinatorState};
use raft::eraftpb::{EntryType, Snapshot};
use raft::Storage as _;

/// First bytes of a seed file.
const SEED_MAGIC: &[u8; 8] = b"RPSEED01";

impl Seed {
    /// Reads the configuration held in the data directory of a stopped member.
    pub fn export(data_dir: &std::path::Path) -> Result<Seed, StartError> {
        if is_fresh(data_dir) {
            return Err(StartError::Config(format!(
                "{} holds no coordinator",
                data_dir.display()
            )));
        }
        let storage = RaftStorage::open(data_dir)?;
        let first = storage.first_index()?;
        let last = storage.last_index()?;
        let mut state = if first > 1 {
            let snapshot = storage.snapshot(first - 1, 0)?;
            decode_state(snapshot.get_data()).map_err(|detail| StartError::Snapshot {
                dir: data_dir.to_path_buf(),
                detail,
            })?
        } else {
            CoordinatorState::new()
        };
        let mut next = first;
        while next <= last {
            let entries = storage.entries(
                next,
                last + 1,
                Some(MAX_SIZE_PER_MSG),
                raft::GetEntriesContext::empty(false),
            )?;
            for entry in &entries {
                if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() {
                    let command: Command =
                        bincode::deserialize(&entry.data).map_err(|e| StartError::Snapshot {
                            dir: data_dir.to_path_buf(),
                            detail: format!("entry {} does not decode: {e}", entry.index),
                        })?;
                    state.apply(&command);
                }
                next = entry.index + 1;
            }
        }
        if last == 0 {
            return Err(StartError::Config(format!(
                "{} holds an empty log: nothing to export",
                data_dir.display()
            )));
        }
        let last_term = storage.term(last)?;
        Ok(Seed {
            index: last,
            last_term,
            state,
        })
    }

    /// The seed file's bytes: magic, bincode, CRC-32C of the bincode.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let body = bincode::serialize(self).map_err(|e| format!("cannot encode a seed: {e}"))?;
        let mut bytes = SEED_MAGIC.to_vec();
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        Ok(bytes)
    }

    /// Reads a seed file's bytes, checking the magic, the checksum and the state.
    pub fn decode(bytes: &[u8]) -> Result<Seed, String> {
        let body = bytes
            .strip_prefix(SEED_MAGIC)
            .ok_or("not a coordinator seed file")?;
        let (body, crc) = body.split_last_chunk::<4>().ok_or("truncated seed file")?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err("seed file checksum mismatch (corrupt or truncated)".into());
        }
        // The state is the last field: its older encoding is decoded after the rest.
        const HEADER: usize = 16;
        if body.len() < HEADER {
            return Err("truncated seed file".into());
        }
        let (index, last_term): (u64, u64) =
            bincode::deserialize(&body[..HEADER]).map_err(|e| format!("bad seed file: {e}"))?;
        let state =
            CoordinatorState::decode(&body[HEADER..]).map_err(|e| format!("bad seed file: {e}"))?;
        let seed = Seed {
            index,
            last_term,
            state,
        };
        if seed.index == 0 {
            return Err("seed file starts at log index 0".into());
        }
        seed.state
            .check_invariants()
            .map_err(|e| format!("seed breaks an invariant: {e}"))?;
        Ok(seed)
    }

    /// Identifies the seed in the group id.
    fn digest(&self) -> u64 {
        let body = bincode::serialize(self).unwrap_or_default();
        u64::from(crc32fast::hash(&body)) << 32 | self.index & 0xffff_ffff
    }
}

/// The id of a Raft group: a hash of its voters and of the seed it started from. Members
/// refuse Raft messages from another group, so an old member left running after its group
/// was re-created from a seed, or a member of a group with other voters, cannot disturb
/// this one. (Two unseeded groups with the same voter ids share an id: keep clusters'
/// `--peers` apart.)
pub fn group_id(voters: &[u64], seed: Option<&Seed>) -> u64 {
    // FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |value: u64| {
        for byte in value.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for voter in voters {
        eat(*voter);
    }
    eat(seed.map_or(0, Seed::digest));
    hash
}

/// Name of the file that records which member a data directory belongs to.
const MEMBER_FILE: &str = "member";

/// Whether `data_dir` holds no member yet (missing, or without a member file): starting
/// there initializes a new member.
pub fn is_fresh(data_dir: &std::path::Path) -> bool {
    !data_dir.join(MEMBER_FILE).exists()
}

/// Reads the member file of a used data directory: checks the id (a data directory
/// started under another id would vote twice in one term) and returns the group id.
pub(super) fn read_member_file(config: &NodeConfig) -> Result<u64, StartError> {
    let path = config.data_dir.join(MEMBER_FILE);
    let found = std::fs::read_to_string(&path)?;
    let mut id = None;
    let mut group = None;
    for line in found.lines() {
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["raft", "id", value] => id = value.parse::<u64>().ok(),
            ["group", value] => group = u64::from_str_radix(value, 16).ok(),
            _ => {}
        }
    }
    match (id, group) {
        (Some(id), Some(group)) if id == config.id => Ok(group),
        (Some(id), Some(_)) => Err(StartError::Config(format!(
            "{} belongs to coordinator {id}, not to id {}",
            config.data_dir.display(),
            config.id
        ))),
        _ => Err(StartError::Config(format!(
            "{} is unreadable: {found:?}",
            path.display()
        ))),
    }
}

/// Records the member id and group id, durably: the last step of a fresh start.
pub(super) fn write_member_file(config: &NodeConfig, group: u64) -> Result<(), StartError> {
    let text = format!("raft id {}\ngroup {group:016x}\n", config.id);
    let tmp = config.data_dir.join(format!("{MEMBER_FILE}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, config.data_dir.join(MEMBER_FILE))?;
    std::fs::File::open(&config.data_dir)?.sync_all()?;
    Ok(())
}

/// A store initialized by a start that stopped before writing the member file never ran
/// a node (no vote, no entry); it may be used if it is what this start would write.
pub(super) fn check_unfinished_start(
    storage: &RaftStorage,
    config: &NodeConfig,
) -> Result<(), StartError> {
    let held = storage.first_index()? - 1;
    let last = storage.last_index()?;
    let vote = storage.initial_state()?.hard_state.vote;
    let expected = config.seed.as_ref().map_or(0, |seed| seed.index);
    if held == expected && last == held && vote == 0 {
        return Ok(());
    }
    Err(StartError::Config(format!(
        "{} holds a Raft store from an earlier start that did not finish, made with other \
         settings (snapshot at {held}, expected {expected}); it never ran, so remove the \
         directory and start again",
        config.data_dir.display()
    )))
}

/// The snapshot a seeded member's log starts from: identical on every member.
pub(super) fn seed_snapshot(seed: &Seed, voters: &[u64]) -> Result<Snapshot, StartError> {
    let data = bincode::serialize(&seed.state)
        .map_err(|e| StartError::Config(format!("cannot encode the seed: {e}")))?;
    let mut snapshot = Snapshot::default();
    snapshot.set_data(data.into());
    let meta = snapshot.mut_metadata();
    meta.index = seed.index;
    meta.term = 1;
    meta.mut_conf_state().voters = voters.to_vec();
    Ok(snapshot)
}

pub(super) fn decode_state(data: &[u8]) -> Result<CoordinatorState, String> {
    let state = CoordinatorState::decode(data).map_err(|e| format!("undecodable snapshot: {e}"))?;
    state
        .check_invariants()
        .map_err(|e| format!("snapshot breaks an invariant: {e}"))?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_round_trips_and_those_of_older_releases_decode() {
        let mut opened = CoordinatorState::new();
        opened.apply(&Command::OpenClient);
        let seed = |state| Seed {
            index: 42,
            last_term: 3,
            state,
        };
        let bytes = seed(opened.clone()).encode().expect("encode");
        assert_eq!(Seed::decode(&bytes), Ok(seed(opened)));
        let bytes = seed(CoordinatorState::new()).encode().expect("encode");
        // The older encodings end the body without the rebalancer's settings and the
        // drained servers (a bool, an empty set's length, a u32 and another empty set's
        // length, 21 bytes), before that without the drains (the empty
        // set's length, 8 bytes), before that without the moves (the counter and two
        // empty maps' lengths, 24 bytes), and before that without the open clients (the
        // counter and the empty set's length, 16 bytes).
        let body = &bytes[SEED_MAGIC.len()..bytes.len() - 4];
        for cut in [21, 21 + 8, 21 + 8 + 24, 21 + 8 + 24 + 16] {
            let old_body = &body[..body.len() - cut];
            let mut old = SEED_MAGIC.to_vec();
            old.extend_from_slice(old_body);
            old.extend_from_slice(&crc32fast::hash(old_body).to_le_bytes());
            let decoded = Seed::decode(&old).expect("an older seed decodes");
            assert_eq!((decoded.index, decoded.last_term), (42, 3));
            assert_eq!(decoded.state, CoordinatorState::new());
        }
    }
}
