//! FastForward's error compensator (seed §3.3), trained by layerwise distillation: per layer,
//! `c = ReLU(x·C1)·C2` (r' = d/8) on each token's FFN input `x` should add what the block's
//! skipped neurons would have added, `e = W_down · (glu ⊙ skipped)` (the dense FFN output minus
//! the sparse one), by mean squared error. The targets come from the model itself
//! ([`collect_errors`]: the dense run again, each block's GLU masked by the oracle's and by the
//! trained predictor's choice); training warm-starts on the oracle's errors (the first third of
//! the steps), then follows the predictor's (the paper's two phases). All layers train together
//! on minibatches of blocks drawn by a seeded generator.

use crate::collect::Samples;
use candle_core::{Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_engine::predictor::{compensator_rank, ExpertPredictors};
use sift_engine::prefill::PREFILL_BLOCK;
use sift_engine::{Engine, FfnObserver};
use sift_model::Model;
use std::sync::{Arc, Mutex};

/// Per layer, the error targets of every kept token (d each, f16): with the oracle's masks and
/// with the predictor's.
#[derive(Clone, Debug, Default)]
pub struct ErrorSamples {
    pub oracle: Vec<Vec<f16>>,
    pub predicted: Vec<Vec<f16>>,
    pub blocks: usize,
}

/// `W_downᵀ` of every layer (n_ff × d, f32) for the error targets, dequantized from `model` (a
/// model whose rows are in their GGUF layout: not repacked).
pub fn down_transposed(model: &Model) -> anyhow::Result<Vec<Tensor>> {
    let c = &model.config;
    let mut out = Vec::with_capacity(c.n_layer);
    let mut row = vec![0f32; c.n_ff];
    for lw in &model.layers {
        let w = &lw.w_down;
        anyhow::ensure!(!w.packed, "the error targets need the down projection in its GGUF layout (not repacked)");
        anyhow::ensure!((w.rows, w.cols) == (c.n_embd, c.n_ff), "ffn_down of shape {} x {}", w.rows, w.cols);
        let mut t = vec![0f32; c.n_ff * c.n_embd];
        for r in 0..w.rows {
            w.ty.dequantize_row(model.row(w, r), &mut row);
            for (j, &v) in row.iter().enumerate() {
                t[j * c.n_embd + r] = v;
            }
        }
        out.push(Tensor::from_vec(t, (c.n_ff, c.n_embd), &Device::Cpu)?);
    }
    Ok(out)
}

struct ErrorCollector {
    keep_block: Arc<Mutex<bool>>,
    out: Arc<Mutex<ErrorSamples>>,
    down: Vec<Tensor>,
    predictor: Arc<ExpertPredictors>,
    d: usize,
    n_ff: usize,
    k: usize,
    failed: Arc<Mutex<Option<String>>>,
}

/// The rows of `glu` (n × n_ff) with the `k` chosen neurons (by `score`, highest) zeroed: what
/// the sparse block skips.
fn skipped(glu: &[f32], n_ff: usize, score: &[f32], k: usize) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n_ff).collect();
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
    let mut keep = vec![false; n_ff];
    for &j in &order[..k.min(n_ff)] {
        keep[j] = true;
    }
    let mut out = glu.to_vec();
    for row in out.chunks_exact_mut(n_ff) {
        for (v, &kp) in row.iter_mut().zip(&keep) {
            if kp {
                *v = 0.0;
            }
        }
    }
    out
}

impl ErrorCollector {
    fn error(&self, layer: usize, glu: &[f32], n: usize, score: &[f32]) -> candle_core::Result<Vec<f16>> {
        let g = Tensor::from_vec(skipped(glu, self.n_ff, score, self.k), (n, self.n_ff), &Device::Cpu)?;
        let e = g.matmul(&self.down[layer])?.flatten_all()?.to_vec1::<f32>()?;
        Ok(e.iter().map(|&v| f16::from_f32(v)).collect())
    }
}

impl FfnObserver for ErrorCollector {
    fn ffn(&mut self, layer: usize, x: &[f32], glu: &[f32], n: usize) {
        if n != PREFILL_BLOCK || !*self.keep_block.lock().expect("not poisoned") {
            return;
        }
        let glu = &glu[..n * self.n_ff];
        let mut norms = vec![0f32; self.n_ff];
        for row in glu.chunks_exact(self.n_ff) {
            for (a, &v) in norms.iter_mut().zip(row) {
                *a += v * v;
            }
        }
        let mut pred = Vec::new();
        self.predictor.scores(layer, &x[..n * self.d], n, &mut pred, None);
        match (self.error(layer, glu, n, &norms), self.error(layer, glu, n, &pred)) {
            (Ok(o), Ok(p)) => {
                let mut out = self.out.lock().expect("not poisoned");
                out.oracle[layer].extend(o);
                out.predicted[layer].extend(p);
            }
            (Err(e), _) | (_, Err(e)) => *self.failed.lock().expect("not poisoned") = Some(e.to_string()),
        }
    }
}

/// Runs `tokens` through `engine` (dense) in the blocks [`crate::collect::collect_blocks`] keeps
/// (the same sequences, so the same blocks) and records each kept token's error targets under
/// the oracle's and `predictor`'s choice of the top `keep` share of neurons.
#[allow(clippy::too_many_arguments)]
pub fn collect_errors(
    engine: &mut Engine,
    tokens: &[u32],
    seq_blocks: usize,
    max_blocks: usize,
    down: Vec<Tensor>,
    predictor: Arc<ExpertPredictors>,
    keep: f32,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<ErrorSamples> {
    let c = engine.config().clone();
    let keep_block = Arc::new(Mutex::new(false));
    let out = Arc::new(Mutex::new(ErrorSamples {
        oracle: vec![Vec::new(); c.n_layer],
        predicted: vec![Vec::new(); c.n_layer],
        blocks: 0,
    }));
    let failed = Arc::new(Mutex::new(None));
    let k = ((keep as f64 * c.n_ff as f64).round() as usize).clamp(1, c.n_ff);
    let prev = engine.set_ffn_observer(Some(Box::new(ErrorCollector {
        keep_block: keep_block.clone(),
        out: out.clone(),
        down,
        predictor,
        d: c.n_embd,
        n_ff: c.n_ff,
        k,
        failed: failed.clone(),
    })));
    let result = crate::collect::run_kept_blocks(engine, tokens, seq_blocks, max_blocks, &keep_block, progress);
    engine.set_ffn_observer(prev);
    engine.truncate(0);
    let kept = result?;
    if let Some(e) = failed.lock().expect("not poisoned").take() {
        anyhow::bail!("computing the error targets: {e}");
    }
    let mut s = std::mem::take(&mut *out.lock().expect("not poisoned"));
    s.blocks = kept;
    Ok(s)
}

/// The settings of a compensator run.
#[derive(Clone, Debug)]
pub struct CompOptions {
    pub steps: usize,
    /// Blocks per step (128 tokens each).
    pub batch: usize,
    pub lr: f64,
    pub seed: u64,
}

impl Default for CompOptions {
    /// 4 blocks (512 tokens, the paper's batch) per step.
    fn default() -> Self {
        CompOptions { steps: 300, batch: 4, lr: 1e-3, seed: 42 }
    }
}

/// Trains every layer's compensator on `x` (the FFN inputs of [`crate::collect::collect_blocks`])
/// and `err` (their targets); `init` continues from its compensator when it has one. Writes the
/// result into `p` (weights, `comp_rank`, `comp_steps`, `comp_loss`). `progress(step, loss)`
/// after each step; the loss is the mean over layers of the MSE relative to the targets' mean
/// square (1.0: no better than no correction).
pub fn train_compensator(
    x: &Samples,
    err: &ErrorSamples,
    o: &CompOptions,
    p: &mut ExpertPredictors,
    progress: &mut dyn FnMut(usize, f32),
) -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let (d, n_layer) = (x.d, x.layers.len());
    let r = compensator_rank(d);
    let blocks = x.blocks.min(err.blocks);
    anyhow::ensure!(blocks > 0, "no training blocks");
    anyhow::ensure!(err.oracle.len() == n_layer && err.predicted.len() == n_layer, "error targets for another model");
    let mut rng = StdRng::seed_from_u64(o.seed);
    let resume = p.header.comp_rank == r && p.layers.iter().all(|l| l.c1.len() == d * r && l.c2.len() == r * d);
    let mut vars = Vec::with_capacity(2 * n_layer);
    for l in 0..n_layer {
        let (c1, c2) = if resume {
            (p.layers[l].c1.clone(), p.layers[l].c2.clone())
        } else {
            // C2 = 0: the compensator starts as no correction at all.
            let std = 1.0 / (d as f32).sqrt();
            let c1 = (0..d * r)
                .map(|_| {
                    let (u1, u2): (f32, f32) = (rng.random::<f32>().max(1e-7), rng.random::<f32>());
                    std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
                })
                .collect();
            (c1, vec![0f32; r * d])
        };
        vars.push((Var::from_vec(c1, (d, r), &dev)?, Var::from_vec(c2, (r, d), &dev)?));
    }
    // Each layer's targets' mean square (per phase), to weigh layers alike.
    let mean_square = |set: &[Vec<f16>]| -> Vec<f64> {
        set.iter()
            .map(|e| (e.iter().map(|v| (v.to_f32() as f64).powi(2)).sum::<f64>() / e.len().max(1) as f64).max(1e-12))
            .collect()
    };
    let (scale_oracle, scale_pred) = (mean_square(&err.oracle), mean_square(&err.predicted));
    let all: Vec<Var> = vars.iter().flat_map(|(a, b)| [a.clone(), b.clone()]).collect();
    let mut opt = AdamW::new(all, ParamsAdamW { lr: o.lr, weight_decay: 0.0, ..Default::default() })?;
    let nb = PREFILL_BLOCK;
    let warm = o.steps / 3;
    let mut last = f32::NAN;
    for step in 0..o.steps {
        let (targets, scale) = if step < warm { (&err.oracle, &scale_oracle) } else { (&err.predicted, &scale_pred) };
        let pick: Vec<usize> = (0..o.batch.max(1)).map(|_| rng.random_range(0..blocks)).collect();
        let rows = pick.len() * nb;
        let mut total: Option<Tensor> = None;
        for (l, (c1, c2)) in vars.iter().enumerate() {
            let mut xs = Vec::with_capacity(rows * d);
            let mut es = Vec::with_capacity(rows * d);
            for &i in &pick {
                xs.extend(x.layers[l].x[i * nb * d..(i + 1) * nb * d].iter().map(|v| v.to_f32()));
                es.extend(targets[l][i * nb * d..(i + 1) * nb * d].iter().map(|v| v.to_f32()));
            }
            let xt = Tensor::from_vec(xs, (rows, d), &dev)?;
            let et = Tensor::from_vec(es, (rows, d), &dev)?;
            let c = xt.matmul(c1.as_tensor())?.relu()?.matmul(c2.as_tensor())?;
            let loss = ((c - et)?.sqr()?.sum_all()? / (rows as f64 * d as f64 * scale[l]))?;
            total = Some(match total {
                None => loss,
                Some(t) => (t + loss)?,
            });
        }
        let total = (total.expect("at least one layer") / n_layer as f64)?;
        opt.backward_step(&total)?;
        last = total.to_scalar::<f32>()?;
        progress(step + 1, last);
    }
    for (l, (c1, c2)) in vars.iter().enumerate() {
        p.layers[l].c1 = c1.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        p.layers[l].c2 = c2.as_tensor().flatten_all()?.to_vec1::<f32>()?;
    }
    p.header.comp_steps = if resume { p.header.comp_steps } else { 0 } + o.steps;
    p.header.comp_rank = r;
    p.header.comp_loss = last;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skipped_part_zeroes_the_chosen_neurons() {
        // 4 neurons, 2 tokens; keep the 2 highest scores (neurons 1 and 3).
        let glu = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let s = skipped(&glu, 4, &[0.1, 0.9, 0.2, 0.8], 2);
        assert_eq!(s, vec![1.0, 0.0, 3.0, 0.0, 5.0, 0.0, 7.0, 0.0]);
    }
}
