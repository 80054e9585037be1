//! [`StopMatcher`]: the stop-string state of one sequence, fed the decoded text deltas.

use std::sync::Arc;

use aho_corasick::automaton::StateID;

use super::strings::{Scan, StopStrings};

/// Where a matcher is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Still looking; the automaton is in this state.
    Open(StateID),
    /// Stop `index` matched; nothing more is emitted.
    Stopped(usize),
    /// [`StopMatcher::finish`] flushed the tail; nothing more is emitted.
    Finished,
}

/// Finds the first stop string in one sequence's text as it streams in and decides which text
/// is safe to emit (see the module docs for the rule). `Send`, one per sequence.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Option<Arc<StopStrings>>,
    include_stop_str_in_output: bool,
    /// The longest suffix of the text so far that is a proper prefix of some stop.
    held: String,
    phase: Phase,
}

impl StopMatcher {
    /// A matcher for `stops` (`None`, or an empty set: a pass-through). With
    /// `include_stop_str_in_output` the matched stop string is emitted before the text ends.
    pub fn new(stops: Option<Arc<StopStrings>>, include_stop_str_in_output: bool) -> Self {
        let stops = stops.filter(|s| !s.is_empty());
        let phase = match &stops {
            Some(s) => Phase::Open(s.start()),
            None => Phase::Open(StateID::ZERO),
        };
        StopMatcher {
            stops,
            include_stop_str_in_output,
            held: String::new(),
            phase,
        }
    }

    /// Feeds the next decoded `delta`, appends to `out` the text that is now certain to be
    /// output, and returns the index of the stop string if one completed in this delta. After a
    /// match (or [`Self::finish`]) further pushes emit nothing and return `None`.
    /// Costs O(`delta` + held), independent of the text seen before.
    pub fn push(&mut self, delta: &str, out: &mut String) -> Option<usize> {
        self.feed(delta, out, true)
    }

    /// Like [`Self::push`], but a stop completing inside `delta` does not end the text: for the
    /// text of tokens before `min_tokens`. Text is still held back, so a stop that starts here
    /// and completes in a later [`Self::push`] still matches (and cuts into this text). The
    /// held text may then include a whole stop that was let pass (it is released by the next
    /// push that cannot continue it).
    pub fn push_without_stopping(&mut self, delta: &str, out: &mut String) {
        self.feed(delta, out, false);
    }

    fn feed(&mut self, delta: &str, out: &mut String, stop_at_match: bool) -> Option<usize> {
        let Phase::Open(state) = self.phase else {
            return None;
        };
        let Some(stops) = &self.stops else {
            out.push_str(delta);
            return None;
        };
        match stops.scan(state, delta.as_bytes(), stop_at_match) {
            Scan::Open { state, held } => {
                self.phase = Phase::Open(state);
                self.release(delta, held, out);
                None
            }
            Scan::Matched { index, end, len } => {
                self.phase = Phase::Stopped(index);
                // The match starts inside `held + delta`: its part before this delta is a suffix
                // of the text that is a prefix of a stop, hence no longer than `held`.
                let end_in_text = self.held.len() + end;
                let emit = if self.include_stop_str_in_output {
                    end_in_text
                } else {
                    end_in_text - len
                };
                self.emit_prefix(delta, emit, out);
                self.held = String::new();
                Some(index)
            }
        }
    }

    /// Flushes the held-back tail into `out`: the text has ended, so no stop can complete any
    /// more. Later pushes emit nothing. Does nothing after a match.
    pub fn finish(&mut self, out: &mut String) {
        if let Phase::Open(_) = self.phase {
            out.push_str(&self.held);
            self.held = String::new();
            self.phase = Phase::Finished;
        }
    }

    /// True once a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped(_))
    }

    /// The index of the stop string that matched, if any.
    pub fn matched(&self) -> Option<usize> {
        match self.phase {
            Phase::Stopped(index) => Some(index),
            _ => None,
        }
    }

    /// The text held back: the longest suffix of the text so far that is a proper prefix of
    /// some stop string (empty after a match or `finish`).
    pub fn held(&self) -> &str {
        &self.held
    }

    /// The number of bytes held back (see [`Self::held`]).
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// The stop strings this matcher looks for (`None` for a pass-through).
    pub fn stops(&self) -> Option<&Arc<StopStrings>> {
        self.stops.as_ref()
    }

    /// After a push with no match: emits `held + delta` except its last `keep` bytes, which
    /// become the new held text.
    fn release(&mut self, delta: &str, keep: usize, out: &mut String) {
        let old = self.held.len();
        if keep == 0 && old == 0 {
            // The common case: nothing held before or after.
            out.push_str(delta);
        } else if keep <= delta.len() {
            // The old held text is released whole.
            let cut = delta.len() - keep;
            out.push_str(&self.held);
            out.push_str(&delta[..cut]);
            self.held.clear();
            self.held.push_str(&delta[cut..]);
        } else {
            let cut = old + delta.len() - keep;
            out.push_str(&self.held[..cut]);
            self.held.drain(..cut);
            self.held.push_str(delta);
        }
    }

    /// Appends the first `len` bytes of `held + delta` to `out`.
    fn emit_prefix(&self, delta: &str, len: usize, out: &mut String) {
        let old = self.held.len();
        if len <= old {
            out.push_str(&self.held[..len]);
        } else {
            out.push_str(&self.held);
            out.push_str(&delta[..len - old]);
        }
    }
}
