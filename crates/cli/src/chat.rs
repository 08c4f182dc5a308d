//! `sift chat`: an interactive conversation using the model's chat template. The KV cache keeps
//! the conversation; each turn evaluates only the new part of the templated text.

use crate::args::ChatArgs;
use anyhow::Context;
use sift_engine::generate::generate;
use sift_model::chat::{ChatMessage, ChatTemplate};
use std::io::{BufRead, Write};

pub fn run(a: ChatArgs) -> anyhow::Result<()> {
    let opts = a.sampling.generate_options()?;
    let mut eo = a.model.engine_options();
    a.memory.adjust(&mut eo);
    let (model, tok) = a.memory.load(&a.model.model, &eo)?;
    let tmpl = ChatTemplate::from_gguf(&model.file.gguf, &tok)?.context("the model has no chat template")?;
    eo.sparse_head = a.sparsity.sparse_head;
    eo.column_kernels = !a.sparsity.dense_kernels;
    eo.all_columns = a.sparsity.all_columns;
    a.memory.adjust(&mut eo);
    let mut engine = a.memory.engine(model, &a.model.model, &eo, &a.sparsity)?;
    let live = a.memory.live(&engine)?;
    let mut history: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        history.push(ChatMessage { role: "system".into(), content: s.clone() });
    }
    // Tokens currently in the KV cache, to evaluate only what is new each turn.
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("sift chat: type a message and press Enter; an empty line or Ctrl-D quits.");
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            break;
        }
        history.push(ChatMessage { role: "user".into(), content: line.to_string() });
        let text = tmpl.apply(&history, true)?;
        let all = tok.encode(&text, true, true)?;
        let common = cached.iter().zip(&all).take_while(|(a, b)| a == b).count().min(all.len() - 1);
        engine.truncate(common);
        cached.truncate(common);
        if let Some(l) = &live {
            l.poll();
        }
        let g = generate(&mut engine, &tok, &all[common..], &opts, |piece| {
            if let Some(l) = &live {
                l.poll();
            }
            let _ = write!(out, "{piece}");
            let _ = out.flush();
            true
        })?;
        writeln!(out)?;
        crate::memory::print_budget_log(&mut engine);
        cached.extend_from_slice(&all[common..]);
        cached.extend_from_slice(&g.tokens);
        // The last sampled token (EOS or past the limit) was not evaluated.
        cached.truncate(engine.n_past());
        history.push(ChatMessage { role: "assistant".into(), content: g.text.trim().to_string() });
    }
    Ok(())
}
