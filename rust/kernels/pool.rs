//! Where a kernel's parallel jobs run: on the calling thread's OpenMP team when the embedding
//! program has handed over its OpenMP runtime (`use_openmp`: torch's libgomp, so the kernels
//! share the threads torch's own ops just finished on), else on rayon's pool.
//!
//! Why not rayon alongside torch: after each parallel region libgomp's workers spin for a
//! while before sleeping, and on a machine with as many cores as threads a rayon worker woken
//! meanwhile waits for the OS to preempt a spinning one. In a decode step, where torch ops and
//! the block matmuls alternate every few microseconds, the two pools would fight at every call.

use std::ffi::{c_uint, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;

/// libgomp's entry point for `#pragma omp parallel`: runs `f(data)` on every thread of the
/// calling thread's team (`num_threads` 0: the team's default size), returning when all have.
type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);

/// The OpenMP runtime handed over by `use_openmp`.
#[derive(Clone, Copy)]
struct OpenMp {
    parallel: GompParallel,
}

static OPENMP: OnceLock<OpenMp> = OnceLock::new();

/// Runs parallel jobs on the OpenMP runtime whose `GOMP_parallel` is at `gomp_parallel` from now
/// on (the first call wins; false for later ones).
///
/// # Safety
/// `gomp_parallel` must be the address of libgomp's `GOMP_parallel` (or a compatible one,
/// such as LLVM's or Intel's OpenMP runtimes export), loaded for the life of the process.
pub unsafe fn use_openmp(gomp_parallel: usize) -> bool {
    // SAFETY: the caller's contract: the address is a function of this type.
    let parallel = unsafe { std::mem::transmute::<usize, GompParallel>(gomp_parallel) };
    OPENMP.set(OpenMp { parallel }).is_ok()
}

/// Whether jobs run on an OpenMP team (else on rayon's pool).
pub fn on_openmp() -> bool {
    OPENMP.get().is_some()
}

/// What the team's threads share: the jobs, the next one to take, the first panic.
struct Team<'a> {
    job: &'a (dyn Fn(usize) + Sync),
    num_jobs: usize,
    next: AtomicUsize,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// Each team thread takes jobs until none is left (dynamic: a thread the OS delays does not
/// hold the others up). A panic is caught here (it must not unwind into C) and re-raised on
/// the calling thread.
extern "C" fn team_body(data: *mut c_void) {
    // SAFETY: `data` is the `Team` that `run_jobs` keeps alive until GOMP_parallel returns.
    let team = unsafe { &*(data as *const Team<'_>) };
    loop {
        let i = team.next.fetch_add(1, Ordering::Relaxed);
        if i >= team.num_jobs {
            return;
        }
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (team.job)(i))) {
            team.next.store(team.num_jobs, Ordering::Relaxed);
            let mut first = team.panic.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert(panic);
            return;
        }
    }
}

/// Calls `job(i)` for every `i < num_jobs`, spread over the OpenMP team or rayon's pool, and
/// returns when all are done (re-raising the first panic of any).
pub fn run_jobs(num_jobs: usize, job: &(dyn Fn(usize) + Sync)) {
    if num_jobs <= 1 {
        (0..num_jobs).for_each(job);
        return;
    }
    let Some(omp) = OPENMP.get() else {
        (0..num_jobs).into_par_iter().for_each(job);
        return;
    };
    let team = Team {
        job,
        num_jobs,
        next: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    // SAFETY: `use_openmp`'s contract makes `parallel` libgomp's GOMP_parallel; `team` outlives
    // the call, which returns only when every thread has left `team_body`.
    unsafe { (omp.parallel)(team_body, &team as *const Team<'_> as *mut c_void, 0, 0) };
    if let Some(panic) = team.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        resume_unwind(panic);
    }
}

/// A raw pointer the jobs share; each writes only its own elements.
#[derive(Clone, Copy)]
pub struct SendPtr<X>(pub *mut X);
// SAFETY: the pointees are plain numbers and the jobs write disjoint elements.
unsafe impl<X: Copy> Send for SendPtr<X> {}
// SAFETY: as above.
unsafe impl<X: Copy> Sync for SendPtr<X> {}

impl<X> SendPtr<X> {
    /// The pointer (a method, so closures capture the whole `SendPtr`, not its field).
    pub fn get(self) -> *mut X {
        self.0
    }
}

/// The threads `run_jobs` spreads over (rayon's count; an OpenMP team is the same size in
/// torch, which sizes both from the cores).
pub fn num_threads() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_runs_once_and_a_panic_reaches_the_caller() {
        let counts: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        run_jobs(counts.len(), &|i| {
            counts[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        let caught = catch_unwind(|| run_jobs(8, &|i| assert!(i != 5, "job 5")));
        assert!(caught.is_err());
    }
}
