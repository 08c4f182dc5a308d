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
    #[error("the text gave {windows} windows where it had {expected} when counted (was the file changed while it was read?)")]
    TextEnded { windows: usize, expected: usize },
    #[error(transparent)]
    Text(#[from] sift_model::tokenizer::EncodeReaderError),
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
    on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity, PerplexityError> {
    let n_chunks = windows_to_score(tokens.len(), n_ctx, max_chunks)?;
    let windows = tokens.chunks_exact(n_ctx.max(1)).map(|w| Ok(w.to_vec()));
    perplexity_windows(engine, windows, n_chunks, n_ctx, scored, bos, on_chunk)
}

/// How many windows of `n_ctx` a text of `n_tokens` gives (at most `max_chunks`), or why it is
/// too short: llama-perplexity's method needs two.
pub fn windows_to_score(n_tokens: usize, n_ctx: usize, max_chunks: Option<usize>) -> Result<usize, PerplexityError> {
    if n_ctx < 2 || n_tokens < 2 * n_ctx {
        return Err(PerplexityError::TooShort { n_tokens, need: 2 * n_ctx.max(2) });
    }
    let n = n_tokens / n_ctx;
    Ok(max_chunks.map_or(n, |m| n.min(m.max(1))))
}

/// Windows of exactly `n_ctx` ids from pieces of ids (an [`sift_model::tokenizer::EncodeReader`]):
/// only one window and one piece are held at a time.
pub fn text_windows<E: Into<PerplexityError>>(
    pieces: impl Iterator<Item = Result<Vec<u32>, E>>,
    n_ctx: usize,
) -> impl Iterator<Item = Result<Vec<u32>, PerplexityError>> {
    let n_ctx = n_ctx.max(1);
    let mut pieces = pieces.fuse();
    let mut buf: Vec<u32> = Vec::new();
    std::iter::from_fn(move || loop {
        if buf.len() >= n_ctx {
            let rest = buf.split_off(n_ctx);
            return Some(Ok(std::mem::replace(&mut buf, rest)));
        }
        match pieces.next()? {
            Ok(ids) => buf.extend_from_slice(&ids),
            Err(e) => return Some(Err(e.into())),
        }
    })
}

/// Perplexity over the first `n_chunks` windows `windows` gives (each `n_ctx` ids; see
/// [`windows_to_score`] and [`text_windows`]).
pub fn perplexity_windows(
    engine: &mut Engine,
    windows: impl Iterator<Item = Result<Vec<u32>, PerplexityError>>,
    n_chunks: usize,
    n_ctx: usize,
    scored: Scored,
    bos: Option<u32>,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity, PerplexityError> {
    if n_ctx < 2 {
        return Err(PerplexityError::TooShort { n_tokens: 0, need: 4 });
    }
    if n_ctx > engine.n_ctx() {
        return Err(PerplexityError::CtxTooLarge { n_ctx, engine_ctx: engine.n_ctx() });
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
    let mut windows = windows.take(n_chunks);
    for i in 0..n_chunks {
        // The targets are the text's own ids: only position 0 becomes BOS, and no target is
        // read from there.
        let Some(text) = windows.next().transpose()? else {
            return Err(PerplexityError::TextEnded { windows: i, expected: n_chunks });
        };
        if text.len() != n_ctx {
            return Err(PerplexityError::TextEnded { windows: i, expected: n_chunks });
        }
        let mut window = text.clone();
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
                add(last, text[first]);
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
                    add(row, text[j + 1]);
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
