//! The `.sift` pack file.
//!
//! A pack holds the column layouts of a GGUF's seven linear ops per layer, and refers to the GGUF
//! itself (the dense tensors, tokenizer and chat template; the rows prompt batches read) by path,
//! size, modification time and hashes ([`SourceGguf`]): nothing of the GGUF is copied.
//!
//! ```text
//! 0       header (64 bytes, rest of the first 4 KiB zero):
//!           magic "SIFTPACK", version u32, flags u32, toc_offset u64, toc_len u64, toc_crc32 u32,
//!           file_len u64
//! 4096    per layer and op, 4 KiB aligned: the op's weight transposed, one contiguous column per
//!         input channel. Exact columns ([`sift_quant::exact`], every quantized source format):
//!         the GGUF's own integers, then (4 KiB aligned) the op's scale plane — the source's
//!         block scales, so the columns hold the GGUF's weights value for value. Float sources
//!         (or `--cols q4_1|q5_0|q8_0`) are re-quantized along the output dimension ([`ColType`]).
//! ...     optionally, per layer and selection site whose units are not in the model's order,
//!         4 KiB aligned: the unit order ([`UnitOrderTensor`]), n_units u32 (position → unit); the
//!         columns of the site's ops lie in that order, their scale planes in the model's
//! ...     per layer with a gated FFN (with `--bundles`), 4 KiB aligned: its neuron bundles,
//!         one record per FFN neuron in the model's order — gate row, up row (the GGUF's bytes),
//!         down column (the down tensor's exact column; its scale plane is the down tensor's) —
//!         padded to 64 bytes ([`sift_quant::bundles`], [`BundleTensor`])
//! ...     optionally (`--group N`), per group of N layers, 4 KiB aligned: n_embd interleaved
//!         records, record c holding column c of q, k, v, gate and up of every layer of the group
//!         (unit → layer → op), for cross-layer preloading ([`GroupTensor`]); a second copy of
//!         those columns, so not written by default
//! toc     JSON table of contents: the source GGUF's record, every section's offset, length and
//!         CRC-32
//! ```
//! Opening checks the magic (a foreign file), the version (a pack from another format version is
//! stale: run `sift pack` again), the length (truncated), every section's CRC-32 (corrupt) and
//! that the source GGUF is there and unchanged ([`SourceGguf::locate`]). A pack opened for a
//! memory budget ([`open_partial`]) checks the header, the table of contents, every section's
//! bounds and the source, and every section's CRC-32 by streaming the file once through a 1 MiB
//! buffer (the pages it read are dropped from the page cache again, so the check holds no
//! memory). That read costs a second or two for a GB pack, so a passed check is remembered in
//! `PACK.verified` beside it (the pack's device, inode, size, modification and change times): a
//! pack rewritten or touched since is checked again; an unwritable folder means a check per open.

mod bundles;

use crate::source::{SourceError, SourceGguf};
use serde::{Deserialize, Serialize};
use sift_gguf::{GgufFile, MappedFile};
use sift_model::layout::{
    unit_positions, BundleTensor, ColumnTensor, GroupPart, GroupTensor, LayerColumns, OpKind, PackIndex,
    UnitOrderTensor, GROUP_OPS, SITE_OPS,
};
use sift_model::{Model, ModelError, QTensor};
use sift_quant::{ColFormat, ColType, ExactFormat};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const PACK_MAGIC: &[u8; 8] = b"SIFTPACK";
/// The pack format this sift writes (4: version 3 with neuron bundles; 3: version 2 with optional
/// unit orders; 2: exact columns with scale planes, the source GGUF referred to rather than
/// copied).
pub const PACK_VERSION: u32 = 4;
/// The oldest pack format this sift reads (a version-2 pack has every site in the model's order).
pub const PACK_VERSION_MIN: u32 = 2;
const ALIGN: u64 = 4096;
const HEADER_LEN: usize = 64;

/// Problems making or opening a pack.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a sift pack or a GGUF file (it starts with {magic:?}); pass a .gguf model or a pack made by `sift pack`")]
    Foreign { path: PathBuf, magic: String },
    #[error("{path} is a stale pack: it has format version {found}, this sift reads versions {PACK_VERSION_MIN} to {PACK_VERSION}; run `sift pack` on the GGUF again")]
    Stale { path: PathBuf, found: u32 },
    #[error("{path} is truncated: the header says {expected} bytes, the file has {found}; run `sift pack` again")]
    Truncated { path: PathBuf, expected: u64, found: u64 },
    #[error("{path} is corrupt: {what} fails its checksum; run `sift pack` again")]
    Corrupt { path: PathBuf, what: String },
    #[error("{path}: bad header: {msg}; run `sift pack` again")]
    Header { path: PathBuf, msg: String },
    #[error("{path}: bad table of contents: {msg}")]
    Toc { path: PathBuf, msg: String },
    #[error(transparent)]
    Output(#[from] sift_output::OutputError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gguf(#[from] sift_gguf::GgufError),
}

/// How column formats are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColPolicy {
    /// Exact columns for every quantized source format, at the source's own bits; float sources
    /// re-quantized to Q8_0.
    #[default]
    Auto,
    /// Exact columns, 5- and 6-bit sources in the wide layout ([`ExactFormat::wide`]: their
    /// integers in bytes, 1.6x / 1.33x the bytes, no bit planes to unpack): faster for sparse
    /// decoding from memory on CPUs without AVX-512 VNNI
    /// ([`sift_quant::exact::wide_is_faster`]), slower under a `--memory` budget, where the
    /// columns come from disk and a byte read costs more than the bit planes.
    Wide,
    /// Re-quantize every op to one format (lossy: a second rounding; kept for comparison).
    Fixed(ColType),
}

impl ColPolicy {
    /// `auto`, `wide`, or a re-quantized format's name (`Q4_1`, `Q5_0`, `Q8_0`).
    pub fn parse(s: &str) -> Option<ColPolicy> {
        match s {
            "auto" => Some(ColPolicy::Auto),
            "wide" => Some(ColPolicy::Wide),
            _ => ColType::from_name(s).map(ColPolicy::Fixed),
        }
    }

    fn choose(self, w: &QTensor) -> ColFormat {
        let exact = match self {
            ColPolicy::Fixed(t) => return ColFormat::Requant(t),
            ColPolicy::Auto => ExactFormat::of(w.ty),
            ColPolicy::Wide => ExactFormat::wide(w.ty).or_else(|| ExactFormat::of(w.ty)),
        };
        match exact {
            Some(f) if f.fits(w.rows, w.cols) => ColFormat::Exact(f),
            _ => ColFormat::Requant(ColType::Q8_0),
        }
    }
}

/// Per layer, per selection site ([`SITE_OPS`] order): the order its units' columns are written
/// in (position → unit, a permutation of the site's units), or `None` for the model's order.
pub type UnitOrders = Vec<[Option<Vec<u32>>; 4]>;

/// What `sift pack` writes.
#[derive(Clone, Debug, Default)]
pub struct PackOptions {
    pub cols: ColPolicy,
    /// Layers per cross-layer interleaved group (0: no interleaved section).
    pub group: usize,
    /// The unit order of each site (empty: every site in the model's order).
    pub unit_orders: UnitOrders,
    /// Write the neuron bundle sections (`sift pack --bundles`): a pack about a third larger,
    /// whose gate-first FFN neurons compute from the bundles. Off by default: measured slower than
    /// the GGUF's rows and the down columns on both CPUs tried (docs/benchmarks.md, issue 59 step 2).
    pub bundles: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Toc {
    version: u32,
    source: SourceGguf,
    /// The GGUF's header length (its data offset).
    gguf_header_len: u64,
    columns: Vec<ColumnTensor>,
    /// The sites whose units are not in the model's order (none in a version-2 pack).
    #[serde(default)]
    orders: Vec<UnitOrderTensor>,
    #[serde(default)]
    groups: Vec<GroupTensor>,
    /// Per layer with a gated FFN, its neuron bundles (none before version 4).
    #[serde(default)]
    bundles: Vec<BundleTensor>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> PackError + '_ {
    move |source| PackError::Io { path: path.to_path_buf(), source }
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Opens a model from a `.gguf` or a `.sift` pack (told apart by their magic, not their name):
/// for a pack, its source GGUF (checked unchanged) with the pack mapped beside it.
pub fn open_model(path: &Path) -> Result<Model, PackError> {
    let Some(toc) = read_toc(path)? else {
        return Ok(Model::load(path)?);
    };
    let src = toc.toc.source.locate(path)?;
    let pack = MappedFile::open(path).map_err(io(path))?;
    let all = pack.bytes();
    let total = toc.total;
    let check = |what: String, off: u64, len: u64, crc: u32| -> Result<(), PackError> {
        let end = section_end(path, &what, off, len, total)?;
        if crc32fast::hash(&all[off as usize..end as usize]) != crc {
            return Err(PackError::Corrupt { path: path.into(), what });
        }
        Ok(())
    };
    let t = &toc.toc;
    for t in &t.columns {
        check(format!("layer {} {:?} columns", t.layer, t.op), t.offset, t.len, t.crc32)?;
        check(format!("layer {} {:?} scales", t.layer, t.op), t.scales_offset, t.scales_len, t.scales_crc32)?;
    }
    for g in &t.groups {
        check(format!("group of layers {:?}", g.layers()), g.offset, g.len, g.crc32)?;
    }
    for b in &t.bundles {
        check(format!("layer {} neuron bundles", b.layer), b.offset, b.len, b.crc32)?;
    }
    let mut model = Model::load(&src)?;
    model.columns = Some(build_index(path, &model, toc)?);
    model.pack = Some(pack);
    Ok(model)
}

/// A pack's table of contents, as read from disk.
pub struct PackToc {
    toc: Toc,
    /// The pack's length according to its header.
    pub total: u64,
}

impl PackToc {
    /// Where the source GGUF's bytes start in the tiered store's address space (past the pack).
    pub fn gguf_offset(&self) -> u64 {
        align_up(self.total)
    }
    /// The source GGUF's length.
    pub fn gguf_len(&self) -> u64 {
        self.toc.source.size
    }
    /// The GGUF header's length.
    pub fn gguf_header_len(&self) -> u64 {
        self.toc.gguf_header_len
    }
    /// The source GGUF's record.
    pub fn source(&self) -> &SourceGguf {
        &self.toc.source
    }
    /// The pack format version it was written in.
    pub fn version(&self) -> u32 {
        self.toc.version
    }
}

/// Reads and checks a pack's header and table of contents with plain reads (no mapping).
/// `Ok(None)`: the file is a GGUF, not a pack.
pub fn read_toc(path: &Path) -> Result<Option<PackToc>, PackError> {
    use std::io::Read;
    let (mut f, _) = sift_output::open_regular(path).map_err(io(path))?;
    let mut magic = [0u8; 8];
    let n = f.read(&mut magic).map_err(io(path))?;
    if n >= 4 && &magic[..4] == b"GGUF" {
        return Ok(None);
    }
    if n < 8 || &magic != PACK_MAGIC {
        return Err(PackError::Foreign {
            path: path.into(),
            magic: String::from_utf8_lossy(&magic[..n]).escape_default().to_string(),
        });
    }
    let file_len = f.metadata().map_err(io(path))?.len();
    let mut head = [0u8; HEADER_LEN];
    f.seek(SeekFrom::Start(0)).map_err(io(path))?;
    f.read_exact(&mut head).map_err(|_| PackError::Truncated {
        path: path.into(),
        expected: HEADER_LEN as u64,
        found: file_len,
    })?;
    let u32_at = |o: usize| u32::from_le_bytes(head[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8 bytes"));
    let version = u32_at(8);
    if !(PACK_VERSION_MIN..=PACK_VERSION).contains(&version) {
        return Err(PackError::Stale { path: path.into(), found: version });
    }
    let (toc_off, toc_len, toc_crc, total) = (u64_at(16), u64_at(24), u32_at(32), u64_at(36));
    if file_len < total {
        return Err(PackError::Truncated { path: path.into(), expected: total, found: file_len });
    }
    let header_err = |msg: String| PackError::Header { path: path.into(), msg };
    if file_len > total {
        return Err(header_err(format!("it says {total} bytes, the file has {file_len} (data appended)")));
    }
    // The flags and the rest of the first 4 KiB are zero (module docs): a byte there was changed.
    let mut rest = vec![0u8; 4096 - HEADER_LEN];
    f.read_exact(&mut rest).map_err(|_| PackError::Truncated { path: path.into(), expected: 4096, found: file_len })?;
    if let Some(i) = head[12..16].iter().chain(&head[44..]).chain(&rest).position(|&b| b != 0) {
        let at = if i < 4 { 12 + i } else { 40 + i };
        return Err(header_err(format!("byte {at} is not zero (flags and padding are)")));
    }
    if toc_off.checked_add(toc_len).is_none_or(|e| e > total) || toc_len > (64 << 20) {
        return Err(PackError::Toc { path: path.into(), msg: format!("toc {toc_off}+{toc_len} is outside the file") });
    }
    let mut toc_bytes = vec![0u8; toc_len as usize];
    f.seek(SeekFrom::Start(toc_off)).map_err(io(path))?;
    f.read_exact(&mut toc_bytes).map_err(io(path))?;
    if crc32fast::hash(&toc_bytes) != toc_crc {
        return Err(PackError::Corrupt { path: path.into(), what: "the table of contents".into() });
    }
    let toc: Toc =
        serde_json::from_slice(&toc_bytes).map_err(|e| PackError::Toc { path: path.into(), msg: e.to_string() })?;
    if toc.version != version {
        return Err(PackError::Toc {
            path: path.into(),
            msg: format!("version {}, the header's {version}", toc.version),
        });
    }
    for t in &toc.columns {
        section_end(path, &format!("layer {} {:?} columns", t.layer, t.op), t.offset, t.len, total)?;
        section_end(path, &format!("layer {} {:?} scales", t.layer, t.op), t.scales_offset, t.scales_len, total)?;
    }
    for g in &toc.groups {
        section_end(path, &format!("group of layers {:?}", g.layers()), g.offset, g.len, total)?;
    }
    for b in &toc.bundles {
        section_end(path, &format!("layer {} neuron bundles", b.layer), b.offset, b.len, total)?;
    }
    Ok(Some(PackToc { toc, total }))
}

/// Opens a pack for running under a memory budget: the GGUF section is built in anonymous
/// memory by `fill` (see [`GgufFile::from_parts`]) holding only the tensors `resident` accepts;
/// everything else stays on disk, reached through the column index this returns with the model.
pub fn open_partial(
    path: &Path,
    toc: PackToc,
    src: &Path,
    fill: impl FnMut(&mut [u8], &[std::ops::Range<usize>]) -> std::io::Result<()>,
    resident: impl Fn(&sift_gguf::Gguf, &sift_gguf::TensorInfo) -> bool,
    check: impl FnOnce(&sift_gguf::Gguf, u64) -> Result<(), String>,
) -> Result<Model, PackError> {
    let (len, header_len) = (toc.gguf_len(), toc.gguf_header_len());
    if header_len == 0 || header_len > len {
        return Err(PackError::Toc { path: path.into(), msg: format!("GGUF header length {header_len} of {len}") });
    }
    verify_streaming(path, &toc)?;
    let gguf = GgufFile::from_parts(src, len as usize, header_len as usize, fill, resident, check)?;
    let mut model = Model::from_file(gguf)?;
    model.columns = Some(build_index(path, &model, toc)?);
    Ok(model)
}

/// The file identity a passed check is remembered by (see the module docs).
fn identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!(
        "sift pack verified: dev {} ino {} size {} mtime {}.{} ctime {}.{}\n",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

fn stamp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".verified");
    PathBuf::from(p)
}

/// Every section's CRC-32 unless a check of this very file passed before (its stamp).
fn verify_streaming(path: &Path, toc: &PackToc) -> Result<(), PackError> {
    let id = identity(path);
    let stamp = stamp_path(path);
    if id.is_some() && sift_output::read_regular(&stamp, 4096).ok().as_deref() == id.as_ref().map(|s| s.as_bytes()) {
        return Ok(());
    }
    verify_sections(path, toc)?;
    if let Some(id) = id {
        // Best effort: a folder we cannot write only means checking again next time.
        let _ = sift_output::write(&stamp, &[path], id.as_bytes());
    }
    Ok(())
}

/// Every section's CRC-32, the file read once front to back through one 1 MiB buffer; what was
/// read is dropped from the page cache again (`POSIX_FADV_DONTNEED`).
fn verify_sections(path: &Path, toc: &PackToc) -> Result<(), PackError> {
    use std::io::{Read, Seek, SeekFrom};
    let t = &toc.toc;
    let mut sections: Vec<(u64, u64, u32, String)> = Vec::new();
    for c in &t.columns {
        sections.push((c.offset, c.len, c.crc32, format!("layer {} {:?} columns", c.layer, c.op)));
        sections.push((c.scales_offset, c.scales_len, c.scales_crc32, format!("layer {} {:?} scales", c.layer, c.op)));
    }
    for g in &t.groups {
        sections.push((g.offset, g.len, g.crc32, format!("group of layers {:?}", g.layers())));
    }
    for b in &t.bundles {
        sections.push((b.offset, b.len, b.crc32, format!("layer {} neuron bundles", b.layer)));
    }
    sections.sort_by_key(|s| s.0);
    let (mut f, _) = sift_output::open_regular(path).map_err(io(path))?;
    let mut buf = vec![0u8; 1 << 20];
    for (off, len, crc, what) in sections {
        section_end(path, &what, off, len, toc.total)?;
        f.seek(SeekFrom::Start(off)).map_err(io(path))?;
        let mut h = crc32fast::Hasher::new();
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            f.read_exact(&mut buf[..n]).map_err(io(path))?;
            h.update(&buf[..n]);
            left -= n as u64;
        }
        if h.finalize() != crc {
            return Err(PackError::Corrupt { path: path.into(), what });
        }
        drop_cached(&f, off, len);
    }
    Ok(())
}

/// Asks the kernel to drop a range of the file from the page cache (a hint).
fn drop_cached(f: &std::fs::File, off: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: posix_fadvise takes a file descriptor we own (open for the call's duration)
        // and plain integers; it never touches our memory.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), off as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (f, off, len);
}

/// The end of a section, checked to lie inside the pack.
fn section_end(path: &Path, what: &str, off: u64, len: u64, total: u64) -> Result<u64, PackError> {
    off.checked_add(len)
        .filter(|&e| e <= total)
        .ok_or_else(|| PackError::Toc { path: path.into(), msg: format!("{what} at {off}+{len} is outside the file") })
}

/// Checks the table of contents against the model's shapes and builds the column index.
fn build_index(path: &Path, model: &Model, pack_toc: PackToc) -> Result<PackIndex, PackError> {
    let gguf_offset = pack_toc.gguf_offset();
    let toc = pack_toc.toc;
    let c = &model.config;
    let toc_err = |msg: String| PackError::Toc { path: path.into(), msg };
    if toc.gguf_header_len != model.file.gguf.data_offset {
        return Err(toc_err(format!(
            "a GGUF header of {} bytes, the model's has {} (made from another file)",
            toc.gguf_header_len, model.file.gguf.data_offset
        )));
    }
    let mut layers: Vec<LayerColumns> = (0..c.n_layer)
        .map(|_| LayerColumns { ops: Vec::new(), positions: Default::default(), bundles: None })
        .collect();
    for t in &toc.columns {
        let lw = model
            .layers
            .get(t.layer)
            .ok_or_else(|| toc_err(format!("layer {} does not exist in the model", t.layer)))?;
        let w = lw.op(t.op);
        let exact_ok = match t.ty {
            ColFormat::Exact(f) => f.src == w.ty && f.fits(t.n_out, t.n_in),
            ColFormat::Requant(_) => t.n_out.is_multiple_of(32),
        };
        if t.n_in != w.cols
            || t.n_out != w.rows
            || !exact_ok
            || t.col_bytes != t.ty.col_bytes(t.n_out)
            || t.len != (t.col_bytes * t.n_in) as u64
            || t.scales_len != t.ty.scale_bytes(t.n_out, t.n_in) as u64
        {
            return Err(toc_err(format!("layer {} {:?}: shape does not match the model", t.layer, t.op)));
        }
        let ops = &mut layers[t.layer].ops;
        if ops.len() != t.op as usize {
            return Err(toc_err(format!("layer {} ops out of order", t.layer)));
        }
        ops.push(t.clone());
    }
    if layers.iter().any(|l| l.ops.len() != 7) {
        return Err(toc_err("some layer lacks column tensors".into()));
    }
    read_unit_orders(path, &toc.orders, pack_toc.total, &mut layers)?;
    bundles::attach(path, model, &toc.bundles, &mut layers)?;
    let mut next_layer = 0;
    for g in &toc.groups {
        let mut off = 0;
        let ok = g.first_layer == next_layer
            && g.n_layers > 0
            && g.layers().end <= c.n_layer
            && g.n_units == c.n_embd
            && g.parts.len() == g.n_layers * GROUP_OPS.len()
            && g.parts.iter().enumerate().all(|(i, p)| {
                let (l, op) = (g.first_layer + i / GROUP_OPS.len(), GROUP_OPS[i % GROUP_OPS.len()]);
                let good = p.layer == l && p.op == op && p.offset == off && p.col_bytes == layers[l].op(op).col_bytes;
                off += p.col_bytes;
                good
            })
            && g.unit_bytes == off
            && g.len == (g.unit_bytes * g.n_units) as u64;
        if !ok {
            return Err(toc_err(format!("group of layers {:?}: shape does not match the model", g.layers())));
        }
        next_layer = g.layers().end;
    }
    if !toc.groups.is_empty() && next_layer != c.n_layer {
        return Err(toc_err("the cross-layer groups do not cover every layer".into()));
    }
    Ok(PackIndex {
        layers,
        groups: toc.groups,
        source_name: toc.source.file_name(),
        gguf_offset,
        gguf_len: toc.source.size,
        gguf_header_len: toc.gguf_header_len,
    })
}

/// Reads, checks and inverts the unit orders of a pack into `layers` (plain reads: the orders are
/// small, and a pack opened under a budget is not mapped).
fn read_unit_orders(
    path: &Path,
    orders: &[UnitOrderTensor],
    total: u64,
    layers: &mut [LayerColumns],
) -> Result<(), PackError> {
    use std::os::unix::fs::FileExt;
    if orders.is_empty() {
        return Ok(());
    }
    let toc_err = |msg: String| PackError::Toc { path: path.into(), msg };
    let (file, _) = sift_output::open_regular(path).map_err(io(path))?;
    for t in orders {
        let what = format!("layer {} site {} unit order", t.layer, t.site);
        let lc = layers.get_mut(t.layer).ok_or_else(|| toc_err(format!("{what}: no such layer")))?;
        let n_units = SITE_OPS.get(t.site).map(|ops| lc.op(ops[0]).n_in);
        if n_units != Some(t.n_units) || t.len != t.n_units as u64 * 4 {
            return Err(toc_err(format!("{what}: shape does not match the model")));
        }
        if lc.positions[t.site].is_some() {
            return Err(toc_err(format!("{what} is given twice")));
        }
        section_end(path, &what, t.offset, t.len, total)?;
        let mut bytes = vec![0u8; t.len as usize];
        file.read_exact_at(&mut bytes, t.offset).map_err(io(path))?;
        if crc32fast::hash(&bytes) != t.crc32 {
            return Err(PackError::Corrupt { path: path.into(), what });
        }
        let order: Vec<u32> = bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let positions = unit_positions(&order).map_err(|e| toc_err(format!("{what} is not a permutation: {e}")))?;
        lc.positions[t.site] = Some(positions);
    }
    Ok(())
}

/// Checks that `orders` fits the model (per layer, per site: a permutation of its units) before a
/// pack is written with them.
fn check_unit_orders(src: &Path, model: &Model, orders: &UnitOrders) -> Result<(), PackError> {
    let c = &model.config;
    if !orders.is_empty() && orders.len() != c.n_layer {
        return Err(PackError::Toc {
            path: src.into(),
            msg: format!("unit orders for {} layers, the model has {}", orders.len(), c.n_layer),
        });
    }
    let dims = sift_model::layout::SiteDims::of(c).units;
    for (l, sites) in orders.iter().enumerate() {
        for (site, order) in sites.iter().enumerate() {
            let Some(order) = order else { continue };
            let bad = |msg: String| PackError::Toc {
                path: src.into(),
                msg: format!("layer {l} site {site} unit order: {msg}"),
            };
            if order.len() != dims[site] {
                return Err(bad(format!("{} units, the site has {}", order.len(), dims[site])));
            }
            unit_positions(order).map_err(bad)?;
        }
    }
    Ok(())
}

/// `data`'s columns (`cb` bytes each) rearranged so that position `p` holds column `order[p]`.
fn reorder_columns(data: &[u8], cb: usize, order: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for &u in order {
        out.extend_from_slice(&data[u as usize * cb..(u as usize + 1) * cb]);
    }
    out
}

/// Dequantizes `w` and writes its columns (transposed, re-quantized to `ty`).
fn requant_columns(model: &Model, w: &QTensor, ty: ColType) -> Vec<u8> {
    let (rows, cols) = (w.rows, w.cols);
    let mut dense = vec![0f32; rows * cols];
    for r in 0..rows {
        w.ty.dequantize_row(model.row(w, r), &mut dense[r * cols..(r + 1) * cols]);
    }
    let cb = ty.col_bytes(rows);
    let mut out = vec![0u8; cb * cols];
    let mut col = vec![0f32; rows];
    for j in 0..cols {
        for (r, v) in col.iter_mut().enumerate() {
            *v = dense[r * cols + j];
        }
        ty.quantize_col(&col, &mut out[j * cb..(j + 1) * cb]);
    }
    out
}

/// `w`'s columns in format `ty`, and its scale plane (empty for re-quantized columns).
fn op_columns(model: &Model, w: &QTensor, ty: ColFormat) -> (Vec<u8>, Vec<u8>) {
    match ty {
        ColFormat::Requant(t) => (requant_columns(model, w, t), Vec::new()),
        ColFormat::Exact(f) => f.transpose(&model.file.bytes()[w.range.clone()], w.rows, w.cols),
    }
}

/// Writes a pack of the GGUF at `src` to `dst` (through a temporary file renamed at the end).
pub fn pack_model(
    src: &Path,
    dst: &Path,
    opts: &PackOptions,
    mut progress: impl FnMut(&str),
) -> Result<u64, PackError> {
    // The destination first, before any work: never a device, never the model itself.
    sift_output::check_destination(dst, &[src])?;
    let model = Model::load(src)?;
    let c = model.config.clone();
    check_unit_orders(src, &model, &opts.unit_orders)?;
    if c.n_embd % 32 != 0 || c.n_embd_kv() % 32 != 0 || c.n_ff % 32 != 0 || c.n_embd_q() % 32 != 0 {
        return Err(PackError::Toc {
            path: src.into(),
            msg: "model dimensions are not multiples of 32; columns cannot be blocked".into(),
        });
    }
    // A temporary file of its own per build beside `dst` (two builds of one pack at once each
    // write their own, and the last rename wins with a whole pack), removed on any error.
    let mut out = sift_output::Output::create(dst, &[src])?;
    let tmp = out.tmp_path().to_path_buf();
    let f = out.file().try_clone().map_err(io(&tmp))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut pos: u64 = 0;
    let pad_to = |w: &mut BufWriter<File>, pos: &mut u64, to: u64| -> Result<(), PackError> {
        let zeros = vec![0u8; (to - *pos) as usize];
        w.write_all(&zeros).map_err(io(&tmp))?;
        *pos = to;
        Ok(())
    };
    // Writes `data` at the next 4 KiB boundary; returns (offset, len, crc).
    let section = |w: &mut BufWriter<File>, pos: &mut u64, data: &[u8]| -> Result<(u64, u64, u32), PackError> {
        if data.is_empty() {
            return Ok((0, 0, crc32fast::hash(&[])));
        }
        let aligned = align_up(*pos);
        pad_to(w, pos, aligned)?;
        w.write_all(data).map_err(io(&tmp))?;
        let at = *pos;
        *pos += data.len() as u64;
        Ok((at, data.len() as u64, crc32fast::hash(data)))
    };
    pad_to(&mut w, &mut pos, ALIGN)?;
    // The whole GGUF's CRC, a piece at a time, each piece's pages released after it (the build
    // streams through the GGUF once and should hold little of it; see `GgufFile::release`).
    let gguf_bytes = model.file.bytes();
    let mut hasher = crc32fast::Hasher::new();
    const PIECE: usize = 16 << 20;
    for start in (0..gguf_bytes.len()).step_by(PIECE) {
        let end = (start + PIECE).min(gguf_bytes.len());
        hasher.update(&gguf_bytes[start..end]);
        model.file.release(start..end);
    }
    let source = SourceGguf::of(src, hasher.finalize()).map_err(io(src))?;
    let mut columns = Vec::new();
    let mut orders = Vec::new();
    let mut groups = Vec::new();
    let mut bundle_tensors = Vec::new();
    // The current group's in-op columns, for the interleaved section: (layer, op, bytes).
    let mut group_cols: Vec<(usize, OpKind, usize, Vec<u8>)> = Vec::new();
    for (l, lw) in model.layers.iter().enumerate() {
        for op in OpKind::ALL {
            let wt = lw.op(op);
            let ty = opts.cols.choose(wt);
            let (data, scales) = op_columns(&model, wt, ty);
            model.file.release(wt.range.clone());
            let order = opts.unit_orders.get(l).and_then(|o| o[op.site_index()].as_deref());
            let (offset, len, crc32) = match order {
                Some(order) => section(&mut w, &mut pos, &reorder_columns(&data, ty.col_bytes(wt.rows), order))?,
                None => section(&mut w, &mut pos, &data)?,
            };
            let (scales_offset, scales_len, scales_crc32) = section(&mut w, &mut pos, &scales)?;
            columns.push(ColumnTensor {
                layer: l,
                op,
                ty,
                n_in: wt.cols,
                n_out: wt.rows,
                col_bytes: ty.col_bytes(wt.rows),
                offset,
                len,
                crc32,
                scales_offset,
                scales_len,
                scales_crc32,
            });
            if op == OpKind::Down && opts.bundles {
                if let Some((mut t, records)) = bundles::layer_records(&model, l, ty, &data) {
                    (t.offset, t.len, t.crc32) = section(&mut w, &mut pos, &records)?;
                    bundle_tensors.push(t);
                }
            }
            if opts.group > 0 && GROUP_OPS.contains(&op) {
                group_cols.push((l, op, ty.col_bytes(wt.rows), data));
            }
        }
        for (site, order) in opts.unit_orders.get(l).into_iter().flatten().enumerate() {
            let Some(order) = order else { continue };
            let bytes: Vec<u8> = order.iter().flat_map(|u| u.to_le_bytes()).collect();
            let (offset, len, crc32) = section(&mut w, &mut pos, &bytes)?;
            orders.push(UnitOrderTensor { layer: l, site, n_units: order.len(), offset, len, crc32 });
        }
        let group_full = (l + 1) % opts.group.max(1) == 0 || l + 1 == c.n_layer;
        if opts.group > 0 && group_full {
            let first_layer = group_cols[0].0;
            let mut parts = Vec::new();
            let mut unit_bytes = 0;
            for (layer, op, cb, _) in &group_cols {
                parts.push(GroupPart { layer: *layer, op: *op, offset: unit_bytes, col_bytes: *cb });
                unit_bytes += cb;
            }
            let mut data = Vec::with_capacity(unit_bytes * c.n_embd);
            for ch in 0..c.n_embd {
                for (_, _, cb, cols) in &group_cols {
                    data.extend_from_slice(&cols[ch * cb..(ch + 1) * cb]);
                }
            }
            let (offset, len, crc32) = section(&mut w, &mut pos, &data)?;
            groups.push(GroupTensor {
                first_layer,
                n_layers: l + 1 - first_layer,
                n_units: c.n_embd,
                unit_bytes,
                parts,
                offset,
                len,
                crc32,
            });
            group_cols.clear();
        }
        progress(&format!("layer {}/{}", l + 1, c.n_layer));
    }
    let toc = Toc {
        version: PACK_VERSION,
        source,
        gguf_header_len: model.file.gguf.data_offset,
        columns,
        orders,
        groups,
        bundles: bundle_tensors,
    };
    let toc_bytes = serde_json::to_vec(&toc).map_err(|e| PackError::Toc { path: tmp.clone(), msg: e.to_string() })?;
    let toc_off = align_up(pos);
    pad_to(&mut w, &mut pos, toc_off)?;
    w.write_all(&toc_bytes).map_err(io(&tmp))?;
    pos += toc_bytes.len() as u64;
    let mut head = [0u8; HEADER_LEN];
    head[..8].copy_from_slice(PACK_MAGIC);
    head[8..12].copy_from_slice(&PACK_VERSION.to_le_bytes());
    head[16..24].copy_from_slice(&toc_off.to_le_bytes());
    head[24..32].copy_from_slice(&(toc_bytes.len() as u64).to_le_bytes());
    head[32..36].copy_from_slice(&crc32fast::hash(&toc_bytes).to_le_bytes());
    head[36..44].copy_from_slice(&pos.to_le_bytes());
    let mut f = w.into_inner().map_err(|e| PackError::Io { path: tmp.clone(), source: e.into_error() })?;
    f.seek(SeekFrom::Start(0)).map_err(io(&tmp))?;
    f.write_all(&head).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    out.commit()?;
    Ok(pos)
}
