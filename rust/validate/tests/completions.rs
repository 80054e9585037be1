//! MindIE `/v1/completions` (docs/api/openai.md#completions-request,
//! docs/api/openai.md#n-best-of-and-beam-search).

use super::{assert_err, limits, merge, ok_with, run_cases, Case};
use crate::validate::codes::*;
use crate::validate::{validate, Limits, Route};

const BASE: &str = r#"{"model": "m", "prompt": "who are you"}"#;

#[rustfmt::skip]
const FIELDS: &[Case] = &[
    ("model", "null", Some(("model", MISSING))),
    ("prompt", "null", Some(("prompt", MISSING))),
    ("prompt", r#""""#, Some(("prompt", EMPTY))),
    ("prompt", r#"["a", "b"]"#, None),
    ("prompt", "[]", Some(("prompt", EMPTY))),
    ("prompt", r#"["a", ""]"#, Some(("prompt[1]", EMPTY))),
    ("prompt", "[1, 2]", None),
    ("prompt", "[[1, 2], [3]]", None),
    ("prompt", "[1, 32000]", Some(("prompt[1]", OUT_OF_RANGE))),
    ("prompt", "[[1], [-1]]", Some(("prompt[1][0]", OUT_OF_RANGE))),
    ("prompt", "[[1], []]", Some(("prompt[1]", EMPTY))),
    ("prompt", r#"[[1], "a"]"#, Some(("prompt[1]", WRONG_TYPE))),
    ("prompt", r#"["a", 1]"#, Some(("prompt[1]", WRONG_TYPE))),
    ("prompt", "[1, [2]]", Some(("prompt[1]", WRONG_TYPE))),
    ("prompt", "{}", Some(("prompt", WRONG_TYPE))),
    // top_p (1e-6, 1]
    ("top_p", "0.000002", None),
    ("top_p", "1", None),
    ("top_p", "0.000001", Some(("top_p", OUT_OF_RANGE))),
    ("top_p", "0", Some(("top_p", OUT_OF_RANGE))),
    // the `timeout` extra: seconds in (0, 3600], fractions allowed
    ("timeout", "0.5", None),
    ("timeout", "3600", None),
    ("timeout", "0", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", "3600.5", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", "-1", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", r#""10""#, Some(("timeout", WRONG_TYPE))),
    // seed (0, 2^64-1]: 0 rejected here
    ("seed", "1", None),
    ("seed", "0", Some(("seed", OUT_OF_RANGE))),
    // top_k -1 or (0, 2^31-1]
    ("top_k", "-1", None),
    ("top_k", "0", Some(("top_k", OUT_OF_RANGE))),
    ("temperature", "0", None),
    ("temperature", "-1", Some(("temperature", OUT_OF_RANGE))),
    ("repetition_penalty", "2.5", Some(("repetition_penalty", OUT_OF_RANGE))),
    ("presence_penalty", "-2", None),
    ("frequency_penalty", "3", Some(("frequency_penalty", OUT_OF_RANGE))),
    // logprobs [0, 5]
    ("logprobs", "0", None),
    ("logprobs", "5", None),
    ("logprobs", "6", Some(("logprobs", OUT_OF_RANGE))),
    ("logprobs", "-1", Some(("logprobs", OUT_OF_RANGE))),
    ("logprobs", "true", Some(("logprobs", WRONG_TYPE))),
    // n and best_of [1, 128], nullable
    ("n", "null", None),
    ("n", "128", None),
    ("n", "129", Some(("n", OUT_OF_RANGE))),
    ("best_of", "null", None),
    ("best_of", "0", Some(("best_of", OUT_OF_RANGE))),
    ("best_of", "129", Some(("best_of", OUT_OF_RANGE))),
    ("use_beam_search", "1", Some(("use_beam_search", WRONG_TYPE))),
    ("max_tokens", "0", Some(("max_tokens", OUT_OF_RANGE))),
    ("stop", r#"["a", ""]"#, Some(("stop[1]", EMPTY))),
    ("stop_token_ids", "[1, null]", Some(("stop_token_ids[1]", WRONG_TYPE))),
    ("min_p", "-0.1", Some(("min_p", OUT_OF_RANGE))),
];

#[test]
fn field_table() {
    run_cases(Route::Completions, BASE, FIELDS);
}

/// The cross-field rules (docs/api/openai.md#n-best-of-and-beam-search), as (extra fields, expected
/// error or None).
#[rustfmt::skip]
const CROSS: &[(&str, Option<(&str, &str)>)] = &[
    // 1. beam search excludes a non-empty stop
    (r#"{"use_beam_search": true, "stop": ["x"]}"#, Some(("stop", CONFLICT))),
    (r#"{"use_beam_search": true, "stop": "x"}"#, Some(("stop", CONFLICT))),
    (r#"{"use_beam_search": true, "stop": []}"#, None),
    (r#"{"use_beam_search": true, "stop": null}"#, None),
    (r#"{"use_beam_search": false, "stop": ["x"]}"#, None),
    // 2. non-streaming: best_of >= n when both are set
    (r#"{"n": 2, "best_of": 3}"#, None),
    (r#"{"n": 3, "best_of": 3}"#, None),
    (r#"{"n": 3, "best_of": 2}"#, Some(("best_of", CONFLICT))),
    (r#"{"best_of": 4}"#, None),
    // 2. streaming: best_of == n, and not alone (except best_of 1)
    (r#"{"stream": true, "n": 2, "best_of": 2}"#, None),
    (r#"{"stream": true, "n": 2}"#, None),
    (r#"{"stream": true, "best_of": 1}"#, None),
    (r#"{"stream": true, "best_of": 2}"#, Some(("best_of", CONFLICT))),
    (r#"{"stream": true, "n": 2, "best_of": 3}"#, Some(("best_of", CONFLICT))),
    (r#"{"stream": true, "n": 1, "best_of": 1}"#, None),
    // 3. beam search: best_of not checked against n
    (r#"{"use_beam_search": true, "n": 3, "best_of": 2, "temperature": 0}"#, None),
    (r#"{"use_beam_search": true, "stream": true, "best_of": 4}"#, None),
    // 4. n > 1 or best_of > 1 needs temperature > 0 (not under beam search)
    (r#"{"n": 2, "temperature": 0}"#, Some(("temperature", CONFLICT))),
    (r#"{"best_of": 2, "temperature": 0}"#, Some(("temperature", CONFLICT))),
    (r#"{"n": 2}"#, None),
    (r#"{"n": 1, "best_of": 1, "temperature": 0}"#, None),
    (r#"{"use_beam_search": true, "n": 2, "temperature": 0}"#, None),
    // beam options act only under beam search, which does not sample
    (r#"{"use_beam_search": true, "length_penalty": -0.5, "early_stopping": "never"}"#, None),
    (r#"{"use_beam_search": true, "early_stopping": true, "temperature": 1}"#, None),
    (r#"{"use_beam_search": true, "early_stopping": "always"}"#, Some(("early_stopping", INVALID_VALUE))),
    (r#"{"use_beam_search": true, "early_stopping": 1}"#, Some(("early_stopping", INVALID_VALUE))),
    (r#"{"length_penalty": 2}"#, Some(("length_penalty", CONFLICT))),
    (r#"{"length_penalty": 1, "early_stopping": false}"#, None),
    (r#"{"early_stopping": "never"}"#, Some(("early_stopping", CONFLICT))),
    (r#"{"use_beam_search": true, "top_p": 0.5}"#, Some(("top_p", CONFLICT))),
    (r#"{"use_beam_search": true, "top_k": 4}"#, Some(("top_k", CONFLICT))),
    (r#"{"use_beam_search": true, "min_p": 0.1}"#, Some(("min_p", CONFLICT))),
    (r#"{"use_beam_search": true, "top_k": -1, "top_p": 1}"#, None),
];

#[test]
fn cross_field_rules() {
    for &(extra, expected) in CROSS {
        let result = validate(Route::Completions, &merge(BASE, extra), None, &limits());
        match expected {
            None => assert!(result.is_ok(), "{extra}: {result:?}"),
            Some((param, code)) => assert_err(result, param, code, extra),
        }
    }
}

#[test]
fn sequences_and_beam_width() {
    let run = |extra: &str| ok_with(Route::Completions, &merge(BASE, extra), None, &limits());
    let p = run("{}");
    assert_eq!((p.n, p.best_of, p.use_beam_search), (1, 1, false));
    let p = run(r#"{"n": 3}"#);
    assert_eq!(
        (p.n, p.best_of),
        (3, 3),
        "best_of defaults to n (docs/decisions.md#choosing-the-best-of-several-samples)"
    );
    let p = run(r#"{"n": 2, "best_of": 5}"#);
    assert_eq!((p.n, p.best_of), (2, 5));
    let p = run(r#"{"use_beam_search": true, "n": 2, "best_of": 4}"#);
    assert_eq!((p.n, p.best_of, p.use_beam_search), (2, 4, true));
    let p = run(r#"{"use_beam_search": true, "n": 3}"#);
    assert_eq!(
        p.best_of, 3,
        "beam width is n without best_of (docs/decisions.md#beam-width)"
    );
    let p = run(r#"{"use_beam_search": true, "n": 3, "best_of": 2}"#);
    assert_eq!(p.best_of, 3, "the width is never below n");
    let narrow = Limits {
        max_beam_width: 4,
        ..limits()
    };
    let body = merge(BASE, r#"{"use_beam_search": true, "n": 2, "best_of": 5}"#);
    assert_err(
        validate(Route::Completions, &body, None, &narrow),
        "best_of",
        OUT_OF_RANGE,
        "width 5",
    );
    let body = merge(BASE, r#"{"use_beam_search": true, "n": 5}"#);
    assert_err(
        validate(Route::Completions, &body, None, &narrow),
        "n",
        OUT_OF_RANGE,
        "width 5",
    );
}

#[test]
fn defaults_logprobs_and_greedy() {
    let run = |extra: &str| ok_with(Route::Completions, &merge(BASE, extra), None, &limits());
    let p = run("{}");
    assert_eq!(
        (p.temperature, p.max_tokens, p.logprobs, p.seed),
        (1.0, Some(1000), None, None)
    );
    assert_eq!(run(r#"{"logprobs": 2}"#).logprobs, Some(2));
    assert_eq!(run(r#"{"logprobs": 0}"#).logprobs, Some(0));
    let p = run(r#"{"temperature": 0, "top_p": 0.5, "top_k": 3}"#);
    assert!(p.is_greedy() && p.top_p == 1.0 && p.top_k == 0);
    let p = run(r#"{"max_tokens": 7, "ignore_eos": true, "skip_special_tokens": false}"#);
    assert_eq!(
        (p.max_tokens, p.ignore_eos, p.skip_special_tokens),
        (Some(7), true, false)
    );
}

#[test]
fn output_cap_uses_the_prompt_field() {
    let body = merge(BASE, r#"{"max_tokens": 50}"#);
    assert_eq!(
        ok_with(
            Route::Completions,
            &body,
            Some(4000),
            &Limits {
                max_input_tokens: 4095,
                ..limits()
            }
        )
        .max_tokens,
        Some(50)
    );
    assert_eq!(
        ok_with(
            Route::Completions,
            &body,
            Some(4070),
            &Limits {
                max_input_tokens: 4095,
                ..limits()
            }
        )
        .max_tokens,
        Some(26)
    );
    assert_err(
        validate(Route::Completions, &body, Some(3001), &limits()),
        "prompt",
        TOO_LONG,
        "3001 tokens",
    );
    let small = Limits {
        max_prompt_chars: 3,
        ..limits()
    };
    let batch = merge(BASE, r#"{"prompt": ["abc", "abcd"]}"#);
    assert_err(
        validate(Route::Completions, &batch, None, &small),
        "prompt[1]",
        TOO_LONG,
        "batch item",
    );
}
