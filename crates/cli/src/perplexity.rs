//! `sift perplexity`: llama-perplexity's method and output shape.

use crate::args::PerplexityArgs;
use anyhow::Context;
use sift_engine::perplexity::{perplexity_windows, text_windows, windows_to_score, Scored};
use sift_engine::prefill::{sparse_blocks, PREFILL_BLOCK};
use sift_engine::EngineOptions;
use std::fs::File;
use std::io::Write;

pub fn run(a: PerplexityArgs) -> anyhow::Result<()> {
    // The text is read from the file a piece at a time, twice (counted, then scored): a text of
    // any size holds about one read's text and ids (`Tokenizer::encode_reader`), never all of it.
    let open = || File::open(&a.file).with_context(|| format!("cannot read '{}'", a.file.display()));
    // A FIFO or a device cannot be read twice (and opening a FIFO blocks until a writer comes).
    let meta = std::fs::metadata(&a.file).with_context(|| format!("cannot read '{}'", a.file.display()))?;
    anyhow::ensure!(
        meta.is_file(),
        "'{}' is not a regular file: perplexity reads its text twice (counted, then scored); save the text to a file first",
        a.file.display()
    );
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads);
    // Sparse prefill applies to the part of each window read as a prompt (its first half, or all
    // but --score-last): said when that part holds no sparse block.
    let sparse_prefill = a.sparsity.prefill_sparsity > 0.0;
    let prompt_part = a.score_last.map_or(a.ctx_size / 2, |n| a.ctx_size.saturating_sub(n));
    if sparse_prefill && sparse_blocks(prompt_part) == 0 {
        eprintln!(
            "sift: note: --prefill-sparsity changes nothing at -c {}: the {prompt_part} tokens of a window read as a prompt hold no sparse block (its first and last {PREFILL_BLOCK}-token blocks stay dense); use -c {} or more, or --score-last N",
            a.ctx_size,
            2 * (2 * PREFILL_BLOCK + 1)
        );
    }
    let eo = a.threading.apply(a.kv.apply(EngineOptions {
        n_threads: threads,
        n_ctx: a.ctx_size,
        // A sparse prefill block is one batch, whatever the window.
        n_batch: a.batch_size.min(a.ctx_size.max(if sparse_prefill { PREFILL_BLOCK } else { 1 })).max(1),
        ..EngineOptions::default()
    }));
    let opts = sift_session::SessionOptions::from_flags(&a.model, eo, &a.sparsity, &a.memory)?;
    let (model, tok) = sift_session::load(&opts.model, &opts.engine_options(), &opts.memory)?;
    let t0 = std::time::Instant::now();
    // With --chunks, the count stops once the windows scored are there (at least two, which
    // llama.cpp's method asks of any text): the rest of a long file is never tokenized.
    let chunks = usize::try_from(a.chunks).ok();
    let want = chunks.map_or(usize::MAX, |n| n.max(2).saturating_mul(a.ctx_size));
    let mut n_tokens = 0usize;
    for ids in tok.encode_reader(open()?, true, false) {
        n_tokens += ids.with_context(|| format!("cannot tokenize '{}'", a.file.display()))?.len();
        if n_tokens >= want {
            break;
        }
    }
    let counted = if n_tokens >= want { "the first " } else { "" };
    eprintln!("tokenized {counted}{n_tokens} tokens in {:.2} s", t0.elapsed().as_secs_f64());
    let total = windows_to_score(n_tokens, a.ctx_size, chunks)?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let mut session = crate::session::build(model, tok, &opts)?;
    let tok = session.tok.clone();
    let engine = &mut session.engine;
    eprintln!("sparsity: {}", engine.selector().describe());
    eprintln!("calculating perplexity over {total} chunks, n_ctx={}", a.ctx_size);
    let t1 = std::time::Instant::now();
    let scored = a.score_last.map_or(Scored::SecondHalf, Scored::Last);
    let windows = text_windows(tok.encode_reader(open()?, true, false), a.ctx_size);
    let r = perplexity_windows(engine, windows, total, a.ctx_size, scored, bos, |i, ppl| {
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
