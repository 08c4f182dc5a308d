//! Belady's MIN with bypass: the offline optimum, for simulation (it needs the future).
//!
//! The crate docs define the key (a unit's future use sequence, compared lexicographically) and
//! prove the batch rule optimal under the cache's protocol.

use super::ReplacementPolicy;

/// Belady's view of the future: for every unit, the ticks (values of the clock right after the
/// `record` call) at which it will be active, ascending, as one CSR array, with the rank of
/// every suffix of these lists.
#[derive(Clone, Debug)]
struct Future {
    /// Unit `u`'s use ticks are `ticks[start[u]..start[u + 1]]`.
    start: Vec<u32>,
    ticks: Vec<u32>,
    /// Per entry: the rank of the use sequence starting there (`ticks[p..start[u + 1]]`) in
    /// lexicographic order, ∞-padded (a sequence that ends is later than one that goes on):
    /// `rank[p] < rank[q]` iff the sequence at `p` is sooner, equal iff the sequences are equal.
    rank: Vec<u32>,
    /// Per unit: index into `ticks` of its first use not yet recorded (advanced by `record`).
    cursor: Vec<u32>,
    /// Clock when the future was set: step `i` is recorded at tick `base + 1 + i`.
    base: u32,
    /// Per step: the number of active units (checks `record` in debug builds).
    sizes: Vec<u32>,
}

/// A next-use tick meaning "never used again".
const NEVER: u32 = u32::MAX;

impl Future {
    /// Moves past tick `now` (the step just recorded with `active`).
    fn record(&mut self, active: &[u32], now: u32) {
        let step = now.wrapping_sub(self.base).wrapping_sub(1) as usize;
        if let Some(&size) = self.sizes.get(step) {
            debug_assert_eq!(active.len(), size as usize, "record: step {step} differs from the future");
        }
        for &u in active {
            let u = u as usize;
            let end = self.start[u + 1];
            let c = &mut self.cursor[u];
            while *c < end && self.ticks[*c as usize] < now {
                *c += 1; // skipped a step: `record` was given another list (release builds)
            }
            if step < self.sizes.len() {
                debug_assert!(
                    *c < end && self.ticks[*c as usize] == now,
                    "record: unit {u} is active at step {step} but not in the future's list"
                );
            }
            if *c < end && self.ticks[*c as usize] == now {
                *c += 1;
            }
        }
    }
}

/// The offline optimum over the future given to [`UnitCache::set_future`](crate::UnitCache::set_future).
/// Without one, every unit counts as never used again and nothing is admitted.
#[derive(Clone, Debug)]
pub struct BeladyOracle {
    n_units: usize,
    future: Option<Box<Future>>,
}

impl BeladyOracle {
    pub fn new(n_units: usize) -> BeladyOracle {
        BeladyOracle { n_units, future: None }
    }

    /// The active lists of every later `record` call, in order, given at cache tick `clock`
    /// (`steps[0]` is the next call's; each sorted ascending, unique, `< n_units`), replacing
    /// any previous future. Stored per unit as the sorted list of its use steps, with the
    /// lexicographic rank of every suffix (8 bytes per activation, 8 per unit, 4 per step; built
    /// in O(E log E)), so comparing two units' keys is O(1) on the common path (`record`
    /// advances a per-unit cursor). Panics on a unit out of range or a list that is not sorted
    /// and unique.
    pub fn set_future(&mut self, steps: Vec<Vec<u32>>, clock: u32) {
        let n = self.n_units;
        let total: usize = steps.iter().map(Vec::len).sum();
        assert!(total < u32::MAX as usize, "set_future: too many activations ({total})");
        assert!(
            (clock as u64) + (steps.len() as u64) < NEVER as u64,
            "set_future: {} steps overflow the clock",
            steps.len()
        );
        let mut start = vec![0u32; n + 1];
        for (i, step) in steps.iter().enumerate() {
            assert!(step.windows(2).all(|w| w[0] < w[1]), "set_future: step {i} not sorted/unique");
            if let Some(&u) = step.last() {
                assert!((u as usize) < n, "set_future: step {i}: unit {u} out of range ({n} units)");
            }
            for &u in step {
                start[u as usize + 1] += 1;
            }
        }
        for u in 0..n {
            start[u + 1] += start[u];
        }
        let mut cursor: Vec<u32> = start[..n].to_vec();
        let mut ticks = vec![0u32; total];
        let base = clock;
        for (i, step) in steps.iter().enumerate() {
            let tick = base + 1 + i as u32;
            for &u in step {
                let c = &mut cursor[u as usize];
                ticks[*c as usize] = tick;
                *c += 1;
            }
        }
        // Suffix ranks, from the last step back: the sequences starting at step i (one per
        // active unit) rank below every sequence starting later, and among themselves by the
        // rank of their rest (already known). `cursor` walks back from each unit's end.
        let mut rank = vec![0u32; total];
        let mut next = total as u32;
        let mut order: Vec<(u32, u32)> = Vec::new(); // (rank of the rest, entry)
        for step in steps.iter().rev() {
            order.clear();
            for &u in step {
                let c = &mut cursor[u as usize];
                *c -= 1;
                let p = *c;
                let rest = if p + 1 < start[u as usize + 1] { rank[p as usize + 1] } else { NEVER };
                order.push((rest, p));
            }
            order.sort_unstable_by_key(|o| std::cmp::Reverse(o.0));
            let mut prev = None;
            for &(rest, p) in &order {
                if prev != Some(rest) {
                    next -= 1;
                    prev = Some(rest);
                }
                rank[p as usize] = next;
            }
        }
        debug_assert_eq!(cursor, start[..n]);
        let sizes = steps.iter().map(|s| s.len() as u32).collect();
        self.future = Some(Box::new(Future { start, ticks, rank, cursor, base, sizes }));
    }

    /// The index in the future's arrays of `unit`'s next use after tick `now`.
    fn next_entry(&self, unit: u32, now: u32) -> Option<(&Future, usize)> {
        let f = self.future.as_deref()?;
        let u = unit as usize;
        let (c, end) = (f.cursor[u] as usize, f.start[u + 1] as usize);
        let uses = &f.ticks[c..end];
        let p = match uses.first() {
            None => return None,
            Some(&t) if t > now => c,
            // Only when `record` was given other lists than the future's (release builds).
            Some(_) => c + uses.partition_point(|&t| t <= now),
        };
        (p < end).then_some((f, p))
    }

    /// The tick of `unit`'s next use after tick `now`, if any.
    pub(crate) fn next_tick(&self, unit: u32, now: u32) -> Option<u32> {
        self.next_entry(unit, now).map(|(f, p)| f.ticks[p])
    }
}

impl ReplacementPolicy for BeladyOracle {
    fn record(&mut self, active: &[u32], now: u32) {
        if let Some(f) = self.future.as_deref_mut() {
            f.record(active, now);
        }
    }

    /// Minus the rank of the unit's future use sequence: sooner next use first, ties by the use
    /// after; −∞ when never used again.
    #[inline]
    fn score(&self, unit: u32, now: u32) -> f64 {
        self.next_entry(unit, now).map_or(f64::NEG_INFINITY, |(f, p)| -(f.rank[p] as f64))
    }

    /// A miss never used again is read for this token only (bypass).
    #[inline]
    fn eligible(&self, score: f64) -> bool {
        score > f64::NEG_INFINITY
    }
}
