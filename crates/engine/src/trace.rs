//! What the engine reports about a token's path: the [`Tracer`] hook (`sift trace`) and the
//! per-site [`SparsityStats`].

use crate::Engine;
use sift_model::QTensor;
use sift_sparsity::Site;

/// Watches a decoded token's path through the layers (`sift trace`): the residual entering each
/// layer and, at each site, the input the selector saw (before masking) and what it chose.
/// Prompt batches are only announced: under a memory budget they read whole layers and leave the
/// cache alone, so the cache's history is the decoded tokens'.
pub trait Tracer: Send {
    /// A prompt batch of `n` tokens is about to run.
    fn prompt(&mut self, _n: usize) {}
    /// A decoded token at position `pos` is about to run.
    fn token(&mut self, _pos: usize) {}
    /// The sequence restarts (the KV cache was cleared).
    fn reset(&mut self) {}
    /// Layer `layer` of the decoded token starts with this residual stream.
    fn layer(&mut self, layer: usize, residual: &[f32]);
    /// The selector chose `active` (ascending; `None`: every unit) at `site` from `input`.
    fn site(&mut self, layer: usize, site: Site, input: &[f32], active: Option<&[u32]>);
}

/// How many input units each site used, summed over the tokens run since the last reset.
#[derive(Clone, Debug, Default)]
pub struct SparsityStats {
    /// Token-layers that passed each site.
    pub visits: [u64; 4],
    /// Active units summed over those visits.
    pub active: [u64; 4],
    /// Units at each site (per visit).
    pub units: [u64; 4],
    /// Tokens whose output head ran, and the head's active input units over them.
    pub head_visits: u64,
    pub head_active: u64,
    /// Weight bytes read by the column kernels.
    pub column_bytes: u64,
    /// Sparse prefill blocks: FFN neurons computed and neurons in the block's FFNs (token-layers
    /// times `n_ff`).
    pub prefill_neurons: [u64; 2],
    /// Sparse decoding of several sequences in one step ([`crate::SlotsMode::RowByRow`]), by
    /// the number of sequences `k` (index `k - 2`, the last entry for 9 and more): sites visited,
    /// units active in the union of the sequences' selections, and in each selection (summed).
    pub batch_union: [BatchUnion; 8],
}

/// How the union of several sequences' active units grows ([`SparsityStats::batch_union`]).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct BatchUnion {
    pub site_visits: u64,
    pub union_units: u64,
    pub token_units: u64,
}

impl BatchUnion {
    /// Units the union needs over the units one token's selection needs (1: the sequences chose
    /// the same units; k: disjoint choices).
    pub fn union_over_one(&self, k: usize) -> f64 {
        if self.token_units == 0 {
            return 0.0;
        }
        self.union_units as f64 / (self.token_units as f64 / k as f64)
    }
}

impl SparsityStats {
    /// Mean fraction of units active at `site`.
    pub fn active_fraction(&self, site: Site) -> f64 {
        let i = site.index();
        if self.visits[i] == 0 || self.units[i] == 0 {
            1.0
        } else {
            self.active[i] as f64 / (self.visits[i] * self.units[i]) as f64
        }
    }
}

impl Engine {
    /// Units used per site since the last [`Engine::reset_stats`].
    pub fn sparsity_stats(&self) -> &SparsityStats {
        &self.sparsity.stats
    }

    pub fn reset_stats(&mut self) {
        let units = self.sparsity.stats.units;
        self.sparsity.stats = SparsityStats { units, ..Default::default() };
    }

    /// Weight bytes each site's ops read per token when dense: [q+k+v, o, gate+up, down], summed
    /// over layers; and the output head's bytes.
    pub fn site_bytes(&self) -> ([u64; 4], u64) {
        let n = |t: &QTensor| (t.range.end - t.range.start) as u64;
        let mut b = [0u64; 4];
        for lw in &self.model.layers {
            for site in Site::ALL {
                b[site.index()] += site.ops().iter().map(|&op| n(lw.op(op))).sum::<u64>();
            }
        }
        (b, n(&self.model.output))
    }

    /// Mean weight bytes per token that the selections since the last stats reset needed
    /// (the seven linears scaled by their sites' active fractions, plus the output head).
    pub fn active_bytes_per_token(&self) -> f64 {
        let (b, head) = self.site_bytes();
        let mut total = 0.0;
        for s in Site::ALL {
            total += b[s.index()] as f64 * self.sparsity.stats.active_fraction(s);
        }
        let head_frac = if self.sparsity.stats.head_visits == 0 {
            1.0
        } else {
            self.sparsity.stats.head_active as f64
                / (self.sparsity.stats.head_visits as f64 * self.model.config.n_embd as f64)
        };
        total + head as f64 * head_frac
    }
}
