//! `--memory` and the tiered store's flags, shared by generate, chat, bench and perplexity: a hard
//! budget for everything sift keeps resident, with the pack's columns streamed from disk.

use anyhow::Context;
use clap::Args;
use sift_engine::sparsity::{Method, Site};
use sift_engine::{Engine, EngineOptions};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use sift_sim::planner::{self, PlanRequest};
use sift_store::cache::Policy;
use sift_store::io::TierKind;
use sift_store::tiered::{
    open_budgeted_checked, resident_bytes, CacheSplit, PlanInputs, TierStats, TieredOptions, TieredStore,
};
use sift_store::OpKind;
use std::path::Path;

use sift_store::tiered::BUDGET_MAX_BATCH;

#[derive(Args, Clone, Debug, Default)]
pub struct MemoryArgs {
    /// Hard memory budget: bytes (K/M/G suffixes, powers of 1024) or a percentage of the model
    /// size ("60%"). Needs a sift pack; its columns are streamed from disk and cached in what is
    /// left after the resident parts.
    #[arg(long = "memory", value_name = "BYTES|PERCENT")]
    pub memory: Option<String>,
    /// Cache policy of the column cache: lfu (context-level counts), lru, tam (temporal activation
    /// momentum), static (hot set from --calib pinned), none
    #[arg(long = "cache-policy", default_value = "lfu", value_parser = ["lfu", "lru", "tam", "static", "none"])]
    pub cache_policy: String,
    /// Layers per cross-layer preload group (0: read misses on demand only; 1: next layer only;
    /// default: the planner's choice)
    #[arg(long = "preload")]
    pub preload: Option<usize>,
    /// Slow tier: auto (io_uring, else pread), io_uring, pread, memory (whole pack in RAM; tests)
    #[arg(long = "io", default_value = "auto", value_parser = ["auto", "io_uring", "pread", "memory"])]
    pub io: String,
    /// TAM decay λ
    #[arg(long = "tam-lambda", default_value_t = sift_store::cache::TAM_DEFAULT_LAMBDA)]
    pub tam_lambda: f32,
    /// TAM admission margin ε (threshold (1 − λ) + ε)
    #[arg(long = "tam-eps", default_value_t = sift_store::cache::TAM_DEFAULT_EPS)]
    pub tam_eps: f32,
    /// Keep the token-embedding table in memory (default: one row read from disk per token)
    #[arg(long = "resident-embd")]
    pub resident_embd: bool,
    /// How cache slots are shared among ops: read-cost (small columns, which cost a whole 4 KiB
    /// read each, first) or uniform (the same fraction of every op)
    #[arg(long = "cache-split", default_value = "read-cost", value_parser = ["read-cost", "uniform"])]
    pub cache_split: String,
    /// Device profile the planner predicts with: a file from `sift probe -o`, or a builtin name
    /// (default: $SIFT_PROFILE, else the builtin profile of sift's development machine)
    #[arg(long = "profile")]
    pub profile: Option<String>,
    /// Highest sparsity the planner may choose when --sparsity is not given
    #[arg(long = "max-ratio", default_value_t = DEFAULT_MAX_RATIO)]
    pub max_ratio: f64,
    /// A file holding the budget (e.g. "500M" or "40%"): rewrite it (or send SIGUSR1) to change
    /// the budget of the running session
    #[arg(long = "budget-file", value_name = "FILE")]
    pub budget_file: Option<std::path::PathBuf>,
    /// Follow Linux memory pressure (PSI): shrink the budget under pressure, grow it back after
    #[arg(long = "follow-pressure")]
    pub follow_pressure: bool,
}

/// The planner's default accuracy limit: Top-K above 0.6 costs more quality than the speed is
/// worth on the models measured (docs/sparsity.md).
pub const DEFAULT_MAX_RATIO: f64 = 0.6;

impl MemoryArgs {
    pub fn enabled(&self) -> bool {
        self.memory.is_some()
    }

    fn options(&self) -> anyhow::Result<TieredOptions> {
        let policy = match Policy::parse(&self.cache_policy) {
            Some(Policy::Tam { .. }) => Policy::Tam { lambda: self.tam_lambda, eps: self.tam_eps },
            Some(p) => p,
            None => anyhow::bail!("unknown --cache-policy '{}'", self.cache_policy),
        };
        anyhow::ensure!(
            (0.0..1.0).contains(&self.tam_lambda) && self.tam_eps >= 0.0,
            "--tam-lambda must be in [0, 1) and --tam-eps at least 0"
        );
        let tier = TierKind::parse(&self.io).with_context(|| format!("unknown --io '{}'", self.io))?;
        Ok(TieredOptions {
            policy,
            preload: self.preload.unwrap_or(4),
            tier,
            resident_embeddings: self.resident_embd,
            split: CacheSplit::parse(&self.cache_split)
                .with_context(|| format!("unknown --cache-split '{}'", self.cache_split))?,
            ..TieredOptions::default()
        })
    }

    /// Loads the model: in full (memory-mapped) without --memory, else only its resident parts —
    /// after checking, before reading them, that they, the tokenizer and the KV cache for `eo`
    /// fit the budget.
    pub fn load(&self, path: &Path, eo: &EngineOptions) -> anyhow::Result<(Model, Tokenizer)> {
        let Some(spec) = &self.memory else {
            return crate::generate::load(path);
        };
        if !path.exists() {
            anyhow::bail!("model file '{}' not found", path.display());
        }
        let opts = self.options()?;
        let model_size = sift_store::read_toc(path)?.map_or(0, |t| t.gguf_len());
        let budget = parse_budget(spec, model_size)?;
        let mut eo = eo.clone();
        self.adjust(&mut eo);
        let tok = std::cell::RefCell::new(None);
        let precheck = |g: &sift_gguf::Gguf, resident: u64| -> Result<(), String> {
            // The tokenizer first: it is part of the process the budget must hold.
            let t = Tokenizer::from_gguf(g).map_err(|e| format!("cannot build the tokenizer: {e}"))?;
            *tok.borrow_mut() = Some(t);
            let runtime = current_rss().unwrap_or(0);
            let kv = sift_model::Config::from_gguf(g)
                .map(|c| Engine::kv_and_scratch_bytes_for(&c, &eo))
                .map_err(|e| e.to_string())?;
            if runtime + resident + kv > budget {
                return Err(format!(
                    "--memory {} is too small to run this model: the process with its tokenizer takes {}, the resident weights (output head, norms, tokenizer data) {} and the KV cache and activations {} before any cache or buffer; raise --memory, or lower -c / -b",
                    mib(budget),
                    mib(runtime),
                    mib(resident),
                    mib(kv)
                ));
            }
            Ok(())
        };
        let model = open_budgeted_checked(path, &opts, precheck)
            .with_context(|| format!("cannot load model '{}'", path.display()))?;
        let tok = match tok.into_inner() {
            Some(t) => t,
            None => Tokenizer::from_gguf(&model.file.gguf)
                .with_context(|| format!("cannot build the tokenizer of '{}'", path.display()))?,
        };
        Ok((model, tok))
    }

    /// Clamps engine options a budget affects (the prompt batch).
    pub fn adjust(&self, eo: &mut EngineOptions) {
        if self.enabled() {
            eo.n_batch = eo.n_batch.min(BUDGET_MAX_BATCH);
        }
    }

    /// Builds the engine with the selector `sparsity` asks for, and under --memory the tiered
    /// store attached. Settings not given (--sparsity, --preload) come from the planner
    /// (`sift_sim::planner`); `static` pins the hot set of the calibration file `--calib`.
    pub fn engine(
        &self,
        model: Model,
        path: &Path,
        eo: &EngineOptions,
        sparsity: &crate::sparsity::SparsityArgs,
    ) -> anyhow::Result<Engine> {
        let calib = sparsity.calib.as_deref();
        let Some(spec) = &self.memory else {
            let mut engine = Engine::new(model, eo);
            sparsity.apply(&mut engine)?;
            return Ok(engine);
        };
        let mut opts = self.options()?;
        let mut sparsity = sparsity.clone();
        let model_size = model.columns.as_ref().map_or(0, |p| p.gguf_len);
        let budget = parse_budget(spec, model_size)?;
        // Everything the process holds besides the resident weights: code, tokenizer, allocator.
        let rss = current_rss().unwrap_or(0);
        let resident = resident_bytes(&model, opts.resident_embeddings);
        let runtime = rss.saturating_sub(resident) + (8 << 20);
        let inputs = PlanInputs { budget, runtime, kv_and_scratch: Engine::kv_and_scratch_bytes(&model, eo) };
        if sparsity.method.is_none() || self.preload.is_none() {
            self.plan(&model, path, &inputs, &mut opts, &mut sparsity)?;
        }
        let mut store = TieredStore::new(&model, path, &opts, &inputs)?;
        if opts.policy == Policy::Static {
            let file = calib.context(
                "--cache-policy static pins the hot channels measured by `sift calibrate`: pass its file with --calib",
            )?;
            let c = sift_engine::sparsity::Calibration::load(file)?;
            let units = [model.config.n_embd, model.config.n_embd_q(), model.config.n_embd, model.config.n_ff];
            c.check_dims(sift_engine::sparsity::SiteDims { n_layer: model.config.n_layer, units })
                .with_context(|| format!("--calib {}", file.display()))?;
            for l in 0..model.config.n_layer {
                for op in OpKind::ALL {
                    let site = Site::ALL[op.site_index()];
                    let ranking = c.hot_ranking(l, site).with_context(|| {
                        format!(
                            "{} has no per-channel magnitudes (made by an older sift); run `sift calibrate` again",
                            file.display()
                        )
                    })?;
                    store.set_hot(l, op, &ranking)?;
                }
            }
        }
        let mut engine = Engine::new(model, eo);
        engine.attach_store(store)?;
        sparsity.apply(&mut engine)?;
        Ok(engine)
    }

    /// Fills in what the user left to the planner: the sparsity (Top-K at the planned ratio) when
    /// --sparsity is absent, the preload group when --preload is.
    fn plan(
        &self,
        model: &Model,
        path: &Path,
        inputs: &PlanInputs,
        opts: &mut TieredOptions,
        sparsity: &mut crate::sparsity::SparsityArgs,
    ) -> anyhow::Result<()> {
        let profile = crate::simulate::resolve_profile(self.profile.as_deref())?;
        let fixed_ratio = sparsity.method.map(|m| if m == Method::Dense { 0.0 } else { sparsity.ratio });
        anyhow::ensure!((0.0..1.0).contains(&self.max_ratio), "--max-ratio must be in [0, 1)");
        let req = PlanRequest {
            inputs: inputs.clone(),
            policy: opts.policy,
            max_ratio: self.max_ratio,
            min_ratio: 0.0,
            fixed_ratio,
            base: opts.clone(),
        };
        let p = planner::plan(model, path, &profile, &req, None)?;
        if self.preload.is_none() {
            opts.preload = p.preload;
        }
        if sparsity.method.is_none() {
            if p.ratio > 0.0 {
                sparsity.method = Some(Method::TopK);
                sparsity.ratio = p.ratio;
            } else {
                sparsity.method = Some(Method::Dense);
            }
        }
        eprintln!(
            "sift: planner (profile {}): --sparsity {} --ratio {:.2} --preload {} -> predicted {:.2} tok/s ({}); give --sparsity / --preload to choose yourself",
            profile.name,
            sparsity.method().name(),
            if sparsity.method() == Method::Dense { 0.0 } else { sparsity.ratio },
            opts.preload,
            p.predicted_tok_s,
            p.predicted_by
        );
        Ok(())
    }
}

/// A running session's live budget: the watcher of `--budget-file` / `--follow-pressure` and the
/// engine's handle. Call [`LiveBudget::poll`] between tokens; the engine applies a change before
/// its next token ([`Engine::budget_handle`]).
pub struct LiveBudget {
    control: crate::live::BudgetControl,
    handle: sift_engine::BudgetHandle,
}

impl LiveBudget {
    pub fn poll(&self) {
        if let Some(b) = self.control.take_change() {
            self.handle.request(b);
        }
    }
}

impl MemoryArgs {
    /// Starts watching the budget file and memory pressure, if asked (needs --memory).
    pub fn live(&self, engine: &Engine) -> anyhow::Result<Option<LiveBudget>> {
        if self.budget_file.is_none() && !self.follow_pressure {
            return Ok(None);
        }
        let store = engine.store().context("--budget-file and --follow-pressure need --memory")?;
        let model_size = engine.model.columns.as_ref().map_or(0, |p| p.gguf_len);
        let control = crate::live::BudgetControl::start(crate::live::ControlOptions {
            initial: store.plan.budget,
            floor: store.plan.fixed(),
            control_file: self.budget_file.clone(),
            follow_pressure: self.follow_pressure,
            parse: Box::new(move |t| parse_budget(t, model_size).map_err(|e| e.to_string())),
        })
        .context("--follow-pressure needs Linux pressure stall information (PSI)")?;
        Ok(Some(LiveBudget { control, handle: engine.budget_handle() }))
    }
}

/// Reports the budget changes the engine applied, on stderr.
pub fn print_budget_log(engine: &mut Engine) {
    for c in engine.take_budget_log() {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        match &c.result {
            Ok(p) => eprintln!(
                "sift: budget -> {:.0} MiB at token {}: cache {:.0} MiB ({:.0}% of columns), applied in {:.1} ms, RSS after {:.0} MiB",
                mib(c.requested),
                c.n_past,
                mib(p.cache),
                p.cache_fraction * 100.0,
                c.secs * 1e3,
                mib(c.rss_after.unwrap_or(0))
            ),
            Err(e) => eprintln!("sift: budget {:.0} MiB at token {} refused: {e}", mib(c.requested), c.n_past),
        }
    }
}

/// Parses "700M", "1.5G", "123456", "60%" (of `model_size`).
pub fn parse_budget(s: &str, model_size: u64) -> anyhow::Result<u64> {
    let t = s.trim();
    let bad = || {
        anyhow::anyhow!("bad --memory '{s}': use bytes with an optional K/M/G suffix (700M, 1.5G) or a percentage of the model size (60%)")
    };
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| bad())?;
        anyhow::ensure!(v > 0.0 && v.is_finite(), bad());
        return Ok((model_size as f64 * v / 100.0) as u64);
    }
    let lower = t.to_ascii_lowercase();
    let lower = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1u64 << 10),
        Some('m') => (&lower[..lower.len() - 1], 1 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1 << 30),
        _ => (lower, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    anyhow::ensure!(v > 0.0 && v.is_finite(), bad());
    Ok((v * mult as f64) as u64)
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The process's resident set now (VmRSS), in bytes.
pub fn current_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The store's plan and counters as JSON (for `-o json`).
pub fn stats_json(engine: &Engine) -> Option<serde_json::Value> {
    let store = engine.store()?;
    let s = store.stats();
    Some(serde_json::json!({
        "memory_budget": store.plan.budget,
        "memory_plan": store.plan,
        "cache_policy": store.policy().name(),
        "preload": store.preload_layers(),
        "preload_interleaved": store.interleaved(),
        "io": store.tier_name(),
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

/// A human summary of the store's plan and counters, on stderr.
pub fn print_stats(engine: &Engine, wall_secs: f64) {
    let Some(store) = engine.store() else {
        return;
    };
    let (p, s): (_, &TierStats) = (&store.plan, store.stats());
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "sift: memory budget {:.0} MiB = runtime {:.0} + resident weights {:.0} + KV/activations {:.0} + buffers {:.0} + cache {:.0} ({:.0}% of columns)",
        mib(p.budget),
        mib(p.runtime),
        mib(p.resident_weights),
        mib(p.kv_and_scratch),
        mib(p.buffers),
        mib(p.cache),
        p.cache_fraction * 100.0
    );
    eprintln!(
        "sift: cache {} | preload {}{} | io {} | hit rate {:.1}% | read {:.1} MiB (preload {:.1}, on demand {:.1}, prompt {:.1}) in {} reads of {:.1} KiB, {:.0} MB/s while busy",
        store.policy().name(),
        store.preload_layers(),
        if store.interleaved() { " (interleaved)" } else { "" },
        store.tier_name(),
        s.hit_rate() * 100.0,
        mib(s.bytes_read()),
        mib(s.bytes_preload),
        mib(s.bytes_ondemand),
        mib(s.bytes_prefill),
        s.reads,
        s.mean_read() / 1024.0,
        s.read_bandwidth() / 1e6
    );
    eprintln!(
        "sift: preload precision {:.1}% recall {:.1}% | stalled on I/O {:.2} s of {:.2} s",
        s.preload_precision() * 100.0,
        s.preload_recall() * 100.0,
        s.stall_ns as f64 * 1e-9,
        wall_secs
    );
}

#[cfg(test)]
mod tests {
    use super::parse_budget;

    #[test]
    fn budgets_parse_like_a_user_writes_them() {
        assert_eq!(parse_budget("700M", 0).unwrap(), 700 << 20);
        assert_eq!(parse_budget("700MiB", 0).unwrap(), 700 << 20);
        assert_eq!(parse_budget("1.5G", 0).unwrap(), 3 << 29);
        assert_eq!(parse_budget("4096", 0).unwrap(), 4096);
        assert_eq!(parse_budget("60%", 1000).unwrap(), 600);
        for bad in ["", "abc", "-5M", "0", "60%%", "nan"] {
            assert!(parse_budget(bad, 1000).is_err(), "{bad}");
        }
    }
}
