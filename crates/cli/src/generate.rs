//! `sift generate`: stream a completion of a prompt to stdout, print speed to stderr.

use crate::args::GenerateArgs;
use anyhow::Context;
use sift_engine::generate::generate;
use sift_model::chat::{ChatMessage, ChatTemplate};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use std::io::Write;
use std::path::Path;

/// Loads a model and its tokenizer, with errors that say what to do.
pub fn load(path: &Path) -> anyhow::Result<(Model, Tokenizer)> {
    if !path.exists() {
        anyhow::bail!(
            "model file '{}' not found; fetch the default model with scripts/fetch-model.sh or pass -m PATH",
            path.display()
        );
    }
    let model = sift_store::open_model(path).with_context(|| format!("cannot load model '{}'", path.display()))?;
    let tok = Tokenizer::from_gguf(&model.file.gguf)
        .with_context(|| format!("cannot build the tokenizer of '{}'", path.display()))?;
    Ok((model, tok))
}

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let prompt = match (&a.prompt, &a.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("cannot read prompt file '{}'", f.display()))?
        }
        (None, None) => anyhow::bail!("no prompt: pass -p TEXT or -f FILE"),
    };
    let opts = a.sampling.generate_options()?;
    let mut eo = a.model.engine_options();
    eo.sparse_head = a.sparsity.sparse_head;
    eo.column_kernels = !a.sparsity.dense_kernels;
    eo.all_columns = a.sparsity.all_columns;
    a.memory.adjust(&mut eo);
    let (model, tok) = a.memory.load(&a.model.model, &eo)?;
    let text = if a.chat {
        let tmpl = ChatTemplate::from_gguf(&model.file.gguf, &tok)?.context("the model has no chat template")?;
        tmpl.apply(&[ChatMessage { role: "user".into(), content: prompt.clone() }], true)?
    } else {
        prompt.clone()
    };
    let tokens = tok.encode(&text, true, a.chat)?;
    anyhow::ensure!(!tokens.is_empty(), "the prompt is empty after tokenization");
    let mut engine = a.memory.engine(model, &a.model.model, &eo, &a.sparsity)?;
    let live = a.memory.live(&engine)?;
    let t0 = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    if !a.no_display_prompt {
        write!(out, "{text}")?;
        out.flush()?;
    }
    let g = generate(&mut engine, &tok, &tokens, &opts, |piece| {
        if let Some(l) = &live {
            l.poll();
        }
        let ok = write!(out, "{piece}").is_ok();
        let _ = out.flush();
        ok
    })?;
    writeln!(out)?;
    print_speed(&g);
    crate::memory::print_budget_log(&mut engine);
    crate::memory::print_stats(&engine, t0.elapsed().as_secs_f64());
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
    if let Some(b) = crate::peak_rss_bytes() {
        eprintln!("sift: peak memory (VmHWM) = {:.1} MiB; stopped by {:?}", b as f64 / (1 << 20) as f64, g.stop);
    }
}
