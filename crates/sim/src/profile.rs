//! Device profiles: what a machine can do, in the numbers sift's cost model needs.
//!
//! A [`DeviceProfile`] holds
//! - **memory**: `mem_read_bw`, streaming read bandwidth with all threads (bytes/s), and
//!   `mem_copy_bw`, one thread copying one buffer into another (bytes copied per second);
//! - **disk** (the slow tier): a [`DiskTable`] of points `{ size, qd, bw, lat_ns }` for request
//!   sizes 4 KiB … 4 MiB and queue depths 1 … 64 — `bw` the bytes/s achieved with `qd` random
//!   reads of `size` bytes submitted together, `lat_ns` the time from submitting such a batch to
//!   its last completion (at qd 1: one request's latency) — plus `max_qd`, the deepest queue
//!   that helps (a batch of more reads runs at `max_qd`: the rest wait their turn);
//! - **compute**: the bytes of weights per second sift's sparse column kernels (per
//!   [`ColType`]) and dense matvec kernels (per [`WeightType`]) get through, and the cost of one
//!   thread-pool dispatch. Profiles taken from papers have no kernel table; their kernels are
//!   assumed to reach `kernel_efficiency` × `mem_read_bw`.
//!
//! Profiles are TOML files: `sift probe -o FILE` measures one, and the seed profiles in
//! `profiles/` (compiled in: [`DeviceProfile::builtin`]) are taken from the papers, every
//! number annotated with where it comes from or marked as an assumption. [`DeviceProfile::load`]
//! checks every field and names the file and the field of any problem.
//!
//! # The disk model ([`IoCost::batch_ns`])
//!
//! `disk_bw(size, qd)` interpolates the table: piecewise linear in (ln size, ln qd) on ln bw
//! (log-log in size, log in qd). Below the smallest size a read costs as long as a read of the
//! smallest size (O_DIRECT reads whole pages; the device does not get faster for less); above
//! the largest, bandwidth stays at the largest size's. `qd` is clamped to `1..=max_qd` and to the
//! table's range.
//!
//! A batch of `n` reads submitted together runs at queue depth `qd = min(n, max_qd)`. Each read
//! of `len` bytes transfers in `len / disk_bw(len, qd)`; the batch costs the sum of these plus a
//! start-up term — the latency of one read of the batch's largest size `s` at qd 1 that the
//! pipeline cannot hide, `lat(s) − s / disk_bw(s, qd)` (zero when negative) — and never less than
//! that largest read alone, `lat(s)`. A single read thus costs exactly its qd-1 latency, and 64
//! small reads together cost far less than 64 one at a time, as measured.
//!
//! What the model ignores: where the reads are (the table is measured with random offsets;
//! sequential runs may be faster), caches in the drive or the host, reads from other processes,
//! CPU time to submit and reap (and its competition with compute threads), the tier splitting
//! reads above 1 MiB into pieces beyond what the table's 4 MiB points captured, and that sizes in
//! a mixed batch interfere (each read is charged at its own size's bandwidth at the batch's
//! queue depth). Copies ([`IoCost::copy_ns`]) cost `bytes / mem_copy_bw`; kernels cost
//! `bytes / throughput` with no start-up, plus [`DeviceProfile::dispatch_ns`] per dispatch for
//! the caller to add.

use serde::{Deserialize, Serialize};
use sift_quant::{ColType, WeightType};
use sift_store::io::{ReadReq, DIRECT_ALIGN};
use sift_store::tiered::IoCost;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Every weight type sift computes with (the dense kernels' table keys, [`WeightType::name`]).
pub const WEIGHT_TYPES: [WeightType; 10] = [
    WeightType::F32,
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q8_0,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
];

/// Request sizes `sift probe` measures (4 KiB … 4 MiB, powers of 4).
pub const PROBE_SIZES: [u64; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Queue depths `sift probe` measures.
pub const PROBE_QDS: [usize; 4] = [1, 4, 16, 64];

/// `kernel_efficiency` when a profile gives none (an assumption, not a measurement).
pub const DEFAULT_KERNEL_EFFICIENCY: f64 = 0.5;

/// The seed profiles compiled into sift: (name, TOML text).
const BUILTIN: [(&str, &str); 7] = [
    ("activeflow-oneplus12", include_str!("../../../profiles/activeflow-oneplus12.toml")),
    ("activeflow-pixel6", include_str!("../../../profiles/activeflow-pixel6.toml")),
    ("activeflow-infinix-zero30", include_str!("../../../profiles/activeflow-infinix-zero30.toml")),
    ("dip-a18", include_str!("../../../profiles/dip-a18.toml")),
    ("kairox-pcie3", include_str!("../../../profiles/kairox-pcie3.toml")),
    ("kairox-pcie4", include_str!("../../../profiles/kairox-pcie4.toml")),
    // Measured by `sift probe` on the 2-core machine sift is developed and benchmarked on: the
    // default profile of `sift plan` and of `--memory` alone.
    ("sift-dev-2core", include_str!("../../../profiles/sift-dev-2core.toml")),
];

/// Why a profile could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("device profile {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("device profile {path} is not a valid profile: {message}")]
    Parse { path: String, message: String },
    #[error("device profile {path}: field `{field}`: {problem}")]
    Invalid { path: String, field: String, problem: String },
}

/// One measured (or derived) point of the disk table.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskPoint {
    /// Bytes per request.
    pub size: u64,
    /// Requests in flight.
    pub qd: usize,
    /// Bytes per second achieved.
    pub bw: f64,
    /// Nanoseconds from submitting a batch of `qd` requests to the last completion (at qd 1:
    /// one request's latency).
    pub lat_ns: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDisk {
    max_qd: usize,
    points: Vec<DiskPoint>,
}

/// The disk table: a full grid of [`DiskPoint`]s (every size at every queue depth) and the
/// device's largest useful queue depth. Built only through [`DiskTable::new`], which checks it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawDisk", into = "RawDisk")]
pub struct DiskTable {
    max_qd: usize,
    /// Distinct sizes, ascending.
    sizes: Vec<u64>,
    /// Distinct queue depths, ascending.
    qds: Vec<usize>,
    /// `bw` at `[qd index * sizes.len() + size index]`.
    bw: Vec<f64>,
    /// `ln bw`, the same way.
    ln_bw: Vec<f64>,
    /// The points as given, sorted by (size, qd).
    points: Vec<DiskPoint>,
}

impl TryFrom<RawDisk> for DiskTable {
    type Error = String;
    fn try_from(r: RawDisk) -> Result<DiskTable, String> {
        DiskTable::new(r.max_qd, r.points).map_err(|(field, problem)| format!("{field}: {problem}"))
    }
}

impl From<DiskTable> for RawDisk {
    fn from(t: DiskTable) -> RawDisk {
        RawDisk { max_qd: t.max_qd, points: t.points }
    }
}

fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// Bandwidths and kernel throughputs a machine can have, bytes/s: 1 MB/s to 100 TB/s (the
/// builtins span 50 MB/s disks to 1 TB/s GPUs). A profile outside them is damaged or hostile:
/// 5e-324 B/s made the planner predict 0 tok/s and an infinite compute time.
const BW_RANGE: (f64, f64) = (1e6, 1e14);

fn plausible_bw(x: f64) -> bool {
    x.is_finite() && (BW_RANGE.0..=BW_RANGE.1).contains(&x)
}

/// The bounds of the other fields: threads, queue depth, read size, latency, dispatch.
const MAX_THREADS: usize = 1024;
const MAX_QD: usize = 65536;
const MAX_READ: u64 = 1 << 30;
const MAX_LAT_NS: f64 = 1e11;
const MAX_DISPATCH_NS: f64 = 1e9;

impl DiskTable {
    /// Checks and indexes a table: `max_qd ≥ 1`; every point's size ≥ 1 and qd in `1..=max_qd`,
    /// `bw` and `lat_ns` positive and finite; no duplicates; every size measured at every queue
    /// depth. On error,
    /// returns the offending field (`disk.points[3].bw`) and the problem.
    pub fn new(max_qd: usize, mut points: Vec<DiskPoint>) -> Result<DiskTable, (String, String)> {
        if max_qd == 0 || max_qd > MAX_QD {
            return Err(("disk.max_qd".into(), format!("must be 1 to {MAX_QD}, got {max_qd}")));
        }
        if points.is_empty() {
            return Err(("disk.points".into(), "the table has no points".into()));
        }
        for (i, p) in points.iter().enumerate() {
            let f = |name: &str| format!("disk.points[{i}].{name}");
            if p.size == 0 || p.size > MAX_READ {
                return Err((f("size"), format!("must be 1 byte to 1 GiB, got {}", p.size)));
            }
            if p.qd == 0 {
                return Err((f("qd"), "must be at least 1".into()));
            }
            if p.qd > max_qd {
                let why = "a batch deeper than max_qd runs at max_qd, so the point would never be used";
                return Err((f("qd"), format!("{} is above disk.max_qd = {max_qd} ({why})", p.qd)));
            }
            if !plausible_bw(p.bw) {
                return Err((f("bw"), format!("bandwidth must be 1e6 to 1e14 bytes/s, got {}", p.bw)));
            }
            if !(positive(p.lat_ns) && p.lat_ns <= MAX_LAT_NS) {
                return Err((f("lat_ns"), format!("latency must be above 0, up to {MAX_LAT_NS} ns, got {}", p.lat_ns)));
            }
        }
        points.sort_by_key(|p| (p.size, p.qd));
        if let Some(w) = points.windows(2).find(|w| (w[0].size, w[0].qd) == (w[1].size, w[1].qd)) {
            return Err(("disk.points".into(), format!("size {} at qd {} appears twice", w[0].size, w[0].qd)));
        }
        let mut sizes: Vec<u64> = points.iter().map(|p| p.size).collect();
        sizes.dedup();
        let mut qds: Vec<usize> = points.iter().map(|p| p.qd).collect();
        qds.sort_unstable();
        qds.dedup();
        if points.len() != sizes.len() * qds.len() {
            let missing = sizes
                .iter()
                .flat_map(|&s| qds.iter().map(move |&q| (s, q)))
                .find(|&(s, q)| !points.iter().any(|p| p.size == s && p.qd == q))
                .expect("a grid with fewer points than cells misses one");
            return Err((
                "disk.points".into(),
                format!(
                    "not a full grid: size {} has no point at qd {} (every size needs every queue depth)",
                    missing.0, missing.1
                ),
            ));
        }
        let mut bw = vec![0.0; points.len()];
        for p in &points {
            let si = sizes.binary_search(&p.size).expect("size listed");
            let qi = qds.binary_search(&p.qd).expect("qd listed");
            bw[qi * sizes.len() + si] = p.bw;
        }
        let ln_bw = bw.iter().map(|b| b.ln()).collect();
        Ok(DiskTable { max_qd, sizes, qds, bw, ln_bw, points })
    }

    /// The deepest queue that helps: a batch of more reads runs at this queue depth.
    /// The best bandwidth of any measured point (bytes/s).
    pub fn best_bw(&self) -> f64 {
        self.points.iter().map(|p| p.bw).fold(0.0, f64::max)
    }

    pub fn max_qd(&self) -> usize {
        self.max_qd
    }

    /// The points, sorted by (size, qd).
    pub fn points(&self) -> &[DiskPoint] {
        &self.points
    }

    /// The table's sizes, ascending.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The table's queue depths, ascending.
    pub fn qds(&self) -> &[usize] {
        &self.qds
    }

    /// The point at exactly (size, qd), if the table has it.
    pub fn point(&self, size: u64, qd: usize) -> Option<&DiskPoint> {
        self.points.iter().find(|p| p.size == size && p.qd == qd)
    }

    /// `ln bw` between the sizes bracketed by `si`, for the queue depth at index `qi`.
    fn ln_bw_at(&self, si: (usize, usize, f64), qi: usize) -> f64 {
        let row = &self.ln_bw[qi * self.sizes.len()..(qi + 1) * self.sizes.len()];
        let (a, b, t) = si;
        row[a] + (row[b] - row[a]) * t
    }

    /// Interpolated bandwidth (bytes/s); see the module doc.
    pub fn bw(&self, size: u64, qd: usize) -> f64 {
        if size == 0 {
            return 0.0;
        }
        let (s0, s1) = (self.sizes[0], *self.sizes.last().expect("non-empty"));
        // Below the smallest size: as long as a read of the smallest size.
        let (eff, scale) = if size < s0 { (s0, size as f64 / s0 as f64) } else { (size.min(s1), 1.0) };
        let si = bracket(&self.sizes, eff, |s| (s as f64).ln());
        let q = qd.clamp(1, self.max_qd);
        let q = q.clamp(self.qds[0], *self.qds.last().expect("non-empty"));
        let (qa, qb, tq) = bracket(&self.qds, q, |q| (q as f64).ln());
        if si.2 == 0.0 && tq == 0.0 {
            // On a table point (in both coordinates): its value, exactly.
            return self.bw[qa * self.sizes.len() + si.0] * scale;
        }
        let la = self.ln_bw_at(si, qa);
        let lb = self.ln_bw_at(si, qb);
        (la + (lb - la) * tq).exp() * scale
    }
}

/// For `x` within `[xs[0], xs.last()]`: the bracketing indices and the fraction between them in
/// the coordinate `f` (a point exactly on a table entry gives fraction 0 on that entry).
fn bracket<T: Copy + PartialOrd>(xs: &[T], x: T, f: impl Fn(T) -> f64) -> (usize, usize, f64) {
    let i = xs.partition_point(|&v| v <= x).saturating_sub(1).min(xs.len() - 1);
    if i + 1 >= xs.len() || xs[i] == x {
        return (i, i, 0.0);
    }
    let (a, b) = (f(xs[i]), f(xs[i + 1]));
    (i, i + 1, ((f(x) - a) / (b - a)).clamp(0.0, 1.0))
}

/// Kernel throughputs and dispatch cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compute {
    /// Nanoseconds of one thread-pool dispatch (an empty `pool.run`).
    pub dispatch_ns: f64,
    /// Fraction of `mem_read_bw` the kernels reach where the tables below have no entry: an
    /// assumption for profiles taken from papers; for measured ones, the median measured
    /// kernel's fraction.
    #[serde(default = "default_efficiency")]
    pub kernel_efficiency: f64,
    /// Sparse column kernels: column type name (`Q4_1`, `Q5_0`, `Q8_0`) → bytes of weights/s.
    #[serde(default)]
    pub columns: BTreeMap<String, f64>,
    /// Dense matvec kernels: weight type name (`Q4_K`, `F16`, …) → bytes of weights/s.
    #[serde(default)]
    pub dense: BTreeMap<String, f64>,
}

fn default_efficiency() -> f64 {
    DEFAULT_KERNEL_EFFICIENCY
}

/// A machine, as sift's cost model sees it (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    pub name: String,
    /// Where the numbers come from: `measured by sift probe on HOST DATE`, or the paper, table
    /// and section.
    pub source: String,
    /// Taken from a paper (derived and assumed numbers included), not measured.
    pub from_paper: bool,
    /// Threads the compute numbers are for.
    pub threads: usize,
    /// Streaming read bandwidth with all threads, bytes/s.
    pub mem_read_bw: f64,
    /// One thread copying one buffer into another, bytes copied per second.
    pub mem_copy_bw: f64,
    pub disk: DiskTable,
    /// The alignment reads of the probed disk needed (`O_DIRECT`: the file system's direct-I/O
    /// alignment, 512 bytes on most disks); `None` (profiles from papers, older probes): a page.
    /// The simulator cuts its reads at this alignment, as the engine does on that disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_align: Option<usize>,
    pub compute: Compute,
    /// What the engine's own budgeted runs on this machine measured against this profile
    /// (kept in the machine's cached profile, see `sift_session::machine`); `None` until a run
    /// has been folded in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
}

/// Corrections learnt from the engine's own budgeted runs ([`Observed::from_run`], folded in by
/// [`DeviceProfile::observe`]).
///
/// The disk table is measured with random reads of one size, back to back; the engine reads
/// sorted batches of mixed sizes between compute, and on a virtual disk above all the two differ
/// (on the development VM the engine's batches run at about twice the table's bandwidth for their
/// mean request size). And the read path costs CPU on the compute side (copies out of the read
/// buffers, page pinning, completions) that in-memory kernel figures do not show.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observed {
    /// Runs folded in.
    pub runs: u32,
    /// The engine's read bandwidth while busy over the table's at the same mean request size
    /// and the table's deepest queue: every batch's disk time is divided by it.
    pub disk_scale: f64,
    /// Compute-side time the read path adds per byte copied out of the read buffers (ns), on top
    /// of the copy itself.
    pub io_cpu_ns_per_byte: f64,
}

/// Bounds a folded-in observation must keep (a run outside them says more about the run than
/// about the machine).
pub const OBSERVED_SCALE: (f64, f64) = (0.1, 10.0);
pub const OBSERVED_MAX_IO_CPU_NS: f64 = 10.0;
/// How many runs an observation averages over at most (later runs weigh `1/OBSERVED_WINDOW`).
pub const OBSERVED_WINDOW: u32 = 4;

impl Observed {
    /// One run's correction: `busy_bw` bytes/s while the loader was reading, `mean_read` bytes
    /// per request and `mean_batch` requests per job (the queue depth the table is read at, as
    /// the simulator charges a batch), `extra_compute_s` of compute beyond the in-memory cost
    /// model and the copies, `copied` bytes copied out of read buffers. `None` when the run read
    /// nothing.
    pub fn from_run(
        profile: &DeviceProfile,
        busy_bw: f64,
        mean_read: f64,
        mean_batch: f64,
        extra_compute_s: f64,
        copied: f64,
    ) -> Option<Observed> {
        if !(positive(busy_bw) && positive(mean_read) && positive(copied)) {
            return None;
        }
        let qd = (mean_batch.round() as usize).clamp(1, profile.disk.max_qd);
        let table = profile.disk.bw(mean_read as u64, qd);
        let (lo, hi) = OBSERVED_SCALE;
        Some(Observed {
            runs: 1,
            disk_scale: (busy_bw / table).clamp(lo, hi),
            io_cpu_ns_per_byte: (extra_compute_s.max(0.0) * 1e9 / copied).clamp(0.0, OBSERVED_MAX_IO_CPU_NS),
        })
    }
}

impl DeviceProfile {
    /// Reads and checks a profile file.
    pub fn load(path: &Path) -> Result<DeviceProfile, ProfileError> {
        let shown = path.display().to_string();
        // A profile is a few KiB of TOML: a regular file of at most 16 MiB.
        let text = sift_output::read_regular(path, 16 << 20)
            .map_err(|source| ProfileError::Io { path: shown.clone(), source })?;
        let text = String::from_utf8(text)
            .map_err(|e| ProfileError::Parse { path: shown.clone(), message: format!("not UTF-8 text ({e})") })?;
        DeviceProfile::from_toml(&text, &shown)
    }

    /// Parses and checks a profile from TOML text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<DeviceProfile, ProfileError> {
        let p: DeviceProfile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            path: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        p.validate().map_err(|(field, problem)| ProfileError::Invalid { path: origin.to_string(), field, problem })?;
        Ok(p)
    }

    /// Checks every field (the disk table is checked when built); returns the first bad field
    /// and its problem.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, p: String| Err((f.to_string(), p));
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty".into());
        }
        if self.threads == 0 || self.threads > MAX_THREADS {
            return bad("threads", format!("must be 1 to {MAX_THREADS}, got {}", self.threads));
        }
        for (f, v) in [("mem_read_bw", self.mem_read_bw), ("mem_copy_bw", self.mem_copy_bw)] {
            if !plausible_bw(v) {
                return bad(f, format!("bandwidth must be 1e6 to 1e14 bytes/s, got {v}"));
            }
        }
        if let Some(a) = self.read_align {
            if !(a.is_power_of_two() && a <= DIRECT_ALIGN) {
                return bad("read_align", format!("must be a power of two up to {DIRECT_ALIGN} bytes, got {a}"));
            }
        }
        if let Some(o) = &self.observed {
            let (lo, hi) = OBSERVED_SCALE;
            if !(o.disk_scale.is_finite() && (lo..=hi).contains(&o.disk_scale)) {
                return bad("observed.disk_scale", format!("must be in [{lo}, {hi}], got {}", o.disk_scale));
            }
            if !(o.io_cpu_ns_per_byte.is_finite() && (0.0..=OBSERVED_MAX_IO_CPU_NS).contains(&o.io_cpu_ns_per_byte)) {
                return bad(
                    "observed.io_cpu_ns_per_byte",
                    format!("must be in [0, {OBSERVED_MAX_IO_CPU_NS}], got {}", o.io_cpu_ns_per_byte),
                );
            }
        }
        let c = &self.compute;
        if !(c.dispatch_ns.is_finite() && (0.0..=MAX_DISPATCH_NS).contains(&c.dispatch_ns)) {
            return bad("compute.dispatch_ns", format!("must be 0 to {MAX_DISPATCH_NS} ns, got {}", c.dispatch_ns));
        }
        if !(positive(c.kernel_efficiency) && c.kernel_efficiency <= 1.0) {
            return bad("compute.kernel_efficiency", format!("must be in (0, 1], got {}", c.kernel_efficiency));
        }
        for (k, &v) in &c.columns {
            if !ColType::ALL.iter().any(|t| t.name() == k) {
                return bad(&format!("compute.columns.{k}"), "unknown column type (Q4_1, Q5_0, Q8_0)".into());
            }
            if !plausible_bw(v) {
                return bad(
                    &format!("compute.columns.{k}"),
                    format!("throughput must be 1e6 to 1e14 bytes/s, got {v}"),
                );
            }
        }
        for (k, &v) in &c.dense {
            if weight_type(k).is_none() {
                let names: Vec<&str> = WEIGHT_TYPES.iter().map(|t| t.name()).collect();
                return bad(&format!("compute.dense.{k}"), format!("unknown weight type ({})", names.join(", ")));
            }
            if !plausible_bw(v) {
                return bad(&format!("compute.dense.{k}"), format!("throughput must be 1e6 to 1e14 bytes/s, got {v}"));
            }
        }
        Ok(())
    }

    /// The profile as TOML (loads back equal), the disk table one point per line.
    pub fn to_toml(&self) -> String {
        #[derive(Serialize)]
        struct Head<'a> {
            name: &'a str,
            source: &'a str,
            from_paper: bool,
            threads: usize,
            mem_read_bw: f64,
            mem_copy_bw: f64,
            #[serde(skip_serializing_if = "Option::is_none")]
            read_align: Option<usize>,
        }
        #[derive(Serialize)]
        struct Tail<'a> {
            compute: &'a Compute,
            #[serde(skip_serializing_if = "Option::is_none")]
            observed: Option<&'a Observed>,
        }
        let head = Head {
            name: &self.name,
            source: &self.source,
            from_paper: self.from_paper,
            threads: self.threads,
            mem_read_bw: self.mem_read_bw,
            mem_copy_bw: self.mem_copy_bw,
            read_align: self.read_align,
        };
        let mut s = toml::to_string(&head).expect("a device profile serializes to TOML");
        let _ = write!(s, "\n[disk]\nmax_qd = {}\npoints = [\n", self.disk.max_qd);
        for p in &self.disk.points {
            // `{:?}` writes the shortest f64 that reads back exactly, always as a TOML float.
            let _ =
                writeln!(s, "    {{ size = {}, qd = {}, bw = {:?}, lat_ns = {:?} }},", p.size, p.qd, p.bw, p.lat_ns);
        }
        s.push_str("]\n\n");
        s.push_str(
            &toml::to_string(&Tail { compute: &self.compute, observed: self.observed.as_ref() })
                .expect("a device profile serializes to TOML"),
        );
        s
    }

    /// Writes the profile as TOML, after `header` (lines of comments, `# ` prepended).
    pub fn save(&self, path: &Path, header: &[String]) -> std::io::Result<()> {
        let mut s = String::new();
        for h in header {
            let _ = writeln!(s, "# {h}");
        }
        if !header.is_empty() {
            s.push('\n');
        }
        s.push_str(&self.to_toml());
        Ok(sift_output::write(path, &[], s.as_bytes())?)
    }

    /// The seed profile `name` compiled into sift (see [`list_builtin`]).
    pub fn builtin(name: &str) -> Option<DeviceProfile> {
        let (n, text) = BUILTIN.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))?;
        Some(
            DeviceProfile::from_toml(text, &format!("<builtin {n}>"))
                .unwrap_or_else(|e| panic!("builtin profile {n} does not load (a bug): {e}")),
        )
    }

    /// Interpolated disk bandwidth for `size`-byte reads at queue depth `qd` (bytes/s), with
    /// the engine's observed correction ([`Observed::disk_scale`]) where the profile has one.
    pub fn disk_bw(&self, size: usize, qd: usize) -> f64 {
        self.disk.bw(size as u64, qd) * self.disk_scale()
    }

    /// [`Observed::disk_scale`], 1 without observations.
    pub fn disk_scale(&self) -> f64 {
        self.observed.map_or(1.0, |o| o.disk_scale)
    }

    /// Folds one run's correction in: a running mean over the last [`OBSERVED_WINDOW`] runs or so
    /// (each new run weighs `1 / min(runs, OBSERVED_WINDOW)`).
    pub fn observe(&mut self, run: Observed) {
        self.observed = Some(match self.observed {
            None => run,
            Some(o) => {
                let runs = o.runs.saturating_add(1);
                let w = 1.0 / runs.min(OBSERVED_WINDOW) as f64;
                Observed {
                    runs,
                    disk_scale: o.disk_scale + (run.disk_scale - o.disk_scale) * w,
                    io_cpu_ns_per_byte: o.io_cpu_ns_per_byte + (run.io_cpu_ns_per_byte - o.io_cpu_ns_per_byte) * w,
                }
            }
        });
    }

    /// Latency of one read of `size` bytes on its own (qd 1), in ns.
    pub fn read_lat_ns(&self, size: usize) -> f64 {
        if size == 0 {
            return 0.0;
        }
        size as f64 / self.disk_bw(size, 1) * 1e9
    }

    /// Nanoseconds of a sparse column product over `bytes` of `ty` columns (no dispatch).
    pub fn columns_ns(&self, ty: ColType, bytes: u64) -> f64 {
        let bw = self.compute.columns.get(ty.name()).copied().unwrap_or_else(|| self.assumed_kernel_bw());
        bytes as f64 / bw * 1e9
    }

    /// Nanoseconds of a dense matvec over `bytes` of `ty` weights (no dispatch).
    pub fn dense_ns(&self, ty: WeightType, bytes: u64) -> f64 {
        let bw = self.compute.dense.get(ty.name()).copied().unwrap_or_else(|| self.assumed_kernel_bw());
        bytes as f64 / bw * 1e9
    }

    /// Nanoseconds to stream `bytes` from memory with all threads.
    pub fn mem_read_ns(&self, bytes: u64) -> f64 {
        bytes as f64 / self.mem_read_bw * 1e9
    }

    /// Nanoseconds of one thread-pool dispatch.
    pub fn dispatch_ns(&self) -> f64 {
        self.compute.dispatch_ns
    }

    fn assumed_kernel_bw(&self) -> f64 {
        self.compute.kernel_efficiency * self.mem_read_bw
    }

    /// The profile as markdown tables (what `sift probe` and `sift probe --show` print).
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "profile `{}`: {}", self.name, self.source);
        if self.from_paper {
            let _ = writeln!(s, "(taken from a paper: derived and assumed numbers are marked in its file)");
        }
        let _ = writeln!(s, "\n| memory | threads | bandwidth |\n| --- | ---: | ---: |");
        let _ = writeln!(s, "| read (sum) | {} | {} |", self.threads, gbs(self.mem_read_bw));
        let _ = writeln!(s, "| copy (memcpy) | 1 | {} |", gbs(self.mem_copy_bw));

        let d = &self.disk;
        let _ = write!(
            s,
            "\ndisk: random reads, bandwidth (batch latency); deeper batches than qd {} run as qd {}\n\n| size |",
            d.max_qd, d.max_qd
        );
        for q in &d.qds {
            let _ = write!(s, " qd {q} |");
        }
        s.push_str("\n| ---: |");
        for _ in &d.qds {
            s.push_str(" ---: |");
        }
        s.push('\n');
        for &size in &d.sizes {
            let _ = write!(s, "| {} |", human_bytes(size));
            for &q in &d.qds {
                let p = d.point(size, q).expect("full grid");
                let _ = write!(s, " {} ({}) |", gbs(p.bw), human_ns(p.lat_ns));
            }
            s.push('\n');
        }

        let _ = writeln!(s, "\n| kernel | type | weights/s | of mem read |\n| --- | --- | ---: | ---: |");
        let c = &self.compute;
        let mut row = |kind: &str, name: &str, v: Option<f64>| {
            let (bw, note) = match v {
                Some(v) => (v, ""),
                None => (self.assumed_kernel_bw(), " (assumed)"),
            };
            let _ = writeln!(s, "| {kind} | {name} | {}{note} | {:.0}% |", gbs(bw), 100.0 * bw / self.mem_read_bw);
        };
        if c.columns.is_empty() && c.dense.is_empty() {
            row("all", "any", None);
        } else {
            for t in ColType::ALL {
                row("columns", t.name(), c.columns.get(t.name()).copied());
            }
            for t in WEIGHT_TYPES {
                row("dense", t.name(), c.dense.get(t.name()).copied());
            }
        }
        let _ = writeln!(s, "\npool dispatch: {}", human_ns(c.dispatch_ns));
        s
    }
}

/// The names of the seed profiles compiled into sift ([`DeviceProfile::builtin`]).
pub fn list_builtin() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// The weight type named `name` (as [`WeightType::name`] spells it).
pub fn weight_type(name: &str) -> Option<WeightType> {
    WEIGHT_TYPES.into_iter().find(|t| t.name() == name)
}

impl IoCost for DeviceProfile {
    fn batch_ns(&self, reqs: &[ReadReq]) -> f64 {
        let lens = reqs.iter().map(|r| r.len).filter(|&l| l > 0);
        let n = lens.clone().count();
        if n == 0 {
            return 0.0;
        }
        let qd = n.min(self.disk.max_qd).max(1);
        let transfer: f64 = lens.clone().map(|l| l as f64 / self.disk_bw(l, qd) * 1e9).sum();
        let largest = lens.max().expect("n > 0");
        let lat = self.read_lat_ns(largest);
        let startup = (lat - largest as f64 / self.disk_bw(largest, qd) * 1e9).max(0.0);
        (startup + transfer).max(lat)
    }

    fn copy_ns(&self, bytes: u64) -> f64 {
        bytes as f64 * (1e9 / self.mem_copy_bw + self.observed.map_or(0.0, |o| o.io_cpu_ns_per_byte))
    }

    fn read_align(&self) -> usize {
        self.read_align.unwrap_or(DIRECT_ALIGN)
    }
}

/// `12.3 GB/s` (decimal units, as disk and memory vendors and the papers quote them).
pub fn gbs(bytes_per_s: f64) -> String {
    if bytes_per_s >= 0.9995e9 {
        format!("{:.2} GB/s", bytes_per_s / 1e9)
    } else {
        format!("{:.0} MB/s", bytes_per_s / 1e6)
    }
}

/// `4 KiB`, `1 MiB`.
pub fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// `850 ns`, `31.2 µs`, `4.10 ms`.
pub fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}
