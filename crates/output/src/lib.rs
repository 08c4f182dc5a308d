//! Output files written safely (issue 22). Every file sift writes — packs, calibrations, traces,
//! device profiles, trained predictors — goes through [`Output`]:
//!
//! - the destination is checked first: it must be a regular file or not exist (a device such as
//!   `/dev/null`, a FIFO or a directory would be replaced by the final rename), and it must not be
//!   one of the command's inputs, compared by file identity (device and inode), not by spelling
//!   (`dir/../model.gguf`, a hard link);
//! - the data goes to a temporary file in the destination's folder with a name no other writer
//!   uses (process id, a per-process counter), created exclusively;
//! - [`Output::commit`] syncs it, checks the destination again, and renames it over the
//!   destination; a file dropped without a commit (an error on the way, a full disk) is removed,
//!   so the destination keeps its old content and no stub appears.
//!
//! Its counterpart for small inputs, [`read_regular`], reads a side file (a budget file) only
//! when it is a regular file and not longer than a bound: a FIFO would block the read forever
//! and a device never end.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why an output cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot write {path}: it is not a regular file (a device, FIFO or directory), which the output would replace; pass a file path")]
    NotAFile { path: PathBuf },
    #[error("cannot write {path}: it is {input}, an input of this command; pass another output path")]
    IsInput { path: PathBuf, input: PathBuf },
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} exists: pass --force to replace it, or choose another output path")]
    Exists { path: PathBuf },
}

impl From<OutputError> for std::io::Error {
    fn from(e: OutputError) -> Self {
        let kind = match &e {
            OutputError::Io { source, .. } => source.kind(),
            _ => std::io::ErrorKind::InvalidInput,
        };
        std::io::Error::new(kind, e.to_string())
    }
}

/// Whether two metadata describe the same file.
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        false
    }
}

/// A command's explicit output: refused when it exists unless `force` (`--force`), so a typo in
/// `-o` never replaces a file silently. Checked before any work; [`Output`] then writes it.
pub fn check_new(dst: &Path, force: bool) -> Result<(), OutputError> {
    if !force && std::fs::symlink_metadata(dst).is_ok() {
        return Err(OutputError::Exists { path: dst.to_path_buf() });
    }
    Ok(())
}

/// Checks a destination: a regular file or nothing, and none of `inputs`.
pub fn check_destination(dst: &Path, inputs: &[&Path]) -> Result<(), OutputError> {
    match std::fs::metadata(dst) {
        Ok(m) if !m.is_file() => Err(OutputError::NotAFile { path: dst.to_path_buf() }),
        Ok(m) => {
            for input in inputs {
                if std::fs::metadata(input).is_ok_and(|i| same_file(&m, &i)) {
                    return Err(OutputError::IsInput { path: dst.to_path_buf(), input: input.to_path_buf() });
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(OutputError::Io { path: dst.to_path_buf(), source }),
    }
}

/// An output file being written: a temporary file beside the destination until [`Output::commit`].
#[derive(Debug)]
pub struct Output {
    file: Option<File>,
    tmp: PathBuf,
    dst: PathBuf,
    inputs: Vec<PathBuf>,
}

impl Output {
    /// Checks `dst` against `inputs` and opens a new temporary file in its folder.
    pub fn create(dst: &Path, inputs: &[&Path]) -> Result<Output, OutputError> {
        check_destination(dst, inputs)?;
        static N: AtomicU64 = AtomicU64::new(0);
        let name = dst.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
        let tmp =
            dst.with_file_name(format!(".{name}.{}-{}.tmp", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let file = File::create_new(&tmp).map_err(|source| OutputError::Io { path: tmp.clone(), source })?;
        Ok(Output {
            file: Some(file),
            tmp,
            dst: dst.to_path_buf(),
            inputs: inputs.iter().map(|p| p.to_path_buf()).collect(),
        })
    }

    /// The temporary file, to write (and seek) in.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("an output is committed once")
    }

    /// The temporary file's path (for error messages).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Syncs the data, checks the destination again (it may have changed meanwhile) and renames
    /// the temporary file over it.
    pub fn commit(mut self) -> Result<(), OutputError> {
        let file = self.file.take().expect("an output is committed once");
        file.sync_all().map_err(|source| OutputError::Io { path: self.tmp.clone(), source })?;
        drop(file);
        let inputs: Vec<&Path> = self.inputs.iter().map(PathBuf::as_path).collect();
        check_destination(&self.dst, &inputs)?;
        std::fs::rename(&self.tmp, &self.dst).map_err(|source| OutputError::Io { path: self.dst.clone(), source })?;
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            self.file = None;
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `dst` through an [`Output`].
pub fn write(dst: &Path, inputs: &[&Path], bytes: &[u8]) -> Result<(), OutputError> {
    let mut out = Output::create(dst, inputs)?;
    let tmp = out.tmp.clone();
    out.file().write_all(bytes).map_err(|source| OutputError::Io { path: tmp, source })?;
    out.commit()
}

/// Opens `path` for reading if it is a regular file, and says how long it is. It is opened
/// without blocking (a FIFO with no writer would otherwise block the open) and checked with
/// `fstat` before any read, so FIFOs, devices and directories are refused at once, naming the
/// path. For side files whose header bounds the rest: read the header, check the length, then
/// the rest (never "until the end" of something that has none).
pub fn open_regular(path: &Path) -> std::io::Result<(File, u64)> {
    use std::io::{Error, ErrorKind};
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let f = opts.open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a regular file (a FIFO, device or directory): use a regular file", path.display()),
        ));
    }
    Ok((f, meta.len()))
}

/// Reads `path` whole if it is a regular file ([`open_regular`]) of at most `max` bytes.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    let (f, _) = open_regular(path)?;
    let mut bytes = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("{} is longer than the {max} bytes such a file may have", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_replaces_regular_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        write(&p, &[], b"one").unwrap();
        write(&p, &[], b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "a temporary file was left");
    }

    #[test]
    fn refuses_devices_directories_and_inputs() {
        let dir = tempfile::tempdir().unwrap();
        #[cfg(unix)]
        {
            let e = write(Path::new("/dev/null"), &[], b"x").unwrap_err();
            assert!(matches!(e, OutputError::NotAFile { .. }), "{e}");
        }
        let e = write(dir.path(), &[], b"x").unwrap_err();
        assert!(matches!(e, OutputError::NotAFile { .. }), "{e}");
        let input = dir.path().join("in.txt");
        std::fs::write(&input, b"keep").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let spelled = dir.path().join("sub/../in.txt");
        let e = write(&spelled, &[&input], b"x").unwrap_err();
        assert!(matches!(e, OutputError::IsInput { .. }), "{e}");
        assert_eq!(std::fs::read(&input).unwrap(), b"keep");
    }

    #[test]
    fn an_output_dropped_before_its_commit_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        std::fs::write(&p, b"old").unwrap();
        {
            let mut out = Output::create(&p, &[]).unwrap();
            out.file().write_all(b"half of the new").unwrap();
            // An error here: dropped, not committed.
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "the temporary file was left");
    }

    #[test]
    fn side_files_are_read_only_from_bounded_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("budget");
        std::fs::write(&f, b"300M\n").unwrap();
        assert_eq!(read_regular(&f, 16).unwrap(), b"300M\n");
        let e = read_regular(&f, 3).unwrap_err();
        assert!(e.to_string().contains("longer than the 3 bytes"), "{e}");
        let e = read_regular(dir.path(), 16).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), 16).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert_eq!(read_regular(&dir.path().join("absent"), 16).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }
}
