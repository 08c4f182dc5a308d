//! Planning a budgeted run: how the tiered store runs ([`TieredOptions`]), where the memory
//! budget goes ([`MemoryPlan`]: runtime, resident weights, KV cache and scratch, the store's
//! buffers, and the cache with what is left), which tensors stay resident ([`is_resident`]), and
//! how the cache is shared among the ops ([`CacheSplit`], [`split_cache`]) and laid out in the
//! store's arena.

use super::{TierError, ONDEMAND_BUF};
use crate::cache::{Policy, UnitCache};
use crate::io::TierKind;
use sift_model::layout::{PackIndex, GROUP_OPS};
use sift_model::Model;

/// Largest prompt batch of a run under a memory budget (activations grow with it).
pub const BUDGET_MAX_BATCH: usize = 64;

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
    /// Size of the buffers a site streams through (the transient area, the prefill buffer) in
    /// bytes; 0: 1/192 of the budget, at least 2 MiB.
    pub stream_buf: usize,
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
            stream_buf: 0,
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
    /// The scale planes of exact columns (the source's block scales), kept in memory.
    pub column_scales: u64,
    /// KV cache at the start of a sequence (its first page), activations and logits.
    pub kv_and_scratch: u64,
    /// KV cache pages added since the start of the sequence: taken from the cache, given back
    /// when a new sequence starts ([`TieredStore::set_kv_growth`](super::TieredStore::set_kv_growth)).
    pub kv_growth: u64,
    /// Transient area, prefill layer buffer, on-demand and preload buffers.
    pub buffers: u64,
    /// The cache's bookkeeping for every unit (its slot and policy state), whatever the cache's
    /// size: part of the fixed part.
    pub cache_index: u64,
    /// The cache's bookkeeping entry of every slot: goes with the cache (taken from its bytes).
    pub cache_entries: u64,
    /// Cache slots.
    pub cache: u64,
    /// Cache slots as a fraction of all column bytes.
    pub cache_fraction: f64,
}

impl MemoryPlan {
    /// Everything: the fixed part, the cache's slots and their entries.
    pub fn total(&self) -> u64 {
        self.fixed() + self.cache_entries + self.cache
    }

    /// Everything but the cache (its slots and their entries).
    pub fn fixed(&self) -> u64 {
        self.runtime
            + self.resident_weights
            + self.column_scales
            + self.kv_and_scratch
            + self.kv_growth
            + self.buffers
            + self.cache_index
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

/// Bytes of the resident part of a budgeted model: its resident tensors, page-rounded (the
/// GGUF's header is freed once parsed, see `GgufFile::from_parts`).
pub fn resident_bytes(model: &Model, resident_embeddings: bool) -> u64 {
    let g = &model.file.gguf;
    let page = |n: u64| n.div_ceil(4096) * 4096;
    g.tensors
        .iter()
        .filter(|t| is_resident(g, &t.name, resident_embeddings))
        .map(|t| page(t.n_bytes) + 4096)
        .sum::<u64>()
}

/// Smallest size of the buffers a site's weights stream through (the transient area, the
/// prefill buffer).
const STREAM_MIN: usize = 2 << 20;
/// They are sized at this fraction of the budget (1/192), unless the whole site fits in less.
const STREAM_BUDGET_SHARE: u64 = 192;

/// Sizes of a store's fixed buffers, in bytes. The weights of a site stream through the first
/// two in parts (a decoded token's missing columns, a prompt batch's rows), so they are sized
/// by the budget, not by the largest site with every column active.
pub(super) struct Buffers {
    /// The transient area: missing columns the cache does not admit, for one part of a site.
    pub(super) transient: usize,
    /// The prefill buffer: a chunk of rows of one op, for a prompt batch.
    pub(super) prefill: usize,
    /// Each of the two preload buffers.
    pub(super) preload: usize,
}

impl Buffers {
    /// The buffers of a store for `model` and its pack's `index`, run with `opts` under `budget`.
    pub(super) fn new(model: &Model, index: &PackIndex, opts: &TieredOptions, budget: u64) -> Buffers {
        let c = &model.config;
        let stream = match opts.stream_buf {
            0 => STREAM_MIN.max((budget / STREAM_BUDGET_SHARE) as usize),
            n => n,
        };
        // Every column of the largest site, and one column of each op of the widest site plus
        // the alignment slack of a part (the least a part can hold).
        let (mut whole_site, mut one_unit) = (0, 0);
        for l in 0..c.n_layer {
            for ops in sift_model::layout::SITE_OPS {
                let cols = |f: fn(&sift_model::layout::ColumnTensor) -> usize| -> usize {
                    ops.iter().map(|&op| f(index.layers[l].op(op))).sum()
                };
                whole_site = whole_site.max(cols(|t| t.len as usize + t.col_bytes));
                one_unit = one_unit.max(cols(|t| t.col_bytes));
            }
        }
        // At least 2 × 64 columns (the engine's kernel piece) per op of the site, and room for
        // alignment.
        let transient = whole_site.min(stream.max(129 * one_unit)).div_ceil(64) * 64;
        // The prefill buffer holds at least one row of the widest streamed tensor.
        let streamed =
            || model.layers.iter().flat_map(|lw| [&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down]);
        let widest_row = streamed().map(|t| t.row_bytes).max().unwrap_or(0);
        let largest_op = streamed().map(|t| t.range.len()).max().unwrap_or(0);
        let prefill = (largest_op.min(stream).max(widest_row)).div_ceil(4096) * 4096 + 2 * 4096;
        // Each preload buffer holds up to a quarter of a group's q/k/v/gate/up columns: the
        // prefetcher reads only predicted columns the cache lacks (at ratio 0.5 with a cache of a
        // third of the columns, about a fifth of them) and leaves any beyond it to on-demand reads.
        let group_bytes = (0..opts.preload.min(c.n_layer))
            .map(|l| GROUP_OPS.iter().map(|&op| index.layers[l].op(op).len as usize).sum::<usize>())
            .sum::<usize>();
        // ... and at most 4% of the budget each: on a tight budget, cache slots pay more.
        let preload = (group_bytes / 4).min(opts.preload_buf).min((budget / 25) as usize).div_ceil(4096) * 4096;
        Buffers { transient, prefill, preload }
    }

    /// Bytes of all the buffers: these, the on-demand buffer, and the preload buffers when
    /// `preload` (layers per preload group) is not 0.
    pub(super) fn total(&self, preload: usize) -> u64 {
        let preload_bufs = if preload > 0 { 2 * self.preload } else { 0 };
        (self.transient + self.prefill + ONDEMAND_BUF + preload_bufs + 2 * 4096) as u64
    }
}

impl MemoryPlan {
    /// The plan of everything but the cache for `model` with `buffers`; refused when the budget
    /// cannot hold it.
    pub(super) fn without_cache(
        model: &Model,
        opts: &TieredOptions,
        inputs: &PlanInputs,
        buffers: &Buffers,
        column_scales: u64,
    ) -> Result<MemoryPlan, TierError> {
        let plan = MemoryPlan {
            budget: inputs.budget,
            runtime: inputs.runtime,
            resident_weights: resident_bytes(model, opts.resident_embeddings),
            column_scales,
            kv_and_scratch: inputs.kv_and_scratch,
            buffers: buffers.total(opts.preload),
            cache_index: if opts.policy == Policy::None { 0 } else { index_units_bytes(model) },
            ..Default::default()
        };
        let fixed = plan.fixed();
        if fixed > inputs.budget {
            return Err(TierError::Budget(format!(
                "--memory {} is too small to run this model: it needs at least {} before any cache (runtime {}, resident weights {}, column scales {}, KV cache and activations {}, I/O and compute buffers {}, cache index {}); raise --memory, or lower -c / -b",
                mib(inputs.budget),
                mib(fixed),
                mib(plan.runtime),
                mib(plan.resident_weights),
                mib(plan.column_scales),
                mib(plan.kv_and_scratch),
                mib(plan.buffers),
                mib(plan.cache_index)
            )));
        }
        Ok(plan)
    }

    /// Sets the cache's share: `bytes` of slots, out of `column_bytes` of columns in the pack.
    pub(super) fn set_cache(&mut self, bytes: u64, column_bytes: u64) {
        self.cache = bytes;
        self.cache_fraction = bytes as f64 / column_bytes.max(1) as f64;
    }
}

/// The cache's bookkeeping for every unit of every op (its slot map and policy state), whatever
/// the cache's size.
pub(super) fn index_units_bytes(model: &Model) -> u64 {
    let c = &model.config;
    // Every op's inputs: its site's width.
    let per_layer: usize = sift_model::layout::OpKind::ALL.iter().map(|op| op.site().width(c)).sum();
    (c.n_layer * per_layer * UnitCache::BYTES_PER_UNIT) as u64
}

/// Where the cache's slots sit in the store's arena, followed by the transient area.
pub(super) struct ArenaLayout {
    /// Per (layer, op), layer-major and in the index's op order: (byte offset of slot 0, slots).
    pub(super) ops: Vec<(usize, usize)>,
    /// Bytes of all the slots.
    pub(super) cache_bytes: u64,
    /// Slots of all the ops.
    pub(super) slots: u64,
    /// Where the transient area starts (past the slots, 64-byte aligned).
    pub(super) transient_start: usize,
}

impl ArenaLayout {
    /// The slots of `cache_budget` bytes of cache, shared among the ops by `split`, each slot
    /// also paying its bookkeeping entry ([`UnitCache::BYTES_PER_SLOT`]) out of the same bytes.
    pub(super) fn new(index: &PackIndex, cache_budget: u64, split: CacheSplit) -> ArenaLayout {
        let first = Self::of(index, cache_budget, split);
        let entries = first.slots * UnitCache::BYTES_PER_SLOT as u64;
        Self::of(index, cache_budget.saturating_sub(entries), split)
    }

    /// Bytes of the slots' bookkeeping entries.
    pub(super) fn index_bytes(&self) -> u64 {
        self.slots * UnitCache::BYTES_PER_SLOT as u64
    }

    fn of(index: &PackIndex, cache_budget: u64, split: CacheSplit) -> ArenaLayout {
        let fractions = split_cache(index, cache_budget, split);
        let mut ops = Vec::with_capacity(index.layers.len() * 7);
        let mut base = 0usize;
        let mut cache_bytes = 0u64;
        let mut all_slots = 0u64;
        for lc in &index.layers {
            for t in &lc.ops {
                let slots = ((t.n_in as f64 * fractions[t.op as usize]).floor() as usize).min(t.n_in);
                ops.push((base, slots));
                base += slots * t.col_bytes;
                cache_bytes += (slots * t.col_bytes) as u64;
                all_slots += slots as u64;
            }
        }
        ArenaLayout { ops, cache_bytes, slots: all_slots, transient_start: base.div_ceil(64) * 64 }
    }
}

/// `b` bytes in MiB, for messages.
pub(super) fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}
