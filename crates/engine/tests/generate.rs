//! The generation step ([`Generator`]) and [`generate`] on the real SmolLM2-135M tokenizer and
//! model, against their specification: what a stream hands out (every piece whole UTF-8, together
//! the text; the text the tokens' decoding cut before the first stop string; each end for its
//! reason) and where `generate` leaves the KV cache. generate/steps.rs checks the rules one at a
//! time on hand-picked streams; sampler_spec.rs the sampler's draws.

use sift_engine::generate::{drive, generate, held_back, GenerateOptions, Generator, StopReason};
use sift_engine::{Engine, EngineOptions, SamplerOptions};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
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

/// [`drive`] — `generate`'s own loop — on the Generator with the sampled tokens given: running out
/// of them stands for a full context. `on_text` returns `false` on call `cancel_at`.
fn stream(ids: &[u32], opts: &GenerateOptions, cancel_at: Option<usize>) -> Run {
    let mut pieces = Vec::new();
    let on_text = |s: &str| {
        pieces.push(s.to_string());
        Some(pieces.len() - 1) != cancel_at
    };
    let mut g = Generator::new(opts, &[]);
    let mut rest = ids[1..].iter().copied();
    let stop = drive(&mut g, tok(), ids[0], on_text, |_, _| Ok::<_, ()>(rest.next())).unwrap();
    Run { pieces, tokens: g.tokens().to_vec(), text: g.text().to_string(), stop }
}

/// Checks a finished generation against the specification, given the tokens `fed` to it (the
/// sampled ones, in order) and how it was asked to run; returns the stop string's index when one
/// ended it.
fn check_run(run: &Run, fed: &[u32], o: &GenerateOptions, cancel_at: Option<usize>, what: &str) {
    let tok = tok();
    let ended_by_eos = |t: u32| !o.ignore_eos && tok.is_eog(t);
    // The tokens are the ones fed, in order, up to the end (an ending EOS not among them).
    assert!(fed.starts_with(&run.tokens), "{what}: tokens {:?} are not a prefix of {fed:?}", run.tokens);
    assert!(!run.tokens.iter().any(|&t| ended_by_eos(t)), "{what}: an EOS among the tokens");
    assert!(run.pieces.iter().all(|p| !p.is_empty()), "{what}: an empty piece");
    let decoded = tok.decode(&run.tokens, true);
    let first_stop = |text: &str| o.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min();
    // The text is the tokens' decoding, cut before the first stop string: a stop string ends
    // the generation on the token that completes it (or the piece before it was refused).
    match first_stop(&decoded) {
        Some(cut) => {
            assert_eq!(run.text, decoded[..cut], "{what}: the text is the decoding cut at the stop string");
            assert!(matches!(run.stop, StopReason::StopString | StopReason::Cancelled), "{what}: {:?}", run.stop);
            let before = tok.decode(&run.tokens[..run.tokens.len() - 1], true);
            assert!(first_stop(&before).is_none(), "{what}: a stop string one token earlier");
        }
        None => {
            assert_eq!(run.text, decoded, "{what}: the text is the tokens' decoding");
            assert_ne!(run.stop, StopReason::StopString, "{what}");
        }
    }
    // Each end for its reason.
    let n = run.tokens.len();
    match run.stop {
        StopReason::Length => assert_eq!(Some(n), o.n_predict, "{what}: ended at the limit"),
        StopReason::Eos => assert!(ended_by_eos(fed[n]), "{what}: ended on {} after the tokens", fed[n]),
        StopReason::ContextFull => assert_eq!(n, fed.len(), "{what}: the context is full when the tokens run out"),
        StopReason::StopString | StopReason::Cancelled => {}
    }
    // What was handed out makes the text; cancelled, it stops at the refused piece (and the
    // decoder's rest, handed out at the end).
    assert_eq!(run.pieces.concat(), run.text, "{what}: the pieces make the text");
    if run.stop == StopReason::Cancelled {
        let refused = cancel_at.expect("cancelled only when asked");
        assert!((refused + 1..=refused + 2).contains(&run.pieces.len()), "{what}: {:?}", run.pieces);
    }
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

/// For random token streams (multi-byte characters split across tokens, EOS in the middle), stop
/// strings (matching across tokens, or only their prefixes), limits and cancellations, the
/// Generator hands out what the specification says (see [`check_run`]).
#[test]
fn generator_streams_follow_the_specification() {
    let mut rng = Rng(7);
    let mut ends = std::collections::HashMap::new();
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
        let run = stream(&ids, &o, cancel_at);
        let what =
            format!("ids {ids:?} stop {stop:?} n_predict {n_predict:?} ignore_eos {ignore_eos} cancel {cancel_at:?}");
        check_run(&run, &ids, &o, cancel_at, &what);
        *ends.entry(format!("{:?}", run.stop)).or_insert(0) += 1;
    }
    // Every end is reached, stop strings often.
    for (end, min) in [("StopString", 200), ("Eos", 50), ("Length", 50), ("ContextFull", 50), ("Cancelled", 50)] {
        assert!(ends.get(end).copied().unwrap_or(0) >= min, "{end}: {ends:?}");
    }
}

/// `generate` on the real model: the specification of [`check_run`] on what the model sampled,
/// for greedy and seeded sampling at temperature 0.8 (llama.cpp's defaults), penalties, stop
/// strings, EOS, ignore-eos, a full context and a cancelling callback; the same seed gives the
/// same tokens and another seed others; the KV cache holds the prompt and every token fed back
/// (the last sampled one is not, unless the limit or EOS came after it was fed).
#[test]
fn generate_on_the_real_model_follows_the_specification() {
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
    let penalties = SamplerOptions { repeat_penalty: 1.3, presence_penalty: 0.5, frequency_penalty: 0.2, ..seeded(3) };
    let mut cases = vec![
        case("greedy", &story[..], g(Some(32), &[], false, &greedy), Some(StopReason::Length)),
        case("temp 0.8 seed 42", &story[..], g(Some(48), &[], false, &seeded(42)), Some(StopReason::Length)),
        case("temp 0.8 seed 7", &story[..], g(Some(48), &[], false, &seeded(7)), Some(StopReason::Length)),
        case("penalties", &story[..], g(Some(40), &[], false, &penalties), Some(StopReason::Length)),
        case("no penalties", &story[..], g(Some(40), &[], false, &seeded(3)), Some(StopReason::Length)),
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
    let mut tokens_of = std::collections::HashMap::new();
    for c in &cases {
        let engine = if c.small { &mut small } else { &mut big };
        let mut runs = Vec::new();
        for _ in 0..2 {
            engine.truncate(0);
            let mut pieces = Vec::new();
            let got = generate(engine, tok, c.prompt, &c.opts, |s| {
                pieces.push(s.to_string());
                Some(pieces.len() - 1) != c.cancel_at
            })
            .unwrap();
            assert_eq!((got.n_gen, got.n_prompt), (got.tokens.len(), c.prompt.len()), "{}", c.name);
            runs.push((Run { pieces, tokens: got.tokens, text: got.text, stop: got.stop }, engine.n_past()));
        }
        let (run, n_past) = &runs[0];
        assert_eq!(runs[0], runs[1], "{}: the same seed, the same generation", c.name);
        if let Some(e) = c.expect {
            assert_eq!(run.stop, e, "{}: {:?}", c.name, run.text);
        }
        // What was fed back: the tokens, and the ending EOS as the next sampled one.
        let mut fed = run.tokens.clone();
        if run.stop == StopReason::Eos {
            fed.push(eos());
        }
        check_run(run, &fed, &c.opts, c.cancel_at, c.name);
        let n = c.prompt.len() + run.tokens.len();
        let want_past = match run.stop {
            StopReason::Length | StopReason::Eos => n,
            StopReason::StopString | StopReason::Cancelled => n - 1,
            StopReason::ContextFull => engine.n_ctx(),
        };
        assert_eq!(*n_past, want_past, "{}: KV cache length", c.name);
        tokens_of.insert(c.name, run.tokens.clone());
        eprintln!("{}: {:?} {} tokens {:?}", c.name, run.stop, run.tokens.len(), run.text);
    }
    assert_ne!(tokens_of["temp 0.8 seed 42"], tokens_of["temp 0.8 seed 7"], "another seed, other tokens");
    assert_ne!(tokens_of["penalties"], tokens_of["no penalties"], "the penalties change the draws");
    assert_ne!(tokens_of["greedy"], tokens_of["temp 0.8 seed 42"], "sampling is not greedy");
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
