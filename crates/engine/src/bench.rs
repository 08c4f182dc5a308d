//! `sift bench`: prompt-processing (pp) and text-generation (tg) throughput measured the way
//! llama-bench measures them — a warm-up run, then `reps` timed runs from an empty context (or,
//! with a depth `d`, after `d` tokens of context, processed once and not timed); pp evaluates
//! `n_prompt` tokens in batches, tg decodes `n_gen` tokens one at a time.

use crate::{Engine, EvalError, Logits};
use std::time::Instant;

/// One test's samples and summary (llama-bench's JSON field names).
#[derive(Clone, Debug)]
pub struct BenchResult {
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens of context before the test (llama-bench's `n_depth`).
    pub n_depth: usize,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    pub avg_ns: f64,
    pub stddev_ns: f64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
}

impl BenchResult {
    /// "pp512" or "tg128", with " @ d2048" after a depth (as llama-bench names them).
    pub fn test_name(&self) -> String {
        let name = if self.n_gen == 0 {
            format!("pp{}", self.n_prompt)
        } else if self.n_prompt == 0 {
            format!("tg{}", self.n_gen)
        } else {
            format!("pp{}+tg{}", self.n_prompt, self.n_gen)
        };
        if self.n_depth > 0 {
            format!("{name} @ d{}", self.n_depth)
        } else {
            name
        }
    }

    fn from_samples(n_prompt: usize, n_gen: usize, n_depth: usize, samples_ns: Vec<u64>) -> Self {
        let n_tok = (n_prompt + n_gen) as f64;
        let samples_ts: Vec<f64> = samples_ns.iter().map(|&ns| n_tok * 1e9 / ns as f64).collect();
        let (avg_ns, stddev_ns) = mean_std(&samples_ns.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let (avg_ts, stddev_ts) = mean_std(&samples_ts);
        BenchResult { n_prompt, n_gen, n_depth, samples_ns, samples_ts, avg_ns, stddev_ns, avg_ts, stddev_ts }
    }
}

fn mean_std(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = if x.len() > 1 { x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Deterministic pseudo-random token ids (llama-bench feeds random tokens too).
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab as u64) as u32
        })
        .collect()
}

/// Fills the context with `depth` tokens (evaluated as a prompt, not timed): every run of a test
/// then starts from there ([`Engine::truncate`] to `depth` keeps them).
fn fill_depth(engine: &mut Engine, depth: usize) -> Result<(), EvalError> {
    engine.truncate(0);
    if depth > 0 {
        let toks = tokens(depth, engine.config().n_vocab, 0xdeb7);
        engine.eval(&toks, Logits::Last)?;
    }
    Ok(())
}

/// Prompt processing: `n_prompt` tokens evaluated as batches, logits of the last one, after
/// `depth` tokens of context.
pub fn bench_pp(engine: &mut Engine, n_prompt: usize, depth: usize, reps: usize) -> Result<BenchResult, EvalError> {
    let toks = tokens(n_prompt, engine.config().n_vocab, 0x5eed);
    fill_depth(engine, depth)?;
    let run = |engine: &mut Engine| -> Result<u64, EvalError> {
        engine.truncate(depth);
        let t = Instant::now();
        engine.eval(&toks, Logits::Last)?;
        Ok(t.elapsed().as_nanos() as u64)
    };
    run(engine)?;
    let samples = (0..reps.max(1)).map(|_| run(engine)).collect::<Result<Vec<_>, _>>()?;
    Ok(BenchResult::from_samples(n_prompt, 0, depth, samples))
}

/// Text generation: `n_gen` single-token steps after `depth` tokens of context.
pub fn bench_tg(engine: &mut Engine, n_gen: usize, depth: usize, reps: usize) -> Result<BenchResult, EvalError> {
    bench_tg_measured(engine, n_gen, depth, reps, &mut |_| {})
}

/// [`bench_tg`], calling `after_warmup` between the warm-up run and the measured ones (to reset
/// counters so that they cover the measured runs only).
pub fn bench_tg_measured(
    engine: &mut Engine,
    n_gen: usize,
    depth: usize,
    reps: usize,
    after_warmup: &mut dyn FnMut(&mut Engine),
) -> Result<BenchResult, EvalError> {
    let toks = tokens(n_gen, engine.config().n_vocab, 0xbe9c);
    fill_depth(engine, depth)?;
    let run = |engine: &mut Engine, n: usize| -> Result<u64, EvalError> {
        engine.truncate(depth);
        let t = Instant::now();
        for &tok in &toks[..n] {
            engine.eval(&[tok], Logits::Last)?;
        }
        Ok(t.elapsed().as_nanos() as u64)
    };
    run(engine, n_gen.min(16))?;
    after_warmup(engine);
    let samples = (0..reps.max(1)).map(|_| run(engine, n_gen)).collect::<Result<Vec<_>, _>>()?;
    Ok(BenchResult::from_samples(0, n_gen, depth, samples))
}
