//! [`PreadTier`]: the fallback when io_uring is unavailable (seccomp, old kernels): `pread` (with
//! `O_DIRECT` where possible) from a few scoped threads that pull 1 MiB pieces from a shared list.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::{at_eof, drop_cached, eof_error, open_file, split_pieces, validate, with_context, Piece, SlowTier};
use crate::io::{lock, AlignedBuf, ReadReq, DIRECT_ALIGN};

/// Fallback tier: `pread` (with `O_DIRECT` where possible) from a few scoped threads.
pub struct PreadTier {
    file: File,
    path: PathBuf,
    len: u64,
    threads: usize,
    /// With `O_DIRECT`: the alignment its reads need.
    direct: Option<usize>,
}

impl PreadTier {
    /// Opens `path`; batches use up to `threads` threads (clamped to 1..=64, the caller's
    /// thread included).
    pub fn open(path: &Path, threads: usize) -> io::Result<PreadTier> {
        Self::open_opts(path, threads, true)
    }

    pub(super) fn open_opts(path: &Path, threads: usize, allow_direct: bool) -> io::Result<PreadTier> {
        let (file, direct) = open_file(path, allow_direct)?;
        let len = file.metadata()?.len();
        Ok(PreadTier { file, path: path.to_path_buf(), len, threads: threads.clamp(1, 64), direct })
    }

    /// Whether the file is read with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }
}

fn pread_piece(
    file: &File,
    path: &Path,
    direct: Option<usize>,
    req: &ReadReq,
    mut p: Piece,
    dst: &mut [u8],
) -> io::Result<()> {
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

    fn read_align(&self) -> usize {
        self.direct.unwrap_or(DIRECT_ALIGN)
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        validate(&self.path, buf.len(), reqs, self.read_align())?;
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
        if self.direct.is_none() {
            drop_cached(&self.file, reqs);
        }
        result
    }
}
