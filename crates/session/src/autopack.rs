//! `--memory` on a `.gguf` just works: the pack (the column file) a budgeted run streams from is
//! built on the first run and reused after.
//!
//! Where: `--pack-dir DIR` if given, else next to the GGUF (`model.gguf` → `model.sift`) when that
//! folder is writable, else the user's cache folder (`$XDG_CACHE_HOME/sift`, or
//! `~/.cache/sift`). A pack records the GGUF it was made from ([`sift_store::SourceGguf`]: path,
//! size, modification time, hashes). A later run reuses it when that record names this GGUF and
//! the GGUF is unchanged (size, modification time and the first and last MiB; no re-hashing of
//! the whole file); a GGUF that changed, was replaced or truncated gets a new pack. The pack is
//! written to a temporary file and renamed when complete (its table of contents, with the
//! record, is written last), so a build killed midway leaves nothing a later run would use. The
//! free space of the target folder is checked first.

use anyhow::Context;
use std::path::{Path, PathBuf};

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

/// [`pack_for`] with its notices and build progress on stderr, as the commands show them.
pub fn column_file(model: &Path, pack_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mut packing = false;
    let pack = pack_for(
        model,
        pack_dir,
        |notice| eprintln!("sift: {notice}"),
        |step| {
            packing = true;
            eprint!("\rsift: packing {step}   ");
        },
    )?;
    if packing {
        eprintln!();
    }
    Ok(pack)
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
    let source = std::fs::canonicalize(model).with_context(|| format!("cannot resolve '{}'", model.display()))?;
    let size = std::fs::metadata(&source).with_context(|| format!("cannot stat '{}'", source.display()))?.len();
    let stem = source.file_stem().map(|s| s.to_os_string()).unwrap_or_else(|| "model".into());
    let mut name = stem;
    name.push(".sift");
    let dir = match pack_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("--pack-dir: cannot create '{}'", d.display()))?;
            d.to_path_buf()
        }
        None => {
            let beside = source.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
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
    if let Ok(meta) = std::fs::metadata(&pack) {
        // Only a pack is ever replaced: never a FIFO or a device (its read would block or never
        // end), nor a file of the user's that happens to have the name.
        anyhow::ensure!(
            meta.is_file(),
            "{} is not a regular file; --memory on '{}' builds its column file there: move it, or give --pack-dir DIR",
            pack.display(),
            model.display()
        );
        match sift_store::read_toc(&pack) {
            Ok(Some(toc)) if toc.source().path == source => match toc.source().matches(&source) {
                Ok(()) => return Ok(pack),
                Err(e) => notice(&format!("{}: {e}; building it again", pack.display())),
            },
            Ok(Some(toc)) => notice(&format!(
                "{} was built from {}, not {}: building it again",
                pack.display(),
                toc.source().path.display(),
                model.display()
            )),
            Ok(None) => anyhow::bail!("{} is a GGUF, not a pack; move it or give --pack-dir DIR", pack.display()),
            Err(sift_store::PackError::Foreign { .. }) => anyhow::bail!(
                "{} is not a sift pack, and --memory on '{}' would build its column file there: move that file, or give --pack-dir DIR",
                pack.display(),
                model.display()
            ),
            Err(e) => notice(&format!("{} cannot be used ({e}): building it again", pack.display())),
        }
    }
    // A pack holds the GGUF's linear ops as columns: about the GGUF's size; ask for 1.5 times it.
    let need = size.saturating_mul(3) / 2;
    if let Some(free) = free_bytes(&dir) {
        anyhow::ensure!(
            free >= need,
            "--memory on a GGUF builds a column file of about {} MiB in '{}', which has {} MiB free; free some space, give --pack-dir DIR elsewhere, or run `sift pack` yourself",
            need >> 20,
            dir.display(),
            free >> 20
        );
    }
    notice(&format!("building the column file {} for --memory (once; later runs reuse it)", pack.display()));
    let opts = sift_store::PackOptions::default();
    sift_store::pack_model(model, &pack, &opts, |s| progress(s))
        .with_context(|| format!("cannot build '{}'", pack.display()))?;
    Ok(pack)
}
