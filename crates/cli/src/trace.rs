//! `sift trace`: run prompts and record, per decoded token, layer and site, what the selector saw
//! and chose (see `sift_sim::trace`), for `sift simulate` and `sift plan --trace`.

use crate::args::{ModelArgs, SamplingArgs};
use anyhow::Context;
use clap::Args;
use sift_engine::generate::generate;
use sift_sim::trace::{TraceHeader, TraceWriter};
use std::path::PathBuf;

#[derive(Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    #[command(flatten)]
    pub memory: sift_session::MemoryOptions,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A prompt
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// A prompt set: one prompt per line (blank lines skipped); each starts a new sequence
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Output trace file
    #[arg(short = 'o', long = "output", default_value = "sift.trace")]
    pub output: PathBuf,
    /// Replace the output file if it exists (without it, an existing file is an error)
    #[arg(long = "force")]
    pub force: bool,
}

pub fn run(mut a: TraceArgs) -> anyhow::Result<()> {
    let prompt_file = a.file.clone().unwrap_or_default();
    sift_session::outputs::check(&a.output, a.force, &[&a.model.model, &prompt_file])?;
    let prompts: Vec<String> = match (&a.prompt, &a.file) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read prompt file '{}'", f.display()))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        (None, None) => anyhow::bail!("no prompt: pass -p TEXT or -f FILE (one prompt per line)"),
    };
    anyhow::ensure!(!prompts.is_empty(), "the prompt file has no prompts");
    if a.sampling.n_predict < 0 {
        a.sampling.n_predict = 32;
    }
    let opts = a.sampling.generate_options()?;
    let so =
        sift_session::SessionOptions::from_flags(&a.model.model, a.model.engine_options(), &a.sparsity, &a.memory)?;
    // The model may now be the column file built from the GGUF (--memory): an input too.
    sift_session::outputs::check(&a.output, a.force, &[&so.model])?;
    let eo = so.engine_options();
    let (model, tok) = sift_session::load(&so.model, &eo, &so.memory)?;
    // What a budgeted run counts as runtime, measured as every budgeted run measures it.
    let unbudgeted_runtime = sift_session::runtime_bytes(&[&so.model, model.file.path()], 0);
    let mut session = crate::session::build(model, tok, &so)?;
    let tok = session.tok.clone();
    let engine = &mut session.engine;
    let c = engine.config().clone();
    let runtime = match engine.memory() {
        Some(s) => s.plan().runtime,
        None => unbudgeted_runtime,
    };
    let name = a.model.model.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
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
    for p in &prompts {
        engine.truncate(0);
        let tokens = tok.encode(p, true, false)?;
        anyhow::ensure!(!tokens.is_empty(), "a prompt is empty after tokenization");
        let g = generate(engine, &tok, &tokens, &opts, |_| true)?;
        n_gen += g.n_gen;
        secs += g.gen_secs;
    }
    engine.set_tracer(None);
    let n = writer.finish()?;
    let bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "sift: traced {n} decoded tokens of {} prompt(s) with {} into {} ({:.1} MiB); decode {:.2} tok/s",
        prompts.len(),
        header.selector,
        a.output.display(),
        bytes as f64 / (1 << 20) as f64,
        n_gen as f64 / secs.max(1e-9)
    );
    crate::session::print_stats(&session, t0.elapsed().as_secs_f64());
    Ok(())
}
