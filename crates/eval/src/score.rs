//! Scoring: tokenization of (context, continuation) pairs as lm-eval does, the per-token
//! log-probability source ([`LogProbs`]: a closure, or [`EngineScorer`] over a real engine), and
//! the evaluation loop that turns log-likelihoods into acc / acc_norm.
//!
//! Tokenization follows lm-eval's `_encode_pair`: trailing whitespace of the context moves to the
//! front of the continuation, then `ctx = tok(context)`, `whole = tok(context + continuation)` and
//! the continuation's tokens are `whole[len(ctx)..]`. When `whole` does not start with `ctx` (a
//! BPE merge across the boundary) lm-eval still uses `ctx` + that slice; so do we, and count the
//! case ([`Report::n_unclean`]). BOS is prepended when the model's metadata asks for it (as
//! `sift perplexity` does; never EOS); a context that tokenizes to nothing is replaced by BOS (or
//! EOS when there is none), lm-eval's `prefix_token_id`.
//!
//! Contexts that do not fit are cut from the left (keeping BOS) so that context + continuation
//! hold at most `n_ctx + 1` tokens (the last continuation token is never fed to the model), as
//! lm-eval's `[-(max_length + 1):]`; they are counted in [`Report::n_truncated`]. A continuation
//! that alone does not fit is an error.
//!
//! [`EngineScorer`] evaluates a context once (last-token logits only) and, for each option,
//! truncates the KV cache back to the context and evaluates the continuation's tokens but the last
//! with all logits: the log-probability of continuation token `i` is read from the logits of the
//! token before it, the first from the context's last token. A one-token continuation (MMLU's
//! " A") costs no forward pass beyond the context. Consecutive contexts also share their common
//! token prefix in the KV cache (WinoGrande's two contexts, an item after a similar one) unless
//! [`EngineScorer::reuse_prefix`] is turned off, which restarts every new context from an empty
//! cache (for selectors that keep per-sequence state). The two engine calls live in
//! [`EngineScorer::forward`].

use crate::data::{Item, TaskKind};
use crate::prompt::{self, Request};
use sift_engine::perplexity::log_softmax_at;
use sift_engine::sparsity::Phase;
use sift_engine::{Engine, EvalError, Logits};
use sift_model::tokenizer::{Tokenizer, TokenizerError};

/// Errors while scoring.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error(transparent)]
    Engine(#[from] EvalError),
    #[error(transparent)]
    Tokenize(#[from] TokenizerError),
    #[error("item at line {line}: {msg}")]
    Item { line: usize, msg: String },
    #[error("{0}")]
    Other(String),
}

/// Something that gives per-token log-probabilities of `cont` after `ctx`: element `i` is
/// `log P(cont[i] | ctx, cont[..i])`. Both slices are non-empty. Implemented by [`EngineScorer`]
/// and by any `FnMut(&[u32], &[u32]) -> Result<Vec<f64>, ScoreError>`.
pub trait LogProbs {
    fn logprobs(&mut self, ctx: &[u32], cont: &[u32]) -> Result<Vec<f64>, ScoreError>;
}

impl<F: FnMut(&[u32], &[u32]) -> Result<Vec<f64>, ScoreError>> LogProbs for F {
    fn logprobs(&mut self, ctx: &[u32], cont: &[u32]) -> Result<Vec<f64>, ScoreError> {
        self(ctx, cont)
    }
}

/// Which part of a request a forward pass is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The context (prompt): only the last token's logits are needed.
    Context,
    /// A continuation (all but its last token): every token's logits.
    Continuation,
}

/// Counters of an [`EngineScorer`].
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineStats {
    /// Context tokens run through the model.
    pub ctx_tokens: usize,
    /// Continuation tokens run through the model.
    pub cont_tokens: usize,
    /// Context tokens taken from the KV cache instead.
    pub reused_tokens: usize,
}

/// [`LogProbs`] over a real [`Engine`], sharing each context's KV cache between its options.
pub struct EngineScorer<'e> {
    engine: &'e mut Engine,
    /// The tokens in the engine's KV cache, as far as this scorer knows.
    cached: Vec<u32>,
    /// `Some(n)`: `cached[..n]` is the context whose last-token logits are in `first`.
    ctx_len: Option<usize>,
    first: Vec<f32>,
    /// Keep the common token prefix of consecutive contexts in the cache (default on).
    pub reuse_prefix: bool,
    pub stats: EngineStats,
}

impl<'e> EngineScorer<'e> {
    /// Starts from an empty KV cache.
    pub fn new(engine: &'e mut Engine) -> EngineScorer<'e> {
        engine.truncate(0);
        EngineScorer {
            engine,
            cached: Vec::new(),
            ctx_len: None,
            first: Vec::new(),
            reuse_prefix: true,
            stats: EngineStats::default(),
        }
    }

    /// The most context + continuation tokens one request may have (`n_ctx + 1`).
    pub fn max_tokens(&self) -> usize {
        self.engine.n_ctx() + 1
    }

    /// The engine calls of the scorer, in one place: contexts want the last token's logits and
    /// run as the prompt, continuations want every token's and run as generation (so selectors
    /// that fix their units at prefill, like core neurons, see the context as the prompt).
    fn forward<'a>(engine: &'a mut Engine, tokens: &[u32], part: Part) -> Result<&'a [f32], EvalError> {
        match part {
            Part::Context => engine.eval_phase(tokens, Logits::Last, Phase::Prompt),
            Part::Continuation => engine.eval_phase(tokens, Logits::All, Phase::Generate),
        }
    }

    fn reset(&mut self) {
        self.engine.truncate(0);
        self.cached.clear();
        self.ctx_len = None;
    }

    fn score(&mut self, ctx: &[u32], cont: &[u32]) -> Result<Vec<f64>, ScoreError> {
        // Resynchronize with the engine in case someone else moved it.
        let np = self.engine.n_past();
        if np < self.cached.len() {
            self.cached.truncate(np);
        } else if np > self.cached.len() {
            self.engine.truncate(self.cached.len());
        }
        if self.ctx_len.is_some_and(|n| n > self.cached.len()) {
            self.ctx_len = None;
        }
        let same = self.ctx_len == Some(ctx.len()) && self.cached[..ctx.len()] == *ctx;
        if same {
            self.engine.truncate(ctx.len());
            self.cached.truncate(ctx.len());
            self.stats.reused_tokens += ctx.len();
        } else {
            let keep = if self.reuse_prefix {
                let lcp = self.cached.iter().zip(ctx).take_while(|(a, b)| a == b).count();
                lcp.min(ctx.len() - 1)
            } else {
                0
            };
            self.engine.truncate(keep);
            self.cached.truncate(keep);
            self.ctx_len = None;
            let logits = Self::forward(self.engine, &ctx[keep..], Part::Context)?;
            self.first.clear();
            self.first.extend_from_slice(logits);
            self.cached.extend_from_slice(&ctx[keep..]);
            self.ctx_len = Some(ctx.len());
            self.stats.ctx_tokens += ctx.len() - keep;
            self.stats.reused_tokens += keep;
        }
        let mut out = Vec::with_capacity(cont.len());
        out.push(log_softmax_at(&self.first, cont[0] as usize));
        if cont.len() > 1 {
            let n_vocab = self.first.len();
            let feed = &cont[..cont.len() - 1];
            let logits = Self::forward(self.engine, feed, Part::Continuation)?;
            for (i, &t) in cont[1..].iter().enumerate() {
                out.push(log_softmax_at(&logits[i * n_vocab..(i + 1) * n_vocab], t as usize));
            }
            self.cached.extend_from_slice(feed);
            self.stats.cont_tokens += feed.len();
        }
        Ok(out)
    }
}

impl LogProbs for EngineScorer<'_> {
    fn logprobs(&mut self, ctx: &[u32], cont: &[u32]) -> Result<Vec<f64>, ScoreError> {
        if ctx.is_empty() || cont.is_empty() {
            return Err(ScoreError::Other("empty context or continuation".into()));
        }
        if let Some(&t) = cont.iter().find(|&&t| t as usize >= self.engine.config().n_vocab) {
            return Err(EvalError::BadToken { id: t, n_vocab: self.engine.config().n_vocab }.into());
        }
        let r = self.score(ctx, cont);
        if r.is_err() {
            self.reset();
        }
        r
    }
}

/// A request's tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub ctx: Vec<u32>,
    pub cont: Vec<u32>,
    /// `tok(context + continuation)` starts with `tok(context)`.
    pub clean: bool,
}

/// Tokenizes a request the way lm-eval does (see the module docs).
pub fn encode_pair(tok: &Tokenizer, context: &str, continuation: &str) -> Result<Encoded, ScoreError> {
    let trimmed = context.trim_end();
    let (context, continuation) = if trimmed.len() < context.len() {
        (trimmed, format!("{}{continuation}", &context[trimmed.len()..]))
    } else {
        (context, continuation.to_string())
    };
    let ctx = encode(tok, context)?;
    let whole = encode(tok, &format!("{context}{continuation}"))?;
    let clean = whole.starts_with(&ctx);
    let cont = whole.get(ctx.len()..).unwrap_or_default().to_vec();
    let ctx = if ctx.is_empty() {
        let prefix = tok.bos().or(tok.eos()).ok_or_else(|| {
            ScoreError::Other("the context is empty and the model has neither BOS nor EOS to stand in".into())
        })?;
        vec![prefix]
    } else {
        ctx
    };
    Ok(Encoded { ctx, cont, clean })
}

/// Plain-text tokens, with BOS first when the model adds one.
fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, ScoreError> {
    let mut out = Vec::new();
    if tok.add_bos() {
        out.extend(tok.bos());
    }
    out.extend(tok.encode(text, false, false)?);
    Ok(out)
}

/// Cuts `ctx` from the left (keeping a leading `bos`) so that `ctx.len() + cont_len <= max`.
/// Returns `None` when nothing needs cutting.
pub fn fit_context(ctx: &[u32], cont_len: usize, max: usize, bos: Option<u32>) -> Option<Vec<u32>> {
    if ctx.len() + cont_len <= max {
        return None;
    }
    let keep_bos = bos.is_some() && ctx.first() == bos.as_ref() && ctx.len() > 1;
    let head = usize::from(keep_bos);
    let room = max.saturating_sub(cont_len + head).max(usize::from(!keep_bos));
    let body = &ctx[head..];
    let mut out = ctx[..head].to_vec();
    out.extend_from_slice(&body[body.len().saturating_sub(room)..]);
    Some(out)
}

/// Settings of [`evaluate`].
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// Most context + continuation tokens per request ([`EngineScorer::max_tokens`]).
    pub max_tokens: usize,
    /// Few-shot examples put before every item ([`prompt::requests_with_shots`]).
    pub shots: Vec<Item>,
}

/// One scored item.
#[derive(Clone, Debug)]
pub struct ItemResult {
    /// 1-based line of the item in its file.
    pub line: usize,
    pub gold: Vec<usize>,
    /// Summed log-likelihood of each option's continuation.
    pub lls: Vec<f64>,
    /// Continuation tokens of each option.
    pub n_tokens: Vec<usize>,
    /// argmax of `lls`.
    pub pred: usize,
    /// argmax of `lls[i] / norm_len[i]`.
    pub pred_norm: usize,
    /// llama.cpp's HellaSwag choice (HellaSwag only): argmax of the mean log-prob of the tokens
    /// after the options' common token prefix.
    pub pred_llama: Option<usize>,
}

impl ItemResult {
    pub fn correct(&self) -> bool {
        self.gold.contains(&self.pred)
    }
    pub fn correct_norm(&self) -> bool {
        self.gold.contains(&self.pred_norm)
    }
}

/// Running figures, passed to the progress callback after each item.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    pub acc: f64,
    pub acc_norm: f64,
}

/// An accuracy and its standard error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acc {
    pub value: f64,
    /// `sqrt(p (1 - p) / (n - 1))`, lm-eval's `mean_stderr` of 0/1 scores (0 when n < 2).
    pub stderr: f64,
}

impl Acc {
    pub fn new(correct: usize, n: usize) -> Acc {
        let p = if n == 0 { 0.0 } else { correct as f64 / n as f64 };
        let stderr = if n > 1 { (p * (1.0 - p) / (n - 1) as f64).sqrt() } else { 0.0 };
        Acc { value: p, stderr }
    }
}

/// The result of [`evaluate`].
#[derive(Clone, Debug)]
pub struct Report {
    pub task: String,
    pub n: usize,
    pub acc: Acc,
    pub acc_norm: Acc,
    /// HellaSwag only: the score `llama-perplexity --hellaswag` reports (see the crate docs).
    pub acc_llama_cpp: Option<Acc>,
    /// Requests whose context was cut from the left to fit.
    pub n_truncated: usize,
    /// Requests whose context tokens are not a prefix of tok(context + continuation).
    pub n_unclean: usize,
    /// Requests scored (items × options).
    pub n_requests: usize,
    /// Continuation tokens scored.
    pub n_cont_tokens: usize,
    pub items: Vec<ItemResult>,
}

/// The first index of the largest value (NaN counts as -inf), like numpy's argmax.
fn argmax(v: impl IntoIterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, x) in v.into_iter().enumerate() {
        let x = if x.is_nan() { f64::NEG_INFINITY } else { x };
        if i == 0 || x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

/// Scores `items` of `task`: one log-likelihood per option from `scorer`, then acc and
/// acc_norm (and llama.cpp's HellaSwag score). `on_item` is called after every item.
pub fn evaluate(
    task: &TaskKind,
    items: &[Item],
    tok: &Tokenizer,
    scorer: &mut dyn LogProbs,
    opts: &EvalOptions,
    mut on_item: impl FnMut(&Progress),
) -> Result<Report, ScoreError> {
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let mut rep = Report {
        task: task.name(),
        n: 0,
        acc: Acc::new(0, 0),
        acc_norm: Acc::new(0, 0),
        acc_llama_cpp: None,
        n_truncated: 0,
        n_unclean: 0,
        n_requests: 0,
        n_cont_tokens: 0,
        items: Vec::with_capacity(items.len()),
    };
    let (mut right, mut right_norm, mut right_llama) = (0usize, 0usize, 0usize);
    for item in items {
        let reqs = prompt::requests_with_shots(task, &opts.shots, item)
            .map_err(|msg| ScoreError::Item { line: item.line, msg })?;
        let mut encoded: Vec<Encoded> = Vec::with_capacity(reqs.len());
        let mut lps: Vec<Vec<f64>> = Vec::with_capacity(reqs.len());
        for Request { context, continuation, .. } in &reqs {
            let enc = encode_pair(tok, context, continuation)?;
            rep.n_requests += 1;
            rep.n_unclean += usize::from(!enc.clean);
            let lp = if enc.cont.is_empty() {
                Vec::new()
            } else {
                if enc.cont.len() >= opts.max_tokens {
                    return Err(ScoreError::Item {
                        line: item.line,
                        msg: format!(
                            "a continuation of {} tokens does not fit the context size; raise -c",
                            enc.cont.len()
                        ),
                    });
                }
                let cut = fit_context(&enc.ctx, enc.cont.len(), opts.max_tokens, bos);
                rep.n_truncated += usize::from(cut.is_some());
                let ctx = cut.as_deref().unwrap_or(&enc.ctx);
                let lp = scorer.logprobs(ctx, &enc.cont)?;
                if lp.len() != enc.cont.len() {
                    return Err(ScoreError::Other(format!(
                        "the scorer returned {} log-probs for {} continuation tokens",
                        lp.len(),
                        enc.cont.len()
                    )));
                }
                lp
            };
            rep.n_cont_tokens += lp.len();
            lps.push(lp);
            encoded.push(enc);
        }
        let lls: Vec<f64> = lps.iter().map(|lp| lp.iter().sum()).collect();
        let pred = argmax(lls.iter().copied());
        let pred_norm = argmax(lls.iter().zip(&reqs).map(|(ll, r)| ll / r.norm_len.max(1) as f64));
        let pred_llama = (*task == TaskKind::HellaSwag).then(|| llama_cpp_choice(&encoded, &lps));
        let r = ItemResult {
            line: item.line,
            gold: item.gold.clone(),
            n_tokens: lps.iter().map(Vec::len).collect(),
            lls,
            pred,
            pred_norm,
            pred_llama,
        };
        right += usize::from(r.correct());
        right_norm += usize::from(r.correct_norm());
        right_llama += usize::from(r.pred_llama.is_some_and(|p| r.gold.contains(&p)));
        rep.items.push(r);
        let done = rep.items.len();
        on_item(&Progress {
            done,
            total: items.len(),
            acc: right as f64 / done as f64,
            acc_norm: right_norm as f64 / done as f64,
        });
    }
    rep.n = rep.items.len();
    rep.acc = Acc::new(right, rep.n);
    rep.acc_norm = Acc::new(right_norm, rep.n);
    if *task == TaskKind::HellaSwag {
        rep.acc_llama_cpp = Some(Acc::new(right_llama, rep.n));
    }
    Ok(rep)
}

/// llama.cpp's HellaSwag pick: the option with the largest mean log-prob over its tokens after
/// the common prefix of all options' full token sequences (the first such token's log-prob comes
/// from the last common token). All options share the context tokens here, so the common prefix
/// is the context plus the leading continuation tokens all options agree on.
fn llama_cpp_choice(encoded: &[Encoded], lps: &[Vec<f64>]) -> usize {
    let Some(first) = encoded.first() else { return 0 };
    let mut common_cont = 0;
    while let Some(&t) = first.cont.get(common_cont) {
        if !encoded.iter().all(|e| e.ctx == first.ctx && e.cont.get(common_cont) == Some(&t)) {
            break;
        }
        common_cont += 1;
    }
    argmax(lps.iter().map(|lp| {
        if lp.is_empty() {
            return f64::NEG_INFINITY;
        }
        // llama.cpp reads past the end when all sequences are identical; keep the last token.
        let tail = &lp[common_cont.min(lp.len() - 1)..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_keeps_bos_and_the_end() {
        assert_eq!(fit_context(&[1, 2, 3], 2, 10, Some(1)), None);
        assert_eq!(fit_context(&[1, 2, 3, 4, 5, 6], 3, 6, Some(1)), Some(vec![1, 5, 6]));
        assert_eq!(fit_context(&[7, 2, 3, 4, 5, 6], 3, 6, Some(1)), Some(vec![4, 5, 6]));
        assert_eq!(fit_context(&[7, 2, 3, 4, 5, 6], 3, 6, None), Some(vec![4, 5, 6]));
        assert_eq!(fit_context(&[1, 2, 3], 5, 6, Some(1)), Some(vec![1]));
    }

    #[test]
    fn stderr_like_lm_eval() {
        let a = Acc::new(41, 100);
        assert!((a.stderr - (0.41f64 * 0.59 / 99.0).sqrt()).abs() < 1e-12);
        assert_eq!(Acc::new(1, 1).stderr, 0.0);
    }

    #[test]
    fn argmax_first_max_and_nan() {
        assert_eq!(argmax([1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax([f64::NAN, -1.0]), 1);
    }
}
