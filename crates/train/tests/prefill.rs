//! The expert predictor trained on the real SmolLM2-135M and real text (WikiText-2's first
//! 16 KiB, a test fixture): a short run learns (its top-50 % recall on the blocks it saw beats
//! chance by a margin), the same seed gives the same weights bit for bit, a run resumed from a
//! checkpoint continues it, and the side file round-trips and is refused for another model.

use sift_engine::predictor::{model_identity, ExpertPredictors};
use sift_engine::{Engine, EngineOptions};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use sift_train::collect::collect_blocks;
use sift_train::prefill::{recall, train_predictor, TrainOptions};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> Model {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    Model::load(p).unwrap()
}

#[test]
fn a_short_run_learns_is_reproducible_and_resumes() {
    let m = model();
    let identity = model_identity(&m);
    let tok = Tokenizer::from_gguf(&m.file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let eo = EngineOptions { n_threads: 2, n_ctx: 512, n_batch: 128, ..EngineOptions::default() };
    let mut e = Engine::new(m, &eo);
    let data = collect_blocks(&mut e, &ids, 4, 6, &mut |_| {}).unwrap();
    assert_eq!(data.blocks, 6);
    assert_eq!(data.layers.len(), e.config().n_layer);
    assert_eq!(data.layers[0].norms.len(), 6 * data.n_ff);
    assert!(data.layers[0].norms.iter().all(|v| v.is_finite() && *v >= 0.0));

    let o = TrainOptions { steps: 60, batch: 4, lr: 3e-3, keep: 0.5, seed: 7 };
    let a = train_predictor(&data, &o, None, &mut |_, _| {}).unwrap();
    let r = recall(&a, &data, 0.5);
    eprintln!("top-50% recall after 60 steps on 6 blocks: {r:.3} (chance 0.5)");
    assert!(r > 0.6, "recall {r}");
    // Same seed, same data: the same weights.
    let b = train_predictor(&data, &o, None, &mut |_, _| {}).unwrap();
    assert_eq!(a.layers, b.layers);
    // Resumed: 60 more steps start from a's weights and count on from 60.
    let c = train_predictor(&data, &TrainOptions { seed: 8, ..o.clone() }, Some(&a), &mut |_, _| {}).unwrap();
    assert_eq!(c.header.steps, 120);
    assert_ne!(c.layers, a.layers);

    // The side file: written, read back for this model, refused for another.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.prefill");
    let mut a = a;
    a.header.model = identity;
    a.save(&path, &[]).unwrap();
    let back = ExpertPredictors::load(&path, &e.model).unwrap();
    assert_eq!(back.layers, a.layers);
    let mut other = a.clone();
    other.header.model = "another.gguf (1 bytes, 1 layers, 1 x 1)".into();
    other.save(&path, &[]).unwrap();
    let err = ExpertPredictors::load(&path, &e.model).unwrap_err().to_string();
    assert!(err.contains("not for this model") && err.contains("sift train prefill"), "{err}");
}

/// FastForward's error compensator on the same blocks: the oracle's skipped neurons add less to
/// the FFN output than the predictor's (the oracle keeps the largest); a short run lowers the
/// relative MSE (1: no correction; C2 starts at zero) and is reproducible; the side file keeps
/// it.
#[test]
fn a_short_compensator_run_learns_and_is_kept_in_the_file() {
    use sift_train::compensate::{collect_errors, down_transposed, train_compensator, CompOptions};
    let m = model();
    let down = down_transposed(&m).unwrap();
    let identity = model_identity(&m);
    let tok = Tokenizer::from_gguf(&m.file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let eo = EngineOptions { n_threads: 2, n_ctx: 512, n_batch: 128, ..EngineOptions::default() };
    let mut e = Engine::new(m, &eo);
    let data = collect_blocks(&mut e, &ids, 4, 6, &mut |_| {}).unwrap();
    let o = TrainOptions { steps: 40, batch: 4, lr: 3e-3, keep: 0.5, seed: 7 };
    let mut p = train_predictor(&data, &o, None, &mut |_, _| {}).unwrap();
    let errs = collect_errors(&mut e, &ids, 4, 6, down, std::sync::Arc::new(p.clone()), 0.5, &mut |_| {}).unwrap();
    assert_eq!(errs.blocks, 6);
    let energy = |v: &[half::f16]| v.iter().map(|x| (x.to_f32() as f64).powi(2)).sum::<f64>();
    let (eo_, ep) =
        (errs.oracle.iter().map(|l| energy(l)).sum::<f64>(), errs.predicted.iter().map(|l| energy(l)).sum::<f64>());
    eprintln!("error energy: oracle masks {eo_:.1}, predicted masks {ep:.1}");
    assert!(eo_ < ep, "the oracle's skipped part {eo_} vs the predictor's {ep}");

    let co = CompOptions { steps: 60, batch: 2, lr: 3e-3, seed: 3 };
    let mut losses = Vec::new();
    train_compensator(&data, &errs, &co, &mut p, &mut |_, l| losses.push(l)).unwrap();
    // Minibatch losses are noisy: means of 5 steps, the first ones on the predictor's masks
    // against the last ones.
    let mean = |r: std::ops::Range<usize>| losses[r.clone()].iter().sum::<f32>() / r.len() as f32;
    let (first, last) = (mean(co.steps / 3..co.steps / 3 + 5), mean(co.steps - 5..co.steps));
    eprintln!(
        "compensator relative MSE: step 1 {:.4}, first predicted-mask steps {first:.4}, last {last:.4}",
        losses[0]
    );
    assert!(last < 0.9 * first, "relative MSE {first} -> {last}");
    assert!(p.has_compensator() && p.header.comp_steps == 60);
    let mut q = train_predictor(&data, &o, None, &mut |_, _| {}).unwrap();
    train_compensator(&data, &errs, &co, &mut q, &mut |_, _| {}).unwrap();
    assert_eq!(p.layers, q.layers, "the same seed gives the same compensator");

    // The layerwise schedule's importance: a share of attention per layer, in (0, 1), not the
    // same everywhere; its schedule keeps half of all neurons on average.
    let mass = sift_train::schedule::attention_mass(&mut e, &ids, 512, 1).unwrap();
    eprintln!("attention mass past the first block per layer: {mass:.3?}");
    assert_eq!(mass.len(), e.config().n_layer);
    assert!(mass.iter().all(|&m| m > 0.0 && m < 1.0), "{mass:?}");
    assert!(mass.iter().any(|&m| (m - mass[0]).abs() > 0.01), "{mass:?}");
    let keep = sift_engine::prefill::linear_schedule(&mass, 0.5);
    assert!((keep.iter().sum::<f32>() / keep.len() as f32 - 0.5).abs() < 1e-4, "{keep:?}");
    p.header.attn_mass = mass;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.prefill");
    p.header.model = identity;
    p.save(&path, &[]).unwrap();
    let back = ExpertPredictors::load(&path, &e.model).unwrap();
    assert_eq!(back.layers, p.layers);
    assert_eq!(back.header.comp_rank, sift_engine::predictor::compensator_rank(e.config().n_embd));
    assert_eq!(back.header.attn_mass, p.header.attn_mass);
}
