//! The fast tier's bookkeeping: per-(layer, op) unit caches with switchable replacement policies.
//!
//! Used by the tiered store (`sift-store`), which owns the bytes, and by DIP-CA's stand-in cache
//! (`sift-sparsity`) when it runs without a budget, so both follow the same LFU.
//!
//! A [`UnitCache`] is the bookkeeping for ONE weight tensor (one layer's one sparsifiable op):
//! `n_units` units (weight columns = input channels, or neuron bundles) of which at most `slots`
//! live in memory at a time. It only decides which unit lives in which slot; the bytes live in a
//! slab of `slots * unit_bytes` owned by the caller, who copies a unit's bytes into the slot
//! this module hands out (or into a transient buffer when the policy declines to cache it).
//!
//! Per token the caller does, for each tensor:
//! 1. [`UnitCache::record`] with the token's active units (always, even when none are active:
//!    it advances the clock that LRU order and TAM decay are measured in);
//! 2. splits the active units into hits ([`UnitCache::slot_of`]) and misses;
//! 3. [`UnitCache::admit`] the misses, protecting the hits, and fills the slots it returns.
//!
//! Policies ([`Policy`] names one; each is a [`ReplacementPolicy`] in [`policy`]):
//! - **LFU**, ActiveFlow §4.2 "Dynamic LLM Weight Caching" (context-level): one usage counter per
//!   unit, counting the tokens that activated it since the context began
//!   ([`UnitCache::reset_context`] zeroes them). "If a newly activated channel has a higher
//!   count than the least-used channel in the cache, we evict the least-used channel." Here
//!   "higher" is strict and a free slot is always used first; victims tie-break least recently
//!   used, then lowest id.
//!   (ActiveFlow's Fig. 12 walk-through replaces a count-1 channel by a count-1 newcomer; the
//!   strict rule of the text is what is implemented, so a newcomer needs a second activation.)
//! - **LRU**: the strawman of KAIROX §3.2: always admit, evict the least recently used unit.
//! - **TAM**, KAIROX §6 "Temporal Activation Momentum": momentum `S ← λ·S + (1−λ)·A` per unit
//!   and token (`A` = 1 when active). Only units with `S > τ_load = (1−λ) + ε` are candidates,
//!   which filters "one-hit wonders" (a cold unit after one isolated activation has exactly
//!   `1−λ`); the cache keeps the top-scoring units (Algorithm 1, line 16), so a candidate evicts
//!   the lowest-momentum resident only when the candidate's momentum is higher. λ is a parameter
//!   here (KAIROX's feedback loop that moves λ at run time is the caller's business).
//! - **Static**, PowerInfer-style offline placement: [`UnitCache::set_hot`] pins the hottest
//!   `slots` units of a profile ranking and nothing ever moves afterwards.
//! - **None**: no slots; every unit is read per token.
//! - **Belady**, the offline optimum (MIN with bypass; Belady 1966, Mattson et al. 1970), for
//!   simulation only since it needs the future: [`UnitCache::set_future`] gives the active
//!   lists of every later [`record`](UnitCache::record) call. A unit's key is its *next use*
//!   (the first later step that activates it; never = ∞), ties broken by the use after that,
//!   and so on (the unit's future use sequence, compared lexicographically). A miss is a
//!   candidate unless it is never used again (bypass: read for this token only); residents not
//!   protected are evictable with the same key. The candidates with the soonest key take the
//!   free slots first, then each evicts the evictable resident with the farthest key while its
//!   own is strictly sooner. It is the batch rule below with score = −key.
//!
//!   Optimality. Under the protocol of this module — a step's hits stay cached through that
//!   step, only the step's misses can enter, and a miss that is not admitted is still served
//!   (read for this step only) — every schedule after step `t` holds the step's hits plus a
//!   choice among the other residents and the misses. Keeping, among those, the ones with the
//!   soonest key maximises the total number of hits over the trace: by Belady's exchange
//!   argument, a schedule that keeps `y` where this one keeps `x` (key of `x` ≤ key of `y`) can
//!   be changed to keep `x` without losing a hit (steps using both are hits either way; the
//!   first step using only one of them uses `x`, a gained hit, and the schedules coincide again
//!   at the latest when `y` alone is used, a lost one). The tie-break matters only because hits
//!   are protected: of two units both next used at step `s`, the cached one stays through `s`
//!   and the other cannot replace it then, so the one used again sooner after `s` should be the
//!   one kept (plain next-use MIN can lose hits here; a unit test shows one). So no policy driven
//!   the same way (LFU, LRU, TAM, static from the same warm start) gets more hits; the tests
//!   check this on random traces and compare with an exhaustive search over all schedules on
//!   small ones. The lexicographic order costs nothing per query: [`UnitCache::set_future`]
//!   ranks every suffix of every unit's use list once (O(E log E) for E activations; 8 bytes
//!   per activation, 8 per unit, 4 per step). Without a future, every unit counts as never used
//!   again: Belady then admits nothing (warm starts with [`UnitCache::set_hot`] still place
//!   units, and [`UnitCache::resize`] still works).
//!
//! Batches. [`UnitCache::admit`] takes all of a token's misses at once. It keeps the best set in
//! the sense of the policy: the eligible misses, ranked by score, and the evictable residents
//! (not protected), ranked worst first, are matched pairwise; the `f` best misses take the free
//! slots and the next ones evict the worst residents while they strictly beat them. For one miss
//! this is exactly the single-channel rule above; for several it equals processing them one by
//! one, strongest first, with the units admitted for this token protected (the token is about
//! to use them). Victims are selected once per batch (`select_nth_unstable`), so a batch of `k`
//! misses costs O(slots + k log k).
//!
//! State is a few flat `Vec`s indexed by unit or slot (no hashing). TAM momentum is decayed
//! lazily: each unit stores `S` as of its last activation tick and its current value is
//! `S·λ^(now − tick)`, which equals updating every unit every token but costs O(active).

#![forbid(unsafe_code)]

pub mod adaptive;
mod optimum;
pub mod policy;
mod unit_cache;

pub use adaptive::{Bottleneck, LambdaBounds, LambdaController, LambdaStep};
pub use optimum::min_misses;
pub use policy::{ActiveFlowLfu, BeladyOracle, LruPolicy, NoCache, ReplacementPolicy, StaticHotSet, TamPolicy};
pub use unit_cache::UnitCache;

/// Returned by [`UnitCache::admit`] for a unit the policy does not cache: the caller reads it
/// into a transient buffer for this token only.
pub const NO_SLOT: u32 = u32::MAX;

/// A unit id at or past a cache's unit count, given to [`UnitCache::record`],
/// [`UnitCache::admit`] or [`UnitCache::set_hot`] /
/// [`UnitCache::place_hot`]. The call that returns it changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unit {unit} is out of range: the tensor has {n_units} units")]
pub struct UnitOutOfRange {
    pub unit: u32,
    pub n_units: usize,
}

/// KAIROX's default momentum decay λ.
pub const TAM_DEFAULT_LAMBDA: f32 = 0.8;
/// KAIROX's default admission margin ε over the one-hit-wonder momentum `1 − λ`.
pub const TAM_DEFAULT_EPS: f32 = 0.05;

/// A unit-cache replacement policy by name (the crate docs define each; [`policy`] implements them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// ActiveFlow context-level least-frequently-used with strict admission.
    Lfu,
    /// Least recently used; always admits.
    Lru,
    /// KAIROX Temporal Activation Momentum with decay `lambda` (in `[0, 1)`) and margin `eps`.
    Tam { lambda: f32, eps: f32 },
    /// TAM whose λ starts at `lambda` and then follows each layer's stall type (KAIROX §7,
    /// [`adaptive`]); the cache's owner feeds the controller and sets λ
    /// ([`UnitCache::set_lambda`]).
    AdaptiveTam { lambda: f32, eps: f32 },
    /// Offline hot set pinned by [`UnitCache::set_hot`]; never admits or evicts.
    Static,
    /// No cache.
    None,
    /// Offline optimal replacement (MIN with bypass) over the future given to
    /// [`UnitCache::set_future`]; simulation only.
    Belady,
}

impl Policy {
    /// TAM with KAIROX's defaults (λ = 0.8, ε = 0.05).
    pub const TAM_DEFAULT: Policy = Policy::Tam { lambda: TAM_DEFAULT_LAMBDA, eps: TAM_DEFAULT_EPS };
    /// Adaptive TAM from KAIROX's defaults.
    pub const TAM_ADAPTIVE_DEFAULT: Policy = Policy::AdaptiveTam { lambda: TAM_DEFAULT_LAMBDA, eps: TAM_DEFAULT_EPS };

    /// Parses `lfu`, `lru`, `tam` (default λ, ε), `tam-adaptive`, `static`, `none` or `belady`
    /// (ASCII case-insensitive).
    pub fn parse(s: &str) -> Option<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lfu" => Some(Policy::Lfu),
            "lru" => Some(Policy::Lru),
            "tam" => Some(Policy::TAM_DEFAULT),
            "tam-adaptive" | "adaptive-tam" => Some(Policy::TAM_ADAPTIVE_DEFAULT),
            "static" => Some(Policy::Static),
            "none" => Some(Policy::None),
            "belady" => Some(Policy::Belady),
            _ => None,
        }
    }

    /// The name [`Policy::parse`] accepts.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Lfu => "lfu",
            Policy::Lru => "lru",
            Policy::Tam { .. } => "tam",
            Policy::AdaptiveTam { .. } => "tam-adaptive",
            Policy::Static => "static",
            Policy::None => "none",
            Policy::Belady => "belady",
        }
    }

    /// TAM's admission threshold `τ_load = (1 − λ) + ε` (adaptive TAM: at its starting λ);
    /// `None` for other policies.
    pub fn tam_threshold(&self) -> Option<f32> {
        match *self {
            Policy::Tam { lambda, eps } | Policy::AdaptiveTam { lambda, eps } => Some((1.0 - lambda) + eps),
            _ => None,
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What [`UnitCache::resize`] did: the caller drops `evicted` and then, for each
/// `(unit, from, to)` in `moved`, copies the unit's bytes from slot `from` (>= the new slot
/// count) to slot `to` (< it, free after the evictions) before shrinking its slab. The moves
/// are independent of each other (every source is >= the new count, every target below it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resize {
    /// Units evicted, worst first by the policy's order.
    pub evicted: Vec<u32>,
    /// Kept units that had to leave a slot past the new end: `(unit, from_slot, to_slot)`.
    pub moved: Vec<(u32, u32, u32)>,
}
