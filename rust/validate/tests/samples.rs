//! The vendor documents' sample request bodies (docs/api/common.md#sample-bodies) are accepted,
//! with their meaning.

use super::spec_bodies::*;
use super::{assert_err, limits, ok, ok_with, parse};
use crate::validate::codes::UNSUPPORTED_CONTENT_TYPE;
use crate::validate::{validate, Limits, Route};

fn multimodal() -> Limits {
    Limits {
        multimodal: true,
        ..limits()
    }
}

#[test]
fn generate_samples() {
    let p = ok(Route::Generate, GENERATE_TEXT);
    assert!(!p.is_greedy());
    assert_eq!(
        (p.temperature, p.top_k, p.top_p, p.repetition_penalty),
        (1.0, 10, 0.99, 1.1)
    );
    assert_eq!(
        (p.seed, p.max_tokens, p.priority, p.timeout_s),
        (Some(123), Some(20), 5, Some(10.0))
    );
    assert_eq!(
        p.typical_p, 1.0,
        "typical_p is validated, then ignored (docs/decisions.md#fields-without-effect)"
    );
    let body = parse(GENERATE_MULTIMODAL);
    assert_eq!(
        ok_with(Route::Generate, &body, Some(40), &multimodal()).max_tokens,
        Some(20)
    );
    let result = validate(Route::Generate, &body, None, &limits());
    assert_err(
        result,
        "text_input[1].type",
        UNSUPPORTED_CONTENT_TYPE,
        "text-only model",
    );
}

#[test]
fn chat_samples() {
    let p = ok(Route::Chat, CHAT_SINGLE);
    assert_eq!(
        (
            p.presence_penalty,
            p.frequency_penalty,
            p.repetition_penalty
        ),
        (1.03, 1.0, 1.0)
    );
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.seed),
        (0.5, 0.95, 0, None)
    );
    assert_eq!(p.stop, vec!["stop1".to_string(), "stop2".to_string()]);
    assert_eq!(
        (p.stop_token_ids.clone(), p.max_tokens),
        (vec![2, 13], Some(20))
    );
    assert!(!p.include_stop_str_in_output && p.skip_special_tokens && !p.ignore_eos);
    let body = parse(CHAT_MULTIMODAL);
    assert!(validate(Route::Chat, &body, None, &multimodal()).is_ok());
    let result = validate(Route::Chat, &body, None, &limits());
    assert_err(
        result,
        "messages[0].content[1].type",
        UNSUPPORTED_CONTENT_TYPE,
        "text-only",
    );
    assert_eq!(
        ok(Route::Chat, CHAT_TOOLS_1).max_tokens,
        Some(1000),
        "1024 capped by maxIterTimes"
    );
    let p = ok(Route::Chat, CHAT_TOOLS_2);
    assert_eq!(
        (p.temperature, p.top_p, p.repetition_penalty),
        (0.9, 1.0, 1.1)
    );
}

#[test]
fn completions_samples() {
    let p = ok(Route::Completions, COMPLETIONS_BEAM_STREAM);
    assert!(p.use_beam_search && p.ignore_eos);
    assert_eq!(
        (p.n, p.best_of, p.logprobs, p.max_tokens),
        (2, 2, Some(2), Some(5))
    );
    let p = ok(Route::Completions, COMPLETIONS_SAMPLING);
    assert!(!p.use_beam_search && !p.is_greedy());
    assert_eq!(
        (p.n, p.best_of, p.logprobs, p.temperature),
        (2, 2, Some(2), 1.0)
    );
}

#[test]
fn databricks_samples() {
    let p = ok(Route::DatabricksChat, DATABRICKS_CHAT);
    assert_eq!(
        (p.max_tokens, p.temperature, p.logprobs),
        (Some(256), 0.2, Some(2))
    );
    let p = ok(Route::DatabricksCompletions, DATABRICKS_COMPLETIONS);
    assert!(p.is_greedy());
    assert_eq!(p.max_tokens, Some(8));
    let p = ok(Route::DatabricksEmbeddings, DATABRICKS_EMBEDDINGS);
    assert_eq!(p.max_tokens, None);
}
