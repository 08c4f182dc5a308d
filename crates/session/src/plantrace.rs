//! The planner's own trace: a short greedy generation recorded once per column file, so that
//! `sift plan` predicts by simulation — the engine's own cache and read path replayed on this
//! machine's profile — rather than by the closed-form cost model, without the user recording a
//! trace by hand.
//!
//! Kept next to the column file as `<pack>.plan.trace` (or in the user's cache folder when that
//! folder is not writable), recorded with the whole model in memory (Top-K 0.5; the planner
//! replays each candidate's own ratio on the recorded inputs), [`PLAN_TOKENS`] decoded tokens of
//! [`PLAN_PROMPT`]. A trace that does not load or does not match the model is recorded again.

use crate::machine::cache_dir;
use crate::options::{MemoryOptions, SessionOptions, SparsityOptions};
use crate::Session;
use anyhow::Context;
use sift_engine::generate::{generate, GenerateOptions};
use sift_engine::sampling::SamplerOptions;
use sift_engine::sparsity::Method;
use sift_engine::EngineOptions;
use sift_sim::trace::{Trace, TraceHeader, TraceWriter};
use std::path::{Path, PathBuf};

/// Decoded tokens the planner's trace records.
pub const PLAN_TOKENS: usize = 48;
/// The prompt it continues (prose and code: what the models are asked for).
pub const PLAN_PROMPT: &str = "Explain, with a short Python example, how a least-recently-used cache works and when \
one would choose it over a least-frequently-used cache.";

/// Where the planner's trace of the column file `pack` lives.
pub fn plan_trace_path(pack: &Path) -> Option<PathBuf> {
    let name = format!("{}.plan.trace", pack.file_name()?.to_string_lossy());
    let dir = pack.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if tempfile::Builder::new().prefix(".sift-probe").tempfile_in(dir).is_ok() {
        Some(dir.join(name))
    } else {
        Some(cache_dir()?.join(name))
    }
}

/// The planner's trace of `pack` if one is kept and matches `model`.
pub fn cached_plan_trace(pack: &Path, model: &sift_model::Model) -> Option<Trace> {
    let path = plan_trace_path(pack)?;
    let t = Trace::read(&path).ok()?;
    t.header.check_model(&path, model).ok()?;
    Some(t)
}

/// The planner's trace of `pack`: the kept one, else recorded now (`notice` says so) and kept.
pub fn plan_trace(
    pack: &Path,
    model: &sift_model::Model,
    threads: usize,
    notice: &mut dyn FnMut(&str),
) -> anyhow::Result<Trace> {
    if let Some(t) = cached_plan_trace(pack, model) {
        return Ok(t);
    }
    let path = plan_trace_path(pack).context("no folder to keep the planner's trace in")?;
    notice(&format!(
        "sift: recording {PLAN_TOKENS} decoded tokens once, for the planner to simulate this model ({})",
        path.display()
    ));
    record(pack, &path, threads).with_context(|| format!("recording the planner's trace {}", path.display()))?;
    let t = Trace::read(&path)?;
    t.header.check_model(&path, model)?;
    Ok(t)
}

fn record(pack: &Path, out: &Path, threads: usize) -> anyhow::Result<()> {
    let opts = SessionOptions {
        model: pack.to_path_buf(),
        engine: EngineOptions { n_threads: threads, n_ctx: 512, ..EngineOptions::default() },
        sparsity: SparsityOptions { method: Some(Method::TopK), ratio: 0.5, ..SparsityOptions::default() },
        memory: MemoryOptions::default(),
    };
    let mut session = Session::open(&opts)?;
    let tok = session.tok.clone();
    let engine = &mut session.engine;
    let c = engine.config().clone();
    let header = TraceHeader {
        model: pack.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        dims: sift_model::layout::SiteDims::of(&c).units,
        selector: engine.selector().describe(),
        n_ctx: engine.n_ctx(),
        n_batch: opts.engine.n_batch,
        runtime_bytes: 0,
        measured_tok_s: 0.0,
    };
    let dir = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile::Builder::new().prefix(".plan-").suffix(".trace").tempfile_in(dir)?;
    let writer = TraceWriter::create(tmp.path(), &header)?;
    engine.set_tracer(Some(Box::new(writer.clone())));
    let tokens = tok.encode(PLAN_PROMPT, true, false)?;
    let gen = GenerateOptions {
        n_predict: Some(PLAN_TOKENS),
        stop: Vec::new(),
        ignore_eos: true,
        sampler: SamplerOptions { temp: 0.0, ..SamplerOptions::default() },
    };
    generate(engine, &tok, &tokens, &gen, |_| true)?;
    engine.set_tracer(None);
    writer.finish()?;
    tmp.persist(out).map_err(|e| e.error)?;
    Ok(())
}
