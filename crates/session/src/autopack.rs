//! `--memory` on a `.gguf` just works: the pack a budgeted run streams from is built on the first
//! run and reused after.
//!
//! Where: `--pack-dir DIR` if given, else next to the GGUF (`model.gguf` → `model.sift`) when that
//! folder is writable, else the user's cache folder (`$XDG_CACHE_HOME/sift`, or
//! `~/.cache/sift`). Beside the pack a small record (`model.sift.source`, JSON) names the GGUF it
//! was built from: its absolute path, size, modification time and a CRC-32 of its first and last
//! MiB. A later run reuses the pack only when the record matches the GGUF as it is now (no
//! re-hashing of the whole file); a GGUF that changed, was replaced or truncated gets a new pack,
//! and a pack without a matching record (an interrupted build, a file from elsewhere) is never
//! trusted. The pack is written to a temporary file and renamed when complete, the record after
//! it, so a build killed midway leaves nothing a later run would use. The free space of the
//! target folder is checked first.

use anyhow::Context;
use std::path::{Path, PathBuf};

/// What a pack records about the GGUF it was built from.
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct SourceRecord {
    source: PathBuf,
    size: u64,
    mtime_ns: u128,
    head_tail_crc32: u32,
}

/// CRC-32 of the first and the last MiB of the `size` bytes at `offset` in `path`.
fn head_tail_crc32(path: &Path, offset: u64, size: u64) -> std::io::Result<u32> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let piece = 1u64 << 20;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; piece.min(size) as usize];
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(&mut buf)?;
    h.update(&buf);
    if size > piece {
        let tail = piece.min(size - piece);
        f.seek(SeekFrom::Start(offset + size - tail))?;
        buf.resize(tail as usize, 0);
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize())
}

impl SourceRecord {
    fn of(gguf: &Path) -> anyhow::Result<SourceRecord> {
        let source = std::fs::canonicalize(gguf).with_context(|| format!("cannot resolve '{}'", gguf.display()))?;
        let meta = std::fs::metadata(&source).with_context(|| format!("cannot stat '{}'", source.display()))?;
        let mtime_ns =
            meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
        let size = meta.len();
        let head_tail_crc32 =
            head_tail_crc32(&source, 0, size).with_context(|| format!("cannot read '{}'", source.display()))?;
        Ok(SourceRecord { source, size, mtime_ns, head_tail_crc32 })
    }

    /// Whether `pack` (a pack made by `sift pack`, without a record) holds this GGUF: same size
    /// and the same first and last MiB of its embedded copy.
    fn embedded_in(&self, pack: &Path) -> bool {
        let Ok(Some(toc)) = sift_store::read_toc(pack) else { return false };
        toc.gguf_len() == self.size
            && head_tail_crc32(pack, toc.gguf_offset(), self.size).is_ok_and(|c| c == self.head_tail_crc32)
    }

    fn write(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("source.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("cannot write '{}'", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write '{}'", path.display()))
    }
}

/// The record file beside `pack`.
fn record_path(pack: &Path) -> PathBuf {
    let mut s = pack.as_os_str().to_owned();
    s.push(".source");
    PathBuf::from(s)
}

/// Whether `dir` accepts new files (tried, not guessed from permission bits).
fn writable(dir: &Path) -> bool {
    tempfile::Builder::new().prefix(".sift-probe").tempfile_in(dir).is_ok()
}

/// The user's cache folder for packs.
fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("sift"))
}

/// Free bytes on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory of the right type;
    // statvfs only writes into it.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // The field types differ between platforms (u32 on some 32-bit ones).
    #[allow(clippy::unnecessary_cast)]
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The pack a budgeted run of `model` streams from: `model` itself when it is a pack; for a GGUF,
/// the pack built from it (see the module docs), built now when there is none that matches it.
/// `notice` gets what is being done and why (one line each), `progress` the build's steps.
pub fn pack_for(
    model: &Path,
    pack_dir: Option<&Path>,
    mut notice: impl FnMut(&str),
    mut progress: impl FnMut(&str),
) -> anyhow::Result<PathBuf> {
    if sift_store::read_toc(model)?.is_some() {
        return Ok(model.to_path_buf());
    }
    let record = SourceRecord::of(model)?;
    let stem = record.source.file_stem().map(|s| s.to_os_string()).unwrap_or_else(|| "model".into());
    let mut name = stem;
    name.push(".sift");
    let dir = match pack_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("--pack-dir: cannot create '{}'", d.display()))?;
            d.to_path_buf()
        }
        None => {
            let beside = record.source.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
            if writable(&beside) {
                beside
            } else {
                let d = cache_dir().context(
                    "the model's folder is not writable and there is no HOME for a cache folder; give --pack-dir DIR",
                )?;
                std::fs::create_dir_all(&d)
                    .with_context(|| format!("cannot create the cache folder '{}'", d.display()))?;
                d
            }
        }
    };
    let pack = dir.join(name);
    let rec_path = record_path(&pack);
    let recorded: Option<SourceRecord> =
        std::fs::read(&rec_path).ok().filter(|b| b.len() < 1 << 16).and_then(|b| serde_json::from_slice(&b).ok());
    if pack.exists() {
        match &recorded {
            Some(r) if *r == record && sift_store::read_toc(&pack).ok().flatten().is_some() => return Ok(pack),
            Some(r) if r.source == record.source => {
                notice(&format!("{} changed since its pack was built: building it again", model.display()))
            }
            Some(r) => notice(&format!(
                "{} was built from {}, not {}: building it again",
                pack.display(),
                r.source.display(),
                model.display()
            )),
            None if record.embedded_in(&pack) => {
                // A pack made by `sift pack` from this very GGUF: adopt it.
                record.write(&rec_path)?;
                return Ok(pack);
            }
            None => notice(&format!(
                "{} has no record of its source and does not hold this GGUF (an interrupted build?): building it again",
                pack.display()
            )),
        }
    }
    // A pack holds the GGUF and the column layouts: about 2.7 times the GGUF; ask for 3.
    let need = record.size.saturating_mul(3);
    if let Some(free) = free_bytes(&dir) {
        anyhow::ensure!(
            free >= need,
            "--memory on a GGUF builds a pack of about {} MiB in '{}', which has {} MiB free; free some space, give --pack-dir DIR elsewhere, or run `sift pack` yourself",
            need >> 20,
            dir.display(),
            free >> 20
        );
    }
    let _ = std::fs::remove_file(&rec_path);
    notice(&format!("building the pack {} for --memory (once; later runs reuse it)", pack.display()));
    let opts = sift_store::PackOptions { cols: sift_store::ColPolicy::Auto, bundles: true, group: 4 };
    sift_store::pack_model(model, &pack, &opts, |s| progress(s))
        .with_context(|| format!("cannot build '{}'", pack.display()))?;
    record.write(&rec_path)?;
    Ok(pack)
}
