//! The column scale planes of a budgeted run: every op's block scales, read from the pack once at
//! start and kept resident (the streamed columns hold only the quantized values).

use super::TierError;
use sift_model::layout::PackIndex;
use std::ops::Range;
use std::path::Path;

/// Per layer, per op: a byte range.
pub(super) type OpRanges = Vec<Vec<Range<usize>>>;

/// Reads every op's scale plane from the pack into one buffer (nothing when `read` is false, for
/// a simulated tier): per (layer, op), its range in the buffer.
pub(super) fn read_scales(path: &Path, index: &PackIndex, read: bool) -> Result<(Vec<u8>, OpRanges), TierError> {
    use std::os::unix::fs::FileExt;
    let total = if read { index.scale_bytes() as usize } else { 0 };
    let mut buf = vec![0u8; total];
    let mut ranges = Vec::with_capacity(index.layers.len());
    let mut at = 0;
    let file = if read {
        Some(std::fs::File::open(path).map_err(|source| TierError::Io { path: path.into(), source })?)
    } else {
        None
    };
    for lc in &index.layers {
        let mut per = Vec::with_capacity(lc.ops.len());
        for t in &lc.ops {
            let len = if read { t.scales_len as usize } else { 0 };
            if let Some(f) = &file {
                f.read_exact_at(&mut buf[at..at + len], t.scales_offset)
                    .map_err(|source| TierError::Io { path: path.into(), source })?;
            }
            per.push(at..at + len);
            at += len;
        }
        ranges.push(per);
    }
    Ok((buf, ranges))
}
