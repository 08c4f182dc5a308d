//! A calibration of the real SmolLM2-135M whose tables do not match the model (cut short, or
//! from another model) is refused with an error that names the field, the expected and the found
//! shape and says to re-run `sift calibrate`, both when a selector is built from it and when it
//! is loaded from a file; it never reaches a selector that would index past its end.

use sift_engine::calibrate::{calibrate, CalibrateOptions};
use sift_engine::sparsity::{build_selector, Calibration, Method, Ratios, Selector, SiteDims, SparsityConfig};
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn engine() -> (Engine, Tokenizer) {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    let model = Model::load(&p).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.gguf).expect("tokenizer");
    let e = Engine::new(
        model,
        &EngineOptions {
            n_threads: 2,
            n_ctx: 512,
            n_batch: 512,
            sparse_head: 0.0,
            column_kernels: true,
            all_columns: false,
            ..Default::default()
        },
    );
    (e, tok)
}

fn config(method: Method, n_layer: usize) -> SparsityConfig {
    SparsityConfig {
        method,
        ratios: Ratios::uniform(method, n_layer, 0.5).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    }
}

/// A prompt and two greedy tokens with `sel` (core-sim fixes its neurons at the prompt's end).
fn run(e: &mut Engine, tok: &Tokenizer, sel: Box<dyn Selector>) -> Vec<u32> {
    e.set_selector(sel);
    e.truncate(0);
    let ids = tok.encode("The river crossing grew into a market town because", true, false).unwrap();
    let mut logits = e.eval(&ids, Logits::Last).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..2 {
        let next = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        out.push(next);
        logits = e.eval(&[next], Logits::Last).unwrap().to_vec();
    }
    out
}

fn assert_refused(msg: &str, field: &str) {
    assert!(msg.contains(&format!("`{field}`")), "the error should name `{field}`: {msg}");
    assert!(msg.contains("expected"), "the error should give the expected shape: {msg}");
    assert!(msg.contains("re-run `sift calibrate` on this model"), "the error should say what to do: {msg}");
}

type Cut = fn(&mut Calibration);

#[test]
fn a_calibration_whose_tables_do_not_match_the_model_is_refused() {
    let (mut e, tok) = engine();
    let dims: SiteDims = e.site_dims();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).expect("fixture text");
    let ids = tok.encode(&text, true, false).unwrap();
    let opts = CalibrateOptions {
        targets: vec![0.5],
        n_tokens: 512,
        window: 256,
        greedy_tokens: 32,
        step: 0.25,
        clusters: 2,
        cluster_passages: 6,
        cluster_len: 16,
        alpha: 0.4,
        column_norms: Some(sift_engine::weight_norms::column_norms(&e.model).unwrap()),
    };
    let calib = calibrate(&mut e, &ids[1024..], tok.bos(), "SmolLM2-135M-Instruct.Q4_1.gguf", &opts, |_| {}).unwrap();

    // The real calibration passes, and every method that reads it runs.
    calib.check_dims(dims).unwrap();
    for m in [Method::Threshold, Method::CoreSim, Method::DipCa, Method::Wina, Method::WinaThreshold] {
        let sel = build_selector(&config(m, dims.n_layer), dims, Some(&calib)).unwrap();
        assert_eq!(run(&mut e, &tok, sel).len(), 2);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smol.calib.json");
    calib.save(&path).unwrap();
    Calibration::load(&path).unwrap().check_dims(dims).unwrap();

    let n_layer = dims.n_layer;
    let cases: [(&str, Method, Cut); 16] = [
        // core-sim indexed `centroids[c][l]` for every layer at the prompt's end: a panic.
        ("clusters.centroids[0]", Method::CoreSim, |c| {
            for cent in &mut c.clusters.as_mut().unwrap().centroids {
                cent.pop();
            }
        }),
        ("clusters.centroids[1][7]", Method::CoreSim, |c| {
            c.clusters.as_mut().unwrap().centroids[1][7].truncate(100);
        }),
        ("histograms[3][1].bins", Method::Threshold, |c| c.histograms[3][1].bins.truncate(50)),
        ("histograms", Method::Threshold, |c| {
            c.histograms.pop();
        }),
        // All-zero tables made every threshold 0: a dense run, silently (bench/file_probe.py).
        ("histograms[2][0].total", Method::Threshold, |c| {
            c.histograms[2][0].bins.fill(0);
            c.histograms[2][0].total = 0;
        }),
        ("histograms[0][3].total", Method::Threshold, |c| c.histograms[0][3].total += 1),
        ("allocations[0].target", Method::Threshold, |c| c.allocations[0].target = 7.0),
        ("allocations[0].ratios", Method::Threshold, |c| {
            c.allocations[0].ratios.pop();
        }),
        // The static cache pins `hot_ranking`'s unit ids: too few (or too many) channels.
        ("channel_mean_abs[4][2]", Method::Dip, |c| c.channel_mean_abs[4][2].truncate(100)),
        ("channel_mean_abs[0][3]", Method::DipCa, |c| c.channel_mean_abs[0][3].push(1.0)),
        // The weight-aware selectors index the norms by channel.
        ("column_norms", Method::Wina, |c| {
            c.column_norms.as_mut().unwrap().norms[2][3].pop();
        }),
        ("column_norms", Method::Wina, |c| c.column_norms.as_mut().unwrap().norms[5][0][7] = -2.5),
        ("weighted_histograms[1][2].bins", Method::WinaThreshold, |c| c.weighted_histograms[1][2].bins.truncate(9)),
        // cats-threshold reads one gate histogram per layer.
        ("gate_histograms[3].bins", Method::CatsThreshold, |c| c.gate_histograms[3].bins.truncate(9)),
        ("gate_histograms", Method::CatsThreshold, |c| {
            c.gate_histograms.pop();
        }),
        ("gate_histograms[0].total", Method::CatsThreshold, |c| c.gate_histograms[0].total += 3),
    ];
    for (field, method, cut) in cases {
        let mut bad = calib.clone();
        cut(&mut bad);
        // In memory: refused where the selector is built.
        match build_selector(&config(method, n_layer), dims, Some(&bad)) {
            Ok(sel) => {
                run(&mut e, &tok, sel);
                panic!("a calibration with a bad `{field}` was accepted");
            }
            Err(err) => assert_refused(&err.to_string(), field),
        }
        // Through a file: refused where it is loaded (the file's tables against its own header).
        bad.save(&path).unwrap();
        let err = Calibration::load(&path).expect_err("a cut file must not load").to_string();
        assert_refused(&err, field);
        assert!(err.contains(&path.display().to_string()), "the error names the file: {err}");
    }

    // A calibration from before the weight-aware tables: `wina-threshold` says to calibrate again.
    let mut old = calib.clone();
    old.weighted_histograms.clear();
    let err = build_selector(&config(Method::WinaThreshold, n_layer), dims, Some(&old)).err().unwrap().to_string();
    assert!(err.contains("weight-aware") && err.contains("run `sift calibrate` again"), "{err}");
    // And one from before the gate histograms: `cats-threshold` says the same.
    let mut old = calib.clone();
    old.gate_histograms.clear();
    let err = build_selector(&config(Method::CatsThreshold, n_layer), dims, Some(&old)).err().unwrap().to_string();
    assert!(err.contains("no gate histograms") && err.contains("run `sift calibrate` again"), "{err}");
}
