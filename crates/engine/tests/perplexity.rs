//! `sift_engine::perplexity` on the real SmolLM2-135M and real text (WikiText-2's first 16 KiB):
//! the scored tokens are the ones each window's logits predict, whichever split is asked for.
//!
//! - [`Scored::Last`]`(N)` gives the mean NLL of the window's last `N` tokens, each predicted from
//!   every token before it, as one pass over the whole window computes them (tolerance 1e-3
//!   relative: the prompt and the scored part run in other batches).
//! - llama-perplexity's split scores `n_ctx/2 − 1` tokens per window.
//! - With sparse prefill (oracle masks, 0.5) only the prompt changes: the scored tokens are the
//!   same, their perplexity differs from the dense one; a split with no prompt is refused.

use sift_engine::perplexity::{log_softmax_at, perplexity, PerplexityError, Scored};
use sift_engine::prefill::PrefillMasks;
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::tokenizer::Tokenizer;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn engine(prefill_sparsity: f32) -> (Engine, Vec<u32>) {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    let model = sift_model::Model::load(&p).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: 512,
        prefill_sparsity,
        prefill_masks: PrefillMasks::Oracle,
        ..EngineOptions::default()
    };
    (Engine::new(model, &opts), ids)
}

const N_CTX: usize = 400;
const CHUNKS: usize = 2;

#[test]
fn the_last_n_tokens_of_each_window_are_scored() {
    let (mut e, ids) = engine(0.0);
    // Reference: one pass over each whole window, the NLL of its last 64 tokens.
    let n = 64;
    let n_vocab = e.config().n_vocab;
    let mut nll = 0f64;
    for c in 0..CHUNKS {
        let w = &ids[c * N_CTX..(c + 1) * N_CTX];
        e.truncate(0);
        let logits = e.eval(w, Logits::All).unwrap();
        for j in N_CTX - n..N_CTX {
            nll -= log_softmax_at(&logits[(j - 1) * n_vocab..j * n_vocab], w[j] as usize);
        }
    }
    let want = (nll / (CHUNKS * n) as f64).exp();
    let r = perplexity(&mut e, &ids, N_CTX, Scored::Last(n), Some(CHUNKS), None, |_, _| {}).unwrap();
    assert_eq!(r.n_scored, CHUNKS * n);
    assert!((r.ppl / want - 1.0).abs() < 1e-3, "--score-last {n}: {} against one pass's {want}", r.ppl);
    // A one-token score: the prompt's last logits alone.
    let one = perplexity(&mut e, &ids, N_CTX, Scored::Last(1), Some(CHUNKS), None, |_, _| {}).unwrap();
    assert_eq!(one.n_scored, CHUNKS);
    // llama-perplexity's split.
    let half = perplexity(&mut e, &ids, N_CTX, Scored::SecondHalf, Some(CHUNKS), None, |_, _| {}).unwrap();
    assert_eq!(half.n_scored, CHUNKS * (N_CTX / 2 - 1));
    for bad in [0, N_CTX] {
        let err = perplexity(&mut e, &ids, N_CTX, Scored::Last(bad), Some(CHUNKS), None, |_, _| {}).unwrap_err();
        assert!(matches!(err, PerplexityError::ScoredTooMany { .. }), "{bad}: {err}");
        assert!(err.to_string().contains("--score-last"), "{err}");
    }
}

#[test]
fn sparse_prefill_changes_only_the_prompt() {
    // 336 prompt tokens: blocks of 128, 128 and 80, the middle one sparse; 64 scored densely.
    let (mut dense, ids) = engine(0.0);
    let d = perplexity(&mut dense, &ids, N_CTX, Scored::Last(64), Some(CHUNKS), None, |_, _| {}).unwrap();
    let (mut sparse, _) = engine(0.5);
    let s = perplexity(&mut sparse, &ids, N_CTX, Scored::Last(64), Some(CHUNKS), None, |_, _| {}).unwrap();
    assert_eq!(s.n_scored, d.n_scored);
    let st = sparse.sparsity_stats().prefill_neurons;
    assert!(st[1] > 0 && st[0] * 2 <= st[1] + st[1] / 50, "half the sparse blocks' neurons computed: {st:?}");
    assert!(s.ppl.is_finite() && s.ppl != d.ppl, "sparse prefill {} against dense {}", s.ppl, d.ppl);
    // Oracle masks at 0.5 on one block of three: a small change (measured +0.3 %).
    assert!((s.ppl / d.ppl - 1.0).abs() < 0.1, "sparse prefill {} against dense {}", s.ppl, d.ppl);
}
