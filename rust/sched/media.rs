//! Media spans of a request (images, video, audio): prompt positions `[offset, offset + length)`
//! whose embeddings come from an encoder, named by the digest of the encoder's input.
//!
//! Two things follow from a span. The prefix cache: a full block's hash (and the key a cache
//! hit is confirmed by) mixes in every span overlapping that block, so blocks before the first
//! span are plain text (shared whatever the image), blocks touching a span are shared only with
//! the same item at the same place, and every later block differs through the chain. The
//! encoder budget: the chunk that first reaches into a span starts its encoder work, which
//! `max_num_encoder_tokens` bounds per step (see `core::encoder`).

use std::sync::Arc;

use crate::error::{CoreError, CoreResult};

/// One media item's place in the prompt and the digest of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaSpan {
    /// The first prompt position the item's embeddings fill.
    pub offset: usize,
    /// Positions it fills (at least 1); also its encoder tokens.
    pub length: usize,
    /// Names the item's content (equal digests: the same embeddings).
    pub digest: Arc<str>,
}

impl MediaSpan {
    /// One past the span's last position.
    pub fn end(&self) -> usize {
        self.offset + self.length
    }
}

/// Checks that `spans` are non-empty, in prompt order without overlap and within the prompt's
/// `num_prompt_tokens`; errors name `media[i]`'s field.
pub(crate) fn check_media(spans: &[MediaSpan], num_prompt_tokens: usize) -> CoreResult<()> {
    let mut prev_end = 0;
    for (i, span) in spans.iter().enumerate() {
        if span.length == 0 {
            let msg = format!("`media[{i}].length` must be at least 1; got 0");
            return Err(CoreError::invalid("media", "empty", msg));
        }
        if span.offset < prev_end {
            let msg = format!(
                "`media[{i}].offset` must be at or after the end of `media[{}]` ({prev_end}): spans are sorted and do not overlap; got {}",
                i - 1,
                span.offset
            );
            return Err(CoreError::invalid("media", "overlapping", msg));
        }
        if span
            .offset
            .checked_add(span.length)
            .is_none_or(|end| end > num_prompt_tokens)
        {
            let msg = format!(
                "`media[{i}]` must lie within the prompt's {num_prompt_tokens} tokens; got [{}, {})",
                span.offset,
                span.offset.saturating_add(span.length)
            );
            return Err(CoreError::invalid("media", "out_of_range", msg));
        }
        prev_end = span.end();
    }
    Ok(())
}

/// The bytes naming the spans that overlap positions `[start, end)`, each by its place relative
/// to `start`, its length and its digest; None when no span does. Equal keys (with equal
/// tokens and prefix) mean equal embeddings in those positions.
pub(crate) fn media_key(spans: &[MediaSpan], start: usize, end: usize) -> Option<Vec<u8>> {
    let first = spans.partition_point(|s| s.end() <= start);
    let overlapping = spans[first..].iter().take_while(|s| s.offset < end);
    let mut key = Vec::new();
    for span in overlapping {
        let rel = span.offset as i64 - start as i64;
        key.extend_from_slice(&rel.to_le_bytes());
        key.extend_from_slice(&(span.length as u64).to_le_bytes());
        key.extend_from_slice(&(span.digest.len() as u64).to_le_bytes());
        key.extend_from_slice(span.digest.as_bytes());
    }
    (!key.is_empty()).then_some(key)
}

/// How many of `spans` end at or before position `num_computed` (their KV is all there, so
/// they need no encoder work).
pub(crate) fn num_spans_done(spans: &[MediaSpan], num_computed: usize) -> usize {
    spans.partition_point(|s| s.end() <= num_computed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(offset: usize, length: usize, digest: &str) -> MediaSpan {
        MediaSpan {
            offset,
            length,
            digest: digest.into(),
        }
    }

    #[test]
    fn key_names_only_the_spans_overlapping_the_range() {
        let spans = [span(4, 4, "a"), span(10, 2, "b")];
        assert_eq!(media_key(&spans, 0, 4), None);
        let a = media_key(&spans, 4, 8).unwrap();
        assert_eq!(media_key(&spans, 8, 10), None);
        let b = media_key(&spans, 8, 12).unwrap();
        let both = media_key(&spans, 0, 16).unwrap();
        assert_ne!(a, b);
        assert!(both.len() > a.len() && both.len() > b.len());
        // The place within the range counts, not just the digest.
        assert_ne!(media_key(&spans, 4, 8), media_key(&[span(5, 3, "a")], 4, 8));
        assert_ne!(media_key(&spans, 4, 8), media_key(&[span(4, 4, "c")], 4, 8));
    }

    #[test]
    fn check_names_the_rule() {
        let code = |spans: &[MediaSpan]| match check_media(spans, 10) {
            Err(CoreError::Invalid { param, code, .. }) => Some((param, code)),
            _ => None,
        };
        assert_eq!(code(&[span(0, 10, "a")]), None);
        assert_eq!(code(&[span(2, 0, "a")]), Some(("media".into(), "empty")));
        assert_eq!(
            code(&[span(0, 4, "a"), span(3, 2, "b")]),
            Some(("media".into(), "overlapping"))
        );
        assert_eq!(
            code(&[span(8, 3, "a")]),
            Some(("media".into(), "out_of_range"))
        );
        assert_eq!(
            code(&[span(usize::MAX, 3, "a")]),
            Some(("media".into(), "out_of_range"))
        );
    }
}
