//! Glob patterns, as Redis's `SCAN ... MATCH` and `CONFIG GET` read them
//! (`stringmatchlen` in Redis's `util.c`): `*` any run of bytes, `?` any one byte,
//! `[abc]`, `[a-z]` (ends in either order), `[^...]` a class and its negation, `\x` the
//! byte `x` (inside a class too); any other byte itself. Bytes, not characters: keys are
//! binary.
//!
//! # Guarantees
//! [`glob_match`] takes time linear in pattern × text whatever the pattern: a pattern
//! comes from whoever reaches the gateway, and the matcher it replaces (a backtracking
//! one, trying every split at every `*`) took exponential time on
//! `*a*a*a*a*a*a*a*a*a*a*a*a*b` against a run of `a`s, holding a worker thread for as
//! long as the client pleased. It needs no memory beyond two positions.
//!
//! # How
//! Every token but `*` matches exactly one byte, so the classic two-pointer walk is
//! exact: match token by token; on a `*`, remember where the pattern goes on after it
//! and where in the text the star's run ends; on a mismatch, lengthen the run of the
//! last star seen by one byte and go on from there. Only the last star needs
//! remembering: whatever an earlier star could absorb, the last one can absorb just as
//! well once the pattern between them has matched (the leftmost match of that part is
//! the best for what follows). Each mismatch moves the last star's run end forward, so
//! the text is walked at most once per pattern position.
//!
//! Redis's one departure: its matcher answers no for a pattern of stars against the
//! empty string (its `SCAN` and `KEYS` special-case the pattern `*` before calling it);
//! here `*` matches the empty key, as a glob should.

/// Whether `text` matches the glob `pattern` (see the module docs).
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // The last star: where the pattern goes on after it, and where in the text its run
    // ends (the text it absorbed is `text[..end]` from wherever it started).
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            p += 1;
            star = Some((p, t));
            continue;
        }
        if let Some(next) = one_byte(pattern, p, text[t]) {
            p = next;
            t += 1;
            continue;
        }
        // A mismatch (or the pattern ran out before the text): the last star absorbs one
        // more byte and the rest of the pattern is tried from there.
        let Some((after, end)) = star.as_mut() else {
            return false;
        };
        *end += 1;
        p = *after;
        t = *end;
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// If the token at `pattern[p]` (not a `*`) matches `byte`, where the next token starts;
/// `None` if it does not, or the pattern has ended.
fn one_byte(pattern: &[u8], p: usize, byte: u8) -> Option<usize> {
    match *pattern.get(p)? {
        b'?' => Some(p + 1),
        b'[' => {
            let (hit, next) = class(pattern, p + 1, byte);
            hit.then_some(next)
        }
        // A trailing `\` is itself.
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == byte).then_some(p + 2),
        literal => (literal == byte).then_some(p + 1),
    }
}

/// The class whose body starts at `pattern[start]` (just after its `[`): whether it
/// holds `byte`, and where the token after it starts. Read as Redis reads it, byte by
/// byte: `\x` is `x`; `]` ends the class; `a-z` is a range (in either order) whenever a
/// `-` follows and a byte follows that, even `]` (so `[a-]` does not end at its `]`);
/// a class with no end runs to the end of the pattern.
fn class(pattern: &[u8], start: usize, byte: u8) -> (bool, usize) {
    let (negated, mut i) = match pattern.get(start) {
        Some(b'^') => (true, start + 1),
        _ => (false, start),
    };
    let mut hit = false;
    loop {
        match pattern.get(i) {
            None => break,
            Some(b']') => {
                i += 1;
                break;
            }
            Some(b'\\') if i + 1 < pattern.len() => {
                hit |= pattern[i + 1] == byte;
                i += 2;
            }
            Some(&low) if i + 2 < pattern.len() && pattern[i + 1] == b'-' => {
                let high = pattern[i + 2];
                hit |= (low.min(high)..=low.max(high)).contains(&byte);
                i += 3;
            }
            Some(&literal) => {
                hit |= literal == byte;
                i += 1;
            }
        }
    }
    (hit != negated, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_match_follows_redis_cases() {
        // (pattern, text, matches): Redis's documented examples and the corners of
        // stringmatchlen (unterminated classes, escapes inside classes, reversed ranges).
        let cases: &[(&str, &str, bool)] = &[
            ("h?llo", "hello", true),
            ("h?llo", "hallo", true),
            ("h?llo", "hllo", false),
            ("h*llo", "hllo", true),
            ("h*llo", "heeeello", true),
            ("h[ae]llo", "hello", true),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hallo", true),
            ("h[a-b]llo", "hbllo", true),
            ("h[a-b]llo", "hcllo", false),
            ("h[b-a]llo", "hallo", true),
            ("user:*", "user:42", true),
            ("user:*", "users", false),
            ("*", "", true),
            ("*", "anything", true),
            ("**", "x", true),
            ("a*", "a", true),
            ("*a", "a", true),
            ("*a", "ba", true),
            ("*a", "ab", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("a*b*c", "abcbc", true),
            ("", "", true),
            ("", "a", false),
            ("a", "", false),
            ("?", "", false),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("a\\?", "a?", true),
            ("a\\?", "ab", false),
            ("a\\", "a\\", true),
            ("[\\]]", "]", true),
            ("[\\-]", "-", true),
            ("[a\\-z]", "b", false),
            ("[a-z]", "b", true),
            ("[]", "]", false),
            ("[abc", "b", true),
            ("[abc", "d", false),
            ("[", "[", false),
            ("[^", "x", true),
            ("[a-]x]", "x", true),
            ("k[0-9]", "k7", true),
            ("k[0-9]", "kx", false),
            ("*[0-9]", "key9", true),
            ("*[^0-9]", "key9", false),
            ("*?", "", false),
            ("*?", "a", true),
        ];
        for &(pattern, text, expected) in cases {
            assert_eq!(
                glob_match(pattern.as_bytes(), text.as_bytes()),
                expected,
                "{pattern:?} against {text:?}"
            );
        }
    }

    #[test]
    fn glob_match_takes_linear_time_on_many_stars() {
        // Exponential for a backtracking matcher: 12 stars, 60 bytes.
        let text = vec![b'a'; 60];
        assert!(!glob_match(b"*a*a*a*a*a*a*a*a*a*a*a*a*b", &text));
        assert!(glob_match(b"*a*a*a*a*a*a*a*a*a*a*a*a*", &text));
        let long = vec![b'a'; 100_000];
        assert!(!glob_match(
            b"*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b",
            &long
        ));
    }

    #[test]
    fn glob_match_agrees_with_a_backtracking_model() {
        /// The definition, by exhaustive backtracking (exponential; small inputs only).
        fn model(pattern: &[u8], p: usize, text: &[u8]) -> bool {
            match pattern.get(p) {
                None => text.is_empty(),
                Some(b'*') => (0..=text.len()).any(|skip| model(pattern, p + 1, &text[skip..])),
                Some(_) => match text.split_first() {
                    None => false,
                    Some((&byte, rest)) => {
                        one_byte(pattern, p, byte).is_some_and(|next| model(pattern, next, rest))
                    }
                },
            }
        }
        /// Every string over `alphabet` of at most `len_max` bytes.
        fn all_strings(alphabet: &[u8], len_max: usize) -> Vec<Vec<u8>> {
            let mut all = vec![Vec::new()];
            let mut last = all.clone();
            for _ in 0..len_max {
                last = last
                    .iter()
                    .flat_map(|s| {
                        alphabet.iter().map(move |&b| {
                            let mut longer = s.clone();
                            longer.push(b);
                            longer
                        })
                    })
                    .collect();
                all.extend(last.iter().cloned());
            }
            all
        }
        let patterns = all_strings(b"*?ab[]^-\\", 4);
        let texts = all_strings(b"ab]-", 4);
        for pattern in &patterns {
            for text in &texts {
                assert_eq!(
                    glob_match(pattern, text),
                    model(pattern, 0, text),
                    "{:?} against {:?}",
                    String::from_utf8_lossy(pattern),
                    String::from_utf8_lossy(text)
                );
            }
        }
    }
}
