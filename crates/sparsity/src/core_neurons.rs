//! SparseInfer's sentence-level core neurons.
//!
//! Token-wise core neurons (Def. 1): of a token's positive FFN activations (the GLU values read by
//! the down projection), the top `alpha` fraction by value. Sentence-wise core neurons (Def. 2):
//! the top `beta` fraction of neurons by how many of the sentence's tokens had them as core.
//! Stability-guided prediction fixes the sentence-wise set at prefill and reuses it for every
//! generated token; here `beta = 1 - ratio` at the GLU site, so `--ratio` means the same as for
//! the other methods. The prompt itself runs dense while the counts are gathered.
//!
//! Similarity-guided prediction (`core-sim`) assigns the prompt to the nearest of the k-means
//! clusters built by `sift calibrate --clusters K` (by its per-layer core-frequency vectors) and
//! uses that cluster's top `gamma = 1 - ratio` most frequent neurons instead.

use crate::calib::CoreClusters;
use crate::topk::{kept, top_k_indices};
use crate::{Phase, Ratios, Selection, Selector, Site, SiteDims};

/// SparseInfer's hyper-parameters besides the core-set size.
#[derive(Clone, Copy, Debug)]
pub struct CoreParams {
    /// Token-wise fraction of positive activations that are core (the paper uses 0.4).
    pub alpha: f32,
    /// Rank by |activation| instead of positive activations (SwiGLU's GLU values are signed, and
    /// strongly negative neurons matter as much as positive ones; the paper's models used ReLU).
    pub magnitude: bool,
}

/// Writes the token-wise core neurons of activation `x` (Def. 1) to `out`, ascending.
pub fn token_core(x: &[f32], alpha: f32, scores: &mut Vec<f32>, scratch: &mut Vec<u32>, out: &mut Vec<u32>) {
    let positives = x.iter().filter(|&&v| v > 0.0).count();
    // alpha arrives as f32 (0.4 is 0.40000000596): round it to the decimal the user gave and take
    // off floating-point error before the ceiling, so that 0.4 × 770 keeps 308 neurons, not 309.
    let a = (alpha as f64 * 1e6).round() / 1e6;
    let p = positives as f64;
    let m = ((a * p - 1e-9 * p).ceil().max(0.0) as usize).min(positives);
    scores.clear();
    scores.extend(x.iter().map(|&v| if v > 0.0 { v } else { f32::NEG_INFINITY }));
    top_k_indices(scores, m, scratch, out);
}

pub struct CoreNeuronSelector {
    ratios: Ratios,
    params: CoreParams,
    /// `counts[layer][neuron]`: tokens of the prompt(s) so far that had the neuron as core.
    counts: Vec<Vec<u32>>,
    n_tokens: u32,
    /// The fixed sets used while generating, per layer (empty: none computed yet).
    sets: Vec<Vec<u32>>,
    clusters: Option<CoreClusters>,
    cluster: Option<usize>,
    scores: Vec<f32>,
    scratch: Vec<u32>,
    token: Vec<u32>,
}

impl CoreNeuronSelector {
    /// `clusters` (core-sim) must match `dims` (every centroid `n_layer × units[down]`);
    /// [`crate::build_selector`] checks that with [`crate::Calibration::check_dims`].
    pub fn new(dims: SiteDims, ratios: Ratios, params: CoreParams, clusters: Option<CoreClusters>) -> Self {
        let n_ff = dims.units[Site::FfnMid.index()];
        CoreNeuronSelector {
            ratios,
            params,
            counts: vec![vec![0; n_ff]; dims.n_layer],
            n_tokens: 0,
            sets: vec![Vec::new(); dims.n_layer],
            clusters,
            cluster: None,
            scores: Vec::new(),
            scratch: Vec::new(),
            token: Vec::new(),
        }
    }

    /// The set fixed for generation at `layer` (empty before a prompt has been read).
    pub fn core_set(&self, layer: usize) -> &[u32] {
        &self.sets[layer]
    }

    /// The calibration cluster the prompt was assigned to (core-sim).
    pub fn cluster(&self) -> Option<usize> {
        self.cluster
    }

    /// Per-layer frequency of each neuron being core in the prompt so far.
    pub fn frequencies(&self) -> Vec<Vec<f32>> {
        let n = self.n_tokens.max(1) as f32;
        self.counts.iter().map(|c| c.iter().map(|&v| v as f32 / n).collect()).collect()
    }

    fn fix_sets(&mut self) {
        if self.n_tokens == 0 {
            return;
        }
        let mut scores = Vec::new();
        match &self.clusters {
            None => {
                for (l, counts) in self.counts.iter().enumerate() {
                    let k = kept(counts.len(), self.ratios.get(l, Site::FfnMid));
                    scores.clear();
                    scores.extend(counts.iter().map(|&c| c as f32));
                    top_k_indices(&scores, k, &mut self.scratch, &mut self.sets[l]);
                }
            }
            Some(cl) => {
                let freq = self.frequencies();
                let c = cl.nearest(&freq);
                self.cluster = Some(c);
                for l in 0..self.sets.len() {
                    let k = kept(self.counts[l].len(), self.ratios.get(l, Site::FfnMid));
                    scores.clear();
                    scores.extend(cl.centroids[c][l].iter().map(|&v| v as f32));
                    top_k_indices(&scores, k, &mut self.scratch, &mut self.sets[l]);
                }
            }
        }
    }
}

impl Selector for CoreNeuronSelector {
    fn describe(&self) -> String {
        let kind = if self.clusters.is_some() { "core-sim" } else { "core" };
        let m = if self.params.magnitude { " |x|" } else { "" };
        format!("{kind}{m} alpha={} beta={:.2}", self.params.alpha, 1.0 - self.ratios.get(0, Site::FfnMid))
    }

    fn reset(&mut self) {
        for c in &mut self.counts {
            c.fill(0);
        }
        self.n_tokens = 0;
        for s in &mut self.sets {
            s.clear();
        }
        self.cluster = None;
    }

    fn keeps_sequence_state(&self) -> bool {
        true
    }

    fn fixed_neurons(&self, layer: usize, phase: Phase) -> Option<&[u32]> {
        let set = &self.sets[layer];
        (phase == Phase::Generate && !set.is_empty()).then_some(&set[..])
    }

    fn end_batch(&mut self, phase: Phase) {
        if phase == Phase::Prompt {
            self.fix_sets();
        }
    }

    fn select(&mut self, layer: usize, site: Site, phase: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        if site != Site::FfnMid || self.ratios.get(layer, site) <= 0.0 {
            return Selection::All;
        }
        match phase {
            Phase::Prompt => {
                if self.params.magnitude {
                    self.scores.clear();
                    self.scores.extend(x.iter().map(|v| v.abs()));
                    let m = ((self.params.alpha as f64 * x.len() as f64).round() as usize).min(x.len());
                    let scores = std::mem::take(&mut self.scores);
                    top_k_indices(&scores, m, &mut self.scratch, &mut self.token);
                    self.scores = scores;
                } else {
                    token_core(x, self.params.alpha, &mut self.scores, &mut self.scratch, &mut self.token);
                }
                for &n in &self.token {
                    self.counts[layer][n as usize] += 1;
                }
                if layer == 0 {
                    self.n_tokens += 1;
                }
                Selection::All
            }
            Phase::Generate => {
                if self.sets[layer].is_empty() {
                    return Selection::All;
                }
                active.clear();
                active.extend_from_slice(&self.sets[layer]);
                Selection::Subset
            }
        }
    }
}
