//! `sift probe --gpu -m MODEL`'s second half: what the engine's own operations cost on this GPU
//! machine, for `sift simulate --gpu FILE` to replay the engine's hybrid decode
//! (`sift_sim::hybrid_engine`). Six short greedy decodes of the model's pack, each opened as
//! `sift generate` would open it: hybrid decode (Top-K 0.5) with attention and the head on the
//! GPU and every unit on the CPU, with attention and every group on the GPU, with attention on
//! the CPU at two budgets (one under `tam-adaptive`, which moves groups), and dense on the CPU and with every layer on the GPU
//! (`-ngl 99`); their `hybrid` reports and times per token give the costs
//! ([`EngineCosts::calibrate`]).

use crate::options::Defaults;
use crate::{Session, SessionOptions};
use anyhow::Context;
use clap::Parser;
use sift_engine::hybrid::HybridReport;
use sift_engine::{EngineOptions, Logits};
use sift_sim::hybrid_engine::EngineCosts;
use std::path::Path;
use std::time::Instant;

/// The text the calibration decodes after (WikiText-2's opening, public domain on Wikipedia).
const PROMPT: &str = "Robert Boulter is an English film, television and theatre actor. He had a guest-starring \
role on the television series The Bill in 2000. This was followed by a starring role in the play Herons written \
by Simon Stephens, which was performed in 2001 at the Royal Court Theatre. He had a guest role in the television \
series Judge John Deed in 2002. In 2004 Boulter landed a role as Craig in the episode Teddy's Story of the \
television series The Long Firm; he starred alongside actors Mark Strong and Derek Jacobi.";

/// Decoded tokens per calibration run.
const TOKENS: usize = 128;
/// The context the runs hold (as the benchmark runs' `-c 1024`).
const N_CTX: usize = 1024;

/// Opens `pack` with these command-line flags and decodes [`TOKENS`] greedy tokens after
/// [`PROMPT`]: the time per decoded token (ns) and the hybrid report, if any.
fn decode(pack: &Path, threads: usize, flags: &[&str]) -> anyhow::Result<(f64, Option<HybridReport>, usize)> {
    let f = Defaults::try_parse_from(std::iter::once("probe").chain(flags.iter().copied()))
        .with_context(|| format!("calibration flags {flags:?}"))?;
    let engine = EngineOptions { n_threads: threads, n_ctx: N_CTX, ..EngineOptions::default() };
    let opts = SessionOptions { model: pack.into(), engine, sparsity: f.sparsity, memory: f.memory };
    let mut s = Session::open(&opts).with_context(|| format!("cannot open '{}' with {flags:?}", pack.display()))?;
    let prompt = s.tok.encode(PROMPT, true, false)?;
    let mut tok = sift_engine::sampling::argmax_logits(s.engine.eval(&prompt, Logits::Last)?);
    let t = Instant::now();
    for _ in 0..TOKENS {
        tok = sift_engine::sampling::argmax_logits(s.engine.eval(&[tok], Logits::Last)?);
    }
    let ns = t.elapsed().as_nanos() as f64 / TOKENS as f64;
    Ok((ns, s.engine.hybrid().map(|h| h.report()), s.engine.model.config.n_layer))
}

/// The engine's costs on this machine for `pack` (see the module docs); `head_gpu_ns` and
/// `round_trip_ns` from the transfer probe fill in the head on the GPU where no run placed it.
pub fn calibrate(pack: &Path, threads: usize, head_gpu_ns: f64, round_trip_ns: f64) -> anyhow::Result<EngineCosts> {
    let hybrid = ["--sparsity", "topk", "--ratio", "0.5"];
    // Attention and the head on the GPU with no room for a group: every unit on the CPU.
    let model = sift_store::open_model(pack).with_context(|| format!("cannot load '{}'", pack.display()))?;
    let dense_only = format!(
        "{}K",
        (sift_engine::gpu::attention_bytes(&model, N_CTX) + sift_engine::gpu::head_bytes(&model)) / 1024 + 64
    );
    drop(model);
    // The policy moves groups in one run (the cost of issuing loads), the others stay put.
    let configs: [(&str, &[&str]); 4] = [
        (
            "static, attention and the head on the GPU, no group",
            &["--gpu-policy", "static", "--gpu-memory", &dense_only, "--gpu-attention", "on"],
        ),
        // Far above the model's slots (Q8_0 columns take about twice a 4-bit model's bytes):
        // only what the groups need is allocated.
        (
            "static, attention and every group on the GPU",
            &["--gpu-policy", "static", "--gpu-memory", "16G", "--gpu-attention", "on"],
        ),
        (
            "tam-adaptive, attention on the CPU, 50 %",
            &["--gpu-policy", "tam-adaptive", "--gpu-memory", "50%", "--gpu-attention", "off"],
        ),
        (
            "static, attention on the CPU, 15 %",
            &["--gpu-policy", "static", "--gpu-memory", "15%", "--gpu-attention", "off"],
        ),
    ];
    let mut runs = Vec::new();
    for (what, extra) in configs {
        let flags: Vec<&str> = hybrid.iter().chain(extra.iter()).copied().collect();
        let (ns, r, _) = decode(pack, threads, &flags)?;
        let r = r.context("a hybrid run without a hybrid report")?;
        eprintln!(
            "sift: calibration, hybrid {what}: {:.2} ms per token (CPU share {:.0} %, head {:.3} ms on the {}, {:.1} loads)",
            ns / 1e6,
            r.cpu_share * 100.0,
            r.head_ms,
            if r.head_on_gpu { "GPU" } else { "CPU" },
            r.reloads_per_token
        );
        runs.push(r);
    }
    let (dense_cpu, _, n_layer) = decode(pack, threads, &[])?;
    let (dense_gpu, _, _) = decode(pack, threads, &["--gpu-layers", "99"])?;
    eprintln!(
        "sift: calibration, dense: {:.2} ms per token on the CPU, {:.2} ms with every layer on the GPU",
        dense_cpu / 1e6,
        dense_gpu / 1e6
    );
    EngineCosts::calibrate(&runs, n_layer, dense_cpu, dense_gpu, head_gpu_ns, round_trip_ns)
        .map_err(|e| anyhow::anyhow!("calibration: {e}"))
}
