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
//! One exception to "distinct keys": a plain `SET` (no `NX`, `XX` or `GET`) of a key
//! that an earlier plain `SET` of the run writes is *absorbed* — the run writes the key
//! once, with the last value, and that one write answers every `SET` of the key
//! ([`SetRun`]). This is what Redis's own semantics allow: the replies come after the
//! last value is durable, so each absorbed `SET` can be taken to have happened, in
//! order, just before it (within the time between its request and its reply), its value
//! overwritten before anyone could read it. It is what makes a pipeline of writes to
//! one key (`redis-benchmark -P 16` without `-r` writes one key) one round trip instead
//! of sixteen. Should the write be refused (the last value too large, no space), the
//! gateway runs the key's `SET`s again one at a time, so that each gets the answer it
//! would have had alone; should its outcome be unknown (a timeout), each absorbed `SET`
//! is answered so, which holds for each of them. A `SET` absorbs only earlier values no
//! longer than its own, so that an absorbed value that would have been refused alone
//! (too large for the cluster) cannot be answered `OK` by a write of a shorter one; a
//! shorter value, or a conditional `SET` of a key the run writes already (its answer
//! depends on the write before it), ends the run.
//!
//! What Redis gives and a run does not: Redis runs one connection's pipeline
//! sequentially, so two `GET`s in a row cannot see another client's two writes in the
//! reverse order; the reads of one run are concurrent, and can (as this gateway's
//! `MGET` can). Writes of one run are each exactly once, as alone.

use bytes::Bytes;
use std::collections::HashMap;

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
    /// `SET key value [NX|XX]` commands, one write per key.
    Sets(SetRun),
}

/// A run of `SET`s: the writes to send, one per key, and which write answers each
/// command (module doc, on absorbed `SET`s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetRun {
    /// `(key, value, condition)`, keys distinct; a key that plain `SET`s of the run
    /// write more than once carries the last one's value.
    pub items: Vec<(Bytes, Bytes, SetCondition)>,
    /// For each command of the run, in order: the item that answers it, and its own
    /// value (what it writes should it have to run alone).
    pub commands: Vec<(usize, Bytes)>,
}

impl SetRun {
    /// How many commands each item answers (more than one: it absorbed plain `SET`s).
    pub fn commands_per_item(&self) -> Vec<usize> {
        let mut answers = vec![0; self.items.len()];
        for (item, _) in &self.commands {
            answers[*item] += 1;
        }
        answers
    }
}

impl Together {
    /// The commands it covers.
    pub fn len(&self) -> usize {
        match self {
            Together::Gets(keys) => keys.len(),
            Together::Sets(run) => run.commands.len(),
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
            let mut run = SetRun {
                items: Vec::new(),
                commands: Vec::new(),
            };
            // Each key's item (room for a bulk load's run at once).
            let mut item_of: HashMap<&Bytes, usize> =
                HashMap::with_capacity(commands.len().min(PIPELINE_BATCH_MAX));
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
                let item = match item_of.get(key) {
                    None => {
                        item_of.insert(key, run.items.len());
                        run.items.push((key.clone(), value.clone(), *condition));
                        run.items.len() - 1
                    }
                    // Only by a value no shorter: what refuses the absorbed value on its
                    // own (too large) refuses the absorbing one, and then they run alone.
                    Some(&item)
                        if *condition == SetCondition::Always
                            && run.items[item].2 == SetCondition::Always
                            && value.len() >= run.items[item].1.len() =>
                    {
                        run.items[item].1 = value.clone();
                        item
                    }
                    // A conditional SET answers after the write before it.
                    Some(_) => break,
                };
                run.commands.push((item, value.clone()));
            }
            Together::Sets(run)
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

    /// The keys of the commands covered, in order.
    fn keys(together: Option<Together>) -> Vec<String> {
        let keys: Vec<Bytes> = match together {
            None => return Vec::new(),
            Some(Together::Gets(keys)) => keys,
            Some(Together::Sets(run)) => run
                .commands
                .iter()
                .map(|(item, _)| run.items[*item].0.clone())
                .collect(),
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
        // write where either write is conditional, as does a SET ... GET or anything
        // else.
        let commands = [
            set("a", always),
            set("b", SetCondition::IfAbsent),
            set("b", always),
        ];
        assert!(matches!(
            together_at_front(&commands),
            Some(Together::Sets(run))
                if run.items.len() == 2 && run.commands.len() == 2
                    && run.items[1].2 == SetCondition::IfAbsent
        ));
        let commands = [
            set("a", always),
            set("b", always),
            set("a", SetCondition::IfPresent),
        ];
        assert_eq!(keys(together_at_front(&commands)), ["a", "b"]);
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
    fn together_at_front_absorbs_plain_sets_of_a_key_into_its_last_value() {
        let value = |v: &'static str| Bytes::from_static(v.as_bytes());
        let plain = |key: &str, v: &'static str| {
            Ok(Command::Set {
                key: Bytes::copy_from_slice(key.as_bytes()),
                value: value(v),
                condition: SetCondition::Always,
                get: false,
            })
        };
        let commands = [
            plain("a", "1"),
            plain("b", "1"),
            plain("a", "2"),
            plain("a", "3"),
            set("c", SetCondition::IfAbsent),
            // Conditional, of a key written already: ends the run.
            set("c", SetCondition::Always),
        ];
        // A shorter value than the one it would absorb ends the run as well.
        assert_eq!(
            keys(together_at_front(&[
                plain("a", "11"),
                plain("a", "22"),
                plain("a", "3")
            ])),
            ["a", "a"]
        );
        let Some(Together::Sets(run)) = together_at_front(&commands) else {
            panic!("the SETs went separately");
        };
        assert_eq!(
            run.items,
            [
                (value("a"), value("3"), SetCondition::Always),
                (value("b"), value("1"), SetCondition::Always),
                (value("c"), value("v"), SetCondition::IfAbsent),
            ]
        );
        // Each command, in order, answered by its key's item, with its own value kept.
        assert_eq!(
            run.commands,
            [
                (0, value("1")),
                (1, value("1")),
                (0, value("2")),
                (0, value("3")),
                (2, value("v")),
            ]
        );
        assert_eq!(run.commands_per_item(), [3, 1, 1]);
        // A pipeline of one key: one write answers all, so they go together.
        let same: Vec<_> = (0..16).map(|_| set("k", SetCondition::Always)).collect();
        assert!(matches!(
            together_at_front(&same),
            Some(Together::Sets(run)) if run.items.len() == 1 && run.commands.len() == 16
        ));
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
