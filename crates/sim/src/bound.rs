//! The physical bound of a budgeted run, and how close a run (or a simulated trace) comes to it.
//!
//! A decoded token must read at least the active columns the best possible cache would not
//! hold. Per (layer, op), with that op's share of the cache (its slots, as the run's memory plan
//! gave them; the units of one op have one size), Belady's optimum
//! ([`sift_store::cache::min_misses`], from the cache's content when the decode starts:
//! [`CacheContent`]) gives the fewest misses over the token sequence; times the op's column bytes, summed over ops, that is the
//! *must-read* bytes. With the disk's best bandwidth from the device profile and the compute
//! time of the same tokens with every weight in memory ([`ComputeModel`], the profile's cost
//! model, as the simulator charges it), no run with this cache split can do better than
//!
//! ```text
//! bound tok/s = 1 / max(compute per token, must-read per token / best bandwidth)
//! ```
//!
//! (a tighter bound would also let the split between ops move; this one keeps the plan's).
//! [`DecodeTelemetry`] puts a run's figures beside it: % of bound, bytes read per token, read
//! amplification (all bytes read during decode over the bytes of the missed columns that were
//! used), hit rates by count and by bytes, stall and compute time.

use crate::profile::{DeviceProfile, Observed};
use sift_engine::trace::Tracer;
use sift_model::layout::{OpKind, PackIndex, SITE_OPS};
use sift_model::Model;
use sift_sparsity::Site;
use sift_store::cache::{min_misses, UnitOutOfRange};
use sift_store::tiered::{MemoryTier, TierStats};
use std::io::{Seek, Write};
use std::sync::{Arc, Mutex, MutexGuard};

/// The bound of one run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReadBound {
    /// Decoded tokens it covers.
    pub tokens: usize,
    /// Bytes the optimal cache must read per token.
    pub must_read_per_token: f64,
    /// The disk's best read bandwidth (bytes/s) in the device profile.
    pub bandwidth: f64,
    /// Compute time per token with every weight in memory (seconds).
    pub compute_s_per_token: f64,
    /// The bound, tokens per second.
    pub tok_s: f64,
}

impl ReadBound {
    /// The bound from its parts (`must_read` bytes and `compute_s` seconds over `tokens`).
    pub fn new(tokens: usize, must_read: u64, bandwidth: f64, compute_s: f64) -> ReadBound {
        let n = tokens.max(1) as f64;
        let (read_s, compute_s) = (must_read as f64 / n / bandwidth.max(1.0), compute_s / n);
        let per_token = read_s.max(compute_s);
        ReadBound {
            tokens,
            must_read_per_token: must_read as f64 / n,
            bandwidth,
            compute_s_per_token: compute_s,
            tok_s: if per_token > 0.0 { 1.0 / per_token } else { 0.0 },
        }
    }
}

/// A decode's compute time with every weight in memory, by a device profile's cost model (what
/// the simulator charges): per layer and site, the column kernels over the active columns' bytes
/// (the profile's throughput per column type) and a pool dispatch, attention over the KV cache
/// after q/k/v at memory bandwidth; per token, the dense output head.
pub struct ComputeModel<'a> {
    profile: &'a DeviceProfile,
    index: &'a PackIndex,
    /// Bytes of one position's K (or V) row, all heads.
    kv_row: u64,
    head_ns: f64,
}

impl<'a> ComputeModel<'a> {
    pub fn new(model: &Model, index: &'a PackIndex, profile: &'a DeviceProfile) -> ComputeModel<'a> {
        let head_ns = profile.dense_ns(model.output.ty, (model.output.row_bytes * model.output.rows) as u64);
        ComputeModel { profile, index, kv_row: model.config.n_embd_kv() as u64 * 4, head_ns }
    }

    /// Layer `l`'s site `si` with `n_active` active units, for a token at position `pos`.
    pub fn site_ns(&self, l: usize, si: usize, n_active: usize, pos: usize) -> f64 {
        let mut ns = self.profile.dispatch_ns();
        for &op in SITE_OPS[si] {
            let t = self.index.layers[l].op(op);
            ns += self.profile.columns_ns(t.ty.cost_class(), (n_active * t.col_bytes) as u64);
        }
        if si == Site::AttnIn.index() {
            ns += self.profile.mem_read_ns(2 * (pos as u64 + 1) * self.kv_row) + self.profile.dispatch_ns();
        }
        ns
    }

    /// What every token costs besides its layers: the output head.
    pub fn token_ns(&self) -> f64 {
        self.head_ns + self.profile.dispatch_ns()
    }
}

/// Why a bound could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    #[error("cannot read the decode's activation log: {0}")]
    Log(#[from] std::io::Error),
    #[error("the activations do not fit the model: {0}")]
    Unit(#[from] UnitOutOfRange),
}

/// The units in a store's cache, per layer and op (q, k, v, o, gate, up, down): where the
/// optimal cache of the bound starts from.
pub struct CacheContent(Vec<Vec<Vec<u32>>>);

impl CacheContent {
    /// What `store` holds now.
    pub fn of(store: &dyn MemoryTier, n_layer: usize) -> CacheContent {
        CacheContent((0..n_layer).map(|l| OpKind::ALL.iter().map(|&op| store.cached_units(l, op)).collect()).collect())
    }

    /// An empty cache (a run's start).
    pub fn empty(n_layer: usize) -> CacheContent {
        CacheContent(vec![vec![Vec::new(); OpKind::ALL.len()]; n_layer])
    }
}

/// Bytes the optimal cache must read over a decode: per layer and op, Belady's fewest misses for
/// the op's slots in `store` from the units `start` holds, times its column bytes. `active(l,
/// site)` gives that site's active units per decoded token, in order (each sorted, unique).
pub fn must_read_bytes(
    index: &PackIndex,
    store: &dyn MemoryTier,
    start: &CacheContent,
    mut active: impl FnMut(usize, usize) -> std::io::Result<Vec<Vec<u32>>>,
) -> Result<u64, BoundError> {
    let mut bytes = 0u64;
    for (l, lc) in index.layers.iter().enumerate() {
        for (si, ops) in SITE_OPS.iter().enumerate() {
            let steps = active(l, si)?;
            for &op in ops.iter() {
                let t = lc.op(op);
                let (slots, _) = store.occupancy(l, op);
                let warm = start.0.get(l).and_then(|ops| ops.get(op as usize)).map_or(&[][..], |u| &u[..]);
                bytes += min_misses(&steps, t.n_in, slots, warm)? * t.col_bytes as u64;
            }
        }
    }
    Ok(bytes)
}

/// A decode's figures beside its bound.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DecodeTelemetry {
    pub tok_s: f64,
    pub bound: ReadBound,
    /// `tok_s` as a percentage of the bound.
    pub pct_of_bound: f64,
    /// Bytes read from the slow tier per decoded token (on demand and preloads).
    pub bytes_read_per_token: f64,
    /// Bytes read during decode over the bytes of the missed columns that were used.
    pub read_amplification: f64,
    pub hit_rate: f64,
    pub hit_rate_bytes: f64,
    /// Seconds waiting for reads and computing, over the decode.
    pub stall_s: f64,
    pub compute_s: f64,
    /// Mean bytes per read request, requests per loader job, and bytes per second while the
    /// slow tier was reading.
    pub mean_read_bytes: f64,
    pub mean_batch_reads: f64,
    pub read_bw_busy: f64,
    /// Bytes of missed columns copied out of read buffers (the amplification's denominator).
    pub copied_bytes: f64,
    /// What this run says about the machine against the profile of its bound
    /// ([`DecodeTelemetry::observation`]), when it read anything.
    pub observed: Option<Observed>,
}

impl DecodeTelemetry {
    /// A decode of `bound.tokens` tokens in `decode_s` seconds with counters `stats` (counted over
    /// that decode, and prompt batches whose reads and stalls are told apart: `bytes_prefill`,
    /// `stall_prefill_ns`).
    pub fn new(bound: ReadBound, decode_s: f64, stats: &TierStats) -> DecodeTelemetry {
        let n = bound.tokens.max(1) as f64;
        let tok_s = if decode_s > 0.0 { bound.tokens as f64 / decode_s } else { 0.0 };
        let read = (stats.bytes_ondemand + stats.bytes_preload) as f64;
        let stall_s = stats.stall_ns.saturating_sub(stats.stall_prefill_ns) as f64 * 1e-9;
        DecodeTelemetry {
            tok_s,
            pct_of_bound: if bound.tok_s > 0.0 { 100.0 * tok_s / bound.tok_s } else { 0.0 },
            bytes_read_per_token: read / n,
            read_amplification: if stats.miss_bytes > 0 { read / stats.miss_bytes as f64 } else { 0.0 },
            hit_rate: stats.hit_rate(),
            hit_rate_bytes: stats.hit_rate_bytes(),
            stall_s,
            compute_s: (decode_s - stall_s).max(0.0),
            mean_read_bytes: stats.mean_read(),
            mean_batch_reads: stats.mean_batch(),
            read_bw_busy: stats.read_bandwidth(),
            copied_bytes: stats.miss_bytes as f64,
            observed: None,
            bound,
        }
    }

    /// What this run says about the machine against `profile` (the profile the bound was
    /// computed with): [`Observed::from_run`] with the compute time beyond the in-memory cost
    /// model and the copies. `None` when the run read nothing.
    pub fn observation(&self, profile: &DeviceProfile) -> Option<Observed> {
        let model_s = self.bound.compute_s_per_token * self.bound.tokens as f64;
        let copy_s = self.copied_bytes / profile.mem_copy_bw;
        Observed::from_run(
            profile,
            self.read_bw_busy,
            self.mean_read_bytes,
            self.mean_batch_reads,
            self.compute_s - model_s - copy_s,
            self.copied_bytes,
        )
    }

    /// One line for a report.
    pub fn line(&self) -> String {
        let mib = |b: f64| b / (1024.0 * 1024.0);
        format!(
            "{:.2} tok/s = {:.0}% of the bound {:.2} tok/s (must read {:.1} MiB/token at {:.2} GB/s, compute {:.1} ms/token) | read {:.1} MiB/token, amplification {:.2} | hit rate {:.1}% by count, {:.1}% by bytes | stalled {:.2} s, computing {:.2} s",
            self.tok_s,
            self.pct_of_bound,
            self.bound.tok_s,
            mib(self.bound.must_read_per_token),
            self.bound.bandwidth * 1e-9,
            self.bound.compute_s_per_token * 1e3,
            mib(self.bytes_read_per_token),
            self.read_amplification,
            100.0 * self.hit_rate,
            100.0 * self.hit_rate_bytes,
            self.stall_s,
            self.compute_s,
        ) + &match self.observed {
            Some(o) => format!(
                " | reads at {:.2}x the profile's disk table, read path {:.2} ns/byte of compute",
                o.disk_scale, o.io_cpu_ns_per_byte
            ),
            None => String::new(),
        }
    }
}

/// A decode's active units, recorded for its bound ([`must_read_bytes`]) while a real run goes:
/// one bitset per decoded token (every layer and site, 47 KB for Qwen2.5-1.5B), written to an
/// unlinked temporary file so that the run's memory holds one token's record, not the decode's.
/// Prompt batches are not recorded (they read rows, not the cache). A cloneable handle: give one
/// clone to the engine ([`sift_engine::Engine::set_tracer`]) and read through another.
#[derive(Clone)]
pub struct ActivationLog(Arc<Mutex<LogInner>>);

struct LogInner {
    dims: [usize; 4],
    n_layer: usize,
    /// Byte offset of each site's bits within a layer's part of a record, and a layer's bytes.
    site_off: [usize; 4],
    layer_bytes: usize,
    record: Vec<u8>,
    recording: bool,
    tokens: usize,
    /// Each recorded token's position (the one in progress last).
    positions: Vec<u32>,
    file: std::io::BufWriter<std::fs::File>,
    error: Option<std::io::Error>,
}

impl ActivationLog {
    /// A log for a model with `n_layer` layers and `dims` units per site.
    pub fn new(n_layer: usize, dims: [usize; 4]) -> std::io::Result<ActivationLog> {
        let mut site_off = [0; 4];
        let mut at = 0;
        for (o, d) in site_off.iter_mut().zip(dims) {
            *o = at;
            at += d.div_ceil(8);
        }
        let file = std::io::BufWriter::with_capacity(1 << 16, tempfile::tempfile()?);
        Ok(ActivationLog(Arc::new(Mutex::new(LogInner {
            dims,
            n_layer,
            site_off,
            layer_bytes: at,
            record: vec![0; at * n_layer],
            recording: false,
            tokens: 0,
            positions: Vec::new(),
            file,
            error: None,
        }))))
    }

    fn inner(&self) -> MutexGuard<'_, LogInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decoded tokens recorded so far (the one in progress included).
    pub fn tokens(&self) -> usize {
        let g = self.inner();
        g.tokens + g.recording as usize
    }

    /// Forgets what was recorded (a warm-up's tokens).
    pub fn clear(&self) -> std::io::Result<()> {
        let mut g = self.inner();
        g.recording = false;
        g.tokens = 0;
        g.positions.clear();
        g.file.seek(std::io::SeekFrom::Start(0))?;
        Ok(())
    }

    /// Each recorded token's position in its sequence.
    pub fn positions(&self) -> Vec<u32> {
        let mut g = self.inner();
        g.end_token();
        g.positions.clone()
    }

    /// Per decoded token, the active units of layer `l`'s site `si` (ascending).
    pub fn steps(&self, l: usize, si: usize) -> std::io::Result<Vec<Vec<u32>>> {
        use std::os::unix::fs::FileExt;
        let mut g = self.inner();
        g.end_token();
        if let Some(e) = g.error.take() {
            return Err(e);
        }
        g.file.flush()?;
        let (off, dim, rec) = (l * g.layer_bytes + g.site_off[si], g.dims[si], g.layer_bytes * g.n_layer);
        let mut bits = vec![0u8; dim.div_ceil(8)];
        let mut out = Vec::with_capacity(g.tokens);
        for t in 0..g.tokens {
            g.file.get_ref().read_exact_at(&mut bits, (t * rec + off) as u64)?;
            out.push((0..dim as u32).filter(|&u| bits[u as usize / 8] & (1 << (u % 8)) != 0).collect());
        }
        Ok(out)
    }
}

impl LogInner {
    /// Writes the token in progress, if any.
    fn end_token(&mut self) {
        if !self.recording {
            return;
        }
        self.recording = false;
        let at = (self.tokens * self.record.len()) as u64;
        let r = self.file.seek(std::io::SeekFrom::Start(at)).and_then(|_| self.file.write_all(&self.record));
        match r {
            Ok(()) => self.tokens += 1,
            Err(e) => {
                self.positions.pop();
                self.error = Some(e);
            }
        }
    }
}

impl Tracer for ActivationLog {
    fn prompt(&mut self, _n: usize) {
        self.inner().end_token();
    }

    fn token(&mut self, pos: usize) {
        let mut g = self.inner();
        g.end_token();
        g.record.fill(0);
        g.recording = true;
        g.positions.push(pos as u32);
    }

    fn layer(&mut self, _layer: usize, _residual: &[f32]) {}

    fn site(&mut self, layer: usize, site: Site, _input: &[f32], active: Option<&[u32]>) {
        let mut g = self.inner();
        let si = site.index();
        if !g.recording || layer >= g.n_layer {
            return;
        }
        let (start, dim) = (layer * g.layer_bytes + g.site_off[si], g.dims[si]);
        let bits = &mut g.record[start..start + dim.div_ceil(8)];
        match active {
            None => (0..dim).for_each(|u| bits[u / 8] |= 1 << (u % 8)),
            Some(units) => {
                for &u in units.iter().filter(|&&u| (u as usize) < dim) {
                    bits[u as usize / 8] |= 1 << (u % 8);
                }
            }
        }
    }
}
