//! `sift generate`: stream a completion of a prompt to stdout, print speed to stderr.

use crate::args::GenerateArgs;
use anyhow::Context;
use sift_engine::generate::generate;
use sift_model::chat::{ChatMessage, ChatTemplate};
use sift_session::Session;
use std::io::Write;

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.prompt.is_some() || a.file.is_some(), "no prompt: pass -p TEXT or -f FILE");
    let opts = a.sampling.generate_options()?;
    let mut session = crate::session::open(&a.model.model, a.model.engine_options(), &a.sparsity, &a.memory)?;
    let tok = session.tok.clone();
    let n_ctx = session.engine.n_ctx();
    let prompt = match (&a.prompt, &a.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => sift_session::prompt::read_prompt_file(f, &tok, n_ctx)?,
        (None, None) => unreachable!("checked above"),
    };
    let text = if a.chat {
        let tmpl = ChatTemplate::from_gguf(&session.engine.model.file.gguf, &tok)?
            .context("the model has no chat template")?;
        tmpl.apply(&[ChatMessage { role: "user".into(), content: prompt }], true)?
    } else {
        prompt
    };
    let tokens = sift_session::prompt::encode_prompt(&tok, &text, true, a.chat, n_ctx)?;
    anyhow::ensure!(!tokens.is_empty(), "the prompt is empty after tokenization");
    let t0 = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    if !a.no_display_prompt {
        write!(out, "{text}")?;
        out.flush()?;
    }
    let Session { engine, live, .. } = &mut session;
    // The bound's optimal cache starts, as this run's, empty.
    let log = if a.verbose { sift_session::report::record_decode(engine)? } else { None };
    let start = sift_sim::bound::CacheContent::empty(engine.config().n_layer);
    let g = generate(engine, &tok, &tokens, &opts, |piece| {
        if let Some(l) = live {
            l.poll();
        }
        let ok = write!(out, "{piece}").is_ok();
        let _ = out.flush();
        ok
    })?;
    writeln!(out)?;
    print_speed(&g);
    if let (Some(log), Some(m)) = (&log, session.profile.clone()) {
        let tm = sift_session::report::decode_telemetry(&mut session.engine, log, &start, g.gen_secs, &m.profile)?;
        eprintln!("sift: decode {}", tm.line());
        sift_session::machine::record_run_if_cached(&m, &tm);
    }
    crate::session::print_budget_log(&mut session);
    crate::session::print_stats(&session, t0.elapsed().as_secs_f64());
    Ok(())
}

/// The speed summary llama.cpp prints after generating, on stderr.
pub fn print_speed(g: &sift_engine::Generation) {
    let line = |what: &str, n: usize, secs: f64| {
        let ms = secs * 1e3;
        eprintln!(
            "sift: {what:>17} = {ms:10.2} ms / {n:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
            ms / n.max(1) as f64,
            n as f64 / secs.max(1e-9)
        );
    };
    eprintln!();
    line("prompt eval time", g.n_prompt, g.prompt_secs);
    line("eval time", g.n_gen, g.gen_secs);
    if let Some(b) = sift_session::peak_rss_bytes() {
        eprintln!("sift: peak memory (VmHWM) = {:.1} MiB; stopped by {:?}", b as f64 / (1 << 20) as f64, g.stop);
    }
}
