//! The [`Loader`] thread: owns a [`SlowTier`] and runs batches of reads ([`LoadJob`]) submitted
//! from the compute thread, so I/O overlaps compute; buffers move into a job and come back with
//! its result ([`LoadDone`]). The loader is the real [`TierIo`] of the tiered store.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::{lock, AlignedBuf, Progress, ReadReq, SlowTier, TierIo};

/// A batch of reads for the [`Loader`]: `tag` identifies it (e.g. a layer group).
#[derive(Debug)]
pub struct LoadJob {
    pub tag: u64,
    pub buf: AlignedBuf,
    pub reqs: Vec<ReadReq>,
    /// Told how many leading requests are complete as they complete, and finished when the job
    /// ends (a streamed job; see [`Progress`]).
    pub progress: Option<Arc<Progress>>,
}

/// A finished [`LoadJob`]: its buffer back, the result, and how long the tier took.
#[derive(Debug)]
pub struct LoadDone {
    pub tag: u64,
    pub buf: AlignedBuf,
    pub result: io::Result<()>,
    /// Bytes the job's reads cover (sum of their `len`).
    pub bytes: u64,
    /// Nanoseconds the tier spent on the job.
    pub busy_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// A job submitted with [`Loader::submit`].
    Tag(u64),
    /// A [`Loader::read_now`] call (ids private to the loader).
    Now(u64),
}

#[derive(Default)]
struct LoaderState {
    /// On-demand reads: run before `queue`.
    urgent: VecDeque<(Key, LoadJob)>,
    queue: VecDeque<(Key, LoadJob)>,
    /// Submitted and not yet finished, per key.
    outstanding: HashMap<Key, usize>,
    done: HashMap<Key, VecDeque<LoadDone>>,
    next_now: u64,
    shutdown: bool,
}

struct Shared {
    state: Mutex<LoaderState>,
    /// Signalled when a job is queued or on shutdown.
    work: Condvar,
    /// Signalled when a job finishes.
    finished: Condvar,
}

/// Loader thread: owns a [`SlowTier`] and runs batches submitted from the compute thread, so I/O
/// overlaps compute. Buffers move into a job and back on completion. On-demand reads
/// ([`Loader::read_now`]) run before queued jobs; queued jobs run in submission order.
pub struct Loader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    tier_name: &'static str,
    read_align: usize,
}

impl Loader {
    /// Starts the loader thread, which owns `tier`.
    pub fn spawn(tier: Box<dyn SlowTier>) -> Loader {
        let (tier_name, read_align) = (tier.name(), tier.read_align());
        let shared = Arc::new(Shared {
            state: Mutex::new(LoaderState::default()),
            work: Condvar::new(),
            finished: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("sift-loader".into())
            .spawn(move || loader_main(&s, tier))
            .expect("spawning the loader thread");
        Loader { shared, thread: Some(thread), tier_name, read_align }
    }

    /// Queues a job (non-blocking). Several jobs may share a tag; [`Loader::wait`] then returns
    /// them in completion order.
    pub fn submit(&self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>) {
        self.submit_job(LoadJob { tag, buf, reqs, progress: None });
    }

    /// Queues a job (non-blocking).
    pub fn submit_job(&self, job: LoadJob) {
        let key = Key::Tag(job.tag);
        let mut st = lock(&self.shared.state);
        *st.outstanding.entry(key).or_default() += 1;
        st.queue.push_back((key, job));
        drop(st);
        self.shared.work.notify_one();
    }

    /// Queues a job ahead of the jobs queued with [`Loader::submit`] (non-blocking), after the
    /// urgent ones already queued: on-demand reads, streamed through `progress`.
    pub fn submit_urgent(&self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>, progress: Option<Arc<Progress>>) {
        let key = Key::Tag(tag);
        let mut st = lock(&self.shared.state);
        *st.outstanding.entry(key).or_default() += 1;
        st.urgent.push_back((key, LoadJob { tag, buf, reqs, progress }));
        drop(st);
        self.shared.work.notify_one();
    }

    /// Blocks until job `tag` completes and returns it. If no job with this tag is queued,
    /// running or finished (and not yet taken), returns at once with an `InvalidInput` error and
    /// an empty buffer.
    pub fn wait(&self, tag: u64) -> LoadDone {
        self.wait_key(Key::Tag(tag), tag)
    }

    /// Job `tag` if it has completed (non-blocking).
    pub fn try_take(&self, tag: u64) -> Option<LoadDone> {
        let mut st = lock(&self.shared.state);
        take_done(&mut st, Key::Tag(tag))
    }

    /// Reads `reqs` into `buf` through the loader's tier and waits: the job runs before any
    /// queued job (after the one running, if any).
    pub fn read_now(&self, buf: AlignedBuf, reqs: Vec<ReadReq>) -> LoadDone {
        let mut st = lock(&self.shared.state);
        let id = st.next_now;
        st.next_now += 1;
        let key = Key::Now(id);
        *st.outstanding.entry(key).or_default() += 1;
        st.urgent.push_back((key, LoadJob { tag: id, buf, reqs, progress: None }));
        drop(st);
        self.shared.work.notify_one();
        self.wait_key(key, id)
    }

    /// Jobs queued and not yet started.
    pub fn queued(&self) -> usize {
        let st = lock(&self.shared.state);
        st.urgent.len() + st.queue.len()
    }

    /// The tier's [`SlowTier::name`].
    pub fn tier_name(&self) -> &'static str {
        self.tier_name
    }

    fn wait_key(&self, key: Key, tag: u64) -> LoadDone {
        let mut st = lock(&self.shared.state);
        loop {
            if let Some(d) = take_done(&mut st, key) {
                return d;
            }
            if !st.outstanding.contains_key(&key) {
                return LoadDone {
                    tag,
                    buf: AlignedBuf::new(0),
                    result: Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no loader job with tag {tag}"))),
                    bytes: 0,
                    busy_ns: 0,
                };
            }
            st = self.shared.finished.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn take_done(st: &mut LoaderState, key: Key) -> Option<LoadDone> {
    let q = st.done.get_mut(&key)?;
    let d = q.pop_front();
    if q.is_empty() {
        st.done.remove(&key);
    }
    d
}

fn loader_main(shared: &Shared, mut tier: Box<dyn SlowTier>) {
    loop {
        let (key, job) = {
            let mut st = lock(&shared.state);
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(j) = st.urgent.pop_front().or_else(|| st.queue.pop_front()) {
                    break j;
                }
                st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let LoadJob { tag, mut buf, reqs, progress } = job;
        let t0 = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| match &progress {
            Some(p) => tier.read_batch_progress(&mut buf, &reqs, p),
            None => tier.read_batch(&mut buf, &reqs),
        }))
        .unwrap_or_else(|_| Err(io::Error::other(format!("slow tier {} panicked", tier.name()))));
        if let Some(p) = &progress {
            p.finish(result.is_ok());
        }
        let busy_ns = t0.elapsed().as_nanos() as u64;
        let bytes = reqs.iter().map(|r| r.len as u64).sum();
        let mut st = lock(&shared.state);
        if let Some(n) = st.outstanding.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                st.outstanding.remove(&key);
            }
        }
        st.done.entry(key).or_default().push_back(LoadDone { tag, buf, result, bytes, busy_ns });
        drop(st);
        shared.finished.notify_all();
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        st.shutdown = true;
        // Queued jobs are dropped with their buffers; the running one (if any) finishes first.
        st.urgent.clear();
        st.queue.clear();
        drop(st);
        self.shared.work.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The loader as the tiered store's slow tier: waits are timed on the wall clock.
impl TierIo for Loader {
    fn name(&self) -> &'static str {
        self.tier_name()
    }

    fn read_align(&self) -> usize {
        self.read_align
    }

    fn submit(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>) {
        Loader::submit(self, tag, buf, reqs);
    }

    fn submit_urgent(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>, progress: Option<Arc<Progress>>) {
        Loader::submit_urgent(self, tag, buf, reqs, progress);
    }

    fn wait_progress(&mut self, _tag: u64, progress: &Progress, n: usize) -> (bool, u64) {
        let t0 = Instant::now();
        let ok = progress.wait_for(n);
        (ok, t0.elapsed().as_nanos() as u64)
    }

    fn wait(&mut self, tag: u64) -> (LoadDone, u64) {
        let t0 = Instant::now();
        let done = Loader::wait(self, tag);
        (done, t0.elapsed().as_nanos() as u64)
    }

    fn read_now(&mut self, buf: AlignedBuf, reqs: Vec<ReadReq>) -> (LoadDone, u64) {
        let t0 = Instant::now();
        let done = Loader::read_now(self, buf, reqs);
        (done, t0.elapsed().as_nanos() as u64)
    }
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader").field("tier", &self.tier_name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::test_util::{expected, model_bytes, model_path, Rng, PAGE};
    use crate::io::{open_slow_tier, MemTier, TierKind};
    use std::time::Duration;

    fn random_job(rng: &mut Rng, flen: u64) -> (AlignedBuf, Vec<ReadReq>) {
        let n = 1 + rng.below(12) as usize;
        let mut reqs = Vec::new();
        let mut at = 0;
        for _ in 0..n {
            let len = (1 + rng.below(256) as usize) * PAGE;
            let offset = rng.below(flen - len as u64) / PAGE as u64 * PAGE as u64;
            reqs.push(ReadReq::full(offset, len, at));
            at += len;
        }
        (AlignedBuf::new(at), reqs)
    }

    fn check_done(file: &[u8], d: &LoadDone, reqs: &[ReadReq]) {
        d.result.as_ref().unwrap();
        assert_eq!(d.bytes, reqs.iter().map(|r| r.len as u64).sum::<u64>());
        for r in reqs {
            assert!(d.buf[r.buf_offset..r.buf_offset + r.len] == expected(file, r)[..], "job {} {r:?}", d.tag);
        }
    }

    #[test]
    fn loader_runs_jobs_and_read_now() {
        let path = model_path();
        let file = model_bytes();
        let loader = Loader::spawn(open_slow_tier(&path, TierKind::Auto).unwrap());
        eprintln!("loader tier: {}", loader.tier_name());
        let mut rng = Rng(7);
        let mut jobs = HashMap::new();
        for tag in 0..12u64 {
            let (buf, reqs) = random_job(&mut rng, file.len() as u64);
            jobs.insert(tag, reqs.clone());
            loader.submit(tag * 10, buf, reqs);
        }
        // On-demand reads while jobs are queued.
        for _ in 0..3 {
            let (buf, reqs) = random_job(&mut rng, file.len() as u64);
            let d = loader.read_now(buf, reqs.clone());
            check_done(&file, &d, &reqs);
        }
        // Wait out of order; take with try_take once done.
        for tag in [50u64, 110, 0, 30] {
            let d = loader.wait(tag);
            assert_eq!(d.tag, tag);
            assert!(d.busy_ns > 0);
            check_done(&file, &d, &jobs[&(tag / 10)]);
        }
        for tag in (0..12u64).map(|t| t * 10).filter(|t| ![50, 110, 0, 30].contains(t)) {
            let d = loop {
                if let Some(d) = loader.try_take(tag) {
                    break d;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            check_done(&file, &d, &jobs[&(tag / 10)]);
        }
        assert!(loader.try_take(0).is_none());
        let none = loader.wait(12345);
        assert_eq!(none.result.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // Errors come back with the buffer.
        let d = loader.read_now(AlignedBuf::new(8192), vec![ReadReq::full(1, 4096, 0)]);
        assert_eq!(d.result.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(d.buf.len(), 8192);
        // Duplicate tags complete in order.
        let (b1, r1) = random_job(&mut rng, file.len() as u64);
        let (b2, r2) = random_job(&mut rng, file.len() as u64);
        loader.submit(99, b1, r1.clone());
        loader.submit(99, b2, r2.clone());
        check_done(&file, &loader.wait(99), &r1);
        check_done(&file, &loader.wait(99), &r2);
        assert_eq!(loader.queued(), 0);
    }

    /// A memory tier that takes 20 ms per batch, so jobs pile up in the queue.
    struct Slow(MemTier);
    impl SlowTier for Slow {
        fn name(&self) -> &'static str {
            "slow memory"
        }
        fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
            std::thread::sleep(Duration::from_millis(20));
            self.0.read_batch(buf, reqs)
        }
        fn file_len(&self) -> u64 {
            self.0.file_len()
        }
    }

    #[test]
    fn loader_read_now_jumps_the_queue() {
        let file = model_bytes();
        let loader = Loader::spawn(Box::new(Slow(MemTier::new(file.clone()))));
        let flen = file.len() as u64;
        for tag in 0..20u64 {
            loader.submit(tag, AlignedBuf::new(1 << 20), vec![ReadReq::full(tag << 20, 1 << 20, 0)]);
        }
        let r =
            ReadReq { offset: flen / PAGE as u64 * PAGE as u64, len: PAGE, buf_offset: 0, need: flen as usize % PAGE };
        let d = loader.read_now(AlignedBuf::new(PAGE), vec![r]);
        check_done(&file, &d, &[r]);
        let left = loader.queued();
        assert!(left >= 15, "read_now waited behind queued jobs ({left} left)");
        for tag in 0..20u64 {
            let d = loader.wait(tag);
            check_done(&file, &d, &[ReadReq::full(tag << 20, 1 << 20, 0)]);
        }
    }

    #[test]
    fn loader_drop_with_queued_jobs_does_not_hang() {
        let path = model_path();
        let t0 = Instant::now();
        {
            let loader = Loader::spawn(open_slow_tier(&path, TierKind::Auto).unwrap());
            for tag in 0..64u64 {
                loader.submit(tag, AlignedBuf::new(3 << 20), vec![ReadReq::full(tag << 20, 3 << 20, 0)]);
            }
        }
        {
            let loader = Loader::spawn(open_slow_tier(&path, TierKind::Auto).unwrap());
            drop(loader);
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
}
