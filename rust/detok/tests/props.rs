//! Property tests: random text (CJK, emoji with ZWJ sequences, combining marks, whitespace)
//! encoded, with special tokens and unknown ids inserted, and random ids, streamed token by
//! token; the deltas must concatenate to `decode` with the same flags.

use proptest::prelude::*;
use proptest::sample::{select, Index};

use super::*;
use crate::detok::utf8::REPLACEMENT;

const EMOJI: [&str; 14] = [
    "😀",
    "🎉",
    "🚀",
    "❤️",
    "👍🏽",
    "👩🏽‍💻",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇫🇷",
    "🧑‍🚀",
    "🦀",
    "✨",
    "🫠",
    "🧬",
];
const WORDS: [&str; 12] = [
    "the",
    " model",
    "token",
    " stream",
    "中文",
    "推理",
    "日本語",
    "한국어",
    "café",
    "naïve",
    "fn",
    "{}",
];

fn char_in(lo: u32, hi: u32) -> impl Strategy<Value = String> {
    (lo..=hi).prop_map(|c| char::from_u32(c).map(String::from).unwrap_or_default())
}

/// One piece of text: words, whitespace, CJK (common and rare), emoji, combining marks,
/// accents, other scripts, punctuation, or any character but U+FFFD.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z]{1,8}",
        "[ \t\n]{1,3}",
        "[0-9.,;:!?()'\"-]{1,3}",
        select(&WORDS[..]).prop_map(String::from),
        char_in(0x4E00, 0x9FFF),
        char_in(0x3040, 0x30FF),
        char_in(0xAC00, 0xD7A3),
        select(&EMOJI[..]).prop_map(String::from),
        char_in(0x1F300, 0x1FAFF),
        ("[a-z]", char_in(0x0300, 0x036F)).prop_map(|(base, mark)| base + &mark),
        select(&["é", "ñ", "ü", "ß", "ø", "Œ", "ç", "å"][..]).prop_map(String::from),
        char_in(0x0400, 0x04FF),
        char_in(0x0600, 0x06FF),
        char_in(0x0900, 0x097F),
        any::<char>()
            .prop_filter("U+FFFD is held back by design", |&c| c != REPLACEMENT)
            .prop_map(String::from),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..24).prop_map(|pieces| pieces.concat())
}

/// Where to insert which extra tokens: a special token, or an id no token has.
fn inserts() -> impl Strategy<Value = Vec<(Index, Index, bool)>> {
    prop::collection::vec(
        (any::<Index>(), any::<Index>(), prop::bool::weighted(0.1)),
        0..5,
    )
}

/// `ids` with the inserts applied at positions drawn from `allowed`.
fn with_inserts(
    det: &Detokenizer,
    ids: &[TokenId],
    allowed: &[usize],
    inserts: &[(Index, Index, bool)],
) -> Vec<TokenId> {
    let specials = specials(det);
    let mut placed: Vec<(usize, TokenId)> = inserts
        .iter()
        .map(|(at, which, missing)| {
            let id = if *missing {
                det.vocab_size() as TokenId + which.index(3) as TokenId
            } else {
                *which.get(&specials)
            };
            (*at.get(allowed), id)
        })
        .collect();
    placed.sort_by_key(|&(at, _)| std::cmp::Reverse(at));
    let mut ids = ids.to_vec();
    for (at, id) in placed {
        ids.insert(at, id);
    }
    ids
}

/// Encodes `text`, inserts tokens (at character boundaries only for byte fallback, where
/// splitting a character makes the ids invalid text), and checks every flag combination; for
/// text, no delta may show U+FFFD unless a special token split a byte-level character.
fn check_text(det: &Detokenizer, text: &str, inserts: &[(Index, Index, bool)]) {
    let encoded = det.encode(text, false).expect("any text encodes");
    let allowed = if det.byte_fallback {
        char_boundaries(det, &encoded)
    } else {
        (0..=encoded.len()).collect()
    };
    let ids = with_inserts(det, &encoded, &allowed, inserts);
    assert_streams_match(det, &ids);
    for (skip, spaces) in FLAGS {
        if !skip && !det.byte_fallback {
            continue;
        }
        let deltas = deltas(det, &ids, skip, spaces);
        assert!(
            deltas.iter().all(|d| !d.contains(REPLACEMENT)),
            "{text:?}: {deltas:?}"
        );
    }
}

fn random_ids(det: &Detokenizer, picks: &[Index]) -> Vec<TokenId> {
    let end = det.vocab_size() + 3;
    picks.iter().map(|p| p.index(end) as TokenId).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn byte_level_text(text in text(), inserts in inserts()) {
        check_text(&BYTE_LEVEL, &text, &inserts);
    }

    #[test]
    fn byte_level_generic_text(text in text(), inserts in inserts()) {
        check_text(&BYTE_LEVEL_GENERIC, &text, &inserts);
    }

    #[test]
    fn sentencepiece_text(text in text(), inserts in inserts()) {
        check_text(&SENTENCEPIECE, &text, &inserts);
    }

    #[test]
    fn wordpiece_text(text in text(), inserts in inserts()) {
        check_text(&WORDPIECE, &text, &inserts);
    }

    #[test]
    fn byte_level_random_ids(picks in prop::collection::vec(any::<Index>(), 0..64)) {
        let ids = random_ids(&BYTE_LEVEL, &picks);
        assert_streams_match(&BYTE_LEVEL, &ids);
        assert_streams_match(&BYTE_LEVEL_GENERIC, &ids);
    }

    #[test]
    fn wordpiece_random_ids(picks in prop::collection::vec(any::<Index>(), 0..64)) {
        assert_streams_match(&WORDPIECE, &random_ids(&WORDPIECE, &picks));
    }

    /// Random ids drawn mostly from byte tokens: the fast path's UTF-8 handling against
    /// `tokenizers`' lossy decode, and the generic path against the fast one.
    #[test]
    fn byte_level_byte_soup(picks in prop::collection::vec(any::<Index>(), 0..48)) {
        let singles: Vec<TokenId> = (0..BYTE_LEVEL.vocab_size() as TokenId)
            .filter(|&id| BYTE_LEVEL.token_bytes(id).len() == 1)
            .collect();
        let ids: Vec<TokenId> = picks.iter().map(|p| *p.get(&singles)).collect();
        assert_streams_match(&BYTE_LEVEL, &ids);
        for (skip, spaces) in FLAGS {
            prop_assert_eq!(
                deltas(&BYTE_LEVEL, &ids, skip, spaces).concat(),
                deltas(&BYTE_LEVEL_GENERIC, &ids, skip, spaces).concat()
            );
        }
    }

    #[test]
    fn fast_and_generic_paths_agree_on_text(text in text(), inserts in inserts()) {
        let encoded = BYTE_LEVEL.encode(&text, false).unwrap();
        let allowed: Vec<usize> = (0..=encoded.len()).collect();
        let ids = with_inserts(&BYTE_LEVEL, &encoded, &allowed, &inserts);
        for (skip, spaces) in FLAGS {
            prop_assert_eq!(
                deltas(&BYTE_LEVEL, &ids, skip, spaces).concat(),
                deltas(&BYTE_LEVEL_GENERIC, &ids, skip, spaces).concat()
            );
        }
    }
}
