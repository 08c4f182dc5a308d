//! Text generation: evaluate the prompt, then sample one token at a time until EOS, a stop string
//! or the token limit, streaming text through a callback as it becomes valid UTF-8.
//!
//! [`Generator`] is one generation step without the engine — sample from a row of logits, add
//! the token, say whether it ended the generation and which text is now safe to stream — used by
//! [`generate`] here and by the server's worker.

use crate::sampling::{Sampler, SamplerOptions};
use crate::{Engine, EvalError, Logits};
use sift_model::tokenizer::{StreamDecoder, Tokenizer};
use std::time::Instant;

/// Generation settings (llama.cpp names: `-n`, `--ignore-eos`, `-r`).
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Tokens to generate; `None` = until the context is full or EOS.
    pub n_predict: Option<usize>,
    /// Stop when the text contains one of these (the stop string is not returned).
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub sampler: SamplerOptions,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token.
    Eos,
    /// A stop string appeared.
    StopString,
    /// `n_predict` tokens were generated.
    Length,
    /// The context filled up.
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

/// What a generation produced, with timings.
#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub n_prompt: usize,
    pub prompt_secs: f64,
    pub n_gen: usize,
    pub gen_secs: f64,
}

/// What adding one token did ([`Generator::push`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The text that is now safe to stream: complete UTF-8, with no tail that may begin a stop
    /// string. Empty when the token completed nothing (or ended the generation with no text).
    pub text: String,
    /// Set when the token ended the generation: [`StopReason::Eos`] (the token is not added to
    /// the tokens or the text) or [`StopReason::StopString`] (the text is cut where the stop
    /// string begins; `text` is what came before it). Reaching the token limit is not reported
    /// here but by [`Generator::limit_reached`] before the next token is sampled.
    pub end: Option<StopReason>,
}

/// One generation in progress, independent of the engine: the sampler (with the prompt in its
/// penalty window), the streaming decoder, the text so far and how much of it was handed out,
/// the stop strings, the token limit and the generated tokens.
///
/// A caller's loop: `if limit_reached() → Length`; `sample(logits)`; `push(tok, id)` → stream
/// `step.text`, stop on `step.end`; evaluate the token; repeat. Then [`finish`](Self::finish)
/// gives the rest of the text.
pub struct Generator {
    sampler: Sampler,
    dec: StreamDecoder,
    /// Non-empty stop strings.
    stop: Vec<String>,
    /// The longest stop string, in bytes.
    stop_len: usize,
    limit: usize,
    ignore_eos: bool,
    tokens: Vec<u32>,
    text: String,
    /// Bytes of `text` handed out through [`Step::text`] and [`finish`](Self::finish).
    emitted: usize,
    ended: Option<StopReason>,
}

impl Generator {
    /// A generation with `opts` after `prompt`, whose tokens enter the penalty window.
    pub fn new(opts: &GenerateOptions, prompt: &[u32]) -> Generator {
        let mut sampler = Sampler::new(opts.sampler.clone());
        for &t in prompt {
            sampler.accept(t);
        }
        Generator::with_sampler(sampler, opts)
    }

    /// A generation drawing from `sampler` as it is (its window already holding the context);
    /// `opts.sampler` is not read.
    pub fn with_sampler(sampler: Sampler, opts: &GenerateOptions) -> Generator {
        let stop: Vec<String> = opts.stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        Generator {
            sampler,
            dec: StreamDecoder::new(),
            stop_len: stop.iter().map(|s| s.len()).max().unwrap_or(0),
            stop,
            limit: opts.n_predict.unwrap_or(usize::MAX),
            ignore_eos: opts.ignore_eos,
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            ended: None,
        }
    }

    /// Picks the next token from one row of logits (the sampler does not change `logits`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sampler.sample(logits)
    }

    /// Adds the sampled token `id`. An end-of-generation token (unless `ignore_eos`) ends the
    /// generation and is not added; any other token joins the tokens, the penalty window and the
    /// text. Not to be called again once a step has ended the generation.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Step {
        debug_assert!(self.ended.is_none(), "push after the generation ended");
        if !self.ignore_eos && tok.is_eog(id) {
            self.ended = Some(StopReason::Eos);
            return Step { text: String::new(), end: self.ended };
        }
        let before = self.text.len();
        self.tokens.push(id);
        self.sampler.accept(id);
        if let Some(piece) = self.dec.push(tok, id) {
            self.text.push_str(&piece);
        }
        // Stop strings: cut at the first full match; hold back a tail that may start one.
        if let Some(cut) = self.find_stop(before) {
            self.text.truncate(cut);
            let text = self.text[self.emitted.min(cut)..].to_string();
            self.emitted = self.text.len();
            self.ended = Some(StopReason::StopString);
            return Step { text, end: self.ended };
        }
        let safe = self.text.len() - held_back(&self.text, &self.stop);
        let mut text = String::new();
        if safe > self.emitted {
            text.push_str(&self.text[self.emitted..safe]);
            self.emitted = safe;
        }
        Step { text, end: None }
    }

    /// Where the first stop string begins in the text, if one is in it. No stop string was in
    /// the first `before` bytes (the text the previous tokens left), so a new match ends past
    /// them and begins at most `stop_len - 1` bytes before: only that tail is searched.
    fn find_stop(&self, before: usize) -> Option<usize> {
        if self.stop.is_empty() {
            return None;
        }
        let mut from = before.saturating_sub(self.stop_len.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let tail = &self.text[from..];
        self.stop.iter().filter_map(|s| tail.find(s.as_str())).min().map(|i| from + i)
    }

    /// Ends the generation: returns the text not handed out yet — the held-back tail and,
    /// unless a stop string ended it, whatever the decoder still holds (an incomplete character
    /// becomes U+FFFD), which then also joins [`text`](Self::text).
    pub fn finish(&mut self) -> String {
        if self.ended != Some(StopReason::StopString) {
            if let Some(rest) = self.dec.flush() {
                self.text.push_str(&rest);
            }
        }
        let rest = self.text[self.emitted.min(self.text.len())..].to_string();
        self.emitted = self.text.len();
        rest
    }

    /// Whether `n_predict` tokens have been generated (checked before sampling the next one).
    pub fn limit_reached(&self) -> bool {
        self.tokens.len() >= self.limit
    }

    /// What ended the generation, if a pushed token did (EOS or a stop string).
    pub fn ended(&self) -> Option<StopReason> {
        self.ended
    }

    /// The generated tokens (without an ending EOS).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The text so far (cut at a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Generated tokens: [`tokens`](Self::tokens)`.len()`.
    pub fn n_generated(&self) -> usize {
        self.tokens.len()
    }

    /// Tokens sampled and pushed, an ending EOS included (what an API reports as generated).
    pub fn n_sampled(&self) -> usize {
        self.tokens.len() + usize::from(self.ended == Some(StopReason::Eos))
    }

    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// The generated tokens and the text.
    pub fn into_parts(self) -> (Vec<u32>, String) {
        (self.tokens, self.text)
    }
}

/// Generates after `prompt` (which is evaluated on top of whatever is already cached).
/// `on_text` receives each new piece of text and returns `false` to stop.
///
/// Each generated token is evaluated before the next one is sampled, so after
/// [`StopReason::Length`] all of them are in the KV cache; after a stop string, a cancel or a full
/// context the last one is not, and an EOS token never is (callers keep their record of the
/// cache in step with `engine.n_past()`).
pub fn generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, EvalError> {
    let mut g = Generator::new(opts, prompt);
    let t0 = Instant::now();
    let first = g.sample(engine.eval(prompt, Logits::Last)?);
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let stop = drive(&mut g, tok, first, on_text, |g, next| -> Result<Option<u32>, EvalError> {
        if engine.n_past() >= engine.n_ctx() {
            return Ok(None);
        }
        Ok(Some(g.sample(engine.eval(&[next], Logits::Last)?)))
    })?;
    let (tokens, text) = g.into_parts();
    Ok(Generation {
        n_gen: tokens.len(),
        tokens,
        text,
        stop,
        n_prompt: prompt.len(),
        prompt_secs,
        gen_secs: t1.elapsed().as_secs_f64(),
    })
}

/// The generation loop [`generate`] runs, for any source of tokens: pushes `first`, then for
/// each pushed token the next one `step` gives (it evaluates the token and samples the next;
/// `None`: the context is full), until an end; hands each piece of text to `on_text` (`false`
/// cancels) and, at the end, the rest the decoder held.
pub fn drive<E>(
    g: &mut Generator,
    tok: &Tokenizer,
    first: u32,
    mut on_text: impl FnMut(&str) -> bool,
    mut step: impl FnMut(&mut Generator, u32) -> Result<Option<u32>, E>,
) -> Result<StopReason, E> {
    let mut next = first;
    let stop = loop {
        if g.limit_reached() {
            break StopReason::Length;
        }
        let pushed = g.push(tok, next);
        if !pushed.text.is_empty() && !on_text(&pushed.text) {
            break StopReason::Cancelled;
        }
        if let Some(end) = pushed.end {
            break end;
        }
        match step(g, next)? {
            Some(t) => next = t,
            None => break StopReason::ContextFull,
        }
    };
    let rest = g.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    Ok(stop)
}

/// Length of the longest suffix of `text` that is a proper prefix of some stop string.
pub fn held_back(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops {
        for (i, _) in s.char_indices().skip(1) {
            if i > best && text.ends_with(&s[..i]) {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn holds_back_partial_stop_strings() {
        let stops = vec!["</s>".to_string(), "User:".to_string()];
        assert_eq!(held_back("hello </", &stops), 2);
        assert_eq!(held_back("hello Us", &stops), 2);
        assert_eq!(held_back("hello", &stops), 0);
    }
}
