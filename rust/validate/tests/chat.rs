//! MindIE `/v1/chat/completions` (docs/api/openai.md#chat-completions), including the shared stop
//! rules (docs/api/common.md#stop-conditions) and the vLLM extras.

use super::{assert_err, limits, merge, ok, ok_with, parse, run_cases, with, Case};
use crate::validate::codes::*;
use crate::validate::{validate, Limits, Route};

const BASE: &str = r#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}"#;

#[rustfmt::skip]
const FIELDS: &[Case] = &[
    ("model", "null", Some(("model", MISSING))),
    ("model", "3", Some(("model", WRONG_TYPE))),
    ("stream", "true", None),
    ("stream", r#""yes""#, Some(("stream", WRONG_TYPE))),
    // penalties
    ("presence_penalty", "-2", None),
    ("presence_penalty", "2.0", None),
    ("presence_penalty", "2.01", Some(("presence_penalty", OUT_OF_RANGE))),
    ("frequency_penalty", "-2.5", Some(("frequency_penalty", OUT_OF_RANGE))),
    ("repetition_penalty", "2", None),
    ("repetition_penalty", "0.001", None),
    ("repetition_penalty", "0", Some(("repetition_penalty", OUT_OF_RANGE))),
    ("repetition_penalty", "2.1", Some(("repetition_penalty", OUT_OF_RANGE))),
    // temperature >= 0, no upper bound
    ("temperature", "0", None),
    ("temperature", "100", None),
    ("temperature", "-0.1", Some(("temperature", OUT_OF_RANGE))),
    // top_p (0, 1]
    ("top_p", "1", None),
    ("top_p", "0", Some(("top_p", OUT_OF_RANGE))),
    // top_k -1 or (0, 2^31-1]; 0 rejected
    ("top_k", "-1", None),
    ("top_k", "1", None),
    ("top_k", "2147483647", None),
    ("top_k", "0", Some(("top_k", OUT_OF_RANGE))),
    ("top_k", "-2", Some(("top_k", OUT_OF_RANGE))),
    ("top_k", "2147483648", Some(("top_k", OUT_OF_RANGE))),
    ("top_k", "1.5", Some(("top_k", WRONG_TYPE))),
    // the `timeout` extra: seconds in (0, 3600], fractions allowed
    ("timeout", "0.5", None),
    ("timeout", "3600", None),
    ("timeout", "0", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", "3600.5", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", "-1", Some(("timeout", OUT_OF_RANGE))),
    ("timeout", r#""10""#, Some(("timeout", WRONG_TYPE))),
    // seed [0, 2^64-1]: 0 allowed here
    ("seed", "0", None),
    ("seed", "18446744073709551615", None),
    ("seed", "-1", Some(("seed", OUT_OF_RANGE))),
    ("seed", "18446744073709551616", Some(("seed", OUT_OF_RANGE))),
    // max_tokens (0, 2^31-1]
    ("max_tokens", "1", None),
    ("max_tokens", "2147483647", None),
    ("max_tokens", "0", Some(("max_tokens", OUT_OF_RANGE))),
    // stop: string or list, each >= 1 char, total <= 32768
    ("stop", r#""x""#, None),
    ("stop", "[]", None),
    ("stop", r#"["a", "b"]"#, None),
    ("stop", r#""""#, Some(("stop", EMPTY))),
    ("stop", r#"["a", ""]"#, Some(("stop[1]", EMPTY))),
    ("stop", r#"["a", null]"#, Some(("stop[1]", WRONG_TYPE))),
    ("stop", r#"["a", 3]"#, Some(("stop[1]", WRONG_TYPE))),
    ("stop", "7", Some(("stop", WRONG_TYPE))),
    // stop_token_ids: null elements rejected, out-of-range ones dropped
    ("stop_token_ids", "[2, 13]", None),
    ("stop_token_ids", "[2, -1, 4294967296, 99999]", None),
    ("stop_token_ids", "[2, null]", Some(("stop_token_ids[1]", WRONG_TYPE))),
    ("stop_token_ids", r#"["2"]"#, Some(("stop_token_ids[0]", WRONG_TYPE))),
    ("stop_token_ids", "2", Some(("stop_token_ids", WRONG_TYPE))),
    ("include_stop_str_in_output", "true", None),
    ("include_stop_str_in_output", "1", Some(("include_stop_str_in_output", WRONG_TYPE))),
    ("skip_special_tokens", "false", None),
    ("skip_special_tokens", "0", Some(("skip_special_tokens", WRONG_TYPE))),
    ("ignore_eos", r#""false""#, Some(("ignore_eos", WRONG_TYPE))),
    // n [1, 128]; n > 1 needs temperature > 0
    ("n", "128", None),
    ("n", "0", Some(("n", OUT_OF_RANGE))),
    ("n", "129", Some(("n", OUT_OF_RANGE))),
    // logprobs / top_logprobs
    ("logprobs", "true", None),
    ("logprobs", "1", Some(("logprobs", WRONG_TYPE))),
    ("top_logprobs", "2", Some(("top_logprobs", CONFLICT))),
    // vLLM extras
    ("min_p", "0", None),
    ("min_p", "1", None),
    ("min_p", "1.1", Some(("min_p", OUT_OF_RANGE))),
    ("min_tokens", "5", None),
    ("min_tokens", "-1", Some(("min_tokens", OUT_OF_RANGE))),
    ("logit_bias", r#"{"5": -100, "7": 100}"#, None),
    ("logit_bias", r#"{"5": 101}"#, Some(("logit_bias.5", OUT_OF_RANGE))),
    ("logit_bias", r#"{"x": 1}"#, Some(("logit_bias.x", INVALID_FORMAT))),
    ("logit_bias", r#"{"32000": 1}"#, Some(("logit_bias.32000", OUT_OF_RANGE))),
    ("logit_bias", r#"{"5": 1, "05": 2}"#, Some(("logit_bias", CONFLICT))),
    ("logit_bias", r#"{"5": "1"}"#, Some(("logit_bias.5", WRONG_TYPE))),
    ("logit_bias", "[1]", Some(("logit_bias", WRONG_TYPE))),
    ("allowed_token_ids", "[3, 1, 3]", None),
    ("allowed_token_ids", "[]", Some(("allowed_token_ids", EMPTY))),
    ("allowed_token_ids", "[1, 32000]", Some(("allowed_token_ids[1]", OUT_OF_RANGE))),
    ("spaces_between_special_tokens", "null", None),
    ("spaces_between_special_tokens", "2", Some(("spaces_between_special_tokens", WRONG_TYPE))),
    // response_format
    ("chat_template_kwargs", r#"{"enable_thinking": false}"#, None),
    ("chat_template_kwargs", "{}", None),
    ("chat_template_kwargs", r#"["enable_thinking"]"#, Some(("chat_template_kwargs", WRONG_TYPE))),
    ("chat_template_kwargs", "true", Some(("chat_template_kwargs", WRONG_TYPE))),
    ("response_format", r#"{"type": "text"}"#, None),
    ("response_format", r#"{"type": "json_object"}"#, None),
    ("response_format", r#"{"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": true}}"#, None),
    ("response_format", r#"{"type": "xml"}"#, Some(("response_format.type", INVALID_VALUE))),
    ("response_format", r#"{}"#, Some(("response_format.type", MISSING))),
    ("response_format", r#"{"type": "json_schema"}"#, Some(("response_format.json_schema", MISSING))),
    ("response_format", r#"{"type": "json_schema", "json_schema": {"schema": {}}}"#, Some(("response_format.json_schema.name", MISSING))),
    ("response_format", r#"{"type": "json_schema", "json_schema": {"name": "o"}}"#, Some(("response_format.json_schema.schema", MISSING))),
    ("response_format", r#""json""#, Some(("response_format", WRONG_TYPE))),
];

#[test]
fn field_table() {
    run_cases(Route::Chat, BASE, FIELDS);
}

#[rustfmt::skip]
const MESSAGES: &[Case] = &[
    ("messages", "null", Some(("messages", MISSING))),
    ("messages", "[]", Some(("messages", EMPTY))),
    ("messages", r#"{"role": "user"}"#, Some(("messages", WRONG_TYPE))),
    ("messages", r#"["hi"]"#, Some(("messages[0]", WRONG_TYPE))),
    ("messages", r#"[{"content": "hi"}]"#, Some(("messages[0].role", MISSING))),
    ("messages", r#"[{"role": "bot", "content": "hi"}]"#, Some(("messages[0].role", INVALID_VALUE))),
    ("messages", r#"[{"role": "user"}]"#, Some(("messages[0].content", MISSING))),
    ("messages", r#"[{"role": "user", "content": ""}]"#, Some(("messages[0].content", EMPTY))),
    ("messages", r#"[{"role": "user", "content": 5}]"#, Some(("messages[0].content", WRONG_TYPE))),
    ("messages", r#"[{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]"#, None),
    // MindIE has no system-position rule (the template decides,
    // docs/decisions.md#system-message-position).
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "system", "content": "s"}, {"role": "system", "content": "t"}]"#, None),
    ("messages", r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "/x.png"}]}]"#,
        Some(("messages[0].content[1].type", UNSUPPORTED_CONTENT_TYPE))),
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "audio_url", "audio_url": "/a.mp3"}]}]"#,
        Some(("messages[1].content[0].type", UNSUPPORTED_CONTENT_TYPE))),
    ("messages", r#"[{"role": "user", "content": [{"type": "file", "file": "/a"}]}]"#,
        Some(("messages[0].content[0].type", INVALID_VALUE))),
    ("messages", r#"[{"role": "user", "content": []}]"#, Some(("messages[0].content", EMPTY))),
    // assistant with tool_calls may leave content out, null or ""; MindIE also takes text
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#, None),
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]"#, None),
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#, None),
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": "t", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#, None),
    ("messages", r#"[{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": []}]"#, Some(("messages[1].content", MISSING))),
    ("messages", r#"[{"role": "user", "content": "a", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#,
        Some(("messages[0].tool_calls", CONFLICT))),
    ("messages", r#"[{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#,
        Some(("messages[0].tool_calls[0].id", MISSING))),
    ("messages", r#"[{"role": "assistant", "tool_calls": [{"id": "c", "type": "tool", "function": {"name": "f", "arguments": "{}"}}]}]"#,
        Some(("messages[0].tool_calls[0].type", INVALID_VALUE))),
    ("messages", r#"[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}]"#,
        Some(("messages[0].tool_calls[0].function.arguments", MISSING))),
    ("messages", r#"[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": 3}}]}]"#,
        Some(("messages[0].tool_calls[0].function.arguments", WRONG_TYPE))),
    ("messages", r#"[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "", "arguments": "{}"}}]}]"#,
        Some(("messages[0].tool_calls[0].function.name", EMPTY))),
    // tool messages need tool_call_id; MindIE ignores it elsewhere
    // (docs/decisions.md#tool-call-ids-on-other-roles)
    ("messages", r#"[{"role": "tool", "content": "r", "tool_call_id": "c1"}]"#, None),
    ("messages", r#"[{"role": "tool", "content": "r"}]"#, Some(("messages[0].tool_call_id", MISSING))),
    ("messages", r#"[{"role": "tool", "content": "r", "tool_call_id": ""}]"#, Some(("messages[0].tool_call_id", EMPTY))),
    ("messages", r#"[{"role": "user", "content": "r", "tool_call_id": "c1"}]"#, None),
];

#[test]
fn message_table() {
    run_cases(Route::Chat, BASE, MESSAGES);
}

/// A body with one tool, `get`.
const WITH_TOOL: &str = r#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}],
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object",
        "properties": {"id": {"type": "string"}}, "required": ["id"]}}}]}"#;

#[rustfmt::skip]
const TOOLS: &[Case] = &[
    ("tool_choice", r#""none""#, None),
    ("tool_choice", r#""auto""#, None),
    ("tool_choice", r#""required""#, None),
    ("tool_choice", r#"{"type": "function", "function": {"name": "get"}}"#, None),
    ("tool_choice", r#""any""#, Some(("tool_choice", INVALID_VALUE))),
    ("tool_choice", r#"{"type": "function", "function": {"name": "put"}}"#, Some(("tool_choice.function.name", INVALID_VALUE))),
    ("tool_choice", r#"{"type": "function"}"#, Some(("tool_choice.function", MISSING))),
    ("tool_choice", "3", Some(("tool_choice", WRONG_TYPE))),
    ("tools", r#"[{"type": "retrieval", "function": {"name": "f"}}]"#, Some(("tools[0].type", INVALID_VALUE))),
    ("tools", r#"[{"type": "function"}]"#, Some(("tools[0].function", MISSING))),
    ("tools", r#"[{"type": "function", "function": {}}]"#, Some(("tools[0].function.name", MISSING))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "description": {"a": 1}}}]"#, Some(("tools[0].function.description", WRONG_TYPE))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "strict": "yes"}}]"#, Some(("tools[0].function.strict", WRONG_TYPE))),
    ("tools", r#"[{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]"#, Some(("tools[1].function.name", CONFLICT))),
    // MindIE `parameters` rules (docs/decisions.md#function-parameters)
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"properties": {}, "required": []}}}]"#, Some(("tools[0].function.parameters.type", MISSING))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "array", "properties": {}, "required": []}}}]"#, Some(("tools[0].function.parameters.type", INVALID_VALUE))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": []}}}]"#, Some(("tools[0].function.parameters.properties", MISSING))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": 1}, "required": []}}}]"#, Some(("tools[0].function.parameters.properties.a", WRONG_TYPE))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]"#, Some(("tools[0].function.parameters.required", MISSING))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}, "required": [1]}}}]"#, Some(("tools[0].function.parameters.required[0]", WRONG_TYPE))),
    ("tools", r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": "no"}}}]"#, Some(("tools[0].function.parameters.additionalProperties", WRONG_TYPE))),
];

#[test]
fn tools_and_tool_choice() {
    run_cases(Route::Chat, WITH_TOOL, TOOLS);
}

#[rustfmt::skip]
const NO_TOOLS: &[Case] = &[
    // "required" or a named choice without tools (docs/decisions.md#the-default-tool-choice);
    // "none" and "auto" are fine.
    ("tool_choice", r#""none""#, None),
    ("tool_choice", r#""auto""#, None),
    ("tool_choice", r#""required""#, Some(("tool_choice", CONFLICT))),
    ("tool_choice", r#"{"type": "function", "function": {"name": "get"}}"#, Some(("tool_choice", CONFLICT))),
    ("tools", "[]", None),
];

#[test]
fn tool_choice_without_tools_and_no_count_limit() {
    run_cases(Route::Chat, BASE, NO_TOOLS);
    // No tool-count limit on MindIE (docs/decisions.md#how-many-tools).
    let tool = |i| format!(r#"{{"type": "function", "function": {{"name": "f{i}"}}}}"#);
    let many = format!("[{}]", (0..40).map(tool).collect::<Vec<_>>().join(","));
    let body = with(&parse(BASE), "tools", parse(&many));
    assert!(validate(Route::Chat, &body, None, &limits()).is_ok());
}

/// Validates `BASE` with the extra top-level fields of the JSON object `extra`.
fn chat(extra: &str) -> crate::params::SamplingParams {
    ok_with(Route::Chat, &merge(BASE, extra), None, &limits())
}

#[test]
fn defaults() {
    let p = ok(Route::Chat, BASE);
    assert_eq!(
        p.max_tokens,
        Some(1000),
        "default max_tokens is max_iter_times"
    );
    let sampling = (p.temperature, p.top_p, p.top_k, p.n, p.best_of);
    assert_eq!(sampling, (1.0, 1.0, 0, 1, 1));
    assert!(p.skip_special_tokens && !p.ignore_eos && p.logprobs.is_none() && p.seed.is_none());
}

#[test]
fn stops_and_top_k_normalisation() {
    let p = chat(
        r#"{"top_k": -1, "seed": 0, "stop": "x", "stop_token_ids": [2, -1, 4294967296, 32000, 13],
            "include_stop_str_in_output": true}"#,
    );
    assert_eq!((p.top_k, p.seed), (0, Some(0)));
    assert_eq!(p.stop, vec!["x".to_string()]);
    assert_eq!(
        p.stop_token_ids,
        vec![2, 13],
        "out-of-range ids are dropped"
    );
    assert!(p.include_stop_str_in_output);
    // include_stop_str_in_output is ignored without stop or stop_token_ids (also if all dropped).
    let p = chat(r#"{"include_stop_str_in_output": true, "stop": []}"#);
    assert!(!p.include_stop_str_in_output);
    let p = chat(r#"{"include_stop_str_in_output": true, "stop_token_ids": [-5]}"#);
    assert!(!p.include_stop_str_in_output);
    assert_eq!(
        chat(r#"{"top_k": 40000}"#).top_k,
        0,
        "top_k >= vocab is off"
    );
    // temperature 0 is greedy; the truncation samplers are switched off, penalties stay.
    let p = chat(
        r#"{"temperature": 0, "top_p": 0.5, "top_k": 5, "min_p": 0.2, "repetition_penalty": 1.5}"#,
    );
    assert!(p.is_greedy());
    assert_eq!(
        (p.top_p, p.top_k, p.min_p, p.repetition_penalty),
        (1.0, 0, 0.0, 1.5)
    );
}

#[test]
fn logprobs_and_extras() {
    assert_eq!(chat(r#"{"logprobs": true}"#).logprobs, Some(0));
    assert_eq!(
        chat(r#"{"logprobs": true, "top_logprobs": 20}"#).logprobs,
        Some(20)
    );
    assert_eq!(chat(r#"{"logprobs": false}"#).logprobs, None);
    let run = |extra: &str| validate(Route::Chat, &merge(BASE, extra), None, &limits());
    let result = run(r#"{"logprobs": true, "top_logprobs": 21}"#);
    assert_err(result, "top_logprobs", OUT_OF_RANGE, "21");
    let p = chat(
        r#"{"logit_bias": {"9": 1.5, "2": -3}, "allowed_token_ids": [9, 2, 9], "min_tokens": 3,
            "max_tokens": 3}"#,
    );
    assert_eq!(p.logit_bias, vec![(2, -3.0), (9, 1.5)]);
    assert_eq!(p.allowed_token_ids, Some(vec![2, 9]));
    assert_eq!((p.min_tokens, p.max_tokens), (3, Some(3)));
    let result = run(r#"{"min_tokens": 4, "max_tokens": 3}"#);
    assert_err(result, "min_tokens", OUT_OF_RANGE, "min > max");
}

#[test]
fn n_needs_sampling() {
    let run = |extra: &str| validate(Route::Chat, &merge(BASE, extra), None, &limits());
    assert_eq!(run(r#"{"n": 3}"#).unwrap().n, 3);
    assert_eq!(run(r#"{"n": 3, "temperature": 0.5}"#).unwrap().best_of, 3);
    assert!(run(r#"{"n": 1, "temperature": 0}"#).is_ok());
    assert_err(
        run(r#"{"n": 2, "temperature": 0}"#),
        "temperature",
        CONFLICT,
        "n 2 greedy",
    );
}

#[test]
fn multimodal_chat() {
    let mm = Limits {
        multimodal: true,
        ..limits()
    };
    let part = |ty: &str| format!(r#"{{"type": "{ty}", "{ty}": "/m"}}"#);
    let msg = |parts: Vec<String>| {
        format!(
            r#"{{"model": "m", "messages": [{{"role": "user", "content": [{{"type": "text", "text": "a"}}, {}]}}]}}"#,
            parts.join(", ")
        )
    };
    let all = vec![part("image_url"), part("video_url"), part("audio_url")];
    assert!(validate(Route::Chat, &parse(&msg(all)), None, &mm).is_ok());
    let twenty: Vec<String> = (0..20).map(|_| part("image_url")).collect();
    assert!(validate(Route::Chat, &parse(&msg(twenty.clone())), None, &mm).is_ok());
    let mut twenty_one = twenty;
    twenty_one.push(part("video_url"));
    let result = validate(Route::Chat, &parse(&msg(twenty_one)), None, &mm);
    assert_err(
        result,
        "messages[0].content[21]",
        TOO_MANY,
        "21 media parts",
    );
    // The limit counts across messages too.
    let images = |k: usize| {
        (0..k)
            .map(|_| part("image_url"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let two_messages = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": [{}]}}, {{"role": "user", "content": [{{"type": "text", "text": "a"}}, {}]}}]}}"#,
        images(10),
        images(11)
    );
    let result = validate(Route::Chat, &parse(&two_messages), None, &mm);
    assert_err(
        result,
        "messages[1].content[11]",
        TOO_MANY,
        "10 + 11 media parts",
    );
    // A message of media alone is content (the request still has text elsewhere).
    let media_only = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": [{}]}}, {{"role": "user", "content": "what is this?"}}]}}"#,
        images(1)
    );
    assert!(validate(Route::Chat, &parse(&media_only), None, &mm).is_ok());
    let url = r#"{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}"#;
    assert!(validate(Route::Chat, &parse(&msg(vec![url.to_string()])), None, &mm).is_ok());
    let p = ok_with(
        Route::Chat,
        &parse(&msg(vec![part("image_url")])),
        Some(100),
        &mm,
    );
    assert_eq!(p.max_tokens, Some(1000));
}

#[test]
fn prompt_chars_and_tokens_cover_all_messages() {
    let small = Limits {
        max_prompt_chars: 5,
        ..limits()
    };
    let body = parse(
        r#"{"model": "m", "messages": [{"role": "system", "content": "abc"}, {"role": "user", "content": [{"type": "text", "text": "de"}]}]}"#,
    );
    assert!(validate(Route::Chat, &body, None, &small).is_ok());
    let body = with(
        &body,
        "messages",
        parse(r#"[{"role": "system", "content": "abc"}, {"role": "user", "content": "def"}]"#),
    );
    assert_err(
        validate(Route::Chat, &body, None, &small),
        "messages",
        TOO_LONG,
        "6 chars",
    );
    assert_err(
        validate(Route::Chat, &body, Some(3001), &limits()),
        "messages",
        TOO_LONG,
        "tokens",
    );
    let p = ok_with(
        Route::Chat,
        &with(&body, "max_tokens", parse("2000")),
        Some(3000),
        &limits(),
    );
    assert_eq!(
        p.max_tokens,
        Some(1000),
        "min(2000, max_iter_times 1000, 4096 - 3000)"
    );
    let tight = Limits {
        max_iter_times: 5000,
        ..limits()
    };
    let p = ok_with(
        Route::Chat,
        &with(&body, "max_tokens", parse("2000")),
        Some(3000),
        &tight,
    );
    assert_eq!(p.max_tokens, Some(1096), "max_model_len - prompt");
}
