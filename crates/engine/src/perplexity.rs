//! Perplexity with llama.cpp's method (`llama-perplexity`): the text is cut into non-overlapping
//! windows of `n_ctx` tokens, the first token of each window is replaced by BOS when the model adds
//! one, and only the second half of each window is scored.
//!
//! The first half runs as the prompt ([`Phase::Prompt`]) and the scored half as generation
//! ([`Phase::Generate`]): the same numbers for per-token selectors, and the natural split for
//! selectors that fix their units at prefill (core neurons) and for sparse prefill, which applies
//! to the prompt only.
//!
//! [`Scored::Last`] instead scores exactly the last `N` tokens of each window after a prompt of
//! the `n_ctx − N` before them, the first of them from the prompt's last logits: FastForward's
//! protocol (256 tokens scored densely after a 2048-token context prefilled sparsely is
//! `-c 2304 --score-last 256`).

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
    #[error("--score-last {scored} must leave at least one prompt token in a window of -c {n_ctx}: use 1 to {}", n_ctx - 1)]
    ScoredTooMany { scored: usize, n_ctx: usize },
    #[error(transparent)]
    Eval(#[from] EvalError),
}

/// Which tokens of a window are scored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scored {
    /// llama-perplexity's: the second half of the window but its first token (`n_ctx/2 − 1`).
    #[default]
    SecondHalf,
    /// The last `N` tokens, after a prompt of the window's first `n_ctx − N` (`1 ≤ N < n_ctx`).
    Last(usize),
}

/// Computes perplexity over `tokens`; `on_chunk(i, running_ppl)` is called after each window.
pub fn perplexity(
    engine: &mut Engine,
    tokens: &[u32],
    n_ctx: usize,
    scored: Scored,
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
    if let Scored::Last(n) = scored {
        if n == 0 || n >= n_ctx {
            return Err(PerplexityError::ScoredTooMany { scored: n, n_ctx });
        }
    }
    let n_vocab = engine.config().n_vocab;
    let first = match scored {
        Scored::SecondHalf => n_ctx / 2,
        Scored::Last(n) => n_ctx - n,
    };
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut window = vec![0u32; n_ctx];
    for i in 0..n_chunks {
        window.copy_from_slice(&tokens[i * n_ctx..(i + 1) * n_ctx]);
        if let Some(b) = bos {
            window[0] = b;
        }
        engine.truncate(0);
        let last = engine.eval_phase(&window[..first], Logits::Last, Phase::Prompt)?;
        let mut add = |row: &[f32], target: u32| {
            let v = -log_softmax_at(row, target as usize);
            nll += v;
            nll2 += v * v;
            count += 1;
        };
        let rest = match scored {
            Scored::SecondHalf => &window[first..],
            Scored::Last(_) => {
                add(last, tokens[i * n_ctx + first]);
                &window[first..n_ctx - 1]
            }
        };
        // One batch at a time: the logits of a whole scored half (256 tokens × a 49k-152k
        // vocabulary: 50-155 MB) are never held at once, only one batch's.
        let step = engine.n_batch().max(1);
        for (b, part) in rest.chunks(step).enumerate() {
            let logits = engine.eval_phase(part, Logits::All, Phase::Generate)?;
            for (r, row) in logits.chunks_exact(n_vocab).enumerate() {
                let j = first + b * step + r;
                if j + 1 < n_ctx {
                    add(row, tokens[i * n_ctx + j + 1]);
                }
            }
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
