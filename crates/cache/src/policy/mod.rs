//! Replacement policies: what each one remembers about the units and how it ranks them.
//!
//! A [`UnitCache`](crate::UnitCache) owns the slots and runs the one batch admission rule of the
//! crate docs; a [`ReplacementPolicy`] supplies the policy's side of it: the state it keeps per
//! token ([`record`](ReplacementPolicy::record)), a score per unit (higher stays), whether a miss
//! may enter at all and whether it may evict a given resident. One implementation per policy,
//! named after where it comes from:
//!
//! | [`crate::Policy`] | implementation | source |
//! |---|---|---|
//! | `lfu` | [`ActiveFlowLfu`] | ActiveFlow §4.2, context-level LFU with strict admission |
//! | `lru` | [`LruPolicy`] | the strawman of KAIROX §3.2 |
//! | `tam` | [`TamPolicy`] | KAIROX §6, Temporal Activation Momentum |
//! | `tam-adaptive` | [`TamPolicy`], λ moved by [`crate::adaptive`] | KAIROX §7, Algorithm 1 |
//! | `static` | [`StaticHotSet`] | PowerInfer-style offline hot set |
//! | `none` | [`NoCache`] | no cache |
//! | `belady` | [`BeladyOracle`] | Belady's MIN with bypass (simulation only) |
//!
//! The cache holds the policy in [`PolicyState`], an enum over the six, so every call is a static
//! dispatch the compiler can inline (scores are asked once per resident when victims are chosen).

mod belady;
mod lfu;
mod lru;
mod static_hot;
mod tam;

pub use belady::BeladyOracle;
pub use lfu::ActiveFlowLfu;
pub use lru::LruPolicy;
pub use static_hot::StaticHotSet;
pub use tam::TamPolicy;

use crate::Policy;

/// One replacement policy's state and ranking. Ticks are the cache's clock: the number of tokens
/// recorded so far, `now` being the current one (the clock advances before `record` is called).
pub trait ReplacementPolicy {
    /// Whether recording a token advances the cache's clock. Policies without per-token state
    /// (static, none) say no, and `record` is then never called.
    fn tracks_time(&self) -> bool {
        true
    }

    /// One token's active units (sorted, unique, in range) at tick `now`.
    fn record(&mut self, active: &[u32], now: u32);

    /// How much `unit` is worth keeping at tick `now`: higher stays, lower is evicted first.
    fn score(&self, unit: u32, now: u32) -> f64;

    /// Tick of `unit`'s last access, which breaks ties between equal scores (least recent goes
    /// first); 0 when never accessed or not tracked.
    fn last_access(&self, _unit: u32) -> u32 {
        0
    }

    /// Whether misses may enter the cache at all (static and none: never).
    fn admits(&self) -> bool {
        true
    }

    /// Whether a miss scoring `score` may be cached (TAM: over the load threshold; Belady: used
    /// again).
    fn eligible(&self, _score: f64) -> bool {
        true
    }

    /// Whether a miss scoring `candidate` may evict a resident scoring `victim`.
    fn beats(&self, candidate: f64, victim: f64) -> bool {
        candidate > victim
    }

    /// `unit` was admitted at tick `now`.
    fn admitted(&mut self, _unit: u32, _now: u32) {}

    /// A warm start from a ranking (hottest first) for a cache of `slots` slots. A policy that
    /// pins (static) remembers the first `slots` distinct units and returns true: the cache then
    /// holds exactly those. Others return false: the ranking only fills free slots.
    fn pin(&mut self, _ranking: &[u32], _slots: usize) -> bool {
        false
    }

    /// Whether `unit` is in the pinned set of the last [`pin`](Self::pin) that returned true.
    fn is_pinned(&self, _unit: u32) -> bool {
        false
    }

    /// A new conversation starts: context-level state (LFU counts, TAM momentum) restarts.
    fn reset_context(&mut self) {}
}

/// No cache: every unit is read for the token that needs it.
#[derive(Clone, Debug, Default)]
pub struct NoCache;

impl ReplacementPolicy for NoCache {
    fn tracks_time(&self) -> bool {
        false
    }

    fn record(&mut self, _active: &[u32], _now: u32) {}

    fn score(&self, _unit: u32, _now: u32) -> f64 {
        0.0
    }

    fn admits(&self) -> bool {
        false
    }

    fn beats(&self, _candidate: f64, _victim: f64) -> bool {
        false
    }
}

/// The policy a [`UnitCache`](crate::UnitCache) runs, with its state.
#[derive(Clone, Debug)]
pub enum PolicyState {
    Lfu(ActiveFlowLfu),
    Lru(LruPolicy),
    Tam(TamPolicy),
    Static(StaticHotSet),
    None(NoCache),
    Belady(BeladyOracle),
}

/// Calls `$body` with `$p` bound to the policy inside `$state`.
macro_rules! dispatch {
    ($state:expr, $p:ident => $body:expr) => {
        match $state {
            PolicyState::Lfu($p) => $body,
            PolicyState::Lru($p) => $body,
            PolicyState::Tam($p) => $body,
            PolicyState::Static($p) => $body,
            PolicyState::None($p) => $body,
            PolicyState::Belady($p) => $body,
        }
    };
}

impl PolicyState {
    /// Fresh state of `policy` for `n_units` units. Panics if a TAM λ is outside `[0, 1)` or ε
    /// is not finite.
    pub fn new(policy: Policy, n_units: usize) -> PolicyState {
        match policy {
            Policy::Lfu => PolicyState::Lfu(ActiveFlowLfu::new(n_units)),
            Policy::Lru => PolicyState::Lru(LruPolicy::new(n_units)),
            Policy::Tam { lambda, eps } | Policy::AdaptiveTam { lambda, eps } => {
                PolicyState::Tam(TamPolicy::new(n_units, lambda, eps))
            }
            Policy::Static => PolicyState::Static(StaticHotSet::new(n_units)),
            Policy::None => PolicyState::None(NoCache),
            Policy::Belady => PolicyState::Belady(BeladyOracle::new(n_units)),
        }
    }
}

impl ReplacementPolicy for PolicyState {
    #[inline]
    fn tracks_time(&self) -> bool {
        dispatch!(self, p => p.tracks_time())
    }

    #[inline]
    fn record(&mut self, active: &[u32], now: u32) {
        dispatch!(self, p => p.record(active, now))
    }

    #[inline]
    fn score(&self, unit: u32, now: u32) -> f64 {
        dispatch!(self, p => p.score(unit, now))
    }

    #[inline]
    fn last_access(&self, unit: u32) -> u32 {
        dispatch!(self, p => p.last_access(unit))
    }

    #[inline]
    fn admits(&self) -> bool {
        dispatch!(self, p => p.admits())
    }

    #[inline]
    fn eligible(&self, score: f64) -> bool {
        dispatch!(self, p => p.eligible(score))
    }

    #[inline]
    fn beats(&self, candidate: f64, victim: f64) -> bool {
        dispatch!(self, p => p.beats(candidate, victim))
    }

    #[inline]
    fn admitted(&mut self, unit: u32, now: u32) {
        dispatch!(self, p => p.admitted(unit, now))
    }

    fn pin(&mut self, ranking: &[u32], slots: usize) -> bool {
        dispatch!(self, p => p.pin(ranking, slots))
    }

    #[inline]
    fn is_pinned(&self, unit: u32) -> bool {
        dispatch!(self, p => p.is_pinned(unit))
    }

    fn reset_context(&mut self) {
        dispatch!(self, p => p.reset_context())
    }
}
