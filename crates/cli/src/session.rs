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
    let session = Session::open(&options(model, engine, sparsity, memory)?)?;
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

/// The session options of a command's flags.
///
/// With `--memory`, or a sparsity method on the column kernels (`--sparsity` other than dense, or
/// `--sparsity-config`, without `--dense-kernels`), on a `.gguf`, the model becomes the pack
/// built from it (once; see [`sift_session::autopack`]): its columns are what makes a sparse
/// decode read less.
pub fn options(
    model: &Path,
    engine: EngineOptions,
    sparsity: &SparsityOptions,
    memory: &MemoryOptions,
) -> anyhow::Result<SessionOptions> {
    let sparse =
        sparsity.method.is_some_and(|m| m != sift_engine::sparsity::Method::Dense) || sparsity.config.is_some();
    let columns = memory.memory.is_some() || (sparse && !sparsity.dense_kernels);
    anyhow::ensure!(
        memory.pack_dir.is_none() || columns,
        "--pack-dir says where the column file of --memory (or of a sparse decode on a .gguf) goes, and neither is asked for: add --memory BYTES, or drop --pack-dir"
    );
    let model =
        if columns && model.exists() { column_file(model, memory.pack_dir.as_deref())? } else { model.to_path_buf() };
    Ok(SessionOptions { model, engine, sparsity: sparsity.clone(), memory: memory.clone() })
}

/// The pack a budgeted run of `model` streams from: `model` if it is one, else the column file
/// built from the GGUF (once, with its progress on stderr; see [`sift_session::autopack`]).
pub fn column_file(model: &Path, pack_dir: Option<&Path>) -> anyhow::Result<std::path::PathBuf> {
    let mut packing = false;
    let pack = sift_session::pack_for(
        model,
        pack_dir,
        |notice| eprintln!("sift: {notice}"),
        |step| {
            packing = true;
            eprint!("\rsift: packing {step}   ");
        },
    )?;
    if packing {
        eprintln!();
    }
    Ok(pack)
}

/// Prints the live budget changes the engine applied since the last call, on stderr.
pub fn print_budget_log(session: &mut Session) {
    for c in session.engine.take_budget_log() {
        eprintln!("{}", sift_session::report::describe_budget_change(&c));
    }
}

/// Prints the store's plan and counters on stderr (nothing without `--memory`).
pub fn print_stats(session: &Session, wall_secs: f64) {
    for line in sift_session::report::memory_report(&session.engine, wall_secs) {
        eprintln!("{line}");
    }
    print_hybrid(&session.engine);
}

/// The hybrid decode's figures (`--gpu-policy`): one line, then the same as JSON.
pub fn print_hybrid(engine: &sift_engine::Engine) {
    let Some(h) = engine.hybrid() else { return };
    let r = h.report();
    eprintln!(
        "sift: hybrid {}: {} tokens, p50 {:.2} ms, p99 {:.2} ms per token; CPU share of active FFN units {:.1}%; {:.1} group loads ({:.2} MiB) per token; {:.1}% of products waited for loads; per token {:.2} ms queueing, {:.2} ms the CPU's FFN share, {:.2} ms waiting for the GPU's, {:.2} ms attention on the GPU, {:.2} ms attention on the CPU, {:.2} ms the output head ({}), {:.2} ms issuing loads, {:.2} ms the rest",
        r.policy,
        r.tokens,
        r.p50_ms,
        r.p99_ms,
        r.cpu_share * 100.0,
        r.reloads_per_token,
        r.reload_bytes_per_token / (1 << 20) as f64,
        r.stalled_share * 100.0,
        r.queue_ms,
        r.cpu_ffn_ms,
        r.gpu_wait_ms,
        r.gpu_attention_ms,
        r.cpu_attention_ms,
        r.head_ms,
        if r.head_on_gpu { "GPU" } else { "CPU" },
        r.load_ms,
        r.other_ms
    );
    if let Ok(j) = serde_json::to_string(&r) {
        eprintln!("sift: hybrid-json {j}");
    }
}
