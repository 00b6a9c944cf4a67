//! The commands the gateway serves: parsed from a request's arguments into a
//! [`Command`], checked for arity and options (pure, tested alone). Unknown commands
//! and bad arguments are errors to answer, never a reason to close the connection.

use bytes::Bytes;

use crate::glob::glob_match;
use crate::resp::Reply;

/// A `SET`'s condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetCondition {
    /// Always.
    Always,
    /// `NX`: only if the key does not exist.
    IfAbsent,
    /// `XX`: only if it exists.
    IfPresent,
}

/// A parsed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `PING [message]`.
    Ping(Option<Bytes>),
    /// `ECHO message`.
    Echo(Bytes),
    /// `QUIT`: answer OK and close.
    Quit,
    /// `AUTH [username] password`: the cluster token (the only user is `default`).
    Auth {
        /// The user named, if any.
        username: Option<Bytes>,
        /// The password.
        password: Bytes,
    },
    /// `SELECT 0` (the gateway's one table).
    Select,
    /// `CLIENT SETNAME name`.
    ClientSetName(Bytes),
    /// `CLIENT GETNAME`.
    ClientGetName,
    /// `CLIENT ID`.
    ClientId,
    /// `COMMAND`, `COMMAND DOCS`, `COMMAND INFO ...`: an empty list (no command table;
    /// enough for clients that probe it).
    CommandList,
    /// `COMMAND COUNT`.
    CommandCount,
    /// `INFO [section]`.
    Info,
    /// `CONFIG GET pattern...`: the settings clients probe (`redis-benchmark` asks for
    /// `save` and `appendonly`), answered by [`config_get`].
    ConfigGet(Vec<Bytes>),
    /// `GET key`.
    Get(Bytes),
    /// `SET key value [NX|XX] [GET]`.
    Set {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
        /// When to write.
        condition: SetCondition,
        /// Answer the old value (`GET`).
        get: bool,
    },
    /// `DEL key...`.
    Del(Vec<Bytes>),
    /// `EXISTS key...`.
    Exists(Vec<Bytes>),
    /// `INCR`, `INCRBY`, `DECR`, `DECRBY`.
    IncrBy(Bytes, i64),
    /// `MGET key...`.
    MGet(Vec<Bytes>),
    /// `MSET key value...`.
    MSet(Vec<(Bytes, Bytes)>),
    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE string]`.
    Scan {
        /// Where to go on from (a key hash; 0 to start).
        cursor: u64,
        /// Keys to keep (glob).
        pattern: Option<Bytes>,
        /// At least this many keys a call, where there are (a hint).
        count: usize,
    },
}

/// Commands [`CommandCount`](Command::CommandCount) counts.
pub const COMMANDS: &[&str] = &[
    "PING", "ECHO", "QUIT", "AUTH", "SELECT", "CLIENT", "COMMAND", "INFO", "CONFIG", "GET", "SET",
    "DEL", "EXISTS", "INCR", "INCRBY", "DECR", "DECRBY", "MGET", "MSET", "SCAN",
];

/// Room [`parse`] makes for a command name, more than the longest it serves (checked
/// below against [`COMMANDS`]; `UNLINK`, served too, is 6): a longer name is unknown.
const COMMAND_NAME_BYTES_MAX: usize = 16;

const _: () = {
    let mut i = 0;
    while i < COMMANDS.len() {
        assert!(COMMANDS[i].len() <= COMMAND_NAME_BYTES_MAX);
        i += 1;
    }
};

/// Keys a `SCAN` returns per call unless `COUNT` says otherwise.
pub const SCAN_COUNT_DEFAULT: usize = 10;

/// Most keys one `SCAN` call returns (a larger `COUNT` is clamped).
pub const SCAN_COUNT_MAX: usize = 10_000;

fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// An integer argument, as Redis parses them.
pub fn integer(arg: &[u8]) -> Option<i64> {
    std::str::from_utf8(arg).ok()?.parse().ok()
}

fn not_an_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

/// Parses `args` (the command name first) into a command, or the error to answer.
pub fn parse(args: &[Bytes]) -> Result<Command, Reply> {
    let Some(name) = args.first() else {
        return Err(Reply::err("empty command"));
    };
    // Upper-cased on the stack: a command of a bulk load costs no allocation here. A
    // name too long for the buffer, or not UTF-8, is no command served (and answered
    // with its own bytes, below).
    let mut upper = [0u8; COMMAND_NAME_BYTES_MAX];
    let name: &str = match upper.get_mut(..name.len()) {
        Some(upper) => {
            upper.copy_from_slice(name);
            upper.make_ascii_uppercase();
            std::str::from_utf8(upper).unwrap_or("")
        }
        None => "",
    };
    let rest = &args[1..];
    let arity = |ok: bool| if ok { Ok(()) } else { Err(wrong_arity(name)) };
    match name {
        "PING" => {
            arity(rest.len() <= 1)?;
            Ok(Command::Ping(rest.first().cloned()))
        }
        "ECHO" => {
            arity(rest.len() == 1)?;
            Ok(Command::Echo(rest[0].clone()))
        }
        "QUIT" => Ok(Command::Quit),
        "AUTH" => match rest {
            [password] => Ok(Command::Auth {
                username: None,
                password: password.clone(),
            }),
            [username, password] => Ok(Command::Auth {
                username: Some(username.clone()),
                password: password.clone(),
            }),
            _ => Err(Reply::Error("ERR syntax error".to_string())),
        },
        "SELECT" => {
            arity(rest.len() == 1)?;
            match integer(&rest[0]) {
                Some(0) => Ok(Command::Select),
                Some(_) => Err(Reply::err(
                    "DB index is out of range: this gateway serves one table (its --table), as database 0",
                )),
                None => Err(not_an_integer()),
            }
        }
        "CLIENT" => {
            arity(!rest.is_empty())?;
            let sub = String::from_utf8_lossy(&rest[0]).to_ascii_uppercase();
            match (sub.as_str(), rest.len()) {
                ("SETNAME", 2) => Ok(Command::ClientSetName(rest[1].clone())),
                ("GETNAME", 1) => Ok(Command::ClientGetName),
                ("ID", 1) => Ok(Command::ClientId),
                ("SETINFO", 3) => Ok(Command::Select),
                _ => Err(Reply::err(format!(
                    "unknown subcommand '{}' of CLIENT: SETNAME, GETNAME, ID and SETINFO are served",
                    sub.to_ascii_lowercase()
                ))),
            }
        }
        "COMMAND" => match rest
            .first()
            .map(|s| String::from_utf8_lossy(s).to_ascii_uppercase())
        {
            Some(sub) if sub == "COUNT" => Ok(Command::CommandCount),
            _ => Ok(Command::CommandList),
        },
        "INFO" => Ok(Command::Info),
        "CONFIG" => {
            arity(!rest.is_empty())?;
            let sub = String::from_utf8_lossy(&rest[0]).to_ascii_uppercase();
            match sub.as_str() {
                "GET" if rest.len() >= 2 => Ok(Command::ConfigGet(rest[1..].to_vec())),
                "GET" => Err(Reply::err(
                    "wrong number of arguments for 'config|get' command",
                )),
                _ => Err(Reply::err(format!(
                    "unknown subcommand '{}' of CONFIG: only GET is served (the gateway's \
                     settings are its command-line flags)",
                    sub.to_ascii_lowercase()
                ))),
            }
        }
        "GET" => {
            arity(rest.len() == 1)?;
            Ok(Command::Get(rest[0].clone()))
        }
        "SET" => {
            arity(rest.len() >= 2)?;
            let (mut condition, mut get) = (SetCondition::Always, false);
            for option in &rest[2..] {
                match String::from_utf8_lossy(option)
                    .to_ascii_uppercase()
                    .as_str()
                {
                    "NX" if condition == SetCondition::Always => condition = SetCondition::IfAbsent,
                    "XX" if condition == SetCondition::Always => {
                        condition = SetCondition::IfPresent
                    }
                    "GET" => get = true,
                    "EX" | "PX" | "EXAT" | "PXAT" | "KEEPTTL" => return Err(Reply::err(
                        "expiry is not supported: Rampart keeps every object until it is deleted",
                    )),
                    _ => return Err(Reply::err("syntax error")),
                }
            }
            Ok(Command::Set {
                key: rest[0].clone(),
                value: rest[1].clone(),
                condition,
                get,
            })
        }
        "DEL" | "UNLINK" => {
            arity(!rest.is_empty())?;
            Ok(Command::Del(rest.to_vec()))
        }
        "EXISTS" => {
            arity(!rest.is_empty())?;
            Ok(Command::Exists(rest.to_vec()))
        }
        "INCR" | "DECR" => {
            arity(rest.len() == 1)?;
            let delta = if name == "INCR" { 1 } else { -1 };
            Ok(Command::IncrBy(rest[0].clone(), delta))
        }
        "INCRBY" | "DECRBY" => {
            arity(rest.len() == 2)?;
            let by = integer(&rest[1]).ok_or_else(not_an_integer)?;
            let delta = if name == "INCRBY" {
                by
            } else {
                by.checked_neg().ok_or_else(not_an_integer)?
            };
            Ok(Command::IncrBy(rest[0].clone(), delta))
        }
        "MGET" => {
            arity(!rest.is_empty())?;
            Ok(Command::MGet(rest.to_vec()))
        }
        "MSET" => {
            arity(!rest.is_empty() && rest.len() % 2 == 0)?;
            Ok(Command::MSet(
                rest.chunks(2)
                    .map(|pair| (pair[0].clone(), pair[1].clone()))
                    .collect(),
            ))
        }
        "SCAN" => {
            arity(!rest.is_empty())?;
            let cursor = std::str::from_utf8(&rest[0])
                .ok()
                .and_then(|c| c.parse::<u64>().ok())
                .ok_or_else(|| Reply::err("invalid cursor"))?;
            let (mut pattern, mut count) = (None, SCAN_COUNT_DEFAULT);
            let mut options = rest[1..].iter();
            while let Some(option) = options.next() {
                let value = options.next().ok_or_else(|| Reply::err("syntax error"))?;
                match String::from_utf8_lossy(option)
                    .to_ascii_uppercase()
                    .as_str()
                {
                    "MATCH" => pattern = Some(value.clone()),
                    "COUNT" => {
                        count = integer(value)
                            .filter(|n| *n >= 1)
                            .map(|n| (n as usize).min(SCAN_COUNT_MAX))
                            .ok_or_else(|| Reply::err("syntax error"))?;
                    }
                    "TYPE" if value.eq_ignore_ascii_case(b"string") => {}
                    // Every object is a string: no key of another type.
                    "TYPE" => pattern = Some(Bytes::from_static(b"\0no key has this type")),
                    _ => return Err(Reply::err("syntax error")),
                }
            }
            Ok(Command::Scan {
                cursor,
                pattern,
                count,
            })
        }
        _ => Err(Reply::err(format!(
            "unknown command '{}', with args beginning with: {}",
            String::from_utf8_lossy(&args[0]),
            rest.iter()
                .take(3)
                .map(|a| format!("'{}'", String::from_utf8_lossy(a)))
                .collect::<Vec<_>>()
                .join(" ")
        ))),
    }
}

/// `CONFIG GET`'s reply: the name and value of each of `settings` (lower-case names)
/// that one of `patterns` matches (globs, case-insensitive, as Redis reads them), in
/// `settings`' order, each once; an empty array when none does.
pub fn config_get(patterns: &[Bytes], settings: &[(&str, String)]) -> Reply {
    let patterns: Vec<Vec<u8>> = patterns.iter().map(|p| p.to_ascii_lowercase()).collect();
    let mut pairs = Vec::new();
    for (name, value) in settings {
        if patterns.iter().any(|p| glob_match(p, name.as_bytes())) {
            pairs.push(Reply::bulk(name.to_string()));
            pairs.push(Reply::bulk(value.clone()));
        }
    }
    Reply::Array(Some(pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    #[test]
    fn commands_parse_case_insensitively_with_their_options() {
        assert_eq!(
            parse(&args(&["set", "k", "v", "nx", "get"])),
            Ok(Command::Set {
                key: "k".into(),
                value: "v".into(),
                condition: SetCondition::IfAbsent,
                get: true
            })
        );
        assert_eq!(
            parse(&args(&["DECRBY", "n", "5"])),
            Ok(Command::IncrBy("n".into(), -5))
        );
        assert_eq!(
            parse(&args(&["MSET", "a", "1", "b", "2"])),
            Ok(Command::MSet(vec![
                ("a".into(), "1".into()),
                ("b".into(), "2".into())
            ]))
        );
        assert_eq!(
            parse(&args(&["scan", "42", "match", "user:*", "count", "100"])),
            Ok(Command::Scan {
                cursor: 42,
                pattern: Some("user:*".into()),
                count: 100
            })
        );
        assert_eq!(parse(&args(&["SELECT", "0"])), Ok(Command::Select));
        assert_eq!(
            parse(&args(&["auth", "secret"])),
            Ok(Command::Auth {
                username: None,
                password: "secret".into()
            })
        );
        assert_eq!(
            parse(&args(&["AUTH", "default", "secret"])),
            Ok(Command::Auth {
                username: Some("default".into()),
                password: "secret".into()
            })
        );
    }

    #[test]
    fn bad_commands_are_errors_to_answer() {
        let error = |words: &[&str]| match parse(&args(words)) {
            Err(Reply::Error(text)) => text,
            other => panic!("{words:?}: {other:?}"),
        };
        assert!(error(&["FLUSHALL"]).starts_with("ERR unknown command 'FLUSHALL'"));
        assert_eq!(
            error(&["GET"]),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(error(&["SET", "k", "v", "NX", "XX"]), "ERR syntax error");
        assert!(error(&["SET", "k", "v", "EX", "10"]).contains("expiry is not supported"));
        assert_eq!(
            error(&["INCRBY", "k", "x"]),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error(&["DECRBY", "k", "-9223372036854775808"]),
            "ERR value is not an integer or out of range"
        );
        assert!(error(&["SELECT", "1"]).contains("out of range"));
        assert_eq!(
            error(&["MSET", "a"]),
            "ERR wrong number of arguments for 'mset' command"
        );
        assert_eq!(error(&["SCAN", "x"]), "ERR invalid cursor");
        assert_eq!(error(&["AUTH"]), "ERR syntax error");
        assert!(error(&["CONFIG", "SET", "save", ""]).contains("only GET is served"));
        assert!(error(&["CONFIG", "GET"]).contains("wrong number of arguments"));
    }

    #[test]
    fn config_get_answers_pairs_for_known_names_and_nothing_for_others() {
        let settings = [
            ("save", String::new()),
            ("appendonly", "no".to_string()),
            ("databases", "1".to_string()),
        ];
        let config = |words: &[&str]| match parse(&args(words)) {
            Ok(Command::ConfigGet(patterns)) => config_get(&patterns, &settings),
            other => panic!("{words:?}: {other:?}"),
        };
        let pairs =
            |p: &[&str]| Reply::Array(Some(p.iter().map(|w| Reply::bulk(w.to_string())).collect()));
        // What redis-benchmark asks at start.
        assert_eq!(config(&["CONFIG", "GET", "save"]), pairs(&["save", ""]));
        assert_eq!(
            config(&["config", "get", "APPENDONLY"]),
            pairs(&["appendonly", "no"])
        );
        assert_eq!(config(&["CONFIG", "GET", "maxmemory"]), pairs(&[]));
        assert_eq!(
            config(&["CONFIG", "GET", "d*", "sav?", "s*"]),
            pairs(&["save", "", "databases", "1"])
        );
    }
}
