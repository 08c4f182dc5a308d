//! The engine's parts grouped by meaning, each optional or replaceable between batches: the
//! sparsity method ([`Sparsity`]), the GPU tier ([`GpuTier`]) and what watches the forward pass
//! ([`Watchers`], the [`FfnObserver`] trait).

use crate::gpu::GpuLayers;
use crate::hybrid::HybridTier;
use crate::trace::{SparsityStats, Tracer};
use sift_sparsity::{Phase, Selector, Site};

/// Watches the dense FFN of every layer and batch: its normed input `x` (`n` rows of `n_embd`)
/// and its GLU `silu(gate)·up` (`n` rows of `n_ff`), before the down projection; and, when it
/// asks, each layer's queries and keys after RoPE (`n` rows of `n_embd_q` and `n_embd_kv`, the
/// batch starting at position `pos`), for statistics of the attention (FastForward's schedule).
pub trait FfnObserver: Send {
    fn ffn(&mut self, layer: usize, x: &[f32], glu: &[f32], n: usize);
    fn attention(&mut self, _layer: usize, _q: &[f32], _k: &[f32], _n: usize, _pos: usize) {}
}

/// What a lone token's time went to, for the hybrid tier's balancing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spent {
    GpuAttention,
    CpuAttention,
    Head,
}

impl GpuTier {
    /// A lone token spent the time since `t` on `what` (the hybrid tier counts it).
    pub(crate) fn spent(&mut self, what: Spent, n: usize, t: std::time::Instant) {
        if let (Some(hy), 1) = (self.hybrid.as_mut(), n) {
            let ns = t.elapsed().as_nanos() as f64;
            match what {
                Spent::GpuAttention => hy.spent_on_attention(ns),
                Spent::CpuAttention => hy.spent_on_cpu_attention(ns),
                Spent::Head => hy.spent_on_head(ns),
            }
        }
    }
}

/// Activation sparsity as the engine runs it (`--sparsity`, `--sparse-head`).
pub(crate) struct Sparsity {
    /// Chooses the active input units of every linear op ([`DenseSelector`] unless set).
    pub(crate) selector: Box<dyn Selector>,
    /// The phase of the batch in flight (set by [`Sparsity::begin_batch`]).
    pub(crate) phase: Phase,
    /// The fraction of the output head's inputs skipped (0: the dense head).
    pub(crate) head_ratio: f32,
    /// Visits, active units and bytes read at each site, the head and the prompt's blocks.
    pub(crate) stats: SparsityStats,
}

impl Sparsity {
    /// Before a batch of `phase`: the selector hears of it.
    pub(crate) fn begin_batch(&mut self, phase: Phase) {
        self.phase = phase;
        self.selector.begin_batch(phase);
    }

    /// After the batch begun by [`Sparsity::begin_batch`].
    pub(crate) fn end_batch(&mut self) {
        self.selector.end_batch(self.phase);
    }
}

/// The GPU tier (none by default; `-ngl`, `--gpu-memory`, `--gpu-policy`).
#[derive(Default)]
pub(crate) struct GpuTier {
    /// Layers (and the output head) held on the GPU, or their attention (KAIROX's placement).
    pub(crate) layers: Option<GpuLayers>,
    /// KAIROX's hybrid decode: FFN unit groups on the GPU, balanced online (`--gpu-policy`).
    pub(crate) hybrid: Option<HybridTier>,
}

/// What watches the forward pass (none by default).
#[derive(Default)]
pub(crate) struct Watchers {
    /// Watches decoded tokens: what each site saw and chose (`sift trace`, a budgeted decode's
    /// bound).
    pub(crate) tracer: Option<Box<dyn Tracer>>,
    /// Sees every dense FFN's input and GLU, and each layer's queries and keys (`sift train
    /// prefill` collects its data so).
    pub(crate) ffn: Option<Box<dyn FfnObserver>>,
}

impl Watchers {
    /// A batch of `n` tokens starts at position `n_past`: the tracer hears of a decoded token
    /// or a prompt.
    pub(crate) fn batch(&mut self, n_past: usize, n: usize) {
        if let Some(t) = &mut self.tracer {
            if n == 1 {
                t.token(n_past);
            } else {
                t.prompt(n);
            }
        }
    }

    /// Layer `l` starts on a lone token's residual `x`.
    pub(crate) fn layer(&mut self, l: usize, n: usize, x: &[f32]) {
        if let (Some(t), 1) = (&mut self.tracer, n) {
            t.layer(l, x);
        }
    }

    /// A lone token's selection at a site: its input row and active units (none: dense).
    pub(crate) fn site(&mut self, l: usize, site: Site, n: usize, row: &[f32], active: Option<&[u32]>) {
        if let (Some(t), 1) = (&mut self.tracer, n) {
            t.site(l, site, row, active);
        }
    }

    /// A dense FFN's input and GLU (`n` rows each).
    pub(crate) fn ffn(&mut self, l: usize, x: &[f32], glu: &[f32], n: usize) {
        if let Some(o) = &mut self.ffn {
            o.ffn(l, x, glu, n);
        }
    }
}
