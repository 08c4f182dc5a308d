//! The tiered store: a pack's weight columns kept on disk (the slow tier, [`crate::io`]) and
//! cached in memory per layer and op (the fast tier, [`crate::cache`]), under a hard memory
//! budget ([`MemoryPlan`]).
//!
//! One decoded token's path: for each layer the engine asks [`TieredStore::fetch`] for the
//! active columns of a site's ops. Cached columns are hits; columns the
//! cross-layer prefetcher ([`TieredStore::begin_layer`]) brought in ahead of time are copied from its
//! buffer; the rest are read on demand, merged into few large reads. Columns the policy admits
//! go to cache slots; the others to a transient area used for this site only. Every column the
//! kernel needs then sits in one arena, addressed by an index per active column in the order the
//! selector listed them, so the products (and the tokens) do not depend on what was cached.
//!
//! Cross-layer preloading is its own component, `CrossLayerPrefetcher` ([`crate::prefetch`]): the
//! store calls it at the start of each layer and asks it for preloaded columns when it fetches.

use crate::cache::{Policy, UnitCache, NO_SLOT};
use crate::io::{open_slow_tier, plan_reads, AlignedBuf, LoadDone, Loader, ReadReq, TierKind};
use crate::prefetch::CrossLayerPrefetcher;
use crate::simulated::SimIo;
use sift_model::layout::{OpKind, PackIndex, GROUP_OPS};
use sift_model::{Model, QTensor};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Largest prompt batch of a run under a memory budget (activations grow with it).
pub const BUDGET_MAX_BATCH: usize = 64;

/// Reads closer than this are merged (the gap is read and thrown away): a 4 KiB read costs
/// nearly as much as a 16 KiB one on this disk.
const MAX_GAP: usize = 4 << 10;
/// Largest single read.
const MAX_READ: usize = 1 << 20;
/// Bytes of the buffer on-demand reads land in (larger batches run in several rounds).
const ONDEMAND_BUF: usize = 4 << 20;

/// The timing of a simulated slow tier and of memory copies, for a store replaying a trace
/// (`sift simulate`); `sift_sim::profile::DeviceProfile` implements it from a device profile.
pub trait IoCost: Send {
    /// Nanoseconds from submitting `reqs` together (as one batch, all in flight at once up to
    /// the device's queue depth) to the last one completing.
    fn batch_ns(&self, reqs: &[ReadReq]) -> f64;
    /// Nanoseconds to copy `bytes` from one memory buffer to another.
    fn copy_ns(&self, bytes: u64) -> f64;
}

/// Problems of the tiered store.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("reading weights from {path}: {source}; the pack may be truncated or the disk failing (check it, or run `sift pack` again)")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Budget(String),
    #[error("{0}")]
    Unsupported(String),
}

/// How the tiered store runs.
#[derive(Clone, Debug)]
pub struct TieredOptions {
    pub policy: Policy,
    /// Layers per preload group (0: no preloading, every miss is read on demand).
    pub preload: usize,
    pub tier: TierKind,
    /// Predicted channels per target layer = (channels it used last token) × (1 + margin).
    pub margin: f32,
    /// Largest size of each of the two preload buffers (bytes).
    pub preload_buf: usize,
    /// Keep the token-embedding table resident (default: read one row per token from disk).
    pub resident_embeddings: bool,
    /// How cache bytes are shared among the ops.
    pub split: CacheSplit,
}

/// How the cache's bytes are shared among the seven ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSplit {
    /// The same fraction of every op's columns.
    Uniform,
    /// Ops whose columns cost the most disk bytes per cached byte first: O_DIRECT reads whole 4 KiB
    /// pages, so a miss of an s-byte column costs about s + 4 KiB, and small columns (k, v, q, o)
    /// save several times their size when cached.
    ReadCost,
}

impl CacheSplit {
    pub fn parse(s: &str) -> Option<CacheSplit> {
        match s {
            "uniform" => Some(CacheSplit::Uniform),
            "read-cost" => Some(CacheSplit::ReadCost),
            _ => None,
        }
    }
}

/// The fraction of each op's columns (q, k, v, o, gate, up, down) that get a cache slot, for
/// `bytes` of cache.
pub fn split_cache(index: &PackIndex, bytes: u64, split: CacheSplit) -> [f64; 7] {
    let mut per_op = [0u64; 7];
    let mut col_bytes = [1usize; 7];
    for lc in &index.layers {
        for t in &lc.ops {
            per_op[t.op as usize] += t.len;
            col_bytes[t.op as usize] = t.col_bytes.max(1);
        }
    }
    let total: u64 = per_op.iter().sum();
    match split {
        CacheSplit::Uniform => [(bytes as f64 / total.max(1) as f64).min(1.0); 7],
        CacheSplit::ReadCost => {
            let mut order: Vec<usize> = (0..7).collect();
            let density = |i: usize| (col_bytes[i] + 4096) as f64 / col_bytes[i] as f64;
            order.sort_by(|&a, &b| density(b).total_cmp(&density(a)).then(a.cmp(&b)));
            let mut left = bytes;
            let mut f = [0.0; 7];
            for i in order {
                let take = left.min(per_op[i]);
                f[i] = if per_op[i] == 0 { 0.0 } else { take as f64 / per_op[i] as f64 };
                left -= take;
            }
            f
        }
    }
}

impl Default for TieredOptions {
    fn default() -> Self {
        TieredOptions {
            policy: Policy::Lfu,
            preload: 4,
            tier: TierKind::Auto,
            margin: 0.1,
            preload_buf: 32 << 20,
            resident_embeddings: false,
            split: CacheSplit::ReadCost,
        }
    }
}

/// Where the budget goes, in bytes.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MemoryPlan {
    pub budget: u64,
    /// The process before the engine: code, tokenizer, allocator (measured).
    pub runtime: u64,
    /// GGUF header and the tensors kept in memory (norms, output head, embeddings if resident).
    pub resident_weights: u64,
    /// KV cache, activations and logits.
    pub kv_and_scratch: u64,
    /// Transient area, prefill layer buffer, on-demand and preload buffers.
    pub buffers: u64,
    /// Cache slots.
    pub cache: u64,
    /// Cache slots as a fraction of all column bytes.
    pub cache_fraction: f64,
}

impl MemoryPlan {
    /// Everything but the cache.
    pub fn fixed(&self) -> u64 {
        self.runtime + self.resident_weights + self.kv_and_scratch + self.buffers
    }
}

/// Counters of one run (reset with [`TieredStore::reset_stats`]).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TierStats {
    /// Active columns found in the cache / not.
    pub hits: u64,
    pub misses: u64,
    /// Misses served from the preload buffer, and misses of ops whose layer had a preload.
    pub preload_hits: u64,
    pub preload_misses: u64,
    pub bytes_preload: u64,
    pub bytes_ondemand: u64,
    pub bytes_prefill: u64,
    pub reads: u64,
    /// Time the slow tier spent reading (loader thread).
    pub io_ns: u64,
    /// Time the compute thread waited for reads.
    pub stall_ns: u64,
    /// Predicted (layer, op, channel) parts brought in by preloading and not cached, and how
    /// many of them the token then used.
    pub preload_parts: u64,
    pub preload_used: u64,
}

impl TierStats {
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.hits + self.misses)
    }
    pub fn preload_precision(&self) -> f64 {
        ratio(self.preload_used, self.preload_parts)
    }
    /// Of the misses of preloaded layers' ops, the fraction the preload buffer held.
    pub fn preload_recall(&self) -> f64 {
        ratio(self.preload_hits, self.preload_misses)
    }
    pub fn bytes_read(&self) -> u64 {
        self.bytes_preload + self.bytes_ondemand + self.bytes_prefill
    }
    pub fn mean_read(&self) -> f64 {
        ratio(self.bytes_read(), self.reads)
    }
    /// Achieved read bandwidth while the slow tier was busy, bytes/s.
    pub fn read_bandwidth(&self) -> f64 {
        if self.io_ns == 0 {
            0.0
        } else {
            self.bytes_read() as f64 / (self.io_ns as f64 * 1e-9)
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// One (layer, op)'s cache: the policy's bookkeeping and where its slots sit in the arena.
pub(crate) struct OpCache {
    pub(crate) cache: UnitCache,
    pub(crate) col_bytes: usize,
    n_units: usize,
    /// Byte offset of slot 0 in the arena.
    base: usize,
    /// Byte offset of the op's column tensor in the pack.
    pub(crate) file_off: u64,
}

/// The columns one [`TieredStore::fetch`] made available, per op in the order asked.
pub struct Fetched<'a> {
    arena: &'a [u8],
    /// Per op: the byte offset of its slot 0 in the arena.
    bases: Vec<usize>,
    /// Per op: each active unit's column index, counted from the op's base.
    idx: &'a [Vec<u32>],
}

impl<'a> Fetched<'a> {
    /// The `k`-th op's columns: the arena from the op's base, and each active unit's column in it.
    pub fn op(&self, k: usize) -> (&'a [u8], &'a [u32]) {
        (&self.arena[self.bases[k]..], &self.idx[k])
    }
}

/// The column store for a model run under a memory budget.
pub struct TieredStore {
    path: PathBuf,
    io: Io,
    arena: Vec<u8>,
    /// The transient area's byte range in the arena.
    transient: Range<usize>,
    /// Per layer, per op (q, k, v, o, gate, up, down).
    ops: Vec<Vec<OpCache>>,
    index: PackIndex,
    policy: Policy,
    split: CacheSplit,
    prefetch: CrossLayerPrefetcher,
    ondemand: Option<AlignedBuf>,
    /// Kernel indices of the ops of the current site (index into the arena from each op's base).
    idx: Vec<Vec<u32>>,
    /// Scratch for one op's fetch.
    misses: Vec<u32>,
    hits: Vec<u32>,
    prefill: Option<AlignedBuf>,
    /// The layer whose rows the prefill buffer holds, with its weights rebased into the buffer.
    prefill_layer: Option<(usize, sift_model::LayerWeights)>,
    embd: Option<(QTensor, u64)>,
    embd_buf: Option<AlignedBuf>,
    stats: TierStats,
    pub plan: MemoryPlan,
}

/// Where the store's reads go: the loader thread over the pack's slow tier, or a simulated
/// device ([`TieredStore::simulated`]), which moves no bytes and keeps a virtual clock.
pub(crate) enum Io {
    Real(Loader),
    Sim(SimIo),
}

impl Io {
    pub(crate) fn submit(&mut self, tag: u64, buf: AlignedBuf, reqs: Vec<ReadReq>) {
        match self {
            Io::Real(l) => l.submit(tag, buf, reqs),
            Io::Sim(s) => s.submit(tag, buf, reqs),
        }
    }

    /// Waits for a submitted job: the job and nanoseconds waited.
    pub(crate) fn wait(&mut self, tag: u64) -> (LoadDone, u64) {
        match self {
            Io::Real(l) => {
                let t0 = Instant::now();
                let done = l.wait(tag);
                (done, t0.elapsed().as_nanos() as u64)
            }
            Io::Sim(s) => {
                let (done, ns) = s.wait(tag);
                (done, ns as u64)
            }
        }
    }

    /// Reads at once and waits: the job and nanoseconds waited.
    fn read_now(&mut self, buf: AlignedBuf, reqs: Vec<ReadReq>) -> (LoadDone, u64) {
        match self {
            Io::Real(l) => {
                let t0 = Instant::now();
                let done = l.read_now(buf, reqs);
                (done, t0.elapsed().as_nanos() as u64)
            }
            Io::Sim(s) => {
                let (done, ns) = s.read_now(buf, reqs);
                (done, ns as u64)
            }
        }
    }

    /// In a simulation, charges the copy of `bytes` to the clock (true); else false (copy them).
    fn simulated_copy(&mut self, bytes: usize) -> bool {
        match self {
            Io::Real(_) => false,
            Io::Sim(s) => {
                let ns = s.cost().copy_ns(bytes as u64);
                s.advance(ns);
                true
            }
        }
    }
}

/// What the engine needs to size the plan.
#[derive(Clone, Debug)]
pub struct PlanInputs {
    pub budget: u64,
    pub runtime: u64,
    pub kv_and_scratch: u64,
}

/// The tensors a budgeted run keeps in memory: everything but the seven linear ops of every layer
/// (streamed as columns) and, unless asked or the output head shares it (tied embeddings), the
/// token-embedding table (one row read per token).
pub fn is_resident(gguf: &sift_gguf::Gguf, name: &str, resident_embeddings: bool) -> bool {
    const STREAMED: [&str; 7] = [
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    ];
    if name == "token_embd.weight" {
        return resident_embeddings || gguf.tensor("output.weight").is_none();
    }
    !(name.starts_with("blk.") && STREAMED.iter().any(|s| name.ends_with(s)))
}

/// Opens a pack for a budgeted run: only the resident tensors are read (through the slow tier,
/// bypassing the page cache) into memory.
pub fn open_budgeted(path: &Path, opts: &TieredOptions) -> Result<Model, TierError> {
    open_budgeted_checked(path, opts, |_, _| Ok(()))
}

/// [`open_budgeted`], calling `precheck(gguf, resident bytes)` once the header is parsed and
/// before any resident tensor is read: a budget that cannot even hold them is refused before the
/// memory is used.
pub fn open_budgeted_checked(
    path: &Path,
    opts: &TieredOptions,
    precheck: impl FnOnce(&sift_gguf::Gguf, u64) -> Result<(), String>,
) -> Result<Model, TierError> {
    let toc = crate::read_toc(path)
        .map_err(|e| TierError::Unsupported(e.to_string()))?
        .ok_or_else(|| {
            TierError::Unsupported(format!(
                "{}: --memory needs a sift pack (the columns it streams from disk); make one with `sift pack {} -o MODEL.sift`",
                path.display(),
                path.display()
            ))
        })?;
    let mut tier = open_slow_tier(path, opts.tier).map_err(|source| TierError::Io { path: path.into(), source })?;
    let gguf_off = toc.gguf_offset();
    let mut buf = AlignedBuf::new(8 << 20);
    let fill = |dst: &mut [u8], ranges: &[Range<usize>]| -> std::io::Result<()> {
        for r in ranges {
            // Read [r] of the GGUF section in aligned pieces through `buf`.
            let mut pos = r.start;
            while pos < r.end {
                let file_start = gguf_off + pos as u64;
                let aligned = file_start / 4096 * 4096;
                let skip = (file_start - aligned) as usize;
                let want = (r.end - pos).min(buf.len() - skip);
                let len = (skip + want).div_ceil(4096) * 4096;
                let req = ReadReq { offset: aligned, len, buf_offset: 0, need: skip + want };
                tier.read_batch(&mut buf, &[req])?;
                dst[pos..pos + want].copy_from_slice(&buf[skip..skip + want]);
                pos += want;
            }
        }
        Ok(())
    };
    let emb = opts.resident_embeddings;
    crate::open_partial(path, toc, fill, |g, t| is_resident(g, &t.name, emb), precheck).map_err(|e| match e {
        crate::PackError::Gguf(sift_gguf::GgufError::Refused(msg)) => TierError::Budget(msg),
        e => TierError::Unsupported(e.to_string()),
    })
}

/// Bytes of the resident part of a budgeted model (header and resident tensors, page-rounded).
pub fn resident_bytes(model: &Model, resident_embeddings: bool) -> u64 {
    let g = &model.file.gguf;
    let page = |n: u64| n.div_ceil(4096) * 4096;
    let header = page(g.data_offset);
    header
        + g.tensors
            .iter()
            .filter(|t| is_resident(g, &t.name, resident_embeddings))
            .map(|t| page(t.n_bytes) + 4096)
            .sum::<u64>()
}

impl TieredStore {
    /// Plans the budget and builds the store for `model` (opened with [`open_budgeted`]).
    pub fn new(
        model: &Model,
        path: &Path,
        opts: &TieredOptions,
        inputs: &PlanInputs,
    ) -> Result<TieredStore, TierError> {
        let index = model.columns.clone().ok_or_else(|| TierError::Unsupported("--memory needs a sift pack".into()))?;
        let tier = open_slow_tier(path, opts.tier).map_err(|source| TierError::Io { path: path.into(), source })?;
        TieredStore::build(model, path, opts, inputs, index, Io::Real(Loader::spawn(tier)))
    }

    /// A store for `model` whose slow tier is simulated by `cost` (see [`crate::simulated`]): the
    /// same plan, cache and prefetch decisions as [`TieredStore::new`], with no bytes read or
    /// copied and time kept on a virtual clock ([`TieredStore::sim_advance`]). `model` may be
    /// opened any way (the pack mapped whole is cheapest); only its layout and norms are used.
    pub fn simulated(
        model: &Model,
        path: &Path,
        opts: &TieredOptions,
        inputs: &PlanInputs,
        cost: Box<dyn IoCost>,
    ) -> Result<TieredStore, TierError> {
        let index =
            model.columns.clone().ok_or_else(|| TierError::Unsupported("simulation needs a sift pack".into()))?;
        TieredStore::build(model, path, opts, inputs, index, Io::Sim(SimIo::new(cost)))
    }

    fn build(
        model: &Model,
        path: &Path,
        opts: &TieredOptions,
        inputs: &PlanInputs,
        index: PackIndex,
        io: Io,
    ) -> Result<TieredStore, TierError> {
        let c = &model.config;
        let sim = matches!(io, Io::Sim(_));
        let interleaved = opts.preload > 0 && index.group_size() == opts.preload;
        // Fixed buffers.
        let site_need = |ops: &[OpKind], l: usize| -> usize {
            ops.iter().map(|&op| index.layers[l].op(op).len as usize + index.layers[l].op(op).col_bytes).sum()
        };
        let mut transient = 0;
        for l in 0..c.n_layer {
            for ops in sift_model::layout::SITE_OPS {
                transient = transient.max(site_need(ops, l));
            }
        }
        let prefill =
            model.layers.iter().map(|lw| layer_span(lw).len()).max().unwrap_or(0).div_ceil(4096) * 4096 + 4096;
        // Each preload buffer holds up to half of a group's q/k/v/gate/up columns.
        let group_bytes = (0..opts.preload.min(c.n_layer))
            .map(|l| GROUP_OPS.iter().map(|&op| index.layers[l].op(op).len as usize).sum::<usize>())
            .sum::<usize>();
        // ... and at most 4% of the budget each: on a tight budget, cache slots pay more.
        let preload_buf =
            (group_bytes / 2).min(opts.preload_buf).min((inputs.budget / 25) as usize).div_ceil(4096) * 4096;
        let preload_bufs = if opts.preload > 0 { 2 * preload_buf } else { 0 };
        let buffers = (transient + prefill + ONDEMAND_BUF + preload_bufs + 2 * 4096) as u64;
        let resident = resident_bytes(model, opts.resident_embeddings);
        let mut plan = MemoryPlan {
            budget: inputs.budget,
            runtime: inputs.runtime,
            resident_weights: resident,
            kv_and_scratch: inputs.kv_and_scratch,
            buffers,
            ..Default::default()
        };
        let fixed = plan.fixed();
        if fixed > inputs.budget {
            return Err(TierError::Budget(format!(
                "--memory {} is too small to run this model: it needs at least {} before any cache (runtime {}, resident weights {}, KV cache and activations {}, I/O and compute buffers {}); raise --memory, or lower -c / -b",
                mib(inputs.budget),
                mib(fixed),
                mib(plan.runtime),
                mib(plan.resident_weights),
                mib(plan.kv_and_scratch),
                mib(plan.buffers)
            )));
        }
        let total_cols = index.column_bytes();
        let policy = opts.policy;
        let cache_budget = if policy == Policy::None { 0 } else { inputs.budget - fixed };
        let fractions = split_cache(&index, cache_budget, opts.split);
        // Slots per op, and the arena layout.
        let mut ops = Vec::with_capacity(c.n_layer);
        let mut base = 0usize;
        let mut cache_bytes = 0u64;
        for lc in &index.layers {
            let mut per = Vec::with_capacity(7);
            for t in &lc.ops {
                let slots = ((t.n_in as f64 * fractions[t.op as usize]).floor() as usize).min(t.n_in);
                per.push(OpCache {
                    cache: UnitCache::new(t.n_in, slots, policy),
                    col_bytes: t.col_bytes,
                    n_units: t.n_in,
                    base,
                    file_off: t.offset,
                });
                base += slots * t.col_bytes;
                cache_bytes += (slots * t.col_bytes) as u64;
            }
            ops.push(per);
        }
        plan.cache = cache_bytes;
        plan.cache_fraction = cache_bytes as f64 / total_cols.max(1) as f64;
        let transient_start = base.div_ceil(64) * 64;
        // A simulation keeps no bytes.
        let arena = if sim { Vec::new() } else { vec![0u8; transient_start + transient] };
        let embd_on_disk = !is_resident(&model.file.gguf, "token_embd.weight", opts.resident_embeddings);
        let embd = embd_on_disk.then(|| (model.tok_embd.clone(), index.gguf_offset));
        Ok(TieredStore {
            path: path.into(),
            io,
            arena,
            transient: transient_start..transient_start + transient,
            ops,
            policy,
            split: opts.split,
            prefetch: CrossLayerPrefetcher::new(model, opts.preload, opts.margin, interleaved, preload_buf),
            ondemand: Some(AlignedBuf::new(ONDEMAND_BUF)),
            idx: Vec::new(),
            misses: Vec::new(),
            hits: Vec::new(),
            prefill: Some(AlignedBuf::new(prefill)),
            prefill_layer: None,
            embd,
            embd_buf: Some(AlignedBuf::new(2 * 4096 + model.tok_embd.row_bytes.div_ceil(4096) * 4096)),
            stats: TierStats::default(),
            index,
            plan,
        })
    }

    pub fn stats(&self) -> &TierStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = TierStats::default();
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn preload_layers(&self) -> usize {
        self.prefetch.group()
    }

    pub fn tier_name(&self) -> &'static str {
        match &self.io {
            Io::Real(l) => l.tier_name(),
            Io::Sim(_) => "simulated",
        }
    }

    /// Bytes the cache arena holds now (slots and transient area; 0 when simulated).
    pub fn arena_bytes(&self) -> usize {
        self.arena.capacity()
    }

    /// A simulated store's clock (nanoseconds since it was built); 0 for a real one.
    pub fn sim_now(&self) -> f64 {
        match &self.io {
            Io::Real(_) => 0.0,
            Io::Sim(s) => s.now,
        }
    }

    /// A simulated store: `ns` of compute pass on its clock (reads in flight go on meanwhile).
    pub fn sim_advance(&mut self, ns: f64) {
        if let Io::Sim(s) = &mut self.io {
            s.advance(ns);
        }
    }

    /// Whether this store is simulated ([`TieredStore::simulated`]).
    pub fn is_simulated(&self) -> bool {
        matches!(self.io, Io::Sim(_))
    }

    /// Gives (layer, op)'s cache the active lists of all its future fetches (Belady's policy,
    /// simulation only).
    pub fn set_future(&mut self, layer: usize, op: OpKind, steps: Vec<Vec<u32>>) {
        self.ops[layer][op as usize].cache.set_future(steps);
    }

    /// Whether preloads read the pack's interleaved cross-layer records.
    pub fn interleaved(&self) -> bool {
        self.prefetch.interleaved()
    }

    /// Slots and occupied slots of (layer, op).
    pub fn occupancy(&self, layer: usize, op: OpKind) -> (usize, usize) {
        let c = &self.ops[layer][op as usize].cache;
        (c.slots(), c.len())
    }

    /// Which columns of (layer, op) are in the cache, as a mask over its units (into `out`).
    pub fn cached_mask(&self, layer: usize, op: OpKind, out: &mut Vec<bool>) {
        let c = &self.ops[layer][op as usize].cache;
        out.clear();
        out.extend((0..c.n_units() as u32).map(|u| c.contains(u)));
    }

    /// The columns of (layer, op) in the cache, ascending.
    pub fn cached_units(&self, layer: usize, op: OpKind) -> Vec<u32> {
        let c = &self.ops[layer][op as usize].cache;
        (0..c.n_units() as u32).filter(|&u| c.contains(u)).collect()
    }

    /// A new conversation: context-level counters restart (cached columns stay).
    pub fn reset_context(&mut self) {
        for per in &mut self.ops {
            for oc in per {
                oc.cache.reset_context();
            }
        }
        self.prefetch.reset(&mut self.io);
    }

    /// Changes the memory budget of a running store (a live budget change): the cache gets what
    /// the new budget leaves after the fixed part of the plan, shared as at start; each (layer,
    /// op) cache shrinks (evicting the policy's worst columns) or grows, and the arena is
    /// compacted in place and reallocated to its new size, so the memory is returned to the OS
    /// before this returns. Cached columns that stay keep their bytes, and the products do not
    /// depend on where columns sit, so the text a run generates does not change. Returns the new
    /// plan; a budget below the fixed part is refused and nothing changes.
    pub fn set_budget(&mut self, budget: u64) -> Result<&MemoryPlan, TierError> {
        let fixed = self.plan.fixed();
        if budget < fixed {
            return Err(TierError::Budget(format!(
                "--memory {} is too small for this run: it needs at least {} before any cache; the budget stays {}",
                mib(budget),
                mib(fixed),
                mib(self.plan.budget)
            )));
        }
        let cache_budget = if self.policy == Policy::None { 0 } else { budget - fixed };
        let fractions = split_cache(&self.index, cache_budget, self.split);
        let sim = self.is_simulated();
        // New slot counts and bases.
        let mut new_base = Vec::with_capacity(self.ops.len() * 7);
        let mut base = 0usize;
        let mut cache_bytes = 0u64;
        for (l, per) in self.ops.iter().enumerate() {
            for (o, oc) in per.iter().enumerate() {
                let t = &self.index.layers[l].ops[o];
                let slots = ((t.n_in as f64 * fractions[t.op as usize]).floor() as usize).min(t.n_in);
                let slots = if self.policy == Policy::None { 0 } else { slots };
                new_base.push((base, slots));
                base += slots * oc.col_bytes;
                cache_bytes += (slots * oc.col_bytes) as u64;
            }
        }
        let transient_len = self.transient.len();
        let transient_start = base.div_ceil(64) * 64;
        let new_len = transient_start + transient_len;
        // Resize every cache; remember where each kept unit's bytes are now (old slot).
        let mut keep: Vec<Vec<(u32, u32)>> = Vec::with_capacity(new_base.len()); // (old slot, new slot)
        for per in self.ops.iter_mut() {
            for oc in per.iter_mut() {
                let (_, slots) = new_base[keep.len()];
                let r = oc.cache.resize(slots);
                let moved: std::collections::HashMap<u32, u32> =
                    r.moved.iter().map(|&(u, from, _)| (u, from)).collect();
                let mut pairs: Vec<(u32, u32)> =
                    oc.cache.cached().map(|(u, slot)| (moved.get(&u).copied().unwrap_or(slot), slot)).collect();
                pairs.sort_unstable_by_key(|p| p.1);
                keep.push(pairs);
            }
        }
        if !sim {
            let grow = new_len > self.arena.len();
            if grow {
                self.arena.resize(new_len, 0);
            }
            // Shrinking: new bases and slots never lie above the old ones, so copying ops in
            // ascending order (and slots ascending) never overwrites bytes still to be moved;
            // growing: the mirror image, descending.
            let mut order: Vec<usize> = (0..keep.len()).collect();
            if grow {
                order.reverse();
            }
            for i in order {
                let (l, o) = (i / 7, i % 7);
                let oc = &self.ops[l][o];
                let cb = oc.col_bytes;
                let (nb, _) = new_base[i];
                let mut pairs = keep[i].clone();
                if grow {
                    pairs.reverse();
                }
                for (from, to) in pairs {
                    let src = oc.base + from as usize * cb;
                    let dst = nb + to as usize * cb;
                    if src != dst {
                        self.arena.copy_within(src..src + cb, dst);
                    }
                }
            }
            if !grow {
                self.arena.truncate(new_len);
                self.arena.shrink_to_fit();
            }
        }
        for (i, (nb, _)) in new_base.iter().enumerate() {
            self.ops[i / 7][i % 7].base = *nb;
        }
        self.transient = transient_start..transient_start + transient_len;
        self.plan.budget = budget;
        self.plan.cache = cache_bytes;
        self.plan.cache_fraction = cache_bytes as f64 / self.index.column_bytes().max(1) as f64;
        Ok(&self.plan)
    }

    /// Pins a hot set per (layer, op) (`static` policy; a warm start for the others).
    pub fn set_hot(&mut self, layer: usize, op: OpKind, ranking: &[u32]) -> Result<(), TierError> {
        let oc = &mut self.ops[layer][op as usize];
        oc.cache.set_hot(ranking).map_err(|e| {
            TierError::Unsupported(format!(
                "hot ranking for layer {layer} {op:?}: {e}; a ranking from a calibration must come from this model (re-run `sift calibrate` on it)"
            ))
        })?;
        // Read the pinned columns now.
        let mut units: Vec<u32> = (0..oc.n_units as u32).filter(|&u| oc.cache.contains(u)).collect();
        units.sort_unstable();
        let ranges: Vec<(u64, usize)> =
            units.iter().map(|&u| (oc.file_off + u as u64 * oc.col_bytes as u64, oc.col_bytes)).collect();
        let dests: Vec<usize> =
            units.iter().map(|&u| oc.base + oc.cache.slot_of(u).expect("pinned") as usize * oc.col_bytes).collect();
        self.read_into_arena(&ranges, &dests, false)
    }

    /// Reads the token-embedding row `id` (when the table stays on disk) into `out` as f32.
    /// Returns false when the table is resident (the caller reads it from the model).
    pub fn embedding_row(&mut self, id: usize, out: &mut [f32]) -> Result<bool, TierError> {
        let Some((t, gguf_off)) = self.embd.clone() else {
            return Ok(false);
        };
        let start = gguf_off + t.range.start as u64 + (id * t.row_bytes) as u64;
        let aligned = start / 4096 * 4096;
        let skip = (start - aligned) as usize;
        let len = (skip + t.row_bytes).div_ceil(4096) * 4096;
        // A buffer lost to a panic elsewhere is replaced, never expected.
        let buf = self.embd_buf.take().unwrap_or_else(|| AlignedBuf::new(len));
        let (done, stall) =
            self.io.read_now(buf, vec![ReadReq { offset: aligned, len, buf_offset: 0, need: skip + t.row_bytes }]);
        account(&mut self.stats, &done, stall, Kind::OnDemand, 1);
        let LoadDone { buf, result, .. } = done;
        let r = result.map(|()| t.ty.dequantize_row(&buf[skip..skip + t.row_bytes], out));
        self.embd_buf = Some(buf);
        r.map_err(|source| TierError::Io { path: self.path.clone(), source })?;
        Ok(true)
    }

    /// Reads layer `l`'s weights (the GGUF rows of its seven ops, exact) for a prompt batch into
    /// the store's prefill buffer; [`TieredStore::prefill_view`] then gives them to the kernels.
    pub fn prefill_layer(&mut self, model: &Model, l: usize) -> Result<(), TierError> {
        let lw = &model.layers[l];
        let span = layer_span(lw);
        let file_start = self.index.gguf_offset + span.start as u64;
        let aligned = file_start / 4096 * 4096;
        let skip = (file_start - aligned) as usize;
        let len = (skip + span.len()).div_ceil(4096) * 4096;
        self.prefill_layer = None;
        let buf = self.prefill.take().unwrap_or_else(|| AlignedBuf::new(len));
        let (done, stall) =
            self.io.read_now(buf, vec![ReadReq { offset: aligned, len, buf_offset: 0, need: skip + span.len() }]);
        account(&mut self.stats, &done, stall, Kind::Prefill, 1);
        let LoadDone { buf, result, .. } = done;
        if let Err(source) = result {
            self.prefill = Some(buf);
            return Err(TierError::Io { path: self.path.clone(), source });
        }
        let shift = |t: &QTensor| {
            let mut t = t.clone();
            let start = t.range.start - span.start + skip;
            t.range = start..start + (t.range.end - t.range.start);
            t
        };
        let mut rebased = lw.clone();
        for t in [
            &mut rebased.wq,
            &mut rebased.wk,
            &mut rebased.wv,
            &mut rebased.wo,
            &mut rebased.w_gate,
            &mut rebased.w_up,
            &mut rebased.w_down,
        ] {
            *t = shift(t);
        }
        self.prefill = Some(buf);
        self.prefill_layer = Some((l, rebased));
        Ok(())
    }

    /// Called at the start of layer `l` of a decoded token with the residual entering it: the
    /// cross-layer prefetcher may start reading the next group's columns.
    pub fn begin_layer(&mut self, l: usize, x: &[f32]) {
        self.prefetch.begin_layer(l, x, &mut self.io, &self.ops, &self.index);
    }

    /// The bytes and rebased weights of layer `l` read by the last [`TieredStore::prefill_layer`]
    /// (`None` when that was another layer, or the read failed).
    pub fn prefill_view(&self, l: usize) -> Option<(&[u8], &sift_model::LayerWeights)> {
        match (&self.prefill, &self.prefill_layer) {
            (Some(buf), Some((pl, lw))) if *pl == l => Some((&buf[..], lw)),
            _ => None,
        }
    }

    /// Makes the columns `active` (ascending) of each op in `ops` of `layer` available to the
    /// kernels, and returns where they are: per op, the arena slice and each active unit's
    /// column index in it.
    pub fn fetch(&mut self, layer: usize, ops: &[OpKind], active: &[u32]) -> Result<Fetched<'_>, TierError> {
        let site = match ops[0] {
            OpKind::Q | OpKind::K | OpKind::V => Some(0),
            OpKind::Gate | OpKind::Up => Some(1),
            _ => None,
        };
        if let Some(s) = site {
            self.prefetch.note_active(layer, s, active.len());
        }
        let pre = match site {
            Some(_) => self
                .prefetch
                .ready(layer, &mut self.io, &mut self.stats)
                .map_err(|source| TierError::Io { path: self.path.clone(), source })?,
            None => None,
        };
        self.idx.resize_with(ops.len(), Vec::new);
        let mut cursor = self.transient.start;
        // Reads this site needs: (file offset, len) and where each lands in the arena.
        let mut ranges: Vec<(u64, usize)> = Vec::new();
        let mut dests: Vec<usize> = Vec::new();
        let mut preload_copied = 0usize;
        for (k, &op) in ops.iter().enumerate() {
            let oc = &mut self.ops[layer][op as usize];
            oc.cache
                .record(active)
                .map_err(|e| TierError::Unsupported(format!("fetch of layer {layer} {op:?}: {e}")))?;
            self.hits.clear();
            self.misses.clear();
            for &u in active {
                if oc.cache.contains(u) {
                    self.hits.push(u);
                } else {
                    self.misses.push(u);
                }
            }
            self.stats.hits += self.hits.len() as u64;
            self.stats.misses += self.misses.len() as u64;
            let slots = oc
                .cache
                .admit(&self.misses, &self.hits)
                .map_err(|e| TierError::Unsupported(format!("fetch of layer {layer} {op:?}: {e}")))?;
            // Transient indices start at the first multiple of col_bytes past the cursor.
            let cb = oc.col_bytes;
            let t0 = (cursor - oc.base).div_ceil(cb);
            let mut t_next = t0;
            let mut slot_of_miss = Vec::with_capacity(self.misses.len());
            for (&u, &s) in self.misses.iter().zip(&slots) {
                let i = if s == NO_SLOT {
                    t_next += 1;
                    (t_next - 1) as u32
                } else {
                    s
                };
                slot_of_miss.push((u, i));
            }
            cursor = oc.base + t_next * cb;
            assert!(cursor <= self.transient.end, "transient area sized for the largest site");
            // Kernel indices in `active` order.
            let idx = &mut self.idx[k];
            idx.clear();
            let mut mi = 0;
            for &u in active {
                if mi < slot_of_miss.len() && slot_of_miss[mi].0 == u {
                    idx.push(slot_of_miss[mi].1);
                    mi += 1;
                } else {
                    idx.push(oc.cache.slot_of(u).expect("hit is cached"));
                }
            }
            // Fill the misses: from the preload buffer when it has them, else from disk.
            let pre = pre.filter(|_| CrossLayerPrefetcher::covers(op));
            if pre.is_some() {
                self.stats.preload_misses += slot_of_miss.len() as u64;
            }
            for &(u, i) in &slot_of_miss {
                let dst = oc.base + i as usize * cb;
                if let Some(ready) = pre {
                    if let Some(at) = self.prefetch.offset(ready, layer, op, u) {
                        if let Io::Real(_) = self.io {
                            let src = &self.prefetch.buffer(ready)[at..at + cb];
                            self.arena[dst..dst + cb].copy_from_slice(src);
                        } else {
                            preload_copied += cb;
                        }
                        self.stats.preload_hits += 1;
                        self.stats.preload_used += 1;
                        continue;
                    }
                }
                ranges.push((oc.file_off + u as u64 * cb as u64, cb));
                dests.push(dst);
            }
        }
        if preload_copied > 0 {
            self.io.simulated_copy(preload_copied);
        }
        if !ranges.is_empty() {
            self.read_into_arena(&ranges, &dests, true)?;
        }
        let bases = ops.iter().map(|&op| self.ops[layer][op as usize].base).collect();
        Ok(Fetched { arena: &self.arena, bases, idx: &self.idx })
    }

    /// Reads `ranges` (file offset, len) into the arena at `dests`, on demand (waiting).
    fn read_into_arena(&mut self, ranges: &[(u64, usize)], dests: &[usize], ondemand: bool) -> Result<(), TierError> {
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| ranges[i].0);
        let mut start = 0;
        while start < order.len() {
            // As many ranges as fit in the on-demand buffer.
            let mut end = start;
            let mut bytes = 0;
            // Worst case a range costs its length, a merged gap and two alignment pages.
            let cost = |len: usize| len + MAX_GAP + 2 * 4096;
            while end < order.len() && (end == start || bytes + cost(ranges[order[end]].1) <= ONDEMAND_BUF) {
                bytes += cost(ranges[order[end]].1);
                end += 1;
            }
            let batch: Vec<(u64, usize)> = order[start..end].iter().map(|&i| ranges[i]).collect();
            let (reqs, starts, need) = plan_reads(&batch, MAX_GAP, MAX_READ);
            let buf = match self.ondemand.take() {
                Some(buf) if buf.len() >= need => buf,
                _ => AlignedBuf::new(need.max(ONDEMAND_BUF)),
            };
            let n_reqs = reqs.len() as u64;
            let (done, stall) = self.io.read_now(buf, reqs);
            account(&mut self.stats, &done, stall, if ondemand { Kind::OnDemand } else { Kind::Prefill }, n_reqs);
            let LoadDone { buf, result, .. } = done;
            if let Err(source) = result {
                self.ondemand = Some(buf);
                return Err(TierError::Io { path: self.path.clone(), source });
            }
            let bytes: usize = order[start..end].iter().map(|&i| ranges[i].1).sum();
            if !self.io.simulated_copy(bytes) {
                for (k, &i) in order[start..end].iter().enumerate() {
                    let (d, len) = (dests[i], ranges[i].1);
                    self.arena[d..d + len].copy_from_slice(&buf[starts[k]..starts[k] + len]);
                }
            }
            self.ondemand = Some(buf);
            start = end;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Preload,
    OnDemand,
    Prefill,
}

/// Plans reads of `ranges` (sorted) that fit in `cap` bytes, dropping the last ranges if needed.
pub(crate) fn plan_within(ranges: &mut Vec<(u64, usize)>, cap: usize) -> Option<(Vec<ReadReq>, Vec<usize>)> {
    loop {
        if ranges.is_empty() {
            return None;
        }
        let (reqs, starts, need) = plan_reads(ranges, MAX_GAP, MAX_READ);
        if need <= cap {
            return Some((reqs, starts));
        }
        let keep = ranges.len() * 3 / 4;
        ranges.truncate(keep);
    }
}

/// The byte range of the GGUF section covering a layer's seven linear ops.
fn layer_span(lw: &sift_model::LayerWeights) -> Range<usize> {
    let ts = [&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down];
    let start = ts.iter().map(|t| t.range.start).min().unwrap_or(0);
    let end = ts.iter().map(|t| t.range.end).max().unwrap_or(0);
    start..end
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}

/// Counts a finished read job in `stats`: the stall, the loader's busy time, the requests and
/// the bytes by kind.
pub(crate) fn account(stats: &mut TierStats, done: &LoadDone, stall_ns: u64, kind: Kind, n_reqs: u64) {
    stats.stall_ns += stall_ns;
    stats.io_ns += done.busy_ns;
    stats.reads += n_reqs.max(1);
    match kind {
        Kind::Preload => stats.bytes_preload += done.bytes,
        Kind::OnDemand => stats.bytes_ondemand += done.bytes,
        Kind::Prefill => stats.bytes_prefill += done.bytes,
    }
}
