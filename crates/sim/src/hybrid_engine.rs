//! sift's own hybrid decode, simulated step by step (issue 20): a trace's FFN activity replayed
//! through the engine's [`NeuronBalancer`] — the code `--gpu-policy` runs, so placements, misses
//! and loads are the engine's own — on the engine's pools ([`pool_layout`]) and placement of the
//! dense parts ([`place_attention`]), each step costed with what the engine's operations take on
//! the machine ([`EngineCosts`], measured by `sift probe --gpu -m PACK`).
//!
//! Where [`crate::hybrid`] models KAIROX's design (one synchronisation per layer, costs from
//! bandwidths), this models what sift does today, so that its predictions can be checked
//! against real runs. Per decoded token and layer:
//! - attention: on the GPU (one round trip: [`EngineCosts::attention_gpu_ns`]) or on the CPU;
//! - per FFN site (the FFN input's channels, then the GLU's neurons): the balancer splits the
//!   active units (a pool with no slot, or a site the selector left dense, runs on the CPU
//!   without it, as in the engine); planning and queueing the GPU's share; the CPU computes its share meanwhile
//!   (a cost per site plus one per output value); the GPU's partial sums arrive a fixed time
//!   after queueing, later when the site's loads are still in flight (an I/O stall); then the
//!   policy's loads go on one reload stream at the transfer curve's bandwidth for a group, each
//!   costing the host the time to issue it (eager's before its product);
//! - the rest of the layer on the CPU side (selection, SiLU, norms).
//!
//! Then the output head, on the GPU or the CPU as placed. llama.cpp's layer split (`layers`)
//! runs whole dense layers on each side ([`GpuPlacement::fit`]) at the measured cost of a dense
//! layer there.
//!
//! The trace has no prompt rows: the warm start (the groups most active over the prompt) is
//! taken from the first [`WARM_TOKENS`] decoded tokens instead.

use crate::hybrid::{GpuProfile, HybridReport};
use crate::trace::{Event, Trace};
use sift_engine::balancer::{BalancePolicy, NeuronBalancer};
use sift_engine::gpu::{attention_bytes, head_bytes, GpuPlacement};
use sift_engine::hybrid::{knee_bytes, place_attention, pool_layout, AttentionPlacement, HybridReport as RunReport};

/// Decoded tokens that stand for the prompt in the warm start.
pub const WARM_TOKENS: usize = 16;

/// What the engine's operations cost on one machine, ns (`sift probe --gpu -m PACK` measures
/// them by running the engine; [`EngineCosts::calibrate`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineCosts {
    /// One layer's attention half on the GPU, its round trip included.
    pub attention_gpu_ns: f64,
    /// One layer's attention half on the CPU.
    pub attention_cpu_ns: f64,
    /// Planning one FFN site's split; queueing a GPU share on top.
    pub site_ns: f64,
    pub gpu_queue_ns: f64,
    /// From queueing a GPU share to its partial sums being back (no loads in flight).
    pub gpu_result_ns: f64,
    /// The CPU's share of a site: per site with CPU work, and per output value computed.
    pub cpu_site_ns: f64,
    pub cpu_value_ns: f64,
    /// The rest of a layer on the CPU's side (selection, SiLU, norms, the residual).
    pub layer_ns: f64,
    /// The output head on the GPU and on the CPU.
    pub head_gpu_ns: f64,
    pub head_cpu_ns: f64,
    /// Issuing one group load on the reload stream (the host's side; the copy itself runs at
    /// the transfer curve's rate). Profiles measured before it was calibrated read 0.
    #[serde(default)]
    pub load_issue_ns: f64,
    /// A dense layer of the layer split on the GPU and on the CPU, and the split's round trip
    /// per token.
    pub dense_gpu_layer_ns: f64,
    pub dense_cpu_layer_ns: f64,
    pub dense_round_trip_ns: f64,
}

/// Least squares `y ≈ a·u + b·v` over the rows `(u, v, y)`, both coefficients kept >= 0 (a
/// negative one is dropped and the other fitted alone).
fn fit2(rows: &[(f64, f64, f64)]) -> (f64, f64) {
    let (mut uu, mut uv, mut vv, mut uy, mut vy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(u, v, y) in rows {
        (uu, uv, vv, uy, vy) = (uu + u * u, uv + u * v, vv + v * v, uy + u * y, vy + v * y);
    }
    let only_u = if uu > 0.0 { (uy / uu).max(0.0) } else { 0.0 };
    let only_v = if vv > 0.0 { (vy / vv).max(0.0) } else { 0.0 };
    let det = uu * vv - uv * uv;
    if det.abs() <= 1e-9 * (uu * vv).max(f64::MIN_POSITIVE) {
        // One direction only (every row the same mix): all of it on v, the per-value term.
        return if vv > 0.0 { (0.0, only_v) } else { (only_u, 0.0) };
    }
    let a = (uy * vv - vy * uv) / det;
    let b = (vy * uu - uy * uv) / det;
    match (a >= 0.0, b >= 0.0) {
        (true, true) => (a, b),
        (false, _) => (0.0, only_v),
        (_, false) => (only_u, 0.0),
    }
}

impl EngineCosts {
    /// The costs behind `runs`: hybrid decodes of one model with `n_layer` layers (their
    /// `hybrid` reports; at least one with attention on the GPU and one on the CPU, with
    /// different CPU shares), and the time per token of a dense decode on the CPU and with
    /// every layer and the head on the GPU (`-ngl 99`). `head_gpu_ns` and `round_trip_ns`
    /// (the probe's product round trip) fill in what no run measured alone.
    pub fn calibrate(
        runs: &[RunReport],
        n_layer: usize,
        dense_cpu_ns: f64,
        dense_gpu_ns: f64,
        head_gpu_ns: f64,
        round_trip_ns: f64,
    ) -> Result<EngineCosts, String> {
        let l = n_layer.max(1) as f64;
        let ms = 1e6;
        let gpu_att: Vec<&RunReport> = runs.iter().filter(|r| r.attention_on_gpu).collect();
        let cpu_att: Vec<&RunReport> = runs.iter().filter(|r| !r.attention_on_gpu).collect();
        if gpu_att.is_empty() || cpu_att.is_empty() {
            return Err("calibration needs a hybrid run with attention on the GPU and one on the CPU".into());
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let attention_gpu_ns = mean(&gpu_att.iter().map(|r| r.gpu_attention_ms * ms / l).collect::<Vec<_>>());
        let attention_cpu_ns = mean(&cpu_att.iter().map(|r| r.cpu_attention_ms * ms / l).collect::<Vec<_>>());
        let head_cpu: Vec<f64> = runs.iter().filter(|r| !r.head_on_gpu).map(|r| r.head_ms * ms).collect();
        let head_gpu: Vec<f64> = runs.iter().filter(|r| r.head_on_gpu).map(|r| r.head_ms * ms).collect();
        let (site_ns, gpu_queue_ns) = fit2(
            &runs.iter().map(|r| (r.sites_per_token, r.gpu_products_per_token, r.queue_ms * ms)).collect::<Vec<_>>(),
        );
        let (cpu_site_ns, cpu_value_ns) = fit2(
            &runs
                .iter()
                .map(|r| (r.cpu_sites_per_token, r.cpu_values_per_token, r.cpu_ffn_ms * ms))
                .collect::<Vec<_>>(),
        );
        // The result's latency from the runs where the CPU had little to do meanwhile (its
        // wait then is the whole of it): the run with the least CPU work per GPU product.
        let lightest = runs
            .iter()
            .filter(|r| r.gpu_products_per_token > 0.0)
            .min_by(|a, b| {
                let w = |r: &RunReport| r.cpu_ffn_ms / r.gpu_products_per_token;
                w(a).total_cmp(&w(b))
            })
            .ok_or("calibration needs a hybrid run where the GPU computed units")?;
        let gpu_result_ns = (lightest.gpu_wait_ms + lightest.cpu_ffn_ms) * ms / lightest.gpu_products_per_token;
        let layer_ns = mean(&runs.iter().map(|r| r.other_ms * ms / l).collect::<Vec<_>>());
        let head_cpu_ns = if head_cpu.is_empty() { 0.0 } else { mean(&head_cpu) };
        let loads: f64 = runs.iter().map(|r| r.reloads_per_token).sum();
        let load_issue_ns = if loads > 0.0 { runs.iter().map(|r| r.load_ms * ms).sum::<f64>() / loads } else { 0.0 };
        let head_gpu_ns = if head_gpu.is_empty() { head_gpu_ns } else { mean(&head_gpu) };
        let c = EngineCosts {
            attention_gpu_ns,
            attention_cpu_ns,
            site_ns,
            gpu_queue_ns,
            gpu_result_ns,
            cpu_site_ns,
            cpu_value_ns,
            layer_ns,
            head_gpu_ns,
            head_cpu_ns,
            load_issue_ns,
            dense_gpu_layer_ns: ((dense_gpu_ns - head_gpu_ns - round_trip_ns) / l).max(0.0),
            dense_cpu_layer_ns: ((dense_cpu_ns - head_cpu_ns) / l).max(0.0),
            dense_round_trip_ns: round_trip_ns,
        };
        c.check()?;
        Ok(c)
    }

    /// Every cost a finite number >= 0.
    pub fn check(&self) -> Result<(), String> {
        let all = [
            self.attention_gpu_ns,
            self.attention_cpu_ns,
            self.site_ns,
            self.gpu_queue_ns,
            self.gpu_result_ns,
            self.cpu_site_ns,
            self.cpu_value_ns,
            self.layer_ns,
            self.head_gpu_ns,
            self.head_cpu_ns,
            self.load_issue_ns,
            self.dense_gpu_layer_ns,
            self.dense_cpu_layer_ns,
            self.dense_round_trip_ns,
        ];
        if all.iter().all(|v| v.is_finite() && *v >= 0.0) {
            Ok(())
        } else {
            Err("the engine's costs must be numbers >= 0 (ns): measure again with `sift probe --gpu -m PACK -o FILE`"
                .into())
        }
    }
}

/// How one simulated run is set up.
#[derive(Clone, Debug)]
pub struct EngineRun {
    /// A balancing policy, or `None` for the layer split.
    pub policy: Option<BalancePolicy>,
    pub gpu_bytes: u64,
    pub attention: AttentionPlacement,
    /// Context positions whose KV cache the GPU holds (`-c`).
    pub n_ctx: usize,
    pub group_size: Option<usize>,
}

/// What a simulated run placed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnginePlacement {
    pub attention: bool,
    pub head: bool,
    /// Slots over all pools' groups (hybrid), or layers on the GPU (layer split).
    pub gpu_share: f64,
    pub gpu_layers: usize,
}

/// Per decoded token, per layer: the active units of the FFN input (channels) and of the GLU
/// (neurons), in the model's order (`None`: all).
pub type FfnActivity = Vec<Vec<[Option<Vec<u32>>; 2]>>;

/// The FFN sites' activity of every decoded token of `trace`.
pub fn ffn_sites(trace: &Trace) -> FfnActivity {
    trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Token { layers, .. } => {
                Some(layers.iter().map(|l| [l.sites[2].active.clone(), l.sites[3].active.clone()]).collect())
            }
            _ => None,
        })
        .collect()
}

fn units(a: &Option<Vec<u32>>, n: usize) -> std::borrow::Cow<'_, [u32]> {
    match a {
        Some(v) => std::borrow::Cow::Borrowed(v),
        None => std::borrow::Cow::Owned((0..n as u32).collect()),
    }
}

/// Replays `activity` through the engine's hybrid decode of `model` (a pack) on `gpu`'s transfer
/// curve with `costs`; `Err` when the model is no pack.
pub fn simulate_engine(
    activity: &FfnActivity,
    model: &sift_model::Model,
    gpu: &GpuProfile,
    costs: &EngineCosts,
    run: &EngineRun,
) -> Result<(HybridReport, EnginePlacement), String> {
    let n_layer = model.layers.len();
    let mut token_ns = Vec::with_capacity(activity.len());
    let Some(policy) = run.policy else {
        let p = GpuPlacement::fit(model, run.gpu_bytes, run.n_ctx);
        let on_gpu = p.n_layer - p.first_layer;
        let t = (n_layer - on_gpu) as f64 * costs.dense_cpu_layer_ns
            + on_gpu as f64 * costs.dense_gpu_layer_ns
            + if p.output { costs.head_gpu_ns } else { costs.head_cpu_ns }
            + if on_gpu > 0 { costs.dense_round_trip_ns } else { 0.0 };
        token_ns.resize(activity.len(), t);
        let placed = EnginePlacement {
            attention: false,
            head: p.output,
            gpu_share: on_gpu as f64 / n_layer.max(1) as f64,
            gpu_layers: on_gpu,
        };
        return Ok((
            HybridReport::of_run("layers", &token_ns, 0, 0.0, 1.0 - placed.gpu_share, 0.0, Vec::new()),
            placed,
        ));
    };
    let dense = place_attention(run.attention, attention_bytes(model, run.n_ctx), head_bytes(model), run.gpu_bytes)?;
    let layout = pool_layout(model, run.group_size, dense.group_bytes, knee_bytes(&gpu.pcie))
        .ok_or("hybrid decode runs on a pack's columns: pass the .sift file")?;
    let specs = &layout.specs;
    let sizes: Vec<usize> = specs.iter().map(|s| s.group_size).collect();
    let slots: Vec<usize> = specs.iter().map(|s| s.slots).collect();
    let mut bal = NeuronBalancer::new(policy, &layout.positions, &sizes, &slots);
    let load_ns: Vec<f64> = specs
        .iter()
        .map(|s| {
            let b = s.group_bytes() as u64;
            b as f64 / gpu.pcie_bw(b).max(1.0) * 1e9
        })
        .collect();
    let n_units: Vec<usize> = layout.positions.iter().map(|p| p.len()).collect();
    // The warm start from the first tokens (the trace has no prompt rows).
    for tok in activity.iter().take(WARM_TOKENS) {
        for (l, sites) in tok.iter().enumerate().take(n_layer) {
            for (i, a) in sites.iter().enumerate() {
                let p = 2 * l + i;
                bal.observe_prompt(p, &units(a, n_units[p]));
            }
        }
    }
    for p in 0..bal.n_sites() {
        bal.warm_start(p);
    }
    let (mut now, mut stream_free) = (0f64, 0f64);
    let mut ready = vec![0f64; bal.n_sites()];
    let (mut loads, mut load_bytes, mut all_units, mut cpu_units, mut stall_total) = (0u64, 0f64, 0u64, 0u64, 0f64);
    let mut lambda = Vec::new();
    let mut queue = |p: usize, n: usize, now: f64, ready: &mut [f64]| {
        if n > 0 {
            let start = now.max(stream_free);
            stream_free = start + n as f64 * load_ns[p];
            ready[p] = stream_free;
        }
    };
    for tok in activity {
        let t0 = now;
        for (l, sites) in tok.iter().enumerate().take(n_layer) {
            now += if dense.attention { costs.attention_gpu_ns } else { costs.attention_cpu_ns };
            for (i, a) in sites.iter().enumerate() {
                let p = 2 * l + i;
                if a.is_none() || specs[p].slots == 0 {
                    // No balanced product: a site the selector left dense runs whole on the CPU
                    // (the engine does not split it), and so does a pool with no slot (the
                    // engine skips the balancer there).
                    let n = a.as_ref().map_or(n_units[p], |v| v.len());
                    if n > 0 {
                        now += costs.cpu_site_ns + (n * specs[p].n_out) as f64 * costs.cpu_value_ns;
                    }
                    all_units += n as u64;
                    cpu_units += n as u64;
                    continue;
                }
                let active = units(a, n_units[p]);
                let plan = bal.plan(p, &active);
                now += plan.load_first.len() as f64 * costs.load_issue_ns;
                queue(p, plan.load_first.len(), now, &mut ready);
                loads += plan.load_first.len() as u64;
                load_bytes += (plan.load_first.len() * specs[p].group_bytes()) as f64;
                let on_gpu = !plan.gpu.is_empty();
                let tq = costs.site_ns + if on_gpu { costs.gpu_queue_ns } else { 0.0 };
                let cpu = if plan.cpu_units.is_empty() {
                    0.0
                } else {
                    costs.cpu_site_ns + (plan.cpu_units.len() * specs[p].n_out) as f64 * costs.cpu_value_ns
                };
                let stall = if on_gpu { (ready[p] - (now + tq)).max(0.0) } else { 0.0 };
                let wait = if on_gpu { (stall + costs.gpu_result_ns - cpu).max(0.0) } else { 0.0 };
                now += tq + cpu + wait;
                stall_total += stall;
                all_units += active.len() as u64;
                cpu_units += plan.cpu_units.len() as u64;
                // The engine tells the policy how long a product that found loads in flight
                // waited after the CPU's share (its I/O stall), and the CPU's time.
                let next = bal.after(p, &plan, if stall > 0.0 { wait } else { 0.0 }, cpu);
                now += next.len() as f64 * costs.load_issue_ns;
                queue(p, next.len(), now, &mut ready);
                loads += next.len() as u64;
                load_bytes += (next.len() * specs[p].group_bytes()) as f64;
            }
            now += costs.layer_ns;
        }
        now += if dense.head { costs.head_gpu_ns } else { costs.head_cpu_ns };
        if let BalancePolicy::TamAdaptive { .. } = policy {
            lambda.push(bal.mean_lambda());
        }
        bal.end_token();
        token_ns.push(now - t0);
    }
    let groups: usize = specs.iter().map(|s| s.n_groups).sum();
    let placed = EnginePlacement {
        attention: dense.attention,
        head: dense.head,
        gpu_share: slots.iter().sum::<usize>() as f64 / groups.max(1) as f64,
        gpu_layers: 0,
    };
    let cpu_share = if all_units > 0 { cpu_units as f64 / all_units as f64 } else { 0.0 };
    Ok((HybridReport::of_run(policy.name(), &token_ns, loads, load_bytes, cpu_share, stall_total, lambda), placed))
}

/// How well layer `l`'s attention output predicts layer `l + 1`'s FFN input channels (KAIROX's
/// adjacent-layer prediction, which would start a layer's loads one layer early): per decoded
/// token and layer, layer `l`'s FFN input with its norm's weights divided out and layer
/// `l + 1`'s multiplied in (the residual stream changes little across one FFN) is ranked by
/// magnitude, and as many channels are predicted as layer `l + 1` used; against the channels it
/// did use, per channel and per group (`group_size` consecutive channels of the pack's order, a
/// group counted as used when it holds at least the site's share of used channels, as the
/// balancer counts it).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct AdjacentPrediction {
    pub channel_recall: f64,
    pub channel_precision: f64,
    pub group_recall: f64,
    pub group_precision: f64,
    /// The baseline: layer `l + 1`'s channels of the token before, as a prediction (recall; as
    /// many channels as used, so also its precision when the counts match).
    pub previous_token_recall: f64,
    /// (token, layer) pairs scored.
    pub pairs: usize,
}

/// [`AdjacentPrediction`] over `trace` (recorded with the selector's inputs) for `model`.
pub fn adjacent_prediction(trace: &Trace, model: &sift_model::Model, group_size: usize) -> AdjacentPrediction {
    let gs = group_size.max(1);
    let layout = pool_layout(model, Some(gs), 0, 0);
    let (mut hit, mut predicted, mut used) = (0u64, 0u64, 0u64);
    let (mut ghit, mut gpred, mut gused) = (0u64, 0u64, 0u64);
    let mut pairs = 0;
    let (mut prev_hit, mut prev_used) = (0u64, 0u64);
    let mut previous: Vec<Option<Vec<u32>>> = Vec::new();
    let hot = |set: &[u32], pos: Option<&[u32]>, n: usize| -> Vec<bool> {
        let n_groups = n.div_ceil(gs);
        let mut count = vec![0u32; n_groups];
        for &u in set {
            let p = pos.and_then(|p| p.get(u as usize).copied()).unwrap_or(u) as usize;
            if p < n {
                count[p / gs] += 1;
            }
        }
        let share = set.len() as f64 / n.max(1) as f64;
        (0..n_groups).map(|g| count[g] > 0 && f64::from(count[g]) >= share * (n - g * gs).min(gs) as f64).collect()
    };
    for e in &trace.events {
        let layers = match e {
            Event::Token { layers, .. } => layers,
            _ => {
                // A new sequence or prompt: no token before.
                previous.clear();
                continue;
            }
        };
        for l in 0..layers.len().saturating_sub(1).min(model.layers.len().saturating_sub(1)) {
            let (now, next) = (&layers[l].sites[2], &layers[l + 1].sites[2]);
            let Some(actual) = &next.active else { continue };
            let (g0, g1) = (&model.layers[l].ffn_norm, &model.layers[l + 1].ffn_norm);
            let n = now.input.len();
            if n == 0 || g0.len() != n || g1.len() != n || actual.is_empty() {
                continue;
            }
            let mut scored: Vec<(f32, u32)> = (0..n)
                .map(|c| {
                    let v = if g0[c] != 0.0 { now.input[c] / g0[c] * g1[c] } else { 0.0 };
                    (v.abs(), c as u32)
                })
                .collect();
            let k = actual.len().min(n);
            if k < n {
                scored.select_nth_unstable_by(k, |a, b| b.0.total_cmp(&a.0));
                scored.truncate(k);
            }
            let mut pred: Vec<u32> = scored.into_iter().map(|s| s.1).collect();
            pred.sort_unstable();
            let inter = pred.iter().filter(|u| actual.binary_search(u).is_ok()).count() as u64;
            (hit, predicted, used) = (hit + inter, predicted + pred.len() as u64, used + actual.len() as u64);
            let pos = layout.as_ref().map(|lay| &lay.positions[2 * (l + 1)][..]);
            let (hp, ha) = (hot(&pred, pos, n), hot(actual, pos, n));
            ghit += hp.iter().zip(&ha).filter(|(a, b)| **a && **b).count() as u64;
            gpred += hp.iter().filter(|&&h| h).count() as u64;
            gused += ha.iter().filter(|&&h| h).count() as u64;
            pairs += 1;
            if let Some(Some(before)) = previous.get(l + 1) {
                prev_hit += before.iter().filter(|u| actual.binary_search(u).is_ok()).count() as u64;
                prev_used += actual.len() as u64;
            }
        }
        previous = layers.iter().map(|r| r.sites[2].active.clone()).collect();
    }
    let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    AdjacentPrediction {
        channel_recall: ratio(hit, used),
        channel_precision: ratio(hit, predicted),
        group_recall: ratio(ghit, gused),
        group_precision: ratio(ghit, gpred),
        previous_token_recall: ratio(prev_hit, prev_used),
        pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit2_recovers_both_terms_and_never_goes_negative() {
        // y = 3u + 0.5v, exactly.
        let rows = [(60.0, 1000.0, 680.0), (60.0, 3000.0, 1680.0), (30.0, 0.0, 90.0)];
        let (a, b) = fit2(&rows);
        assert!((a - 3.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-9, "{a} {b}");
        // One mix only: all on the per-value term.
        let (a, b) = fit2(&[(60.0, 1000.0, 500.0), (120.0, 2000.0, 1000.0)]);
        assert_eq!((a, b), (0.0, 0.5));
        // A fit that wants a negative per-site cost drops it.
        let (a, b) = fit2(&[(60.0, 1000.0, 100.0), (60.0, 3000.0, 900.0)]);
        assert_eq!(a, 0.0);
        assert!(b > 0.0);
        assert_eq!(fit2(&[]), (0.0, 0.0));
    }

    fn run_report(attention_on_gpu: bool, head_on_gpu: bool) -> RunReport {
        RunReport { attention_on_gpu, head_on_gpu, ..RunReport::default() }
    }

    /// Three runs made from known costs give those costs back.
    #[test]
    fn calibration_inverts_the_runs_it_was_made_from() {
        let l = 30.0;
        // Attention and head on the GPU, every unit there: 60 GPU products, no CPU work.
        let mut a = run_report(true, true);
        (a.gpu_attention_ms, a.head_ms, a.sites_per_token, a.gpu_products_per_token) = (l * 0.05, 0.02, 60.0, 60.0);
        (a.queue_ms, a.gpu_wait_ms, a.cpu_ffn_ms, a.other_ms) = (60.0 * 0.012, 60.0 * 0.015, 0.0, l * 0.01);
        // Attention on the CPU, half the units there.
        let mut b = run_report(false, false);
        (b.cpu_attention_ms, b.head_ms, b.sites_per_token, b.gpu_products_per_token) = (l * 0.04, 0.6, 60.0, 60.0);
        (b.cpu_sites_per_token, b.cpu_values_per_token) = (60.0, 1e6);
        (b.queue_ms, b.cpu_ffn_ms, b.gpu_wait_ms, b.other_ms) = (60.0 * 0.012, 60.0 * 0.005 + 1.0, 0.0, l * 0.01);
        // Nearly everything on the CPU: fewer GPU products.
        let mut c = b.clone();
        (c.gpu_products_per_token, c.cpu_values_per_token) = (30.0, 3e6);
        (c.queue_ms, c.cpu_ffn_ms) = (60.0 * 0.002 + 30.0 * 0.010, 60.0 * 0.005 + 3.0);
        (c.reloads_per_token, c.load_ms) = (40.0, 40.0 * 0.004);
        let close = |x: f64, want: f64| (x - want).abs() <= 1e-6 * want.max(1.0);
        let k = EngineCosts::calibrate(&[a, b, c], 30, 3e6, 1e6, 0.0, 20_000.0).unwrap();
        assert!(close(k.load_issue_ns, 4_000.0), "{k:?}");
        assert!(close(k.attention_gpu_ns, 50_000.0) && close(k.attention_cpu_ns, 40_000.0), "{k:?}");
        assert!(close(k.head_gpu_ns, 20_000.0) && close(k.head_cpu_ns, 600_000.0), "{k:?}");
        assert!(close(k.site_ns, 2_000.0) && close(k.gpu_queue_ns, 10_000.0), "{k:?}");
        assert!(close(k.cpu_site_ns, 5_000.0) && close(k.cpu_value_ns, 1.0), "{k:?}");
        assert!(close(k.gpu_result_ns, 15_000.0) && close(k.layer_ns, 10_000.0), "{k:?}");
        // Dense: (3 ms - the CPU head) / 30 and (1 ms - the GPU head - the round trip) / 30.
        assert!(close(k.dense_cpu_layer_ns, 80_000.0) && close(k.dense_gpu_layer_ns, 32_000.0), "{k:?}");
        // Both placements of attention are needed.
        let err = EngineCosts::calibrate(&[run_report(true, true)], 30, 1.0, 1.0, 0.0, 0.0).unwrap_err();
        assert!(err.contains("attention on the GPU and one on the CPU"), "{err}");
    }
}
