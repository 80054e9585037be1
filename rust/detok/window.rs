//! The generic path: one run of normal tokens streamed through the tokenizer's own decoder,
//! re-decoding only a bounded window of recent ids (vLLM's prefix_offset / read_offset idea).
//!
//! The window always starts at a *clean boundary*: a token boundary at which everything decoded
//! so far was emitted and did not end in U+FFFD. Decoders treat the first token of their input
//! specially (Strip and Metaspace drop its leading space, WordPiece does not join it, a byte run
//! restarts), so the window's first tokens serve as context: only the text after what was
//! already emitted is new, and that text is the same as in the full decode because the window
//! starts where decoding restarts cleanly.

use super::utf8::REPLACEMENT;
use super::Detokenizer;
use crate::types::TokenId;

/// Tokens a window may hold past its last clean boundary before the held-back text is emitted
/// anyway. Valid text needs at most 4 (one character's bytes); the bound keeps the per-token
/// cost constant when a model emits bytes that never form a character.
pub const MAX_PENDING: usize = 16;

/// The state of one run on the generic path.
#[derive(Clone, Debug, Default)]
pub(crate) struct Window {
    /// The window; it starts at a clean boundary.
    pub(super) ids: Vec<TokenId>,
    /// Bytes of the window's decoded text already emitted.
    emitted: usize,
    /// `ids[..clean]` ends at the latest clean boundary.
    clean: usize,
}

impl Window {
    /// Adds `id` (a normal token) and appends the text that became final.
    pub(crate) fn push(&mut self, det: &Detokenizer, id: TokenId, out: &mut String) {
        self.ids.push(id);
        let text = det.decode_run(&self.ids);
        // Trailing U+FFFD may be an incomplete character (byte-level lossy decoding) or a byte
        // run that is not valid yet (ByteFallback renders every byte of it as U+FFFD).
        let stable = text.trim_end_matches(REPLACEMENT).len();
        let forced = self.ids.len() - self.clean > MAX_PENDING;
        let upto = if forced { text.len() } else { stable };
        self.emit(&text, upto, out);
        if upto == text.len() {
            self.mark_clean(det, text.len());
        }
    }

    /// Appends what was held back, rendered as the run's full decode renders it, and empties
    /// the window for a new run.
    pub(crate) fn finish(&mut self, det: &Detokenizer, out: &mut String) {
        if self.clean < self.ids.len() {
            let text = det.decode_run(&self.ids);
            self.emit(&text, text.len(), out);
        }
        self.ids.clear();
        self.emitted = 0;
        self.clean = 0;
    }

    /// Emits `text[emitted..upto]`. The window's earlier text is normally a prefix of `text`;
    /// where a decoder renders earlier tokens differently once later ones arrive (see the
    /// module docs of `detok`), the start is rounded up to a character boundary so the stream
    /// stays valid UTF-8 and keeps the reference's length.
    fn emit(&mut self, text: &str, upto: usize, out: &mut String) {
        if upto > self.emitted {
            let start = ceil_char_boundary(text, self.emitted);
            out.push_str(&text[start..upto]);
            self.emitted = upto;
        }
    }

    /// Records a clean boundary at the end of the window and moves the window's start to the
    /// previous clean boundary: the tokens since then (usually one) become the context.
    fn mark_clean(&mut self, det: &Detokenizer, text_len: usize) {
        if self.clean > 0 {
            self.ids.drain(..self.clean);
            self.emitted = match self.ids[..] {
                [id] => det.alone_len(id),
                _ => det.decode_run(&self.ids).len(),
            };
        } else {
            self.emitted = text_len;
        }
        self.clean = self.ids.len();
    }
}

/// The smallest character boundary of `text` at or after `i` (at most `text.len()`).
fn ceil_char_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}
