//! [`UnitCache`]: which unit of one weight tensor lives in which slot, and the batch admission
//! rule every policy shares (see the crate docs); the policy's own state and ranking are a
//! [`ReplacementPolicy`] held in [`PolicyState`].

use crate::policy::{PolicyState, ReplacementPolicy};
use crate::{Policy, Resize, UnitOutOfRange, NO_SLOT};
use std::cmp::Ordering;

/// A cached unit with its policy ranking: lower sorts first = evicted first.
#[derive(Clone, Copy, Debug)]
struct Ranked {
    /// Policy score (LFU count, TAM momentum, −static rank, −rank of the future use sequence
    /// for Belady (−∞ when never used again); 0 for LRU).
    score: f64,
    /// Tick of the unit's last access (tie-break: least recently used first).
    last: u32,
    unit: u32,
}

fn worst_first(a: &Ranked, b: &Ranked) -> Ordering {
    a.score.total_cmp(&b.score).then(a.last.cmp(&b.last)).then(a.unit.cmp(&b.unit))
}

/// A miss competing for a slot.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    score: f64,
    /// Position in the caller's list (tie-break: earlier first).
    idx: u32,
    unit: u32,
}

/// Slot bookkeeping and policy state for one weight tensor. See the crate docs.
#[derive(Clone, Debug)]
pub struct UnitCache {
    policy: Policy,
    n_units: usize,
    /// unit → slot, or `NO_SLOT`.
    slot_of: Vec<u32>,
    /// slot → unit, or `NO_SLOT` when free; its length is the slot count.
    unit_in: Vec<u32>,
    /// Free slots, used from the back (kept so the lowest ids come out first after a rebuild).
    free: Vec<u32>,
    /// Tokens recorded so far (LRU order and TAM decay are measured in these ticks).
    clock: u32,
    /// The policy's own state and ranking.
    state: PolicyState,
    /// Scratch: per-slot protection marks (`mark[slot] == epoch` means protected).
    mark: Vec<u32>,
    epoch: u32,
    /// Scratch buffers of one `admit` call (given back after it: a model has hundreds of
    /// caches, and keeping each one's scratch would cost more than its bookkeeping).
    ranked: Vec<Ranked>,
    cands: Vec<Candidate>,
    /// Units evicted by the last `admit`/`set_hot` call.
    evicted: Vec<u32>,
}

impl UnitCache {
    /// Heap bytes a cache keeps per unit at most: its slot map and the policy's per-unit state
    /// (LFU and TAM keep two 4-byte figures).
    pub const BYTES_PER_UNIT: usize = 4 + 8;
    /// Heap bytes a cache keeps per slot at most: slot → unit, the free list, the protection
    /// marks, and the last call's evictions (grown by doubling).
    pub const BYTES_PER_SLOT: usize = 4 + 4 + 4 + 8;

    /// A cache for `n_units` units with `slots` slots (clamped to `n_units`; 0 for
    /// [`Policy::None`]). Panics if a TAM λ is outside `[0, 1)` or ε is not finite.
    pub fn new(n_units: usize, slots: usize, policy: Policy) -> UnitCache {
        assert!(n_units < NO_SLOT as usize, "UnitCache: too many units ({n_units})");
        let state = PolicyState::new(policy, n_units);
        let slots = if policy == Policy::None { 0 } else { slots.min(n_units) };
        UnitCache {
            policy,
            n_units,
            slot_of: vec![NO_SLOT; n_units],
            unit_in: vec![NO_SLOT; slots],
            free: (0..slots as u32).rev().collect(),
            clock: 0,
            state,
            mark: vec![0; slots],
            epoch: 0,
            ranked: Vec::new(),
            cands: Vec::new(),
            evicted: Vec::new(),
        }
    }

    pub fn n_units(&self) -> usize {
        self.n_units
    }

    /// Slot count (the capacity).
    pub fn slots(&self) -> usize {
        self.unit_in.len()
    }

    /// Occupied slots.
    pub fn len(&self) -> usize {
        self.unit_in.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The slot holding `unit`, if cached. No side effects.
    pub fn slot_of(&self, unit: u32) -> Option<u32> {
        match self.slot_of[unit as usize] {
            NO_SLOT => None,
            s => Some(s),
        }
    }

    pub fn contains(&self, unit: u32) -> bool {
        self.slot_of[unit as usize] != NO_SLOT
    }

    /// The unit held by `slot`, if occupied (`None` too for a slot past the end).
    pub fn unit_in_slot(&self, slot: u32) -> Option<u32> {
        match self.unit_in.get(slot as usize) {
            Some(&u) if u != NO_SLOT => Some(u),
            _ => None,
        }
    }

    /// Cached units as `(unit, slot)`, in slot order.
    pub fn cached(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.unit_in.iter().enumerate().filter(|(_, &u)| u != NO_SLOT).map(|(s, &u)| (u, s as u32))
    }

    /// Tokens recorded so far.
    pub fn clock(&self) -> u32 {
        self.clock
    }

    /// LFU activation count of `unit` in this context (0 for other policies).
    pub fn count(&self, unit: u32) -> u32 {
        match &self.state {
            PolicyState::Lfu(p) => p.count(unit),
            _ => 0,
        }
    }

    /// TAM momentum of `unit` now (0 for other policies).
    pub fn momentum(&self, unit: u32) -> f32 {
        match &self.state {
            PolicyState::Tam(p) => p.momentum(unit, self.clock),
            _ => 0.0,
        }
    }

    /// Tick of `unit`'s last access (0 = never, or a policy that does not track it).
    pub fn last_access(&self, unit: u32) -> u32 {
        self.state.last_access(unit)
    }

    /// Units evicted by the last [`admit`](Self::admit) or [`set_hot`](Self::set_hot) call (for statistics; the slot map is already updated).
    pub fn last_evictions(&self) -> &[u32] {
        &self.evicted
    }

    /// Belady: the active lists of every later [`record`](Self::record) call of this cache, in
    /// order (`steps[0]` is the next call's; each sorted ascending, unique, `< n_units`),
    /// replacing any previous future. Stored per unit as the sorted list of its use steps, with
    /// the lexicographic rank of every suffix (8 bytes per activation, 8 per unit, 4 per step;
    /// built in O(E log E)), so comparing two units' keys is O(1) on the common path
    /// ([`record`](Self::record) advances a per-unit cursor). After the last step every unit
    /// counts as never used again. Other policies ignore it. Panics on a unit out of range or a
    /// list that is not sorted and unique.
    pub fn set_future(&mut self, steps: Vec<Vec<u32>>) {
        if let PolicyState::Belady(b) = &mut self.state {
            b.set_future(steps, self.clock);
        }
    }

    /// TAM (fixed or adaptive): sets the momentum decay λ from now on (see
    /// [`TamPolicy::set_lambda`](crate::TamPolicy::set_lambda)); other policies ignore it.
    pub fn set_lambda(&mut self, lambda: f32) {
        if let PolicyState::Tam(t) = &mut self.state {
            t.set_lambda(lambda, self.clock);
        }
    }

    /// Belady: how many [`record`](Self::record) calls from now until `unit` is next active
    /// (1 = the next call), or `None` if never again (or no future is set, or another policy).
    pub fn next_use(&self, unit: u32) -> Option<u32> {
        match &self.state {
            PolicyState::Belady(b) => b.next_tick(unit, self.clock).map(|t| t - self.clock),
            _ => None,
        }
    }

    /// One token's activations for this tensor (`active`: sorted ascending, unique,
    /// `< n_units`). Advances the clock and updates the policy state: LFU counts, LRU access
    /// ticks, TAM momentum (every unit's, lazily), Belady's position in the future (`active`
    /// must then be the future's list for this step; checked in debug builds). Call it once per
    /// token even when `active` is empty, and before admitting that token's misses. A unit out
    /// of range is an error, under every policy, and nothing is recorded.
    pub fn record(&mut self, active: &[u32]) -> Result<(), UnitOutOfRange> {
        debug_assert!(active.windows(2).all(|w| w[0] < w[1]), "record: active not sorted/unique");
        self.check_units(active)?;
        if !self.state.tracks_time() {
            return Ok(());
        }
        // Saturates after 2^32 − 1 tokens, which only blurs LRU order among later accesses.
        self.clock = self.clock.saturating_add(1);
        self.state.record(active, self.clock);
        Ok(())
    }

    /// Chooses slots for `misses` (units not cached; any that are cached just get their slot
    /// back and are protected). Units in `protect` (cached units the current token is about to
    /// use) are never evicted. Returns one entry per miss, in order: the slot the caller must
    /// now fill with that unit's bytes, or [`NO_SLOT`] if the policy does not admit it. Victims
    /// are removed from the map ([`last_evictions`](Self::last_evictions) lists them) and the
    /// admitted units inserted. LRU admits whenever there is something evictable; LFU and TAM
    /// compare the scores [`record`](Self::record) left; static and none admit nothing. A unit of
    /// `misses` out of range is an error and nothing changes (units of `protect` out of range
    /// are ignored: they cannot be cached).
    pub fn admit(&mut self, misses: &[u32], protect: &[u32]) -> Result<Vec<u32>, UnitOutOfRange> {
        self.admit_batch(misses, protect)
    }

    /// Static: pins the first `slots` distinct units of `ranking` (hottest first), replacing
    /// any previous pinned set. Other policies: warm start, filling free slots with the
    /// ranking's units in order (nothing is evicted). None: no effect. Use
    /// [`place_hot`](Self::place_hot) to learn which slots need bytes. A unit of `ranking` out
    /// of range (anywhere in it, under every policy) is an error and nothing changes.
    pub fn set_hot(&mut self, ranking: &[u32]) -> Result<(), UnitOutOfRange> {
        self.place_hot(ranking).map(|_| ())
    }

    /// [`set_hot`](Self::set_hot), returning the `(unit, slot)` pairs newly placed (whose bytes
    /// the caller must load). Under static, pinned units that stay pinned keep their slots, and
    /// units that drop out are evicted ([`last_evictions`](Self::last_evictions)). Errors like
    /// [`set_hot`](Self::set_hot).
    pub fn place_hot(&mut self, ranking: &[u32]) -> Result<Vec<(u32, u32)>, UnitOutOfRange> {
        self.check_units(ranking)?;
        self.evicted.clear();
        let mut placed = Vec::new();
        let pinned = self.state.pin(ranking, self.slots());
        if pinned {
            // Units that dropped out of the pinned set leave; the others keep their slots.
            for s in 0..self.slots() {
                let u = self.unit_in[s];
                if u != NO_SLOT && !self.state.is_pinned(u) {
                    self.remove(u);
                    self.evicted.push(u);
                }
            }
        }
        for &u in ranking {
            if self.free.is_empty() {
                break;
            }
            if (!pinned || self.state.is_pinned(u)) && !self.contains(u) {
                let s = self.free.pop().expect("a free slot");
                self.insert(u, s);
                placed.push((u, s));
            }
        }
        Ok(placed)
    }

    /// New conversation: LFU counts and TAM momentum back to zero. The LRU clock, access ticks,
    /// Belady's future and the cached units stay.
    pub fn reset_context(&mut self) {
        self.state.reset_context();
    }

    /// Empties every slot (policy state such as LFU counts is kept).
    pub fn evict_all(&mut self) {
        for s in 0..self.unit_in.len() {
            let u = self.unit_in[s];
            if u != NO_SLOT {
                self.slot_of[u as usize] = NO_SLOT;
                self.unit_in[s] = NO_SLOT;
            }
        }
        self.rebuild_free();
    }

    /// Changes the slot count (a live budget change), clamped to `n_units` (0 under none).
    /// Shrinking evicts the policy's worst units (static: the lowest ranked; Belady: the farthest
    /// next use, never-used-again first) until the rest fit,
    /// then moves kept units out of slots past the new end; see [`Resize`]. Growing only adds
    /// free slots (under static, call [`place_hot`](Self::place_hot) again to pin more).
    pub fn resize(&mut self, slots: usize) -> Resize {
        let new = if self.policy == Policy::None { 0 } else { slots.min(self.n_units) };
        let old = self.slots();
        let mut out = Resize::default();
        if new >= old {
            self.unit_in.resize(new, NO_SLOT);
            self.mark.resize(new, 0);
            self.rebuild_free();
            return out;
        }
        let len = self.len();
        if len > new {
            let excess = len - new;
            self.epoch_bump(); // nothing protected
            self.select_victims(excess);
            let victims = std::mem::take(&mut self.ranked);
            for v in &victims {
                self.remove(v.unit);
                out.evicted.push(v.unit);
            }
            self.ranked = victims;
        }
        let mut targets = (0..new).filter(|&s| self.unit_in[s] == NO_SLOT);
        for from in new..old {
            let u = self.unit_in[from];
            if u != NO_SLOT {
                let to = targets.next().expect("resize: a free slot below the new end");
                out.moved.push((u, from as u32, to as u32));
            }
        }
        for &(u, from, to) in &out.moved {
            self.unit_in[from as usize] = NO_SLOT;
            self.unit_in[to as usize] = u;
            self.slot_of[u as usize] = to;
        }
        self.unit_in.truncate(new);
        self.mark.truncate(new);
        self.rebuild_free();
        out
    }

    // ---- internals ----

    /// Errors with the first unit of `units` at or past `n_units`.
    pub(crate) fn check_units(&self, units: &[u32]) -> Result<(), UnitOutOfRange> {
        match units.iter().find(|&&u| u as usize >= self.n_units) {
            Some(&unit) => Err(UnitOutOfRange { unit, n_units: self.n_units }),
            None => Ok(()),
        }
    }

    /// The policy's score of `unit` now (higher = more worth caching).
    #[inline]
    fn score(&self, unit: u32) -> f64 {
        self.state.score(unit, self.clock)
    }

    /// Whether a miss scoring `score` may be cached at all.
    #[inline]
    fn eligible(&self, score: f64) -> bool {
        self.state.eligible(score)
    }

    /// `unit` with the policy's score now and its last access.
    #[inline]
    fn ranked(&self, unit: u32) -> Ranked {
        Ranked { score: self.score(unit), last: self.state.last_access(unit), unit }
    }

    fn insert(&mut self, unit: u32, slot: u32) {
        debug_assert_eq!(self.slot_of[unit as usize], NO_SLOT);
        debug_assert_eq!(self.unit_in[slot as usize], NO_SLOT);
        self.slot_of[unit as usize] = slot;
        self.unit_in[slot as usize] = unit;
    }

    /// Uncaches `unit` and returns its slot, now empty but not on the free list.
    fn take(&mut self, unit: u32) -> u32 {
        let s = self.slot_of[unit as usize];
        debug_assert_ne!(s, NO_SLOT);
        self.slot_of[unit as usize] = NO_SLOT;
        self.unit_in[s as usize] = NO_SLOT;
        s
    }

    /// Uncaches `unit`, freeing its slot.
    fn remove(&mut self, unit: u32) {
        let s = self.take(unit);
        self.free.push(s);
    }

    fn rebuild_free(&mut self) {
        self.free.clear();
        let unit_in = &self.unit_in;
        self.free.extend((0..unit_in.len() as u32).rev().filter(|&s| unit_in[s as usize] == NO_SLOT));
    }

    /// Starts a new protection epoch (no slot protected).
    fn epoch_bump(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.mark.fill(0);
            self.epoch = 1;
        }
    }

    fn protect_unit(&mut self, unit: u32) {
        if let Some(&s) = self.slot_of.get(unit as usize) {
            if s != NO_SLOT {
                self.mark[s as usize] = self.epoch;
            }
        }
    }

    /// Leaves in `self.ranked` the `k` worst unprotected residents (fewer if there are not
    /// that many), worst first. O(slots + k log k).
    fn select_victims(&mut self, k: usize) {
        let mut ranked = std::mem::take(&mut self.ranked);
        ranked.clear();
        for s in 0..self.unit_in.len() {
            let u = self.unit_in[s];
            if u != NO_SLOT && self.mark[s] != self.epoch {
                ranked.push(self.ranked(u));
            }
        }
        if k == 0 {
            ranked.clear();
        } else if k < ranked.len() {
            ranked.select_nth_unstable_by(k - 1, worst_first);
            ranked.truncate(k);
        }
        ranked.sort_unstable_by(worst_first);
        self.ranked = ranked;
    }

    fn admit_batch(&mut self, units: &[u32], protect: &[u32]) -> Result<Vec<u32>, UnitOutOfRange> {
        self.check_units(units)?;
        self.evicted.clear();
        if self.state.admits() && !self.unit_in.is_empty() {
            self.admit_inner(units, protect);
        }
        Ok(units.iter().map(|&u| self.slot_of[u as usize]).collect())
    }

    fn admit_inner(&mut self, units: &[u32], protect: &[u32]) {
        // Eligible candidates: not cached, (TAM) over the load threshold, (Belady) used again.
        let mut cands = std::mem::take(&mut self.cands);
        cands.clear();
        for (i, &u) in units.iter().enumerate() {
            if self.contains(u) {
                continue;
            }
            let score = self.score(u);
            if !self.eligible(score) {
                continue;
            }
            cands.push(Candidate { score, idx: i as u32, unit: u });
        }
        if cands.len() > 1 {
            // Drop duplicates (keep the first occurrence), then strongest first.
            cands.sort_unstable_by_key(|c| (c.unit, c.idx));
            cands.dedup_by_key(|c| c.unit);
            cands.sort_unstable_by(|a, b| b.score.total_cmp(&a.score).then(a.idx.cmp(&b.idx)));
        }
        let k = cands.len();
        let f = self.free.len();
        let mut n_admit = k.min(f);
        if k > f {
            self.epoch_bump();
            for &u in protect.iter().chain(units) {
                self.protect_unit(u);
            }
            self.select_victims(k - f);
            // The f strongest take the free slots; candidate f+i may evict victim i (worst
            // first) only if it beats it. Both lists are monotone, so stop at the first loss.
            let mut m = 0;
            while m < self.ranked.len() && self.state.beats(cands[f + m].score, self.ranked[m].score) {
                m += 1;
            }
            // Candidate f+i takes victim i's slot.
            for i in 0..m {
                let (v, c) = (self.ranked[i].unit, cands[f + i].unit);
                let s = self.take(v);
                self.evicted.push(v);
                self.insert(c, s);
            }
            n_admit = f + m;
        }
        for c in &cands[..n_admit.min(f)] {
            let s = self.free.pop().expect("admit: free slot");
            self.insert(c.unit, s);
        }
        for c in &cands[..n_admit] {
            self.state.admitted(c.unit, self.clock);
        }
        drop(cands);
        self.ranked = Vec::new();
    }
}

#[cfg(test)]
mod tests;
