//! Speculative decoding: a decode row may carry draft tokens, verified in the same step.
//!
//! A row with `k` draft tokens computes `1 + k` positions (its last token, then the draft) and
//! yields `1 + k` samples: sample `i` is the target's draw after the output so far plus draft
//! tokens `0..i`, with every processor seeing exactly that history. The row keeps the longest
//! prefix of the draft the target agrees with, then the target's own token at the first
//! disagreement (or a bonus token after the last draft token): `a + 1` tokens for `a` accepted.
//!
//! The agreement rule keeps the output distribution the target's, whatever the draft:
//! - without draft logits (greedy, the n-gram drafter, a client's bare `draft_tokens`) the
//!   drafter counts as deterministic (`q` a point mass on its token), where accepting with
//!   probability `min(1, p/q) = p(d)` and resampling `max(0, p - q)` is the same as drawing from
//!   `p` and keeping the draft token when the draw equals it. Each draw uses the usual uniform of
//!   its position, so a seeded request gives the same tokens with or without a draft;
//! - with a client's `draft_logits` at temperature > 0, the speculative-sampling rule proper
//!   (`sampling::verify_draft`).
//!
//! Rejected positions are rolled back: `num_computed_tokens` advances by the committed tokens
//! only, blocks past them are freed, and draft tokens never enter `tokens` (so no block hash
//! or prefix-cache entry covers them) unless accepted.
//!
//! Who drafts: a request's own `draft_tokens` (its guess of the output's first tokens, used
//! while the output follows it), else prompt-lookup decoding when configured ([`propose_ngram`]).
//! Beam search, grammar-constrained requests and a row that forks into `n` sequences never
//! speculate (a client draft on the first two is refused at intake): their steps depend on
//! every candidate of a position, or on a grammar state per position.

use super::intake::NewRequest;
use super::plan::StepOutput;
use super::rank::SeqKey;
use super::request::{ClientDraft, Sequence};
use super::schedule::{PlanRecord, Row};
use super::scheduler::Scheduler;
use super::update::{cache_full_blocks, Samples};
use crate::error::{CoreError, CoreResult};
use crate::sampling::{verify_draft, DraftCheck, Sampled};
use crate::types::{SeqStatus, TokenId};
use rayon::prelude::*;
use std::sync::Arc;

/// Prompt-lookup decoding: the tokens that followed the latest earlier occurrence of the
/// longest n-gram (`min_n..=max_n` tokens) that ends `tokens`, at most `max_draft` of them;
/// empty when no such n-gram occurred before.
pub fn propose_ngram(
    tokens: &[TokenId],
    min_n: usize,
    max_n: usize,
    max_draft: usize,
) -> Vec<TokenId> {
    let len = tokens.len();
    if max_draft == 0 || min_n == 0 {
        return Vec::new();
    }
    for n in (min_n..=max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // Start positions j < len - n, so that at least one token follows the occurrence.
        if let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == suffix) {
            let end = (j + n + max_draft).min(len);
            return tokens[j + n..end].to_vec();
        }
    }
    Vec::new()
}

/// The client draft a new request carries (None when it has no draft tokens).
pub(crate) fn client_draft(
    tokens: Vec<TokenId>,
    logits: Option<Vec<f32>>,
) -> Option<Arc<ClientDraft>> {
    (!tokens.is_empty()).then(|| Arc::new(ClientDraft { tokens, logits }))
}

/// The part of `s`'s client draft still ahead of its output: None once the output left the
/// draft or passed its end.
fn client_draft_rest(s: &Sequence) -> Option<&[TokenId]> {
    let draft = s.draft.as_deref()?;
    let output = &s.tokens[s.num_prompt_tokens..];
    let ahead = draft.tokens.len().checked_sub(output.len())?;
    (ahead > 0 && draft.tokens[..output.len()] == *output).then(|| &draft.tokens[output.len()..])
}

/// Whether `s` may carry draft tokens at all. Prompt logprobs are scored from the prefill's
/// positions, which a draft would extend, so those requests do not speculate either.
fn may_speculate(s: &Sequence) -> bool {
    !s.params.use_beam_search
        && s.grammar.is_none()
        && !s.will_fork()
        && s.params.prompt_logprobs.is_none()
}

fn refuse(param: &'static str, code: &'static str, msg: String) -> CoreError {
    CoreError::invalid(param, code, msg)
}

impl Scheduler {
    /// Checks a new request's draft: token ids in the vocabulary, `draft_logits` only with
    /// draft tokens and of shape `[num_draft, vocab]`, and no draft where it could not be
    /// verified (beam search, a grammar).
    pub(crate) fn check_draft(&self, req: &NewRequest) -> CoreResult<()> {
        let (k, vocab) = (req.draft_tokens.len(), self.cfg.vocab_size);
        if let Some(logits) = &req.draft_logits {
            let rows_ok = k > 0 && logits.len() % k == 0 && !logits.is_empty();
            if !rows_ok || (vocab > 0 && logits.len() != k * vocab) {
                let msg = format!(
                    "`draft_logits` must be [num_draft_tokens ({k}), vocab_size] with num_draft_tokens > 0; got {} values",
                    logits.len()
                );
                return Err(refuse("draft_logits", "wrong_shape", msg));
            }
        }
        if k == 0 {
            return Ok(());
        }
        if let Some(t) = req
            .draft_tokens
            .iter()
            .find(|&&t| vocab > 0 && t as usize >= vocab)
        {
            let msg =
                format!("`draft_tokens` must be in [0, {vocab}) (the model's vocabulary); got {t}");
            return Err(refuse("draft_tokens", "out_of_range", msg));
        }
        let why = match (req.params.use_beam_search, req.grammar.is_some()) {
            (true, _) => "beam search",
            (_, true) => "a grammar (structured output)",
            _ => return Ok(()),
        };
        let msg = format!("`draft_tokens` cannot be used with {why}");
        Err(refuse("draft_tokens", "unsupported", msg))
    }

    /// Gives a just-admitted `row` (its blocks reserved) the draft its sequence has, when
    /// `budget` tokens and the blocks for them are left: a prompt computed in one step then
    /// verifies its draft in that same step.
    pub(crate) fn attach_draft(&mut self, row: &mut Row, budget: usize) {
        let (draft, client_draft) = self.draft_for(row.key, row.num_tokens, budget);
        if draft.is_empty()
            || self
                .reserve_blocks(row.key, row.num_tokens + draft.len())
                .is_none()
        {
            return;
        }
        row.num_tokens += draft.len();
        row.draft = draft;
        row.client_draft = client_draft;
    }

    /// The draft `key`'s row carries this step when it computes `num_tokens` and `budget`
    /// tokens are left after them: empty unless the row reaches the end of the sequence's
    /// tokens (a decode, or a prompt's last chunk) of a sequence that may speculate and has a
    /// draft. The bool says whether the draft is the client's. The draft
    /// never runs past `max_tokens` or `max_model_len` (the bonus token included).
    pub(crate) fn draft_for(
        &self,
        key: SeqKey,
        num_tokens: usize,
        budget: usize,
    ) -> (Vec<TokenId>, bool) {
        let s = self.seq(key);
        let at_end = s.num_computed_tokens + num_tokens == s.tokens.len();
        let spec = &self.cfg.speculative;
        if !at_end || !may_speculate(s) || (s.draft.is_none() && spec.is_none()) {
            return (Vec::new(), false);
        }
        let mut room = budget.min(self.cfg.max_model_len.saturating_sub(s.tokens.len() + 1));
        if let Some(m) = s.params.max_tokens {
            room = room.min((m as usize).saturating_sub(s.num_output_tokens() + 1));
        }
        if room == 0 {
            return (Vec::new(), false);
        }
        if let Some(rest) = client_draft_rest(s) {
            return (rest[..rest.len().min(room)].to_vec(), true);
        }
        match spec {
            Some(ng) => {
                let k = ng.num_draft_tokens.min(room);
                (propose_ngram(&s.tokens, ng.min_n, ng.max_n, k), false)
            }
            None => (Vec::new(), false),
        }
    }

    /// Per row of `rec`: the output plus the row's draft when it has one (the history its
    /// samples see), else empty.
    pub(crate) fn draft_histories(&self, rec: &PlanRecord) -> Vec<Vec<TokenId>> {
        rec.rows
            .iter()
            .map(|row| match row.draft.is_empty() {
                true => Vec::new(),
                false => {
                    let s = self.seq(row.key);
                    let output = &s.tokens[s.num_prompt_tokens..];
                    [output, &row.draft[..]].concat()
                }
            })
            .collect()
    }

    /// Verifies the drafts that came with logits (rows in parallel): per check, the index of
    /// its first sample and the tokens it yields.
    pub(crate) fn verify_drafts(
        &self,
        logits: &[f32],
        vocab: usize,
        checks: &[DraftCheck<'_>],
    ) -> Vec<(usize, CoreResult<Vec<Sampled>>)> {
        let run =
            |c: &DraftCheck<'_>| (c.reqs[0].row, verify_draft(logits, vocab, c, &self.sampler));
        match checks.len() {
            0 | 1 => checks.iter().map(run).collect(),
            _ => checks.par_iter().map(run).collect(),
        }
    }

    /// Applies a row that carried `row.draft`, whose samples start at `first`: commits the
    /// accepted draft tokens and the target's next token (each through `append`, so a stop,
    /// EOS or `max_tokens` inside the run ends the sequence at the right token), and rolls the
    /// rejected positions back.
    pub(crate) fn apply_draft_row(
        &mut self,
        row: &Row,
        first: usize,
        samples: &Samples<'_>,
        out: &mut StepOutput,
    ) {
        let k = row.draft.len();
        let accepted = (0..k)
            .take_while(|&i| samples.token_at(first + i) == Some(row.draft[i]))
            .count();
        self.num_draft_tokens += k as u64;
        self.num_accepted_draft_tokens += accepted as u64;
        let bs = self.cfg.block_size;
        let s = self.seqs[row.key as usize].as_mut().expect("scheduled");
        s.num_computed_tokens += row.num_tokens - k + accepted;
        let keep = s.num_computed_tokens.div_ceil(bs);
        if s.block_table.len() > keep {
            // Only this step's fresh blocks lie past the committed tokens: never cached, never
            // shared.
            let rejected = s.block_table.split_off(keep);
            self.pool.free(&rejected);
        }
        for i in first..=first + accepted {
            if self.seq(row.key).status != SeqStatus::Running {
                break;
            }
            let token = samples.token_at(i).expect("accepted run is drawn");
            self.append(row.key, token, samples.drawn(i), out);
        }
        let s = self.seqs[row.key as usize]
            .as_mut()
            .expect("live until dropped");
        if s.status == SeqStatus::Running {
            if self.cfg.enable_prefix_caching {
                cache_full_blocks(&mut self.pool, s, bs);
            }
            if row.client_draft && client_draft_rest(s).is_none() {
                s.draft = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::propose_ngram;

    #[test]
    fn ngram_proposes_the_continuation_of_the_longest_latest_match() {
        // "1 2 3" occurred at 0 and 5; the latest earlier occurrence wins.
        let t = [1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        assert_eq!(propose_ngram(&t, 1, 3, 4), vec![7, 8, 1, 2]);
        assert_eq!(propose_ngram(&t, 1, 3, 1), vec![7]);
        // A longer match beats a later shorter one: "9 5" only matches as "5".
        let t = [9, 5, 6, 1, 5, 2, 9, 5];
        assert_eq!(propose_ngram(&t, 1, 3, 3), vec![6, 1, 5]);
        assert_eq!(propose_ngram(&t, 1, 1, 3), vec![2, 9, 5]);
        // The continuation stops at the end of the sequence.
        assert_eq!(propose_ngram(&[4, 4, 4], 1, 3, 4), vec![4]);
    }

    #[test]
    fn ngram_proposes_nothing_without_a_match() {
        assert!(propose_ngram(&[1, 2, 3, 4], 1, 3, 4).is_empty());
        assert!(propose_ngram(&[1], 1, 3, 4).is_empty());
        assert!(propose_ngram(&[1, 2, 1, 2], 1, 3, 0).is_empty());
        // min_n above every match.
        assert!(propose_ngram(&[1, 2, 9, 2], 2, 3, 4).is_empty());
    }
}
