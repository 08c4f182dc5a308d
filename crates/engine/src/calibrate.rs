//! `sift calibrate`: activation statistics for the calibrated selection methods.
//!
//! 1. Histograms of |x| at every layer and site over calibration text (TEAL), from which a
//!    target sparsity becomes a magnitude threshold.
//! 2. Greedy allocation (TEAL's block-wise search): for each layer, starting dense, repeatedly
//!    raise by `step` the site whose extra sparsity costs the least layer-output error per weight
//!    byte saved, until the layer's byte-weighted ratio reaches each target. The error is measured
//!    by running the real layer with threshold selection on captured inputs:
//!    `‖y − y_dense‖² / ‖y_dense − x‖²` (relative to the layer's own update). Every layer gets the
//!    same byte ratio, as in TEAL; within a layer the four sites get different ratios.
//!    With them, histograms of each layer's `|act(gate)|` on the gate-first path (CATS'
//!    per-layer thresholds, `cats-threshold`).
//! 3. Optionally SparseInfer's core-neuron clusters: k-means over the per-layer core frequencies
//!    of short calibration passages.

use crate::forward::{FfnStep, RowMode};
use crate::{Engine, EvalError, Logits};
use sift_sparsity::calib::{Allocation, CoreClusters};
use sift_sparsity::{
    Calibration, CoreNeuronSelector, CoreParams, DenseSelector, Method, Phase, Ratios, Selection, Selector, Site,
    ThresholdSelector,
};
use std::sync::{Arc, Mutex};

/// What to calibrate and on how much text.
#[derive(Clone, Debug)]
pub struct CalibrateOptions {
    /// Overall ratios to allocate (empty: histograms only).
    pub targets: Vec<f32>,
    /// Tokens for the histograms.
    pub n_tokens: usize,
    /// Window length for the histogram passes.
    pub window: usize,
    /// Tokens of captured layer input the greedy search evaluates on.
    pub greedy_tokens: usize,
    /// Ratio increment per greedy step.
    pub step: f32,
    /// Core-neuron clusters to build (0 = none), from passages of `cluster_len` tokens.
    pub clusters: usize,
    pub cluster_passages: usize,
    pub cluster_len: usize,
    pub alpha: f32,
    /// The weight columns' norms ([`crate::weight_norms`]): kept in the file, with histograms of
    /// the weight-aware scores (`wina`, `wina-threshold`).
    pub column_norms: Option<sift_sparsity::ColumnNorms>,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions {
            targets: vec![0.3, 0.4, 0.5, 0.6, 0.7],
            n_tokens: 8192,
            window: 512,
            greedy_tokens: 256,
            step: 0.05,
            clusters: 0,
            cluster_passages: 128,
            cluster_len: 64,
            alpha: 0.4,
            column_norms: None,
        }
    }
}

/// A selector that records |x| histograms and keeps every unit.
struct HistogramCollector {
    calib: Calibration,
    scores: Vec<f32>,
}

impl Selector for HistogramCollector {
    fn describe(&self) -> String {
        "histogram collector (dense)".into()
    }
    fn select(&mut self, layer: usize, site: Site, _: Phase, x: &[f32], _: &mut Vec<u32>) -> Selection {
        self.calib.histograms[layer][site.index()].add(x);
        self.calib.add_channel_abs(layer, site, x);
        self.calib.add_weighted(layer, site, x, &mut self.scores);
        Selection::All
    }
}

/// A gate-first selector (CATS) that records each layer's `|act(gate)|` and keeps every neuron.
struct GateHistogramCollector {
    calib: Calibration,
}

impl Selector for GateHistogramCollector {
    fn describe(&self) -> String {
        "gate histogram collector (dense)".into()
    }
    fn gate_first(&self) -> bool {
        true
    }
    fn select(&mut self, layer: usize, site: Site, _: Phase, x: &[f32], _: &mut Vec<u32>) -> Selection {
        if site == Site::FfnMid {
            self.calib.add_gate(layer, x);
        }
        Selection::All
    }
}

/// Runs the first `n_windows` windows of `window` tokens (each starting with `bos`, if any) as
/// prompts under `collector`, then goes back to dense; returns the tokens run.
#[allow(clippy::too_many_arguments)]
fn record_windows<S: Selector + 'static>(
    engine: &mut Engine,
    collector: &Arc<Mutex<S>>,
    tokens: &[u32],
    bos: Option<u32>,
    window: usize,
    n_windows: usize,
    what: &str,
    progress: &mut impl FnMut(&str),
) -> Result<usize, EvalError> {
    engine.set_selector(Box::new(Shared(collector.clone())));
    let mut used = 0;
    let mut win = Vec::with_capacity(window);
    for chunk in tokens.chunks_exact(window).take(n_windows) {
        win.clear();
        win.extend_from_slice(chunk);
        if let Some(b) = bos {
            win[0] = b;
        }
        engine.truncate(0);
        engine.eval_phase(&win, Logits::Last, Phase::Prompt)?;
        used += window;
        progress(&format!("{what}: {used} tokens"));
    }
    engine.set_selector(Box::new(DenseSelector));
    Ok(used)
}

/// A selector the caller keeps a handle to while the engine uses it.
pub struct Shared<S>(pub Arc<Mutex<S>>);

impl<S: Selector> Selector for Shared<S> {
    fn describe(&self) -> String {
        lock(&self.0).describe()
    }
    fn reset(&mut self) {
        lock(&self.0).reset()
    }
    fn begin_batch(&mut self, phase: Phase) {
        lock(&self.0).begin_batch(phase)
    }
    fn end_batch(&mut self, phase: Phase) {
        lock(&self.0).end_batch(phase)
    }
    fn gate_first(&self) -> bool {
        lock(&self.0).gate_first()
    }
    fn select(&mut self, layer: usize, site: Site, phase: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        lock(&self.0).select(layer, site, phase, x, active)
    }
    // `fixed_neurons` keeps its default (None): a borrow cannot outlive the lock; the row gather
    // is a speed path only, results are the same without it.
}

fn lock<S>(m: &Mutex<S>) -> std::sync::MutexGuard<'_, S> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs the calibration; `progress` receives human-readable status lines.
pub fn calibrate(
    engine: &mut Engine,
    tokens: &[u32],
    bos: Option<u32>,
    model_name: &str,
    opts: &CalibrateOptions,
    mut progress: impl FnMut(&str),
) -> Result<Calibration, EvalError> {
    let dims = engine.site_dims();
    let window = opts.window.min(engine.n_ctx()).max(2);
    // 1. Histograms.
    let mut calib = Calibration::new(model_name.to_string(), dims);
    if let Some(n) = &opts.column_norms {
        calib.set_column_norms(n.clone());
    }
    let collector = Arc::new(Mutex::new(HistogramCollector { calib, scores: Vec::new() }));
    let n_windows = opts.n_tokens.div_ceil(window);
    let used = record_windows(engine, &collector, tokens, bos, window, n_windows, "histograms", &mut progress)?;
    let mut calib = lock(&collector).calib.clone();
    calib.n_tokens = used;
    calib.finish_channel_means(used);

    // 1b. The gate's histograms (cats-threshold), on the gate-first path, over the first half of
    // those windows (each token gives every FFN neuron of every layer: plenty for a quantile).
    calib.start_gate_histograms();
    let gates = Arc::new(Mutex::new(GateHistogramCollector { calib }));
    let n_gate = used.div_ceil(2 * window).max(1);
    record_windows(engine, &gates, tokens, bos, window, n_gate, "gate histograms", &mut progress)?;
    let mut calib = lock(&gates).calib.clone();

    // 2. Greedy allocation.
    if !opts.targets.is_empty() {
        calib.allocations = allocate(engine, &calib, tokens, bos, opts, &mut progress)?;
    }

    // 3. Core-neuron clusters.
    if opts.clusters > 0 {
        let mut passages = Vec::new();
        let len = opts.cluster_len.max(8);
        // Passages from the end of the text, so they differ from the histogram windows.
        for (i, chunk) in tokens.rchunks_exact(len).take(opts.cluster_passages).enumerate() {
            let r = Ratios::uniform(Method::Core, dims.n_layer, 0.5).expect("0.5 is a valid ratio");
            let sel = Arc::new(Mutex::new(CoreNeuronSelector::new(
                dims,
                r,
                CoreParams { alpha: opts.alpha, magnitude: false },
                None,
            )));
            engine.set_selector(Box::new(Shared(sel.clone())));
            let mut p = chunk.to_vec();
            if let Some(b) = bos {
                p.insert(0, b);
            }
            engine.truncate(0);
            engine.eval_phase(&p, Logits::Last, Phase::Prompt)?;
            passages.push(lock(&sel).frequencies());
            if i % 16 == 15 {
                progress(&format!("core clusters: {} passages", i + 1));
            }
        }
        calib.clusters = Some(CoreClusters::kmeans(opts.alpha, &passages, opts.clusters, 20));
    }
    engine.set_selector(Box::new(DenseSelector));
    engine.truncate(0);
    Ok(calib)
}

/// TEAL's greedy search, per layer, recording the ratios where each target is first reached.
fn allocate(
    engine: &mut Engine,
    calib: &Calibration,
    tokens: &[u32],
    bos: Option<u32>,
    opts: &CalibrateOptions,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<Allocation>, EvalError> {
    let dims = engine.site_dims();
    let n = opts.greedy_tokens.min(engine.n_ctx()).min(tokens.len()).max(2);
    // Layer inputs from the middle of the text (not the histogram windows' start).
    let start = (tokens.len() / 2).min(tokens.len() - n);
    let mut seq = tokens[start..start + n].to_vec();
    if let Some(b) = bos {
        seq[0] = b;
    }
    engine.set_selector(Box::new(DenseSelector));
    let inputs = engine.layer_inputs(&seq)?;
    let (bytes, _) = engine.site_bytes();
    let frac: Vec<f64> = {
        let total: u64 = bytes.iter().sum();
        bytes.iter().map(|&b| b as f64 / total.max(1) as f64).collect()
    };
    let mut targets = opts.targets.clone();
    targets.sort_by(f32::total_cmp);
    let mut out: Vec<Allocation> =
        targets.iter().map(|&t| Allocation { target: t, ratios: vec![[0.0; 4]; dims.n_layer] }).collect();
    let max_target = targets.last().copied().unwrap_or(0.0) as f64;
    for (l, x) in inputs.iter().enumerate() {
        engine.set_selector(Box::new(DenseSelector));
        let y_dense = engine.run_layer(l, x, Phase::Prompt)?;
        let update: f64 = y_dense.iter().zip(x).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().max(1e-30);
        let mut r = [0f32; 4];
        let mut err = 0f64;
        let mut next_target = 0;
        loop {
            let overall: f64 = (0..4).map(|i| r[i] as f64 * frac[i]).sum();
            while next_target < targets.len() && overall + 1e-9 >= targets[next_target] as f64 {
                out[next_target].ratios[l] = r;
                next_target += 1;
            }
            if next_target >= targets.len() || overall >= max_target {
                break;
            }
            let mut best: Option<(f64, usize, f64)> = None;
            for s in Site::ALL {
                let i = s.index();
                if r[i] + opts.step > 0.98 || frac[i] == 0.0 {
                    continue;
                }
                let mut cand = r;
                cand[i] += opts.step;
                let e = layer_error(engine, calib, l, &cand, x, &y_dense, update)?;
                let cost = (e - err).max(0.0) / (opts.step as f64 * frac[i]);
                if best.is_none_or(|b| cost < b.0) {
                    best = Some((cost, i, e));
                }
            }
            let Some((_, i, e)) = best else { break };
            r[i] += opts.step;
            err = e;
        }
        // Targets not reached (every site at its cap) keep the last ratios.
        for a in out.iter_mut().skip(next_target) {
            a.ratios[l] = r;
        }
        progress(&format!("greedy allocation: layer {} of {} -> {:?}", l + 1, dims.n_layer, r));
    }
    engine.set_selector(Box::new(DenseSelector));
    engine.truncate(0);
    Ok(out)
}

fn layer_error(
    engine: &mut Engine,
    calib: &Calibration,
    l: usize,
    r: &[f32; 4],
    x: &[f32],
    y: &[f32],
    update: f64,
) -> Result<f64, EvalError> {
    let mut table = vec![[0f32; 4]; calib.n_layer];
    table[l] = *r;
    let sel = ThresholdSelector::new(calib, &Ratios::from_table(table)).expect("histograms exist for every layer");
    engine.set_selector(Box::new(sel));
    let out = engine.run_layer(l, x, Phase::Prompt)?;
    Ok(out.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / update)
}

/// The engine as calibration drives it: layer inputs of a text, one layer at a time.
impl Engine {
    /// Runs `tokens` (at most one batch, from position 0) and returns each layer's input: the
    /// residual stream entering layer `l`, `tokens.len() * n_embd` values per layer. For calibration.
    pub fn layer_inputs(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EvalError> {
        self.check_tokens(tokens)?;
        let n = tokens.len().min(self.n_batch).min(self.seq.n_ctx);
        let e = self.model.config.n_embd;
        self.truncate(0);
        self.embed(&tokens[..n])?;
        let mut out = Vec::with_capacity(self.model.layers.len());
        for l in 0..self.model.layers.len() {
            out.push(self.s.x[..n * e].to_vec());
            self.layer(l, n, self.layer_plan(l, FfnStep::Sites, RowMode::Together))?;
        }
        Ok(out)
    }

    /// Runs layer `l` alone on `x` (`n` tokens at positions `0..n`, at most one batch) with the
    /// current selector and returns its output. Overwrites that layer's KV cache; call
    /// `truncate(0)` before evaluating text again.
    pub fn run_layer(&mut self, l: usize, x: &[f32], phase: Phase) -> Result<Vec<f32>, EvalError> {
        let e = self.model.config.n_embd;
        let n = (x.len() / e).min(self.n_batch).min(self.seq.n_ctx);
        self.seq.n_past = 0;
        self.sparsity.phase = phase;
        self.s.x[..n * e].copy_from_slice(&x[..n * e]);
        self.layer(l, n, self.layer_plan(l, FfnStep::Sites, RowMode::Together))?;
        Ok(self.s.x[..n * e].to_vec())
    }
}
