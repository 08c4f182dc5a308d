//! The simulator (`sift simulate`): a trace replayed through the engine's own tiered store on a
//! device profile's clock.
//!
//! The store is a [`TieredStore::simulated`]: the same memory plan, the same [`UnitCache`]
//! policies, the same cross-layer prefetcher and read planning as a real run under `--memory`,
//! with the slow tier replaced by a virtual one ([`sift_store::simulated`]) that moves no bytes
//! and charges each batch of reads the time the [`DeviceProfile`] gives. Replaying the recorded
//! choices therefore reproduces a real run's hits and misses exactly; what is modelled is time:
//!
//! - reads: each batch (on-demand reads of a site, a preload group) costs the profile's latency
//!   plus transfer time at the bandwidth of its request sizes and queue depth; one job at a time
//!   on the device, on-demand reads after the job in progress and before queued ones;
//! - overlap: preloads run while the compute clock advances; the compute thread waits only when
//!   it needs a read that has not finished (the store's stall time);
//! - compute: per site, the column kernel's time for the active columns' bytes (the profile's
//!   measured throughput per column type) plus a pool dispatch; per layer, attention reading the
//!   f32 KV cache at memory bandwidth; per token, the dense output head; copies from the read
//!   buffers into the cache arena at memory-copy bandwidth.
//!
//! Belady's optimal policy ([`Policy::Belady`]) is available here only: it needs the future, which
//! the simulator knows (the selections are computed before the replay). Static and Belady start
//! with the hot set filled (off the clock); the other policies start cold, as the engine does.
//!
//! [`UnitCache`]: sift_store::cache::UnitCache

use crate::bound::{must_read_bytes, CacheContent, ComputeModel, DecodeTelemetry, ReadBound};
use crate::profile::DeviceProfile;
use crate::trace::{Event, Trace, TraceHeader};
use sift_engine::{Engine, EngineOptions};
use sift_model::layout::SITE_OPS;
use sift_model::Model;
use sift_sparsity::{Calibration, Phase, Selection, Selector, Site, SiteDims};
use sift_store::cache::Policy;
use sift_store::tiered::{MemoryPlan, PlanInputs, TierError, TierStats, TieredOptions, TieredStore};
use std::path::Path;

/// Problems of a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Store(#[from] TierError),
    #[error("{0}")]
    Invalid(String),
}

/// Which units each token uses in the replay.
pub enum Replay {
    /// The recording run's choices (exact).
    Recorded,
    /// A selector run on the recorded inputs.
    Select(Box<dyn Selector>),
}

/// One simulation's settings.
pub struct SimOptions {
    pub budget: u64,
    /// The plan inputs (runtime, KV and scratch) to plan the cache with; `None`: those of a
    /// budgeted run like the recorded one ([`plan_inputs`]). The planner passes its own.
    pub inputs: Option<PlanInputs>,
    pub tiered: TieredOptions,
    pub replay: Replay,
    /// Hot sets for the static policy (from `sift calibrate`); without it, the trace's own
    /// selection counts rank the units (an oracle profile of this very trace).
    pub calibration: Option<Calibration>,
    /// A name for this run in reports (e.g. "60% lfu recorded").
    pub label: String,
}

/// What a simulation predicts.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimReport {
    pub label: String,
    pub policy: String,
    pub preload: usize,
    pub budget: u64,
    pub selector: String,
    pub tokens: usize,
    /// Predicted decode time and speed.
    pub decode_s: f64,
    pub tok_s: f64,
    /// Of the decode time: compute (kernels, attention, head, copies) and waiting for reads.
    pub compute_s: f64,
    pub stall_s: f64,
    pub hit_rate: f64,
    pub stats: TierStats,
    pub plan: MemoryPlan,
    /// Active column bytes per token (what the kernels read).
    pub active_bytes_per_token: f64,
    /// The decode beside its bound (Belady's must-read at the profile's best disk bandwidth).
    pub telemetry: DecodeTelemetry,
    /// Adaptive TAM: λ per layer and step as the controller moved it (empty for other policies).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lambda: Vec<sift_store::cache::LambdaStep>,
}

/// The plan inputs a budgeted run like the recorded one has: its budget, runtime and KV/scratch
/// sizes (the prompt batch capped as under `--memory`).
pub fn plan_inputs(model: &Model, header: &TraceHeader, budget: u64) -> PlanInputs {
    let n_batch = header.n_batch.min(sift_store::tiered::BUDGET_MAX_BATCH);
    let eo = EngineOptions { n_ctx: header.n_ctx, n_batch, ..Default::default() };
    PlanInputs { budget, runtime: header.runtime_bytes, kv_and_scratch: Engine::kv_and_scratch_bytes(model, &eo) }
}

/// Replays `trace` on `model` (the pack at `path`) with `profile`'s timing.
pub fn simulate(
    model: &Model,
    path: &Path,
    trace: &Trace,
    profile: &DeviceProfile,
    opts: SimOptions,
) -> Result<SimReport, SimError> {
    let c = &model.config;
    let index = model
        .columns
        .clone()
        .ok_or_else(|| SimError::Invalid(format!("{}: simulation needs a sift pack", path.display())))?;
    let inputs = opts.inputs.clone().unwrap_or_else(|| plan_inputs(model, &trace.header, opts.budget));
    let mut store = TieredStore::simulated(model, path, &opts.tiered, &inputs, Box::new(profile.clone()))?;
    let SimOptions { tiered, replay, calibration, label, .. } = opts;
    if let Some(cal) = &calibration {
        // Its hot rankings are pinned by unit id: refuse one made for another model shape.
        cal.check_dims(SiteDims::of(c)).map_err(|e| SimError::Invalid(e.to_string()))?;
    }
    let policy = tiered.policy;
    let (selector_name, mut online) = match replay {
        Replay::Recorded => (format!("{} (recorded)", trace.header.selector), None),
        Replay::Select(s) => (s.describe(), Some(s)),
    };
    let cache_aware = online.as_ref().is_some_and(|s| s.wants_cache_state());
    if cache_aware && policy == Policy::Belady {
        return Err(SimError::Invalid(
            "belady needs every token's selection in advance, but a cache-aware selector (dip-ca) chooses by the cache's state; pick another policy or selector".into(),
        ));
    }
    // Selections of every token, layer and site, computed ahead unless they depend on the cache.
    let dims = trace.header.dims;
    let mut ahead: Vec<Vec<[Vec<u32>; 4]>> = Vec::new();
    if !cache_aware {
        for ev in &trace.events {
            match ev {
                Event::Reset => {
                    if let Some(s) = online.as_mut() {
                        s.reset();
                    }
                }
                Event::Prompt(_) => {}
                Event::Token { layers, .. } => {
                    if let Some(s) = online.as_mut() {
                        s.begin_batch(Phase::Generate);
                    }
                    let mut tok = Vec::with_capacity(layers.len());
                    for (l, rec) in layers.iter().enumerate() {
                        let mut sites: [Vec<u32>; 4] = Default::default();
                        for (si, site) in Site::ALL.into_iter().enumerate() {
                            sites[si] = choose(online.as_deref_mut(), l, site, &rec.sites[si], dims[si]);
                        }
                        tok.push(sites);
                    }
                    if let Some(s) = online.as_mut() {
                        s.end_batch(Phase::Generate);
                    }
                    ahead.push(tok);
                }
            }
        }
        if let Some(s) = online.as_mut() {
            s.reset();
        }
    }
    if policy == Policy::Belady {
        for l in 0..c.n_layer {
            for (si, ops) in SITE_OPS.iter().enumerate() {
                for &op in ops.iter() {
                    store.set_future(l, op, ahead.iter().map(|t| t[l][si].clone()).collect());
                }
            }
        }
    }
    // Static pins its hot set before the replay; Belady starts from the same warm fill, so that
    // it bounds static too (from the same start no policy beats it). Both load off the clock.
    if policy == Policy::Static || policy == Policy::Belady {
        for l in 0..c.n_layer {
            for (si, site) in Site::ALL.into_iter().enumerate() {
                let ranking = match calibration.as_ref().and_then(|cal| cal.hot_ranking(l, site)) {
                    Some(r) => r,
                    None => {
                        let mut count = vec![0u32; dims[si]];
                        for t in &ahead {
                            for &u in &t[l][si] {
                                count[u as usize] += 1;
                            }
                        }
                        let mut r: Vec<u32> = (0..dims[si] as u32).collect();
                        r.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
                        r
                    }
                };
                for &op in SITE_OPS[si] {
                    store.set_hot(l, op, &ranking)?;
                }
            }
        }
    }
    store.reset_stats();
    // The bound's optimal cache starts from what this one holds now (the warm fill, if any).
    let start = CacheContent::of(&store, c.n_layer);
    // Compute costs.
    let cost = ComputeModel::new(model, &index, profile);
    let mut embd_row = vec![0f32; c.n_embd];
    let mut mask = Vec::new();
    let mut all: [Vec<u32>; 4] = Default::default();
    for (si, a) in all.iter_mut().enumerate() {
        a.extend(0..dims[si] as u32);
    }
    let t_start = store.sim_now();
    let mut compute_ns = 0.0;
    let mut active_bytes = 0u64;
    let mut tokens = 0usize;
    let mut online_sel: Vec<u32>;
    // Every token's active units per layer and site, for the bound.
    let mut used: Vec<[Vec<Vec<u32>>; 4]> = (0..c.n_layer).map(|_| Default::default()).collect();
    for ev in &trace.events {
        match ev {
            Event::Reset => {
                store.reset_context();
                if let Some(s) = online.as_mut() {
                    s.reset();
                }
            }
            Event::Prompt(_) => {}
            Event::Token { pos, layers } => {
                if let Some(s) = online.as_mut() {
                    s.begin_batch(Phase::Generate);
                }
                store.embedding_row(0, &mut embd_row)?;
                for (l, rec) in layers.iter().enumerate() {
                    store.begin_layer(l, &rec.residual);
                    for (si, site) in Site::ALL.into_iter().enumerate() {
                        let act: &[u32] = if cache_aware {
                            let s = online.as_mut().expect("cache-aware selector");
                            store.cached_mask(l, SITE_OPS[si][0], &mut mask);
                            s.observe_cache(l, site, &mask);
                            online_sel = choose(Some(s.as_mut()), l, site, &rec.sites[si], dims[si]);
                            &online_sel
                        } else {
                            &ahead[tokens][l][si]
                        };
                        let act = if act.len() == dims[si] { &all[si][..] } else { act };
                        used[l][si].push(act.to_vec());
                        // In parts, as the engine does when the misses outgrow the transient area.
                        // Each part is computed as it comes, while later parts are read.
                        let ns = cost.site_ns(l, si, act.len(), *pos);
                        let mut done = 0;
                        while done < act.len() {
                            let taken =
                                store.fetch(l, SITE_OPS[si], &act[done..], sift_engine::sparse::COLUMN_PIECE)?.taken;
                            done += taken;
                            store.sim_advance(ns * taken as f64 / act.len() as f64);
                        }
                        for &op in SITE_OPS[si] {
                            active_bytes += (act.len() * index.layers[l].op(op).col_bytes) as u64;
                        }
                        compute_ns += ns;
                    }
                }
                let ns = cost.token_ns();
                store.sim_advance(ns);
                compute_ns += ns;
                if let Some(s) = online.as_mut() {
                    s.end_batch(Phase::Generate);
                }
                tokens += 1;
            }
        }
    }
    let decode_ns = store.sim_now() - t_start;
    let stats = store.stats().clone();
    let decode_s = decode_ns * 1e-9;
    let must_read = must_read_bytes(&index, &store, &start, |l, si| Ok(std::mem::take(&mut used[l][si])))
        .map_err(|e| SimError::Invalid(e.to_string()))?;
    let bound = ReadBound::new(tokens, must_read, profile.disk.best_bw(), compute_ns * 1e-9);
    let telemetry = DecodeTelemetry::new(bound, decode_s, &stats);
    Ok(SimReport {
        label,
        policy: policy.name().into(),
        preload: store.preload_layers(),
        budget: inputs.budget,
        selector: selector_name,
        tokens,
        decode_s,
        tok_s: if decode_s > 0.0 { tokens as f64 / decode_s } else { 0.0 },
        compute_s: compute_ns * 1e-9,
        stall_s: stats.stall_ns as f64 * 1e-9,
        hit_rate: stats.hit_rate(),
        stats,
        plan: store.plan.clone(),
        active_bytes_per_token: if tokens > 0 { active_bytes as f64 / tokens as f64 } else { 0.0 },
        lambda: store.lambda_history(),
        telemetry,
    })
}

/// The units of one site: the recorded choice, or `selector`'s on the recorded input.
fn choose(
    selector: Option<&mut (dyn Selector + 'static)>,
    l: usize,
    site: Site,
    rec: &crate::trace::SiteRecord,
    dim: usize,
) -> Vec<u32> {
    match selector {
        None => rec.active.clone().unwrap_or_else(|| (0..dim as u32).collect()),
        Some(s) => {
            let mut out = Vec::new();
            match s.select(l, site, Phase::Generate, &rec.input, &mut out) {
                Selection::All => (0..dim as u32).collect(),
                Selection::Subset => out,
            }
        }
    }
}
