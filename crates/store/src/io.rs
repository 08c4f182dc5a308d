//! Slow tier: reading byte ranges of the pack file from disk into memory, bypassing the page cache.
//!
//! The memory budget sift enforces is a hard one (it is checked under a cgroup memory limit), so
//! weight bytes must never linger in the page cache: every tier opens the file with `O_DIRECT`
//! and reads into [`AlignedBuf`]s (4 KiB aligned). Where `O_DIRECT` is refused (tmpfs on older
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
//!
//! Semantics shared by every tier: a [`ReadReq`] reads file bytes `[offset, offset + len)` into
//! `buf[buf_offset..buf_offset + len]`; `offset`, `len` and `buf_offset` are multiples of
//! [`DIRECT_ALIGN`]; the read may run past the end of the file as long as its first `need` bytes
//! exist; bytes past the end of the file are set to zero; fewer than `need` bytes is an
//! [`io::ErrorKind::UnexpectedEof`] error naming the file and offset. Requests in one batch must
//! not overlap in the buffer.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use io_uring::{opcode, types, IoUring};

/// Alignment (and granularity) of file offsets, lengths and buffer offsets of every read.
pub const DIRECT_ALIGN: usize = 4096;
/// Reads larger than this are split into pieces of this size.
pub const MAX_PIECE: usize = 1 << 20;
/// io_uring queue depth [`open_slow_tier`] uses.
pub const DEFAULT_QUEUE_DEPTH: usize = 64;
/// Number of pread threads [`open_slow_tier`] uses.
pub const DEFAULT_PREAD_THREADS: usize = 4;

const ALIGN_U64: u64 = DIRECT_ALIGN as u64;

fn is_aligned(x: u64) -> bool {
    x.is_multiple_of(ALIGN_U64)
}

// ---------------------------------------------------------------------------------------------
// AlignedBuf

/// Buffers at least this large are mapped straight from the OS (anonymous `mmap`): their pages
/// are zero and take no memory until first written, so a buffer sized for the worst case costs
/// only what is used (and a simulated store's buffers, never written, cost nothing).
const MMAP_MIN: usize = 1 << 20;

/// Heap buffer aligned to [`DIRECT_ALIGN`], its length a multiple of it, zero-initialised.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Whether `ptr` is an `mmap` of `len` bytes (else an allocator block).
    mapped: bool,
}

// SAFETY: an AlignedBuf uniquely owns its allocation, exactly like a Box<[u8]>; it has no interior
// mutability and no thread affinity, so moving it to or sharing `&` of it with another thread is
// as sound as for Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` only gives out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to a multiple of [`DIRECT_ALIGN`].
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.checked_next_multiple_of(DIRECT_ALIGN).expect("AlignedBuf length overflows usize");
        if len == 0 {
            return AlignedBuf { ptr: NonNull::dangling(), len: 0, mapped: false };
        }
        if len >= MMAP_MIN {
            // SAFETY: an anonymous private mapping of `len` bytes at an address of the kernel's
            // choosing touches no existing memory; the result is checked before use. Anonymous
            // pages are zero-filled and page-aligned (DIRECT_ALIGN is the page size).
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw != libc::MAP_FAILED {
                let ptr = NonNull::new(raw as *mut u8).expect("mmap returned null");
                return AlignedBuf { ptr, len, mapped: true };
            }
            // Fall back to the allocator (e.g. under a mapping-count limit).
        }
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size (len > 0) and a valid power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { ptr, len, mapped: false }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, DIRECT_ALIGN).expect("AlignedBuf length too large")
    }

    /// Length in bytes (a multiple of [`DIRECT_ALIGN`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for reads of `len` initialised bytes (allocated zeroed, or
        // dangling with len 0), and the borrow of `self` keeps it alive and unaliased by `&mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Raw pointer to the first byte (for I/O submission).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if self.mapped {
            // SAFETY: `ptr` is the start of a mapping of exactly `len` bytes made in `new`, owned
            // uniquely by this buffer and not unmapped before.
            unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
            return;
        }
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout and has not
        // been freed (we own it uniquely).
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut b = AlignedBuf::new(self.len);
        b.as_mut_slice().copy_from_slice(self.as_slice());
        b
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Requests, validation, pieces

/// One read: file bytes `[offset, offset + len)` into `buf[buf_offset..buf_offset + len]`.
///
/// `offset`, `len` and `buf_offset` must be multiples of [`DIRECT_ALIGN`]. The read may run past
/// the end of the file only if its first `need` (`<= len`) bytes exist; bytes past the end of the
/// file are set to zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReq {
    pub offset: u64,
    pub len: usize,
    pub buf_offset: usize,
    pub need: usize,
}

impl ReadReq {
    /// A read that must deliver all of its `len` bytes.
    pub fn full(offset: u64, len: usize, buf_offset: usize) -> ReadReq {
        ReadReq { offset, len, buf_offset, need: len }
    }
}

fn invalid(path: &Path, msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {msg}", path.display()))
}

/// Checks alignment, bounds and that no two requests overlap in the buffer.
fn validate(path: &Path, buf_len: usize, reqs: &[ReadReq]) -> io::Result<()> {
    let mut dests: Vec<(usize, usize)> = Vec::with_capacity(reqs.len());
    for r in reqs {
        if !is_aligned(r.offset) || !r.len.is_multiple_of(DIRECT_ALIGN) || !r.buf_offset.is_multiple_of(DIRECT_ALIGN) {
            return Err(invalid(
                path,
                format!("misaligned read {r:?}: offset, len and buf_offset must be multiples of {DIRECT_ALIGN}"),
            ));
        }
        if r.need > r.len {
            return Err(invalid(path, format!("read {r:?} needs more bytes than it reads")));
        }
        let fits = r.buf_offset.checked_add(r.len).is_some_and(|end| end <= buf_len);
        if !fits || r.offset.checked_add(r.len as u64).is_none() {
            return Err(invalid(path, format!("read {r:?} does not fit a buffer of {buf_len} bytes")));
        }
        if r.len > 0 {
            dests.push((r.buf_offset, r.len));
        }
    }
    dests.sort_unstable();
    for w in dests.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            return Err(invalid(path, format!("reads overlap in the buffer at byte {}", w[1].0)));
        }
    }
    Ok(())
}

fn eof_error(path: &Path, req: &ReadReq, got_to: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "{}: unexpected end of file: read at offset {} needs {} bytes but the file ends at byte {got_to}",
            path.display(),
            req.offset,
            req.need
        ),
    )
}

fn with_context(path: &Path, offset: u64, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: read at offset {offset}: {e}", path.display()))
}

/// A request, or a `MAX_PIECE` slice of one, plus progress.
#[derive(Clone, Copy, Debug)]
struct Piece {
    /// Index of the request this piece belongs to.
    req: usize,
    file_off: u64,
    buf_off: usize,
    len: usize,
    /// Bytes of this piece that must arrive.
    need: usize,
    /// Bytes arrived so far.
    done: usize,
    /// Transient-error retries so far.
    retries: u32,
}

fn split_pieces(reqs: &[ReadReq]) -> Vec<Piece> {
    let mut pieces = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let mut rel = 0;
        while rel < r.len {
            let len = (r.len - rel).min(MAX_PIECE);
            pieces.push(Piece {
                req: i,
                file_off: r.offset + rel as u64,
                buf_off: r.buf_offset + rel,
                len,
                need: r.need.saturating_sub(rel).min(len),
                done: 0,
                retries: 0,
            });
            rel += len;
        }
    }
    pieces
}

/// After `n` more bytes arrived for `p`: whether the piece has hit the end of the file (and the
/// remainder must not be re-read). With `O_DIRECT` a read only ends at an unaligned position at
/// the end of the file, so that counts as the end too (re-reading there would be misaligned).
fn at_eof(p: &Piece, n: usize, direct: bool) -> bool {
    n == 0 || (direct && !is_aligned(p.file_off + p.done as u64))
}

const MAX_RETRIES: u32 = 64;

fn is_transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN
}

// ---------------------------------------------------------------------------------------------
// Opening files

/// Opens `path` for reading with `O_DIRECT` when the file system supports it (checked with one
/// aligned read), else without. Returns the file and whether it is direct.
fn open_file(path: &Path, allow_direct: bool) -> io::Result<(File, bool)> {
    if allow_direct {
        match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => {
                let mut probe = AlignedBuf::new(DIRECT_ALIGN);
                match f.read_at(probe.as_mut_slice(), 0) {
                    Ok(_) => return Ok((f, true)),
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(e) => return Err(with_context(path, 0, e)),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    let f = File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok((f, false))
}

/// For files opened without `O_DIRECT`: drops the pages a batch read from the page cache.
fn drop_cached(file: &File, reqs: &[ReadReq]) {
    for r in reqs.iter().filter(|r| r.len > 0) {
        // SAFETY: posix_fadvise takes no pointers; the descriptor is open for as long as `file`
        // is borrowed. The advice is only a hint, so its result is ignored.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                r.offset as libc::off_t,
                r.len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The trait

/// A source of file bytes: performs batches of aligned reads.
pub trait SlowTier: Send {
    /// `"io_uring"`, `"pread"` or `"memory"`.
    fn name(&self) -> &'static str;
    /// Performs every read into `buf`; returns when all completed, or the first error (after
    /// every read already in flight has finished, so nothing writes into `buf` afterwards).
    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()>;
    /// Length of the file when the tier was opened.
    fn file_len(&self) -> u64;
}

// ---------------------------------------------------------------------------------------------
// io_uring

/// io_uring + `O_DIRECT`, up to `queue_depth` reads in flight, the file registered with the ring.
pub struct UringTier {
    ring: IoUring,
    file: File,
    path: PathBuf,
    len: u64,
    depth: usize,
    direct: bool,
    /// Whether the file is registered (index 0) with the ring.
    fixed: bool,
    /// Set when io_uring_enter failed with an unexpected error: the ring is not used again.
    broken: bool,
}

impl UringTier {
    /// Opens `path` and sets up a ring of `queue_depth` entries (clamped to 1..=4096). Fails if
    /// io_uring is unavailable (disabled, seccomp, kernel older than 5.6).
    pub fn open(path: &Path, queue_depth: usize) -> io::Result<UringTier> {
        Self::open_opts(path, queue_depth, true)
    }

    fn open_opts(path: &Path, queue_depth: usize, allow_direct: bool) -> io::Result<UringTier> {
        let (file, direct) = open_file(path, allow_direct)?;
        let len = file.metadata()?.len();
        let depth = queue_depth.clamp(1, 4096);
        let ring = IoUring::new(depth.next_power_of_two() as u32)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "io_uring lacks IORING_OP_READ"));
        }
        let fixed = ring.submitter().register_files(&[file.as_raw_fd()]).is_ok();
        let depth = depth.min(ring.params().sq_entries() as usize);
        Ok(UringTier { ring, file, path: path.to_path_buf(), len, depth, direct, fixed, broken: false })
    }

    /// Whether the file is read with `O_DIRECT` (else page-cache pages are dropped after reads).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Reads kept in flight at most.
    pub fn queue_depth(&self) -> usize {
        self.depth
    }

    /// Whether the file is registered with the ring.
    pub fn is_file_registered(&self) -> bool {
        self.fixed
    }
}

/// The SQE reading the rest of piece `p` (number `idx`) to `ptr`; `fixed`: use registered file 0.
fn read_entry(fixed: bool, fd: i32, ptr: *mut u8, p: &Piece, idx: usize) -> io_uring::squeue::Entry {
    let len = (p.len - p.done) as u32; // <= MAX_PIECE
    let off = p.file_off + p.done as u64;
    let e = if fixed {
        opcode::Read::new(types::Fixed(0), ptr, len).offset(off).build()
    } else {
        opcode::Read::new(types::Fd(fd), ptr, len).offset(off).build()
    };
    e.user_data(idx as u64)
}

impl SlowTier for UringTier {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn file_len(&self) -> u64 {
        self.len
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(format!(
                "{}: io_uring ring unusable after an earlier failure",
                self.path.display()
            )));
        }
        validate(&self.path, buf.len(), reqs)?;
        let mut pieces = split_pieces(reqs);
        // From here on `buf` is only touched through `base`: the kernel writes into it while reads
        // are in flight, so no Rust reference to its bytes is created until every read is reaped.
        let base = buf.as_mut_ptr();
        let fd = self.file.as_raw_fd();
        let mut next = 0; // next piece never submitted
        let mut retry: Vec<usize> = Vec::new(); // pieces to (re)submit for their remainder
        let mut pushed = 0usize; // entries pushed to the SQ
        let mut reaped = 0usize; // completions reaped
        let mut first_err: Option<io::Error> = None;
        // Nothing in the loop should panic; if something does, abort rather than unwind with
        // reads in flight. Defused (forgotten) on every normal way out.
        let guard = AbortOnUnwind;
        loop {
            if first_err.is_none() {
                let mut sq = self.ring.submission();
                while pushed - reaped < self.depth {
                    let idx = match retry.pop() {
                        Some(i) => i,
                        None if next < pieces.len() => {
                            next += 1;
                            next - 1
                        }
                        None => break,
                    };
                    let p = &pieces[idx];
                    // SAFETY: validate() checked buf_offset + len <= buf.len() for every request
                    // and pieces lie within their request, so `base + buf_off + done` and the
                    // following `len - done` bytes are inside the allocation.
                    let ptr = unsafe { base.add(p.buf_off + p.done) };
                    let entry = read_entry(self.fixed, fd, ptr, p, idx);
                    // SAFETY: the entry writes `len - done` bytes at `ptr`, inside `buf`, which we
                    // borrow mutably until this function returns; it does not return (nor unwind:
                    // `guard` aborts) before every pushed entry has completed. Pieces do not
                    // overlap (validated), so no two reads in flight write the same bytes, and
                    // the registered file / fd stays open as long as `self`.
                    if unsafe { sq.push(&entry) }.is_err() {
                        retry.push(idx);
                        break;
                    }
                    pushed += 1;
                }
            }
            if pushed == reaped {
                break;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                let errno = e.raw_os_error().unwrap_or(0);
                if !(is_transient(errno) || errno == libc::EBUSY) {
                    self.broken = true;
                    let unsubmitted = self.ring.submission().len();
                    if pushed - reaped > unsubmitted {
                        // Reads are in flight into `buf` and we can no longer wait for them:
                        // returning (or unwinding) would let the kernel write into memory the
                        // caller may free. There is no sound way out.
                        eprintln!("sift io_uring: io_uring_enter failed with reads in flight: {e}");
                        std::process::abort();
                    }
                    // Nothing reached the kernel; the queued entries are never submitted since
                    // the ring is not used again.
                    std::mem::forget(guard);
                    return Err(io::Error::new(e.kind(), format!("{}: io_uring_enter: {e}", self.path.display())));
                }
            }
            for cqe in self.ring.completion() {
                reaped += 1;
                let idx = cqe.user_data() as usize;
                let res = cqe.result();
                let p = &mut pieces[idx];
                let req = &reqs[p.req];
                if res < 0 {
                    let errno = -res;
                    if is_transient(errno) && p.retries < MAX_RETRIES {
                        p.retries += 1;
                        retry.push(idx);
                    } else if first_err.is_none() {
                        let off = p.file_off + p.done as u64;
                        first_err = Some(with_context(&self.path, off, io::Error::from_raw_os_error(errno)));
                    }
                    continue;
                }
                let n = res as usize;
                if n > p.len - p.done {
                    first_err.get_or_insert_with(|| {
                        io::Error::other(format!("{}: io_uring returned too many bytes", self.path.display()))
                    });
                    continue;
                }
                p.done += n;
                if p.done == p.len {
                    continue;
                }
                if at_eof(p, n, self.direct) {
                    if p.done < p.need {
                        first_err.get_or_insert_with(|| eof_error(&self.path, req, p.file_off + p.done as u64));
                    } else {
                        // SAFETY: the piece's bytes lie inside `buf` (validated), its only read
                        // has completed, and no other read in flight touches them (pieces do not
                        // overlap), so writing them here races with nothing.
                        unsafe { std::ptr::write_bytes(base.add(p.buf_off + p.done), 0, p.len - p.done) };
                    }
                } else {
                    // Short read that did not reach the end of the file: read the remainder.
                    retry.push(idx);
                }
            }
        }
        std::mem::forget(guard);
        if let Some(e) = first_err {
            return Err(e);
        }
        if !self.direct {
            drop_cached(&self.file, reqs);
        }
        Ok(())
    }
}

/// Aborts the process when dropped, i.e. when unwinding out of [`UringTier::read_batch`] while
/// reads may be in flight: unwinding would let the kernel write into a buffer the caller may
/// already have freed.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!("sift io_uring: panic with reads in flight; aborting");
        std::process::abort();
    }
}

// ---------------------------------------------------------------------------------------------
// pread

/// Fallback tier: `pread` (with `O_DIRECT` where possible) from a few scoped threads.
pub struct PreadTier {
    file: File,
    path: PathBuf,
    len: u64,
    threads: usize,
    direct: bool,
}

impl PreadTier {
    /// Opens `path`; batches use up to `threads` threads (clamped to 1..=64, the caller's
    /// thread included).
    pub fn open(path: &Path, threads: usize) -> io::Result<PreadTier> {
        Self::open_opts(path, threads, true)
    }

    fn open_opts(path: &Path, threads: usize, allow_direct: bool) -> io::Result<PreadTier> {
        let (file, direct) = open_file(path, allow_direct)?;
        let len = file.metadata()?.len();
        Ok(PreadTier { file, path: path.to_path_buf(), len, threads: threads.clamp(1, 64), direct })
    }

    /// Whether the file is read with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

fn pread_piece(file: &File, path: &Path, direct: bool, req: &ReadReq, mut p: Piece, dst: &mut [u8]) -> io::Result<()> {
    while p.done < p.len {
        match file.read_at(&mut dst[p.done..], p.file_off + p.done as u64) {
            Ok(n) => {
                p.done += n;
                if p.done < p.len && at_eof(&p, n, direct) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(with_context(path, p.file_off + p.done as u64, e)),
        }
    }
    if p.done < p.need {
        return Err(eof_error(path, req, p.file_off + p.done as u64));
    }
    dst[p.done..].fill(0);
    Ok(())
}

impl SlowTier for PreadTier {
    fn name(&self) -> &'static str {
        "pread"
    }

    fn file_len(&self) -> u64 {
        self.len
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        validate(&self.path, buf.len(), reqs)?;
        let mut pieces = split_pieces(reqs);
        // Carve `buf` into one disjoint `&mut` slice per piece (pieces do not overlap: validated).
        pieces.sort_unstable_by_key(|p| p.buf_off);
        let mut work: Vec<(Piece, &mut [u8])> = Vec::with_capacity(pieces.len());
        let mut rest: &mut [u8] = buf.as_mut_slice();
        let mut at = 0;
        for p in pieces {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(p.buf_off - at);
            let (dst, tail) = tail.split_at_mut(p.len);
            rest = tail;
            at = p.buf_off + p.len;
            work.push((p, dst));
        }
        // Pop from the back: reverse so pieces are read roughly in request order.
        work.reverse();
        let threads = self.threads.min(work.len());
        let (file, path, direct) = (&self.file, self.path.as_path(), self.direct);
        let result = if threads <= 1 {
            work.into_iter().rev().try_for_each(|(p, dst)| pread_piece(file, path, direct, &reqs[p.req], p, dst))
        } else {
            let queue = Mutex::new(work);
            let failed = AtomicBool::new(false);
            let first_err: Mutex<Option<io::Error>> = Mutex::new(None);
            let worker = || {
                while !failed.load(Ordering::Relaxed) {
                    let Some((p, dst)) = lock(&queue).pop() else { break };
                    if let Err(e) = pread_piece(file, path, direct, &reqs[p.req], p, dst) {
                        failed.store(true, Ordering::Relaxed);
                        lock(&first_err).get_or_insert(e);
                    }
                }
            };
            std::thread::scope(|s| {
                for _ in 1..threads {
                    s.spawn(worker);
                }
                worker();
            });
            match first_err.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        };
        if !self.direct {
            drop_cached(&self.file, reqs);
        }
        result
    }
}

// ---------------------------------------------------------------------------------------------
// memory

/// The whole file in memory (for tests and tiny models): same semantics as the disk tiers.
pub struct MemTier {
    bytes: Arc<[u8]>,
    path: PathBuf,
}

impl MemTier {
    /// Serves `bytes` as the file.
    pub fn new(bytes: Arc<[u8]>) -> MemTier {
        MemTier { bytes, path: PathBuf::from("<memory>") }
    }

    /// Reads the whole file at `path` once.
    pub fn from_file(path: &Path) -> io::Result<MemTier> {
        let bytes = std::fs::read(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(MemTier { bytes: bytes.into(), path: path.to_path_buf() })
    }
}

impl SlowTier for MemTier {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        validate(&self.path, buf.len(), reqs)?;
        let file_len = self.bytes.len() as u64;
        for r in reqs {
            let avail = file_len.saturating_sub(r.offset).min(r.len as u64) as usize;
            if avail < r.need {
                return Err(eof_error(&self.path, r, file_len));
            }
            let dst = &mut buf[r.buf_offset..r.buf_offset + r.len];
            if avail > 0 {
                let start = r.offset as usize;
                dst[..avail].copy_from_slice(&self.bytes[start..start + avail]);
            }
            dst[avail..].fill(0);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Choosing a tier

/// Which slow tier to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TierKind {
    /// io_uring if it works here, else pread.
    #[default]
    Auto,
    Uring,
    Pread,
    Memory,
}

impl TierKind {
    /// Parses `auto`, `io_uring` (or `uring`), `pread`, `memory` (or `mem`).
    pub fn parse(s: &str) -> Option<TierKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(TierKind::Auto),
            "io_uring" | "uring" | "io-uring" => Some(TierKind::Uring),
            "pread" => Some(TierKind::Pread),
            "memory" | "mem" => Some(TierKind::Memory),
            _ => None,
        }
    }

    /// `"auto"`, `"io_uring"`, `"pread"` or `"memory"`.
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Auto => "auto",
            TierKind::Uring => "io_uring",
            TierKind::Pread => "pread",
            TierKind::Memory => "memory",
        }
    }
}

impl fmt::Display for TierKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TierKind {
    type Err = String;
    fn from_str(s: &str) -> Result<TierKind, String> {
        TierKind::parse(s).ok_or_else(|| format!("unknown slow tier '{s}' (auto|io_uring|pread|memory)"))
    }
}

/// Opens a slow tier of `kind` for `path`; `Auto` is io_uring where it can be set up, else pread.
/// Logs nothing: [`SlowTier::name`] says which one it is.
pub fn open_slow_tier(path: &Path, kind: TierKind) -> io::Result<Box<dyn SlowTier>> {
    Ok(match kind {
        TierKind::Uring => Box::new(UringTier::open(path, DEFAULT_QUEUE_DEPTH)?),
        TierKind::Pread => Box::new(PreadTier::open(path, DEFAULT_PREAD_THREADS)?),
        TierKind::Memory => Box::new(MemTier::from_file(path)?),
        TierKind::Auto => match UringTier::open(path, DEFAULT_QUEUE_DEPTH) {
            Ok(t) => Box::new(t),
            Err(_) => Box::new(PreadTier::open(path, DEFAULT_PREAD_THREADS)?),
        },
    })
}

// ---------------------------------------------------------------------------------------------
// plan_reads

/// Plans aligned reads covering `ranges` (`(file offset, len)`, any alignment, normally sorted by
/// offset; unsorted, overlapping and duplicate ranges are handled too).
///
/// Ranges whose aligned extents are at most `max_gap` bytes apart are merged into one read (the
/// gap is read too) as long as the merged read stays within `max_read` bytes; a single range
/// longer than `max_read` still becomes one read (the tiers split reads into 1 MiB pieces). Reads
/// are laid out back to back in one buffer. Returns the reads, where each input range's first
/// byte lands in the buffer (in input order), and the buffer size needed. Each read's `need`
/// ends at the last byte of the ranges it covers, so a range ending at an unaligned end of the
/// file is fine.
pub fn plan_reads(ranges: &[(u64, usize)], max_gap: usize, max_read: usize) -> (Vec<ReadReq>, Vec<usize>, usize) {
    struct Cur {
        start: u64,
        end: u64,
        need_end: u64,
        buf_off: usize,
    }
    fn close(c: &Cur, reqs: &mut Vec<ReadReq>) -> usize {
        let len = (c.end - c.start) as usize;
        reqs.push(ReadReq { offset: c.start, len, buf_offset: c.buf_off, need: (c.need_end - c.start) as usize });
        len
    }
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].0); // stable; a no-op pass for sorted input
    let mut reqs = Vec::new();
    let mut pos = vec![0usize; ranges.len()];
    let mut buf_len = 0usize;
    let mut cur: Option<Cur> = None;
    for i in order {
        let (off, len) = ranges[i];
        let end = off + len as u64;
        let s = off - off % ALIGN_U64;
        let e = end.next_multiple_of(ALIGN_U64);
        if let Some(c) = cur.as_mut() {
            let new_end = c.end.max(e);
            if s.saturating_sub(c.end) <= max_gap as u64 && new_end - c.start <= max_read as u64 {
                c.end = new_end;
                c.need_end = c.need_end.max(end);
                pos[i] = c.buf_off + (off - c.start) as usize;
                continue;
            }
            buf_len += close(c, &mut reqs);
        }
        cur = Some(Cur { start: s, end: e, need_end: end, buf_off: buf_len });
        pos[i] = buf_len + (off - s) as usize;
    }
    if let Some(c) = cur {
        buf_len += close(&c, &mut reqs);
    }
    (reqs, pos, buf_len)
}

// ---------------------------------------------------------------------------------------------
// Loader

/// A batch of reads for the [`Loader`]: `tag` identifies it (e.g. a layer group).
#[derive(Debug)]
pub struct LoadJob {
    pub tag: u64,
    pub buf: AlignedBuf,
    pub reqs: Vec<ReadReq>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; recover the guard if something did.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Loader thread: owns a [`SlowTier`] and runs batches submitted from the compute thread, so I/O
/// overlaps compute. Buffers move into a job and back on completion. On-demand reads
/// ([`Loader::read_now`]) run before queued jobs; queued jobs run in submission order.
pub struct Loader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    tier_name: &'static str,
}

impl Loader {
    /// Starts the loader thread, which owns `tier`.
    pub fn spawn(tier: Box<dyn SlowTier>) -> Loader {
        let tier_name = tier.name();
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
        Loader { shared, thread: Some(thread), tier_name }
    }

    /// Queues a job (non-blocking). Several jobs may share a tag; [`Loader::wait`] then returns
    /// them in completion order.
    pub fn submit(&self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>) {
        self.submit_job(LoadJob { tag, buf, reqs });
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
        st.urgent.push_back((key, LoadJob { tag: id, buf, reqs }));
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
        let LoadJob { tag, mut buf, reqs } = job;
        let t0 = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| tier.read_batch(&mut buf, &reqs)))
            .unwrap_or_else(|_| Err(io::Error::other(format!("slow tier {} panicked", tier.name()))));
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

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader").field("tier", &self.tier_name).finish()
    }
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    const PAGE: usize = DIRECT_ALIGN;

    fn model_path() -> PathBuf {
        let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert!(p.exists(), "{} missing: run ./scripts/fetch-model.sh", p.display());
        p
    }

    fn model_bytes() -> Arc<[u8]> {
        std::fs::read(model_path()).unwrap().into()
    }

    /// xorshift64*: deterministic test randomness without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// io_uring tier if it can be set up here (else prints why and returns None). Set
    /// SIFT_REQUIRE_URING=1 to make its absence a failure.
    fn uring(path: &Path, depth: usize, allow_direct: bool) -> Option<UringTier> {
        match UringTier::open_opts(path, depth, allow_direct) {
            Ok(t) => Some(t),
            Err(e) => {
                assert!(std::env::var_os("SIFT_REQUIRE_URING").is_none(), "io_uring required but unavailable: {e}");
                eprintln!("io_uring unavailable here ({e}); testing the pread fallback only");
                None
            }
        }
    }

    /// Every disk and memory tier configuration worth testing for `path`, with a label.
    fn all_tiers(path: &Path) -> Vec<(String, Box<dyn SlowTier>)> {
        let mut v: Vec<(String, Box<dyn SlowTier>)> = Vec::new();
        if let Some(t) = uring(path, 64, true) {
            v.push((
                format!("io_uring depth 64 direct={} registered={}", t.is_direct(), t.is_file_registered()),
                Box::new(t),
            ));
        }
        if let Some(t) = uring(path, 3, true) {
            v.push((format!("io_uring depth {} direct={}", t.queue_depth(), t.is_direct()), Box::new(t)));
        }
        if let Some(t) = uring(path, 16, false) {
            v.push(("io_uring buffered+fadvise".into(), Box::new(t)));
        }
        let t = PreadTier::open(path, 4).unwrap();
        v.push((format!("pread x4 direct={}", t.is_direct()), Box::new(t)));
        v.push(("pread x1".into(), Box::new(PreadTier::open(path, 1).unwrap())));
        v.push(("pread buffered+fadvise".into(), Box::new(PreadTier::open_opts(path, 3, false).unwrap())));
        v.push(("memory".into(), Box::new(MemTier::from_file(path).unwrap())));
        v
    }

    /// Expected buffer contents of `r`: file bytes, zeros past the end of the file.
    fn expected(file: &[u8], r: &ReadReq) -> Vec<u8> {
        let mut v = vec![0u8; r.len];
        let start = (r.offset as usize).min(file.len());
        let end = (r.offset as usize + r.len).min(file.len());
        v[..end - start].copy_from_slice(&file[start..end]);
        v
    }

    /// `n` random aligned reads, 4 KiB..3 MiB, an eighth of them crossing the end of the file,
    /// in random batches laid out in shuffled order with untouched gaps between them.
    fn check_random_reads(label: &str, tier: &mut dyn SlowTier, file: &[u8], n: usize, seed: u64) {
        let mut rng = Rng(seed);
        let flen = file.len() as u64;
        assert_eq!(tier.file_len(), flen);
        let last_page = (flen - 1) / PAGE as u64 * PAGE as u64;
        let mut buf = AlignedBuf::new(40 << 20);
        let mut total = 0usize;
        let mut left = n;
        while left > 0 {
            let count = (1 + rng.below(40) as usize).min(left);
            left -= count;
            let mut reqs = Vec::new();
            for _ in 0..count {
                let pages = 1 + rng.below(768);
                let len = pages as usize * PAGE;
                let offset = if rng.below(8) == 0 {
                    last_page.saturating_sub(rng.below(pages) * PAGE as u64)
                } else {
                    rng.below(flen) / PAGE as u64 * PAGE as u64
                };
                let need = (flen - offset).min(len as u64) as usize;
                reqs.push(ReadReq { offset, len, buf_offset: 0, need });
            }
            // Shuffle the buffer order, leave gaps, stay within the buffer.
            let mut order: Vec<usize> = (0..reqs.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut at = 0;
            let mut batch = Vec::new();
            for i in order {
                at += rng.below(3) as usize * PAGE;
                if at + reqs[i].len > buf.len() {
                    break;
                }
                reqs[i].buf_offset = at;
                at += reqs[i].len;
                batch.push(reqs[i]);
            }
            buf.fill(0xa5);
            tier.read_batch(&mut buf, &batch).unwrap_or_else(|e| panic!("{label}: {e}"));
            let mut touched = vec![false; buf.len() / PAGE];
            for r in &batch {
                let got = &buf[r.buf_offset..r.buf_offset + r.len];
                assert!(got == expected(file, r).as_slice(), "{label}: wrong bytes for {r:?}");
                touched[r.buf_offset / PAGE..(r.buf_offset + r.len) / PAGE].fill(true);
                total += r.len;
            }
            for (p, _) in touched.iter().enumerate().filter(|(_, t)| !**t) {
                assert!(
                    buf[p * PAGE..(p + 1) * PAGE].iter().all(|&b| b == 0xa5),
                    "{label}: page {p} outside the reads was written"
                );
            }
        }
        eprintln!("{label}: {n} reads, {} MiB verified", total >> 20);
    }

    #[test]
    fn aligned_buf_basics() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
        let c = b.clone();
        assert_eq!(c.as_slice(), b.as_slice());
        let e = AlignedBuf::new(0);
        assert!(e.is_empty() && e.as_slice().is_empty());
        assert_eq!(AlignedBuf::new(4096).len(), 4096);
        // Send: moves through a thread.
        let b = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(b[8191], 7);
    }

    #[test]
    fn tier_kind_parse() {
        for k in [TierKind::Auto, TierKind::Uring, TierKind::Pread, TierKind::Memory] {
            assert_eq!(TierKind::parse(k.name()), Some(k));
            assert_eq!(k.name().parse::<TierKind>().unwrap(), k);
        }
        assert_eq!(TierKind::parse("uring"), Some(TierKind::Uring));
        assert_eq!(TierKind::parse("mmap"), None);
    }

    #[test]
    fn tiers_match_std_read() {
        let path = model_path();
        let file = model_bytes();
        assert_ne!(file.len() % PAGE, 0, "the test wants a file whose length is not page-aligned");
        let auto = open_slow_tier(&path, TierKind::Auto).unwrap();
        eprintln!("open_slow_tier(Auto) -> {}", auto.name());
        if UringTier::open(&path, 8).is_ok() {
            assert_eq!(auto.name(), "io_uring", "io_uring works here, so Auto must pick it");
        } else {
            assert_eq!(auto.name(), "pread");
        }
        for kind in [TierKind::Pread, TierKind::Memory] {
            assert_eq!(open_slow_tier(&path, kind).unwrap().name(), kind.name());
        }
        for (i, (label, mut tier)) in all_tiers(&path).into_iter().enumerate() {
            let n = if i == 0 { 400 } else { 150 };
            check_random_reads(&format!("{} ({label})", tier.name()), tier.as_mut(), &file, n, 0x5eed + i as u64);
        }
    }

    #[test]
    fn invalid_requests_rejected() {
        let path = model_path();
        for (label, mut tier) in all_tiers(&path) {
            let mut buf = AlignedBuf::new(64 << 10);
            let bad = [
                ReadReq { offset: 100, len: 4096, buf_offset: 0, need: 4096 },
                ReadReq { offset: 4096, len: 100, buf_offset: 0, need: 100 },
                ReadReq { offset: 4096, len: 4096, buf_offset: 512, need: 4096 },
                ReadReq { offset: 0, len: 4096, buf_offset: 0, need: 8192 },
                ReadReq { offset: 0, len: 8192, buf_offset: 60 << 10, need: 8192 },
            ];
            for r in bad {
                let e = tier.read_batch(&mut buf, &[r]).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{label}: {r:?}: {e}");
            }
            let overlap = [ReadReq::full(0, 8192, 0), ReadReq::full(65536, 8192, 4096)];
            let e = tier.read_batch(&mut buf, &overlap).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{label}: overlap: {e}");
            // Still usable afterwards.
            tier.read_batch(&mut buf, &[ReadReq::full(0, 8192, 0)]).unwrap();
            assert_eq!(&buf[..4], b"GGUF", "{label}");
        }
    }

    #[test]
    fn past_eof_beyond_need_is_error() {
        let path = model_path();
        let file = model_bytes();
        let flen = file.len() as u64;
        let last_page = flen / PAGE as u64 * PAGE as u64;
        let tail = (flen - last_page) as usize;
        for (label, mut tier) in all_tiers(&path) {
            let mut buf = AlignedBuf::new(4 << 20);
            // The exact tail is fine, and the rest of the buffer range is zeroed.
            buf.fill(0xff);
            let ok = ReadReq { offset: last_page - (2 << 20), len: 3 << 20, buf_offset: 0, need: (2 << 20) + tail };
            tier.read_batch(&mut buf, &[ok]).unwrap_or_else(|e| panic!("{label}: {e}"));
            assert!(buf[..ok.len] == expected(&file, &ok)[..], "{label}");
            // One byte more than the file has: UnexpectedEof naming the file and offset.
            for r in [
                ReadReq { need: ok.need + 1, ..ok },
                ReadReq { offset: last_page, len: 8192, buf_offset: 0, need: 8192 },
                ReadReq { offset: last_page + (1 << 20), len: 4096, buf_offset: 4096, need: 1 },
            ] {
                let e = tier.read_batch(&mut buf, &[ReadReq::full(0, 4096, 3 << 20), r]).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{label}: {e}");
                let msg = e.to_string();
                assert!(msg.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{label}: {msg}");
                assert!(msg.contains(&r.offset.to_string()), "{label}: {msg}");
            }
            // need 0 past the end of the file reads nothing and zeroes.
            buf.fill(0xff);
            tier.read_batch(&mut buf, &[ReadReq { offset: last_page + 8192, len: 8192, buf_offset: 0, need: 0 }])
                .unwrap();
            assert!(buf[..8192].iter().all(|&b| b == 0), "{label}");
        }
    }

    #[test]
    fn truncated_after_open_is_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shrinking.bin");
        let mut rng = Rng(42);
        let data: Vec<u8> = (0..(8 << 20)).map(|_| rng.next() as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let mut tiers: Vec<(String, Box<dyn SlowTier>)> = Vec::new();
        if let Some(t) = uring(&path, 64, true) {
            tiers.push(("io_uring".into(), Box::new(t)));
        }
        if let Some(t) = uring(&path, 64, false) {
            tiers.push(("io_uring buffered".into(), Box::new(t)));
        }
        tiers.push(("pread".into(), Box::new(PreadTier::open(&path, 4).unwrap())));
        tiers.push(("pread buffered".into(), Box::new(PreadTier::open_opts(&path, 4, false).unwrap())));
        let new_len = (3 << 20) + 100;
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(new_len).unwrap();
        for (label, mut tier) in tiers {
            assert_eq!(tier.file_len(), 8 << 20, "{label}: length as opened");
            let mut buf = AlignedBuf::new(8 << 20);
            // Many reads in flight, some of which now run past the end.
            let reqs: Vec<ReadReq> = (0..8).map(|i| ReadReq::full(i << 20, 1 << 20, (i as usize) << 20)).collect();
            let t0 = Instant::now();
            let e = tier.read_batch(&mut buf, &reqs).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(10), "{label}: slow error");
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{label}: {e}");
            assert!(e.to_string().contains("shrinking.bin"), "{label}: {e}");
            // What is still there reads fine, the rest is zero; the tier keeps working.
            buf.fill(0xff);
            let r = ReadReq { offset: 2 << 20, len: 2 << 20, buf_offset: 0, need: (1 << 20) + 100 };
            tier.read_batch(&mut buf, &[r]).unwrap_or_else(|e| panic!("{label}: {e}"));
            assert!(buf[..(1 << 20) + 100] == data[2 << 20..new_len as usize], "{label}");
            assert!(buf[(1 << 20) + 100..2 << 20].iter().all(|&b| b == 0), "{label}");
        }
    }

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

    #[test]
    fn plan_reads_merges_caps_and_maps() {
        let p = PAGE as u64;
        // Two ranges in the same page, one 2 pages further on: one read with max_gap >= 8 KiB.
        let ranges = [(10, 20), (100, 5000), (3 * p + 7, 10)];
        let (reqs, pos, len) = plan_reads(&ranges, 8192, 1 << 20);
        assert_eq!(reqs, vec![ReadReq { offset: 0, len: 4 * PAGE, buf_offset: 0, need: 3 * PAGE + 17 }]);
        assert_eq!(pos, vec![10, 100, 3 * PAGE + 7]);
        assert_eq!(len, 4 * PAGE);
        // Gap too large: two reads, back to back.
        let (reqs, pos, len) = plan_reads(&ranges, 4095, 1 << 20);
        assert_eq!(
            reqs,
            vec![
                ReadReq { offset: 0, len: 2 * PAGE, buf_offset: 0, need: 5100 },
                ReadReq { offset: 3 * p, len: PAGE, buf_offset: 2 * PAGE, need: 17 },
            ]
        );
        assert_eq!(pos, vec![10, 100, 2 * PAGE + 7]);
        assert_eq!(len, 3 * PAGE);
        // Cap: reads never grow past max_read by merging.
        let ranges: Vec<(u64, usize)> = (0..10).map(|i| (i * p, PAGE)).collect();
        let (reqs, pos, _) = plan_reads(&ranges, 0, 3 * PAGE);
        assert_eq!(reqs.iter().map(|r| r.len).collect::<Vec<_>>(), vec![3 * PAGE, 3 * PAGE, 3 * PAGE, PAGE]);
        assert_eq!(pos, (0..10).map(|i| i * PAGE).collect::<Vec<_>>());
        // Duplicates and overlaps map into the same read.
        let (reqs, pos, _) = plan_reads(&[(5000, 100), (5000, 100), (4000, 3000)], 0, 1 << 20);
        assert_eq!(reqs, vec![ReadReq { offset: 0, len: 2 * PAGE, buf_offset: 0, need: 7000 }]);
        assert_eq!(pos, vec![5000, 5000, 4000]);
        // A range larger than max_read is one read.
        let (reqs, _, _) = plan_reads(&[(0, 5 << 20)], 0, 1 << 20);
        assert_eq!(reqs.len(), 1);
        assert_eq!(plan_reads(&[], 0, 0), (vec![], vec![], 0));
    }

    #[test]
    fn plan_reads_roundtrip() {
        let path = model_path();
        let file = model_bytes();
        let flen = file.len() as u64;
        let mut tiers: Vec<Box<dyn SlowTier>> = vec![Box::new(MemTier::new(file.clone()))];
        tiers.push(open_slow_tier(&path, TierKind::Auto).unwrap());
        let mut rng = Rng(99);
        for round in 0..60 {
            let n = 1 + rng.below(300) as usize;
            let mut ranges: Vec<(u64, usize)> = (0..n)
                .map(|_| {
                    let len = match rng.below(4) {
                        0 => rng.below(64) as usize,
                        1 => rng.below(8192) as usize,
                        _ => rng.below(200_000) as usize,
                    };
                    let off = rng.below(flen - len as u64 + 1);
                    (off, len)
                })
                .collect();
            ranges.push((flen - 17, 17)); // the unaligned end of the file
            if round % 2 == 0 {
                ranges.sort_unstable();
            }
            let max_gap = [0, 4096, 65536, 1 << 20][rng.below(4) as usize];
            let max_read = [4096, 1 << 20, 4 << 20][rng.below(3) as usize];
            let (reqs, pos, len) = plan_reads(&ranges, max_gap, max_read);
            assert!(reqs.len() <= ranges.len());
            let mut at = 0;
            for r in &reqs {
                assert_eq!(r.buf_offset, at);
                assert!(r.len <= max_read.max(r.need.next_multiple_of(PAGE)));
                at += r.len;
            }
            assert_eq!(at, len);
            for tier in tiers.iter_mut() {
                let mut buf = AlignedBuf::new(len);
                tier.read_batch(&mut buf, &reqs).unwrap_or_else(|e| panic!("{}: {e}", tier.name()));
                for (&(off, l), &p) in ranges.iter().zip(&pos) {
                    assert!(
                        buf[p..p + l] == file[off as usize..off as usize + l],
                        "{}: range ({off}, {l})",
                        tier.name()
                    );
                }
            }
        }
    }

    /// Pages of `path` resident in the page cache, via mmap + mincore.
    fn resident_pages(path: &Path) -> usize {
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a fresh read-only shared mapping of an open file; no Rust reference to its
        // memory is created, it is only passed to mincore and unmapped below.
        let addr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        assert_ne!(addr, libc::MAP_FAILED);
        let mut vec = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: `addr` is a page-aligned mapping of `len` bytes and `vec` has one byte per page.
        let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
        // SAFETY: unmaps exactly the mapping created above.
        unsafe { libc::munmap(addr, len) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    fn evict(path: &Path) {
        let f = File::open(path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: plain syscall on an open descriptor, no pointers.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }

    #[test]
    fn reads_bypass_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cold.bin");
        let mut rng = Rng(3);
        let data: Vec<u8> = (0..(16 << 20) + 1234).map(|_| rng.next() as u8).collect();
        std::fs::write(&path, &data).unwrap();
        evict(&path);
        if resident_pages(&path) != 0 {
            eprintln!("cannot evict pages on this file system; skipping the page-cache check");
            return;
        }
        let mut tiers: Vec<(String, Box<dyn SlowTier>)> = Vec::new();
        if let Some(t) = uring(&path, 64, true) {
            tiers.push((format!("io_uring direct={}", t.is_direct()), Box::new(t)));
        }
        if let Some(t) = uring(&path, 64, false) {
            tiers.push(("io_uring buffered+fadvise".into(), Box::new(t)));
        }
        let t = PreadTier::open(&path, 4).unwrap();
        tiers.push((format!("pread direct={}", t.is_direct()), Box::new(t)));
        tiers.push(("pread buffered+fadvise".into(), Box::new(PreadTier::open_opts(&path, 4, false).unwrap())));
        for (label, mut tier) in tiers {
            let mut buf = AlignedBuf::new(data.len());
            let r = ReadReq { offset: 0, len: buf.len(), buf_offset: 0, need: data.len() };
            tier.read_batch(&mut buf, &[r]).unwrap();
            assert!(buf[..data.len()] == data[..], "{label}");
            let resident = resident_pages(&path);
            eprintln!("{label}: {resident} pages resident after reading {} MiB", data.len() >> 20);
            assert_eq!(resident, 0, "{label} left pages in the page cache");
        }
        // The measurement itself works: an ordinary read does fill the cache.
        std::fs::read(&path).unwrap();
        assert!(resident_pages(&path) > 0);
    }
}
