//! The GGUF a pack was made from: a pack holds only the column layouts and refers to its source
//! GGUF (for the dense tensors, the tokenizer, the chat template and the rows of prompt batches)
//! by path, size, modification time and hashes.
//!
//! At build the whole GGUF is hashed (CRC-32) as it is read anyway, and a content fingerprint
//! taken: the CRC-32 of [`SAMPLES`] blocks of 4 KiB spread evenly over the file. At open the
//! source is looked for at its recorded path, then beside the pack under its recorded file name;
//! it is accepted when its size, the CRC-32 of its first and last MiB and the fingerprint match,
//! and, if its modification time or its status-change time (ctime: any write, `chmod` or copy
//! moves it, and `touch -r` cannot set it back) changed, when the whole file's CRC-32 still
//! matches. A GGUF edited in place with its modification time restored is refused so. Anything
//! else — missing, truncated, replaced — is refused with what to do. Packs made before the
//! fingerprint and the ctime were recorded are checked by what they recorded.

use std::path::{Path, PathBuf};

/// What a pack records about its source GGUF.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceGguf {
    /// Absolute path at build time.
    pub path: PathBuf,
    pub size: u64,
    pub mtime_ns: u128,
    /// CRC-32 of the first and the last MiB.
    pub head_tail_crc32: u32,
    /// CRC-32 of the whole file.
    pub crc32: u32,
    /// The status-change time (0: not recorded, packs made before it was).
    #[serde(default)]
    pub ctime_ns: u128,
    /// CRC-32 of [`SAMPLES`] blocks of 4 KiB spread over the file (`None`: not recorded).
    #[serde(default)]
    pub sample_crc32: Option<u32>,
}

/// Blocks of 4 KiB the content fingerprint reads (1 MiB in all).
pub const SAMPLES: u64 = 256;

/// Why a pack's source cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{pack} was made from {source_path}, which is not there (nor beside the pack); put the GGUF back, or run `sift pack` on it again (or run the .gguf with --memory: sift makes its column file itself)")]
    Missing { pack: PathBuf, source_path: PathBuf },
    #[error("{found} is not the GGUF {pack} was made from ({what}); run `sift pack` on it again (or run the .gguf with --memory: sift makes a new column file)")]
    Changed { pack: PathBuf, found: PathBuf, what: String },
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos())
}

fn ctime_ns(meta: &std::fs::Metadata) -> u128 {
    use std::os::unix::fs::MetadataExt;
    (meta.ctime().max(0) as u128) * 1_000_000_000 + meta.ctime_nsec().max(0) as u128
}

/// CRC-32 of [`SAMPLES`] blocks of 4 KiB at evenly spaced offsets of the `size` bytes of `path`
/// (the whole file when it is smaller).
pub fn sample_crc32(path: &Path, size: u64) -> std::io::Result<u32> {
    use std::io::{Read, Seek, SeekFrom};
    const BLOCK: u64 = 4096;
    let mut f = std::fs::File::open(path)?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; BLOCK as usize];
    if size <= SAMPLES * BLOCK {
        let mut all = Vec::new();
        f.take(size).read_to_end(&mut all)?;
        h.update(&all);
        return Ok(h.finalize());
    }
    for i in 0..SAMPLES {
        let at = (size - BLOCK) / (SAMPLES - 1) * i;
        f.seek(SeekFrom::Start(at))?;
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize())
}

/// CRC-32 of the first and the last MiB of the `size` bytes of `path`.
pub fn head_tail_crc32(path: &Path, size: u64) -> std::io::Result<u32> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let piece = 1u64 << 20;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; piece.min(size) as usize];
    f.read_exact(&mut buf)?;
    h.update(&buf);
    if size > piece {
        let tail = piece.min(size - piece);
        f.seek(SeekFrom::Start(size - tail))?;
        buf.resize(tail as usize, 0);
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize())
}

/// CRC-32 of the whole file.
fn full_crc32(path: &Path) -> std::io::Result<u32> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finalize());
        }
        h.update(&buf[..n]);
    }
}

impl SourceGguf {
    /// The record of `path` as it is now, with the whole file's CRC-32 given (computed by the
    /// caller while reading it).
    pub fn of(path: &Path, crc32: u32) -> std::io::Result<SourceGguf> {
        let path = std::fs::canonicalize(path)?;
        let meta = std::fs::metadata(&path)?;
        let size = meta.len();
        Ok(SourceGguf {
            head_tail_crc32: head_tail_crc32(&path, size)?,
            sample_crc32: Some(sample_crc32(&path, size)?),
            mtime_ns: mtime_ns(&meta),
            ctime_ns: ctime_ns(&meta),
            path,
            size,
            crc32,
        })
    }

    /// The file name at build time.
    pub fn file_name(&self) -> String {
        self.path.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default()
    }

    /// Whether `path` is this source as it is now (the checks of the module docs).
    pub fn matches(&self, path: &Path) -> Result<(), SourceError> {
        let io = |err| SourceError::Io { path: path.to_path_buf(), err };
        let meta = std::fs::metadata(path).map_err(io)?;
        let changed = |what: String| SourceError::Changed { pack: PathBuf::new(), found: path.to_path_buf(), what };
        if meta.len() != self.size {
            return Err(changed(format!("it has {} bytes, the source had {}", meta.len(), self.size)));
        }
        if head_tail_crc32(path, self.size).map_err(io)? != self.head_tail_crc32 {
            return Err(changed("its first or last MiB differs".into()));
        }
        if let Some(want) = self.sample_crc32 {
            if sample_crc32(path, self.size).map_err(io)? != want {
                return Err(changed("its contents differ (sampled blocks)".into()));
            }
        }
        let touched = mtime_ns(&meta) != self.mtime_ns || (self.ctime_ns != 0 && ctime_ns(&meta) != self.ctime_ns);
        if touched && full_crc32(path).map_err(io)? != self.crc32 {
            return Err(changed("its contents differ".into()));
        }
        Ok(())
    }

    /// Finds this source for the pack at `pack`: at its recorded path, else beside the pack.
    pub fn locate(&self, pack: &Path) -> Result<PathBuf, SourceError> {
        let beside = pack.parent().map(|d| d.join(self.file_name()));
        let mut first_err = None;
        for cand in std::iter::once(self.path.clone()).chain(beside) {
            if !cand.is_file() {
                continue;
            }
            match self.matches(&cand) {
                Ok(()) => return Ok(cand),
                Err(SourceError::Changed { found, what, .. }) => {
                    first_err.get_or_insert(SourceError::Changed { pack: pack.to_path_buf(), found, what });
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(first_err
            .unwrap_or_else(|| SourceError::Missing { pack: pack.to_path_buf(), source_path: self.path.clone() }))
    }
}
