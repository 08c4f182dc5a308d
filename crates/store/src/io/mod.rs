//! Slow tier: reading byte ranges of the pack file from disk into memory, bypassing the page cache.
//!
//! The memory budget sift enforces is a hard one (it is checked under a cgroup memory limit), so
//! weight bytes must never linger in the page cache: every tier opens the file with `O_DIRECT`
//! and reads into [`AlignedBuf`]s (4 KiB aligned), each read aligned as the file system's direct
//! I/O needs (`statx`'s `STATX_DIOALIGN`: 512 bytes on most disks, a page where it does not say). Where `O_DIRECT` is refused (tmpfs on older
//! kernels, some FUSE file systems) the file is opened normally and every batch is followed by
//! `posix_fadvise(POSIX_FADV_DONTNEED)` over the ranges it read.
//!
//! Tiers ([`SlowTier`]):
//! - [`UringTier`]: io_uring with up to `queue_depth` reads in flight (64 by default; the
//!   submission queue is refilled after every reap), requests split into 1 MiB pieces, short
//!   reads retried for the remainder, the file registered with the ring. Buffers are *not*
//!   registered: they change with every batch, and registering them per batch pins and unpins the
//!   same pages `O_DIRECT` pins per read anyway, so there is nothing to gain for this workload.
//! - [`PreadTier`]: the fallback when io_uring is unavailable (seccomp, old kernels): `pread` from
//!   a few scoped threads that pull 1 MiB pieces from a shared list.
//! - [`MemTier`]: the whole file in memory, for tests.
//!
//! [`open_slow_tier`] picks the best available. [`Loader`] runs a tier on its own thread so reads
//! overlap compute: buffers move into a job and come back with its result. [`plan_reads`] turns a
//! list of wanted byte ranges into a few large aligned reads laid out back to back in one buffer.
//! [`TierIo`] is the slow tier as the tiered store sees it: the [`Loader`] implements it, and so
//! does the simulated device of [`crate::simulated`].
//!
//! Semantics shared by every tier: a [`ReadReq`] reads file bytes `[offset, offset + len)` into
//! `buf[buf_offset..buf_offset + len]`; `offset`, `len` and `buf_offset` are multiples of the
//! tier's [`SlowTier::read_align`]; the read may run past the end of the file as long as its first `need` bytes
//! exist; bytes past the end of the file are set to zero; fewer than `need` bytes is an
//! [`std::io::ErrorKind::UnexpectedEof`] error naming the file and offset. Requests in one batch must
//! not overlap in the buffer.
//!
//! Modules: [`AlignedBuf`] (`buf`); [`ReadReq`] and [`plan_reads`] (`plan`); [`Progress`] of a
//! job read in a stream (`progress`); the tiers, with
//! [`TierKind`] and [`open_slow_tier`] (`tier`); the [`Loader`] thread (`loader`); [`TierIo`]
//! (`tier_io`).

mod buf;
mod loader;
mod plan;
mod progress;
#[cfg(test)]
mod test_util;
mod tier;
mod tier_io;

pub use buf::AlignedBuf;
pub use loader::{LoadDone, LoadJob, Loader};
pub use plan::{plan_reads, ReadReq, ReadShape};
pub use progress::Progress;
pub use tier::{
    open_slow_tier, MemTier, PackAndSource, PreadTier, SlowTier, TierKind, UringTier, DEFAULT_PREAD_THREADS,
    DEFAULT_QUEUE_DEPTH, MAX_PIECE,
};
pub use tier_io::TierIo;

use std::sync::{Mutex, MutexGuard};

/// The coarsest alignment any tier's reads need, and the alignment of every [`AlignedBuf`]: a
/// page. A tier's own ([`SlowTier::read_align`]) may be finer: 512 bytes where the file system's
/// direct I/O allows it.
pub const DIRECT_ALIGN: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; recover the guard if something did.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
