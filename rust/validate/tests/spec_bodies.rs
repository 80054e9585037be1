//! The vendor documents' sample request bodies (docs/api/common.md#sample-bodies), verbatim, are
//! accepted with the documented meaning.

/// MindIE generate_stream's text-only sample (docs/api/common.md#sample-bodies).
pub(super) const GENERATE_TEXT: &str = r#"{
    "id":"a123",
    "text_input": "My name is Olivier and I",
    "parameters": {
        "details": true,
        "do_sample": true,
        "max_new_tokens":20,
        "repetition_penalty": 1.1,
        "seed": 123,
        "temperature": 1,
        "top_k": 10,
        "top_p": 0.99,
        "batch_size":100,
        "typical_p": 0.5,
        "watermark": false,
        "perf_stat": false,
        "priority": 5,
        "timeout": 10
    }
}"#;

/// MindIE generate_stream's multimodal sample (docs/api/common.md#sample-bodies).
pub(super) const GENERATE_MULTIMODAL: &str = r#"{
    "id":"a123",
    "text_input": [
        {"type": "text", "text": "My name is Olivier and I"},
        {
            "type": "image_url",
            "image_url": "/xxxx/test.png"
        }
    ],
    "parameters": {
        "details": true,
        "do_sample": true,
        "max_new_tokens":20,
        "repetition_penalty": 1.1,
        "seed": 123,
        "temperature": 1,
        "top_k": 10,
        "top_p": 0.99,
        "batch_size":100,
        "typical_p": 0.5,
        "watermark": false,
        "perf_stat": false,
        "priority": 5,
        "timeout": 10
    }
}"#;

/// MindIE chat's single-turn text sample (docs/api/common.md#sample-bodies).
pub(super) const CHAT_SINGLE: &str = r#"{
    "model": "gpt-3.5-turbo",
    "messages": [{
        "role": "user",
        "content": "You are a helpful assistant."
    }],
    "stream": false,
    "presence_penalty": 1.03,
    "frequency_penalty": 1.0,
    "repetition_penalty": 1.0,
    "temperature": 0.5,
    "top_p": 0.95,
    "top_k": -1,
    "seed": null,
    "stop": ["stop1", "stop2"],
    "stop_token_ids": [2, 13],
    "include_stop_str_in_output": false,
    "skip_special_tokens": true,
    "ignore_eos": false,
    "max_tokens": 20
}"#;

/// MindIE chat's multimodal sample (docs/api/common.md#sample-bodies).
pub(super) const CHAT_MULTIMODAL: &str = r#"{
    "model": "gpt-3.5-turbo",
    "messages": [{
        "role": "user",
        "content": [
           {"type": "text", "text": "My name is Olivier and I"},
           {"type": "image_url", "image_url": "/xxxx/test.png"}
        ]
    }],
    "stream": false,
    "presence_penalty": 1.03,
    "frequency_penalty": 1.0,
    "repetition_penalty": 1.0,
    "temperature": 0.5,
    "top_p": 0.95,
    "top_k": -1,
    "seed": null,
    "stop": ["stop1", "stop2"],
    "stop_token_ids": [2, 13],
    "include_stop_str_in_output": false,
    "skip_special_tokens": true,
    "ignore_eos": false,
    "max_tokens": 20
}"#;

/// MindIE chat's first multi-turn tool request (docs/api/common.md#sample-bodies).
pub(super) const CHAT_TOOLS_1: &str = r#"{
    "model": "gpt-3.5-turbo",
    "messages": [{
        "role": "system",
        "content": "You are a student who is good at math."
        },
        {
        "role": "user",
        "content": "Hi, can you tell me the delivery date for my order? my order id is 12345."
        }
    ],
    "stream": false,
    "presence_penalty": 1.03,
    "frequency_penalty": 1.0,
    "repetition_penalty": 1.0,
    "temperature": 0.5,
    "top_p": 0.95,
    "top_k": -1,
    "seed": null,
    "stop": ["stop1", "stop2"],
    "stop_token_ids": [2, 13],
    "ignore_eos": false,
    "max_tokens": 1024,
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_delivery_date",
                "strict": true,
                "description": "Get the delivery date for a customer's order. Call this whenever you need to know the delivery date, for example when a customer asks 'Where is my package'",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "order_id": {
                            "type": "string",
                            "description": "The customer's order ID."
                        }
                    },
                "required": [
                    "order_id"
                ],
                "additionalProperties": false
                }
            }
        }
    ],
    "tool_choice": "auto"
}"#;

/// MindIE chat's second multi-turn tool request, the round trip (docs/api/common.md#sample-bodies).
pub(super) const CHAT_TOOLS_2: &str = r#"{
    "model": "llama_65b",
    "messages": [
        {
            "role": "system",
            "content": "You are a helpful customer support assistant. Use the supplied tools to assist the user."
        },
        {
            "role": "user",
            "content": "Hi, can you tell me the delivery date for my order? my order id is 12345."
        },
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "function": {
                        "arguments": "{\"order_id\": \"12345\"}",
                        "name": "get_delivery_date"
                    },
                    "id": "tool_call_8p2Nk",
                    "type": "function"
                }
            ]
        },
        {
            "role": "tool",
            "content": "the delivery date is 2024.09.10.",
            "tool_call_id": "tool_call_8p2Nk"
        }
    ],
    "stream": false,
    "repetition_penalty": 1.1,
    "temperature": 0.9,
    "top_p": 1,
    "max_tokens": 1024,
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_delivery_date",
                "strict": true,
                "description": "Get the delivery date for a customer's order. Call this whenever you need to know the delivery date, for example when a customer asks 'Where is my package'",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "order_id": {
                            "type": "string",
                            "description": "The customer's order ID."
                        }
                    },
                    "required": [
                        "order_id"
                    ],
                    "additionalProperties": false
                }
            }
        }
    ],
    "tool_choice": "auto"
}"#;

/// MindIE completions' streamed beam-search sample (docs/api/common.md#sample-bodies).
pub(super) const COMPLETIONS_BEAM_STREAM: &str = r#"{
    "model": "Qwen2.5-7B-Instruct",
    "prompt": "who are you",
    "temperature": 1,
    "max_tokens": 5,
    "use_beam_search": true,
    "ignore_eos":true,
    "n": 2,
    "best_of":2,
    "stream": true,
    "logprobs": 2}"#;

/// MindIE completions' sampling sample (docs/api/common.md#sample-bodies).
pub(super) const COMPLETIONS_SAMPLING: &str = r#"{
    "model": "llama",
    "prompt": "who are you",
    "temperature": 1,
    "max_tokens": 5,
    "ignore_eos":true,
    "n": 2,
    "best_of":2,
    "stream": false,
    "logprobs": 2}"#;

/// The illustrative Databricks chat request (docs/api/common.md#sample-bodies).
pub(super) const DATABRICKS_CHAT: &str = r#"{
  "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the delivery date for order 12345?"}
  ],
  "max_tokens": 256,
  "temperature": 0.2,
  "tools": [{"type": "function", "function": {"name": "get_delivery_date", "description": "Look up an order's delivery date", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}],
  "tool_choice": "auto",
  "logprobs": true,
  "top_logprobs": 2
}"#;

/// The illustrative Databricks completions request (docs/api/common.md#sample-bodies).
pub(super) const DATABRICKS_COMPLETIONS: &str = r#"{"prompt": ["Once upon a time", "The capital of France is"], "max_tokens": 8, "temperature": 0, "suffix": "", "echo": false}"#;

/// The illustrative Databricks embeddings request (docs/api/common.md#sample-bodies).
pub(super) const DATABRICKS_EMBEDDINGS: &str = r#"{"input": ["first chunk", "second chunk"], "instruction": "Represent this sentence for searching relevant passages:"}"#;
