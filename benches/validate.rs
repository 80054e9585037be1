//! Criterion benches of request validation: a generate body (the sample
//! (docs/api/common.md#sample-bodies)), a typical chat body, and a chat body with a tool, each
//! validated with a prompt-token count.

use _core::validate::{validate, Limits, Raw, Route};
use criterion::{criterion_group, criterion_main, Criterion};

// The tests' JSON reader builds the bodies; it refers to `super::Raw`.
#[path = "../rust/validate/tests/json.rs"]
#[allow(dead_code)]
mod json;

const GENERATE: &str = r#"{"id": "a123", "text_input": "My name is Olivier and I",
  "parameters": {"details": true, "do_sample": true, "max_new_tokens": 20,
    "repetition_penalty": 1.1, "seed": 123, "temperature": 1, "top_k": 10, "top_p": 0.99,
    "batch_size": 100, "typical_p": 0.5, "watermark": false, "perf_stat": false,
    "priority": 5, "timeout": 10}}"#;

const CHAT: &str = r#"{"model": "qwen", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a haiku about the sea, in the style of Basho."}],
  "stream": true, "temperature": 0.7, "top_p": 0.9, "max_tokens": 256,
  "stop": ["\n\n", "User:"], "presence_penalty": 0.5, "seed": 42}"#;

const CHAT_TOOLS: &str = r#"{"model": "qwen", "messages": [
    {"role": "user", "content": "Where is my order 12345?"}],
  "tools": [{"type": "function", "function": {"name": "get_delivery_date",
    "description": "Get the delivery date for a customer's order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string",
      "description": "The customer's order ID."}}, "required": ["order_id"],
      "additionalProperties": false}}}],
  "tool_choice": "auto", "temperature": 0.5, "max_tokens": 512}"#;

fn bench_validate(c: &mut Criterion) {
    let limits = Limits {
        vocab_size: 151_936,
        ..Limits::default()
    };
    let mut group = c.benchmark_group("validate");
    for (name, route, body) in [
        ("generate", Route::Generate, GENERATE),
        ("chat", Route::Chat, CHAT),
        ("chat_tools", Route::Chat, CHAT_TOOLS),
    ] {
        let body = json::parse(body);
        validate(route, &body, Some(40), &limits).expect("a valid body");
        group.bench_function(name, |b| {
            b.iter(|| validate(route, std::hint::black_box(&body), Some(40), &limits))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_validate);
criterion_main!(benches);
