//! Shared fixtures and helpers for the detokenizer tests; the property tests are in `props.rs`,
//! the worked examples in `examples.rs`.

mod examples;
mod fuzz;
mod props;

use std::sync::LazyLock;

use tokenizers::Tokenizer;

use super::fixtures;
use super::{DecodeStream, Detokenizer};
use crate::types::TokenId;

/// Loads through tokenizer.json, as the server does.
fn load(tokenizer: Tokenizer) -> Detokenizer {
    let json = tokenizer.to_string(false).expect("fixtures serialize");
    Detokenizer::from_json(&json).expect("fixtures load")
}

static BYTE_LEVEL: LazyLock<Detokenizer> = LazyLock::new(|| load(fixtures::byte_level()));
static BYTE_LEVEL_GENERIC: LazyLock<Detokenizer> =
    LazyLock::new(|| load(fixtures::byte_level()).with_fast_path(false));
static SENTENCEPIECE: LazyLock<Detokenizer> = LazyLock::new(|| load(fixtures::sentencepiece()));
static WORDPIECE: LazyLock<Detokenizer> = LazyLock::new(|| load(fixtures::wordpiece()));

/// The four flag combinations (`skip_special_tokens`, `spaces_between_special_tokens`).
const FLAGS: [(bool, bool); 4] = [(true, true), (true, false), (false, true), (false, false)];

/// Streams `ids` one token at a time; the last delta is the one from `finish`.
fn deltas(det: &Detokenizer, ids: &[TokenId], skip: bool, spaces: bool) -> Vec<String> {
    let mut stream = DecodeStream::new(skip, spaces);
    let mut deltas: Vec<String> = ids
        .iter()
        .map(|&id| {
            let mut out = String::new();
            stream.step(det, id, &mut out);
            out
        })
        .collect();
    let mut out = String::new();
    stream.finish(det, &mut out);
    deltas.push(out);
    deltas
}

fn id_of(det: &Detokenizer, token: &str) -> TokenId {
    det.tokenizer()
        .token_to_id(token)
        .unwrap_or_else(|| panic!("{token} is in the vocabulary"))
}

fn specials(det: &Detokenizer) -> Vec<TokenId> {
    (0..det.vocab_size() as TokenId)
        .filter(|&id| det.is_special(id))
        .collect()
}

/// Positions where a special token may go without splitting a byte-fallback character: after
/// any token unless it ends a run of `<0xNN>` tokens whose bytes are not valid UTF-8 yet.
fn char_boundaries(det: &Detokenizer, ids: &[TokenId]) -> Vec<usize> {
    let mut run: Vec<u8> = Vec::new();
    let mut allowed = vec![0];
    for (i, &id) in ids.iter().enumerate() {
        match det.fallback_byte(id) {
            Some(b) => run.push(b),
            None => run.clear(),
        }
        if std::str::from_utf8(&run).is_ok() {
            allowed.push(i + 1);
        }
    }
    allowed
}

/// Asserts the invariant for every flag combination, and that `skip_special_tokens` matches
/// `tokenizers` itself.
fn assert_streams_match(det: &Detokenizer, ids: &[TokenId]) {
    for (skip, spaces) in FLAGS {
        let reference = det.decode(ids, skip, spaces);
        let streamed = deltas(det, ids, skip, spaces).concat();
        assert_eq!(
            streamed, reference,
            "skip={skip} spaces={spaces} ids={ids:?}"
        );
    }
    let theirs = det
        .tokenizer()
        .decode(ids, true)
        .expect("tokenizers decodes");
    assert_eq!(det.decode(ids, true, true), theirs, "ids={ids:?}");
}
