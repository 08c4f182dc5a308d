//! The planner (`sift plan`, and `--memory` alone on any command): ActiveFlow §4.1's search for
//! the sparsity, cross-layer group size and cache size that minimise decode time under a memory
//! budget on a given device.
//!
//! Following ActiveFlow, the budget is a hard constraint and accuracy depends only on sparsity, so
//! the sparsity is the lowest that lets one token's active columns fit in the cache
//! (`sp = 1 − cache / column bytes`, their `1 − M_max / S_m` for the streamed part of the model),
//! clamped to `[0, max_ratio]`; then each candidate group size N (0 = no preloading, 1 = KAIROX's
//! next layer, 2, 4, 8, and the pack's interleaved group) is planned exactly as the engine
//! would ([`TieredStore`]'s own [`MemoryPlan`], which charges N's preload buffers to the budget)
//! and its decode time predicted; the fastest wins. ActiveFlow grows N until preloading hides
//! behind compute; trying every N is cheap here and finds the same optimum without the stopping
//! rule.
//!
//! Prediction: with a trace ([`crate::trace`]), each candidate is simulated ([`crate::replay`]) with
//! Top-K at its ratio — the engine's own cache and prefetch code on the profile's clock. Without
//! one, ActiveFlow's cost model (Eqs. 1–9) is evaluated with this engine's terms: per token the
//! active bytes `A = (1 − sp)·S`, a hit rate `hr` from the cache's share of the active set,
//! compute at the profile's kernel speed, preloaded misses (q/k/v/gate/up, at the prefetcher's
//! recall) read at large-request bandwidth overlapped with compute, the rest read on demand at
//! small-request bandwidth (a column read costs a whole 4 KiB page when it is smaller).

use crate::profile::DeviceProfile;
use crate::replay::{simulate, Replay, SimOptions};
use crate::trace::Trace;
use sift_model::layout::GROUP_OPS;
use sift_model::Model;
use sift_sparsity::{Method, Ratios, TopKSelector};
use sift_store::cache::Policy;
use sift_store::tiered::{
    split_cache, CacheSplit, IoCost, MemoryPlan, PlanInputs, TierError, TieredOptions, TieredStore,
};
use std::path::Path;

/// The cross-layer prefetcher's share of preloadable misses it brings in, and the share of what it
/// reads that is used (measured on Qwen2.5-1.5B under --memory: recall 0.17–0.29, precision
/// 0.46–0.55 for preload 4; docs/benchmarks.md).
pub const DEFAULT_PRELOAD_RECALL: f64 = 0.25;
pub const DEFAULT_PRELOAD_PRECISION: f64 = 0.5;

/// What to plan for.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    pub inputs: PlanInputs,
    /// The cache policy (the planner does not choose it; lfu is ActiveFlow's).
    pub policy: Policy,
    /// Highest sparsity the planner may pick (accuracy limit).
    pub max_ratio: f64,
    /// Lowest sparsity (0: dense allowed).
    pub min_ratio: f64,
    /// The sparsity the user fixed (the planner then chooses only the group size).
    pub fixed_ratio: Option<f64>,
    pub base: TieredOptions,
    /// Sequences decoded together (a server's `-np`): their selections' union must fit the cache,
    /// and a step decodes one token of each ([`union_fraction`]).
    pub sequences: usize,
}

/// The share of an op's units that `k` sequences' selections need together when each needs `a`
/// of them, as if they chose independently: `1 − (1 − a)^k`. Measured on SmolLM2-135M with Top-K
/// 0.5 (`/admin/stats` `batch_union`): 0.73 / 0.91 / 0.98 of the units at 2 / 4 / 8 sequences,
/// this gives 0.75 / 0.94 / 0.996 (the sequences' choices overlap a little more than chance).
pub fn union_fraction(a: f64, k: usize) -> f64 {
    1.0 - (1.0 - a.clamp(0.0, 1.0)).powi(k.max(1) as i32)
}

/// One candidate the planner weighed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Candidate {
    pub preload: usize,
    pub ratio: f64,
    pub cache_bytes: u64,
    pub predicted_tok_s: f64,
    /// Why it could not run, if so.
    pub refused: Option<String>,
}

/// The planner's choice.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    pub sparsity: String,
    pub ratio: f64,
    pub preload: usize,
    pub cache_policy: String,
    pub memory: MemoryPlan,
    pub predicted_tok_s: f64,
    /// "simulation" (a trace was given) or "cost model".
    pub predicted_by: String,
    pub candidates: Vec<Candidate>,
}

/// Plans a run of `model` (the pack at `path`) under `req` on `profile`, simulating `trace` when
/// given.
pub fn plan(
    model: &Model,
    path: &Path,
    profile: &DeviceProfile,
    req: &PlanRequest,
    trace: Option<&Trace>,
) -> Result<Plan, TierError> {
    let index = model.columns.as_ref().ok_or_else(|| TierError::Unsupported("planning needs a sift pack".into()))?;
    let total = index.column_bytes() as f64;
    let mut sizes = vec![0usize, 1, 2, 4, 8, index.group_size()];
    sizes.retain(|&n| n <= model.config.n_layer);
    sizes.sort_unstable();
    sizes.dedup();
    let mut candidates = Vec::new();
    let mut best: Option<(usize, MemoryPlan)> = None;
    let mut first_err = None;
    for &n in &sizes {
        let opts = TieredOptions { preload: n, policy: req.policy, ..req.base.clone() };
        let store = match TieredStore::simulated(model, path, &opts, &req.inputs, Box::new(profile.clone())) {
            Ok(s) => s,
            Err(e) => {
                candidates.push(Candidate {
                    preload: n,
                    ratio: 0.0,
                    cache_bytes: 0,
                    predicted_tok_s: 0.0,
                    refused: Some(e.to_string()),
                });
                first_err.get_or_insert(e);
                continue;
            }
        };
        let mplan = store.plan.clone();
        drop(store);
        let ratio = match req.fixed_ratio {
            Some(r) => r,
            None => {
                // The lowest sparsity whose active columns (the union of the sequences' at a
                // step) fit the cache: 1 − r^k ≤ cache / total.
                let k = req.sequences.max(1) as f64;
                let r = (1.0 - mplan.cache as f64 / total).max(0.0).powf(1.0 / k).clamp(req.min_ratio, req.max_ratio);
                (r * 100.0).round() / 100.0
            }
        };
        let tok_s = match trace {
            // A trace holds one sequence: several are predicted by the cost model.
            Some(t) if req.sequences <= 1 => {
                let ratios = Ratios::uniform(Method::TopK, model.config.n_layer, ratio)
                    .map_err(|e| TierError::Unsupported(e.to_string()))?;
                let sel = TopKSelector::new("topk", ratios);
                let r = simulate(
                    model,
                    path,
                    t,
                    profile,
                    SimOptions {
                        budget: req.inputs.budget,
                        inputs: Some(req.inputs.clone()),
                        tiered: opts.clone(),
                        replay: Replay::Select(Box::new(sel)),
                        calibration: None,
                        label: String::new(),
                    },
                )
                .map_err(|e| TierError::Unsupported(e.to_string()))?;
                r.tok_s
            }
            _ => cost_model_tok_s(model, profile, ratio, n, &mplan, req.sequences),
        };
        candidates.push(Candidate {
            preload: n,
            ratio,
            cache_bytes: mplan.cache,
            predicted_tok_s: tok_s,
            refused: None,
        });
        // Candidates come in growing preload, each with less cache than the last: one must
        // promise clearly more speed (beyond the cost model's few percent of noise) to be
        // chosen over a plan that keeps more of the budget as cache.
        let better = match &best {
            None => true,
            Some((bi, _)) => tok_s > candidates[*bi].predicted_tok_s * 1.02,
        };
        if better {
            best = Some((candidates.len() - 1, mplan));
        }
    }
    let Some((bi, memory)) = best else {
        return Err(first_err.unwrap_or_else(|| TierError::Budget("no plan fits the budget".into())));
    };
    let c = &candidates[bi];
    Ok(Plan {
        sparsity: if c.ratio > 0.0 { "topk".into() } else { "dense".into() },
        ratio: c.ratio,
        preload: c.preload,
        cache_policy: req.policy.name().into(),
        memory,
        predicted_tok_s: c.predicted_tok_s,
        predicted_by: if trace.is_some() && req.sequences <= 1 { "simulation".into() } else { "cost model".into() },
        candidates,
    })
}

/// ActiveFlow's cost model (Eqs. 1–9) with this engine's terms; decode tokens per second.
///
/// Per token: active columns `a = 1 − ratio` of every op; a hit rate from the cache's share `f`
/// of the op's columns as the store splits the cache ([`hit_rate_estimate`]); each op's missed columns read either as separate page
/// reads (a column costs itself plus about a page) or, when misses lie closer than the read
/// planner's 4 KiB merge gap, as long merged runs (a miss then costs the columns in between too);
/// preloadable misses (q/k/v/gate/up, with `preload > 0`) at the prefetcher's recall and
/// precision, read as large requests while the token computes; on-demand reads one batch per site.
/// Decode time = max(compute + on-demand, preload + on-demand) + buffer copies.
///
/// With `sequences` k > 1 decoded together, a step computes each sequence's own columns (k times
/// one token's compute, one output head over k rows at about one's cost) and reads the misses of
/// their union ([`union_fraction`]); the result is the tokens of all sequences per second.
pub fn cost_model_tok_s(
    model: &Model,
    profile: &DeviceProfile,
    ratio: f64,
    preload: usize,
    plan: &MemoryPlan,
    sequences: usize,
) -> f64 {
    let Some(index) = model.columns.as_ref() else {
        return 0.0;
    };
    let k = sequences.max(1);
    let a_token = (1.0 - ratio).clamp(1e-3, 1.0);
    // What the step reads and caches: the union of the sequences' columns.
    let a = union_fraction(a_token, k).clamp(1e-3, 1.0);
    // The cache's share of each op's columns, as the store splits it (small columns first).
    let share = split_cache(index, plan.cache, CacheSplit::ReadCost);
    let mut compute = 0.0;
    let (mut preload_bytes, mut copied) = (0.0, 0.0);
    let mut t_ondemand = 0.0;
    for lc in &index.layers {
        // On-demand bytes and request size per site (q/k/v, o, gate/up, down).
        let mut site = [(0.0f64, 4096.0f64); 4];
        for t in &lc.ops {
            let cb = t.col_bytes as f64;
            let active_cols = a * t.n_in as f64;
            compute += k as f64 * profile.columns_ns(t.ty.cost_class(), (a_token * t.n_in as f64 * cb) as u64);
            let hr = hit_rate_estimate(share[t.op as usize], a);
            let miss_cols = active_cols * (1.0 - hr);
            let density = (a * (1.0 - hr)).max(1e-6);
            let gap = cb * (1.0 / density - 1.0);
            let (per, req) = if gap <= 4096.0 { (cb / density, 256.0 * 1024.0) } else { (cb + 4096.0, cb + 4096.0) };
            let bytes = (miss_cols * per).min(t.len as f64);
            copied += miss_cols * cb;
            let preloadable = preload > 0 && GROUP_OPS.contains(&t.op);
            let on_demand = if preloadable {
                preload_bytes += bytes * DEFAULT_PRELOAD_RECALL / DEFAULT_PRELOAD_PRECISION;
                bytes * (1.0 - DEFAULT_PRELOAD_RECALL)
            } else {
                bytes
            };
            let si = t.op.site_index();
            site[si].0 += on_demand;
            site[si].1 = site[si].1.max(req);
        }
        for (bytes, req) in site {
            if bytes > 0.0 {
                let size = req as usize;
                t_ondemand += profile.read_lat_ns(size) + bytes / profile.disk_bw(size, 64) * 1e9;
            }
        }
        compute += 4.0 * profile.dispatch_ns();
    }
    compute += profile.dense_ns(model.output.ty, (model.output.row_bytes * model.output.rows) as u64);
    let t_preload = preload_bytes / profile.disk_bw(256 << 10, 16) * 1e9;
    let t = (compute + t_ondemand).max(t_preload + t_ondemand) + profile.copy_ns(copied as u64);
    if t > 0.0 {
        k as f64 * 1e9 / t
    } else {
        0.0
    }
}

/// Share of active columns found in the cache, from the cache's share `f` of all columns and the
/// active share `a`: `0.8·(f/a)^0.6`, at most 0.9; 1 when every column fits. Fitted to sift's own
/// simulations of Qwen2.5-1.5B traces (LFU, Top-K 0.5, 24 tokens from a cold cache: 26%, 45%, 60%,
/// 77%, 84% at f/a = 0.16, 0.38, 0.62, 0.96, 1.46); a trace (`sift plan --trace`) replaces it.
pub fn hit_rate_estimate(f: f64, a: f64) -> f64 {
    if f >= 1.0 {
        return 1.0;
    }
    (0.8 * (f / a.max(1e-6)).powf(0.6)).min(0.9)
}
