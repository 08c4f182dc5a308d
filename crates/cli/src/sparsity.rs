//! The selection flags shared by every command that runs the model: `--sparsity METHOD --ratio R`
//! and their refinements, turned into a [`Selector`](sift_engine::sparsity::Selector) on an engine.

use anyhow::Context;
use clap::Args;
use sift_engine::sparsity::{build_selector, Calibration, Method, Ratios, SparsityConfig};
use sift_engine::Engine;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct SparsityArgs {
    /// Selection method: dense, topk, threshold, dip, dip-ca, glu, core, core-sim (default: dense;
    /// with --memory alone, the planner's choice)
    #[arg(long = "sparsity")]
    pub method: Option<Method>,
    /// Fraction of units skipped at each sparsified site (0 = dense)
    #[arg(long = "ratio", default_value_t = 0.5)]
    pub ratio: f64,
    /// JSON file with per-site / per-layer ratio overrides (see docs/sparsity.md)
    #[arg(long = "sparsity-config")]
    pub config: Option<PathBuf>,
    /// Calibration file from `sift calibrate` (threshold, core-sim)
    #[arg(long = "calib")]
    pub calib: Option<PathBuf>,
    /// DIP-CA: penalty for units not in cache (Eq. 10)
    #[arg(long = "gamma", default_value_t = 0.2)]
    pub gamma: f32,
    /// DIP-CA: cache size as a fraction of each site's units (default: 1 - ratio)
    #[arg(long = "cache-frac")]
    pub cache_frac: Option<f32>,
    /// core: token-wise fraction of positive activations that are core (SparseInfer's alpha)
    #[arg(long = "alpha", default_value_t = 0.4)]
    pub alpha: f32,
    /// core: rank neurons by |GLU| instead of positive GLU values (SwiGLU adaptation)
    #[arg(long = "core-magnitude")]
    pub core_magnitude: bool,
    /// Fraction of the output head's input channels skipped per token (magnitude Top-K)
    #[arg(long = "sparse-head", default_value_t = 0.0)]
    pub sparse_head: f32,
    /// With a .sift pack: decode sparse selections on the dense kernels with masked inputs instead
    /// of the column kernels (same results up to rounding; for comparisons)
    #[arg(long = "dense-kernels")]
    pub dense_kernels: bool,
    /// With a .sift pack: run every product of the seven linears on the re-quantized columns,
    /// prompts and dense selections too (measures what re-quantizing the columns costs)
    #[arg(long = "all-columns", conflicts_with = "dense_kernels")]
    pub all_columns: bool,
}

impl SparsityArgs {
    /// The method asked for (dense when none was).
    pub fn method(&self) -> Method {
        self.method.unwrap_or(Method::Dense)
    }

    /// Checks the flags; errors name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (0.0..1.0).contains(&self.sparse_head),
            "--sparse-head must be in [0, 1), got {}",
            self.sparse_head
        );
        if let Some(f) = self.cache_frac {
            anyhow::ensure!((0.0..=1.0).contains(&f), "--cache-frac must be in [0, 1], got {f}");
        }
        Ok(())
    }

    /// The config these flags describe for a model of `n_layer` layers.
    pub fn config(&self, n_layer: usize) -> anyhow::Result<SparsityConfig> {
        let method = self.method();
        let ratio = if method == Method::Dense { 0.0 } else { self.ratio };
        let mut ratios = Ratios::uniform(method, n_layer, ratio).context("--ratio")?;
        if let Some(p) = &self.config {
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read '{}'", p.display()))?;
            ratios.apply_overrides(method, &text).with_context(|| format!("in '{}'", p.display()))?;
        }
        Ok(SparsityConfig {
            method,
            ratios,
            gamma: self.gamma,
            cache_fraction: self.cache_frac,
            alpha: self.alpha,
            core_magnitude: self.core_magnitude,
        })
    }

    /// Flags for `method` at `ratio` with the other settings at their defaults.
    pub fn for_method(method: Method, ratio: f64, gamma: f32, calib: Option<PathBuf>) -> SparsityArgs {
        SparsityArgs {
            method: Some(method),
            ratio,
            config: None,
            calib,
            gamma,
            cache_frac: None,
            alpha: 0.4,
            core_magnitude: false,
            sparse_head: 0.0,
            dense_kernels: false,
            all_columns: false,
        }
    }

    /// The selector these flags describe, for `model`.
    pub fn selector(&self, model: &sift_model::Model) -> anyhow::Result<Box<dyn sift_engine::sparsity::Selector>> {
        self.validate()?;
        let c = &model.config;
        let dims =
            sift_engine::sparsity::SiteDims { n_layer: c.n_layer, units: [c.n_embd, c.n_embd_q(), c.n_embd, c.n_ff] };
        let cfg = self.config(dims.n_layer)?;
        let calib = match &self.calib {
            Some(p) => Some(Calibration::load(p)?),
            None => None,
        };
        Ok(build_selector(&cfg, dims, calib.as_ref())?)
    }

    /// Installs the selector on `engine`.
    pub fn apply(&self, engine: &mut Engine) -> anyhow::Result<()> {
        self.validate()?;
        let dims = engine.site_dims();
        let cfg = self.config(dims.n_layer)?;
        let calib = match &self.calib {
            Some(p) => Some(Calibration::load(p)?),
            None => None,
        };
        let sel = build_selector(&cfg, dims, calib.as_ref())?;
        engine.set_selector(sel);
        Ok(())
    }
}
