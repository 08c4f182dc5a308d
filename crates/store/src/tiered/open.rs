//! Opening a pack for a budgeted run ([`open_budgeted`]): only the tensors of its source GGUF that
//! stay in memory ([`is_resident`]) are read, through the slow tier; the streamed columns stay on
//! disk for the [`TieredStore`](super::TieredStore).

use super::{is_resident, TierError, TieredOptions};
use crate::io::{open_slow_tier, AlignedBuf, ReadReq};
use sift_model::Model;
use std::ops::Range;
use std::path::Path;

/// Opens a pack for a budgeted run: only the resident tensors are read (through the slow tier,
/// bypassing the page cache) into memory.
pub fn open_budgeted(path: &Path, opts: &TieredOptions) -> Result<Model, TierError> {
    open_budgeted_checked(path, opts, |_, _| Ok(()))
}

/// [`open_budgeted`], calling `precheck(gguf, resident bytes)` once the header is parsed and
/// before any resident tensor is read: a budget that cannot even hold them is refused before the
/// memory is used.
pub fn open_budgeted_checked(
    path: &Path,
    opts: &TieredOptions,
    precheck: impl FnOnce(&sift_gguf::Gguf, u64) -> Result<(), String>,
) -> Result<Model, TierError> {
    let toc = crate::read_toc(path)
        .map_err(|e| TierError::Unsupported(e.to_string()))?
        .ok_or_else(|| {
            TierError::Unsupported(format!(
                "{}: --memory needs a sift pack (the columns it streams from disk); make one with `sift pack {} -o MODEL.sift`",
                path.display(),
                path.display()
            ))
        })?;
    let src = toc.source().locate(path).map_err(|e| TierError::Unsupported(e.to_string()))?;
    let mut tier = open_slow_tier(&src, opts.tier).map_err(|source| TierError::Io { path: src.clone(), source })?;
    let gguf_off = 0u64;
    let mut buf = AlignedBuf::new(8 << 20);
    let fill = |dst: &mut [u8], ranges: &[Range<usize>]| -> std::io::Result<()> {
        for r in ranges {
            // Read [r] of the GGUF section in aligned pieces through `buf`.
            let mut pos = r.start;
            while pos < r.end {
                let file_start = gguf_off + pos as u64;
                let aligned = file_start / 4096 * 4096;
                let skip = (file_start - aligned) as usize;
                let want = (r.end - pos).min(buf.len() - skip);
                let len = (skip + want).div_ceil(4096) * 4096;
                let req = ReadReq { offset: aligned, len, buf_offset: 0, need: skip + want };
                tier.read_batch(&mut buf, &[req])?;
                dst[pos..pos + want].copy_from_slice(&buf[skip..skip + want]);
                pos += want;
            }
        }
        Ok(())
    };
    let emb = opts.resident_embeddings;
    crate::open_partial(path, toc, &src, fill, |g, t| is_resident(g, &t.name, emb), precheck).map_err(|e| match e {
        crate::PackError::Gguf(sift_gguf::GgufError::Refused(msg)) => TierError::Budget(msg),
        e => TierError::Unsupported(e.to_string()),
    })
}
