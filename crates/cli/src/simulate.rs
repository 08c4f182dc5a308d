//! `sift simulate`: a trace replayed through the engine's cache and prefetch code on a device
//! profile, or with `--gpu` through the hybrid decode (`sift_session::simulate`).

use crate::args::SimulateArgs;

pub fn run(a: SimulateArgs) -> anyhow::Result<()> {
    sift_session::simulate::Simulation {
        trace: a.trace,
        model: a.model,
        profile: a.profile,
        memory: a.memory,
        policies: a.policy,
        selections: a.sparsity,
        ratio: a.ratio,
        gamma: a.gamma,
        calib: a.calib,
        preload: a.preload,
        cache_split: a.cache_split,
        tam_lambda: a.tam_lambda,
        tam_eps: a.tam_eps,
        runtime: a.runtime,
        ctx_size: a.ctx_size,
        sweep: a.sweep,
        gpu: a.gpu,
        gpu_memory: a.gpu_memory,
        gpu_policies: a.gpu_policy,
        group_size: a.group_size.map(|g| g as usize),
        gpu_attention: a.gpu_attention,
        json: a.output == "json",
    }
    .run(&mut std::io::stdout().lock())
}
