//! `DecodeStream`: one sequence's incremental detokenization. It splits the ids into segments
//! the way [`Detokenizer::decode`] does and streams each run of normal tokens through the fast
//! path (byte-level tokenizers) or the generic window.

use super::table::Kind;
use super::utf8::Utf8Tail;
use super::window::Window;
use super::Detokenizer;
use crate::types::TokenId;

/// The per-sequence state of incremental detokenization. Small and `Send`; it borrows the
/// shared [`Detokenizer`] only for the duration of each call, which must always be the same one.
#[derive(Clone, Debug)]
pub struct DecodeStream {
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
    /// A segment has started, so the next one is preceded by the separator.
    any_segment: bool,
    /// A run of normal tokens is open (its separator is already out).
    in_run: bool,
    /// The fast path's held-back bytes.
    tail: Utf8Tail,
    /// The generic path's window.
    pub(super) window: Window,
}

impl DecodeStream {
    /// A stream for one sequence. The flags mean what they mean for [`Detokenizer::decode`],
    /// whose result the deltas concatenate to.
    pub fn new(skip_special_tokens: bool, spaces_between_special_tokens: bool) -> Self {
        DecodeStream {
            skip_special_tokens,
            spaces_between_special_tokens,
            any_segment: false,
            in_run: false,
            tail: Utf8Tail::default(),
            window: Window::default(),
        }
    }

    /// Adds one token and appends to `out` the text that became final with it (possibly none).
    /// Ids no token has are ignored, as `decode` ignores them.
    pub fn step(&mut self, det: &Detokenizer, id: TokenId, out: &mut String) {
        match det.table.kind(id) {
            Kind::Missing => {}
            Kind::Special if self.skip_special_tokens => {}
            Kind::Special => {
                self.end_run(det, out);
                self.separator(out);
                out.push_str(det.table.string(id));
            }
            Kind::Normal => {
                if !self.in_run {
                    self.separator(out);
                    self.in_run = true;
                }
                if det.fast_path {
                    self.tail.push(det.table.bytes(id), out);
                } else {
                    self.window.push(det, id, out);
                }
            }
        }
    }

    /// [`step`](Self::step) for each of `ids` in order.
    pub fn push(&mut self, det: &Detokenizer, ids: &[TokenId], out: &mut String) {
        for &id in ids {
            self.step(det, id, out);
        }
    }

    /// Ends the sequence: appends everything held back (an incomplete UTF-8 tail becomes
    /// U+FFFD, as in `decode`) and resets the stream, which may then start a new sequence.
    pub fn finish(&mut self, det: &Detokenizer, out: &mut String) {
        self.end_run(det, out);
        self.any_segment = false;
    }

    /// Closes the open run, flushing what it held back.
    fn end_run(&mut self, det: &Detokenizer, out: &mut String) {
        if self.in_run {
            self.tail.finish(out);
            self.window.finish(det, out);
            self.in_run = false;
        }
    }

    /// Emits the separator before a new segment. With `skip_special_tokens` there is a single
    /// run and never a separator.
    fn separator(&mut self, out: &mut String) {
        if self.any_segment && self.spaces_between_special_tokens {
            out.push(' ');
        }
        self.any_segment = true;
    }
}
