//! Bounded fuzzing of every route's validation: many random bodies, built from the routes' own
//! field names and hostile values (huge and non-finite numbers, deep nesting, lone
//! surrogate-like and control characters, giant lists, duplicate keys), must each come back as
//! a valid request or as `CoreError::Invalid` whose message names its field in backticks:
//! never a panic, never another error kind. `FERROLLM_FUZZ_CASES` raises the count per route
//! (`make fuzz`); plain `cargo test` runs a few thousand, seeded, so a failure reproduces.

use super::{limits, Raw};
use crate::error::CoreError;
use crate::fuzzing::{cases, Rng};
use crate::validate::{validate_request, Route};

/// Field names of every route (top level and nested), so random bodies reach deep rules.
const NAMES: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "image_url",
    "url",
    "prompt",
    "input",
    "text_input",
    "instruction",
    "truncate_prompt_tokens",
    "dimensions",
    "encoding_format",
    "parameters",
    "id",
    "max_tokens",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "best_of",
    "use_beam_search",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
    "stream",
    "details",
    "do_sample",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "timeout",
    "priority",
    "tools",
    "tool_choice",
    "function",
    "name",
    "arguments",
    "description",
    "response_format",
    "json_schema",
    "schema",
    "error_behavior",
    "prompt_logprobs",
    "allowed_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "tool_calls",
    "tool_call_id",
    "batch_size",
    "watermark",
    "input_ids",
    "beam_width",
    "end_id",
    "pad_id",
    "bad_words_list",
    "stop_words_list",
];

const ROUTES: &[Route] = &[
    Route::Generate,
    Route::Chat,
    Route::Completions,
    Route::DatabricksChat,
    Route::DatabricksCompletions,
    Route::DatabricksEmbeddings,
    Route::Embeddings,
    Route::Trt,
    Route::Offline,
];

fn string(rng: &mut Rng) -> String {
    const PIECES: &[&str] = &[
        "",
        "a",
        "Hello",
        "user",
        "assistant",
        "system",
        "tool",
        "text",
        "function",
        "auto",
        "none",
        "json_object",
        "json_schema",
        "truncate",
        "error",
        "\u{0}",
        "\u{fffd}",
        "\u{1f600}",
        "\u{202e}",
        "</s>",
        "<|im_end|>",
        "{{ x }}",
        "\\ud800",
        "\n",
        " ",
        "-1",
        "1e309",
    ];
    let mut s = String::new();
    for _ in 0..rng.below(4) {
        let piece: &&str = rng.pick(PIECES);
        s.push_str(piece);
    }
    if rng.below(50) == 0 {
        s.push_str(&"x".repeat(40_000)); // past the stop-string and id limits
    }
    s
}

fn number(rng: &mut Rng) -> Raw {
    const INTS: &[i128] = &[
        0,
        1,
        -1,
        2,
        5,
        20,
        128,
        129,
        3600,
        3601,
        2147483647,
        2147483648,
        -2147483649,
        u64::MAX as i128,
        u64::MAX as i128 + 1,
        i128::MAX,
        i128::MIN,
    ];
    const FLOATS: &[f64] = &[
        0.0,
        -0.0,
        0.5,
        1.0,
        1.5,
        2.0,
        2.01,
        1e-7,
        1e308,
        -1e308,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
        3600.5,
    ];
    if rng.below(2) == 0 {
        Raw::Int(*rng.pick(INTS))
    } else {
        Raw::Float(*rng.pick(FLOATS))
    }
}

fn value(rng: &mut Rng, depth: u32) -> Raw {
    let leaf = depth > 6 || rng.below(3) == 0;
    match rng.below(if leaf { 4 } else { 6 }) {
        0 => Raw::Null,
        1 => Raw::Bool(rng.below(2) == 0),
        2 => number(rng),
        3 => Raw::Str(string(rng)),
        4 if depth <= 1 && rng.below(40) == 0 => {
            // A giant list of small leaves (stops, token ids, prompts) near the top: giant
            // lists of giant items would test the allocator, not the validator.
            let item = if rng.below(2) == 0 {
                number(rng)
            } else {
                Raw::Str("ab".into())
            };
            Raw::List(vec![item; 5000])
        }
        4 => Raw::List((0..rng.below(4)).map(|_| value(rng, depth + 1)).collect()),
        _ => object(rng, depth + 1),
    }
}

fn object(rng: &mut Rng, depth: u32) -> Raw {
    let mut entries = Vec::new();
    for _ in 0..rng.below(8) {
        let name = rng.pick(NAMES).to_string();
        if rng.below(10) == 0 {
            entries.push((name.clone(), value(rng, depth))); // a duplicate key
        }
        entries.push((name, value(rng, depth)));
    }
    Raw::Map(entries)
}

/// A body the route accepts, as (name, value) pairs: random fields on top of it get past the
/// required-field checks to the deeper rules.
fn base(route: Route) -> Vec<(String, Raw)> {
    let text = |s: &str| Raw::Str(s.into());
    let chat = Raw::List(vec![Raw::Map(vec![
        ("role".into(), text("user")),
        ("content".into(), text("Hi")),
    ])]);
    let fields = match route {
        Route::Generate => vec![("text_input", text("Hi"))],
        Route::Chat => vec![("model", text("m")), ("messages", chat)],
        Route::Completions => vec![("model", text("m")), ("prompt", text("Hi"))],
        Route::DatabricksChat => vec![("messages", chat)],
        Route::DatabricksCompletions => vec![("prompt", text("Hi"))],
        Route::DatabricksEmbeddings => vec![("input", text("Hi"))],
        Route::Embeddings => vec![("model", text("m")), ("input", text("Hi"))],
        Route::Trt => vec![("input_ids", Raw::List(vec![Raw::Int(1), Raw::Int(2)]))],
        Route::Offline => vec![],
    };
    fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Random fields (MindIE's under `parameters` too), then the base fields they left out.
fn mutated(rng: &mut Rng, route: Route) -> Raw {
    let Raw::Map(mut entries) = object(rng, 1) else {
        unreachable!()
    };
    if route == Route::Generate && rng.below(2) == 0 {
        entries.push(("parameters".into(), object(rng, 1)));
    }
    for (name, value) in base(route) {
        if !entries.iter().any(|(n, _)| *n == name) {
            entries.push((name, value));
        }
    }
    Raw::Map(entries)
}

/// A deeply nested list: validation must not recurse into a stack overflow.
fn deep(depth: usize) -> Raw {
    let mut raw = Raw::Int(1);
    for _ in 0..depth {
        raw = Raw::List(vec![raw]);
    }
    raw
}

/// Validates `body`; whether it was accepted.
fn check(route: Route, body: &Raw, case: u64) -> bool {
    match validate_request(route, body, &limits()) {
        Ok(_) => true,
        Err(CoreError::Invalid { param, message, .. }) => {
            assert!(
                message.starts_with('`') && !message.is_empty(),
                "{route:?} case {case}: message does not name a field ({param}): {message}"
            );
            false
        }
        Err(other) => panic!("{route:?} case {case}: not a validation error: {other:?}"),
    }
}

#[test]
fn random_bodies_are_accepted_or_rejected_naming_the_field() {
    let cases = cases(2000);
    for &route in ROUTES {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ route as u64);
        let mut num_accepted = 0u64;
        for case in 0..cases {
            let body = match case % 10 {
                0 => value(&mut rng, 0), // not always an object
                1..=3 => object(&mut rng, 0),
                _ => mutated(&mut rng, route),
            };
            num_accepted += u64::from(check(route, &body, case));
        }
        println!("fuzz {route:?}: {cases} bodies, {num_accepted} accepted, the rest refused");
    }
}

#[test]
fn deep_nesting_in_every_field_is_refused_or_accepted_without_overflow() {
    for &route in ROUTES {
        for (case, name) in NAMES.iter().enumerate() {
            let body = Raw::Map(vec![(name.to_string(), deep(1_000))]);
            check(route, &body, case as u64);
        }
    }
}
