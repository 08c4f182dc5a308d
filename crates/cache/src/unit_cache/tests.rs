//! Tests of the unit cache and its policies: each policy's rule on small hand-made traces, structural
//! invariants on random ones, and Belady's optimality against every online policy and an exhaustive
//! search.

use super::*;
use crate::*;

const TAM: Policy = Policy::TAM_DEFAULT;

mod belady;

/// Checks the structural invariants: len <= slots, slot_of/unit_in a bijection, free list
/// exactly the empty slots.
fn check(c: &UnitCache) {
    assert!(c.len() <= c.slots());
    assert!(c.slots() <= c.n_units());
    let mut occupied = 0;
    for (s, &u) in c.unit_in.iter().enumerate() {
        if u != NO_SLOT {
            occupied += 1;
            assert_eq!(c.slot_of[u as usize], s as u32, "unit {u} in slot {s}");
        }
    }
    for (u, &s) in c.slot_of.iter().enumerate() {
        if s != NO_SLOT {
            assert!((s as usize) < c.slots(), "unit {u} in slot {s} past {}", c.slots());
            assert_eq!(c.unit_in[s as usize], u as u32);
        }
    }
    assert_eq!(occupied, c.len());
    let mut free = c.free.clone();
    free.sort_unstable();
    free.dedup();
    assert_eq!(free.len(), c.free.len(), "duplicate free slot");
    for &s in &free {
        assert_eq!(c.unit_in[s as usize], NO_SLOT);
    }
    assert_eq!(free.len() + occupied, c.slots());
}

/// One token the way the engine drives a cache: record, split hits/misses, admit.
fn token(c: &mut UnitCache, active: &[u32]) -> Vec<u32> {
    c.record(active).unwrap();
    let hits: Vec<u32> = active.iter().copied().filter(|&u| c.contains(u)).collect();
    let misses: Vec<u32> = active.iter().copied().filter(|&u| !c.contains(u)).collect();
    let r = c.admit(&misses, &hits).unwrap();
    check(c);
    r
}

fn cached_set(c: &UnitCache) -> Vec<u32> {
    let mut v: Vec<u32> = c.cached().map(|(u, _)| u).collect();
    v.sort_unstable();
    v
}

#[test]
fn parse_and_name() {
    for name in ["lfu", "lru", "tam", "static", "none", "belady"] {
        let p = Policy::parse(name).unwrap();
        assert_eq!(p.name(), name);
        assert_eq!(p.to_string(), name);
    }
    assert_eq!(Policy::parse("TAM"), Some(Policy::Tam { lambda: 0.8, eps: 0.05 }));
    assert_eq!(Policy::parse(" Belady "), Some(Policy::Belady));
    assert_eq!(Policy::parse("fifo"), None);
    assert!((TAM.tam_threshold().unwrap() - 0.25).abs() < 1e-6);
    assert_eq!(Policy::Lfu.tam_threshold(), None);
}

#[test]
fn new_clamps_slots() {
    assert_eq!(UnitCache::new(4, 10, Policy::Lru).slots(), 4);
    assert_eq!(UnitCache::new(4, 3, Policy::None).slots(), 0);
    let c = UnitCache::new(10, 3, Policy::Lfu);
    assert_eq!((c.n_units(), c.slots(), c.len(), c.is_empty()), (10, 3, 0, true));
    assert_eq!(c.policy(), Policy::Lfu);
}

#[test]
fn lfu_admission_is_strict_and_counts_every_activation() {
    let mut c = UnitCache::new(8, 2, Policy::Lfu);
    // Free slots: admitted whatever the count.
    let r = token(&mut c, &[1, 2]);
    assert!(r.iter().all(|&s| s != NO_SLOT));
    assert_eq!((c.count(1), c.count(2)), (1, 1));
    // Unit 1 hits (protected); 3 has count 1, least-used evictable is 2 with count 1: tie,
    // not strictly higher, so not admitted.
    assert_eq!(token(&mut c, &[1, 3]), vec![NO_SLOT]);
    assert_eq!((c.count(1), c.count(3)), (2, 1));
    assert_eq!(cached_set(&c), vec![1, 2]);
    // 3 again: count 2 > 1 (unit 2): evicts 2, takes its slot.
    let slot2 = c.slot_of(2).unwrap();
    assert_eq!(token(&mut c, &[3]), vec![slot2]);
    assert_eq!(c.last_evictions(), &[2]);
    assert_eq!(cached_set(&c), vec![1, 3]);
    // Hits are counted too: 1 reaches 3.
    token(&mut c, &[1]);
    assert_eq!(c.count(1), 3);
    // 4 three times: count 1, 2 don't beat 3's count 2 ... until count 3 > 2 evicts 3
    // (the least used; 1 has count 3).
    assert_eq!(token(&mut c, &[4]), vec![NO_SLOT]);
    assert_eq!(token(&mut c, &[4]), vec![NO_SLOT]);
    assert_ne!(token(&mut c, &[4]), vec![NO_SLOT]);
    assert_eq!(c.last_evictions(), &[3]);
    assert_eq!(cached_set(&c), vec![1, 4]);
}

#[test]
fn lfu_victim_ties_break_lru_then_lowest_id() {
    let mut c = UnitCache::new(10, 3, Policy::Lfu);
    token(&mut c, &[5]); // tick 1
    token(&mut c, &[2, 7]); // tick 2
    assert_eq!(cached_set(&c), vec![2, 5, 7]);
    // All counts 1. 9 twice: count 2 beats them; LRU victim is 5 (tick 1).
    token(&mut c, &[9]);
    token(&mut c, &[9]);
    assert_eq!(c.last_evictions(), &[5]);
    // 8 twice: victims 2 and 7 both count 1, tick 2: lowest id (2) goes.
    token(&mut c, &[8]);
    token(&mut c, &[8]);
    assert_eq!(c.last_evictions(), &[2]);
    assert_eq!(cached_set(&c), vec![7, 8, 9]);
}

#[test]
fn lfu_paper_example_needs_a_second_activation() {
    // ActiveFlow Fig. 12: 4 channels cached, channel 0 present initially.
    let mut c = UnitCache::new(8, 4, Policy::Lfu);
    c.set_hot(&[0]).unwrap();
    assert_eq!(cached_set(&c), vec![0]);
    token(&mut c, &[0, 1, 4, 6]);
    assert_eq!(cached_set(&c), vec![0, 1, 4, 6]);
    // Channel 7 (count 1) ties channel 1 (count 1, the least used): not strictly higher.
    assert_eq!(token(&mut c, &[0, 4, 6, 7]), vec![NO_SLOT]);
    // Its next activation (count 2) replaces channel 1.
    let slot1 = c.slot_of(1).unwrap();
    assert_eq!(token(&mut c, &[7]), vec![slot1]);
    assert_eq!(cached_set(&c), vec![0, 4, 6, 7]);
}

#[test]
fn lfu_batch_matches_strongest_against_weakest() {
    let mut c = UnitCache::new(10, 3, Policy::Lfu);
    token(&mut c, &[0, 1, 2]);
    token(&mut c, &[1]);
    token(&mut c, &[1]); // counts 0:1 1:3 2:1
    for _ in 0..2 {
        c.record(&[5, 6, 7]).unwrap(); // 5,6,7 reach count 2 without being admitted
    }
    c.record(&[6]).unwrap();
    c.record(&[5, 6, 7, 8]).unwrap(); // counts 5:3 6:4 7:3 8:1
    let r = c.admit(&[5, 6, 7, 8], &[]).unwrap();
    // Victims worst first: 0 (1), 2 (1), 1 (3). 6 beats 0, 5 beats 2, 7 (3) does not beat 1 (3).
    assert_eq!(r[1], 0); // 6 took 0's slot
    assert_ne!(r[0], NO_SLOT);
    assert_eq!((r[2], r[3]), (NO_SLOT, NO_SLOT));
    assert_eq!(c.last_evictions(), &[0, 2]);
    assert_eq!(cached_set(&c), vec![1, 5, 6]);
    check(&c);
}

#[test]
fn lfu_reset_context_zeroes_counts_only() {
    let mut c = UnitCache::new(8, 2, Policy::Lfu);
    for _ in 0..5 {
        token(&mut c, &[0, 1]);
    }
    let clock = c.clock();
    c.reset_context();
    assert_eq!((c.count(0), c.count(1)), (0, 0));
    assert_eq!(cached_set(&c), vec![0, 1]);
    assert_eq!(c.clock(), clock);
    // A fresh unit now beats the stale residents after one activation (1 > 0); the victim
    // is 0 (equal counts, equal recency, lowest id).
    assert_ne!(token(&mut c, &[3]), vec![NO_SLOT]);
    assert_eq!(c.last_evictions(), &[0]);
}

#[test]
fn lfu_predicted_uses_current_count_without_bump() {
    let mut c = UnitCache::new(8, 1, Policy::Lfu);
    token(&mut c, &[0]);
    c.record(&[]).unwrap();
    // Unit 5 never activated: count 0 does not beat 0's count 1.
    assert_eq!(c.admit(&[5], &[]).unwrap(), vec![NO_SLOT]);
    assert_eq!(c.count(5), 0);
    c.record(&[5]).unwrap();
    c.record(&[5]).unwrap();
    // Not admitted by record; predicted with count 2 > 1.
    assert_eq!(c.admit(&[5], &[]).unwrap(), vec![0]);
    assert_eq!(c.count(5), 2);
    // Free slot: predicted unit admitted even with count 0.
    let mut c = UnitCache::new(8, 1, Policy::Lfu);
    assert_eq!(c.admit(&[3], &[]).unwrap(), vec![0]);
}

#[test]
fn lru_evicts_least_recently_used() {
    let mut c = UnitCache::new(10, 3, Policy::Lru);
    token(&mut c, &[0]);
    token(&mut c, &[1]);
    token(&mut c, &[2]);
    token(&mut c, &[0]); // hit: 0 is now most recent; order 1, 2, 0
    let slot1 = c.slot_of(1).unwrap();
    assert_eq!(token(&mut c, &[3]), vec![slot1]); // one-hit admitted, evicts 1
    assert_eq!(c.last_evictions(), &[1]);
    token(&mut c, &[4, 5]); // evicts 2 and 0 (in that order)
    assert_eq!(c.last_evictions(), &[2, 0]);
    assert_eq!(cached_set(&c), vec![3, 4, 5]);
    // Two misses while two residents are protected: only one evictable (3).
    let r = token(&mut c, &[4, 5, 6, 7]);
    assert_ne!(r[0], NO_SLOT);
    assert_eq!(r[1], NO_SLOT);
    assert_eq!(cached_set(&c), vec![4, 5, 6]);
    // reset_context leaves LRU order alone: 4, 5 and 6 were last used at tick 7; after 6
    // is touched again the victim is 4 (least recent, lowest id).
    c.reset_context();
    assert_eq!(cached_set(&c), vec![4, 5, 6]);
    token(&mut c, &[6]);
    token(&mut c, &[8]);
    assert_eq!(c.last_evictions(), &[4]);
}

#[test]
fn lru_predicted_counts_as_access() {
    let mut c = UnitCache::new(10, 2, Policy::Lru);
    token(&mut c, &[0]);
    token(&mut c, &[1]);
    c.record(&[]).unwrap();
    assert_eq!(c.admit(&[7], &[]).unwrap(), vec![c.slot_of(7).unwrap()]);
    assert_eq!(c.last_evictions(), &[0]);
    // The preloaded unit is not the next victim.
    token(&mut c, &[8]);
    assert_eq!(c.last_evictions(), &[1]);
    assert_eq!(cached_set(&c), vec![7, 8]);
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-5
}

#[test]
fn tam_momentum_values_and_decay() {
    let mut c = UnitCache::new(4, 2, TAM);
    c.record(&[1]).unwrap();
    assert!(close(c.momentum(1), 0.2));
    c.record(&[1]).unwrap();
    assert!(close(c.momentum(1), 0.36)); // 0.8·0.2 + 0.2
    c.record(&[]).unwrap();
    assert!(close(c.momentum(1), 0.288));
    c.record(&[0]).unwrap();
    assert!(close(c.momentum(1), 0.2304));
    assert!(close(c.momentum(0), 0.2));
    c.record(&[0, 1]).unwrap();
    assert!(close(c.momentum(1), 0.8 * 0.2304 + 0.2));
    assert!(close(c.momentum(0), 0.36));
    // Long idle decays towards zero.
    for _ in 0..200 {
        c.record(&[]).unwrap();
    }
    assert!(c.momentum(1) < 1e-12);
    // Against a reference eager update over a pseudo-random script.
    let mut c = UnitCache::new(3, 1, Policy::Tam { lambda: 0.6, eps: 0.1 });
    let mut eager = [0f32; 3];
    let mut x = 0x9e37_79b9u32;
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let active: Vec<u32> = (0..3).filter(|b| x >> (b * 3) & 1 == 1).collect();
        c.record(&active).unwrap();
        for (u, s) in eager.iter_mut().enumerate() {
            let a = if active.contains(&(u as u32)) { 1.0 } else { 0.0 };
            *s = 0.6 * *s + 0.4 * a;
        }
        for u in 0..3 {
            assert!(close(c.momentum(u), eager[u as usize]), "{} vs {}", c.momentum(u), eager[u as usize]);
        }
    }
}

#[test]
fn tam_rejects_one_hit_wonders_and_admits_sustained_units() {
    let mut c = UnitCache::new(8, 2, TAM);
    // One isolated activation: S = 1 − λ = 0.2 <= τ = 0.25, even with free slots.
    assert_eq!(token(&mut c, &[3]), vec![NO_SLOT]);
    assert!(c.is_empty());
    // Active again on the next token: S = 0.36 > 0.25, admitted.
    assert_ne!(token(&mut c, &[3]), vec![NO_SLOT]);
    assert!(c.contains(3));
    // Two activations far apart are two one-hit wonders (S ≈ 0.2 each time).
    token(&mut c, &[5]);
    for _ in 0..30 {
        c.record(&[]).unwrap();
    }
    assert_eq!(token(&mut c, &[5]), vec![NO_SLOT]);
    assert!(close(c.momentum(5), 0.2 + 0.2 * 0.8f32.powi(31)));
    // reset_context zeroes momentum; cached units stay.
    c.reset_context();
    assert_eq!(c.momentum(3), 0.0);
    assert!(c.contains(3));
}

#[test]
fn tam_victim_is_lowest_momentum_and_must_be_beaten() {
    let mut c = UnitCache::new(10, 2, TAM);
    token(&mut c, &[1, 2]);
    token(&mut c, &[1, 2]); // both 0.36, admitted
    token(&mut c, &[1]); // 1: 0.488, 2: 0.288
    assert_eq!(cached_set(&c), vec![1, 2]);
    assert!(close(c.momentum(1), 0.488) && close(c.momentum(2), 0.288));
    // 7 active twice: 0.36 > τ and > S_2 = 0.8·0.288 = 0.2304 → evicts 2 (lowest), not 1.
    token(&mut c, &[7]);
    let slot2 = c.slot_of(2).unwrap();
    assert_eq!(token(&mut c, &[7]), vec![slot2]);
    assert_eq!(c.last_evictions(), &[2]);
    assert_eq!(cached_set(&c), vec![1, 7]);
    // Keep 1 and 7 hot; 9 reaches 0.36 > τ but is below both residents: not admitted.
    for _ in 0..5 {
        token(&mut c, &[1, 7]);
    }
    c.record(&[1, 7, 9]).unwrap();
    c.record(&[1, 7, 9]).unwrap();
    assert!(c.momentum(9) > 0.25 && c.momentum(9) < c.momentum(7).min(c.momentum(1)));
    assert_eq!(c.admit(&[9], &[]).unwrap(), vec![NO_SLOT]);
    assert!(c.last_evictions().is_empty());
}

#[test]
fn tam_predicted_uses_current_momentum() {
    let mut c = UnitCache::new(10, 2, TAM);
    c.record(&[4]).unwrap();
    assert_eq!(c.admit(&[4], &[]).unwrap(), vec![NO_SLOT]); // 0.2
    c.record(&[4]).unwrap();
    assert_ne!(c.admit(&[4], &[]).unwrap(), vec![NO_SLOT]); // 0.36
    assert!(close(c.momentum(4), 0.36));
}

#[test]
fn static_pins_top_slots_and_never_changes() {
    let mut c = UnitCache::new(10, 3, Policy::Static);
    // Before set_hot: empty, admits nothing.
    assert_eq!(token(&mut c, &[1, 2]), vec![NO_SLOT, NO_SLOT]);
    assert!(c.is_empty());
    let placed = c.place_hot(&[7, 3, 7, 9, 1, 0]).unwrap();
    assert_eq!(placed.len(), 3);
    assert_eq!(cached_set(&c), vec![3, 7, 9]);
    let before: Vec<(u32, u32)> = c.cached().collect();
    for t in 0..100u32 {
        let mut active = vec![t % 10, (t * 7 + 1) % 10];
        active.sort_unstable();
        active.dedup();
        let r = token(&mut c, &active);
        assert!(r.iter().all(|&s| s == NO_SLOT));
        assert!(c.admit(&[0, 1, 2], &[]).unwrap().iter().all(|&s| s == NO_SLOT));
    }
    c.reset_context();
    assert_eq!(c.cached().collect::<Vec<_>>(), before);
    // Re-pinning keeps slots of units that stay, evicts those that drop out.
    let slot9 = c.slot_of(9).unwrap();
    let placed = c.place_hot(&[9, 4, 7]).unwrap();
    assert_eq!(c.slot_of(9), Some(slot9));
    assert_eq!(c.last_evictions(), &[3]);
    assert_eq!(placed, vec![(4, c.slot_of(4).unwrap())]);
    assert_eq!(cached_set(&c), vec![4, 7, 9]);
    // Shrinking drops the lowest ranked first.
    let r = c.resize(1);
    assert_eq!(r.evicted, vec![7, 4]);
    assert_eq!(cached_set(&c), vec![9]);
    check(&c);
}

#[test]
fn none_admits_nothing() {
    let mut c = UnitCache::new(10, 5, Policy::None);
    assert_eq!(c.slots(), 0);
    assert_eq!(token(&mut c, &[1, 2, 3]), vec![NO_SLOT; 3]);
    c.set_hot(&[1, 2, 3]).unwrap();
    assert!(c.is_empty());
    assert_eq!(c.resize(5), Resize::default());
    assert_eq!(c.slots(), 0);
    assert_eq!(c.admit(&[4], &[]).unwrap(), vec![NO_SLOT]);
}

#[test]
fn warm_start_fills_free_slots_in_ranking_order() {
    for p in [Policy::Lfu, Policy::Lru, TAM] {
        let mut c = UnitCache::new(10, 3, p);
        let placed = c.place_hot(&[8, 8, 2, 5, 1]).unwrap();
        assert_eq!(placed, vec![(8, 0), (2, 1), (5, 2)]);
        assert!(c.place_hot(&[0]).unwrap().is_empty()); // full: nothing evicted
        check(&c);
    }
}

#[test]
fn protect_is_honoured() {
    for p in [Policy::Lfu, Policy::Lru, TAM] {
        let mut c = UnitCache::new(10, 2, p);
        c.place_hot(&[0, 1]).unwrap();
        for _ in 0..5 {
            c.record(&[2, 3]).unwrap();
        }
        // Both residents protected: nothing admitted.
        assert_eq!(c.admit(&[2, 3], &[1, 0]).unwrap(), vec![NO_SLOT, NO_SLOT], "{p:?}");
        assert_eq!(cached_set(&c), vec![0, 1]);
        // One protected: exactly the other is evicted.
        let r = c.admit(&[2, 3], &[1]).unwrap();
        assert_eq!(r.iter().filter(|&&s| s != NO_SLOT).count(), 1, "{p:?}");
        assert!(c.contains(1));
        assert_eq!(c.last_evictions(), &[0]);
        check(&c);
    }
}

#[test]
fn admit_tolerates_cached_and_duplicate_units() {
    let mut c = UnitCache::new(10, 2, Policy::Lru);
    token(&mut c, &[0]);
    c.record(&[0, 5]).unwrap();
    // 0 is cached: gets its slot back and is protected even though not in `protect`.
    let r = c.admit(&[5, 0, 5, 6], &[]).unwrap();
    assert_eq!(r[1], c.slot_of(0).unwrap());
    assert_eq!(r[0], r[2]);
    assert_ne!(r[0], NO_SLOT);
    assert_eq!(r[3], NO_SLOT);
    check(&c);
}

#[test]
fn resize_shrink_and_grow() {
    let mut c = UnitCache::new(20, 6, Policy::Lru);
    for u in 0..6 {
        token(&mut c, &[u]);
    }
    // Recency order (oldest first): 0..6. Shrink to 3: evict 0, 1, 2 (worst first).
    let slots_before: Vec<(u32, u32)> = c.cached().collect();
    let r = c.resize(3);
    assert_eq!(r.evicted, vec![0, 1, 2]);
    assert_eq!(c.slots(), 3);
    assert_eq!(cached_set(&c), vec![3, 4, 5]);
    for &(u, from, to) in &r.moved {
        assert!(from >= 3 && to < 3);
        assert!(slots_before.contains(&(u, from)));
        assert_eq!(c.slot_of(u), Some(to));
    }
    check(&c);
    // Grow: free slots added, nothing moves.
    let r = c.resize(8);
    assert_eq!(r, Resize::default());
    assert_eq!((c.slots(), c.len()), (8, 3));
    check(&c);
    // Free slots are reused before evicting.
    for u in 10..15 {
        token(&mut c, &[u]);
        assert!(c.last_evictions().is_empty());
    }
    assert_eq!(c.len(), 8);
    // Clamped to n_units.
    c.resize(100);
    assert_eq!(c.slots(), 20);
    // Shrink with free room: no eviction, only moves.
    let mut c = UnitCache::new(20, 6, Policy::Lfu);
    c.place_hot(&[0, 1, 2, 3, 4, 5]).unwrap();
    c.evict_all();
    c.place_hot(&[9]).unwrap();
    c.remove(9);
    c.insert(9, 5); // put it in the last slot
    c.rebuild_free();
    check(&c);
    let r = c.resize(2);
    assert!(r.evicted.is_empty());
    assert_eq!(r.moved, vec![(9, 5, 0)]);
    assert_eq!(c.slot_of(9), Some(0));
    check(&c);
    // Shrink to zero.
    let r = c.resize(0);
    assert_eq!(r.evicted, vec![9]);
    assert!(c.is_empty());
    assert_eq!(c.admit(&[1], &[]).unwrap(), vec![NO_SLOT]);
    check(&c);
}

/// Deterministic xorshift64* generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p_percent: u64) -> bool {
        self.next() % 100 < p_percent
    }
}

/// Random sorted unique subset of `0..n`, biased to a drifting hot window.
fn random_active(rng: &mut Rng, n: usize, window: usize) -> Vec<u32> {
    let k = rng.below(n.min(24) + 1);
    let mut v: Vec<u32> = (0..k)
        .map(|_| if rng.chance(70) { ((window + rng.below(n / 4 + 1)) % n) as u32 } else { rng.below(n) as u32 })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Thousands of random tokens through every policy: structural invariants, protect, the
/// returned slots, the caller's view of slot contents (kept from return values only), and
/// each policy's admission/eviction rule.
#[test]
fn randomized_invariants() {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let policies = [
        Policy::Lfu,
        Policy::Lru,
        TAM,
        Policy::Tam { lambda: 0.5, eps: 0.0 },
        Policy::Static,
        Policy::None,
        Policy::Belady,
    ];
    for round in 0..70 {
        let policy = policies[round % policies.len()];
        let n = 1 + rng.below(300);
        let slots = rng.below(n + 3);
        let mut c = UnitCache::new(n, slots, policy);
        // The whole trace up front (Belady needs it).
        let mut window = 0usize;
        let trace: Vec<Vec<u32>> = (0..1500)
            .map(|_| {
                if rng.chance(5) {
                    window = rng.below(n);
                }
                random_active(&mut rng, n, window)
            })
            .collect();
        c.set_future(trace.clone());
        // What the caller believes each slot holds, maintained only from return values.
        let mut view: Vec<u32> = vec![NO_SLOT; c.slots()];
        for (t, active) in trace.iter().enumerate() {
            match rng.below(200) {
                0 => {
                    let new = rng.below(n + 3);
                    let r = c.resize(new);
                    for &(u, from, to) in &r.moved {
                        assert_eq!(view[from as usize], u);
                        assert!((to as usize) < c.slots());
                        view[to as usize] = u;
                    }
                    for &u in &r.evicted {
                        assert!(!c.contains(u));
                    }
                    for w in r.evicted.windows(2) {
                        let order = worst_first(&c.ranked(w[0]), &c.ranked(w[1]));
                        assert_eq!(order, Ordering::Less, "{policy:?}: resize evicted out of order");
                    }
                    // Survivors rank above every evicted unit.
                    for (k, _) in c.cached() {
                        for &v in &r.evicted {
                            assert_eq!(worst_first(&c.ranked(v), &c.ranked(k)), Ordering::Less);
                        }
                    }
                    view.resize(c.slots(), NO_SLOT);
                }
                1 => c.reset_context(),
                2 => {
                    c.evict_all();
                    assert!(c.is_empty());
                }
                3 | 4 => {
                    let ranking: Vec<u32> = (0..rng.below(n + 1)).map(|_| rng.below(n) as u32).collect();
                    for (u, s) in c.place_hot(&ranking).unwrap() {
                        view[s as usize] = u;
                    }
                }
                _ => {}
            }
            check(&c);

            c.record(active).unwrap();
            let hits: Vec<u32> = active.iter().copied().filter(|&u| c.contains(u)).collect();
            let misses: Vec<u32> = active.iter().copied().filter(|&u| !c.contains(u)).collect();
            let predicted = rng.chance(20);
            let (units, protect) = if predicted {
                // Preload a few random units while the token's hits are protected.
                let mut p: Vec<u32> = (0..rng.below(6)).map(|_| rng.below(n) as u32).collect();
                p.retain(|&u| !c.contains(u));
                p.sort_unstable();
                p.dedup();
                (p, hits.clone())
            } else {
                (misses, hits.clone())
            };
            let hit_slots: Vec<u32> = hits.iter().map(|&u| c.slot_of(u).unwrap()).collect();
            let before: Vec<(u32, u32)> = c.cached().collect();
            let free_before = c.slots() - c.len();
            let r = c.admit(&units, &protect).unwrap();
            check(&c);
            assert_eq!(r.len(), units.len());
            // Protected units stay where they were.
            for (&u, &s) in hits.iter().zip(&hit_slots) {
                assert_eq!(c.slot_of(u), Some(s), "{policy:?} t{t}: protected unit {u} moved");
            }
            let mut admitted = Vec::new();
            let mut rejected = Vec::new();
            for (&u, &s) in units.iter().zip(&r) {
                if s == NO_SLOT {
                    assert!(!c.contains(u));
                    rejected.push(u);
                } else {
                    assert_eq!(c.slot_of(u), Some(s));
                    view[s as usize] = u;
                    admitted.push(u);
                }
            }
            // Evictions: exactly the residents that disappeared, and only as many as needed.
            let evicted = c.last_evictions().to_vec();
            let gone: Vec<u32> = before.iter().map(|&(u, _)| u).filter(|&u| !c.contains(u)).collect();
            let mut e_sorted = evicted.clone();
            e_sorted.sort_unstable();
            let mut g_sorted = gone.clone();
            g_sorted.sort_unstable();
            assert_eq!(e_sorted, g_sorted);
            assert_eq!(admitted.len(), evicted.len() + free_before.min(admitted.len()));
            assert!(evicted.len() <= admitted.len());
            if !evicted.is_empty() {
                assert_eq!(c.len(), c.slots(), "evicted while a slot was free");
            }
            // Policy rules.
            let kept_evictable: Vec<u32> = c
                .cached()
                .map(|(u, _)| u)
                .filter(|u| !protect.contains(u) && !admitted.contains(u) && !units.contains(u))
                .collect();
            match policy {
                Policy::Static | Policy::None => {
                    assert!(admitted.is_empty() && evicted.is_empty());
                }
                Policy::Lru => {
                    // Rejected only when nothing evictable was left.
                    if !rejected.is_empty() {
                        assert!(kept_evictable.is_empty(), "{policy:?} t{t}");
                    }
                    // Victims were the least recently used.
                    for &v in &evicted {
                        for &k in &kept_evictable {
                            assert!((c.last_access(v), v) < (c.last_access(k), k), "LRU victim {v} vs kept {k}");
                        }
                    }
                }
                Policy::Lfu | Policy::Tam { .. } | Policy::AdaptiveTam { .. } | Policy::Belady => {
                    for &a in &admitted {
                        assert!(c.eligible(c.score(a)), "{policy:?} admitted {a} at {}", c.score(a));
                        for &v in &evicted {
                            assert!(c.score(a) > c.score(v), "{policy:?} admitted {a} over {v}");
                        }
                    }
                    for &u in &rejected {
                        if !c.eligible(c.score(u)) {
                            continue;
                        }
                        assert_eq!(c.len(), c.slots(), "{policy:?}: rejected {u} with a free slot");
                        for &k in &kept_evictable {
                            assert!(c.score(u) <= c.score(k), "{policy:?}: rejected {u} but kept {k}");
                        }
                    }
                    // Victims are the worst of the evictable residents.
                    for &v in &evicted {
                        for &k in &kept_evictable {
                            let (rv, rk) = (c.ranked(v), c.ranked(k));
                            assert_eq!(worst_first(&rv, &rk), Ordering::Less, "{policy:?}: evicted {v} kept {k}");
                        }
                    }
                }
            }
            // The caller's view agrees with every occupied slot.
            for (u, s) in c.cached() {
                assert_eq!(view[s as usize], u, "{policy:?} t{t}: slot {s} view stale");
            }
        }
    }
}
