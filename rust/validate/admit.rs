//! What the engine bounds itself, beyond a route's `Limits`: a request built from validated
//! parameters is admitted here before it is queued, whichever way it came (HTTP, the offline
//! `LLM`, the TRT `Executor`), so the engine never checks a request field by hand.

use crate::error::{CoreError, CoreResult};
use crate::params::SamplingParams;

use super::codes;

/// The engine's own bounds: its widest beam and its model's hidden size (the width of a
/// prompt table's rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// Widest beam search (`--max-beam-width`).
    pub max_beam_width: u32,
    /// The model's hidden size.
    pub hidden_size: u32,
}

/// What a request asks of the engine besides its parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineAsks {
    /// TRT `return_generation_logits`.
    pub generation_logits: bool,
    /// The shape of TRT's `prompt_embedding_table` (as given, any number of dimensions).
    pub prompt_table_shape: Option<Vec<usize>>,
}

/// Admits a request: its beam width against `max_beam_width`, what cannot go with beam
/// search, and its prompt table's shape. Returns the table's rows (the prompt's virtual
/// tokens; 0 without one).
pub fn admit(p: &SamplingParams, asks: &EngineAsks, limits: &EngineLimits) -> CoreResult<u32> {
    if p.use_beam_search && p.best_of > limits.max_beam_width {
        return Err(CoreError::invalid(
            "best_of",
            codes::OUT_OF_RANGE,
            format!(
                "`best_of` must give a beam width of at most {} (max_beam_width); got {}",
                limits.max_beam_width, p.best_of
            ),
        ));
    }
    if p.use_beam_search && asks.generation_logits {
        return Err(CoreError::invalid(
            "return_generation_logits",
            codes::CONFLICT,
            "`return_generation_logits` cannot be used with beam search (beams are reordered every step, so no row belongs to one output sequence)",
        ));
    }
    let Some(shape) = &asks.prompt_table_shape else {
        return Ok(0);
    };
    match shape.as_slice() {
        &[rows, width] if rows >= 1 && width == limits.hidden_size as usize => {
            Ok(u32::try_from(rows).unwrap_or(u32::MAX))
        }
        _ => Err(CoreError::invalid(
            "prompt_embedding_table",
            codes::INVALID_FORMAT,
            format!(
                "`prompt_embedding_table` must be [rows, hidden_size] = [rows, {}] with rows >= 1; got shape {shape:?}",
                limits.hidden_size
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: EngineLimits = EngineLimits {
        max_beam_width: 4,
        hidden_size: 8,
    };

    fn param(result: CoreResult<u32>) -> String {
        match result {
            Err(CoreError::Invalid { param, .. }) => param,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn beams_wider_than_the_engine_and_beams_with_generation_logits_are_refused() {
        let mut p = SamplingParams {
            use_beam_search: true,
            best_of: 5,
            n: 1,
            ..SamplingParams::default()
        };
        let none = EngineAsks::default();
        assert_eq!(param(admit(&p, &none, &LIMITS)), "best_of");
        p.best_of = 4;
        assert_eq!(admit(&p, &none, &LIMITS).unwrap(), 0);
        let logits = EngineAsks {
            generation_logits: true,
            ..EngineAsks::default()
        };
        assert_eq!(
            param(admit(&p, &logits, &LIMITS)),
            "return_generation_logits"
        );
        p.use_beam_search = false;
        assert!(admit(&p, &logits, &LIMITS).is_ok());
    }

    #[test]
    fn a_prompt_table_is_rows_of_the_hidden_size() {
        let p = SamplingParams::default();
        let table = |shape: Vec<usize>| EngineAsks {
            prompt_table_shape: Some(shape),
            ..EngineAsks::default()
        };
        assert_eq!(admit(&p, &table(vec![3, 8]), &LIMITS).unwrap(), 3);
        for bad in [vec![0, 8], vec![3, 7], vec![3], vec![2, 3, 8]] {
            assert_eq!(
                param(admit(&p, &table(bad), &LIMITS)),
                "prompt_embedding_table"
            );
        }
    }
}
