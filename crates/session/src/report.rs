//! What a session reports about its memory: the store's plan and counters (as JSON for `-o json`
//! and the server's stats, as lines for humans) and the live budget changes applied.

use sift_engine::{BudgetChange, Engine};
use sift_sim::bound::{must_read_bytes, ActivationLog, CacheContent, ComputeModel, DecodeTelemetry, ReadBound};
use sift_sim::profile::DeviceProfile;
use sift_store::tiered::TierStats;

/// Starts recording a budgeted engine's decode for its bound: an [`ActivationLog`] set as the
/// engine's tracer (nothing without a store). Give it to [`decode_telemetry`] after the decode.
pub fn record_decode(engine: &mut Engine) -> anyhow::Result<Option<ActivationLog>> {
    if engine.memory().is_none() {
        return Ok(None);
    }
    let dims = engine.site_dims();
    let log = ActivationLog::new(dims.n_layer, dims.units)?;
    engine.set_tracer(Some(Box::new(log.clone())));
    Ok(Some(log))
}

/// A budgeted decode beside its bound (see [`sift_sim::bound`]): the tokens `log` recorded in
/// `decode_s` seconds, the store's counters over the same tokens, the bound from Belady's
/// must-read bytes (from the cache's content `start` when the decode began) at `profile`'s best disk bandwidth and the compute time of the same tokens
/// with every weight in memory by `profile`'s cost model. Stops the recording.
pub fn decode_telemetry(
    engine: &mut Engine,
    log: &ActivationLog,
    start: &CacheContent,
    decode_s: f64,
    profile: &DeviceProfile,
) -> anyhow::Result<DecodeTelemetry> {
    decode_telemetry_since(engine, log, start, None, decode_s, profile)
}

/// A decode measured against its bound while the store's counters go on counting (the server):
/// [`DecodeProbe::start`] before the decode, [`DecodeProbe::finish`] after it.
pub struct DecodeProbe {
    log: ActivationLog,
    start: CacheContent,
    stats: TierStats,
}

impl DecodeProbe {
    /// Starts recording (nothing without a store): the activation log, the cache's content and a
    /// copy of the counters.
    pub fn start(engine: &mut Engine) -> anyhow::Result<Option<DecodeProbe>> {
        let Some(log) = record_decode(engine)? else {
            return Ok(None);
        };
        let store = engine.memory().ok_or_else(|| anyhow::anyhow!("no memory budget"))?;
        let start = CacheContent::of(store, engine.config().n_layer);
        Ok(Some(DecodeProbe { log, start, stats: store.stats().clone() }))
    }

    /// The decode since [`DecodeProbe::start`], `decode_s` seconds long, against its bound.
    pub fn finish(
        self,
        engine: &mut Engine,
        decode_s: f64,
        profile: &DeviceProfile,
    ) -> anyhow::Result<DecodeTelemetry> {
        decode_telemetry_since(engine, &self.log, &self.start, Some(&self.stats), decode_s, profile)
    }
}

/// [`decode_telemetry`] with the counters taken since `before` (all of them: `None`).
fn decode_telemetry_since(
    engine: &mut Engine,
    log: &ActivationLog,
    start: &CacheContent,
    before: Option<&TierStats>,
    decode_s: f64,
    profile: &DeviceProfile,
) -> anyhow::Result<DecodeTelemetry> {
    engine.set_tracer(None);
    let store = engine.memory().ok_or_else(|| anyhow::anyhow!("decode telemetry needs a memory budget"))?;
    let index = engine.model.columns.as_ref().ok_or_else(|| anyhow::anyhow!("decode telemetry needs a column file"))?;
    let cost = ComputeModel::new(&engine.model, index, profile);
    let positions = log.positions();
    let mut compute_ns = cost.token_ns() * positions.len() as f64;
    let must_read = must_read_bytes(index, store, start, |l, si| {
        let steps = log.steps(l, si)?;
        for (a, &pos) in steps.iter().zip(&positions) {
            compute_ns += cost.site_ns(l, si, a.len(), pos as usize);
        }
        Ok(steps)
    })?;
    let bound = ReadBound::new(log.tokens(), must_read, profile.disk.best_bw(), compute_ns * 1e-9);
    let stats = match before {
        Some(b) => store.stats().since(b),
        None => store.stats().clone(),
    };
    let mut tm = DecodeTelemetry::new(bound, decode_s, &stats);
    tm.observed = tm.observation(profile);
    Ok(tm)
}

/// The store's plan and counters as JSON (for `-o json`).
pub fn stats_json(engine: &Engine) -> Option<serde_json::Value> {
    let store = engine.memory()?;
    let (s, set) = (store.stats(), store.settings());
    Some(serde_json::json!({
        "memory_budget": store.plan().budget + engine.budget_reserve(),
        "budget_reserve": engine.budget_reserve(),
        "memory_plan": store.plan(),
        "cache_policy": set.policy,
        "preload": set.preload_layers,
        "preload_interleaved": set.interleaved,
        "io": set.io,
        "hit_rate": s.hit_rate(),
        "bytes_preload": s.bytes_preload,
        "bytes_ondemand": s.bytes_ondemand,
        "bytes_prefill": s.bytes_prefill,
        "reads": s.reads,
        "mean_read_bytes": s.mean_read(),
        "read_bandwidth": s.read_bandwidth(),
        "preload_precision": s.preload_precision(),
        "preload_recall": s.preload_recall(),
        "io_stall_ns": s.stall_ns,
        "io_busy_ns": s.io_ns,
        "stats": s,
    }))
}

/// A human summary of the store's plan and counters (three lines, each starting "sift: "), or
/// nothing without a store.
pub fn memory_report(engine: &Engine, wall_secs: f64) -> Vec<String> {
    let Some(store) = engine.memory() else {
        return Vec::new();
    };
    let (p, s): (_, &TierStats) = (store.plan(), store.stats());
    let set = store.settings();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut out = Vec::new();
    out.push(format!(
        "sift: memory budget {:.0} MiB = runtime {:.0} + resident weights {:.0} + column scales {:.0} + KV/activations {:.0} (KV grown by {:.1} since the sequence began, taken from the cache) + buffers {:.0} + cache index {:.0} + cache {:.0} ({:.0}% of columns); fixed part {:.1} (all but the cache's slots and their index entries)",
        mib(p.budget),
        mib(p.runtime),
        mib(p.resident_weights),
        mib(p.column_scales),
        mib(p.kv_and_scratch + p.kv_growth),
        mib(p.kv_growth),
        mib(p.buffers),
        mib(p.cache_index + p.cache_entries),
        mib(p.cache),
        p.cache_fraction * 100.0,
        mib(p.fixed())
    ));
    out.push(format!(
        "sift: cache {} | preload {}{} | io {} | hit rate {:.1}% | read {:.1} MiB (preload {:.1}, on demand {:.1}, prompt {:.1}) in {} reads of {:.1} KiB, {:.0} MB/s while busy",
        set.policy,
        set.preload_layers,
        if set.interleaved { " (interleaved)" } else { "" },
        set.io,
        s.hit_rate() * 100.0,
        mib(s.bytes_read()),
        mib(s.bytes_preload),
        mib(s.bytes_ondemand),
        mib(s.bytes_prefill),
        s.reads,
        s.mean_read() / 1024.0,
        s.read_bandwidth() / 1e6
    ));
    out.push(format!(
        "sift: preload precision {:.1}% recall {:.1}% | stalled on I/O {:.2} s of {:.2} s",
        s.preload_precision() * 100.0,
        s.preload_recall() * 100.0,
        s.stall_ns as f64 * 1e-9,
        wall_secs
    ));
    out
}

/// The hybrid decode's figures (`--gpu-policy`), or nothing without one: a line for humans,
/// then the same as JSON (`sift: hybrid-json {...}`).
pub fn hybrid_lines(engine: &Engine) -> Vec<String> {
    let Some(h) = engine.hybrid() else { return Vec::new() };
    let r = h.report();
    let mut out = vec![format!(
        "sift: hybrid {}: {} tokens, p50 {:.2} ms, p99 {:.2} ms per token; CPU share of active FFN units {:.1}%; {:.1} group loads ({:.2} MiB) per token; {:.1}% of products waited for loads; per token {:.2} ms queueing, {:.2} ms the CPU's FFN share, {:.2} ms waiting for the GPU's, {:.2} ms attention on the GPU, {:.2} ms attention on the CPU, {:.2} ms the output head ({}), {:.2} ms issuing loads, {:.2} ms the rest",
        r.policy,
        r.tokens,
        r.p50_ms,
        r.p99_ms,
        r.cpu_share * 100.0,
        r.reloads_per_token,
        r.reload_bytes_per_token / (1 << 20) as f64,
        r.stalled_share * 100.0,
        r.queue_ms,
        r.cpu_ffn_ms,
        r.gpu_wait_ms,
        r.gpu_attention_ms,
        r.cpu_attention_ms,
        r.head_ms,
        if r.head_on_gpu { "GPU" } else { "CPU" },
        r.load_ms,
        r.other_ms
    )];
    if let Ok(j) = serde_json::to_string(&r) {
        out.push(format!("sift: hybrid-json {j}"));
    }
    out
}

/// One line (starting "sift: ") about a live budget change the engine applied or refused.
pub fn describe_budget_change(c: &BudgetChange) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    match &c.result {
        Ok(p) => format!(
            "sift: budget -> {:.0} MiB at token {}: cache {:.0} MiB ({:.0}% of columns), applied in {:.1} ms, RSS after {:.0} MiB",
            mib(c.requested),
            c.n_past,
            mib(p.cache),
            p.cache_fraction * 100.0,
            c.secs * 1e3,
            mib(c.rss_after.unwrap_or(0))
        ),
        Err(e) => format!("sift: budget {:.0} MiB at token {} refused: {e}", mib(c.requested), c.n_past),
    }
}
