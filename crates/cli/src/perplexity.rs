//! `sift perplexity`: llama-perplexity's method and output shape.

use crate::args::PerplexityArgs;
use anyhow::Context;
use sift_engine::perplexity::{perplexity, Scored};
use sift_engine::EngineOptions;
use std::io::Write;

pub fn run(a: PerplexityArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("cannot read '{}'", a.file.display()))?;
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads);
    let eo = a.threading.apply(a.kv.apply(EngineOptions {
        n_threads: threads,
        n_ctx: a.ctx_size,
        n_batch: a.batch_size.min(a.ctx_size).max(1),
        ..EngineOptions::default()
    }));
    let opts = crate::session::options(&a.model, eo, &a.sparsity, &a.memory)?;
    let (model, tok) = sift_session::load(&opts.model, &opts.engine_options(), &opts.memory)?;
    let t0 = std::time::Instant::now();
    // With --chunks, only the windows scored are tokenized (the same ids as the start of the
    // whole text's; at least two windows, which llama.cpp's method asks of any text): a long
    // file's ids are never all held.
    let chunks = usize::try_from(a.chunks).ok();
    let tokens = match chunks {
        Some(n) => tok.encode_prefix(&text, true, false, n.max(2).saturating_mul(a.ctx_size)),
        None => tok.encode(&text, true, false)?,
    };
    eprintln!("tokenized {} bytes into {} tokens in {:.2} s", text.len(), tokens.len(), t0.elapsed().as_secs_f64());
    // The text is not needed again: its memory goes back before the run is planned.
    let large = text.len() > 1 << 20;
    drop(text);
    if large {
        sift_session::budget::trim_heap();
    }
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let mut session = crate::session::build(model, tok, &opts)?;
    let engine = &mut session.engine;
    eprintln!("sparsity: {}", engine.selector().describe());
    let total = (tokens.len() / a.ctx_size.max(1)).min(chunks.unwrap_or(usize::MAX));
    eprintln!("calculating perplexity over {total} chunks, n_ctx={}", a.ctx_size);
    let t1 = std::time::Instant::now();
    let scored = a.score_last.map_or(Scored::SecondHalf, Scored::Last);
    let r = perplexity(engine, &tokens, a.ctx_size, scored, chunks, bos, |i, ppl| {
        print!("[{}]{ppl:.4},", i + 1);
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!(
        "{} tokens scored in {:.2} s ({:.2} s per chunk)",
        r.n_scored,
        t1.elapsed().as_secs_f64(),
        t1.elapsed().as_secs_f64() / r.n_chunks as f64
    );
    let st = engine.sparsity_stats();
    let frac: Vec<String> = sift_engine::sparsity::Site::ALL
        .iter()
        .map(|&s| format!("{} {:.3}", s.name(), st.active_fraction(s)))
        .collect();
    eprintln!(
        "active units: {}; active weight bytes per token: {:.2} MiB",
        frac.join(", "),
        engine.active_bytes_per_token() / (1 << 20) as f64
    );
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_err);
    Ok(())
}
