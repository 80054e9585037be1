//! Tests of the stop-string rule, the hold-back and chunking independence (the streamed result
//! equals [`truncate_at_stop`] for every split of the text).

use std::sync::Arc;

use proptest::prelude::*;

use super::{truncate_at_stop, StopMatcher, StopStrings};
use crate::error::CoreError;

fn strings(stops: &[&str]) -> Vec<String> {
    stops.iter().map(|s| s.to_string()).collect()
}

fn matcher(stops: &[&str], include: bool) -> StopMatcher {
    let compiled = StopStrings::new(&strings(stops)).unwrap();
    StopMatcher::new(Some(Arc::new(compiled)), include)
}

/// Streams `deltas` through a matcher; returns what each push emitted, what `finish` emitted,
/// and the matched index.
fn stream(stops: &[&str], include: bool, deltas: &[&str]) -> (Vec<String>, String, Option<usize>) {
    let mut m = matcher(stops, include);
    let mut matched = None;
    let pieces = deltas
        .iter()
        .map(|d| {
            let mut out = String::new();
            if let Some(i) = m.push(d, &mut out) {
                assert_eq!(matched.replace(i), None, "a second match was reported");
            }
            out
        })
        .collect();
    let mut tail = String::new();
    m.finish(&mut tail);
    assert_eq!(m.matched(), matched);
    (pieces, tail, matched)
}

/// The streamed output (pushes then finish) and the matched index.
fn streamed(stops: &[&str], include: bool, deltas: &[&str]) -> (String, Option<usize>) {
    let (pieces, tail, matched) = stream(stops, include, deltas);
    (pieces.concat() + &tail, matched)
}

#[test]
fn stop_spanning_deltas_cuts_before_it() {
    let deltas = ["abc ST", "O", "P def"];
    assert_eq!(
        streamed(&["STOP"], false, &deltas),
        ("abc ".into(), Some(0))
    );
    assert_eq!(
        streamed(&["STOP"], true, &deltas),
        ("abc STOP".into(), Some(0))
    );
    let (pieces, tail, _) = stream(&["STOP"], false, &deltas);
    assert_eq!((pieces, tail), (strings(&["abc ", "", ""]), String::new()));
}

#[test]
fn overlapping_stops_the_first_to_complete_wins() {
    // "bc" ends at byte 3, before "abcd" (byte 4) completes.
    assert_eq!(
        streamed(&["abcd", "bc"], false, &["xabcd"]),
        ("xa".into(), Some(1))
    );
    assert_eq!(
        streamed(&["abcd", "bc"], true, &["x", "a", "b", "c", "d"]),
        ("xabc".into(), Some(1))
    );
    // Same end: the longer (earlier-starting) stop wins, whatever the order given.
    assert_eq!(
        streamed(&["c", "abc"], false, &["zabc"]),
        ("z".into(), Some(1))
    );
    assert_eq!(
        streamed(&["abc", "c"], true, &["zab", "c"]),
        ("zabc".into(), Some(0))
    );
    // Identical stops: the lowest index.
    assert_eq!(streamed(&["q", "q"], false, &["aq"]), ("a".into(), Some(0)));
}

#[test]
fn stop_equal_to_the_whole_text_or_at_the_start() {
    assert_eq!(streamed(&["stop"], false, &["stop"]), ("".into(), Some(0)));
    assert_eq!(
        streamed(&["stop"], true, &["st", "op"]),
        ("stop".into(), Some(0))
    );
    assert_eq!(streamed(&["<"], false, &["<abc"]), ("".into(), Some(0)));
    assert_eq!(streamed(&["<"], true, &["<abc"]), ("<".into(), Some(0)));
}

#[test]
fn multibyte_chars_are_never_split() {
    // "é" and "ü" share their first byte (0xC3); a shared byte alone is never held.
    let mut m = matcher(&["ü!"], false);
    let mut out = String::new();
    assert_eq!(m.push("café", &mut out), None);
    assert_eq!((out.as_str(), m.held()), ("café", ""));
    assert_eq!(m.push("ü", &mut out), None);
    assert_eq!((out.as_str(), m.held()), ("café", "ü"));
    assert_eq!(m.push("!", &mut out), Some(0));
    assert_eq!(out, "café");

    let mut m = matcher(&["日本語"], false);
    let mut out = String::new();
    m.push("こんにちは日本", &mut out);
    assert_eq!((out.as_str(), m.held()), ("こんにちは", "日本"));
    m.push("人", &mut out);
    assert_eq!((out.as_str(), m.held()), ("こんにちは日本人", ""));
}

#[test]
fn hold_back_releases_as_soon_as_no_stop_can_start() {
    let mut m = matcher(&["Hello!"], false);
    let mut out = String::new();
    m.push("Hel", &mut out);
    assert_eq!((out.as_str(), m.held(), m.held_len()), ("", "Hel", 3));
    m.push("p", &mut out);
    assert_eq!((out.as_str(), m.held()), ("Help", ""));
    // Only the suffix that can still start the stop is held, not a fixed window.
    m.push(" me, Hel", &mut out);
    assert_eq!((out.as_str(), m.held()), ("Help me, ", "Hel"));
    m.push("lo", &mut out);
    assert_eq!((out.as_str(), m.held()), ("Help me, ", "Hello"));
    m.finish(&mut out);
    assert_eq!((out.as_str(), m.held()), ("Help me, Hello", ""));
    assert!(!m.is_stopped());
}

#[test]
fn nothing_is_emitted_after_a_match_or_finish() {
    let mut m = matcher(&["END"], false);
    let mut out = String::new();
    assert_eq!(m.push("a E", &mut out), None);
    assert_eq!(m.push("ND b", &mut out), Some(0));
    assert!(m.is_stopped());
    assert_eq!(m.push("more END", &mut out), None);
    m.finish(&mut out);
    assert_eq!(out, "a ");

    let mut m = matcher(&["END"], false);
    let mut out = String::new();
    m.push("x EN", &mut out);
    m.finish(&mut out);
    assert_eq!(m.push("D", &mut out), None);
    assert_eq!((out.as_str(), m.is_stopped()), ("x EN", false));
}

#[test]
fn no_stops_is_a_pass_through() {
    for stops in [None, Some(Arc::new(StopStrings::new(&[]).unwrap()))] {
        let mut m = StopMatcher::new(stops, true);
        let mut out = String::new();
        assert_eq!(m.push("any <|im_end|> text", &mut out), None);
        m.finish(&mut out);
        assert_eq!((out.as_str(), m.held_len()), ("any <|im_end|> text", 0));
        assert!(m.stops().is_none());
    }
}

#[test]
fn empty_stop_string_is_rejected() {
    let err = StopStrings::new(&strings(&["ok", ""])).unwrap_err();
    assert_eq!(
        err,
        CoreError::invalid(
            "stop",
            "empty",
            "`stop[1]` must be at least 1 character; got \"\""
        )
    );
}

#[test]
fn a_long_stop_is_held_as_long_as_it_can_still_match() {
    let long = "#".repeat(3000);
    let stops = ["\n\nUser:", long.as_str(), "ab"];
    let deltas = ["x\n", "\nUs", "er", ": ab"];
    assert_eq!(streamed(&stops, false, &deltas), ("x".into(), Some(0)));
    let (mut m, mut out) = (matcher(&stops, false), String::new());
    m.push("y ####", &mut out);
    assert_eq!((out.as_str(), m.held()), ("y ", "####"));
    m.push(&"#".repeat(2995), &mut out);
    assert_eq!((out.as_str(), m.held_len()), ("y ", 2999));
    assert_eq!(m.push("#", &mut out), Some(1));
    assert_eq!(out, "y ");
}

#[test]
fn stops_completing_before_min_tokens_are_let_pass() {
    let mut m = matcher(&["STOP"], false);
    let mut out = String::new();
    m.push_without_stopping("a STOP b ST", &mut out);
    assert_eq!((out.as_str(), m.held()), ("a STOP b ", "ST"));
    assert_eq!(m.push("OP c", &mut out), Some(0));
    assert_eq!(out, "a STOP b ");
    // A stop that starts before the boundary and completes after it still cuts the text.
    let mut m = matcher(&["ab", "abc"], false);
    let mut out = String::new();
    m.push_without_stopping("xab", &mut out);
    assert_eq!((out.as_str(), m.held()), ("x", "ab"));
    assert_eq!(m.push("c", &mut out), Some(1));
    assert_eq!(out, "x");
    // A stop let pass whole is held until the next push, then released.
    let mut m = matcher(&["ab"], false);
    let mut out = String::new();
    m.push_without_stopping("xab", &mut out);
    assert_eq!((out.as_str(), m.held()), ("x", "ab"));
    assert_eq!(m.push("d", &mut out), None);
    assert_eq!((out.as_str(), m.held()), ("xabd", ""));
}

#[test]
fn reference_examples() {
    let stops = strings(&["abcd", "bc", "x"]);
    assert_eq!(
        truncate_at_stop("zabcd", &stops, false),
        ("za".into(), Some(1))
    );
    assert_eq!(
        truncate_at_stop("zabcd", &stops, true),
        ("zabc".into(), Some(1))
    );
    assert_eq!(truncate_at_stop("zzz", &stops, true), ("zzz".into(), None));
    assert_eq!(truncate_at_stop("", &stops, false), ("".into(), None));
}

/// The longest suffix of `text` that is a prefix of some stop (a proper one if `proper`), by
/// brute force.
fn longest_held(text: &str, stops: &[String], proper: bool) -> usize {
    (0..=text.len())
        .rev()
        .filter(|&k| text.is_char_boundary(text.len() - k))
        .find(|&k| {
            let suffix = &text[text.len() - k..];
            stops
                .iter()
                .any(|s| (s.len() > k || !proper) && s.starts_with(suffix))
        })
        .unwrap_or(0)
}

/// The reference when the first `boundary` bytes cannot end the text (before `min_tokens`):
/// the first stop to complete after `boundary`, by brute force over start positions.
fn truncate_after(
    text: &str,
    stops: &[String],
    include: bool,
    boundary: usize,
) -> (String, Option<usize>) {
    let first = (0..=text.len())
        .filter(|&at| text.is_char_boundary(at))
        .flat_map(|at| stops.iter().enumerate().map(move |(i, s)| (at, i, s)))
        .filter(|&(at, _, s)| text[at..].starts_with(s.as_str()) && at + s.len() > boundary)
        .map(|(at, i, s)| (at + s.len(), at, i))
        .min();
    match first {
        Some((end, at, i)) => (text[..if include { end } else { at }].to_string(), Some(i)),
        None => (text.to_string(), None),
    }
}

fn small_text(max_chars: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop::sample::select(vec!['a', 'b', 'c', 'é', '日']),
        0..max_chars,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// Splits `text` into deltas of the given char counts (empty deltas included), the rest last.
fn split<'a>(text: &'a str, sizes: &[usize]) -> Vec<&'a str> {
    let mut rest = text;
    let mut deltas = Vec::new();
    for &n in sizes {
        let at = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
        let (head, tail) = rest.split_at(at);
        deltas.push(head);
        rest = tail;
    }
    deltas.push(rest);
    deltas
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn streaming_equals_the_reference_for_any_split(
        text in small_text(40),
        sizes in proptest::collection::vec(0usize..6, 0..20),
        stops in proptest::collection::vec(small_text(7).prop_filter("non-empty", |s| !s.is_empty()), 0..6),
        include in any::<bool>(),
        num_unchecked in prop_oneof![Just(0usize), 0usize..4],
    ) {
        let deltas = split(&text, &sizes);
        let num_unchecked = num_unchecked.min(deltas.len());
        let boundary: usize = deltas[..num_unchecked].iter().map(|d| d.len()).sum();
        let (expected, expected_index) = truncate_after(&text, &stops, include, boundary);
        if boundary == 0 {
            prop_assert_eq!(truncate_at_stop(&text, &stops, include), (expected.clone(), expected_index));
        }
        let mut m = StopMatcher::new(Some(Arc::new(StopStrings::new(&stops).unwrap())), include);
        let (mut out, mut seen, mut matched, mut proper) = (String::new(), String::new(), None, true);
        for (k, delta) in deltas.into_iter().enumerate() {
            let before = out.len();
            let got = if k < num_unchecked {
                m.push_without_stopping(delta, &mut out);
                proper = false;
                None
            } else {
                proper |= !delta.is_empty();
                m.push(delta, &mut out)
            };
            prop_assert!(got.is_none() || matched.is_none(), "matched twice");
            matched = matched.or(got);
            // Emitted text is only ever appended, and is always a prefix of the final output.
            prop_assert!(expected.starts_with(&out), "emitted {:?}, expected {:?}", out, expected);
            prop_assert!(out.len() >= before);
            if m.is_stopped() {
                prop_assert_eq!(m.held_len(), 0);
            } else {
                seen.push_str(delta);
                // Nothing lost, and the held text is exactly the minimal hold-back.
                prop_assert_eq!(format!("{out}{}", m.held()), seen.as_str());
                prop_assert_eq!(m.held_len(), longest_held(&seen, &stops, proper));
            }
        }
        m.finish(&mut out);
        prop_assert_eq!(&out, &expected);
        prop_assert_eq!(matched, expected_index);
        prop_assert_eq!(m.matched(), expected_index);
    }
}
