//! Calibration data (`sift calibrate`): activation-magnitude histograms per layer and site (TEAL's
//! way of turning a target sparsity into thresholds), greedy per-site allocations of an overall
//! ratio, and SparseInfer's core-neuron clusters. Saved as versioned JSON.

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
    #[error("the calibration was made for a different model shape ({found}), this model is {expected}; calibrate this model")]
    WrongModel { found: String, expected: String },
    #[error("the calibration has no histogram for layer {layer} site {site}")]
    Missing { layer: usize, site: &'static str },
}

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
        }
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
        let text = std::fs::read_to_string(path).map_err(|e| CalibrationError::Io { path: p.clone(), source: e })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| CalibrationError::Parse { path: p.clone(), msg: e.to_string() })?;
        match v.get("version").and_then(|v| v.as_u64()) {
            Some(x) if x as u32 == CALIB_VERSION => {}
            Some(x) => return Err(CalibrationError::Version { found: x as u32 }),
            None => return Err(CalibrationError::Parse { path: p, msg: "no \"version\" field".into() }),
        }
        let c: Calibration =
            serde_json::from_value(v).map_err(|e| CalibrationError::Parse { path: p.clone(), msg: e.to_string() })?;
        if c.histograms.len() != c.n_layer || c.histograms.iter().any(|h| h.len() != 4) {
            return Err(CalibrationError::Parse { path: p, msg: "histogram table does not match n_layer x 4".into() });
        }
        Ok(c)
    }

    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let p = path.display().to_string();
        let text =
            serde_json::to_string(self).map_err(|e| CalibrationError::Parse { path: p.clone(), msg: e.to_string() })?;
        std::fs::write(path, text).map_err(|e| CalibrationError::Io { path: p, source: e })
    }

    /// Errors unless the calibration was made for a model of this shape.
    pub fn check_dims(&self, dims: SiteDims) -> Result<(), CalibrationError> {
        if self.n_layer != dims.n_layer || self.units != dims.units {
            return Err(CalibrationError::WrongModel {
                found: format!("{} layers, units {:?}", self.n_layer, self.units),
                expected: format!("{} layers, units {:?}", dims.n_layer, dims.units),
            });
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
}
