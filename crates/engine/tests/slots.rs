//! Parallel sequences (`Engine::set_slots`, `Engine::eval_slots`) on the real SmolLM2-135M: a
//! batch of several sequences, joining at different steps with prompts in chunks while the others
//! decode, gives every sequence the logits it gets alone, bit for bit (dense, and Top-K 0.5 on
//! masked rows, and on a pack's columns); selectors with per-sequence state are refused; slots
//! keep their own caches.

use sift_engine::sparsity::{build_selector, Method, Ratios, SparsityConfig};
use sift_engine::{Engine, EngineOptions, Logits, SlotRun, SlotsMode};
use sift_model::tokenizer::Tokenizer;
use sift_store::{pack_model, ColPolicy, PackOptions};
use std::path::PathBuf;

fn gguf() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

fn engine() -> (Engine, Tokenizer) {
    engine_on(&gguf())
}

/// The model packed (in this test binary's folder under target/tmp, re-used by every run).
fn pack() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("engine-slots");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smol.sift");
    let opts = PackOptions { cols: ColPolicy::Auto, group: 4, ..PackOptions::default() };
    pack_model(&gguf(), &out, &opts, |_| {}).unwrap();
    out
}

fn engine_on(p: &std::path::Path) -> (Engine, Tokenizer) {
    let model = sift_store::open_model(p).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.gguf).expect("tokenizer");
    let opts = EngineOptions { n_threads: 2, n_ctx: 1024, n_batch: 64, ..Default::default() };
    (Engine::new(model, &opts), tok)
}

fn selector(e: &mut Engine, method: Method, ratio: f64) {
    let cfg = SparsityConfig {
        method,
        ratios: Ratios::uniform(method, e.config().n_layer, ratio).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    let s = build_selector(&cfg, e.site_dims(), None).unwrap();
    e.set_selector(s);
}

const PROMPTS: [&str; 3] = [
    "The history of the Roman Empire begins with",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to",
    "def fibonacci(n):",
];
const CHUNK: usize = 8;
const DECODE: usize = 6;

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a))).unwrap() as u32
}

/// One sequence alone: the prompt in chunks of CHUNK tokens (none of one token), then greedy
/// decoding; the logits after each chunk that ends the prompt and after each decoded token.
fn alone(e: &mut Engine, prompt: &[u32]) -> Vec<Vec<f32>> {
    e.truncate(0);
    let mut out = Vec::new();
    let mut last = Vec::new();
    for c in chunks(prompt.len()) {
        last = e.eval(&prompt[c], Logits::Last).unwrap().to_vec();
    }
    out.push(last.clone());
    for _ in 0..DECODE {
        let t = argmax(&last);
        last = e.eval(&[t], Logits::Last).unwrap().to_vec();
        out.push(last.clone());
    }
    out
}

fn chunks(n: usize) -> Vec<std::ops::Range<usize>> {
    let mut v = Vec::new();
    let mut s = 0;
    while s < n {
        let mut len = CHUNK.min(n - s);
        if n - s - len == 1 {
            len -= 1;
        }
        v.push(s..s + len);
        s += len;
    }
    v
}

/// The same sequences as parallel slots: sequence i joins at step i; every step runs one chunk
/// of each prompt still being read and one token of each sequence decoding.
fn together(e: &mut Engine, prompts: &[Vec<u32>]) -> Vec<Vec<Vec<f32>>> {
    let n = prompts.len();
    let mut out = vec![Vec::new(); n];
    let mut pending: Vec<Vec<std::ops::Range<usize>>> = prompts.iter().map(|p| chunks(p.len())).collect();
    let mut next: Vec<Option<u32>> = vec![None; n];
    for step in 0.. {
        let mut runs = Vec::new();
        let mut toks: Vec<Vec<u32>> = Vec::new();
        let mut who = Vec::new();
        for i in 0..n.min(step + 1) {
            if !pending[i].is_empty() {
                let c = pending[i].remove(0);
                toks.push(prompts[i][c].to_vec());
                who.push((i, pending[i].is_empty()));
            } else if out[i].len() <= DECODE {
                toks.push(vec![next[i].unwrap()]);
                who.push((i, true));
            }
        }
        if toks.is_empty() {
            break;
        }
        for (t, &(i, want)) in toks.iter().zip(&who) {
            runs.push(SlotRun {
                slot: i,
                tokens: t,
                logits: if want { Logits::Last } else { Logits::None },
                prompt_end: None,
            });
        }
        let logits = e.eval_slots(&runs).unwrap().to_vec();
        let nv = e.config().n_vocab;
        let mut rows = logits.chunks(nv);
        for &(i, want) in &who {
            if want {
                let row = rows.next().unwrap().to_vec();
                next[i] = Some(argmax(&row));
                out[i].push(row);
            }
        }
        assert!(rows.next().is_none());
    }
    out
}

fn check(method: Option<(Method, f64)>, on: &std::path::Path, mode: SlotsMode) {
    let (mut e, tok) = engine_on(on);
    if let Some((m, r)) = method {
        selector(&mut e, m, r);
    }
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true, false).unwrap()).collect();
    let solo: Vec<_> = prompts.iter().map(|p| alone(&mut e, p)).collect();
    e.truncate(0);
    e.set_slots(3).unwrap();
    assert_eq!(e.n_slots(), 3);
    assert_eq!(e.n_ctx(), 1024 / 3);
    assert_eq!(e.slots_mode(), mode);
    let both = together(&mut e, &prompts);
    for (i, (a, b)) in solo.iter().zip(&both).enumerate() {
        assert_eq!(a.len(), b.len(), "sequence {i}");
        for (s, (x, y)) in a.iter().zip(b).enumerate() {
            let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "sequence {i} step {s}: the batch's logits differ from the sequence's alone");
        }
        assert_eq!(e.slot_n_past(i), prompts[i].len() + DECODE, "sequence {i}'s cache");
    }
    if mode == SlotsMode::RowByRow {
        // The union of the decoding sequences' active units, as reported: between one token's
        // units (the same choices) and k times them (disjoint ones).
        let u = e.sparsity_stats().batch_union;
        assert!(u[0].site_visits > 0 && u[1].site_visits > 0, "{u:?}");
        for (k, b) in [(2, u[0]), (3, u[1])] {
            let r = b.union_over_one(k);
            assert!(r > 1.0 && r <= k as f64, "{k} sequences: union {r:.2} x one token's");
        }
        assert!(u[1].union_over_one(3) > u[0].union_over_one(2), "the union grows with the sequences: {u:?}");
    }
    // The sequences' texts differ: each run attended over its own cache.
    let texts: Vec<u32> = solo.iter().map(|s| argmax(&s[0])).collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "three prompts, one continuation: {texts:?}");
    // A slot cleared starts over while the others keep theirs.
    e.use_slot(1);
    e.truncate(0);
    assert_eq!((e.slot_n_past(0), e.slot_n_past(1)), (prompts[0].len() + DECODE, 0));
    let again = alone(&mut e, &prompts[1]);
    assert!(again[0].iter().zip(&solo[1][0]).all(|(p, q)| p.to_bits() == q.to_bits()));
}

#[test]
fn parallel_sequences_give_what_each_gives_alone_dense() {
    check(None, &gguf(), SlotsMode::Batch);
}

#[test]
fn parallel_sequences_give_what_each_gives_alone_topk() {
    check(Some((Method::TopK, 0.5)), &gguf(), SlotsMode::Batch);
}

/// On a pack a lone token's Top-K products run on its active columns: the decoding sequences
/// share the layers' passes, each token on its own columns (and dense, the rows, in one batch).
#[test]
fn parallel_sequences_on_a_pack_give_what_each_gives_alone() {
    let pack = pack();
    check(Some((Method::TopK, 0.5)), &pack, SlotsMode::RowByRow);
    check(Some((Method::Dip, 0.5)), &pack, SlotsMode::RowByRow);
    // Gate first: each row's own neurons, down on the pack's columns.
    check(Some((Method::Cats, 0.5)), &pack, SlotsMode::RowByRow);
    check(None, &pack, SlotsMode::Batch);
}

#[test]
fn parallel_sequences_refuse_what_cannot_share() {
    let (mut e, _) = engine();
    selector(&mut e, Method::Core, 0.4);
    let err = e.set_slots(4).unwrap_err();
    assert!(err.contains("per sequence"), "{err}");
    assert_eq!(e.n_slots(), 1);
    let (mut e, _) = engine();
    assert!(e.set_slots(0).is_err());
    assert!(e.set_slots(1000).is_err());
    let (mut e, _) = engine();
    e.set_slots(2).unwrap();
    assert!(e.set_slots(3).unwrap_err().contains("once"));
    // Tokens past a slot's share of the context are refused, naming the context.
    let long = vec![1u32; 1024 / 2 + 1];
    let err = e.eval_slots(&[SlotRun { slot: 1, tokens: &long, logits: Logits::Last, prompt_end: None }]).unwrap_err();
    assert!(err.to_string().contains("context is full"), "{err}");
}

/// `seq_truncate` cuts one slot back (a rejected draft, llama.cpp's `llama_memory_seq_rm`): the
/// slot then continues exactly as a sequence that never had the forgotten tokens, the other slot
/// and the slot in use untouched.
#[test]
fn a_slot_cut_back_continues_as_if_the_tokens_were_never_there() {
    let (mut e, tok) = engine();
    let ids = |s: &str| tok.encode(s, true, false).unwrap();
    let (a, b) = (ids(PROMPTS[0]), ids(PROMPTS[1]));
    let draft = ids(" the quick brown fox jumps")[1..].to_vec();
    let next = ids(" a new")[1..].to_vec();
    // The references: each sequence alone in a fresh engine.
    let b_next = {
        let (mut f, _) = engine();
        f.eval(&b, Logits::Last).unwrap();
        f.eval(&next, Logits::All).unwrap().to_vec()
    };
    let a_next = {
        let (mut f, _) = engine();
        f.eval(&a, Logits::Last).unwrap();
        f.eval(&next, Logits::All).unwrap().to_vec()
    };
    e.set_slots(2).unwrap();
    e.use_slot(0);
    e.eval(&a, Logits::Last).unwrap();
    e.use_slot(1);
    e.eval(&b, Logits::Last).unwrap();
    e.eval(&draft, Logits::All).unwrap();
    e.use_slot(0);
    e.seq_truncate(1, b.len());
    assert_eq!(e.current_slot(), 0, "the slot in use stays in use");
    assert_eq!((e.slot_n_past(0), e.slot_n_past(1)), (a.len(), b.len()));
    // The cut slot continues as if the draft had never been evaluated, the other as before.
    e.use_slot(1);
    assert!(e.eval(&next, Logits::All).unwrap() == &b_next[..], "slot 1 after the cut");
    e.use_slot(0);
    assert!(e.eval(&next, Logits::All).unwrap() == &a_next[..], "slot 0, untouched");
    // Cut to nothing, the slot starts afresh, as a fresh engine's sequence; the other goes on.
    e.seq_truncate(1, 0);
    assert_eq!((e.current_slot(), e.slot_n_past(0), e.slot_n_past(1)), (0, a.len() + next.len(), 0));
    e.use_slot(1);
    let (mut f, _) = engine();
    assert!(e.eval(&b, Logits::Last).unwrap() == f.eval(&b, Logits::Last).unwrap(), "slot 1 afresh");
}
