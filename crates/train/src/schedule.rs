//! FastForward's layer importance (seed §3.4) for the layerwise schedule: per layer, the
//! attention mass that queries put on keys past the first block (the sink block), averaged over
//! heads and queries of calibration text run through the dense model. The schedule itself
//! (Algorithm 1) is `sift_engine::prefill::linear_schedule`, computed at run time for the
//! sparsity asked for.

use sift_engine::prefill::PREFILL_BLOCK;
use sift_engine::{Engine, FfnObserver, Logits};
use std::sync::{Arc, Mutex};

struct MassObserver {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    /// Per layer: the keys of the sequence so far (positions × kvd).
    keys: Vec<Vec<f32>>,
    /// Per layer: the summed mass on non-sink keys and the (query, head) count.
    mass: Arc<Mutex<Vec<(f64, u64)>>>,
}

impl FfnObserver for MassObserver {
    fn ffn(&mut self, _: usize, _: &[f32], _: &[f32], _: usize) {}

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], n: usize, pos: usize) {
        let (hd, nh, nkv) = (self.head_dim, self.n_head, self.n_head_kv);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let keys = &mut self.keys[layer];
        keys.truncate(pos * kvd);
        keys.extend_from_slice(&k[..n * kvd]);
        let scale = 1.0 / (hd as f32).sqrt();
        let (mut sum, mut count) = (0f64, 0u64);
        let mut w = Vec::new();
        for t in 0..n {
            let p = pos + t;
            if p < PREFILL_BLOCK {
                continue; // queries of the sink block see no other block
            }
            for h in 0..nh {
                let kh = h / (nh / nkv).max(1);
                let qv = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                w.clear();
                w.extend((0..=p).map(|j| {
                    let kv = &keys[j * kvd + kh * hd..j * kvd + (kh + 1) * hd];
                    qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
                }));
                let m = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f64 = w.iter().map(|&x| ((x - m) as f64).exp()).sum();
                let past: f64 = w[PREFILL_BLOCK..].iter().map(|&x| ((x - m) as f64).exp()).sum();
                sum += past / z;
                count += 1;
            }
        }
        let mut mass = self.mass.lock().expect("not poisoned");
        mass[layer].0 += sum;
        mass[layer].1 += count;
    }
}

/// Runs `n_seq` sequences of `seq_len` tokens of `tokens` (from the end of the text: apart from
/// the blocks the predictor learned from) through `engine` (dense) and returns each layer's mean
/// attention mass on keys past the first block.
pub fn attention_mass(engine: &mut Engine, tokens: &[u32], seq_len: usize, n_seq: usize) -> anyhow::Result<Vec<f64>> {
    let c = engine.config().clone();
    anyhow::ensure!(seq_len > PREFILL_BLOCK && seq_len <= engine.n_ctx(), "sequences of {seq_len} tokens");
    let n_seq = n_seq.min(tokens.len() / seq_len);
    anyhow::ensure!(n_seq > 0, "the text has fewer than {seq_len} tokens");
    let mass = Arc::new(Mutex::new(vec![(0f64, 0u64); c.n_layer]));
    let prev = engine.set_ffn_observer(Some(Box::new(MassObserver {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
        keys: vec![Vec::new(); c.n_layer],
        mass: mass.clone(),
    })));
    let start = tokens.len() - n_seq * seq_len;
    let result = (|| -> anyhow::Result<()> {
        for s in 0..n_seq {
            engine.truncate(0);
            engine.eval(&tokens[start + s * seq_len..start + (s + 1) * seq_len], Logits::Last)?;
        }
        Ok(())
    })();
    engine.set_ffn_observer(prev);
    engine.truncate(0);
    result?;
    let m = mass.lock().expect("not poisoned");
    Ok(m.iter().map(|&(s, n)| if n > 0 { s / n as f64 } else { 0.0 }).collect())
}
