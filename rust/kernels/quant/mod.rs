//! Matrix products with GGUF-quantized weights, read in their own blocks (no dense copy):
//! `out[M, N] = x[M, K] @ W[N, K]^T`, `W` one or more segments of rows in any of `BlockType`'s
//! formats, `x` and `out` float32 or bfloat16.
//!
//! The activations are quantized once per call to `i8` groups of 32 (`act`), then every
//! weight group's integers meet them in integer dot products with one float multiply per
//! group (`x86`, or `generic` anywhere else). Error against the exact product of the file's
//! dequantized weights and `x`: only the activations' rounding, at most half an activation
//! step per value, so `|out - exact| <= sum_g (d_g / 2) * sum_{j in g} |w_j|` (`d_g` =
//! max|x| / 127 of group `g`) plus float32 summation error.
//!
//! `Path` is the code that runs, chosen from what the CPU has at run time (`CpuFeatures`,
//! capped by `FERROLLM_CPU_ISA`), never from the build machine's flags.

mod act;
mod blocks;
mod gated;
mod generic;
pub mod interleave;
mod quantize;
mod work;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_x16;
#[cfg(target_arch = "x86_64")]
mod x86_x8;

pub use act::QuantizedRows;
pub use blocks::{dequantize_row, BlockType, ALL_TYPES, GROUP};
pub use gated::silu_mlp;
pub use quantize::quantize_row_into;

use super::cpu::CpuFeatures;
use super::pool::{self, SendPtr};
use super::simd::Elem;
use crate::error::{CoreError, CoreResult};
use work::Work;

/// The kernel code a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Portable Rust: any CPU.
    Generic,
    /// AVX2 `maddubs` (AMD Zen 2/3, Intel Haswell on).
    Avx2,
    /// AVX-VNNI `dpbusd` at 256 bits (Intel Alder Lake, Sapphire Rapids).
    AvxVnni,
    /// AVX512-VNNI `dpbusd` at 256 bits (Intel Cascade Lake on, AMD Zen 4 on).
    Avx512Vnni,
}

impl Path {
    /// Every path, portable first.
    pub const ALL: [Path; 4] = [Path::Generic, Path::Avx2, Path::AvxVnni, Path::Avx512Vnni];

    /// "generic", "avx2", "avx_vnni" or "avx512_vnni".
    pub fn name(self) -> &'static str {
        match self {
            Self::Generic => "generic",
            Self::Avx2 => "avx2",
            Self::AvxVnni => "avx_vnni",
            Self::Avx512Vnni => "avx512_vnni",
        }
    }

    /// The path named `name` (`name()`'s spelling).
    pub fn parse(name: &str) -> CoreResult<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                invalid(
                    "path",
                    format!(
                        "`path` must be one of generic, avx2, avx_vnni, avx512_vnni; got {name:?}"
                    ),
                )
            })
    }

    /// Whether a CPU with `features` runs this path.
    pub fn runs_on(self, features: &CpuFeatures) -> bool {
        let avx2 =
            cfg!(target_arch = "x86_64") && ["avx2", "fma", "f16c"].iter().all(|f| features.has(f));
        match self {
            Self::Generic => true,
            Self::Avx2 => avx2,
            Self::AvxVnni => avx2 && features.has("avx_vnni"),
            Self::Avx512Vnni => {
                avx2 && ["avx512f", "avx512vl", "avx512_vnni"]
                    .iter()
                    .all(|f| features.has(f))
            }
        }
    }

    /// The paths `features` runs, portable first.
    pub fn available(features: &CpuFeatures) -> Vec<Path> {
        Self::ALL
            .into_iter()
            .filter(|p| p.runs_on(features))
            .collect()
    }

    /// The fastest path `features` runs (VNNI's single instruction beats AVX2's pair).
    pub fn best(features: &CpuFeatures) -> Path {
        *Self::available(features).last().unwrap_or(&Path::Generic)
    }

    /// The path for this process (`CpuFeatures::get()`), decided once.
    pub fn current() -> Path {
        static PATH: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *PATH.get_or_init(|| Path::best(CpuFeatures::get()))
    }
}

/// Rows of one weight type, contiguous: `rows` rows of `k` values.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// The block format.
    pub ty: BlockType,
    /// `rows * ty.row_bytes(k)` bytes.
    pub data: &'a [u8],
    /// Output features this segment produces.
    pub rows: usize,
    /// `data` is in `interleave`'s layout (runs of 8 rows; `rows` a multiple of 8, `ty` one
    /// that `interleave::packs`).
    pub interleaved: bool,
}

/// `out = x @ W^T` where `W`'s rows are `segments`' rows in order; `x` is `[m, k]` and `out`
/// `[m, sum of rows]`, both row-major. `path` must run on this CPU (`Path::runs_on`);
/// `parallel` spreads the weight rows over the threads of `pool::run_jobs`.
pub fn matmul<X: Elem>(
    x: &[X],
    m: usize,
    k: usize,
    segments: &[Segment<'_>],
    out: &mut [X],
    path: Path,
    parallel: bool,
) -> CoreResult<()> {
    let n = check(x, m, k, segments, out.len())?;
    if !path.runs_on(hardware()) {
        return Err(invalid(
            "path",
            format!("`path` {} does not run on this CPU", path.name()),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let xq = quantize_activations(x, m, k, path, parallel);
    let jobs = split(segments, k, parallel);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let run = |job: &Job<'_>| {
        let work = Work {
            ty: job.ty,
            w: job.w,
            row_bytes: job.row_bytes,
            x: &xq,
            // SAFETY: `col < n`, inside `out` (checked above).
            out: unsafe { out_ptr.get().add(job.col) },
            ld: n,
            interleaved: job.interleaved,
        };
        // SAFETY: `path` runs here (checked above); jobs cover disjoint columns.
        unsafe { run_work(path, &work) };
    };
    if parallel {
        pool::run_jobs(jobs.len(), &|i| run(&jobs[i]));
    } else {
        jobs.iter().for_each(run);
    }
    Ok(())
}

/// The float weight `[sum of rows, k]` of `segments` (interleaved ones read back in row order)
/// into `out`, runs of rows spread over `pool::run_jobs`: a many-row product's dense copy, read
/// from the blocks the kernels hold (an interleaved weight's original pages stay paged out).
pub fn dequantize(k: usize, segments: &[Segment<'_>], out: &mut [f32]) -> CoreResult<()> {
    const RUN_ROWS: usize = 64; // a multiple of `interleave::ROWS`
    let n = check(&[] as &[f32], 0, k, segments, 0)?;
    if out.len() != n * k {
        return Err(invalid(
            "out",
            format!("`out` must hold {n} x {k} values; got {}", out.len()),
        ));
    }
    let mut jobs = Vec::new();
    let mut first = 0;
    for s in segments {
        let row_bytes = s.ty.row_bytes(k, "k")?;
        for (i, bytes) in s.data.chunks(RUN_ROWS * row_bytes).enumerate() {
            jobs.push((s, row_bytes, bytes, first + i * RUN_ROWS));
        }
        first += s.rows;
    }
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool::run_jobs(jobs.len(), &|j| {
        let (s, row_bytes, bytes, row) = jobs[j];
        let unpacked;
        let rows = if s.interleaved {
            unpacked = interleave::unpack(s.ty, bytes, row_bytes);
            &unpacked[..]
        } else {
            bytes
        };
        let len = rows.len() / row_bytes * k;
        // SAFETY: the jobs' rows are disjoint and inside `out` (`n * k` values, checked above).
        let out = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(row * k), len) };
        for (w, o) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(k)) {
            dequantize_row(s.ty, w, o);
        }
    });
    Ok(())
}

/// What this CPU has, uncapped: a path beyond `FERROLLM_CPU_ISA`'s cap still runs when asked
/// for by name (tests compare every variant), one the CPU lacks never does.
fn hardware() -> &'static CpuFeatures {
    static HARDWARE: std::sync::OnceLock<CpuFeatures> = std::sync::OnceLock::new();
    HARDWARE.get_or_init(CpuFeatures::uncapped)
}

/// The output columns after checking every extent the kernels follow.
fn check<X>(
    x: &[X],
    m: usize,
    k: usize,
    segments: &[Segment<'_>],
    out_len: usize,
) -> CoreResult<usize> {
    if x.len() != m * k {
        return Err(invalid(
            "x",
            format!("`x` must hold {m} x {k} values; got {}", x.len()),
        ));
    }
    let mut n = 0;
    for (i, s) in segments.iter().enumerate() {
        let want = s.rows * s.ty.row_bytes(k, "k")?;
        if s.data.len() != want {
            let msg = format!(
                "`segments[{i}]` must hold {} rows of {k} {} values ({want} bytes); got {} bytes",
                s.rows,
                s.ty.name(),
                s.data.len()
            );
            return Err(invalid("segments", msg));
        }
        if s.interleaved && !interleave::fits(s.ty, s.rows) {
            let msg = format!(
                "`segments[{i}]` is interleaved, which needs Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 in runs of \
                 {} rows; got {} rows of {}",
                interleave::ROWS,
                s.rows,
                s.ty.name()
            );
            return Err(invalid("segments", msg));
        }
        n += s.rows;
    }
    if out_len != m * n {
        return Err(invalid(
            "out",
            format!("`out` must hold {m} x {n} values; got {out_len}"),
        ));
    }
    Ok(n)
}

fn invalid(param: &str, message: String) -> CoreError {
    CoreError::invalid(param, "invalid_quantized_input", message)
}

/// A run of whole weight rows and the output column of its first.
struct Job<'a> {
    ty: BlockType,
    w: &'a [u8],
    row_bytes: usize,
    col: usize,
    interleaved: bool,
}

/// The segments cut into runs of rows: about four per thread when `parallel` (so a slow
/// thread does not hold up the step), never under `MIN_ROWS` rows (a run must outweigh the
/// pool's hand-off).
fn split<'a>(segments: &[Segment<'a>], k: usize, parallel: bool) -> Vec<Job<'a>> {
    const MIN_ROWS: usize = 16;
    let total: usize = segments.iter().map(|s| s.rows).sum();
    let pieces = if parallel {
        4 * rayon::current_num_threads()
    } else {
        1
    };
    let chunk = total.div_ceil(pieces).max(MIN_ROWS);
    let mut jobs = Vec::new();
    let mut col = 0;
    for s in segments {
        let row_bytes = s.data.len() / s.rows.max(1);
        debug_assert_eq!(Ok(row_bytes), s.ty.row_bytes(k, "k"));
        // An interleaved segment splits between runs only.
        let chunk = if s.interleaved {
            chunk.next_multiple_of(interleave::ROWS)
        } else {
            chunk
        };
        for (i, w) in s.data.chunks(chunk * row_bytes).enumerate() {
            jobs.push(Job {
                ty: s.ty,
                w,
                row_bytes,
                col: col + i * chunk,
                interleaved: s.interleaved,
            });
        }
        col += s.rows;
    }
    jobs
}

/// # Safety
/// `path` must run on this CPU and `work` satisfy `Work`'s contract.
unsafe fn run_work<X: Elem>(path: Path, work: &Work<'_, X>) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract.
    unsafe {
        match (path, work.interleaved) {
            (Path::Avx2, false) => return x86::tile_avx2(work),
            (Path::AvxVnni, false) => return x86::tile_avxvnni(work),
            (Path::Avx512Vnni, false) => return x86::tile_avx512vnni(work),
            (Path::Avx2, true) => return x86::interleaved_avx2(work),
            (Path::AvxVnni, true) => return x86::interleaved_avxvnni(work),
            (Path::Avx512Vnni, true) => return x86::interleaved_avx512vnni(work),
            (Path::Generic, _) => {}
        }
    }
    let _ = path;
    if work.interleaved {
        // The portable path reads rows: the runs are put back in order first.
        let rows = interleave::unpack(work.ty, work.w, work.row_bytes);
        generic_work(&Work {
            w: &rows,
            interleaved: false,
            ..*work
        });
    } else {
        generic_work(work);
    }
}

/// The portable kernel over a `Work`.
fn generic_work<X: Elem>(work: &Work<'_, X>) {
    let mut sums = [0f32; 4];
    let rows: Vec<usize> = (0..work.x.m).collect();
    for (n, w) in work.w.chunks_exact(work.row_bytes).enumerate() {
        for tile in rows.chunks(sums.len()) {
            let out = &mut sums[..tile.len()];
            generic::dot_rows(work.ty, w, work.x, tile, out);
            for (&r, &v) in tile.iter().zip(out.iter()) {
                // SAFETY: `r < m` and `n` is a row of `w` (Work's contract).
                unsafe { work.store::<1>(r, n, [v]) };
            }
        }
    }
}

/// `x` quantized in groups of 32, at `path`'s vector width; rows spread over rayon's pool
/// when `parallel` and there are enough of them to pay for it.
fn quantize_activations<X: Elem>(
    x: &[X],
    m: usize,
    k: usize,
    path: Path,
    parallel: bool,
) -> QuantizedRows {
    let mut xq = QuantizedRows::new(m, k);
    let groups = k / GROUP;
    let simd = path != Path::Generic;
    if parallel && m >= 16 {
        // Rows in runs of 8, each run one job, through disjoint chunks of the output.
        const RUN: usize = 8;
        let (q, d, s) = (
            SendPtr(xq.q.as_mut_ptr()),
            SendPtr(xq.d.as_mut_ptr()),
            SendPtr(xq.s.as_mut_ptr()),
        );
        pool::run_jobs(m.div_ceil(RUN), &|j| {
            for r in j * RUN..((j + 1) * RUN).min(m) {
                // SAFETY: row `r < m` of each buffer (sized for `m` rows by `new`) is written
                // by this job alone; the AVX2 variant runs only where `path` does.
                unsafe {
                    let q = std::slice::from_raw_parts_mut(q.get().add(r * k), k);
                    let d = std::slice::from_raw_parts_mut(d.get().add(r * groups), groups);
                    let s = std::slice::from_raw_parts_mut(s.get().add(r * groups), groups);
                    quantize_row_dispatch(simd, &x[r * k..][..k], q, d, s);
                }
            }
        });
    } else {
        for r in 0..m {
            let (q, d, s) = xq.row_mut(r);
            // SAFETY: the AVX2 variant runs only where `path`, an AVX2 path, does.
            unsafe { quantize_row_dispatch(simd, &x[r * k..][..k], q, d, s) };
        }
    }
    xq
}

/// # Safety
/// `simd` only where the CPU has AVX2 and FMA.
unsafe fn quantize_row_dispatch<X: Elem>(
    simd: bool,
    x: &[X],
    q: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller's contract.
        return unsafe { quantize_row_avx2(x, q, d, s) };
    }
    let _ = simd;
    act::quantize_row(x, q, d, s);
}

#[cfg(target_arch = "x86_64")]
use x86::quantize_row_avx2;

/// Rows `ids` of a `[rows, k]` weight of type `ty` (`data`, whole rows), dequantized into `out`
/// (`[ids.len(), k]`): an embedding lookup that never dequantizes the table.
pub fn dequantize_rows(
    ty: BlockType,
    data: &[u8],
    k: usize,
    ids: &[i64],
    out: &mut [f32],
) -> CoreResult<()> {
    let row_bytes = ty.row_bytes(k, "k")?;
    let rows = data.len() / row_bytes;
    if data.len() != rows * row_bytes {
        return Err(invalid(
            "data",
            format!(
                "`data` must be whole rows of {row_bytes} bytes; got {} bytes",
                data.len()
            ),
        ));
    }
    if out.len() != ids.len() * k {
        return Err(invalid(
            "out",
            format!(
                "`out` must hold {} x {k} values; got {}",
                ids.len(),
                out.len()
            ),
        ));
    }
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(k)) {
        let r = usize::try_from(id)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| {
                invalid(
                    "ids",
                    format!("`ids` entries must be in [0, {rows}); got {id}"),
                )
            })?;
        dequantize_row(ty, &data[r * row_bytes..][..row_bytes], o);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
