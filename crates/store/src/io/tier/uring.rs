//! [`UringTier`]: io_uring + `O_DIRECT`, up to `queue_depth` reads in flight (the submission
//! queue refilled after every reap), short reads retried for the remainder, the file registered
//! with the ring.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use io_uring::{opcode, types, IoUring};

use super::{at_eof, drop_cached, eof_error, open_file, split_pieces, validate, with_context, Piece, SlowTier};
use crate::io::{AlignedBuf, Progress, ReadReq, DIRECT_ALIGN};

const MAX_RETRIES: u32 = 64;

fn is_transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN
}

/// io_uring + `O_DIRECT`, up to `queue_depth` reads in flight, the file registered with the ring.
pub struct UringTier {
    ring: IoUring,
    file: File,
    path: PathBuf,
    len: u64,
    depth: usize,
    /// With `O_DIRECT`: the alignment its reads need.
    direct: Option<usize>,
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

    pub(super) fn open_opts(path: &Path, queue_depth: usize, allow_direct: bool) -> io::Result<UringTier> {
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
        self.direct.is_some()
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

    fn read_align(&self) -> usize {
        self.direct.unwrap_or(DIRECT_ALIGN)
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        self.run(buf, reqs, None)
    }

    /// Counts each request complete once all its pieces are: reads are submitted in request
    /// order, so the leading ones complete first.
    fn read_batch_progress(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq], progress: &Progress) -> io::Result<()> {
        self.run(buf, reqs, Some(progress))
    }
}

impl UringTier {
    /// The batch, telling `progress` (if any) how many leading requests are complete.
    fn run(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq], progress: Option<&Progress>) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(format!(
                "{}: io_uring ring unusable after an earlier failure",
                self.path.display()
            )));
        }
        validate(&self.path, buf.len(), reqs, self.read_align())?;
        let mut pieces = split_pieces(reqs);
        // Per request: pieces not complete yet; requests before `leading` are all complete.
        let mut left = vec![0u32; reqs.len()];
        for p in &pieces {
            left[p.req] += 1;
        }
        let mut leading = 0;
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
                    left[p.req] -= 1;
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
                        left[p.req] -= 1;
                    }
                } else {
                    // Short read that did not reach the end of the file: read the remainder.
                    retry.push(idx);
                }
            }
            if let (Some(pr), None) = (progress, &first_err) {
                while leading < left.len() && left[leading] == 0 {
                    leading += 1;
                }
                // The leading requests' pieces have all been reaped: nothing writes their bytes
                // again, and this function touches them no more.
                pr.advance(leading);
            }
        }
        std::mem::forget(guard);
        if let Some(e) = first_err {
            return Err(e);
        }
        if self.direct.is_none() {
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
