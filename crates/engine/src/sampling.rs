//! Token sampling as a chain of stages, by default llama.cpp's chain and defaults:
//! repetition / presence / frequency penalties → top-k → top-p → min-p → temperature → draw.
//! `temp <= 0` is greedy: penalties, then the most likely token.
//!
//! [`SamplerOptions::chain`] builds the chain in llama.cpp's default order; [`Sampler::with_chain`]
//! runs any other ([`SamplerStage`]s in a given order, then a [`Pick`]), which is where a
//! `--samplers` order or a logit-bias stage slots in.

use std::collections::VecDeque;

/// Sampling settings (llama.cpp's flag names and defaults).
#[derive(Clone, Debug)]
pub struct SamplerOptions {
    pub temp: f32,
    /// 0 = no top-k.
    pub top_k: usize,
    /// 1.0 = no top-p.
    pub top_p: f32,
    /// 0.0 = no min-p.
    pub min_p: f32,
    /// 1.0 = no penalty.
    pub repeat_penalty: f32,
    /// Subtracted from a recent token's logit once (0.0 = off; llama.cpp's `--presence-penalty`,
    /// OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted from a recent token's logit per occurrence (0.0 = off; `--frequency-penalty`).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Random seed; `None` picks one from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: None,
        }
    }
}

impl SamplerOptions {
    /// Always pick the most likely token.
    pub fn greedy() -> Self {
        SamplerOptions { temp: 0.0, ..Default::default() }
    }

    /// The chain these options describe, in llama.cpp's default order. Stages whose setting is
    /// neutral are left out (penalties of 1.0 / 0.0, top-k 0, top-p 1.0, min-p 0.0); `temp <= 0`
    /// is the penalties (if any) and then [`Pick::Greedy`].
    pub fn chain(&self) -> SamplerChain {
        let mut stages = Vec::new();
        let penalties = Penalties {
            repeat: self.repeat_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
        };
        if !penalties.is_neutral() {
            stages.push(SamplerStage::Penalties(penalties));
        }
        if self.temp <= 0.0 {
            return SamplerChain { stages, pick: Pick::Greedy };
        }
        if self.top_k > 0 {
            stages.push(SamplerStage::TopK(self.top_k));
        }
        if self.top_p < 1.0 {
            stages.push(SamplerStage::TopP(self.top_p));
        }
        if self.min_p > 0.0 {
            stages.push(SamplerStage::MinP(self.min_p));
        }
        stages.push(SamplerStage::Temperature(self.temp));
        SamplerChain { stages, pick: Pick::Draw }
    }
}

/// llama.cpp's penalties sampler: each distinct token of the recent window once, with its count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// A recent token's positive logit is divided by it, a negative one multiplied (1.0 = off).
    pub repeat: f32,
    /// Subtracted per occurrence in the window (0.0 = off).
    pub frequency: f32,
    /// Subtracted once (0.0 = off).
    pub presence: f32,
}

impl Penalties {
    pub fn is_neutral(&self) -> bool {
        self.repeat == 1.0 && self.presence == 0.0 && self.frequency == 0.0
    }
}

/// One stage of a sampling chain: it changes or cuts the candidate list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SamplerStage {
    /// Penalties on the tokens of the recent window ([`Sampler::accept`]).
    Penalties(Penalties),
    /// Keep the `k` most likely candidates (0 = all).
    TopK(usize),
    /// Keep the most likely candidates whose probabilities sum to at least `p` (1.0 = all).
    TopP(f32),
    /// Keep the candidates at least `p` times as likely as the most likely one (0.0 = all).
    MinP(f32),
    /// Divide the logits by `t` for the stages after it and the draw (`t <= 0` keeps only the
    /// most likely candidate, as llama.cpp's temperature sampler).
    Temperature(f32),
}

/// How a chain ends: which candidate becomes the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The most likely candidate (the lowest id among ties); draws no random number.
    Greedy,
    /// A random candidate, in proportion to its probability.
    Draw,
}

/// Stages in the order they run, then the pick.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerChain {
    pub stages: Vec<SamplerStage>,
    pub pick: Pick,
}

/// A sampler with its chain, its random state and the recent-token window for the penalties.
pub struct Sampler {
    /// The options it was made with: `seed` and `repeat_last_n` (the window [`accept`](Self::accept)
    /// keeps) are read from here; the sampling settings went into the chain when it was built.
    pub opts: SamplerOptions,
    chain: SamplerChain,
    rng: SplitMix64,
    recent: VecDeque<u32>,
    /// The candidates and their weights, kept between calls to reuse the memory.
    cand: Vec<(u32, f32)>,
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler running `opts.chain()`.
    pub fn new(opts: SamplerOptions) -> Sampler {
        let chain = opts.chain();
        Sampler::with_chain(opts, chain)
    }

    /// A sampler running `chain`; `opts` gives the seed and the window of the penalties
    /// (`repeat_last_n`), its other sampling settings are not read.
    pub fn with_chain(opts: SamplerOptions, chain: SamplerChain) -> Sampler {
        let seed = opts.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ (std::process::id() as u64) << 32
        });
        Sampler { opts, chain, rng: SplitMix64(seed), recent: VecDeque::new(), cand: Vec::new(), weights: Vec::new() }
    }

    /// The chain this sampler runs.
    pub fn chain(&self) -> &SamplerChain {
        &self.chain
    }

    /// Remembers a token that is now part of the context (prompt or generated).
    pub fn accept(&mut self, tok: u32) {
        if self.opts.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.opts.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(tok);
    }

    /// Picks the next token from one row of logits: every id is a candidate, each stage of the
    /// chain runs in turn, then the pick.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mut c = Candidates {
            c: std::mem::take(&mut self.cand),
            w: std::mem::take(&mut self.weights),
            sorted: false,
            by_id: true,
            temp: None,
        };
        c.c.clear();
        c.c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for stage in &self.chain.stages {
            match *stage {
                SamplerStage::Penalties(p) => c.penalties(&p, &self.recent),
                SamplerStage::TopK(k) => c.top_k(k),
                SamplerStage::TopP(p) => c.top_p(p),
                SamplerStage::MinP(p) => c.min_p(p),
                SamplerStage::Temperature(t) => c.temperature(t),
            }
        }
        let id = match self.chain.pick {
            Pick::Greedy => c.most_likely(),
            Pick::Draw => c.draw(&mut self.rng),
        };
        self.cand = c.c;
        self.weights = c.w;
        id
    }
}

/// The candidate list as it goes through a chain.
struct Candidates {
    /// (id, logit), logits as the penalties left them (the temperature is kept apart in `temp`).
    c: Vec<(u32, f32)>,
    /// Scratch for the candidates' weights (after a draw: the weights it drew from).
    w: Vec<f32>,
    /// Sorted by [`desc`].
    sorted: bool,
    /// Still every id, in id order (`c[i].0 == i`).
    by_id: bool,
    /// The temperature the logits are divided by, once a temperature stage has run.
    temp: Option<f32>,
}

/// Most likely first; the lower id first among equal logits (a total order: ids are distinct).
fn desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

impl Candidates {
    fn penalties(&mut self, p: &Penalties, recent: &VecDeque<u32>) {
        if p.is_neutral() {
            return;
        }
        let mut counts: Vec<(u32, u32)> = Vec::with_capacity(recent.len());
        for &t in recent {
            match counts.iter_mut().find(|(id, _)| *id == t) {
                Some((_, n)) => *n += 1,
                None => counts.push((t, 1)),
            }
        }
        for (t, n) in counts {
            let c = if self.by_id { self.c.get_mut(t as usize) } else { self.c.iter_mut().find(|c| c.0 == t) };
            if let Some(c) = c {
                c.1 = if c.1 > 0.0 { c.1 / p.repeat } else { c.1 * p.repeat };
                c.1 -= n as f32 * p.frequency + p.presence;
            }
        }
        if !self.by_id {
            self.sorted = false;
        }
    }

    fn top_k(&mut self, k: usize) {
        if k > 0 && k < self.c.len() {
            if !self.sorted {
                self.c.select_nth_unstable_by(k - 1, desc);
            }
            self.c.truncate(k);
            self.by_id = false;
        }
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.c.sort_unstable_by(desc);
            self.sorted = true;
            self.by_id = false;
        }
    }

    /// `exp((logit - max) / temp)` of a candidate, `max` the first (sorted) candidate's logit:
    /// its probability up to the common factor.
    fn weight(&self, logit: f32, max: f32) -> f32 {
        match self.temp {
            None => (logit - max).exp(),
            Some(t) => ((logit - max) / t).exp(),
        }
    }

    fn top_p(&mut self, p: f32) {
        if p >= 1.0 {
            return;
        }
        self.sort();
        let max = self.c[0].1;
        let mut probs = std::mem::take(&mut self.w);
        probs.clear();
        probs.extend(self.c.iter().map(|x| self.weight(x.1, max)));
        let sum: f32 = probs.iter().sum();
        let mut keep = self.c.len();
        let mut cum = 0.0;
        for (i, q) in probs.iter().enumerate() {
            cum += q / sum;
            if cum >= p {
                keep = i + 1;
                break;
            }
        }
        self.w = probs;
        self.c.truncate(keep.max(1));
    }

    fn min_p(&mut self, p: f32) {
        if p <= 0.0 {
            return;
        }
        self.sort();
        let max = self.c[0].1;
        let floor = p * self.weight(max, max);
        let keep = self.c.iter().take_while(|x| self.weight(x.1, max) >= floor).count();
        self.c.truncate(keep.max(1));
    }

    fn temperature(&mut self, t: f32) {
        if t <= 0.0 {
            let best = self.most_likely();
            self.c.clear();
            self.c.push((best, 0.0));
            self.sorted = true;
            self.by_id = false;
            return;
        }
        self.temp = Some(self.temp.map_or(t, |a| a * t));
    }

    /// The most likely candidate, the lowest id among ties.
    fn most_likely(&self) -> u32 {
        if self.sorted {
            self.c[0].0
        } else if self.by_id {
            argmax(&self.c)
        } else {
            self.c.iter().copied().min_by(desc).map_or(0, |x| x.0)
        }
    }

    fn draw(&mut self, rng: &mut SplitMix64) -> u32 {
        self.sort();
        let max = self.c[0].1;
        let mut w = std::mem::take(&mut self.w);
        w.clear();
        w.extend(self.c.iter().map(|x| self.weight(x.1, max)));
        let total: f32 = w.iter().sum();
        let mut r = rng.next_f32() * total;
        let mut pick = self.c.len() - 1;
        for (i, wi) in w.iter().enumerate() {
            r -= wi;
            if r <= 0.0 {
                pick = i;
                break;
            }
        }
        self.w = w;
        self.c[pick].0
    }
}

/// Index of the largest logit (the lowest id among ties).
pub fn argmax(c: &[(u32, f32)]) -> u32 {
    let mut best = c[0];
    for &x in &c[1..] {
        if x.1 > best.1 {
            best = x;
        }
    }
    best.0
}

/// Index of the largest value of a logits row.
pub fn argmax_logits(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9, -1.0]
    }

    /// The sampler before it became a chain (issue: one generation-step API), copied verbatim as
    /// the reference the chain must match bit for bit.
    struct Reference {
        opts: SamplerOptions,
        rng: SplitMix64,
        recent: VecDeque<u32>,
        cand: Vec<(u32, f32)>,
        /// The weights of the last draw (added to the copy: the chain must compute the same bits).
        w: Vec<f32>,
    }

    impl Reference {
        fn new(opts: SamplerOptions) -> Reference {
            let seed = opts.seed.unwrap();
            Reference { opts, rng: SplitMix64(seed), recent: VecDeque::new(), cand: Vec::new(), w: Vec::new() }
        }

        fn accept(&mut self, tok: u32) {
            if self.opts.repeat_last_n == 0 {
                return;
            }
            if self.recent.len() == self.opts.repeat_last_n {
                self.recent.pop_front();
            }
            self.recent.push_back(tok);
        }

        fn sample(&mut self, logits: &[f32]) -> u32 {
            let o = &self.opts;
            self.cand.clear();
            self.cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
            if o.repeat_penalty != 1.0 || o.presence_penalty != 0.0 || o.frequency_penalty != 0.0 {
                let mut counts: Vec<(u32, u32)> = Vec::with_capacity(self.recent.len());
                for &t in &self.recent {
                    match counts.iter_mut().find(|(id, _)| *id == t) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((t, 1)),
                    }
                }
                for (t, n) in counts {
                    if let Some(c) = self.cand.get_mut(t as usize) {
                        c.1 = if c.1 > 0.0 { c.1 / o.repeat_penalty } else { c.1 * o.repeat_penalty };
                        c.1 -= n as f32 * o.frequency_penalty + o.presence_penalty;
                    }
                }
            }
            if o.temp <= 0.0 {
                return argmax(&self.cand);
            }
            let c = &mut self.cand;
            let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
            if o.top_k > 0 && o.top_k < c.len() {
                c.select_nth_unstable_by(o.top_k - 1, desc);
                c.truncate(o.top_k);
            }
            c.sort_unstable_by(desc);
            let max = c[0].1;
            let probs: Vec<f32> = c.iter().map(|x| (x.1 - max).exp()).collect();
            let sum: f32 = probs.iter().sum();
            let mut keep = c.len();
            if o.top_p < 1.0 {
                let mut cum = 0.0;
                for (i, p) in probs.iter().enumerate() {
                    cum += p / sum;
                    if cum >= o.top_p {
                        keep = i + 1;
                        break;
                    }
                }
            }
            if o.min_p > 0.0 {
                let floor = o.min_p * probs[0];
                keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
            }
            c.truncate(keep.max(1));
            let w: Vec<f32> = c.iter().map(|x| ((x.1 - max) / o.temp).exp()).collect();
            self.w = w.clone();
            let total: f32 = w.iter().sum();
            let mut r = self.rng.next_f32() * total;
            for (i, wi) in w.iter().enumerate() {
                r -= wi;
                if r <= 0.0 {
                    return c[i].0;
                }
            }
            c[c.len() - 1].0
        }
    }

    /// A random row of logits: spread, quantized (ties), with some `-inf` (masked tokens).
    fn random_logits(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
        let scale = [0.5, 2.0, 8.0, 30.0][(rng.next_u64() % 4) as usize];
        let quantum = [0.0, 0.25, 1.0][(rng.next_u64() % 3) as usize];
        (0..n)
            .map(|_| {
                if rng.next_u64().is_multiple_of(50) {
                    return f32::NEG_INFINITY;
                }
                let x = (rng.next_f32() * 2.0 - 1.0) * scale;
                if quantum > 0.0 {
                    (x / quantum).round() * quantum
                } else {
                    x
                }
            })
            .collect()
    }

    /// Random options, each knob either neutral or set, covering greedy, top-k only, top-p,
    /// min-p, penalties and temperature alone and together.
    fn random_options(rng: &mut SplitMix64, case: u64) -> SamplerOptions {
        let mut pick = |choices: &[f32]| choices[(rng.next_u64() % choices.len() as u64) as usize];
        let temp = pick(&[0.0, -1.0, 0.1, 0.5, 0.8, 1.0, 1.7, 5.0]);
        let top_k = pick(&[0.0, 0.0, 1.0, 2.0, 5.0, 40.0, 1000.0]) as usize;
        let top_p = pick(&[1.0, 1.0, 0.95, 0.5, 0.1, 0.0, 1.5]);
        let min_p = pick(&[0.0, 0.0, 0.05, 0.2, 0.9, 1.0]);
        let repeat_penalty = pick(&[1.0, 1.0, 1.1, 1.5, 0.8]);
        let presence_penalty = pick(&[0.0, 0.0, 0.5, -1.0]);
        let frequency_penalty = pick(&[0.0, 0.0, 0.2, -0.3]);
        let repeat_last_n = pick(&[64.0, 0.0, 3.0, 16.0]) as usize;
        SamplerOptions {
            temp,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            presence_penalty,
            frequency_penalty,
            repeat_last_n,
            seed: Some(case.wrapping_mul(0x9E37_79B9) ^ 17),
        }
    }

    #[test]
    fn chain_matches_the_reference_sampler_bit_for_bit() {
        let mut rng = SplitMix64(2024);
        let mut draws = 0;
        for case in 0..3000u64 {
            let opts = random_options(&mut rng, case);
            let n_vocab = [1usize, 2, 7, 64, 300, 2000][(rng.next_u64() % 6) as usize];
            let mut new = Sampler::new(opts.clone());
            let mut old = Reference::new(opts.clone());
            // A prompt in the penalty window.
            for _ in 0..(rng.next_u64() % 20) {
                let t = (rng.next_u64() % (n_vocab as u64 + 3)) as u32;
                new.accept(t);
                old.accept(t);
            }
            for step in 0..8 {
                let logits = random_logits(&mut rng, n_vocab);
                let (a, b) = (new.sample(&logits), old.sample(&logits));
                assert_eq!(a, b, "case {case} step {step}: {opts:?}, chain {:?}", new.chain());
                if new.chain().pick == Pick::Draw {
                    // The same candidates, in the same order, with the same weights to the bit.
                    let bits = |w: &[f32]| w.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(new.cand, old.cand, "case {case} step {step}: {opts:?}");
                    assert_eq!(bits(&new.weights), bits(&old.w), "case {case} step {step}: {opts:?}");
                }
                new.accept(a);
                old.accept(b);
                draws += 1;
            }
        }
        assert_eq!(draws, 3000 * 8);
    }

    #[test]
    fn chain_matches_the_reference_on_odd_settings() {
        // NaN temperature (every weight NaN: the last candidate), top-k of the whole vocabulary,
        // a penalty window with ids out of range, all logits equal.
        let cases = [
            SamplerOptions { temp: f32::NAN, seed: Some(1), ..Default::default() },
            SamplerOptions { top_k: 6, top_p: 1.0, min_p: 0.0, seed: Some(2), ..Default::default() },
            SamplerOptions { repeat_penalty: 1.3, seed: Some(3), ..Default::default() },
            SamplerOptions { repeat_penalty: 1.3, seed: Some(4), ..SamplerOptions::greedy() },
        ];
        let rows = [logits(), vec![0.5; 6], vec![-3.0, -1.0, -1.0, -2.0, -1.0, -9.0]];
        for opts in cases {
            for row in &rows {
                let mut new = Sampler::new(opts.clone());
                let mut old = Reference::new(opts.clone());
                for t in [1, 4, 99, 1] {
                    new.accept(t);
                    old.accept(t);
                }
                for _ in 0..20 {
                    assert_eq!(new.sample(row), old.sample(row), "{opts:?} {row:?}");
                }
            }
        }
    }

    #[test]
    fn default_chain_is_llama_cpp_order() {
        use SamplerStage::*;
        let c = SamplerOptions { repeat_penalty: 1.1, ..Default::default() }.chain();
        let p = super::Penalties { repeat: 1.1, frequency: 0.0, presence: 0.0 };
        assert_eq!(c.stages, vec![SamplerStage::Penalties(p), TopK(40), TopP(0.95), MinP(0.05), Temperature(0.8)]);
        assert_eq!(c.pick, Pick::Draw);
        let c = SamplerOptions::greedy().chain();
        assert!(c.stages.is_empty());
        assert_eq!(c.pick, Pick::Greedy);
        let c = SamplerOptions { temp: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Default::default() }.chain();
        assert_eq!(c.stages, vec![Temperature(1.0)]);
    }

    #[test]
    fn stages_run_in_the_chain_order() {
        // Temperature before top-p changes which candidates top-p keeps (llama.cpp semantics):
        // at temperature 1, top-p 0.5 of [3.0, 2.9, 2.0, ...] needs two candidates; at a high
        // temperature more.
        let opts = SamplerOptions { seed: Some(5), ..Default::default() };
        let chain = |stages| SamplerChain { stages, pick: Pick::Draw };
        use SamplerStage::*;
        let mut late = Sampler::with_chain(opts.clone(), chain(vec![TopP(0.5), Temperature(100.0)]));
        let mut early = Sampler::with_chain(opts.clone(), chain(vec![Temperature(100.0), TopP(0.5)]));
        let seen = |s: &mut Sampler| {
            let mut v: Vec<u32> = (0..400).map(|_| s.sample(&logits())).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        assert_eq!(seen(&mut late), vec![1, 4]);
        assert_eq!(seen(&mut early), vec![1, 2, 4]);
        // Temperature 0 inside a chain keeps the most likely candidate.
        let mut zero = Sampler::with_chain(opts.clone(), chain(vec![Temperature(0.0)]));
        assert_eq!(seen(&mut zero), vec![1]);
        // Penalties after a cut find their tokens by id.
        let mut s = Sampler::with_chain(
            opts,
            SamplerChain {
                stages: vec![TopK(3), Penalties(super::Penalties { repeat: 1.5, frequency: 0.0, presence: 0.0 })],
                pick: Pick::Greedy,
            },
        );
        s.accept(1);
        assert_eq!(s.sample(&logits()), 4);
    }

    #[test]
    fn greedy_picks_the_largest() {
        let mut s = Sampler::new(SamplerOptions::greedy());
        assert_eq!(s.sample(&logits()), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(SamplerOptions { temp: 5.0, top_k: 1, seed: Some(7), ..Default::default() });
        for _ in 0..50 {
            assert_eq!(s.sample(&logits()), 1);
        }
    }

    #[test]
    fn top_k_restricts_the_candidates() {
        let mut s = Sampler::new(SamplerOptions {
            temp: 10.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..200 {
            let t = s.sample(&logits());
            assert!(t == 1 || t == 4, "sampled {t}");
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // Relative to the best (logit 3.0): p ∝ e^(l - 3), so min_p 0.2 keeps 3.0, 2.9 and 2.0 (e^-1 ≈ 0.37)
        // and drops 1.0 (e^-2 ≈ 0.14), 0.5 and -1.0.
        let mut s = Sampler::new(SamplerOptions {
            temp: 100.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
            seed: Some(3),
            ..Default::default()
        });
        for _ in 0..300 {
            let t = s.sample(&logits());
            assert!([1, 2, 4].contains(&t), "sampled {t}");
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let run = |seed| {
            let mut s = Sampler::new(SamplerOptions {
                temp: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: Some(seed),
                ..Default::default()
            });
            (0..32).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut s = Sampler::new(SamplerOptions { temp: 0.0, repeat_penalty: 1.5, ..SamplerOptions::greedy() });
        s.accept(1);
        // 3.0 / 1.5 = 2.0 < 2.9
        assert_eq!(s.sample(&logits()), 4);
        // Once per distinct token, as llama.cpp: twice in the window is still 3.0 / 1.5.
        // 3.0 / 1.02 = 2.94 > 2.9 (twice would be 3.0 / 1.02^2 = 2.88 < 2.9).
        let mut s = Sampler::new(SamplerOptions { repeat_penalty: 1.02, ..SamplerOptions::greedy() });
        s.accept(1);
        s.accept(1);
        assert_eq!(s.sample(&logits()), 1);
    }

    #[test]
    fn presence_and_frequency_penalties_subtract() {
        let greedy = |presence, frequency, recent: &[u32]| {
            let mut s = Sampler::new(SamplerOptions {
                presence_penalty: presence,
                frequency_penalty: frequency,
                ..SamplerOptions::greedy()
            });
            recent.iter().for_each(|&t| s.accept(t));
            s.sample(&logits())
        };
        assert_eq!(greedy(0.0, 0.0, &[1, 1]), 1);
        // 3.0 - 0.2 = 2.8 < 2.9.
        assert_eq!(greedy(0.2, 0.0, &[1, 1]), 4);
        // 3.0 - 2 x 0.06 = 2.88 < 2.9; one occurrence: 2.94 > 2.9.
        assert_eq!(greedy(0.0, 0.06, &[1, 1]), 4);
        assert_eq!(greedy(0.0, 0.06, &[1]), 1);
        // A negative presence penalty promotes: 2.0 + 1.5 = 3.5 > 3.0.
        assert_eq!(greedy(-1.5, 0.0, &[2]), 2);
    }
}
