//! A pack opened for a memory budget has its data checked (issue 22): every section's CRC-32 is
//! verified once per version of the file (a stamp beside it remembers a passed check), so one
//! flipped byte in a column section is refused with the section's name — on the first open, and
//! again after a pack that passed is changed. Real SmolLM2-135M packed.

use sift_store::tiered::{open_budgeted, TieredOptions};
use sift_store::{pack_model, ColPolicy, PackOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

fn flip_byte(p: &std::path::Path, at: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x40]).unwrap();
}

#[test]
fn a_damaged_pack_is_refused_under_a_budget() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(src.exists(), "{} missing: run scripts/fetch-model.sh first", src.display());
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("smol.sift");
    pack_model(&src, &pack, &PackOptions { cols: ColPolicy::Auto, ..PackOptions::default() }, |_| {}).unwrap();
    let opts = TieredOptions::default();
    let stamp = dir.path().join("smol.sift.verified");
    // A good pack opens and is stamped; the stamp lets the next open skip the read.
    open_budgeted(&pack, &opts).unwrap();
    assert!(stamp.exists());
    open_budgeted(&pack, &opts).unwrap();
    // A byte in the middle of the file (column data) flipped after the check: the change of the
    // file's times voids the stamp, and the section fails its checksum.
    let mid = std::fs::metadata(&pack).unwrap().len() / 2;
    std::thread::sleep(std::time::Duration::from_millis(20));
    flip_byte(&pack, mid);
    let err = open_budgeted(&pack, &opts).err().expect("a damaged pack must be refused").to_string();
    assert!(err.contains("is corrupt") && err.contains("fails its checksum"), "{err}");
    // A copy never opened before is checked on its first open.
    let copy = dir.path().join("copy.sift");
    std::fs::copy(&pack, &copy).unwrap();
    let err = open_budgeted(&copy, &opts).err().expect("a damaged copy must be refused").to_string();
    assert!(err.contains("copy.sift") && err.contains("fails its checksum"), "{err}");
}
