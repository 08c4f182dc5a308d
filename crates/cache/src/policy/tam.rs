//! KAIROX §6 "Temporal Activation Momentum" (TAM).

use super::ReplacementPolicy;

/// Momentum `S ← λ·S + (1−λ)·A` per unit and token (`A` = 1 when active). Only units with
/// `S > τ_load = (1−λ) + ε` may enter, which filters "one-hit wonders" (a cold unit after one
/// isolated activation has exactly `1−λ`); the cache keeps the top-scoring units (Algorithm 1,
/// line 16), so a candidate evicts the lowest-momentum resident only when its momentum is higher.
///
/// Momentum decays lazily: each unit stores `S` as of its last activation tick and its value now
/// is `S·λ^(now − tick)`, which equals updating every unit every token at O(active) per token.
/// λ may be moved at run time ([`TamPolicy::set_lambda`], adaptive TAM): momentum accumulated
/// before the change keeps its value and decays at the new λ from then on.
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

    /// Sets λ (clamped into `[0, 0.999]`): later activations add `1 − λ`, and every unit's
    /// momentum decays at the new λ from now on (each unit's stored momentum is first brought up
    /// to `now` at the old one).
    pub fn set_lambda(&mut self, lambda: f32, now: u32) {
        let lambda = if lambda.is_finite() { lambda.clamp(0.0, 0.999) } else { self.lambda };
        if lambda == self.lambda {
            return;
        }
        for u in 0..self.momentum.len() {
            if self.momentum[u] != 0.0 {
                self.momentum[u] = self.momentum(u as u32, now);
                self.last[u] = now;
            }
        }
        self.lambda = lambda;
    }

    /// λ now.
    pub fn lambda(&self) -> f32 {
        self.lambda
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_lambda_keeps_momentum_earned_and_decays_at_the_new_rate_from_then_on() {
        let mut t = TamPolicy::new(2, 0.5, 0.0);
        t.record(&[0], 1); // 0.5
        t.record(&[0], 2); // 0.75
        assert!((t.momentum(0, 4) - 0.1875).abs() < 1e-6); // two idle ticks at 0.5
        t.set_lambda(0.9, 4);
        assert!((t.lambda() - 0.9).abs() < 1e-6);
        assert!((t.threshold() - 0.1).abs() < 1e-6);
        // The momentum at the change is kept; afterwards it decays by 0.9 per tick.
        assert!((t.momentum(0, 4) - 0.1875).abs() < 1e-6);
        assert!((t.momentum(0, 6) - 0.1875 * 0.81).abs() < 1e-6);
        // An activation now adds 1 − λ = 0.1.
        t.record(&[1], 5);
        assert!((t.momentum(1, 5) - 0.1).abs() < 1e-6);
        // Nonsense is ignored, out-of-range values clamped.
        t.set_lambda(f32::NAN, 6);
        assert!((t.lambda() - 0.9).abs() < 1e-6);
        t.set_lambda(2.0, 6);
        assert!(t.lambda() < 1.0);
    }
}
