//! MindIE generate / generate_stream (docs/api/mindie.md#request).

use super::{assert_err, limits, ok, ok_with, parse, run_cases, with, Case};
use crate::validate::codes::*;
use crate::validate::{validate, Limits, Raw, Route};

const BASE: &str = r#"{"id": "a123", "text_input": "My name is Olivier and I"}"#;

#[rustfmt::skip]
const FIELDS: &[Case] = &[
    // id: ^[A-Za-z0-9_-]{1,256}$
    ("id", r#""A-z_09""#, None),
    ("id", "null", None),
    ("id", r#""""#, Some(("id", INVALID_FORMAT))),
    ("id", r#""a b""#, Some(("id", INVALID_FORMAT))),
    ("id", r#""abc.d""#, Some(("id", INVALID_FORMAT))),
    ("id", r#""é""#, Some(("id", INVALID_FORMAT))),
    ("id", "12", Some(("id", WRONG_TYPE))),
    // text_input
    ("text_input", r#""x""#, None),
    ("text_input", r#""""#, Some(("text_input", EMPTY))),
    ("text_input", "null", Some(("text_input", MISSING))),
    ("text_input", "5", Some(("text_input", WRONG_TYPE))),
    ("text_input", "[]", Some(("text_input", EMPTY))),
    ("text_input", r#"[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]"#, None),
    ("text_input", r#"[{"type": "text", "text": ""}]"#, Some(("text_input[0].text", EMPTY))),
    ("text_input", r#"[{"type": "text"}]"#, Some(("text_input[0].text", MISSING))),
    ("text_input", r#"[{"text": "a"}]"#, Some(("text_input[0].type", MISSING))),
    ("text_input", r#"["a"]"#, Some(("text_input[0]", WRONG_TYPE))),
    ("text_input", r#"[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "/x.png"}]"#,
        Some(("text_input[1].type", UNSUPPORTED_CONTENT_TYPE))),
    ("text_input", r#"[{"type": "text", "text": "a"}, {"type": "video_url", "video_url": "/x.mp4"}]"#,
        Some(("text_input[1].type", UNSUPPORTED_CONTENT_TYPE))),
    ("text_input", r#"[{"type": "text", "text": "a"}, {"type": "picture", "picture": "/x"}]"#,
        Some(("text_input[1].type", INVALID_VALUE))),
    // parameters: an object
    ("parameters", "null", None),
    ("parameters", "[]", Some(("parameters", WRONG_TYPE))),
    ("parameters.details", "true", None),
    ("parameters.details", "1", Some(("parameters.details", WRONG_TYPE))),
    ("parameters.do_sample", r#""true""#, Some(("parameters.do_sample", WRONG_TYPE))),
    // max_new_tokens (0, 2^31-1]
    ("parameters.max_new_tokens", "1", None),
    ("parameters.max_new_tokens", "2147483647", None),
    ("parameters.max_new_tokens", "5.0", None),
    ("parameters.max_new_tokens", "0", Some(("parameters.max_new_tokens", OUT_OF_RANGE))),
    ("parameters.max_new_tokens", "2147483648", Some(("parameters.max_new_tokens", OUT_OF_RANGE))),
    ("parameters.max_new_tokens", "5.5", Some(("parameters.max_new_tokens", WRONG_TYPE))),
    ("parameters.max_new_tokens", r#""5""#, Some(("parameters.max_new_tokens", WRONG_TYPE))),
    ("parameters.max_new_tokens", "true", Some(("parameters.max_new_tokens", WRONG_TYPE))),
    // repetition_penalty > 0, no upper bound
    ("parameters.repetition_penalty", "0.01", None),
    ("parameters.repetition_penalty", "7", None),
    ("parameters.repetition_penalty", "0", Some(("parameters.repetition_penalty", OUT_OF_RANGE))),
    ("parameters.repetition_penalty", "-1", Some(("parameters.repetition_penalty", OUT_OF_RANGE))),
    // seed (0, 2^64-1]
    ("parameters.seed", "1", None),
    ("parameters.seed", "18446744073709551615", None),
    ("parameters.seed", "0", Some(("parameters.seed", OUT_OF_RANGE))),
    ("parameters.seed", "18446744073709551616", Some(("parameters.seed", OUT_OF_RANGE))),
    ("parameters.seed", "1.5", Some(("parameters.seed", WRONG_TYPE))),
    ("parameters.seed", "1e300", Some(("parameters.seed", WRONG_TYPE))),
    // temperature > 0
    ("parameters.temperature", "0.001", None),
    ("parameters.temperature", "5", None),
    ("parameters.temperature", "0", Some(("parameters.temperature", OUT_OF_RANGE))),
    ("parameters.temperature", "-0.5", Some(("parameters.temperature", OUT_OF_RANGE))),
    ("parameters.temperature", "1e39", Some(("parameters.temperature", OUT_OF_RANGE))),
    ("parameters.temperature", r#""hot""#, Some(("parameters.temperature", WRONG_TYPE))),
    // top_k [0, 2^31-1]
    ("parameters.top_k", "0", None),
    ("parameters.top_k", "2147483647", None),
    ("parameters.top_k", "-1", Some(("parameters.top_k", OUT_OF_RANGE))),
    ("parameters.top_k", "2147483648", Some(("parameters.top_k", OUT_OF_RANGE))),
    // top_p (0, 1]
    ("parameters.top_p", "1", None),
    ("parameters.top_p", "0.000001", None),
    ("parameters.top_p", "0", Some(("parameters.top_p", OUT_OF_RANGE))),
    ("parameters.top_p", "1.0001", Some(("parameters.top_p", OUT_OF_RANGE))),
    // batch_size (0, 2^31-1]
    ("parameters.batch_size", "100", None),
    ("parameters.batch_size", "0", Some(("parameters.batch_size", OUT_OF_RANGE))),
    // typical_p (0, 1], and an explicit -1 is rejected
    ("parameters.typical_p", "0.5", None),
    ("parameters.typical_p", "1", None),
    ("parameters.typical_p", "-1", Some(("parameters.typical_p", OUT_OF_RANGE))),
    ("parameters.typical_p", "-1.0", Some(("parameters.typical_p", OUT_OF_RANGE))),
    ("parameters.typical_p", "0", Some(("parameters.typical_p", OUT_OF_RANGE))),
    ("parameters.watermark", "false", None),
    ("parameters.watermark", "0", Some(("parameters.watermark", WRONG_TYPE))),
    ("parameters.perf_stat", r#""no""#, Some(("parameters.perf_stat", WRONG_TYPE))),
    // priority [1, 5]
    ("parameters.priority", "1", None),
    ("parameters.priority", "5", None),
    ("parameters.priority", "0", Some(("parameters.priority", OUT_OF_RANGE))),
    ("parameters.priority", "6", Some(("parameters.priority", OUT_OF_RANGE))),
    // timeout (0, 3600]
    ("parameters.timeout", "1", None),
    ("parameters.timeout", "3600", None),
    ("parameters.timeout", "0", Some(("parameters.timeout", OUT_OF_RANGE))),
    ("parameters.timeout", "3601", Some(("parameters.timeout", OUT_OF_RANGE))),
    ("parameters.timeout", "1.5", Some(("parameters.timeout", WRONG_TYPE))),
    // unknown fields are ignored
    ("parameters.stop", r#"["x"]"#, None),
    ("whatever", "{}", None),
];

#[test]
fn field_table() {
    run_cases(Route::Generate, BASE, FIELDS);
}

#[test]
fn body_must_be_an_object() {
    let result = validate(Route::Generate, &parse("[1]"), None, &limits());
    assert_err(result, "body", WRONG_TYPE, "list body");
}

#[test]
fn defaults() {
    let p = ok(Route::Generate, BASE);
    assert_eq!(p.max_tokens, Some(20));
    assert_eq!(p.priority, 5);
    assert_eq!(p.timeout_s, Some(600.0));
    assert_eq!((p.n, p.best_of), (1, 1));
    assert_eq!(p.seed, None);
    assert_eq!(p.repetition_penalty, 1.0);
    // No sampling parameter and no do_sample: greedy (docs/decisions.md#when-generate-samples).
    assert!(p.is_greedy());
}

#[test]
fn do_sample_rule() {
    let base = parse(BASE);
    let run = |params: &str| {
        let body = with(&base, "parameters", parse(params));
        ok_with(Route::Generate, &body, None, &limits())
    };
    // Absent: sample when any sampling parameter departs from its neutral value.
    for params in [
        r#"{"temperature": 0.7}"#,
        r#"{"top_k": 5}"#,
        r#"{"top_p": 0.9}"#,
        r#"{"typical_p": 0.5}"#,
        r#"{"do_sample": true}"#,
    ] {
        assert!(!run(params).is_greedy(), "{params} should sample");
    }
    for params in [
        "{}",
        r#"{"temperature": 1.0}"#,
        r#"{"top_k": 0}"#,
        r#"{"top_k": 32000}"#,
        r#"{"top_p": 1}"#,
        r#"{"repetition_penalty": 1.3, "seed": 7}"#,
        r#"{"do_sample": false, "temperature": 0.7, "top_k": 5, "top_p": 0.5}"#,
    ] {
        let p = run(params);
        assert!(p.is_greedy(), "{params} should be greedy");
        assert_eq!(
            (p.top_k, p.top_p),
            (0, 1.0),
            "{params}: samplers off when greedy"
        );
    }
    // do_sample false keeps the repetition penalty; typical_p never reaches the sampler.
    let p = run(r#"{"do_sample": false, "repetition_penalty": 1.2, "typical_p": 0.3}"#);
    assert_eq!((p.repetition_penalty, p.typical_p), (1.2, 1.0));
    let p = run(r#"{"do_sample": true, "temperature": 0.5, "top_k": 40, "top_p": 0.9}"#);
    assert_eq!((p.temperature, p.top_k, p.top_p), (0.5, 40, 0.9));
    // top_k at or above the vocabulary means no restriction.
    assert_eq!(run(r#"{"do_sample": true, "top_k": 40000}"#).top_k, 0);
}

#[test]
fn scheduling_fields_and_seed() {
    let body = with(
        &parse(BASE),
        "parameters",
        parse(r#"{"priority": 1, "timeout": 30, "seed": 18446744073709551615}"#),
    );
    let p = ok_with(Route::Generate, &body, None, &limits());
    assert_eq!(
        (p.priority, p.timeout_s, p.seed),
        (1, Some(30.0), Some(u64::MAX))
    );
}

#[test]
fn output_cap_and_prompt_tokens() {
    let limits = limits(); // max_model_len 4096, max_input_tokens 3000, max_iter_times 1000
    let body = |max_new: u32| {
        with(
            &parse(BASE),
            "parameters.max_new_tokens",
            Raw::Int(max_new.into()),
        )
    };
    let cap = |max_new: u32, tokens: Option<u32>| {
        ok_with(Route::Generate, &body(max_new), tokens, &limits).max_tokens
    };
    assert_eq!(cap(500, None), Some(500));
    assert_eq!(cap(5000, None), Some(1000), "max_iter_times caps");
    assert_eq!(cap(500, Some(100)), Some(500));
    assert_eq!(cap(1000, Some(3000)), Some(1000));
    let long = Limits {
        max_input_tokens: 4095,
        ..limits.clone()
    };
    let cap_long = |tokens| ok_with(Route::Generate, &body(1000), Some(tokens), &long).max_tokens;
    assert_eq!(cap_long(3500), Some(596), "max_model_len - prompt caps");
    assert_eq!(cap_long(4095), Some(1));
    for (tokens, code) in [(3001, TOO_LONG), (0, EMPTY)] {
        let result = validate(Route::Generate, &body(10), Some(tokens), &limits);
        assert_err(result, "text_input", code, "prompt tokens");
    }
    let result = validate(Route::Generate, &body(10), Some(4096), &long);
    assert_err(result, "text_input", TOO_LONG, "maxSeqLen - 1");
}

#[test]
fn prompt_characters_are_code_points() {
    let limits = Limits {
        max_prompt_chars: 4,
        ..limits()
    };
    let body = |text: &str| with(&parse(BASE), "text_input", Raw::Str(text.into()));
    // Four CJK characters are 12 bytes but 4 characters.
    assert!(validate(Route::Generate, &body("你好世界"), None, &limits).is_ok());
    let result = validate(Route::Generate, &body("你好世界!"), None, &limits);
    assert_err(result, "text_input", TOO_LONG, "5 chars");
    // Text parts are joined before counting.
    let parts = parse(r#"[{"type": "text", "text": "ab"}, {"type": "text", "text": "cde"}]"#);
    let result = validate(
        Route::Generate,
        &with(&parse(BASE), "text_input", parts),
        None,
        &limits,
    );
    assert_err(result, "text_input", TOO_LONG, "joined parts");
}

#[test]
fn images_on_a_multimodal_model() {
    let limits = Limits {
        multimodal: true,
        ..limits()
    };
    let body = |parts: &str| with(&parse(BASE), "text_input", parse(parts));
    let one = r#"[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "/x.png"}]"#;
    assert!(validate(Route::Generate, &body(one), None, &limits).is_ok());
    let url = r#"[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "http://h/x.png"}}]"#;
    assert!(validate(Route::Generate, &body(url), None, &limits).is_ok());
    let cases = [
        (
            r#"[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "/x"}, {"type": "image_url", "image_url": "/y"}]"#,
            "text_input[2]",
            TOO_MANY,
        ),
        (
            r#"[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": ""}]"#,
            "text_input[1].image_url",
            EMPTY,
        ),
        (
            r#"[{"type": "text", "text": "a"}, {"type": "image_url"}]"#,
            "text_input[1].image_url",
            MISSING,
        ),
        (
            r#"[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"href": "/x"}}]"#,
            "text_input[1].image_url.url",
            MISSING,
        ),
        (
            r#"[{"type": "text", "text": "a"}, {"type": "audio_url", "audio_url": "/x.mp3"}]"#,
            "text_input[1].type",
            UNSUPPORTED_CONTENT_TYPE,
        ),
        (
            r#"[{"type": "image_url", "image_url": "/x.png"}]"#,
            "text_input",
            EMPTY,
        ),
    ];
    for (parts, param, code) in cases {
        let result = validate(Route::Generate, &body(parts), None, &limits);
        assert_err(result, param, code, parts);
    }
}
