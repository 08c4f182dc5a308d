//! Opening a GGUF file from disk as a read-only memory map.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{Gguf, GgufError};

/// A GGUF file opened read-only with mmap, with its parsed header.
pub struct GgufFile {
    pub gguf: Gguf,
    mmap: Mmap,
    /// Where the GGUF bytes lie within the mapped file (all of it, or a section of a sift pack).
    range: std::ops::Range<usize>,
    path: PathBuf,
}

impl GgufFile {
    /// Opens and maps `path`, then parses and validates its header and tensor table.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_section(path, None)
    }

    /// Opens a GGUF file embedded in a larger file (a sift pack) at `offset`, `len` bytes long.
    /// `bytes()` then returns only that section, so offsets inside it work unchanged.
    pub fn open_embedded(path: impl AsRef<Path>, offset: u64, len: u64) -> Result<GgufFile, GgufError> {
        Self::open_section(path, Some((offset, len)))
    }

    fn open_section(path: impl AsRef<Path>, section: Option<(u64, u64)>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source: io::Error| GgufError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(io_err(io::Error::new(io::ErrorKind::IsADirectory, "it is a directory")));
        }
        // SAFETY: the map is read-only and we never create a mutable view of it. Memory
        // mapping is unsafe because another process could modify or truncate the file while
        // it is mapped, which would change bytes under our feet (breaking `&[u8]`'s
        // immutability) or raise SIGBUS on access past a new end. We assume model files are
        // not modified while sift has them open, the same assumption llama.cpp makes; the
        // parser itself never trusts the contents, so a concurrent rewrite can at worst give
        // wrong data or a crash, not an out-of-bounds read at parse time.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let range = match section {
            None => 0..mmap.len(),
            Some((off, len)) => {
                let end = off.checked_add(len).filter(|&e| e <= mmap.len() as u64).ok_or_else(|| {
                    io_err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "embedded GGUF section {off}+{len} runs past the end of the file ({} bytes)",
                            mmap.len()
                        ),
                    ))
                })?;
                off as usize..end as usize
            }
        };
        let gguf = Gguf::parse(&mmap[range.clone()])?;
        Ok(GgufFile { gguf, mmap, range, path })
    }

    /// The GGUF's bytes (the whole file, or the embedded section).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap[self.range.clone()]
    }

    /// The whole mapped file, including what lies outside an embedded GGUF section.
    pub fn file_bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The data of the tensor named `name`, or `None` if there is no such tensor.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.gguf.tensor(name)?;
        self.gguf.try_tensor_data(self.bytes(), t)
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("file_size", &self.gguf.file_size)
            .field("version", &self.gguf.version)
            .field("n_kv", &self.gguf.metadata.len())
            .field("n_tensors", &self.gguf.tensors.len())
            .finish_non_exhaustive()
    }
}
