//! Prompts held to the context before they take memory: a prompt file too large for the context
//! is refused by its size before it is read, and a prompt is tokenized only up to the context
//! size (a 50 MB prompt under `--memory 130M` used to be read, echoed and tokenized in full —
//! 217 MB — before the engine said the context was full).

use anyhow::Context;
use sift_model::tokenizer::{Tokenizer, TokenizerError};
use std::path::Path;

/// Reads the prompt file `path` unless its size alone shows that it holds more than `n_ctx`
/// tokens (at most [`Tokenizer::max_piece_bytes`] bytes per token).
pub fn read_prompt_file(path: &Path, tok: &Tokenizer, n_ctx: usize) -> anyhow::Result<String> {
    let size = std::fs::metadata(path).with_context(|| format!("cannot read prompt file '{}'", path.display()))?.len();
    let at_least = size / tok.max_piece_bytes() as u64;
    anyhow::ensure!(
        at_least <= n_ctx as u64,
        "the prompt file '{}' ({size} bytes) holds at least {at_least} tokens, more than the context size {n_ctx}: \
         raise -c or shorten the prompt",
        path.display()
    );
    std::fs::read_to_string(path).with_context(|| format!("cannot read prompt file '{}'", path.display()))
}

/// The prompt's tokens, refused as soon as there are more than `n_ctx` (the tokenizer stops
/// there).
pub fn encode_prompt(
    tok: &Tokenizer,
    text: &str,
    add_special: bool,
    parse_special: bool,
    n_ctx: usize,
) -> anyhow::Result<Vec<u32>> {
    match tok.encode_at_most(text, add_special, parse_special, n_ctx) {
        Err(TokenizerError::TooManyTokens { limit }) => {
            anyhow::bail!("the prompt has more than {limit} tokens, the context size: raise -c or shorten the prompt")
        }
        r => Ok(r?),
    }
}
