//! One token onto a sequence: token-level stops (EOS, stop token ids and sequences, length),
//! what the request's behaviours make of the token, its text and stop strings, its output entry.

use super::Scheduler;
use crate::sampling::Sampled;
use crate::sched::behaviour::on_token;
use crate::sched::output::{Entry, StepOutput};
use crate::sched::rank::SeqKey;
use crate::sched::seq::Sequence;
use crate::types::{FinishReason, SeqStatus, TokenId};

impl Scheduler {
    /// Appends one token to `key`: token-level stops, the behaviours' view of the token, then
    /// text and stop strings, then the output entry (which the behaviour may hold back); a
    /// finished sequence is released.
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
        // A behaviour may end the output with this token, which is then its last content.
        let content_end = on_token(s, token, &mut finish);
        if content_end {
            stop_token_id = -1;
        }
        let text_start = out.text.len();
        let mut stop_str_index = -1;
        if let (Some(text), Some(detok)) = (s.text.as_mut(), self.detok.as_deref()) {
            let num_output = s.tokens.len() - s.num_prompt_tokens;
            // The last content token's text flushes, never drops.
            let text_finish = match content_end {
                true => Some(FinishReason::Length),
                false => finish,
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
        let entry = Entry {
            req_id: s.req_id.0,
            seq_index: s.seq_index,
            token_id: token,
            finish_reason: finish.map_or(0, |f| f as u8),
            stop_str_index,
            stop_token_id,
            sequence_score: f32::NAN,
        };
        out.push_entry(&entry, text_start);
        // Token logprobs go out when the request needs them: asked for, or to rank sequences.
        let drawn = drawn.filter(|_| s.params.needs_token_logprob());
        out.push_logprobs(drawn, self.detok.as_deref());
        if let Some(reason) = finish {
            self.finish_seq(key, reason);
        }
        self.after_append(key, out);
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
