//! `sift probe --list / --show`: the builtin profiles print, and bad profile files get an error
//! naming the file and the field. (The measurement itself is tested in sift-sim's tests/probe.rs.)

use std::process::{Command, Output};

/// The sift binary, with the builtin development-machine profile (tests do not probe the
/// machine they run on, nor learn from their runs: `machine_profile_*` tests that part).
fn sift_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sift"));
    c.env("SIFT_PROFILE", "sift-dev-2core");
    c
}

fn sift(args: &[&str]) -> Output {
    sift_cmd().args(args).output().expect("run sift")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn list_names_every_builtin_profile() {
    let out = sift(&["probe", "--list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for name in [
        "activeflow-oneplus12",
        "activeflow-pixel6",
        "activeflow-infinix-zero30",
        "dip-a18",
        "kairox-pcie3",
        "kairox-pcie4",
    ] {
        assert!(s.contains(&format!("| {name} |")), "{name} missing from\n{s}");
    }
}

#[test]
fn show_prints_a_builtin_profile_as_tables() {
    let out = sift(&["probe", "--show", "activeflow-pixel6"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("UFS 3.1") && s.contains("taken from the paper"), "{s}");
    assert!(s.contains("| 4 KiB |") && s.contains("| 4 MiB |") && s.contains("| qd 1 |"), "{s}");
    assert!(s.contains("21.00 GB/s"), "5 x 4.2 GB/s of memory bandwidth: {s}");
}

#[test]
fn show_rejects_unknown_names_and_bad_files() {
    let out = sift(&["probe", "--show", "no-such-profile"]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("no builtin profile or file named 'no-such-profile'") && e.contains("dip-a18"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "name = \"x\"\nsource = \"s\"\nfrom_paper = false\nthreads = 2\nmem_read_bw = -5.0\nmem_copy_bw = 1.0\n\
         [disk]\nmax_qd = 1\npoints = [{ size = 4096, qd = 1, bw = 1.0e8, lat_ns = 4.0e4 }]\n\
         [compute]\ndispatch_ns = 0.0\n",
    )
    .unwrap();
    let out = sift(&["probe", "--show", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("bad.toml") && e.contains("mem_read_bw") && e.contains("1e6 to 1e14"), "{e}");
}
