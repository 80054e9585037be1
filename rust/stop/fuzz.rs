//! Bounded fuzzing of the stop matcher and the token stop sequences: many random stop sets
//! (overlapping, sharing prefixes, multi-byte, up to a few hundred) over random texts split
//! into random deltas at char boundaries. The streamed text and match must equal
//! [`truncate_at_stop`]'s, and what is emitted plus what is held must always be the text seen
//! so far (nothing withdrawn, nothing lost); a matcher fed `push_without_stopping` first must
//! never panic nor emit more than its text. Token stops must equal a brute-force check of the
//! tail. `FERROLLM_FUZZ_CASES` raises the count (`make fuzz`); plain `cargo test` runs a few
//! thousand, seeded, so a failure reproduces.

use std::sync::Arc;

use super::{truncate_at_stop, StopMatcher, StopStrings, TokenStops};
use crate::fuzzing::{cases, Rng};
use crate::types::TokenId;

/// A small alphabet, so stops overlap and recur; multi-byte chars share lead bytes.
const CHARS: &[char] = &[
    'a', 'b', 'a', 'b', 'c', ' ', '\n', 'é', 'ü', '中', '😀', '\u{0}',
];

fn word(rng: &mut Rng, max: u64) -> String {
    (0..1 + rng.below(max))
        .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
        .collect()
}

/// `text` cut into random pieces at char boundaries (empty pieces included).
fn split(rng: &mut Rng, text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let end = (at + rng.below(6) as usize).min(chars.len());
        pieces.push(chars[at..end].iter().collect());
        at = end;
    }
    pieces
}

#[test]
fn fuzz_stop_strings_stream_like_the_reference() {
    let mut rng = Rng(0x570b_0016);
    let cases = cases(3000);
    let mut num_matched = 0;
    for case in 0..cases {
        let num_stops = if rng.below(50) == 0 {
            300
        } else {
            1 + rng.below(5)
        };
        let stops: Vec<String> = (0..num_stops).map(|_| word(&mut rng, 4)).collect();
        let text = word(&mut rng, 60);
        let include = rng.below(2) == 0;
        let compiled = Arc::new(StopStrings::new(&stops).expect("non-empty stops compile"));
        let deltas = split(&mut rng, &text);

        let mut matcher = StopMatcher::new(Some(compiled.clone()), include);
        let (mut out, mut seen, mut matched) = (String::new(), String::new(), None);
        for delta in &deltas {
            seen.push_str(delta);
            if let Some(i) = matcher.push(delta, &mut out) {
                matched = Some(i);
                break;
            }
            assert_eq!(
                format!("{out}{}", matcher.held()),
                seen,
                "case {case}: emitted + held != seen; stops={stops:?} deltas={deltas:?}"
            );
        }
        matcher.finish(&mut out);
        let expected = truncate_at_stop(&text, &stops, include);
        assert_eq!(
            (out, matched),
            expected,
            "case {case}: stops={stops:?} include={include} deltas={deltas:?}"
        );
        num_matched += u64::from(matched.is_some());

        // Before `min_tokens`: stops completing there are let pass; never a panic, and never
        // more text than was fed.
        let mut early = StopMatcher::new(Some(compiled), include);
        let mut out = String::new();
        let cut = rng.below(deltas.len() as u64 + 1) as usize;
        for delta in &deltas[..cut] {
            early.push_without_stopping(delta, &mut out);
        }
        for delta in &deltas[cut..] {
            if early.push(delta, &mut out).is_some() {
                break;
            }
        }
        early.finish(&mut out);
        assert!(
            text.starts_with(&out),
            "case {case}: {out:?} is not a prefix of {text:?}"
        );
    }
    println!("fuzz stop strings: {cases} cases, {num_matched} matched a stop");
}

#[test]
fn fuzz_token_stops_match_the_tail() {
    let mut rng = Rng(0x70ce_0016);
    let cases = cases(3000);
    for case in 0..cases {
        let sequences: Vec<Vec<TokenId>> = (0..1 + rng.below(6))
            .map(|_| {
                (0..1 + rng.below(4))
                    .map(|_| rng.below(4) as TokenId)
                    .collect()
            })
            .collect();
        let stops = TokenStops::new(&sequences).expect("non-empty sequences");
        let output: Vec<TokenId> = (0..rng.below(12))
            .map(|_| rng.below(4) as TokenId)
            .collect();
        // the longest sequence the output ends with, then the lowest index
        let expected = sequences
            .iter()
            .enumerate()
            .filter(|(_, s)| output.ends_with(s))
            .min_by_key(|(i, s)| (std::cmp::Reverse(s.len()), *i))
            .map(|(i, _)| i);
        assert_eq!(
            stops.matches(&output),
            expected,
            "case {case}: {sequences:?} on {output:?}"
        );
    }
    println!("fuzz token stops: {cases} cases");
}
