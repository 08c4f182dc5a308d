//! Least recently used: the strawman of KAIROX §3.2.

use super::ReplacementPolicy;

/// Always admits a miss, evicting the resident accessed least recently (admission counts as an
/// access); ties go to the lowest id.
#[derive(Clone, Debug)]
pub struct LruPolicy {
    /// Per unit: tick of the last access.
    last: Vec<u32>,
}

impl LruPolicy {
    pub fn new(n_units: usize) -> LruPolicy {
        LruPolicy { last: vec![0; n_units] }
    }
}

impl ReplacementPolicy for LruPolicy {
    fn record(&mut self, active: &[u32], now: u32) {
        for &u in active {
            self.last[u as usize] = now;
        }
    }

    /// Every unit scores the same: the order is the access ticks'.
    #[inline]
    fn score(&self, _unit: u32, _now: u32) -> f64 {
        0.0
    }

    #[inline]
    fn last_access(&self, unit: u32) -> u32 {
        self.last.get(unit as usize).copied().unwrap_or(0)
    }

    #[inline]
    fn beats(&self, _candidate: f64, _victim: f64) -> bool {
        true
    }

    fn admitted(&mut self, unit: u32, now: u32) {
        self.last[unit as usize] = now;
    }
}
