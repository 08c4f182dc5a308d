//! `sift plan`: what the planner (`sift_sim::planner`) would run a model with under a memory
//! budget on a device: sparsity, cross-layer group, cache size and the memory split, with the
//! predicted decode speed. `-o json` prints the settings and `predicted_tok_s`.

use anyhow::Context;
use clap::Args;
use sift_engine::{Engine, EngineOptions};
use sift_sim::planner::{plan, PlanRequest};
use sift_sim::trace::Trace;
use sift_store::tiered::{CacheSplit, PlanInputs, TieredOptions};
use std::path::PathBuf;

#[derive(Args)]
pub struct PlanArgs {
    /// The model to plan for: a GGUF (its column file is built on first use, as `--memory` does)
    /// or a sift pack
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Where a GGUF's column file goes (default: next to it, or the user's cache folder)
    #[arg(long = "pack-dir")]
    pub pack_dir: Option<PathBuf>,
    /// Memory budget: bytes (K/M/G) or a percentage of the model size
    #[arg(long = "memory")]
    pub memory: String,
    /// Device profile: a file from `sift probe -o` or a builtin name (default: $SIFT_PROFILE, else
    /// this machine's, probed on first use and kept in the user's cache folder)
    #[arg(long = "profile")]
    pub profile: Option<String>,
    /// Predict by simulating this trace (from `sift trace`; default: the planner's own, a short
    /// generation recorded once next to the column file)
    #[arg(long = "trace")]
    pub trace: Option<PathBuf>,
    /// Predict with the closed-form cost model instead of simulating a trace
    #[arg(long = "cost-model", conflicts_with = "trace")]
    pub cost_model: bool,
    /// Cache policy to plan for
    #[arg(long = "cache-policy", default_value = "lfu")]
    pub cache_policy: String,
    /// Highest sparsity the planner may choose
    #[arg(long = "max-ratio", default_value_t = sift_session::DEFAULT_MAX_RATIO, value_parser = sift_session::ranges::skip_ratio)]
    pub max_ratio: f64,
    /// Plan only the group size for this fixed sparsity ratio
    #[arg(long = "ratio", value_parser = sift_session::ranges::skip_ratio)]
    pub ratio: Option<f64>,
    /// Context size the run will use (KV cache)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096, value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: usize,
    /// Sequences decoded together (a server's -np): the union of their active columns must fit
    /// the cache, and the prediction is their tokens per second together
    #[arg(long = "parallel", default_value_t = 1, value_parser = sift_session::ranges::count_in::<1, 256>)]
    pub parallel: usize,
    #[command(flatten)]
    pub kv: crate::args::KvCacheArgs,
    /// Output format: md or json
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
    anyhow::ensure!((0.0..1.0).contains(&a.max_ratio), "--max-ratio must be in [0, 1)");
    if let Some(r) = a.ratio {
        anyhow::ensure!((0.0..1.0).contains(&r), "--ratio must be in [0, 1)");
    }
    let pack = sift_session::autopack::column_file(&a.model, a.pack_dir.as_deref())?;
    let profile = sift_session::profile::machine_or_named(
        a.profile.as_deref(),
        &pack,
        sift_engine::default_threads(),
        None,
        &mut |l| eprintln!("{l}"),
    )?
    .profile;
    let mut model = sift_store::open_model(&pack).with_context(|| format!("cannot load '{}'", pack.display()))?;
    let gguf_len = model.columns.as_ref().with_context(|| format!("{}: not a sift pack", pack.display()))?.gguf_len;
    let budget = sift_session::parse_budget(&a.memory, gguf_len)?;
    // What a budgeted run counts as runtime: this process with the tokenizer built (and the
    // GGUF's copies of its tables given back, as a run does); the mapped files do not count.
    // Measured before the planner's trace is recorded (that run's memory is not a budgeted run's).
    let _tok = sift_model::tokenizer::Tokenizer::from_gguf(&model.file.gguf)?;
    sift_session::drop_tokenizer_tables(&mut model);
    let measured_runtime = sift_session::runtime_bytes(&[&pack, model.file.path()], 0);
    let trace = match &a.trace {
        Some(p) => {
            let t = Trace::read(p)?;
            t.header.check_model(p, &model)?;
            Some(t)
        }
        None if a.cost_model => None,
        None => Some(sift_session::plantrace::plan_trace(&pack, &model, sift_engine::default_threads(), &mut |l| {
            eprintln!("{l}")
        })?),
    };
    // A trace from `sift trace` carries the runtime of its run (the planner's own carries none).
    let runtime = trace.as_ref().map(|t| t.header.runtime_bytes).filter(|&r| r > 0).unwrap_or(measured_runtime);
    let eo = a.kv.apply(EngineOptions { n_ctx: a.ctx_size, n_batch: 64, ..EngineOptions::default() });
    let policy = sift_session::profile::parse_policy(&a.cache_policy, 0.8, 0.05)?;
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
    if a.output == "json" {
        println!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let m = &p.memory;
    println!("plan for {} under {:.0} MiB on {} ({})\n", a.model.display(), mib(budget), profile.name, profile.source);
    println!(
        "  --sparsity {} --ratio {:.2} --preload {} --cache-policy {}   predicted {:.2} tok/s ({})\n",
        p.sparsity,
        p.ratio,
        p.preload,
        p.cache_policy,
        p.predicted_tok_s,
        if a.parallel > 1 {
            format!("{}, {} sequences together", p.predicted_by, a.parallel)
        } else {
            p.predicted_by.clone()
        }
    );
    println!("| memory | MiB |\n|---|---:|");
    for (k, v) in [
        ("runtime (code, tokenizer)", m.runtime),
        ("resident weights", m.resident_weights),
        ("column scales (exact columns)", m.column_scales),
        ("KV cache (first page) + activations", m.kv_and_scratch),
        ("I/O and compute buffers", m.buffers),
        ("column cache index (slots, policy state)", m.cache_index + m.cache_entries),
        ("column cache", m.cache),
    ] {
        println!("| {k} | {:.0} |", mib(v));
    }
    println!("| **total** | **{:.0}** of {:.0} |\n", mib(m.total()), mib(m.budget));
    let kv_full = sift_engine::kv::cache_bytes(&model.config, a.ctx_size.max(1), a.kv.k, a.kv.v);
    println!(
        "The KV cache grows a page of {} tokens at a time, taking its room from the column cache: {:.0} MiB at {} tokens (-ctk {} -ctv {}).\n",
        sift_engine::kv::KV_PAGE,
        mib(kv_full),
        a.ctx_size,
        a.kv.k,
        a.kv.v
    );
    println!("| preload | ratio | cache MiB | predicted tok/s |\n|---:|---:|---:|---:|");
    for c in &p.candidates {
        match &c.refused {
            Some(why) => println!("| {} | - | - | refused: {why} |", c.preload),
            None => {
                println!("| {} | {:.2} | {:.0} | {:.2} |", c.preload, c.ratio, mib(c.cache_bytes), c.predicted_tok_s)
            }
        }
    }
    Ok(())
}
