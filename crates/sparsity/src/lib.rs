//! Activation sparsity: which units of each linear op one token needs.
//!
//! A transformer layer has four places where a linear op reads an activation vector; sift calls
//! them [`Site`]s: the attention input (read by q, k and v), the attention output (read by o), the
//! FFN input (read by gate and up) and the FFN's GLU activation (read by down). A [`Selector`]
//! looks at the activation at a site and returns the *active input channels*: the columns of the
//! site's weight matrices that this token needs. Skipped channels contribute nothing, which is the
//! same as zeroing those inputs, so a selection can run either on sparse column kernels (only the
//! active columns are read) or, for measuring quality, on the dense kernels with masked inputs.
//!
//! The methods, chosen with `--sparsity METHOD --ratio R` (R = fraction of units skipped):
//! - `topk` ([`TopKSelector`]): per-token magnitude Top-K at every site (ActiveFlow, TEAL);
//! - `threshold` ([`ThresholdSelector`]): per-layer/per-site magnitude thresholds from
//!   `sift calibrate` ([`calib`]), with the ratio allocated across sites and layers;
//! - `dip` ([`DipSelector`]): Dynamic Input Pruning of the MLP (Top-K of |x| for gate/up, of |GLU|
//!   for down);
//! - `dip-ca` ([`DipSelector`] with a [`LfuCacheState`]): DIP with cache-aware re-weighting (DIP Eq. 10);
//! - `glu` ([`TopKSelector`] on the GLU site only): prune down-projection columns by |GLU|;
//! - `cats` ([`CatsSelector`]): CATS' gate-first FFN neurons: the gate product for every neuron,
//!   then up and down only for the neurons of largest |act(gate)| (whole neurons skipped);
//!   `cats-threshold` the same with the paper's per-layer thresholds from `sift calibrate`;
//! - `core` / `core-sim` ([`CoreNeuronSelector`]): SparseInfer's sentence-level core neurons,
//!   fixed at prefill (stability-guided) or taken from the nearest calibration cluster
//!   (similarity-guided);
//! - `wina` / `wina-threshold` ([`WeightAwareSelector`]): Top-K or calibrated thresholds over
//!   `|x_i| · ‖W_:,i‖`, the input times its weight column's norm (WINA);
//! - `dense` ([`DenseSelector`]).

#![forbid(unsafe_code)]

pub mod calib;
mod cats;
mod core_neurons;
mod dip;
mod ratios;
mod threshold;
mod topk;
pub mod weight_aware;

pub use calib::{Calibration, CalibrationError, SiteHistogram};
pub use cats::CatsSelector;
pub use core_neurons::{CoreNeuronSelector, CoreParams};
pub use dip::{DipSelector, LfuCacheState};
pub use ratios::{RatioError, Ratios};
pub use threshold::ThresholdSelector;
pub use topk::{top_k_indices, TopKSelector};
pub use weight_aware::{ColumnNorms, WeightAwareSelector};

use std::fmt;
use std::str::FromStr;

pub use sift_model::layout::{Site, SiteDims};

/// Whether the engine is reading a prompt or generating. Most selectors act the same in both;
/// core-neuron selection observes the prompt (dense) and fixes its set for generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Prompt,
    Generate,
}

/// The outcome of one selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Every unit is active (dense at this site).
    All,
    /// Only the units written to `active` (ascending) are.
    Subset,
}

/// A selection method: given a token's activation at a site, the active input units.
pub trait Selector: Send {
    /// A short description, e.g. `topk r=0.50`.
    fn describe(&self) -> String;
    /// A new sequence starts (the KV cache was cleared).
    fn reset(&mut self) {}
    /// A batch of tokens in `phase` is about to run.
    fn begin_batch(&mut self, _phase: Phase) {}
    /// The batch has run.
    fn end_batch(&mut self, _phase: Phase) {}
    /// Chooses the active units of `site` in `layer` for one token whose input there is `x`.
    /// Returns [`Selection::All`] for dense, or fills `active` (cleared first) with the active unit
    /// indices in ascending order.
    fn select(&mut self, layer: usize, site: Site, phase: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection;
    /// The FFN neurons of `layer` known to be active before the layer runs (ascending), for
    /// selectors that fix them in advance (core neurons while generating). The engine then
    /// computes only those rows of gate and up (row gather) and those columns of down.
    fn fixed_neurons(&self, _layer: usize, _phase: Phase) -> Option<&[u32]> {
        None
    }
    /// Whether the selector re-weights by what the weight cache holds (DIP-CA); the engine then
    /// calls [`Selector::observe_cache`] before each `select` under a memory budget (every token
    /// row, prompt and decode alike).
    fn wants_cache_state(&self) -> bool {
        false
    }
    /// The live cache state of `site` in `layer`: `cached[u]` is true when unit `u`'s weights
    /// are in memory. Valid for the next `select` of that (layer, site).
    fn observe_cache(&mut self, _layer: usize, _site: Site, _cached: &[bool]) {}
    /// Whether the selection depends on the sequence's own history (core neurons fixed at its
    /// prompt): such a selector serves one sequence at a time, not parallel ones (`-np`).
    fn keeps_sequence_state(&self) -> bool {
        false
    }
    /// Whether every unit is always active (the dense selector): the engine may then run layers
    /// without asking at each site (whole layers on the GPU).
    fn is_dense(&self) -> bool {
        false
    }
    /// Whether the FFN's neurons are chosen from the gate's activation before the up product
    /// (CATS): the engine then computes the gate product for every neuron, asks
    /// [`Selector::select`] at [`Site::FfnMid`] with `act(gate)`, and computes up and down for
    /// the chosen neurons only.
    fn gate_first(&self) -> bool {
        false
    }
}

/// Every unit active.
#[derive(Clone, Debug, Default)]
pub struct DenseSelector;

impl Selector for DenseSelector {
    fn describe(&self) -> String {
        "dense".into()
    }
    fn is_dense(&self) -> bool {
        true
    }
    fn select(&mut self, _: usize, _: Site, _: Phase, _: &[f32], _: &mut Vec<u32>) -> Selection {
        Selection::All
    }
}

/// The selection methods sift knows, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Dense,
    TopK,
    Threshold,
    Dip,
    DipCa,
    Glu,
    Cats,
    Core,
    CoreSim,
    Wina,
    WinaThreshold,
    CatsThreshold,
}

impl Method {
    pub const ALL: [Method; 12] = [
        Method::Dense,
        Method::TopK,
        Method::Threshold,
        Method::Dip,
        Method::DipCa,
        Method::Glu,
        Method::Cats,
        Method::Core,
        Method::CoreSim,
        Method::Wina,
        Method::WinaThreshold,
        Method::CatsThreshold,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Dense => "dense",
            Method::TopK => "topk",
            Method::Threshold => "threshold",
            Method::Dip => "dip",
            Method::DipCa => "dip-ca",
            Method::Glu => "glu",
            Method::Cats => "cats",
            Method::Core => "core",
            Method::CoreSim => "core-sim",
            Method::Wina => "wina",
            Method::WinaThreshold => "wina-threshold",
            Method::CatsThreshold => "cats-threshold",
        }
    }

    /// The sites a method sparsifies.
    pub fn sites(self) -> &'static [Site] {
        match self {
            Method::Dense => &[],
            Method::TopK | Method::Threshold | Method::Wina | Method::WinaThreshold => &Site::ALL,
            Method::Dip | Method::DipCa => &[Site::FfnIn, Site::FfnMid],
            Method::Glu | Method::Cats | Method::CatsThreshold | Method::Core | Method::CoreSim => &[Site::FfnMid],
        }
    }

    /// Whether the method needs a calibration file (`--calib`).
    pub fn needs_calibration(self) -> bool {
        matches!(self, Method::Threshold | Method::CoreSim | Method::WinaThreshold | Method::CatsThreshold)
    }

    /// Whether the method ranks inputs by their weight columns' norms (WINA).
    pub fn needs_column_norms(self) -> bool {
        matches!(self, Method::Wina | Method::WinaThreshold)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Method::ALL.iter().copied().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<_> = Method::ALL.iter().map(|m| m.name()).collect();
            format!("unknown sparsity method '{s}'; known: {}", names.join(", "))
        })
    }
}

/// Everything that defines a selection run, from the command line or a config file.
#[derive(Clone, Debug)]
pub struct SparsityConfig {
    pub method: Method,
    /// Fraction of units skipped at each sparsified site, per layer (after overrides).
    pub ratios: Ratios,
    /// DIP-CA's penalty for units not in cache (Eq. 10).
    pub gamma: f32,
    /// DIP-CA's cache size as a fraction of each site's units (None: 1 - ratio).
    pub cache_fraction: Option<f32>,
    /// SparseInfer's token-wise top-alpha fraction of positive activations.
    pub alpha: f32,
    /// Core neurons ranked by |GLU| instead of positive GLU values (see [`CoreParams`]).
    pub core_magnitude: bool,
}

/// Errors building a selector.
#[derive(Debug, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "--sparsity {0} needs a calibration file: run `sift calibrate MODEL -f TEXT -o CALIB` and pass --calib CALIB"
    )]
    NeedsCalibration(Method),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    #[error("{0}")]
    Invalid(String),
}

/// Builds the selector a config asks for. A calibration is checked against `dims` first
/// ([`Calibration::check_dims`]: its header and every per-layer / per-site table), so a file cut
/// short or made for another model is an error here rather than an index out of bounds later.
/// The weight-aware methods take their column norms from the calibration
/// ([`build_selector_with_norms`] gives them otherwise).
pub fn build_selector(
    cfg: &SparsityConfig,
    dims: SiteDims,
    calib: Option<&Calibration>,
) -> Result<Box<dyn Selector>, SelectorError> {
    build_selector_with_norms(cfg, dims, calib, None)
}

/// [`build_selector`], with the weight columns' norms for the weight-aware methods when the
/// calibration has none (computed from the model: `sift_engine::weight_norms`).
pub fn build_selector_with_norms(
    cfg: &SparsityConfig,
    dims: SiteDims,
    calib: Option<&Calibration>,
    norms: Option<std::sync::Arc<ColumnNorms>>,
) -> Result<Box<dyn Selector>, SelectorError> {
    if !(0.0..=1.0).contains(&cfg.gamma) {
        return Err(SelectorError::Invalid(format!("--gamma must be in [0, 1], got {}", cfg.gamma)));
    }
    if !(cfg.alpha > 0.0 && cfg.alpha <= 1.0) {
        return Err(SelectorError::Invalid(format!("--alpha must be in (0, 1], got {}", cfg.alpha)));
    }
    if let Some(c) = calib {
        c.check_dims(dims)?;
    }
    let r = cfg.ratios.clone();
    let column_norms = || -> Result<std::sync::Arc<ColumnNorms>, SelectorError> {
        let n = match (calib.and_then(|c| c.column_norms.clone()), norms.clone()) {
            (Some(n), _) => std::sync::Arc::new(n),
            (None, Some(n)) => n,
            (None, None) => {
                return Err(SelectorError::Invalid(format!(
                    "--sparsity {} needs the weight columns' norms: give a calibration that has them (`sift calibrate`) or let sift compute them from the model",
                    cfg.method
                )))
            }
        };
        n.check(dims).map_err(|e| SelectorError::Invalid(format!("weight column norms do not fit this model: {e}")))?;
        Ok(n)
    };
    Ok(match cfg.method {
        Method::Dense => Box::new(DenseSelector),
        Method::TopK => Box::new(TopKSelector::new("topk", r)),
        Method::Glu => Box::new(TopKSelector::new("glu", r)),
        Method::Cats => Box::new(CatsSelector::new(r)),
        Method::CatsThreshold => {
            let c = calib.ok_or(SelectorError::NeedsCalibration(cfg.method))?;
            Box::new(CatsSelector::threshold(c, &r)?)
        }
        Method::Threshold => {
            let c = calib.ok_or(SelectorError::NeedsCalibration(cfg.method))?;
            Box::new(ThresholdSelector::new(c, &r)?)
        }
        Method::Dip => Box::new(DipSelector::new(r, None)),
        Method::Wina => Box::new(WeightAwareSelector::top_k(column_norms()?, r)),
        Method::WinaThreshold => {
            let c = calib.ok_or(SelectorError::NeedsCalibration(cfg.method))?;
            Box::new(WeightAwareSelector::threshold(column_norms()?, c, &r)?)
        }
        Method::DipCa => {
            let frac = |l: usize, s: Site| cfg.cache_fraction.unwrap_or(1.0 - r.get(l, s));
            let cache = LfuCacheState::new(dims, &[Site::FfnIn, Site::FfnMid], frac);
            Box::new(DipSelector::new(r, Some((cache, cfg.gamma))))
        }
        Method::Core => Box::new(CoreNeuronSelector::new(
            dims,
            r,
            CoreParams { alpha: cfg.alpha, magnitude: cfg.core_magnitude },
            None,
        )),
        Method::CoreSim => {
            let c = calib.ok_or(SelectorError::NeedsCalibration(cfg.method))?;
            let clusters = c.clusters.clone().ok_or_else(|| {
                SelectorError::Invalid(
                    "the calibration file has no core-neuron clusters; run `sift calibrate` with --clusters K".into(),
                )
            })?;
            Box::new(CoreNeuronSelector::new(
                dims,
                r,
                CoreParams { alpha: cfg.alpha, magnitude: cfg.core_magnitude },
                Some(clusters),
            ))
        }
    })
}
