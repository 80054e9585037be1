//! Prompt logprobs: `echo` with `logprobs`, vLLM's `prompt_logprobs` extra, `max_tokens: 0`
//! with `echo` (score the prompt only), and token-id prompts as switches see them.

use super::{assert_err, json::parse, limits, merge, ok_with};
use crate::validate::codes::*;
use crate::validate::{validate, validate_request, Route};

const CMPL: &str = r#"{"model": "m", "prompt": "who are you"}"#;
const CHAT: &str = r#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#;
const DBX: &str = r#"{"prompt": "who are you"}"#;

fn params(route: Route, base: &str, extra: &str) -> crate::params::SamplingParams {
    ok_with(route, &merge(base, extra), None, &limits())
}

#[test]
fn echo_with_logprobs_scores_the_prompt_with_as_many_alternatives() {
    let run = |extra: &str| params(Route::Completions, CMPL, extra).prompt_logprobs;
    assert_eq!(run("{}"), None);
    assert_eq!(run(r#"{"logprobs": 2}"#), None, "no echo, no prompt scores");
    assert_eq!(
        run(r#"{"echo": true}"#),
        None,
        "echo without logprobs is text only"
    );
    assert_eq!(run(r#"{"echo": true, "logprobs": 3}"#), Some(3));
    assert_eq!(run(r#"{"echo": true, "logprobs": 0}"#), Some(0));
    assert_eq!(run(r#"{"prompt_logprobs": 1}"#), Some(1));
    assert_eq!(
        run(r#"{"echo": true, "logprobs": 3, "prompt_logprobs": 1}"#),
        Some(3)
    );
    assert_eq!(
        run(r#"{"echo": true, "logprobs": 1, "prompt_logprobs": 4}"#),
        Some(4)
    );
    let dbx = |extra: &str| params(Route::DatabricksCompletions, DBX, extra);
    assert_eq!(
        dbx(r#"{"echo": true, "logprobs": 2}"#).prompt_logprobs,
        Some(2)
    );
    assert_eq!(dbx(r#"{"logprobs": 2}"#).logprobs, Some(2));
    assert_eq!(dbx(r#"{"echo": true}"#).prompt_logprobs, None);
    assert_eq!(
        params(Route::Chat, CHAT, r#"{"prompt_logprobs": 0}"#).prompt_logprobs,
        Some(0)
    );
    let offline = ok_with(
        Route::Offline,
        &parse(r#"{"prompt_logprobs": 5}"#),
        None,
        &limits(),
    );
    assert_eq!(offline.prompt_logprobs, Some(5));
}

#[test]
fn bad_prompt_logprobs_values_name_the_field() {
    let cases: [(Route, &str, &str, &str, &str); 8] = [
        (
            Route::Completions,
            CMPL,
            r#"{"prompt_logprobs": -1}"#,
            "prompt_logprobs",
            OUT_OF_RANGE,
        ),
        (
            Route::Completions,
            CMPL,
            r#"{"prompt_logprobs": 21}"#,
            "prompt_logprobs",
            OUT_OF_RANGE,
        ),
        (
            Route::Completions,
            CMPL,
            r#"{"prompt_logprobs": true}"#,
            "prompt_logprobs",
            WRONG_TYPE,
        ),
        (
            Route::Chat,
            CHAT,
            r#"{"prompt_logprobs": "2"}"#,
            "prompt_logprobs",
            WRONG_TYPE,
        ),
        (
            Route::Chat,
            CHAT,
            r#"{"prompt_logprobs": 1, "stream": true}"#,
            "prompt_logprobs",
            CONFLICT,
        ),
        (
            Route::Completions,
            CMPL,
            r#"{"prompt_logprobs": 0, "stream": true}"#,
            "prompt_logprobs",
            CONFLICT,
        ),
        (
            Route::DatabricksCompletions,
            DBX,
            r#"{"logprobs": 6}"#,
            "logprobs",
            OUT_OF_RANGE,
        ),
        (
            Route::Offline,
            "{}",
            r#"{"prompt_logprobs": 21}"#,
            "prompt_logprobs",
            OUT_OF_RANGE,
        ),
    ];
    for (route, base, extra, param, code) in cases {
        let result = validate(route, &merge(base, extra), None, &limits());
        assert_err(result, param, code, extra);
    }
}

#[test]
fn max_tokens_zero_only_with_echo_and_then_scores_only() {
    let body = merge(CMPL, r#"{"max_tokens": 0}"#);
    let result = validate(Route::Completions, &body, None, &limits());
    assert_err(result, "max_tokens", OUT_OF_RANGE, "0 without echo");
    let body = merge(CHAT, r#"{"max_tokens": 0}"#);
    let result = validate(Route::Chat, &body, None, &limits());
    assert_err(result, "max_tokens", OUT_OF_RANGE, "chat never takes 0");
    let body = merge(CMPL, r#"{"max_tokens": 0, "echo": true, "logprobs": 1}"#);
    let valid = validate_request(Route::Completions, &body, &limits()).expect("valid");
    assert!(valid.switches.score_only && valid.switches.echo);
    assert_eq!(
        valid.params.max_tokens,
        Some(1),
        "one token is run, none returned"
    );
    assert_eq!(valid.params.prompt_logprobs, Some(1));
    let body = merge(CMPL, r#"{"max_tokens": 1, "echo": true}"#);
    let valid = validate_request(Route::Completions, &body, &limits()).expect("valid");
    assert!(!valid.switches.score_only);
}

#[test]
fn token_id_prompts_are_one_prompt_or_a_batch() {
    let switches = |extra: &str| {
        let body = merge(CMPL, extra);
        validate_request(Route::Completions, &body, &limits())
            .expect("valid")
            .switches
    };
    assert!(!switches(r#"{"prompt": [1, 2, 3]}"#).is_batch);
    assert!(switches(r#"{"prompt": [[1, 2], [3]]}"#).is_batch);
    assert!(switches(r#"{"prompt": ["a", "b"]}"#).is_batch);
    assert_eq!(
        switches(r#"{"prompt_logprobs": 2}"#).prompt_logprobs,
        Some(2)
    );
    assert_eq!(
        switches(r#"{"echo": true, "logprobs": 2}"#).prompt_logprobs,
        None
    );
    // Databricks prompts stay text.
    let body = merge(DBX, r#"{"prompt": [1, 2]}"#);
    let result = validate(Route::DatabricksCompletions, &body, None, &limits());
    assert_err(result, "prompt[0]", WRONG_TYPE, "databricks token ids");
}
