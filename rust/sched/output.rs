//! What one step produced: `StepOutput`, flat columns for the engine, one entry per appended
//! token. An entry can also live detached as an [`OutRow`]: entries a behaviour holds back (a
//! request's candidates until they are ranked) or makes outside `update()` (the results of a
//! request ended at `schedule()`), pushed into a later output.

use crate::detok::Detokenizer;
use crate::error::CoreError;
use crate::sampling::Sampled;
use crate::types::TokenId;

/// What one step produced, as flat columns: one entry per sample, in plan order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// Request id of each sample.
    pub req_ids: Vec<u64>,
    /// Sequence index (0..n) of each sample within its request.
    pub seq_indices: Vec<u32>,
    /// The token appended to the sequence.
    pub token_ids: Vec<u32>,
    /// `FinishReason` code if the sequence ended with this token, else 0.
    pub finish_reasons: Vec<u8>,
    /// The text that became final with each token, samples concatenated: sample `i`'s delta is
    /// `text[text_offsets[i]..text_offsets[i + 1]]`, offsets counted in code points (so Python
    /// can slice one `str`). Held-back text (a partial UTF-8 character, a possible stop-string
    /// prefix) arrives with a later token, or with the finishing one.
    pub text: String,
    /// Sample boundaries in `text` (`num_samples + 1` offsets, in code points).
    pub text_offsets: Vec<u32>,
    /// Index into the request's `stop` of the stop string that ended the sequence, else -1.
    pub stop_str_indices: Vec<i32>,
    /// The id from the request's `stop_token_ids` that ended the sequence, else -1 (vLLM's
    /// rule: EOS is no stop reason unless `ignore_eos`; a stop string takes precedence).
    pub stop_token_ids: Vec<i64>,
    /// Logprob of each appended token; NaN when the request asked for no logprobs.
    pub logprobs: Vec<f32>,
    /// On the last token of a sequence that its behaviour scores as a whole, that score
    /// (`sum_logprobs / generated_len^length_penalty`, HF's `sequences_scores`); else NaN.
    pub sequence_scores: Vec<f32>,
    /// Columns of `top_token_ids` / `top_logprobs`: the most alternatives any sample asked for.
    pub num_top_logprobs: usize,
    /// Row-major `[samples, num_top_logprobs]`, best first, padded with -1 / -inf.
    pub top_token_ids: Vec<i32>,
    /// The logprobs of `top_token_ids`, same shape.
    pub top_logprobs: Vec<f32>,
    /// The bytes each logprob entry's token stands for (OpenAI's `bytes`; its text is their
    /// lossy UTF-8 decoding): per sample, the chosen token, then its `num_top_logprobs`
    /// alternatives; entries are empty for padding, for samples without logprobs and when the
    /// scheduler has no detokenizer.
    pub logprob_bytes: Vec<u8>,
    /// Entry boundaries in `logprob_bytes`: `num_samples * (1 + num_top_logprobs) + 1` offsets.
    pub logprob_byte_offsets: Vec<u32>,
    /// Requests whose every sequence has now finished (their state is gone). Failed requests
    /// are not among them.
    pub finished_req_ids: Vec<u64>,
    /// Requests that failed alone in this step (for example a row with no finite logit left
    /// after their processors): every sequence ended with [`FinishReason::Error`], blocks freed,
    /// state gone. The step's other requests were applied normally.
    pub failed_req_ids: Vec<u64>,
    /// Why each of `failed_req_ids` failed: the error, with its field, code and message.
    pub failed_errors: Vec<CoreError>,
    /// Requests that advanced in this step with every new token held back: a `best_of`
    /// request's candidates, shown (the best `n`, ranked) when the last of them finishes.
    pub held_req_ids: Vec<u64>,
}

impl StepOutput {
    /// The messages of `failed_errors`, in order.
    pub fn failed_messages(&self) -> Vec<String> {
        self.failed_errors.iter().map(ToString::to_string).collect()
    }

    /// Appended tokens (samples) in this output.
    pub fn num_samples(&self) -> usize {
        self.token_ids.len()
    }

    /// An output with no entry yet and `num_top_logprobs` alternative columns.
    pub(crate) fn with_width(num_top_logprobs: usize) -> Self {
        StepOutput {
            num_top_logprobs,
            text_offsets: vec![0],
            logprob_byte_offsets: vec![0],
            ..StepOutput::default()
        }
    }

    /// The columns of a new entry besides its logprobs, its text having been appended to `text`
    /// from byte `text_start` on.
    pub(crate) fn push_entry(&mut self, e: &Entry, text_start: usize) {
        let num_chars = self.text[text_start..].chars().count() as u32;
        let last_offset = *self.text_offsets.last().expect("starts with 0");
        self.text_offsets.push(last_offset + num_chars);
        self.stop_str_indices.push(e.stop_str_index);
        self.stop_token_ids.push(e.stop_token_id);
        self.req_ids.push(e.req_id);
        self.seq_indices.push(e.seq_index);
        self.token_ids.push(e.token_id);
        self.finish_reasons.push(e.finish_reason);
        self.sequence_scores.push(e.sequence_score);
    }

    /// The logprob columns of the last entry (`drawn` is None when the request needs none, or
    /// the caller sampled): NaN and padding then. With a detokenizer, the bytes of the chosen
    /// token and of each alternative go with them (empty for padding), so that logprob entries
    /// reach Python with their token texts in the step that made them.
    pub(crate) fn push_logprobs(&mut self, drawn: Option<&Sampled>, detok: Option<&Detokenizer>) {
        let width = self.num_top_logprobs;
        let top = drawn.map_or(&[][..], |d| &d.top_logprobs[..]);
        self.logprobs
            .push(drawn.and_then(|d| d.logprob).unwrap_or(f32::NAN));
        self.push_token_bytes(detok, drawn.map(|d| d.token));
        for k in 0..width {
            let (id, lp) = top
                .get(k)
                .map_or((-1, f32::NEG_INFINITY), |&(t, l)| (t as i32, l));
            self.top_token_ids.push(id);
            self.top_logprobs.push(lp);
            self.push_token_bytes(detok, u32::try_from(id).ok());
        }
    }

    /// Appends the bytes `token` stands for (nothing for `None` or without a detokenizer) as
    /// the next entry of the logprob byte columns.
    fn push_token_bytes(&mut self, detok: Option<&Detokenizer>, token: Option<TokenId>) {
        if let (Some(d), Some(t)) = (detok, token) {
            self.logprob_bytes.extend_from_slice(&d.token_bytes(t));
        }
        self.push_byte_end();
    }

    fn push_byte_end(&mut self) {
        let end = u32::try_from(self.logprob_bytes.len()).expect("a step's logprob bytes fit u32");
        self.logprob_byte_offsets.push(end);
    }

    /// Appends a detached entry, widening the alternative columns if it has more.
    pub(crate) fn push_row(&mut self, row: &OutRow) {
        if row.top.len() > self.num_top_logprobs {
            self.widen(row.top.len());
        }
        let text_start = self.text.len();
        self.text.push_str(&row.text);
        self.push_entry(&row.entry, text_start);
        self.logprobs.push(row.logprob);
        let piece = |i: usize| {
            let start = i.checked_sub(1).map_or(0, |p| row.byte_ends[p]) as usize;
            &row.bytes[start..row.byte_ends[i] as usize]
        };
        self.logprob_bytes.extend_from_slice(piece(0));
        self.push_byte_end();
        for k in 0..self.num_top_logprobs {
            let (id, lp) = row.top.get(k).copied().unwrap_or((-1, f32::NEG_INFINITY));
            self.top_token_ids.push(id);
            self.top_logprobs.push(lp);
            if k < row.top.len() {
                self.logprob_bytes.extend_from_slice(piece(k + 1));
            }
            self.push_byte_end();
        }
    }

    /// Detaches the last entry (its padding dropped).
    pub(crate) fn pop_row(&mut self) -> OutRow {
        let i = self.num_samples() - 1;
        let width = self.num_top_logprobs;
        let num_chars = (self.text_offsets[i + 1] - self.text_offsets[i]) as usize;
        let text_start = match num_chars {
            0 => self.text.len(),
            n => {
                self.text
                    .char_indices()
                    .rev()
                    .nth(n - 1)
                    .expect("counted")
                    .0
            }
        };
        self.text_offsets.pop();
        let entries = self.logprob_byte_offsets.split_off(i * (1 + width) + 1);
        let first = *self.logprob_byte_offsets.last().expect("starts with 0");
        let bytes = self.logprob_bytes.split_off(first as usize);
        let ids = self.top_token_ids.split_off(i * width);
        let lps = self.top_logprobs.split_off(i * width);
        let top: Vec<(i32, f32)> = ids
            .into_iter()
            .zip(lps)
            .filter(|&(id, _)| id >= 0)
            .collect();
        let byte_ends = entries[..1 + top.len()]
            .iter()
            .map(|&e| e - first)
            .collect();
        OutRow {
            entry: Entry {
                req_id: self.req_ids.pop().expect("an entry"),
                seq_index: self.seq_indices.pop().expect("an entry"),
                token_id: self.token_ids.pop().expect("an entry"),
                finish_reason: self.finish_reasons.pop().expect("an entry"),
                stop_str_index: self.stop_str_indices.pop().expect("an entry"),
                stop_token_id: self.stop_token_ids.pop().expect("an entry"),
                sequence_score: self.sequence_scores.pop().expect("an entry"),
            },
            text: self.text.split_off(text_start),
            logprob: self.logprobs.pop().expect("an entry"),
            top,
            bytes,
            byte_ends,
        }
    }

    /// Pads every entry's alternatives to `width` columns.
    fn widen(&mut self, width: usize) {
        let old = self.num_top_logprobs;
        let n = self.num_samples();
        let (mut ids, mut lps) = (Vec::with_capacity(n * width), Vec::with_capacity(n * width));
        let mut offsets = Vec::with_capacity(n * (1 + width) + 1);
        offsets.push(0);
        for r in 0..n {
            ids.extend_from_slice(&self.top_token_ids[r * old..(r + 1) * old]);
            ids.resize((r + 1) * width, -1);
            lps.extend_from_slice(&self.top_logprobs[r * old..(r + 1) * old]);
            lps.resize((r + 1) * width, f32::NEG_INFINITY);
            let entries = &self.logprob_byte_offsets[r * (1 + old) + 1..(r + 1) * (1 + old) + 1];
            offsets.extend_from_slice(entries);
            let end = *offsets.last().expect("starts with 0");
            offsets.resize(offsets.len() + width - old, end);
        }
        self.top_token_ids = ids;
        self.top_logprobs = lps;
        self.logprob_byte_offsets = offsets;
        self.num_top_logprobs = width;
    }
}

/// The columns of one entry besides its text and logprobs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub req_id: u64,
    pub seq_index: u32,
    pub token_id: TokenId,
    /// `FinishReason` code if the sequence ended with this token, else 0.
    pub finish_reason: u8,
    pub stop_str_index: i32,
    pub stop_token_id: i64,
    pub sequence_score: f32,
}

/// One entry of a [`StepOutput`] on its own, to push into another output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutRow {
    pub entry: Entry,
    /// The text that became final with the token.
    pub text: String,
    pub logprob: f32,
    /// The alternatives (token id, logprob), best first, without padding.
    pub top: Vec<(i32, f32)>,
    /// The bytes of the chosen token, then of each of `top`, concatenated; entry `i` ends at
    /// `byte_ends[i]`.
    pub bytes: Vec<u8>,
    pub byte_ends: Vec<u32>,
}

impl OutRow {
    /// The entry for `token` with `text`, its logprob entry from `drawn` (as
    /// [`StepOutput::push_logprobs`] makes it).
    pub fn new(
        entry: Entry,
        text: String,
        drawn: Option<&Sampled>,
        detok: Option<&Detokenizer>,
    ) -> Self {
        let mut one = StepOutput::with_width(drawn.map_or(0, |d| d.top_logprobs.len()));
        one.text = text;
        one.push_entry(&entry, 0);
        one.push_logprobs(drawn, detok);
        one.pop_row()
    }

    /// Sum of the logprobs, exactly rounded (NaN when any is, from a token given without
    /// logits).
    pub fn sum_logprobs<'a>(rows: impl IntoIterator<Item = &'a OutRow>) -> f64 {
        exact_sum(rows.into_iter().map(|r| f64::from(r.logprob)))
    }
}

/// The correctly rounded sum of `values` (Shewchuk's algorithm, as Python's `math.fsum`), so
/// that a ranking by it agrees with one the caller makes from the same values.
pub(crate) fn exact_sum(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    let mut special = 0.0;
    for mut x in values {
        if !x.is_finite() {
            special += x;
            continue;
        }
        let mut i = 0;
        for j in 0..partials.len() {
            let mut y = partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                partials[i] = lo;
                i += 1;
            }
            x = hi;
        }
        partials.truncate(i);
        partials.push(x);
    }
    if special != 0.0 {
        return special; // an infinity, or NaN
    }
    let Some(mut hi) = partials.pop() else {
        return 0.0;
    };
    let mut lo = 0.0;
    while let Some(y) = partials.pop() {
        let x = hi;
        hi = x + y;
        lo = y - (hi - x);
        if lo != 0.0 {
            break;
        }
    }
    // Round half to even across the remaining partials, as `math.fsum` does.
    if let Some(&next) = partials.last() {
        if (lo < 0.0 && next < 0.0) || (lo > 0.0 && next > 0.0) {
            let y = lo * 2.0;
            let x = hi + y;
            if y == x - hi {
                hi = x;
            }
        }
    }
    hi
}
