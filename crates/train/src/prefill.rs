//! Training FastForward's expert predictor (seed §3.2) on candle: per layer a learned pooling
//! query `q` (d), `W1` (d × r) and `W2` (r × n_ff), `s = ReLU(softmax(qXᵀ/√d) X · W1) · W2`,
//! trained with the paper's weighted binary cross-entropy on GRIFFIN labels: the `keep` share of
//! neurons with the largest activation norms over the block are positives, weighted 32, 16, 8,
//! 4, 2 by fifths of their rank; the others negatives of weight 1. All layers train together
//! (one AdamW over every layer's weights, the loss summed over layers), on minibatches of blocks
//! drawn by a seeded generator, so a run is reproducible.

use crate::collect::Samples;
use candle_core::{Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_engine::predictor::{predictor_rank, ExpertPredictors, LayerPredictor, PredictorHeader, PREDICTOR_VERSION};
use sift_engine::prefill::PREFILL_BLOCK;

/// The settings of a training run.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub steps: usize,
    /// Blocks per step.
    pub batch: usize,
    pub lr: f64,
    /// Share of neurons labelled positive (1 − the prefill sparsity it is meant for).
    pub keep: f32,
    pub seed: u64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions { steps: 300, batch: 16, lr: 2e-3, keep: 0.5, seed: 42 }
    }
}

/// Labels and weights of one block's neurons from their norms (the paper's scheme).
pub fn labels(norms: &[f32], keep: f32) -> (Vec<f32>, Vec<f32>) {
    let n = norms.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| norms[b].total_cmp(&norms[a]).then(a.cmp(&b)));
    let pos = ((keep as f64 * n as f64).round() as usize).clamp(1, n);
    let (mut y, mut w) = (vec![0f32; n], vec![1f32; n]);
    for (rank, &j) in order.iter().take(pos).enumerate() {
        y[j] = 1.0;
        // Fifths of the positives: 32, 16, 8, 4, 2.
        w[j] = 32.0 / (1u32 << (5 * rank / pos).min(4)) as f32;
    }
    (y, w)
}

struct Layer {
    q: Var,
    w1: Var,
    w2: Var,
}

/// Trains every layer's predictor on `data`; `init` continues from earlier weights (`--resume`).
/// `progress(step, loss)` after each step. Returns the predictors (header filled in but for the
/// model's identity, which the caller sets).
pub fn train_predictor(
    data: &Samples,
    o: &TrainOptions,
    init: Option<&ExpertPredictors>,
    progress: &mut dyn FnMut(usize, f32),
) -> anyhow::Result<ExpertPredictors> {
    let dev = Device::Cpu;
    let (d, ff, n_layer) = (data.d, data.n_ff, data.layers.len());
    let r = predictor_rank(d);
    anyhow::ensure!(data.blocks > 0, "no training blocks");
    if let Some(p) = init {
        anyhow::ensure!(
            (p.header.n_layer, p.header.n_embd, p.header.n_ff, p.header.rank) == (n_layer, d, ff, r),
            "the predictor to resume from has another shape"
        );
    }
    let mut rng = StdRng::seed_from_u64(o.seed);
    let mut normal = |n: usize, std: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // Box–Muller from the seeded generator (candle's own randn is not seeded).
                let (u1, u2): (f32, f32) = (rng.random::<f32>().max(1e-7), rng.random::<f32>());
                std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
            })
            .collect()
    };
    let mut layers = Vec::with_capacity(n_layer);
    for l in 0..n_layer {
        let (q, w1, w2) = match init {
            Some(p) => (p.layers[l].q.clone(), p.layers[l].w1.clone(), p.layers[l].w2.clone()),
            None => (vec![0.0; d], normal(d * r, 1.0 / (d as f32).sqrt()), normal(r * ff, 1.0 / (r as f32).sqrt())),
        };
        layers.push(Layer {
            q: Var::from_vec(q, d, &dev)?,
            w1: Var::from_vec(w1, (d, r), &dev)?,
            w2: Var::from_vec(w2, (r, ff), &dev)?,
        });
    }
    let vars: Vec<Var> = layers.iter().flat_map(|l| [l.q.clone(), l.w1.clone(), l.w2.clone()]).collect();
    let mut opt = AdamW::new(vars, ParamsAdamW { lr: o.lr, weight_decay: 0.0, ..Default::default() })?;
    // Labels once per block and layer.
    let lab: Vec<Vec<(Vec<f32>, Vec<f32>)>> =
        data.layers.iter().map(|ls| ls.norms.chunks_exact(ff).map(|n| labels(n, o.keep)).collect()).collect();
    let nb = PREFILL_BLOCK;
    let mut last = f32::NAN;
    for step in 0..o.steps {
        let pick: Vec<usize> = (0..o.batch.max(1)).map(|_| rng.random_range(0..data.blocks)).collect();
        let b = pick.len();
        let mut total: Option<Tensor> = None;
        for (l, layer) in layers.iter().enumerate() {
            let ls = &data.layers[l];
            let mut x = Vec::with_capacity(b * nb * d);
            let (mut y, mut w) = (Vec::with_capacity(b * ff), Vec::with_capacity(b * ff));
            for &i in &pick {
                x.extend(ls.x[i * nb * d..(i + 1) * nb * d].iter().map(|v| v.to_f32()));
                y.extend_from_slice(&lab[l][i].0);
                w.extend_from_slice(&lab[l][i].1);
            }
            let x = Tensor::from_vec(x, (b, nb, d), &dev)?;
            let y = Tensor::from_vec(y, (b, ff), &dev)?;
            let w = Tensor::from_vec(w, (b, ff), &dev)?;
            let s = scores(layer, &x, d)?;
            // Weighted BCE on logits: w · (softplus(s) − y·s), softplus(s) = relu(s) + ln(1 + e^−|s|).
            let softplus = (s.relu()? + (s.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
            let bce = ((softplus - (&y * &s)?)? * &w)?;
            let loss = (bce.sum_all()? / (b * ff) as f64)?;
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
    let mut out = Vec::with_capacity(n_layer);
    for (i, l) in layers.iter().enumerate() {
        // A compensator of the file resumed from is kept as it is.
        let (c1, c2) = init.map_or((Vec::new(), Vec::new()), |p| (p.layers[i].c1.clone(), p.layers[i].c2.clone()));
        out.push(LayerPredictor {
            q: l.q.as_tensor().to_vec1::<f32>()?,
            w1: l.w1.as_tensor().flatten_all()?.to_vec1::<f32>()?,
            w2: l.w2.as_tensor().flatten_all()?.to_vec1::<f32>()?,
            c1,
            c2,
        });
    }
    let steps_before = init.map_or(0, |p| p.header.steps);
    Ok(ExpertPredictors {
        header: PredictorHeader {
            version: PREDICTOR_VERSION,
            model: String::new(),
            n_layer,
            n_embd: d,
            n_ff: ff,
            rank: r,
            keep: o.keep,
            steps: steps_before + o.steps,
            blocks: data.blocks,
            seed: o.seed,
            loss: last,
            crc32: 0,
            comp_rank: init.map_or(0, |p| p.header.comp_rank),
            comp_steps: init.map_or(0, |p| p.header.comp_steps),
            comp_loss: init.map_or(0.0, |p| p.header.comp_loss),
            comp_on: init.is_none_or(|p| p.header.comp_on),
            comp_check: init.and_then(|p| p.header.comp_check),
            attn_mass: init.map_or_else(Vec::new, |p| p.header.attn_mass.clone()),
        },
        layers: out,
    })
}

/// `s = ReLU(softmax(q·Xᵀ/√d) X · W1) · W2` for a batch `x` of (b, N, d): (b, n_ff).
fn scores(l: &Layer, x: &Tensor, d: usize) -> candle_core::Result<Tensor> {
    let (b, n, _) = x.dims3()?;
    let q = l.q.as_tensor().reshape((1, d, 1))?.broadcast_as((b, d, 1))?.contiguous()?;
    let logits = (x.matmul(&q)? / (d as f64).sqrt())?; // (b, N, 1)
    let att = candle_nn::ops::softmax(&logits.reshape((b, n))?, D::Minus1)?; // (b, N)
    let a = att.reshape((b, 1, n))?.matmul(x)?.reshape((b, d))?; // (b, d)
    a.matmul(l.w1.as_tensor())?.relu()?.matmul(l.w2.as_tensor())
}

/// The top-`keep` recall of `p`'s scores against the labels of `data` (the share of each block's
/// true top neurons the predictor picks), averaged over layers and blocks.
pub fn recall(p: &ExpertPredictors, data: &Samples, keep: f32) -> f32 {
    let (d, ff) = (data.d, data.n_ff);
    let k = ((keep as f64 * ff as f64).round() as usize).clamp(1, ff);
    let mut s = Vec::new();
    let (mut hit, mut all) = (0usize, 0usize);
    for (l, ls) in data.layers.iter().enumerate() {
        for i in 0..data.blocks {
            let x: Vec<f32> =
                ls.x[i * PREFILL_BLOCK * d..(i + 1) * PREFILL_BLOCK * d].iter().map(|v| v.to_f32()).collect();
            p.scores(l, &x, PREFILL_BLOCK, &mut s, None);
            let (y, _) = labels(&ls.norms[i * ff..(i + 1) * ff], keep);
            let mut order: Vec<usize> = (0..ff).collect();
            order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
            hit += order[..k].iter().filter(|&&j| y[j] > 0.0).count();
            all += k;
        }
    }
    hit as f32 / all.max(1) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_papers_scheme() {
        // 10 neurons, keep 0.5: the 5 largest are positives, weights 32, 16, 8, 4, 2 by rank.
        let norms = [0.1, 5.0, 0.3, 4.0, 0.2, 3.0, 9.0, 0.0, 1.0, 0.4];
        let (y, w) = labels(&norms, 0.5);
        assert_eq!(y, vec![0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]);
        assert_eq!(w, vec![1.0, 16.0, 1.0, 8.0, 1.0, 4.0, 32.0, 1.0, 2.0, 1.0]);
    }
}
