//! LoRA adapters on the real SmolLM2-135M: the fused row equals the side product before
//! quantization; the fused GGUF changes only the adapted tensors, within a quantization step;
//! hostile adapter files are refused naming the problem.

use sift_engine::lora::{fuse, fused_row, DistillInfo, LoraAdapters, OpAdapter, Rounding};
use sift_engine::sparsity::Site;
use sift_model::layout::OpKind;
use sift_model::Model;
use sift_quant::grid::RowGrid;
use std::path::PathBuf;

fn model() -> Model {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    Model::load(p).unwrap()
}

/// A deterministic pseudo-random adapter for `op` of `layer`.
fn adapter(m: &Model, layer: usize, op: OpKind, rank: usize, scale: f32) -> OpAdapter {
    let w = m.layers[layer].op(op);
    let mut state = 0x2545_f491_4f6c_dd1du64 ^ (layer as u64 * 31 + rank as u64);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    OpAdapter {
        n_in: w.cols,
        n_out: w.rows,
        rank,
        a_t: (0..w.cols * rank).map(|_| next() * scale).collect(),
        b_t: (0..rank * w.rows).map(|_| next() * scale).collect(),
    }
}

#[test]
fn a_fused_row_computes_what_the_side_product_adds() {
    let m = model();
    let mut l = LoraAdapters::empty(m.config.n_layer, 16.0);
    l.set(4, OpKind::Down, adapter(&m, 4, OpKind::Down, 8, 0.2));
    let w = m.layers[4].op(OpKind::Down);
    let x: Vec<f32> = (0..w.cols).map(|j| ((j * 7919) % 97) as f32 / 97.0 - 0.5).collect();
    // The side product on x, for every output.
    let mut side = vec![0f32; w.rows];
    l.apply(4, Site::FfnMid, &x, 1, &mut [&mut side[..]]);
    let (mut fused, mut plain) = (vec![0f32; w.cols], vec![0f32; w.cols]);
    for (r, &side) in side.iter().enumerate() {
        fused_row(&m, &l, 4, OpKind::Down, r, &mut fused);
        w.ty.dequantize_row(m.row(w, r), &mut plain);
        let dot = |a: &[f32]| a.iter().zip(&x).map(|(a, b)| (a * b) as f64).sum::<f64>();
        let (f, p) = (dot(&fused), dot(&plain));
        assert!((f - p - side as f64).abs() < 1e-3 * (1.0 + side.abs() as f64), "row {r}: {f} - {p} vs {}", side);
    }
    // Ops without an adapter keep their rows.
    let up = &m.layers[4].w_up;
    let (mut fused, mut plain) = (vec![0f32; up.cols], vec![0f32; up.cols]);
    fused_row(&m, &l, 4, OpKind::Up, 0, &mut fused);
    up.ty.dequantize_row(m.row(up, 0), &mut plain);
    assert_eq!(fused, plain);
}

#[test]
fn the_fused_gguf_changes_only_the_adapted_tensors() {
    let m = model();
    let mut l = LoraAdapters::empty(m.config.n_layer, 8.0);
    l.set(2, OpKind::Gate, adapter(&m, 2, OpKind::Gate, 4, 0.5));
    let bytes = fuse(&m, &l, Rounding::Fresh).unwrap();
    let orig = m.file.bytes();
    assert_eq!(bytes.len(), orig.len());
    let w = &m.layers[2].w_gate;
    assert_eq!(bytes[..w.range.start], orig[..w.range.start]);
    assert_eq!(bytes[w.range.end..], orig[w.range.end..]);
    assert_ne!(bytes[w.range.clone()], orig[w.range.clone()]);
    // Each fused row, read back, is the exact fused row to within its quantization step.
    let (mut want, mut got) = (vec![0f32; w.cols], vec![0f32; w.cols]);
    for r in (0..w.rows).step_by(97) {
        fused_row(&m, &l, 2, OpKind::Gate, r, &mut want);
        let at = w.range.start + r * w.row_bytes;
        w.ty.dequantize_row(&bytes[at..at + w.row_bytes], &mut got);
        for (b, (g, e)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
            let (lo, hi) = e.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let step = (hi - lo) / 15.0;
            for (g, e) in g.iter().zip(e) {
                assert!((g - e).abs() <= 0.51 * step + 1e-6, "row {r} block {b}: {g} vs {e} (step {step})");
            }
        }
    }
}

/// On the grid: the scales stay (every level the same), each fused value lands on the level of
/// the original grid nearest the exact fused value, and the correction moves some integers.
#[test]
fn fusing_onto_the_grid_keeps_the_scales_and_takes_the_nearest_level() {
    let m = model();
    let mut l = LoraAdapters::empty(m.config.n_layer, 8.0);
    l.set(2, OpKind::Gate, adapter(&m, 2, OpKind::Gate, 4, 0.5));
    let bytes = fuse(&m, &l, Rounding::Grid).unwrap();
    let orig = m.file.bytes();
    let w = &m.layers[2].w_gate;
    assert_eq!(bytes[..w.range.start], orig[..w.range.start]);
    assert_eq!(bytes[w.range.end..], orig[w.range.end..]);
    let mut want = vec![0f32; w.cols];
    let mut moved = 0;
    for r in (0..w.rows).step_by(41) {
        fused_row(&m, &l, 2, OpKind::Gate, r, &mut want);
        let at = w.range.start + r * w.row_bytes;
        let g0 = RowGrid::of(w.ty, &orig[at..at + w.row_bytes], w.cols).unwrap();
        let g1 = RowGrid::of(w.ty, &bytes[at..at + w.row_bytes], w.cols).unwrap();
        for (k, &e) in want.iter().enumerate() {
            assert_eq!(g0.level(k, 0), g1.level(k, 0), "row {r} value {k}: the scales stay");
            assert_eq!(g0.level(k, g0.max_code()), g1.level(k, g1.max_code()));
            let best = (0..=g0.max_code()).map(|q| (g0.level(k, q) - e).abs()).fold(f32::INFINITY, f32::min);
            assert!((g1.value(k) - e).abs() <= best + 1e-6, "row {r} value {k}: {} for {e}", g1.value(k));
            moved += usize::from(g0.code(k) != g1.code(k));
        }
    }
    assert!(moved > 0, "the correction moved no integer");
}

#[test]
fn hostile_adapter_files_are_refused() {
    let m = model();
    let mut l = LoraAdapters::empty(m.config.n_layer, 8.0);
    l.set(0, OpKind::Q, adapter(&m, 0, OpKind::Q, 4, 0.1));
    l.info = DistillInfo { method: "dip".into(), ratio: 0.5, steps: 3, tokens: 768, seed: 7, loss: 0.25, qat: true };
    let good = l.to_gguf("llama");
    // How the adapters were trained comes back with them (quantization-aware ones are fused).
    assert_eq!(LoraAdapters::from_gguf(&good, &m).unwrap().info, l.info);
    let err = |b: &[u8]| LoraAdapters::from_gguf(b, &m).unwrap_err();
    assert!(err(&l.to_gguf("qwen2")).contains("for a 'qwen2' model"));
    let cut = err(&good[..good.len() / 2]);
    assert!(cut.contains("past the end") || cut.contains("truncated") || cut.contains("GGUF"), "{cut}");
    // A NaN in lora_b.
    let mut nan = l.clone();
    nan.layers[0][0].as_mut().unwrap().b_t[3] = f32::NAN;
    assert!(err(&nan.to_gguf("llama")).contains("non-finite"));
    // An adapter shaped for another op (k's rows on q).
    let mut wrong = LoraAdapters::empty(m.config.n_layer, 8.0);
    let mut a = adapter(&m, 0, OpKind::K, 4, 0.1);
    a.n_out = m.layers[0].wk.rows;
    wrong.set(0, OpKind::Q, a);
    assert!(err(&wrong.to_gguf("llama")).contains("shape"), "{}", err(&wrong.to_gguf("llama")));
    // Not an adapter at all: the model file itself.
    assert!(err(m.file.bytes()).contains("general.type"));
}

/// An adapter file whose `adapter.lora.alpha` is 0 (or absent) applies `B·A` at the user's scale,
/// as llama.cpp does, instead of silently adding nothing (found by bench/file_probe.py).
#[test]
fn an_adapter_without_alpha_applies_at_the_users_scale() {
    let m = model();
    let w = m.layers[2].op(OpKind::Up);
    let x: Vec<f32> = (0..w.cols).map(|j| ((j * 31) % 53) as f32 / 53.0 - 0.5).collect();
    let side = |alpha: f32| {
        let mut l = LoraAdapters::empty(m.config.n_layer, alpha);
        l.set(2, OpKind::Up, adapter(&m, 2, OpKind::Up, 4, 0.3));
        let l = LoraAdapters::from_gguf(&l.to_gguf("llama"), &m).unwrap();
        let mut out = vec![0f32; w.rows];
        let mut gate = vec![0f32; w.rows];
        l.apply(2, Site::FfnIn, &x, 1, &mut [&mut gate[..], &mut out[..]]);
        out
    };
    // alpha = rank gives scale 1, the same as no alpha.
    let (none, one) = (side(0.0), side(4.0));
    assert!(none.iter().any(|&v| v != 0.0), "the adapter added nothing");
    assert_eq!(none, one);
}
