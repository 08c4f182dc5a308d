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
//!
//! The slow tier is a [`TierIo`]: the [`Loader`] thread over the pack
//! ([`TieredStore::new`]), or a simulated device ([`TieredStore::simulated`]), which moves no
//! bytes and keeps a virtual clock; the store's code is the same for both.
//!
//! Modules: the plan of a budgeted run, [`TieredOptions`] and [`MemoryPlan`] (`plan`); opening a
//! pack for one, [`open_budgeted`] (`open`); the counters, [`TierStats`] (`stats`); a site's
//! on-demand reads streamed in parts (`ondemand`); the adaptive-TAM feed (`lambda`); the resident
//! scale planes (`scales`); the interface the rest of sift uses, [`MemoryTier`] (`memory`); this
//! module, the store itself.

mod lambda;
mod memory;
mod ondemand;
mod open;
mod plan;
mod scales;
mod stats;

pub use crate::simulated::IoCost;
pub use memory::{MemoryTier, TierSettings};
pub use open::{open_budgeted, open_budgeted_checked};
pub use plan::{
    is_resident, resident_bytes, split_cache, CacheSplit, MemoryPlan, PlanInputs, TieredOptions, BUDGET_MAX_BATCH,
};
pub use stats::TierStats;
pub(crate) use stats::{account, Kind};

use crate::cache::{Policy, UnitCache, NO_SLOT};
use crate::io::{
    open_slow_tier, plan_reads, AlignedBuf, LoadDone, Loader, PackAndSource, ReadReq, ReadShape, TierIo, DIRECT_ALIGN,
};
use crate::prefetch::CrossLayerPrefetcher;
use crate::simulated::SimIo;
use lambda::LambdaFeed;
use ondemand::{cut_parts, whole, ColumnRead, OnDemandReads, IN_FLIGHT, JOB_BUF};
use plan::{mib, ArenaLayout, Buffers};
use scales::{read_scales, OpRanges};
use sift_model::layout::{OpKind, PackIndex, UnitPositions};
use sift_model::{Model, QTensor};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Reads closer than this are merged (the gap is read and thrown away). Fewer, larger requests
/// outweigh the extra bytes on the development VM's disk: 16 KiB against the former 4 KiB gave
/// +8-9 % decode tok/s at 60 % of both Qwen2.5 models (amplification 1.61 → 1.92, requests 2.6×
/// fewer; 32 and 64 KiB no clearer gain; docs/benchmarks.md, issue 16 step 3).
const MAX_GAP: usize = 16 << 10;
/// Largest single read.
const MAX_READ: usize = 1 << 20;

/// How the store cuts its reads on `io`: at the tier's alignment, gaps up to [`MAX_GAP`] read
/// through, reads up to [`MAX_READ`].
pub(crate) fn read_shape(io: &dyn TierIo) -> ReadShape {
    ReadShape::paged(MAX_GAP, MAX_READ).aligned(io.read_align())
}
/// Bytes of the buffers on-demand reads land in: [`IN_FLIGHT`] jobs at once.
const ONDEMAND_BUF: usize = IN_FLIGHT * JOB_BUF;

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

/// One (layer, op)'s cache: the policy's bookkeeping and where its slots sit in the arena.
pub(crate) struct OpCache {
    pub(crate) cache: UnitCache,
    pub(crate) col_bytes: usize,
    n_units: usize,
    /// Byte offset of slot 0 in the arena.
    base: usize,
    /// Byte offset of the op's column tensor in the pack.
    file_off: u64,
    /// Where each unit's column lies in the tensor, when its site has a unit order of its own.
    positions: Option<UnitPositions>,
}

impl OpCache {
    /// Byte offset in the pack of unit `u`'s column.
    pub(crate) fn column_offset(&self, u: u32) -> u64 {
        let p = self.positions.as_ref().map_or(u, |p| p[u as usize]);
        self.file_off + p as u64 * self.col_bytes as u64
    }
}

/// The columns one [`TieredStore::fetch`] made available, per op in the order asked.
pub struct Fetched<'a> {
    /// How many of the units asked for (a prefix) these are: a site whose missing columns do not
    /// fit the transient area at once is fetched, and computed, in parts.
    pub taken: usize,
    arena: &'a [u8],
    /// Per op: the byte offset of its slot 0 in the arena.
    bases: Vec<usize>,
    /// Per op: each active unit's column index, counted from the op's base, for the prefix the
    /// site's fetch took; this part is `units` of it.
    idx: &'a [Vec<u32>],
    units: Range<usize>,
    /// Per op: its scale plane (empty for re-quantized columns).
    scales: Vec<&'a [u8]>,
}

impl<'a> Fetched<'a> {
    /// The `k`-th op's columns: the arena from the op's base, each active unit's column in it,
    /// and the op's scale plane.
    pub fn op(&self, k: usize) -> (&'a [u8], &'a [u32], &'a [u8]) {
        (&self.arena[self.bases[k]..], &self.idx[k][self.units.clone()], self.scales[k])
    }
}

/// The column store for a model run under a memory budget.
pub struct TieredStore {
    path: PathBuf,
    /// The slow tier.
    io: Box<dyn TierIo>,
    /// Cache slots, then the transient area (empty when the tier moves no bytes).
    arena: Vec<u8>,
    /// Every op's scale plane (exact columns), resident; per (layer, op) its range in here.
    scales: Vec<u8>,
    scale_ranges: OpRanges,
    /// The transient area's byte range in the arena.
    transient: Range<usize>,
    /// Per layer, per op (q, k, v, o, gate, up, down).
    ops: Vec<Vec<OpCache>>,
    index: PackIndex,
    policy: Policy,
    split: CacheSplit,
    prefetch: CrossLayerPrefetcher,
    /// The current site's on-demand reads, streamed in parts.
    ondemand: OnDemandReads,
    /// Reads that failed where no caller could be told (see [`TieredStore::reset_context`]):
    /// the next fetch reports it.
    failed: Option<std::io::Error>,
    /// Adaptive TAM's λ controller and its measurement of each layer.
    lambda: Option<LambdaFeed>,
    /// Kernel indices of the ops of the current site (index into the arena from each op's base).
    idx: Vec<Vec<u32>>,
    /// Scratch for one op's fetch.
    misses: Vec<u32>,
    hits: Vec<u32>,
    /// The buffer a prompt batch's rows stream through, a chunk of rows at a time.
    prefill: Option<AlignedBuf>,
    embd: Option<(QTensor, u64)>,
    embd_buf: Option<AlignedBuf>,
    stats: TierStats,
    pub plan: MemoryPlan,
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
        let pack = open_slow_tier(path, opts.tier).map_err(|source| TierError::Io { path: path.into(), source })?;
        let src = model.file.path();
        let source = open_slow_tier(src, opts.tier).map_err(|source| TierError::Io { path: src.into(), source })?;
        let tier = Box::new(PackAndSource::new(pack, source, index.gguf_offset));
        TieredStore::build(model, path, opts, inputs, index, Box::new(Loader::spawn(tier)))
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
        TieredStore::build(model, path, opts, inputs, index, Box::new(SimIo::new(cost)))
    }

    fn build(
        model: &Model,
        path: &Path,
        opts: &TieredOptions,
        inputs: &PlanInputs,
        index: PackIndex,
        io: Box<dyn TierIo>,
    ) -> Result<TieredStore, TierError> {
        let interleaved = opts.preload > 0 && index.group_size() == opts.preload;
        let buffers = Buffers::new(model, &index, opts, inputs.budget);
        let mut plan =
            MemoryPlan::without_cache(model, opts, inputs, &buffers, index.scale_bytes() + index.position_bytes())?;
        let policy = opts.policy;
        let cache_budget = if policy == Policy::None { 0 } else { inputs.budget - plan.fixed() };
        // Slots per op, and the arena layout.
        let layout = ArenaLayout::new(&index, cache_budget, opts.split);
        plan.cache_entries = layout.index_bytes();
        let mut slots = layout.ops.iter();
        let ops: Vec<Vec<OpCache>> = index
            .layers
            .iter()
            .map(|lc| {
                lc.ops
                    .iter()
                    .zip(&mut slots)
                    .map(|(t, &(base, slots))| OpCache {
                        cache: UnitCache::new(t.n_in, slots, policy),
                        col_bytes: t.col_bytes,
                        n_units: t.n_in,
                        base,
                        file_off: t.offset,
                        positions: lc.positions(t.op).cloned(),
                    })
                    .collect()
            })
            .collect();
        plan.set_cache(layout.cache_bytes, index.column_bytes());
        let (transient_start, transient) = (layout.transient_start, buffers.transient);
        // A tier that moves no bytes (a simulation) needs no arena and no scales.
        let arena = if io.moves_bytes() { vec![0u8; transient_start + transient] } else { Vec::new() };
        let (scales, scale_ranges) = read_scales(path, &index, io.moves_bytes())?;
        let embd_on_disk = !is_resident(&model.file.gguf, "token_embd.weight", opts.resident_embeddings);
        let embd = embd_on_disk.then(|| (model.tok_embd.clone(), index.gguf_offset));
        Ok(TieredStore {
            path: path.into(),
            io,
            arena,
            scales,
            scale_ranges,
            transient: transient_start..transient_start + transient,
            ops,
            policy,
            split: opts.split,
            prefetch: CrossLayerPrefetcher::new(model, opts.preload, opts.margin, interleaved, buffers.preload),
            ondemand: OnDemandReads::new(),
            failed: None,
            lambda: LambdaFeed::new(policy, index.layers.len()),
            idx: Vec::new(),
            misses: Vec::new(),
            hits: Vec::new(),
            prefill: Some(AlignedBuf::new(buffers.prefill)),
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

    /// Adaptive TAM: λ per layer and step as the controller moved it (oldest first); empty for
    /// other policies.
    pub fn lambda_history(&self) -> Vec<sift_cache::LambdaStep> {
        self.lambda.as_ref().map(|f| f.history()).unwrap_or_default()
    }

    pub fn preload_layers(&self) -> usize {
        self.prefetch.group()
    }

    /// The slow tier's name for reports (`"io_uring"`, `"pread"`, `"memory"`, `"simulated"`).
    pub fn tier_name(&self) -> &'static str {
        self.io.name()
    }

    /// Bytes the cache arena holds now (slots and transient area; 0 when simulated).
    pub fn arena_bytes(&self) -> usize {
        self.arena.capacity()
    }

    /// A simulated store's clock (nanoseconds since it was built); 0 for a real one.
    pub fn sim_now(&self) -> f64 {
        self.io.clock_ns().unwrap_or(0.0)
    }

    /// A simulated store: `ns` of compute pass on its clock (reads in flight go on meanwhile).
    pub fn sim_advance(&mut self, ns: f64) {
        self.io.advance(ns);
    }

    /// Whether this store is simulated ([`TieredStore::simulated`]).
    pub fn is_simulated(&self) -> bool {
        self.io.clock_ns().is_some()
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
        if let Err(e) = self.ondemand.finish(self.io.as_mut(), &mut self.arena, &mut self.stats) {
            self.failed = Some(e);
        }
        if let Some(f) = self.lambda.as_mut() {
            f.reset();
        }
        for per in &mut self.ops {
            for oc in per {
                oc.cache.reset_context();
            }
        }
        self.prefetch.reset(self.io.as_mut());
    }

    /// Changes the memory budget of a running store (a live budget change): the cache gets what
    /// the new budget leaves after the fixed part of the plan, shared as at start; each (layer,
    /// op) cache shrinks (evicting the policy's worst columns) or grows, and the arena is
    /// compacted in place and reallocated to its new size, so the memory is returned to the OS
    /// before this returns. Cached columns that stay keep their bytes, and the products do not
    /// depend on where columns sit, so the text a run generates does not change. Returns the new
    /// plan; a budget below the fixed part is refused and nothing changes.
    pub fn set_budget(&mut self, budget: u64) -> Result<&MemoryPlan, TierError> {
        self.finish_reads()?;
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
        // New slot counts and bases.
        let layout = ArenaLayout::new(&self.index, cache_budget, self.split);
        let index_bytes = layout.index_bytes();
        let ArenaLayout { ops: new_base, cache_bytes, transient_start, .. } = layout;
        let transient_len = self.transient.len();
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
        // A tier that moves no bytes keeps no arena.
        if self.io.moves_bytes() {
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
        self.plan.cache_entries = index_bytes;
        self.plan.set_cache(cache_bytes, self.index.column_bytes());
        Ok(&self.plan)
    }

    /// The KV cache has grown by `bytes` since the start of its sequence (0: a new sequence):
    /// the cache gives that room up (or takes it back) as a budget change would, the budget
    /// staying the same. When the cache cannot give it up (the fixed part would pass the budget)
    /// nothing changes and the error says so.
    pub fn set_kv_growth(&mut self, bytes: u64) -> Result<&MemoryPlan, TierError> {
        let old = self.plan.kv_growth;
        if old == bytes {
            return Ok(&self.plan);
        }
        self.plan.kv_growth = bytes;
        let budget = self.plan.budget;
        if let Err(e) = self.set_budget(budget) {
            self.plan.kv_growth = old;
            return Err(e);
        }
        Ok(&self.plan)
    }

    /// Pins a hot set per (layer, op) (`static` policy; a warm start for the others).
    pub fn set_hot(&mut self, layer: usize, op: OpKind, ranking: &[u32]) -> Result<(), TierError> {
        self.finish_reads()?;
        let oc = &mut self.ops[layer][op as usize];
        oc.cache.set_hot(ranking).map_err(|e| {
            TierError::Unsupported(format!(
                "hot ranking for layer {layer} {op:?}: {e}; a ranking from a calibration must come from this model (re-run `sift calibrate` on it)"
            ))
        })?;
        // Read the pinned columns now.
        let mut units: Vec<u32> = (0..oc.n_units as u32).filter(|&u| oc.cache.contains(u)).collect();
        units.sort_unstable();
        let ranges: Vec<(u64, usize)> = units.iter().map(|&u| (oc.column_offset(u), oc.col_bytes)).collect();
        let dests: Vec<usize> =
            units.iter().map(|&u| oc.base + oc.cache.slot_of(u).expect("pinned") as usize * oc.col_bytes).collect();
        self.read_into_arena(&ranges, &dests)
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

    /// Rows of `w` (one of the streamed tensors of the source GGUF) that one chunk of a prompt
    /// batch's weights holds: as many as fit the prefill buffer, at least one.
    pub fn prefill_rows_per_chunk(&self, w: &QTensor) -> usize {
        let room = self.prefill.as_ref().map_or(0, |b| b.len()).saturating_sub(2 * 4096);
        (room / w.row_bytes.max(1)).clamp(1, w.rows.max(1))
    }

    /// Reads rows `rows` of `w` (exact GGUF rows) for a prompt batch into the prefill buffer;
    /// returns the buffer and `w` narrowed to those rows and rebased into it, for the kernels.
    pub fn prefill_rows(&mut self, w: &QTensor, rows: Range<usize>) -> Result<(&[u8], QTensor), TierError> {
        let rows = rows.start.min(w.rows)..rows.end.min(w.rows);
        let span = w.range.start + rows.start * w.row_bytes..w.range.start + rows.end * w.row_bytes;
        let file_start = self.index.gguf_offset + span.start as u64;
        let aligned = file_start / 4096 * 4096;
        let skip = (file_start - aligned) as usize;
        let len = (skip + span.len()).div_ceil(4096) * 4096;
        let buf = match self.prefill.take() {
            Some(buf) if buf.len() >= len => buf,
            _ => AlignedBuf::new(len),
        };
        let (done, stall) =
            self.io.read_now(buf, vec![ReadReq { offset: aligned, len, buf_offset: 0, need: skip + span.len() }]);
        account(&mut self.stats, &done, stall, Kind::Prefill, 1);
        let LoadDone { buf, result, .. } = done;
        self.prefill = Some(buf);
        result.map_err(|source| TierError::Io { path: self.path.clone(), source })?;
        let mut part = w.clone();
        part.rows = rows.len();
        part.range = skip..skip + span.len();
        Ok((&self.prefill.as_ref().expect("just put back")[..], part))
    }

    /// Called at the start of layer `l` of a decoded token with the residual entering it: the
    /// cross-layer prefetcher may start reading the next group's columns.
    pub fn begin_layer(&mut self, l: usize, x: &[f32]) {
        if let Some(f) = self.lambda.as_mut() {
            let now = self.io.clock_ns().unwrap_or_else(|| f.wall_ns());
            for (layer, lambda) in f.begin_layer(l, now, self.stats.stall_ns) {
                for oc in &mut self.ops[layer] {
                    oc.cache.set_lambda(lambda);
                }
            }
        }
        self.prefetch.begin_layer(l, x, self.io.as_mut(), &self.ops, &self.index);
    }

    /// Makes the columns of `active` (ascending) of each op in `ops` of `layer` available to the
    /// kernels, and returns where they are: per op, the arena slice and each active unit's
    /// column index in it. Covers the longest prefix of `active` whose missing columns fit the
    /// transient area ([`Fetched::taken`]), cut at a multiple of `align` units (the kernels'
    /// piece, so that parts add up to the same bits as the whole); the caller computes it and
    /// fetches the rest.
    pub fn fetch(
        &mut self,
        layer: usize,
        ops: &[OpKind],
        active: &[u32],
        align: usize,
    ) -> Result<Fetched<'_>, TierError> {
        if let Some(source) = self.failed.take() {
            return Err(TierError::Io { path: self.path.clone(), source });
        }
        if !self.ondemand.continues(layer, ops, active) {
            self.finish_reads()?;
            self.start_site(layer, ops, active, align)?;
        }
        let units = match self.ondemand.serve(self.io.as_mut(), &mut self.arena, &mut self.stats) {
            Some(r) => r.map_err(|source| TierError::Io { path: self.path.clone(), source })?,
            None => unreachable!("a site was just started"),
        };
        let bases = ops.iter().map(|&op| self.ops[layer][op as usize].base).collect();
        let scales = ops.iter().map(|&op| &self.scales[self.scale_ranges[layer][op as usize].clone()]).collect();
        Ok(Fetched { taken: units.len(), arena: &self.arena, bases, idx: &self.idx, units, scales })
    }

    /// Waits for the on-demand reads still in flight and lands their columns, so that the arena
    /// holds what the cache says it holds.
    fn finish_reads(&mut self) -> Result<(), TierError> {
        self.ondemand
            .finish(self.io.as_mut(), &mut self.arena, &mut self.stats)
            .map_err(|source| TierError::Io { path: self.path.clone(), source })
    }

    /// Starts a site's fetch: takes the longest prefix of `active` whose misses fit the
    /// transient area, decides hits, admissions and where every column of it sits, copies the
    /// columns the prefetcher holds, and hands the rest to the on-demand reads, in parts.
    fn start_site(&mut self, layer: usize, ops: &[OpKind], active: &[u32], align: usize) -> Result<(), TierError> {
        let taken = self.fitting_prefix(layer, ops, active, align)?;
        if taken < active.len() {
            self.stats.partial_fetches += 1;
        }
        let active = &active[..taken];
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
                .ready(layer, self.io.as_mut(), &mut self.stats)
                .map_err(|source| TierError::Io { path: self.path.clone(), source })?,
            None => None,
        };
        self.idx.resize_with(ops.len(), Vec::new);
        let mut cursor = self.transient.start;
        // Columns to read: where each is in the active list, the file and the arena.
        let mut reads: Vec<ColumnRead> = Vec::new();
        // Bytes copied (or, when the tier moves no bytes, not) from the preload buffer.
        let mut preload_copied = 0usize;
        let moves_bytes = self.io.moves_bytes();
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
            self.stats.hit_bytes += (self.hits.len() * oc.col_bytes) as u64;
            self.stats.miss_bytes += (self.misses.len() * oc.col_bytes) as u64;
            let slots = oc
                .cache
                .admit(&self.misses, &self.hits)
                .map_err(|e| TierError::Unsupported(format!("fetch of layer {layer} {op:?}: {e}")))?;
            if let Some(f) = self.lambda.as_mut() {
                f.loaded(layer, slots.iter().filter(|&&s| s != NO_SLOT).count());
            }
            // Transient indices start at the first multiple of col_bytes past the cursor.
            let cb = oc.col_bytes;
            let t0 = (cursor - oc.base).div_ceil(cb);
            let mut t_next = t0;
            // Each miss: its unit, its column index from the op's base, its position in `active`.
            let mut slot_of_miss = Vec::with_capacity(self.misses.len());
            for (&u, &s) in self.misses.iter().zip(&slots) {
                let i = if s == NO_SLOT {
                    t_next += 1;
                    (t_next - 1) as u32
                } else {
                    s
                };
                slot_of_miss.push((u, i, 0usize));
            }
            cursor = oc.base + t_next * cb;
            assert!(cursor <= self.transient.end, "transient area sized for the largest site");
            // Kernel indices in `active` order.
            let idx = &mut self.idx[k];
            idx.clear();
            let mut mi = 0;
            for (pos, &u) in active.iter().enumerate() {
                if mi < slot_of_miss.len() && slot_of_miss[mi].0 == u {
                    idx.push(slot_of_miss[mi].1);
                    slot_of_miss[mi].2 = pos;
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
            for &(u, i, pos) in &slot_of_miss {
                let dst = oc.base + i as usize * cb;
                if let Some(ready) = pre {
                    if let Some(at) = self.prefetch.offset(ready, layer, op, u) {
                        if moves_bytes {
                            let src = &self.prefetch.buffer(ready)[at..at + cb];
                            self.arena[dst..dst + cb].copy_from_slice(src);
                        }
                        preload_copied += cb;
                        self.stats.preload_hits += 1;
                        self.stats.preload_used += 1;
                        continue;
                    }
                }
                reads.push(ColumnRead { pos, offset: oc.column_offset(u), len: cb, dest: dst });
            }
        }
        if preload_copied > 0 {
            self.io.charge_copy(preload_copied);
        }
        // Parts are prefixes of the active list. Where the site's units lie in an order of their
        // own, a prefix's columns are spread over the whole tensor and reading it apart from the
        // rest would split runs the reads merge: the site is read as one part.
        let in_unit_order = ops.iter().all(|&op| self.ops[layer][op as usize].positions.is_none());
        let parts = if in_unit_order {
            cut_parts(reads, active.len(), align, read_shape(self.io.as_ref()))
        } else {
            whole(reads, active.len())
        };
        self.ondemand.start(self.io.as_mut(), layer, ops, active, parts);
        Ok(())
    }

    /// How many units of `active` one fetch can take: missing columns that the policy does not
    /// admit land in the transient area, so the prefix is the longest whose misses (all of them,
    /// to be safe) fit it, less one column per op of alignment, cut at a multiple of `align`.
    fn fitting_prefix(&self, layer: usize, ops: &[OpKind], active: &[u32], align: usize) -> Result<usize, TierError> {
        let align = align.max(1);
        let opc: Vec<&OpCache> = ops.iter().map(|&op| &self.ops[layer][op as usize]).collect();
        let room = self.transient.len().saturating_sub(opc.iter().map(|o| o.col_bytes).sum());
        let mut need = 0;
        for (i, &u) in active.iter().enumerate() {
            need += opc
                .iter()
                .filter(|o| u as usize >= o.n_units || !o.cache.contains(u))
                .map(|o| o.col_bytes)
                .sum::<usize>();
            if need > room {
                let cut = i / align * align;
                if cut == 0 {
                    return Err(TierError::Budget(format!(
                        "the transient area ({}) cannot hold {align} columns of each op of layer {layer} {ops:?}",
                        mib(self.transient.len() as u64)
                    )));
                }
                return Ok(cut);
            }
        }
        Ok(active.len())
    }

    /// Reads `ranges` (file offset, len) into the arena at `dests` and waits (the pinned
    /// columns of a warm start), through a buffer of its own.
    fn read_into_arena(&mut self, ranges: &[(u64, usize)], dests: &[usize]) -> Result<(), TierError> {
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| ranges[i].0);
        let mut buf = AlignedBuf::new(JOB_BUF);
        let mut start = 0;
        while start < order.len() {
            // As many ranges as fit in the buffer: worst case a range costs its length, a merged
            // gap and two alignment pages.
            let mut end = start;
            let mut bytes = 0;
            let cost = |len: usize| len + MAX_GAP + 2 * DIRECT_ALIGN;
            while end < order.len() && (end == start || bytes + cost(ranges[order[end]].1) <= JOB_BUF) {
                bytes += cost(ranges[order[end]].1);
                end += 1;
            }
            let batch: Vec<(u64, usize)> = order[start..end].iter().map(|&i| ranges[i]).collect();
            let (reqs, starts, need) = plan_reads(&batch, read_shape(self.io.as_ref()));
            if buf.len() < need {
                buf = AlignedBuf::new(need);
            }
            let n_reqs = reqs.len() as u64;
            let (done, stall) = self.io.read_now(buf, reqs);
            account(&mut self.stats, &done, stall, Kind::Prefill, n_reqs);
            let LoadDone { buf: back, result, .. } = done;
            buf = back;
            result.map_err(|source| TierError::Io { path: self.path.clone(), source })?;
            let bytes: usize = order[start..end].iter().map(|&i| ranges[i].1).sum();
            if self.io.moves_bytes() {
                for (k, &i) in order[start..end].iter().enumerate() {
                    let (d, len) = (dests[i], ranges[i].1);
                    self.arena[d..d + len].copy_from_slice(&buf[starts[k]..starts[k] + len]);
                }
            }
            self.io.charge_copy(bytes);
            start = end;
        }
        Ok(())
    }
}

/// Plans reads of `ranges` (sorted) that fit in `cap` bytes, dropping the last ranges if needed.
pub(crate) fn plan_within(
    ranges: &mut Vec<(u64, usize)>,
    cap: usize,
    shape: ReadShape,
) -> Option<(Vec<ReadReq>, Vec<usize>)> {
    loop {
        if ranges.is_empty() {
            return None;
        }
        let (reqs, starts, need) = plan_reads(ranges, shape);
        if need <= cap {
            return Some((reqs, starts));
        }
        let keep = ranges.len() * 3 / 4;
        ranges.truncate(keep);
    }
}
