//! Opening a GGUF file from disk as a read-only memory map, or building a partial view of one in
//! anonymous memory (only the tensors that must stay resident, for running under a memory budget).

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};
use std::ops::Range;

use crate::{Gguf, GgufError};

/// Opens `path` for reading only if it is a regular file: opened without blocking (a FIFO with
/// no writer would block the open forever) and checked with `fstat` before anything is mapped
/// or read (a device such as `/dev/zero` never ends).
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::new(io::ErrorKind::IsADirectory, "it is a directory"));
    }
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is not a regular file (a FIFO or a device): use a model file",
        ));
    }
    Ok(file)
}

/// A GGUF file opened read-only with mmap, with its parsed header.
pub struct GgufFile {
    pub gguf: Gguf,
    mmap: Mmap,
    /// Where the GGUF bytes lie within the mapped file (all of it, or a section of a sift pack).
    range: std::ops::Range<usize>,
    path: PathBuf,
    /// Whether `mmap` maps the file itself (not an in-memory copy of its resident parts).
    file_backed: bool,
    /// Whether some pages of the file's mapping were changed in a private copy
    /// ([`GgufFile::edit_mapped`]): they must never be dropped, or they would come back from the
    /// file unchanged.
    edited: bool,
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
        let file = open_regular(&path).map_err(io_err)?;
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
        Ok(GgufFile { gguf, mmap, range, path, file_backed: true, edited: false })
    }

    /// Builds a view of a GGUF of `len` bytes in anonymous memory, holding only some tensors.
    ///
    /// `fill(buf, ranges)` must copy the GGUF's bytes for each range into `buf` (the same offsets):
    /// it is called once for the header (`0..header_len`, the data offset, which the caller knows
    /// from the pack's table of contents), then once for the data of every tensor `resident`
    /// accepts (in one call). Pages nobody filled are never touched, so they cost no memory; they
    /// are made inaccessible (`PROT_NONE`), so code that reads a tensor that is not resident
    /// crashes instead of computing with zeros. The header's pages are freed the same way once
    /// it is parsed: the metadata lives on in [`Gguf`]. `check(gguf, resident bytes)` runs after the header is
    /// parsed and before any tensor is read; an `Err` refuses the load. Used to run a pack under a
    /// memory budget: the weights
    /// streamed from disk are read elsewhere, through the tiered store.
    pub fn from_parts(
        path: impl AsRef<Path>,
        len: usize,
        header_len: usize,
        mut fill: impl FnMut(&mut [u8], &[Range<usize>]) -> io::Result<()>,
        resident: impl Fn(&Gguf, &crate::TensorInfo) -> bool,
        check: impl FnOnce(&Gguf, u64) -> Result<(), String>,
    ) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source: io::Error| GgufError::Io { path: path.clone(), source };
        if header_len > len || len == 0 {
            return Err(io_err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("GGUF header length {header_len} does not fit the section length {len}"),
            )));
        }
        let mut anon = MmapOptions::new().len(len).map_anon().map_err(io_err)?;
        fill(&mut anon, std::slice::from_ref(&(0..header_len))).map_err(io_err)?;
        let gguf = Gguf::parse(&anon)?;
        // The header is parsed now and not read again: only the resident tensors are kept, and
        // the header's pages are given back with the gaps.
        let mut keep: Vec<Range<usize>> = Vec::with_capacity(gguf.tensors.len());
        for t in gguf.tensors.iter().filter(|t| resident(&gguf, t)) {
            let start = gguf.data_offset.saturating_add(t.offset) as usize;
            keep.push(start..start.saturating_add(t.n_bytes as usize).min(len));
        }
        // Pages the resident part will touch (tensors rounded out to whole pages).
        let pages: u64 = keep.iter().map(|r| (r.len().div_ceil(4096) as u64 + 1) * 4096).sum();
        check(&gguf, pages).map_err(GgufError::Refused)?;
        fill(&mut anon, &keep).map_err(io_err)?;
        let mmap = anon.make_read_only().map_err(io_err)?;
        protect_gaps(&mmap, &mut keep).map_err(io_err)?;
        Ok(GgufFile { gguf, mmap, range: 0..len, path, file_backed: false, edited: false })
    }

    /// Copies the GGUF's bytes (the file, or its embedded section) out of the file mapping into
    /// anonymous memory backed by transparent huge pages where the kernel gives them (asked with
    /// `MADV_HUGEPAGE`), and maps that instead; offsets into [`GgufFile::bytes`] stay the same.
    /// Decode reads every weight once per token: with 2 MiB pages the TLB covers the weights that
    /// 4 KiB file pages spread over 512 times as many entries, and the hardware prefetchers are
    /// not stopped at every 4 KiB boundary (measured from -4 to +15 % decode tok/s on the
    /// development VM, docs/benchmarks.md). Costs one read of the file at load, and every tensor
    /// becomes resident (a mapping leaves the embedding rows no token used on disk); the copy is
    /// made in chunks whose file pages are dropped as it goes, so the peak is not twice the
    /// weights. Nothing to do for a view that is already in memory.
    pub fn load_into_memory(&mut self) -> io::Result<()> {
        self.load_into_memory_with(|_| {})
    }

    /// [`GgufFile::load_into_memory`], letting `edit` change the copied bytes (repack tensors in
    /// place, same offsets) before they become read-only. Nothing happens (and `edit` is not
    /// called) for a view that is already in memory.
    pub fn load_into_memory_with(&mut self, edit: impl FnOnce(&mut [u8])) -> io::Result<()> {
        if !self.file_backed {
            return Ok(());
        }
        let len = self.range.len();
        let mut anon = MmapOptions::new().len(len.max(1)).map_anon()?;
        // Only a hint: without transparent huge pages the copy still works, with 4 KiB pages.
        let _ = anon.advise(memmap2::Advice::HugePage);
        // In chunks, each one's file pages dropped from the process once copied, so that the
        // copy's peak resident memory stays the weights' size, not twice it.
        const CHUNK: usize = 8 << 20;
        for at in (0..len).step_by(CHUNK) {
            let end = (at + CHUNK).min(len);
            anon[at..end].copy_from_slice(&self.mmap[self.range.start + at..self.range.start + end]);
            self.release(at..end);
        }
        edit(&mut anon[..len]);
        self.mmap = anon.make_read_only()?;
        self.range = 0..len;
        self.file_backed = false;
        Ok(())
    }

    /// Lets `edit` change the GGUF's bytes in a private copy-on-write mapping of the file (as
    /// llama.cpp's repack buffer, with the mapping kept): the pages it writes become the process's
    /// own memory, every other page stays the file's, shared with the page cache and read on
    /// demand. The file is mapped again for this (`MAP_PRIVATE`); its length and first page must
    /// be what was opened. Returns `false` (and does not call `edit`) for a view that is not the
    /// file's mapping: [`GgufFile::load_into_memory_with`] edits those.
    pub fn edit_mapped(&mut self, edit: impl FnOnce(&mut [u8])) -> io::Result<bool> {
        if !self.file_backed {
            return Ok(false);
        }
        let file = File::open(&self.path)?;
        // SAFETY: a private (copy-on-write) mapping: writes go to the process's own pages, never
        // to the file. As for the first mapping (see `open_section`), the file must not change
        // while mapped; the checks below refuse a file replaced since it was opened.
        let mut copy = unsafe { MmapOptions::new().map_copy(&file) }?;
        let head = 4096.min(self.mmap.len());
        if copy.len() != self.mmap.len() || copy[..head] != self.mmap[..head] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("'{}' changed on disk since it was opened", self.path.display()),
            ));
        }
        edit(&mut copy[self.range.clone()]);
        self.mmap = copy.make_read_only()?;
        self.edited = true;
        Ok(true)
    }

    /// Whether the bytes are the file's own mapping (not a copy in memory).
    pub fn is_file_backed(&self) -> bool {
        self.file_backed
    }

    /// The GGUF's bytes (the whole file, or the embedded section).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap[self.range.clone()]
    }

    /// Drops the pages of `range` (offsets into [`GgufFile::bytes`]) from the process's resident
    /// memory, for a reader that streams through the file once (building a pack): they are read
    /// from the file again if touched. Only whole pages inside the range; nothing for an
    /// in-memory copy or a mapping with edited pages ([`GgufFile::edit_mapped`]).
    pub fn release(&self, range: Range<usize>) {
        const PAGE: usize = 4096;
        if !self.file_backed || self.edited {
            return;
        }
        let start = (self.range.start + range.start).div_ceil(PAGE) * PAGE;
        let end = ((self.range.start + range.end.min(self.range.len())) / PAGE * PAGE).min(self.mmap.len());
        if end > start {
            // SAFETY: `mmap` is a read-only mapping of a file (`file_backed`) with no page of its
            // own (not `edited`): MADV_DONTNEED
            // only drops its pages, and a later access faults in the same bytes from the file, so
            // no reference into the map ever sees different contents.
            let _ = unsafe { self.mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    /// The whole mapped file, including what lies outside an embedded GGUF section (after
    /// [`GgufFile::load_into_memory`], only the section).
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

/// A whole file mapped read-only (a sift pack's column sections).
pub struct MappedFile {
    mmap: Mmap,
    path: PathBuf,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: impl AsRef<Path>) -> io::Result<MappedFile> {
        let path = path.as_ref().to_path_buf();
        let file = open_regular(&path)?;
        // SAFETY: as in `GgufFile::open_section`: a read-only map never viewed mutably; a file
        // changed under it can give wrong bytes or SIGBUS, never an out-of-bounds slice, since
        // every range taken from it is checked against its length first.
        let mmap = unsafe { Mmap::map(&file) }?;
        Ok(MappedFile { mmap, path })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedFile").field("path", &self.path).field("len", &self.mmap.len()).finish()
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

/// Makes every page of `map` that no range in `keep` touches inaccessible.
fn protect_gaps(map: &Mmap, keep: &mut [Range<usize>]) -> io::Result<()> {
    const PAGE: usize = 4096;
    keep.sort_by_key(|r| r.start);
    let base = map.as_ptr() as usize;
    let mut gaps = Vec::new();
    let mut pos = 0usize; // first byte not yet known to be needed, page-rounded
    for r in keep.iter() {
        let start = r.start / PAGE * PAGE;
        if start > pos {
            gaps.push(pos..start);
        }
        pos = pos.max(r.end.div_ceil(PAGE) * PAGE);
    }
    let end = map.len().div_ceil(PAGE) * PAGE;
    if end > pos {
        gaps.push(pos..end);
    }
    for g in gaps {
        let (ptr, len) = ((base + g.start) as *mut libc::c_void, g.len());
        // SAFETY: `g` lies inside the mapping (page-aligned, the mapping is page-aligned and
        // rounded up to whole pages by the kernel); after this no code may read those bytes,
        // and none does: they hold no tensor the model reads (the caller's contract), and a
        // stray read faults instead of returning data. MADV_DONTNEED on this private anonymous
        // mapping frees the pages that were filled (the parsed header's).
        let rc = unsafe {
            if libc::madvise(ptr, len, libc::MADV_DONTNEED) != 0 {
                -1
            } else {
                libc::mprotect(ptr, len, libc::PROT_NONE)
            }
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
