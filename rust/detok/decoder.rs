//! The tokenizer's decoder, prepared for decoding many short runs. Leading stages that map each
//! token on its own (Replace, Strip) give the same result whatever the neighbours, so they run
//! once per vocabulary entry at load; only the remaining stages run per decode. For the Llama
//! decoder that takes the regex-based Replace off the per-token path.

use tokenizers::decoders::sequence::Sequence;
use tokenizers::{Decoder, DecoderWrapper};

use super::table::{FlatStrings, Kind, TokenTable};
use crate::types::TokenId;

/// Decodes runs of normal tokens exactly as the tokenizer's decoder would.
pub(crate) struct RunDecoder {
    /// The stages left to run per decode; `None` when the tokenizer has no decoder, in which
    /// case `tokenizers` joins the tokens with " ".
    rest: Option<DecoderWrapper>,
    /// Each token after the leading per-token stages, when there are any.
    pieces: Option<FlatStrings>,
    /// The byte length of each normal token decoded alone (0 for other ids); empty until
    /// [`RunDecoder::cache_lengths`].
    alone_lens: Vec<u32>,
}

impl RunDecoder {
    /// Splits `decoder` and applies its leading per-token stages to every normal token.
    pub(crate) fn new(decoder: Option<&DecoderWrapper>, table: &TokenTable) -> Self {
        let (maps, rest) = split(decoder);
        let pieces = if maps.is_empty() {
            None
        } else {
            apply_maps(&maps, table)
        };
        match pieces {
            Some(pieces) => RunDecoder {
                rest,
                pieces: Some(pieces),
                alone_lens: Vec::new(),
            },
            // A stage failed on some token: keep the whole decoder per decode.
            None => RunDecoder {
                rest: decoder.cloned(),
                pieces: None,
                alone_lens: Vec::new(),
            },
        }
    }

    /// Records the decoded length of every normal token alone, which the generic window needs
    /// each time it moves. Idempotent.
    pub(crate) fn cache_lengths(&mut self, table: &TokenTable) {
        if !self.alone_lens.is_empty() {
            return;
        }
        self.alone_lens = (0..table.num_ids() as TokenId)
            .map(|id| match table.kind(id) {
                Kind::Normal => self.decode(table, &[id]).len() as u32,
                _ => 0,
            })
            .collect();
    }

    /// The byte length of `decode(&[id])` for a normal token, from the cache when filled.
    #[inline]
    pub(crate) fn alone_len(&self, table: &TokenTable, id: TokenId) -> usize {
        match self.alone_lens.get(id as usize) {
            Some(&len) => len as usize,
            None => self.decode(table, &[id]).len(),
        }
    }

    /// Whether the leading per-token stages were applied at load.
    #[cfg(test)]
    pub(crate) fn has_pieces(&self) -> bool {
        self.pieces.is_some()
    }

    /// The token `id` after the leading per-token stages.
    #[cfg(test)]
    pub(crate) fn piece(&self, id: TokenId) -> Option<&str> {
        self.pieces.as_ref().map(|p| p.get(id))
    }

    /// Decodes a run of normal tokens. A decoder error renders the run as "" (the stock
    /// decoders never fail; `decode` and the streams share this function, so they agree).
    pub(crate) fn decode(&self, table: &TokenTable, ids: &[TokenId]) -> String {
        let tokens: Vec<String> = ids
            .iter()
            .map(|&id| match &self.pieces {
                Some(pieces) => pieces.get(id).to_owned(),
                None => table.string(id).to_owned(),
            })
            .collect();
        match &self.rest {
            Some(rest) => rest.decode(tokens).unwrap_or_default(),
            None => tokens.join(" "),
        }
    }
}

/// Whether a stage maps each token independently of its neighbours and of its position.
fn is_per_token(stage: &DecoderWrapper) -> bool {
    matches!(stage, DecoderWrapper::Replace(_) | DecoderWrapper::Strip(_))
}

/// The leading per-token stages and the rest (an empty Sequence joins with "").
fn split(decoder: Option<&DecoderWrapper>) -> (Vec<DecoderWrapper>, Option<DecoderWrapper>) {
    let stages = match decoder {
        None => return (Vec::new(), None),
        Some(DecoderWrapper::Sequence(seq)) => seq.get_decoders().to_vec(),
        Some(single) => vec![single.clone()],
    };
    let num_maps = stages.iter().take_while(|s| is_per_token(s)).count();
    if num_maps == 0 {
        return (Vec::new(), decoder.cloned());
    }
    let rest = Sequence::new(stages[num_maps..].to_vec());
    (stages[..num_maps].to_vec(), Some(rest.into()))
}

/// Each normal token through `maps` (other ids as they are); `None` if a stage fails.
fn apply_maps(maps: &[DecoderWrapper], table: &TokenTable) -> Option<FlatStrings> {
    let maps = Sequence::new(maps.to_vec());
    let mut pieces = FlatStrings::default();
    for id in 0..table.num_ids() as TokenId {
        let token = table.string(id);
        // Strip indexes from the end of each token and would panic on an empty one.
        if table.kind(id) != Kind::Normal || token.is_empty() {
            pieces.push(token);
            continue;
        }
        let mapped = maps.decode_chain(vec![token.to_owned()]).ok()?;
        pieces.push(&mapped.concat());
    }
    Some(pieces)
}
