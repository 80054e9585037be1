//! Incremental detokenization on top of the `tokenizers` crate.
//!
//! [`Detokenizer`] loads a tokenizer.json once and is shared (`Arc`) by every sequence; each
//! sequence owns a small [`DecodeStream`] that turns token ids into text deltas.
//!
//! **The reference.** [`Detokenizer::decode`] is the all-at-once text. With
//! `skip_special_tokens` it drops special tokens and decodes the rest together, which equals
//! `tokenizer.decode(ids, true)`. Without it, the text is built from *segments*: each maximal run
//! of normal tokens decoded together, and each special token as its own segment (its content),
//! joined with `" "` if `spaces_between_special_tokens` else `""` (vLLM's convention). "Special"
//! is what `tokenizers` means by it (added tokens marked special); non-special added tokens are
//! normal tokens. Ids that no token has are ignored, as `tokenizers` ignores them.
//!
//! **The invariant.** The deltas of [`DecodeStream::step`] plus [`DecodeStream::finish`]
//! concatenate to `decode(ids)` with the same flags, and no delta holds half a UTF-8 character.
//! It holds for any ids on the fast path (byte-level decoders). On the generic path it holds for
//! any ids except where a decoder renders earlier tokens differently once later ones arrive:
//! * ByteFallback renders a run of `<0xNN>` tokens as its UTF-8 text if the whole run is valid,
//!   else as one U+FFFD per byte. The stream emits a character as soon as its bytes complete,
//!   so a run that is valid UTF-8 up to some token and later turns invalid streams its valid
//!   start: `<0xE4><0xB8><0xAD><0xE4>` then `x` streams `中` then `���x` where `decode` gives
//!   `����x`. The same happens when a
//!   special token ends such a run with `skip_special_tokens` false. Ids that encode text never
//!   do this, nor do special tokens placed between characters. Waiting for the end of every
//!   byte run instead would hold back whole sentences of byte-fallback CJK.
//! * A window holds at most [`MAX_PENDING`] tokens past the point where its text last ended
//!   cleanly (not in U+FFFD); past that it emits what it holds, to keep the cost per token
//!   bounded when a model emits bytes that never form a character. Only text with that many
//!   consecutive tokens each leaving it ending in U+FFFD (a literal U+FFFD run that also ends
//!   in an incomplete byte run) can then differ.
//!
//! **Cost.** Per token, the fast path appends the token's bytes (a table built at load) and
//! emits the longest valid UTF-8 prefix. The generic path decodes a window of the last clean
//! chunk (usually one token) plus the new token; leading per-token decoder stages (the Llama
//! decoder's Replace) were applied to the whole vocabulary at load (`decoder.rs`). Neither
//! grows with the length of the sequence.

mod decoder;
mod stream;
mod table;
mod utf8;
mod window;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

use std::path::Path;

use tokenizers::{Decoder, DecoderWrapper, Tokenizer};

pub use stream::DecodeStream;
pub use window::MAX_PENDING;

use crate::error::{CoreError, CoreResult};
use crate::types::TokenId;
use decoder::RunDecoder;
use table::{Kind, TokenTable};

impl std::fmt::Debug for Detokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("fast_path", &self.fast_path)
            .finish_non_exhaustive()
    }
}

/// A loaded tokenizer with the tables streaming needs. `Send + Sync`; share it with `Arc`.
pub struct Detokenizer {
    tokenizer: Tokenizer,
    table: TokenTable,
    run: RunDecoder,
    /// The decoder is ByteLevel: the table holds each token's bytes.
    byte_level: bool,
    /// Streams of byte-level tokenizers use the byte table instead of the generic window.
    fast_path: bool,
    /// The decoder turns `<0xNN>` tokens into raw bytes (ByteFallback).
    byte_fallback: bool,
}

impl Detokenizer {
    /// Wraps a tokenizer, building the per-id tables (one pass over the vocabulary).
    pub fn new(tokenizer: Tokenizer) -> Self {
        let decoder = tokenizer.get_decoder();
        let byte_level = matches!(decoder, Some(DecoderWrapper::ByteLevel(_)));
        let byte_fallback =
            decoder.is_some_and(|d| d.decode(vec!["<0x41>".to_string()]).is_ok_and(|s| s == "A"));
        let table = TokenTable::new(&tokenizer, byte_level);
        let mut run = RunDecoder::new(decoder, &table);
        if !byte_level {
            run.cache_lengths(&table);
        }
        Detokenizer {
            tokenizer,
            table,
            run,
            byte_level,
            fast_path: byte_level,
            byte_fallback,
        }
    }

    /// Loads a tokenizer.json file; an unreadable or invalid file is an error on `tokenizer`.
    pub fn from_file(path: impl AsRef<Path>) -> CoreResult<Self> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|e| {
            CoreError::invalid(
                "tokenizer",
                "unreadable_tokenizer",
                format!(
                    "`tokenizer` must be a readable tokenizer.json file; {}: {e}",
                    path.display()
                ),
            )
        })?;
        Self::from_json(&json)
    }

    /// Parses the contents of a tokenizer.json; invalid JSON is an error on `tokenizer`.
    pub fn from_json(json: &str) -> CoreResult<Self> {
        let tokenizer: Tokenizer = json.parse().map_err(|e| {
            CoreError::invalid(
                "tokenizer",
                "invalid_tokenizer",
                format!("`tokenizer` must be a valid tokenizer.json; {e}"),
            )
        })?;
        Ok(Self::new(tokenizer))
    }

    /// Turns the byte-level fast path on (the default where the decoder is ByteLevel) or off
    /// (streams then use the generic window). Has no effect on other decoders. For comparing
    /// the two paths.
    pub fn with_fast_path(mut self, enabled: bool) -> Self {
        self.fast_path = enabled && self.byte_level;
        if !self.fast_path {
            self.run.cache_lengths(&self.table);
        }
        self
    }

    /// Whether streams use the byte-level fast path.
    pub fn has_fast_path(&self) -> bool {
        self.fast_path
    }

    /// The wrapped tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The all-at-once text of `ids`: the reference the streams reproduce (see the module docs
    /// for the segment rule when special tokens are kept).
    pub fn decode(
        &self,
        ids: &[TokenId],
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> String {
        if skip_special_tokens {
            let normal: Vec<TokenId> = ids
                .iter()
                .copied()
                .filter(|&id| self.table.kind(id) == Kind::Normal)
                .collect();
            return self.decode_run(&normal);
        }
        let mut segments: Vec<String> = Vec::new();
        let mut run: Vec<TokenId> = Vec::new();
        for &id in ids {
            match self.table.kind(id) {
                Kind::Normal => run.push(id),
                Kind::Special => {
                    if !run.is_empty() {
                        segments.push(self.decode_run(&run));
                        run.clear();
                    }
                    segments.push(self.table.string(id).to_owned());
                }
                Kind::Missing => {}
            }
        }
        if !run.is_empty() {
            segments.push(self.decode_run(&run));
        }
        segments.join(if spaces_between_special_tokens {
            " "
        } else {
            ""
        })
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS,
    /// `[CLS] … [SEP]`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> CoreResult<Vec<TokenId>> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| {
                CoreError::invalid(
                    "text",
                    "unencodable_text",
                    format!("`text` must be encodable by the tokenizer; {e}"),
                )
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// One past the largest token id, added tokens included: the size of an id-indexed table.
    pub fn vocab_size(&self) -> usize {
        self.table.num_ids()
    }

    /// Whether `id` is a special token (dropped by `skip_special_tokens`).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.table.kind(id) == Kind::Special
    }

    /// The text `id` stands for on its own, for logprobs: a special token's content; a
    /// byte-level token's bytes decoded lossily (half a character is U+FFFD); a byte-fallback
    /// token's byte likewise; any other token as the decoder renders it after another token, so
    /// a SentencePiece `▁Hello` keeps its leading space. "" for an id no token has.
    pub fn token_text(&self, id: TokenId) -> String {
        match self.table.kind(id) {
            Kind::Missing => String::new(),
            Kind::Special => self.table.string(id).to_owned(),
            Kind::Normal if self.byte_level => {
                String::from_utf8_lossy(self.table.bytes(id)).into_owned()
            }
            Kind::Normal => match self.fallback_byte(id) {
                Some(b) => String::from_utf8_lossy(&[b]).into_owned(),
                None => self.decode_alone(id),
            },
        }
    }

    /// The raw bytes `id` stands for (OpenAI logprobs `bytes`): the real bytes for byte-level
    /// and byte-fallback tokens, else the UTF-8 of [`token_text`](Self::token_text).
    pub fn token_bytes(&self, id: TokenId) -> Vec<u8> {
        match self.table.kind(id) {
            Kind::Normal if self.byte_level => self.table.bytes(id).to_vec(),
            Kind::Normal => match self.fallback_byte(id) {
                Some(b) => vec![b],
                None => self.decode_alone(id).into_bytes(),
            },
            _ => self.token_text(id).into_bytes(),
        }
    }

    /// Decodes a run of normal tokens with the tokenizer's decoder.
    #[inline]
    pub(crate) fn decode_run(&self, ids: &[TokenId]) -> String {
        self.run.decode(&self.table, ids)
    }

    /// The byte length of `decode_run(&[id])`.
    #[inline]
    pub(crate) fn alone_len(&self, id: TokenId) -> usize {
        self.run.alone_len(&self.table, id)
    }

    /// The byte of a `<0xNN>` token when the decoder does byte fallback, parsed exactly as
    /// ByteFallback parses it.
    fn fallback_byte(&self, id: TokenId) -> Option<u8> {
        let token = self.table.string(id);
        let is_byte = token.len() == 6 && token.starts_with("<0x") && token.ends_with('>');
        if !self.byte_fallback || !is_byte {
            return None;
        }
        u8::from_str_radix(&token[3..5], 16).ok()
    }

    /// A normal token rendered after an anchor token and with the anchor cut off, so that
    /// first-token rules (Strip, Metaspace, WordPiece) do not eat its leading space.
    fn decode_alone(&self, id: TokenId) -> String {
        const ANCHOR: &str = "a";
        let token = self.table.string(id);
        let Some(decoder) = self.tokenizer.get_decoder() else {
            return token.to_owned();
        };
        let anchored = decoder
            .decode(vec![ANCHOR.to_owned(), token.to_owned()])
            .unwrap_or_default();
        match anchored.strip_prefix(ANCHOR) {
            Some(text) => text.to_owned(),
            None => decoder.decode(vec![token.to_owned()]).unwrap_or_default(),
        }
    }
}
