use half::bf16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

/// A random step: `q_lens` tokens per row, each row's context ending at its last query, over
/// shuffled blocks of a random cache.
struct Case {
    dims: Dims,
    q: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    positions: Vec<i64>,
    slots: Vec<i64>,
    cu: Vec<i32>,
    context_lens: Vec<i32>,
    tables: Vec<i32>,
    max_blocks: usize,
}

fn case(rng: &mut SmallRng, group: usize, q_lens: &[usize]) -> Case {
    let (num_kv_heads, head_dim, block_size) = (2, 24, 4);
    let contexts: Vec<usize> = q_lens
        .iter()
        .map(|&n| n + rng.random_range(0..20))
        .collect();
    let max_blocks = contexts
        .iter()
        .map(|c| c.div_ceil(block_size))
        .max()
        .unwrap()
        + 1;
    let num_blocks = 1 + contexts
        .iter()
        .map(|c| c.div_ceil(block_size))
        .sum::<usize>();
    let dims = Dims {
        num_heads: group * num_kv_heads,
        num_kv_heads,
        head_dim,
        num_blocks,
        block_size,
    };
    let mut free: Vec<i32> = (1..num_blocks as i32).collect();
    let (mut tables, mut positions, mut slots, mut cu) = (vec![], vec![], vec![], vec![0]);
    for (&n, &ctx) in q_lens.iter().zip(&contexts) {
        let mut table = vec![0; max_blocks];
        for entry in table.iter_mut().take(ctx.div_ceil(block_size)) {
            *entry = free.swap_remove(rng.random_range(0..free.len()));
        }
        for p in ctx - n..ctx {
            positions.push(p as i64);
            slots.push(
                i64::from(table[p / block_size]) * block_size as i64 + (p % block_size) as i64,
            );
        }
        tables.extend(table);
        cu.push(positions.len() as i32);
    }
    let mut rand_vec = |len| {
        (0..len)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    Case {
        q: rand_vec(positions.len() * dims.num_heads * head_dim),
        k_cache: rand_vec(dims.cache_len()),
        v_cache: rand_vec(dims.cache_len()),
        positions,
        slots,
        cu,
        context_lens: contexts.iter().map(|&c| c as i32).collect(),
        tables,
        max_blocks,
        dims,
    }
}

impl Case {
    fn layout<'a>(&'a self, rows: &'a [i32], window: Option<usize>) -> StepLayout<'a> {
        StepLayout {
            positions: &self.positions,
            slot_mapping: &self.slots,
            cu_seqlens_q: &self.cu,
            context_lens: &self.context_lens,
            block_tables: &self.tables,
            max_blocks: self.max_blocks,
            rows,
            sliding_window: window,
        }
    }

    /// Softmax attention in float64, one query head at a time, keys found by slot arithmetic.
    fn reference(&self, k_cache: &[f32], v_cache: &[f32], window: Option<usize>) -> Vec<f32> {
        let d = self.dims;
        let (hd, scale) = (d.head_dim, (d.head_dim as f64).powf(-0.5));
        let mut out = vec![0f32; self.q.len()];
        for r in 0..self.context_lens.len() {
            for t in self.cu[r] as usize..self.cu[r + 1] as usize {
                let pos = self.positions[t] as usize;
                let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                for h in 0..d.num_heads {
                    let kvh = h / d.group();
                    let q = &self.q[(t * d.num_heads + h) * hd..][..hd];
                    let at = |j: usize| {
                        let slot = self.tables[r * self.max_blocks + j / d.block_size] as usize
                            * d.block_size
                            + j % d.block_size;
                        (slot * d.num_kv_heads + kvh) * hd
                    };
                    let scores: Vec<f64> = (lo..=pos)
                        .map(|j| {
                            let k = &k_cache[at(j)..][..hd];
                            q.iter().zip(k).map(|(a, b)| f64::from(a * b)).sum::<f64>() * scale
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for (j, s) in (lo..=pos).zip(&scores) {
                        let p = (s - max).exp() / total;
                        for x in 0..hd {
                            out[(t * d.num_heads + h) * hd + x] +=
                                (p * f64::from(v_cache[at(j) + x])) as f32;
                        }
                    }
                }
            }
        }
        out
    }

    fn run<Q: Elem, C: Elem>(&self, window: Option<usize>, parallel: bool) -> Vec<f32> {
        let threads = if parallel { pool::num_threads() } else { 1 };
        self.run_on::<Q, C>(window, threads)
    }

    fn run_on<Q: Elem, C: Elem>(&self, window: Option<usize>, threads: usize) -> Vec<f32> {
        let q: Vec<Q> = self.q.iter().map(|&x| Q::from_f32(x)).collect();
        let k: Vec<C> = self.k_cache.iter().map(|&x| C::from_f32(x)).collect();
        let v: Vec<C> = self.v_cache.iter().map(|&x| C::from_f32(x)).collect();
        let rows: Vec<i32> = (0..self.context_lens.len() as i32).collect();
        let mut out = vec![Q::from_f32(0.0); q.len()];
        let q_rows = Rows {
            data: &q,
            stride: self.dims.num_heads * self.dims.head_dim,
        };
        let scale = (self.dims.head_dim as f32).powf(-0.5);
        attend(
            q_rows,
            &k,
            &v,
            &self.layout(&rows, window),
            &self.dims,
            scale,
            &mut out,
            threads,
        )
        .unwrap();
        out.iter().map(|x| x.to_f32()).collect()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
}

#[test]
fn matches_reference_for_random_mixed_steps() {
    let mut rng = SmallRng::seed_from_u64(7);
    for seed_case in 0..24 {
        let group = [1, 3, 4][seed_case % 3];
        let window = [None, Some(5)][seed_case / 3 % 2];
        let q_lens: Vec<usize> = (0..rng.random_range(1..6))
            .map(|_| rng.random_range(1..9))
            .collect();
        let c = case(&mut rng, group, &q_lens);
        let want = c.reference(&c.k_cache, &c.v_cache, window);
        let got = c.run::<f32, f32>(window, seed_case % 2 == 0);
        assert!(max_diff(&got, &want) < 1e-5, "f32, case {seed_case}");
        // A bfloat16 cache holds rounded K/V; compute stays float32.
        let want_bf = c.reference(&rounded(&c.k_cache), &rounded(&c.v_cache), window);
        assert!(
            max_diff(&c.run::<f32, bf16>(window, false), &want_bf) < 1e-5,
            "bf16 cache"
        );
        assert!(
            max_diff(&c.run::<bf16, bf16>(window, true), &want) < 3e-2,
            "bf16 everything"
        );
    }
}

#[test]
fn fewer_tokens_than_threads_split_their_keys_and_merge_to_the_same_output() {
    let mut rng = SmallRng::seed_from_u64(11);
    for (i, q_lens) in [&[1][..], &[1, 1], &[2], &[1, 1, 1]].iter().enumerate() {
        for window in [None, Some(5)] {
            let c = case(&mut rng, [1, 3][i % 2], q_lens);
            let want = c.reference(&c.k_cache, &c.v_cache, window);
            assert!(max_diff(&c.run_on::<f32, f32>(window, 1), &want) < 1e-5);
            // 8 parts of a context of a few blocks leave some parts no keys at all.
            for threads in [2, 3, 5, 8] {
                let got = c.run_on::<f32, f32>(window, threads);
                assert!(
                    max_diff(&got, &want) < 1e-5,
                    "{q_lens:?} {window:?} {threads}"
                );
                let got = c.run_on::<bf16, bf16>(window, threads);
                assert!(max_diff(&got, &want) < 3e-2, "bf16 {q_lens:?} {threads}");
            }
        }
    }
}

#[test]
fn every_simd_variant_agrees() {
    let mut rng = SmallRng::seed_from_u64(3);
    let c = case(&mut rng, 3, &[1, 4, 1]);
    let rows = [0, 1, 2];
    let layout = c.layout(&rows, None);
    let job = Job {
        q: Rows {
            data: &c.q,
            stride: c.dims.num_heads * c.dims.head_dim,
        },
        k_cache: &c.k_cache,
        v_cache: &c.v_cache,
        layout: &layout,
        dims: c.dims,
        scale: 0.2,
        token_row: layout.check(&c.dims).unwrap(),
    };
    let chunk = c.dims.num_heads * c.dims.head_dim;
    let run = |item: ItemFn<f32, f32>| {
        let mut out = vec![0f32; c.q.len()];
        for (i, o) in out.chunks_mut(chunk).enumerate() {
            // SAFETY: only variants this CPU supports are passed in.
            unsafe { item(&job, i, Span::Whole(o)) };
        }
        out
    };
    let generic = run(item_generic::<f32, f32>);
    assert!(max_diff(&generic, &run(select::<f32, f32>())) < 1e-6);
    // Every variant the hardware runs, whatever the process's cap, against the portable one.
    for tier in [KernelTier::Avx2, KernelTier::Avx512] {
        if tier <= CpuFeatures::uncapped().tier {
            assert!(
                max_diff(&generic, &run(variant::<f32, f32>(tier))) < 1e-6,
                "{tier:?}"
            );
        }
    }
}

#[test]
fn rows_not_listed_keep_their_output() {
    let mut rng = SmallRng::seed_from_u64(5);
    let c = case(&mut rng, 1, &[3, 1]);
    let rows = [1];
    let mut out = vec![7f32; c.q.len()];
    let q = Rows {
        data: &c.q,
        stride: c.dims.num_heads * c.dims.head_dim,
    };
    attend(
        q,
        &c.k_cache,
        &c.v_cache,
        &c.layout(&rows, None),
        &c.dims,
        0.2,
        &mut out,
        8, // 4 tokens on 8 threads: the split path, rows not listed included
    )
    .unwrap();
    let first_row = 3 * c.dims.num_heads * c.dims.head_dim;
    assert!(out[..first_row].iter().all(|&x| x == 7.0));
    assert!(out[first_row..].iter().all(|&x| x != 7.0));
}

#[test]
fn write_kv_converts_and_lands_at_slots() {
    let dims = Dims {
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 2,
        num_blocks: 2,
        block_size: 2,
    };
    // Strided rows: each token's K is the first 2 of 3 values.
    let k = [1.0f32, 2.0, 99.0, 3.0, 4.0, 99.0];
    let v = [5.0f32, 6.0, 7.0, 8.0];
    let (mut kc, mut vc) = (vec![bf16::ZERO; 8], vec![bf16::ZERO; 8]);
    let rows = |data, stride| Rows { data, stride };
    write_kv(rows(&k, 3), rows(&v, 2), &[3, 0], &dims, &mut kc, &mut vc).unwrap();
    let f = |c: &[bf16]| c.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    assert_eq!(f(&kc), [3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
    assert_eq!(f(&vc), [7.0, 8.0, 0.0, 0.0, 0.0, 0.0, 5.0, 6.0]);
    let err = write_kv(rows(&k, 3), rows(&v, 2), &[4, 0], &dims, &mut kc, &mut vc).unwrap_err();
    assert!(
        err.to_string()
            .contains("`slot_mapping` entries must be in [0, 4)"),
        "{err}"
    );
}

#[test]
fn bad_layouts_are_refused_naming_the_field() {
    let mut rng = SmallRng::seed_from_u64(9);
    let c = case(&mut rng, 2, &[2, 1]);
    let rows = [0, 1];
    let q = Rows {
        data: &c.q,
        stride: c.dims.num_heads * c.dims.head_dim,
    };
    let mut out = vec![0f32; c.q.len()];
    let mut check = |layout: StepLayout<'_>, field: &str| {
        let err = attend(
            q, &c.k_cache, &c.v_cache, &layout, &c.dims, 1.0, &mut out, 1,
        )
        .unwrap_err();
        assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
    };
    let mut tables = c.tables.clone();
    tables[0] = c.dims.num_blocks as i32;
    check(
        StepLayout {
            block_tables: &tables,
            ..c.layout(&rows, None)
        },
        "block_tables",
    );
    let positions: Vec<i64> = c.positions.iter().map(|p| p + 100).collect();
    check(
        StepLayout {
            positions: &positions,
            ..c.layout(&rows, None)
        },
        "positions",
    );
    let lens = [i32::MAX, 1];
    check(
        StepLayout {
            context_lens: &lens,
            ..c.layout(&rows, None)
        },
        "context_lens",
    );
    check(
        StepLayout {
            rows: &[2],
            ..c.layout(&rows, None)
        },
        "rows",
    );
    check(
        StepLayout {
            cu_seqlens_q: &[0, 1, 2],
            ..c.layout(&rows, None)
        },
        "cu_seqlens_q",
    );
    check(c.layout(&rows, Some(0)), "sliding_window");
}
