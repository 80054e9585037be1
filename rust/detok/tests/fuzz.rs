//! Bounded fuzzing of the decode stream: many random id sequences (byte tokens, special tokens,
//! ids past the vocabulary up to `u32::MAX`), fed one at a time and in random chunks, through
//! each decoder family. Byte-level and WordPiece streams must concatenate to `decode` exactly;
//! every stream (byte fallback included, whose caveats the module docs list) must never panic
//! and give the same text stepped or pushed in chunks. `FERROLLM_FUZZ_CASES` raises the count (`make fuzz`); plain
//! `cargo test` runs a few hundred per family, seeded, so a failure reproduces.

use super::{deltas, Detokenizer, BYTE_LEVEL, BYTE_LEVEL_GENERIC, FLAGS, SENTENCEPIECE, WORDPIECE};
use crate::detok::DecodeStream;
use crate::fuzzing::{cases, Rng};
use crate::types::TokenId;

/// Random ids: mostly single-byte tokens (so characters split across tokens), some of any
/// token, some special, a few past the vocabulary.
fn ids(rng: &mut Rng, det: &Detokenizer, bytes: &[TokenId], specials: &[TokenId]) -> Vec<TokenId> {
    let vocab = det.vocab_size() as u64;
    (0..rng.below(80))
        .map(|_| match rng.below(20) {
            0..=9 if !bytes.is_empty() => bytes[rng.below(bytes.len() as u64) as usize],
            10 if !specials.is_empty() => specials[rng.below(specials.len() as u64) as usize],
            11 => (vocab + rng.below(4)) as TokenId,
            12 => TokenId::MAX - rng.below(2) as TokenId,
            _ => rng.below(vocab) as TokenId,
        })
        .collect()
}

/// Streams `ids` through `push` in random chunks; the deltas, `finish`'s last.
fn chunked(rng: &mut Rng, det: &Detokenizer, ids: &[TokenId], skip: bool, spaces: bool) -> String {
    let mut stream = DecodeStream::new(skip, spaces);
    let mut text = String::new();
    let mut at = 0;
    while at < ids.len() {
        let end = (at + 1 + rng.below(8) as usize).min(ids.len());
        stream.push(det, &ids[at..end], &mut text);
        at = end;
    }
    stream.finish(det, &mut text);
    text
}

fn fuzz(name: &str, det: &Detokenizer, exact: bool) {
    let bytes: Vec<TokenId> = (0..det.vocab_size() as TokenId)
        .filter(|&id| det.token_bytes(id).len() == 1)
        .collect();
    let specials = super::specials(det);
    let mut rng = Rng(0x5eed_0016 ^ det.vocab_size() as u64);
    let cases = cases(300);
    for case in 0..cases {
        let ids = ids(&mut rng, det, &bytes, &specials);
        for (skip, spaces) in FLAGS {
            let stepped = deltas(det, &ids, skip, spaces);
            let chunks = chunked(&mut rng, det, &ids, skip, spaces);
            assert_eq!(
                chunks,
                stepped.concat(),
                "{name} case {case}: chunked != stepped, ids={ids:?}"
            );
            if exact {
                assert_eq!(
                    chunks,
                    det.decode(&ids, skip, spaces),
                    "{name} case {case}: skip={skip} spaces={spaces} ids={ids:?}"
                );
            }
        }
    }
    println!("fuzz detok {name}: {cases} id sequences x 4 flag combinations, no failure");
}

#[test]
fn fuzz_byte_level_streams_equal_decode() {
    fuzz("byte-level", &BYTE_LEVEL, true);
    fuzz("byte-level generic", &BYTE_LEVEL_GENERIC, true);
}

#[test]
fn fuzz_wordpiece_streams_equal_decode() {
    fuzz("wordpiece", &WORDPIECE, true);
}

#[test]
fn fuzz_byte_fallback_streams_never_panic() {
    fuzz("sentencepiece", &SENTENCEPIECE, false);
}
