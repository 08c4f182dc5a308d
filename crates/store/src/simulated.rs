//! The slow tier of a simulated store: no bytes move, and every batch of reads takes the time an
//! [`IoCost`] (a device profile) says, on a virtual clock that the caller advances with compute
//! time. `sift simulate` replays a trace through a [`TieredStore`](crate::tiered::TieredStore) built on
//! this, so the cache and prefetch decisions are the engine's own; only time is modelled.
//!
//! The device runs one job at a time, as the real [`Loader`](crate::io::Loader) thread does:
//! queued preload jobs start in submission order when the device is free; an on-demand read
//! ([`TierIo::read_now`]) starts after the job running (if any) and before the queued ones, and
//! the compute thread waits for it; on-demand parts queued with [`TierIo::submit_urgent`]
//! start the same way, in their order. [`SimIo`] is the store's [`TierIo`]: it moves no bytes, and
//! the copies the store would make are charged to the clock at [`IoCost::copy_ns`].

use crate::io::{AlignedBuf, LoadDone, Progress, ReadReq, TierIo};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The timing of a simulated slow tier and of memory copies, for a store replaying a trace
/// (`sift simulate`); `sift_sim::profile::DeviceProfile` implements it from a device profile.
pub trait IoCost: Send {
    /// Nanoseconds from submitting `reqs` together (as one batch, all in flight at once up to
    /// the device's queue depth) to the last one completing.
    fn batch_ns(&self, reqs: &[ReadReq]) -> f64;
    /// Nanoseconds to copy `bytes` from one memory buffer to another.
    fn copy_ns(&self, bytes: u64) -> f64;
    /// The alignment the simulated device's reads need (as [`TierIo::read_align`]); a page by
    /// default.
    fn read_align(&self) -> usize {
        crate::io::DIRECT_ALIGN
    }
}

/// A simulated slow tier with its clock (nanoseconds since the store was built).
pub struct SimIo {
    cost: Box<dyn IoCost>,
    /// The compute thread's time.
    now: f64,
    /// When the device finishes the last job it started.
    free_at: f64,
    /// Submitted and not yet started: (tag, submitted at, duration, job); urgent ones start
    /// first.
    queue: VecDeque<(u64, f64, f64, LoadDone)>,
    urgent: VecDeque<(u64, f64, f64, LoadDone)>,
    /// Started: (tag, finishes at, job).
    started: Vec<(u64, f64, LoadDone)>,
    /// Streamed jobs: per tag, the share of the job's time by which each prefix of its requests
    /// has arrived (requests finish in order, in proportion to their bytes); and when each
    /// started job began.
    shares: HashMap<u64, Vec<f64>>,
    began: HashMap<u64, f64>,
}

impl SimIo {
    /// A device whose reads and copies take the times `cost` gives; the clock starts at 0.
    pub fn new(cost: Box<dyn IoCost>) -> SimIo {
        SimIo {
            cost,
            now: 0.0,
            free_at: 0.0,
            queue: VecDeque::new(),
            urgent: VecDeque::new(),
            started: Vec::new(),
            shares: HashMap::new(),
            began: HashMap::new(),
        }
    }

    /// The device's timing.
    pub fn cost(&self) -> &dyn IoCost {
        self.cost.as_ref()
    }

    /// Starts queued jobs whose start time (device free, job submitted) is at or before `t`.
    fn settle(&mut self, t: f64) {
        loop {
            let q = if self.urgent.is_empty() { &mut self.queue } else { &mut self.urgent };
            let Some(&(_, submitted, dur, _)) = q.front() else { break };
            let start = self.free_at.max(submitted);
            if start > t {
                break;
            }
            let (tag, _, _, done) = q.pop_front().expect("front exists");
            if self.shares.contains_key(&tag) {
                self.began.insert(tag, start);
            }
            self.free_at = start + dur;
            self.started.push((tag, self.free_at, done));
        }
    }

    fn job(&self, tag: u64, buf: AlignedBuf, reqs: &[ReadReq]) -> (f64, LoadDone) {
        let dur = self.cost.batch_ns(reqs).max(0.0);
        let bytes = reqs.iter().map(|r| r.len as u64).sum();
        (dur, LoadDone { tag, buf, result: Ok(()), bytes, busy_ns: dur as u64 })
    }
}

impl TierIo for SimIo {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn read_align(&self) -> usize {
        self.cost.read_align()
    }

    /// Queues a job at the current time.
    fn submit(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>) {
        let (dur, done) = self.job(tag, buf, &reqs);
        self.settle(self.now);
        self.queue.push_back((tag, self.now, dur, done));
        self.settle(self.now);
    }

    /// Queues a job at the current time, ahead of the queued preloads.
    fn submit_urgent(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>, progress: Option<Arc<Progress>>) {
        if progress.is_some() {
            let total: usize = reqs.iter().map(|r| r.len).sum::<usize>().max(1);
            let mut at = 0usize;
            let mut shares = vec![0.0];
            for r in &reqs {
                at += r.len;
                shares.push(at as f64 / total as f64);
            }
            self.shares.insert(tag, shares);
        }
        let (dur, done) = self.job(tag, buf, &reqs);
        self.settle(self.now);
        self.urgent.push_back((tag, self.now, dur, done));
        self.settle(self.now);
    }

    /// Waits for job `tag`; returns it and the time waited.
    fn wait(&mut self, tag: u64) -> (LoadDone, u64) {
        // Nothing else can be submitted while the compute thread waits: every queued job starts.
        self.settle(f64::INFINITY);
        match self.started.iter().position(|j| j.0 == tag) {
            Some(i) => {
                let (_, end, done) = self.started.swap_remove(i);
                self.shares.remove(&tag);
                self.began.remove(&tag);
                let stall = (end - self.now).max(0.0);
                self.now = self.now.max(end);
                (done, stall as u64)
            }
            None => {
                let done = LoadDone {
                    tag,
                    buf: AlignedBuf::new(0),
                    result: Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "no such job")),
                    bytes: 0,
                    busy_ns: 0,
                };
                (done, 0)
            }
        }
    }

    /// Waits until the job's first `n` requests have arrived: the job's start plus their share of
    /// its time.
    fn wait_progress(&mut self, tag: u64, _progress: &Progress, n: usize) -> (bool, u64) {
        self.settle(f64::INFINITY);
        let Some(&(_, end, _)) = self.started.iter().find(|j| j.0 == tag) else { return (false, 0) };
        let (Some(shares), Some(&start)) = (self.shares.get(&tag), self.began.get(&tag)) else { return (false, 0) };
        let share = shares.get(n).or(shares.last()).copied().unwrap_or(1.0);
        let at = start + (end - start) * share;
        let stall = (at - self.now).max(0.0);
        self.now = self.now.max(at);
        (true, stall as u64)
    }

    /// An on-demand read: runs after the job in progress, before queued ones; the caller waits.
    fn read_now(&mut self, buf: AlignedBuf, reqs: Vec<ReadReq>) -> (LoadDone, u64) {
        self.settle(self.now);
        // Urgent jobs queued earlier run first.
        while let Some((tag, submitted, dur, done)) = self.urgent.pop_front() {
            let start = self.free_at.max(submitted);
            if self.shares.contains_key(&tag) {
                self.began.insert(tag, start);
            }
            self.free_at = start + dur;
            self.started.push((tag, self.free_at, done));
        }
        let (dur, done) = self.job(0, buf, &reqs);
        let start = self.now.max(self.free_at);
        self.free_at = start + dur;
        let stall = self.free_at - self.now;
        self.now = self.free_at;
        (done, stall as u64)
    }

    /// No bytes move: the store keeps no arena and copies nothing.
    fn moves_bytes(&self) -> bool {
        false
    }

    /// The copy the store would make takes [`IoCost::copy_ns`] on the clock.
    fn charge_copy(&mut self, bytes: usize) {
        let ns = self.cost.copy_ns(bytes as u64);
        self.advance(ns);
    }

    fn clock_ns(&self) -> Option<f64> {
        Some(self.now)
    }

    /// Compute time passes.
    fn advance(&mut self, ns: f64) {
        self.now += ns.max(0.0);
    }
}
