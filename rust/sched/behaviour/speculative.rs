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
//! A row whose behaviours forbid tentative tokens (`allows_lookahead`: their steps depend on
//! every candidate of a position, or on a grammar state per position), and a row that forks
//! into `n` sequences, never speculate (a client draft on the former is refused at intake).
//!
//! In the core's terms a draft is a row's `lookahead`: tentative tokens computed and sampled
//! after the row's own, kept only as far as the samples confirm them.

use std::ops::Range;
use std::sync::Arc;

use super::super::config::SchedulerConfig;
use super::super::core::{PlanRecord, Row, Samples, Scheduler};
use super::super::output::StepOutput;
use super::super::rank::SeqKey;
use super::super::request::NewRequest;
use super::super::seq::Sequence;
use super::super::stats::SchedulerStats;
use super::allows_lookahead;
use crate::error::{CoreError, CoreResult};
use crate::sampling::{verify_draft, DraftCheck, SampleRequest, SampleResult, Sampled};
use crate::types::{SeqStatus, TokenId};
use llguidance::toktrie::SimpleVob;
use rayon::prelude::*;

/// Draft tokens a request brought (TensorRT-LLM's `draft_input_ids` / `draft_logits`): a guess
/// of the output's first tokens, verified by the target model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClientDraft {
    pub tokens: Vec<TokenId>,
    /// Row-major `[tokens.len(), vocab]`: the drafter's logits at each draft token; its
    /// distribution is their softmax (the rows the draft tokens were drawn from).
    pub logits: Option<Vec<f32>>,
}

/// Draft tokens verified so far, and how many the target accepted.
#[derive(Debug, Default)]
pub(crate) struct DraftCounts {
    num_draft_tokens: u64,
    num_accepted_draft_tokens: u64,
}

impl DraftCounts {
    pub fn add_stats(&self, stats: &mut SchedulerStats) {
        stats.num_draft_tokens = self.num_draft_tokens;
        stats.num_accepted_draft_tokens = self.num_accepted_draft_tokens;
    }
}

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
    let draft = s.ext.draft.as_deref()?;
    let output = &s.tokens[s.num_prompt_tokens..];
    let ahead = draft.tokens.len().checked_sub(output.len())?;
    (ahead > 0 && draft.tokens[..output.len()] == *output).then(|| &draft.tokens[output.len()..])
}

/// Whether `s` may carry draft tokens at all. Prompt logprobs are scored from the prefill's
/// positions, which a draft would extend, so those requests do not speculate either.
fn may_speculate(s: &Sequence) -> bool {
    allows_lookahead(s) && !s.will_fork() && s.params.prompt_logprobs.is_none()
}

fn refuse(param: &'static str, code: &'static str, msg: String) -> CoreError {
    CoreError::invalid(param, code, msg)
}

/// Checks a new request's draft: token ids in the vocabulary, `draft_logits` only with draft
/// tokens and of shape `[num_draft, vocab]`.
pub(super) fn check_draft(cfg: &SchedulerConfig, req: &NewRequest) -> CoreResult<()> {
    let (k, vocab) = (req.draft_tokens.len(), cfg.vocab_size);
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
    if let Some(t) = req
        .draft_tokens
        .iter()
        .find(|&&t| vocab > 0 && t as usize >= vocab)
    {
        let msg =
            format!("`draft_tokens` must be in [0, {vocab}) (the model's vocabulary); got {t}");
        return Err(refuse("draft_tokens", "out_of_range", msg));
    }
    Ok(())
}

/// The sampling requests of `s`'s row with a draft, whose samples are `samples` of the plan:
/// sample `j` draws after the output plus draft tokens `0..j` (`history` is the output and the
/// whole draft), in the sequence's own stream.
pub(super) fn requests<'a>(
    s: &'a Sequence,
    samples: Range<usize>,
    eos_token_ids: &'a [TokenId],
    allowed: Option<&'a SimpleVob>,
    history: &'a [TokenId],
) -> Vec<SampleRequest<'a>> {
    let num_output = s.num_output_tokens();
    samples
        .enumerate()
        .map(|(j, row)| SampleRequest {
            row,
            params: &s.params,
            prompt: &s.tokens[..s.num_prompt_tokens],
            output: &history[..history.len().min(num_output + j)],
            seed: s.seed,
            sample_index: s.seq_index,
            eos_token_ids,
            allowed,
        })
        .collect()
}

/// The row's requests as a draft check when its draft is the client's, came with logits and
/// the request samples (temperature > 0): verified by `sampling::verify_draft`. Otherwise
/// the requests back, to be drawn like any other (a draw equal to the draft token accepts it).
pub(super) fn check_for<'a>(
    s: &'a Sequence,
    row: &'a Row,
    reqs: Vec<SampleRequest<'a>>,
) -> Result<DraftCheck<'a>, Vec<SampleRequest<'a>>> {
    let draft = s
        .ext
        .draft
        .as_deref()
        .filter(|_| client_draft_rest(s).is_some());
    let Some((draft, logits)) = draft.and_then(|d| Some((d, d.logits.as_deref()?))) else {
        return Err(reqs);
    };
    if s.params.is_greedy() {
        return Err(reqs);
    }
    let vocab = logits.len() / draft.tokens.len();
    let num_output = s.num_output_tokens();
    let rows = num_output * vocab..(num_output + row.lookahead.len()) * vocab;
    Ok(DraftCheck {
        reqs,
        draft: &row.lookahead,
        draft_logits: logits.get(rows).unwrap_or(&[]),
    })
}

/// Discards the samples after each draft's first rejected position (they would have followed
/// a token the row does not keep), failed or not: a row keeps its accepted draft tokens and
/// the target's token at the first disagreement.
pub(super) fn cut_rejected(rec: &PlanRecord, samples: &mut [Option<SampleResult>]) {
    let mut next = 0;
    for (row, &num_samples) in rec.rows.iter().zip(&rec.num_samples) {
        let first = next;
        next += num_samples as usize;
        for (j, &d) in row.lookahead.iter().enumerate() {
            let agrees = matches!(&samples[first + j], Some(Ok(t)) if t.token == d);
            if !agrees {
                samples[first + j + 1..next].fill(None);
                break;
            }
        }
    }
}

impl Scheduler {
    /// Gives `row` (its own tokens counted) the draft its sequence has this step, when
    /// `budget` tokens and the blocks for the row's tokens and the draft are left, reserving
    /// them. Returns false, changing nothing, otherwise. An admitted prompt computed in one
    /// step thus verifies its draft in that same step.
    pub(crate) fn attach_draft(&mut self, row: &mut Row, budget: usize) -> bool {
        let draft = self.draft_for(row.key, row.num_tokens, budget);
        if draft.is_empty() {
            return false;
        }
        let Some(copy) = self.reserve_blocks(row.key, row.num_tokens + draft.len()) else {
            return false;
        };
        row.num_tokens += draft.len();
        row.lookahead = draft;
        row.copy = row.copy.or(copy);
        true
    }

    /// The draft `key`'s row carries this step when it computes `num_tokens` and `budget`
    /// tokens are left after them: empty unless the row reaches the end of the sequence's
    /// tokens (a decode, or a prompt's last chunk) of a sequence that may speculate and has a
    /// draft (the client's while the output follows it, else the n-gram drafter's). The draft
    /// never runs past `max_tokens` or `max_model_len` (the bonus token included).
    fn draft_for(&self, key: SeqKey, num_tokens: usize, budget: usize) -> Vec<TokenId> {
        let s = self.seq(key);
        let cfg = self.config();
        let at_end = s.num_computed_tokens + num_tokens == s.tokens.len();
        let spec = &cfg.speculative;
        if !at_end || !may_speculate(s) || (s.ext.draft.is_none() && spec.is_none()) {
            return Vec::new();
        }
        let mut room = budget.min(cfg.max_model_len.saturating_sub(s.tokens.len() + 1));
        if let Some(m) = s.params.max_tokens {
            room = room.min((m as usize).saturating_sub(s.num_output_tokens() + 1));
        }
        if room == 0 {
            return Vec::new();
        }
        if let Some(rest) = client_draft_rest(s) {
            return rest[..rest.len().min(room)].to_vec();
        }
        match spec {
            Some(ng) => {
                let k = ng.num_draft_tokens.min(room);
                propose_ngram(&s.tokens, ng.min_n, ng.max_n, k)
            }
            None => Vec::new(),
        }
    }

    /// Per row of `rec`: the output plus the row's draft when it has one (the history its
    /// samples see), else empty.
    pub(super) fn draft_histories(&self, rec: &PlanRecord) -> Vec<Vec<TokenId>> {
        rec.rows
            .iter()
            .map(|row| match row.lookahead.is_empty() {
                true => Vec::new(),
                false => {
                    let s = self.seq(row.key);
                    let output = &s.tokens[s.num_prompt_tokens..];
                    [output, &row.lookahead[..]].concat()
                }
            })
            .collect()
    }

    /// Verifies the drafts that came with logits (rows in parallel): per check, the index of
    /// its first sample and the tokens it yields.
    pub(super) fn verify_drafts(
        &self,
        logits: &[f32],
        vocab: usize,
        checks: &[DraftCheck<'_>],
    ) -> Vec<(usize, CoreResult<Vec<Sampled>>)> {
        let sampler = self.sampler();
        let run = |c: &DraftCheck<'_>| (c.reqs[0].row, verify_draft(logits, vocab, c, sampler));
        match checks.len() {
            0 | 1 => checks.iter().map(run).collect(),
            _ => checks.par_iter().map(run).collect(),
        }
    }

    /// Applies a row that carried a draft, whose samples start at `first`: commits the
    /// accepted draft tokens and the target's next token (each through `append`, so a stop,
    /// EOS or `max_tokens` inside the run ends the sequence at the right token), and rolls the
    /// rejected positions back.
    pub(super) fn apply_draft_row(
        &mut self,
        row: &Row,
        first: usize,
        samples: &Samples<'_>,
        out: &mut StepOutput,
    ) {
        let k = row.lookahead.len();
        let accepted = (0..k)
            .take_while(|&i| samples.token_at(first + i) == Some(row.lookahead[i]))
            .count();
        let counts = &mut self.edges_mut().drafts;
        counts.num_draft_tokens += k as u64;
        counts.num_accepted_draft_tokens += accepted as u64;
        let client = client_draft_rest(self.seq(row.key)).is_some();
        self.seq_mut(row.key).num_computed_tokens += row.num_tokens - k + accepted;
        // Only this step's fresh blocks lie past the committed tokens.
        self.release_blocks_past_computed(row.key);
        for i in first..=first + accepted {
            if self.seq(row.key).status != SeqStatus::Running {
                break;
            }
            let token = samples.token_at(i).expect("accepted run is drawn");
            self.append(row.key, token, samples.drawn(i), out);
        }
        if self.seq(row.key).status == SeqStatus::Running {
            self.cache_blocks(row.key);
            let s = self.seq_mut(row.key);
            if client && client_draft_rest(s).is_none() {
                s.ext.draft = None;
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
