//! Text generation: evaluate the prompt, then sample one token at a time until EOS, a stop string
//! or the token limit, streaming text through a callback as it becomes valid UTF-8.

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

/// Generates after `prompt` (which is evaluated on top of whatever is already cached).
/// `on_text` receives each new piece of text and returns `false` to stop.
pub fn generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, EvalError> {
    let mut sampler = Sampler::new(opts.sampler.clone());
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut next = sampler.sample(engine.eval(prompt, Logits::Last)?);
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut out = Vec::new();
    let mut text = String::new();
    let mut emitted = 0usize;
    let mut dec = StreamDecoder::new();
    let limit = opts.n_predict.unwrap_or(usize::MAX);
    let stop = loop {
        if out.len() >= limit {
            break StopReason::Length;
        }
        if !opts.ignore_eos && tok.is_eog(next) {
            break StopReason::Eos;
        }
        out.push(next);
        sampler.accept(next);
        if let Some(piece) = dec.push(tok, next) {
            text.push_str(&piece);
        }
        // Stop strings: cut at the first full match; hold back a tail that may start one.
        if let Some(cut) = opts.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            if emitted < text.len() && !on_text(&text[emitted..]) {
                break StopReason::Cancelled;
            }
            emitted = text.len();
            break StopReason::StopString;
        }
        let safe = text.len() - held_back(&text, &opts.stop);
        if safe > emitted {
            let cont = on_text(&text[emitted..safe]);
            emitted = safe;
            if !cont {
                break StopReason::Cancelled;
            }
        }
        if engine.n_past() >= engine.n_ctx() {
            break StopReason::ContextFull;
        }
        next = sampler.sample(engine.eval(&[next], Logits::Last)?);
    };
    if stop != StopReason::StopString {
        if let Some(rest) = dec.flush() {
            text.push_str(&rest);
        }
        if emitted < text.len() {
            on_text(&text[emitted..]);
        }
    }
    Ok(Generation {
        n_gen: out.len(),
        tokens: out,
        text,
        stop,
        n_prompt: prompt.len(),
        prompt_secs,
        gen_secs: t1.elapsed().as_secs_f64(),
    })
}

/// Length of the longest suffix of `text` that is a proper prefix of some stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
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
