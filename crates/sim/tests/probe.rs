//! A quick `sift probe` of this machine on the real default model file: the numbers are
//! plausible, and the profile it writes loads back equal.

use sift_sim::probe::{probe, ProbeOptions};
use sift_sim::profile::{DeviceProfile, PROBE_QDS, PROBE_SIZES, WEIGHT_TYPES};
use std::path::PathBuf;

fn model() -> PathBuf {
    let p = std::env::var_os("SIFT_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

#[test]
fn quick_probe_measures_plausible_numbers_and_round_trips() {
    let file = model();
    let opts =
        ProbeOptions { file: file.clone(), threads: 2, quick: true, name: "test-machine".into(), work_cap: None };
    let mut lines = Vec::new();
    let report = probe(&opts, &mut |l| lines.push(l.to_string())).expect("probe runs");
    let p = &report.profile;
    eprintln!("{}", p.to_markdown());
    eprintln!("probe took {:.1} s", report.elapsed.as_secs_f64());

    assert!(!p.from_paper && p.source.contains("measured by `sift probe`"), "{}", p.source);
    assert!(p.mem_read_bw > 1e9 && p.mem_read_bw < 1e12, "mem read {}", p.mem_read_bw);
    assert!(p.mem_copy_bw > 1e8 && p.mem_copy_bw < 1e12, "mem copy {}", p.mem_copy_bw);
    // Every size at every queue depth, and large deep reads beat single small ones.
    assert_eq!(p.disk.points().len(), PROBE_SIZES.len() * PROBE_QDS.len());
    let small = p.disk.point(4096, 1).unwrap().bw;
    let big = p.disk.point(1 << 20, 16).unwrap().bw;
    assert!(big > small, "1 MiB qd 16 {big} vs 4 KiB qd 1 {small}");
    assert!(small > 1e6, "4 KiB reads at {small} B/s");
    // Kernels: every type measured, positive, and not faster than a few times memory bandwidth.
    assert_eq!(p.compute.columns.len(), 3);
    assert_eq!(p.compute.dense.len(), WEIGHT_TYPES.len());
    for (k, &v) in p.compute.columns.iter().chain(&p.compute.dense) {
        assert!(v > 1e7 && v < 20.0 * p.mem_read_bw, "{k}: {v}");
    }
    assert!(p.compute.dispatch_ns > 0.0 && p.compute.dispatch_ns < 1e6, "{}", p.compute.dispatch_ns);
    assert!(report.notes.iter().any(|n| n.contains("O_DIRECT")), "{:?}", report.notes);
    assert!(lines.len() > 30, "progress lines: {lines:?}");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("this.toml");
    p.save(&out, &["a header".into()]).unwrap();
    let again = DeviceProfile::load(&out).expect("written profile loads");
    assert_eq!(&again, p);
    assert!(std::fs::read_to_string(&out).unwrap().starts_with("# a header\n"));
}
