//! Training data from the model itself: text through the dense model in blocks of
//! [`PREFILL_BLOCK`] tokens, an [`FfnObserver`] keeping each layer's FFN input (f16) and each
//! neuron's activation norm over the block (the L2 norm of its GLU output over the block's
//! tokens: GRIFFIN's measure, the oracle masks' ranking).

use half::f16;
use sift_engine::prefill::PREFILL_BLOCK;
use sift_engine::{Engine, FfnObserver, Logits};
use std::sync::{Arc, Mutex};

/// One layer's samples: `n` blocks of `PREFILL_BLOCK × d` inputs and `n_ff` norms each.
#[derive(Clone, Debug, Default)]
pub struct LayerSamples {
    pub x: Vec<f16>,
    pub norms: Vec<f32>,
}

/// What [`collect_blocks`] gathered.
#[derive(Clone, Debug)]
pub struct Samples {
    pub d: usize,
    pub n_ff: usize,
    pub blocks: usize,
    pub layers: Vec<LayerSamples>,
}

struct Collector {
    keep: Arc<Mutex<bool>>,
    out: Arc<Mutex<Vec<LayerSamples>>>,
    d: usize,
    n_ff: usize,
}

impl FfnObserver for Collector {
    fn ffn(&mut self, layer: usize, x: &[f32], glu: &[f32], n: usize) {
        if n != PREFILL_BLOCK || !*self.keep.lock().expect("not poisoned") {
            return;
        }
        let mut out = self.out.lock().expect("not poisoned");
        let s = &mut out[layer];
        s.x.extend(x[..n * self.d].iter().map(|&v| f16::from_f32(v)));
        let mut norms = vec![0f32; self.n_ff];
        for row in glu[..n * self.n_ff].chunks_exact(self.n_ff) {
            for (a, &v) in norms.iter_mut().zip(row) {
                *a += v * v;
            }
        }
        s.norms.extend(norms.iter().map(|v| v.sqrt()));
    }
}

/// The block loop of [`collect_blocks`] and of the compensator's error collection: `tokens` in
/// sequences of `seq_blocks` 128-token blocks (a fresh KV cache each), `keep` set for every block
/// after a sequence's first (the observer keeps those), until `max_blocks` are kept; returns how
/// many were. The caller installs its observer before and clears the KV cache after.
pub(crate) fn run_kept_blocks(
    engine: &mut Engine,
    tokens: &[u32],
    seq_blocks: usize,
    max_blocks: usize,
    keep: &Mutex<bool>,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<usize> {
    let mut kept = 0;
    for seq in tokens.chunks(seq_blocks.max(2) * PREFILL_BLOCK) {
        engine.truncate(0);
        for (i, block) in seq.chunks(PREFILL_BLOCK).enumerate() {
            if block.len() < PREFILL_BLOCK || kept >= max_blocks {
                return Ok(kept);
            }
            *keep.lock().expect("not poisoned") = i > 0;
            engine.eval(block, Logits::Last)?;
            if i > 0 {
                kept += 1;
                progress(kept);
            }
        }
    }
    Ok(kept)
}

/// Runs `tokens` through `engine` (dense) in sequences of `seq_blocks` blocks and keeps up to
/// `max_blocks` blocks; each sequence's first block is run but not kept (sparse prefill keeps it
/// dense: the attention sinks). `progress(done)` after each kept block.
pub fn collect_blocks(
    engine: &mut Engine,
    tokens: &[u32],
    seq_blocks: usize,
    max_blocks: usize,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<Samples> {
    let c = engine.config().clone();
    let keep = Arc::new(Mutex::new(false));
    let out = Arc::new(Mutex::new(vec![LayerSamples::default(); c.n_layer]));
    let prev = engine.set_ffn_observer(Some(Box::new(Collector {
        keep: keep.clone(),
        out: out.clone(),
        d: c.n_embd,
        n_ff: c.n_ff,
    })));
    let result = run_kept_blocks(engine, tokens, seq_blocks, max_blocks, &keep, progress);
    engine.set_ffn_observer(prev);
    engine.truncate(0);
    let kept = result?;
    let layers = std::mem::take(&mut *out.lock().expect("not poisoned"));
    anyhow::ensure!(
        kept > 0,
        "the training text gave no 128-token block after a first one: give at least {} tokens",
        2 * PREFILL_BLOCK
    );
    Ok(Samples { d: c.n_embd, n_ff: c.n_ff, blocks: kept, layers })
}
