//! `sift trace`'s run: prompts generated from on a session opened as `sift generate` opens one,
//! with the selector's inputs and choices per decoded token, layer and site written to a trace
//! file (`sift_sim::trace`) for `sift simulate` and `sift plan --trace`. Progress and the store's
//! report go to stderr.

use crate::{Session, SessionOptions};
use anyhow::Context;
use sift_engine::generate::generate;
use sift_engine::GenerateOptions;
use sift_sim::trace::{TraceHeader, TraceWriter};
use std::path::{Path, PathBuf};

/// The prompts of a prompt set: one per line, blank lines skipped.
pub fn prompt_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("cannot read prompt file '{}'", path.display()))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// One `sift trace` run.
#[derive(Clone, Debug)]
pub struct TraceRecording {
    /// The session's options (from [`SessionOptions::from_flags`]) and the model as the user
    /// named it (the trace records its file name).
    pub session: SessionOptions,
    pub model: PathBuf,
    /// The prompts, each a new sequence, and how to generate from them.
    pub prompts: Vec<String>,
    pub generate: GenerateOptions,
    /// The trace file, and whether it may replace an existing one.
    pub output: PathBuf,
    pub force: bool,
}

impl TraceRecording {
    /// Generates from every prompt and writes the trace.
    pub fn run(&self) -> anyhow::Result<()> {
        let (a, so) = (self, &self.session);
        // The model may now be the column file built from the GGUF (--memory): an input too.
        crate::outputs::check(&a.output, a.force, &[&so.model])?;
        let eo = so.engine_options();
        let (model, tok) = crate::load(&so.model, &eo, &so.memory)?;
        // What a budgeted run counts as runtime, measured as every budgeted run measures it.
        let unbudgeted_runtime = crate::runtime_bytes(&[&so.model, model.file.path()], 0);
        let mut session = Session::build(model, tok.into(), so)?;
        if let Some(line) = &session.planned {
            eprintln!("{line}");
        }
        let tok = session.tok.clone();
        let engine = &mut session.engine;
        let c = engine.config().clone();
        let runtime = match engine.memory() {
            Some(s) => s.plan().runtime,
            None => unbudgeted_runtime,
        };
        let name = a.model.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let header = TraceHeader {
            model: name,
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            dims: sift_model::layout::SiteDims::of(&c).units,
            selector: engine.selector().describe(),
            n_ctx: engine.n_ctx(),
            n_batch: eo.n_batch,
            runtime_bytes: runtime,
            measured_tok_s: 0.0,
        };
        let writer = TraceWriter::create(&a.output, &header)?;
        engine.set_tracer(Some(Box::new(writer.clone())));
        let (mut n_gen, mut secs) = (0usize, 0.0f64);
        let t0 = std::time::Instant::now();
        for p in &a.prompts {
            engine.truncate(0);
            let tokens = tok.encode(p, true, false)?;
            anyhow::ensure!(!tokens.is_empty(), "a prompt is empty after tokenization");
            let g = generate(engine, &tok, &tokens, &a.generate, |_| true)?;
            n_gen += g.n_gen;
            secs += g.gen_secs;
        }
        engine.set_tracer(None);
        let n = writer.finish()?;
        let bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "sift: traced {n} decoded tokens of {} prompt(s) with {} into {} ({:.1} MiB); decode {:.2} tok/s",
            a.prompts.len(),
            header.selector,
            a.output.display(),
            bytes as f64 / (1 << 20) as f64,
            n_gen as f64 / secs.max(1e-9)
        );
        let report = crate::report::memory_report(&session.engine, t0.elapsed().as_secs_f64());
        for line in report.into_iter().chain(crate::report::hybrid_lines(&session.engine)) {
            eprintln!("{line}");
        }
        Ok(())
    }
}
