//! What one step computes (`StepPlan`, flat columns for the model runner) and what it produced
//! (`StepOutput`, flat columns for the engine).

use super::request::{SeqKey, Sequence};
use crate::types::{BlockId, FinishReason, RequestId};

/// One scheduled sequence: `num_tokens` tokens from its `num_computed_tokens` on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub key: SeqKey,
    pub num_tokens: usize,
    /// Copy-on-write done for this row before its KV is written: (source, destination).
    pub copy: Option<(BlockId, BlockId)>,
}

/// What `update()` needs to remember of the last plan.
#[derive(Debug, Clone)]
pub(crate) struct PlanRecord {
    pub step_id: u64,
    pub rows: Vec<Row>,
    /// Samples per row: 0 while a prefill chunk is unfinished, `n` for a row that forks, else 1.
    pub num_samples: Vec<u32>,
    pub total_samples: usize,
}

/// The step to run, as flat columns. Rows are scheduled sequences; samples are the positions
/// whose logits are sampled (one per row that reaches the end of its tokens, `n` for a row whose
/// request forks into `n` sequences this step; none for a row in the middle of a prefill).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    /// Pass this plan back to `update()`; it must be the last plan `schedule()` returned.
    pub step_id: u64,
    /// Token ids to compute, rows concatenated.
    pub input_ids: Vec<i64>,
    /// Position of each token in its sequence.
    pub positions: Vec<i64>,
    /// KV slot (block * block_size + offset) each token's KV is written to.
    pub slot_mapping: Vec<i64>,
    /// Row boundaries in `input_ids`: row r is `cu_seqlens_q[r]..cu_seqlens_q[r+1]`.
    pub cu_seqlens_q: Vec<i32>,
    /// Tokens in each row's KV after this step (what attention reads).
    pub context_lens: Vec<i32>,
    /// Row-major `[num_rows, max_num_blocks]`, padded with the null block 0.
    pub block_tables: Vec<i32>,
    /// Columns of `block_tables`.
    pub max_num_blocks: usize,
    /// Request id of each row.
    pub req_ids: Vec<u64>,
    /// Sequence index (0..n) of each row within its request.
    pub seq_indices: Vec<u32>,
    /// Index into `input_ids` of each sample's position (the row's last token).
    pub logits_indices: Vec<i64>,
    /// Row of each sample.
    pub sample_rows: Vec<i32>,
    /// Sequence index each sample is for (differs from the row's for forked sequences).
    pub sample_seq_indices: Vec<u32>,
    /// KV block copies to do before computing: `[num_copies, 2]` row-major (source, destination).
    pub block_copies: Vec<i32>,
    /// Tokens of rows that are not single-token decodes.
    pub num_prefill_tokens: usize,
    /// Rows that are single-token decodes.
    pub num_decode_tokens: usize,
    /// Sequences preempted in this step: request ids and sequence indices.
    pub preempted_req_ids: Vec<u64>,
    pub preempted_seq_indices: Vec<u32>,
    /// Requests ended in this step before running (abort, timeout), with `FinishReason` codes.
    pub finished_req_ids: Vec<u64>,
    pub finished_reasons: Vec<u8>,
}

impl StepPlan {
    /// Scheduled sequences.
    pub fn num_rows(&self) -> usize {
        self.req_ids.len()
    }

    /// Logit rows the model must produce (and `update()` expects sampled tokens for).
    pub fn num_samples(&self) -> usize {
        self.logits_indices.len()
    }

    /// Tokens computed in this step.
    pub fn num_scheduled_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// Appends `seq`'s row (the caller has already reserved its blocks). Returns its samples.
    pub(crate) fn push_row(
        &mut self,
        seq: &Sequence,
        num_tokens: usize,
        block_size: usize,
        row: i32,
    ) -> u32 {
        let start = seq.num_computed_tokens;
        let end = start + num_tokens;
        let base = *self.cu_seqlens_q.last().unwrap_or(&0);
        if self.cu_seqlens_q.is_empty() {
            self.cu_seqlens_q.push(0);
        }
        self.input_ids
            .extend(seq.tokens[start..end].iter().map(|&t| i64::from(t)));
        for pos in start..end {
            let block = seq.block_table[pos / block_size].0 as usize;
            self.positions.push(pos as i64);
            self.slot_mapping
                .push((block * block_size + pos % block_size) as i64);
        }
        self.cu_seqlens_q.push(base + num_tokens as i32);
        self.context_lens.push(end as i32);
        self.req_ids.push(seq.req_id.0);
        self.seq_indices.push(seq.seq_index);
        let is_decode = num_tokens == 1 && seq.num_output_tokens() > 0 && end == seq.tokens.len();
        if is_decode {
            self.num_decode_tokens += 1;
        } else {
            self.num_prefill_tokens += num_tokens;
        }
        if end < seq.tokens.len() {
            return 0;
        }
        let samples = if seq.will_fork() { seq.seats as u32 } else { 1 };
        for j in 0..samples {
            self.logits_indices
                .push(i64::from(base) + num_tokens as i64 - 1);
            self.sample_rows.push(row);
            self.sample_seq_indices
                .push(if j == 0 { seq.seq_index } else { j });
        }
        samples
    }

    /// Fills `block_tables` once every row is known.
    pub(crate) fn fill_block_tables<'a>(&mut self, tables: impl Iterator<Item = &'a [BlockId]>) {
        let tables: Vec<&[BlockId]> = tables.collect();
        self.max_num_blocks = tables.iter().map(|t| t.len()).max().unwrap_or(0);
        self.block_tables = vec![0; tables.len() * self.max_num_blocks];
        for (r, table) in tables.iter().enumerate() {
            let row = &mut self.block_tables[r * self.max_num_blocks..][..table.len()];
            for (dst, b) in row.iter_mut().zip(table.iter()) {
                *dst = b.0 as i32;
            }
        }
    }

    pub(crate) fn push_finished(&mut self, req_id: RequestId, reason: FinishReason) {
        self.finished_req_ids.push(req_id.0);
        self.finished_reasons.push(reason as u8);
    }
}

/// What one step produced, as flat columns: one entry per sample, in plan order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    pub req_ids: Vec<u64>,
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
    pub text_offsets: Vec<u32>,
    /// Index into the request's `stop` of the stop string that ended the sequence, else -1.
    pub stop_str_indices: Vec<i32>,
    /// Logprob of each appended token; NaN when the request asked for no logprobs.
    pub logprobs: Vec<f32>,
    /// Columns of `top_token_ids` / `top_logprobs`: the most alternatives any sample asked for.
    pub num_top_logprobs: usize,
    /// Row-major `[samples, num_top_logprobs]`, best first, padded with -1 / -inf.
    pub top_token_ids: Vec<i32>,
    pub top_logprobs: Vec<f32>,
    /// Requests whose every sequence has now finished (their state is gone).
    pub finished_req_ids: Vec<u64>,
}

impl StepOutput {
    /// Appended tokens (samples) in this output.
    pub fn num_samples(&self) -> usize {
        self.token_ids.len()
    }
}
