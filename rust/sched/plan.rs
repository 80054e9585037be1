//! What one step computes: `StepPlan`, flat columns for the model runner.

use crate::types::{BlockId, FinishReason, RequestId, TokenId};

/// One scheduled row as plain data: what [`StepPlan::push_row`] reads of a sequence.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSpec<'a> {
    pub req_id: RequestId,
    pub seq_index: u32,
    /// Prompt followed by the output so far.
    pub tokens: &'a [TokenId],
    pub num_prompt_tokens: usize,
    /// Tokens whose KV is already in `block_table`; the row computes the next `num_tokens`.
    pub num_computed_tokens: usize,
    pub num_tokens: usize,
    /// Tentative tokens computed after those `num_tokens` (draft tokens of speculative
    /// decoding): the row then yields one sample per tentative token plus one.
    pub lookahead: &'a [TokenId],
    /// The row's blocks, already reserved for its `num_tokens` and draft.
    pub block_table: &'a [BlockId],
    /// Samples the row yields once it reaches the end of its tokens (its behaviour decides: `n`
    /// for a request's first sequence that forks into `n`, 0 for none, else 1).
    pub num_samples_at_end: u32,
    /// The row's LoRA adapter (0: none).
    pub lora_id: u32,
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
    /// LoRA adapter of each row (`NewRequest::lora_id`; 0: the base model).
    pub lora_ids: Vec<u32>,
    /// Draft tokens at the end of each row (speculative decoding; 0 = none): such a row's last
    /// `1 + num_draft_tokens` positions are all sampled, in order.
    pub num_draft_tokens: Vec<u32>,
    /// Index into `input_ids` of each sample's position (the row's last token; the last
    /// `1 + num_draft_tokens` of a row with a draft).
    pub logits_indices: Vec<i64>,
    /// Row of each sample.
    pub sample_rows: Vec<i32>,
    /// Sequence index each sample is for (differs from the row's for forked sequences).
    pub sample_seq_indices: Vec<u32>,
    /// KV block copies to do before computing: `[num_copies, 2]` row-major (source, destination).
    pub block_copies: Vec<i32>,
    /// Tokens of rows that are not single-token decodes.
    pub num_prefill_tokens: usize,
    /// Media positions whose encoder work this step starts (see `max_num_encoder_tokens`).
    pub num_encoder_tokens: usize,
    /// Rows that are single-token decodes.
    pub num_decode_tokens: usize,
    /// Sequences preempted in this step: request ids and sequence indices.
    pub preempted_req_ids: Vec<u64>,
    /// Sequence index of each of `preempted_req_ids`.
    pub preempted_seq_indices: Vec<u32>,
    /// Requests ended in this step before running (abort, timeout), with `FinishReason` codes.
    pub finished_req_ids: Vec<u64>,
    /// `FinishReason` code of each of `finished_req_ids`.
    pub finished_reasons: Vec<u8>,
}

impl StepPlan {
    /// An empty plan for step `step_id`.
    pub(crate) fn new(step_id: u64) -> Self {
        StepPlan {
            step_id,
            ..StepPlan::default()
        }
    }

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

    /// Appends row number `row` (the caller has already reserved its blocks). Returns its
    /// samples: 0 while its prefill is unfinished.
    pub(crate) fn push_row(&mut self, spec: &RowSpec<'_>, block_size: usize, row: i32) -> u32 {
        let (start, num_draft) = (spec.num_computed_tokens, spec.lookahead.len());
        let end = start + spec.num_tokens;
        let num_tokens = spec.num_tokens + num_draft;
        let base = *self.cu_seqlens_q.last().unwrap_or(&0);
        if self.cu_seqlens_q.is_empty() {
            self.cu_seqlens_q.push(0);
        }
        self.input_ids
            .extend(spec.tokens[start..end].iter().map(|&t| i64::from(t)));
        self.input_ids
            .extend(spec.lookahead.iter().map(|&t| i64::from(t)));
        for pos in start..end + num_draft {
            let block = spec.block_table[pos / block_size].0 as usize;
            self.positions.push(pos as i64);
            self.slot_mapping
                .push((block * block_size + pos % block_size) as i64);
        }
        self.cu_seqlens_q.push(base + num_tokens as i32);
        self.context_lens.push((end + num_draft) as i32);
        self.req_ids.push(spec.req_id.0);
        self.seq_indices.push(spec.seq_index);
        self.lora_ids.push(spec.lora_id);
        self.num_draft_tokens.push(num_draft as u32);
        let has_output = spec.tokens.len() > spec.num_prompt_tokens;
        if num_tokens == 1 && has_output && end == spec.tokens.len() {
            self.num_decode_tokens += 1;
        } else {
            self.num_prefill_tokens += num_tokens;
        }
        if end < spec.tokens.len() {
            return 0;
        }
        if num_draft > 0 {
            let last = i64::from(base) + num_tokens as i64 - 1;
            for i in (0..=num_draft as i64).rev() {
                self.logits_indices.push(last - i);
                self.sample_rows.push(row);
                self.sample_seq_indices.push(spec.seq_index);
            }
            return num_draft as u32 + 1;
        }
        let samples = spec.num_samples_at_end;
        for j in 0..samples {
            self.logits_indices
                .push(i64::from(base) + num_tokens as i64 - 1);
            self.sample_rows.push(row);
            self.sample_seq_indices
                .push(if j == 0 { spec.seq_index } else { j });
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
