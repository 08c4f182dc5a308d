//! Device profiles: the seed profiles load and round-trip, the disk interpolation and batch cost
//! behave as documented, and bad files get errors that name the file and the field.

use sift_sim::profile::{
    list_builtin, DeviceProfile, DiskPoint, DiskTable, Observed, ProfileError, OBSERVED_SCALE, PROBE_QDS, PROBE_SIZES,
};
use sift_store::io::ReadReq;
use sift_store::tiered::IoCost;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn builtins() -> Vec<DeviceProfile> {
    list_builtin().iter().map(|n| DeviceProfile::builtin(n).expect("listed builtin exists")).collect()
}

/// The builtin profiles taken from the papers (the measured one, sift-dev-2core, is real data:
/// its bandwidth need not grow with request size).
fn paper_builtins() -> Vec<DeviceProfile> {
    builtins().into_iter().filter(|p| p.from_paper).collect()
}

/// A profile shaped like this machine's disk (numbers from docs: 4 KiB qd 1 128 MB/s,
/// 64 KiB 1.0 GB/s, 1 MiB 1.9 GB/s), written as TOML text.
fn measured_like() -> String {
    let mut s = String::from(
        "name = \"t\"\nsource = \"test\"\nfrom_paper = false\nthreads = 2\nmem_read_bw = 1.0e10\nmem_copy_bw = 5.0e9\n\
         [disk]\nmax_qd = 64\npoints = [\n",
    );
    for size in PROBE_SIZES {
        for qd in PROBE_QDS {
            let lat = 30e-6 / (qd as f64).sqrt();
            let bw = size as f64 / (lat + size as f64 / 2.0e9);
            s += &format!(
                "{{ size = {size}, qd = {qd}, bw = {bw}, lat_ns = {} }},\n",
                qd as f64 * size as f64 / bw * 1e9
            );
        }
    }
    s += "]\n[compute]\ndispatch_ns = 900.0\ncolumns = { Q4_1 = 8.0e9 }\ndense = { Q4_K = 9.0e9, F16 = 7.5e9 }\n";
    s
}

fn all_profiles() -> Vec<DeviceProfile> {
    let mut v = paper_builtins();
    v.push(DeviceProfile::from_toml(&measured_like(), "<test>").expect("test profile loads"));
    v
}

#[test]
fn every_builtin_loads_round_trips_and_cites_its_paper() {
    let names = list_builtin();
    assert_eq!(names.len(), 7, "{names:?}");
    assert_eq!(paper_builtins().len(), 6);
    for p in builtins() {
        if p.from_paper {
            assert!(p.source.contains("taken from the paper") && p.source.contains('§'), "{}: {}", p.name, p.source);
        } else {
            assert_eq!(p.name, "sift-dev-2core");
            assert!(p.source.contains("measured by `sift probe`"), "{}", p.source);
            // A measured table still hits its own points exactly.
            for pt in p.disk.points() {
                assert!((p.disk_bw(pt.size as usize, pt.qd) / pt.bw - 1.0).abs() < 1e-12, "{pt:?}");
            }
        }
        let again = DeviceProfile::from_toml(&p.to_toml(), "<round trip>").expect("round trip loads");
        assert_eq!(again, p);
        // The file on disk is the same profile.
        let from_file = DeviceProfile::load(&root().join(format!("profiles/{}.toml", p.name))).unwrap();
        assert_eq!(from_file, p);
    }
    assert!(DeviceProfile::builtin("no-such-device").is_none());
    assert_eq!(DeviceProfile::builtin("DIP-A18").map(|p| p.mem_read_bw), Some(60e9));
}

#[test]
fn every_profile_file_in_the_repository_loads() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("profiles")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let p = DeviceProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(DeviceProfile::from_toml(&p.to_toml(), "<rt>").unwrap(), p);
            n += 1;
        }
    }
    assert!(n >= 6);
}

#[test]
fn seed_numbers_match_the_papers() {
    // ActiveFlow Table 2 peak flash bandwidths: the largest, deepest reads approach them.
    for (name, peak) in
        [("activeflow-oneplus12", 5.8e9), ("activeflow-pixel6", 4.2e9), ("activeflow-infinix-zero30", 3.6e9)]
    {
        let p = DeviceProfile::builtin(name).unwrap();
        let big = p.disk_bw(4 << 20, 64);
        assert!(big < peak && big > 0.95 * peak, "{name}: {big}");
        // §3 / Fig. 7: one 4 KiB read at a time runs at MB/s, not GB/s.
        assert!(p.disk_bw(4096, 1) < 1e8, "{name}");
        assert_eq!(p.mem_read_bw, 5.0 * peak, "{name}: §1's ~5x");
    }
    let dip = DeviceProfile::builtin("dip-a18").unwrap();
    assert_eq!((dip.mem_read_bw, dip.disk_bw(4096, 1), dip.disk_bw(4 << 20, 64)), (60e9, 1e9, 1e9));
    assert!((dip.disk_bw(100_000, 7) / 1e9 - 1.0).abs() < 1e-12, "flat between points too");
    // KAIROX Table 2: groups of 1..32 neurons of 8 KB (PCIe 3.0) / 10 KB (PCIe 4.0) at qd 1.
    for (name, neuron, table) in [
        ("kairox-pcie3", 8192usize, [3.3, 6.8, 8.7, 10.2, 10.8, 11.1]),
        ("kairox-pcie4", 10240, [5.8, 13.7, 17.8, 20.9, 22.3, 22.8]),
    ] {
        let p = DeviceProfile::builtin(name).unwrap();
        for (gs, gbs) in [1usize, 4, 8, 16, 24, 32].into_iter().zip(table) {
            assert_eq!(p.disk_bw(gs * neuron, 1), gbs * 1e9, "{name} GS {gs}");
        }
    }
    assert_eq!(DeviceProfile::builtin("kairox-pcie3").unwrap().threads, 12);
}

#[test]
fn interpolation_hits_table_points_and_is_monotone_in_size() {
    for p in all_profiles() {
        for pt in p.disk.points() {
            let bw = p.disk_bw(pt.size as usize, pt.qd);
            assert!((bw / pt.bw - 1.0).abs() < 1e-12, "{}: {pt:?} gives {bw}", p.name);
        }
        for &qd in &[1usize, 2, 3, 4, 10, 16, 40, 64, 200] {
            let mut last = 0.0;
            let mut size = 1024.0f64;
            while size < 16.0 * 1024.0 * 1024.0 {
                let bw = p.disk_bw(size as usize, qd);
                assert!(bw.is_finite() && bw > 0.0, "{}: {size} {qd}", p.name);
                assert!(bw >= last * (1.0 - 1e-12), "{}: bw falls from {last} to {bw} at {size} B, qd {qd}", p.name);
                last = bw;
                size *= 1.07;
            }
        }
        // Between table points the value lies between its neighbours.
        let within = |a: f64, mid: f64, b: f64| mid >= a.min(b) * (1.0 - 1e-12) && mid <= a.max(b) * (1.0 + 1e-12);
        let (a, b) = (p.disk_bw(16 << 10, 4), p.disk_bw(64 << 10, 4));
        assert!(within(a, p.disk_bw(32 << 10, 4), b), "{}", p.name);
        let (a, b) = (p.disk_bw(64 << 10, 4), p.disk_bw(64 << 10, 16));
        assert!(within(a, p.disk_bw(64 << 10, 8), b), "{}", p.name);
    }
}

fn reqs(n: usize, len: usize) -> Vec<ReadReq> {
    (0..n).map(|i| ReadReq::full((i * 1000 * len) as u64, len, i * len)).collect()
}

#[test]
fn batch_cost_behaves() {
    for p in all_profiles() {
        assert_eq!(p.batch_ns(&[]), 0.0);
        assert_eq!(p.batch_ns(&[ReadReq::full(0, 0, 0)]), 0.0);
        // One read costs its qd-1 latency.
        for len in [4096usize, 65536, 1 << 20] {
            let one = p.batch_ns(&reqs(1, len));
            assert!((one / p.read_lat_ns(len) - 1.0).abs() < 1e-9, "{}: {one}", p.name);
        }
        // More bytes cost more: bigger reads, and more of them.
        let mut last = 0.0;
        for len in [4096usize, 16384, 65536, 262144, 1 << 20, 4 << 20] {
            let t = p.batch_ns(&reqs(1, len));
            assert!(t > last, "{}: {len}", p.name);
            last = t;
        }
        let mut last = 0.0;
        for n in [1usize, 2, 4, 8, 16, 32, 64, 128] {
            let t = p.batch_ns(&reqs(n, 65536));
            assert!(t > last, "{}: {n} reads", p.name);
            last = t;
        }
        // 64 small reads together beat 64 one at a time (by a lot where latency dominates).
        let together = p.batch_ns(&reqs(64, 4096));
        let apart = 64.0 * p.batch_ns(&reqs(1, 4096));
        assert!(together <= apart, "{}: {together} vs {apart}", p.name);
        if p.name != "dip-a18" {
            assert!(together < apart / 2.0, "{}: {together} vs {apart}", p.name);
        }
        // Never less than the largest read alone.
        let mut mixed = reqs(8, 4096);
        mixed.push(ReadReq::full(1 << 30, 4 << 20, 8 * 4096));
        assert!(p.batch_ns(&mixed) >= p.read_lat_ns(4 << 20));
        assert!((p.copy_ns(1 << 30) - (1u64 << 30) as f64 / p.mem_copy_bw * 1e9).abs() < 1e-3);
    }
}

#[test]
fn kernel_costs_use_the_table_or_the_efficiency() {
    use sift_quant::{ColType, WeightType};
    let m = DeviceProfile::from_toml(&measured_like(), "<test>").unwrap();
    assert!((m.columns_ns(ColType::Q4_1, 8_000_000_000) - 1e9).abs() < 1e-3);
    assert!((m.dense_ns(WeightType::Q4_K, 9_000_000_000) - 1e9).abs() < 1e-3);
    // Not in the table: half of the memory bandwidth (the default efficiency).
    assert!((m.dense_ns(WeightType::Q8_0, 5_000_000_000) - 1e9).abs() < 1e-3);
    assert!((m.mem_read_ns(10_000_000_000) - 1e9).abs() < 1e-3);
    assert_eq!(m.dispatch_ns(), 900.0);
    let dip = DeviceProfile::builtin("dip-a18").unwrap();
    assert!((dip.columns_ns(ColType::Q8_0, 60_000_000_000) - 1e9).abs() < 1e-3, "DIP: compute = DRAM transfer");
}

fn err_of(text: &str) -> String {
    let e = DeviceProfile::from_toml(text, "bad.toml").expect_err("must be rejected");
    let s = e.to_string();
    assert!(s.contains("bad.toml"), "{s}");
    s
}

#[test]
fn bad_profiles_are_rejected_with_the_problem_named() {
    let good = measured_like();
    // Malformed TOML.
    let s = err_of("name = \"x\"\nthreads = [1,\n");
    assert!(s.contains("not a valid profile"), "{s}");
    // A missing field.
    let s = err_of(&good.replace("mem_copy_bw = 5.0e9\n", ""));
    assert!(s.contains("mem_copy_bw"), "{s}");
    // A misspelt one.
    let s = err_of(&good.replace("mem_copy_bw", "mem_copy_bandwidth"));
    assert!(s.contains("mem_copy_bandwidth"), "{s}");
    // Negative and non-finite bandwidths.
    let s = err_of(&good.replace("mem_read_bw = 1.0e10", "mem_read_bw = -1.0e10"));
    assert!(s.contains("mem_read_bw") && s.contains("1e6 to 1e14"), "{s}");
    let s = err_of(&good.replace("mem_read_bw = 1.0e10", "mem_read_bw = nan"));
    assert!(s.contains("mem_read_bw"), "{s}");
    let first_bw = good.find("points").unwrap() + good[good.find("points").unwrap()..].find(" bw = ").unwrap() + 1;
    let bad_disk = format!("{}bw = -{}", &good[..first_bw], &good[first_bw + 5..]);
    let s = err_of(&bad_disk);
    assert!(s.contains("disk.points[0].bw") && s.contains("1e6 to 1e14"), "{s}");
    // Positive but absurd (bench/file_probe.py: 5e-324 B/s predicted 0 tok/s, a dispatch of
    // 1e300 ns printed a 300-digit stall, 2^40 threads passed).
    for (from, to, field) in [
        ("mem_read_bw = 1.0e10", "mem_read_bw = 5e-324", "mem_read_bw"),
        ("mem_read_bw = 1.0e10", "mem_read_bw = 1e300", "mem_read_bw"),
        ("threads = 2", "threads = 1099511627776", "threads"),
        ("Q4_1 = 8.0e9", "Q4_1 = 1e-300", "compute.columns.Q4_1"),
        ("dispatch_ns = 900.0", "dispatch_ns = 1e300", "compute.dispatch_ns"),
    ] {
        let s = err_of(&good.replace(from, to));
        assert!(s.contains(field), "{to}: {s}");
    }
    // Kernel table entries.
    let s = err_of(&good.replace("Q4_K = 9.0e9", "Q9_Z = 9.0e9"));
    assert!(s.contains("compute.dense.Q9_Z"), "{s}");
    let s = err_of(&good.replace("Q4_1 = 8.0e9", "Q4_1 = 0.0"));
    assert!(s.contains("compute.columns.Q4_1"), "{s}");
    let s = err_of(&good.replace("threads = 2", "threads = 0"));
    assert!(s.contains("threads"), "{s}");
    // A grid with a hole, a duplicate, a negative size.
    let first_point = good.find("{ size").unwrap();
    let line_end = first_point + good[first_point..].find('\n').unwrap() + 1;
    let holed = format!("{}{}", &good[..first_point], &good[line_end..]);
    let s = err_of(&holed);
    assert!(s.contains("not a full grid") && s.contains("qd 1"), "{s}");
    let dup = format!("{}{}", &good[..line_end], &good[first_point..]);
    assert!(err_of(&dup).contains("appears twice"));
    assert!(err_of(&good.replacen("size = 4096", "size = -4096", 1)).contains("size"));
    // A foreign TOML file and a binary file.
    let s = err_of(&std::fs::read_to_string(root().join("Cargo.toml")).unwrap());
    assert!(s.contains("not a valid profile"), "{s}");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("model.gguf");
    std::fs::write(&bin, [0x47u8, 0x47, 0x55, 0x46, 0xff, 0xfe, 0, 1]).unwrap();
    let e = DeviceProfile::load(&bin).unwrap_err();
    assert!(matches!(e, ProfileError::Parse { .. }) && e.to_string().contains("model.gguf"), "{e}");
    let e = DeviceProfile::load(Path::new("/nonexistent/profile.toml")).unwrap_err();
    assert!(matches!(e, ProfileError::Io { .. }) && e.to_string().contains("/nonexistent/profile.toml"), "{e}");
}

#[test]
fn disk_tables_are_checked_when_built() {
    let pt = |size, qd, bw| DiskPoint { size, qd, bw, lat_ns: 1000.0 };
    assert!(DiskTable::new(0, vec![pt(4096, 1, 1e8)]).is_err());
    assert!(DiskTable::new(4, vec![]).is_err());
    let (f, _) = DiskTable::new(4, vec![pt(4096, 1, 1e8), pt(8192, 1, f64::INFINITY)]).unwrap_err();
    assert_eq!(f, "disk.points[1].bw");
    // One size, one depth: a flat table.
    let t = DiskTable::new(4, vec![pt(4096, 1, 1e8)]).unwrap();
    assert_eq!(t.bw(4096, 64), 1e8);
    assert_eq!(t.bw(1 << 20, 1), 1e8);
    assert_eq!(t.bw(2048, 1), 5e7, "a read below the smallest size costs as long as the smallest");
}

#[test]
fn observed_corrections_scale_the_disk_and_charge_the_read_path() {
    let base = DeviceProfile::from_toml(&measured_like(), "t").unwrap();
    let batch = reqs(40, 32 << 10);
    // One run: the engine read at twice the table's bandwidth for its mean request size, and its
    // compute side took 0.2 s beyond the model and the copies for 100 MB copied.
    let mean = 32 << 10;
    let busy = 2.0 * base.disk.bw(mean as u64, base.disk.max_qd());
    let run = Observed::from_run(&base, busy, mean as f64, 64.0, 0.2, 1e8).unwrap();
    assert_eq!(run.runs, 1);
    assert!((run.disk_scale - 2.0).abs() < 1e-12, "{run:?}");
    assert!((run.io_cpu_ns_per_byte - 2.0).abs() < 1e-12, "{run:?}");
    let mut p = base.clone();
    p.observe(run);
    assert_eq!(p.observed, Some(run));
    // Every batch's disk time halves; copies cost the observed CPU on top of memcpy.
    let (a, b) = (base.batch_ns(&batch), p.batch_ns(&batch));
    assert!((b / a - 0.5).abs() < 1e-9, "{a} -> {b}");
    assert!((p.copy_ns(1000) - base.copy_ns(1000) - 2000.0).abs() < 1e-6);
    // Later runs weigh 1/runs up to OBSERVED_WINDOW, then 1/OBSERVED_WINDOW.
    let run2 = Observed { runs: 1, disk_scale: 1.0, io_cpu_ns_per_byte: 0.0 };
    p.observe(run2);
    let o = p.observed.unwrap();
    assert_eq!(o.runs, 2);
    assert!((o.disk_scale - 1.5).abs() < 1e-12 && (o.io_cpu_ns_per_byte - 1.0).abs() < 1e-12, "{o:?}");
    for _ in 0..40 {
        p.observe(run2);
    }
    let o = p.observed.unwrap();
    assert_eq!(o.runs, 42);
    assert!((o.disk_scale - 1.0).abs() < 1e-4, "the old runs fade: {o:?}");
    // Runs that read nothing say nothing; wild ones are clamped.
    assert_eq!(Observed::from_run(&base, 0.0, 4096.0, 8.0, 1.0, 1e6), None);
    assert_eq!(Observed::from_run(&base, 1e9, 4096.0, 8.0, 1.0, 0.0), None);
    let wild = Observed::from_run(&base, 1e15, 4096.0, 8.0, -5.0, 1.0).unwrap();
    // The table is read at the runs' queue depth: the same bandwidth at qd 4 is a larger
    // correction than at qd 64 (the table is slower there).
    let at4 = Observed::from_run(&base, busy, mean as f64, 4.0, 0.2, 1e8).unwrap();
    assert!(at4.disk_scale > run.disk_scale, "{at4:?} vs {run:?}");
    assert_eq!((wild.disk_scale, wild.io_cpu_ns_per_byte), (OBSERVED_SCALE.1, 0.0));
    // The section round-trips through TOML, and a bad one is refused by name.
    assert_eq!(DeviceProfile::from_toml(&p.to_toml(), "t").unwrap(), p);
    let bad = p.to_toml().replace("disk_scale = 1.0", "disk_scale = -1.0");
    assert_ne!(bad, p.to_toml(), "the test edits the section");
    let e = err_of(&bad);
    assert!(e.contains("observed.disk_scale"), "{e}");
}
