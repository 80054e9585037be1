//! [`StopStrings`]: the stop strings of one request compiled once into an Aho-Corasick
//! automaton, plus the scan over one delta that every [`super::StopMatcher`] of the request runs.
//!
//! The automaton is the crate's contiguous NFA, not its DFA: on this workload the DFA scans only
//! about 5-10% faster (text mostly sits in the start state, which the scan skips through with a
//! first-byte table) but takes about 3x longer to build (16 stops: ~620k vs ~230k instructions)
//! and, for large stop sets, far more memory (states x alphabet classes), which a request pays
//! before its first token.

use std::cmp::Reverse;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::{Anchored, MatchKind};

use crate::error::{CoreError, CoreResult};

/// The stop strings of one request, compiled once and shared (behind an `Arc`) by the matchers
/// of all its sequences. Index `i` everywhere refers to the `i`-th string given to [`Self::new`].
pub struct StopStrings {
    stops: Vec<String>,
    nfa: NFA,
    start: StateID,
    depth: Depths,
    /// `first_byte[b]`: some stop starts with byte `b`. From the start state, any other byte
    /// leads back to the start state, so a scan skips such bytes without walking the automaton.
    first_byte: [bool; 256],
    max_len: usize,
}

/// Where the scan of one delta ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// No stop completed. The automaton is in `state`; the last `held` bytes of the text (which
    /// may reach back before the delta) are a proper prefix of some stop.
    Open { state: StateID, held: usize },
    /// Stop `index`, `len` bytes long, completed at byte `end` (exclusive) of the delta.
    Matched {
        index: usize,
        end: usize,
        len: usize,
    },
}

impl StopStrings {
    /// Compiles `stops` (each non-empty). An empty list is allowed and never matches. Fails
    /// with [`CoreError::Invalid`] on `stop` for an empty string.
    pub fn new(stops: &[String]) -> CoreResult<Self> {
        check_non_empty(stops)?;
        // Standard (not leftmost) semantics: every stop ending at a position is reported there,
        // which is what "the first to complete" needs. No prefilter: the scan has its own skip.
        let nfa = NFA::builder()
            .match_kind(MatchKind::Standard)
            .prefilter(false)
            .build(stops)
            .map_err(|err| {
                CoreError::invalid(
                    "stop",
                    "too_large",
                    format!("`stop` strings are too large to compile: {err}"),
                )
            })?;
        let (start, depth) = Depths::new(&nfa, stops)?;
        let mut first_byte = [false; 256];
        for stop in stops {
            first_byte[usize::from(stop.as_bytes()[0])] = true;
        }
        Ok(StopStrings {
            stops: stops.to_vec(),
            nfa,
            start,
            depth,
            first_byte,
            max_len: stops.iter().map(String::len).max().unwrap_or(0),
        })
    }

    /// The stop strings, in the order given.
    pub fn as_slice(&self) -> &[String] {
        &self.stops
    }

    /// The number of stop strings.
    pub fn len(&self) -> usize {
        self.stops.len()
    }

    /// True when there are no stop strings (nothing ever matches).
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The length in bytes of the longest stop string; a matcher never holds more than one
    /// byte less than this.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Heap bytes held by the compiled automaton and its side table.
    pub fn memory_usage(&self) -> usize {
        self.nfa.memory_usage() + self.depth.by_state.len() * std::mem::size_of::<u32>()
    }

    /// The state of a matcher that has seen no text (or only text no stop can continue).
    pub(crate) fn start(&self) -> StateID {
        self.start
    }

    /// Runs the automaton over `delta` from `state` and, with `stop_at_match`, stops at the
    /// first byte where some stop completes, picking the longest stop ending there (then the
    /// lowest index). A standard automaton lists at each match state every stop ending there.
    pub(crate) fn scan(&self, mut state: StateID, delta: &[u8], stop_at_match: bool) -> Scan {
        let aut = &self.nfa;
        let mut i = 0;
        while i < delta.len() {
            if state == self.start {
                match delta[i..]
                    .iter()
                    .position(|&b| self.first_byte[usize::from(b)])
                {
                    Some(skip) => i += skip,
                    None => break,
                }
            }
            state = aut.next_state(Anchored::No, state, delta[i]);
            i += 1;
            if stop_at_match && aut.is_special(state) && aut.is_match(state) {
                let (len, Reverse(index)) = (0..aut.match_len(state))
                    .map(|k| aut.match_pattern(state, k))
                    .map(|pid| (aut.pattern_len(pid), Reverse(pid.as_usize())))
                    .max()
                    .expect("a match state lists at least one stop");
                return Scan::Matched { index, end: i, len };
            }
        }
        Scan::Open {
            state,
            held: self.depth.get(state),
        }
    }
}

impl std::fmt::Debug for StopStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StopStrings").field(&self.stops).finish()
    }
}

/// Rejects empty stop strings: an empty stop would match before any text.
pub(crate) fn check_non_empty(stops: &[String]) -> CoreResult<()> {
    match stops.iter().position(String::is_empty) {
        Some(i) => Err(CoreError::invalid(
            "stop",
            "empty",
            format!("`stop[{i}]` must be at least 1 character; got \"\""),
        )),
        None => Ok(()),
    }
}

/// The trie depth (bytes) of every state a scan can reach: the length of the longest suffix of
/// the text so far that is a prefix of some stop, i.e. how much text must be held back. A flat
/// table indexed by state id (ids are offsets into the automaton's own table; `shift` divides
/// out a common power-of-two factor when there is one).
struct Depths {
    by_state: Vec<u32>,
    shift: u32,
}

impl Depths {
    /// The unanchored start state and the depth of every trie node. Reading a prefix `p[..i]`
    /// of a stop from the start ends in the node of `p[..i]` itself (it is its own longest
    /// suffix that is a prefix of a stop), so walking every stop visits every node a scan can
    /// reach, each with its depth.
    fn new(aut: &NFA, stops: &[String]) -> CoreResult<(StateID, Depths)> {
        let start = aut
            .start_state(Anchored::No)
            .map_err(|err| CoreError::invalid("stop", "unsupported", format!("`stop`: {err}")))?;
        let mut nodes = vec![(start, 0u32)];
        for stop in stops {
            let mut state = start;
            for (i, &byte) in stop.as_bytes().iter().enumerate() {
                state = aut.next_state(Anchored::No, state, byte);
                // `i + 1 <= stop.len()`, far below `u32::MAX` for any stop set that compiles.
                nodes.push((state, (i + 1) as u32));
            }
        }
        let shift = nodes
            .iter()
            .map(|(s, _)| s.as_u32().trailing_zeros())
            .min()
            .unwrap_or(0)
            .min(31);
        let len = nodes.iter().map(|(s, _)| (s.as_usize() >> shift) + 1).max();
        let mut by_state = vec![0; len.unwrap_or(0)];
        for (state, depth) in nodes {
            by_state[state.as_usize() >> shift] = depth;
        }
        Ok((start, Depths { by_state, shift }))
    }

    /// The depth of `state`, a state some scan reached (all of which `new` recorded).
    #[inline]
    fn get(&self, state: StateID) -> usize {
        self.by_state[state.as_usize() >> self.shift] as usize
    }
}
