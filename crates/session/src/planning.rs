//! `sift plan`: what the planner (`sift_sim::planner`) would run a model with under a memory
//! budget on a device — the model's pack built if needed, the profile this machine's unless one is
//! named, the runtime measured as a budgeted run measures it, the prediction simulated on a trace
//! (the planner's own unless one is given) or by the cost model — reported as JSON or as
//! `sift_sim::plan_report`'s markdown.

use anyhow::Context;
use sift_engine::kv::KvType;
use sift_engine::{Engine, EngineOptions};
use sift_sim::plan_report::{markdown, PlanSetting};
use sift_sim::planner::{plan, PlanRequest};
use sift_sim::trace::Trace;
use sift_store::tiered::{CacheSplit, PlanInputs, TieredOptions};
use std::io::Write;
use std::path::PathBuf;

/// What `sift plan` plans for.
#[derive(Clone, Debug)]
pub struct PlanQuery {
    /// A GGUF (its column file built on first use, in `pack_dir` if given) or a pack.
    pub model: PathBuf,
    pub pack_dir: Option<PathBuf>,
    /// The budget: bytes (K/M/G) or a percentage of the model.
    pub memory: String,
    /// The device profile (`None`: `$SIFT_PROFILE`, else this machine's).
    pub profile: Option<String>,
    /// A trace to simulate (`None`: the planner's own), or the cost model instead.
    pub trace: Option<PathBuf>,
    pub cost_model: bool,
    pub cache_policy: String,
    /// The highest sparsity allowed, or a fixed one.
    pub max_ratio: f64,
    pub ratio: Option<f64>,
    /// The run's context, sequences decoded together and KV cache types.
    pub ctx_size: usize,
    pub parallel: usize,
    pub cache_type_k: KvType,
    pub cache_type_v: KvType,
    /// JSON instead of markdown.
    pub json: bool,
}

impl PlanQuery {
    /// Plans and writes the report to `out`.
    pub fn run(&self, out: &mut dyn Write) -> anyhow::Result<()> {
        let a = self;
        anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
        anyhow::ensure!((0.0..1.0).contains(&a.max_ratio), "--max-ratio must be in [0, 1)");
        if let Some(r) = a.ratio {
            anyhow::ensure!((0.0..1.0).contains(&r), "--ratio must be in [0, 1)");
        }
        let pack = crate::autopack::column_file(&a.model, a.pack_dir.as_deref())?;
        let profile = crate::profile::machine_or_named(
            a.profile.as_deref(),
            &pack,
            sift_engine::default_threads(),
            None,
            &mut |l| eprintln!("{l}"),
        )?
        .profile;
        let mut model = sift_store::open_model(&pack).with_context(|| format!("cannot load '{}'", pack.display()))?;
        let gguf_len = model.columns.as_ref().with_context(|| format!("{}: not a sift pack", pack.display()))?.gguf_len;
        let budget = crate::parse_budget(&a.memory, gguf_len)?;
        // What a budgeted run counts as runtime: this process with the tokenizer built (and the
        // GGUF's copies of its tables given back, as a run does); the mapped files do not count.
        // Measured before the planner's trace is recorded (that run's memory is not a budgeted
        // run's).
        let _tok = sift_model::tokenizer::Tokenizer::from_gguf(&model.file.gguf)?;
        crate::drop_tokenizer_tables(&mut model);
        let measured_runtime = crate::runtime_bytes(&[&pack, model.file.path()], 0);
        let trace = match &a.trace {
            Some(p) => {
                let t = Trace::read(p)?;
                t.header.check_model(p, &model)?;
                Some(t)
            }
            None if a.cost_model => None,
            None => Some(crate::plantrace::plan_trace(&pack, &model, sift_engine::default_threads(), &mut |l| {
                eprintln!("{l}")
            })?),
        };
        // A trace from `sift trace` carries the runtime of its run (the planner's own carries none).
        let runtime = trace.as_ref().map(|t| t.header.runtime_bytes).filter(|&r| r > 0).unwrap_or(measured_runtime);
        let eo = EngineOptions {
            n_ctx: a.ctx_size,
            n_batch: 64,
            cache_type_k: a.cache_type_k,
            cache_type_v: a.cache_type_v,
            ..EngineOptions::default()
        };
        let policy = crate::profile::parse_policy(&a.cache_policy, 0.8, 0.05)?;
        let req = PlanRequest {
            inputs: PlanInputs { budget, runtime, kv_and_scratch: Engine::kv_and_scratch_bytes(&model, &eo) },
            policy,
            max_ratio: a.max_ratio,
            min_ratio: 0.0,
            fixed_ratio: a.ratio,
            base: TieredOptions { split: CacheSplit::ReadCost, ..TieredOptions::default() },
            sequences: a.parallel,
        };
        let p = plan(&model, &pack, &profile, &req, trace.as_ref())?;
        if a.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&p)?)?;
            return Ok(());
        }
        let setting = PlanSetting {
            model: &a.model,
            budget,
            profile: &profile,
            sequences: a.parallel,
            n_ctx: a.ctx_size,
            cache_type_k: a.cache_type_k,
            cache_type_v: a.cache_type_v,
            kv_bytes: sift_engine::kv::cache_bytes(&model.config, a.ctx_size.max(1), a.cache_type_k, a.cache_type_v),
        };
        write!(out, "{}", markdown(&p, &setting))?;
        Ok(())
    }
}
