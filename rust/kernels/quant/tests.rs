use half::{bf16, f16};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Offsets of each type's float16 fields (scales and mins).
fn half_fields(ty: BlockType) -> &'static [usize] {
    match ty {
        BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Q8_0 => &[0],
        BlockType::Q4_1 | BlockType::Q5_1 | BlockType::Q4_K | BlockType::Q5_K => &[0, 2],
        BlockType::Q6_K => &[208],
    }
}

/// `rows` random rows of `k` values: random bytes for the integers and sub-scales, sane
/// float16 scales of both signs and varied magnitudes (so a scale on the wrong row shows).
fn random_weight(rng: &mut SmallRng, ty: BlockType, rows: usize, k: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..rows * ty.row_bytes(k, "k").unwrap())
        .map(|_| rng.random())
        .collect();
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in half_fields(ty) {
            let v = rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-4..-1));
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
        }
    }
    data
}

fn random_x(rng: &mut SmallRng, m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| rng.random_range(-2.0f32..2.0) * if i % 7 == 0 { 5.0 } else { 1.0 })
        .collect()
}

fn dequantized(ty: BlockType, data: &[u8], rows: usize, k: usize) -> Vec<f32> {
    let mut w = vec![0f32; rows * k];
    for (bytes, out) in data
        .chunks_exact(data.len() / rows)
        .zip(w.chunks_exact_mut(k))
    {
        dequantize_row(ty, bytes, out);
    }
    w
}

/// The exact product in float64 and the bound the activations' rounding allows: per group
/// `g` of a row of `x`, half its step `max|x_g| / 127` times the group's `sum |w|`, plus
/// float32 summation error (relative 1e-5 of `sum |x w|`).
fn reference(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut exact, mut bound) = (vec![0f64; m * n], vec![0f64; m * n]);
    for r in 0..m {
        let xr = &x[r * k..][..k];
        for c in 0..n {
            let wr = &w[c * k..][..k];
            let (mut e, mut b, mut mag) = (0f64, 0f64, 0f64);
            for (xg, wg) in xr.chunks(GROUP).zip(wr.chunks(GROUP)) {
                let step = f64::from(xg.iter().fold(0f32, |a, v| a.max(v.abs()))) / 127.0;
                let wsum: f64 = wg.iter().map(|v| f64::from(v.abs())).sum();
                b += step / 2.0 * wsum;
                for (a, v) in xg.iter().zip(wg) {
                    e += f64::from(*a) * f64::from(*v);
                    mag += f64::from(a.abs() * v.abs());
                }
            }
            exact[r * n + c] = e;
            bound[r * n + c] = b * 1.0001 + 1e-5 * mag + 1e-6;
        }
    }
    (exact, bound)
}

fn paths() -> Vec<Path> {
    Path::available(&CpuFeatures::uncapped())
}

#[test]
fn f16_conversion_is_exact_for_every_bit_pattern() {
    for bits in 0..=u16::MAX {
        let (ours, theirs) = (blocks::f16_to_f32(bits), f16::from_bits(bits).to_f32());
        assert!(
            ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
            "{bits:#x}"
        );
    }
}

#[test]
fn every_path_equals_the_dequantized_product_within_the_activation_bound() {
    let mut rng = SmallRng::seed_from_u64(7);
    for ty in ALL_TYPES {
        let ks: &[usize] = if ty.block_values() == 256 {
            &[256, 768]
        } else {
            &[32, 96, 576]
        };
        for &k in ks {
            for m in [1, 2, 3, 4, 5, 9] {
                let n = 19;
                let data = random_weight(&mut rng, ty, n, k);
                let x = random_x(&mut rng, m, k);
                let w = dequantized(ty, &data, n, k);
                let (exact, bound) = reference(&x, &w, m, n, k);
                let seg = [Segment {
                    ty,
                    data: &data,
                    rows: n,
                    interleaved: false,
                }];
                for path in paths() {
                    for parallel in [false, true] {
                        let mut out = vec![f32::NAN; m * n];
                        matmul(&x, m, k, &seg, &mut out, path, parallel).unwrap();
                        for i in 0..m * n {
                            let err = (f64::from(out[i]) - exact[i]).abs();
                            assert!(
                                err <= bound[i],
                                "{} {path:?} k={k} m={m} [{i}]: {} vs {} (bound {})",
                                ty.name(),
                                out[i],
                                exact[i],
                                bound[i]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn simd_paths_equal_the_portable_one_up_to_float_summation_order() {
    let mut rng = SmallRng::seed_from_u64(11);
    let k = 512;
    for ty in ALL_TYPES {
        let n = 40;
        let data = random_weight(&mut rng, ty, n, k);
        let x = random_x(&mut rng, 6, k);
        let seg = [Segment {
            ty,
            data: &data,
            rows: n,
            interleaved: false,
        }];
        let mut want = vec![0f32; 6 * n];
        matmul(&x, 6, k, &seg, &mut want, Path::Generic, false).unwrap();
        let w = dequantized(ty, &data, n, k);
        let (_, bound) = reference(&x, &w, 6, n, k);
        for path in paths() {
            let mut got = vec![0f32; 6 * n];
            matmul(&x, 6, k, &seg, &mut got, path, true).unwrap();
            for i in 0..got.len() {
                // Same integers and scales: only the order of float additions differs.
                let tol = 1e-3 * bound[i];
                assert!(
                    (got[i] - want[i]).abs() as f64 <= tol,
                    "{} {path:?} [{i}]",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn segments_of_different_types_fill_their_own_columns() {
    let mut rng = SmallRng::seed_from_u64(3);
    let (m, k) = (3, 256);
    let types = [
        BlockType::Q4_K,
        BlockType::Q6_K,
        BlockType::Q8_0,
        BlockType::Q5_1,
    ];
    let rows = [5, 40, 1, 17];
    let datas: Vec<Vec<u8>> = types
        .iter()
        .zip(rows)
        .map(|(&ty, n)| random_weight(&mut rng, ty, n, k))
        .collect();
    let segs: Vec<Segment<'_>> = types
        .iter()
        .zip(rows)
        .zip(&datas)
        .map(|((&ty, rows), data)| Segment {
            ty,
            data,
            rows,
            interleaved: false,
        })
        .collect();
    let x = random_x(&mut rng, m, k);
    let n: usize = rows.iter().sum();
    let w: Vec<f32> = segs
        .iter()
        .flat_map(|s| dequantized(s.ty, s.data, s.rows, k))
        .collect();
    let (exact, bound) = reference(&x, &w, m, n, k);
    for path in paths() {
        let mut out = vec![0f32; m * n];
        matmul(&x, m, k, &segs, &mut out, path, true).unwrap();
        for i in 0..m * n {
            assert!(
                (f64::from(out[i]) - exact[i]).abs() <= bound[i],
                "{path:?} [{i}]"
            );
        }
    }
}

#[test]
fn bfloat16_activations_give_the_float32_product_rounded() {
    let mut rng = SmallRng::seed_from_u64(5);
    let (m, n, k) = (3, 24, 64);
    let data = random_weight(&mut rng, BlockType::Q4_1, n, k);
    let x: Vec<bf16> = random_x(&mut rng, m, k)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let seg = [Segment {
        ty: BlockType::Q4_1,
        data: &data,
        rows: n,
        interleaved: false,
    }];
    for path in paths() {
        let (mut out, mut want) = (vec![bf16::ZERO; m * n], vec![0f32; m * n]);
        matmul(&x, m, k, &seg, &mut out, path, false).unwrap();
        matmul(&xf, m, k, &seg, &mut want, path, false).unwrap();
        for (o, w) in out.iter().zip(&want) {
            assert_eq!(*o, bf16::from_f32(*w), "{path:?}");
        }
    }
}

#[test]
fn bad_extents_are_refused_naming_the_field() {
    let data = vec![0u8; 2 * 20];
    let seg = [Segment {
        ty: BlockType::Q4_1,
        data: &data,
        rows: 2,
        interleaved: false,
    }];
    let x = vec![0f32; 64];
    let mut out = vec![0f32; 4];
    let err = |r: CoreResult<()>| r.unwrap_err().to_string();
    let short = Segment {
        ty: BlockType::Q4_1,
        data: &data[..30],
        rows: 2,
        interleaved: false,
    };
    assert!(
        err(matmul(&x, 2, 32, &[short], &mut out, Path::Generic, false)).contains("`segments[0]`")
    );
    assert!(err(matmul(&x, 3, 32, &seg, &mut out, Path::Generic, false)).contains("`x`"));
    assert!(err(matmul(&x, 2, 32, &seg, &mut out[..3], Path::Generic, false)).contains("`out`"));
    let k_seg = [Segment {
        ty: BlockType::Q4_K,
        data: &data,
        rows: 2,
        interleaved: false,
    }];
    assert!(err(matmul(&x, 1, 64, &k_seg, &mut out, Path::Generic, false)).contains("`k` (64)"));
    assert!(Path::parse("avx3")
        .unwrap_err()
        .to_string()
        .contains("`path`"));
}

#[test]
fn embedding_rows_are_dequantized_and_ids_checked() {
    let mut rng = SmallRng::seed_from_u64(9);
    let (rows, k) = (6, 64);
    let data = random_weight(&mut rng, BlockType::Q8_0, rows, k);
    let w = dequantized(BlockType::Q8_0, &data, rows, k);
    let mut out = vec![0f32; 2 * k];
    dequantize_rows(BlockType::Q8_0, &data, k, &[4, 1], &mut out).unwrap();
    assert_eq!(&out[..k], &w[4 * k..5 * k]);
    assert_eq!(&out[k..], &w[k..2 * k]);
    let err = dequantize_rows(BlockType::Q8_0, &data, k, &[6], &mut out[..k]).unwrap_err();
    assert!(err.to_string().contains("`ids`"), "{err}");
}

#[test]
fn quantized_rows_move_each_value_by_at_most_half_a_step() {
    let mut rng = SmallRng::seed_from_u64(13);
    let k = 128;
    for ty in [BlockType::Q8_0, BlockType::Q4_1] {
        let x = random_x(&mut rng, 1, k);
        let mut bytes = vec![0u8; ty.row_bytes(k, "k").unwrap()];
        quantize_row_into(ty, &x, &mut bytes).unwrap();
        let mut back = vec![0f32; k];
        dequantize_row(ty, &bytes, &mut back);
        let mut groups = [blocks::Group::default(); 1];
        for (b, (xg, yg)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
            blocks::decode_block(ty, &bytes[b * ty.block_bytes()..], &mut groups);
            let step = groups[0].scale[0].abs();
            // Half a step, plus what the float16 min of Q4_1 moved.
            let slack = if ty == BlockType::Q4_1 {
                1e-3 * groups[0].min.abs()
            } else {
                0.0
            };
            for (a, c) in xg.iter().zip(yg) {
                assert!(
                    (a - c).abs() <= step / 2.0 * 1.001 + slack,
                    "{} {a} {c}",
                    ty.name()
                );
            }
        }
    }
    let mut out = vec![0u8; 144];
    assert!(quantize_row_into(BlockType::Q4_K, &[0.0; 256], &mut out).is_err());
}

#[test]
#[cfg(target_arch = "x86_64")]
fn avx2_activation_rows_equal_the_portable_ones_bit_for_bit() {
    if !Path::Avx2.runs_on(hardware()) {
        eprintln!("skipped: this CPU lacks avx2");
        return;
    }
    let mut rng = SmallRng::seed_from_u64(11);
    let k = 4 * GROUP;
    // Random values, a zero group, exact ties of the rounding (+-0.5 steps) and one group whose
    // largest value is negative.
    let mut x = random_x(&mut rng, 1, k);
    x[GROUP..2 * GROUP].fill(0.0);
    // Largest value 127: the scale is 1 and every other value is a tie (n + 0.5).
    for (j, v) in x[2 * GROUP..3 * GROUP].iter_mut().enumerate() {
        *v = if j == 0 { 127.0 } else { j as f32 - 16.5 };
    }
    x[3 * GROUP] = -100.0;
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let (mut a, mut b) = (QuantizedRows::new(1, k), QuantizedRows::new(1, k));
    {
        let (q, d, s) = a.row_mut(0);
        act::quantize_row(&x, q, d, s);
        let (q2, d2, s2) = b.row_mut(0);
        // SAFETY: the CPU has AVX2 (checked above); the rows are `k` values.
        unsafe { x86::quantize_row_avx2(&x, q2, d2, s2) };
    }
    assert_eq!((&a.q, &a.d, &a.s), (&b.q, &b.d, &b.s));
    let (q, d, s) = a.row_mut(0);
    act::quantize_row(&xb, q, d, s);
    let (q2, d2, s2) = b.row_mut(0);
    // SAFETY: as above.
    unsafe { x86::quantize_row_avx2(&xb, q2, d2, s2) };
    assert_eq!((&a.q, &a.d, &a.s), (&b.q, &b.d, &b.s));
    assert!(a.q.contains(&-127) && a.q.contains(&127));
}

#[test]
fn interleaving_moves_every_byte_and_back() {
    let mut rng = SmallRng::seed_from_u64(21);
    for ty in ALL_TYPES.into_iter().filter(|&t| interleave::packs(t)) {
        let (n, k) = (16, 96);
        let row_bytes = ty.row_bytes(k, "k").unwrap();
        let data = random_weight(&mut rng, ty, n, k);
        let packed = interleave::pack(ty, &data, row_bytes);
        assert_eq!(packed.len(), data.len());
        assert_ne!(packed, data, "{}", ty.name());
        assert_eq!(
            interleave::unpack(ty, &packed, row_bytes),
            data,
            "{}",
            ty.name()
        );
        // Row 3's first block scale sits in float16 slot 3 of the first block column.
        assert_eq!(packed[6..8], data[3 * row_bytes..3 * row_bytes + 2]);
    }
}

#[test]
fn interleaved_weights_give_the_product_of_their_rows_on_every_path() {
    let mut rng = SmallRng::seed_from_u64(23);
    for ty in ALL_TYPES.into_iter().filter(|&t| interleave::packs(t)) {
        // K of 3 groups (no chunk of 8), 18 groups (the default model's), ragged M, and row
        // counts that split into several jobs.
        for (k, n) in [(96, 24), (576, 64)] {
            let row_bytes = ty.row_bytes(k, "k").unwrap();
            let data = random_weight(&mut rng, ty, n, k);
            let packed = interleave::pack(ty, &data, row_bytes);
            let (rows, runs) = (
                [Segment {
                    ty,
                    data: &data,
                    rows: n,
                    interleaved: false,
                }],
                [Segment {
                    ty,
                    data: &packed,
                    rows: n,
                    interleaved: true,
                }],
            );
            let w = dequantized(ty, &data, n, k);
            // 17 and 19 rows: `x86_x16` pairs runs from 16 activation rows (ragged tiles too).
            for m in [1, 2, 3, 4, 5, 9, 17, 19] {
                let x = random_x(&mut rng, m, k);
                let (exact, bound) = reference(&x, &w, m, n, k);
                let mut want = vec![0f32; m * n];
                matmul(&x, m, k, &rows, &mut want, Path::Generic, false).unwrap();
                for path in paths() {
                    for parallel in [false, true] {
                        let mut got = vec![0f32; m * n];
                        matmul(&x, m, k, &runs, &mut got, path, parallel).unwrap();
                        for i in 0..got.len() {
                            let what = format!("{} {path:?} k={k} m={m} [{i}]", ty.name());
                            // Same integers and scales: only the float summation order differs.
                            assert!((got[i] - want[i]).abs() as f64 <= 1e-3 * bound[i], "{what}");
                            assert!(
                                (got[i] as f64 - exact[i]).abs() <= 1.01 * bound[i],
                                "{what}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn interleaved_segments_must_be_whole_runs_of_a_packed_type() {
    let mut rng = SmallRng::seed_from_u64(5);
    let k = 256;
    for (ty, rows) in [(BlockType::Q4_1, 12), (BlockType::Q4_K, 8)] {
        let data = random_weight(&mut rng, ty, rows, k);
        let seg = [Segment {
            ty,
            data: &data,
            rows,
            interleaved: true,
        }];
        let mut out = vec![0f32; rows];
        let err = matmul(&[0.0; 256], 1, k, &seg, &mut out, Path::Generic, false).unwrap_err();
        assert!(err.to_string().contains("runs of 8 rows"), "{err}");
    }
}
