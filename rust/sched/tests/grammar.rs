//! Constrained decoding through the scheduler: random logits, sampled at temperature 1 under a
//! grammar, always give output the grammar accepts; forks and beams follow their own copies; a
//! hostile grammar fails to compile quickly with an error naming its field.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::detok::{fixtures, Detokenizer};
use crate::grammar::{GrammarCompiler, GrammarKind, GrammarSpec};
use crate::params::SamplingParams;

/// The byte-level fixture's `<|endoftext|>`.
const EOS: u32 = 0;

fn detok() -> Arc<Detokenizer> {
    let json = fixtures::byte_level().to_string(false).expect("serializes");
    Arc::new(Detokenizer::from_json(&json).expect("loads"))
}

fn spec(kind: GrammarKind, text: &str) -> GrammarSpec {
    GrammarSpec {
        kind,
        text: text.to_string(),
        field: "response_format".to_string(),
    }
}

/// Runs one constrained request to its end on random logits; its outputs' texts and finish
/// reasons, per sequence index.
fn run(
    compiler: &GrammarCompiler,
    spec: &GrammarSpec,
    params: SamplingParams,
    seed: u64,
) -> Vec<(String, u8)> {
    let detok = detok();
    let vocab = detok.vocab_size();
    let mut s = Scheduler::new(SchedulerConfig {
        eos_token_ids: vec![EOS],
        seed: Some(seed),
        max_model_len: 512,
        ..cfg(1024, 4, 256, 16)
    })
    .unwrap();
    s.set_detokenizer(Some(detok.clone()));
    let n = params.n as usize;
    let mut req = NewRequest::new(1, vec![70, 71], Arc::new(params));
    req.grammar = Some(compiler.compile(spec).expect("compiles"));
    s.add_request(req).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut texts = vec![String::new(); n];
    let mut reasons = vec![0u8; n];
    while s.has_unfinished_requests() {
        let plan = s.schedule(0.0);
        let logits: Vec<f32> = (0..plan.num_samples() * vocab)
            .map(|_| rng.random_range(-4.0..4.0))
            .collect();
        let out = s.update_with_logits(plan.step_id, &logits, vocab).unwrap();
        assert!(out.failed_req_ids.is_empty(), "{:?}", out.failed_messages());
        for i in 0..out.num_samples() {
            let o = &out.text_offsets;
            let piece: String = out
                .text
                .chars()
                .skip(o[i] as usize)
                .take((o[i + 1] - o[i]) as usize)
                .collect();
            texts[out.seq_indices[i] as usize].push_str(&piece);
            if out.finish_reasons[i] != 0 {
                reasons[out.seq_indices[i] as usize] = out.finish_reasons[i];
            }
        }
    }
    assert_eq!(s.stats().num_used_blocks, 0);
    texts.into_iter().zip(reasons).collect()
}

fn sampled(n: u32) -> SamplingParams {
    SamplingParams {
        n,
        best_of: n,
        max_tokens: Some(120),
        ..SamplingParams::default()
    }
}

#[test]
fn sampled_json_follows_its_schema() {
    let compiler = GrammarCompiler::new(detok(), &[EOS]).unwrap();
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "ok": {"type": "boolean"}},
        "required": ["name", "age", "ok"], "additionalProperties": false}"#;
    let spec = spec(GrammarKind::JsonSchema, schema);
    for seed in 0..6 {
        for (text, reason) in run(&compiler, &spec, sampled(3), seed) {
            assert_eq!(reason, FinishReason::Stop as u8, "{text}");
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            let obj = v.as_object().expect("an object");
            assert_eq!(obj.len(), 3, "{text}");
            assert!(
                obj["name"].as_str().is_some_and(|s| s.chars().count() <= 8),
                "{text}"
            );
            assert!(obj["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
            assert!(obj["ok"].is_boolean(), "{text}");
        }
    }
}

#[test]
fn json_object_regex_choice_and_lark_constrain_as_asked() {
    let compiler = GrammarCompiler::new(detok(), &[EOS]).unwrap();
    let mut parsed = 0;
    for seed in 0..4 {
        // Any JSON object: one that runs into max_tokens ends by length, unfinished (as asked).
        for (text, reason) in run(
            &compiler,
            &spec(GrammarKind::JsonObject, ""),
            sampled(2),
            seed,
        ) {
            assert!(text.starts_with('{'), "{text}");
            if reason == FinishReason::Stop as u8 {
                let v: serde_json::Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
                assert!(v.is_object(), "{text}");
                parsed += 1;
            } else {
                assert_eq!(reason, FinishReason::Length as u8);
            }
        }
        for (text, reason) in run(
            &compiler,
            &spec(GrammarKind::Regex, "[0-9]{3}-[a-z]{2}"),
            sampled(2),
            seed,
        ) {
            let b = text.as_bytes();
            assert_eq!(reason, FinishReason::Stop as u8);
            assert!(
                b.len() == 6
                    && b[..3].iter().all(u8::is_ascii_digit)
                    && b[3] == b'-'
                    && b[4..].iter().all(u8::is_ascii_lowercase),
                "{text}"
            );
        }
        let choices = r#"["red", "green", "blue sky"]"#;
        for (text, _) in run(
            &compiler,
            &spec(GrammarKind::Choice, choices),
            sampled(2),
            seed,
        ) {
            assert!(
                ["red", "green", "blue sky"].contains(&text.as_str()),
                "{text}"
            );
        }
        let lark = "start: \"yes\" | \"no\" | NUM\nNUM: /[1-9][0-9]?/";
        for (text, _) in run(&compiler, &spec(GrammarKind::Lark, lark), sampled(1), seed) {
            let num = text.parse::<u32>().is_ok_and(|x| (1..100).contains(&x));
            assert!(text == "yes" || text == "no" || num, "{text}");
        }
    }
    assert!(parsed > 0, "some JSON objects closed");
}

#[test]
fn beams_follow_the_grammar_too() {
    let compiler = GrammarCompiler::new(detok(), &[EOS]).unwrap();
    let params = SamplingParams {
        use_beam_search: true,
        best_of: 3,
        n: 2,
        max_tokens: Some(40),
        ..SamplingParams::default()
    };
    for seed in 0..3 {
        for (text, _) in run(
            &compiler,
            &spec(GrammarKind::Regex, "(ab|cd)+e"),
            params.clone(),
            seed,
        ) {
            assert!(text.ends_with('e') && text.len() % 2 == 1, "{text}");
            assert!(
                text.as_bytes()[..text.len() - 1]
                    .chunks(2)
                    .all(|p| p == b"ab" || p == b"cd"),
                "{text}"
            );
        }
    }
}

#[test]
fn bad_and_hostile_grammars_fail_fast_naming_their_field() {
    let compiler = GrammarCompiler::new(detok(), &[EOS]).unwrap();
    let deep = format!(
        "{}{}",
        r#"{"type": "array", "items": "#.repeat(2000),
        "}".repeat(2000)
    );
    let refused = [
        spec(GrammarKind::JsonSchema, "{not json"),
        spec(GrammarKind::JsonSchema, "[1, 2]"),
        spec(GrammarKind::JsonSchema, &deep),
        spec(GrammarKind::Regex, "(a"),
        spec(GrammarKind::Regex, "((a{1000}){1000}){1000}"),
        spec(
            GrammarKind::JsonSchema,
            r#"{"type": "object", "patternProperties": {"^(x{500}){500}$": {}}}"#,
        ),
        spec(
            GrammarKind::JsonSchema,
            r#"{"type": "string", "pattern": "((a{1000}){1000}){1000}"}"#,
        ),
        spec(GrammarKind::Lark, "start: X\nX: /((b{100}){100}){100}/"),
        spec(GrammarKind::Choice, "[]"),
        spec(GrammarKind::Lark, "start: undefined_rule"),
    ];
    for case in refused {
        let started = Instant::now();
        let err = compiler.compile(&case).map(|_| ()).expect_err(&case.text);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        match err {
            crate::error::CoreError::Invalid { param, message, .. } => {
                assert_eq!(param, "response_format");
                assert!(message.starts_with("`response_format`"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Large but honest grammars compile, and in bounded time.
    let alternation = format!(
        "({})",
        (0..20000)
            .map(|i| format!("w{i}x"))
            .collect::<Vec<_>>()
            .join("|")
    );
    for text in [
        alternation.as_str(),
        "[a-z]{0,5000}[0-9]{0,5000}(x|y){3000}",
        "(a|aa)*(b|bb){1000}[a-z]{1000}",
    ] {
        let started = Instant::now();
        compiler
            .compile(&spec(GrammarKind::Regex, text))
            .expect("compiles");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_grammar_with_ignore_eos_is_refused() {
    let compiler = GrammarCompiler::new(detok(), &[EOS]).unwrap();
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let mut req = NewRequest::new(1, vec![70], Arc::new(params));
    req.grammar = Some(
        compiler
            .compile(&spec(GrammarKind::JsonObject, ""))
            .unwrap(),
    );
    match s.add_request(req) {
        Err(crate::error::CoreError::Invalid { param, .. }) => assert_eq!(param, "ignore_eos"),
        other => panic!("{other:?}"),
    }
}

/// A grammar that fails under a beam search fails its request once, alone: the failed mask
/// used to be reported twice (once for the beams' samples, once for their continuations),
/// ending the group's sequences twice and panicking when they were dropped.
#[test]
fn a_failing_grammar_fails_a_beam_search_once() {
    let detok = detok();
    let vocab = detok.vocab_size();
    let compiler = GrammarCompiler::new(detok.clone(), &[EOS]).unwrap();
    let mut grammar = compiler
        .compile(&spec(GrammarKind::Regex, "(ab|cd)+e"))
        .expect("compiles");
    let z = (0..vocab as u32)
        .find(|&t| detok.token_bytes(t) == b"z")
        .expect("a token for z");
    assert!(grammar.consume(z).is_err(), "z is not allowed");
    let mut s = Scheduler::new(SchedulerConfig {
        eos_token_ids: vec![EOS],
        max_model_len: 512,
        ..cfg(1024, 4, 256, 16)
    })
    .unwrap();
    s.set_detokenizer(Some(detok));
    let params = SamplingParams {
        use_beam_search: true,
        best_of: 3,
        max_tokens: Some(8),
        ..SamplingParams::default()
    };
    let mut req = NewRequest::new(1, vec![70, 71], Arc::new(params));
    req.grammar = Some(grammar);
    s.add_request(req).unwrap();
    add(&mut s, 2, vec![70, 71], Arc::new(sampled(1)), 5, 0.0);
    let plan = s.schedule(0.0);
    let logits = vec![0.0; plan.num_samples() * vocab];
    let out = s.update_with_logits(plan.step_id, &logits, vocab).unwrap();
    assert_eq!(out.failed_req_ids, vec![1]);
    assert!(
        out.failed_messages()[0].contains("response_format"),
        "{:?}",
        out.failed_messages()
    );
    assert_eq!(out.req_ids, vec![2], "the other request goes on");
    s.check_invariants().unwrap();
    assert_eq!(s.stats().num_unfinished_requests, 1);
}
