//! [`TokenStops`]: multi-token stop sequences (TensorRT-LLM `stop_words_list`) matched on the
//! tail of a sequence's generated ids.

use rustc_hash::FxHashMap;

use crate::error::{CoreError, CoreResult};
use crate::types::TokenId;

/// The multi-token stop sequences of one request. Checked after each appended token, so the
/// sequence that completes first wins, as for stop strings; among sequences completing on the
/// same token, the longest, then the lowest index.
#[derive(Debug, Clone)]
pub struct TokenStops {
    sequences: Vec<Vec<TokenId>>,
    /// Sequence indices by last token, longest first (then by index): only these can end at a
    /// given token, and the first whose tail matches is the answer.
    by_last: FxHashMap<TokenId, Vec<u32>>,
}

impl TokenStops {
    /// Indexes `sequences` (each non-empty; fails with [`CoreError::Invalid`] on
    /// `stop_token_sequences` otherwise). An empty list never matches.
    pub fn new(sequences: &[Vec<TokenId>]) -> CoreResult<Self> {
        if let Some(i) = sequences.iter().position(Vec::is_empty) {
            return Err(CoreError::invalid(
                "stop_token_sequences",
                "empty",
                format!("`stop_token_sequences[{i}]` must hold at least 1 token id; got []"),
            ));
        }
        let mut by_last: FxHashMap<TokenId, Vec<u32>> = FxHashMap::default();
        for (i, seq) in sequences.iter().enumerate() {
            // `sequences` comes from one request, far below `u32::MAX` entries.
            by_last
                .entry(seq[seq.len() - 1])
                .or_default()
                .push(i as u32);
        }
        for indices in by_last.values_mut() {
            indices.sort_by_key(|&i| (std::cmp::Reverse(sequences[i as usize].len()), i));
        }
        Ok(TokenStops {
            sequences: sequences.to_vec(),
            by_last,
        })
    }

    /// The index of the stop sequence that `output` ends with, if any (the longest; then the
    /// lowest index). Costs O(total length of the sequences ending in `output`'s last token),
    /// independent of the length of `output`.
    pub fn matches(&self, output: &[TokenId]) -> Option<usize> {
        let candidates = self.by_last.get(output.last()?)?;
        candidates
            .iter()
            .map(|&i| i as usize)
            .find(|&i| output.ends_with(&self.sequences[i]))
    }

    /// The stop sequences, in the order given.
    pub fn as_slice(&self) -> &[Vec<TokenId>] {
        &self.sequences
    }

    /// True when there are no stop sequences.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(seqs: &[&[TokenId]]) -> TokenStops {
        TokenStops::new(&seqs.iter().map(|s| s.to_vec()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn matches_only_the_tail() {
        let s = stops(&[&[1, 2, 3], &[7]]);
        assert_eq!(s.matches(&[]), None);
        assert_eq!(s.matches(&[1, 2]), None);
        assert_eq!(s.matches(&[9, 1, 2, 3]), Some(0));
        assert_eq!(s.matches(&[1, 2, 3, 4]), None);
        assert_eq!(s.matches(&[5, 7]), Some(1));
        assert_eq!(s.matches(&[2, 3]), None);
    }

    #[test]
    fn ties_go_to_the_longest_then_the_lowest_index() {
        let s = stops(&[&[2, 3], &[1, 2, 3], &[3], &[1, 2, 3]]);
        assert_eq!(s.matches(&[1, 2, 3]), Some(1));
        assert_eq!(s.matches(&[0, 2, 3]), Some(0));
        assert_eq!(s.matches(&[0, 3]), Some(2));
    }

    #[test]
    fn checked_token_by_token_the_first_completion_wins() {
        let s = stops(&[&[1, 2, 3, 4], &[2, 3]]);
        let output = [1, 2, 3, 4];
        let first = (1..=output.len()).find_map(|n| s.matches(&output[..n]).map(|i| (n, i)));
        assert_eq!(first, Some((3, 1)));
    }

    #[test]
    fn empty_sequence_is_rejected_and_empty_list_never_matches() {
        let err = TokenStops::new(&[vec![1], vec![]]).unwrap_err();
        assert_eq!(
            err,
            CoreError::invalid(
                "stop_token_sequences",
                "empty",
                "`stop_token_sequences[1]` must hold at least 1 token id; got []"
            )
        );
        let none = TokenStops::new(&[]).unwrap();
        assert!(none.is_empty());
        assert_eq!(none.matches(&[1, 2, 3]), None);
    }
}
