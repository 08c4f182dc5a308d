//! The fewest misses any policy can have on a known sequence of activations: the floor under
//! the bytes a budgeted run must read (its read bound).
//!
//! It is [`Policy::Belady`] driven the way the tiered store drives every cache (record a step,
//! hits protected, misses admitted or bypassed), from the cache's content when the sequence
//! starts (empty when a run starts): by the optimality argument in the crate docs, no policy
//! driven that way from that content misses less.

use crate::{Policy, UnitCache, UnitOutOfRange};

/// Misses of the optimal policy with `slots` slots over `steps` (each step's active units,
/// sorted ascending, unique, `< n_units`), starting with the units `warm` cached (as many as fit).
pub fn min_misses(steps: &[Vec<u32>], n_units: usize, slots: usize, warm: &[u32]) -> Result<u64, UnitOutOfRange> {
    let mut cache = UnitCache::new(n_units, slots, Policy::Belady);
    for s in steps {
        cache.check_units(s)?;
    }
    cache.set_hot(warm)?;
    cache.set_future(steps.to_vec());
    let (mut hits, mut misses, mut n_missed) = (Vec::new(), Vec::new(), 0u64);
    for active in steps {
        cache.record(active)?;
        hits.clear();
        misses.clear();
        for &u in active {
            if cache.contains(u) {
                hits.push(u);
            } else {
                misses.push(u);
            }
        }
        n_missed += misses.len() as u64;
        cache.admit(&misses, &hits)?;
    }
    Ok(n_missed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_checked_sequence() {
        // Steps {0,1} {2} {0} {1} {2} {0} over 3 units.
        let steps = [vec![0, 1], vec![2], vec![0], vec![1], vec![2], vec![0]];
        // Two slots: 0 and 1 miss and stay; 2 (next used at step 4, after 0 at 2 and 1 at 3) is
        // read and not kept; 0 and 1 hit; 2 misses again (never used after: not kept); 0 hits.
        assert_eq!(min_misses(&steps, 3, 2, &[]).unwrap(), 4);
        // One slot: 0 stays (next at 2), 1 and 2 bypass; 0 hits; 1 and 2 miss; 0 hits.
        assert_eq!(min_misses(&steps, 3, 1, &[]).unwrap(), 5);
        // Room for all: only first uses miss. No room: every activation misses.
        assert_eq!(min_misses(&steps, 3, 3, &[]).unwrap(), 3);
        assert_eq!(min_misses(&steps, 3, 0, &[]).unwrap(), 7);
        // Two slots holding 2 and 1 at the start: 0 misses at step 0 (not kept: 2, the only
        // evictable unit, is needed sooner), 2, 0 (not kept again), 1 and 2 hit... 0 misses at
        // steps 0, 2 and 5. Keeping 0 instead costs the same: 0, then 2 at steps 1 and 4.
        assert_eq!(min_misses(&steps, 3, 2, &[2, 1]).unwrap(), 3);
    }

    #[test]
    fn a_unit_out_of_range_is_an_error() {
        assert!(min_misses(&[vec![0, 7]], 4, 2, &[]).is_err());
    }

    /// No other policy, driven the same way from an empty cache, misses less.
    #[test]
    fn no_policy_misses_less() {
        let mut state = 0x5eedu64;
        let mut rand = |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        for _ in 0..50 {
            let n_units = 8 + rand(24) as usize;
            let steps: Vec<Vec<u32>> =
                (0..40).map(|_| (0..n_units as u32).filter(|_| rand(3) == 0).collect()).collect();
            for slots in [0, 1, n_units / 4, n_units / 2, n_units] {
                let best = min_misses(&steps, n_units, slots, &[]).unwrap();
                for policy in [Policy::Lfu, Policy::Lru, Policy::Tam { lambda: 0.8, eps: 0.05 }] {
                    let mut c = UnitCache::new(n_units, slots, policy);
                    let mut missed = 0u64;
                    for a in &steps {
                        c.record(a).unwrap();
                        let (h, m): (Vec<u32>, Vec<u32>) = a.iter().partition(|&&u| c.contains(u));
                        missed += m.len() as u64;
                        c.admit(&m, &h).unwrap();
                    }
                    assert!(best <= missed, "{policy:?} with {slots} slots: {missed} < {best}");
                }
            }
        }
    }
}
