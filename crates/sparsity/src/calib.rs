//! Calibration data (`sift calibrate`): activation-magnitude histograms per layer and site (TEAL's
//! way of turning a target sparsity into thresholds), greedy per-site allocations of an overall
//! ratio, and SparseInfer's core-neuron clusters. Saved as versioned JSON.

use crate::weight_aware::ColumnNorms;
use crate::{Ratios, Site, SiteDims};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Format version written to and required from calibration files.
pub const CALIB_VERSION: u32 = 1;

/// Log-spaced histogram bins cover |x| in [HIST_LO, HIST_HI); values below land in bin 0.
const HIST_LO: f32 = 1e-6;
const HIST_HI: f32 = 1e4;
const HIST_BINS: usize = 2000;

/// Problems with a calibration file.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("cannot read calibration file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is not a sift calibration file: {msg}")]
    Parse { path: String, msg: String },
    #[error("calibration file version {found} is not supported (this sift reads version {CALIB_VERSION}); run `sift calibrate` again")]
    Version { found: u32 },
    #[error("the calibration was made for a different model shape ({found}), this model is {expected}: re-run `sift calibrate` on this model")]
    WrongModel { found: String, expected: String },
    /// A per-layer / per-site table whose shape disagrees with the model's (or the file's own
    /// header): refused up front, since the selectors and the static cache index these tables.
    #[error("{origin}: `{field}` has {found}, expected {expected}; the file is damaged or was made for another model: re-run `sift calibrate` on this model")]
    Shape { origin: String, field: String, expected: String, found: String },
    #[error("the calibration has no histogram for layer {layer} site {site}")]
    Missing { layer: usize, site: &'static str },
    #[error("the calibration has no weight-aware (WINA) score histograms: it was made before `sift calibrate` recorded them; run `sift calibrate` again")]
    NoWeightedHistograms,
    #[error("the calibration has no gate histograms (|act(gate)| per layer, for cats-threshold): it was made before `sift calibrate` recorded them; run `sift calibrate` again")]
    NoGateHistograms,
}

/// What [`Calibration::check_shapes`] asks of a histogram's total.
const HIST_TOTAL: &str = "values recorded, as many as the bins hold";

/// A histogram of |x| at one site of one layer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SiteHistogram {
    /// Counts per log-spaced bin (bin 0 also holds values below the range, the last above).
    pub bins: Vec<u64>,
    pub total: u64,
}

impl Default for SiteHistogram {
    fn default() -> Self {
        SiteHistogram { bins: vec![0; HIST_BINS], total: 0 }
    }
}

fn bin_of(v: f32) -> usize {
    if v.is_nan() || v <= HIST_LO {
        return 0;
    }
    let f = (v / HIST_LO).ln() / (HIST_HI / HIST_LO).ln();
    ((f * HIST_BINS as f32) as usize).min(HIST_BINS - 1)
}

fn bin_lower(b: usize) -> f32 {
    HIST_LO * (HIST_HI / HIST_LO).powf(b as f32 / HIST_BINS as f32)
}

impl SiteHistogram {
    pub fn add(&mut self, x: &[f32]) {
        if self.bins.len() != HIST_BINS {
            self.bins = vec![0; HIST_BINS];
        }
        for &v in x {
            self.bins[bin_of(v.abs())] += 1;
        }
        self.total += x.len() as u64;
    }

    /// Errors (what was found) unless the histogram recorded values and `total` is the sum of
    /// its bins: an all-zero table would make every threshold 0 (a dense run, silently).
    fn check_total(&self) -> Result<(), String> {
        let sum: u128 = self.bins.iter().map(|&b| b as u128).sum();
        if self.total == 0 || sum != self.total as u128 {
            return Err(format!("total {} with bins summing to {sum}", self.total));
        }
        Ok(())
    }

    /// The magnitude below which a fraction `ratio` of the recorded values lie (geometric
    /// interpolation inside the bin).
    pub fn threshold_for(&self, ratio: f32) -> f32 {
        if self.total == 0 || ratio <= 0.0 {
            return 0.0;
        }
        let target = ratio as f64 * self.total as f64;
        let mut below = 0f64;
        for (b, &c) in self.bins.iter().enumerate() {
            let next = below + c as f64;
            if next >= target && c > 0 {
                let frac = ((target - below) / c as f64).clamp(0.0, 1.0) as f32;
                let (lo, hi) = (bin_lower(b), bin_lower(b + 1));
                return lo * (hi / lo).powf(frac);
            }
            below = next;
        }
        HIST_HI
    }

    /// Fraction of recorded values with |x| below `t`.
    pub fn fraction_below(&self, t: f32) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let b = bin_of(t);
        let below: u64 = self.bins[..b].iter().sum();
        below as f64 / self.total as f64
    }
}

/// A greedy allocation of an overall ratio across sites and layers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Allocation {
    /// The overall fraction of the seven linears' weight bytes skipped.
    pub target: f32,
    /// `ratios[layer][site]`.
    pub ratios: Vec<[f32; 4]>,
}

/// k-means clusters of calibration sentences by their core-neuron frequencies (SparseInfer §4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CoreClusters {
    pub alpha: f32,
    /// `centroids[cluster][layer][neuron]`: mean core frequency, scaled to 0..=255.
    pub centroids: Vec<Vec<Vec<u8>>>,
    /// Calibration sentences per cluster.
    pub sizes: Vec<usize>,
}

impl CoreClusters {
    /// Index of the centroid nearest (squared Euclidean) to per-layer frequencies in [0, 1].
    pub fn nearest(&self, freq: &[Vec<f32>]) -> usize {
        let mut best = (f32::INFINITY, 0);
        for (c, cent) in self.centroids.iter().enumerate() {
            let d: f32 = cent
                .iter()
                .zip(freq)
                .map(|(cl, fl)| cl.iter().zip(fl).map(|(&a, &b)| (a as f32 / 255.0 - b).powi(2)).sum::<f32>())
                .sum();
            if d < best.0 {
                best = (d, c);
            }
        }
        best.1
    }

    /// k-means (k-means++-style deterministic seeding: farthest point) over sentences' per-layer
    /// frequency vectors, `iters` Lloyd iterations.
    pub fn kmeans(alpha: f32, sentences: &[Vec<Vec<f32>>], k: usize, iters: usize) -> CoreClusters {
        let flat: Vec<Vec<f32>> = sentences.iter().map(|s| s.concat()).collect();
        let k = k.clamp(1, flat.len().max(1));
        let dist = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>();
        let mut cents: Vec<Vec<f32>> = Vec::with_capacity(k);
        if let Some(first) = flat.first() {
            cents.push(first.clone());
        }
        while cents.len() < k {
            let far = (0..flat.len())
                .max_by(|&a, &b| {
                    let da = cents.iter().map(|c| dist(&flat[a], c)).fold(f32::INFINITY, f32::min);
                    let db = cents.iter().map(|c| dist(&flat[b], c)).fold(f32::INFINITY, f32::min);
                    da.total_cmp(&db)
                })
                .unwrap_or(0);
            cents.push(flat[far].clone());
        }
        let mut assign = vec![0usize; flat.len()];
        for _ in 0..iters {
            for (i, f) in flat.iter().enumerate() {
                assign[i] =
                    (0..cents.len()).min_by(|&a, &b| dist(f, &cents[a]).total_cmp(&dist(f, &cents[b]))).unwrap_or(0);
            }
            for (c, cent) in cents.iter_mut().enumerate() {
                let members: Vec<&Vec<f32>> =
                    flat.iter().zip(&assign).filter(|(_, &a)| a == c).map(|(f, _)| f).collect();
                if members.is_empty() {
                    continue;
                }
                for (j, v) in cent.iter_mut().enumerate() {
                    *v = members.iter().map(|m| m[j]).sum::<f32>() / members.len() as f32;
                }
            }
        }
        let layer_len: Vec<usize> = sentences.first().map(|s| s.iter().map(|l| l.len()).collect()).unwrap_or_default();
        let centroids = cents
            .iter()
            .map(|c| {
                let mut out = Vec::with_capacity(layer_len.len());
                let mut off = 0;
                for &n in &layer_len {
                    out.push(c[off..off + n].iter().map(|&v| (v.clamp(0.0, 1.0) * 255.0).round() as u8).collect());
                    off += n;
                }
                out
            })
            .collect();
        let sizes = (0..cents.len()).map(|c| assign.iter().filter(|&&a| a == c).count()).collect();
        CoreClusters { alpha, centroids, sizes }
    }
}

/// Everything `sift calibrate` measured for one model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Calibration {
    pub version: u32,
    /// The model file's name, for the reader's information.
    pub model: String,
    pub n_layer: usize,
    /// Units per site: qkv, o, gate_up, down.
    pub units: [usize; 4],
    /// Tokens the statistics were gathered over.
    pub n_tokens: usize,
    /// `histograms[layer][site]`.
    pub histograms: Vec<Vec<SiteHistogram>>,
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    #[serde(default)]
    pub clusters: Option<CoreClusters>,
    /// `channel_mean_abs[layer][site][c]`: mean |x_c| over the calibration tokens; ranks the hot
    /// channels a `static` cache pins (empty in files from before it was recorded).
    #[serde(default)]
    pub channel_mean_abs: Vec<Vec<Vec<f32>>>,
    /// The weight columns' norms per layer, site and channel (the weight-aware selectors' `‖W_:,i‖`;
    /// none in files from before they were recorded: then computed from the model at startup).
    #[serde(default)]
    pub column_norms: Option<ColumnNorms>,
    /// `weighted_histograms[layer][site]`: histograms of the weight-aware scores `|x_i| · ‖W_:,i‖`
    /// (`wina-threshold`'s thresholds; empty in files from before they were recorded).
    #[serde(default)]
    pub weighted_histograms: Vec<Vec<SiteHistogram>>,
    /// `gate_histograms[layer]`: histograms of each FFN neuron's `|act(gate)|` (gate first, CATS;
    /// `cats-threshold`'s thresholds; empty in files from before they were recorded).
    #[serde(default)]
    pub gate_histograms: Vec<SiteHistogram>,
}

impl Calibration {
    pub fn new(model: String, dims: SiteDims) -> Calibration {
        Calibration {
            version: CALIB_VERSION,
            model,
            n_layer: dims.n_layer,
            units: dims.units,
            n_tokens: 0,
            histograms: vec![vec![SiteHistogram::default(); 4]; dims.n_layer],
            allocations: Vec::new(),
            clusters: None,
            channel_mean_abs: (0..dims.n_layer).map(|_| dims.units.iter().map(|&n| vec![0.0; n]).collect()).collect(),
            column_norms: None,
            weighted_histograms: Vec::new(),
            gate_histograms: Vec::new(),
        }
    }

    /// Records the weight columns' norms and starts the weight-aware score histograms.
    pub fn set_column_norms(&mut self, norms: ColumnNorms) {
        self.weighted_histograms = vec![vec![SiteHistogram::default(); 4]; self.n_layer];
        self.column_norms = Some(norms);
    }

    /// Adds one activation row's weight-aware scores (`|x_i| · ‖W_:,i‖`) to its site's histogram,
    /// when the norms were set ([`Calibration::set_column_norms`]); `scratch` holds the scores.
    pub fn add_weighted(&mut self, layer: usize, site: Site, x: &[f32], scratch: &mut Vec<f32>) {
        let Some(norms) = &self.column_norms else { return };
        if let Some(h) = self.weighted_histograms.get_mut(layer).and_then(|r| r.get_mut(site.index())) {
            crate::weight_aware::weighted_scores(x, norms.site(layer, site), scratch);
            h.add(scratch);
        }
    }

    /// The weight-aware scores' histogram of `site` in `layer`.
    pub fn weighted_histogram(&self, layer: usize, site: Site) -> Result<&SiteHistogram, CalibrationError> {
        if self.weighted_histograms.is_empty() {
            return Err(CalibrationError::NoWeightedHistograms);
        }
        self.weighted_histograms
            .get(layer)
            .and_then(|h| h.get(site.index()))
            .ok_or(CalibrationError::Missing { layer, site: site.name() })
    }

    /// Starts the gate histograms (one per layer, empty) that [`Calibration::add_gate`] fills.
    pub fn start_gate_histograms(&mut self) {
        self.gate_histograms = vec![SiteHistogram::default(); self.n_layer];
    }

    /// Adds one token's `|act(gate)|` of every FFN neuron of `layer` to the layer's gate histogram
    /// (started by [`Calibration::start_gate_histograms`]).
    pub fn add_gate(&mut self, layer: usize, act_gate: &[f32]) {
        if let Some(h) = self.gate_histograms.get_mut(layer) {
            h.add(act_gate);
        }
    }

    /// The histogram of `|act(gate)|` of `layer`'s FFN neurons (`cats-threshold`).
    pub fn gate_histogram(&self, layer: usize) -> Result<&SiteHistogram, CalibrationError> {
        if self.gate_histograms.is_empty() {
            return Err(CalibrationError::NoGateHistograms);
        }
        self.gate_histograms.get(layer).ok_or(CalibrationError::Missing { layer, site: "gate" })
    }

    /// Adds one activation row to the channel sums (divide by the row count with
    /// [`Calibration::finish_channel_means`]).
    pub fn add_channel_abs(&mut self, layer: usize, site: Site, x: &[f32]) {
        if let Some(sums) = self.channel_mean_abs.get_mut(layer).and_then(|l| l.get_mut(site.index())) {
            for (s, v) in sums.iter_mut().zip(x) {
                *s += v.abs();
            }
        }
    }

    pub fn finish_channel_means(&mut self, rows: usize) {
        let k = 1.0 / rows.max(1) as f32;
        self.channel_mean_abs.iter_mut().flatten().flatten().for_each(|s| *s *= k);
    }

    /// Channels of `site` at `layer`, hottest (largest mean |x|) first, if recorded.
    pub fn hot_ranking(&self, layer: usize, site: Site) -> Option<Vec<u32>> {
        let m = self.channel_mean_abs.get(layer)?.get(site.index())?;
        if m.is_empty() || m.iter().all(|&v| v == 0.0) {
            return None;
        }
        let mut r: Vec<u32> = (0..m.len() as u32).collect();
        r.sort_by(|&a, &b| m[b as usize].total_cmp(&m[a as usize]).then(a.cmp(&b)));
        Some(r)
    }

    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let p = path.display().to_string();
        // A regular file of at most 1 GiB (a FIFO would block, a device never end).
        let bytes = sift_output::read_regular(path, 1 << 30)
            .map_err(|e| CalibrationError::Io { path: p.clone(), source: e })?;
        let text = String::from_utf8(bytes)
            .map_err(|e| CalibrationError::Parse { path: p.clone(), msg: format!("not UTF-8 text ({e})") })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| CalibrationError::Parse { path: p.clone(), msg: e.to_string() })?;
        match v.get("version").and_then(|v| v.as_u64()) {
            Some(x) if x as u32 == CALIB_VERSION => {}
            Some(x) => return Err(CalibrationError::Version { found: x as u32 }),
            None => return Err(CalibrationError::Parse { path: p, msg: "no \"version\" field".into() }),
        }
        let c: Calibration =
            serde_json::from_value(v).map_err(|e| CalibrationError::Parse { path: p.clone(), msg: e.to_string() })?;
        // Every table against the file's own header; `check_dims` compares the header with the model.
        c.check_shapes(|| format!("calibration file {p}"))?;
        Ok(c)
    }

    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let p = path.display().to_string();
        let text =
            serde_json::to_string(self).map_err(|e| CalibrationError::Parse { path: p.clone(), msg: e.to_string() })?;
        sift_output::write(path, &[], text.as_bytes()).map_err(|e| CalibrationError::Io { path: p, source: e.into() })
    }

    /// Errors unless the calibration was made for a model of this shape: its header (`n_layer`,
    /// `units`) and every per-layer / per-site table it holds (histograms, allocations, core
    /// clusters, channel means; see [`Calibration::check_shapes`]). Everything that indexes
    /// these tables by the model's layers and units (the selectors, the static cache's hot
    /// rankings) may rely on them once this has passed.
    pub fn check_dims(&self, dims: SiteDims) -> Result<(), CalibrationError> {
        if self.n_layer != dims.n_layer || self.units != dims.units {
            return Err(CalibrationError::WrongModel {
                found: format!("{} layers, units {:?}", self.n_layer, self.units),
                expected: format!("{} layers, units {:?}", dims.n_layer, dims.units),
            });
        }
        self.check_shapes(|| format!("calibration made from {}", self.model))
    }

    /// Errors ([`CalibrationError::Shape`], naming the field, the expected and the found shape)
    /// unless every table matches the header's `n_layer` and `units`: `histograms` is
    /// `n_layer × 4` histograms of the standard bin count; each allocation has `n_layer` rows of
    /// ratios in [0, 1); the core clusters are at least one centroid of `n_layer × units[down]`
    /// with one size each; `channel_mean_abs` is empty (files from before it was recorded) or
    /// `n_layer × 4 × units[site]`. `origin` names the calibration in the message.
    pub fn check_shapes(&self, origin: impl Fn() -> String) -> Result<(), CalibrationError> {
        let bad = |field: String, expected: String, found: String| CalibrationError::Shape {
            origin: origin(),
            field,
            expected,
            found,
        };
        let n_layer = self.n_layer;
        let layers = |n: usize| format!("{n} layers");
        let want_layers = || format!("{n_layer} layers (n_layer)");
        let sites = |n: usize| format!("{n} sites");
        let want_sites = || "4 sites (qkv, o, gate_up, down)".to_string();
        // One histogram, named `field`: the standard bins, and a total that is their sum.
        let check_hist = |h: &SiteHistogram, field: String| -> Result<(), CalibrationError> {
            if h.bins.len() != HIST_BINS {
                return Err(bad(
                    format!("{field}.bins"),
                    format!("{HIST_BINS} bins"),
                    format!("{} bins", h.bins.len()),
                ));
            }
            h.check_total().map_err(|found| bad(format!("{field}.total"), HIST_TOTAL.into(), found))
        };
        if self.histograms.len() != n_layer {
            return Err(bad("histograms".into(), want_layers(), layers(self.histograms.len())));
        }
        for (l, row) in self.histograms.iter().enumerate() {
            if row.len() != 4 {
                return Err(bad(format!("histograms[{l}]"), want_sites(), sites(row.len())));
            }
            for (s, h) in row.iter().enumerate() {
                check_hist(h, format!("histograms[{l}][{s}]"))?;
            }
        }
        if let Some(n) = &self.column_norms {
            let dims = SiteDims { n_layer, units: self.units };
            n.check(dims).map_err(|found| {
                bad("column_norms".into(), format!("{n_layer} layers × 4 sites × units, finite"), found)
            })?;
        }
        if !self.weighted_histograms.is_empty() {
            if self.column_norms.is_none() {
                return Err(bad("weighted_histograms".into(), "none without column_norms".into(), "histograms".into()));
            }
            if self.weighted_histograms.len() != n_layer {
                return Err(bad("weighted_histograms".into(), want_layers(), layers(self.weighted_histograms.len())));
            }
            for (l, row) in self.weighted_histograms.iter().enumerate() {
                if row.len() != 4 {
                    return Err(bad(format!("weighted_histograms[{l}]"), want_sites(), sites(row.len())));
                }
                for (s, h) in row.iter().enumerate() {
                    check_hist(h, format!("weighted_histograms[{l}][{s}]"))?;
                }
            }
        }
        if !self.gate_histograms.is_empty() {
            if self.gate_histograms.len() != n_layer {
                return Err(bad("gate_histograms".into(), want_layers(), layers(self.gate_histograms.len())));
            }
            for (l, h) in self.gate_histograms.iter().enumerate() {
                check_hist(h, format!("gate_histograms[{l}]"))?;
            }
        }
        for (i, a) in self.allocations.iter().enumerate() {
            if !(0.0..1.0).contains(&a.target) {
                return Err(bad(
                    format!("allocations[{i}].target"),
                    "a share in [0, 1)".into(),
                    format!("{}", a.target),
                ));
            }
            if a.ratios.len() != n_layer {
                return Err(bad(format!("allocations[{i}].ratios"), want_layers(), layers(a.ratios.len())));
            }
            for (l, row) in a.ratios.iter().enumerate() {
                for (s, &r) in row.iter().enumerate() {
                    if !(0.0..1.0).contains(&r) {
                        return Err(bad(
                            format!("allocations[{i}].ratios[{l}][{s}]"),
                            "a ratio in [0, 1)".into(),
                            format!("{r}"),
                        ));
                    }
                }
            }
        }
        if let Some(cl) = &self.clusters {
            let n_ff = self.units[Site::FfnMid.index()];
            if cl.centroids.is_empty() {
                return Err(bad("clusters.centroids".into(), "at least 1 centroid".into(), "none".into()));
            }
            for (c, cent) in cl.centroids.iter().enumerate() {
                if cent.len() != n_layer {
                    return Err(bad(format!("clusters.centroids[{c}]"), want_layers(), layers(cent.len())));
                }
                for (l, v) in cent.iter().enumerate() {
                    if v.len() != n_ff {
                        return Err(bad(
                            format!("clusters.centroids[{c}][{l}]"),
                            format!("{n_ff} neurons (units[3], the FFN width)"),
                            format!("{} neurons", v.len()),
                        ));
                    }
                }
            }
            if cl.sizes.len() != cl.centroids.len() {
                return Err(bad(
                    "clusters.sizes".into(),
                    format!("{} entries (one per centroid)", cl.centroids.len()),
                    format!("{} entries", cl.sizes.len()),
                ));
            }
        }
        if !self.channel_mean_abs.is_empty() {
            if self.channel_mean_abs.len() != n_layer {
                return Err(bad(
                    "channel_mean_abs".into(),
                    format!("{n_layer} layers (n_layer), or none"),
                    layers(self.channel_mean_abs.len()),
                ));
            }
            for (l, row) in self.channel_mean_abs.iter().enumerate() {
                if row.len() != 4 {
                    return Err(bad(format!("channel_mean_abs[{l}]"), want_sites(), sites(row.len())));
                }
                for (site, m) in Site::ALL.into_iter().zip(row) {
                    let n = self.units[site.index()];
                    if m.len() != n {
                        return Err(bad(
                            format!("channel_mean_abs[{l}][{}]", site.index()),
                            format!("{n} channels (units[{}], site {})", site.index(), site.name()),
                            format!("{} channels", m.len()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn histogram(&self, layer: usize, site: Site) -> Result<&SiteHistogram, CalibrationError> {
        self.histograms
            .get(layer)
            .and_then(|h| h.get(site.index()))
            .ok_or(CalibrationError::Missing { layer, site: site.name() })
    }

    /// The stored allocation whose target equals the overall ratio of a uniform `ratios` table
    /// (every sparsified site at the same value), else `ratios` itself. Returns how it was chosen.
    pub fn allocation_for(&self, ratios: &Ratios) -> (Ratios, String) {
        let r0 = ratios.get(0, Site::AttnIn);
        let uniform = ratios.table().iter().all(|row| row.iter().all(|&v| v == r0));
        if uniform {
            if let Some(a) = self.allocations.iter().find(|a| (a.target - r0).abs() < 1e-4) {
                if a.ratios.len() == ratios.n_layer() {
                    return (Ratios::from_table(a.ratios.clone()), format!("greedy allocation for {:.2}", a.target));
                }
            }
        }
        (ratios.clone(), format!("uniform {r0:.2}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_thresholds_match_quantiles() {
        let mut h = SiteHistogram::default();
        let xs: Vec<f32> = (1..=10000).map(|i| i as f32 * 1e-3).collect();
        h.add(&xs);
        for r in [0.1f32, 0.5, 0.9] {
            let t = h.threshold_for(r);
            let exact = r * 10.0;
            assert!((t - exact).abs() / exact < 0.01, "r={r}: {t} vs {exact}");
            assert!((h.fraction_below(t) - r as f64).abs() < 0.01);
        }
    }

    #[test]
    fn kmeans_separates_two_groups() {
        let a = vec![vec![1.0, 1.0, 0.0, 0.0]];
        let b = vec![vec![0.0, 0.0, 1.0, 1.0]];
        let s = vec![a.clone(), b.clone(), a.clone(), b.clone()];
        let c = CoreClusters::kmeans(0.4, &s, 2, 5);
        assert_eq!(c.sizes, vec![2, 2]);
        assert_ne!(c.nearest(&a), c.nearest(&b));
    }

    use crate::{build_selector, Method, Phase, Selection, SparsityConfig};

    const DIMS: SiteDims = SiteDims { n_layer: 3, units: [8, 8, 8, 12] };

    /// A complete calibration of a small model shape, filled the way `sift calibrate` fills one:
    /// histograms and channel means from activation rows, an allocation, core clusters by k-means.
    fn calibration() -> Calibration {
        let mut c = Calibration::new("test.gguf".into(), DIMS);
        let rows = 16;
        for t in 0..rows {
            for l in 0..DIMS.n_layer {
                for s in Site::ALL {
                    let x: Vec<f32> =
                        (0..DIMS.units[s.index()]).map(|j| ((j * 7 + t * 3 + l) % 11) as f32 * 0.1 - 0.3).collect();
                    c.histograms[l][s.index()].add(&x);
                    c.add_channel_abs(l, s, &x);
                }
            }
        }
        c.n_tokens = rows;
        c.finish_channel_means(rows);
        c.allocations.push(Allocation { target: 0.5, ratios: vec![[0.5; 4]; DIMS.n_layer] });
        let n_ff = DIMS.units[Site::FfnMid.index()];
        let sentence = |k: usize| -> Vec<Vec<f32>> {
            (0..DIMS.n_layer).map(|l| (0..n_ff).map(|j| ((j + k + l) % 4) as f32 / 3.0).collect()).collect()
        };
        c.clusters = Some(CoreClusters::kmeans(0.4, &[sentence(0), sentence(1), sentence(2)], 2, 5));
        c
    }

    fn config(method: Method) -> SparsityConfig {
        SparsityConfig {
            method,
            ratios: Ratios::uniform(method, DIMS.n_layer, 0.5).unwrap(),
            gamma: 0.2,
            cache_fraction: None,
            alpha: 0.4,
            core_magnitude: false,
        }
    }

    /// Builds `method`'s selector on `calib` and, if that succeeds, runs a prompt and a decoded
    /// token through it the way the engine does, checking every unit it returns is in range.
    fn build_and_run(method: Method, calib: &Calibration) -> Result<(), crate::SelectorError> {
        let mut sel = build_selector(&config(method), DIMS, Some(calib))?;
        let mut active = Vec::new();
        for phase in [Phase::Prompt, Phase::Generate] {
            sel.begin_batch(phase);
            for l in 0..DIMS.n_layer {
                for s in Site::ALL {
                    let n = DIMS.units[s.index()];
                    let x: Vec<f32> = (0..n).map(|j| j as f32 - 3.0).collect();
                    if sel.select(l, s, phase, &x, &mut active) == Selection::Subset {
                        assert!(active.iter().all(|&u| (u as usize) < n), "layer {l} {s:?}: {active:?}");
                    }
                }
            }
            sel.end_batch(phase);
        }
        Ok(())
    }

    /// Asserts `r` is a shape error that names `field` and says what to do.
    fn assert_shape_error<T>(r: Result<T, impl std::fmt::Display>, field: &str) {
        let msg = match r {
            Ok(_) => panic!("a calibration with a bad `{field}` was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(field), "the error should name `{field}`: {msg}");
        assert!(msg.contains("expected"), "the error should give the expected shape: {msg}");
        assert!(msg.contains("re-run `sift calibrate` on this model"), "the error should say what to do: {msg}");
    }

    #[test]
    fn a_complete_calibration_is_accepted() {
        let c = calibration();
        c.check_dims(DIMS).unwrap();
        for m in [Method::Threshold, Method::CoreSim, Method::Dip, Method::DipCa, Method::TopK] {
            build_and_run(m, &c).unwrap();
        }
        // Files from before the channel means were recorded have none: still valid.
        let mut old = c.clone();
        old.channel_mean_abs.clear();
        old.check_dims(DIMS).unwrap();
        assert!(old.hot_ranking(0, Site::FfnIn).is_none());
    }

    #[test]
    fn core_sim_refuses_centroids_of_the_wrong_shape() {
        // Fewer layers than the model: used to panic indexing `centroids[c][l]` at the prompt's end.
        let mut c = calibration();
        c.clusters.as_mut().unwrap().centroids[0].pop();
        assert_shape_error(build_and_run(Method::CoreSim, &c), "clusters.centroids[0]");
        // Too few neurons in one layer.
        let mut c = calibration();
        c.clusters.as_mut().unwrap().centroids[1][2].truncate(5);
        assert_shape_error(build_and_run(Method::CoreSim, &c), "clusters.centroids[1][2]");
        // Too many: the fixed set would name neurons the model does not have.
        let mut c = calibration();
        c.clusters.as_mut().unwrap().centroids[0][0].extend([255; 4]);
        assert_shape_error(build_and_run(Method::CoreSim, &c), "clusters.centroids[0][0]");
        // No clusters at all (k = 0): `nearest` would pick cluster 0 of none.
        let mut c = calibration();
        let cl = c.clusters.as_mut().unwrap();
        cl.centroids.clear();
        cl.sizes.clear();
        assert_shape_error(build_and_run(Method::CoreSim, &c), "clusters.centroids");
        let mut c = calibration();
        c.clusters.as_mut().unwrap().sizes.push(1);
        assert_shape_error(build_and_run(Method::CoreSim, &c), "clusters.sizes");
    }

    #[test]
    fn threshold_refuses_histograms_and_allocations_of_the_wrong_shape() {
        let mut c = calibration();
        c.histograms[1][3].bins.truncate(10);
        assert_shape_error(build_and_run(Method::Threshold, &c), "histograms[1][3].bins");
        let mut c = calibration();
        c.histograms[2].pop();
        assert_shape_error(build_and_run(Method::Threshold, &c), "histograms[2]");
        let mut c = calibration();
        c.allocations[0].ratios.pop();
        assert_shape_error(build_and_run(Method::Threshold, &c), "allocations[0].ratios");
        let mut c = calibration();
        c.allocations[0].ratios[1][2] = 1.5;
        assert_shape_error(build_and_run(Method::Threshold, &c), "allocations[0].ratios[1][2]");
    }

    #[test]
    fn channel_means_of_the_wrong_shape_are_refused() {
        // The static policy pins `hot_ranking`'s unit ids: a short list ranks too few channels,
        // a long one names channels the model does not have.
        let mut c = calibration();
        c.channel_mean_abs[1][2].truncate(3);
        assert_shape_error(c.check_dims(DIMS), "channel_mean_abs[1][2]");
        let mut c = calibration();
        c.channel_mean_abs[0][0].push(1.0);
        assert_shape_error(c.check_dims(DIMS), "channel_mean_abs[0][0]");
        let mut c = calibration();
        c.channel_mean_abs.pop();
        assert_shape_error(c.check_dims(DIMS), "channel_mean_abs");
        // Every selector is built through the same check.
        assert_shape_error(build_and_run(Method::Dip, &c), "channel_mean_abs");
    }

    #[test]
    fn load_refuses_a_file_whose_fields_disagree_with_its_header() {
        let dir = std::env::temp_dir().join(format!("sift-calib-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        let good = calibration();
        good.save(&path).unwrap();
        Calibration::load(&path).unwrap().check_dims(DIMS).unwrap();
        type Cut = fn(&mut serde_json::Value);
        let cases: [(&str, Cut); 4] = [
            ("clusters.centroids[0]", |v| {
                v["clusters"]["centroids"][0].as_array_mut().unwrap().pop();
            }),
            ("channel_mean_abs[2][3]", |v| {
                v["channel_mean_abs"][2][3].as_array_mut().unwrap().truncate(1);
            }),
            ("histograms[0][1].bins", |v| {
                v["histograms"][0][1]["bins"].as_array_mut().unwrap().truncate(1);
            }),
            ("histograms", |v| {
                v["histograms"].as_array_mut().unwrap().pop();
            }),
        ];
        for (field, cut) in cases {
            let mut v = serde_json::to_value(&good).unwrap();
            cut(&mut v);
            std::fs::write(&path, v.to_string()).unwrap();
            let r = Calibration::load(&path);
            if let Err(e) = &r {
                assert!(e.to_string().contains(&path.display().to_string()), "the error names the file: {e}");
            }
            assert_shape_error(r, field);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
