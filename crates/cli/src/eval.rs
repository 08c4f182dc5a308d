//! `sift eval`: multiple-choice accuracy by log-likelihood (acc, acc_norm), lm-eval's method; see
//! the `sift_eval` crate docs for the prompts and for how llama.cpp's HellaSwag score differs.

use crate::args::EvalArgs;
use anyhow::Context;
use sift_eval::{evaluate, EngineScorer, EvalOptions, Format, TaskKind};

/// Items between two progress lines.
const PROGRESS_EVERY: usize = 50;

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    let format = a.format.as_deref().map(str::parse::<Format>).transpose().map_err(anyhow::Error::msg)?;
    let task = match a.task.as_deref() {
        Some(t) => Some(TaskKind::parse(t, Some(&a.file)).with_context(|| {
            format!("unknown --task '{t}': expected hellaswag, arc, openbookqa, winogrande, mmlu[-SUBJECT] or generic")
        })?),
        None => None,
    };
    let ds = sift_eval::load(&a.file, format, task)?;
    let total = ds.items.len();
    anyhow::ensure!(a.offset < total, "--offset {} skips all {total} items of '{}'", a.offset, a.file.display());
    let end = a.limit.map_or(total, |l| a.offset.saturating_add(l).min(total));
    let items = &ds.items[a.offset..end];
    anyhow::ensure!(!items.is_empty(), "--limit 0 leaves nothing to score");
    let shots = sift_eval::load_shots(&ds, a.shots, a.shots_file.as_deref())?;

    let memory = sift_session::MemoryOptions::default();
    let mut session = crate::session::open(&a.model.model, a.model.engine_options(), &a.sparsity, &memory)?;
    let (engine, tok) = (&mut session.engine, session.tok.clone());
    eprintln!("sparsity: {}", engine.selector().describe());
    eprintln!(
        "eval: task {}{}, {:?} format, items {}..{} of {total} from '{}', n_ctx {}, {} threads",
        ds.name,
        if a.shots > 0 { format!(", {}-shot", a.shots) } else { String::new() },
        ds.format,
        a.offset,
        end,
        a.file.display(),
        engine.n_ctx(),
        engine.n_threads()
    );
    let t0 = std::time::Instant::now();
    let stateful = a.sparsity.method() != sift_engine::sparsity::Method::Dense;
    let mut scorer = EngineScorer::new(engine);
    // Selectors with sequence state (core neurons, DIP-CA's cache) must see each item from an
    // empty context, so every context restarts instead of reusing a shared prefix.
    scorer.reuse_prefix = !stateful;
    let opts = EvalOptions { max_tokens: scorer.max_tokens(), shots };
    let rep = evaluate(&ds.task, items, &tok, &mut scorer, &opts, |p| {
        if p.done.is_multiple_of(PROGRESS_EVERY) || p.done == p.total {
            let s = t0.elapsed().as_secs_f64();
            eprintln!(
                "[{}/{}] acc = {:.4}, acc_norm = {:.4} ({:.1} s, {:.2} items/s)",
                p.done,
                p.total,
                p.acc,
                p.acc_norm,
                s,
                p.done as f64 / s.max(1e-9)
            );
        }
    })
    .with_context(|| format!("cannot score '{}'", a.file.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let st = scorer.stats;
    eprintln!(
        "eval: {} requests, {} context tokens run + {} reused, {} continuation tokens run, {} scored; {} contexts cut to fit, {} unclean token boundaries; {secs:.2} s",
        rep.n_requests,
        st.ctx_tokens,
        st.reused_tokens,
        st.cont_tokens,
        rep.n_cont_tokens,
        rep.n_truncated,
        rep.n_unclean
    );
    if a.output == "json" {
        let mut j = serde_json::json!({
            "task": ds.name,
            "file": a.file.display().to_string(),
            "model": a.model.model.display().to_string(),
            "n": rep.n,
            "offset": a.offset,
            "shots": a.shots,
            "acc": rep.acc.value,
            "acc_stderr": rep.acc.stderr,
            "acc_norm": rep.acc_norm.value,
            "acc_norm_stderr": rep.acc_norm.stderr,
            "n_truncated": rep.n_truncated,
            "seconds": secs,
        });
        if let Some(l) = rep.acc_llama_cpp {
            j["acc_llama_cpp"] = l.value.into();
            j["acc_llama_cpp_stderr"] = l.stderr.into();
        }
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!(
            "acc = {:.4} +/- {:.4}, acc_norm = {:.4} +/- {:.4} (N = {})",
            rep.acc.value, rep.acc.stderr, rep.acc_norm.value, rep.acc_norm.stderr, rep.n
        );
        if let Some(l) = rep.acc_llama_cpp {
            println!(
                "llama.cpp HellaSwag score (mean log-prob per ending token after the common prefix) = {:.4} +/- {:.4}",
                l.value, l.stderr
            );
        }
    }
    Ok(())
}
