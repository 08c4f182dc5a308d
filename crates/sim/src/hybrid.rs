//! KAIROX's GPU–CPU hybrid decode, simulated (issue 20): which FFN neuron groups a GPU of a
//! given size holds under each balancing policy, and what a decode step then costs, replayed from
//! an activation trace on a [`GpuProfile`].
//!
//! # The model of a step
//! Per decoded token and layer, the trace gives the FFN's active neurons (the down projection's
//! input, `Site::FfnMid`). Neurons are bundled (gate row, up row, down column) and grouped:
//! `group_size` consecutive neurons in the pack's unit order (co-activation grouping happens when
//! the pack is made). A layer's resident set on the GPU holds at most `K` groups (`K` from the GPU
//! budget left after the dense parts, spread evenly over the layers). The active neurons of
//! resident groups run on the GPU, the others on the CPU, concurrently; the layer takes the longer
//! of the two, plus a merge. Attention and the other dense parts stay on the GPU (KAIROX's
//! placement) and cost their bytes at the GPU's bandwidth.
//!
//! Loads go over one reload stream ordered by issue time: after a layer runs, its policy picks
//! the next resident set and the groups to load are queued; the same layer of the next token
//! cannot start before they have arrived (an I/O stall). The transfer rate depends on the size of
//! one transfer (a group): the measured curve of [`GpuProfile::pcie`] (KAIROX Table 2).
//!
//! # Policies ([`HybridPolicy`])
//! - `static`: PowerInfer-like: the `K` hottest groups of the whole trace, fixed (a perfect
//!   offline profile: generous to it);
//! - `eager`: Neuralink-like: every active group is loaded before the layer runs, all on the GPU
//!   (transfers on the critical path; LRU eviction);
//! - `lru`: misses run on the CPU and are loaded for later, evicting the least recently used;
//! - `tam`: Algorithm 1 with a fixed λ: group momentum `S ← λS + (1−λ)A` with `A` the group's
//!   share of active neurons; candidates above `τ_load = (1−λ) + ε`; the top `K` are resident;
//! - `tam-adaptive`: the same with each layer's λ moved by its stall type through
//!   [`sift_store::cache::LambdaController`] (the controller the flash tier uses): an I/O stall
//!   raises λ, a CPU-bound layer lowers it;
//! - `layers`: llama.cpp's layer split (`-ngl`) as the baseline: the last layers that fit run
//!   whole on the GPU, the others whole on the CPU, one after the other (the head on the GPU only
//!   when every layer is); no transfers;
//! - `oracle`: the bound: for each token and layer, the best split any `K` resident groups could
//!   give, with no transfer: the GPU's share of active neurons chosen (as a real number, at most
//!   what the token's `K` most active groups hold) to minimise the layer's time. No policy that
//!   keeps at most `K` groups can beat it (eager, which brings every active group over, is not
//!   bound by `K` within a token).

use crate::trace::{Event, Trace};
use sift_store::cache::{LambdaBounds, LambdaController};

/// The GPU side of a machine: what the hybrid simulation needs beside the CPU's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuProfile {
    pub name: String,
    /// GPU memory bandwidth the sparse FFN and the dense parts run at, bytes/s.
    pub gpu_bw: f64,
    /// Host-to-device bandwidth by transfer size: (bytes per transfer, bytes/s), ascending.
    pub pcie: Vec<(u64, f64)>,
    /// Fixed GPU cost per layer (launches, synchronisation), ns.
    pub gpu_layer_ns: f64,
    /// The CPU's effective bandwidth on sparse FFN neurons, bytes/s, and its fixed cost per
    /// layer that has CPU work, ns.
    pub cpu_bw: f64,
    pub cpu_layer_ns: f64,
    /// Merging the CPU's partial FFN output into the GPU's, per layer with CPU work, ns.
    pub merge_ns: f64,
    /// What sift's own operations take on this machine (`sift probe --gpu -m PACK`): with them
    /// `sift simulate --gpu` replays the engine's hybrid decode
    /// ([`crate::hybrid_engine`]) instead of KAIROX's design.
    pub engine: Option<crate::hybrid_engine::EngineCosts>,
}

/// Bytes of one neuron in KAIROX Table 2's rows (fp16 rows of 4096 and 5120 values).
const ROW_4096: u64 = 8 << 10;
const ROW_5120: u64 = 10 << 10;
const GB: f64 = 1e9;

impl GpuProfile {
    /// The machines of the KAIROX paper (§9.1), with Table 2's transfer curves: `rtx3080ti-pcie3`
    /// (PC-Low: 912 GB/s GDDR6X, PCIe 3.0, Xeon E5-2680 v4 at 12 threads) and `rtx4090-pcie4`
    /// (PC-High: 1008 GB/s, PCIe 4.0, EPYC 7542 at 16 threads). The CPU figures are estimates
    /// (quad-channel DDR4 at about half its peak for sparse rows), not measurements.
    pub fn builtin(name: &str) -> Option<GpuProfile> {
        let curve = |row: u64, bw: [f64; 6]| -> Vec<(u64, f64)> {
            [1u64, 4, 8, 16, 24, 32].iter().zip(bw).map(|(&gs, b)| (gs * row, b * GB)).collect()
        };
        match name {
            "rtx3080ti-pcie3" => Some(GpuProfile {
                name: name.into(),
                gpu_bw: 912.0 * GB,
                pcie: curve(ROW_4096, [3.3, 6.8, 8.7, 10.2, 10.8, 11.1]),
                gpu_layer_ns: 20_000.0,
                cpu_bw: 30.0 * GB,
                cpu_layer_ns: 10_000.0,
                merge_ns: 10_000.0,
                engine: None,
            }),
            "rtx4090-pcie4" => Some(GpuProfile {
                name: name.into(),
                gpu_bw: 1008.0 * GB,
                pcie: curve(ROW_5120, [5.8, 13.7, 17.8, 20.9, 22.3, 22.8]),
                gpu_layer_ns: 15_000.0,
                cpu_bw: 50.0 * GB,
                cpu_layer_ns: 8_000.0,
                merge_ns: 8_000.0,
                engine: None,
            }),
            _ => None,
        }
    }

    /// A machine measured by `sift probe --gpu -o FILE` (JSON: the GPU's `name`, `h2d` curve,
    /// `device_bw` and a hybrid product's `round_trip_ns`, and the host's `host_read_bw`).
    /// The GPU runs at its measured device bandwidth; a layer's fixed GPU cost and the merge of
    /// the CPU's partial sums are one measured round trip each (KAIROX synchronises once per
    /// layer); the CPU works on sparse neurons at half its measured read bandwidth and pays
    /// 8 µs per layer with CPU work, the conventions of the builtin profiles.
    pub fn from_probe(json: &str) -> Result<GpuProfile, String> {
        #[derive(serde::Deserialize)]
        struct Probe {
            name: String,
            h2d: Vec<(u64, f64)>,
            device_bw: f64,
            round_trip_ns: f64,
            host_read_bw: Option<f64>,
            engine: Option<crate::hybrid_engine::EngineCosts>,
        }
        let p: Probe = serde_json::from_str(json).map_err(|e| format!("not a `sift probe --gpu` file: {e}"))?;
        let host = p.host_read_bw.ok_or(
            "it has no host_read_bw (the host's memory read): measure again with this sift's `sift probe --gpu -o FILE`",
        )?;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let sorted = p.h2d.windows(2).all(|w| w[0].0 < w[1].0);
        if p.h2d.is_empty() || !sorted || !p.h2d.iter().all(|&(b, bw)| b > 0 && positive(bw)) {
            return Err("its h2d curve must be (bytes, bytes/s) pairs, sizes ascending, all positive".into());
        }
        if ![p.device_bw, p.round_trip_ns, host].into_iter().all(positive) {
            return Err("device_bw, round_trip_ns and host_read_bw must be positive numbers".into());
        }
        if let Some(e) = &p.engine {
            e.check()?;
        }
        Ok(GpuProfile {
            name: p.name,
            gpu_bw: p.device_bw,
            pcie: p.h2d,
            gpu_layer_ns: p.round_trip_ns,
            cpu_bw: 0.5 * host,
            cpu_layer_ns: 8_000.0,
            merge_ns: p.round_trip_ns,
            engine: p.engine,
        })
    }

    pub fn builtin_names() -> &'static [&'static str] {
        &["rtx3080ti-pcie3", "rtx4090-pcie4"]
    }

    /// Transfer bandwidth for transfers of `bytes`: the curve interpolated in log(bytes), flat
    /// beyond its ends.
    pub fn pcie_bw(&self, bytes: u64) -> f64 {
        let p = &self.pcie;
        let Some(first) = p.first() else { return 0.0 };
        if bytes <= first.0 {
            return first.1;
        }
        for w in p.windows(2) {
            let ((b0, v0), (b1, v1)) = (w[0], w[1]);
            if bytes <= b1 {
                let f = ((bytes as f64).ln() - (b0 as f64).ln()) / ((b1 as f64).ln() - (b0 as f64).ln());
                return v0 + f * (v1 - v0);
            }
        }
        p[p.len() - 1].1
    }
}

/// How the GPU's share of each layer's FFN is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HybridPolicy {
    Static,
    Eager,
    Lru,
    Tam { lambda: f32 },
    TamAdaptive { lambda0: f32 },
    LayerSplit,
    Oracle,
}

impl HybridPolicy {
    /// `static`, `eager`, `lru`, `tam` (λ = 0.8), `tam-adaptive` (λ from 0.5, KAIROX's start),
    /// `oracle`.
    pub fn parse(s: &str) -> Option<HybridPolicy> {
        Some(match s {
            "static" => HybridPolicy::Static,
            "eager" => HybridPolicy::Eager,
            "lru" => HybridPolicy::Lru,
            "tam" => HybridPolicy::Tam { lambda: 0.8 },
            "tam-adaptive" => HybridPolicy::TamAdaptive { lambda0: 0.5 },
            "layers" => HybridPolicy::LayerSplit,
            "oracle" => HybridPolicy::Oracle,
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            HybridPolicy::Static => "static",
            HybridPolicy::Eager => "eager",
            HybridPolicy::Lru => "lru",
            HybridPolicy::Tam { .. } => "tam",
            HybridPolicy::TamAdaptive { .. } => "tam-adaptive",
            HybridPolicy::LayerSplit => "layers",
            HybridPolicy::Oracle => "oracle",
        }
    }
}

/// The model's shape as the simulation needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridModel {
    pub n_layer: usize,
    /// FFN neurons per layer.
    pub n_ff: usize,
    /// Bytes of one neuron's gate row, up row and down column.
    pub neuron_bytes: u64,
    /// Bytes per layer of what stays on the GPU whole (attention).
    pub dense_layer_bytes: u64,
    /// Bytes of the output head (on the GPU for the neuron policies).
    pub head_bytes: u64,
}

impl HybridModel {
    /// The shape of `model`: a neuron is its gate and up rows and its down column.
    pub fn of(model: &sift_model::Model) -> HybridModel {
        let c = &model.config;
        let l0 = &model.layers[0];
        let down = (l0.w_down.rows * l0.w_down.row_bytes) as u64 / c.n_ff.max(1) as u64;
        let attn = [&l0.wq, &l0.wk, &l0.wv, &l0.wo].iter().map(|t| (t.rows * t.row_bytes) as u64).sum();
        HybridModel {
            n_layer: c.n_layer,
            n_ff: c.n_ff,
            neuron_bytes: (l0.w_gate.row_bytes + l0.w_up.row_bytes) as u64 + down,
            dense_layer_bytes: attn,
            head_bytes: (model.output.rows * model.output.row_bytes) as u64,
        }
    }

    /// What the neuron policies keep on the GPU whatever the budget: every layer's attention
    /// and the output head.
    pub fn fixed_gpu_bytes(&self) -> u64 {
        self.dense_layer_bytes * self.n_layer as u64 + self.head_bytes
    }

    /// Groups of `group_size` per layer a GPU budget of `gpu_bytes` holds beside
    /// [`HybridModel::fixed_gpu_bytes`]; `None` when that does not fit.
    pub fn groups_for(&self, gpu_bytes: u64, group_size: usize) -> Option<usize> {
        let per_layer = gpu_bytes.checked_sub(self.fixed_gpu_bytes())? / self.n_layer.max(1) as u64;
        Some((per_layer / (group_size.max(1) as u64 * self.neuron_bytes).max(1)) as usize)
    }

    /// Whole layers a GPU budget holds (the layer split), and whether the head fits beside them.
    pub fn layers_for(&self, gpu_bytes: u64) -> (usize, bool) {
        let layer = self.dense_layer_bytes + self.n_ff as u64 * self.neuron_bytes;
        let n = ((gpu_bytes / layer.max(1)) as usize).min(self.n_layer);
        (n, n == self.n_layer && gpu_bytes >= layer * self.n_layer as u64 + self.head_bytes)
    }
}

/// The settings of one simulated run.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridOptions {
    pub policy: HybridPolicy,
    pub group_size: usize,
    /// Groups the GPU holds per layer.
    pub gpu_groups: usize,
    /// For the layer split: whole layers on the GPU, and whether the head is there too.
    pub gpu_layers: (usize, bool),
    /// TAM's margin ε over `1 − λ`.
    pub eps: f32,
    /// The adaptive controller's bounds (KAIROX's α etc.).
    pub bounds: LambdaBounds,
}

/// What a run cost.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct HybridReport {
    pub policy: String,
    pub tokens: usize,
    pub tok_s: f64,
    /// Time per token, ns: median and 99th percentile.
    pub p50_ns: f64,
    pub p99_ns: f64,
    /// Groups loaded per token, and their bytes.
    pub reloads_per_token: f64,
    pub reload_bytes_per_token: f64,
    /// Share of the active neurons computed on the CPU.
    pub cpu_share: f64,
    /// Share of a token's time spent waiting for transfers.
    pub stall_share: f64,
    /// Mean λ over layers after each token (adaptive TAM; empty otherwise).
    pub lambda: Vec<f32>,
}

/// The FFN's active neurons of every decoded token and layer of `trace` (`None`: all).
pub fn ffn_activity(trace: &Trace) -> Vec<Vec<Option<Vec<u32>>>> {
    trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Token { layers, .. } => Some(layers.iter().map(|l| l.sites[3].active.clone()).collect()),
            _ => None,
        })
        .collect()
}

/// `activity` with each neuron renamed to its position in the pack's FFN unit order (the
/// co-activation grouping `sift pack --grouping` made), so that groups of consecutive positions
/// are the groups that pack transfers. Layers in the model's own order stay as they are.
pub fn in_pack_order(activity: &mut [Vec<Option<Vec<u32>>>], model: &sift_model::Model) {
    let Some(cols) = &model.columns else { return };
    for tok in activity.iter_mut() {
        for (l, act) in tok.iter_mut().enumerate() {
            let Some(pos) = cols.layers.get(l).and_then(|c| c.positions(sift_model::layout::OpKind::Down)) else {
                continue;
            };
            if let Some(a) = act {
                for u in a.iter_mut() {
                    if let Some(&p) = pos.get(*u as usize) {
                        *u = p;
                    }
                }
                a.sort_unstable();
            }
        }
    }
}

/// Per group of `gs` neurons, how many of `active` (ascending ids < n_ff; `None`: all) it holds.
fn group_counts(active: &Option<Vec<u32>>, n_ff: usize, gs: usize) -> Vec<u32> {
    let n_groups = n_ff.div_ceil(gs);
    let mut c = vec![0u32; n_groups];
    match active {
        None => {
            for (g, v) in c.iter_mut().enumerate() {
                *v = (gs.min(n_ff - g * gs)) as u32;
            }
        }
        Some(a) => {
            for &u in a {
                if (u as usize) < n_ff {
                    c[u as usize / gs] += 1;
                }
            }
        }
    }
    c
}

/// One layer's resident set and policy state.
struct LayerState {
    resident: Vec<bool>,
    /// TAM momentum, or the LRU's last use (token index + 1).
    score: Vec<f32>,
    last_use: Vec<u64>,
    /// When this layer's queued loads will have arrived (ns on the run's clock).
    ready_ns: f64,
}

/// Replays `activity` (per token, per layer: active neurons) on `gpu` under `o`.
pub fn simulate_hybrid(
    activity: &[Vec<Option<Vec<u32>>>],
    m: &HybridModel,
    gpu: &GpuProfile,
    o: &HybridOptions,
) -> HybridReport {
    let gs = o.group_size.max(1);
    let n_groups = m.n_ff.div_ceil(gs);
    let k = o.gpu_groups.min(n_groups);
    let group_bytes = gs as u64 * m.neuron_bytes;
    let pcie = gpu.pcie_bw(group_bytes).max(1.0);
    let load_ns = group_bytes as f64 / pcie * 1e9;
    // The static hot set: the K groups most active over the whole trace, per layer.
    let hot: Vec<Vec<bool>> = (0..m.n_layer)
        .map(|l| {
            let mut total = vec![0u64; n_groups];
            for tok in activity {
                for (g, c) in group_counts(&tok[l], m.n_ff, gs).into_iter().enumerate() {
                    total[g] += c as u64;
                }
            }
            top_k_mask(&total.iter().map(|&t| t as f32).collect::<Vec<_>>(), k, |_| true)
        })
        .collect();
    let mut layers: Vec<LayerState> = (0..m.n_layer)
        .map(|l| LayerState {
            resident: match o.policy {
                HybridPolicy::Static => hot[l].clone(),
                _ => vec![false; n_groups],
            },
            score: vec![0.0; n_groups],
            last_use: vec![0; n_groups],
            ready_ns: 0.0,
        })
        .collect();
    let lambda0 = match o.policy {
        HybridPolicy::Tam { lambda } => lambda,
        HybridPolicy::TamAdaptive { lambda0 } => lambda0,
        _ => 0.8,
    };
    let mut ctl = LambdaController::new(m.n_layer, lambda0, o.bounds);
    let (mut now, mut stream_free) = (0f64, 0f64);
    let mut token_ns = Vec::with_capacity(activity.len());
    let (mut loads, mut cpu_neurons, mut all_neurons, mut stall_total) = (0u64, 0u64, 0u64, 0f64);
    let mut lambda_trace = Vec::new();
    for (t, tok) in activity.iter().enumerate() {
        let t0 = now;
        for (l, st) in layers.iter_mut().enumerate() {
            let counts = group_counts(&tok[l], m.n_ff, gs);
            let active: u64 = counts.iter().map(|&c| c as u64).sum();
            all_neurons += active;
            let cost = |on_gpu: f64| -> (f64, f64, f64) {
                let on_cpu = active as f64 - on_gpu;
                let gpu_ns =
                    (m.dense_layer_bytes as f64 + on_gpu * m.neuron_bytes as f64) / gpu.gpu_bw * 1e9 + gpu.gpu_layer_ns;
                if on_cpu <= 0.0 {
                    return (gpu_ns, 0.0, 0.0);
                }
                (gpu_ns, on_cpu * m.neuron_bytes as f64 / gpu.cpu_bw * 1e9 + gpu.cpu_layer_ns, gpu.merge_ns)
            };
            if o.policy == HybridPolicy::LayerSplit {
                let bytes = (m.dense_layer_bytes + active * m.neuron_bytes) as f64 * 1e9;
                if l >= m.n_layer - o.gpu_layers.0.min(m.n_layer) {
                    now += bytes / gpu.gpu_bw + gpu.gpu_layer_ns;
                } else {
                    now += bytes / gpu.cpu_bw + gpu.cpu_layer_ns;
                    cpu_neurons += active;
                }
                continue;
            }
            if o.policy == HybridPolicy::Oracle {
                // The best GPU share up to what the token's K most active groups hold.
                let mut c: Vec<u32> = counts.clone();
                c.sort_unstable_by(|a, b| b.cmp(a));
                let most: f64 = c.iter().take(k).map(|&x| x as f64).sum();
                let total = |a: f64| {
                    let (g, c, mg) = cost(a);
                    g.max(c) + mg
                };
                let (g1, c1) = (m.neuron_bytes as f64 / gpu.gpu_bw * 1e9, m.neuron_bytes as f64 / gpu.cpu_bw * 1e9);
                let (g0, _, _) = cost(0.0);
                let cross =
                    ((active as f64 * c1 + gpu.cpu_layer_ns - g0) / (g1 + c1)).clamp(0.0, most.min(active as f64));
                let mut best = cross;
                if most >= active as f64 && total(active as f64) < total(cross) {
                    best = active as f64;
                }
                let (g, c, mg) = cost(best);
                now += g.max(c) + mg;
                cpu_neurons += (active as f64 - best).round() as u64;
                continue;
            }
            // Eager: every active group is brought over before the layer runs.
            let mut stall = (st.ready_ns - now).max(0.0);
            if o.policy == HybridPolicy::Eager {
                let missing: Vec<usize> = (0..n_groups).filter(|&g| counts[g] > 0 && !st.resident[g]).collect();
                let start = now.max(stream_free);
                let done = start + missing.len() as f64 * load_ns;
                stream_free = done;
                stall = stall.max(done - now);
                loads += missing.len() as u64;
                lru_admit(st, &missing, k, t as u64 + 1);
                // Groups past K could not stay: they still ran on the GPU this token.
                for &g in &missing {
                    st.last_use[g] = t as u64 + 1;
                }
            }
            now += stall;
            stall_total += stall;
            let on_gpu: u64 = if o.policy == HybridPolicy::Eager {
                active
            } else {
                counts.iter().zip(&st.resident).filter(|(_, &r)| r).map(|(&c, _)| c as u64).sum()
            };
            cpu_neurons += active - on_gpu;
            let (gpu_ns, cpu_ns, merge) = cost(on_gpu as f64);
            now += gpu_ns.max(cpu_ns) + merge;
            // The policy's next resident set; its new groups go on the reload stream.
            let next = match o.policy {
                HybridPolicy::Static | HybridPolicy::Eager => None,
                HybridPolicy::Oracle | HybridPolicy::LayerSplit => unreachable!("handled above"),
                HybridPolicy::Lru => {
                    let misses: Vec<usize> = (0..n_groups).filter(|&g| counts[g] > 0 && !st.resident[g]).collect();
                    for ((used, &c), &r) in st.last_use.iter_mut().zip(&counts).zip(&st.resident) {
                        if c > 0 && r {
                            *used = t as u64 + 1;
                        }
                    }
                    let before = st.resident.clone();
                    lru_admit(st, &misses, k, t as u64 + 1);
                    Some(before)
                }
                HybridPolicy::Tam { .. } | HybridPolicy::TamAdaptive { .. } => {
                    let lambda = ctl.lambda(l);
                    let tau = (1.0 - lambda) + o.eps;
                    for (s, &c) in st.score.iter_mut().zip(&counts) {
                        *s = lambda * *s + (1.0 - lambda) * c as f32 / gs as f32;
                    }
                    let before = std::mem::replace(&mut st.resident, top_k_mask(&st.score, k, |s| s > tau));
                    // Candidates below τ never displace a resident group (Algorithm 1 keeps the
                    // top K of the candidates only; residents that fell below τ are evicted).
                    Some(before)
                }
            };
            let mut new_loads = 0u32;
            if let Some(before) = next {
                new_loads = st.resident.iter().zip(&before).filter(|(&now_r, &was)| now_r && !was).count() as u32;
                if new_loads > 0 {
                    let start = now.max(stream_free);
                    stream_free = start + new_loads as f64 * load_ns;
                    st.ready_ns = stream_free;
                    loads += new_loads as u64;
                }
            }
            if let HybridPolicy::TamAdaptive { .. } = o.policy {
                // I/O-bound: the layer waited for its loads; CPU-bound: the CPU's share took
                // longer than the GPU's.
                ctl.observe(t as u32, l, stall, (cpu_ns - gpu_ns).max(0.0), new_loads);
            }
        }
        // The output head: on the GPU, except in a layer split that left it on the CPU.
        let head_on_gpu = o.policy != HybridPolicy::LayerSplit || o.gpu_layers.1;
        now += m.head_bytes as f64 * 1e9 / if head_on_gpu { gpu.gpu_bw } else { gpu.cpu_bw };
        if let HybridPolicy::TamAdaptive { .. } = o.policy {
            lambda_trace.push((0..m.n_layer).map(|l| ctl.lambda(l)).sum::<f32>() / m.n_layer.max(1) as f32);
        }
        token_ns.push(now - t0);
    }
    let cpu_share = if all_neurons > 0 { cpu_neurons as f64 / all_neurons as f64 } else { 0.0 };
    let load_bytes = (loads * group_bytes) as f64;
    HybridReport::of_run(o.policy.name(), &token_ns, loads, load_bytes, cpu_share, stall_total, lambda_trace)
}

impl HybridReport {
    /// A run's report from its tokens' times (ns), its loads and their bytes, the CPU's share of
    /// the active units, the time stalled (ns) and λ after each token.
    pub(crate) fn of_run(
        policy: &str,
        token_ns: &[f64],
        loads: u64,
        load_bytes: f64,
        cpu_share: f64,
        stall_ns: f64,
        lambda: Vec<f32>,
    ) -> HybridReport {
        let n = token_ns.len().max(1) as f64;
        let total: f64 = token_ns.iter().sum();
        let mut sorted = token_ns.to_vec();
        sorted.sort_by(f64::total_cmp);
        let pct =
            |p: f64| if sorted.is_empty() { 0.0 } else { sorted[((sorted.len() - 1) as f64 * p).round() as usize] };
        HybridReport {
            policy: policy.into(),
            tokens: token_ns.len(),
            tok_s: if total > 0.0 { token_ns.len() as f64 / (total * 1e-9) } else { 0.0 },
            p50_ns: pct(0.5),
            p99_ns: pct(0.99),
            reloads_per_token: loads as f64 / n,
            reload_bytes_per_token: load_bytes / n,
            cpu_share,
            stall_share: if total > 0.0 { stall_ns / total } else { 0.0 },
            lambda,
        }
    }
}

/// Admits `misses` into an LRU resident set of at most `k` groups, evicting the least recently
/// used; the admitted groups count as used at `tick`.
fn lru_admit(st: &mut LayerState, misses: &[usize], k: usize, tick: u64) {
    for &g in misses {
        if k == 0 {
            return;
        }
        if st.resident.iter().filter(|&&r| r).count() >= k {
            // The least recently used resident not used at this tick.
            let victim = (0..st.resident.len())
                .filter(|&v| st.resident[v] && st.last_use[v] < tick)
                .min_by_key(|&v| (st.last_use[v], v));
            match victim {
                Some(v) => st.resident[v] = false,
                None => return,
            }
        }
        st.resident[g] = true;
        st.last_use[g] = tick;
    }
}

/// The `k` highest of `score` among those `eligible` (ties: lower index), as a mask.
fn top_k_mask(score: &[f32], k: usize, eligible: impl Fn(f32) -> bool) -> Vec<bool> {
    let mut idx: Vec<usize> = (0..score.len()).filter(|&i| eligible(score[i]) && score[i] > 0.0).collect();
    idx.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
    let mut m = vec![false; score.len()];
    for &i in idx.iter().take(k) {
        m[i] = true;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU whose numbers make times easy to check: 1 byte/ns on the GPU, 0.1 byte/ns on the
    /// CPU, transfers at 0.01 byte/ns, no fixed costs.
    fn toy() -> GpuProfile {
        GpuProfile {
            name: "toy".into(),
            gpu_bw: 1e9,
            pcie: vec![(1, 1e7)],
            gpu_layer_ns: 0.0,
            cpu_bw: 1e8,
            cpu_layer_ns: 0.0,
            merge_ns: 0.0,
            engine: None,
        }
    }

    /// The profile measured on the H200 machine (docs/results/issue20-h200) loads with its own
    /// numbers; files that are not such a profile are refused with what is wrong.
    #[test]
    fn probed_profiles_load_and_bad_ones_are_refused() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("docs/results/issue20-h200/h200-profile.json")).unwrap();
        let p = GpuProfile::from_probe(&text).unwrap();
        assert_eq!(p.name, "NVIDIA H200");
        assert_eq!(p.pcie.len(), 7);
        assert!((p.pcie_bw(1 << 20) / 1e9 - 48.37).abs() < 0.01, "{}", p.pcie_bw(1 << 20));
        assert!((p.cpu_bw / 1e9 - 28.1).abs() < 0.01 && (p.merge_ns - 16983.29).abs() < 0.01);
        // The GPU probe alone (no host figure), garbage, a curve out of order, a zero bandwidth.
        let probe_only = std::fs::read_to_string(root.join("docs/results/issue20-h200/gpu-probe.json")).unwrap();
        let bad = [
            (probe_only.as_str(), "host_read_bw"),
            ("not json", "not a `sift probe --gpu` file"),
            (r#"{"name":"x","h2d":[[2,1.0],[1,1.0]],"device_bw":1,"round_trip_ns":1,"host_read_bw":1}"#, "ascending"),
            (r#"{"name":"x","h2d":[[1,1.0]],"device_bw":0,"round_trip_ns":1,"host_read_bw":1}"#, "positive"),
        ];
        for (text, want) in bad {
            let e = GpuProfile::from_probe(text).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    fn model(n_ff: usize) -> HybridModel {
        HybridModel { n_layer: 1, n_ff, neuron_bytes: 100, dense_layer_bytes: 0, head_bytes: 0 }
    }

    fn opts(policy: HybridPolicy, gs: usize, k: usize) -> HybridOptions {
        HybridOptions {
            policy,
            group_size: gs,
            gpu_groups: k,
            gpu_layers: (0, false),
            eps: 0.05,
            bounds: LambdaBounds::default(),
        }
    }

    fn tokens(lists: &[&[u32]]) -> Vec<Vec<Option<Vec<u32>>>> {
        lists.iter().map(|l| vec![Some(l.to_vec())]).collect()
    }

    #[test]
    fn pcie_curve_interpolates_in_log_size() {
        let p = GpuProfile::builtin("rtx4090-pcie4").unwrap();
        assert_eq!(p.pcie_bw(1), 5.8e9);
        assert_eq!(p.pcie_bw(1 << 40), 22.8e9);
        let mid = p.pcie_bw(20 << 10); // between 10 KiB (5.8) and 40 KiB (13.7), halfway in log
        assert!((mid - (5.8e9 + 13.7e9) / 2.0).abs() < 1e6, "{mid}");
    }

    /// Algorithm 1 on one layer, 4 groups of 1 neuron, K = 2, λ = 0.5, ε = 0.05 (τ = 0.55): a
    /// group needs two activations in a row to pass τ (one gives 0.5, a one-hit wonder), and the
    /// top two candidates are resident.
    #[test]
    fn tam_filters_one_hit_wonders_and_keeps_the_top_k() {
        let acts = tokens(&[&[0, 1], &[0, 1, 2], &[0, 3], &[0, 3]]);
        let o = opts(HybridPolicy::Tam { lambda: 0.5 }, 1, 2);
        // By hand: after t0 S = [.5, .5, 0, 0] (none > .55); t1 [.75, .75, .5, 0] → {0, 1};
        // t2 [.875, .375, .25, .5] → {0} (1 fell below τ, 3 is a one-hit wonder);
        // t3 [.9375, .1875, .125, .75] → {0, 3}.
        // Loads: 2 after t1, 0 after t2, 1 after t3 = 3 in all.
        let r = simulate_hybrid(&acts, &model(4), &toy(), &o);
        assert_eq!(r.reloads_per_token, 3.0 / 4.0);
        // CPU share: t0 2/2, t1 3/3 (nothing resident yet), t2: 0 resident → 1 of 2 on CPU
        // (group 3 on the CPU), t3: {0} resident → 3 on the CPU: 1 of 2. (2+3+1+1)/(2+3+2+2).
        assert!((r.cpu_share - 7.0 / 9.0).abs() < 1e-12, "{}", r.cpu_share);
    }

    #[test]
    fn static_holds_the_hottest_groups_and_never_loads() {
        let acts = tokens(&[&[0, 1], &[0, 2], &[0, 1], &[3]]);
        let r = simulate_hybrid(&acts, &model(4), &toy(), &opts(HybridPolicy::Static, 1, 2));
        assert_eq!(r.reloads_per_token, 0.0);
        // Hot set {0, 1} (3 and 2 activations): CPU runs 2 (t1), 3 (t3) of 7.
        assert!((r.cpu_share - 2.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn the_oracle_bounds_every_policy() {
        // A drifting workload: the hot groups move halfway.
        let mut lists: Vec<Vec<u32>> = Vec::new();
        for t in 0..40u32 {
            let base = if t < 20 { 0 } else { 8 };
            lists.push(
                (base..base + 6).chain([(t * 7) % 16]).collect::<std::collections::BTreeSet<_>>().into_iter().collect(),
            );
        }
        let acts: Vec<Vec<Option<Vec<u32>>>> = lists.into_iter().map(|l| vec![Some(l)]).collect();
        let m = model(16);
        let oracle = simulate_hybrid(&acts, &m, &toy(), &opts(HybridPolicy::Oracle, 2, 3));
        for p in ["static", "lru", "tam", "tam-adaptive"] {
            let r = simulate_hybrid(&acts, &m, &toy(), &opts(HybridPolicy::parse(p).unwrap(), 2, 3));
            assert!(r.tok_s <= oracle.tok_s * (1.0 + 1e-9), "{p}: {} > oracle {}", r.tok_s, oracle.tok_s);
        }
        assert_eq!(oracle.reloads_per_token, 0.0);
    }

    /// Times on the toy profile: one neuron of 100 bytes is 100 ns on the GPU, 1000 ns on the
    /// CPU, 10 µs to load (a group of 1).
    #[test]
    fn step_times_follow_the_profile() {
        // Everything on the CPU (K = 0): 3 neurons = 3000 ns per token.
        let acts = tokens(&[&[0, 1, 2], &[0, 1, 2]]);
        let r = simulate_hybrid(&acts, &model(4), &toy(), &opts(HybridPolicy::Lru, 1, 0));
        assert_eq!(r.p50_ns, 3000.0);
        assert_eq!(r.cpu_share, 1.0);
        // Eager with room for all: token 0 waits for 3 loads (30 µs) then 300 ns on the GPU;
        // token 1 finds them resident: 300 ns.
        let r = simulate_hybrid(&acts, &model(4), &toy(), &opts(HybridPolicy::Eager, 1, 4));
        assert_eq!(r.cpu_share, 0.0);
        assert_eq!(r.p99_ns, 30_300.0);
        assert_eq!(r.reloads_per_token, 1.5);
    }

    /// The layer split runs its GPU layers at the GPU's speed and the rest at the CPU's.
    #[test]
    fn layer_split_runs_whole_layers_on_each_side() {
        let m = HybridModel { n_layer: 2, n_ff: 4, neuron_bytes: 100, dense_layer_bytes: 1000, head_bytes: 0 };
        // A layer is 1000 + 4 × 100 bytes.
        assert_eq!(m.layers_for(2000), (1, false));
        assert_eq!(m.layers_for(2800), (2, true));
        let acts: Vec<Vec<Option<Vec<u32>>>> = vec![vec![Some(vec![0, 1]), Some(vec![2])]];
        let mut o = opts(HybridPolicy::LayerSplit, 1, 0);
        o.gpu_layers = (1, false);
        let r = simulate_hybrid(&acts, &m, &toy(), &o);
        // Layer 0 on the CPU: 1200 bytes at 0.1 B/ns = 12 µs; layer 1 on the GPU: 1100 ns.
        assert_eq!(r.p50_ns, 13_100.0);
        assert!((r.cpu_share - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn adaptive_lambda_rises_when_loads_stall() {
        // Every token a new set of groups: loads never arrive in time (10 µs each against
        // ~1 µs of compute), so the layer is I/O-bound and λ climbs from 0.5.
        let lists: Vec<Vec<u32>> = (0..30u32).map(|t| vec![(t % 8) * 2, (t % 8) * 2 + 1, ((t + 3) % 8) * 2]).collect();
        let acts: Vec<Vec<Option<Vec<u32>>>> = lists.into_iter().map(|l| vec![Some(l)]).collect();
        let r = simulate_hybrid(&acts, &model(16), &toy(), &opts(HybridPolicy::TamAdaptive { lambda0: 0.5 }, 1, 4));
        assert_eq!(r.lambda.len(), 30);
        assert!(r.lambda.last().unwrap() > &0.5, "{:?}", r.lambda);
    }
}
