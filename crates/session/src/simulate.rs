//! `sift simulate`'s runs: a trace replayed through the engine's cache and prefetch code on a
//! device profile (`sift_sim::replay`) for every budget × cache policy × selector given, or with a
//! GPU profile, through the GPU–CPU hybrid decode (KAIROX's design, `sift_sim::hybrid`, or with
//! the engine's measured costs its own, `sift_sim::hybrid_engine`) for every GPU budget × policy.
//! The reports are `sift_sim::replay_report`'s and `sift_sim::hybrid_report`'s; what is skipped
//! or failed goes to stderr.

use anyhow::Context;
use sift_engine::balancer::BalancePolicy;
use sift_engine::gpu::GpuPlacement;
use sift_engine::hybrid::{knee_bytes, pool_layout, AttentionPlacement};
use sift_model::Model;
use sift_sim::hybrid::{
    ffn_activity, in_pack_order, simulate_hybrid, GpuProfile, HybridModel, HybridOptions, HybridPolicy,
};
use sift_sim::hybrid_engine::{adjacent_prediction, ffn_sites, simulate_engine, EngineCosts, EngineRun};
use sift_sim::hybrid_report::{self, HybridRow};
use sift_sim::replay::{simulate, Replay, SimOptions, SimReport};
use sift_sim::trace::Trace;
use sift_store::cache::LambdaBounds;
use sift_store::tiered::{CacheSplit, TieredOptions};
use std::io::Write;
use std::path::PathBuf;

/// What `sift simulate` replays, and on what.
#[derive(Clone, Debug)]
pub struct Simulation {
    /// The trace (from `sift trace`) and the model or pack it was recorded on.
    pub trace: PathBuf,
    pub model: PathBuf,
    /// The device profile (a file or a builtin name; `None`: this machine's).
    pub profile: Option<String>,
    /// Memory budgets (bytes with K/M/G, or % of the model).
    pub memory: Vec<String>,
    /// The cache policies and the selections replayed (`recorded`, or a method's name), with the
    /// methods' ratio, DIP-CA's gamma and a calibration file.
    pub policies: Vec<String>,
    pub selections: Vec<String>,
    pub ratio: f64,
    pub gamma: f32,
    pub calib: Option<PathBuf>,
    /// Layers per preload group, the cache's split among ops, TAM's λ and ε.
    pub preload: usize,
    pub cache_split: String,
    pub tam_lambda: f32,
    pub tam_eps: f32,
    /// Overrides of the runtime memory and the context the trace recorded.
    pub runtime: Option<String>,
    pub ctx_size: Option<usize>,
    /// Where `--sweep` writes its CSV and charts.
    pub sweep: Option<PathBuf>,
    /// With a GPU profile (a builtin name or a file from `sift probe --gpu`): the hybrid decode.
    pub gpu: Option<String>,
    pub gpu_memory: Vec<String>,
    pub gpu_policies: Vec<String>,
    pub group_size: Option<usize>,
    pub gpu_attention: String,
    /// JSON instead of markdown.
    pub json: bool,
}

impl Simulation {
    /// Runs the simulations and writes the report to `out`.
    pub fn run(&self, out: &mut dyn Write) -> anyhow::Result<()> {
        let trace = Trace::read(&self.trace)?;
        if let Some(gpu) = &self.gpu {
            return self.hybrid(gpu, &trace, out);
        }
        let a = self;
        anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
        // A GGUF stands for its column file (built on first use, as `--memory` does).
        let pack = crate::autopack::column_file(&a.model, None)?;
        let profile = crate::profile::machine_or_named(
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
            header.runtime_bytes = crate::parse_budget(r, 0).context("--runtime")?;
        } else if header.runtime_bytes == 0 {
            // A trace recorded without a budget's accounting (the planner's own): the runtime a
            // budgeted run of this model has, measured as `sift plan` measures it.
            let _tok = sift_model::tokenizer::Tokenizer::from_gguf(&model.file.gguf)?;
            crate::drop_tokenizer_tables(&mut model);
            header.runtime_bytes = crate::runtime_bytes(&[&pack, model.file.path()], 0);
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
        let runs = a.memory.len() * a.policies.len() * a.selections.len();
        for m in &a.memory {
            let budget = crate::parse_budget(m, model_size)?;
            for (p, sp) in a.policies.iter().flat_map(|p| a.selections.iter().map(move |s| (p, s))) {
                let policy = crate::profile::parse_policy(p, a.tam_lambda, a.tam_eps)?;
                let replay = if sp == "recorded" {
                    Replay::Recorded
                } else {
                    let method: sift_engine::sparsity::Method =
                        sp.parse().map_err(|e| anyhow::anyhow!("--sparsity: {e}"))?;
                    let args = crate::SparsityOptions::for_method(method, a.ratio, a.gamma, a.calib.clone());
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
        if a.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&reports)?)?;
        } else {
            write!(out, "{}", sift_sim::replay_report::markdown(&reports, &profile, trace.n_tokens(), &a.trace))?;
        }
        if let Some(dir) = &a.sweep {
            let calib = a.calib.clone().unwrap_or_default();
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create '{}'", dir.display()))?;
            for (name, text) in sift_sim::replay_report::sweep_files(&reports) {
                crate::outputs::write_in(dir, &name, &[&a.trace, &a.model, &calib], text.as_bytes())?;
            }
            eprintln!(
                "sift: wrote {}/results.csv, hitrate.svg, tps.svg, reads.svg (and lambda-N.svg, loads-N.svg for tam-adaptive)",
                dir.display()
            );
        }
        Ok(())
    }

    /// `--gpu PROFILE`: the trace's FFN activity through the hybrid decode, per GPU budget ×
    /// balancing policy.
    fn hybrid(&self, gpu: &str, trace: &Trace, out: &mut dyn Write) -> anyhow::Result<()> {
        let a = self;
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
            return self.hybrid_engine(&profile, costs, trace, &model, out);
        }
        let group_size = a.group_size.unwrap_or(16);
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
            let budget = crate::parse_budget(m, matrices).with_context(|| format!("--gpu-memory {m}"))?;
            let k = shape.groups_for(budget, group_size);
            let layers = shape.layers_for(budget);
            for p in &a.gpu_policies {
                let policy = HybridPolicy::parse(p).with_context(|| {
                    format!("unknown --gpu-policy '{p}': use static, eager, lru, tam, tam-adaptive, layers or oracle")
                })?;
                let split = policy == HybridPolicy::LayerSplit;
                let Some(k) = k.filter(|_| !split).or(split.then_some(0)) else {
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
                let report = simulate_hybrid(&activity, &shape, &profile, &opts);
                let placed = if split { format!("{} layers", layers.0) } else { k.to_string() };
                rows.push(HybridRow { gpu_memory: m.clone(), gpu_bytes: budget, placed, report });
            }
        }
        if a.json {
            writeln!(out, "{}", hybrid_report::json(&rows)?)?;
            return Ok(());
        }
        writeln!(
            out,
            "hybrid decode simulated on **{}**, {} decoded tokens of `{}`, groups of {} neurons ({} per layer, {} KiB each)\n",
            profile.name,
            activity.len(),
            a.trace.display(),
            group_size,
            shape.n_ff.div_ceil(group_size),
            (group_size as u64 * shape.neuron_bytes) >> 10
        )?;
        write!(out, "{}", hybrid_report::markdown(&rows, "on the GPU (groups / layer)", "---:"))?;
        Ok(())
    }

    /// The engine's own hybrid decode replayed at its measured costs (`sift_sim::hybrid_engine`).
    fn hybrid_engine(
        &self,
        profile: &GpuProfile,
        costs: &EngineCosts,
        trace: &Trace,
        model: &Model,
        out: &mut dyn Write,
    ) -> anyhow::Result<()> {
        let a = self;
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
            let budget = crate::parse_budget(m, all).with_context(|| format!("--gpu-memory {m}"))?;
            for p in &a.gpu_policies {
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
                let run = EngineRun { policy, gpu_bytes: budget, attention, n_ctx, group_size: a.group_size };
                let (report, placed) =
                    simulate_engine(&activity, model, profile, costs, &run).map_err(|e| anyhow::anyhow!(e))?;
                let placed = if policy.is_none() {
                    format!("{} of {n_layer} layers{}", placed.gpu_layers, if placed.head { " + head" } else { "" })
                } else {
                    format!(
                        "{}{}{:.0}% of groups",
                        if placed.attention { "attention, " } else { "" },
                        if placed.head { "head, " } else { "" },
                        placed.gpu_share * 100.0
                    )
                };
                rows.push(HybridRow { gpu_memory: m.clone(), gpu_bytes: budget, placed, report });
            }
        }
        // KAIROX's adjacent-layer prediction, scored on the trace (groups of the engine's size).
        let gs = pool_layout(model, a.group_size, 0, knee_bytes(&profile.pcie)).map_or(16, |l| l.specs[0].group_size);
        let pred_line = hybrid_report::prediction_line(&adjacent_prediction(trace, model, gs), gs);
        if a.json {
            writeln!(out, "{}", hybrid_report::json(&rows)?)?;
            eprintln!("sift: {pred_line}");
            return Ok(());
        }
        writeln!(
            out,
            "sift's hybrid decode simulated at the engine's measured costs on **{}**, {} decoded tokens of `{}`, -c {n_ctx}\n",
            profile.name,
            activity.len(),
            a.trace.display()
        )?;
        write!(out, "{}", hybrid_report::markdown(&rows, "on the GPU", "---"))?;
        writeln!(out, "\n{pred_line}")?;
        Ok(())
    }
}
