//! KAIROX's feedback-driven tuning of TAM's decay λ (§7, Algorithm 1, phase 1): per layer, the
//! stall type of each decoded step moves λ. I/O-bound steps (the compute side waited for reads)
//! raise it by a factor `1 + α` (more inertia: cold units need a longer activation window to
//! pass the load threshold `τ_load = (1 − λ) + ε`, so fewer are loaded); compute-bound steps lower
//! it by `1 − α` (the cache follows recent activations faster); λ stays within `[λ_min, λ_max]`.
//!
//! [`LambdaController`] knows nothing of where the time was measured or what the cache is: the
//! flash tier's store feeds it each layer's wait and compute time, and a GPU tier can feed it its
//! own pipeline's stalls. It keeps the recent history of λ per layer for plots.

use std::collections::VecDeque;

/// What held a step back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bottleneck {
    /// The compute side waited for reads longer than the band allows.
    Io,
    /// Reads waited for compute (or no reads were waited for).
    Compute,
    /// Neither by more than the band: λ stays.
    Balanced,
}

impl Bottleneck {
    /// A step that waited `stall_ns` for reads and computed `compute_ns`: I/O-bound when the
    /// wait's share of the step is above `0.5 + band`, compute-bound below `0.5 − band`.
    pub fn classify(stall_ns: f64, compute_ns: f64, band: f64) -> Bottleneck {
        let total = stall_ns.max(0.0) + compute_ns.max(0.0);
        if total <= 0.0 {
            return Bottleneck::Balanced;
        }
        let io_share = stall_ns.max(0.0) / total;
        if io_share > 0.5 + band {
            Bottleneck::Io
        } else if io_share < 0.5 - band {
            Bottleneck::Compute
        } else {
            Bottleneck::Balanced
        }
    }
}

/// The controller's settings.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LambdaBounds {
    pub min: f32,
    pub max: f32,
    /// Adjustment rate per step.
    pub alpha: f32,
    /// Dead band of [`Bottleneck::classify`] around an even split.
    pub band: f32,
}

impl Default for LambdaBounds {
    /// λ between 0.5 (KAIROX's starting value) and 0.95, 5 % per step, a ±10 % dead band.
    fn default() -> Self {
        LambdaBounds { min: 0.5, max: 0.95, alpha: 0.05, band: 0.1 }
    }
}

/// One observation: a layer's step, its stall type and λ after it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LambdaStep {
    pub step: u32,
    pub layer: u32,
    pub bottleneck: Bottleneck,
    pub lambda: f32,
    /// Units the layer's caches loaded (admitted) in the step.
    pub loads: u32,
}

/// Per layer λ, moved by each step's stall type (Algorithm 1, lines 1-6).
#[derive(Clone, Debug)]
pub struct LambdaController {
    bounds: LambdaBounds,
    lambda: Vec<f32>,
    history: VecDeque<LambdaStep>,
}

/// Observations kept for plots (the oldest are dropped).
pub const HISTORY_CAP: usize = 1 << 16;

impl LambdaController {
    /// `n_layers` layers starting at `lambda0` (clamped into the bounds). Panics if the bounds
    /// are not `0 <= min <= max < 1` with `alpha` in `[0, 1)`.
    pub fn new(n_layers: usize, lambda0: f32, bounds: LambdaBounds) -> LambdaController {
        assert!(
            0.0 <= bounds.min && bounds.min <= bounds.max && bounds.max < 1.0,
            "adaptive TAM: λ bounds {}..{} must satisfy 0 <= min <= max < 1",
            bounds.min,
            bounds.max
        );
        assert!((0.0..1.0).contains(&bounds.alpha), "adaptive TAM: α {} outside [0, 1)", bounds.alpha);
        let l0 = lambda0.clamp(bounds.min, bounds.max);
        LambdaController { bounds, lambda: vec![l0; n_layers], history: VecDeque::new() }
    }

    pub fn bounds(&self) -> LambdaBounds {
        self.bounds
    }

    /// Layer `layer`'s λ now.
    pub fn lambda(&self, layer: usize) -> f32 {
        self.lambda[layer]
    }

    /// Step `step` of `layer` waited `stall_ns` for reads, computed `compute_ns` and loaded
    /// `loads` units: moves the layer's λ and returns it.
    pub fn observe(&mut self, step: u32, layer: usize, stall_ns: f64, compute_ns: f64, loads: u32) -> f32 {
        let b = self.bounds;
        let bottleneck = Bottleneck::classify(stall_ns, compute_ns, f64::from(b.band));
        let l = &mut self.lambda[layer];
        *l = match bottleneck {
            Bottleneck::Io => (*l * (1.0 + b.alpha)).min(b.max),
            Bottleneck::Compute => (*l * (1.0 - b.alpha)).max(b.min),
            Bottleneck::Balanced => *l,
        };
        if self.history.len() == HISTORY_CAP {
            self.history.pop_front();
        }
        self.history.push_back(LambdaStep { step, layer: layer as u32, bottleneck, lambda: *l, loads });
        *l
    }

    /// The recent observations, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &LambdaStep> {
        self.history.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1e6;

    #[test]
    fn stalls_are_classified_by_their_share_of_the_step() {
        assert_eq!(Bottleneck::classify(8.0 * MS, 2.0 * MS, 0.1), Bottleneck::Io);
        assert_eq!(Bottleneck::classify(1.0 * MS, 9.0 * MS, 0.1), Bottleneck::Compute);
        assert_eq!(Bottleneck::classify(5.5 * MS, 4.5 * MS, 0.1), Bottleneck::Balanced);
        assert_eq!(Bottleneck::classify(0.0, 3.0 * MS, 0.1), Bottleneck::Compute);
        assert_eq!(Bottleneck::classify(0.0, 0.0, 0.1), Bottleneck::Balanced);
    }

    #[test]
    fn io_bound_steps_raise_lambda_to_its_max_and_compute_bound_ones_lower_it_to_its_min() {
        let bounds = LambdaBounds { min: 0.5, max: 0.9, alpha: 0.1, band: 0.1 };
        let mut c = LambdaController::new(2, 0.6, bounds);
        // Layer 0 I/O-bound: 0.6 · 1.1 = 0.66, · 1.1 = 0.726, 0.7986, 0.87846, then capped at 0.9.
        let expect = [0.66, 0.726, 0.7986, 0.87846, 0.9, 0.9];
        for (t, &e) in expect.iter().enumerate() {
            let l = c.observe(t as u32, 0, 9.0 * MS, 1.0 * MS, 3);
            assert!((l - e).abs() < 1e-5, "step {t}: λ {l}, expected {e}");
        }
        // Layer 1 compute-bound: 0.6 · 0.9 = 0.54, then floored at 0.5; layer 0 untouched.
        assert!((c.observe(6, 1, 0.0, 5.0 * MS, 0) - 0.54).abs() < 1e-6);
        assert_eq!(c.observe(7, 1, 0.0, 5.0 * MS, 0), 0.5);
        assert_eq!(c.lambda(0), 0.9);
        // Balanced steps leave λ where it is; the threshold follows: τ = 1 − λ + ε.
        assert_eq!(c.observe(8, 0, 5.0 * MS, 5.0 * MS, 0), 0.9);
        let h: Vec<&LambdaStep> = c.history().collect();
        assert_eq!(h.len(), 9);
        assert_eq!(h[0].bottleneck, Bottleneck::Io);
        assert_eq!(h[6].layer, 1);
        assert_eq!(h[8].bottleneck, Bottleneck::Balanced);
    }

    #[test]
    fn alternating_stalls_keep_lambda_within_its_bounds_and_history_is_capped() {
        let mut c = LambdaController::new(1, 0.8, LambdaBounds::default());
        for t in 0..HISTORY_CAP as u32 + 10 {
            let (s, k) = if t % 2 == 0 { (9.0, 1.0) } else { (1.0, 9.0) };
            let l = c.observe(t, 0, s * MS, k * MS, 0);
            assert!((0.5..=0.95).contains(&l), "step {t}: λ {l} left its bounds");
        }
        assert_eq!(c.history().count(), HISTORY_CAP);
        assert_eq!(c.history().next().unwrap().step, 10);
    }

    #[test]
    #[should_panic(expected = "must satisfy")]
    fn bounds_past_one_are_refused() {
        LambdaController::new(1, 0.5, LambdaBounds { min: 0.5, max: 1.0, alpha: 0.1, band: 0.1 });
    }
}
