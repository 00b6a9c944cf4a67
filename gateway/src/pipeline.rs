//! Which of a connection's pipelined commands the gateway sends together (pure).
//!
//! A client that pipelines (`redis-benchmark -P 16`, a client library's pipeline)
//! sends many requests before it reads a reply. Run one at a time, each waits for its
//! master's round trip before the next leaves; sent together, a run of them costs one
//! multi-operation, which the client library splits into one request per master, all in
//! flight at once.
//!
//! # Guarantees
//! Replies keep the requests' order, and a connection's commands take effect in its
//! order, as in Redis: only consecutive commands of one kind go together — `GET`s (a
//! multi-read), or `SET`s without `GET` (a multi-write; `NX`/`XX` become each item's
//! reject rules) of distinct keys, so that no key is written twice in one
//! multi-operation, whose items are applied in no particular order. Anything else (an
//! `INCR`, a `DEL`, an error to answer) ends the run and runs alone, after it.
//!
//! What Redis gives and a run does not: Redis runs one connection's pipeline
//! sequentially, so two `GET`s in a row cannot see another client's two writes in the
//! reverse order; the reads of one run are concurrent, and can (as this gateway's
//! `MGET` can). Writes of one run are each exactly once, as alone.

use bytes::Bytes;
use std::collections::HashSet;

use crate::commands::{Command, SetCondition};
use crate::resp::Reply;

/// Commands taken together at most: a connection's pipelined requests are taken off
/// its input this many at a time, so that a bulk load (a client pipelining a thousand
/// `SET`s) costs one multi-write, not sixteen round trips one after the other. What they
/// take is bounded by the connection's input bound.
pub const PIPELINE_BATCH_MAX: usize = 1024;

/// `GET`s sent together at most: 64 of the cluster's default largest value (1 MiB)
/// reply [`REPLY_BYTES_PENDING_MAX`](crate::gateway::REPLY_BYTES_PENDING_MAX), the
/// most a connection's replies may hold before they are written.
pub const GET_RUN_MAX: usize = 64;

const _: () = assert!(GET_RUN_MAX <= PIPELINE_BATCH_MAX);

/// Commands that run as one multi-operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Together {
    /// `GET` of each key.
    Gets(Vec<Bytes>),
    /// `SET key value [NX|XX]` of each, keys distinct.
    Sets(Vec<(Bytes, Bytes, SetCondition)>),
}

impl Together {
    /// The commands it covers.
    pub fn len(&self) -> usize {
        match self {
            Together::Gets(keys) => keys.len(),
            Together::Sets(items) => items.len(),
        }
    }

    /// Whether it covers none (never, as [`together_at_front`] makes them).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The commands at the front of `commands` (parsed, or the error to answer) that go
/// together: two or more; `None` when the first runs alone.
pub fn together_at_front(commands: &[Result<Command, Reply>]) -> Option<Together> {
    let together = match commands.first()? {
        Ok(Command::Get(_)) => Together::Gets(
            commands
                .iter()
                .map_while(|command| match command {
                    Ok(Command::Get(key)) => Some(key.clone()),
                    _ => None,
                })
                .take(GET_RUN_MAX)
                .collect(),
        ),
        Ok(Command::Set { get: false, .. }) => {
            let mut items: Vec<(Bytes, Bytes, SetCondition)> = Vec::new();
            let mut keys: HashSet<&Bytes> = HashSet::new();
            for command in commands {
                let Ok(Command::Set {
                    key,
                    value,
                    condition,
                    get: false,
                }) = command
                else {
                    break;
                };
                if !keys.insert(key) {
                    break;
                }
                items.push((key.clone(), value.clone(), *condition));
            }
            Together::Sets(items)
        }
        _ => return None,
    };
    (together.len() >= 2).then_some(together)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(key: &str) -> Result<Command, Reply> {
        Ok(Command::Get(Bytes::copy_from_slice(key.as_bytes())))
    }

    fn set(key: &str, condition: SetCondition) -> Result<Command, Reply> {
        Ok(Command::Set {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            condition,
            get: false,
        })
    }

    fn keys(together: Option<Together>) -> Vec<String> {
        let keys: Vec<Bytes> = match together {
            None => return Vec::new(),
            Some(Together::Gets(keys)) => keys,
            Some(Together::Sets(items)) => items.into_iter().map(|(key, _, _)| key).collect(),
        };
        keys.iter()
            .map(|k| String::from_utf8_lossy(k).to_string())
            .collect()
    }

    #[test]
    fn together_at_front_takes_consecutive_gets_or_sets_of_distinct_keys() {
        let always = SetCondition::Always;
        let commands = [get("a"), get("b"), get("a"), set("c", always), get("d")];
        assert_eq!(keys(together_at_front(&commands)), ["a", "b", "a"]);
        // SETs: NX and XX go along; a key written twice ends the run before its second
        // write, as does a SET ... GET or anything else.
        let commands = [
            set("a", always),
            set("b", SetCondition::IfAbsent),
            set("a", always),
        ];
        assert!(matches!(
            together_at_front(&commands),
            Some(Together::Sets(items)) if items.len() == 2 && items[1].2 == SetCondition::IfAbsent
        ));
        let with_get = Ok(Command::Set {
            key: Bytes::from_static(b"z"),
            value: Bytes::from_static(b"v"),
            condition: always,
            get: true,
        });
        assert_eq!(
            keys(together_at_front(&[
                set("a", always),
                set("b", always),
                with_get
            ])),
            ["a", "b"]
        );
        // One alone, or a first command of another kind: nothing goes together.
        assert_eq!(together_at_front(&[get("a"), set("b", always)]), None);
        assert_eq!(
            together_at_front(&[Err(Reply::err("bad")), get("a"), get("b")]),
            None
        );
        assert_eq!(
            together_at_front(&[Ok(Command::Quit), get("a"), get("b")]),
            None
        );
        assert_eq!(together_at_front(&[]), None);
    }

    #[test]
    fn a_bulk_load_goes_as_one_run_and_gets_at_most_get_run_max() {
        let sets: Vec<_> = (0..PIPELINE_BATCH_MAX)
            .map(|i| set(&format!("k{i}"), SetCondition::Always))
            .collect();
        assert_eq!(
            together_at_front(&sets).map(|t| t.len()),
            Some(PIPELINE_BATCH_MAX)
        );
        let gets: Vec<_> = (0..GET_RUN_MAX + 10)
            .map(|i| get(&format!("k{i}")))
            .collect();
        assert_eq!(together_at_front(&gets).map(|t| t.len()), Some(GET_RUN_MAX));
    }
}
