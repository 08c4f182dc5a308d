//! [`MemTier`]: the whole file in memory, for tests and tiny models, with the disk tiers'
//! semantics.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{eof_error, validate, SlowTier};
use crate::io::{AlignedBuf, ReadReq};

/// [`MemTier`]'s read alignment.
const MEM_ALIGN: usize = 512;

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

    /// Any alignment would do; 512 bytes, as a disk of 512-byte sectors read with `O_DIRECT`.
    fn read_align(&self) -> usize {
        MEM_ALIGN
    }

    fn read_batch(&mut self, buf: &mut AlignedBuf, reqs: &[ReadReq]) -> io::Result<()> {
        validate(&self.path, buf.len(), reqs, self.read_align())?;
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
