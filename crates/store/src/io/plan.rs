//! Read requests and read planning: [`ReadReq`] (one aligned read into a buffer), [`ReadShape`]
//! (how reads are cut: alignment, merge gap, largest read) and [`plan_reads`], which merges wanted
//! byte ranges into a few large aligned reads laid out back to back in one buffer.

use super::DIRECT_ALIGN;

/// One read: file bytes `[offset, offset + len)` into `buf[buf_offset..buf_offset + len]`.
///
/// `offset`, `len` and `buf_offset` must be multiples of the tier's read alignment
/// ([`SlowTier::read_align`](super::SlowTier::read_align), at most [`DIRECT_ALIGN`]). The read may run past the end of the file only if its first `need` (`<= len`) bytes exist;
/// bytes past the end of the file are set to zero.
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

/// How [`plan_reads`] cuts wanted ranges into reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadShape {
    /// Alignment of every read's offset and length (and of where it lands in the buffer): the
    /// tier's [`read_align`](super::SlowTier::read_align), a power of two up to [`DIRECT_ALIGN`].
    pub align: usize,
    /// Ranges whose aligned extents are at most this far apart are read as one (the gap is read
    /// and thrown away).
    pub max_gap: usize,
    /// Merging stops at reads of this many bytes.
    pub max_read: usize,
}

impl ReadShape {
    /// Page-aligned reads ([`DIRECT_ALIGN`]) with the given gap and largest read.
    pub fn paged(max_gap: usize, max_read: usize) -> ReadShape {
        ReadShape { align: DIRECT_ALIGN, max_gap, max_read }
    }

    /// The same gap and largest read at alignment `align` (clamped to `1..=DIRECT_ALIGN`, rounded
    /// up to a power of two).
    pub fn aligned(self, align: usize) -> ReadShape {
        ReadShape { align: align.clamp(1, DIRECT_ALIGN).next_power_of_two(), ..self }
    }
}

/// Plans aligned reads covering `ranges` (`(file offset, len)`, any alignment, normally sorted by
/// offset; unsorted, overlapping and duplicate ranges are handled too).
///
/// Reads start and end at multiples of `shape.align`. Ranges whose page extents are at most
/// `shape.max_gap` bytes apart (whatever the alignment: the disk's cost per request measured
/// the same at both, and the finer alignment only trims the reads' ends) are merged into one read (the gap is read too) as long as the
/// merged read stays within `shape.max_read` bytes; a single range longer than that still
/// becomes one read (the tiers split reads into 1 MiB pieces). Reads
/// are laid out back to back in one buffer. Returns the reads, where each input range's first
/// byte lands in the buffer (in input order), and the buffer size needed. Each read's `need`
/// ends at the last byte of the ranges it covers, so a range ending at an unaligned end of the
/// file is fine.
pub fn plan_reads(ranges: &[(u64, usize)], shape: ReadShape) -> (Vec<ReadReq>, Vec<usize>, usize) {
    let ReadShape { align, max_gap, max_read } = shape;
    let align = align.max(1) as u64;
    const PAGE: u64 = DIRECT_ALIGN as u64;
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
        let s = off - off % align;
        let e = end.next_multiple_of(align);
        if let Some(c) = cur.as_mut() {
            let new_end = c.end.max(e);
            // The gap counted between the pages the two reads touch, whatever their alignment.
            let page_gap = (s - s % PAGE).saturating_sub(c.end.next_multiple_of(PAGE));
            if page_gap <= max_gap as u64 && new_end - c.start <= max_read as u64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::test_util::{model_bytes, model_path, Rng, PAGE};
    use crate::io::{open_slow_tier, AlignedBuf, MemTier, SlowTier, TierKind};

    #[test]
    fn plan_reads_merges_caps_and_maps() {
        let p = PAGE as u64;
        // Two ranges in the same page, one 2 pages further on: one read with max_gap >= 8 KiB.
        let ranges = [(10, 20), (100, 5000), (3 * p + 7, 10)];
        let (reqs, pos, len) = plan_reads(&ranges, ReadShape::paged(8192, 1 << 20));
        assert_eq!(reqs, vec![ReadReq { offset: 0, len: 4 * PAGE, buf_offset: 0, need: 3 * PAGE + 17 }]);
        assert_eq!(pos, vec![10, 100, 3 * PAGE + 7]);
        assert_eq!(len, 4 * PAGE);
        // Gap too large: two reads, back to back.
        let (reqs, pos, len) = plan_reads(&ranges, ReadShape::paged(4095, 1 << 20));
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
        let (reqs, pos, _) = plan_reads(&ranges, ReadShape::paged(0, 3 * PAGE));
        assert_eq!(reqs.iter().map(|r| r.len).collect::<Vec<_>>(), vec![3 * PAGE, 3 * PAGE, 3 * PAGE, PAGE]);
        assert_eq!(pos, (0..10).map(|i| i * PAGE).collect::<Vec<_>>());
        // Duplicates and overlaps map into the same read.
        let (reqs, pos, _) = plan_reads(&[(5000, 100), (5000, 100), (4000, 3000)], ReadShape::paged(0, 1 << 20));
        assert_eq!(reqs, vec![ReadReq { offset: 0, len: 2 * PAGE, buf_offset: 0, need: 7000 }]);
        assert_eq!(pos, vec![5000, 5000, 4000]);
        // A range larger than max_read is one read.
        let (reqs, _, _) = plan_reads(&[(0, 5 << 20)], ReadShape::paged(0, 1 << 20));
        assert_eq!(reqs.len(), 1);
        assert_eq!(plan_reads(&[], ReadShape::paged(0, 0)), (vec![], vec![], 0));
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
            // Any alignment every tier takes: the coarsest tier's, or a page.
            let tier_align = tiers.iter().map(|t| t.read_align()).max().unwrap_or(PAGE);
            let align = [tier_align, PAGE][rng.below(2) as usize];
            let shape = ReadShape::paged(max_gap, max_read).aligned(align);
            let (reqs, pos, len) = plan_reads(&ranges, shape);
            assert!(reqs.len() <= ranges.len());
            let mut at = 0;
            for r in &reqs {
                assert_eq!(r.buf_offset, at);
                assert!(r.len <= max_read.max(r.need.next_multiple_of(align)));
                assert!(r.offset.is_multiple_of(align as u64) && r.len.is_multiple_of(align));
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
}
