//! The neuron-major 8-bit copy ([`sift_quant::transposed_q8`]) three ways: the SIMD kernel
//! against the scalar reference (bit for bit), both against an f64 sum over the stored weights
//! (within the coefficients' rounding), and the stored weights against the f32 matrix (within
//! half a step of the two scales).
//!
//! Tolerances, per output `o` of token `t`:
//! - stored weights: `|w8(o, j) − w(o, j)| ≤ row_scale_o · neuron_scale_j / 2` (plus 10⁻⁶ relative);
//! - kernels: `|y − Σ_i c_i·w8(o, j_i)| ≤ Σ_b d_b/2 · Σ_{i ∈ b} |w8(o, j_i)| / neuron_scale_{j_i}·…`,
//!   computed below as `Σ_i (d_b(i)/2) · |w8(o, j_i)| / ns_{j_i}` plus `10⁻⁵ · Σ_i |c_i·w8(o, j_i)|`
//!   for the f32 sums: each coefficient `c·ns` is rounded to a multiple of its block's `d`.

use sift_quant::transposed_q8::{
    gemm_chosen_fn, gemm_chosen_scalar, quantize_block_fn, quantize_block_scalar, QuantizedCoefs, TransposedQ8,
    COEF_BLOCK, PANEL,
};
use sift_quant::Isa;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A matrix with the spread of a real FFN's: most weights small, a few rows and columns larger.
fn matrix(n_out: usize, n_in: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let row_amp: Vec<f32> = (0..n_out).map(|o| if o % 37 == 5 { 8.0 } else { 1.0 }).collect();
    let col_amp: Vec<f32> = (0..n_in).map(|j| if j % 23 == 3 { 4.0 } else { 1.0 }).collect();
    let mut w = vec![0f32; n_out * n_in];
    for o in 0..n_out {
        for j in 0..n_in {
            w[o * n_in + j] = 0.02 * r.f() * row_amp[o] * col_amp[j];
        }
    }
    w
}

/// Ascending subsets, an unsorted list with repeats, and the edge sizes.
fn chosen_sets(n_in: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut r = Rng(seed);
    let all: Vec<u32> = (0..n_in as u32).collect();
    let half: Vec<u32> = all.iter().copied().filter(|_| r.next().is_multiple_of(2)).collect();
    let tenth: Vec<u32> = all.iter().copied().filter(|_| r.next().is_multiple_of(10)).collect();
    let unsorted: Vec<u32> = (0..COEF_BLOCK + 7).map(|_| (r.next() % n_in as u64) as u32).collect();
    vec![all, half, tenth, unsorted, vec![7], vec![n_in as u32 - 1, 0, 5], vec![]]
}

fn coefs(n_tok: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..n_tok * k).map(|i| if i % 97 == 11 { 30.0 * r.f() } else { r.f() }).collect()
}

#[test]
fn stored_weights_are_within_half_a_step() {
    let (n_out, n_in) = (2 * PANEL, 300);
    let w = matrix(n_out, n_in, 1);
    let m = TransposedQ8::from_rows(&w, n_out, n_in).unwrap();
    // The scales: a column's largest magnitude; the scaled row's largest over 127.
    for j in 0..n_in {
        let col_amax = (0..n_out).map(|o| w[o * n_in + j].abs()).fold(0f32, f32::max);
        assert_eq!(m.neuron_scale(j), col_amax);
    }
    for o in 0..n_out {
        let amax = (0..n_in).map(|j| (w[o * n_in + j] * (1.0 / m.neuron_scale(j))).abs()).fold(0f32, f32::max);
        assert_eq!(m.row_scale(o), amax / 127.0);
        for j in 0..n_in {
            let step = m.row_scale(o) * m.neuron_scale(j);
            let err = (m.weight(o, j) - w[o * n_in + j]).abs();
            assert!(err <= step / 2.0 * 1.0001, "({o}, {j}): {err} > {}", step / 2.0);
        }
    }
    // Whole matrix: relative Frobenius error under 1 %.
    let (mut num, mut den) = (0f64, 0f64);
    for o in 0..n_out {
        for j in 0..n_in {
            num += ((m.weight(o, j) - w[o * n_in + j]) as f64).powi(2);
            den += (w[o * n_in + j] as f64).powi(2);
        }
    }
    let rel = (num / den).sqrt();
    assert!(rel < 0.01, "relative error {rel}");
}

#[test]
fn kernels_three_ways() {
    let (n_out, n_in) = (3 * PANEL, 2 * COEF_BLOCK + 40);
    let w = matrix(n_out, n_in, 2);
    let m = TransposedQ8::from_rows(&w, n_out, n_in).unwrap();
    let simd = gemm_chosen_fn(Isa::detect());
    for (si, chosen) in chosen_sets(n_in, 3).into_iter().enumerate() {
        for n_tok in [1, 2, 3, 4, 5, 7] {
            let k = chosen.len();
            let c = coefs(n_tok, k, 10 + si as u64);
            let mut q = QuantizedCoefs::default();
            q.reset(&m, &chosen, n_tok).unwrap();
            q.quantize(&c);
            // Quantized in chunks of two tokens (as threads do): the same kernel outputs.
            let mut q2 = QuantizedCoefs::default();
            q2.reset(&m, &chosen, n_tok).unwrap();
            for mut part in q2.token_chunks(2) {
                part.quantize(&c);
            }
            let whole = 0..m.n_panels();
            let len = m.n_panels() * n_tok * PANEL;
            let (mut y1, mut y2) = (vec![0f32; len], vec![0f32; len]);
            gemm_chosen_scalar(&m, &chosen, &q, whole.clone(), &mut y1, &mut Vec::new());
            gemm_chosen_scalar(&m, &chosen, &q2, whole, &mut y2, &mut Vec::new());
            assert!(y1.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits()), "set {si}: chunked quantization");
            for panels in [0..m.n_panels(), 1..2] {
                let len = panels.len() * n_tok * PANEL;
                let (mut ys, mut yv) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                gemm_chosen_scalar(&m, &chosen, &q, panels.clone(), &mut ys, &mut Vec::new());
                simd(&m, &chosen, &q, panels.clone(), &mut yv, &mut Vec::new());
                for (i, (a, b)) in ys.iter().zip(&yv).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "set {si}, {n_tok} tokens, panels {panels:?}, value {i}: {a} vs {b}"
                    );
                }
                // Against f64 over the stored weights. Each block's coefficient step, per token.
                let amax: Vec<Vec<f64>> = (0..n_tok)
                    .map(|t| {
                        (0..k.div_ceil(COEF_BLOCK))
                            .map(|b| {
                                (b * COEF_BLOCK..((b + 1) * COEF_BLOCK).min(k))
                                    .map(|i| (c[t * k + i] as f64 * neuron_scale(&m, chosen[i] as usize)).abs())
                                    .fold(0f64, f64::max)
                            })
                            .collect()
                    })
                    .collect();
                for (pi, p) in panels.clone().enumerate() {
                    for t in 0..n_tok {
                        for col in 0..PANEL {
                            let o = p * PANEL + col;
                            let (mut exact, mut bound, mut mag) = (0f64, 0f64, 0f64);
                            for (i, &j) in chosen.iter().enumerate() {
                                let ci = c[t * k + i] as f64;
                                let wv = m.weight(o, j as usize) as f64;
                                exact += ci * wv;
                                mag += (ci * wv).abs();
                                // |c·ns − d·q| ≤ d/2 with d = block amax / 127.
                                bound +=
                                    amax[t][i / COEF_BLOCK] / 127.0 / 2.0 * (wv / neuron_scale(&m, j as usize)).abs();
                            }
                            let got = ys[(pi * n_tok + t) * PANEL + col] as f64;
                            assert!(
                                (got - exact).abs() <= bound * 1.0001 + 1e-5 * mag + 1e-30,
                                "set {si}, token {t}, output {o}: {got} vs {exact} (bound {bound})"
                            );
                        }
                    }
                }
            }
        }
    }
}

fn neuron_scale(m: &TransposedQ8, j: usize) -> f64 {
    m.neuron_scale(j) as f64
}

#[test]
fn a_nan_coefficient_makes_its_tokens_outputs_nan() {
    let (n_out, n_in) = (PANEL, 64);
    let m = TransposedQ8::from_rows(&matrix(n_out, n_in, 4), n_out, n_in).unwrap();
    let chosen: Vec<u32> = (0..n_in as u32).collect();
    let mut c = coefs(2, n_in, 5);
    c[n_in + 3] = f32::NAN;
    let mut q = QuantizedCoefs::default();
    q.reset(&m, &chosen, 2).unwrap();
    q.quantize(&c);
    for isa in Isa::available() {
        let mut y = vec![0f32; 2 * PANEL];
        gemm_chosen_fn(isa)(&m, &chosen, &q, 0..1, &mut y, &mut Vec::new());
        assert!(y[..PANEL].iter().all(|v| v.is_finite()), "{isa:?}: token 0 is clean");
        assert!(y[PANEL..].iter().all(|v| v.is_nan()), "{isa:?}: token 1 holds the NaN");
    }
}

#[test]
fn bad_shapes_are_refused() {
    let w = matrix(PANEL, 10, 6);
    assert!(TransposedQ8::from_rows(&w, PANEL, 10).is_ok());
    let e = TransposedQ8::from_rows(&w[..PANEL * 10 / 2], PANEL / 2, 10).unwrap_err();
    assert!(e.0.contains("multiple of 64"), "{e}");
    let mut bad = w.clone();
    bad[13] = f32::INFINITY;
    let e = TransposedQ8::from_rows(&bad, PANEL, 10).unwrap_err();
    assert!(e.0.contains("row 1, column 3"), "{e}");
    let m = TransposedQ8::from_rows(&w, PANEL, 10).unwrap();
    let e = QuantizedCoefs::default().reset(&m, &[3, 10], 1).unwrap_err();
    assert!(e.0.contains("neuron 10"), "{e}");
    let mut q = QuantizedCoefs::default();
    q.reset(&m, &[1, 2], 1).unwrap();
    q.quantize(&[0.5, -0.5]);
    for isa in Isa::available() {
        let r =
            std::panic::catch_unwind(|| gemm_chosen_fn(isa)(&m, &[1, 2], &q, 0..1, &mut [0f32; 3], &mut Vec::new()));
        assert!(r.is_err(), "{isa:?}: a short output is refused");
        let r = std::panic::catch_unwind(|| {
            gemm_chosen_fn(isa)(&m, &[1, 2], &q, 0..2, &mut [0f32; 2 * PANEL], &mut Vec::new())
        });
        assert!(r.is_err(), "{isa:?}: a panel past the matrix is refused");
    }
}

#[test]
fn coefficient_quantizers_agree_bit_for_bit() {
    let mut r = Rng(8);
    let simd = quantize_block_fn(Isa::detect());
    for n in [1, 5, 16, 17, 100, COEF_BLOCK] {
        for special in [None, Some(f32::NAN), Some(f32::INFINITY), Some(0.0)] {
            let mut c: Vec<f32> = (0..n).map(|_| r.f() * 3.0).collect();
            let ns: Vec<f32> = (0..n).map(|_| 0.01 + r.f().abs()).collect();
            if let Some(v) = special {
                if v == 0.0 {
                    c.fill(0.0);
                } else {
                    c[n / 2] = v;
                }
            }
            let (mut qa, mut qb) = (vec![0i8; n], vec![0i8; n]);
            let a = quantize_block_scalar(&c, &ns, &mut qa);
            let b = simd(&c, &ns, &mut qb);
            assert_eq!((a.0.to_bits(), a.1), (b.0.to_bits(), b.1), "{n} values, {special:?}");
            assert_eq!(qa, qb, "{n} values, {special:?}");
            if special.is_none() {
                // Every value within half a step, the largest at ±127.
                let d = a.0;
                for i in 0..n {
                    assert!((c[i] * ns[i] - d * qa[i] as f32).abs() <= d / 2.0 * 1.0001, "{n}: value {i}");
                }
                assert!(qa.iter().any(|q| q.abs() == 127));
            }
        }
    }
}
