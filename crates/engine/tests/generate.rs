//! The generation step ([`Generator`]) and [`generate`] on the real SmolLM2-135M tokenizer and
//! model, against the code they replaced.
//!
//! The references below are copies of that code as it was before the generation step was shared
//! (issue: one generation-step API): `generate`'s loop and its sampler, and the server worker's
//! loop (`choice`), engine-free where the engine does not matter (the tokens are given).

use sift_engine::generate::{generate, held_back, GenerateOptions, Generator, StopReason};
use sift_engine::{Engine, EngineOptions, SamplerOptions};
use sift_model::tokenizer::{StreamDecoder, Tokenizer};
use sift_model::Model;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::OnceLock;

#[path = "generate/steps.rs"]
mod steps;

fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let f = sift_gguf::GgufFile::open(model_path()).expect("open gguf");
        Tokenizer::from_gguf(&f.gguf).expect("tokenizer")
    })
}

fn eos() -> u32 {
    tok().eos().expect("eos id")
}

fn ids(text: &str) -> Vec<u32> {
    tok().encode(text, false, true).expect("encode")
}

fn opts(stop: &[&str], n_predict: Option<usize>, ignore_eos: bool) -> GenerateOptions {
    GenerateOptions {
        n_predict,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        ignore_eos,
        sampler: SamplerOptions::greedy(),
    }
}

/// What a generation handed out, and how it ended.
#[derive(Debug, PartialEq)]
struct Run {
    pieces: Vec<String>,
    tokens: Vec<u32>,
    text: String,
    stop: StopReason,
}

/// The text handling of `generate` before the Generator (copied), with the sampled tokens given:
/// running out of them stands for a full context. `on_text` returns `false` on call `cancel_at`.
fn old_stream(ids: &[u32], opts: &GenerateOptions, cancel_at: Option<usize>) -> Run {
    let tok = tok();
    let mut pieces = Vec::new();
    let mut on_text = |s: &str| {
        pieces.push(s.to_string());
        Some(pieces.len() - 1) != cancel_at
    };
    let mut it = ids.iter().copied();
    let mut next = it.next().unwrap();
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
        if let Some(piece) = dec.push(tok, next) {
            text.push_str(&piece);
        }
        if let Some(cut) = opts.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            if emitted < text.len() && !on_text(&text[emitted..]) {
                break StopReason::Cancelled;
            }
            emitted = text.len();
            break StopReason::StopString;
        }
        let safe = text.len() - old_held_back(&text, &opts.stop);
        if safe > emitted {
            let cont = on_text(&text[emitted..safe]);
            emitted = safe;
            if !cont {
                break StopReason::Cancelled;
            }
        }
        match it.next() {
            Some(t) => next = t,
            None => break StopReason::ContextFull,
        }
    };
    if stop != StopReason::StopString {
        if let Some(rest) = dec.flush() {
            text.push_str(&rest);
        }
        if emitted < text.len() {
            on_text(&text[emitted..]);
        }
    }
    Run { pieces, tokens: out, text, stop }
}

fn old_held_back(text: &str, stops: &[String]) -> usize {
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

/// `generate`'s loop as it is now (on the Generator), with the sampled tokens given.
fn new_stream(ids: &[u32], opts: &GenerateOptions, cancel_at: Option<usize>) -> (Run, Generator) {
    let tok = tok();
    let mut pieces = Vec::new();
    let mut on_text = |s: &str| {
        pieces.push(s.to_string());
        Some(pieces.len() - 1) != cancel_at
    };
    let mut g = Generator::new(opts, &[]);
    let mut it = ids.iter().copied();
    let mut next = it.next().unwrap();
    let stop = loop {
        if g.limit_reached() {
            break StopReason::Length;
        }
        let step = g.push(tok, next);
        if !step.text.is_empty() && !on_text(&step.text) {
            break StopReason::Cancelled;
        }
        if let Some(end) = step.end {
            break end;
        }
        match it.next() {
            Some(t) => next = t,
            None => break StopReason::ContextFull,
        }
    };
    let rest = g.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    (Run { pieces, tokens: g.tokens().to_vec(), text: g.text().to_string(), stop }, g)
}

/// One event of the server worker: streamed text with the log-probabilities pending (here the
/// ids they are for), or the end.
#[derive(Debug, PartialEq)]
enum Event {
    Text(String, Vec<u32>),
    Done(&'static str, usize),
}

/// The server worker's loop (`choice`) before the Generator (copied), with the sampled tokens
/// given (running out of them stands for a full context) and logprobs on. `send` fails from call
/// `cancel_at` on; `Err` is the worker's `Stop::Cancelled`.
fn old_worker(
    ids: &[u32],
    stop: &[String],
    max: usize,
    ignore_eos: bool,
    cancel_at: Option<usize>,
) -> Result<Vec<Event>, Vec<Event>> {
    let tok = tok();
    let mut events = Vec::new();
    let send = |events: &mut Vec<Event>, text: &str, lps: &mut Vec<u32>| {
        if Some(events.len()) >= cancel_at && cancel_at.is_some() {
            return false;
        }
        events.push(Event::Text(text.to_string(), std::mem::take(lps)));
        true
    };
    let mut it = ids.iter().copied();
    let mut dec = StreamDecoder::new();
    let mut text = String::new();
    let mut emitted = 0usize;
    let mut pending: Vec<u32> = Vec::new();
    let mut n_gen = 0usize;
    let mut hit_stop = false;
    let finish = loop {
        if n_gen >= max {
            break "length";
        }
        let next = it.next().unwrap();
        pending.push(next);
        n_gen += 1;
        if !ignore_eos && tok.is_eog(next) {
            break "stop";
        }
        if let Some(piece) = dec.push(tok, next) {
            text.push_str(&piece);
        }
        if let Some(cut) = stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            if emitted < text.len() || !pending.is_empty() {
                send(&mut events, &text[emitted..], &mut pending);
            }
            emitted = text.len();
            hit_stop = true;
            break "stop";
        }
        let safe = text.len() - old_held_back(&text, stop);
        if safe > emitted {
            if !send(&mut events, &text[emitted..safe], &mut pending) {
                return Err(events);
            }
            emitted = safe;
        }
        if it.len() == 0 {
            break "length";
        }
    };
    if emitted < text.len() || dec.has_pending() || !pending.is_empty() {
        let mut rest = text[emitted..].to_string();
        if !hit_stop {
            if let Some(r) = dec.flush() {
                rest.push_str(&r);
            }
        }
        if (!rest.is_empty() || !pending.is_empty()) && !send(&mut events, &rest, &mut pending) {
            return Err(events);
        }
    }
    if Some(events.len()) >= cancel_at && cancel_at.is_some() {
        return Err(events);
    }
    events.push(Event::Done(finish, n_gen));
    Ok(events)
}

/// The worker's loop on the Generator, as the report proposes it (same arguments as
/// [`old_worker`]).
fn new_worker(
    ids: &[u32],
    stop: &[String],
    max: usize,
    ignore_eos: bool,
    cancel_at: Option<usize>,
) -> Result<Vec<Event>, Vec<Event>> {
    let tok = tok();
    let mut events = Vec::new();
    let send = |events: &mut Vec<Event>, text: &str, lps: &mut Vec<u32>| {
        if Some(events.len()) >= cancel_at && cancel_at.is_some() {
            return false;
        }
        events.push(Event::Text(text.to_string(), std::mem::take(lps)));
        true
    };
    let opts =
        GenerateOptions { n_predict: Some(max), stop: stop.to_vec(), ignore_eos, sampler: SamplerOptions::greedy() };
    let mut g = Generator::new(&opts, &[]);
    let mut it = ids.iter().copied();
    let mut pending: Vec<u32> = Vec::new();
    let (finish, mut tail) = loop {
        if g.limit_reached() {
            break ("length", String::new());
        }
        // let next = g.sample(&self.logits); pending logprob from self.logits
        let next = it.next().unwrap();
        pending.push(next);
        let step = g.push(tok, next);
        if step.end.is_some() {
            break ("stop", step.text);
        }
        if !step.text.is_empty() && !send(&mut events, &step.text, &mut pending) {
            return Err(events);
        }
        if it.len() == 0 {
            break ("length", String::new());
        }
    };
    tail.push_str(&g.finish());
    if (!tail.is_empty() || !pending.is_empty()) && !send(&mut events, &tail, &mut pending) {
        return Err(events);
    }
    if Some(events.len()) >= cancel_at && cancel_at.is_some() {
        return Err(events);
    }
    events.push(Event::Done(finish, g.n_sampled()));
    Ok(events)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const TEXTS: &[&str] = &[
    "Hello User: how are you? User: fine.\nAssistant: ok </s> done",
    "Grüße aus Köln — 世界你好！ こんにちは。 😀👍🏽 Привет, мир! ¿Qué tal?",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n### End\n\n### Next",
    "The quick brown fox jumps over the lazy dog. The end. THE END.",
    "🧑‍🤝‍🧑 family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 with ZWJ\u{200d} and NBSP\u{a0}here",
];

/// A random stop string: a substring of `text` (so it matches, maybe across tokens), or one
/// that does not match but whose prefixes do (held back, then released).
fn random_stop(rng: &mut Rng, text: &str) -> String {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let a = rng.below(chars.len());
    let len = 1 + rng.below(6);
    let b = (a + len).min(chars.len());
    let end = chars.get(b).map_or(text.len(), |c| c.0);
    let s = &text[chars[a].0..end];
    match rng.below(3) {
        0 => format!("{s}\u{1}"),
        _ => s.to_string(),
    }
}

/// The Generator streams exactly what `generate` streamed before, for random token streams
/// (multi-byte characters split across tokens, EOS in the middle), stop strings, limits and
/// cancellations; and the worker sketch sends exactly the worker's events.
#[test]
fn generator_streams_what_the_old_loops_streamed() {
    let mut rng = Rng(7);
    let mut cases = 0;
    let mut stop_hits = 0;
    let mut held = 0;
    let mut cancelled_at_stop = 0;
    for round in 0..1500 {
        let text = TEXTS[round % TEXTS.len()];
        let mut ids = ids(text);
        if rng.below(3) == 0 {
            let at = rng.below(ids.len());
            ids.insert(at, eos());
        }
        let n_stop = rng.below(4);
        let stop: Vec<String> = (0..n_stop).map(|_| random_stop(&mut rng, text)).collect();
        let n_predict = match rng.below(3) {
            0 => Some(rng.below(ids.len() + 2)),
            _ => None,
        };
        let ignore_eos = rng.below(4) == 0;
        let cancel_at = if rng.below(4) == 0 { Some(rng.below(8)) } else { None };
        let o = GenerateOptions { n_predict, stop: stop.clone(), ignore_eos, sampler: SamplerOptions::greedy() };

        let old = old_stream(&ids, &o, cancel_at);
        let (new, g) = new_stream(&ids, &o, cancel_at);
        if old.stop == StopReason::Cancelled && g.ended() == Some(StopReason::StopString) {
            // The one change: cancelled on the piece before a stop string, the old loop handed
            // that piece out again (and the decoder's rest); the Generator does not.
            cancelled_at_stop += 1;
            assert_eq!(new.tokens, old.tokens);
            assert_eq!(new.stop, old.stop);
            assert_eq!(&old.pieces[..new.pieces.len()], &new.pieces[..]);
            assert!(old.text.starts_with(&new.text));
        } else {
            assert_eq!(
                new, old,
                "ids {ids:?} stop {stop:?} n_predict {n_predict:?} ignore_eos {ignore_eos} cancel {cancel_at:?}"
            );
        }
        stop_hits += usize::from(old.stop == StopReason::StopString);
        held += usize::from(new.pieces.iter().map(|p| p.len()).sum::<usize>() > 0 && !stop.is_empty());

        let max = n_predict.unwrap_or(ids.len() + 5);
        let stop_w: Vec<String> = stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        assert_eq!(
            new_worker(&ids, &stop_w, max, ignore_eos, cancel_at),
            old_worker(&ids, &stop_w, max, ignore_eos, cancel_at),
            "worker: ids {ids:?} stop {stop:?} max {max} ignore_eos {ignore_eos} cancel {cancel_at:?}"
        );
        cases += 1;
    }
    assert_eq!(cases, 1500);
    assert!(stop_hits > 200, "only {stop_hits} stop-string hits");
    assert!(held > 100);
    assert!(cancelled_at_stop < 100, "{cancelled_at_stop}");
}

// --- generate() on the real model against the old loop and the old sampler ---

/// The sampler before it became a chain (copied verbatim).
struct OldSampler {
    opts: SamplerOptions,
    rng: u64,
    recent: VecDeque<u32>,
    cand: Vec<(u32, f32)>,
}

impl OldSampler {
    fn new(opts: SamplerOptions) -> OldSampler {
        OldSampler { rng: opts.seed.unwrap(), opts, recent: VecDeque::new(), cand: Vec::new() }
    }

    fn next_f32(&mut self) -> f32 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
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
        let o = self.opts.clone();
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
            return sift_engine::sampling::argmax(&self.cand);
        }
        let mut c = std::mem::take(&mut self.cand);
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
        let total: f32 = w.iter().sum();
        let mut r = self.next_f32() * total;
        let mut pick = c[c.len() - 1].0;
        for (i, wi) in w.iter().enumerate() {
            r -= wi;
            if r <= 0.0 {
                pick = c[i].0;
                break;
            }
        }
        self.cand = c;
        pick
    }
}

/// `generate` before the Generator (copied, with the old sampler).
fn old_generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str) -> bool,
) -> (Vec<u32>, String, StopReason) {
    let mut sampler = OldSampler::new(opts.sampler.clone());
    for &t in prompt {
        sampler.accept(t);
    }
    let mut next = sampler.sample(engine.eval(prompt, sift_engine::Logits::Last).unwrap());
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
        if let Some(cut) = opts.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            if emitted < text.len() && !on_text(&text[emitted..]) {
                break StopReason::Cancelled;
            }
            emitted = text.len();
            break StopReason::StopString;
        }
        let safe = text.len() - old_held_back(&text, &opts.stop);
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
        next = sampler.sample(engine.eval(&[next], sift_engine::Logits::Last).unwrap());
    };
    if stop != StopReason::StopString {
        if let Some(rest) = dec.flush() {
            text.push_str(&rest);
        }
        if emitted < text.len() {
            on_text(&text[emitted..]);
        }
    }
    (out, text, stop)
}

/// `generate` gives the same tokens, text, pieces, stop reason and KV cache length as the old
/// loop with the old sampler: greedy, seeded sampling at temperature 0.8 (llama.cpp's defaults),
/// penalties, stop strings, EOS, ignore-eos, a full context and a cancelling callback.
#[test]
fn generate_matches_the_old_loop_on_the_real_model() {
    let model = |n_ctx| {
        Engine::new(
            Model::load(model_path()).expect("load model"),
            &EngineOptions { n_threads: 2, n_ctx, n_batch: 512, ..EngineOptions::default() },
        )
    };
    let mut big = model(512);
    let mut small = model(40);
    let tok = tok();
    let story = ids("Once upon a time, in a small village,");
    let chat = ids("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n");
    let seeded = |seed| SamplerOptions { seed: Some(seed), ..SamplerOptions::default() };
    let greedy = SamplerOptions { seed: Some(0), ..SamplerOptions::greedy() };
    let g = |n: Option<usize>, stop: &[&str], ignore_eos, sampler: &SamplerOptions| GenerateOptions {
        n_predict: n,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        ignore_eos,
        sampler: sampler.clone(),
    };
    struct Case<'a> {
        name: &'a str,
        prompt: &'a [u32],
        opts: GenerateOptions,
        small: bool,
        cancel_at: Option<usize>,
        expect: Option<StopReason>,
    }
    let case = |name, prompt, opts, expect| Case { name, prompt, opts, small: false, cancel_at: None, expect };
    let mut cases = vec![
        case("greedy", &story[..], g(Some(32), &[], false, &greedy), Some(StopReason::Length)),
        case("temp 0.8 seed 42", &story[..], g(Some(48), &[], false, &seeded(42)), Some(StopReason::Length)),
        case("temp 0.8 seed 7", &story[..], g(Some(48), &[], false, &seeded(7)), Some(StopReason::Length)),
        case(
            "penalties",
            &story[..],
            g(
                Some(40),
                &[],
                false,
                &SamplerOptions { repeat_penalty: 1.3, presence_penalty: 0.5, frequency_penalty: 0.2, ..seeded(3) },
            ),
            Some(StopReason::Length),
        ),
        case("chat greedy eos", &chat[..], g(Some(100), &[], false, &greedy), Some(StopReason::Eos)),
        case("chat seeded", &chat[..], g(Some(100), &[], false, &seeded(11)), None),
        case("chat ignore eos", &chat[..], g(Some(30), &[], true, &greedy), Some(StopReason::Length)),
        case("stop string", &story[..], g(Some(64), &["named E", "zzz"], false, &greedy), Some(StopReason::StopString)),
        case("stop not hit", &story[..], g(Some(24), &["zzz", "xylophone"], false, &seeded(5)), None),
    ];
    cases.push(Case {
        small: true,
        ..case("context full", &story[..], g(None, &[], true, &seeded(9)), Some(StopReason::ContextFull))
    });
    cases.push(Case {
        cancel_at: Some(4),
        ..case("cancelled", &story[..], g(Some(40), &[], false, &seeded(1)), Some(StopReason::Cancelled))
    });
    for c in &cases {
        let engine = if c.small { &mut small } else { &mut big };
        engine.truncate(0);
        let mut old_pieces = Vec::new();
        let (tokens, text, stop) = old_generate(engine, tok, c.prompt, &c.opts, |s| {
            old_pieces.push(s.to_string());
            Some(old_pieces.len() - 1) != c.cancel_at
        });
        let old_past = engine.n_past();
        engine.truncate(0);
        let mut pieces = Vec::new();
        let got = generate(engine, tok, c.prompt, &c.opts, |s| {
            pieces.push(s.to_string());
            Some(pieces.len() - 1) != c.cancel_at
        })
        .unwrap();
        assert_eq!(got.tokens, tokens, "{}", c.name);
        assert_eq!(got.text, text, "{}", c.name);
        assert_eq!(got.stop, stop, "{}", c.name);
        assert_eq!(pieces, old_pieces, "{}", c.name);
        assert_eq!(got.n_gen, tokens.len(), "{}", c.name);
        assert_eq!(got.n_prompt, c.prompt.len(), "{}", c.name);
        assert_eq!(engine.n_past(), old_past, "{}: KV cache length", c.name);
        if let Some(e) = c.expect {
            assert_eq!(got.stop, e, "{}: {:?}", c.name, got.text);
        }
        assert_eq!(pieces.concat(), got.text, "{}", c.name);
        eprintln!("{}: {:?} {} tokens {:?}", c.name, got.stop, got.n_gen, got.text);
    }
}

/// Greedy `generate` with EOS ignored gives the ids of a plain argmax loop on the prompts of
/// tests/fixtures/greedy.json, and llama.cpp's own ids where that loop does (see reference.rs for
/// the near ties where they part).
#[test]
fn generate_greedy_is_the_argmax_loop_on_the_llama_cpp_fixture() {
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/greedy.json"))
            .unwrap(),
    )
    .unwrap();
    let mut engine = Engine::new(
        Model::load(model_path()).expect("load model"),
        &EngineOptions { n_threads: 2, n_ctx: 512, n_batch: 512, ..EngineOptions::default() },
    );
    let ids =
        |v: &serde_json::Value| v.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    let mut as_llama = 0;
    for run in fixture["runs"].as_array().unwrap() {
        let prompt = ids(&run["prompt_tokens"]);
        let want = ids(&run["generated"]);
        engine.truncate(0);
        let mut argmax = Vec::new();
        let mut next = sift_engine::sampling::argmax_logits(engine.eval(&prompt, sift_engine::Logits::Last).unwrap());
        for _ in 0..want.len() {
            argmax.push(next);
            next = sift_engine::sampling::argmax_logits(engine.eval(&[next], sift_engine::Logits::Last).unwrap());
        }
        engine.truncate(0);
        let o = GenerateOptions { n_predict: Some(want.len()), ..opts(&[], None, true) };
        let got = generate(&mut engine, tok(), &prompt, &o, |_| true).unwrap();
        assert_eq!(got.tokens, argmax, "{}", run["name"]);
        assert_eq!(got.stop, StopReason::Length);
        as_llama += usize::from(got.tokens == want);
    }
    assert!(as_llama >= 2, "only {as_llama} runs equal llama.cpp's");
}
