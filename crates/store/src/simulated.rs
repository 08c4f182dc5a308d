//! The slow tier of a simulated store: no bytes move, and every batch of reads takes the time an
//! [`IoCost`] (a device profile) says, on a virtual clock that the caller advances with compute
//! time. `sift simulate` replays a trace through a [`TieredStore`](crate::tiered::TieredStore) built on
//! this, so the cache and prefetch decisions are the engine's own; only time is modelled.
//!
//! The device runs one job at a time, as the real [`Loader`](crate::io::Loader) thread does:
//! queued preload jobs start in submission order when the device is free; an on-demand read
//! ([`SimIo::read_now`]) starts after the job running (if any) and before the queued ones, and
//! the compute thread waits for it.

use crate::io::{AlignedBuf, LoadDone, ReadReq};
use crate::tiered::IoCost;
use std::collections::VecDeque;

/// A simulated slow tier with its clock (nanoseconds since the store was built).
pub struct SimIo {
    cost: Box<dyn IoCost>,
    /// The compute thread's time.
    pub now: f64,
    /// When the device finishes the last job it started.
    free_at: f64,
    /// Submitted and not yet started: (tag, submitted at, duration, job).
    queue: VecDeque<(u64, f64, f64, LoadDone)>,
    /// Started: (tag, finishes at, job).
    started: Vec<(u64, f64, LoadDone)>,
}

impl SimIo {
    pub fn new(cost: Box<dyn IoCost>) -> SimIo {
        SimIo { cost, now: 0.0, free_at: 0.0, queue: VecDeque::new(), started: Vec::new() }
    }

    pub fn cost(&self) -> &dyn IoCost {
        self.cost.as_ref()
    }

    /// Starts queued jobs whose start time (device free, job submitted) is at or before `t`.
    fn settle(&mut self, t: f64) {
        while let Some(&(_, submitted, dur, _)) = self.queue.front() {
            let start = self.free_at.max(submitted);
            if start > t {
                break;
            }
            let (tag, _, _, done) = self.queue.pop_front().expect("front exists");
            self.free_at = start + dur;
            self.started.push((tag, self.free_at, done));
        }
    }

    fn job(&self, tag: u64, buf: AlignedBuf, reqs: &[ReadReq]) -> (f64, LoadDone) {
        let dur = self.cost.batch_ns(reqs).max(0.0);
        let bytes = reqs.iter().map(|r| r.len as u64).sum();
        (dur, LoadDone { tag, buf, result: Ok(()), bytes, busy_ns: dur as u64 })
    }

    /// Queues a job at the current time.
    pub fn submit(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>) {
        let (dur, done) = self.job(tag, buf, &reqs);
        self.settle(self.now);
        self.queue.push_back((tag, self.now, dur, done));
        self.settle(self.now);
    }

    /// Waits for job `tag`; returns it and the time waited.
    pub fn wait(&mut self, tag: u64) -> (LoadDone, f64) {
        // Nothing else can be submitted while the compute thread waits: every queued job starts.
        self.settle(f64::INFINITY);
        match self.started.iter().position(|j| j.0 == tag) {
            Some(i) => {
                let (_, end, done) = self.started.swap_remove(i);
                let stall = (end - self.now).max(0.0);
                self.now = self.now.max(end);
                (done, stall)
            }
            None => {
                let done = LoadDone {
                    tag,
                    buf: AlignedBuf::new(0),
                    result: Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "no such job")),
                    bytes: 0,
                    busy_ns: 0,
                };
                (done, 0.0)
            }
        }
    }

    /// An on-demand read: runs after the job in progress, before queued ones; the caller waits.
    pub fn read_now(&mut self, buf: AlignedBuf, reqs: Vec<ReadReq>) -> (LoadDone, f64) {
        self.settle(self.now);
        let (dur, done) = self.job(0, buf, &reqs);
        let start = self.now.max(self.free_at);
        self.free_at = start + dur;
        let stall = self.free_at - self.now;
        self.now = self.free_at;
        (done, stall)
    }

    /// Compute time passes.
    pub fn advance(&mut self, ns: f64) {
        self.now += ns.max(0.0);
    }
}
