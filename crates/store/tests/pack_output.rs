//! `sift pack`'s destination is checked before anything is written (issue 22): a device such as
//! `/dev/null` is never replaced by a file, the model being packed is never overwritten however
//! the path is spelled (`dir/../model.gguf`, a hard link), and a failed pack leaves no file
//! behind. On the real SmolLM2-135M.

use sift_store::{pack_model, PackOptions};
use std::path::PathBuf;

fn model() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(src.exists(), "{} missing: run scripts/fetch-model.sh first", src.display());
    src
}

#[test]
fn a_device_is_never_replaced() {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let dev = std::path::Path::new("/dev/null");
        let err = pack_model(&model(), dev, &PackOptions::default(), |_| {}).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(std::fs::metadata(dev).unwrap().file_type().is_char_device(), "/dev/null was replaced");
    }
}

#[test]
fn the_input_is_never_overwritten_whatever_the_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::copy(model(), &src).unwrap();
    let before = std::fs::read(&src).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let linked = dir.path().join("link.gguf");
    std::fs::hard_link(&src, &linked).unwrap();
    for dst in [dir.path().join("sub/../m.gguf"), linked] {
        let err = pack_model(&src, &dst, &PackOptions::default(), |_| {}).unwrap_err().to_string();
        assert!(err.contains("an input of this command"), "{}: {err}", dst.display());
    }
    assert!(std::fs::read(&src).unwrap() == before, "the model changed");
    // Nothing but the model, its link and the folder: no temporary file left.
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    names.sort();
    assert_eq!(names, ["link.gguf", "m.gguf", "sub"]);
}

#[test]
fn a_failed_pack_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    // A truncated model: refused, and neither the destination nor a temporary file appears.
    let src = dir.path().join("cut.gguf");
    let bytes = std::fs::read(model()).unwrap();
    std::fs::write(&src, &bytes[..bytes.len() / 2]).unwrap();
    let dst = dir.path().join("cut.sift");
    assert!(pack_model(&src, &dst, &PackOptions::default(), |_| {}).is_err());
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert_eq!(names, ["cut.gguf"]);
}
