//! Belady's clairvoyant policy (the offline optimum the simulator bounds online policies with):
//! its rule on hand-made traces, its errors, and its optimality against every online policy, a
//! static hot set and an exhaustive search.

use super::*;

/// Runs `trace` through a cache the way the engine does (record, split hits/misses, admit
/// the misses protecting the hits), after `set_future(trace)` and `set_hot(warm)`; returns
/// the total number of hits.
fn run_hits(n: usize, slots: usize, policy: Policy, trace: &[Vec<u32>], warm: &[u32]) -> u64 {
    let mut c = UnitCache::new(n, slots, policy);
    c.set_future(trace.to_vec());
    c.set_hot(warm).unwrap();
    let mut hits = 0;
    for active in trace {
        c.record(active).unwrap();
        let h: Vec<u32> = active.iter().copied().filter(|&u| c.contains(u)).collect();
        let m: Vec<u32> = active.iter().copied().filter(|&u| !c.contains(u)).collect();
        hits += h.len() as u64;
        c.admit(&m, &h).unwrap();
    }
    hits
}

fn steps(lists: &[&[u32]]) -> Vec<Vec<u32>> {
    lists.iter().map(|l| l.to_vec()).collect()
}

#[test]
fn belady_bypasses_units_never_used_again() {
    // Single-unit steps, 2 slots: 0 1 2 0 1 3 0 1. 2 and 3 are never used again: bypassed.
    let trace = steps(&[&[0], &[1], &[2], &[0], &[1], &[3], &[0], &[1]]);
    let mut c = UnitCache::new(4, 2, Policy::Belady);
    c.set_future(trace.clone());
    let mut got = Vec::new();
    for active in &trace {
        got.push(token(&mut c, active));
        assert!(c.last_evictions().is_empty());
    }
    let e = Vec::<u32>::new;
    assert_eq!(got, vec![vec![0], vec![1], vec![NO_SLOT], e(), e(), vec![NO_SLOT], e(), e()]);
    assert_eq!(cached_set(&c), vec![0, 1]);
    assert_eq!(run_hits(4, 2, Policy::Belady, &trace, &[]), 4);
    assert_eq!(run_hits(4, 2, Policy::Lru, &trace, &[]), 0);
}

#[test]
fn belady_evicts_the_farthest_next_use() {
    // 2 slots: 0 1 2 2 0 1. At step 2, 2 (next use: step 3) evicts 1 (step 5), not 0 (step 4).
    let trace = steps(&[&[0], &[1], &[2], &[2], &[0], &[1]]);
    let mut c = UnitCache::new(3, 2, Policy::Belady);
    c.set_future(trace.clone());
    token(&mut c, &trace[0]);
    token(&mut c, &trace[1]);
    let slot1 = c.slot_of(1).unwrap();
    assert_eq!((c.next_use(0), c.next_use(1), c.next_use(2)), (Some(3), Some(4), Some(1)));
    assert_eq!(token(&mut c, &trace[2]), vec![slot1]);
    assert_eq!(c.last_evictions(), &[1]);
    assert_eq!(token(&mut c, &trace[3]), Vec::<u32>::new()); // hit
    assert_eq!(token(&mut c, &trace[4]), Vec::<u32>::new()); // hit
    assert_eq!(token(&mut c, &trace[5]), vec![NO_SLOT]); // 1 is never used again
    assert_eq!(run_hits(3, 2, Policy::Belady, &trace, &[]), 2);
    // Past the end of the future nothing is used again: nothing admitted, no panic.
    assert_eq!(token(&mut c, &[]), Vec::<u32>::new());
    assert_eq!(c.next_use(0), None);
    check(&c);
}

#[test]
fn belady_batch_pairs_soonest_misses_with_farthest_residents() {
    // 3 slots, warm start 0 1 2. Step 0: 0 hits (protected); misses 3, 4 (next: step 1)
    // and 5 (step 2); evictable 2 (step 3) and 1 (step 2). 3 evicts 2, 4 evicts 1, 5 has
    // nothing left it strictly beats.
    let trace = steps(&[&[0, 3, 4, 5], &[3, 4], &[1, 5], &[2], &[0]]);
    let mut c = UnitCache::new(6, 3, Policy::Belady);
    c.set_future(trace.clone());
    c.set_hot(&[0, 1, 2]).unwrap();
    assert_eq!(cached_set(&c), vec![0, 1, 2]);
    assert_eq!((c.next_use(0), c.next_use(5), c.next_use(2)), (Some(1), Some(1), Some(4)));
    let (slot1, slot2) = (c.slot_of(1).unwrap(), c.slot_of(2).unwrap());
    assert_eq!(token(&mut c, &trace[0]), vec![slot2, slot1, NO_SLOT]);
    assert_eq!(c.last_evictions(), &[2, 1]);
    assert_eq!(cached_set(&c), vec![0, 3, 4]);
    assert_eq!((c.next_use(0), c.next_use(5), c.next_use(3)), (Some(4), Some(2), Some(1)));
    assert_eq!(token(&mut c, &trace[1]), Vec::<u32>::new());
    // 1 and 5 are never used again after step 2: bypassed although 3 and 4 are dead too.
    assert_eq!(token(&mut c, &trace[2]), vec![NO_SLOT, NO_SLOT]);
    assert_eq!(c.next_use(3), None);
    // Shrinking evicts the farthest next use first: 3 and 4 (never; lower id first), keeps 0.
    let r = c.resize(1);
    assert_eq!(r.evicted, vec![3, 4]);
    assert_eq!(cached_set(&c), vec![0]);
    check(&c);
    assert_eq!(token(&mut c, &trace[3]), vec![NO_SLOT]);
    assert_eq!(token(&mut c, &trace[4]), Vec::<u32>::new());
    assert_eq!(run_hits(6, 3, Policy::Belady, &trace, &[0, 1, 2]), 4);
}

#[test]
fn belady_ties_on_next_use_go_to_the_sooner_use_after() {
    // 1 slot holding 2. Step 0 uses 3; 2 and 3 are both next used at step 1, and 3 again at
    // step 2. Hits are protected, so whichever is cached at step 1 stays through it: 3 must
    // replace 2 now (plain next-use MIN keeps 2 and gets 1 hit instead of 2).
    let trace = steps(&[&[3], &[2, 3], &[3]]);
    let mut c = UnitCache::new(4, 1, Policy::Belady);
    c.set_future(trace.clone());
    c.set_hot(&[2]).unwrap();
    assert_eq!(token(&mut c, &trace[0]), vec![0]);
    assert_eq!(c.last_evictions(), &[2]);
    assert_eq!(c.next_use(2), c.next_use(3));
    assert_eq!(token(&mut c, &trace[1]), vec![NO_SLOT]);
    assert_eq!(token(&mut c, &trace[2]), Vec::<u32>::new());
    assert_eq!(run_hits(4, 1, Policy::Belady, &trace, &[2]), 2);
    // A unit whose uses are a prefix of another's ranks later (it ends: ∞ after that).
    let mut c = UnitCache::new(4, 1, Policy::Belady);
    c.set_future(steps(&[&[0, 1], &[0, 1], &[1]]));
    c.record(&[0, 1]).unwrap();
    assert_eq!(c.admit(&[0, 1], &[]).unwrap(), vec![NO_SLOT, 0]);
}

#[test]
fn belady_free_slots_go_to_the_soonest_next_use() {
    // 2 free slots, 4 misses: 2 (next: step 1) and 0 (step 2) get them, 1 (step 3) does
    // not, 3 (never) is bypassed.
    let trace = steps(&[&[0, 1, 2, 3], &[2], &[0], &[1]]);
    let mut c = UnitCache::new(4, 2, Policy::Belady);
    c.set_future(trace.clone());
    // Free slots are handed out lowest first, soonest next use first: 2 gets slot 0.
    assert_eq!(token(&mut c, &trace[0]), vec![1, NO_SLOT, 0, NO_SLOT]);
    assert_eq!(cached_set(&c), vec![0, 2]);
    assert_eq!(run_hits(4, 2, Policy::Belady, &trace, &[]), 2);
}

#[test]
fn belady_without_future_admits_nothing_and_stays_usable() {
    let mut c = UnitCache::new(10, 3, Policy::Belady);
    assert_eq!(token(&mut c, &[1, 2]), vec![NO_SLOT, NO_SLOT]);
    assert_eq!(c.next_use(1), None);
    assert_eq!(c.admit(&[4], &[]).unwrap(), vec![NO_SLOT]);
    // Warm start like LFU.
    assert_eq!(c.place_hot(&[5, 6, 5, 7, 8]).unwrap(), vec![(5, 0), (6, 1), (7, 2)]);
    assert_eq!(token(&mut c, &[5, 9]), vec![NO_SLOT]);
    assert_eq!(c.resize(1).evicted.len(), 2);
    c.reset_context();
    check(&c);
    // Other policies ignore a future.
    let mut l = UnitCache::new(10, 3, Policy::Lfu);
    l.set_future(vec![vec![1]]);
    assert_eq!(l.next_use(1), None);
    assert_ne!(token(&mut l, &[1]), vec![NO_SLOT]);
}

#[test]
fn belady_future_set_mid_run_counts_from_the_next_record() {
    let mut c = UnitCache::new(5, 1, Policy::Belady);
    token(&mut c, &[0]);
    token(&mut c, &[1]);
    c.set_future(steps(&[&[2], &[], &[2, 3]]));
    assert_eq!((c.next_use(2), c.next_use(3), c.next_use(0)), (Some(1), Some(3), None));
    assert_eq!(token(&mut c, &[2]), vec![0]); // used again at step 2
    assert_eq!(c.next_use(2), Some(2));
    token(&mut c, &[]);
    // 3 (never again after this step) is bypassed; 2 hits.
    assert_eq!(token(&mut c, &[2, 3]), vec![NO_SLOT]);
    assert_eq!(cached_set(&c), vec![2]);
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "differs from the future")]
fn belady_record_checks_the_future_in_debug_builds() {
    let mut c = UnitCache::new(5, 1, Policy::Belady);
    c.set_future(steps(&[&[1, 2]]));
    c.record(&[1]).unwrap();
}

#[test]
fn units_out_of_range_are_errors_that_change_nothing() {
    let all = [Policy::Lfu, Policy::Lru, TAM, Policy::Static, Policy::None, Policy::Belady];
    for p in all {
        let mut c = UnitCache::new(10, 3, p);
        c.set_future(steps(&[&[1, 2], &[1, 2, 4], &[4]]));
        c.set_hot(&[2, 1]).unwrap();
        c.record(&[1, 2]).unwrap();
        let before = format!("{c:?}");
        let err = UnitOutOfRange { unit: 10, n_units: 10 };
        assert_eq!(c.record(&[1, 2, 10]), Err(err), "{p:?}");
        assert_eq!(c.admit(&[4, 10], &[1]), Err(err), "{p:?}");
        assert_eq!(c.admit(&[10], &[]), Err(err), "{p:?}");
        assert_eq!(c.set_hot(&[3, 4, 5, 6, 10]), Err(err), "{p:?}");
        let far = UnitOutOfRange { unit: u32::MAX, n_units: 10 };
        assert_eq!(c.place_hot(&[u32::MAX, 0]), Err(far), "{p:?}");
        assert_eq!(format!("{c:?}"), before, "{p:?}: a refused call changes nothing");
        assert_eq!(err.to_string(), "unit 10 is out of range: the tensor has 10 units");
        // Protected units out of range cannot be cached, so they are not an error.
        c.record(&[1, 2, 4]).unwrap();
        let r = c.admit(&[4], &[1, 2, 99]).unwrap();
        assert_eq!(r.len(), 1);
        check(&c);
    }
}

#[test]
#[should_panic(expected = "out of range")]
fn belady_future_unit_out_of_range_panics() {
    UnitCache::new(5, 1, Policy::Belady).set_future(steps(&[&[1, 5]]));
}

/// The most hits any schedule can get under the module's protocol: after each step the cache
/// holds the step's hits plus any subset of (residents ∪ misses), at most `k` units. Bitmask
/// DP over all cache states (n ≤ 8).
fn exhaustive_optimum(n: usize, k: usize, trace: &[u32], init: u32) -> u64 {
    let states = 1usize << n;
    let mut best = vec![-1i64; states];
    best[init as usize] = 0;
    for &a in trace {
        let mut next = vec![-1i64; states];
        for (c, &h) in best.iter().enumerate() {
            if h < 0 {
                continue;
            }
            let c = c as u32;
            let hit = c & a;
            let pool = (c | a) & !hit;
            let gained = h + hit.count_ones() as i64;
            // Every subset of `pool`.
            let mut sub = pool;
            loop {
                let s = hit | sub;
                if s.count_ones() as usize <= k {
                    next[s as usize] = next[s as usize].max(gained);
                }
                if sub == 0 {
                    break;
                }
                sub = (sub - 1) & pool;
            }
        }
        best = next;
    }
    best.into_iter().max().unwrap() as u64
}

/// Textbook MIN with bypass for one request per step (`None`: no request): on a miss, skip
/// a unit never requested again, else take a free slot, else replace the resident whose next
/// request is farthest if that is farther than the newcomer's.
fn reference_min(k: usize, trace: &[Option<u32>]) -> u64 {
    let next = |from: usize, u: u32| trace[from..].iter().position(|&x| x == Some(u)).map_or(usize::MAX, |p| from + p);
    let mut cache: Vec<u32> = Vec::new();
    let mut hits = 0;
    for (t, &x) in trace.iter().enumerate() {
        let Some(x) = x else { continue };
        if cache.contains(&x) {
            hits += 1;
            continue;
        }
        let nx = next(t + 1, x);
        if nx == usize::MAX || k == 0 {
            continue;
        }
        if cache.len() < k {
            cache.push(x);
            continue;
        }
        let (i, far) = cache.iter().enumerate().map(|(i, &u)| (i, next(t + 1, u))).max_by_key(|&(_, f)| f).unwrap();
        if far > nx {
            cache[i] = x;
        }
    }
    hits
}

fn mask_to_list(m: u32) -> Vec<u32> {
    (0..32).filter(|b| m >> b & 1 == 1).collect()
}

/// A trace of `steps` active sets over `n` units. `skew`: ranks drawn log-uniformly (Zipf-like
/// with exponent 1: P(rank r) ∝ 1/(r + 1)) through a permutation that rotates every
/// `drift` steps (0: never); otherwise uniform.
fn gen_trace(seed: u64, n: usize, steps: usize, max_active: usize, skew: bool, drift: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng(seed | 1);
    let mut perm: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    (0..steps)
        .map(|t| {
            let k = rng.below(max_active + 1);
            let shift = t.checked_div(drift).unwrap_or(0);
            let mut v: Vec<u32> = (0..k)
                .map(|_| {
                    if skew {
                        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                        let rank = ((n as f64 + 1.0).powf(u) - 1.0).floor() as usize;
                        perm[(rank.min(n - 1) + shift) % n]
                    } else {
                        rng.below(n) as u32
                    }
                })
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect()
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Belady gets at least as many hits as every online policy and as a static hot set
        /// (any ranking, and the trace's own frequency ranking), cold and from the same warm
        /// start, on skewed, drifting and uniform traces.
        #[test]
        fn belady_beats_every_online_policy(
            seed in any::<u64>(),
            n in 1usize..48,
            slot_frac in 0.0f64..=1.0,
            n_steps in 1usize..120,
            max_active in 0usize..16,
            skew in any::<bool>(),
            drift in prop_oneof![Just(0usize), 5usize..40],
            ranking_seed in any::<u64>(),
        ) {
            let slots = (slot_frac * n as f64).round() as usize;
            let trace = gen_trace(seed, n, n_steps, max_active, skew, drift);
            let mut ranking: Vec<u32> = (0..n as u32).collect();
            let mut rng = Rng(ranking_seed | 1);
            for i in (1..n).rev() {
                ranking.swap(i, rng.below(i + 1));
            }
            let mut freq = vec![0u32; n];
            for u in trace.iter().flatten() {
                freq[*u as usize] += 1;
            }
            let mut by_freq: Vec<u32> = (0..n as u32).collect();
            by_freq.sort_by_key(|&u| std::cmp::Reverse(freq[u as usize]));
            let online = [Policy::Lfu, Policy::Lru, TAM];
            let belady_cold = run_hits(n, slots, Policy::Belady, &trace, &[]);
            for p in online {
                let h = run_hits(n, slots, p, &trace, &[]);
                prop_assert!(belady_cold >= h, "cold: belady {} < {:?} {}", belady_cold, p, h);
            }
            for warm in [&ranking, &by_freq] {
                let belady = run_hits(n, slots, Policy::Belady, &trace, warm);
                for p in online.into_iter().chain([Policy::Static]) {
                    let h = run_hits(n, slots, p, &trace, warm);
                    prop_assert!(belady >= h, "warm: belady {} < {:?} {}", belady, p, h);
                }
            }
        }

        /// Belady equals the exhaustive optimum over every schedule the protocol allows.
        #[test]
        fn belady_matches_exhaustive_optimum(
            n in 1usize..9,
            slot_frac in 0.0f64..=1.0,
            masks in proptest::collection::vec(any::<u32>(), 1..14),
            init in any::<u32>(),
        ) {
            let k = (slot_frac * n as f64).round() as usize;
            let all = (1u32 << n) - 1;
            let masks: Vec<u32> = masks.into_iter().map(|m| m & all).collect();
            // A warm start of at most k units.
            let mut init = init & all;
            while init.count_ones() as usize > k {
                init &= init - 1;
            }
            let trace: Vec<Vec<u32>> = masks.iter().map(|&m| mask_to_list(m)).collect();
            let hits = run_hits(n, k, Policy::Belady, &trace, &mask_to_list(init));
            prop_assert_eq!(hits, exhaustive_optimum(n, k, &masks, init));
        }

        /// With one unit per step, Belady equals textbook MIN with bypass.
        #[test]
        fn belady_matches_reference_min_on_single_unit_steps(
            n in 1usize..30,
            k in 0usize..12,
            reqs in proptest::collection::vec(proptest::option::weighted(0.9, 0u32..30), 1..200),
        ) {
            let reqs: Vec<Option<u32>> = reqs.into_iter().map(|r| r.map(|u| u % n as u32)).collect();
            let trace: Vec<Vec<u32>> = reqs.iter().map(|r| r.iter().copied().collect()).collect();
            prop_assert_eq!(run_hits(n, k, Policy::Belady, &trace, &[]), reference_min(k.min(n), &reqs));
        }
    }
}
