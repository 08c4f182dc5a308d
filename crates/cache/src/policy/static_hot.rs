//! PowerInfer-style offline placement: a hot set pinned from a profile ranking.

use super::ReplacementPolicy;
use crate::NO_SLOT;

/// The hottest units of a ranking ([`UnitCache::set_hot`](crate::UnitCache::set_hot)) stay
/// cached and nothing ever moves afterwards; shrinking the cache drops the lowest ranked first.
#[derive(Clone, Debug)]
pub struct StaticHotSet {
    /// Per unit: rank in the pinned set, or `NO_SLOT` when not pinned.
    hot_rank: Vec<u32>,
}

impl StaticHotSet {
    pub fn new(n_units: usize) -> StaticHotSet {
        StaticHotSet { hot_rank: vec![NO_SLOT; n_units] }
    }
}

impl ReplacementPolicy for StaticHotSet {
    fn tracks_time(&self) -> bool {
        false
    }

    fn record(&mut self, _active: &[u32], _now: u32) {}

    /// Minus the rank: the lowest ranked goes first.
    #[inline]
    fn score(&self, unit: u32, _now: u32) -> f64 {
        -(self.hot_rank[unit as usize] as f64)
    }

    fn admits(&self) -> bool {
        false
    }

    fn beats(&self, _candidate: f64, _victim: f64) -> bool {
        false
    }

    fn pin(&mut self, ranking: &[u32], slots: usize) -> bool {
        self.hot_rank.fill(NO_SLOT);
        let mut n = 0u32;
        for &u in ranking {
            if n as usize == slots {
                break;
            }
            if self.hot_rank[u as usize] == NO_SLOT {
                self.hot_rank[u as usize] = n;
                n += 1;
            }
        }
        true
    }

    #[inline]
    fn is_pinned(&self, unit: u32) -> bool {
        self.hot_rank[unit as usize] != NO_SLOT
    }
}
