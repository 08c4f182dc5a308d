//! On-demand reads of one site's missing columns, streamed in parts so that the kernels compute
//! one part while the disk reads the next (the read path's overlap of I/O and compute).
//!
//! [`TieredStore::fetch`](super::TieredStore::fetch) decides, for the prefix of the active units
//! it takes, which columns are missing and where each lands in the arena. [`OnDemandReads`] cuts
//! that prefix into [`Part`]s at multiples of the kernels' piece (so that the parts' products add
//! up to the same bits as the whole site's), queues each part's reads as a job of its own ahead of
//! any preload, at most [`IN_FLIGHT`] at a time, and hands the parts back in order: it waits for a
//! part's reads, copies its columns into the arena and queues the next part's reads. The engine
//! computes each part as it comes, while the later parts are read.

use super::{account, Kind, TierStats, MAX_GAP, MAX_READ};
use crate::io::{plan_reads, AlignedBuf, LoadDone, ReadReq, TierIo};
use sift_model::layout::OpKind;
use std::collections::VecDeque;
use std::io;
use std::ops::Range;

/// Bytes of one part's read buffer.
pub(super) const PART_BUF: usize = 1 << 20;
/// Parts whose reads are queued or running at once: the read buffers a store holds.
pub(super) const IN_FLIGHT: usize = 4;
/// The first part of a site is cut once its reads reach this many bytes (small, so the kernels
/// start early), the others at [`PART_READS`].
const FIRST_PART_READS: usize = 128 << 10;
const PART_READS: usize = 512 << 10;
/// Tags of on-demand parts (the cross-layer prefetcher counts its own up from 1).
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
pub(super) fn cut_parts(mut reads: Vec<ColumnRead>, n_active: usize, align: usize) -> Vec<Part> {
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
            plan_reads(&ranges, MAX_GAP, MAX_READ).2
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

/// One job of reads: a part's reads, or a share of them that fits one buffer.
struct Job {
    part: usize,
    reads: Vec<ColumnRead>,
    reqs: Vec<ReadReq>,
    /// Where each of `reads` lands in the job's buffer.
    starts: Vec<usize>,
    need: usize,
}

/// A part's reads as jobs: merged into aligned reads, then shared out in file order into jobs
/// whose reads fit [`PART_BUF`] (a single read larger than that is a job of its own).
fn jobs_of(part: usize, reads: &[ColumnRead]) -> Vec<Job> {
    let mut reads = reads.to_vec();
    reads.sort_by_key(|r| r.offset);
    let ranges: Vec<(u64, usize)> = reads.iter().map(|r| (r.offset, r.len)).collect();
    let (reqs, starts, _) = plan_reads(&ranges, MAX_GAP, MAX_READ);
    let mut jobs: Vec<Job> = Vec::new();
    let mut i = 0; // next read
    let mut k = 0; // next request
    while k < reqs.len() {
        // Requests k..k_end: as many as fit one buffer, at least one.
        let base = reqs[k].buf_offset;
        let mut k_end = k + 1;
        while k_end < reqs.len() && reqs[k_end].buf_offset + reqs[k_end].len - base <= PART_BUF {
            k_end += 1;
        }
        let end = reqs[k_end - 1].buf_offset + reqs[k_end - 1].len;
        let i0 = i;
        while i < reads.len() && starts[i] < end {
            i += 1;
        }
        let job_reqs: Vec<ReadReq> =
            reqs[k..k_end].iter().map(|r| ReadReq { buf_offset: r.buf_offset - base, ..*r }).collect();
        jobs.push(Job {
            part,
            reads: reads[i0..i].to_vec(),
            reqs: job_reqs,
            starts: starts[i0..i].iter().map(|&s| s - base).collect(),
            need: end - base,
        });
        k = k_end;
    }
    jobs
}

/// A job whose reads are queued or running.
struct InFlight {
    job: Job,
    tag: u64,
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
    /// queues the first jobs' reads.
    pub(super) fn start(&mut self, io: &mut dyn TierIo, layer: usize, ops: &[OpKind], units: &[u32], parts: Vec<Part>) {
        debug_assert!(self.site.is_none(), "the previous site was finished");
        let jobs = parts.iter().enumerate().flat_map(|(p, part)| jobs_of(p, &part.reads)).collect();
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
                None => AlignedBuf::new(job.need.max(PART_BUF)),
            };
            let tag = self.next_tag;
            self.next_tag += 1;
            io.submit_urgent(tag, buf, job.reqs.clone());
            s.inflight.push_back(InFlight { job, tag });
        }
    }

    /// Hands out the next part of the site being streamed: waits for its jobs, copies its
    /// columns into `arena` (when the tier moves bytes) and queues later jobs. Returns the part's
    /// units (positions in the prefix); `None` when no site is being streamed.
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
            if s.inflight.front().is_none_or(|f| f.job.part != p) {
                break;
            }
            let f = s.inflight.pop_front().expect("front exists");
            let (done, stall) = io.wait(f.tag);
            account(stats, &done, stall, Kind::OnDemand, f.job.reqs.len() as u64);
            let LoadDone { buf, result: r, .. } = done;
            if r.is_ok() && io.moves_bytes() {
                for (c, &at) in f.job.reads.iter().zip(&f.job.starts) {
                    arena[c.dest..c.dest + c.len].copy_from_slice(&buf[at..at + c.len]);
                }
            }
            io.charge_copy(f.job.reads.iter().map(|c| c.len).sum());
            if buf.len() == PART_BUF {
                self.free.push(buf);
            }
            if result.is_ok() {
                result = r;
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

    fn read(pos: usize, offset: u64, len: usize) -> ColumnRead {
        ColumnRead { pos, offset, len, dest: pos * len }
    }

    #[test]
    fn parts_cover_the_prefix_at_piece_boundaries_and_keep_every_read() {
        // 1000 units, 5040-byte columns, every other unit missing, laid far apart.
        let reads: Vec<ColumnRead> = (0..1000).step_by(2).map(|p| read(p, p as u64 * 20_000, 5040)).collect();
        let parts = cut_parts(reads.clone(), 1000, 64);
        assert!(parts.len() > 2, "{} parts", parts.len());
        let mut at = 0;
        let mut n = 0;
        for p in &parts {
            assert_eq!(p.units.start, at);
            assert!(p.units.end % 64 == 0 || p.units.end == 1000);
            assert!(p.reads.iter().all(|r| p.units.contains(&r.pos)));
            let ranges: Vec<(u64, usize)> = p.reads.iter().map(|r| (r.offset, r.len)).collect();
            assert!(plan_reads(&ranges, MAX_GAP, MAX_READ).2 <= PART_BUF);
            n += p.reads.len();
            at = p.units.end;
        }
        assert_eq!(at, 1000);
        assert_eq!(n, reads.len());
        // The first part is the small one.
        let bytes = |p: &Part| p.reads.iter().map(|r| r.len).sum::<usize>();
        assert!(bytes(&parts[0]) < bytes(&parts[1]));
    }

    #[test]
    fn a_prefix_with_no_misses_is_one_part() {
        let parts = cut_parts(Vec::new(), 300, 64);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].units, 0..300);
    }
}
