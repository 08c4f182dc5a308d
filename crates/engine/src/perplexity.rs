//! Perplexity with llama.cpp's method (`llama-perplexity`): the text is cut into non-overlapping
//! windows of `n_ctx` tokens, the first token of each window is replaced by BOS when the model adds
//! one, and only the second half of each window is scored.
//!
//! The first half runs as the prompt ([`Phase::Prompt`]) and the scored half as generation
//! ([`Phase::Generate`]): the same numbers for per-token selectors, and the natural split for
//! selectors that fix their units at prefill (core neurons).

use crate::{Engine, EvalError, Logits};
use sift_sparsity::Phase;

/// The result of a perplexity run.
#[derive(Clone, Debug)]
pub struct Perplexity {
    pub ppl: f64,
    /// llama.cpp's "+/-" figure: standard error of the mean NLL, times PPL.
    pub ppl_err: f64,
    pub n_chunks: usize,
    pub n_scored: usize,
}

/// Errors of a perplexity run.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error("the text has {n_tokens} tokens, but perplexity needs at least 2 * n_ctx = {need}; use a longer file or a smaller -c")]
    TooShort { n_tokens: usize, need: usize },
    #[error("-c {n_ctx} is larger than the engine's context {engine_ctx}")]
    CtxTooLarge { n_ctx: usize, engine_ctx: usize },
    #[error(transparent)]
    Eval(#[from] EvalError),
}

/// Computes perplexity over `tokens`; `on_chunk(i, running_ppl)` is called after each window.
pub fn perplexity(
    engine: &mut Engine,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity, PerplexityError> {
    if n_ctx < 2 || tokens.len() < 2 * n_ctx {
        return Err(PerplexityError::TooShort { n_tokens: tokens.len(), need: 2 * n_ctx.max(2) });
    }
    if n_ctx > engine.n_ctx() {
        return Err(PerplexityError::CtxTooLarge { n_ctx, engine_ctx: engine.n_ctx() });
    }
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(m) = max_chunks {
        n_chunks = n_chunks.min(m.max(1));
    }
    let n_vocab = engine.config().n_vocab;
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut window = vec![0u32; n_ctx];
    for i in 0..n_chunks {
        window.copy_from_slice(&tokens[i * n_ctx..(i + 1) * n_ctx]);
        if let Some(b) = bos {
            window[0] = b;
        }
        engine.truncate(0);
        engine.eval_phase(&window[..first], Logits::Last, Phase::Prompt)?;
        let logits = engine.eval_phase(&window[first..], Logits::All, Phase::Generate)?;
        for j in first..n_ctx - 1 {
            let row = &logits[(j - first) * n_vocab..(j - first + 1) * n_vocab];
            let target = tokens[i * n_ctx + j + 1] as usize;
            let v = -log_softmax_at(row, target);
            nll += v;
            nll2 += v * v;
            count += 1;
        }
        on_chunk(i, (nll / count as f64).exp());
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
    Ok(Perplexity { ppl, ppl_err: err, n_chunks, n_scored: count })
}

/// log softmax(row)[i], accumulated in f64.
pub fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[i] as f64 - max - sum.ln()
}
