//! `ValidRequest`: the route switches one validation pass reads, the prompt-token rules applied
//! after tokenizing (`fit_prompt`: truncation, batch names, the cap), and the capability table.

use super::{limits, merge, parse};
use crate::error::CoreError;
use crate::validate::{check_capabilities, check_request, validate_request, Route, BUILT};

fn request(route: Route, body: &str) -> crate::validate::ValidRequest {
    validate_request(route, &parse(body), &limits()).expect("valid")
}

fn unsupported_param(result: Result<(), CoreError>) -> String {
    match result {
        Err(CoreError::Invalid {
            param,
            code: "unsupported",
            ..
        }) => param,
        other => panic!("expected an unsupported error, got {other:?}"),
    }
}

#[test]
fn switches_are_read_once_with_the_parameters() {
    let r = request(
        Route::Completions,
        r#"{"model": "m", "prompt": ["a", "b"], "stream": true, "echo": true, "max_tokens": 7}"#,
    );
    let s = &r.switches;
    assert!(s.stream && s.echo && s.is_batch);
    assert_eq!(s.model.as_deref(), Some("m"));
    assert_eq!(r.params.max_tokens, Some(7));
    let g = request(
        Route::Generate,
        r#"{"id": "c1", "text_input": "hi", "parameters": {"details": true}}"#,
    );
    assert!(g.switches.details && !g.switches.stream && !g.switches.is_batch);
    assert_eq!(g.switches.client_id.as_deref(), Some("c1"));
    let d = request(
        Route::DatabricksCompletions,
        r#"{"prompt": "x", "error_behavior": "truncate", "suffix": "!"}"#,
    );
    assert!(d.switches.truncate);
    assert_eq!(d.switches.suffix.as_deref(), Some("!"));
}

#[test]
fn fit_prompt_caps_output_and_names_the_batch_prompt() {
    let l = limits(); // max_model_len 4096, max_input_tokens 3000, max_iter_times 1000
    let r = request(
        Route::Completions,
        r#"{"model": "m", "prompt": ["a", "b"]}"#,
    );
    let (drop, p) = r.fit_prompt(3500 - 1000, Some(1), &l).unwrap();
    assert_eq!((drop, p.max_tokens), (0, Some(1000)));
    let wide = crate::validate::Limits {
        max_input_tokens: 4000,
        ..limits()
    };
    let (_, p) = r.fit_prompt(3500, Some(1), &wide).unwrap();
    assert_eq!(p.max_tokens, Some(4096 - 3500));
    match r.fit_prompt(3001, Some(1), &l) {
        Err(CoreError::Invalid { param, message, .. }) => {
            assert_eq!(param, "prompt[1]");
            assert!(
                message.starts_with("`prompt[1]` must be at most 3000 tokens"),
                "{message}"
            );
        }
        other => panic!("expected a prompt error, got {other:?}"),
    }
    // A single prompt is named without an index.
    let one = request(Route::Completions, r#"{"model": "m", "prompt": "a"}"#);
    match one.fit_prompt(0, Some(0), &l) {
        Err(CoreError::Invalid { param, .. }) => assert_eq!(param, "prompt"),
        other => panic!("expected a prompt error, got {other:?}"),
    }
}

#[test]
fn fit_prompt_truncates_from_the_left_only_when_asked() {
    let l = limits();
    let cut = request(
        Route::DatabricksCompletions,
        r#"{"prompt": "x", "error_behavior": "truncate", "max_tokens": 50}"#,
    );
    let (drop, p) = cut.fit_prompt(3500, None, &l).unwrap();
    assert_eq!(drop, 500, "keeps the last 3000 tokens");
    assert_eq!(p.max_tokens, Some(50));
    assert_eq!(cut.fit_prompt(10, None, &l).unwrap().0, 0);
    let keep = request(Route::DatabricksCompletions, r#"{"prompt": "x"}"#);
    assert!(keep.fit_prompt(3500, None, &l).is_err());
}

#[test]
fn the_capability_table_refuses_unbuilt_features_by_field() {
    let cases = [(
        Route::Completions,
        r#"{"model": "m", "prompt": "a", "suffix": "z"}"#,
        "suffix",
    )];
    for (route, body, field) in cases {
        // Refused by validation itself: the one place the table is consulted.
        let result = validate_request(route, &parse(body), &limits()).map(|_| ());
        assert_eq!(unsupported_param(result), field, "{body}");
    }
    let json_mode = request(
        Route::Chat,
        r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#,
    );
    assert!(check_request(&json_mode, &BUILT).is_ok());
    let grammar = json_mode.switches.grammar.expect("a grammar");
    assert_eq!(
        (grammar.kind, grammar.field.as_str()),
        (crate::grammar::GrammarKind::JsonObject, "response_format")
    );
    let served = [
        (
            Route::Chat,
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}"#,
        ),
        (
            Route::Completions,
            r#"{"model": "m", "prompt": "a", "echo": true, "best_of": 1}"#,
        ),
        (
            Route::Completions,
            r#"{"model": "m", "prompt": "a", "use_beam_search": true, "n": 2, "best_of": 4}"#,
        ),
        (
            Route::Completions,
            r#"{"model": "m", "prompt": "a", "n": 2, "best_of": 5, "temperature": 1}"#,
        ),
        (
            Route::Completions,
            r#"{"model": "m", "prompt": "a", "echo": true, "logprobs": 1}"#,
        ),
        (
            Route::DatabricksCompletions,
            r#"{"prompt": "a", "suffix": "z", "echo": true}"#,
        ),
        (
            Route::DatabricksEmbeddings,
            r#"{"input": ["x", "y"], "instruction": "Represent this:"}"#,
        ),
        (
            Route::Chat,
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none", "response_format": {"type": "text"}}"#,
        ),
    ];
    for (route, body) in served {
        assert!(
            check_request(&request(route, body), &BUILT).is_ok(),
            "{body}"
        );
    }
    let offline = request(Route::Offline, r#"{"use_beam_search": true, "n": 2}"#);
    assert!(check_capabilities(&offline.params, &BUILT).is_ok());
    let best_of = request(Route::Offline, r#"{"n": 1, "best_of": 2}"#);
    assert!(check_capabilities(&best_of.params, &BUILT).is_ok());
}

#[test]
fn validate_equals_the_request_path() {
    let l = crate::validate::Limits {
        max_input_tokens: 4000,
        ..limits()
    };
    let body = merge(
        r#"{"model": "m", "prompt": "a"}"#,
        r#"{"max_tokens": 900, "min_tokens": 800}"#,
    );
    let r = validate_request(Route::Completions, &body, &l).unwrap();
    let p = crate::validate::validate(Route::Completions, &body, Some(3500), &l).unwrap();
    assert_eq!(r.with_prompt_tokens(Some(3500), None, &l).unwrap(), p);
    assert_eq!((p.max_tokens, p.min_tokens), (Some(596), 596));
}

#[test]
fn response_format_is_read_only_where_the_api_has_it_and_checked_there() {
    let bad = r#"{"model": "m", "prompt": "a", "response_format": {"type": "yaml"}}"#;
    match validate_request(Route::Completions, &parse(bad), &limits()) {
        Err(CoreError::Invalid { param, code, .. }) => {
            assert_eq!(
                (param.as_str(), code),
                ("response_format.type", "invalid_value")
            );
        }
        other => panic!("an unknown response_format type was accepted: {other:?}"),
    }
    let json = r#"{"model": "m", "prompt": "a", "response_format": {"type": "json_object"}}"#;
    assert!(request(Route::Completions, json).switches.grammar.is_some());
    // MindIE generate and Databricks completions have no such field: it is an unknown field,
    // ignored like any other, never turned into a grammar nobody enforces.
    let generate = r#"{"text_input": "a", "response_format": {"type": "json_object"}}"#;
    assert!(request(Route::Generate, generate)
        .switches
        .grammar
        .is_none());
    let dbx = r#"{"prompt": "a", "response_format": {"type": "json_object"}}"#;
    assert!(request(Route::DatabricksCompletions, dbx)
        .switches
        .grammar
        .is_none());
}
