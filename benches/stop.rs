//! Criterion benches of the stop matcher alone: an ~8 KB text that never completes a stop (the
//! steady state, though it often starts one: "\n", "<|", "#") pushed through one matcher with
//! 0, 4, 16 and 100 stop strings, in 1-char and 32-char deltas. Throughput is text bytes.

use std::sync::Arc;

use _core::stop::{truncate_at_stop, StopMatcher, StopStrings};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const TEXT_BYTES: usize = 8192;

/// Stop strings seen in the wild, most common first.
const COMMON_STOPS: [&str; 16] = [
    "<|im_end|>",
    "\n\nUser:",
    "</s>",
    "###",
    "<|eot_id|>",
    "\n\nHuman:",
    "Observation:",
    "<|endoftext|>",
    "[/INST]",
    "<|end|>",
    "\n\n\n",
    "STOP",
    "~",
    ";;",
    "<|im_start|>",
    "\nQ:",
];

/// The first `n` common stops, then generated ones of 1 to 32 bytes.
fn stop_set(n: usize) -> Vec<String> {
    let mut stops: Vec<String> = COMMON_STOPS.iter().take(n).map(|s| s.to_string()).collect();
    for i in 0..n.saturating_sub(COMMON_STOPS.len()) {
        stops.push(match i % 4 {
            0 => format!("<|reserved_special_token_{i}|>"),
            1 => format!("\n\nAnswer {i}:"),
            2 => format!("END{i}"),
            _ => ["^", "@@", "$$$", "|>>"][i / 4 % 4].to_string(),
        });
    }
    stops
}

/// Words, sentences and single newlines; includes starts of stops ("\n", "<|", "#", "[/")
/// but never a whole one (checked by the caller).
fn text() -> String {
    const WORDS: [&str; 16] = [
        "the",
        "model",
        "answer",
        "is",
        "User",
        "tokens",
        "of",
        "a",
        "stream",
        "<|im",
        "#1",
        "Human",
        "[/x]",
        "end",
        "STO",
        "Observation",
    ];
    let mut rng = SmallRng::seed_from_u64(7);
    let mut text = String::new();
    while text.len() < TEXT_BYTES {
        text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        text.push_str(match rng.random_range(0..12) {
            0 => ". ",
            1 => "\n",
            2 => ", ",
            _ => " ",
        });
    }
    text
}

/// `text` cut into deltas of `chars` chars.
fn deltas(text: &str, chars: usize) -> Vec<&str> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .step_by(chars)
        .chain([text.len()])
        .collect();
    bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

fn push_text(c: &mut Criterion) {
    let text = text();
    let mut group = c.benchmark_group("stop_push");
    group.throughput(Throughput::Bytes(text.len() as u64));
    for num_stops in [0, 4, 16, 100] {
        let stops = stop_set(num_stops);
        assert_eq!(truncate_at_stop(&text, &stops, false).1, None);
        let compiled = (num_stops > 0).then(|| Arc::new(StopStrings::new(&stops).unwrap()));
        for delta_chars in [1, 32] {
            let pieces = deltas(&text, delta_chars);
            let id = BenchmarkId::new(format!("stops_{num_stops}"), format!("delta_{delta_chars}"));
            let mut out = String::with_capacity(text.len());
            group.bench_function(id, |b| {
                b.iter(|| {
                    out.clear();
                    let mut m = StopMatcher::new(compiled.clone(), false);
                    for piece in &pieces {
                        m.push(std::hint::black_box(piece), &mut out);
                    }
                    m.finish(&mut out);
                    assert_eq!(out.len(), text.len());
                })
            });
        }
    }
    group.finish();
}

fn compile(c: &mut Criterion) {
    let mut group = c.benchmark_group("stop_compile");
    for num_stops in [4, 16, 100] {
        let stops = stop_set(num_stops);
        group.bench_function(format!("stops_{num_stops}"), |b| {
            b.iter(|| StopStrings::new(std::hint::black_box(&stops)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, push_text, compile);
criterion_main!(benches);
