//! Magnitude Top-K at the widths of the models' sites: ns per `top_k_indices` call (the fastest
//! of repeated calls, one thread) at ratio 0.5 and 0.7.
//!
//! Scores are magnitudes of a heavy-tailed random vector (a sum of uniforms, with one value in
//! 64 ten times larger), as a model's activations are: a few outliers, a dense middle.
//!
//! Run with `cargo bench -p sift-sparsity --bench topk`.

use sift_sparsity::top_k_indices;
use std::hint::black_box;
use std::time::Instant;

const WIDTHS: &[(usize, &str)] = &[
    (576, "SmolLM2 hidden"),
    (896, "Qwen-0.5B hidden"),
    (1536, "SmolLM2 ffn / Qwen-1.5B hidden"),
    (4864, "Qwen-0.5B ffn"),
    (8960, "Qwen-1.5B ffn"),
];

fn main() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    println!("{:>6} {:>6} {:>10}  site", "n", "ratio", "ns/call");
    for &(n, what) in WIDTHS {
        let scores: Vec<f32> = (0..n)
            .map(|i| {
                let v = (0..4).map(|_| uniform()).sum::<f32>() - 2.0;
                (if i % 64 == 7 { 10.0 * v } else { v }).abs()
            })
            .collect();
        for ratio in [0.5f32, 0.7] {
            let k = n - (ratio * n as f32).round() as usize;
            let (mut scratch, mut out) = (Vec::new(), Vec::new());
            let mut best = f64::INFINITY;
            for _ in 0..50 {
                let t = Instant::now();
                for _ in 0..100 {
                    top_k_indices(black_box(&scores), k, &mut scratch, &mut out);
                    black_box(&out);
                }
                best = best.min(t.elapsed().as_secs_f64() / 100.0);
            }
            println!("{n:>6} {ratio:>6.2} {:>10.0}  {what}", best * 1e9);
        }
    }
}
