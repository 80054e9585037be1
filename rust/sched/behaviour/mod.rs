//! Per-request behaviour at the scheduler's edges. The core (`sched::core`) knows sequences,
//! groups, one token budget and KV blocks; what a request does beyond drawing one token per
//! sequence lives here, one file per behaviour:
//!
//! - `sample.rs`: plain sampling; `n > 1` forks the prompt's sequence into `n`.
//! - `best_of.rs`: `best_of > n`: candidates held back, ranked by cumulative logprob, the best
//!   `n` shown once all have finished.
//! - `beam.rs`: beam search: a gang of beams chosen again every step from the logits.
//! - `speculative.rs`: draft tokens (the client's, or prompt lookup) verified in the same step.
//! - `grammar.rs`: grammar masks for constrained decoding.
//!
//! (Prefill-only packing, for embeddings, is a scheduler of its own: `sched::prefill`.)
//!
//! A request decodes in one of the ways of [`Behaviour`], whose state lives in the request's
//! group; grammars and drafts are per-sequence additions ([`SeqExt`]) that compose with it. The
//! methods here are the core's only calls into behaviours, each dispatching to the files above:
//! a new behaviour adds a file and its arms here, not branches in the core.

mod beam;
mod best_of;
mod grammar;
mod sample;
mod speculative;

use std::ops::Range;
use std::sync::Arc;

use super::core::{PlanRecord, Row, Samples, Scheduler};
use super::output::StepOutput;
use super::rank::SeqKey;
use super::request::NewRequest;
use super::seq::Sequence;
use super::stats::SchedulerStats;
use crate::error::{CoreError, CoreResult};
use crate::grammar::GrammarState;
use crate::params::SamplingParams;
use crate::sampling::{self, BeamCandidate, SampleRequest, SampleResult};
use crate::types::{FinishReason, RequestId, TokenId};

pub use speculative::propose_ngram;

/// How a request decodes, with the state it keeps across steps.
#[derive(Debug)]
pub(crate) enum Behaviour {
    /// `sample.rs`: one token per sequence per step; `n > 1` forks after the prompt.
    Sample,
    /// `best_of.rs`: sampled like `Sample`, its candidates' entries held until ranked.
    BestOf(Box<best_of::Candidates>),
    /// `beam.rs`: the beams' finished hypotheses and stopping state.
    Beam(Box<beam::BeamGroup>),
}

/// Which way a request decodes, read from its parameters where a group lookup would cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sample,
    BestOf,
    Beam,
}

impl Kind {
    fn of(params: &SamplingParams) -> Kind {
        if params.use_beam_search {
            Kind::Beam
        } else if params.ranks_candidates() {
            Kind::BestOf
        } else {
            Kind::Sample
        }
    }
}

/// What a sequence keeps for its request's behaviours.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqExt {
    /// `grammar.rs`: the grammar's state after this sequence's output so far.
    pub grammar: Option<Box<GrammarState>>,
    /// `speculative.rs`: the client's draft of the output's first tokens, until it is used up
    /// or the output leaves it.
    pub draft: Option<Arc<speculative::ClientDraft>>,
    /// `beam.rs`: this is a live beam, with its score and logprobs.
    pub beam: Option<Box<beam::Beam>>,
}

/// What the behaviours keep for the whole scheduler: their counters.
#[derive(Debug, Default)]
pub(crate) struct Edges {
    drafts: speculative::DraftCounts,
}

impl Edges {
    /// Adds the behaviours' counters to `stats`.
    pub fn add_stats(&self, stats: &mut SchedulerStats) {
        self.drafts.add_stats(stats);
    }
}

/// What a new request starts with.
pub(crate) struct Start {
    pub behaviour: Behaviour,
    pub ext: SeqExt,
    /// Whether the sequences decode their text as tokens come (else the behaviour decodes the
    /// text of what it shows itself).
    pub streams_text: bool,
}

/// A step's work beyond its per-sample draws, from `draw` to `finish_step`: the beam groups
/// with their continuations (or why they could not be computed).
#[derive(Default)]
pub(crate) struct StepEdges {
    beams: Vec<(beam::BeamStep, CoreResult<Vec<BeamCandidate>>)>,
}

impl StepEdges {
    /// The requests these edges failed, with why.
    pub fn failures(&self) -> Vec<(RequestId, CoreError)> {
        self.beams
            .iter()
            .filter_map(|(b, c)| c.as_ref().err().map(|e| (b.req_id, e.clone())))
            .collect()
    }
}

/// The first field of `req` that asks for a behaviour that samples, if any: what a scheduler
/// that samples nothing (`sched::prefill`) refuses.
pub(crate) fn sampling_field(req: &NewRequest) -> Option<&'static str> {
    let p = &req.params;
    let asked = [
        ("use_beam_search", p.use_beam_search),
        ("n", p.n > 1),
        ("best_of", p.best_of > 1),
        ("grammar", req.grammar.is_some()),
        ("draft_tokens", !req.draft_tokens.is_empty()),
    ];
    asked.into_iter().find(|(_, a)| *a).map(|(field, _)| field)
}

/// Whether `s`'s behaviours let its rows carry tentative tokens: not when its steps depend on
/// every candidate of a position (a beam search) or on a grammar state per position.
fn allows_lookahead(s: &Sequence) -> bool {
    Kind::of(&s.params) != Kind::Beam && s.ext.grammar.is_none()
}

/// What the behaviours make of a token just appended to `s`, whose token-level end is
/// `finish`: they may end the output there. Returns true when they did, the token being the
/// output's last content (its text is flushed, never dropped).
pub(crate) fn on_token(
    s: &mut Sequence,
    token: TokenId,
    finish: &mut Option<FinishReason>,
) -> bool {
    grammar::on_token(s, token, finish)
}

impl Scheduler {
    /// Checks what the request's behaviours need of it: a grammar without `ignore_eos`, a
    /// well-formed draft where one can be verified, a beam group the pool can hold.
    pub(crate) fn check_behaviours(&self, req: &NewRequest) -> CoreResult<()> {
        grammar::check(req)?;
        speculative::check_draft(self.config(), req)?;
        let why = match (req.params.use_beam_search, req.grammar.is_some()) {
            _ if req.draft_tokens.is_empty() => None,
            (true, _) => Some("beam search"),
            (_, true) => Some("a grammar (structured output)"),
            _ => None,
        };
        if let Some(why) = why {
            let msg = format!("`draft_tokens` cannot be used with {why}");
            return Err(CoreError::invalid("draft_tokens", "unsupported", msg));
        }
        if req.params.use_beam_search {
            self.check_beam_fits(&req.params, req.prompt_token_ids.len())?;
        }
        Ok(())
    }

    /// The behaviours a checked request starts with (its grammar and draft move into them).
    pub(crate) fn start_behaviours(&self, req: &mut NewRequest) -> Start {
        let ext = SeqExt {
            grammar: req.grammar.take().map(Box::new),
            draft: speculative::client_draft(
                std::mem::take(&mut req.draft_tokens),
                req.draft_logits.take(),
            ),
            beam: None,
        };
        let behaviour = match Kind::of(&req.params) {
            Kind::Sample => Behaviour::Sample,
            Kind::BestOf => Behaviour::BestOf(Box::new(best_of::Candidates::new(&req.params))),
            Kind::Beam => {
                let group = self.new_beam_group(&req.params, req.prompt_token_ids.len());
                Behaviour::Beam(Box::new(group))
            }
        };
        Start {
            // A beam's text is decoded once its hypothesis is chosen.
            streams_text: !matches!(behaviour, Behaviour::Beam(_)),
            behaviour,
            ext,
        }
    }

    /// Samples `s`'s row yields once it reaches the end of its tokens.
    pub(crate) fn samples_at_end(&self, s: &Sequence) -> u32 {
        match Kind::of(&s.params) {
            // A beam group's first row yields one sample: the beams come from its logits.
            Kind::Beam => 1,
            Kind::Sample | Kind::BestOf => sample::samples_at_end(s),
        }
    }

    /// Extends a row with the tentative tokens its sequence's behaviours add (with `budget`
    /// tokens left after the row's own), reserving blocks for the row's tokens and them. Returns
    /// false, changing nothing, when it adds none or their blocks are not free.
    pub(crate) fn extend_row(&mut self, row: &mut Row, budget: usize) -> bool {
        self.attach_draft(row, budget)
    }

    /// A request ends at `schedule()` (abort, deadline): its behaviour may keep what it found
    /// so far for the next `update()` to emit.
    pub(crate) fn on_request_end(&mut self, req_id: RequestId, reason: FinishReason) {
        match &self.group(req_id).behaviour {
            Behaviour::Sample => {}
            Behaviour::BestOf(_) => self.show_ended_candidates(req_id, reason),
            Behaviour::Beam(_) => self.keep_beams_of_ended(req_id, reason),
        }
    }

    /// Refuses tokens given for a step whose behaviours choose from the logits themselves.
    pub(crate) fn check_given(&self, rec: &PlanRecord) -> CoreResult<()> {
        if self.beam_steps(&sample_keys(rec)).is_empty() {
            return Ok(());
        }
        Err(CoreError::invalid(
            "sampled_token_ids",
            "beam_search",
            "the plan holds beam-search rows, which are chosen from the logits: call `update_with_logits`",
        ))
    }

    /// Draws the step's samples from `logits` (`[num_samples, vocab]`): grammar masks first,
    /// then every row's samples in one parallel pass, drafts verified, and the beam groups'
    /// continuations. Fails, changing nothing, when the sampler refuses the whole batch.
    pub(crate) fn draw(
        &mut self,
        rec: &PlanRecord,
        logits: &[f32],
        vocab: usize,
    ) -> CoreResult<(Samples<'static>, StepEdges)> {
        let keys = sample_keys(rec);
        let steps = self.beam_steps(&keys);
        let masks = self.grammar_masks(rec);
        let histories = self.draft_histories(rec);
        let (rows, drawn, verified) = {
            let (reqs, checks) = self.sample_requests(rec, &steps, &masks, &histories);
            let drawn = sampling::sample(logits, vocab, &reqs, self.sampler())?;
            let rows: Vec<usize> = reqs.iter().map(|r| r.row).collect();
            (rows, drawn, self.verify_drafts(logits, vocab, &checks))
        };
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
        speculative::cut_rejected(rec, &mut all);
        let cands = self.beam_candidates(&steps, logits, vocab, &masks);
        let beams = steps.into_iter().zip(cands).collect();
        Ok((Samples::Drawn(all), StepEdges { beams }))
    }

    /// One sampling request per sample of the plan, left out: beam groups' samples (their
    /// continuations come from `beam_candidates`) and rows whose grammar failed. Rows with
    /// drafts verified against the drafter's logits go to the second list.
    fn sample_requests<'a>(
        &'a self,
        rec: &'a PlanRecord,
        beams: &[beam::BeamStep],
        masks: &'a grammar::Masks,
        histories: &'a [Vec<TokenId>],
    ) -> (Vec<SampleRequest<'a>>, Vec<sampling::DraftCheck<'a>>) {
        let mut reqs = Vec::with_capacity(rec.total_samples);
        let mut checks = Vec::new();
        let eos = &self.config().eos_token_ids;
        let mut next = 0;
        for (r, (row, &num_samples)) in rec.rows.iter().zip(&rec.num_samples).enumerate() {
            let s = self.seq(row.key);
            let samples = next..next + num_samples as usize;
            next = samples.end;
            let allowed = match masks.get(&row.key) {
                Some(Ok(mask)) => Some(mask),
                Some(Err(_)) => continue, // the request fails (see `draw`)
                None => None,
            };
            if samples.is_empty() || beams.iter().any(|b| b.req_id == s.req_id) {
                continue;
            }
            match row.lookahead.is_empty() {
                true => reqs.extend(sample::requests(s, samples, eos, allowed)),
                false => {
                    let row_reqs = speculative::requests(s, samples, eos, allowed, &histories[r]);
                    match speculative::check_for(s, row, row_reqs) {
                        Ok(check) => checks.push(check),
                        Err(row_reqs) => reqs.extend(row_reqs),
                    }
                }
            }
        }
        (reqs, checks)
    }

    /// Applies one row's samples (`samples` the range of its samples in the plan); `ok` is
    /// false when its request failed in this step.
    pub(crate) fn apply_row(
        &mut self,
        row: &Row,
        samples: Range<usize>,
        drawn: &Samples<'_>,
        ok: bool,
        out: &mut StepOutput,
    ) {
        if !row.lookahead.is_empty() {
            if ok {
                self.apply_draft_row(row, samples.start, drawn, out);
            }
            return;
        }
        self.advance(row.key, row.num_tokens);
        if samples.is_empty() || !ok {
            return;
        }
        match Kind::of(&self.seq(row.key).params) {
            // The group's step applies its samples (`finish_step`).
            Kind::Beam => {}
            Kind::Sample | Kind::BestOf => self.apply_samples(row.key, samples, drawn, out),
        }
    }

    /// What the step's behaviours do once every row is applied: each beam group's step.
    pub(crate) fn finish_step(&mut self, edges: StepEdges, out: &mut StepOutput) {
        for (step, cands) in &edges.beams {
            if let Ok(cands) = cands {
                self.beam_step(step, cands, out);
            }
        }
    }

    /// The entry just appended for `key` is at the end of `out`: its behaviour may hold it back.
    pub(crate) fn after_append(&mut self, key: SeqKey, out: &mut StepOutput) {
        if Kind::of(&self.seq(key).params) == Kind::BestOf {
            self.hold_candidate_entry(key, out);
        }
    }
}

/// The sequence of each sample of the plan, in order.
fn sample_keys(rec: &PlanRecord) -> Vec<SeqKey> {
    rec.rows
        .iter()
        .zip(&rec.num_samples)
        .flat_map(|(row, &n)| std::iter::repeat_n(row.key, n as usize))
        .collect()
}
