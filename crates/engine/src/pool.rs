//! A persistent thread pool whose workers spin between jobs, like ggml's.
//!
//! A decode step is ~300 small ops (SmolLM2: ~30 µs each); a fork-join that wakes threads through
//! the OS costs several µs per op. Here the calling thread is worker 0 and `n - 1` helper threads
//! wait for a new job by spinning on a generation counter for a while, then park.
//!
//! Work is handed out dynamically ([`ThreadPool::for_each`]: chunks claimed from an atomic
//! counter), and the caller never waits for a helper that has not started: when the caller has
//! claimed the last chunk it closes the job and waits only for helpers that are inside it. On a
//! busy machine (more runnable threads than cores) a descheduled helper therefore costs nothing,
//! instead of a scheduler time slice per op.
//!
//! Two of llama.cpp's threading settings map onto the pool: the workers that take part in jobs
//! ([`ThreadPool::set_active`]: `-t` for one-token decode steps, `-tb` for prompt batches; the
//! others park) and how long idle workers poll for the next job ([`ThreadPool::set_poll`],
//! `--poll 0..100`; 0 parks at once, which leaves a busy machine's cores to other processes).
//! The pool also stops polling by itself while another process takes its cores
//! ([`ThreadPool::adapt_polling`]).

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

type Job = dyn Fn(usize) + Sync;

/// How long an idle helper spins before it parks (iterations of `spin_loop`).
pub const SPIN_BEFORE_PARK: u32 = 1 << 17;

struct Shared {
    /// Incremented once per published job.
    generation: AtomicUsize,
    /// The newest generation that is closed to late helpers.
    closed: AtomicUsize,
    /// Helpers currently inside a job (or checking whether they may enter one).
    entered: AtomicUsize,
    /// The current job, as a raw fat pointer (see the SAFETY note in `publish`).
    job: Mutex<Option<JobPtr>>,
    sleeping: Vec<AtomicBool>,
    stop: AtomicBool,
    /// Spins before parking: the configured count ([`ThreadPool::set_spin`]), or 0 while
    /// contention is detected ([`ThreadPool::adapt_polling`]).
    spin: AtomicU32,
    configured_spin: AtomicU32,
    /// Contention control's state (written by the publishing thread only).
    window_jobs: AtomicU32,
    window_stalls: AtomicU32,
    parked_jobs_left: AtomicU32,
    stall_episodes: AtomicU64,
    /// Workers that take part in jobs (ids `0..active`; [`ThreadPool::set_active`]).
    active: AtomicUsize,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and only dereferenced while `publish` keeps it alive.
unsafe impl Send for JobPtr {}

/// A pool of `n_threads` workers (the caller counts as one).
pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    threads: Vec<(JoinHandle<()>, Thread)>,
    /// Workers for one-token steps and for batches (llama.cpp's `-t`, `-tb`; both `n` unless set).
    steps: (usize, usize),
    /// llama.cpp's `--poll` level the pool was set to.
    poll: u8,
}

impl ThreadPool {
    /// Starts `n_threads - 1` helpers (at least one worker: the caller).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            closed: AtomicUsize::new(0),
            entered: AtomicUsize::new(0),
            job: Mutex::new(None),
            sleeping: (0..n).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
            spin: AtomicU32::new(SPIN_BEFORE_PARK),
            configured_spin: AtomicU32::new(SPIN_BEFORE_PARK),
            window_jobs: AtomicU32::new(0),
            window_stalls: AtomicU32::new(0),
            parked_jobs_left: AtomicU32::new(0),
            stall_episodes: AtomicU64::new(0),
            active: AtomicUsize::new(n),
        });
        let threads = (1..n)
            .map(|id| {
                let s = Arc::clone(&shared);
                let h = thread::Builder::new()
                    .name(format!("sift-worker-{id}"))
                    .spawn(move || worker(s, id))
                    .expect("failed to spawn a worker thread");
                let t = h.thread().clone();
                (h, t)
            })
            .collect();
        ThreadPool { n, shared, threads, steps: (n, n), poll: 50 }
    }

    /// Workers for one-token steps and for batches (`-t`, `-tb`; each at most the pool's).
    pub fn set_step_threads(&mut self, decode: usize, batch: usize) {
        self.steps = (decode.clamp(1, self.n), batch.clamp(1, self.n));
        self.set_active(self.steps.0);
    }

    /// `-t` and `-tb`.
    pub fn step_threads(&self) -> (usize, usize) {
        self.steps
    }

    /// Makes the workers of a step of `n_tokens` tokens active: `-t` for one, `-tb` for more.
    pub fn for_tokens(&self, n_tokens: usize) {
        self.set_active(if n_tokens == 1 { self.steps.0 } else { self.steps.1 });
    }

    /// The `--poll` level last set ([`ThreadPool::set_poll`]).
    pub fn poll_level(&self) -> u8 {
        self.poll
    }

    /// How long idle helpers spin before parking (iterations of `spin_loop`; default
    /// [`SPIN_BEFORE_PARK`], several ms). A caller that often blocks between jobs — on reads, under
    /// a memory budget — sets it low, so idle helpers give their core to the I/O thread instead of
    /// spinning through the wait.
    pub fn set_spin(&self, iterations: u32) {
        self.shared.configured_spin.store(iterations, Relaxed);
        if self.shared.parked_jobs_left.load(Relaxed) == 0 {
            self.shared.spin.store(iterations, Relaxed);
        }
    }

    /// llama.cpp's `--poll` level (0-100, default 50): how long idle helpers spin before parking,
    /// in proportion ([`SPIN_BEFORE_PARK`] at 50, twice that at 100). 0 parks at once: each job
    /// then wakes helpers through the OS (a few µs), but a helper never holds a core that another
    /// process wants while it waits.
    pub fn set_poll(&mut self, level: u8) {
        self.poll = level;
        self.set_spin(spin_for_poll(level));
    }

    /// Number of workers that take part in jobs, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.active.load(Relaxed)
    }

    /// Workers the pool was started with: the most [`ThreadPool::set_active`] can ask for.
    pub fn capacity(&self) -> usize {
        self.n
    }

    /// Lets workers `0..k` (clamped to `1..=capacity()`) take part in the next jobs; the others
    /// park until they are asked again. Called between jobs by the thread that publishes them (an
    /// engine switches between its decode and batch thread counts).
    pub fn set_active(&self, k: usize) {
        self.shared.active.store(k.clamp(1, self.n), SeqCst);
    }

    /// Calls `f(range, worker)` for consecutive chunks of `0..n` of `chunk` items until all are
    /// done; `worker` (< `n_threads()`) identifies the physical thread, for per-thread scratch.
    pub fn for_each(&self, n: usize, chunk: usize, f: &(dyn Fn(Range<usize>, usize) + Sync)) {
        let chunk = chunk.max(1);
        if self.n_threads() == 1 || n <= chunk {
            if n > 0 {
                f(0..n, 0);
            }
            return;
        }
        let next = AtomicUsize::new(0);
        self.publish(&|worker| loop {
            let start = next.fetch_add(1, Relaxed) * chunk;
            if start >= n {
                break;
            }
            f(start..(start + chunk).min(n), worker);
        });
    }

    /// Runs `f(part, n_threads)` once for every `part` in `0..n_threads`, spread over the workers
    /// that are free (a part's number is not a thread id; use it with [`split`]).
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.n_threads();
        self.for_each(n, 1, &|r, _| f(r.start, n));
    }

    /// Hands `job` to the helpers, runs it here too, and returns once no helper is inside it.
    fn publish(&self, job: &(dyn Fn(usize) + Sync + '_)) {
        let s = &*self.shared;
        // SAFETY: we erase the borrow's lifetime to hand the job to the helpers. A helper only
        // calls it after registering in `entered` and seeing the job still open; we close the job
        // and then wait until `entered` is zero before returning, so `job` outlives every call.
        let ptr: *const Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(ptr));
        let gen = s.generation.fetch_add(1, SeqCst) + 1;
        let active = self.n_threads();
        for (i, (_, t)) in self.threads.iter().enumerate().take(active - 1) {
            if s.sleeping[i + 1].load(SeqCst) {
                t.unpark();
            }
        }
        let started = Instant::now();
        job(0);
        s.closed.store(gen, SeqCst);
        let finished = Instant::now();
        let mut spins = 0u32;
        while s.entered.load(SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.adapt_polling(finished.elapsed(), finished - started);
    }

    /// Contention control, run by the publishing thread after each job with how long it waited
    /// for helpers once its own part was done and how long that part took. Items are claimed one
    /// at a time, so a helper that keeps its core finishes at most one item after the caller ran
    /// out, and the caller's part took at least one item: a wait longer than twice that part and
    /// [`STALL`] (a stall) means a helper lost its core mid-job, to another process. Helpers that spin between
    /// jobs then compete with that process all the time and are preempted inside jobs again and
    /// again; helpers that sleep are woken with priority and finish their item at once. So after
    /// [`STALLS_TO_PARK`] stalls within [`STALL_WINDOW`] jobs the helpers stop polling for
    /// [`PARKED_JOBS`] jobs (a few tokens), then poll again as configured; a stall while they
    /// sleep extends that.
    fn adapt_polling(&self, waited: Duration, own_part: Duration) {
        let s = &*self.shared;
        let stalled = waited > STALL + 2 * own_part;
        // Only this thread writes these counters: plain loads and stores suffice.
        let parked = s.parked_jobs_left.load(Relaxed);
        if parked > 0 {
            let left = if stalled { PARKED_JOBS } else { parked - 1 };
            s.parked_jobs_left.store(left, Relaxed);
            if left == 0 {
                s.spin.store(s.configured_spin.load(Relaxed), Relaxed);
            }
            return;
        }
        let jobs = s.window_jobs.load(Relaxed) + 1;
        let stalls = s.window_stalls.load(Relaxed) + u32::from(stalled);
        if stalls >= STALLS_TO_PARK {
            s.spin.store(0, Relaxed);
            s.parked_jobs_left.store(PARKED_JOBS, Relaxed);
            s.stall_episodes.fetch_add(1, Relaxed);
            s.window_jobs.store(0, Relaxed);
            s.window_stalls.store(0, Relaxed);
        } else if jobs >= STALL_WINDOW {
            s.window_jobs.store(0, Relaxed);
            s.window_stalls.store(0, Relaxed);
        } else {
            s.window_jobs.store(jobs, Relaxed);
            s.window_stalls.store(stalls, Relaxed);
        }
    }

    /// How many times contention made the helpers stop polling ([`ThreadPool::adapt_polling`]).
    pub fn stall_episodes(&self) -> u64 {
        self.shared.stall_episodes.load(Relaxed)
    }
}

/// A wait for helpers longer than this (plus twice the caller's own part) is a stall (a decode
/// work item takes a few µs to tens of µs, a time slice lost to another process milliseconds).
const STALL: Duration = Duration::from_micros(200);
/// Stalls within [`STALL_WINDOW`] jobs that make the helpers stop polling.
const STALLS_TO_PARK: u32 = 3;
const STALL_WINDOW: u32 = 256;
/// Jobs the helpers then sleep between (a decode token of a small model is ~300 jobs).
const PARKED_JOBS: u32 = 8192;

fn worker(s: Arc<Shared>, id: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        let gen = loop {
            if s.stop.load(Acquire) {
                return;
            }
            let g = s.generation.load(Acquire);
            if g != seen {
                break g;
            }
            spins += 1;
            // A worker outside the active set parks at once: it has no job to wait for.
            if spins < s.spin.load(Relaxed) && id < s.active.load(Relaxed) {
                std::hint::spin_loop();
            } else {
                s.sleeping[id].store(true, SeqCst);
                if s.generation.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                    thread::park();
                }
                s.sleeping[id].store(false, SeqCst);
                spins = 0;
            }
        };
        seen = gen;
        if id >= s.active.load(SeqCst) {
            continue;
        }
        s.entered.fetch_add(1, SeqCst);
        if s.closed.load(SeqCst) < gen {
            // The job is open, so the caller is still inside `publish(gen)` and waits for us.
            let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(JobPtr(p)) = job {
                // SAFETY: see `publish`: the job stays alive until `entered` drops to zero.
                let f = unsafe { &*p };
                f(id);
            }
        }
        s.entered.fetch_sub(1, SeqCst);
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

/// Spin iterations for a `--poll` level (0-100; 50 is [`SPIN_BEFORE_PARK`]).
pub fn spin_for_poll(level: u8) -> u32 {
    (u64::from(SPIN_BEFORE_PARK) * u64::from(level.min(100)) / 50) as u32
}

/// Splits `0..n` into `parts` nearly equal contiguous ranges and returns range `i`.
#[inline]
pub fn split(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    (n * i / parts)..(n * (i + 1) / parts)
}

/// A mutable slice that workers write disjoint parts of: made from a `&'a mut [T]`, which stays
/// mutably borrowed for as long as a `SharedMut<'a, T>` (or a copy of it) is used, so it cannot
/// outlive the slice, nor can the slice be read or written past it while it is in use.
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _slice: PhantomData<&'a mut [T]>,
}

impl<T> Clone for SharedMut<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<'_, T> {}

// SAFETY: a `SharedMut` is a `&mut [T]` whose parts are handed out by `slice`; moving it to
// another thread moves access to `T`s, which is sound for `T: Send`, as for `&mut [T]`.
unsafe impl<T: Send> Send for SharedMut<'_, T> {}
// SAFETY: sharing it lets several threads call `slice`, whose contract (no two threads hold
// overlapping ranges at the same time) makes every `T` reached from one thread at a time, which
// needs only `T: Send` (as `Mutex<T>: Sync` does).
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Shares `s` for disjoint writes; `s` stays mutably borrowed while this is in use.
    pub fn new(s: &'a mut [T]) -> Self {
        SharedMut { ptr: s.as_mut_ptr(), len: s.len(), _slice: PhantomData }
    }

    /// Elements `r` of the slice, for writing.
    ///
    /// # Safety
    /// No two threads may hold overlapping ranges at the same time, and a thread may not hold two
    /// overlapping ranges at once (each range is a `&mut`). That the slice outlives the result is
    /// guaranteed by the borrow (`'a`).
    ///
    /// # Panics
    /// If `r` is not inside the slice.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, r: Range<usize>) -> &mut [T] {
        assert!(r.start <= r.end && r.end <= self.len, "SharedMut range out of bounds");
        // SAFETY: `r` is inside the `len` elements at `ptr`, which the `&'a mut [T]` this was made
        // from keeps valid and unaliased by anyone but `SharedMut` copies for as long as `self`
        // lives; no other live reference overlaps `r`, by the caller's contract.
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
    fn for_each_covers_every_item_once_even_when_helpers_are_busy() {
        let pool = ThreadPool::new(3);
        for n in [0usize, 1, 7, 100, 1001] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(n, 8, &|r, w| {
                assert!(w < 3);
                for i in r {
                    hits[i].fetch_add(1, Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
        }
        // Many tiny jobs in a row: no job may be lost or run twice.
        let total = AtomicUsize::new(0);
        for _ in 0..5000 {
            pool.for_each(4, 1, &|r, _| {
                total.fetch_add(r.len(), Relaxed);
            });
        }
        assert_eq!(total.load(Relaxed), 20000);
    }

    #[test]
    fn only_active_workers_take_part() {
        let mut pool = ThreadPool::new(3);
        for (active, poll) in [(1, 50), (2, 0), (3, 0), (2, 100), (3, 50)] {
            pool.set_active(active);
            pool.set_poll(poll);
            assert_eq!(pool.n_threads(), active);
            let seen: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            let parts = AtomicUsize::new(0);
            for _ in 0..200 {
                pool.for_each(64, 1, &|r, w| {
                    seen[w].fetch_add(r.len(), Relaxed);
                });
                pool.run(&|part, n| {
                    assert!(part < n && n == active);
                    parts.fetch_add(1, Relaxed);
                });
            }
            let total: usize = seen.iter().map(|s| s.load(Relaxed)).sum();
            assert_eq!(total, 200 * 64, "active {active}");
            assert!(seen[active..].iter().all(|s| s.load(Relaxed) == 0), "a parked worker ran a job (active {active})");
            assert_eq!(parts.load(Relaxed), 200 * active);
        }
        pool.set_active(0);
        assert_eq!(pool.n_threads(), 1, "at least the caller");
        pool.set_active(9);
        assert_eq!(pool.n_threads(), 3, "at most the pool's capacity");
        assert_eq!(spin_for_poll(50), SPIN_BEFORE_PARK);
        assert_eq!(spin_for_poll(0), 0);
        assert_eq!(spin_for_poll(255), 2 * SPIN_BEFORE_PARK);
    }

    #[test]
    fn stalls_are_waits_far_longer_than_the_callers_part() {
        let mut pool = ThreadPool::new(2);
        let us = Duration::from_micros;
        // A helper that finishes its last item after the caller ran out (at most one item, and the
        // caller's part took at least one): no stall, however long the items.
        for _ in 0..1000 {
            pool.adapt_polling(us(150) + 2 * us(3000), us(3000));
            pool.adapt_polling(us(150), us(5));
        }
        assert_eq!((pool.stall_episodes(), pool.shared.spin.load(Relaxed)), (0, SPIN_BEFORE_PARK));
        // Two stalls in a window are not enough; a third is.
        pool.adapt_polling(us(3000), us(20));
        pool.adapt_polling(us(3000), us(20));
        assert_eq!(pool.stall_episodes(), 0);
        pool.adapt_polling(us(3000), us(20));
        assert_eq!((pool.stall_episodes(), pool.shared.spin.load(Relaxed)), (1, 0));
        // Helpers sleep for PARKED_JOBS quiet jobs, a stall meanwhile starts that over, then they
        // poll again as configured (here --poll 100).
        pool.set_poll(100);
        assert_eq!(pool.shared.spin.load(Relaxed), 0, "set_poll must not end the sleeping period");
        for _ in 0..PARKED_JOBS - 1 {
            pool.adapt_polling(us(10), us(20));
        }
        pool.adapt_polling(us(3000), us(20));
        for _ in 0..PARKED_JOBS - 1 {
            pool.adapt_polling(us(10), us(20));
        }
        assert_eq!(pool.shared.spin.load(Relaxed), 0);
        pool.adapt_polling(us(10), us(20));
        assert_eq!((pool.stall_episodes(), pool.shared.spin.load(Relaxed)), (1, spin_for_poll(100)));
    }

    #[test]
    fn a_helper_that_keeps_stalling_stops_the_polling() {
        // Worker 1 stalls inside its item (as when another process takes its core): the pool
        // stops polling and still runs every item of every job.
        let pool = ThreadPool::new(2);
        for _ in 0..10 {
            let done = AtomicUsize::new(0);
            pool.for_each(8, 1, &|r, w| {
                // The caller's items take long enough for the helper to claim one.
                let ms = if w == 1 { 30.0 } else { 1.0 };
                std::thread::sleep(std::time::Duration::from_secs_f64(ms / 1000.0));
                done.fetch_add(r.len(), Relaxed);
            });
            assert_eq!(done.load(Relaxed), 8);
        }
        assert!(pool.stall_episodes() >= 1);
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
