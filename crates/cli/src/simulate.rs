//! `sift simulate`: replay a trace through the engine's cache and prefetch code on a device
//! profile (see `sift_sim::replay`); `--sweep` runs every budget × policy given and writes CSV and
//! plots. Also home of the profile lookup shared with `sift plan` and `--memory`.

use anyhow::Context;
use clap::Args;
use sift_eval::plot::{Chart, Series};
use sift_sim::replay::{simulate, Replay, SimOptions, SimReport};
use sift_sim::trace::Trace;
use sift_store::tiered::{CacheSplit, TieredOptions};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct SimulateArgs {
    /// Trace from `sift trace`
    #[arg(long = "trace")]
    pub trace: PathBuf,
    /// The pack the trace was recorded on
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Device profile: a file from `sift probe -o`, or a builtin name (`sift probe --list`)
    #[arg(long = "profile")]
    pub profile: Option<String>,
    /// Memory budgets (bytes with K/M/G, or % of the model), comma-separated
    #[arg(long = "memory", value_delimiter = ',', required_unless_present = "gpu")]
    pub memory: Vec<String>,
    /// Simulate KAIROX's GPU–CPU hybrid decode instead, on this GPU profile: a file from
    /// `sift probe --gpu -o FILE`, or rtx3080ti-pcie3, rtx4090-pcie4: FFN neuron groups on the
    /// GPU under each --gpu-policy
    #[arg(long = "gpu", value_name = "PROFILE")]
    pub gpu: Option<String>,
    /// With --gpu: GPU memory budgets (bytes with K/M/G, or % of the model's matrices)
    #[arg(long = "gpu-memory", value_delimiter = ',', default_value = "25%,50%,75%")]
    pub gpu_memory: Vec<String>,
    /// With --gpu: balancing policies: static, eager, lru, tam, tam-adaptive, layers (llama.cpp's
    /// layer split), oracle (the bound)
    #[arg(
        long = "gpu-policy",
        value_delimiter = ',',
        default_value = "oracle,layers,static,eager,lru,tam,tam-adaptive"
    )]
    pub gpu_policy: Vec<String>,
    /// With --gpu: neurons per group (the unit of transfer); default 16, or with a profile that
    /// holds the engine's costs, the engine's own choice (from the transfer curve)
    #[arg(long = "group-size", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub group_size: Option<u32>,
    /// With --gpu and the engine's costs: where attention runs (auto, on, off; as
    /// --gpu-attention of generate)
    #[arg(long = "gpu-attention", value_name = "auto|on|off", default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub gpu_attention: String,
    /// Cache policies, comma-separated: lfu, lru, tam, static, belady, none
    #[arg(long = "policy", value_delimiter = ',', default_value = "lfu")]
    pub policy: Vec<String>,
    /// Selections replayed, comma-separated: recorded (the trace's own choices, exact) or a
    /// method run on the recorded inputs (topk, dip, dip-ca, glu, threshold, ...)
    #[arg(long = "sparsity", value_delimiter = ',', default_value = "recorded")]
    pub sparsity: Vec<String>,
    /// Ratio for --sparsity METHOD
    #[arg(long = "ratio", default_value_t = 0.5, value_parser = sift_session::ranges::skip_ratio)]
    pub ratio: f64,
    /// DIP-CA penalty for units not in cache
    #[arg(long = "gamma", default_value_t = 0.2, value_parser = sift_session::ranges::weight_f32)]
    pub gamma: f32,
    /// Calibration file (threshold, core-sim; static's hot set — else ranked from the trace itself)
    #[arg(long = "calib")]
    pub calib: Option<PathBuf>,
    /// Layers per cross-layer preload group
    #[arg(long = "preload", default_value_t = 4, value_parser = sift_session::ranges::count_in::<0, 4096>)]
    pub preload: usize,
    /// Cache split among ops: read-cost or uniform
    #[arg(long = "cache-split", default_value = "read-cost", value_parser = ["read-cost", "uniform"])]
    pub cache_split: String,
    /// TAM decay λ and margin ε
    #[arg(long = "tam-lambda", default_value_t = sift_store::cache::TAM_DEFAULT_LAMBDA, value_parser = sift_session::ranges::skip_ratio_f32)]
    pub tam_lambda: f32,
    #[arg(long = "tam-eps", default_value_t = sift_store::cache::TAM_DEFAULT_EPS, value_parser = sift_session::ranges::fraction_f32)]
    pub tam_eps: f32,
    /// Override the runtime memory the trace recorded (bytes with K/M/G)
    #[arg(long = "runtime")]
    pub runtime: Option<String>,
    /// Override the context size the trace recorded (it sizes the KV cache in the plan)
    #[arg(short = 'c', long = "ctx-size", value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: Option<usize>,
    /// Write results.csv, hitrate.svg, tps.svg and reads.svg into this directory (with
    /// tam-adaptive: lambda-N.svg and loads-N.svg, λ and loads per token of run N)
    #[arg(long = "sweep")]
    pub sweep: Option<PathBuf>,
    /// Output format: md or json
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
}

pub fn run(a: SimulateArgs) -> anyhow::Result<()> {
    let trace = Trace::read(&a.trace)?;
    if let Some(gpu) = &a.gpu {
        return crate::simulate_gpu::run(&a, gpu, &trace);
    }
    anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
    // A GGUF stands for its column file (built on first use, as `--memory` does).
    let pack = crate::session::column_file(&a.model, None)?;
    let profile = sift_session::profile::machine_or_named(
        a.profile.as_deref(),
        &pack,
        sift_engine::default_threads(),
        None,
        &mut |l| eprintln!("{l}"),
    )?
    .profile;
    let mut model = sift_store::open_model(&pack).with_context(|| format!("cannot load '{}'", pack.display()))?;
    trace.header.check_model(&a.trace, &model)?;
    let model_size = model.columns.as_ref().map_or(0, |p| p.gguf_len);
    let mut header = trace.header.clone();
    if let Some(r) = &a.runtime {
        header.runtime_bytes = sift_session::parse_budget(r, 0).context("--runtime")?;
    } else if header.runtime_bytes == 0 {
        // A trace recorded without a budget's accounting (the planner's own): the runtime a
        // budgeted run of this model has, measured as `sift plan` measures it.
        let _tok = sift_model::tokenizer::Tokenizer::from_gguf(&model.file.gguf)?;
        sift_session::drop_tokenizer_tables(&mut model);
        header.runtime_bytes = sift_session::runtime_bytes(&[&pack, model.file.path()], 0);
    }
    if let Some(c) = a.ctx_size {
        header.n_ctx = c;
    }
    let trace = Trace { header, events: trace.events };
    let split = CacheSplit::parse(&a.cache_split).context("--cache-split")?;
    let calib = match &a.calib {
        Some(p) => Some(sift_engine::sparsity::Calibration::load(p)?),
        None => None,
    };
    let mut reports: Vec<SimReport> = Vec::new();
    let runs = a.memory.len() * a.policy.len() * a.sparsity.len();
    for m in &a.memory {
        let budget = sift_session::parse_budget(m, model_size)?;
        for (p, sp) in a.policy.iter().flat_map(|p| a.sparsity.iter().map(move |s| (p, s))) {
            let policy = sift_session::profile::parse_policy(p, a.tam_lambda, a.tam_eps)?;
            let replay = if sp == "recorded" {
                Replay::Recorded
            } else {
                let method: sift_engine::sparsity::Method =
                    sp.parse().map_err(|e| anyhow::anyhow!("--sparsity: {e}"))?;
                let args = sift_session::SparsityOptions::for_method(method, a.ratio, a.gamma, a.calib.clone());
                Replay::Select(args.selector(&model)?)
            };
            let opts = SimOptions {
                budget,
                inputs: None,
                tiered: TieredOptions { policy, preload: a.preload, split, ..TieredOptions::default() },
                replay,
                calibration: calib.clone(),
                label: format!("{m} {p} {sp}"),
            };
            match simulate(&model, &pack, &trace, &profile, opts) {
                Ok(r) => reports.push(r),
                Err(e) if runs > 1 => eprintln!("sift: {m} {p} {sp}: {e}"),
                Err(e) => return Err(e.into()),
            }
        }
    }
    if a.output == "json" {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!(
            "simulated on **{}** ({}), {} decoded tokens of `{}`\n",
            profile.name,
            profile.source,
            trace.n_tokens(),
            a.trace.display()
        );
        println!("| budget | policy | preload | selector | cache | hit rate (bytes) | read/token | preload/token | must read/token | amplification | tok/s | bound tok/s | % of bound | compute s | stall s |");
        println!("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &reports {
            let per = |b: u64| b as f64 / r.tokens.max(1) as f64 / (1 << 20) as f64;
            let t = &r.telemetry;
            println!(
                "| {:.0} MiB | {} | {} | {} | {:.0} MiB ({:.0}%) | {:.1}% ({:.1}%) | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.2} | {:.2} | {:.2} | {:.0}% | {:.2} | {:.2} |",
                r.budget as f64 / (1 << 20) as f64,
                r.policy,
                r.preload,
                r.selector,
                r.plan.cache as f64 / (1 << 20) as f64,
                r.plan.cache_fraction * 100.0,
                r.hit_rate * 100.0,
                t.hit_rate_bytes * 100.0,
                per(r.stats.bytes_read()),
                per(r.stats.bytes_preload),
                t.bound.must_read_per_token / (1 << 20) as f64,
                t.read_amplification,
                r.tok_s,
                t.bound.tok_s,
                t.pct_of_bound,
                r.compute_s,
                r.stall_s
            );
        }
    }
    if let Some(dir) = &a.sweep {
        let calib = a.calib.clone().unwrap_or_default();
        write_sweep(dir, &reports, &[&a.trace, &a.model, &calib])?;
        eprintln!(
            "sift: wrote {}/results.csv, hitrate.svg, tps.svg, reads.svg (and lambda-N.svg, loads-N.svg for tam-adaptive)",
            dir.display()
        );
    }
    Ok(())
}

fn write_sweep(dir: &Path, reports: &[SimReport], inputs: &[&Path]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create '{}'", dir.display()))?;
    let mut csv = String::from(
        "budget_bytes,policy,preload,selector,cache_bytes,cache_fraction,hit_rate,bytes_preload,bytes_ondemand,tokens,tok_s,compute_s,stall_s\n",
    );
    for r in reports {
        csv.push_str(&format!(
            "{},{},{},{},{},{:.4},{:.4},{},{},{},{:.4},{:.4},{:.4}\n",
            r.budget,
            r.policy,
            r.preload,
            r.selector.replace(',', ";"),
            r.plan.cache,
            r.plan.cache_fraction,
            r.hit_rate,
            r.stats.bytes_preload,
            r.stats.bytes_ondemand,
            r.tokens,
            r.tok_s,
            r.compute_s,
            r.stall_s
        ));
    }
    crate::outputs::write_in(dir, "results.csv", inputs, csv.as_bytes())?;
    let mut by_policy: Vec<(String, Vec<&SimReport>)> = Vec::new();
    for r in reports {
        // The method's name keeps the legend short ("lfu / topk").
        let method = r.selector.split_whitespace().next().unwrap_or("");
        let key = format!("{} / {method}", r.policy);
        match by_policy.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => by_policy.push((key, vec![r])),
        }
    }
    let series = |f: &dyn Fn(&SimReport) -> f64| -> Vec<Series> {
        by_policy
            .iter()
            .map(|(k, v)| Series {
                name: k.clone(),
                points: v.iter().map(|r| (r.plan.cache as f64 / (1 << 20) as f64, f(r))).collect(),
            })
            .collect()
    };
    let hit = Chart {
        title: "Column-cache hit rate vs cache size (simulated)".into(),
        x_label: "cache (MiB)".into(),
        y_label: "hit rate (%)".into(),
        log_y: false,
        series: series(&|r| r.hit_rate * 100.0),
    };
    let tps = Chart {
        title: "Predicted decode speed vs cache size".into(),
        x_label: "cache (MiB)".into(),
        y_label: "tokens/s".into(),
        log_y: false,
        series: series(&|r| r.tok_s),
    };
    let reads = Chart {
        title: "Bytes read per token vs cache size (simulated)".into(),
        x_label: "cache (MiB)".into(),
        y_label: "MiB read per token".into(),
        log_y: false,
        series: series(&|r| r.telemetry.bytes_read_per_token / (1 << 20) as f64),
    };
    crate::outputs::write_in(dir, "hitrate.svg", inputs, hit.to_svg().as_bytes())?;
    crate::outputs::write_in(dir, "tps.svg", inputs, tps.to_svg().as_bytes())?;
    crate::outputs::write_in(dir, "reads.svg", inputs, reads.to_svg().as_bytes())?;
    // Adaptive TAM: λ and loads over the decode, for a few layers of each adaptive run.
    for (i, r) in reports.iter().filter(|r| !r.lambda.is_empty()).enumerate() {
        let n_layer = r.lambda.iter().map(|s| s.layer + 1).max().unwrap_or(1);
        let layers = [0, n_layer / 2, n_layer.saturating_sub(2)];
        let per_layer = |f: &dyn Fn(&sift_store::cache::LambdaStep) -> f64| -> Vec<Series> {
            layers
                .iter()
                .map(|&l| Series {
                    name: format!("layer {l}"),
                    points: r.lambda.iter().filter(|s| s.layer == l).map(|s| (f64::from(s.step), f(s))).collect(),
                })
                .collect()
        };
        let budget = r.budget as f64 / (1 << 20) as f64;
        let lambda = Chart {
            title: format!("Adaptive TAM: λ per decoded token ({budget:.0} MiB budget)"),
            x_label: "decoded token".into(),
            y_label: "λ".into(),
            log_y: false,
            series: per_layer(&|s| f64::from(s.lambda)),
        };
        let loads = Chart {
            title: format!("Adaptive TAM: columns loaded into the cache per token ({budget:.0} MiB budget)"),
            x_label: "decoded token".into(),
            y_label: "columns loaded".into(),
            log_y: false,
            series: per_layer(&|s| f64::from(s.loads)),
        };
        crate::outputs::write_in(dir, &format!("lambda-{i}.svg"), inputs, lambda.to_svg().as_bytes())?;
        crate::outputs::write_in(dir, &format!("loads-{i}.svg"), inputs, loads.to_svg().as_bytes())?;
    }
    Ok(())
}
