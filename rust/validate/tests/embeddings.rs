//! OpenAI `/v1/embeddings` and the Databricks embeddings task: the input shapes, the switches,
//! every rejection (param path and code), and the token limits after tokenizing.

use super::{limits, parse};
use crate::error::CoreError;
use crate::validate::codes::*;
use crate::validate::{
    check_input_tokens, validate_request, Limits, Route, ValidRequest, MAX_EMBED_INPUTS,
};

fn embed_limits() -> Limits {
    Limits {
        max_input_tokens: 256,
        max_model_len: 257,
        embedding_dimensions: 384,
        ..limits()
    }
}

fn run(route: Route, body: &str) -> Result<ValidRequest, CoreError> {
    validate_request(route, &parse(body), &embed_limits())
}

/// The error's (param, code, message); panics when the body passed.
fn refused(result: Result<ValidRequest, CoreError>, context: &str) -> (String, String, String) {
    match result {
        Err(CoreError::Invalid {
            param,
            code,
            message,
        }) => (param, code.to_string(), message),
        other => panic!("{context}: expected an error, got {other:?}"),
    }
}

#[test]
fn openai_accepts_every_input_shape_and_reads_the_switches() {
    for input in [r#""a""#, r#"["a", "b"]"#, "[1, 2, 3]", "[[1, 2], [3]]"] {
        let body = format!(r#"{{"model": "m", "input": {input}}}"#);
        let v = run(Route::Embeddings, &body).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert_eq!(v.switches.model.as_deref(), Some("m"));
        assert!(!v.switches.base64 && v.switches.truncate_prompt_tokens.is_none());
    }
    let body = r#"{"model": "m", "input": "a", "encoding_format": "base64", "dimensions": 384,
        "user": "u", "truncate_prompt_tokens": -1}"#;
    let v = run(Route::Embeddings, body).unwrap();
    assert!(v.switches.base64);
    assert_eq!(
        v.switches.truncate_prompt_tokens,
        Some(256),
        "-1 is the model's maximum"
    );
    let body =
        r#"{"model": "m", "input": "a", "encoding_format": null, "truncate_prompt_tokens": 7}"#;
    assert_eq!(
        run(Route::Embeddings, body)
            .unwrap()
            .switches
            .truncate_prompt_tokens,
        Some(7)
    );
}

#[test]
fn openai_rejections_name_the_field_and_the_rule() {
    let many = format!(r#"["a"{}]"#, r#", "a""#.repeat(MAX_EMBED_INPUTS));
    #[rustfmt::skip]
    let cases: Vec<(String, &str, &str, &str)> = vec![
        (r#"{"input": "a"}"#.into(), "model", MISSING, "is required"),
        (r#"{"model": 5, "input": "a"}"#.into(), "model", WRONG_TYPE, "a string"),
        (r#"{"model": "m"}"#.into(), "input", WRONG_TYPE, "a non-empty string, a non-empty list"),
        (r#"{"model": "m", "input": 5}"#.into(), "input", WRONG_TYPE, "list of token-id lists"),
        (r#"{"model": "m", "input": ""}"#.into(), "input", EMPTY, "must not be empty"),
        (r#"{"model": "m", "input": []}"#.into(), "input", EMPTY, "an empty list"),
        (r#"{"model": "m", "input": ["a", ""]}"#.into(), "input[1]", EMPTY, "must not be empty"),
        (r#"{"model": "m", "input": ["a", 5]}"#.into(), "input[1]", WRONG_TYPE, "mixing"),
        (r#"{"model": "m", "input": [[1], "a"]}"#.into(), "input[1]", WRONG_TYPE, "mixing"),
        (r#"{"model": "m", "input": [1, "a"]}"#.into(), "input[1]", WRONG_TYPE, "an integer"),
        (r#"{"model": "m", "input": [1, 32000]}"#.into(), "input[1]", OUT_OF_RANGE, "[0, 31999]"),
        (r#"{"model": "m", "input": [1, -1]}"#.into(), "input[1]", OUT_OF_RANGE, "[0, 31999]"),
        (r#"{"model": "m", "input": [[1], []]}"#.into(), "input[1]", EMPTY, "must not be empty"),
        (r#"{"model": "m", "input": [[1], [2, 40000]]}"#.into(), "input[1][1]", OUT_OF_RANGE, "token id"),
        (format!(r#"{{"model": "m", "input": {many}}}"#), "input", TOO_MANY, "at most 2048"),
        (r#"{"model": "m", "input": "a", "encoding_format": "int8"}"#.into(),
            "encoding_format", INVALID_VALUE, r#""float" or "base64""#),
        (r#"{"model": "m", "input": "a", "encoding_format": 1}"#.into(),
            "encoding_format", WRONG_TYPE, "a string"),
        (r#"{"model": "m", "input": "a", "dimensions": 0}"#.into(), "dimensions", OUT_OF_RANGE, "positive"),
        (r#"{"model": "m", "input": "a", "dimensions": 1.5}"#.into(), "dimensions", WRONG_TYPE, "integer"),
        (r#"{"model": "m", "input": "a", "dimensions": 128}"#.into(), "dimensions", UNSUPPORTED, "Matryoshka"),
        (r#"{"model": "m", "input": "a", "user": 3}"#.into(), "user", WRONG_TYPE, "a string"),
        (r#"{"model": "m", "input": "a", "truncate_prompt_tokens": 0}"#.into(),
            "truncate_prompt_tokens", OUT_OF_RANGE, "positive"),
        (r#"{"model": "m", "input": "a", "truncate_prompt_tokens": -2}"#.into(),
            "truncate_prompt_tokens", OUT_OF_RANGE, "-1 (the model's maximum)"),
        (r#"{"model": "m", "input": "a", "truncate_prompt_tokens": 257}"#.into(),
            "truncate_prompt_tokens", OUT_OF_RANGE, "at most 256"),
        (r#"{"model": "m", "input": "a", "truncate_prompt_tokens": true}"#.into(),
            "truncate_prompt_tokens", WRONG_TYPE, "integer"),
        (r#"{"model": "m", "input": "a", "pooling": "cls"}"#.into(), "pooling", UNKNOWN_FIELD,
            "unknown field; /v1/embeddings takes dimensions, encoding_format, input, model"),
    ];
    for (body, param, code, mention) in cases {
        let (got_param, got_code, message) = refused(run(Route::Embeddings, &body), &body);
        assert_eq!(
            (got_param.as_str(), got_code.as_str()),
            (param, code),
            "{body}: {message}"
        );
        assert!(message.contains(mention), "{body}: {message}");
        assert!(message.starts_with(&format!("`{param}`")), "{message}");
    }
}

#[test]
fn any_dimensions_pass_without_a_known_model() {
    let body = parse(r#"{"model": "m", "input": "a", "dimensions": 64}"#);
    assert!(validate_request(Route::Embeddings, &body, &limits()).is_ok());
}

#[test]
fn databricks_input_and_instruction() {
    assert!(run(
        Route::DatabricksEmbeddings,
        r#"{"input": ["a", "b"], "instruction": "q:"}"#
    )
    .is_ok());
    let many = format!(
        r#"{{"input": ["a"{}]}}"#,
        r#", "a""#.repeat(MAX_EMBED_INPUTS)
    );
    #[rustfmt::skip]
    let cases: Vec<(String, &str, &str)> = vec![
        ("{}".into(), "input", MISSING),
        (r#"{"input": []}"#.into(), "input", EMPTY),
        (r#"{"input": ["a", ""]}"#.into(), "input[1]", EMPTY),
        (r#"{"input": [1, 2]}"#.into(), "input[0]", WRONG_TYPE),
        (r#"{"input": "a", "instruction": 5}"#.into(), "instruction", WRONG_TYPE),
        (many, "input", TOO_MANY),
    ];
    for (body, param, code) in cases {
        let (got_param, got_code, message) =
            refused(run(Route::DatabricksEmbeddings, &body), &body);
        assert_eq!(
            (got_param.as_str(), got_code.as_str()),
            (param, code),
            "{body}: {message}"
        );
    }
}

#[test]
fn token_limits_after_tokenizing() {
    let l = embed_limits();
    assert_eq!(
        check_input_tokens(Route::Embeddings, &[3, 256], &l).unwrap(),
        259
    );
    let (param, code, message) = refused(
        check_input_tokens(Route::Embeddings, &[3, 257], &l).map(|_| unreachable!()),
        "too long",
    );
    assert_eq!((param.as_str(), code.as_str()), ("input[1]", TOO_LONG));
    assert!(
        message.contains("257 tokens; the model takes at most 256; send `truncate_prompt_tokens`"),
        "{message}"
    );
    let (_, _, message) = refused(
        check_input_tokens(Route::DatabricksEmbeddings, &[300], &l).map(|_| unreachable!()),
        "databricks",
    );
    assert!(
        !message.contains("truncate_prompt_tokens"),
        "no such field there: {message}"
    );
    let lengths = vec![200; 1501];
    let (param, code, message) = refused(
        check_input_tokens(Route::Embeddings, &lengths, &l).map(|_| unreachable!()),
        "total",
    );
    assert_eq!((param.as_str(), code.as_str()), ("input", TOO_LONG));
    assert!(
        message.contains("300200 tokens in all; at most 300000 per request"),
        "{message}"
    );
}
