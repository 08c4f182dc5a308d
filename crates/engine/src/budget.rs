//! Live memory-budget changes: another thread asks through a [`BudgetHandle`], the engine applies
//! the request between tokens (on the tiered store) and logs what happened as a [`BudgetChange`].

use sift_store::tiered::MemoryPlan;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A live budget change the engine applied (or refused) between tokens.
#[derive(Clone, Debug)]
pub struct BudgetChange {
    /// Tokens in the context when it was applied.
    pub n_past: usize,
    pub requested: u64,
    /// The new plan, or why the budget was refused (the old one stays).
    pub result: Result<MemoryPlan, String>,
    /// How long applying it took (evicting, compacting, returning memory).
    pub secs: f64,
    /// The process's resident memory right after (VmRSS), if known.
    pub rss_after: Option<u64>,
}

/// Asks a running engine for a new memory budget from any thread; the engine applies it before
/// its next batch (between tokens), see [`Engine::budget_handle`](crate::Engine::budget_handle).
#[derive(Clone, Debug)]
pub struct BudgetHandle(Arc<AtomicU64>);

impl BudgetHandle {
    /// Requests `bytes` (a later request replaces one not yet applied).
    pub fn request(&self, bytes: u64) {
        self.0.store(bytes.max(1), Ordering::SeqCst);
    }
}

/// The engine's side of live budget changes: the pending request, the log of applied ones, and
/// the part of every budget kept for work outside the engine.
#[derive(Default)]
pub(crate) struct LiveBudget {
    request: Arc<AtomicU64>,
    pub(crate) log: Vec<BudgetChange>,
    /// Bytes of every budget kept for work outside the engine (a server's requests,
    /// [`Engine::set_budget_reserve`]).
    pub(crate) reserve: u64,
}

impl LiveBudget {
    pub(crate) fn handle(&self) -> BudgetHandle {
        BudgetHandle(self.request.clone())
    }

    /// The budget asked for since the last call, if any.
    pub(crate) fn take_request(&self) -> Option<u64> {
        match self.request.swap(0, Ordering::SeqCst) {
            0 => None,
            b => Some(b),
        }
    }
}

/// The process's resident set (VmRSS) in bytes, where /proc tells it.
pub fn current_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
