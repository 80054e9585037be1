//! The per-request parameters the scheduler acts on. The full sampling parameter set and its
//! per-route validation build on this struct; it is immutable once built.

use crate::error::{CoreError, CoreResult};
use crate::types::TokenId;

/// Largest `n` (parallel sequences per request) the scheduler accepts.
pub const MAX_N: u32 = 128;

/// Validated, immutable parameters of one request, as far as the scheduler needs them.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Number of output sequences forked from the prompt (>= 1).
    pub n: u32,
    /// Cap on generated tokens per sequence; `None` = until `max_model_len`.
    pub max_tokens: Option<u32>,
    /// EOS and stop token ids do not end a sequence before this many tokens.
    pub min_tokens: u32,
    /// When true, EOS does not end the sequence (stop token ids still do).
    pub ignore_eos: bool,
    /// Token ids that end the sequence (the token is kept in the output).
    pub stop_token_ids: Vec<TokenId>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            max_tokens: None,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Builds parameters from raw caller values, checking each field and the cross-field rule
    /// `min_tokens <= max_tokens`. Values arrive as `i64` so that negative or huge inputs get a
    /// range error naming the field rather than an integer-conversion error.
    pub fn new(
        n: i64,
        max_tokens: Option<i64>,
        min_tokens: i64,
        ignore_eos: bool,
        stop_token_ids: Vec<TokenId>,
    ) -> CoreResult<Self> {
        let n = in_range("n", n, 1, i64::from(MAX_N))?;
        let max_tokens = max_tokens
            .map(|m| in_range("max_tokens", m, 1, i64::from(u32::MAX)))
            .transpose()?;
        let min_tokens = in_range("min_tokens", min_tokens, 0, i64::from(u32::MAX))?;
        if let Some(max) = max_tokens {
            if min_tokens > max {
                return Err(CoreError::invalid(
                    "min_tokens",
                    "out_of_range",
                    format!("`min_tokens` must be <= `max_tokens` ({max}); got {min_tokens}"),
                ));
            }
        }
        Ok(SamplingParams {
            n,
            max_tokens,
            min_tokens,
            ignore_eos,
            stop_token_ids,
        })
    }
}

/// Checks `min <= value <= max` and narrows to `u32` (callers keep `max <= u32::MAX`).
fn in_range(param: &'static str, value: i64, min: i64, max: i64) -> CoreResult<u32> {
    if value < min || value > max {
        let rule = if max == i64::from(u32::MAX) {
            format!("at least {min}")
        } else {
            format!("in [{min}, {max}]")
        };
        return Err(CoreError::invalid(
            param,
            "out_of_range",
            format!("`{param}` must be {rule}; got {value}"),
        ));
    }
    Ok(value as u32)
}

/// Checks a request priority: 1 (highest) to 5 (lowest, the default).
pub fn check_priority(priority: i64) -> CoreResult<u8> {
    Ok(in_range("priority", priority, 1, 5)? as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_boundaries_and_rejects_each_rule() {
        assert!(SamplingParams::new(1, Some(1), 1, false, vec![]).is_ok());
        assert!(SamplingParams::new(MAX_N.into(), None, 1000, true, vec![7]).is_ok());
        let cases: [(i64, Option<i64>, i64, &str); 7] = [
            (0, None, 0, "n"),
            (i64::from(MAX_N) + 1, None, 0, "n"),
            (-1, None, 0, "n"),
            (1, Some(0), 0, "max_tokens"),
            (1, Some(1 << 40), 0, "max_tokens"),
            (1, None, -1, "min_tokens"),
            (1, Some(4), 5, "min_tokens"),
        ];
        for (n, max_tokens, min_tokens, field) in cases {
            match SamplingParams::new(n, max_tokens, min_tokens, false, vec![]) {
                Err(CoreError::Invalid { param, message, .. }) => {
                    assert_eq!(param, field);
                    assert!(message.contains(&format!("`{field}`")), "{message}");
                }
                other => panic!("expected an error on `{field}`, got {other:?}"),
            }
        }
        assert_eq!(check_priority(1), Ok(1));
        assert_eq!(check_priority(5), Ok(5));
        assert!(
            check_priority(0).is_err() && check_priority(6).is_err() && check_priority(-3).is_err()
        );
    }
}
