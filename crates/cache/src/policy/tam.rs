//! KAIROX §6 "Temporal Activation Momentum" (TAM).

use super::ReplacementPolicy;

/// Momentum `S ← λ·S + (1−λ)·A` per unit and token (`A` = 1 when active). Only units with
/// `S > τ_load = (1−λ) + ε` may enter, which filters "one-hit wonders" (a cold unit after one
/// isolated activation has exactly `1−λ`); the cache keeps the top-scoring units (Algorithm 1,
/// line 16), so a candidate evicts the lowest-momentum resident only when its momentum is higher.
///
/// Momentum decays lazily: each unit stores `S` as of its last activation tick and its value now
/// is `S·λ^(now − tick)`, which equals updating every unit every token at O(active) per token.
/// λ is fixed here; a controller that moves it at run time is the caller's business.
#[derive(Clone, Debug)]
pub struct TamPolicy {
    lambda: f32,
    eps: f32,
    /// Per unit: momentum as of tick `last[unit]`.
    momentum: Vec<f32>,
    /// Per unit: tick of the last activation (when `momentum` was last updated).
    last: Vec<u32>,
}

impl TamPolicy {
    /// Panics if `lambda` is outside `[0, 1)` or `eps` is not finite.
    pub fn new(n_units: usize, lambda: f32, eps: f32) -> TamPolicy {
        assert!((0.0..1.0).contains(&lambda), "UnitCache: TAM lambda {lambda} outside [0, 1)");
        assert!(eps.is_finite(), "UnitCache: TAM eps {eps} not finite");
        TamPolicy { lambda, eps, momentum: vec![0.0; n_units], last: vec![0; n_units] }
    }

    /// The admission threshold `τ_load = (1 − λ) + ε`.
    pub fn threshold(&self) -> f32 {
        (1.0 - self.lambda) + self.eps
    }

    /// `unit`'s momentum at tick `now`.
    #[inline]
    pub fn momentum(&self, unit: u32, now: u32) -> f32 {
        let u = unit as usize;
        let dt = now - self.last[u];
        let s = self.momentum[u];
        if dt == 0 || s == 0.0 {
            s
        } else {
            s * self.lambda.powi(dt.min(i32::MAX as u32) as i32)
        }
    }
}

impl ReplacementPolicy for TamPolicy {
    fn record(&mut self, active: &[u32], now: u32) {
        for &u in active {
            // λ·S(now − 1) = S(last)·λ^(now − last); then add (1 − λ)·1.
            let s = self.momentum(u, now) + (1.0 - self.lambda);
            self.momentum[u as usize] = s;
            self.last[u as usize] = now;
        }
    }

    #[inline]
    fn score(&self, unit: u32, now: u32) -> f64 {
        self.momentum(unit, now) as f64
    }

    #[inline]
    fn last_access(&self, unit: u32) -> u32 {
        self.last.get(unit as usize).copied().unwrap_or(0)
    }

    #[inline]
    fn eligible(&self, score: f64) -> bool {
        score > f64::from(self.threshold())
    }

    fn reset_context(&mut self) {
        self.momentum.fill(0.0);
    }
}
