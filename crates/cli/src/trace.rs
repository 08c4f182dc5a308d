//! `sift trace`: run prompts and record, per decoded token, layer and site, what the selector saw
//! and chose (see `sift_sim::trace`), for `sift simulate` and `sift plan --trace`; the run is
//! `sift_session::trace_recording`.

use crate::args::{ModelArgs, SamplingArgs};
use clap::Args;
use sift_session::trace_recording::TraceRecording;
use sift_session::SessionOptions;
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
        (None, Some(f)) => sift_session::trace_recording::prompt_lines(f)?,
        (None, None) => anyhow::bail!("no prompt: pass -p TEXT or -f FILE (one prompt per line)"),
    };
    anyhow::ensure!(!prompts.is_empty(), "the prompt file has no prompts");
    if a.sampling.n_predict < 0 {
        a.sampling.n_predict = 32;
    }
    let generate = a.sampling.generate_options()?;
    let session = SessionOptions::from_flags(&a.model.model, a.model.engine_options(), &a.sparsity, &a.memory)?;
    TraceRecording { session, model: a.model.model, prompts, generate, output: a.output, force: a.force }.run()
}
