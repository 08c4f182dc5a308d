//! ActiveFlow §4.2 "Dynamic LLM Weight Caching": context-level least-frequently-used.

use super::ReplacementPolicy;

/// One usage counter per unit, counting the tokens that activated it since the context began. A
/// miss evicts the least-used resident only when its own count is strictly higher ("if a newly
/// activated channel has a higher count than the least-used channel in the cache, we evict the
/// least-used channel"); ties among victims go to the least recently used, then the lowest id.
#[derive(Clone, Debug)]
pub struct ActiveFlowLfu {
    /// Per unit: activations in this context.
    counts: Vec<u32>,
    /// Per unit: tick of the last activation.
    last: Vec<u32>,
}

impl ActiveFlowLfu {
    pub fn new(n_units: usize) -> ActiveFlowLfu {
        ActiveFlowLfu { counts: vec![0; n_units], last: vec![0; n_units] }
    }

    /// Activations of `unit` in this context (0 for a unit out of range).
    pub fn count(&self, unit: u32) -> u32 {
        self.counts.get(unit as usize).copied().unwrap_or(0)
    }
}

impl ReplacementPolicy for ActiveFlowLfu {
    fn record(&mut self, active: &[u32], now: u32) {
        for &u in active {
            let u = u as usize;
            self.counts[u] = self.counts[u].saturating_add(1);
            self.last[u] = now;
        }
    }

    #[inline]
    fn score(&self, unit: u32, _now: u32) -> f64 {
        self.counts[unit as usize] as f64
    }

    #[inline]
    fn last_access(&self, unit: u32) -> u32 {
        self.last.get(unit as usize).copied().unwrap_or(0)
    }

    fn reset_context(&mut self) {
        self.counts.fill(0);
    }
}
