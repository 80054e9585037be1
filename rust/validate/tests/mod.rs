//! Table-driven tests of request validation: for every route, each rule's accepted boundary
//! values and rejected ones (asserting the param path and code), defaults, normalisations,
//! the output-cap arithmetic, and the vendor documents' sample bodies
//! (docs/api/common.md#sample-bodies).

mod chat;
mod completions;
mod databricks;
mod embeddings;
mod fuzz;
mod generate;
mod json;
mod limits;
mod offline;
mod prompt_logprobs;
mod raw;
mod request;
mod samples;
mod spec_bodies;
mod trt;

use super::{validate, Limits, Raw, Route};
use crate::error::CoreError;
use crate::params::SamplingParams;

pub(super) use json::parse;

/// Limits with a known vocabulary and small, distinct lengths so the cap arithmetic shows.
pub(super) fn limits() -> Limits {
    Limits {
        max_model_len: 4096,
        max_input_tokens: 3000,
        max_iter_times: 1000,
        vocab_size: 32000,
        ..Limits::default()
    }
}

/// Validates a JSON body with [`limits`] and no prompt count; panics on an error.
pub(super) fn ok(route: Route, body: &str) -> SamplingParams {
    ok_with(route, &parse(body), None, &limits())
}

/// Validates a body; panics with the error on failure.
pub(super) fn ok_with(
    route: Route,
    body: &Raw,
    tokens: Option<u32>,
    limits: &Limits,
) -> SamplingParams {
    validate(route, body, tokens, limits)
        .unwrap_or_else(|e| panic!("{route:?} rejected a valid body: {e:?}\n{body:?}"))
}

/// Asserts that validation fails on `param` with `code`, and that the message names the
/// param in backticks.
pub(super) fn assert_err(
    result: Result<SamplingParams, CoreError>,
    param: &str,
    code: &str,
    context: &str,
) {
    match result {
        Err(CoreError::Invalid {
            param: got,
            code: got_code,
            message,
        }) => {
            assert_eq!(
                (got.as_str(), got_code),
                (param, code),
                "{context}: {message}"
            );
            assert!(
                message.starts_with(&format!("`{param}`")),
                "{context}: message does not name the field: {message}"
            );
        }
        other => panic!("{context}: expected an error on `{param}` ({code}), got {other:?}"),
    }
}

/// `body` with the value at a dotted `path` (object keys only) replaced by `value`; missing
/// objects on the way are created.
pub(super) fn with(body: &Raw, path: &str, value: Raw) -> Raw {
    let mut out = body.clone();
    set(&mut out, path, value);
    out
}

fn set(target: &mut Raw, path: &str, value: Raw) {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    let Raw::Map(entries) = target else {
        panic!("cannot set {path} on {target:?}");
    };
    let slot = match entries.iter().position(|(k, _)| k == head) {
        Some(i) => &mut entries[i].1,
        None => {
            entries.push((head.to_string(), Raw::Map(Vec::new())));
            &mut entries.last_mut().expect("just pushed").1
        }
    };
    match rest {
        Some(rest) => set(slot, rest, value),
        None => *slot = value,
    }
}

/// The JSON object `base` with the top-level members of the JSON object `extra` set on it.
pub(super) fn merge(base: &str, extra: &str) -> Raw {
    let mut body = parse(base);
    let Raw::Map(entries) = parse(extra) else {
        panic!("extra must be an object: {extra}");
    };
    for (key, value) in entries {
        body = with(&body, &key, value);
    }
    body
}

/// One row of a field table: set `path` to the JSON `value`; `None` expects acceptance,
/// `Some((param, code))` the error.
pub(super) type Case = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
);

/// Runs a field table against `base` (a valid body) on `route`.
pub(super) fn run_cases(route: Route, base: &str, cases: &[Case]) {
    let base = parse(base);
    let limits = limits();
    for &(path, value, expected) in cases {
        let body = with(&base, path, parse(value));
        let result = validate(route, &body, None, &limits);
        let context = format!("{route:?} {path} = {value}");
        match expected {
            None => assert!(result.is_ok(), "{context}: rejected: {result:?}"),
            Some((param, code)) => assert_err(result, param, code, &context),
        }
    }
}
