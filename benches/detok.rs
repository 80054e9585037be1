//! Criterion benches of streaming detokenization: one 1000-token output (mixed English, CJK,
//! code, emoji) streamed token by token through a fresh `DecodeStream`, per tokenizer and path.
//! Throughput is in tokens, so criterion's time divided by 1000 is the cost per token.

use std::sync::Arc;

use _core::detok::{DecodeStream, Detokenizer};
use _core::stop::{StopMatcher, StopStrings};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[path = "../rust/detok/fixtures.rs"]
mod fixtures;

const NUM_TOKENS: usize = 1000;

/// The first `NUM_TOKENS` tokens of the corpus, re-encoded by `det` (repeated if short).
fn output_ids(det: &Detokenizer) -> Vec<u32> {
    let text = fixtures::CORPUS.repeat(4);
    let mut ids = det.encode(&text, false).expect("the corpus encodes");
    assert!(ids.len() >= NUM_TOKENS, "{} tokens", ids.len());
    ids.truncate(NUM_TOKENS);
    ids
}

fn stream_all(det: &Detokenizer, ids: &[u32], out: &mut String) {
    let mut stream = DecodeStream::new(true, true);
    out.clear();
    for &id in ids {
        stream.step(det, std::hint::black_box(id), out);
    }
    stream.finish(det, out);
}

fn streaming(c: &mut Criterion) {
    let byte_level = fixtures::byte_level();
    let cases = [
        ("byte_level_fast", Detokenizer::new(byte_level.clone())),
        (
            "byte_level_generic",
            Detokenizer::new(byte_level).with_fast_path(false),
        ),
        (
            "sentencepiece_generic",
            Detokenizer::new(fixtures::sentencepiece()),
        ),
        ("wordpiece_generic", Detokenizer::new(fixtures::wordpiece())),
    ];
    let mut group = c.benchmark_group("detok_stream_1k_tokens");
    group.throughput(Throughput::Elements(NUM_TOKENS as u64));
    let mut out = String::with_capacity(16 * NUM_TOKENS);
    for (name, det) in &cases {
        let ids = output_ids(det);
        stream_all(det, &ids, &mut out);
        assert_eq!(
            out,
            det.decode(&ids, true, true),
            "{name} streams the reference"
        );
        group.bench_function(*name, |b| b.iter(|| stream_all(det, &ids, &mut out)));
    }
    group.finish();
}

/// The whole text path of `update()` per token: detokenize, then the stop matcher (4 stop
/// strings that never match, so every token goes through hold-back checks).
fn detok_and_stop(c: &mut Criterion) {
    let stops: Vec<String> = ["\n\nUser:", "<|im_end|>", "###", "The end."]
        .map(String::from)
        .to_vec();
    let stops = Arc::new(StopStrings::new(&stops).expect("valid stops"));
    let mut group = c.benchmark_group("detok_plus_stop_1k_tokens");
    group.throughput(Throughput::Elements(NUM_TOKENS as u64));
    let mut out = String::with_capacity(16 * NUM_TOKENS);
    let mut delta = String::new();
    for (name, det) in [
        ("byte_level_fast", Detokenizer::new(fixtures::byte_level())),
        (
            "sentencepiece_generic",
            Detokenizer::new(fixtures::sentencepiece()),
        ),
    ] {
        let ids = output_ids(&det);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut stream = DecodeStream::new(true, true);
                let mut matcher = StopMatcher::new(Some(stops.clone()), false);
                out.clear();
                for &id in &ids {
                    delta.clear();
                    stream.step(&det, std::hint::black_box(id), &mut delta);
                    assert!(matcher.push(&delta, &mut out).is_none());
                }
                delta.clear();
                stream.finish(&det, &mut delta);
                matcher.push(&delta, &mut out);
                matcher.finish(&mut out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, streaming, detok_and_stop);
criterion_main!(benches);
