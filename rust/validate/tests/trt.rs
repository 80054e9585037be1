//! The TensorRT-LLM-style request (docs/api/trt.md, docs/decisions.md#tensorrt-llm).

use super::{assert_err, limits, merge, ok_with, parse, run_cases, with, Case};
use crate::validate::codes::*;
use crate::validate::{validate, Limits, Raw, Route};

const BASE: &str = r#"{"input_ids": [1, 2, 3], "request_output_len": 16}"#;

#[rustfmt::skip]
const FIELDS: &[Case] = &[
    ("input_ids", "null", Some(("input_ids", MISSING))),
    ("input_ids", "[]", Some(("input_ids", EMPTY))),
    ("input_ids", "[[1, 2, 3]]", None),
    ("input_ids", "[0, 31999]", None),
    ("input_ids", "[1, -1]", Some(("input_ids[1]", OUT_OF_RANGE))),
    ("input_ids", "[32000]", Some(("input_ids[0]", OUT_OF_RANGE))),
    ("input_ids", "[[1], [2]]", Some(("input_ids", INVALID_FORMAT))),
    ("input_ids", r#"["1"]"#, Some(("input_ids[0]", WRONG_TYPE))),
    ("request_output_len", "null", Some(("request_output_len", MISSING))),
    ("request_output_len", "[16]", None),
    ("request_output_len", "[[16]]", None),
    ("request_output_len", "2147483647", None),
    ("request_output_len", "0", Some(("request_output_len", OUT_OF_RANGE))),
    ("request_output_len", "2147483648", Some(("request_output_len", OUT_OF_RANGE))),
    ("request_output_len", "[1, 2]", Some(("request_output_len", INVALID_FORMAT))),
    ("max_new_tokens", "8", Some(("max_new_tokens", CONFLICT))),
    ("streaming", "[true]", None),
    ("streaming", "1", Some(("streaming", WRONG_TYPE))),
    ("is_streaming", "true", None),
    ("beam_width", "1", None),
    ("beam_width", "[4]", None),
    ("beam_width", "0", Some(("beam_width", OUT_OF_RANGE))),
    ("beam_width", "129", Some(("beam_width", OUT_OF_RANGE))),
    ("temperature", "0", None),
    ("temperature", "-1", Some(("temperature", OUT_OF_RANGE))),
    ("runtime_top_k", "1024", None),
    ("runtime_top_k", "1025", Some(("runtime_top_k", OUT_OF_RANGE))),
    ("runtime_top_k", "-1", Some(("runtime_top_k", OUT_OF_RANGE))),
    ("runtime_top_p", "0", None),
    ("runtime_top_p", "1.01", Some(("runtime_top_p", OUT_OF_RANGE))),
    ("len_penalty", "-3.5", Some(("len_penalty", CONFLICT))),
    ("length_penalty", "1.0", None),
    ("early_stopping", "[0]", None),
    ("early_stopping", "[1]", Some(("early_stopping", CONFLICT))),
    ("early_stopping", "0.5", Some(("early_stopping", WRONG_TYPE))),
    ("repetition_penalty", "0", Some(("repetition_penalty", OUT_OF_RANGE))),
    ("presence_penalty", "-5", None),
    ("min_length", "-1", Some(("min_length", OUT_OF_RANGE))),
    ("no_repeat_ngram_size", "3", None),
    ("no_repeat_ngram_size", "-1", Some(("no_repeat_ngram_size", OUT_OF_RANGE))),
    ("random_seed", "18446744073709551615", None),
    ("random_seed", "-1", Some(("random_seed", OUT_OF_RANGE))),
    ("random_seed", "18446744073709551616", Some(("random_seed", OUT_OF_RANGE))),
    ("end_id", "-1", None),
    ("end_id", "31999", None),
    ("end_id", "-2", Some(("end_id", OUT_OF_RANGE))),
    ("end_id", "32000", Some(("end_id", OUT_OF_RANGE))),
    ("pad_id", "0", None),
    ("return_log_probs", "[true]", None),
    ("return_context_logits", "1", Some(("return_context_logits", WRONG_TYPE))),
    ("lora_task_id", "18446744073709551615", None),
    ("lora_task_id", "-1", Some(("lora_task_id", OUT_OF_RANGE))),
    ("lora_config", "[[0, 1, 8], [1, 1, 8]]", Some(("lora_config", CONFLICT))),
    ("lora_weights", "[[0.5]]", Some(("lora_weights", CONFLICT))),
    ("len_penalty", "0", None),
    ("lora_config", "[[0, 1]]", Some(("lora_config[0]", INVALID_FORMAT))),
    ("prompt_embedding_table", "[[0.1, 0.2], [0.3, 0.4]]", None),
    ("prompt_embedding_table", "[[0.1, 0.2], [0.3]]", Some(("prompt_embedding_table[1]", INVALID_FORMAT))),
    ("prompt_embedding_table", "[[]]", Some(("prompt_embedding_table", EMPTY))),
    ("prompt_vocab_size", "2", Some(("prompt_vocab_size", CONFLICT))),
    ("draft_input_ids", "[5, 6]", None),
    ("draft_input_ids", "[5, 32000]", Some(("draft_input_ids[1]", OUT_OF_RANGE))),
    ("bad_words_list", "[[77, 15249, 77], [2, 3, -1]]", None),
    ("bad_words_list", "[[[77, 15249, 77], [2, 3, -1]]]", None),
    ("bad_words_list", "[[77, 15249, 77]]", Some(("bad_words_list", INVALID_FORMAT))),
    ("bad_words_list", "[[77, 15249, 77], [2, 3]]", Some(("bad_words_list", INVALID_FORMAT))),
    ("bad_words_list", "[[77, 15249, 77], [2, 2, -1]]", Some(("bad_words_list", INVALID_FORMAT))),
    ("bad_words_list", "[[77, 15249, 77], [0, 3, -1]]", Some(("bad_words_list", INVALID_FORMAT))),
    ("bad_words_list", "[[77, 15249, 77], [2, 4, -1]]", Some(("bad_words_list", INVALID_FORMAT))),
    ("bad_words_list", "[[77, 15249, 77], [-1, 2, 3]]", Some(("bad_words_list", INVALID_FORMAT))),
    ("bad_words_list", "[[77, 32000, 77], [2, 3, -1]]", Some(("bad_words_list[0][1]", OUT_OF_RANGE))),
    ("stop_words_list", "[[5, 0], [1, -1]]", None),
    ("stop_words_list", "[[5, 0], [1, 0.5]]", Some(("stop_words_list[1]", WRONG_TYPE))),
    ("guided_decoding_guide_type", r#"["json"]"#, Some(("end_id", MISSING))),
    ("guided_decoding_guide_type", r#""regex""#, Some(("guided_decoding_guide", MISSING))),
    ("guided_decoding_guide_type", r#""ebnf_grammar""#, Some(("guided_decoding_guide_type", UNSUPPORTED))),
    ("guided_decoding_guide_type", r#""yaml""#, Some(("guided_decoding_guide_type", INVALID_VALUE))),
    ("guided_decoding_guide_type", r#"["json", "regex"]"#, Some(("guided_decoding_guide_type", INVALID_FORMAT))),
    ("guided_decoding_guide_type", "7", Some(("guided_decoding_guide_type", WRONG_TYPE))),
    ("guided_decoding_guide", r#""[0-9]+""#, Some(("guided_decoding_guide", CONFLICT))),
];

#[test]
fn guided_decoding_tensors_give_the_grammar() {
    use crate::grammar::GrammarKind;
    let grammar = |extra: &str| {
        let body = merge(
            r#"{"input_ids": [1, 2, 3], "request_output_len": 16, "end_id": 2}"#,
            extra,
        );
        let req = crate::validate::validate_request(Route::Trt, &body, &limits()).expect("valid");
        req.switches.grammar.map(|g| (g.kind, g.text, g.field))
    };
    let field = "guided_decoding_guide_type".to_string();
    assert_eq!(
        grammar(
            r#"{"guided_decoding_guide_type": ["regex"], "guided_decoding_guide": ["[a-z]+"]}"#
        ),
        Some((GrammarKind::Regex, "[a-z]+".to_string(), field.clone()))
    );
    assert_eq!(
        grammar(
            r#"{"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "{\"type\": \"object\"}"}"#
        ),
        Some((
            GrammarKind::JsonSchema,
            r#"{"type":"object"}"#.to_string(),
            field.clone()
        ))
    );
    assert_eq!(
        grammar(r#"{"guided_decoding_guide_type": "json"}"#),
        Some((GrammarKind::JsonObject, String::new(), field))
    );
    assert_eq!(grammar("{}"), None);
    let body = merge(
        BASE,
        r#"{"end_id": 2, "guided_decoding_guide_type": "json"}"#,
    );
    let req = crate::validate::validate_request(Route::Trt, &body, &limits()).expect("valid");
    assert!(
        !req.params.ignore_eos,
        "a guided output may end on the model's EOS"
    );
}

#[test]
fn field_table() {
    run_cases(Route::Trt, BASE, FIELDS);
}

#[test]
fn decoding_modes() {
    let run = |extra: &str| ok_with(Route::Trt, &merge(BASE, extra), None, &limits());
    // Absent top-k and top-p are TRT's 0 / 0.0: greedy (docs/decisions.md#absent-top-k-and-top-p).
    assert!(run("{}").is_greedy());
    assert!(run(r#"{"runtime_top_k": 0, "runtime_top_p": 0.0, "temperature": 0.8}"#).is_greedy());
    let p = run(r#"{"runtime_top_k": 5}"#);
    assert_eq!(
        (p.top_k, p.top_p, p.temperature),
        (5, 1.0, 1.0),
        "top-p 0 is off"
    );
    let p = run(r#"{"runtime_top_p": 0.9, "temperature": 0.7}"#);
    assert_eq!((p.top_k, p.top_p, p.temperature), (0, 0.9, 0.7));
    let p = run(r#"{"runtime_top_k": 0, "runtime_top_p": 1.0}"#);
    assert!(
        !p.is_greedy(),
        "the HTTP mapping's 0 / 1.0 samples the full distribution"
    );
    assert!(run(r#"{"runtime_top_p": 0.9, "temperature": 0}"#).is_greedy());
    let p = run(r#"{"beam_width": 4}"#);
    assert_eq!((p.use_beam_search, p.n, p.best_of), (true, 4, 4));
    assert!(!run(r#"{"beam_width": 1}"#).use_beam_search);
}

#[test]
fn field_mapping() {
    let run = |extra: &str| ok_with(Route::Trt, &merge(BASE, extra), None, &limits());
    let p = run("{}");
    assert_eq!(p.seed, Some(0), "TRT's default random seed");
    assert!(
        p.ignore_eos && p.stop_token_ids.is_empty(),
        "end_id -1: EOS never ends (docs/decisions.md#the-end-id-default)"
    );
    assert_eq!((p.max_tokens, p.logprobs), (Some(16), None));
    let p = run(
        r#"{"end_id": 2, "min_length": [[3]], "random_seed": 9, "no_repeat_ngram_size": 2, "return_log_probs": true}"#,
    );
    assert!(p.ignore_eos);
    assert_eq!(p.stop_token_ids, vec![2]);
    assert_eq!(
        (p.min_tokens, p.seed, p.no_repeat_ngram_size, p.logprobs),
        (3, Some(9), 2, Some(0))
    );
    let p = run(
        r#"{"bad_words_list": [[77, 15249, 77], [2, 3, -1]], "stop_words_list": [[[5, 6, 0], [2, -1, -1]]]}"#,
    );
    assert_eq!(p.bad_words, vec![vec![77, 15249], vec![77]]);
    assert_eq!(p.stop_token_sequences, vec![vec![5, 6]]);
    let p = run(
        r#"{"max_new_tokens": 4, "request_output_len": null, "is_streaming": true, "beam_width": 3, "length_penalty": 2, "early_stopping": 5}"#,
    );
    assert_eq!(
        p.max_tokens,
        Some(4),
        "aliases (docs/decisions.md#pybind-names)"
    );
    assert_eq!(
        (
            p.use_beam_search,
            p.best_of,
            p.length_penalty,
            p.early_stopping
        ),
        (true, 3, 2.0, crate::params::EarlyStopping::Never)
    );
    for (early, want) in [
        ("0", crate::params::EarlyStopping::Heuristic),
        ("1", crate::params::EarlyStopping::Finished),
        ("-1", crate::params::EarlyStopping::Never),
    ] {
        let p = run(&format!(
            r#"{{"beam_width": 2, "early_stopping": [{early}]}}"#
        ));
        assert_eq!(p.early_stopping, want, "early_stopping {early}");
    }
    let filtered = merge(BASE, r#"{"beam_width": 2, "runtime_top_k": 5}"#);
    assert_err(
        validate(Route::Trt, &filtered, None, &limits()),
        "runtime_top_k",
        CONFLICT,
        "beam search does not sample",
    );
    let p =
        run(r#"{"repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.5}"#);
    assert_eq!(
        (
            p.repetition_penalty,
            p.presence_penalty,
            p.frequency_penalty
        ),
        (1.2, 0.5, -0.5)
    );
}

#[test]
fn output_cap_counts_input_ids() {
    let limits = Limits {
        max_model_len: 10,
        max_input_tokens: 9,
        ..limits()
    };
    let body = |n: usize, out: i128| {
        let ids = Raw::List(vec![Raw::Int(1); n]);
        with(
            &with(&parse(BASE), "input_ids", ids),
            "request_output_len",
            Raw::Int(out),
        )
    };
    // The body's own input_ids count; the num_prompt_tokens argument is not needed.
    assert_eq!(
        ok_with(Route::Trt, &body(3, 100), None, &limits).max_tokens,
        Some(7)
    );
    assert_eq!(
        ok_with(Route::Trt, &body(9, 100), Some(1), &limits).max_tokens,
        Some(1)
    );
    assert_err(
        validate(Route::Trt, &body(10, 1), None, &limits),
        "input_ids",
        TOO_LONG,
        "10 ids",
    );
}

/// Shape rules with a 4-token vocabulary: (extra fields, expected error or None).
#[rustfmt::skip]
const SHAPES: &[(&str, Option<(&str, &str)>)] = &[
    (r#"{"embedding_bias": [0.5, 0, -1, 2]}"#, None),
    (r#"{"embedding_bias": [0.5, 0, -1]}"#, Some(("embedding_bias", INVALID_FORMAT))),
    (r#"{"embedding_bias": [0.5, 0, "x", 1]}"#, Some(("embedding_bias[2]", WRONG_TYPE))),
    (r#"{"draft_input_ids": [1, 2], "draft_logits": [[0, 0, 0, 0], [1, 1, 1, 1]]}"#, None),
    (r#"{"draft_input_ids": [1], "draft_logits": [[0, 0, 0, 0], [1, 1, 1, 1]]}"#, Some(("draft_logits", INVALID_FORMAT))),
    (r#"{"draft_input_ids": [1], "draft_logits": [[0, 0, 0]]}"#, Some(("draft_logits[0]", INVALID_FORMAT))),
    (r#"{"lora_config": [[0, 1, 8]], "lora_weights": [[0.1, 0.2]]}"#, Some(("lora_weights", CONFLICT))),
    (r#"{"lora_task_id": 3, "lora_config": [[0, 1, 8]], "lora_weights": [[0.1, 0.2]]}"#, None),
    (r#"{"lora_config": [[0, 1, 8]], "lora_weights": [[0.1], [0.2]]}"#, Some(("lora_weights", INVALID_FORMAT))),
    (r#"{"beam_width": 2}"#, None),
    (r#"{"beam_width": 3}"#, Some(("beam_width", OUT_OF_RANGE))),
];

#[test]
fn embedding_bias_and_shapes() {
    let limits = Limits {
        vocab_size: 4,
        max_beam_width: 2,
        ..limits()
    };
    let run = |extra: &str| validate(Route::Trt, &merge(BASE, extra), None, &limits);
    for &(extra, expected) in SHAPES {
        match expected {
            None => assert!(run(extra).is_ok(), "{extra}"),
            Some((param, code)) => assert_err(run(extra), param, code, extra),
        }
    }
    let p = run(r#"{"embedding_bias": [[0.5, 0, -1, 2]]}"#).unwrap();
    let bias = p.embedding_bias.as_deref();
    assert_eq!(
        bias,
        Some(&[0.5, 0.0, -1.0, 2.0][..]),
        "a [1, vocab] tensor"
    );
}

#[test]
fn prompt_tuning_admits_virtual_ids() {
    let limits = Limits {
        vocab_size: 4,
        ..limits()
    };
    let run = |extra: &str| validate(Route::Trt, &merge(BASE, extra), None, &limits);
    let table = r#""prompt_embedding_table": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]"#;
    // Ids vocab..vocab + rows name table rows; one past them is out of range.
    assert!(run(&format!(r#"{{"input_ids": [4, 6, 1], {table}}}"#)).is_ok());
    assert_err(
        run(&format!(r#"{{"input_ids": [7], {table}}}"#)),
        "input_ids[0]",
        OUT_OF_RANGE,
        "past the table",
    );
    // prompt_vocab_size narrows the virtual range and may not exceed the table.
    assert!(run(&format!(
        r#"{{"input_ids": [5], "prompt_vocab_size": 2, {table}}}"#
    ))
    .is_ok());
    assert_err(
        run(&format!(
            r#"{{"input_ids": [6], "prompt_vocab_size": 2, {table}}}"#
        )),
        "input_ids[0]",
        OUT_OF_RANGE,
        "past prompt_vocab_size",
    );
    assert_err(
        run(&format!(r#"{{"prompt_vocab_size": [4], {table}}}"#)),
        "prompt_vocab_size",
        OUT_OF_RANGE,
        "more than the table's rows",
    );
    // Without a table, ids stop at the vocabulary.
    assert_err(
        run(r#"{"input_ids": [4]}"#),
        "input_ids[0]",
        OUT_OF_RANGE,
        "no table",
    );
}

#[test]
fn batched_word_lists_and_length_penalty_default() {
    let run = |extra: &str| ok_with(Route::Trt, &merge(BASE, extra), None, &limits());
    let p = run(r#"{"bad_words_list": [[[77, 15249, 77], [2, 3, -1]], [[9, 0, 0], [1, -1, -1]]]}"#);
    assert_eq!(p.bad_words, vec![vec![77, 15249], vec![77], vec![9]]);
    assert_err(
        validate(
            Route::Trt,
            &merge(
                BASE,
                r#"{"stop_words_list": [[[5, 6], [2, -1]], [[5], [3]]]}"#,
            ),
            None,
            &limits(),
        ),
        "stop_words_list[1]",
        INVALID_FORMAT,
        "a bad batch item names its index",
    );
    assert_eq!(
        run(r#"{"beam_width": 2}"#).length_penalty,
        0.0,
        "TRT's default"
    );
}
