//! Sparsity-aware distillation on the real SmolLM2-135M and real text (WikiText-2's first
//! 16 KiB, a test fixture): the candle student computes the engine's logits (dense, and under
//! Top-K masks with adapters, the engine applying them from the GGUF LoRA file), the straight-
//! through mask passes gradients unchanged, and a short run lowers the KL on what it saw.

use candle_core::{Device, Tensor, Var};
use sift_engine::lora::LoraAdapters;
use sift_engine::sparsity::{build_selector, DenseSelector, Method, Phase, Ratios, Selector, Site, SparsityConfig};
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::layout::OpKind;
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use sift_train::distill::{kl_loss, ste_mask, train, Adam, DistillOptions, LoraVars, Student};
use std::path::PathBuf;
use std::sync::Arc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> Model {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    Model::load(p).unwrap()
}

fn topk(e: &Engine, ratio: f64) -> Box<dyn Selector> {
    let cfg = SparsityConfig {
        method: Method::TopK,
        ratios: Ratios::uniform(Method::TopK, e.config().n_layer, ratio).unwrap(),
        gamma: 0.0,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    build_selector(&cfg, e.site_dims(), None).unwrap()
}

/// Top-K at one site only.
fn topk_at(e: &Engine, site: Site, ratio: f32) -> Box<dyn Selector> {
    let mut r = Ratios::uniform(Method::TopK, e.config().n_layer, 0.0).unwrap();
    for l in 0..e.config().n_layer {
        r.set(l, site, ratio);
    }
    let cfg = SparsityConfig {
        method: Method::TopK,
        ratios: r,
        gamma: 0.0,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    build_selector(&cfg, e.site_dims(), None).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Forward `x ⊙ m`, gradient the identity (checked against the plain product's, which is `m`).
#[test]
fn the_straight_through_mask_passes_gradients_unchanged() {
    let dev = Device::Cpu;
    let x = Var::from_vec(vec![0.5f32, -2.0, 3.0, 0.25], 4, &dev).unwrap();
    let m = Tensor::new(&[1f32, 0.0, 1.0, 0.0], &dev).unwrap();
    let w = Tensor::new(&[1f32, 2.0, 3.0, 4.0], &dev).unwrap();
    let y = ste_mask(x.as_tensor(), &m).unwrap();
    assert_eq!(y.to_vec1::<f32>().unwrap(), [0.5, 0.0, 3.0, 0.0]);
    let g = (y * &w).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    // Finite differences of the loss through the STE's forward see only the kept inputs; the
    // gradient above is theirs on kept positions and w (identity) on the masked ones.
    let f = |v: &[f32]| -> f32 {
        let t = Tensor::from_slice(v, 4, &dev).unwrap();
        (ste_mask(&t, &m).unwrap() * &w).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap()
    };
    let base = [0.5f32, -2.0, 3.0, 0.25];
    for (i, want) in [(0, 1.0), (2, 3.0)] {
        let mut p = base;
        p[i] += 1e-2;
        assert!(((f(&p) - f(&base)) / 1e-2 - want).abs() < 1e-2);
    }
}

#[test]
fn the_student_computes_the_engines_logits_and_a_short_run_learns() {
    let tok = Tokenizer::from_gguf(&model().file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let seq = 64;
    let window = &ids[100..100 + seq];
    let eo = EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 64, ..EngineOptions::default() };
    let mut e = Engine::new(model(), &eo);
    let student = Student::from_model(&e.model).unwrap();
    let vocab = e.config().n_vocab;

    // Dense: the engine's logits.
    e.truncate(0);
    let dense = e.eval(window, Logits::All).unwrap().to_vec();
    let s = student.forward(&e.model, window, None, None).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let kl_of = |a: &[f32], b: &[f32]| {
        let a = Tensor::from_slice(a, (seq, vocab), &Device::Cpu).unwrap();
        let b = Tensor::from_slice(b, (seq, vocab), &Device::Cpu).unwrap();
        kl_loss(&a, &b).unwrap().to_scalar::<f32>().unwrap()
    };
    let d = kl_of(&dense, &s);
    eprintln!("dense: KL(engine || student) = {d}, max |diff| {}", max_abs_diff(&dense, &s));
    assert!(d < 0.01, "{d}");

    // Adapters on every op, B not zero: the engine, reading them back from their GGUF LoRA
    // file, computes the student's logits, dense and with Top-K 0.5 at the down projection's
    // input. (Top-K at the FFN input is chaotic between the two: the engine's 8-bit activations
    // change which inputs tie at the threshold, and the two runs drift apart as far as either
    // is from the dense model; the masks themselves are the same selector's.)
    let lora = LoraVars::new(&e.model, &OpKind::ALL, 8, 16.0, 3, None).unwrap();
    for (_, b) in lora.vars.iter().flatten().flatten() {
        let (r, c) = b.as_tensor().dims2().unwrap();
        b.set(&Tensor::randn(0f32, 0.02, (r, c), &Device::Cpu).unwrap()).unwrap();
    }
    let adapters = lora.to_adapters().unwrap();
    let bytes = adapters.to_gguf("llama");
    let back = LoraAdapters::from_gguf(&bytes, &e.model).unwrap();
    assert_eq!(back.layers, adapters.layers);
    e.set_lora(Some(Arc::new(back)));
    for down_only in [false, true] {
        let mut sel = down_only.then(|| topk_at(&e, Site::FfnMid, 0.5));
        let s = student.forward(&e.model, window, sel.as_mut().map(|s| s.as_mut() as _), Some(&lora)).unwrap();
        let s = s.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        e.set_selector(if down_only { topk_at(&e, Site::FfnMid, 0.5) } else { Box::new(DenseSelector) });
        e.truncate(0);
        let got = e.eval_phase(window, Logits::All, Phase::Generate).unwrap().to_vec();
        let (d, moved) = (kl_of(&got, &s), kl_of(&dense, &got));
        eprintln!("adapters, top-k at down {down_only}: KL(engine || student) = {d}, KL(dense || engine) = {moved}");
        // Dense: as close as without adapters (8-bit activations); masked: closer to the student
        // than to the dense model. The short training above is not bit-reproducible from run to
        // run (found in session 20 on an AVX2-only CPU: the masked ratio d / moved took 0.29, 0.40
        // and 0.60 in three debug runs, 0.42 in release), so the masked bound is 3/4.
        let close = if down_only { d < 0.75 * moved } else { d < 0.01 && moved > 5.0 * d };
        assert!(close, "{d} vs {moved}");
    }
    e.set_selector(Box::new(DenseSelector));

    // A short run on one window lowers the KL to the dense model there.
    e.set_lora(None);
    let lora = LoraVars::new(&e.model, &[OpKind::Gate, OpKind::Up, OpKind::Down], 8, 16.0, 3, None).unwrap();
    let teacher_t = Tensor::from_vec(dense.clone(), (seq, vocab), &Device::Cpu).unwrap();
    let kl = |lora: &LoraVars| {
        let mut sel = topk(&e, 0.5);
        let s = student.forward(&e.model, window, Some(sel.as_mut()), Some(lora)).unwrap();
        kl_loss(&teacher_t, &s).unwrap().to_scalar::<f32>().unwrap()
    };
    let before = kl(&lora);
    let window_tokens = &ids[100..100 + seq + 1];
    let run_batched = |lora: &LoraVars, adam: &mut Adam, steps: usize, accumulate: usize| {
        let mut sel = topk(&e, 0.5);
        let o = DistillOptions { steps, seq, seed: 1, accumulate, layer_weight: 0.0 };
        train(
            &student,
            &e.model,
            sel.as_mut(),
            lora,
            adam,
            window_tokens,
            &o,
            &mut |_| Ok(dense.clone()),
            &mut |s, l| {
                eprintln!("step {s}: KL {l:.4}");
                Ok(())
            },
        )
        .unwrap()
    };
    let run = |lora: &LoraVars, adam: &mut Adam, steps: usize| run_batched(lora, adam, steps, 1);
    let t0 = std::time::Instant::now();
    let mut adam = Adam::new(&lora.all(), 2e-3).unwrap();
    run(&lora, &mut adam, 8);
    let after = kl(&lora);
    eprintln!("KL on the window: {before:.4} -> {after:.4} ({:.1} s)", t0.elapsed().as_secs_f64());
    assert!(after < 0.8 * before, "{before} -> {after}");

    // Resumed exactly: 3 steps, a checkpoint (adapters and optimizer state through their files),
    // 3 more, equal 6 steps in one run, value for value.
    let straight = LoraVars::new(&e.model, &[OpKind::Down], 4, 8.0, 5, None).unwrap();
    let mut adam = Adam::new(&straight.all(), 1e-3).unwrap();
    adam.horizon = 6;
    run(&straight, &mut adam, 6);
    let piece = LoraVars::new(&e.model, &[OpKind::Down], 4, 8.0, 5, None).unwrap();
    let mut adam = Adam::new(&piece.all(), 1e-3).unwrap();
    adam.horizon = 6;
    run(&piece, &mut adam, 3);
    let file = LoraAdapters::from_gguf(&piece.to_adapters().unwrap().to_gguf("llama"), &e.model).unwrap();
    let resumed = LoraVars::new(&e.model, &[OpKind::Down], 4, 8.0, 99, Some(&file)).unwrap();
    let mut adam = Adam::from_gguf(&adam.to_gguf().unwrap(), &resumed.all(), 1e-3).unwrap();
    assert_eq!((adam.step, adam.horizon), (3, 6));
    run(&resumed, &mut adam, 3);
    assert_eq!(resumed.to_adapters().unwrap().layers, straight.to_adapters().unwrap().layers);

    // Accumulated gradients are averaged: the text holds one window, so a batch of two is that
    // window twice, and its update is the one window's, value for value (halving is exact).
    let one = LoraVars::new(&e.model, &[OpKind::Down], 4, 8.0, 7, None).unwrap();
    let mut adam = Adam::new(&one.all(), 1e-3).unwrap();
    run_batched(&one, &mut adam, 2, 1);
    let two = LoraVars::new(&e.model, &[OpKind::Down], 4, 8.0, 7, None).unwrap();
    let mut adam = Adam::new(&two.all(), 1e-3).unwrap();
    run_batched(&two, &mut adam, 2, 2);
    assert_eq!(two.to_adapters().unwrap().layers, one.to_adapters().unwrap().layers);
}

/// The layer-wise loss (`--layer-loss`): zero against itself, blind to each token's scale,
/// larger the more the masks skip, and lowered by a short run that trains on it.
#[test]
fn the_layer_loss_measures_how_far_the_masks_move_each_layer() {
    use sift_train::distill::residual_loss;
    let tok = Tokenizer::from_gguf(&model().file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let seq = 48;
    let window = &ids[300..300 + seq];
    let eo = EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 64, ..EngineOptions::default() };
    let e = Engine::new(model(), &eo);
    let student = Student::from_model(&e.model).unwrap();
    let value = |t: Tensor| t.to_scalar::<f32>().unwrap();
    let (_, dense) = student.forward_with_residuals(&e.model, window, None, None).unwrap();
    assert_eq!(dense.len(), e.config().n_layer);
    assert_eq!(value(residual_loss(&dense, &dense).unwrap()), 0.0);
    let scaled: Vec<Tensor> = dense.iter().map(|t| (t * 3.0).unwrap()).collect();
    assert!(value(residual_loss(&dense, &scaled).unwrap()) < 1e-9);
    let at = |ratio: f64| {
        let mut sel = topk(&e, ratio);
        let (_, sparse) = student.forward_with_residuals(&e.model, window, Some(sel.as_mut()), None).unwrap();
        value(residual_loss(&dense, &sparse).unwrap())
    };
    let (low, high) = (at(0.3), at(0.7));
    eprintln!("layer loss: top-k 0.3 {low:.4}, 0.7 {high:.4}");
    assert!(0.0 < low && low < high, "{low} {high}");

    // Six steps on the layer loss alone (its weight large against the KL) lower it on the window.
    let lora = LoraVars::new(&e.model, &[OpKind::Gate, OpKind::Up, OpKind::Down], 8, 16.0, 3, None).unwrap();
    let loss = |lora: &LoraVars| {
        let mut sel = topk(&e, 0.5);
        let (_, sparse) = student.forward_with_residuals(&e.model, window, Some(sel.as_mut()), Some(lora)).unwrap();
        value(residual_loss(&dense, &sparse).unwrap())
    };
    let before = loss(&lora);
    let mut e2 = Engine::new(model(), &eo);
    let teacher = e2.eval(&ids[300..300 + seq], Logits::All).unwrap().to_vec();
    let mut adam = Adam::new(&lora.all(), 2e-3).unwrap();
    let mut sel = topk(&e, 0.5);
    let o = DistillOptions { steps: 6, seq, seed: 1, accumulate: 1, layer_weight: 100.0 };
    train(
        &student,
        &e.model,
        sel.as_mut(),
        &lora,
        &mut adam,
        &ids[300..300 + seq + 1],
        &o,
        &mut |_| Ok(teacher.clone()),
        &mut |_, _| Ok(()),
    )
    .unwrap();
    let after = loss(&lora);
    eprintln!("layer loss under top-k 0.5: {before:.4} -> {after:.4}");
    assert!(after < 0.9 * before, "{before} -> {after}");
}

/// Quantization-aware adapters (`--qat`): with B = 0 the student is the model itself (its weights
/// lie on their own grid), and with adapters it computes what the adapters fused and rounded
/// onto that grid (`--rounding grid`) compute, which the plain adapters do not.
#[test]
fn quantization_aware_adapters_compute_the_fused_model() {
    let m = model();
    let ffn = [OpKind::Gate, OpKind::Up, OpKind::Down];
    let tok = Tokenizer::from_gguf(&m.file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let window = &ids[500..532];
    let plain = Student::from_model(&m).unwrap();
    let mut qat = Student::from_model(&m).unwrap();
    qat.quantization_aware(&m, &ffn).unwrap();
    let logits = |s: &Student, model: &Model, lora: Option<&LoraVars>| {
        s.forward(model, window, None, lora).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let kl_of = |a: &[f32], b: &[f32]| {
        let n = window.len();
        let a = Tensor::from_slice(a, (n, a.len() / n), &Device::Cpu).unwrap();
        let b = Tensor::from_slice(b, (n, b.len() / n), &Device::Cpu).unwrap();
        kl_loss(&a, &b).unwrap().to_scalar::<f32>().unwrap()
    };
    let lora = LoraVars::new(&m, &ffn, 8, 16.0, 3, None).unwrap();
    assert_eq!(logits(&plain, &m, Some(&lora)), logits(&qat, &m, Some(&lora)), "B = 0: the model on its own grid");

    for (_, b) in lora.vars.iter().flatten().flatten() {
        let (r, c) = b.as_tensor().dims2().unwrap();
        b.set(&Tensor::randn(0f32, 0.01, (r, c), &Device::Cpu).unwrap()).unwrap();
    }
    let bytes = sift_engine::lora::fuse(&m, &lora.to_adapters().unwrap(), sift_engine::lora::Rounding::Grid).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fused.gguf");
    std::fs::write(&path, bytes).unwrap();
    let fused = Model::load(&path).unwrap();
    let fused_logits = logits(&Student::from_model(&fused).unwrap(), &fused, None);
    let (to_qat, to_plain) =
        (kl_of(&fused_logits, &logits(&qat, &m, Some(&lora))), kl_of(&fused_logits, &logits(&plain, &m, Some(&lora))));
    eprintln!("KL(fused on the grid || quantization-aware student) {to_qat:.2e}, || plain adapters {to_plain:.2e}");
    assert!(to_qat < 1e-3 && to_qat < 0.1 * to_plain, "{to_qat} vs {to_plain}");
}
