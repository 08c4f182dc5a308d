//! A damaged model must not pass silently (issue 22): the real SmolLM2-135M with one block scale
//! of layer 3's `ffn_down` set to an f16 NaN gives an error naming layer 3, not NaN logits that
//! read as the end of text or a NaN perplexity; the untouched model still runs after it.

use sift_engine::{Engine, EngineOptions, EvalError, Logits};
use std::path::PathBuf;

fn gguf() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

#[test]
fn nan_weights_are_an_error_naming_the_layer() {
    let mut bytes = std::fs::read(gguf()).unwrap();
    let g = sift_gguf::Gguf::parse(&bytes).unwrap();
    let t = g.tensor("blk.3.ffn_down.weight").unwrap().clone();
    // Q4_1 block: f16 d, f16 m, 16 bytes of nibbles; every block of the first row's scales → NaN.
    let at = (g.data_offset + t.offset) as usize;
    for b in 0..(t.row_bytes() as usize / 20) {
        bytes[at + 20 * b..at + 20 * b + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("damaged.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let opts = EngineOptions { n_threads: 2, n_ctx: 64, ..EngineOptions::default() };
    let mut e = Engine::new(sift_model::Model::load(&bad).unwrap(), &opts);
    for (ids, want) in [(&[1u32, 2, 3, 4][..], Logits::All), (&[5u32][..], Logits::Last)] {
        let err = e.eval(ids, want).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, EvalError::NonFinite { .. }), "{msg}");
        assert!(msg.contains("layer 3") && msg.contains("damaged"), "{msg}");
        assert_eq!(e.n_past(), 0, "nothing of a failed batch stays in the cache");
    }
    let mut ok = Engine::new(sift_model::Model::load(gguf()).unwrap(), &opts);
    assert!(ok.eval(&[1, 2, 3, 4], Logits::All).unwrap().iter().all(|v| v.is_finite()));
}
