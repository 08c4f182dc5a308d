//! [`TierIo`]: the slow tier as the tiered store uses it. The store submits jobs of reads, waits
//! for them and counts the time it waited; it does not know whether the reads go to disk (the
//! [`Loader`](super::Loader) thread, on the wall clock) or to a simulated device
//! ([`SimIo`](crate::simulated::SimIo), which moves no bytes and keeps a virtual clock).

use super::{AlignedBuf, LoadDone, Progress, ReadReq, DIRECT_ALIGN};
use std::sync::Arc;

/// The slow tier of a [`TieredStore`](crate::tiered::TieredStore): where its reads go and how
/// long they take.
///
/// Jobs follow the [`Loader`](super::Loader)'s rules: queued jobs ([`TierIo::submit`]) run one
/// at a time in submission order; an on-demand read ([`TierIo::read_now`]) runs after the job in
/// progress (if any) and before the queued ones. Every wait reports the nanoseconds the caller
/// waited, measured on the tier's clock: the wall clock, or the virtual one of
/// [`TierIo::clock_ns`].
///
/// The default methods describe a tier on the wall clock whose reads land real bytes.
pub trait TierIo: Send {
    /// The tier's name for reports (`"io_uring"`, `"pread"`, `"memory"`, `"simulated"`).
    fn name(&self) -> &'static str;

    /// The alignment its reads need ([`SlowTier::read_align`](super::SlowTier::read_align));
    /// a page by default.
    fn read_align(&self) -> usize {
        DIRECT_ALIGN
    }

    /// Queues a job reading `reqs` into `buf` (non-blocking); [`TierIo::wait`] takes it back.
    fn submit(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>);

    /// Queues a job as [`TierIo::submit`] does, but ahead of every queued job that was not
    /// itself submitted this way (on-demand reads: they run in their order, after the job in
    /// progress and before queued preloads). With `progress`, the job's leading requests can be
    /// waited for ([`TierIo::wait_progress`]) before the whole job ends.
    fn submit_urgent(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>, progress: Option<Arc<Progress>>);

    /// Waits until the first `n` requests of job `tag` (submitted with `progress`) are complete:
    /// whether they are (false: the job failed first; [`TierIo::wait`] then tells why) and the
    /// nanoseconds waited. The job stays to be taken back with [`TierIo::wait`].
    fn wait_progress(&mut self, tag: u64, progress: &Progress, n: usize) -> (bool, u64);

    /// Waits for job `tag`: the job and the nanoseconds waited. With no such job, returns at
    /// once with an `InvalidInput` error and an empty buffer.
    fn wait(&mut self, tag: u64) -> (LoadDone, u64);

    /// Reads `reqs` into `buf` before any queued job and waits: the job and the nanoseconds
    /// waited.
    fn read_now(&mut self, buf: AlignedBuf, reqs: Vec<ReadReq>) -> (LoadDone, u64);

    /// Whether finished jobs' buffers hold the bytes read. A tier that moves none (a
    /// simulation) leaves the store without an arena: the store copies nothing, and reports
    /// every copy it would have made to [`TierIo::charge_copy`].
    fn moves_bytes(&self) -> bool {
        true
    }

    /// The store copied `bytes` from read buffers into its arena (or, when the tier does not
    /// [move bytes](TierIo::moves_bytes), would have): a tier on a virtual clock charges the
    /// copy's time to it. Nothing by default: a real copy takes its own time.
    fn charge_copy(&mut self, _bytes: usize) {}

    /// The virtual clock (nanoseconds since the tier was made); `None` for a tier on the wall
    /// clock.
    fn clock_ns(&self) -> Option<f64> {
        None
    }

    /// `ns` of compute pass on the virtual clock (reads in flight go on meanwhile). Nothing by
    /// default: the wall clock passes by itself.
    fn advance(&mut self, _ns: f64) {}
}
