//! Databricks chat, completions and embeddings (docs/api/databricks.md).

use super::{assert_err, limits, merge, ok_with, parse, run_cases, with, Case};
use crate::validate::codes::*;
use crate::validate::{validate, EndpointType, Limits, Route};

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "Hi"}]}"#;
const CMPL: &str = r#"{"prompt": "Once upon a time"}"#;

#[rustfmt::skip]
const CHAT_FIELDS: &[Case] = &[
    // no `model` needed: the endpoint decides
    ("max_tokens", "null", None),
    ("max_tokens", "1", None),
    ("max_tokens", "100000000000", None),
    ("max_tokens", "0", Some(("max_tokens", OUT_OF_RANGE))),
    ("max_tokens", "2.5", Some(("max_tokens", WRONG_TYPE))),
    ("stream", "false", None),
    // the `timeout` extra: seconds in (0, 3600], fractions allowed
    ("timeout", "0.5", None),
    ("timeout", "3600", None),
    ("timeout", "0", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", "3600.5", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", "-1", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", r#""10""#, Some(("timeout", WRONG_TYPE))),
    // temperature [0, 2]
    ("temperature", "0", None),
    ("temperature", "2", None),
    ("temperature", "2.01", Some(("temperature", OUT_OF_RANGE))),
    ("temperature", "-0.01", Some(("temperature", OUT_OF_RANGE))),
    // top_p [0, 1]
    ("top_p", "0", None),
    ("top_p", "1", None),
    ("top_p", "1.5", Some(("top_p", OUT_OF_RANGE))),
    // top_k null or > 0
    ("top_k", "null", None),
    ("top_k", "1", None),
    ("top_k", "0", Some(("top_k", OUT_OF_RANGE))),
    ("top_k", "-1", Some(("top_k", OUT_OF_RANGE))),
    ("stop", "[]", None),
    ("stop", r#""""#, Some(("stop", EMPTY))),
    ("n", "1", None),
    ("n", "128", None),
    ("n", "0", Some(("n", OUT_OF_RANGE))),
    ("n", "129", Some(("n", OUT_OF_RANGE))),
    ("logprobs", "true", None),
    ("top_logprobs", "0", Some(("top_logprobs", CONFLICT))),
    ("response_format", r#"{"type": "json_object"}"#, None),
    ("response_format", r#"{"type": "yaml"}"#, Some(("response_format.type", INVALID_VALUE))),
    // Databricks message rules
    ("messages", r#"[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]"#, None),
    ("messages", r#"[{"role": "user", "content": "u"}, {"role": "system", "content": "s"}]"#, Some(("messages[1].role", CONFLICT))),
    ("messages", r#"[{"role": "system", "content": "s"}, {"role": "system", "content": "t"}]"#, Some(("messages[1].role", CONFLICT))),
    ("messages", r#"[{"role": "user", "content": "u", "tool_call_id": "c"}]"#, Some(("messages[0].tool_call_id", CONFLICT))),
    ("messages", r#"[{"role": "user", "content": "u", "tool_call_id": ""}]"#, None),
    ("messages", r#"[{"role": "tool", "content": "r"}]"#, Some(("messages[0].tool_call_id", MISSING))),
    ("messages", r#"[{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#, None),
    ("messages", r#"[{"role": "user", "content": "u"}, {"role": "assistant", "content": "text", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#,
        Some(("messages[1].content", CONFLICT))),
    ("messages", r#"[{"role": "user", "content": "u"}, {"role": "assistant"}]"#, Some(("messages[1].content", MISSING))),
    ("messages", r#"[{"role": "user", "content": [{"type": "text", "text": "u"}]}]"#, None),
    ("messages", r#"[{"role": "user", "content": [{"type": "image_url", "image_url": "/x"}]}]"#,
        Some(("messages[0].content[0].type", UNSUPPORTED_CONTENT_TYPE))),
    // tools: properties <= 15 keys
    ("tools", r#"[{"type": "function", "function": {"name": "f"}}]"#, None),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}}]"#, None),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"properties": {"1":{},"2":{},"3":{},"4":{},"5":{},"6":{},"7":{},"8":{},"9":{},"10":{},"11":{},"12":{},"13":{},"14":{},"15":{},"16":{}}}}}]"#,
        Some(("tools[0].function.parameters.properties", TOO_MANY))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"properties": []}}}]"#,
        Some(("tools[0].function.parameters.properties", WRONG_TYPE))),
    ("tool_choice", r#""required""#, Some(("tool_choice", CONFLICT))),
];

#[test]
fn chat_field_table() {
    run_cases(Route::DatabricksChat, CHAT, CHAT_FIELDS);
}

#[test]
fn chat_tool_count() {
    let tool = |i| format!(r#"{{"type": "function", "function": {{"name": "f{i}"}}}}"#);
    let tools = |k| {
        parse(&format!(
            "[{}]",
            (0..k).map(tool).collect::<Vec<_>>().join(",")
        ))
    };
    let run = |k| {
        validate(
            Route::DatabricksChat,
            &with(&parse(CHAT), "tools", tools(k)),
            None,
            &limits(),
        )
    };
    assert!(run(32).is_ok());
    assert_err(run(33), "tools", TOO_MANY, "33 tools");
}

#[test]
fn chat_normalisation() {
    let run = |extra: &str| ok_with(Route::DatabricksChat, &merge(CHAT, extra), None, &limits());
    let p = run("{}");
    assert_eq!(
        p.max_tokens,
        Some(1000),
        "null max_tokens: capped by max_iter_times"
    );
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.logprobs),
        (1.0, 1.0, 0, None)
    );
    // temperature 0 and top_p 0 are greedy, also with n > 1
    // (docs/decisions.md#greedy-with-several-completions)
    for extra in [r#"{"temperature": 0, "n": 3}"#, r#"{"top_p": 0, "n": 2}"#] {
        let p = run(extra);
        assert!(p.is_greedy() && p.top_p == 1.0, "{extra}");
    }
    assert!(run(r#"{"top_k": 1}"#).is_greedy());
    assert_eq!(run(r#"{"top_k": 40000}"#).top_k, 0);
    assert_eq!(
        run(r#"{"logprobs": true, "top_logprobs": 2}"#).logprobs,
        Some(2)
    );
    assert_eq!(
        run(r#"{"max_tokens": 100000000000}"#).max_tokens,
        Some(1000)
    );
    assert_eq!(run(r#"{"max_tokens": 7}"#).max_tokens, Some(7));
    // Unknown to Databricks: ignored.
    assert_eq!(run(r#"{"seed": "x", "presence_penalty": 9}"#).seed, None);
    let long = Limits {
        max_input_tokens: 4095,
        ..limits()
    };
    let p = ok_with(Route::DatabricksChat, &parse(CHAT), Some(4000), &long);
    assert_eq!(
        p.max_tokens,
        Some(96),
        "null: min(max_iter_times, max_model_len - prompt)"
    );
}

#[test]
fn endpoint_type_rules() {
    let pay = Limits {
        databricks_endpoint_type: Some(EndpointType::PayPerToken),
        ..limits()
    };
    let provisioned = Limits {
        databricks_endpoint_type: Some(EndpointType::ProvisionedThroughput),
        ..limits()
    };
    let run = |route, base: &str, extra: &str, limits: &Limits| {
        validate(route, &merge(base, extra), None, limits)
    };
    for route in [Route::DatabricksChat, Route::DatabricksCompletions] {
        let base = if route == Route::DatabricksChat {
            CHAT
        } else {
            CMPL
        };
        assert_err(
            run(route, base, r#"{"n": 2}"#, &pay),
            "n",
            UNSUPPORTED,
            "n on pay-per-token",
        );
        assert!(
            run(route, base, r#"{"n": 1}"#, &pay).is_ok(),
            "the default never counts"
        );
        assert!(run(route, base, r#"{"n": 2}"#, &provisioned).is_ok());
        assert!(
            run(route, base, r#"{"n": 2}"#, &limits()).is_ok(),
            "unset type accepts both"
        );
    }
    let behaviour = |value: &str, limits: &Limits| {
        run(
            Route::DatabricksCompletions,
            CMPL,
            &format!(r#"{{"error_behavior": {value}}}"#),
            limits,
        )
    };
    assert!(behaviour(r#""truncate""#, &pay).is_ok());
    assert!(behaviour(r#""truncate""#, &limits()).is_ok());
    assert!(behaviour(r#""error""#, &provisioned).is_ok());
    assert_err(
        behaviour(r#""truncate""#, &provisioned),
        "error_behavior",
        UNSUPPORTED,
        "truncate",
    );
    assert_err(
        behaviour(r#""ignore""#, &limits()),
        "error_behavior",
        INVALID_VALUE,
        "ignore",
    );
}

#[rustfmt::skip]
const CMPL_FIELDS: &[Case] = &[
    ("prompt", r#"["a", "b"]"#, None),
    ("prompt", "null", Some(("prompt", MISSING))),
    ("prompt", "[]", Some(("prompt", EMPTY))),
    ("prompt", r#"["a", 1]"#, Some(("prompt[1]", WRONG_TYPE))),
    ("temperature", "2", None),
    ("temperature", "3", Some(("temperature", OUT_OF_RANGE))),
    ("top_p", "0", None),
    ("top_k", "0", Some(("top_k", OUT_OF_RANGE))),
    ("suffix", r#""""#, None),
    ("suffix", "1", Some(("suffix", WRONG_TYPE))),
    ("echo", r#""no""#, Some(("echo", WRONG_TYPE))),
    ("use_raw_prompt", "true", None),
    ("use_raw_prompt", "0", Some(("use_raw_prompt", WRONG_TYPE))),
    ("stop", r#"["\n"]"#, None),
];

#[test]
fn completions_field_table() {
    run_cases(Route::DatabricksCompletions, CMPL, CMPL_FIELDS);
}

#[test]
fn completions_truncate_cuts_instead_of_failing() {
    let long = Limits {
        max_input_tokens: 4095,
        ..limits()
    };
    let body = merge(CMPL, r#"{"error_behavior": "truncate", "max_tokens": 500}"#);
    let p = ok_with(Route::DatabricksCompletions, &body, Some(9000), &long);
    assert_eq!(
        p.max_tokens,
        Some(1),
        "the prompt is cut to 4095 tokens, leaving 1"
    );
    let body = merge(CMPL, r#"{"error_behavior": "error"}"#);
    let result = validate(Route::DatabricksCompletions, &body, Some(9000), &long);
    assert_err(result, "prompt", TOO_LONG, "error behaviour");
}

#[test]
fn embeddings() {
    let run =
        |body: &str, tokens| validate(Route::DatabricksEmbeddings, &parse(body), tokens, &limits());
    assert!(run(r#"{"input": "a"}"#, None).is_ok());
    assert!(run(
        r#"{"input": ["a", "b"], "instruction": "Represent this"}"#,
        Some(10)
    )
    .is_ok());
    #[rustfmt::skip]
    let rejected = [
        (r#"{}"#, "input", MISSING),
        (r#"{"input": ""}"#, "input", EMPTY),
        (r#"{"input": []}"#, "input", EMPTY),
        (r#"{"input": ["a", ""]}"#, "input[1]", EMPTY),
        (r#"{"input": 3}"#, "input", WRONG_TYPE),
        (r#"{"input": [1, 2]}"#, "input[0]", WRONG_TYPE),
        (r#"{"input": "a", "instruction": 1}"#, "instruction", WRONG_TYPE),
    ];
    for (body, param, code) in rejected {
        assert_err(run(body, None), param, code, body);
    }
    assert_err(
        run(r#"{"input": "a"}"#, Some(3001)),
        "input",
        TOO_LONG,
        "tokens",
    );
}

#[test]
fn chat_media_on_a_multimodal_model() {
    let mm = Limits {
        multimodal: true,
        ..limits()
    };
    let body = |parts: &str| {
        parse(&format!(
            r#"{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "a"}}, {parts}]}}]}}"#
        ))
    };
    let image = r#"{"type": "image_url", "image_url": {"url": "/m.png"}}"#;
    assert!(validate(Route::DatabricksChat, &body(image), None, &mm).is_ok());
    // A text-only model still refuses it, naming the part.
    let result = validate(Route::DatabricksChat, &body(image), None, &limits());
    assert_err(
        result,
        "messages[0].content[1].type",
        UNSUPPORTED_CONTENT_TYPE,
        "text-only",
    );
    let many = vec![image; 21].join(", ");
    let result = validate(Route::DatabricksChat, &body(&many), None, &mm);
    assert_err(
        result,
        "messages[0].content[21]",
        TOO_MANY,
        "21 media parts",
    );
}
