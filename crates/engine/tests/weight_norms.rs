//! The weight columns' norms (WINA's `‖W_:,i‖`) on the real model, against a direct computation
//! from the tensors' dequantized rows; and the weight-aware selector on them.

use sift_engine::sparsity::{
    build_selector_with_norms, ColumnNorms, Method, Phase, Ratios, Selection, Site, SparsityConfig,
};
use sift_engine::weight_norms::column_norms;
use sift_model::{Model, QTensor};
use std::path::PathBuf;
use std::sync::Arc;

fn gguf() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

/// Σ over rows of W[r, i]², per column, in f64 (the reference).
fn column_squares(model: &Model, t: &QTensor) -> Vec<f64> {
    let bytes = &model.file.bytes()[t.range.clone()];
    let mut row = vec![0f32; t.cols];
    let mut sq = vec![0f64; t.cols];
    for r in bytes.chunks_exact(t.row_bytes) {
        t.ty.dequantize_row(r, &mut row);
        for (s, v) in sq.iter_mut().zip(&row) {
            *s += (*v as f64) * (*v as f64);
        }
    }
    sq
}

#[test]
fn norms_are_the_stacked_columns_norms() {
    let model = Model::load(gguf()).unwrap();
    let n = column_norms(&model).unwrap();
    let c = &model.config;
    assert_eq!(n.norms.len(), c.n_layer);
    for l in [0, c.n_layer - 1] {
        let lw = &model.layers[l];
        let sites: [(Site, Vec<&QTensor>); 4] = [
            (Site::AttnIn, vec![&lw.wq, &lw.wk, &lw.wv]),
            (Site::AttnOut, vec![&lw.wo]),
            (Site::FfnIn, vec![&lw.w_gate, &lw.w_up]),
            (Site::FfnMid, vec![&lw.w_down]),
        ];
        for (site, ops) in sites {
            let mut want = vec![0f64; ops[0].cols];
            for t in ops {
                for (w, s) in want.iter_mut().zip(column_squares(&model, t)) {
                    *w += s;
                }
            }
            let got = n.site(l, site);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let w = w.sqrt();
                // f32 sums of ≤ 1536 squares against f64: relative 1e-4.
                assert!(((*g as f64) - w).abs() <= 1e-4 * w.max(1e-3), "layer {l} {site:?} channel {i}: {g} vs {w}");
            }
            // Real weights: the columns differ (the ranking has something to weigh).
            let (lo, hi) = got.iter().fold((f32::MAX, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
            assert!(lo > 0.0 && hi > 1.1 * lo, "layer {l} {site:?}: norms {lo}..{hi}");
        }
    }
}

#[test]
fn weight_aware_top_k_keeps_as_many_units_as_top_k_but_other_ones() {
    let model = Model::load(gguf()).unwrap();
    let c = &model.config;
    let dims =
        sift_engine::sparsity::SiteDims { n_layer: c.n_layer, units: [c.n_embd, c.n_embd_q(), c.n_embd, c.n_ff] };
    let norms = Arc::new(column_norms(&model).unwrap());
    let cfg = |method| SparsityConfig {
        method,
        ratios: Ratios::uniform(method, dims.n_layer, 0.5).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    let mut wina = build_selector_with_norms(&cfg(Method::Wina), dims, None, Some(norms.clone())).unwrap();
    let mut topk = build_selector_with_norms(&cfg(Method::TopK), dims, None, None).unwrap();
    // Without norms (none given, no calibration) the weight-aware method says what it needs.
    let err = build_selector_with_norms(&cfg(Method::Wina), dims, None, None).err().unwrap();
    assert!(err.to_string().contains("norms"), "{err}");
    // Norms for another model are refused.
    let mut other = ColumnNorms::zeros(dims);
    other.norms.pop();
    assert!(build_selector_with_norms(&cfg(Method::Wina), dims, None, Some(Arc::new(other))).is_err());

    // An activation of unit magnitude everywhere: Top-K's choice is arbitrary (ties by index),
    // the weight-aware one keeps exactly the largest columns.
    let x = vec![1.0f32; c.n_ff];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    assert_eq!(wina.select(3, Site::FfnMid, Phase::Generate, &x, &mut a), Selection::Subset);
    assert_eq!(topk.select(3, Site::FfnMid, Phase::Generate, &x, &mut b), Selection::Subset);
    assert_eq!(a.len(), b.len());
    assert_ne!(a, b);
    let n = norms.site(3, Site::FfnMid);
    let kept_min = a.iter().map(|&i| n[i as usize]).fold(f32::MAX, f32::min);
    let dropped_max =
        (0..c.n_ff as u32).filter(|i| a.binary_search(i).is_err()).map(|i| n[i as usize]).fold(0f32, f32::max);
    assert!(kept_min >= dropped_max, "kept {kept_min} < dropped {dropped_max}");
}
