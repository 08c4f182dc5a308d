//! KAIROX's online neuron balancing (Algorithm 1), as bookkeeping: which groups of a site's
//! units the GPU holds, which of a token's active units therefore run there and which on the
//! CPU, and which groups to load next. No GPU here: [`crate::hybrid`] moves the bytes; this
//! module is what the tests check on hand-made activity.
//!
//! Units are a site's input channels in the pack's unit order (co-activation grouping happens
//! when the pack is made): group `g` is positions `g·group_size ..` of that order, moved as one
//! transfer. Each (layer, site) has a [`UnitCache`] over its groups with `slots` group slots,
//! under the policy of [`BalancePolicy`]:
//! - `static` (PowerInfer-like): the groups most active over the prompt pinned at its end;
//! - `eager` (Neuralink-like): every active group not held is loaded *before* the token's
//!   product (on the critical path), the least recently used evicted;
//! - `lru`: misses run on the CPU this token and are loaded for the next, LRU eviction;
//! - `tam`: Temporal Activation Momentum at group level, `S ← λS + (1−λ)A` (A = 1 when any unit
//!   of the group is active), loads only for groups above `τ_load = (1−λ) + ε` (one-hit wonders
//!   stay on the CPU), the top groups by momentum held;
//! - `tam-adaptive`: the same with λ moved per (layer, site) by the stall type of each step
//!   through [`LambdaController`] (the controller the flash tier uses): an I/O stall (the GPU's
//!   product waited for loads) raises λ, a CPU-bound step lowers it.
//!
//! A group counts as active in a token when it holds at least the site's share of active units
//! (see [`NeuronBalancer::plan`]): binary activity per group, as Algorithm 1 takes it, that still
//! separates hot from cold groups when most groups have some active unit (Top-K at 0.5).
//! Every policy starts a sequence warm: the groups most active over the prompt fill the slots.

use sift_store::cache::{LambdaBounds, LambdaController, Policy, UnitCache, NO_SLOT};

/// How the GPU's share of each site is chosen (`--gpu-policy`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BalancePolicy {
    Static,
    Eager,
    Lru,
    Tam { lambda: f32, eps: f32 },
    TamAdaptive { lambda0: f32, eps: f32 },
}

impl BalancePolicy {
    /// Every name [`BalancePolicy::parse`] accepts.
    pub const NAMES: &'static [&'static str] = &["static", "eager", "lru", "tam", "tam-adaptive"];

    /// `static`, `eager`, `lru`, `tam` (λ = 0.8, ε = 0.05) or `tam-adaptive` (λ from 0.5, KAIROX's
    /// start).
    pub fn parse(s: &str) -> Option<BalancePolicy> {
        Some(match s {
            "static" => BalancePolicy::Static,
            "eager" => BalancePolicy::Eager,
            "lru" => BalancePolicy::Lru,
            "tam" => BalancePolicy::Tam {
                lambda: sift_store::cache::TAM_DEFAULT_LAMBDA,
                eps: sift_store::cache::TAM_DEFAULT_EPS,
            },
            "tam-adaptive" => BalancePolicy::TamAdaptive { lambda0: 0.5, eps: sift_store::cache::TAM_DEFAULT_EPS },
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            BalancePolicy::Static => "static",
            BalancePolicy::Eager => "eager",
            BalancePolicy::Lru => "lru",
            BalancePolicy::Tam { .. } => "tam",
            BalancePolicy::TamAdaptive { .. } => "tam-adaptive",
        }
    }

    fn cache_policy(&self) -> Policy {
        match *self {
            BalancePolicy::Static => Policy::Static,
            BalancePolicy::Eager | BalancePolicy::Lru => Policy::Lru,
            BalancePolicy::Tam { lambda, eps } => Policy::Tam { lambda, eps },
            BalancePolicy::TamAdaptive { lambda0, eps } => Policy::AdaptiveTam { lambda: lambda0, eps },
        }
    }
}

/// One (layer, site): its units' groups and the cache over them.
#[derive(Debug)]
pub struct SiteBalance {
    /// Per unit (input channel): its group and its place in the group.
    group_of: Vec<u32>,
    place: Vec<u32>,
    group_size: usize,
    cache: UnitCache,
    /// Active rows per group over the current prompt (the warm start's ranking).
    prompt: Vec<u32>,
}

/// Where a token's active units of one site run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SitePlan {
    /// Indices into the token's active list of the units the GPU holds, and their columns in
    /// the site's pool (`slot · group_size + place`).
    pub gpu: Vec<usize>,
    pub gpu_cols: Vec<u32>,
    /// The other active units (ascending), computed on the CPU.
    pub cpu_units: Vec<u32>,
    /// `(group, slot)` to load before the product (eager only).
    pub load_first: Vec<(u32, u32)>,
    /// The token's active (hot) groups, and those not held when it came (for
    /// [`NeuronBalancer::after`]).
    groups: Vec<u32>,
    misses: Vec<u32>,
}

/// All sites' balancing and the λ controller (see the module docs).
#[derive(Debug)]
pub struct NeuronBalancer {
    pub policy: BalancePolicy,
    sites: Vec<SiteBalance>,
    ctl: LambdaController,
    step: u32,
}

impl NeuronBalancer {
    /// Sites `positions.len()`: site `p`'s units lie at `positions[p]` of its pack order (unit
    /// `u` at position `positions[p][u]`), cut into groups of `group_sizes[p]`, of which
    /// `slots[p]` fit on the GPU.
    pub fn new(
        policy: BalancePolicy,
        positions: &[Vec<u32>],
        group_sizes: &[usize],
        slots: &[usize],
    ) -> NeuronBalancer {
        let sites = positions
            .iter()
            .zip(slots)
            .zip(group_sizes)
            .map(|((pos, &k), &gs)| {
                let gs = gs.max(1);
                let n_groups = pos.len().div_ceil(gs);
                SiteBalance {
                    group_of: pos.iter().map(|&p| p / gs as u32).collect(),
                    place: pos.iter().map(|&p| p % gs as u32).collect(),
                    group_size: gs,
                    cache: UnitCache::new(n_groups, k.min(n_groups), policy.cache_policy()),
                    prompt: vec![0; n_groups],
                }
            })
            .collect::<Vec<_>>();
        let lambda0 = match policy {
            BalancePolicy::Tam { lambda, .. } => lambda,
            BalancePolicy::TamAdaptive { lambda0, .. } => lambda0,
            _ => sift_store::cache::TAM_DEFAULT_LAMBDA,
        };
        let ctl = LambdaController::new(sites.len(), lambda0, LambdaBounds::default());
        NeuronBalancer { policy, sites, ctl, step: 0 }
    }

    pub fn n_sites(&self) -> usize {
        self.sites.len()
    }

    /// Groups of site `p` and the GPU's slots for them.
    pub fn groups(&self, p: usize) -> (usize, usize) {
        (self.sites[p].cache.n_units(), self.sites[p].cache.slots())
    }

    /// Site `p`'s groups held now.
    pub fn held(&self, p: usize) -> usize {
        self.sites[p].cache.len()
    }

    /// λ of site `p` now (TAM policies).
    pub fn lambda(&self, p: usize) -> f32 {
        self.ctl.lambda(p)
    }

    /// The mean λ over sites.
    pub fn mean_lambda(&self) -> f32 {
        let n = self.sites.len().max(1);
        (0..self.sites.len()).map(|p| self.ctl.lambda(p)).sum::<f32>() / n as f32
    }

    /// The groups of site `p` that count as active for the policies (ascending): those holding
    /// at least the site's share of active units (and one at least). Under sparse activity that
    /// is every group with an active unit; under dense activity (Top-K at 0.5 leaves every
    /// 16-unit group some active unit) only the groups above the average, so that LRU and TAM
    /// still tell hot groups from the rest. Units past the site are ignored.
    fn hot_groups(&self, p: usize, active: &[u32]) -> Vec<u32> {
        let s = &self.sites[p];
        let n_units = s.group_of.len();
        let mut count = vec![0u32; s.prompt.len()];
        for &u in active {
            if let Some(&g) = s.group_of.get(u as usize) {
                count[g as usize] += 1;
            }
        }
        let share = active.len() as f64 / n_units.max(1) as f64;
        let size = |g: usize| (n_units - g * s.group_size).min(s.group_size) as f64;
        (0..count.len()).filter(|&g| count[g] > 0 && f64::from(count[g]) >= share * size(g)).map(|g| g as u32).collect()
    }

    /// One prompt row's active units of site `p`: counted per group for the warm start.
    pub fn observe_prompt(&mut self, p: usize, active: &[u32]) {
        let s = &mut self.sites[p];
        for &u in active {
            if let Some(&g) = s.group_of.get(u as usize) {
                s.prompt[g as usize] += 1;
            }
        }
    }

    /// A new sequence: prompt counts and momentum back to zero (groups held stay).
    pub fn reset(&mut self) {
        for s in &mut self.sites {
            s.prompt.fill(0);
            s.cache.reset_context();
        }
    }

    /// The end of a prompt: the groups most active over it fill site `p`'s slots (static: are
    /// pinned, replacing the previous prompt's). Returns the `(group, slot)` pairs to load.
    pub fn warm_start(&mut self, p: usize) -> Vec<(u32, u32)> {
        let s = &mut self.sites[p];
        let mut ranking: Vec<u32> = (0..s.prompt.len() as u32).filter(|&g| s.prompt[g as usize] > 0).collect();
        ranking.sort_by(|&a, &b| s.prompt[b as usize].cmp(&s.prompt[a as usize]).then(a.cmp(&b)));
        s.prompt.fill(0);
        s.cache.place_hot(&ranking).expect("groups in range")
    }

    /// A decoded token's `active` units of site `p` (ascending): where each runs, and for eager
    /// the groups to load before the product.
    pub fn plan(&mut self, p: usize, active: &[u32]) -> SitePlan {
        let groups = self.hot_groups(p, active);
        let policy = self.policy;
        let s = &mut self.sites[p];
        s.cache.record(&groups).expect("groups in range");
        let misses: Vec<u32> = groups.iter().copied().filter(|&g| !s.cache.contains(g)).collect();
        let mut load_first = Vec::new();
        if policy == BalancePolicy::Eager && !misses.is_empty() {
            let hits: Vec<u32> = groups.iter().copied().filter(|&g| s.cache.contains(g)).collect();
            let slots = s.cache.admit(&misses, &hits).expect("groups in range");
            load_first = misses.iter().zip(slots).filter(|(_, s)| *s != NO_SLOT).map(|(&g, s)| (g, s)).collect();
        }
        let mut plan = SitePlan { load_first, groups, misses, ..SitePlan::default() };
        for (i, &u) in active.iter().enumerate() {
            let Some(&g) = s.group_of.get(u as usize) else { continue };
            match s.cache.slot_of(g) {
                Some(slot) => {
                    plan.gpu.push(i);
                    plan.gpu_cols.push(slot * s.group_size as u32 + s.place[u as usize]);
                }
                None => plan.cpu_units.push(u),
            }
        }
        plan
    }

    /// After the token's product of site `p`: the policy's next groups, as `(group, slot)` to
    /// load (LRU and TAM admit this token's misses; static and eager nothing). `stall_ns` is how
    /// long the product waited for loads, `cpu_ns` the CPU's share: adaptive TAM moves λ by them.
    pub fn after(&mut self, p: usize, plan: &SitePlan, stall_ns: f64, cpu_ns: f64) -> Vec<(u32, u32)> {
        let s = &mut self.sites[p];
        let loads: Vec<(u32, u32)> = match self.policy {
            BalancePolicy::Static | BalancePolicy::Eager => Vec::new(),
            BalancePolicy::Lru | BalancePolicy::Tam { .. } | BalancePolicy::TamAdaptive { .. } => {
                let hits: Vec<u32> = plan.groups.iter().copied().filter(|&g| s.cache.contains(g)).collect();
                let slots = s.cache.admit(&plan.misses, &hits).expect("groups in range");
                plan.misses.iter().zip(slots).filter(|(_, s)| *s != NO_SLOT).map(|(&g, s)| (g, s)).collect()
            }
        };
        if let BalancePolicy::TamAdaptive { .. } = self.policy {
            let lambda = self.ctl.observe(self.step, p, stall_ns, cpu_ns, loads.len() as u32);
            s.cache.set_lambda(lambda);
        }
        loads
    }

    /// The token is done (its sites all planned and balanced).
    pub fn end_token(&mut self) {
        self.step = self.step.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One site of 8 units in the model's order, groups of 2, `k` group slots.
    fn one(policy: &str, k: usize) -> NeuronBalancer {
        NeuronBalancer::new(BalancePolicy::parse(policy).unwrap(), &[(0..8).collect()], &[2], &[k])
    }

    #[test]
    fn units_split_by_the_groups_held() {
        let mut b = one("lru", 2);
        b.observe_prompt(0, &[0, 1, 5]);
        b.observe_prompt(0, &[1, 4]);
        // Group 0 twice, group 2 twice: both held, lowest first on ties.
        let placed = b.warm_start(0);
        assert_eq!(placed.len(), 2);
        let plan = b.plan(0, &[1, 3, 4, 7]);
        // Units 1 (group 0) and 4 (group 2) on the GPU, at slot·2 + place.
        assert_eq!(plan.gpu, vec![0, 2]);
        let slot = |g: u32| placed.iter().find(|p| p.0 == g).unwrap().1;
        assert_eq!(plan.gpu_cols, vec![slot(0) * 2 + 1, slot(2) * 2]);
        assert_eq!(plan.cpu_units, vec![3, 7]);
        assert!(plan.load_first.is_empty());
    }

    #[test]
    fn pack_order_decides_the_groups() {
        // Units 0 and 7 are neighbours in the pack's order: one group.
        let pos = vec![0, 2, 3, 4, 5, 6, 7, 1];
        let mut b = NeuronBalancer::new(BalancePolicy::Lru, &[pos], &[2], &[1]);
        b.observe_prompt(0, &[0, 7]);
        assert_eq!(b.warm_start(0), vec![(0, 0)]);
        let plan = b.plan(0, &[0, 7]);
        assert_eq!(plan.gpu_cols, vec![0, 1]);
        assert!(plan.cpu_units.is_empty());
    }

    #[test]
    fn under_dense_activity_only_groups_above_the_average_count() {
        // 5 of 8 units active: every group has one, only group 0 has both (above 5/8).
        let mut b = one("lru", 1);
        let plan = b.plan(0, &[0, 1, 2, 4, 6]);
        assert_eq!(plan.cpu_units, vec![0, 1, 2, 4, 6]);
        assert_eq!(b.after(0, &plan, 0.0, 1.0), vec![(0, 0)]);
        b.end_token();
        // Group 0 held: its units on the GPU, the others on the CPU.
        let plan = b.plan(0, &[0, 1, 2, 4, 6]);
        assert_eq!(plan.gpu_cols, vec![0, 1]);
        assert_eq!(plan.cpu_units, vec![2, 4, 6]);
    }

    #[test]
    fn static_never_moves_and_eager_loads_first() {
        let mut s = one("static", 1);
        s.observe_prompt(0, &[2]);
        assert_eq!(s.warm_start(0), vec![(1, 0)]);
        for _ in 0..3 {
            let plan = s.plan(0, &[6]);
            assert_eq!(plan.cpu_units, vec![6]);
            assert!(s.after(0, &plan, 0.0, 1.0).is_empty());
            s.end_token();
        }
        let mut e = one("eager", 1);
        let plan = e.plan(0, &[6]);
        // Group 3 is loaded before the product and runs on the GPU.
        assert_eq!(plan.load_first, vec![(3, 0)]);
        assert_eq!(plan.gpu_cols, vec![0]);
        assert!(plan.cpu_units.is_empty());
        assert!(e.after(0, &plan, 0.0, 0.0).is_empty());
    }

    #[test]
    fn lru_loads_every_miss_for_the_next_token() {
        let mut b = one("lru", 1);
        let plan = b.plan(0, &[2]);
        assert_eq!(plan.cpu_units, vec![2]);
        assert_eq!(b.after(0, &plan, 0.0, 1.0), vec![(1, 0)]);
        b.end_token();
        // A different group evicts it at once.
        let plan = b.plan(0, &[6]);
        assert_eq!(b.after(0, &plan, 0.0, 1.0), vec![(3, 0)]);
    }

    #[test]
    fn tam_leaves_one_hit_wonders_on_the_cpu() {
        // λ = 0.8: one activation gives momentum 0.2 < τ = 0.25; two in a row 0.36 > τ.
        let mut b = one("tam", 1);
        let plan = b.plan(0, &[2]);
        assert!(b.after(0, &plan, 0.0, 1.0).is_empty(), "a one-hit wonder is not loaded");
        b.end_token();
        let plan = b.plan(0, &[3]);
        assert_eq!(b.after(0, &plan, 0.0, 1.0), vec![(1, 0)]);
        b.end_token();
        // A group active once now does not displace the held one.
        let plan = b.plan(0, &[6]);
        assert_eq!(plan.cpu_units, vec![6]);
        assert!(b.after(0, &plan, 0.0, 1.0).is_empty());
    }

    #[test]
    fn adaptive_lambda_follows_the_stall_type() {
        let mut b = one("tam-adaptive", 1);
        assert_eq!(b.lambda(0), 0.5);
        // CPU-bound steps (no stall) keep λ at its floor; stalls raise it by 5 % each.
        let plan = b.plan(0, &[0]);
        b.after(0, &plan, 0.0, 1e6);
        assert_eq!(b.lambda(0), 0.5);
        for _ in 0..4 {
            let plan = b.plan(0, &[0]);
            b.after(0, &plan, 1e6, 1e3);
            b.end_token();
        }
        assert!((b.lambda(0) - 0.5 * 1.05f32.powi(4)).abs() < 1e-5, "λ {}", b.lambda(0));
        let plan = b.plan(0, &[0]);
        b.after(0, &plan, 0.0, 1e6);
        assert!((b.lambda(0) - 0.5 * 1.05f32.powi(4) * 0.95).abs() < 1e-5);
    }
}
