//! `sift eval`: multiple-choice accuracy by log-likelihood (acc, acc_norm), lm-eval's method; see
//! the `sift_eval` crate docs for the prompts and for how llama.cpp's HellaSwag score differs, and
//! `sift_eval::run` for the run.

use crate::args::EvalArgs;
use sift_eval::run::EvalRequest;

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    let eval = EvalRequest {
        file: a.file,
        format: a.format,
        task: a.task,
        offset: a.offset,
        limit: a.limit,
        shots: a.shots,
        shots_file: a.shots_file,
    }
    .load()?;
    let memory = sift_session::MemoryOptions::default();
    let mut session = crate::session::open(&a.model.model, a.model.engine_options(), &a.sparsity, &memory)?;
    let tok = session.tok.clone();
    // Selectors with sequence state (core neurons, DIP-CA's cache) must see each item from an
    // empty context, so every context restarts instead of reusing a shared prefix.
    let reuse_prefix = a.sparsity.method() == sift_engine::sparsity::Method::Dense;
    let out = &mut std::io::stdout().lock();
    eval.score(&mut session.engine, &tok, reuse_prefix, &a.model.model, a.output == "json", out)
}
