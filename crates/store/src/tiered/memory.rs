//! The tiered store as everything outside it sees it: [`MemoryTier`], one small interface for
//! the budget, the KV cache's growth inside it, the counters and what the cache holds. The engine
//! hands it out (`Engine::memory`); reports, the server, the bench and the simulator's bound read
//! and change a budgeted run through it without naming the store's type.

use super::{MemoryPlan, TierError, TierStats, TieredStore};
use crate::cache::LambdaStep;
use sift_model::layout::OpKind;

/// How a budgeted run's store was set up, for reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierSettings {
    /// The cache policy's name (`lfu`, `tam`, ...).
    pub policy: &'static str,
    /// Layers preloaded ahead (0: none).
    pub preload_layers: usize,
    /// Whether preloads read the pack's interleaved cross-layer records.
    pub interleaved: bool,
    /// The slow tier (`io_uring`, `pread`, `memory`, `simulated`).
    pub io: &'static str,
}

/// A budgeted run's memory: its plan and counters, the two changes a running engine makes (the
/// budget, the KV cache's growth), and what the cache holds.
pub trait MemoryTier: Send {
    /// The plan in force: the budget and how it is spent.
    fn plan(&self) -> &MemoryPlan;
    /// Hits, misses and bytes read since the last [`MemoryTier::reset_stats`].
    fn stats(&self) -> &TierStats;
    fn reset_stats(&mut self);
    /// A new budget (cache slots given back or added); refused, with nothing changed, when it
    /// cannot hold the run.
    fn set_budget(&mut self, budget: u64) -> Result<&MemoryPlan, TierError>;
    /// The KV cache's bytes past its first page, taken from the cache; refused when they do not
    /// fit.
    fn set_kv_growth(&mut self, bytes: u64) -> Result<&MemoryPlan, TierError>;
    fn settings(&self) -> TierSettings;
    /// Bytes the cache arena holds now.
    fn arena_bytes(&self) -> usize;
    /// Slots and occupied slots of (layer, op).
    fn occupancy(&self, layer: usize, op: OpKind) -> (usize, usize);
    /// The columns of (layer, op) in the cache, ascending.
    fn cached_units(&self, layer: usize, op: OpKind) -> Vec<u32>;
    /// Adaptive TAM's λ per layer and step (empty for other policies).
    fn lambda_history(&self) -> Vec<LambdaStep>;
}

impl MemoryTier for TieredStore {
    fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    fn stats(&self) -> &TierStats {
        TieredStore::stats(self)
    }

    fn reset_stats(&mut self) {
        TieredStore::reset_stats(self)
    }

    fn set_budget(&mut self, budget: u64) -> Result<&MemoryPlan, TierError> {
        TieredStore::set_budget(self, budget)
    }

    fn set_kv_growth(&mut self, bytes: u64) -> Result<&MemoryPlan, TierError> {
        TieredStore::set_kv_growth(self, bytes)
    }

    fn settings(&self) -> TierSettings {
        TierSettings {
            policy: self.policy().name(),
            preload_layers: self.preload_layers(),
            interleaved: self.interleaved(),
            io: self.tier_name(),
        }
    }

    fn arena_bytes(&self) -> usize {
        TieredStore::arena_bytes(self)
    }

    fn occupancy(&self, layer: usize, op: OpKind) -> (usize, usize) {
        TieredStore::occupancy(self, layer, op)
    }

    fn cached_units(&self, layer: usize, op: OpKind) -> Vec<u32> {
        TieredStore::cached_units(self, layer, op)
    }

    fn lambda_history(&self) -> Vec<LambdaStep> {
        TieredStore::lambda_history(self)
    }
}
