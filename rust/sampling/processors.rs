//! Steps 1-8 of the sampler (see the module docs of `sampling` for the order): each processor
//! touches only the tokens it concerns, except the dense `embedding_bias`, `allowed_token_ids`
//! and temperature, so the cost of the penalties grows with the history, not the vocabulary.
//!
//! Token ids at or beyond the row's length are skipped everywhere: they have no logit to change
//! (`validate` rejects them against the tokenizer's vocabulary, and a model's logits row may be
//! padded beyond that vocabulary).

use super::kernels::{copy_sanitized, divide, sanitize};
use super::scratch::{ProcScratch, IN_PROMPT};
use super::SampleRequest;
use crate::error::{CoreError, CoreResult};
use crate::params::{SamplingParams, MAX_LOGPROBS};
use crate::types::TokenId;
use llguidance::toktrie::SimpleVob;

/// Checks what the sampler cannot act on for a row of `vocab` logits: an `embedding_bias` of
/// another length, or more top logprobs than [`MAX_LOGPROBS`].
pub(crate) fn check_params(p: &SamplingParams, vocab: usize) -> CoreResult<()> {
    if let Some(bias) = &p.embedding_bias {
        if bias.len() != vocab {
            return Err(CoreError::invalid(
                "embedding_bias",
                "length_mismatch",
                format!(
                    "`embedding_bias` must have one value per vocabulary entry ({vocab}); got {}",
                    bias.len()
                ),
            ));
        }
    }
    if let Some(k) = p.logprobs {
        if k > MAX_LOGPROBS {
            return Err(CoreError::invalid(
                "logprobs",
                "out_of_range",
                format!("`logprobs` must be in [0, {MAX_LOGPROBS}]; got {k}"),
            ));
        }
    }
    Ok(())
}

/// Checks that every token id `p` names is below `vocab`: `logit_bias`, `allowed_token_ids`,
/// `bad_words`, `stop_token_ids` and `stop_token_sequences`. The sampler itself skips such ids
/// (a logits row may be padded beyond the vocabulary); admission rejects them.
fn check_token_ids(p: &SamplingParams, vocab: usize) -> CoreResult<()> {
    fn beyond<'a>(ids: impl IntoIterator<Item = &'a TokenId>, vocab: usize) -> Option<TokenId> {
        ids.into_iter().copied().find(|&id| id as usize >= vocab)
    }
    let found = [
        (
            "logit_bias",
            beyond(p.logit_bias.iter().map(|(id, _)| id), vocab),
        ),
        (
            "allowed_token_ids",
            beyond(p.allowed_token_ids.iter().flatten(), vocab),
        ),
        ("bad_words", beyond(p.bad_words.iter().flatten(), vocab)),
        ("stop_token_ids", beyond(&p.stop_token_ids, vocab)),
        (
            "stop_token_sequences",
            beyond(p.stop_token_sequences.iter().flatten(), vocab),
        ),
    ];
    for (param, id) in found {
        if let Some(id) = id {
            return Err(CoreError::invalid(
                param,
                "out_of_range",
                format!(
                    "`{param}` must hold token ids below the model's vocabulary size ({vocab}); got {id}"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that `p` fits a model of `vocab` tokens before any work starts: what the sampler
/// checks per row ([`check_params`]) plus every token id `p` names.
pub fn check_fits_vocab(p: &SamplingParams, vocab: usize) -> CoreResult<()> {
    check_params(p, vocab)?;
    check_token_ids(p, vocab)
}

/// Copies `raw` into `row` (NaN -> `-inf`) and applies steps 1-7; temperature is left to the
/// caller, which skips it for greedy rows.
pub(crate) fn process_into(
    row: &mut [f32],
    raw: &[f32],
    req: &SampleRequest<'_>,
    s: &mut ProcScratch,
) {
    copy_sanitized(row, raw);
    apply_steps(row, req, s);
}

/// Steps 1-7 and the temperature in place (the public `process_logits`).
pub(crate) fn process_in_place(row: &mut [f32], req: &SampleRequest<'_>, s: &mut ProcScratch) {
    sanitize(row);
    apply_steps(row, req, s);
    apply_temperature(row, req.params);
}

/// Steps 1-7 in place (NaN -> `-inf` first), without the temperature: what beam search applies
/// to each beam's log-softmax, as HF transformers' logits processors do.
pub(crate) fn process_steps(row: &mut [f32], req: &SampleRequest<'_>, s: &mut ProcScratch) {
    sanitize(row);
    apply_steps(row, req, s);
}

/// Step 8: divides by the temperature when it is positive and not 1 (0 means greedy: the argmax
/// of steps 1-7, which a division could only blur by creating ties).
pub(crate) fn apply_temperature(row: &mut [f32], p: &SamplingParams) {
    if p.temperature > 0.0 && p.temperature != 1.0 {
        divide(row, p.temperature);
    }
}

/// Where the processors read and write logits: a dense row, or a sparse overlay over the
/// read-only raw row (see `overlay`). `None` for an id beyond the row.
pub(crate) trait RowMut {
    fn at(&mut self, id: TokenId) -> Option<&mut f32>;
}

impl RowMut for [f32] {
    #[inline]
    fn at(&mut self, id: TokenId) -> Option<&mut f32> {
        self.get_mut(id as usize)
    }
}

fn apply_steps(row: &mut [f32], req: &SampleRequest<'_>, s: &mut ProcScratch) {
    let p = req.params;
    add_logit_bias(row, p);
    if let Some(bias) = &p.embedding_bias {
        for (x, &b) in row.iter_mut().zip(bias.iter()) {
            *x += b;
        }
    }
    if let Some(allowed) = &p.allowed_token_ids {
        keep_only(row, allowed, &mut s.saved);
    }
    if let Some(mask) = req.allowed {
        keep_masked(row, mask);
    }
    apply_history_steps(row, req, s);
}

/// Step 2's grammar mask: every token the mask does not allow -> `-inf`.
fn keep_masked(row: &mut [f32], mask: &SimpleVob) {
    let covered = mask.len().min(row.len());
    for (id, x) in row[..covered].iter_mut().enumerate() {
        if !mask.is_allowed(id as TokenId) {
            *x = f32::NEG_INFINITY;
        }
    }
    for x in &mut row[covered..] {
        *x = f32::NEG_INFINITY;
    }
}

/// True when every processor `p` asks for is sparse, so that steps 1-7 can run on an overlay.
pub(crate) fn all_sparse(p: &SamplingParams) -> bool {
    p.embedding_bias.is_none() && p.allowed_token_ids.is_none()
}

/// [`all_sparse`] for one sample: a grammar mask is dense too.
pub(crate) fn all_sparse_req(req: &SampleRequest<'_>) -> bool {
    req.allowed.is_none() && all_sparse(req.params)
}

/// Steps 1-7 for parameters where [`all_sparse`] holds: only the ids they touch are written.
pub(crate) fn apply_sparse_steps<R: RowMut + ?Sized>(
    row: &mut R,
    req: &SampleRequest<'_>,
    s: &mut ProcScratch,
) {
    debug_assert!(all_sparse_req(req));
    add_logit_bias(row, req.params);
    apply_history_steps(row, req, s);
}

/// Steps 3-7, which depend on the token history.
fn apply_history_steps<R: RowMut + ?Sized>(
    row: &mut R,
    req: &SampleRequest<'_>,
    s: &mut ProcScratch,
) {
    let p = req.params;
    ban_bad_words(row, &p.bad_words, req.output);
    if (req.output.len() as u64) < u64::from(p.min_tokens) {
        ban(row, req.eos_token_ids);
        ban(row, &p.stop_token_ids);
    }
    if p.no_repeat_ngram_size > 0 {
        s.seq.clear();
        s.seq.extend_from_slice(req.prompt);
        s.seq.extend_from_slice(req.output);
        ban_repeated_ngrams(row, p.no_repeat_ngram_size as usize, &s.seq);
    }
    apply_penalties(row, p, req.prompt, req.output, s);
}

fn ban<R: RowMut + ?Sized>(row: &mut R, ids: &[TokenId]) {
    for &id in ids {
        if let Some(x) = row.at(id) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Step 1, sparse half: `logit_bias` is added (the dense `embedding_bias` follows it).
fn add_logit_bias<R: RowMut + ?Sized>(row: &mut R, p: &SamplingParams) {
    for &(id, bias) in &p.logit_bias {
        if let Some(x) = row.at(id) {
            *x += bias;
        }
    }
}

/// Step 2: every token outside `allowed` becomes `-inf`.
fn keep_only(row: &mut [f32], allowed: &[TokenId], saved: &mut Vec<f32>) {
    saved.clear();
    saved.extend(
        allowed
            .iter()
            .map(|&id| row.get(id as usize).copied().unwrap_or(0.0)),
    );
    row.fill(f32::NEG_INFINITY);
    for (&id, &v) in allowed.iter().zip(saved.iter()) {
        if let Some(x) = row.get_mut(id as usize) {
            *x = v;
        }
    }
}

/// Step 3: a bad word's last token is banned when the rest of it is the output's tail (so a
/// one-token bad word is always banned). Empty bad words are ignored.
fn ban_bad_words<R: RowMut + ?Sized>(row: &mut R, bad_words: &[Vec<TokenId>], output: &[TokenId]) {
    for word in bad_words {
        let Some((&last, prefix)) = word.split_last() else {
            continue;
        };
        if output.ends_with(prefix) {
            ban(row, &[last]);
        }
    }
}

/// Step 5 (HF `NoRepeatNGramLogitsProcessor`, over `seq` = prompt ++ output): bans every token
/// that would complete an `n`-gram already present in `seq`.
fn ban_repeated_ngrams<R: RowMut + ?Sized>(row: &mut R, n: usize, seq: &[TokenId]) {
    if seq.len() < n {
        return;
    }
    let tail = &seq[seq.len() + 1 - n..];
    for gram in seq.windows(n) {
        let (&next, head) = gram.split_last().expect("windows are non-empty");
        if head == tail {
            ban(row, &[next]);
        }
    }
}

/// Steps 6-7 over the distinct tokens of the history only: `repetition_penalty` (prompt and
/// output; positive logits divided, the others multiplied, as HF and vLLM do), then
/// `logit -= frequency_penalty * count + presence_penalty` for tokens in the output.
fn apply_penalties<R: RowMut + ?Sized>(
    row: &mut R,
    p: &SamplingParams,
    prompt: &[TokenId],
    output: &[TokenId],
    s: &mut ProcScratch,
) {
    let repetition = p.repetition_penalty != 1.0;
    if !repetition && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0 {
        return;
    }
    reset_counts(s);
    let history = if repetition { prompt } else { &[] };
    for &t in history {
        if let Some(c) = s.counts.get_mut(t as usize) {
            if *c == 0 {
                s.touched.push(t);
            }
            *c |= IN_PROMPT;
        }
    }
    for &t in output {
        if let Some(c) = s.counts.get_mut(t as usize) {
            if *c == 0 {
                s.touched.push(t);
            }
            *c += 1;
        }
    }
    for &t in &s.touched {
        let Some(x) = row.at(t) else {
            continue;
        };
        if repetition {
            let r = p.repetition_penalty;
            *x = if *x > 0.0 { *x / r } else { *x * r };
        }
        let count = s.counts[t as usize] & !IN_PROMPT;
        if count > 0 {
            *x -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
    }
    reset_counts(s);
}

/// Zeroes the touched counts. Run before use too, so a panic mid-way leaves no stale counts.
fn reset_counts(s: &mut ProcScratch) {
    for t in s.touched.drain(..) {
        if let Some(c) = s.counts.get_mut(t as usize) {
            *c = 0;
        }
    }
}
