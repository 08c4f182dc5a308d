//! GPU–CPU hybrid decode with online neuron balancing (KAIROX, issue 20): the GPU holds groups
//! of the FFN's units and computes a token's active units among them while the CPU computes the
//! rest, concurrently; the [`NeuronBalancer`] decides, token by token, which groups to move.
//!
//! The units are sift's sparse units: the input channels of the FFN's two selection sites, a
//! channel of the FFN input (its gate and up columns) and a neuron of the GLU (its down column),
//! in the pack's unit order. Attention runs on the GPU too when it fits the budget (KAIROX's
//! placement, [`place_attention`]: every layer's attention half and its KV cache first, then the
//! output head if it fits, the unit groups in what is left;
//! [`crate::gpu::GpuLayers::upload_attention`]), else on the CPU with the head. Per decoded token and FFN site:
//! 1. the selector's active units are split by the groups the GPU holds ([`NeuronBalancer::plan`];
//!    eager first queues its missing groups);
//! 2. the GPU's share is queued on the critical stream (it waits for loads still on their way: an
//!    I/O stall), the CPU computes its share from the pack's columns meanwhile, then the GPU's
//!    partial sums are added;
//! 3. the policy's next loads are queued on the reload stream ([`NeuronBalancer::after`]), to
//!    arrive while the rest of the token and the next one run.
//!
//! The GPU's budget (`--gpu-memory`) goes to group slots, the same share of every (layer, site)'s
//! groups. Slots hold Q8_0 columns ([`sift_gpu::columns`]): a 4-bit model's units take about 1.9x
//! their file bytes there, and a page-locked host copy of every unit's columns (the load source)
//! costs host memory once more, reported at start.

use crate::balancer::{BalancePolicy, NeuronBalancer};
use crate::pool::SharedMut;
use crate::source::{column_ops, site_col_ops};
use crate::sparse::ColOp;
pub use sift_gpu::ColumnPoolSpec;
use sift_gpu::{GpuColumns, GpuError};
use sift_quant::ColType;
use sift_sparsity::Site;
use std::time::Instant;

/// The largest automatic group.
pub const MAX_GROUP: usize = 64;

/// The smallest transfer of `curve` ((bytes, bytes/s), ascending) reaching 80 % of its best.
pub fn knee_bytes(curve: &[(u64, f64)]) -> u64 {
    let best = curve.iter().map(|c| c.1).fold(0.0, f64::max);
    curve.iter().find(|c| c.1 >= 0.8 * best).map_or(64 << 10, |c| c.0)
}

/// Units per group for units of `unit_bytes` and transfers of about `target` bytes.
pub fn auto_group(unit_bytes: usize, target: u64) -> usize {
    let fit = (target as usize / unit_bytes.max(1)).clamp(1, MAX_GROUP);
    1 << fit.ilog2()
}

/// The sites whose units the GPU shares, in pool order within a layer.
pub const HYBRID_SITES: [Site; 2] = [Site::FfnIn, Site::FfnMid];

/// Where the hybrid decode runs attention (`--gpu-attention`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPlacement {
    /// On the GPU when every layer's attention half and its KV cache fit the GPU budget.
    #[default]
    Auto,
    /// On the GPU, or an error.
    Gpu,
    /// On the CPU: the whole budget buys unit groups.
    Cpu,
}

impl AttentionPlacement {
    pub const NAMES: [&'static str; 3] = ["auto", "on", "off"];

    pub fn parse(s: &str) -> Option<AttentionPlacement> {
        match s {
            "auto" => Some(AttentionPlacement::Auto),
            "on" | "gpu" => Some(AttentionPlacement::Gpu),
            "off" | "cpu" => Some(AttentionPlacement::Cpu),
            _ => None,
        }
    }
}

/// What [`place_attention`] put on the GPU, and the bytes left for unit groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DensePlacement {
    pub attention: bool,
    pub head: bool,
    pub group_bytes: u64,
}

/// KAIROX's placement: whether attention goes on the GPU (taking `attention` bytes, its KV
/// cache counted in, of the `gpu_bytes` budget), then the output head (`head` bytes) when it fits
/// in what is left, and the bytes left for unit groups. The dense parts first because a GPU byte
/// of them saves the CPU a byte read every token, where a byte of group slots holds about half a
/// byte of a 4-bit model's columns (Q8_0), read only while active.
pub fn place_attention(
    mode: AttentionPlacement,
    attention: u64,
    head: u64,
    gpu_bytes: u64,
) -> Result<DensePlacement, String> {
    let none = DensePlacement { attention: false, head: false, group_bytes: gpu_bytes };
    let fits = attention <= gpu_bytes;
    match mode {
        AttentionPlacement::Cpu => Ok(none),
        AttentionPlacement::Auto if !fits => Ok(none),
        AttentionPlacement::Gpu if !fits => Err(format!(
            "attention of every layer with its KV cache takes {:.1} MiB, more than the {:.1} MiB of --gpu-memory: raise --gpu-memory, lower the context (-c) or use --gpu-attention off",
            attention as f64 / (1 << 20) as f64,
            gpu_bytes as f64 / (1 << 20) as f64
        )),
        _ => {
            let left = gpu_bytes - attention;
            let with_head = head <= left;
            let group_bytes = if with_head { left - head } else { left };
            Ok(DensePlacement { attention: true, head: with_head, group_bytes })
        }
    }
}

/// The hybrid tier's settings.
#[derive(Clone, Debug)]
pub struct HybridOptions {
    pub policy: BalancePolicy,
    /// Units per group (one transfer); `None`: per site, the most (a power of two, at most
    /// [`MAX_GROUP`]) whose group stays within the transfer size measured to reach 80 % of the
    /// GPU's best host-to-device bandwidth (KAIROX Table 2's knee).
    pub group_size: Option<usize>,
    /// GPU bytes for group slots.
    pub gpu_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum HybridError {
    #[error("hybrid decode (--gpu-policy) runs on a pack's columns: make one with `sift pack MODEL.gguf` and pass the .sift file")]
    NoPack,
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// What a run did (`sift bench`, `generate --verbose`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct HybridReport {
    pub policy: String,
    /// Units per group of the FFN input's and the GLU's sites (layer 0).
    pub group_size: [usize; 2],
    /// Device bytes of the slots, and their share of all groups.
    pub gpu_bytes: u64,
    pub gpu_share: f64,
    /// Page-locked host bytes of the load tables.
    pub host_bytes: u64,
    pub tokens: usize,
    /// Time per decoded token, ms: median and 99th percentile.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Share of the active FFN units computed on the CPU.
    pub cpu_share: f64,
    /// Groups loaded per token, and their bytes.
    pub reloads_per_token: f64,
    pub reload_bytes_per_token: f64,
    /// Share of site products that waited for loads.
    pub stalled_share: f64,
    /// Mean λ over sites after each token (tam-adaptive).
    pub lambda: Vec<f32>,
    /// Where a token's time goes, ms per token (means): planning the splits and queueing the
    /// GPU's share, the CPU computing its share of the FFN units, waiting for the GPU's partial
    /// sums after that, attention (on the GPU or the CPU), the head, issuing loads, and the rest
    /// (norms, selection, SiLU: everything else).
    pub queue_ms: f64,
    pub cpu_ffn_ms: f64,
    pub gpu_wait_ms: f64,
    /// The layers' attention halves on the GPU, round trips included (KAIROX's placement).
    pub gpu_attention_ms: f64,
    /// The layers' attention halves on the CPU (when attention is not on the GPU).
    pub cpu_attention_ms: f64,
    /// The output head (norm and product, on the GPU or the CPU as placed).
    pub head_ms: f64,
    /// Issuing group loads (the host's side of the copies; eager's before its products).
    pub load_ms: f64,
    pub other_ms: f64,
    /// Where the dense parts ran: attention and the output head on the GPU.
    pub attention_on_gpu: bool,
    pub head_on_gpu: bool,
    /// Per token: FFN site products, those that queued work on the GPU, those with a CPU share,
    /// and the output values the CPU's share computed (active units on the CPU times their columns' length): what
    /// `sift probe --gpu -m PACK` calibrates the simulator's costs from.
    pub sites_per_token: f64,
    pub gpu_products_per_token: f64,
    pub cpu_sites_per_token: f64,
    pub cpu_values_per_token: f64,
}

/// The GPU's column pools, the balancer and the run's figures.
pub struct HybridTier {
    pub(crate) gpu: GpuColumns,
    pub balancer: NeuronBalancer,
    pub(crate) opts: HybridOptions,
    /// Whether the current sequence's warm start was placed.
    pub(crate) warm: bool,
    pub(crate) products: u64,
    pub(crate) stalled: u64,
    pub(crate) token_ns: Vec<f64>,
    pub(crate) lambda: Vec<f32>,
    pub(crate) token_start: Option<Instant>,
    /// Nanoseconds of queueing, the CPU's share, the GPU wait, the GPU's attention, the CPU's
    /// attention and the head: summed over the tokens in `token_ns`, and the current token's so
    /// far.
    pub(crate) spent_ns: [f64; SPENT],
    pub(crate) token_spent_ns: [f64; SPENT],
    /// Counts by [`Count`]: over the tokens in `token_ns`, and the current token's so far.
    pub(crate) counts: [u64; COUNTS],
    pub(crate) token_counts: [u64; COUNTS],
    /// Where the dense parts run (set by the session after placing them).
    pub attention_on_gpu: bool,
    pub head_on_gpu: bool,
    pub(crate) y: Vec<f32>,
    pub(crate) coef: Vec<f32>,
}

/// Parts of a token [`HybridTier`] times: queueing, the CPU's FFN share, the GPU wait, attention
/// on the GPU, attention on the CPU, the output head, issuing group loads.
pub(crate) const SPENT: usize = 7;
pub(crate) const ATTENTION_GPU: usize = 3;
pub(crate) const ATTENTION_CPU: usize = 4;
pub(crate) const HEAD: usize = 5;
pub(crate) const LOADS: usize = 6;

/// What [`HybridTier`] counts per token: FFN site products that went through the balancer,
/// those that queued GPU work, those with a CPU share, the CPU's output values, active units and
/// those on the GPU, group loads and their bytes.
#[derive(Clone, Copy)]
pub(crate) enum Count {
    Sites,
    GpuProducts,
    CpuSites,
    CpuValues,
    Units,
    GpuUnits,
    Loads,
    LoadBytes,
}
pub(crate) const COUNTS: usize = 8;

impl HybridTier {
    pub(crate) fn count(&mut self, c: Count, n: u64) {
        self.token_counts[c as usize] += n;
    }

    fn total(&self, c: Count) -> f64 {
        self.counts[c as usize] as f64
    }
}

impl HybridTier {
    /// A decode step's attention half ran on the GPU for `ns` nanoseconds.
    pub(crate) fn spent_on_attention(&mut self, ns: f64) {
        self.token_spent_ns[ATTENTION_GPU] += ns;
    }

    /// A decode step's attention half ran on the CPU for `ns` nanoseconds.
    pub(crate) fn spent_on_cpu_attention(&mut self, ns: f64) {
        self.token_spent_ns[ATTENTION_CPU] += ns;
    }

    /// A decode step's output head took `ns` nanoseconds.
    pub(crate) fn spent_on_head(&mut self, ns: f64) {
        self.token_spent_ns[HEAD] += ns;
    }

    /// The pool of `site` in layer `l`, when the GPU shares it.
    pub fn pool_of(&self, l: usize, site: Site) -> Option<usize> {
        HYBRID_SITES.iter().position(|&s| s == site).map(|i| l * HYBRID_SITES.len() + i)
    }

    /// A new sequence: the next prompt warm-starts the slots again.
    pub fn reset(&mut self) {
        self.balancer.reset();
        self.warm = false;
        self.token_start = None;
    }

    /// The run's figures so far.
    pub fn report(&self) -> HybridReport {
        let mut t = self.token_ns.clone();
        t.sort_by(f64::total_cmp);
        let pct = |p: f64| if t.is_empty() { 0.0 } else { t[((t.len() - 1) as f64 * p).round() as usize] / 1e6 };
        let n = self.token_ns.len().max(1) as f64;
        let ms = |ns: f64| ns / n / 1e6;
        let total: f64 = self.token_ns.iter().sum();
        let groups: usize = self.gpu.specs.iter().map(|s| s.n_groups).sum();
        let slots: usize = self.gpu.specs.iter().map(|s| s.slots).sum();
        HybridReport {
            policy: self.opts.policy.name().into(),
            group_size: [self.gpu.specs[0].group_size, self.gpu.specs[1].group_size],
            gpu_bytes: self.gpu.device_bytes(),
            gpu_share: slots as f64 / groups.max(1) as f64,
            host_bytes: self.gpu.table_bytes(),
            tokens: self.token_ns.len(),
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            cpu_share: if self.total(Count::Units) > 0.0 {
                1.0 - self.total(Count::GpuUnits) / self.total(Count::Units)
            } else {
                0.0
            },
            reloads_per_token: self.total(Count::Loads) / n,
            reload_bytes_per_token: self.total(Count::LoadBytes) / n,
            stalled_share: if self.products > 0 { self.stalled as f64 / self.products as f64 } else { 0.0 },
            lambda: self.lambda.clone(),
            queue_ms: ms(self.spent_ns[0]),
            cpu_ffn_ms: ms(self.spent_ns[1]),
            gpu_wait_ms: ms(self.spent_ns[2]),
            gpu_attention_ms: ms(self.spent_ns[ATTENTION_GPU]),
            cpu_attention_ms: ms(self.spent_ns[ATTENTION_CPU]),
            head_ms: ms(self.spent_ns[HEAD]),
            load_ms: ms(self.spent_ns[LOADS]),
            other_ms: ms((total - self.spent_ns.iter().sum::<f64>()).max(0.0)),
            attention_on_gpu: self.attention_on_gpu,
            head_on_gpu: self.head_on_gpu,
            sites_per_token: self.total(Count::Sites) / n,
            gpu_products_per_token: self.total(Count::GpuProducts) / n,
            cpu_sites_per_token: self.total(Count::CpuSites) / n,
            cpu_values_per_token: self.total(Count::CpuValues) / n,
        }
    }

    /// One line for the start of a run.
    pub fn summary(&self) -> String {
        let r = self.report();
        format!(
            "hybrid decode, policy {}: {:.0}% of the FFN's unit groups ({} and {} units, {} and {} KiB) fit {:.1} MiB of GPU slots; {:.1} MiB of page-locked host tables",
            r.policy,
            r.gpu_share * 100.0,
            r.group_size[0],
            r.group_size[1],
            self.gpu.specs[0].group_bytes() >> 10,
            self.gpu.specs[1].group_bytes() >> 10,
            r.gpu_bytes as f64 / (1 << 20) as f64,
            r.host_bytes as f64 / (1 << 20) as f64
        )
    }

    /// Issues `loads` of `pool` on the reload stream; returns the host's time doing it (ns),
    /// also counted as the token's loading time.
    pub(crate) fn load(&mut self, pool: usize, loads: &[(u32, u32)]) -> Result<f64, GpuError> {
        if loads.is_empty() {
            return Ok(0.0);
        }
        let t = Instant::now();
        for &(g, slot) in loads {
            self.gpu.load(pool, g, slot)?;
        }
        self.count(Count::Loads, loads.len() as u64);
        self.count(Count::LoadBytes, (loads.len() * self.gpu.specs[pool].group_bytes()) as u64);
        let ns = t.elapsed().as_nanos() as f64;
        self.token_spent_ns[LOADS] += ns;
        Ok(ns)
    }

    /// Layer 0's first site of a token: the token clock, and the warm start after a prompt.
    pub(crate) fn begin_token(&mut self) -> Result<(), GpuError> {
        let now = Instant::now();
        if let Some(t0) = self.token_start.replace(now) {
            self.token_ns.push(now.duration_since(t0).as_nanos() as f64);
            for (s, t) in self.spent_ns.iter_mut().zip(&mut self.token_spent_ns) {
                *s += std::mem::take(t);
            }
            for (c, t) in self.counts.iter_mut().zip(&mut self.token_counts) {
                *c += std::mem::take(t);
            }
            if let BalancePolicy::TamAdaptive { .. } = self.opts.policy {
                self.lambda.push(self.balancer.mean_lambda());
            }
            self.balancer.end_token();
        }
        if !self.warm {
            for p in 0..self.balancer.n_sites() {
                let placed = self.balancer.warm_start(p);
                for &(g, slot) in &placed {
                    self.gpu.load(p, g, slot)?;
                }
            }
            // The warm start belongs to the prompt, not to the first token's time.
            self.gpu.sync_loads()?;
            self.warm = true;
            self.token_start = Some(Instant::now());
            self.token_spent_ns = [0.0; SPENT];
            self.token_counts = [0; COUNTS];
        }
        Ok(())
    }
}

/// Fills a pool's host table: unit `u`'s columns (the site's `ops` in order, dequantized from
/// the pack bytes `file`, then Q8_0 along the output) at position `pos[u]`, `ub` bytes each.
pub(crate) fn fill_table(
    pool: &crate::pool::ThreadPool,
    ops: &[ColOp],
    file: &[u8],
    pos: &[u32],
    ub: usize,
    t: &mut [u8],
) {
    let widest = ops.iter().map(|op| op.n_out).max().unwrap_or(0);
    assert!(pos.iter().all(|&p| (p as usize + 1) * ub <= t.len()), "the table holds every position");
    let table = SharedMut::new(t);
    pool.for_each(pos.len(), 32, &|range, _| {
        let mut y = vec![0f32; widest];
        for u in range {
            let at = pos[u] as usize * ub;
            // SAFETY: `pos` is a permutation of the site's units, so unit u alone writes the
            // table's bytes at its position, which lie in the table (asserted above).
            let dst = unsafe { table.slice(at..at + ub) };
            let mut off = 0;
            for op in ops {
                let cb = op.n_out / 32 * 34;
                op.column_f32(file, u as u32, &mut y[..op.n_out]);
                ColType::Q8_0.quantize_col(&y[..op.n_out], &mut dst[off..off + cb]);
                off += cb;
            }
        }
    });
}

/// The hybrid tier's pools of a model: per (layer, site) in [`HYBRID_SITES`] order, its shape
/// and group slots, and its units' positions in the pack's unit order.
#[derive(Clone, Debug)]
pub struct PoolLayout {
    pub specs: Vec<ColumnPoolSpec>,
    pub positions: Vec<Vec<u32>>,
}

/// The pools [`Engine::attach_hybrid`] makes for `model` (a pack; `None` for a GGUF): groups of
/// `group_size` units, or per site the most whose Q8_0 bytes stay within `knee` bytes (see
/// [`auto_group`]); slots for the same share of every pool's groups, as many as `gpu_bytes`
/// buys. The simulator (`sift simulate --gpu`) lays its pools out with this too.
pub fn pool_layout(
    model: &sift_model::Model,
    group_size: Option<usize>,
    gpu_bytes: u64,
    knee: u64,
) -> Option<PoolLayout> {
    let cols = column_ops(model)?;
    let mut specs = Vec::new();
    let mut positions: Vec<Vec<u32>> = Vec::new();
    for layer in &cols {
        for site in HYBRID_SITES {
            let ops = site_col_ops(layer, site);
            let n_units = ops[0].n_in;
            let n_out: usize = ops.iter().map(|op| op.n_out).sum();
            positions.push(ops[0].positions.as_ref().map_or_else(|| (0..n_units as u32).collect(), |p| p.to_vec()));
            let gs = group_size.unwrap_or_else(|| auto_group(n_out / 32 * 34, knee)).max(1);
            specs.push(ColumnPoolSpec { n_out, group_size: gs, n_groups: n_units.div_ceil(gs), slots: 0 });
        }
    }
    let table: u64 = specs.iter().map(|s| s.table_bytes()).sum();
    let share = (gpu_bytes as f64 / table.max(1) as f64).min(1.0);
    for s in &mut specs {
        s.slots = ((s.n_groups as f64 * share).floor() as usize).min(s.n_groups);
    }
    Some(PoolLayout { specs, positions })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention first when it fits (KAIROX), the rest to the groups; `on` insists, `off` never.
    #[test]
    fn attention_takes_its_bytes_first_when_it_fits() {
        use AttentionPlacement::*;
        let p = |attention, head, group_bytes| DensePlacement { attention, head, group_bytes };
        assert_eq!(place_attention(Auto, 30, 80, 100), Ok(p(true, false, 70)));
        assert_eq!(place_attention(Auto, 30, 20, 100), Ok(p(true, true, 50)));
        assert_eq!(place_attention(Auto, 30, 70, 100), Ok(p(true, true, 0)));
        assert_eq!(place_attention(Auto, 100, 0, 100), Ok(p(true, true, 0)));
        assert_eq!(place_attention(Auto, 101, 1, 100), Ok(p(false, false, 100)));
        assert_eq!(place_attention(Gpu, 30, 90, 100), Ok(p(true, false, 70)));
        let err = place_attention(Gpu, 3 << 20, 0, 2 << 20).unwrap_err();
        assert!(err.contains("3.0 MiB") && err.contains("2.0 MiB") && err.contains("--gpu-attention off"), "{err}");
        assert_eq!(place_attention(Cpu, 30, 20, 100), Ok(p(false, false, 100)));
        for name in AttentionPlacement::NAMES {
            assert!(AttentionPlacement::parse(name).is_some());
        }
        assert_eq!(AttentionPlacement::parse("sometimes"), None);
    }

    #[test]
    fn groups_follow_the_transfer_curve() {
        // KAIROX Table 2 (RTX 4090, PCIe 4): 22.8 GB/s at best, 80 % first reached at 16 rows.
        let row = 10 << 10;
        let curve: Vec<(u64, f64)> = [(1, 5.8), (4, 13.7), (8, 17.8), (16, 20.9), (24, 22.3), (32, 22.8)]
            .iter()
            .map(|&(n, b)| (n * row, b * 1e9))
            .collect();
        assert_eq!(knee_bytes(&curve), 16 * row);
        assert_eq!(auto_group(row as usize, knee_bytes(&curve)), 16);
        // Smaller units: more per group (a power of two, at most MAX_GROUP); larger: at least one.
        assert_eq!(auto_group(3000, 64 << 10), 16);
        assert_eq!(auto_group(100, 1 << 20), MAX_GROUP);
        assert_eq!(auto_group(1 << 20, 64 << 10), 1);
    }

    /// The host tables hold each unit's own columns (Q8_0 of the pack's), at its position.
    #[test]
    fn tables_hold_the_pack_columns() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let gguf = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let dir = tempfile::tempdir().unwrap();
        let pack = dir.path().join("smol.sift");
        sift_store::pack_model(&gguf, &pack, &sift_store::PackOptions::default(), |_| {}).unwrap();
        let model = sift_store::open_model(&pack).unwrap();
        let cols = column_ops(&model).unwrap();
        // A unit's column is the GGUF matrix's column.
        let w = &model.layers[3].w_gate;
        let mut row = vec![0f32; w.cols];
        let mut col = vec![0f32; w.rows];
        let gate = &site_col_ops(&cols[3], Site::FfnIn)[0];
        for u in [0u32, 5, 300] {
            gate.column_f32(model.pack_bytes(), u, &mut col);
            for r in [0usize, 1, 33, 700] {
                w.ty.dequantize_row(model.row(w, r), &mut row);
                assert!((row[u as usize] - col[r]).abs() < 1e-4, "unit {u} row {r}: {} vs {}", col[r], row[u as usize]);
            }
        }
        let pool = crate::pool::ThreadPool::new(2);
        for site in HYBRID_SITES {
            let ops = site_col_ops(&cols[3], site);
            let n = ops[0].n_in;
            // A permutation of the units: reversed.
            let pos: Vec<u32> = (0..n as u32).rev().collect();
            let n_out: usize = ops.iter().map(|op| op.n_out).sum();
            let ub = n_out / 32 * 34;
            let mut t = vec![0u8; n * ub];
            fill_table(&pool, ops, model.pack_bytes(), &pos, ub, &mut t);
            // A product over half the units: the table's (the GPU's reference) vs the pack's.
            let active: Vec<u32> = (0..n as u32).filter(|u| u % 2 == 1 || u % 7 == 0).collect();
            let coef: Vec<f32> = active.iter().map(|&u| ((u * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let idx: Vec<u32> = active.iter().map(|&u| pos[u as usize]).collect();
            let mut got = vec![0f32; n_out];
            sift_gpu::axpy_cols_q8_ref(&t, ub, &idx, &coef, &mut got);
            let mut outs: Vec<Vec<f32>> = ops.iter().map(|op| vec![0f32; op.n_out]).collect();
            let mut jobs: Vec<crate::sparse::ColJob<'_>> = ops
                .iter()
                .zip(outs.iter_mut())
                .map(|(op, out)| crate::sparse::tensor_job(op, model.pack_bytes(), &active, out))
                .collect();
            crate::sparse::column_matmul(&pool, &active, &coef, &mut jobs, &mut Vec::new());
            let want: Vec<f32> = outs.concat();
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
            assert!(err <= 0.01 * scale, "{site:?}: product differs by {err} (largest output {scale})");
            for u in [0u32, 1, 77, n as u32 - 1] {
                let mut got = vec![0f32; n_out];
                ColType::Q8_0.dequantize_col(&t[pos[u as usize] as usize * ub..][..ub], &mut got);
                let mut off = 0;
                for op in ops {
                    let mut want = vec![0f32; op.n_out];
                    op.column_f32(model.pack_bytes(), u, &mut want);
                    for b in 0..op.n_out / 32 {
                        let blk = &want[b * 32..(b + 1) * 32];
                        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                        for k in 0..32 {
                            let (w, g) = (blk[k], got[off + b * 32 + k]);
                            assert!(
                                (w - g).abs() <= amax / 127.0 + 1e-6,
                                "{site:?} unit {u} value {}: {g} vs {w}",
                                b * 32 + k
                            );
                        }
                    }
                    off += op.n_out;
                }
            }
        }
    }
}
