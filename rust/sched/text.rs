//! The text side of `update()`: per sequence, the incremental detokenizer feeding the stop-string
//! matcher. Each appended token yields the text that became final with it; a stop string ends
//! the sequence with `FinishReason::Stop` and nothing after it is ever emitted.

use std::sync::Arc;

use crate::detok::{DecodeStream, Detokenizer};
use crate::error::{CoreError, CoreResult};
use crate::params::SamplingParams;
use crate::stop::{StopMatcher, StopStrings, TokenStops};
use crate::types::{FinishReason, TokenId};

/// Text state of one sequence.
#[derive(Debug, Clone)]
pub(crate) struct TextState {
    decode: DecodeStream,
    stop: StopMatcher,
    /// Reused buffer for the detokenizer's output before the stop matcher sees it.
    scratch: String,
}

/// A new sequence's text state and token stops.
pub(crate) type SeqText = (Option<Box<TextState>>, Option<Arc<TokenStops>>);

impl TextState {
    fn new(params: &SamplingParams, stops: Option<Arc<StopStrings>>) -> Self {
        TextState {
            decode: DecodeStream::new(
                params.skip_special_tokens,
                params.spaces_between_special_tokens,
            ),
            stop: StopMatcher::new(stops, params.include_stop_str_in_output),
            scratch: String::new(),
        }
    }

    /// Feeds the token just appended (`num_output` output tokens now) and appends the text that
    /// became final to `out`. `finish` is the token-level end of the sequence, if any: a token
    /// that ended it by EOS or a stop id contributes no text unless `include_stop_str_in_output`
    /// (vLLM's rule), and a finished sequence flushes everything held back. Stop strings count
    /// only from `min_tokens` output tokens on. Returns the index into `params.stop` of the stop
    /// string that matched, if one did.
    pub fn on_token(
        &mut self,
        detok: &Detokenizer,
        params: &SamplingParams,
        token: TokenId,
        num_output: usize,
        finish: Option<FinishReason>,
        out: &mut String,
    ) -> Option<usize> {
        self.scratch.clear();
        let drop_text = finish == Some(FinishReason::Stop) && !params.include_stop_str_in_output;
        if !drop_text {
            self.decode.step(detok, token, &mut self.scratch);
        }
        if finish.is_some() {
            self.decode.finish(detok, &mut self.scratch);
        }
        let stop_str_index = if num_output >= params.min_tokens as usize {
            self.stop.push(&self.scratch, out)
        } else {
            self.stop.push_without_stopping(&self.scratch, out);
            None
        };
        if finish.is_some() || stop_str_index.is_some() {
            self.stop.finish(out);
        }
        stop_str_index
    }
}

/// The text state and token stops a new request's sequences start with, given the scheduler's
/// detokenizer (if any). Stop strings need a tokenizer: without one they are refused rather
/// than silently ignored.
pub(crate) fn text_state_for(
    detok: Option<&Detokenizer>,
    params: &SamplingParams,
) -> CoreResult<SeqText> {
    let token_stops = match params.stop_token_sequences.is_empty() {
        true => None,
        false => Some(Arc::new(TokenStops::new(&params.stop_token_sequences)?)),
    };
    if detok.is_none() {
        if !params.stop.is_empty() {
            return Err(CoreError::invalid(
                "stop",
                "unsupported",
                "`stop` strings need a tokenizer, and this scheduler has none (give it a Detokenizer)",
            ));
        }
        return Ok((None, token_stops));
    }
    let stops = match params.stop.is_empty() {
        true => None,
        false => Some(Arc::new(StopStrings::new(&params.stop)?)),
    };
    Ok((Some(Box::new(TextState::new(params, stops))), token_stops))
}
