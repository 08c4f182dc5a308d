//! A command's output files checked against its inputs before any work (docs/robustness.md):
//! an output that is one of the command's inputs — compared by file identity, so
//! `-o ../dir/model.gguf` and hard links count — is refused whatever `--force` says, and so is
//! the GGUF a pack among the inputs was made from (the pack reads it for its dense tensors); an
//! existing output otherwise needs `--force`. `sift_output::Output` checks the inputs again
//! when it renames the finished file into place.

use std::path::{Path, PathBuf};

/// The files reading `path` reads: itself, and for a pack the GGUF it was made from (at its
/// recorded path, and where the pack finds it now).
pub fn with_sources(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    if let Ok(Some(toc)) = sift_store::read_toc(path) {
        out.push(toc.source().path.clone());
        if let Ok(found) = toc.source().locate(path) {
            out.push(found);
        }
    }
    out
}

/// Refuses `out` when it is one of `inputs` or a pack's source among them (see the module docs),
/// or when it exists and `force` is not set.
pub fn check(out: &Path, force: bool, inputs: &[&Path]) -> anyhow::Result<()> {
    let all: Vec<PathBuf> = inputs.iter().flat_map(|p| with_sources(p)).collect();
    let refs: Vec<&Path> = all.iter().map(PathBuf::as_path).collect();
    sift_output::check_destination(out, &refs)?;
    sift_output::check_new(out, force)?;
    Ok(())
}

/// Writes a whole file into a folder of results (`sweep -o DIR`, `simulate --sweep DIR`) through
/// [`sift_output::write`]: never over a device or one of `inputs`.
pub fn write_in(dir: &Path, name: &str, inputs: &[&Path], bytes: &[u8]) -> anyhow::Result<PathBuf> {
    let all: Vec<PathBuf> = inputs.iter().flat_map(|p| with_sources(p)).collect();
    let refs: Vec<&Path> = all.iter().map(PathBuf::as_path).collect();
    let path = dir.join(name);
    sift_output::write(&path, &refs, bytes)?;
    Ok(path)
}
