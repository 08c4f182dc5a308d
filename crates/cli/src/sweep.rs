//! `sift sweep`: perplexity, an optional multiple-choice eval and decode speed over selection
//! methods × ratios, as a CSV and Pareto plots (`sift_session::sweep`).

use crate::args::SweepArgs;

pub fn run(a: SweepArgs) -> anyhow::Result<()> {
    sift_session::sweep::Sweep {
        model: a.model,
        file: a.file,
        ctx_size: a.ctx_size,
        chunks: a.chunks,
        methods: a.methods,
        ratios: a.ratios,
        calib: a.calib,
        gamma: a.gamma,
        alpha: a.alpha,
        tg: a.tg,
        threads: a.threads.unwrap_or_else(sift_engine::default_threads),
        out: a.out,
        dense_kernels: a.dense_kernels,
        eval: a.eval,
        eval_limit: a.eval_limit,
    }
    .run()
}
