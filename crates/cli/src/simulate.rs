//! `sift simulate`: replay a trace through the engine's cache and prefetch code on a device
//! profile (see `sift_sim::replay`); `--sweep` runs every budget × policy given and writes CSV and
//! plots. Also home of the profile lookup shared with `sift plan` and `--memory`.

use crate::args::SimulateArgs;
use anyhow::Context;
use sift_eval::plot::{Chart, Series};
use sift_sim::replay::{simulate, Replay, SimOptions, SimReport};
use sift_sim::trace::Trace;
use sift_store::tiered::{CacheSplit, TieredOptions};
use std::path::Path;

pub fn run(a: SimulateArgs) -> anyhow::Result<()> {
    let trace = Trace::read(&a.trace)?;
    if let Some(gpu) = &a.gpu {
        return crate::simulate_gpu::run(&a, gpu, &trace);
    }
    anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
    // A GGUF stands for its column file (built on first use, as `--memory` does).
    let pack = sift_session::autopack::column_file(&a.model, None)?;
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
    sift_session::outputs::write_in(dir, "results.csv", inputs, csv.as_bytes())?;
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
    sift_session::outputs::write_in(dir, "hitrate.svg", inputs, hit.to_svg().as_bytes())?;
    sift_session::outputs::write_in(dir, "tps.svg", inputs, tps.to_svg().as_bytes())?;
    sift_session::outputs::write_in(dir, "reads.svg", inputs, reads.to_svg().as_bytes())?;
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
        sift_session::outputs::write_in(dir, &format!("lambda-{i}.svg"), inputs, lambda.to_svg().as_bytes())?;
        sift_session::outputs::write_in(dir, &format!("loads-{i}.svg"), inputs, loads.to_svg().as_bytes())?;
    }
    Ok(())
}
