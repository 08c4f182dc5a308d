//! Every selection method on real activations of the real SmolLM2-135M: the units each selector
//! returns are checked against a straightforward re-implementation of its definition, using the
//! activations the engine actually handed it.

use sift_engine::calibrate::{calibrate, CalibrateOptions};
use sift_engine::sparsity::{
    build_selector, Method, Phase, Ratios, Selection, Selector, Site, SiteDims, SparsityConfig,
};
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

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

fn text() -> String {
    std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).expect("fixture text")
}

/// One call of `select`: what the engine passed and what came back.
#[derive(Clone, Debug)]
struct Call {
    layer: usize,
    site: Site,
    phase: Phase,
    x: Vec<f32>,
    active: Option<Vec<u32>>,
}

/// Wraps a selector and records every call.
struct Recorder {
    inner: Box<dyn Selector>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Selector for Recorder {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn begin_batch(&mut self, p: Phase) {
        self.inner.begin_batch(p)
    }
    fn end_batch(&mut self, p: Phase) {
        self.inner.end_batch(p)
    }
    fn fixed_neurons(&self, layer: usize, phase: Phase) -> Option<&[u32]> {
        self.inner.fixed_neurons(layer, phase)
    }
    fn gate_first(&self) -> bool {
        self.inner.gate_first()
    }
    fn select(&mut self, layer: usize, site: Site, phase: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        let sel = self.inner.select(layer, site, phase, x, active);
        let active = (sel == Selection::Subset).then(|| active.clone());
        self.calls.lock().unwrap().push(Call { layer, site, phase, x: x.to_vec(), active });
        sel
    }
}

fn config(method: Method, n_layer: usize, ratio: f64) -> SparsityConfig {
    SparsityConfig {
        method,
        ratios: Ratios::uniform(method, n_layer, ratio).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    }
}

/// Runs a prompt and `n_gen` greedy tokens with `sel`, returning the recorded calls.
fn record(engine: &mut Engine, tok: &Tokenizer, sel: Box<dyn Selector>, prompt: &str, n_gen: usize) -> Vec<Call> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    engine.set_selector(Box::new(Recorder { inner: sel, calls: calls.clone() }));
    engine.truncate(0);
    let ids = tok.encode(prompt, true, false).unwrap();
    let mut logits = engine.eval(&ids, Logits::Last).unwrap().to_vec();
    for _ in 0..n_gen {
        let next = argmax(&logits);
        logits = engine.eval(&[next], Logits::Last).unwrap().to_vec();
    }
    let v = calls.lock().unwrap().clone();
    v
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32
}

/// Reference Top-K: the `k` largest |x| by a full sort (ties by lower index).
fn reference_topk(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    idx.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
    let mut top = idx[..k].to_vec();
    top.sort();
    top
}

fn kept(n: usize, r: f64) -> usize {
    n - (r * n as f64).round() as usize
}

const PROMPT: &str =
    "The history of the city begins in the early Middle Ages, when a small settlement grew around the river crossing.";

#[test]
fn topk_selects_the_largest_magnitudes_at_every_site() {
    let (mut e, tok) = engine();
    let dims = e.site_dims();
    let sel = build_selector(&config(Method::TopK, dims.n_layer, 0.4), dims, None).unwrap();
    let calls = record(&mut e, &tok, sel, PROMPT, 4);
    assert_eq!(calls.len(), (tok.encode(PROMPT, true, false).unwrap().len() + 4) * dims.n_layer * 4);
    for c in &calls {
        let active = c.active.as_ref().expect("topk sparsifies every site");
        let mags: Vec<f32> = c.x.iter().map(|v| v.abs()).collect();
        assert_eq!(active, &reference_topk(&mags, kept(c.x.len(), 0.4)), "layer {} {:?}", c.layer, c.site);
    }
}

#[test]
fn glu_prunes_only_the_down_projection() {
    let (mut e, tok) = engine();
    let dims = e.site_dims();
    let sel = build_selector(&config(Method::Glu, dims.n_layer, 0.5), dims, None).unwrap();
    for c in record(&mut e, &tok, sel, PROMPT, 2) {
        match c.site {
            Site::FfnMid => {
                let mags: Vec<f32> = c.x.iter().map(|v| v.abs()).collect();
                assert_eq!(c.active.unwrap(), reference_topk(&mags, kept(c.x.len(), 0.5)));
            }
            _ => assert!(c.active.is_none(), "{:?} must stay dense", c.site),
        }
    }
}

/// CATS asks once per token and layer, at the GLU site, with act(gate) — the SiLU of the gate
/// product, before up: checked in the first layer against the gate rows dequantized and
/// multiplied in f64 with the FFN input that `glu` reports there (both runs are identical up to
/// that point). It keeps the largest |act(gate)|, which is not what `glu` keeps.
#[test]
fn cats_chooses_neurons_on_the_gate_activation() {
    let (mut e, tok) = engine();
    let dims = e.site_dims();
    let cats =
        record(&mut e, &tok, build_selector(&config(Method::Cats, dims.n_layer, 0.5), dims, None).unwrap(), PROMPT, 2);
    let glu =
        record(&mut e, &tok, build_selector(&config(Method::Glu, dims.n_layer, 0.5), dims, None).unwrap(), PROMPT, 2);
    let n_tokens = tok.encode(PROMPT, true, false).unwrap().len() + 2;
    let mid = cats.iter().filter(|c| c.site == Site::FfnMid).count();
    assert_eq!(mid, n_tokens * dims.n_layer, "one choice of neurons per token and layer");
    let ffn_in = cats.iter().filter(|c| c.site == Site::FfnIn).count();
    assert_eq!(ffn_in, n_tokens * dims.n_layer, "the FFN input is asked too (traces see every site)");
    for c in &cats {
        if c.site != Site::FfnMid {
            assert!(c.active.is_none(), "{:?} must stay dense", c.site);
            continue;
        }
        let mags: Vec<f32> = c.x.iter().map(|v| v.abs()).collect();
        assert_eq!(c.active.as_ref().unwrap(), &reference_topk(&mags, kept(c.x.len(), 0.5)), "layer {}", c.layer);
    }
    // Layer 0 of the prompt: the FFN input from glu's run, the gate rows from the file.
    let c = &e.model.config;
    let n_embd = c.n_embd;
    let gate = e.model.layers[0].op(sift_model::layout::OpKind::Gate);
    assert!(!gate.packed, "the test reads the gate's rows as stored in the GGUF");
    let mut w = vec![0f32; n_embd];
    let ffn_in: Vec<&Call> = glu.iter().filter(|c| c.layer == 0 && c.site == Site::FfnIn).collect();
    let glu_mid: Vec<&Call> = glu.iter().filter(|c| c.layer == 0 && c.site == Site::FfnMid).collect();
    let cats0: Vec<&Call> = cats.iter().filter(|c| c.layer == 0 && c.site == Site::FfnMid).collect();
    let mut differ = 0;
    for ((h, act), g) in ffn_in.iter().zip(&cats0).zip(&glu_mid).take(8) {
        let scale = act.x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (r, &got) in act.x.iter().enumerate() {
            gate.ty.dequantize_row(e.model.row(gate, r), &mut w);
            let z: f64 = w.iter().zip(&h.x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let want = z / (1.0 + (-z).exp());
            assert!((got as f64 - want).abs() <= 0.02 * scale as f64, "neuron {r}: act(gate) {got}, want {want}");
        }
        differ += (act.active != g.active) as usize;
    }
    assert!(differ > 0, "cats chose what glu chose on every token: it is not ranking by the gate");
}

/// A lone token's chosen up rows (row gather) compute what dense up with the skipped neurons
/// zeroed computes: bit-identical logits while generating.
#[test]
fn cats_row_gather_computes_what_masked_dense_computes() {
    assert_eq!(decode_with(Method::Cats, true), decode_with(Method::Cats, false));
}

#[test]
fn dip_prunes_mlp_input_and_glu_of_the_pruned_input() {
    let (mut e, tok) = engine();
    let dims = e.site_dims();
    let sel = build_selector(&config(Method::Dip, dims.n_layer, 0.5), dims, None).unwrap();
    let calls = record(&mut e, &tok, sel, PROMPT, 2);
    let mut glu_zeros = 0usize;
    for c in &calls {
        match c.site {
            Site::FfnIn | Site::FfnMid => {
                let mags: Vec<f32> = c.x.iter().map(|v| v.abs()).collect();
                assert_eq!(c.active.as_ref().unwrap(), &reference_topk(&mags, kept(c.x.len(), 0.5)));
                if c.site == Site::FfnMid {
                    glu_zeros += c.x.iter().filter(|&&v| v == 0.0).count();
                }
            }
            _ => assert!(c.active.is_none()),
        }
    }
    // GLU~ is computed from the pruned input, so it is dense-valued but different from the dense GLU:
    // no structural zeros appear (the masking happens on the MLP input, not on the neurons).
    assert!(glu_zeros < calls.len(), "unexpected zeros in GLU~: {glu_zeros}");
}

/// ActiveFlow's LFU, one unit at a time, as the tiered store runs it: every active unit's count
/// goes up; then each miss, strongest first (higher count, then lower id), takes a free slot, or
/// evicts the least-used cached unit this token does not use (ties: least recently used, then
/// lowest id) when its own count is strictly higher.
struct RefLfu {
    cap: usize,
    counts: Vec<u32>,
    last: Vec<u32>,
    cached: Vec<bool>,
    clock: u32,
}

impl RefLfu {
    fn new(n: usize, cap: usize) -> RefLfu {
        RefLfu { cap, counts: vec![0; n], last: vec![0; n], cached: vec![false; n], clock: 0 }
    }

    fn access(&mut self, active: &[u32]) {
        self.clock += 1;
        for &u in active {
            self.counts[u as usize] += 1;
            self.last[u as usize] = self.clock;
        }
        let mut misses: Vec<usize> = active.iter().map(|&u| u as usize).filter(|&u| !self.cached[u]).collect();
        misses.sort_by_key(|&u| (std::cmp::Reverse(self.counts[u]), u));
        for u in misses {
            if self.cached.iter().filter(|&&c| c).count() < self.cap {
                self.cached[u] = true;
                continue;
            }
            let victim = (0..self.counts.len())
                .filter(|&v| self.cached[v] && !active.contains(&(v as u32)))
                .min_by_key(|&v| (self.counts[v], self.last[v], v));
            if let Some(v) = victim.filter(|&v| self.counts[u] > self.counts[v]) {
                self.cached[v] = false;
                self.cached[u] = true;
            }
        }
    }
}

#[test]
fn dip_ca_reweights_against_the_cache_state() {
    let (mut e, tok) = engine();
    let dims = e.site_dims();
    let mut cfg = config(Method::DipCa, dims.n_layer, 0.5);
    cfg.cache_fraction = Some(0.6);
    let sel = build_selector(&cfg, dims, None).unwrap();
    let calls = record(&mut e, &tok, sel, PROMPT, 6);
    let mut lfu: Vec<RefLfu> = (0..dims.n_layer * 4)
        .map(|i| {
            let n = dims.units[i % 4];
            RefLfu::new(n, (0.6 * n as f64).round() as usize)
        })
        .collect();
    let mut differs_from_plain_topk = 0;
    for c in &calls {
        if !matches!(c.site, Site::FfnIn | Site::FfnMid) {
            assert!(c.active.is_none());
            continue;
        }
        let cache = &mut lfu[c.layer * 4 + c.site.index()];
        let max = c.x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scores: Vec<f32> =
            c.x.iter().enumerate().map(|(j, v)| v.abs() * if cache.cached[j] { 1.0 } else { 0.2 } / max).collect();
        let want = reference_topk(&scores, kept(c.x.len(), 0.5));
        assert_eq!(c.active.as_ref().unwrap(), &want, "layer {} {:?}", c.layer, c.site);
        let plain = reference_topk(&c.x.iter().map(|v| v.abs()).collect::<Vec<_>>(), want.len());
        differs_from_plain_topk += (plain != want) as usize;
        cache.access(&want);
    }
    assert!(differs_from_plain_topk > 0, "the cache never changed a selection");
}

#[test]
fn core_neurons_are_fixed_at_prefill_and_reused_while_decoding() {
    let (mut e, tok) = engine();
    let dims = e.site_dims();
    let sel = build_selector(&config(Method::Core, dims.n_layer, 0.6), dims, None).unwrap();
    let calls = record(&mut e, &tok, sel, PROMPT, 5);
    let n_ff = dims.units[Site::FfnMid.index()];
    for l in 0..dims.n_layer {
        // Reference: count token-wise core neurons (top 40% of positive activations) over the prompt.
        let mut counts = vec![0f32; n_ff];
        for c in calls.iter().filter(|c| c.layer == l && c.site == Site::FfnMid && c.phase == Phase::Prompt) {
            assert!(c.active.is_none(), "the prompt runs dense");
            let pos: Vec<f32> = c.x.iter().map(|&v| if v > 0.0 { v } else { f32::NEG_INFINITY }).collect();
            // ceil(0.4 P) in integers, free of floating-point artifacts.
            let m = (4 * c.x.iter().filter(|&&v| v > 0.0).count()).div_ceil(10);
            for j in reference_topk(&pos, m) {
                counts[j as usize] += 1.0;
            }
        }
        let want = reference_topk(&counts, kept(n_ff, 0.6));
        let gen: Vec<&Call> =
            calls.iter().filter(|c| c.layer == l && c.site == Site::FfnMid && c.phase == Phase::Generate).collect();
        assert_eq!(gen.len(), 5);
        for c in gen {
            assert_eq!(c.active.as_ref().unwrap(), &want, "layer {l}: the set must stay fixed while decoding");
        }
    }
    assert!(calls.iter().filter(|c| c.site != Site::FfnMid).all(|c| c.active.is_none()));
}

#[test]
fn threshold_keeps_units_above_the_calibrated_threshold() {
    let (mut e, tok) = engine();
    let dims: SiteDims = e.site_dims();
    let ids = tok.encode(&text(), true, false).unwrap();
    let opts =
        CalibrateOptions { targets: vec![0.5], n_tokens: 1024, greedy_tokens: 64, step: 0.1, ..Default::default() };
    let calib = calibrate(&mut e, &ids[2048..], tok.bos(), "test", &opts, |_| {}).unwrap();
    assert_eq!(calib.allocations.len(), 1);
    let alloc = Ratios::from_table(calib.allocations[0].ratios.clone());
    let (bytes, _) = e.site_bytes();
    let overall = alloc.overall(bytes.map(|b| b as f64));
    assert!((0.5..0.56).contains(&overall), "greedy allocation reaches the target: {overall}");
    let sel = build_selector(&config(Method::Threshold, dims.n_layer, 0.5), dims, Some(&calib)).unwrap();
    let calls = record(&mut e, &tok, sel, PROMPT, 3);
    let (mut kept_units, mut total) = (0usize, 0usize);
    for c in &calls {
        let r = alloc.get(c.layer, c.site);
        let t = if r > 0.0 { calib.histograms[c.layer][c.site.index()].threshold_for(r) } else { 0.0 };
        let want: Vec<u32> = (0..c.x.len() as u32).filter(|&j| c.x[j as usize].abs() >= t).collect();
        match &c.active {
            Some(a) => assert_eq!(a, &want, "layer {} {:?}", c.layer, c.site),
            None => assert_eq!(t, 0.0),
        }
        let w = bytes[c.site.index()] as usize / c.x.len();
        kept_units += want.len() * w;
        total += c.x.len() * w;
    }
    let skipped = 1.0 - kept_units as f64 / total as f64;
    assert!((0.35..0.65).contains(&skipped), "thresholds skip about the target by bytes: {skipped}");
}

/// `cats-threshold`: `sift calibrate` records each layer's |act(gate)| on the gate-first path;
/// the selector keeps, on a prompt it did not see, exactly the neurons whose |act(gate)| clears
/// the layer's 0.5 quantile, which skips about half of them.
#[test]
fn cats_threshold_keeps_gates_above_the_calibrated_quantile() {
    let (mut e, tok) = engine();
    let dims: SiteDims = e.site_dims();
    let ids = tok.encode(&text(), true, false).unwrap();
    let opts = CalibrateOptions { targets: vec![], n_tokens: 1024, ..Default::default() };
    let calib = calibrate(&mut e, &ids[2048..], tok.bos(), "test", &opts, |_| {}).unwrap();
    assert_eq!(calib.gate_histograms.len(), dims.n_layer);
    let n_ff = dims.units[Site::FfnMid.index()];
    for h in &calib.gate_histograms {
        // Half of the histogram windows (one of 512 tokens), every neuron of every token.
        assert_eq!(h.total, (512 * n_ff) as u64);
    }
    let sel = build_selector(&config(Method::CatsThreshold, dims.n_layer, 0.5), dims, Some(&calib)).unwrap();
    assert!(sel.gate_first());
    let calls = record(&mut e, &tok, sel, PROMPT, 3);
    let (mut kept, mut total) = (0usize, 0usize);
    for c in calls.iter().filter(|c| c.site == Site::FfnMid) {
        let t = calib.gate_histograms[c.layer].threshold_for(0.5);
        assert!(t > 0.0);
        let want: Vec<u32> = (0..c.x.len() as u32).filter(|&j| c.x[j as usize].abs() >= t).collect();
        assert_eq!(c.active.as_ref().expect("a subset"), &want, "layer {}", c.layer);
        kept += want.len();
        total += c.x.len();
    }
    assert!(total > 0);
    let skipped = 1.0 - kept as f64 / total as f64;
    assert!((0.35..0.65).contains(&skipped), "the thresholds skip about half the neurons: {skipped}");
    assert!(calls.iter().filter(|c| c.site != Site::FfnMid).all(|c| c.active.is_none()));
}

#[test]
fn ratio_zero_is_exactly_dense() {
    let (mut e, tok) = engine();
    let ids = tok.encode(PROMPT, true, false).unwrap();
    let dense = e.eval(&ids, Logits::All).unwrap().to_vec();
    let dims = e.site_dims();
    for m in [Method::TopK, Method::Dip, Method::Glu, Method::Cats, Method::Core] {
        e.set_selector(build_selector(&config(m, dims.n_layer, 0.0), dims, None).unwrap());
        e.truncate(0);
        assert_eq!(e.eval(&ids, Logits::All).unwrap(), &dense[..], "{m} at ratio 0");
    }
}

#[test]
fn core_row_gather_computes_what_masked_dense_computes() {
    // The row gather (only the fixed neurons' gate/up rows) against dense gate/up with the
    // inactive GLU values zeroed: bit-identical logits while generating.
    assert_eq!(decode_with(Method::Core, true), decode_with(Method::Core, false));
}

/// The logits of three decoded tokens after the prompt under `method` at 0.5, with the row
/// gather (`gather`: the pack-less column-kernel option) or dense kernels on masked inputs.
fn decode_with(method: Method, gather: bool) -> Vec<Vec<f32>> {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let model = Model::load(&p).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.gguf).expect("tokenizer");
    let opts = EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 256, column_kernels: gather, ..Default::default() };
    let mut e = Engine::new(model, &opts);
    let dims = e.site_dims();
    e.set_selector(build_selector(&config(method, dims.n_layer, 0.5), dims, None).unwrap());
    let ids = tok.encode(PROMPT, true, false).unwrap();
    e.eval(&ids, Logits::Last).unwrap();
    [504u32, 3575, 282].iter().map(|&t| e.eval(&[t], Logits::Last).unwrap().to_vec()).collect()
}
