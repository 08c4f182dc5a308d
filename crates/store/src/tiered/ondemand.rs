//! On-demand reads of one site's missing columns, streamed so that the kernels compute one part
//! of the site while the disk reads the next (the read path's overlap of I/O and compute).
//!
//! [`TieredStore::fetch`](super::TieredStore::fetch) decides, for the prefix of the active units
//! it takes, which columns are missing and where each lands in the arena. [`OnDemandReads`] cuts
//! that prefix into [`Part`]s at multiples of the kernels' piece (so that the parts' products add
//! up to the same bits as the whole site's) and queues the reads of consecutive parts as a few
//! large jobs ahead of any preload (each within one [`JOB_BUF`] buffer, at most [`IN_FLIGHT`] at a
//! time), so the disk sees a full queue. Each job reports its progress ([`Progress`]: how many of
//! its leading requests are complete; io_uring tells as completions arrive), and the parts are
//! handed out in order as soon as *their* requests are in: their columns are copied into the arena
//! and the engine computes them while the later requests are still in flight.

use super::{account, read_shape, Kind, TierStats};
use crate::io::{plan_reads, AlignedBuf, LoadDone, Progress, ReadReq, ReadShape, TierIo};
use sift_model::layout::OpKind;
use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// Bytes of one job's read buffer.
pub(super) const JOB_BUF: usize = 2 << 20;
/// Jobs queued or running at once: the read buffers a store holds.
pub(super) const IN_FLIGHT: usize = 2;
/// The largest part (its reads' buffer).
const PART_BUF: usize = 1 << 20;
/// The first part of a site is cut once its reads reach this many bytes (small, so the kernels
/// start early), the others at [`PART_READS`].
const FIRST_PART_READS: usize = 64 << 10;
const PART_READS: usize = 256 << 10;
/// Tags of on-demand jobs (the cross-layer prefetcher counts its own up from 1).
const TAG_BASE: u64 = 1 << 63;

/// One missing column to read: its position in the active list, where it lies in the file and
/// where it lands in the arena.
#[derive(Clone, Copy, Debug)]
pub(super) struct ColumnRead {
    pub(super) pos: usize,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) dest: usize,
}

/// One part of a site: the active units it covers (positions in the fetched prefix) and its
/// columns' reads.
#[derive(Debug)]
pub(super) struct Part {
    pub(super) units: Range<usize>,
    reads: Vec<ColumnRead>,
}

/// Cuts a prefix of `n_active` units whose missing columns are `reads` (any order) into parts at
/// multiples of `align` units: the first once its reads reach [`FIRST_PART_READS`], the others
/// [`PART_READS`], each within [`PART_BUF`] unless one piece alone needs more.
pub(super) fn cut_parts(mut reads: Vec<ColumnRead>, n_active: usize, align: usize, shape: ReadShape) -> Vec<Part> {
    let align = align.max(1);
    reads.sort_by_key(|r| (r.pos, r.offset));
    let mut parts = Vec::new();
    let (mut start, mut next) = (0usize, 0usize);
    let mut cur: Vec<ColumnRead> = Vec::new();
    let mut piece0 = 0;
    while piece0 < n_active {
        let piece1 = (piece0 + align).min(n_active);
        let first = next;
        while next < reads.len() && reads[next].pos < piece1 {
            next += 1;
        }
        let piece = &reads[first..next];
        let need = |rs: &[ColumnRead]| {
            let ranges: Vec<(u64, usize)> = rs.iter().map(|r| (r.offset, r.len)).collect();
            plan_reads(&ranges, shape).2
        };
        if !cur.is_empty() && !piece.is_empty() {
            let with: Vec<ColumnRead> = cur.iter().chain(piece).copied().collect();
            if need(&with) > PART_BUF {
                parts.push(Part { units: start..piece0, reads: std::mem::take(&mut cur) });
                start = piece0;
            }
        }
        cur.extend_from_slice(piece);
        let target = if parts.is_empty() { FIRST_PART_READS } else { PART_READS };
        if need(&cur) >= target || piece1 == n_active {
            parts.push(Part { units: start..piece1, reads: std::mem::take(&mut cur) });
            start = piece1;
        }
        piece0 = piece1;
    }
    if parts.is_empty() {
        parts.push(Part { units: 0..n_active, reads: cur });
    }
    parts
}

/// The prefix of `n_active` units whose missing columns are `reads` as one part.
pub(super) fn whole(reads: Vec<ColumnRead>, n_active: usize) -> Vec<Part> {
    vec![Part { units: 0..n_active, reads }]
}

/// One job: requests laid out back to back in one buffer, the columns they bring, and per part
/// whose columns are in it, how many of the job's leading requests the part needs.
#[derive(Default)]
struct Job {
    reqs: Vec<ReadReq>,
    reads: Vec<ColumnRead>,
    /// Where each of `reads` lands in the job's buffer.
    starts: Vec<usize>,
    need: usize,
    /// (part, its reads in `reads`, requests it needs: `reqs[..n]`), in part order.
    parts: Vec<(usize, Range<usize>, usize)>,
}

/// The parts' reads as jobs: each part's columns merged into aligned reads, the reads of
/// consecutive parts laid out in one buffer up to [`JOB_BUF`] (a part that would pass it
/// continues in the next job; a single read larger than that is a job of its own).
fn jobs_of(parts: &[Part], shape: ReadShape) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut cur = Job::default();
    for (p, part) in parts.iter().enumerate() {
        if part.reads.is_empty() {
            continue;
        }
        let mut reads = part.reads.clone();
        reads.sort_by_key(|r| r.offset);
        let ranges: Vec<(u64, usize)> = reads.iter().map(|r| (r.offset, r.len)).collect();
        let (reqs, starts, _) = plan_reads(&ranges, shape);
        let mut first = cur.reads.len();
        let mut i = 0;
        for r in &reqs {
            if !cur.reqs.is_empty() && cur.need + r.len > JOB_BUF {
                if cur.reads.len() > first {
                    let n = cur.reqs.len();
                    cur.parts.push((p, first..cur.reads.len(), n));
                }
                jobs.push(std::mem::take(&mut cur));
                first = 0;
            }
            let end = r.buf_offset + r.len;
            while i < reads.len() && starts[i] < end {
                cur.reads.push(reads[i]);
                cur.starts.push(starts[i] - r.buf_offset + cur.need);
                i += 1;
            }
            cur.reqs.push(ReadReq { buf_offset: cur.need, ..*r });
            cur.need += r.len;
        }
        let n = cur.reqs.len();
        cur.parts.push((p, first..cur.reads.len(), n));
    }
    if !cur.reqs.is_empty() {
        jobs.push(cur);
    }
    jobs
}

/// Where a queued job's buffer is: read (by [`OnDemandReads::serve`]) only where the job's
/// [`Progress`] says the requests are complete, before the buffer is taken back.
struct BufPtr(*const u8, usize);

// SAFETY: a plain address of a heap block owned by the loader's job; it is only dereferenced on
// the store's thread, under the rules of `serve`.
unsafe impl Send for BufPtr {}

/// A job whose reads are queued or running.
struct InFlight {
    job: Job,
    tag: u64,
    progress: Arc<Progress>,
    buf: BufPtr,
    /// The next of `job.parts` to hand out.
    next: usize,
}

/// The site being streamed.
struct Site {
    layer: usize,
    ops: Vec<OpKind>,
    /// The fetched prefix of the active units.
    units: Vec<u32>,
    parts: Vec<Part>,
    next_serve: usize,
    /// Jobs not submitted yet, in part order.
    jobs: VecDeque<Job>,
    inflight: VecDeque<InFlight>,
}

/// The on-demand reads of the site being fetched, and the read buffers they use.
pub(super) struct OnDemandReads {
    free: Vec<AlignedBuf>,
    next_tag: u64,
    site: Option<Site>,
}

impl OnDemandReads {
    pub(super) fn new() -> OnDemandReads {
        OnDemandReads { free: Vec::new(), next_tag: TAG_BASE, site: None }
    }

    /// Whether a fetch of `active` for (`layer`, `ops`) continues the site being streamed: the
    /// same site, and `active` starts with the units of its parts not handed out yet.
    pub(super) fn continues(&self, layer: usize, ops: &[OpKind], active: &[u32]) -> bool {
        let Some(s) = &self.site else { return false };
        let Some(p) = s.parts.get(s.next_serve) else { return false };
        let rest = &s.units[p.units.start..];
        s.layer == layer && s.ops == ops && active.len() >= rest.len() && &active[..rest.len()] == rest
    }

    /// Starts streaming a site's prefix `units` in `parts` (from [`cut_parts`] or [`whole`]):
    /// queues the first jobs.
    pub(super) fn start(&mut self, io: &mut dyn TierIo, layer: usize, ops: &[OpKind], units: &[u32], parts: Vec<Part>) {
        debug_assert!(self.site.is_none(), "the previous site was finished");
        let jobs = jobs_of(&parts, read_shape(io)).into();
        self.site = Some(Site {
            layer,
            ops: ops.to_vec(),
            units: units.to_vec(),
            parts,
            next_serve: 0,
            jobs,
            inflight: VecDeque::new(),
        });
        self.fill(io);
    }

    /// Queues jobs while fewer than [`IN_FLIGHT`] are queued or running.
    fn fill(&mut self, io: &mut dyn TierIo) {
        let Some(s) = self.site.as_mut() else { return };
        while s.inflight.len() < IN_FLIGHT {
            let Some(job) = s.jobs.pop_front() else { break };
            let buf = match self.free.iter().position(|b| b.len() >= job.need) {
                Some(i) => self.free.swap_remove(i),
                None => AlignedBuf::new(job.need.max(JOB_BUF)),
            };
            let tag = self.next_tag;
            self.next_tag += 1;
            let progress = Arc::new(Progress::new());
            // The heap block does not move when the buffer moves into the job.
            let ptr = BufPtr(buf.as_ptr(), buf.len());
            io.submit_urgent(tag, buf, job.reqs.clone(), Some(Arc::clone(&progress)));
            s.inflight.push_back(InFlight { job, tag, progress, buf: ptr, next: 0 });
        }
    }

    /// Hands out the next part of the site being streamed: waits until its requests are in,
    /// copies its columns into `arena` (when the tier moves bytes) and queues later jobs. Returns
    /// the part's units (positions in the prefix); `None` when no site is being streamed.
    pub(super) fn serve(
        &mut self,
        io: &mut dyn TierIo,
        arena: &mut [u8],
        stats: &mut TierStats,
    ) -> Option<io::Result<Range<usize>>> {
        let s = self.site.as_ref()?;
        if s.next_serve == s.parts.len() {
            self.site = None;
            return None;
        }
        let p = s.next_serve;
        let mut result = Ok(());
        loop {
            self.fill(io);
            let s = self.site.as_mut().expect("site being served");
            let Some(f) = s.inflight.front_mut() else { break };
            let Some((part, reads, n_reqs)) = f.job.parts.get(f.next).cloned() else { break };
            if part != p {
                break;
            }
            let (ok, stall) = io.wait_progress(f.tag, &f.progress, n_reqs);
            stats.stall_ns += stall;
            if ok && io.moves_bytes() {
                for (c, &at) in f.job.reads[reads.clone()].iter().zip(&f.job.starts[reads.clone()]) {
                    assert!(at + c.len <= f.buf.1, "a column lies inside its job's buffer");
                    // SAFETY: `at..at + len` lies inside the job's buffer (checked above), which
                    // the loader's job owns until `wait` gives it back below, after the last
                    // part's copy. Its request is among the first `n_reqs`, which the tier
                    // reported complete (`Progress::done`, Acquire): nothing writes those bytes
                    // again, and the tier holds no reference to them (io_uring reads through raw
                    // pointers; other tiers report only once the batch has returned).
                    let src = unsafe { std::slice::from_raw_parts(f.buf.0.add(at), c.len) };
                    arena[c.dest..c.dest + c.len].copy_from_slice(src);
                }
            }
            io.charge_copy(f.job.reads[reads].iter().map(|c| c.len).sum());
            f.next += 1;
            if ok && f.next < f.job.parts.len() {
                continue;
            }
            // The job's last part (or it failed): take it back.
            let f = s.inflight.pop_front().expect("front exists");
            let (done, stall) = io.wait(f.tag);
            account(stats, &done, stall, Kind::OnDemand, f.job.reqs.len() as u64);
            let LoadDone { buf, result: r, .. } = done;
            if buf.len() == JOB_BUF {
                self.free.push(buf);
            }
            if result.is_ok() {
                result = match r {
                    Err(e) => Err(e),
                    Ok(()) if !ok => Err(io::Error::other("on-demand read reported failed without an error")),
                    Ok(()) => Ok(()),
                };
            }
            if result.is_err() {
                break;
            }
        }
        let s = self.site.as_mut().expect("site being served");
        s.next_serve += 1;
        let units = s.parts[p].units.clone();
        if result.is_err() {
            // This part's error is the one reported; the rest is waited for (nothing may stay
            // in flight), and the later parts' errors add nothing.
            let _ = self.finish(io, arena, stats);
        } else if s.next_serve == s.parts.len() {
            self.site = None;
        }
        Some(result.map(|()| units))
    }

    /// Serves every part not handed out yet (their columns land in the arena, as the cache
    /// expects for the ones it admitted), so that nothing is in flight. Returns the first error.
    pub(super) fn finish(&mut self, io: &mut dyn TierIo, arena: &mut [u8], stats: &mut TierStats) -> io::Result<()> {
        let mut first = Ok(());
        while let Some(r) = self.serve(io, arena, stats) {
            if let (Err(e), true) = (r, first.is_ok()) {
                first = Err(e);
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiered::{MAX_GAP, MAX_READ};

    /// The store's shapes on a disk of 4 KiB and one of 512-byte direct-I/O alignment.
    fn shapes() -> [ReadShape; 2] {
        let paged = ReadShape::paged(MAX_GAP, MAX_READ);
        [paged, paged.aligned(512)]
    }

    fn read(pos: usize, offset: u64, len: usize) -> ColumnRead {
        ColumnRead { pos, offset, len, dest: pos * len }
    }

    #[test]
    fn parts_cover_the_prefix_at_piece_boundaries_and_keep_every_read() {
        // 1000 units, 5040-byte columns, every other unit missing, laid far apart.
        let reads: Vec<ColumnRead> = (0..1000).step_by(2).map(|p| read(p, p as u64 * 20_000, 5040)).collect();
        for shape in shapes() {
            let parts = cut_parts(reads.clone(), 1000, 64, shape);
            assert!(parts.len() > 2, "{} parts", parts.len());
            let mut at = 0;
            let mut n = 0;
            for p in &parts {
                assert_eq!(p.units.start, at);
                assert!(p.units.end % 64 == 0 || p.units.end == 1000);
                assert!(p.reads.iter().all(|r| p.units.contains(&r.pos)));
                let ranges: Vec<(u64, usize)> = p.reads.iter().map(|r| (r.offset, r.len)).collect();
                assert!(plan_reads(&ranges, shape).2 <= PART_BUF);
                n += p.reads.len();
                at = p.units.end;
            }
            assert_eq!(at, 1000);
            assert_eq!(n, reads.len());
            // The first part is the small one: one piece.
            assert_eq!(parts[0].units, 0..64);
            assert!(parts[1].units.len() >= 64);
        }
    }

    #[test]
    fn jobs_bring_every_column_within_the_requests_its_part_waits_for() {
        // Three sites' worth of parts, with columns of several sizes, some adjacent, some apart.
        let mut reads = Vec::new();
        for p in 0..3000usize {
            if p % 3 != 1 {
                let len = [768, 4480, 1152][p % 3];
                reads.push(read(p, (p as u64 / 2) * 9000 + (p % 3) as u64 * 3_000_000, len));
            }
        }
        for shape in shapes() {
            let parts = cut_parts(reads.clone(), 3000, 64, shape);
            let jobs = jobs_of(&parts, shape);
            assert!(jobs.len() > 1);
            let mut seen = 0;
            let mut last_part = 0;
            for j in &jobs {
                assert!(j.need <= JOB_BUF, "job of {} bytes", j.need);
                let mut prev_end = 0;
                for (part, range, n_reqs) in &j.parts {
                    assert!(*part >= last_part && *n_reqs >= prev_end && *n_reqs <= j.reqs.len());
                    last_part = *part;
                    prev_end = *n_reqs;
                    for (r, &at) in j.reads[range.clone()].iter().zip(&j.starts[range.clone()]) {
                        assert!(parts[*part].units.contains(&r.pos));
                        // The request holding the column is among those the part waits for.
                        let q = j.reqs[..*n_reqs]
                            .iter()
                            .find(|q| q.buf_offset <= at && at + r.len <= q.buf_offset + q.len)
                            .expect("a request holds the column");
                        assert_eq!(q.offset + (at - q.buf_offset) as u64, r.offset);
                        assert!(q.offset.is_multiple_of(shape.align as u64) && q.len.is_multiple_of(shape.align));
                        seen += 1;
                    }
                }
            }
            assert_eq!(seen, reads.len());
        }
    }

    #[test]
    fn a_prefix_with_no_misses_is_one_part() {
        let parts = cut_parts(Vec::new(), 300, 64, shapes()[0]);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].units, 0..300);
    }
}
