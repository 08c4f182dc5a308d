//! `sift chat`: an interactive conversation using the model's chat template. The KV cache keeps
//! the conversation; each turn evaluates only the new part of the templated text.

use crate::args::ChatArgs;
use anyhow::Context;
use sift_engine::generate::generate;
use sift_model::chat::{ChatMessage, ChatTemplate};
use sift_session::Session;
use std::io::{BufRead, Write};

pub fn run(a: ChatArgs) -> anyhow::Result<()> {
    let opts = a.sampling.generate_options()?;
    let mut session = crate::session::open(&a.model.model, a.model.engine_options(), &a.sparsity, &a.memory)?;
    let tok = session.tok.clone();
    let tmpl =
        ChatTemplate::from_gguf(&session.engine.model.file.gguf, &tok)?.context("the model has no chat template")?;
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
        let Session { engine, live, .. } = &mut session;
        engine.truncate(common);
        cached.truncate(common);
        if let Some(l) = live {
            l.poll();
        }
        let g = generate(engine, &tok, &all[common..], &opts, |piece| {
            if let Some(l) = live {
                l.poll();
            }
            let _ = write!(out, "{piece}");
            let _ = out.flush();
            true
        })?;
        writeln!(out)?;
        cached.extend_from_slice(&all[common..]);
        cached.extend_from_slice(&g.tokens);
        // The last sampled token (EOS or past the limit) was not evaluated.
        cached.truncate(engine.n_past());
        crate::session::print_budget_log(&mut session);
        history.push(ChatMessage { role: "assistant".into(), content: g.text.trim().to_string() });
    }
    Ok(())
}
