//! The slow tiers ([`SlowTier`]): io_uring + `O_DIRECT` ([`UringTier`]), the `pread` fallback
//! ([`PreadTier`]) and the in-memory tier for tests ([`MemTier`]); what they share (request
//! validation, 1 MiB pieces, opening files with `O_DIRECT`, dropping cached pages); and choosing
//! one ([`TierKind`], [`open_slow_tier`]).

mod mem;
mod pread;
mod uring;

pub use mem::MemTier;
pub use pread::PreadTier;
pub use uring::UringTier;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{AlignedBuf, Progress, ReadReq, DIRECT_ALIGN};

/// Reads larger than this are split into pieces of this size.
pub const MAX_PIECE: usize = 1 << 20;
/// io_uring queue depth [`open_slow_tier`] uses.
pub const DEFAULT_QUEUE_DEPTH: usize = 64;
/// Number of pread threads [`open_slow_tier`] uses.
pub const DEFAULT_PREAD_THREADS: usize = 4;

/// A source of file bytes: performs batches of aligned reads.
pub trait SlowTier: Send {
    /// `"io_uring"`, `"pread"` or `"memory"`.
    fn name(&self) -> &'static str;
    /// Performs every read into `buf`; returns when all completed, or the first error (after
    /// every read already in flight has finished, so nothing writes into `buf` afterwards).
    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()>;
    /// [`SlowTier::read_batch`], telling `progress` how many leading requests are complete as
    /// they complete. A tier that does (io_uring) must hold no reference to the bytes of a
    /// request once it has counted it: a reader may use them while the rest is in flight. By
    /// default nothing is told until the batch returns (the loader then finishes `progress`).
    fn read_batch_progress(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq], progress: &Progress) -> io::Result<()> {
        let _ = progress;
        self.read_batch(buf, reqs)
    }
    /// Length of the file when the tier was opened.
    fn file_len(&self) -> u64;
    /// The alignment this tier's reads need (offset, length and place in the buffer): the file
    /// system's direct-I/O alignment where the file is read with `O_DIRECT` (512 bytes on most
    /// disks, from `statx`), else a page. A power of two, at most [`DIRECT_ALIGN`].
    fn read_align(&self) -> usize {
        DIRECT_ALIGN
    }
}

// ---------------------------------------------------------------------------------------------
// Requests, validation, pieces

fn invalid(path: &Path, msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {msg}", path.display()))
}

/// Checks alignment (to `align`), bounds and that no two requests overlap in the buffer.
fn validate(path: &Path, buf_len: usize, reqs: &[ReadReq], align: usize) -> io::Result<()> {
    let mut dests: Vec<(usize, usize)> = Vec::with_capacity(reqs.len());
    for r in reqs {
        if !r.offset.is_multiple_of(align as u64) || !r.len.is_multiple_of(align) || !r.buf_offset.is_multiple_of(align)
        {
            return Err(invalid(
                path,
                format!("misaligned read {r:?}: offset, len and buf_offset must be multiples of {align}"),
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
/// remainder must not be re-read). With `O_DIRECT` (`direct`: its alignment) a read only ends at
/// an unaligned position at the end of the file, so that counts as the end too (re-reading there
/// would be misaligned).
fn at_eof(p: &Piece, n: usize, direct: Option<usize>) -> bool {
    n == 0 || direct.is_some_and(|a| !(p.file_off + p.done as u64).is_multiple_of(a as u64))
}

// ---------------------------------------------------------------------------------------------
// Opening files

/// Opens `path` for reading with `O_DIRECT` when the file system supports it (checked with one
/// aligned read), else without. Returns the file and, when it is direct, the alignment its reads
/// need ([`direct_io_align`]).
fn open_file(path: &Path, allow_direct: bool) -> io::Result<(File, Option<usize>)> {
    if allow_direct {
        match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => {
                let mut probe = AlignedBuf::new(DIRECT_ALIGN);
                match f.read_at(probe.as_mut_slice(), 0) {
                    Ok(_) => {
                        let align = direct_io_align(&f);
                        return Ok((f, Some(align)));
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(e) => return Err(with_context(path, 0, e)),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    let f = File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok((f, None))
}

/// The alignment `O_DIRECT` reads of `file` need: the larger of the file's direct-I/O offset and
/// memory alignments as `statx(STATX_DIOALIGN)` reports them (Linux 6.1+; the device's logical
/// block, 512 bytes on most disks), or [`DIRECT_ALIGN`] where the kernel or file system does not
/// say, or says something larger or not a power of two.
pub(crate) fn direct_io_align(file: &File) -> usize {
    // SAFETY: `statx` is plain old data, so all-zero bytes are a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open while `file` is borrowed; with AT_EMPTY_PATH and an empty
    // NUL-terminated path the call describes the descriptor itself and writes only into `st`,
    // which outlives the call.
    let rc = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut st) };
    if rc != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return DIRECT_ALIGN;
    }
    let align = st.stx_dio_offset_align.max(st.stx_dio_mem_align) as usize;
    if align == 0 || !align.is_power_of_two() || align > DIRECT_ALIGN {
        return DIRECT_ALIGN;
    }
    align
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

/// Two files in one address space: the pack at offsets `0..base`, its source GGUF at
/// `base..base + source length` (`base` is the pack's length rounded up to a page, the
/// `gguf_offset` of its [`PackIndex`](sift_model::layout::PackIndex)). The tiered store names
/// every byte it reads — a column, a prompt layer's rows, an embedding row — by one offset.
pub struct PackAndSource {
    pack: Box<dyn SlowTier>,
    source: Box<dyn SlowTier>,
    base: u64,
}

impl PackAndSource {
    pub fn new(pack: Box<dyn SlowTier>, source: Box<dyn SlowTier>, base: u64) -> PackAndSource {
        PackAndSource { pack, source, base }
    }
}

impl SlowTier for PackAndSource {
    fn name(&self) -> &'static str {
        self.pack.name()
    }

    /// Streams only a batch that lies all in the pack (the columns' reads).
    fn read_batch_progress(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq], progress: &Progress) -> io::Result<()> {
        if reqs.iter().all(|r| r.offset + r.len as u64 <= self.base) {
            self.pack.read_batch_progress(buf, reqs, progress)
        } else {
            self.read_batch(buf, reqs)
        }
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        let (lo, hi): (Vec<ReadReq>, Vec<ReadReq>) = reqs.iter().partition(|r| r.offset < self.base);
        if let Some(r) = lo.iter().find(|r| r.offset + r.len as u64 > self.base) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read {r:?} runs from the pack into its source GGUF"),
            ));
        }
        if !lo.is_empty() {
            self.pack.read_batch(buf, &lo)?;
        }
        if !hi.is_empty() {
            let shifted: Vec<ReadReq> = hi.iter().map(|r| ReadReq { offset: r.offset - self.base, ..*r }).collect();
            self.source.read_batch(buf, &shifted)?;
        }
        Ok(())
    }

    fn file_len(&self) -> u64 {
        self.base + self.source.file_len()
    }

    fn read_align(&self) -> usize {
        self.pack.read_align().max(self.source.read_align())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::test_util::{expected, model_bytes, model_path, Rng, PAGE};
    use std::io::Write;
    use std::time::{Duration, Instant};

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
            // Every other batch streamed: io_uring counts every request complete by the end;
            // the other tiers leave the count to the loader.
            let progress = Progress::new();
            if rng.below(2) == 0 {
                tier.read_batch(&mut buf, &batch).unwrap_or_else(|e| panic!("{label}: {e}"));
            } else {
                tier.read_batch_progress(&mut buf, &batch, &progress).unwrap_or_else(|e| panic!("{label}: {e}"));
                let expect = if label.starts_with("io_uring") { batch.len() } else { 0 };
                assert_eq!(progress.done(), expect, "{label}: requests counted complete");
            }
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
                ReadReq { offset: 4096, len: 4096, buf_offset: 100, need: 4096 },
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
            // Reads at the tier's own alignment (finer than a page where the disk allows it) are
            // taken and bring the file's bytes; half of it is refused unless it is one byte.
            let a = tier.read_align();
            assert!(a.is_power_of_two() && a <= DIRECT_ALIGN, "{label}: {a}");
            tier.read_batch(&mut buf, &[ReadReq::full(3 * a as u64, a, a)]).unwrap_or_else(|e| panic!("{label}: {e}"));
            assert!(buf[a..2 * a] == model_bytes()[3 * a..4 * a], "{label}");
            if a > 1 {
                let half = ReadReq::full(a as u64 / 2, a, 0);
                assert!(tier.read_batch(&mut buf, &[half]).is_err(), "{label}: {half:?}");
            }
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
