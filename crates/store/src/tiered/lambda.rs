//! Adaptive TAM in the tiered store (`--cache-policy tam-adaptive`): the store measures each
//! layer of a decoded token, from one [`TieredStore::begin_layer`](super::TieredStore::begin_layer)
//! to the next, as time waited for reads and time computing, and feeds it to KAIROX's λ
//! controller ([`LambdaController`]); the layer's caches then decay momentum at the new λ. The
//! clock is the store's: the wall clock, or a simulated tier's virtual one. The last layer's span
//! would include the output head and sampling, so it is not measured: it takes the λ of the layer
//! before it.

use sift_cache::{LambdaBounds, LambdaController, LambdaStep, Policy};
use std::time::Instant;

/// Where the layer being measured began.
#[derive(Clone, Copy, Debug)]
struct Mark {
    layer: usize,
    at_ns: f64,
    stall_ns: u64,
}

/// The controller and the measurement in progress.
pub(super) struct LambdaFeed {
    ctl: LambdaController,
    n_layers: usize,
    mark: Option<Mark>,
    /// Decoded tokens seen (the controller's step).
    step: u32,
    /// Per layer: units its caches admitted since its last observation.
    loads: Vec<u32>,
    epoch: Instant,
}

impl LambdaFeed {
    /// The feed of a store running `policy` over `n_layers` layers: `None` unless adaptive TAM.
    pub(super) fn new(policy: crate::cache::Policy, n_layers: usize) -> Option<LambdaFeed> {
        let Policy::AdaptiveTam { lambda, .. } = policy else { return None };
        Some(LambdaFeed {
            ctl: LambdaController::new(n_layers, lambda, LambdaBounds::default()),
            n_layers,
            mark: None,
            step: 0,
            loads: vec![0; n_layers],
            epoch: Instant::now(),
        })
    }

    /// Nanoseconds on the wall clock since the feed was made.
    pub(super) fn wall_ns(&self) -> f64 {
        self.epoch.elapsed().as_nanos() as f64
    }

    /// Layer `layer`'s caches admitted `n` units.
    pub(super) fn loaded(&mut self, layer: usize, n: usize) {
        if let Some(l) = self.loads.get_mut(layer) {
            *l = l.saturating_add(n as u32);
        }
    }

    /// Layer `layer` of a decoded token begins at `now_ns`, the store having waited `stall_ns`
    /// for reads in all so far: the layer before it is observed. Returns the layers whose λ
    /// changed, with their new λ.
    pub(super) fn begin_layer(&mut self, layer: usize, now_ns: f64, stall_ns: u64) -> Vec<(usize, f32)> {
        let mut changed = Vec::new();
        if let Some(m) = self.mark.take() {
            if layer == m.layer + 1 {
                let stall = stall_ns.saturating_sub(m.stall_ns) as f64;
                let compute = (now_ns - m.at_ns - stall).max(0.0);
                let loads = std::mem::take(&mut self.loads[m.layer]);
                let before = self.ctl.lambda(m.layer);
                let after = self.ctl.observe(self.step, m.layer, stall, compute, loads);
                if after != before {
                    changed.push((m.layer, after));
                }
                if layer + 1 == self.n_layers {
                    changed.push((layer, after));
                }
            }
        }
        if layer == 0 {
            self.step += 1;
        }
        self.mark = Some(Mark { layer, at_ns: now_ns, stall_ns });
        changed
    }

    /// A new conversation: the measurement in progress is dropped (λ stays).
    pub(super) fn reset(&mut self) {
        self.mark = None;
    }

    pub(super) fn history(&self) -> Vec<LambdaStep> {
        self.ctl.history().copied().collect()
    }
}
