//! Beam search in the scheduler: a request with `use_beam_search` is a group of up to
//! `best_of` live beams, each a [`Sequence`] with its own block table. Until its prompt is done
//! the group is its first sequence alone (holding `best_of` seats); from then on every step
//! samples all live beams together and [`Scheduler::beam_step`] replaces them by the best
//! continuations (HF transformers' `generate(num_beams=...)` semantics, see below).
//!
//! KV sharing: a new beam takes its parent's block table (refcounts go up), so every common
//! prefix, the prompt's included, is held once; a beam reorder rewires block tables and never
//! recomputes anything. The partial last block is copied on the beam's next write
//! (`reserve_blocks`'s copy-on-write), the only KV ever copied.
//!
//! Scheduling: a group's beams are sampled in the same step or not at all: they are a gang
//! (`Sequence::gang`), so the core gives their decode rows all together, preempts them together
//! and re-admits them as a whole, each beam recomputing up to its last token; the group then
//! resumes with the same beams.
//!
//! Selection, as transformers' `_beam_search` (do_sample=False): the `max(2, 1 + #stop ids) *
//! width` best continuations over all beams (`sampling::beam_candidates`); of the first `width`
//! of them, those that end the hypothesis (EOS unless `ignore_eos`, a `stop_token_ids` id, a
//! multi-token stop sequence, or the length limit) join the finished hypotheses, scored
//! `sum_logprobs / generated_len^length_penalty`, best `width` kept; the first `width` that do
//! not end become the next beams. The search stops when no running beam can still improve the
//! finished ones (`early_stopping`), when `width` hypotheses are finished under
//! `early_stopping: true`, or when no continuation is left; the best `n` finished hypotheses
//! are then emitted, each as a whole sequence of tokens with text and logprobs.

use std::sync::Arc;

use rayon::prelude::*;

use super::super::core::Scheduler;
use super::super::output::{Entry, OutRow, StepOutput};
use super::super::rank::SeqKey;
use super::super::seq::Sequence;
use super::super::text::text_state_for;
use super::{grammar, Behaviour};
use crate::error::{CoreError, CoreResult};
use crate::params::{EarlyStopping, SamplingParams};
use crate::sampling::{beam_candidates, BeamCandidate, BeamRow, SampleRequest, Sampled};
use crate::types::{FinishReason, RequestId, TokenId};

/// Score of a slot that holds no hypothesis yet (transformers' placeholder).
const NO_SCORE: f32 = -1.0e9;

/// The per-token logprob entry of a beam: the token's processed logprob and the beam's best
/// alternatives at that position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BeamToken {
    pub logprob: f32,
    pub top: Vec<(TokenId, f32)>,
}

/// What a live beam carries besides its tokens.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Beam {
    /// Sum of the processed logprobs of its generated tokens.
    pub score: f32,
    /// Per generated token, when the request asked for logprobs.
    pub logprobs: Vec<BeamToken>,
}

/// A finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hypothesis {
    /// Generated tokens (the ending stop token included).
    pub output: Vec<TokenId>,
    /// `sum_logprobs / generated_len^length_penalty`.
    pub score: f32,
    pub finish: FinishReason,
    /// The `stop_token_ids` id that ended it, else -1.
    pub stop_token_id: i64,
    pub logprobs: Vec<BeamToken>,
}

/// A beam search's state beyond its live beams.
#[derive(Debug, Clone)]
pub(crate) struct BeamGroup {
    /// Beams kept per step (`best_of`).
    pub width: usize,
    /// Finished hypotheses, best first, at most `width`.
    pub finished: Vec<Hypothesis>,
    /// transformers' `is_early_stop_heuristic_unsatisfied`: whether a running beam may still
    /// beat the worst finished hypothesis; once false, the search ends.
    pub improvable: bool,
    /// Token ids that end a hypothesis: EOS (unless `ignore_eos`) and `stop_token_ids`.
    pub stop_ids: Vec<TokenId>,
    /// The most tokens a hypothesis may generate (`max_tokens`, or up to `max_model_len`).
    pub max_new_tokens: usize,
}

impl BeamGroup {
    pub fn new(params: &SamplingParams, eos: &[TokenId], max_new_tokens: usize) -> Self {
        let mut stop_ids: Vec<TokenId> = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend(eos.iter().filter(|t| !params.stop_token_ids.contains(t)));
        }
        BeamGroup {
            width: params.best_of as usize,
            finished: Vec::new(),
            improvable: true,
            stop_ids,
            max_new_tokens,
        }
    }

    /// Continuations gathered per step: enough that `width` of them do not end even when the
    /// best ones all pick a stop token (transformers' `beams_to_keep`).
    pub fn num_candidates(&self) -> usize {
        (1 + self.stop_ids.len()).max(2) * self.width
    }
}

/// One group's step: its beams (in row order) and the logits row of each.
pub(crate) struct BeamStep {
    pub req_id: RequestId,
    pub members: Vec<SeqKey>,
    pub rows: Vec<usize>,
}

/// `x / len^penalty`, the length-normalised score.
fn normalised(sum: f32, len: usize, penalty: f32) -> f32 {
    sum / (len as f64).powf(f64::from(penalty)) as f32
}

impl Scheduler {
    /// The beam groups sampled in a step, from its rows' sequences and sample indices
    /// (`samples[i]` = the sequence of sample `i`).
    pub(super) fn beam_steps(&self, samples: &[SeqKey]) -> Vec<BeamStep> {
        let mut steps: Vec<BeamStep> = Vec::new();
        for (i, &key) in samples.iter().enumerate() {
            let s = self.seq(key);
            // A request's group exists exactly when its parameters ask for beam search.
            if !s.params.use_beam_search {
                continue;
            }
            match steps.iter_mut().find(|g| g.req_id == s.req_id) {
                Some(g) => {
                    g.members.push(key);
                    g.rows.push(i);
                }
                None => steps.push(BeamStep {
                    req_id: s.req_id,
                    members: vec![key],
                    rows: vec![i],
                }),
            }
        }
        steps
    }

    /// Each group's best continuations (groups and their beams in parallel).
    pub(super) fn beam_candidates(
        &self,
        steps: &[BeamStep],
        logits: &[f32],
        vocab: usize,
        masks: &grammar::Masks,
    ) -> Vec<CoreResult<Vec<BeamCandidate>>> {
        let eos = &self.config().eos_token_ids;
        steps
            .par_iter()
            .map(|g| {
                let group = self.beam_group(g.req_id);
                if let Some(Err(e)) = g
                    .members
                    .iter()
                    .find_map(|k| masks.get(k))
                    .filter(|m| m.is_err())
                {
                    return Err(e.clone());
                }
                let rows: Vec<BeamRow<'_>> = g
                    .members
                    .iter()
                    .zip(&g.rows)
                    .map(|(&key, &row)| {
                        let s = self.seq(key);
                        BeamRow {
                            logits: &logits[row * vocab..][..vocab],
                            req: SampleRequest {
                                row,
                                params: &s.params,
                                prompt: &s.tokens[..s.num_prompt_tokens],
                                output: &s.tokens[s.num_prompt_tokens..],
                                seed: 0,
                                sample_index: 0,
                                eos_token_ids: eos,
                                allowed: masks.get(&key).and_then(|m| m.as_ref().ok()),
                            },
                            score: s.ext.beam.as_ref().map_or(0.0, |b| b.score),
                        }
                    })
                    .collect();
                let params = &self.seq(g.members[0]).params;
                beam_candidates(&rows, vocab, group.num_candidates(), params.logprobs)
            })
            .collect()
    }

    /// Applies one group's step: finished hypotheses updated, then either the next beams take
    /// the places of `members`, or the search ends and its best `n` hypotheses go to `out`.
    pub(super) fn beam_step(
        &mut self,
        step: &BeamStep,
        cands: &[BeamCandidate],
        out: &mut StepOutput,
    ) {
        let behaviour = &mut self.group_mut(step.req_id).behaviour;
        let Behaviour::Beam(mut group) = std::mem::replace(behaviour, Behaviour::Sample) else {
            unreachable!("a beam search's group holds its state");
        };
        let first = self.seq(step.members[0]);
        let params = Arc::clone(&first.params);
        let gen_len = first.num_output_tokens() + 1;
        let at_limit = gen_len >= group.max_new_tokens;
        let stop_ids = &group.stop_ids;
        let ends = |c: &BeamCandidate| -> Option<(FinishReason, i64)> {
            let s = self.seq(step.members[c.beam]);
            if stop_ids.contains(&c.token) {
                let id = match params.stop_token_ids.contains(&c.token)
                    && !self.is_eos(c.token, &params)
                {
                    true => i64::from(c.token),
                    false => -1,
                };
                return Some((FinishReason::Stop, id));
            }
            if let Some(stops) = &s.token_stops {
                let mut tail: Vec<TokenId> = s.tokens[s.num_prompt_tokens..].to_vec();
                tail.push(c.token);
                if stops.matches(&tail).is_some() && gen_len >= params.min_tokens as usize {
                    return Some((FinishReason::Stop, -1));
                }
            }
            at_limit.then_some((FinishReason::Length, -1))
        };
        let endings: Vec<Option<(FinishReason, i64)>> = cands.iter().map(ends).collect();
        let width = group.width;
        let lp = params.length_penalty;
        let full = |g: &BeamGroup| g.finished.len() == width;
        let closed = full(&group) && params.early_stopping == EarlyStopping::Finished;
        if group.improvable && !closed {
            for (c, end) in cands.iter().zip(&endings).take(width) {
                if let Some((finish, stop_token_id)) = *end {
                    let hyp = self.hypothesis(
                        step.members[c.beam],
                        c,
                        gen_len,
                        lp,
                        finish,
                        stop_token_id,
                    );
                    let at = group.finished.partition_point(|h| h.score >= hyp.score);
                    group.finished.insert(at, hyp);
                    group.finished.truncate(width);
                }
            }
        }
        let next: Vec<&BeamCandidate> = cands
            .iter()
            .zip(&endings)
            .filter(|(_, end)| end.is_none())
            .map(|(c, _)| c)
            .take(width)
            .collect();
        if let Some(best) = next.first() {
            let best_len = match params.early_stopping == EarlyStopping::Never && lp > 0.0 {
                true => group.max_new_tokens,
                false => gen_len,
            };
            let worst = match full(&group) {
                true => group.finished.last().map_or(NO_SCORE, |h| h.score),
                false => NO_SCORE,
            };
            group.improvable &= normalised(best.score, best_len, lp) > worst;
        }
        let closed = full(&group) && params.early_stopping == EarlyStopping::Finished;
        if next.is_empty() || !group.improvable || closed {
            self.end_beam_search(step, &mut group, &next, gen_len, out);
        } else {
            self.reorder_beams(step, &next);
        }
        self.group_mut(step.req_id).behaviour = Behaviour::Beam(group);
    }

    /// A beam search that an abort or its deadline ends keeps what it found: the best `n` of
    /// its finished hypotheses and live beams (scored as if they ended now), all ending with
    /// `reason`, emitted by the next `update()`. Nothing is kept before the first beams exist.
    pub(super) fn keep_beams_of_ended(&mut self, req_id: RequestId, reason: FinishReason) {
        let mut hypotheses = self.beam_group(req_id).finished.clone();
        let mut params = None;
        for &key in &self.group(req_id).seqs {
            let s = self.seq(key);
            params = Some(Arc::clone(&s.params));
            let Some(beam) = s.ext.beam.as_deref() else {
                continue;
            };
            let output = s.tokens[s.num_prompt_tokens..].to_vec();
            hypotheses.push(Hypothesis {
                score: normalised(beam.score, output.len(), s.params.length_penalty),
                output,
                finish: reason,
                stop_token_id: -1,
                logprobs: beam.logprobs.clone(),
            });
        }
        let Some(params) = params else { return };
        hypotheses.sort_by(|a, b| b.score.total_cmp(&a.score));
        hypotheses.truncate(params.n as usize);
        for h in &mut hypotheses {
            h.finish = reason;
        }
        let rows: Vec<OutRow> = hypotheses
            .iter()
            .enumerate()
            .flat_map(|(index, hyp)| self.hypothesis_rows(req_id, index as u32, hyp, &params))
            .collect();
        self.hold_rows(rows);
    }

    /// The state of `req_id`'s beam search.
    fn beam_group(&self, req_id: RequestId) -> &BeamGroup {
        match &self.group(req_id).behaviour {
            Behaviour::Beam(group) => group,
            _ => unreachable!("a beam search's group holds its state"),
        }
    }

    /// A beam group for a new request with a prompt of `num_prompt` tokens.
    pub(super) fn new_beam_group(&self, params: &SamplingParams, num_prompt: usize) -> BeamGroup {
        let cfg = self.config();
        let room = cfg.max_model_len - num_prompt;
        let max_new = params.max_tokens.map_or(room, |m| room.min(m as usize));
        BeamGroup::new(params, &cfg.eos_token_ids, max_new)
    }

    fn is_eos(&self, token: TokenId, params: &SamplingParams) -> bool {
        !params.ignore_eos && self.config().eos_token_ids.contains(&token)
    }

    /// The hypothesis `c` makes of the beam `key`.
    fn hypothesis(
        &self,
        key: SeqKey,
        c: &BeamCandidate,
        gen_len: usize,
        length_penalty: f32,
        finish: FinishReason,
        stop_token_id: i64,
    ) -> Hypothesis {
        let s = self.seq(key);
        let mut output = s.tokens[s.num_prompt_tokens..].to_vec();
        output.push(c.token);
        let mut logprobs = s
            .ext
            .beam
            .as_ref()
            .map_or_else(Vec::new, |b| b.logprobs.clone());
        if s.params.logprobs.is_some() {
            logprobs.push(BeamToken {
                logprob: c.logprob,
                top: c.top_logprobs.clone(),
            });
        }
        Hypothesis {
            output,
            score: normalised(c.score, gen_len, length_penalty),
            finish,
            stop_token_id,
            logprobs,
        }
    }

    /// The next beams take the places of `step.members`: each is its parent's sequence plus
    /// one token, sharing the parent's blocks. Extra members end; missing ones are added.
    fn reorder_beams(&mut self, step: &BeamStep, next: &[&BeamCandidate]) {
        let mut beams: Vec<Sequence> = Vec::with_capacity(next.len());
        for (j, c) in next.iter().enumerate() {
            let mut s = self.clone_shared(step.members[c.beam]);
            s.seq_index = j as u32;
            s.seats = 1;
            s.gang = true;
            s.tokens.push(c.token);
            grammar::follow(&mut s, c.token);
            let mut beam = s.ext.beam.take().unwrap_or_else(|| {
                Box::new(Beam {
                    score: 0.0,
                    logprobs: Vec::new(),
                })
            });
            beam.score = c.score;
            if s.params.logprobs.is_some() {
                beam.logprobs.push(BeamToken {
                    logprob: c.logprob,
                    top: c.top_logprobs.clone(),
                });
            }
            s.ext.beam = Some(beam);
            beams.push(s);
        }
        self.replace_seqs(step.req_id, &step.members, beams);
    }

    /// Ends the search: every live beam finishes (blocks freed) and the best `n` hypotheses
    /// are emitted. Should fewer than `n` have finished (no continuation was left), the best
    /// running continuations fill in, ended by length.
    fn end_beam_search(
        &mut self,
        step: &BeamStep,
        group: &mut BeamGroup,
        next: &[&BeamCandidate],
        gen_len: usize,
        out: &mut StepOutput,
    ) {
        let params = Arc::clone(&self.seq(step.members[0]).params);
        let n = params.n as usize;
        for c in next {
            if group.finished.len() >= n {
                break;
            }
            let hyp = self.hypothesis(
                step.members[c.beam],
                c,
                gen_len,
                params.length_penalty,
                FinishReason::Length,
                -1,
            );
            group.finished.push(hyp);
        }
        for &key in &step.members {
            self.finish_seq(key, FinishReason::Stop);
        }
        for (index, hyp) in group.finished.iter().take(n).enumerate() {
            for row in self.hypothesis_rows(step.req_id, index as u32, hyp, &params) {
                out.push_row(&row);
            }
        }
    }

    /// A whole hypothesis as output entries, one per token, as sequence `index`: its text
    /// from a fresh detokenizer (stop token text dropped unless `include_stop_str_in_output`),
    /// its logprobs, and its score on the last entry.
    fn hypothesis_rows(
        &self,
        req_id: RequestId,
        index: u32,
        hyp: &Hypothesis,
        params: &SamplingParams,
    ) -> Vec<OutRow> {
        let detok = self.detok();
        let mut text = text_state_for(detok, params).ok().and_then(|(t, _)| t);
        let last = hyp.output.len() - 1;
        let mut rows = Vec::with_capacity(hyp.output.len());
        for (i, &token) in hyp.output.iter().enumerate() {
            let finish = (i == last).then_some(hyp.finish);
            let mut piece = String::new();
            if let (Some(text), Some(detok)) = (text.as_mut(), detok) {
                text.on_token(detok, params, token, i + 1, finish, &mut piece);
            }
            let entry = Entry {
                req_id: req_id.0,
                seq_index: index,
                token_id: token,
                finish_reason: finish.map_or(0, |f| f as u8),
                stop_str_index: -1,
                stop_token_id: if i == last { hyp.stop_token_id } else { -1 },
                sequence_score: if i == last { hyp.score } else { f32::NAN },
            };
            let drawn = hyp.logprobs.get(i).map(|t| Sampled {
                token,
                logprob: Some(t.logprob),
                top_logprobs: t.top.clone(),
            });
            rows.push(OutRow::new(entry, piece, drawn.as_ref(), detok));
        }
        rows
    }

    /// Refuses a beam search the pool could never hold: `best_of` beams that share nothing,
    /// each at its longest, must fit the KV blocks (so a group alone always runs to its end).
    pub(super) fn check_beam_fits(
        &self,
        params: &SamplingParams,
        num_prompt: usize,
    ) -> CoreResult<()> {
        let cfg = self.config();
        let longest = params.max_tokens.map_or(cfg.max_model_len, |m| {
            (num_prompt + m as usize).min(cfg.max_model_len)
        });
        let need = params.best_of as usize * longest.div_ceil(cfg.block_size);
        let have = self.pool().num_blocks() - 1;
        if need > have {
            let msg = format!(
                "`best_of`: a beam width of {} over {longest} tokens can need {need} KV blocks; \
                 the cache has {have}. Lower the beam width or `max_tokens`",
                params.best_of
            );
            return Err(CoreError::invalid("best_of", "out_of_range", msg));
        }
        Ok(())
    }
}
