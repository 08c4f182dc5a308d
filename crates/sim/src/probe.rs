//! `sift probe`: measures this machine into a [`DeviceProfile`].
//!
//! - **memory**: read bandwidth — every thread of a [`ThreadPool`] sums its share of a buffer
//!   larger than the last-level cache (256 MiB, or twice the L3 if that is larger); copy
//!   bandwidth — one thread `memcpy`s 64 MiB into another 64 MiB (bytes copied per second).
//! - **disk**: random, 4 KiB-aligned reads of a weight file through sift's own slow tier
//!   ([`UringTier`], else [`PreadTier`]: what `open_slow_tier(path, TierKind::Auto)` picks), for
//!   every request size × queue depth of [`PROBE_SIZES`] × [`PROBE_QDS`]: a batch of `qd` reads is
//!   submitted at once ([`SlowTier::read_batch`]) and batches repeat until the point has run for
//!   its time. The file is opened with `O_DIRECT`, so reads bypass the page cache and measure
//!   the disk (a drive's or a hypervisor's own cache can still serve repeated reads of a small
//!   file: the report says so when the file is small).
//! - **kernels**: sift's sparse column kernel ([`column_matmul`], half of the columns active, op
//!   shapes 1536 → 8960 and 8960 → 1536) per [`ColType`], and the dense matvec ([`matmul_many`],
//!   one token, the same shapes) per [`WeightType`], over valid blocks (random f32 values
//!   quantized with the reference quantizers, tiled over the working buffer), reported as bytes
//!   of weights per second; and what one pool dispatch adds to a parallel op.
//!
//! Medians of repeated passes are reported for memory and kernels (the machine may be shared);
//! disk points report total bytes over total time. A full probe takes about 15 s on a 2-core
//! machine, `--quick` about 6 s (a quarter of the time per measurement). On a shared machine the
//! numbers move with the load; the report notes a high load average.

use crate::profile::{
    gbs, human_bytes, Compute, DeviceProfile, DiskPoint, DiskTable, PROBE_QDS, PROBE_SIZES, WEIGHT_TYPES,
};
use sift_engine::matmul::{matmul_many, MatJob, QuantActs};
use sift_engine::pool::{split, ThreadPool};
use sift_engine::sparse::{column_matmul, ColJob, ColOp};
use sift_model::QTensor;
use sift_quant::{ColType, Isa, WeightType};
use sift_store::io::{
    AlignedBuf, PreadTier, ReadReq, SlowTier, UringTier, DEFAULT_PREAD_THREADS, DEFAULT_QUEUE_DEPTH, DIRECT_ALIGN,
};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Smallest working set for memory and kernel measurements.
pub const MIN_WORK_BYTES: usize = 256 << 20;
/// Bytes each side of the copy measurement.
pub const COPY_BYTES: usize = 64 << 20;
/// Below this, a probed file is called small (random reads repeat parts of it).
pub const SMALL_FILE: u64 = 1 << 30;
/// Output width × input width of the two op shapes the kernels run (Qwen2.5-1.5B's FFN).
pub const KERNEL_SHAPES: [(usize, usize); 2] = [(8960, 1536), (1536, 8960)];

/// What to measure.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// The weight file whose reads measure the disk.
    pub file: PathBuf,
    /// Threads for memory reads and kernels.
    pub threads: usize,
    /// A quarter of the time per measurement.
    pub quick: bool,
    /// The profile's name.
    pub name: String,
    /// Most bytes the memory and kernel measurements may allocate (a probe run under a memory
    /// budget); `None`: [`work_bytes`]. At least 32 MiB are used (a memory figure from less
    /// would be the last-level cache's); kernel types and disk request sizes that need more are
    /// left out.
    pub work_cap: Option<usize>,
}

/// A finished probe.
#[derive(Clone, Debug)]
pub struct ProbeReport {
    pub profile: DeviceProfile,
    /// What the reader should know about the numbers (the tier, O_DIRECT, a small file).
    pub notes: Vec<String>,
    pub elapsed: Duration,
}

/// Why a probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("probing the disk with {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is {len} bytes: too small to probe the disk (reads of up to {need} bytes); pass a larger weight file with -m")]
    TooSmall { path: PathBuf, len: u64, need: u64 },
    #[error("the measured profile is invalid ({0}): a bug in the probe")]
    Invalid(String),
}

impl ProbeOptions {
    fn min_time(&self, full: f64) -> Duration {
        Duration::from_secs_f64(if self.quick { full / 4.0 } else { full })
    }
}

/// Runs every measurement; `progress` gets one line per step.
pub fn probe(opts: &ProbeOptions, progress: &mut dyn FnMut(&str)) -> Result<ProbeReport, ProbeError> {
    let start = Instant::now();
    let threads = opts.threads.max(1);
    let pool = ThreadPool::new(threads);
    let mut notes = Vec::new();
    let load_before = load_average();

    let work_len = opts.work_cap.map_or(work_bytes(), |cap| work_bytes().min(cap.max(32 << 20)));
    let mut work = vec![0u8; work_len];
    for (i, chunk) in work.chunks_mut(4096).enumerate() {
        chunk.fill(i as u8);
    }
    progress(&format!("memory: reading {} with {threads} threads", human_bytes(work.len() as u64)));
    let mem_read_bw = mem_read_bw(&pool, &work, opts.min_time(0.4));
    progress(&format!("memory: read {}", gbs(mem_read_bw)));
    let copy_len = COPY_BYTES.min(work.len() / 2);
    let (src, rest) = work.split_at_mut(copy_len);
    let mem_copy_bw = mem_copy_bw(src, &mut rest[..copy_len], opts.min_time(0.3));
    progress(&format!("memory: copy {} (1 thread)", gbs(mem_copy_bw)));

    // Each kernel measurement needs two ops of each shape in half the work buffer; under a cap,
    // types whose ops do not fit are left out (the profile then assumes `kernel_efficiency`).
    let fits = |op_bytes: usize| work_len / 2 >= op_bytes;
    let widest = |bytes_of: &dyn Fn(usize, usize) -> usize| {
        KERNEL_SHAPES.iter().map(|&(rows, cols)| bytes_of(rows, cols)).max().unwrap_or(0)
    };
    let mut columns = BTreeMap::new();
    for ty in ColType::ALL {
        if !fits(widest(&|n_out, n_in| n_in * ty.col_bytes(n_out))) {
            continue;
        }
        let bw = column_kernel_bw(&pool, ty, &mut work, opts.min_time(0.3));
        progress(&format!("kernels: columns {} {}", ty.name(), gbs(bw)));
        columns.insert(ty.name().to_string(), bw.round());
    }
    let mut dense = BTreeMap::new();
    for ty in WEIGHT_TYPES {
        if !fits(widest(&|rows, cols| rows * ty.row_bytes(cols).unwrap_or(usize::MAX / rows.max(1)))) {
            continue;
        }
        let bw = dense_kernel_bw(&pool, ty, &mut work, opts.min_time(0.3));
        progress(&format!("kernels: dense {} {}", ty.name(), gbs(bw)));
        dense.insert(ty.name().to_string(), bw.round());
    }
    drop(work);
    // For kernel types a later sift may add: the median measured kernel's share of memory bandwidth.
    let mut shares: Vec<f64> = columns.values().chain(dense.values()).map(|bw| bw / mem_read_bw).collect();
    shares.sort_by(f64::total_cmp);
    let kernel_efficiency = match shares.get(shares.len() / 2) {
        Some(s) => (s * 1000.0).round().clamp(1.0, 1000.0) / 1000.0,
        None => crate::profile::DEFAULT_KERNEL_EFFICIENCY,
    };
    let dispatch = dispatch_ns(&pool, opts.min_time(0.15));
    progress(&format!("kernels: pool dispatch {dispatch:.0} ns"));

    // Under a cap, request sizes whose deepest batch would not fit are left out.
    let max_qd = PROBE_QDS.iter().copied().max().unwrap_or(1) as u64;
    let sizes: Vec<u64> = match opts.work_cap {
        Some(cap) => PROBE_SIZES.iter().copied().filter(|&s| s * max_qd <= (cap as u64).max(16 << 20)).collect(),
        None => PROBE_SIZES.to_vec(),
    };
    let disk = disk_probe(&opts.file, &sizes, &PROBE_QDS, opts.min_time(0.3), opts.quick, progress)?;
    notes.extend(disk.notes.iter().cloned());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    if let Some(load) = load_before.into_iter().chain(load_average()).reduce(f64::max).filter(|&l| l > 0.5 * cpus) {
        notes.push(format!(
            "load: the load average was {load:.2} on {cpus} CPUs while probing: other processes competed for cores and \
             memory, so these numbers may be low and vary between runs (probe an idle machine for a reference profile)"
        ));
    }

    let host = hostname();
    let isa = format!("{:?}", Isa::detect());
    let profile = DeviceProfile {
        name: opts.name.clone(),
        source: format!(
            "measured by `sift probe` on {host} {} ({isa}, {threads} threads; disk: {} of {})",
            today(),
            disk.tier,
            opts.file.display()
        ),
        from_paper: false,
        threads,
        mem_read_bw: mem_read_bw.round(),
        mem_copy_bw: mem_copy_bw.round(),
        disk: DiskTable::new(disk.max_qd, disk.points).map_err(|(f, p)| ProbeError::Invalid(format!("{f}: {p}")))?,
        read_align: Some(disk.read_align),
        compute: Compute { dispatch_ns: dispatch.round(), kernel_efficiency, columns, dense },
        observed: None,
    };
    profile.validate().map_err(|(f, p)| ProbeError::Invalid(format!("{f}: {p}")))?;
    Ok(ProbeReport { profile, notes, elapsed: start.elapsed() })
}

/// The working-set size for memory and kernel measurements: [`MIN_WORK_BYTES`], or twice the
/// last-level cache where that is larger (up to 1 GiB).
pub fn work_bytes() -> usize {
    let l3 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size").ok().and_then(|s| {
        let s = s.trim();
        let (num, mul) = match s.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (s, 1),
            },
        };
        num.parse::<usize>().ok().map(|n| n * mul)
    });
    (2 * l3.unwrap_or(0)).clamp(MIN_WORK_BYTES, 1 << 30)
}

/// Runs `pass` (one warm-up, then until `min_time` has passed and at least `min_reps` times);
/// returns the median duration of a pass in seconds.
fn median_pass(min_time: Duration, min_reps: usize, mut pass: impl FnMut()) -> f64 {
    pass();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_reps || start.elapsed() < min_time {
        let t = Instant::now();
        pass();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// How far ahead [`sum_words`] prefetches: as far as sift's dot kernels do (`sift_quant`'s
/// `PREFETCH_BYTES`), so the read bandwidth is the one the kernels can reach.
const PREFETCH_AHEAD: usize = 4096;

/// Sum of a byte slice as u64 words, eight accumulators, each 64-byte line prefetched
/// [`PREFETCH_AHEAD`] bytes ahead (software prefetch adds about 30 % to a core's streaming
/// bandwidth on the machine sift is developed on, and sift's kernels use it).
fn sum_words(b: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `sum_words_sse` only needs SSE, which every x86_64 CPU has (it is part of the
        // x86_64 baseline); the function has no other preconditions.
        unsafe { sum_words_sse(b) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        sum_words_plain(b, |_| {})
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse")]
fn sum_words_sse(b: &[u8]) -> u64 {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let base = b.as_ptr();
    // A prefetch is only a hint: it never faults and is not a memory access in Rust's sense, so
    // addresses past the end are fine (`wrapping_add` keeps computing them defined).
    sum_words_plain(b, |off| _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off + PREFETCH_AHEAD) as *const i8))
}

#[inline(always)]
fn sum_words_plain(b: &[u8], prefetch: impl Fn(usize)) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = b.chunks_exact(64);
    for (i, c) in (&mut chunks).enumerate() {
        prefetch(i * 64);
        for (k, a) in acc.iter_mut().enumerate() {
            let w = u64::from_ne_bytes(c[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            *a = a.wrapping_add(w);
        }
    }
    let tail = chunks.remainder().iter().fold(0u64, |s, &x| s.wrapping_add(x as u64));
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

/// Streaming read bandwidth (bytes/s): every worker sums its share of `buf`.
pub fn mem_read_bw(pool: &ThreadPool, buf: &[u8], min_time: Duration) -> f64 {
    let secs = median_pass(min_time, 3, || {
        pool.run(&|part, n| {
            black_box(sum_words(&buf[split(buf.len(), n, part)]));
        });
    });
    buf.len() as f64 / secs
}

/// One thread copying `src` into `dst` (bytes copied per second).
pub fn mem_copy_bw(src: &[u8], dst: &mut [u8], min_time: Duration) -> f64 {
    let n = src.len().min(dst.len());
    let secs = median_pass(min_time, 3, || {
        dst[..n].copy_from_slice(black_box(&src[..n]));
        black_box(&dst[..n]);
    });
    n as f64 / secs
}

/// Deterministic xorshift64* numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Fills `buf` with copies of `seed` (whole copies, then a partial one).
fn tile(buf: &mut [u8], seed: &[u8]) {
    for chunk in buf.chunks_mut(seed.len()) {
        chunk.copy_from_slice(&seed[..chunk.len()]);
    }
}

/// `n` sorted distinct indices below `of`.
fn random_subset(rng: &mut Rng, n: usize, of: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..of as u32).collect();
    for i in 0..n {
        let j = i + rng.below((of - i) as u64) as usize;
        all.swap(i, j);
    }
    let mut v = all[..n].to_vec();
    v.sort_unstable();
    v
}

/// Sparse column kernel throughput (bytes of active columns per second) for `ty`: `work` is
/// filled with column tensors of both [`KERNEL_SHAPES`] (half of it each), every op runs with a
/// random half of its columns active, all ops of a shape in one [`column_matmul`] dispatch.
///
/// # Panics
/// If half of `work` cannot hold one op (about 15 MB for Q8_0); [`work_bytes`] always can.
pub fn column_kernel_bw(pool: &ThreadPool, ty: ColType, work: &mut [u8], min_time: Duration) -> f64 {
    let mut rng = Rng(0x5eed_c011 ^ ty.block_bytes() as u64);
    // Seed columns: 16 random columns of each length, quantized, then tiled.
    let half = work.len() / 2;
    let mut ops: Vec<(ColOp, Vec<u32>)> = Vec::new();
    for (si, &(n_out, n_in)) in KERNEL_SHAPES.iter().enumerate() {
        let col_bytes = ty.col_bytes(n_out);
        let mut seed = vec![0u8; 16 * col_bytes];
        for c in seed.chunks_mut(col_bytes) {
            let x: Vec<f32> = (0..n_out).map(|_| rng.f32()).collect();
            ty.quantize_col(&x, c);
        }
        let region = si * half..(si + 1) * half;
        tile(&mut work[region.clone()], &seed);
        let op_bytes = n_in * col_bytes;
        assert!(half >= op_bytes, "column_kernel_bw: {} bytes of work cannot hold two ops of {op_bytes}", work.len());
        for k in 0..half / op_bytes {
            let start = region.start + k * op_bytes;
            let op = ColOp::requant(ty, n_in, n_out, start..start + op_bytes);
            ops.push((op, random_subset(&mut rng, n_in / 2, n_in)));
        }
    }
    let work: &[u8] = work;
    let bytes: usize = ops.iter().map(|(op, idx)| op.bytes(idx.len())).sum();
    let mut outs: Vec<Vec<f32>> = ops.iter().map(|(op, _)| vec![0f32; op.n_out]).collect();
    let coefs: Vec<Vec<f32>> =
        KERNEL_SHAPES.iter().map(|&(_, n_in)| (0..n_in / 2).map(|_| rng.f32()).collect()).collect();
    // Re-quantized kernels do not read the active inputs' numbers, only their columns' (`idx`).
    let units: Vec<Vec<u32>> = KERNEL_SHAPES.iter().map(|&(_, n_in)| (0..(n_in / 2) as u32).collect()).collect();
    let mut scratch = Vec::new();
    let secs = median_pass(min_time, 2, || {
        for (si, &(n_out, _)) in KERNEL_SHAPES.iter().enumerate() {
            let mut jobs: Vec<ColJob<'_>> = ops
                .iter()
                .zip(outs.iter_mut())
                .filter(|((op, _), _)| op.n_out == n_out)
                .map(|((op, idx), out)| ColJob { op, data: &work[op.range.clone()], idx, scales: &[], out })
                .collect();
            column_matmul(pool, &units[si], &coefs[si], &mut jobs, &mut scratch);
        }
        black_box(&outs);
    });
    bytes as f64 / secs
}

/// Dense matvec throughput (bytes of weights per second) for `ty`: `work` is filled with
/// matrices of both [`KERNEL_SHAPES`] (half of it each), one token, all matrices of a shape in
/// one [`matmul_many`] dispatch.
///
/// # Panics
/// If half of `work` cannot hold one matrix (55 MB for F32); [`work_bytes`] always can.
pub fn dense_kernel_bw(pool: &ThreadPool, ty: WeightType, work: &mut [u8], min_time: Duration) -> f64 {
    let mut rng = Rng(0xde05e ^ ty.block_bytes() as u64);
    let half = work.len() / 2;
    let mut tensors: Vec<QTensor> = Vec::new();
    let mut acts = Vec::new();
    for (si, &(rows, cols)) in KERNEL_SHAPES.iter().enumerate() {
        let row_bytes = ty.row_bytes(cols).expect("kernel shapes are whole blocks of every type");
        let mut seed = Vec::with_capacity(16 * row_bytes);
        for _ in 0..16 {
            let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
            seed.extend_from_slice(&sift_quant::scalar::quantize_row(ty, &x));
        }
        let region = si * half..(si + 1) * half;
        tile(&mut work[region.clone()], &seed);
        let t_bytes = rows * row_bytes;
        assert!(half >= t_bytes, "dense_kernel_bw: {} bytes of work cannot hold two matrices of {t_bytes}", work.len());
        for k in 0..half / t_bytes {
            let start = region.start + k * t_bytes;
            tensors.push(QTensor {
                name: format!("probe.{}.{si}.{k}", ty.name()),
                ty,
                rows,
                cols,
                row_bytes,
                range: start..start + t_bytes,
                packed: false,
            });
        }
        let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
        let mut qa = QuantActs::new();
        qa.quantize(pool, ty.act_type(), &x, cols, 1);
        acts.push(qa);
    }
    let work: &[u8] = work;
    let bytes: usize = tensors.iter().map(|t| t.range.len()).sum();
    let mut outs: Vec<Vec<f32>> = tensors.iter().map(|t| vec![0f32; t.rows]).collect();
    let secs = median_pass(min_time, 2, || {
        for (si, &(rows, cols)) in KERNEL_SHAPES.iter().enumerate() {
            let mut jobs: Vec<MatJob<'_>> = tensors
                .iter()
                .zip(outs.iter_mut())
                .filter(|(t, _)| (t.rows, t.cols) == (rows, cols))
                .map(|(w, out)| MatJob { w, out, stride: rows })
                .collect();
            matmul_many(pool, work, &acts[si], 1, &mut jobs);
        }
        black_box(&outs);
    });
    bytes as f64 / secs
}

/// Work each part of a dispatch does while [`dispatch_ns`] measures it.
pub const DISPATCH_WORK: Duration = Duration::from_micros(5);

/// Nanoseconds a thread-pool dispatch adds to a parallel op: every worker's part spins for
/// [`DISPATCH_WORK`] and the dispatch costs what a round takes beyond that (median over blocks
/// of 200). It includes handing the job to the helpers and waiting for them, and, when a helper
/// is descheduled on a busy machine, the part the caller does in its place.
pub fn dispatch_ns(pool: &ThreadPool, min_time: Duration) -> f64 {
    const N: usize = 200;
    let spin = || {
        let t = Instant::now();
        while t.elapsed() < DISPATCH_WORK {
            std::hint::spin_loop();
        }
    };
    let secs = median_pass(min_time, 3, || {
        for _ in 0..N {
            pool.run(&|_, _| spin());
        }
    });
    (secs / N as f64 - DISPATCH_WORK.as_secs_f64()).max(0.0) * 1e9
}

/// The disk measurements.
#[derive(Clone, Debug)]
pub struct DiskProbe {
    pub points: Vec<DiskPoint>,
    /// The deepest batch measured: the table's `max_qd` (the tier's own limit on reads in
    /// flight is part of what the deeper points measured).
    pub max_qd: usize,
    /// `"io_uring"` or `"pread"`.
    pub tier: &'static str,
    /// Whether the file was read with `O_DIRECT`.
    pub direct: bool,
    /// The alignment the tier's reads need ([`SlowTier::read_align`]).
    pub read_align: usize,
    pub file_len: u64,
    pub notes: Vec<String>,
}

/// Opens `path` as `open_slow_tier(path, TierKind::Auto)` does, keeping whether it is direct and
/// how many reads it keeps in flight.
fn open_tier(path: &Path) -> std::io::Result<(Box<dyn SlowTier>, bool, usize)> {
    match UringTier::open(path, DEFAULT_QUEUE_DEPTH) {
        Ok(t) => {
            let (direct, qd) = (t.is_direct(), t.queue_depth());
            Ok((Box::new(t), direct, qd))
        }
        Err(_) => {
            let t = PreadTier::open(path, DEFAULT_PREAD_THREADS)?;
            let direct = t.is_direct();
            Ok((Box::new(t), direct, DEFAULT_PREAD_THREADS))
        }
    }
}

/// Random aligned reads of `path`: for every size × queue depth, batches of `qd` reads of
/// `size` bytes at random 4 KiB-aligned offsets, repeated for `min_time` (at least two batches,
/// one with `quick`). `bw` is bytes over time; `lat_ns` the mean time of one batch.
pub fn disk_probe(
    path: &Path,
    sizes: &[u64],
    qds: &[usize],
    min_time: Duration,
    quick: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<DiskProbe, ProbeError> {
    let io_err = |source| ProbeError::Io { path: path.to_path_buf(), source };
    let (mut tier, direct, tier_qd) = open_tier(path).map_err(io_err)?;
    let file_len = tier.file_len();
    let max_size = sizes.iter().copied().max().unwrap_or(DIRECT_ALIGN as u64);
    if file_len < max_size {
        return Err(ProbeError::TooSmall { path: path.to_path_buf(), len: file_len, need: max_size });
    }
    let mut notes = vec![format!(
        "disk: {} ({}) read with {} (up to {tier_qd} reads in flight){}",
        path.display(),
        human_bytes_approx(file_len),
        tier.name(),
        if direct {
            ", O_DIRECT: the page cache is bypassed, so these are the disk's numbers"
        } else {
            " without O_DIRECT (refused by the file system): pages are dropped after each batch, but the numbers may be optimistic"
        }
    )];
    let max_batch = max_size * qds.iter().copied().max().unwrap_or(1) as u64;
    if file_len < SMALL_FILE {
        notes.push(format!(
            "disk: the file is only {}, smaller than 1 GiB{}: random reads repeat parts of it and a drive or host \
             cache may serve repeats faster than the disk would; probe with a larger file (-m) for better numbers",
            human_bytes_approx(file_len),
            if file_len < max_batch {
                format!(" and than one batch of the largest reads ({})", human_bytes_approx(max_batch))
            } else {
                String::new()
            }
        ));
    }
    let mut buf = AlignedBuf::new(max_batch as usize);
    let mut rng = Rng(0xd15c ^ file_len);
    let mut batch = |tier: &mut Box<dyn SlowTier>, buf: &mut AlignedBuf, size: u64, qd: usize| {
        let slots = (file_len - size) / DIRECT_ALIGN as u64 + 1;
        let reqs: Vec<ReadReq> = (0..qd)
            .map(|i| ReadReq::full(rng.below(slots) * DIRECT_ALIGN as u64, size as usize, i * size as usize))
            .collect();
        let t = Instant::now();
        tier.read_batch(buf, &reqs).map(|()| t.elapsed().as_secs_f64())
    };
    // Warm-up: the ring and the drive.
    for _ in 0..4 {
        batch(&mut tier, &mut buf, 64 << 10, 16).map_err(io_err)?;
    }
    let min_batches = if quick { 1 } else { 2 };
    let mut points = Vec::new();
    for &size in sizes {
        for &qd in qds {
            let (mut secs, mut n) = (0.0, 0usize);
            let start = Instant::now();
            while n < min_batches || start.elapsed() < min_time {
                secs += batch(&mut tier, &mut buf, size, qd).map_err(io_err)?;
                n += 1;
            }
            let bw = (size * qd as u64 * n as u64) as f64 / secs;
            let lat_ns = secs / n as f64 * 1e9;
            progress(&format!("disk: {} qd {qd}: {} ({:.1} µs per batch)", human_bytes(size), gbs(bw), lat_ns / 1e3));
            points.push(DiskPoint { size, qd, bw: bw.round(), lat_ns: lat_ns.round() });
        }
    }
    let max_qd = qds.iter().copied().max().unwrap_or(1);
    let read_align = tier.read_align();
    Ok(DiskProbe { points, max_qd, tier: tier.name(), direct, read_align, file_len, notes })
}

/// `98.3 MB`, `1.10 GB` (file sizes, decimal).
fn human_bytes_approx(b: u64) -> String {
    if b >= 1_000_000_000 {
        format!("{:.2} GB", b as f64 / 1e9)
    } else {
        format!("{:.1} MB", b as f64 / 1e6)
    }
}

/// The 1-minute load average (Linux), if readable.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// This machine's host name.
pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() / 86_400).unwrap_or(0)
            as i64;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn subsets_are_sorted_distinct_and_in_range() {
        let mut rng = Rng(7);
        let s = random_subset(&mut rng, 500, 1000);
        assert_eq!(s.len(), 500);
        assert!(s.windows(2).all(|w| w[0] < w[1]) && *s.last().unwrap() < 1000);
    }
}
