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
use sift_store::io::ReadReq;
use sift_store::tiered::{IoCost, MemoryPlan, PlanInputs, TierError, TieredOptions, TieredStore};
use std::path::Path;

/// Hit rate of an LFU cache holding `cache_share` of a token's active set, without a trace to
/// measure it: the share itself, discounted for the churn of the active set between tokens.
/// (Fitted to sift's own simulations of Qwen2.5-1.5B at Top-K 0.5; see docs/simulator.md.)
pub const DEFAULT_REUSE: f64 = 0.8;
/// The cross-layer prefetcher's share of preloadable misses it predicts (measured on Qwen2.5-1.5B).
pub const DEFAULT_PRELOAD_RECALL: f64 = 0.6;

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
                let r = (1.0 - mplan.cache as f64 / total).clamp(req.min_ratio, req.max_ratio);
                (r * 100.0).round() / 100.0
            }
        };
        let tok_s = match trace {
            Some(t) => {
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
                        tiered: opts.clone(),
                        replay: Replay::Select(Box::new(sel)),
                        calibration: None,
                        label: String::new(),
                    },
                )
                .map_err(|e| TierError::Unsupported(e.to_string()))?;
                r.tok_s
            }
            None => cost_model_tok_s(model, profile, ratio, n, &mplan),
        };
        candidates.push(Candidate {
            preload: n,
            ratio,
            cache_bytes: mplan.cache,
            predicted_tok_s: tok_s,
            refused: None,
        });
        let better = match &best {
            None => true,
            Some((bi, _)) => tok_s > candidates[*bi].predicted_tok_s * 1.0001,
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
        predicted_by: if trace.is_some() { "simulation".into() } else { "cost model".into() },
        candidates,
    })
}

/// ActiveFlow's cost model (Eqs. 1–9) with this engine's terms; decode tokens per second.
pub fn cost_model_tok_s(model: &Model, profile: &DeviceProfile, ratio: f64, preload: usize, plan: &MemoryPlan) -> f64 {
    let Some(index) = model.columns.as_ref() else {
        return 0.0;
    };
    let c = &model.config;
    let a = 1.0 - ratio;
    let total = index.column_bytes() as f64;
    // Share of each token's active bytes the cache can hold, discounted for churn.
    let hr = ((plan.cache as f64 / (a * total).max(1.0)).min(1.0) * DEFAULT_REUSE).min(1.0);
    let mut compute = 0.0;
    let mut preload_bytes = 0.0;
    let mut preload_reqs = 0.0;
    let mut ondemand_bytes = 0.0;
    let mut ondemand_reqs = 0.0;
    for lc in &index.layers {
        for t in &lc.ops {
            let active_cols = a * t.n_in as f64;
            compute += profile.columns_ns(t.ty, (active_cols * t.col_bytes as f64) as u64);
            let miss_cols = active_cols * (1.0 - hr);
            // A miss costs its column, or a whole page when the column is smaller.
            let per = (t.col_bytes as f64).max(4096.0 * (1.0 - a).max(t.col_bytes as f64 / 4096.0).min(1.0));
            let preloadable = preload > 0 && GROUP_OPS.contains(&t.op);
            if preloadable {
                let pre = miss_cols * DEFAULT_PRELOAD_RECALL;
                preload_bytes += pre * per;
                preload_reqs += pre;
                ondemand_bytes += (miss_cols - pre) * per;
                ondemand_reqs += miss_cols - pre;
            } else {
                ondemand_bytes += miss_cols * per;
                ondemand_reqs += miss_cols;
            }
        }
        compute += 4.0 * profile.dispatch_ns();
    }
    compute += profile.dense_ns(model.output.ty, (model.output.row_bytes * model.output.rows) as u64);
    compute += profile.copy_ns((preload_bytes + ondemand_bytes) as u64);
    // Reads: preloads as few large requests, on-demand reads as one batch per site of small ones.
    let batch = |bytes: f64, reqs: f64, size: usize| -> f64 {
        if reqs < 1.0 {
            return 0.0;
        }
        let n = (bytes / size as f64).ceil().max(1.0) as usize;
        // Time of `n` requests of `size`, issued 64 at a time.
        let per_batch = profile.batch_ns(&vec![ReadReq::full(0, size, 0); n.min(64)]);
        per_batch * (n as f64 / 64.0).max(1.0)
    };
    let t_preload = batch(preload_bytes, preload_reqs, 256 << 10);
    let sites = (c.n_layer * 4) as f64;
    let t_ondemand = if ondemand_reqs >= 1.0 {
        let per_site_bytes = ondemand_bytes / sites;
        let size = (ondemand_bytes / ondemand_reqs).max(4096.0) as usize;
        let n_per_site = (per_site_bytes / size as f64).ceil().max(1.0) as usize;
        sites * profile.batch_ns(&vec![ReadReq::full(0, size, 0); n_per_site.min(256)])
    } else {
        0.0
    };
    let t = compute.max(t_preload) + t_ondemand;
    if t > 0.0 {
        1e9 / t
    } else {
        0.0
    }
}
