//! A persistent thread pool whose workers spin between jobs, like ggml's.
//!
//! A decode step is ~300 small ops (SmolLM2: ~30 µs each); a fork-join that wakes threads through
//! the OS costs several µs per op. Here the calling thread is worker 0 and `n - 1` helper threads
//! wait for a new job by spinning on a generation counter for a while, then park. [`ThreadPool::run`]
//! publishes a job, runs its own share, and spins until every helper is done.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};

type Job = dyn Fn(usize, usize) + Sync;

/// How long an idle helper spins before it parks (iterations of `spin_loop`).
const SPIN_BEFORE_PARK: u32 = 1 << 17;

struct Shared {
    /// Incremented once per published job.
    generation: AtomicUsize,
    /// Helpers that finished the current job.
    done: AtomicUsize,
    /// The current job, as a raw fat pointer (see the SAFETY note in `run`).
    job: std::sync::Mutex<Option<JobPtr>>,
    sleeping: Vec<AtomicBool>,
    stop: AtomicBool,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and only dereferenced while `run` keeps it alive.
unsafe impl Send for JobPtr {}

/// A pool of `n_threads` workers (the caller counts as one).
pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    threads: Vec<(JoinHandle<()>, Thread)>,
}

impl ThreadPool {
    /// Starts `n_threads - 1` helpers (at least one worker: the caller).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            job: std::sync::Mutex::new(None),
            sleeping: (0..n).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        });
        let threads = (1..n)
            .map(|tid| {
                let s = Arc::clone(&shared);
                let h = thread::Builder::new()
                    .name(format!("sift-worker-{tid}"))
                    .spawn(move || worker(s, tid, n))
                    .expect("failed to spawn a worker thread");
                let t = h.thread().clone();
                (h, t)
            })
            .collect();
        ThreadPool { n, shared, threads }
    }

    /// Number of workers, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n
    }

    /// Runs `f(tid, n_threads)` on every worker and returns when all have finished.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n == 1 {
            f(0, 1);
            return;
        }
        let s = &*self.shared;
        // SAFETY: we erase the borrow's lifetime to hand it to the helpers. They only call it
        // between the generation bump below and their increment of `done`, and this function does
        // not return (so `f` stays alive) until `done` says every helper has finished with it.
        let ptr: *const Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(f) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(ptr));
        s.done.store(0, Release);
        s.generation.fetch_add(1, SeqCst);
        for (tid, (_, t)) in self.threads.iter().enumerate() {
            if s.sleeping[tid + 1].load(SeqCst) {
                t.unpark();
            }
        }
        f(0, self.n);
        let mut spins = 0u32;
        while s.done.load(Acquire) != self.n - 1 {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

fn worker(s: Arc<Shared>, tid: usize, n: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        loop {
            if s.stop.load(Acquire) {
                return;
            }
            if s.generation.load(Acquire) != seen {
                break;
            }
            spins += 1;
            if spins < SPIN_BEFORE_PARK {
                std::hint::spin_loop();
            } else {
                s.sleeping[tid].store(true, SeqCst);
                if s.generation.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                    thread::park();
                }
                s.sleeping[tid].store(false, SeqCst);
                spins = 0;
            }
        }
        seen = s.generation.load(Acquire);
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(JobPtr(p)) = job {
            // SAFETY: `run` keeps the closure alive until we increment `done` below.
            let f = unsafe { &*p };
            f(tid, n);
        }
        s.done.fetch_add(1, AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        for (h, t) in self.threads.drain(..) {
            t.unpark();
            let _ = h.join();
        }
    }
}

/// Splits `0..n` into `parts` nearly equal contiguous ranges and returns range `i`.
#[inline]
pub fn split(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    (n * i / parts)..(n * (i + 1) / parts)
}

/// A raw pointer to a mutable slice that workers write disjoint parts of.
#[derive(Clone, Copy)]
pub struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}
// SAFETY: users only write disjoint index ranges from different threads (see `slice`).
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(s: &mut [T]) -> Self {
        SharedMut { ptr: s.as_mut_ptr(), len: s.len() }
    }

    /// # Safety
    /// No two threads may hold overlapping ranges at the same time, and the original slice must
    /// outlive every use (guaranteed when used inside one [`ThreadPool::run`] call).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, r: std::ops::Range<usize>) -> &mut [T] {
        assert!(r.start <= r.end && r.end <= self.len, "SharedMut range out of bounds");
        // SAFETY: bounds checked above; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_runs_every_job() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n);
            let hits = AtomicUsize::new(0);
            for _ in 0..1000 {
                pool.run(&|tid, nth| {
                    assert!(tid < nth);
                    hits.fetch_add(1, Relaxed);
                });
            }
            assert_eq!(hits.load(Relaxed), 1000 * n);
        }
    }

    #[test]
    fn disjoint_writes_cover_the_output() {
        let pool = ThreadPool::new(2);
        let mut out = vec![0usize; 1001];
        let sm = SharedMut::new(&mut out);
        pool.run(&|tid, nth| {
            let r = split(1001, nth, tid);
            // SAFETY: split gives disjoint ranges per tid.
            let s = unsafe { sm.slice(r.clone()) };
            for (i, v) in s.iter_mut().enumerate() {
                *v = r.start + i;
            }
        });
        assert!(out.iter().enumerate().all(|(i, &v)| i == v));
    }

    #[test]
    fn helpers_wake_after_parking() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let hits = AtomicUsize::new(0);
        pool.run(&|_, _| {
            hits.fetch_add(1, Relaxed);
        });
        assert_eq!(hits.load(Relaxed), 2);
    }
}
