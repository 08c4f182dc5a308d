//! `sift simulate --gpu PROFILE`: a trace's FFN activity replayed through KAIROX's GPU–CPU
//! hybrid decode (`sift_sim::hybrid`) for each GPU budget × balancing policy.

use crate::args::SimulateArgs;
use anyhow::Context;
use sift_engine::balancer::BalancePolicy;
use sift_engine::gpu::GpuPlacement;
use sift_engine::hybrid::AttentionPlacement;
use sift_engine::hybrid::{knee_bytes, pool_layout};
use sift_sim::hybrid::{
    ffn_activity, in_pack_order, simulate_hybrid, GpuProfile, HybridModel, HybridOptions, HybridPolicy,
};
use sift_sim::hybrid_engine::{adjacent_prediction, ffn_sites, simulate_engine, EngineCosts, EngineRun};
use sift_sim::trace::Trace;
use sift_store::cache::LambdaBounds;

pub fn run(a: &SimulateArgs, gpu: &str, trace: &Trace) -> anyhow::Result<()> {
    let profile = match GpuProfile::builtin(gpu) {
        Some(p) => p,
        None if std::path::Path::new(gpu).is_file() => {
            let text = sift_output::read_regular(std::path::Path::new(gpu), 1 << 20)
                .with_context(|| format!("cannot read the GPU profile '{gpu}'"))?;
            let text = String::from_utf8(text).map_err(|_| anyhow::anyhow!("GPU profile '{gpu}' is not text"))?;
            GpuProfile::from_probe(&text).map_err(|e| anyhow::anyhow!("GPU profile '{gpu}': {e}"))?
        }
        None => anyhow::bail!(
            "unknown GPU profile '{gpu}': use a file from `sift probe --gpu -o FILE` or one of {}",
            GpuProfile::builtin_names().join(", ")
        ),
    };
    anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
    let model = sift_store::open_model(&a.model).with_context(|| format!("cannot load '{}'", a.model.display()))?;
    trace.header.check_model(&a.trace, &model)?;
    if let Some(costs) = &profile.engine {
        return run_engine(a, &profile, costs, trace, &model);
    }
    let group_size = a.group_size.unwrap_or(16) as usize;
    let shape = HybridModel::of(&model);
    let matrices: u64 = shape.head_bytes
        + model
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .map(|t| (t.rows * t.row_bytes) as u64)
            .sum::<u64>();
    // Groups are consecutive neurons in the pack's unit order (its co-activation grouping).
    let mut activity = ffn_activity(trace);
    in_pack_order(&mut activity, &model);
    anyhow::ensure!(!activity.is_empty(), "the trace '{}' has no decoded tokens", a.trace.display());
    let mut rows = Vec::new();
    for m in &a.gpu_memory {
        let budget = sift_session::parse_budget(m, matrices).with_context(|| format!("--gpu-memory {m}"))?;
        let k = shape.groups_for(budget, group_size);
        let layers = shape.layers_for(budget);
        for p in &a.gpu_policy {
            let policy = HybridPolicy::parse(p).with_context(|| {
                format!("unknown --gpu-policy '{p}': use static, eager, lru, tam, tam-adaptive, layers or oracle")
            })?;
            let Some(k) =
                k.filter(|_| policy != HybridPolicy::LayerSplit).or((policy == HybridPolicy::LayerSplit).then_some(0))
            else {
                eprintln!(
                    "sift: --gpu-memory {m}: {p} needs every layer's attention and the output head on the GPU ({} MiB); skipped",
                    shape.fixed_gpu_bytes() >> 20
                );
                continue;
            };
            let opts = HybridOptions {
                policy,
                group_size,
                gpu_groups: k,
                gpu_layers: layers,
                eps: a.tam_eps,
                bounds: LambdaBounds::default(),
            };
            let r = simulate_hybrid(&activity, &shape, &profile, &opts);
            let placed =
                if policy == HybridPolicy::LayerSplit { format!("{} layers", layers.0) } else { k.to_string() };
            rows.push((m.clone(), budget, placed, r));
        }
    }
    if a.output == "json" {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(m, budget, k, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["gpu_memory"] = serde_json::json!(m);
                v["gpu_bytes"] = serde_json::json!(budget);
                v["placed"] = serde_json::json!(k);
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let n_groups = shape.n_ff.div_ceil(group_size);
    println!(
        "hybrid decode simulated on **{}**, {} decoded tokens of `{}`, groups of {} neurons ({} per layer, {} KiB each)\n",
        profile.name,
        activity.len(),
        a.trace.display(),
        group_size,
        n_groups,
        (group_size as u64 * shape.neuron_bytes) >> 10
    );
    println!("| GPU memory | on the GPU (groups / layer) | policy | tok/s | p50 ms | p99 ms | reloads/token | MiB/token | CPU share | stall share |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for (m, _, k, r) in &rows {
        println!(
            "| {m} | {k} | {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1}% | {:.1}% |",
            r.policy,
            r.tok_s,
            r.p50_ns / 1e6,
            r.p99_ns / 1e6,
            r.reloads_per_token,
            r.reload_bytes_per_token / (1 << 20) as f64,
            100.0 * r.cpu_share,
            100.0 * r.stall_share
        );
    }
    Ok(())
}

/// The engine's own hybrid decode replayed at its measured costs (`sift_sim::hybrid_engine`).
fn run_engine(
    a: &SimulateArgs,
    profile: &GpuProfile,
    costs: &EngineCosts,
    trace: &Trace,
    model: &sift_model::Model,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        model.columns.is_some(),
        "'{}' is not a pack: the hybrid decode runs on a pack's columns (make one with `sift pack MODEL.gguf`)",
        a.model.display()
    );
    let activity = ffn_sites(trace);
    anyhow::ensure!(!activity.is_empty(), "the trace '{}' has no decoded tokens", a.trace.display());
    let n_layer = model.layers.len();
    // A percentage is of what the engine's --gpu-memory takes it of: every matrix and norm.
    let all = GpuPlacement::from_layers(n_layer + 1, n_layer).bytes(model, 0);
    let attention = AttentionPlacement::parse(&a.gpu_attention).expect("clap checked it");
    let n_ctx = a.ctx_size.unwrap_or(sift_engine::EngineOptions::default().n_ctx);
    let mut rows = Vec::new();
    for m in &a.gpu_memory {
        let budget = sift_session::parse_budget(m, all).with_context(|| format!("--gpu-memory {m}"))?;
        for p in &a.gpu_policy {
            let policy = match p.as_str() {
                "layers" => None,
                "oracle" => {
                    eprintln!("sift: the oracle bound belongs to KAIROX's design (a profile without the engine's costs); skipped");
                    continue;
                }
                _ => Some(BalancePolicy::parse(p).with_context(|| {
                    format!("unknown --gpu-policy '{p}': use static, eager, lru, tam, tam-adaptive or layers")
                })?),
            };
            let run =
                EngineRun { policy, gpu_bytes: budget, attention, n_ctx, group_size: a.group_size.map(|g| g as usize) };
            let (r, placed) =
                simulate_engine(&activity, model, profile, costs, &run).map_err(|e| anyhow::anyhow!(e))?;
            let what = if policy.is_none() {
                format!("{} of {n_layer} layers{}", placed.gpu_layers, if placed.head { " + head" } else { "" })
            } else {
                format!(
                    "{}{}{:.0}% of groups",
                    if placed.attention { "attention, " } else { "" },
                    if placed.head { "head, " } else { "" },
                    placed.gpu_share * 100.0
                )
            };
            rows.push((m.clone(), budget, what, r));
        }
    }
    // KAIROX's adjacent-layer prediction, scored on the trace (groups of the engine's size).
    let gs = pool_layout(model, a.group_size.map(|g| g as usize), 0, knee_bytes(&profile.pcie))
        .map_or(16, |l| l.specs[0].group_size);
    let pred = adjacent_prediction(trace, model, gs);
    let pred_line = format!(
        "adjacent-layer prediction of the FFN input's channels (layer l's attention output for layer l + 1, {} token-layer pairs): recall {:.1}%, precision {:.1}%; of its {gs}-channel groups: recall {:.1}%, precision {:.1}%; the token before's channels: recall {:.1}%",
        pred.pairs,
        100.0 * pred.channel_recall,
        100.0 * pred.channel_precision,
        100.0 * pred.group_recall,
        100.0 * pred.group_precision,
        100.0 * pred.previous_token_recall
    );
    if a.output == "json" {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(m, budget, what, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["gpu_memory"] = serde_json::json!(m);
                v["gpu_bytes"] = serde_json::json!(budget);
                v["placed"] = serde_json::json!(what);
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        eprintln!("sift: {pred_line}");
        return Ok(());
    }
    println!(
        "sift's hybrid decode simulated at the engine's measured costs on **{}**, {} decoded tokens of `{}`, -c {n_ctx}\n",
        profile.name,
        activity.len(),
        a.trace.display()
    );
    println!("| GPU memory | on the GPU | policy | tok/s | p50 ms | p99 ms | reloads/token | MiB/token | CPU share | stall share |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (m, _, what, r) in &rows {
        println!(
            "| {m} | {what} | {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1}% | {:.1}% |",
            r.policy,
            r.tok_s,
            r.p50_ns / 1e6,
            r.p99_ns / 1e6,
            r.reloads_per_token,
            r.reload_bytes_per_token / (1 << 20) as f64,
            100.0 * r.cpu_share,
            100.0 * r.stall_share
        );
    }
    println!("\n{pred_line}");
    Ok(())
}
