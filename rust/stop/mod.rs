//! Stop strings on the decoded text of a sequence, and multi-token stop sequences on its ids.
//!
//! # Semantics of stop strings
//!
//! The stop that *completes first* in the text ends it: the match with the earliest end; among
//! matches ending at the same place, the one starting earliest (the longest); among equal
//! strings, the lowest index. This is what a streaming generator can decide without look-ahead,
//! and it does not depend on how the text is split into deltas. The output ends just before the
//! match, or just after it with `include_stop_str_in_output`; nothing after it is ever emitted.
//! [`truncate_at_stop`] states the rule as a brute-force reference.
//!
//! # Hold-back
//!
//! [`StopMatcher`] emits text as soon as no stop can still start in it: it holds back exactly the
//! longest suffix of the text seen so far that is a proper prefix of some stop string (never a
//! fixed window), so a stream never shows text that is later withdrawn. That suffix always starts
//! on a char boundary (it starts with a stop's first byte, which is never a UTF-8 continuation
//! byte), so no char is ever split.
//!
//! The held suffix is read off the Aho-Corasick automaton: after any text, its state is the trie
//! node of the longest suffix of the text that is a prefix of some stop, so the node's depth is
//! the number of bytes to hold. A push therefore scans only the new delta (the state carries
//! everything needed about the text before it) and costs O(delta + held), whatever the length
//! of the text so far.
//!
//! With no stop strings the matcher is a pass-through.
//!
//! Before `min_tokens`, text is fed with [`StopMatcher::push_without_stopping`]: stops that
//! complete inside it are let pass, but one that starts there and completes later still cuts
//! the text where it starts.
//!
//! # Token stop sequences
//!
//! [`TokenStops`] matches multi-token stop sequences (TensorRT-LLM `stop_words_list`) on the
//! tail of the generated ids, checked after each appended token; single stop ids are the
//! scheduler's.

mod matcher;
mod reference;
mod strings;
mod tokens;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

pub use matcher::StopMatcher;
pub use reference::truncate_at_stop;
#[cfg(feature = "python")]
pub(crate) use strings::check_non_empty;
pub use strings::StopStrings;
pub use tokens::TokenStops;
