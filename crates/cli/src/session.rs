//! The CLI's side of a session (`sift_session`): open one from a command's flags, say what the
//! planner chose, and print what the store did.

use sift_engine::EngineOptions;
use sift_session::{MemoryOptions, Session, SessionOptions, SparsityOptions};
use std::path::Path;

/// Opens `model` with these flags; prints the planner's choice when it made one.
pub fn open(
    model: &Path,
    engine: EngineOptions,
    sparsity: &SparsityOptions,
    memory: &MemoryOptions,
) -> anyhow::Result<Session> {
    let session = Session::open(&SessionOptions::from_flags(model, engine, sparsity, memory)?)?;
    if let Some(line) = &session.planned {
        eprintln!("{line}");
    }
    Ok(session)
}

/// [`open`] on a model and tokenizer already loaded (by [`sift_session::load`]).
pub fn build(
    model: sift_model::Model,
    tok: sift_model::tokenizer::Tokenizer,
    opts: &SessionOptions,
) -> anyhow::Result<Session> {
    let session = Session::build(model, tok.into(), opts)?;
    if let Some(line) = &session.planned {
        eprintln!("{line}");
    }
    Ok(session)
}

/// Prints the live budget changes the engine applied since the last call, on stderr.
pub fn print_budget_log(session: &mut Session) {
    for c in session.engine.take_budget_log() {
        eprintln!("{}", sift_session::report::describe_budget_change(&c));
    }
}

/// Prints the store's plan and counters on stderr (nothing without `--memory`), then the hybrid
/// decode's figures.
pub fn print_stats(session: &Session, wall_secs: f64) {
    let report = sift_session::report::memory_report(&session.engine, wall_secs);
    for line in report.into_iter().chain(sift_session::report::hybrid_lines(&session.engine)) {
        eprintln!("{line}");
    }
}
