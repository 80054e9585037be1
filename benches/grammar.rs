//! Criterion benches of constrained decoding's per-token work: for R rows each following a JSON
//! schema with 10 properties, one step = every row's allowed-token mask (computed in parallel
//! across rows, as the scheduler does) and the consumption of one allowed token. Vocabularies of
//! 49,152 (SmolLM2's size) and 151,936 (Qwen2.5's) synthetic byte-level tokens; rows 1/32/128.
//! A row that completes its object starts over from a fresh state, so every step is mid-output.
//! With `FERROLLM_BENCH_TOKENIZER` (a tokenizer.json) and `FERROLLM_BENCH_EOS` (its EOS id), the
//! same steps run over that real vocabulary too (`benches/grammar_backends.py` sets them, to put
//! xgrammar and outlines-core beside it on the same tokenizer).

use std::time::Duration;

use std::sync::Arc;

use _core::detok::Detokenizer;
use _core::grammar::{GrammarCompiler, GrammarKind, GrammarSpec, GrammarState};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

const SCHEMA: &str = r#"{"type": "object", "properties": {
  "field_0": {"type": "string", "maxLength": 12}, "field_1": {"type": "string", "maxLength": 12},
  "field_2": {"type": "string", "maxLength": 12}, "field_3": {"type": "string", "maxLength": 12},
  "field_4": {"type": "string", "maxLength": 12}, "field_5": {"type": "string", "maxLength": 12},
  "age": {"type": "integer", "minimum": 0, "maximum": 120}, "score": {"type": "number"},
  "active": {"type": "boolean"},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
  "required": ["field_0", "age", "active"]}"#;

/// A byte-level vocabulary of `size` ids: id 0 the special EOS, then the 256 bytes, then
/// pseudo-words (syllables, with and without a leading space or capital), digit runs and
/// punctuation runs, the mix a BPE vocabulary has.
fn vocabulary(size: usize) -> Vec<(Vec<u8>, bool)> {
    let mut words: Vec<(Vec<u8>, bool)> = vec![(b"<|endoftext|>".to_vec(), true)];
    words.extend((0..=255u8).map(|b| (vec![b], false)));
    let mut seen: std::collections::HashSet<Vec<u8>> = words.iter().map(|w| w.0.clone()).collect();
    let consonants = b"bcdfghjklmnprstvwyz";
    let vowels = b"aeiou";
    let punct: &[&[u8]] = &[
        b"\"", b"{", b"}", b":", b",", b" ", b"\n", b"[", b"]", b".", b"-",
    ];
    let mut rng = SmallRng::seed_from_u64(7);
    while words.len() < size {
        let mut w = Vec::new();
        match rng.random_range(0..10) {
            0 => (0..rng.random_range(1..4)).for_each(|_| w.push(b'0' + rng.random_range(0..10))),
            1 => (0..rng.random_range(2..4))
                .for_each(|_| w.extend_from_slice(punct[rng.random_range(0..punct.len())])),
            _ => {
                if rng.random_bool(0.5) {
                    w.push(b' ');
                }
                for _ in 0..rng.random_range(1..5) {
                    w.push(consonants[rng.random_range(0..consonants.len())]);
                    w.push(vowels[rng.random_range(0..vowels.len())]);
                }
                if rng.random_bool(0.3) {
                    w.push(consonants[rng.random_range(0..consonants.len())]);
                }
                let first = usize::from(w[0] == b' ');
                if rng.random_bool(0.2) {
                    w[first] = w[first].to_ascii_uppercase();
                }
            }
        }
        if seen.insert(w.clone()) {
            words.push((w, false));
        }
    }
    words
}

/// One decoding step for every row: its mask, then one allowed token (not EOS while another
/// is allowed) consumed; a finished row starts over.
fn step(rows: &mut [(GrammarState, SmallRng)], fresh: &GrammarState, eos: u32) {
    rows.par_iter_mut().for_each(|(state, rng)| {
        let mask = state.mask().expect("mask");
        let vocab = mask.len();
        let start = rng.random_range(0..vocab);
        let pick = (0..vocab)
            .map(|i| (start + i) % vocab)
            .find(|&t| t as u32 != eos && mask.is_allowed(t as u32))
            .map_or(eos, |t| t as u32);
        if pick == eos || state.consume(pick).is_err() || state.is_stopped() {
            *state = fresh.clone();
        }
    });
}

fn bench_grammar(c: &mut Criterion) {
    let mut group = c.benchmark_group("grammar_step");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let mut compilers: Vec<(String, GrammarCompiler, u32)> = [49_152usize, 151_936]
        .into_iter()
        .map(|size| {
            let compiler = GrammarCompiler::from_vocab(&vocabulary(size), &[0]).expect("compiler");
            (format!("vocab{size}"), compiler, 0)
        })
        .collect();
    if let Ok(path) = std::env::var("FERROLLM_BENCH_TOKENIZER") {
        let json = std::fs::read_to_string(&path).expect("FERROLLM_BENCH_TOKENIZER is readable");
        let detok = Arc::new(Detokenizer::from_json(&json).expect("a tokenizer.json"));
        let eos: u32 = std::env::var("FERROLLM_BENCH_EOS")
            .ok()
            .and_then(|e| e.parse().ok())
            .unwrap_or(0);
        let name = format!("tokenizer{}", detok.vocab_size());
        compilers.push((
            name,
            GrammarCompiler::new(detok, &[eos]).expect("compiler"),
            eos,
        ));
    }
    for (name, compiler, eos) in &compilers {
        let eos = *eos;
        let spec = GrammarSpec {
            kind: GrammarKind::JsonSchema,
            text: SCHEMA.to_string(),
            field: "bench".to_string(),
        };
        let fresh = compiler.compile(&spec).expect("compiles");
        for rows in [1usize, 32, 128] {
            let mut states: Vec<(GrammarState, SmallRng)> = (0..rows)
                .map(|r| (fresh.clone(), SmallRng::seed_from_u64(r as u64)))
                .collect();
            // Spread the rows over different points of the object.
            for k in 0..rows {
                for _ in 0..(k * 7) % 40 {
                    step(&mut states[k..=k], &fresh, eos);
                }
            }
            group.throughput(Throughput::Elements(rows as u64));
            group.bench_with_input(
                BenchmarkId::new(name, format!("rows{rows}")),
                &rows,
                |b, _| b.iter(|| step(&mut states, &fresh, eos)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_grammar);
criterion_main!(benches);
