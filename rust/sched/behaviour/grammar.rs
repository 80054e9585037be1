//! Constrained decoding: a request's grammar (compiled by the caller) is copied into each of its
//! sequences, which follows it token by token. Before a step's draws, every sampled sequence
//! with a grammar computes the tokens it allows next (in parallel), and its draws (and the
//! continuations a behaviour chooses from the logits itself) see only those; each appended token advances the grammar, and a grammar that
//! is complete ends the output (a stop) on the token that completed it. A grammar that fails
//! fails its request alone, at its next mask.

use rustc_hash::FxHashMap;

use super::super::core::{PlanRecord, Scheduler};
use super::super::rank::SeqKey;
use super::super::request::NewRequest;
use super::super::seq::Sequence;
use crate::error::{CoreError, CoreResult};
use crate::grammar::GrammarState;
use crate::types::{FinishReason, TokenId};
use llguidance::toktrie::SimpleVob;
use rayon::prelude::*;

/// Each step's grammar masks, by sequence: the tokens its grammar allows next, or why the
/// grammar failed (the request then fails alone).
pub(super) type Masks = FxHashMap<SeqKey, CoreResult<SimpleVob>>;

/// A grammar decides where the output ends, so it cannot be combined with `ignore_eos`.
pub(super) fn check(req: &NewRequest) -> CoreResult<()> {
    if req.grammar.is_some() && req.params.ignore_eos {
        return Err(CoreError::invalid(
            "ignore_eos",
            "conflict",
            "`ignore_eos` cannot be used with a grammar (structured output ends where the grammar does)",
        ));
    }
    Ok(())
}

/// Advances `s`'s grammar past `token` unless the token already ended the output by a stop;
/// a grammar now complete ends it (a stop, even on the last token `max_tokens` allows).
/// Returns whether it did.
pub(super) fn on_token(
    s: &mut Sequence,
    token: TokenId,
    finish: &mut Option<FinishReason>,
) -> bool {
    let open = matches!(finish, None | Some(FinishReason::Length));
    let Some(g) = s.ext.grammar.as_deref_mut().filter(|_| open) else {
        return false;
    };
    // The mask allowed the token; a failure shows at the next mask, failing the request.
    let _ = g.consume(token);
    if !g.is_stopped() {
        return false;
    }
    // Nothing but EOS could follow: end here.
    *finish = Some(FinishReason::Stop);
    true
}

/// Advances a sequence's grammar past `token` that a behaviour chose from the masked logits
/// itself (not through a draw): the mask allowed it; a failure shows at the next mask.
pub(super) fn follow(s: &mut Sequence, token: TokenId) {
    if let Some(g) = s.ext.grammar.as_deref_mut() {
        let _ = g.consume(token);
    }
}

impl Scheduler {
    /// The grammar masks of the plan's sampling rows whose sequences have a grammar, computed
    /// in parallel (a forking row's mask serves all its samples).
    pub(super) fn grammar_masks(&mut self, rec: &PlanRecord) -> Masks {
        let sampled: FxHashMap<SeqKey, ()> = rec
            .rows
            .iter()
            .zip(&rec.num_samples)
            .filter(|(row, &n)| n > 0 && self.seq(row.key).ext.grammar.is_some())
            .map(|(row, _)| (row.key, ()))
            .collect();
        // A step without constrained rows (the usual one) touches nothing more.
        if sampled.is_empty() {
            return Masks::default();
        }
        let mut states: Vec<(SeqKey, &mut GrammarState)> = self
            .seqs_mut()
            .filter(|(k, _)| sampled.contains_key(k))
            .filter_map(|(k, s)| Some((k, s.ext.grammar.as_deref_mut()?)))
            .collect();
        match states.len() {
            0 => Masks::default(),
            1 => states.iter_mut().map(|(k, g)| (*k, g.mask())).collect(),
            _ => states.par_iter_mut().map(|(k, g)| (*k, g.mask())).collect(),
        }
    }
}
