//! The offline route (the Python `SamplingParams(...)` constructor), vLLM ranges.

use super::{assert_err, limits, merge, ok_with, parse, run_cases, Case};
use crate::params::SamplingParams;
use crate::validate::codes::*;
use crate::validate::{validate, Limits, Route, OFFLINE_FIELDS};

#[rustfmt::skip]
const FIELDS: &[Case] = &[
    ("n", "128", None),
    ("n", "0", Some(("n", OUT_OF_RANGE))),
    ("n", "129", Some(("n", OUT_OF_RANGE))),
    ("n", "1180591620717411303424", Some(("n", OUT_OF_RANGE))),
    ("best_of", "0", Some(("best_of", OUT_OF_RANGE))),
    ("temperature", "0", None),
    ("temperature", "-0.1", Some(("temperature", OUT_OF_RANGE))),
    ("top_p", "1", None),
    ("top_p", "0", Some(("top_p", OUT_OF_RANGE))),
    ("top_k", "-1", None),
    ("top_k", "0", None),
    ("top_k", "1", None),
    ("top_k", "-2", Some(("top_k", OUT_OF_RANGE))),
    ("min_p", "1", None),
    ("min_p", "-0.1", Some(("min_p", OUT_OF_RANGE))),
    ("typical_p", "1", None),
    ("typical_p", "0", Some(("typical_p", OUT_OF_RANGE))),
    ("repetition_penalty", "5", None),
    ("repetition_penalty", "0", Some(("repetition_penalty", OUT_OF_RANGE))),
    ("presence_penalty", "2", None),
    ("frequency_penalty", "-2.1", Some(("frequency_penalty", OUT_OF_RANGE))),
    ("seed", "0", None),
    ("seed", "18446744073709551615", None),
    ("seed", "18446744073709551616", Some(("seed", OUT_OF_RANGE))),
    ("seed", "-1", Some(("seed", OUT_OF_RANGE))),
    ("stop", r#"["a"]"#, None),
    ("stop", r#"[""]"#, Some(("stop[0]", EMPTY))),
    ("stop_token_ids", "[]", None),
    ("stop_token_ids", "[5, 6]", None),
    ("stop_token_ids", "[5, -1]", Some(("stop_token_ids[1]", OUT_OF_RANGE))),
    ("stop_token_ids", "[32000]", Some(("stop_token_ids[0]", OUT_OF_RANGE))),
    ("stop_token_sequences", "[[1, 2], [3]]", None),
    ("stop_token_sequences", "[[]]", Some(("stop_token_sequences[0]", EMPTY))),
    ("stop_token_sequences", "[1]", Some(("stop_token_sequences[0]", WRONG_TYPE))),
    ("bad_words", "[[1, 2]]", None),
    ("bad_words", "[null]", Some(("bad_words[0]", WRONG_TYPE))),
    ("logit_bias", r#"{"1": 100}"#, None),
    ("logit_bias", r#"{"1": -100.5}"#, Some(("logit_bias.1", OUT_OF_RANGE))),
    ("allowed_token_ids", "[0]", None),
    ("allowed_token_ids", "[]", Some(("allowed_token_ids", EMPTY))),
    ("max_tokens", "1", None),
    ("max_tokens", "4294967295", None),
    ("max_tokens", "0", Some(("max_tokens", OUT_OF_RANGE))),
    ("max_tokens", "4294967296", Some(("max_tokens", OUT_OF_RANGE))),
    ("min_tokens", "-1", Some(("min_tokens", OUT_OF_RANGE))),
    ("ignore_eos", "1", Some(("ignore_eos", WRONG_TYPE))),
    ("logprobs", "20", None),
    ("logprobs", "21", Some(("logprobs", OUT_OF_RANGE))),
    ("no_repeat_ngram_size", "0", None),
    ("no_repeat_ngram_size", "-1", Some(("no_repeat_ngram_size", OUT_OF_RANGE))),
    ("priority", "1", None),
    ("priority", "6", Some(("priority", OUT_OF_RANGE))),
    ("timeout_s", "0.5", None),
    ("timeout_s", "0", Some(("timeout_s", OUT_OF_RANGE))),
    ("timeout_s", r#""1""#, Some(("timeout_s", WRONG_TYPE))),
    ("use_beam_search", "true", None),
    ("embedding_bias", "[]", Some(("embedding_bias", INVALID_FORMAT))),
];

#[test]
fn field_table() {
    run_cases(Route::Offline, "{}", FIELDS);
}

#[test]
fn defaults_equal_sampling_params_default() {
    let p = ok_with(Route::Offline, &parse("{}"), None, &limits());
    assert_eq!(p, SamplingParams::default());
    // Every field name is read: null for each is the same as absent.
    let nulls = format!(
        "{{{}}}",
        OFFLINE_FIELDS.map(|k| format!("\"{k}\": null")).join(", ")
    );
    assert_eq!(ok_with(Route::Offline, &parse(&nulls), None, &limits()), p);
}

#[test]
fn cross_field_rules() {
    let run = |extra: &str| validate(Route::Offline, &merge("{}", extra), None, &limits());
    assert_err(
        run(r#"{"max_tokens": 3, "min_tokens": 4}"#),
        "min_tokens",
        OUT_OF_RANGE,
        "min > max",
    );
    assert!(run(r#"{"max_tokens": 3, "min_tokens": 3}"#).is_ok());
    assert_err(
        run(r#"{"n": 3, "best_of": 2}"#),
        "best_of",
        CONFLICT,
        "best_of < n",
    );
    assert_err(
        run(r#"{"n": 2, "temperature": 0}"#),
        "temperature",
        CONFLICT,
        "greedy n 2",
    );
    assert_err(
        run(r#"{"best_of": 2, "temperature": 0}"#),
        "temperature",
        CONFLICT,
        "greedy best_of 2",
    );
    assert_err(
        run(r#"{"use_beam_search": true, "stop": "x"}"#),
        "stop",
        CONFLICT,
        "beam + stop",
    );
    assert!(run(r#"{"use_beam_search": true, "n": 2, "best_of": 4, "temperature": 0}"#).is_ok());
    let narrow = Limits {
        max_beam_width: 2,
        ..limits()
    };
    let body = merge("{}", r#"{"use_beam_search": true, "best_of": 3}"#);
    assert_err(
        validate(Route::Offline, &body, None, &narrow),
        "best_of",
        OUT_OF_RANGE,
        "width",
    );
}

#[test]
fn normalisation() {
    let run = |extra: &str| ok_with(Route::Offline, &merge("{}", extra), None, &limits());
    let p = run(
        r#"{"n": 2, "max_tokens": 9, "min_tokens": 2, "stop_token_ids": [5], "ignore_eos": true, "priority": 2, "timeout_s": 1.5}"#,
    );
    assert_eq!(
        (p.n, p.best_of, p.max_tokens, p.min_tokens),
        (2, 2, Some(9), 2)
    );
    assert_eq!(
        (
            p.stop_token_ids.clone(),
            p.ignore_eos,
            p.priority,
            p.timeout_s
        ),
        (vec![5], true, 2, Some(1.5))
    );
    assert_eq!(run(r#"{"top_k": -1}"#).top_k, 0);
    assert_eq!(run(r#"{"top_k": 50000}"#).top_k, 0);
    assert_eq!(run(r#"{"top_k": 50}"#).top_k, 50);
    let p = run(r#"{"temperature": 0, "top_p": 0.5, "typical_p": 0.5}"#);
    assert!(p.is_greedy() && p.top_p == 1.0 && p.typical_p == 1.0);
    assert!(!run(r#"{"include_stop_str_in_output": true}"#).include_stop_str_in_output);
    assert!(run(r#"{"include_stop_str_in_output": true, "stop": "x"}"#).include_stop_str_in_output);
    let p = run(
        r#"{"logit_bias": {"3": 1}, "allowed_token_ids": [4, 2], "bad_words": [[1, 2]], "logprobs": 3, "seed": 0}"#,
    );
    assert_eq!(
        (p.logit_bias.clone(), p.allowed_token_ids.clone()),
        (vec![(3, 1.0)], Some(vec![2, 4]))
    );
    assert_eq!(
        (p.bad_words.clone(), p.logprobs, p.seed),
        (vec![vec![1, 2]], Some(3), Some(0))
    );
    // Unknown vocabulary: ids up to u32::MAX pass.
    let open = Limits {
        vocab_size: 0,
        ..limits()
    };
    let p = ok_with(
        Route::Offline,
        &parse(r#"{"stop_token_ids": [4294967295]}"#),
        None,
        &open,
    );
    assert_eq!(p.stop_token_ids, vec![u32::MAX]);
}

#[test]
fn cap_only_with_a_prompt_count() {
    let run = |body: &str, tokens| ok_with(Route::Offline, &parse(body), tokens, &limits());
    assert_eq!(run("{}", None).max_tokens, None, "no model, no cap");
    assert_eq!(run(r#"{"max_tokens": 5000}"#, None).max_tokens, Some(5000));
    assert_eq!(run("{}", Some(10)).max_tokens, Some(1000));
    assert_eq!(
        run(r#"{"max_tokens": 5, "min_tokens": 5}"#, Some(10)).max_tokens,
        Some(5)
    );
}
