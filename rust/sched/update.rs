//! `Scheduler::update()` / `update_with_logits()`: apply one step's tokens (given, or sampled
//! here from the step's logits). Advances computed tokens, offers newly full blocks to the prefix
//! cache, forks `n`-sequence requests after their prompt, appends tokens, applies token-level
//! stops, detokenizes and matches stop strings, and frees what finished. A sample that could not
//! be drawn fails its request alone (`StepOutput::failed_req_ids`).

use super::beam::BeamStep;
use super::plan::StepOutput;
use super::rank::SeqKey;
use super::request::Sequence;
use super::schedule::PlanRecord;
use super::scheduler::Scheduler;
use crate::detok::Detokenizer;
use crate::error::{CoreError, CoreResult};
use crate::sampling::{self, BeamCandidate, DraftCheck, SampleRequest, SampleResult, Sampled};
use crate::types::{FinishReason, RequestId, SeqStatus, TokenId};
use llguidance::toktrie::SimpleVob;
use rayon::prelude::*;
use rustc_hash::FxHashMap;

/// The tokens of one step: given by the caller, or drawn here from the step's logits (where a
/// sample may have failed).
/// Beam groups' samples are not drawn (`None`): `beam_step` consumes them, nor are the
/// positions after a rejected draft token verified with draft logits.
pub(crate) enum Samples<'a> {
    Given(&'a [TokenId]),
    Drawn(Vec<Option<SampleResult>>),
}

impl Samples<'_> {
    /// The token of sample `i`, which must not have failed.
    fn token(&self, i: usize) -> TokenId {
        match self {
            Samples::Given(t) => t[i],
            Samples::Drawn(d) => {
                let drawn = d[i].as_ref().expect("beam samples are not appended");
                drawn.as_ref().expect("failed samples are skipped").token
            }
        }
    }

    /// The token of sample `i`, if it was drawn and did not fail.
    pub(crate) fn token_at(&self, i: usize) -> Option<TokenId> {
        match self {
            Samples::Given(t) => t.get(i).copied(),
            Samples::Drawn(d) => d.get(i)?.as_ref()?.as_ref().ok().map(|s| s.token),
        }
    }

    pub(crate) fn drawn(&self, i: usize) -> Option<&Sampled> {
        match self {
            Samples::Given(_) => None,
            Samples::Drawn(d) => d[i].as_ref().and_then(|r| r.as_ref().ok()),
        }
    }

    pub(crate) fn error(&self, i: usize) -> Option<&CoreError> {
        match self {
            Samples::Given(_) => None,
            Samples::Drawn(d) => d[i].as_ref().and_then(|r| r.as_ref().err()),
        }
    }

    fn num_top_logprobs(&self) -> usize {
        match self {
            Samples::Given(_) => 0,
            Samples::Drawn(d) => d
                .iter()
                .flatten()
                .flatten()
                .map(|s| s.top_logprobs.len())
                .max()
                .unwrap_or(0),
        }
    }
}

/// The beam groups of a step with their continuations (or why they could not be computed).
type BeamResults = Vec<(BeamStep, CoreResult<Vec<BeamCandidate>>)>;

impl Scheduler {
    /// Applies the tokens sampled for the plan of step `step_id`, one per sample in plan order.
    /// Fails, changing nothing, if the plan is not the last one or the count is wrong.
    pub fn update(
        &mut self,
        step_id: u64,
        sampled_token_ids: &[TokenId],
    ) -> CoreResult<StepOutput> {
        let rec = self.take_plan(step_id)?;
        if sampled_token_ids.len() != rec.total_samples {
            let expected = rec.total_samples;
            self.last = Some(rec);
            return Err(CoreError::invalid(
                "sampled_token_ids",
                "wrong_length",
                format!(
                    "`sampled_token_ids` must have one token per sample of the plan ({expected}); got {}",
                    sampled_token_ids.len()
                ),
            ));
        }
        if self.cfg.prefill_only {
            return Ok(self.finish_prefill(&rec));
        }
        if !self.beam_steps(&sample_keys(&rec)).is_empty() {
            self.last = Some(rec);
            return Err(CoreError::invalid(
                "sampled_token_ids",
                "beam_search",
                "the plan holds beam-search rows, which are chosen from the logits: call `update_with_logits`",
            ));
        }
        Ok(self.apply(&rec, &Samples::Given(sampled_token_ids), Vec::new()))
    }

    /// Samples every row of the step from `logits` (row-major `[num_samples, vocab]`, row `i`
    /// for sample `i` of the plan) and applies the tokens like [`Scheduler::update`]. Rows are
    /// drawn in parallel; each sequence's draw depends only on its own seed, sample index and
    /// position. Fails, changing nothing, on a stale plan or a logits shape that does not match.
    /// A sample that cannot be drawn (its parameters do not fit the row, or no finite logit is
    /// left after its processors) fails its request alone: see `StepOutput::failed_req_ids`.
    pub fn update_with_logits(
        &mut self,
        step_id: u64,
        logits: &[f32],
        vocab: usize,
    ) -> CoreResult<StepOutput> {
        if self.cfg.prefill_only {
            return Err(CoreError::invalid(
                "logits",
                "prefill_only",
                "a prefill-only scheduler samples nothing: end its steps with `update(step_id, [])`",
            ));
        }
        let rec = self.take_plan(step_id)?;
        let expected = rec.total_samples * vocab;
        if vocab == 0 || logits.len() != expected {
            let rows = rec.total_samples;
            self.last = Some(rec);
            return Err(CoreError::invalid(
                "logits",
                "wrong_shape",
                format!(
                    "`logits` must be [num_samples ({rows}), vocab] with vocab > 0; got {} values for vocab {vocab}",
                    logits.len()
                ),
            ));
        }
        let keys = sample_keys(&rec);
        let steps = self.beam_steps(&keys);
        let masks = self.grammar_masks(&rec);
        let histories = self.draft_histories(&rec);
        let drawn = {
            let (reqs, checks) = self.sample_requests(&rec, &steps, &masks, &histories);
            sampling::sample(logits, vocab, &reqs, &self.sampler).map(|d| {
                let rows = reqs.iter().map(|r| r.row).collect::<Vec<_>>();
                (rows, d, self.verify_drafts(logits, vocab, &checks))
            })
        };
        match drawn {
            Ok((rows, drawn, verified)) => {
                let mut all: Vec<Option<SampleResult>> = vec![None; rec.total_samples];
                for (row, d) in rows.into_iter().zip(drawn) {
                    all[row] = Some(d);
                }
                for (first, tokens) in verified {
                    match tokens {
                        Ok(tokens) => {
                            for (i, t) in tokens.into_iter().enumerate() {
                                all[first + i] = Some(Ok(t));
                            }
                        }
                        Err(e) => all[first] = Some(Err(e)),
                    }
                }
                for (i, key) in keys.iter().enumerate() {
                    if let Some(Err(e)) = masks.get(key) {
                        all[i] = Some(Err(e.clone()));
                    }
                }
                let cands = self.beam_candidates(&steps, logits, vocab, &masks);
                let beams = steps.into_iter().zip(cands).collect();
                Ok(self.apply(&rec, &Samples::Drawn(all), beams))
            }
            Err(e) => {
                self.last = Some(rec);
                Err(e)
            }
        }
    }

    /// The grammar masks of the plan's sampling rows whose sequences have a grammar, computed
    /// in parallel (a forking row's mask serves all its samples).
    fn grammar_masks(&mut self, rec: &PlanRecord) -> GrammarMasks {
        let sampled: FxHashMap<SeqKey, ()> = rec
            .rows
            .iter()
            .zip(&rec.num_samples)
            .filter(|(row, &n)| n > 0 && self.seq(row.key).grammar.is_some())
            .map(|(row, _)| (row.key, ()))
            .collect();
        // A step without constrained rows (the usual one) touches nothing more.
        if sampled.is_empty() {
            return GrammarMasks::default();
        }
        let mut states: Vec<(SeqKey, &mut crate::grammar::GrammarState)> = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter(|(k, _)| sampled.contains_key(&(*k as SeqKey)))
            .filter_map(|(k, s)| Some((k as SeqKey, s.as_mut()?.grammar.as_deref_mut()?)))
            .collect();
        match states.len() {
            0 => GrammarMasks::default(),
            1 => states.iter_mut().map(|(k, g)| (*k, g.mask())).collect(),
            _ => states.par_iter_mut().map(|(k, g)| (*k, g.mask())).collect(),
        }
    }

    /// Takes the record of the plan `step_id`, which must be the last one `schedule()` returned.
    fn take_plan(&mut self, step_id: u64) -> CoreResult<PlanRecord> {
        match self.last.take() {
            Some(rec) if rec.step_id == step_id => Ok(rec),
            other => {
                self.last = other;
                Err(CoreError::StalePlan {
                    got: step_id,
                    expected: self.last.as_ref().map_or(self.step + 1, |r| r.step_id),
                })
            }
        }
    }

    /// One sampling request per sample of the plan, beam groups' samples left out. A row that
    /// forks draws its `n` samples from the parent's history with sample indices 0..n, the
    /// indices its children will carry. A row with a draft draws sample `j` after its output
    /// plus draft tokens `0..j` (from `histories`); one whose client draft has logits and
    /// samples at temperature > 0 goes to the second list, to be verified by
    /// `sampling::verify_draft`.
    fn sample_requests<'a>(
        &'a self,
        rec: &'a PlanRecord,
        beams: &[BeamStep],
        masks: &'a GrammarMasks,
        histories: &'a [Vec<TokenId>],
    ) -> (Vec<SampleRequest<'a>>, Vec<DraftCheck<'a>>) {
        let mut reqs = Vec::with_capacity(rec.total_samples);
        let mut checks = Vec::new();
        let mut i = 0;
        for (r, (row, &num_samples)) in rec.rows.iter().zip(&rec.num_samples).enumerate() {
            let s = self.seqs[row.key as usize].as_ref().expect("scheduled");
            let first = i;
            i += num_samples as usize;
            let allowed = match masks.get(&row.key) {
                Some(Ok(mask)) => Some(mask),
                Some(Err(_)) => continue, // the request fails (see update_with_logits)
                None => None,
            };
            if beams.iter().any(|b| b.req_id == s.req_id) {
                continue;
            }
            let speculative = !row.draft.is_empty();
            let draft_logits = match (row.client_draft, s.params.is_greedy()) {
                (true, false) => s.draft.as_deref().and_then(|d| d.logits.as_deref()),
                _ => None,
            };
            let history = match speculative {
                true => &histories[r][..],
                false => &s.tokens[s.num_prompt_tokens..],
            };
            let num_output = s.num_output_tokens();
            let row_reqs = (0..num_samples).map(|j| SampleRequest {
                row: first + j as usize,
                params: &s.params,
                prompt: &s.tokens[..s.num_prompt_tokens],
                output: &history[..history.len().min(num_output + j as usize)],
                seed: s.seed,
                sample_index: if num_samples > 1 && !speculative {
                    j
                } else {
                    s.seq_index
                },
                eos_token_ids: &self.cfg.eos_token_ids,
                allowed,
            });
            match draft_logits {
                Some(logits) => {
                    let vocab = logits.len() / s.draft.as_ref().map_or(1, |d| d.tokens.len());
                    let rows = num_output * vocab..(num_output + row.draft.len()) * vocab;
                    checks.push(DraftCheck {
                        reqs: row_reqs.collect(),
                        draft: &row.draft,
                        draft_logits: logits.get(rows).unwrap_or(&[]),
                    });
                }
                None => reqs.extend(row_reqs),
            }
        }
        (reqs, checks)
    }

    fn apply(&mut self, rec: &PlanRecord, samples: &Samples<'_>, beams: BeamResults) -> StepOutput {
        let ended_width = self.ended_beams.iter().filter_map(|e| e.params.logprobs);
        let beam_width = beams
            .iter()
            .filter_map(|(b, _)| self.seq(b.members[0]).params.logprobs)
            .chain(ended_width)
            .max()
            .map_or(0, |k| k as usize);
        let mut out = StepOutput {
            num_top_logprobs: samples.num_top_logprobs().max(beam_width),
            text_offsets: vec![0],
            logprob_byte_offsets: vec![0],
            ..StepOutput::default()
        };
        let mut failed = self.failed_requests(rec, samples);
        for (b, cands) in &beams {
            // A failed grammar mask fails the group's samples too: report the request once.
            let listed = failed.iter().any(|(id, _)| *id == b.req_id);
            if let (Err(e), false) = (cands, listed) {
                failed.push((b.req_id, e.to_string()));
            }
        }
        let mut next = 0;
        for (row, &num_samples) in rec.rows.iter().zip(&rec.num_samples) {
            let (first, num_samples) = (next, num_samples as usize);
            next += num_samples;
            let req_id = self.seq(row.key).req_id;
            if !row.draft.is_empty() {
                if !failed.iter().any(|(id, _)| *id == req_id) {
                    self.apply_draft_row(row, first, samples, &mut out);
                }
                continue;
            }
            self.advance(row.key, row.num_tokens);
            let in_beam = beams.iter().any(|(b, _)| b.req_id == req_id);
            if num_samples == 0 || in_beam || failed.iter().any(|(id, _)| *id == req_id) {
                continue;
            }
            let mut keys = vec![row.key];
            if num_samples > 1 {
                self.fork(row.key, num_samples, &mut keys);
            }
            for (j, &key) in keys.iter().enumerate() {
                let i = first + j;
                self.append(key, samples.token(i), samples.drawn(i), &mut out);
            }
        }
        for (step, cands) in &beams {
            if let Ok(cands) = cands {
                self.beam_step(step, cands, &mut out);
            }
        }
        self.emit_ended_beams(&mut out);
        for (req_id, message) in failed {
            self.fail_request(req_id);
            out.failed_req_ids.push(req_id.0);
            out.failed_messages.push(message);
        }
        let done = self.drop_finished();
        let failed_ids = &out.failed_req_ids;
        out.finished_req_ids = done
            .into_iter()
            .map(|id| id.0)
            .filter(|id| !failed_ids.contains(id))
            .collect();
        out
    }

    /// The requests with a sample that failed in this step, each once with its first error.
    fn failed_requests(&self, rec: &PlanRecord, samples: &Samples<'_>) -> Vec<(RequestId, String)> {
        let mut failed: Vec<(RequestId, String)> = Vec::new();
        let mut next = 0;
        for (row, &num_samples) in rec.rows.iter().zip(&rec.num_samples) {
            let req_id = self.seq(row.key).req_id;
            for i in next..next + num_samples as usize {
                let Some(err) = samples.error(i) else {
                    // Positions after a rejected draft token are discarded, failed or not.
                    let j = i - next;
                    match row.draft.get(j) {
                        Some(&d) if samples.token_at(i) != Some(d) => break,
                        _ => continue,
                    }
                };
                if !failed.iter().any(|(id, _)| *id == req_id) {
                    failed.push((req_id, err.to_string()));
                }
                break;
            }
            next += num_samples as usize;
        }
        failed
    }

    /// Records that `num_tokens` more tokens of `key` are computed and caches full blocks.
    fn advance(&mut self, key: SeqKey, num_tokens: usize) {
        let s = self.seqs[key as usize]
            .as_mut()
            .expect("scheduled sequence is live");
        s.num_computed_tokens += num_tokens;
        if self.cfg.enable_prefix_caching {
            cache_full_blocks(&mut self.pool, s, self.cfg.block_size);
        }
    }

    /// Splits a request's first sequence into `n`: the children share every block (refcounts go
    /// up) and the partial last block is copied on the first write (see `reserve_blocks`).
    fn fork(&mut self, key: SeqKey, n: usize, keys: &mut Vec<SeqKey>) {
        let parent = self.seqs[key as usize].as_mut().expect("live");
        parent.seats = 1;
        let template = parent.clone();
        for &b in &template.block_table {
            for _ in 1..n {
                self.pool.incref(b);
            }
        }
        for j in 1..n {
            let child = self.insert_seq(Sequence {
                seq_index: j as u32,
                ..template.clone()
            });
            self.running.push(child);
            self.requests
                .get_mut(&template.req_id)
                .expect("request of a live seq")
                .seqs
                .push(child);
            keys.push(child);
        }
    }

    /// Appends one token to `key`: token-level stops, then text and stop strings, then the
    /// output columns; a finished sequence is released.
    pub(crate) fn append(
        &mut self,
        key: SeqKey,
        token: TokenId,
        drawn: Option<&Sampled>,
        out: &mut StepOutput,
    ) {
        let s = self.seqs[key as usize].as_mut().expect("live");
        s.tokens.push(token);
        let stop = token_stop(s, &self.cfg.eos_token_ids, self.cfg.max_model_len);
        let (mut finish, mut stop_token_id) = (stop.map(|(f, _)| f), stop.map_or(-1, |(_, t)| t));
        let mut grammar_done = false;
        let open = matches!(finish, None | Some(FinishReason::Length));
        if let (Some(g), true) = (s.grammar.as_deref_mut(), open) {
            // The mask allowed the token; a failure shows at the next mask, failing the request.
            let _ = g.consume(token);
            if g.is_stopped() {
                // The grammar is complete: nothing but EOS could follow, so end here (a stop,
                // even on the last token `max_tokens` allows).
                finish = Some(FinishReason::Stop);
                stop_token_id = -1;
                grammar_done = true;
            }
        }
        let text_start = out.text.len();
        let mut stop_str_index = -1;
        if let (Some(text), Some(detok)) = (s.text.as_mut(), self.detok.as_deref()) {
            let num_output = s.tokens.len() - s.num_prompt_tokens;
            // The token that completes a grammar is content: its text flushes, never drops.
            let text_finish = if grammar_done {
                Some(FinishReason::Length)
            } else {
                finish
            };
            let matched = text.on_token(
                detok,
                &s.params,
                token,
                num_output,
                text_finish,
                &mut out.text,
            );
            if let Some(i) = matched {
                finish = Some(FinishReason::Stop);
                stop_str_index = i as i32;
                stop_token_id = -1;
            }
        }
        let num_chars = out.text[text_start..].chars().count() as u32;
        let last_offset = *out.text_offsets.last().expect("starts with 0");
        out.text_offsets.push(last_offset + num_chars);
        out.stop_str_indices.push(stop_str_index);
        out.stop_token_ids.push(stop_token_id);
        out.req_ids.push(s.req_id.0);
        out.seq_indices.push(s.seq_index);
        out.token_ids.push(token);
        out.finish_reasons.push(finish.map_or(0, |f| f as u8));
        out.sequence_scores.push(f32::NAN);
        // A candidate of a best_of > n request carries its token logprobs even when none were
        // asked for: the engine ranks the candidates by their sum (and returns no entries).
        let drawn = drawn.filter(|_| s.params.needs_token_logprob());
        push_logprobs(out, drawn, self.detok.as_deref());
        if let Some(reason) = finish {
            self.finish_seq(key, reason);
        }
    }
}

/// The logprob columns of one sample (`drawn` is None when the request needs none, or the
/// caller sampled): NaN and padding then. With a detokenizer, the bytes of the chosen token and
/// of each alternative go with them (empty for padding), so that logprob entries reach Python
/// with their token texts in the step that made them.
pub(crate) fn push_logprobs(
    out: &mut StepOutput,
    drawn: Option<&Sampled>,
    detok: Option<&Detokenizer>,
) {
    let width = out.num_top_logprobs;
    let top = drawn.map_or(&[][..], |d| &d.top_logprobs[..]);
    out.logprobs
        .push(drawn.and_then(|d| d.logprob).unwrap_or(f32::NAN));
    push_token_bytes(out, detok, drawn.map(|d| d.token));
    for k in 0..width {
        let (id, lp) = top
            .get(k)
            .map_or((-1, f32::NEG_INFINITY), |&(t, l)| (t as i32, l));
        out.top_token_ids.push(id);
        out.top_logprobs.push(lp);
        push_token_bytes(out, detok, u32::try_from(id).ok());
    }
}

/// Appends the bytes `token` stands for (nothing for `None` or without a detokenizer) as the
/// next entry of the logprob byte columns.
fn push_token_bytes(out: &mut StepOutput, detok: Option<&Detokenizer>, token: Option<TokenId>) {
    if let (Some(d), Some(t)) = (detok, token) {
        out.logprob_bytes.extend_from_slice(&d.token_bytes(t));
    }
    let end = u32::try_from(out.logprob_bytes.len()).expect("a step's logprob bytes fit u32");
    out.logprob_byte_offsets.push(end);
}

/// Each step's grammar masks, by sequence: the tokens its grammar allows next, or why the
/// grammar failed (the request then fails alone).
pub(crate) type GrammarMasks = FxHashMap<SeqKey, CoreResult<SimpleVob>>;

/// The sequence of each sample of the plan, in order.
fn sample_keys(rec: &PlanRecord) -> Vec<SeqKey> {
    rec.rows
        .iter()
        .zip(&rec.num_samples)
        .flat_map(|(row, &n)| std::iter::repeat_n(row.key, n as usize))
        .collect()
}

/// Offers `s`'s computed full blocks past `num_cached_blocks` to the prefix cache.
pub(crate) fn cache_full_blocks(pool: &mut crate::kv::BlockPool, s: &mut Sequence, bs: usize) {
    let num_full = s.num_computed_tokens / bs;
    while s.num_cached_blocks < num_full {
        let i = s.num_cached_blocks;
        let hash = s.block_hash(i, bs);
        let key = pool.key_after(
            i.checked_sub(1).map(|p| s.block_table[p]),
            s.extra_key.as_ref(),
        );
        let tokens = &s.tokens[i * bs..(i + 1) * bs];
        pool.insert(s.block_table[i], hash, tokens, key);
        s.num_cached_blocks += 1;
    }
}

/// The token-level end of a sequence whose last token was just appended, if any, with the stop
/// token id that caused it (-1 for EOS, a stop token sequence or a length limit). EOS (unless
/// `ignore_eos`) and stop token ids count only once `min_tokens` tokens exist. An id that is
/// both EOS and a stop token id reports as EOS, as in vLLM.
fn token_stop(s: &Sequence, eos: &[TokenId], max_model_len: usize) -> Option<(FinishReason, i64)> {
    let token = *s.tokens.last().expect("just appended");
    let params = &s.params;
    let num_output = s.num_output_tokens();
    let past_min = num_output >= params.min_tokens as usize;
    let is_eos = !params.ignore_eos && eos.contains(&token);
    if past_min && (is_eos || params.stop_token_ids.contains(&token)) {
        let id = if is_eos { -1 } else { i64::from(token) };
        return Some((FinishReason::Stop, id));
    }
    if past_min
        && s.token_stops
            .as_ref()
            .is_some_and(|t| t.matches(&s.tokens[s.num_prompt_tokens..]).is_some())
    {
        return Some((FinishReason::Stop, -1));
    }
    if params.max_tokens.is_some_and(|m| num_output >= m as usize)
        || s.tokens.len() >= max_model_len
    {
        return Some((FinishReason::Length, -1));
    }
    debug_assert_eq!(s.status, SeqStatus::Running);
    None
}
