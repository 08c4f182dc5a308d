//! Three-way tests for the non-K formats (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0) and the
//! activation quantizers (Q8_0, Q8_1, Q8_K): SIMD kernels against the scalar reference against an
//! f64 computation on dequantized values, for every instruction set this CPU runs
//! ([`Isa::available`]), on seeded random rows of 32, 96, 160, 576, 1536 and 4864 values (1, 3 and
//! 5 blocks exercise the kernels' tails) stored at odd byte offsets (unaligned).
//!
//! # Tolerances
//!
//! Below `d` is a block's stored (f16) scale, `d32` the f32 scale the quantizer computed before
//! rounding it to f16, and `Σ|w·a|` the sum of the magnitudes of the products of dequantized
//! weights and activations (the natural scale of the rounding error of a sum; a relative error on
//! the result itself is meaningless when the sum cancels).
//!
//! - Weight round trip (`quantize_row_*` then `dequantize_row`), per element:
//!   Q4_0 `|e| ≤ d·(½ + 2⁻⁶)`, or `d·(1 + 2⁻⁶)` for the values GGML clamps (`x/d32 > 7.5`, the side
//!   opposite the block's extreme); Q5_0 the same with 15.5; Q4_1 `d/2 + |m|·2⁻¹⁰ + 15·d·2⁻¹⁰`
//!   (f16 rounding of `m` and `d`); Q8_0 `d·(½ + 127·2⁻¹⁰)`; F16 `|x|·2⁻¹¹ + 2⁻²⁴`; BF16
//!   `|x|·2⁻⁸`; F32 exact. (Each bound also allows `10⁻⁶·amax` of f32 rounding.)
//! - Activation round trip, per element: Q8_0 / Q8_1 `d32·(½ + 127·2⁻¹⁰) + 10⁻⁶·amax`; Q8_K
//!   `|d|·(½ + 10⁻⁴)` (its `d` is f32).
//! - Scalar dot vs f64 `Σ w·a` of the dequantized rows: `≤ 10⁻⁵·Σ|w·a|` (integer sums are exact;
//!   only the f32 adds of per-block terms round). Q4_1 × Q8_1 uses the stored `s` instead of
//!   `d·Σq`; the reference adds that difference (`m·(s − d·Σq)`, an f16 rounding) exactly.
//! - SIMD dot vs scalar dot: `≤ 10⁻⁴·Σ|w·a|` (different f32 summation order only).
//! - End to end, dot vs f64 `Σ x·y` of the original f32 rows: within `Σ (ew·|y| + |x|·ea + ew·ea)`
//!   of the per-element round-trip bounds `ew`, `ea` above, plus `10⁻⁴·Σ|x·y|`.
//! - SIMD vs scalar activation quantizers: Q8_K byte-identical; Q8_0 / Q8_1 identical `d`, quants
//!   within ±1 of the scalar ones on at most 0.5 % of values (values within an ulp of a rounding
//!   tie: GGML's x86 code multiplies by `127/amax` and rounds half to even, the reference
//!   multiplies by `1/d` and rounds half away from zero), and Q8_1's `s = f16(d32·Σq)` of its own
//!   quants.
//! - One-hot rows (`127·e_j`, which every quantizer represents exactly with `d = 1`) make
//!   `dot / 127` the dequantized weight `w_j` to within `4` f32 ulps of the block's `|d·q| + |m|`.
//!   The real-model test does this for `blk.0.ffn_down.weight` of SmolLM2-135M-Instruct.Q4_1
//!   (skipped with a message when `models/` lacks the file).

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_quant::{scalar, ActType, Isa, WeightType};

const LEGACY: [WeightType; 7] = [
    WeightType::F32,
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q8_0,
];
const SIZES: [usize; 6] = [32, 96, 160, 576, 1536, 4864];

fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// A random row: mostly uniform with a per-row scale, a few outliers (like real weights and
/// activations), and sometimes an all-zero block.
fn random_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let scale = 10f32.powf(rng.random_range(-2.0..1.0));
    let mut x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect();
    for _ in 0..n / 64 + 1 {
        let i = rng.random_range(0..n);
        x[i] *= rng.random_range(2.0f32..20.0);
    }
    if n >= 64 && rng.random_bool(0.3) {
        let b = rng.random_range(0..n / 32);
        x[32 * b..32 * b + 32].fill(0.0);
    }
    x
}

fn dequantize(t: WeightType, w: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    t.dequantize_row(w, &mut out);
    out
}

/// Per-element bound on `|dequantize(quantize(x)) - x|` (see the module doc).
fn weight_err_bound(t: WeightType, x: &[f32], w: &[u8]) -> Vec<f32> {
    let mut e = vec![0f32; x.len()];
    if t.block_size() == 1 {
        for (e, &v) in e.iter_mut().zip(x) {
            *e = match t {
                WeightType::F32 => 0.0,
                WeightType::F16 => v.abs() * 2f32.powi(-11) + 2f32.powi(-24),
                _ => v.abs() * 2f32.powi(-8),
            };
        }
        return e;
    }
    let bb = t.block_bytes();
    for ((e, x), b) in e.chunks_exact_mut(32).zip(x.chunks_exact(32)).zip(w.chunks_exact(bb)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let slack = 1e-6 * amax;
        let d = f16_at(b, 0).abs();
        // The signed value of largest magnitude, as GGML's quantizers find it.
        let max = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        for (e, &v) in e.iter_mut().zip(x) {
            *e = slack
                + match t {
                    WeightType::Q4_0 | WeightType::Q5_0 => {
                        let half = if t == WeightType::Q4_0 { 8.0 } else { 16.0 };
                        let d32 = max / -half;
                        let clamped = d32 != 0.0 && v / d32 > half - 0.5;
                        d * (if clamped { 1.0 } else { 0.5 } + 2f32.powi(-6))
                    }
                    WeightType::Q4_1 => {
                        let m = f16_at(b, 2);
                        0.5 * d + m.abs() * 2f32.powi(-10) + 15.0 * d * 2f32.powi(-10)
                    }
                    WeightType::Q8_0 => d * (0.5 + 127.0 * 2f32.powi(-10)),
                    _ => unreachable!(),
                };
        }
    }
    e
}

/// Dequantizes an activation row (the formats have no public dequantizer: they never leave a dot).
fn dequantize_act(t: ActType, a: &[u8], n: usize) -> Vec<f32> {
    match t {
        ActType::F32 => a.chunks_exact(4).take(n).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        ActType::Q8_0 | ActType::Q8_1 => {
            let (bb, qoff) = if t == ActType::Q8_0 { (34, 2) } else { (36, 4) };
            let mut out = Vec::with_capacity(n);
            for b in a.chunks_exact(bb).take(n / 32) {
                let d = f16_at(b, 0);
                out.extend(b[qoff..qoff + 32].iter().map(|&q| q as i8 as f32 * d));
            }
            out
        }
        ActType::Q8_K => {
            let mut out = Vec::with_capacity(n);
            for b in a.chunks_exact(292).take(n / 256) {
                let d = f32::from_le_bytes(b[..4].try_into().unwrap());
                out.extend(b[4..260].iter().map(|&q| q as i8 as f32 * d));
            }
            out
        }
    }
}

/// Per-element bound on the activation round-trip error (see the module doc).
fn act_err_bound(t: ActType, x: &[f32], a: &[u8]) -> Vec<f32> {
    match t {
        ActType::F32 => vec![0.0; x.len()],
        ActType::Q8_0 | ActType::Q8_1 => {
            let mut e = Vec::with_capacity(x.len());
            for x in x.chunks_exact(32) {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d32 = amax / 127.0;
                e.extend(std::iter::repeat_n(d32 * (0.5 + 127.0 * 2f32.powi(-10)) + 1e-6 * amax, 32));
            }
            e
        }
        ActType::Q8_K => {
            let mut e = Vec::with_capacity(x.len());
            for b in a.chunks_exact(292).take(x.len() / 256) {
                let d = f32::from_le_bytes(b[..4].try_into().unwrap());
                e.extend(std::iter::repeat_n(d.abs() * (0.5 + 1e-4), 256));
            }
            e
        }
    }
}

fn quantize_act(t: ActType, x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; t.row_bytes(x.len())];
    t.quantize(x, &mut a);
    a
}

/// Copies `b` to offset `off` of a fresh buffer and returns that buffer (the kernels must not
/// depend on alignment).
fn misaligned(b: &[u8], off: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0xA5u8; b.len() + off];
    v[off..].copy_from_slice(b);
    (v, off)
}

/// Σ|w·a| and the f64 dot of dequantized rows.
fn dot_f64(w: &[f32], a: &[f32]) -> (f64, f64) {
    let abs = w.iter().zip(a).map(|(&w, &a)| (w as f64 * a as f64).abs()).sum();
    let dot = w.iter().zip(a).map(|(&w, &a)| w as f64 * a as f64).sum();
    (dot, abs)
}

/// Q4_1 × Q8_1 kernels use the stored `s` where the dequantized product has `d·Σq`: the exact
/// difference `Σ m·(s − d·Σq)` over blocks.
fn q4_1_s_correction(w: &[u8], a: &[u8], n: usize) -> f64 {
    let mut c = 0f64;
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(36)).take(n / 32) {
        let m = f16_at(wb, 2) as f64;
        let (d, s) = (f16_at(ab, 0) as f64, f16_at(ab, 2) as f64);
        let sum_q: i32 = ab[4..36].iter().map(|&q| q as i8 as i32).sum();
        c += m * (s - d * sum_q as f64);
    }
    c
}

#[test]
fn every_isa_has_every_legacy_kernel() {
    let isas = Isa::available();
    assert_eq!(isas[0], Isa::Scalar);
    for t in LEGACY {
        for &isa in &isas {
            assert!(t.dot_fn_for(isa).is_some(), "{} has no {isa:?} kernel", t.name());
        }
    }
    println!("ISAs tested: {isas:?}");
}

#[test]
fn weight_round_trip_within_bounds() {
    let mut rng = StdRng::seed_from_u64(1);
    for t in LEGACY {
        for n in SIZES {
            for _ in 0..4 {
                let x = random_row(&mut rng, n);
                let w = scalar::quantize_row(t, &x);
                assert_eq!(w.len(), t.row_bytes(n).unwrap());
                let y = dequantize(t, &w, n);
                let bound = weight_err_bound(t, &x, &w);
                for i in 0..n {
                    let err = (y[i] - x[i]).abs();
                    assert!(
                        err <= bound[i],
                        "{} n={n} [{i}]: x={} got {} err {err} > {}",
                        t.name(),
                        x[i],
                        y[i],
                        bound[i]
                    );
                }
            }
        }
    }
}

#[test]
fn dequantize_matches_ggml_formulas() {
    // Hand-built blocks: element order (low nibbles first), offsets and fifth bits.
    let mut q4_0 = vec![0u8; 18];
    q4_0[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    q4_0[2] = 0x3A; // element 0 = 0xA, element 16 = 0x3
    let y = dequantize(WeightType::Q4_0, &q4_0, 32);
    assert_eq!((y[0], y[16], y[1], y[17]), (1.0, -2.5, -4.0, -4.0));

    let mut q4_1 = vec![0u8; 20];
    q4_1[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    q4_1[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
    q4_1[4 + 15] = 0xF1; // element 15 = 1, element 31 = 15
    let y = dequantize(WeightType::Q4_1, &q4_1, 32);
    assert_eq!((y[15], y[31], y[0]), (-0.75, 2.75, -1.0));

    let mut q5_0 = vec![0u8; 22];
    q5_0[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    q5_0[2..6].copy_from_slice(&((1u32 << 3) | (1 << 19)).to_le_bytes()); // fifth bit of 3 and 19
    q5_0[6 + 3] = 0x21; // element 3 = 1 | 16, element 19 = 2 | 16
    let y = dequantize(WeightType::Q5_0, &q5_0, 32);
    assert_eq!((y[3], y[19], y[0], y[16]), (2.0, 4.0, -32.0, -32.0));

    let mut q8_0 = vec![0u8; 34];
    q8_0[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    q8_0[2 + 31] = (-127i8) as u8;
    let y = dequantize(WeightType::Q8_0, &q8_0, 32);
    assert_eq!((y[31], y[0]), (-63.5, 0.0));

    let bf = bf16::from_f32(-3.25).to_le_bytes();
    assert_eq!(dequantize(WeightType::BF16, &bf, 1), [-3.25]);
}

#[test]
fn activation_round_trip_within_bounds() {
    let mut rng = StdRng::seed_from_u64(2);
    for t in [ActType::F32, ActType::Q8_0, ActType::Q8_1, ActType::Q8_K] {
        for n in [256, 512, 1536, 4864] {
            for _ in 0..4 {
                let x = random_row(&mut rng, n);
                for (which, a) in [
                    ("dispatch", quantize_act(t, &x)),
                    ("scalar", {
                        let mut a = vec![0u8; t.row_bytes(n)];
                        scalar::quantize_act(t, &x, &mut a);
                        a
                    }),
                ] {
                    let y = dequantize_act(t, &a, n);
                    let bound = act_err_bound(t, &x, &a);
                    for i in 0..n {
                        let err = (y[i] - x[i]).abs();
                        assert!(
                            err <= bound[i],
                            "{which} {t:?} n={n} [{i}]: x={} got {} err {err} > {}",
                            x[i],
                            y[i],
                            bound[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn scalar_dot_equals_f64_dot_of_dequantized_rows() {
    let mut rng = StdRng::seed_from_u64(3);
    for t in LEGACY {
        let dot = t.dot_fn_for(Isa::Scalar).unwrap();
        for n in SIZES {
            for _ in 0..4 {
                let w = scalar::quantize_row(t, &random_row(&mut rng, n));
                let a = quantize_act(t.act_type(), &random_row(&mut rng, n));
                let (mut want, abs) = dot_f64(&dequantize(t, &w, n), &dequantize_act(t.act_type(), &a, n));
                if t == WeightType::Q4_1 {
                    want += q4_1_s_correction(&w, &a, n);
                }
                let got = dot(n, &w, &a) as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * abs + 1e-30,
                    "{} n={n}: scalar {got} vs f64 {want} (Σ|w·a| {abs})",
                    t.name()
                );
            }
        }
    }
}

#[test]
fn simd_dot_equals_scalar_dot() {
    let mut rng = StdRng::seed_from_u64(4);
    for t in LEGACY {
        let reference = t.dot_fn_for(Isa::Scalar).unwrap();
        for n in SIZES {
            for trial in 0..6 {
                let w = scalar::quantize_row(t, &random_row(&mut rng, n));
                let a = quantize_act(t.act_type(), &random_row(&mut rng, n));
                let (_, abs) = dot_f64(&dequantize(t, &w, n), &dequantize_act(t.act_type(), &a, n));
                let want = reference(n, &w, &a);
                let (wbuf, wo) = misaligned(&w, 1 + trial % 3);
                let (abuf, ao) = misaligned(&a, 3 + trial % 5);
                for isa in Isa::available() {
                    let got = t.dot_fn_for(isa).unwrap()(n, &wbuf[wo..], &abuf[ao..]);
                    let diff = (got as f64 - want as f64).abs();
                    assert!(
                        diff <= 1e-4 * abs + 1e-30,
                        "{} {isa:?} n={n}: {got} vs scalar {want} (Σ|w·a| {abs})",
                        t.name()
                    );
                }
            }
        }
    }
}

#[test]
fn dot_within_quantization_error_of_exact_f32_dot() {
    let mut rng = StdRng::seed_from_u64(5);
    for t in LEGACY {
        for n in SIZES {
            for _ in 0..3 {
                let (x, y) = (random_row(&mut rng, n), random_row(&mut rng, n));
                let w = scalar::quantize_row(t, &x);
                let a = quantize_act(t.act_type(), &y);
                let (ew, ea) = (weight_err_bound(t, &x, &w), act_err_bound(t.act_type(), &y, &a));
                let (exact, abs) = dot_f64(&x, &y);
                let mut bound = 1e-4 * abs;
                for i in 0..n {
                    bound += (ew[i] * y[i].abs() + x[i].abs() * ea[i] + ew[i] * ea[i]) as f64;
                }
                if t == WeightType::Q4_1 {
                    bound += q4_1_s_correction(&w, &a, n).abs();
                }
                for isa in Isa::available() {
                    let got = t.dot_fn_for(isa).unwrap()(n, &w, &a) as f64;
                    assert!(
                        (got - exact).abs() <= bound,
                        "{} {isa:?} n={n}: {got} vs exact {exact}, bound {bound}",
                        t.name()
                    );
                }
            }
        }
    }
}

#[test]
fn simd_activation_quantizers_match_scalar() {
    let mut rng = StdRng::seed_from_u64(6);
    let (mut values, mut differing) = (0usize, 0usize);
    for t in [ActType::Q8_0, ActType::Q8_1, ActType::Q8_K] {
        for n in [256, 512, 1536, 4608] {
            for _ in 0..8 {
                let x = random_row(&mut rng, n);
                let fast = quantize_act(t, &x);
                let mut slow = vec![0u8; t.row_bytes(n)];
                scalar::quantize_act(t, &x, &mut slow);
                if t == ActType::Q8_K {
                    assert_eq!(fast, slow, "Q8_K n={n}: SIMD and scalar bytes differ");
                    continue;
                }
                let (bb, qoff) = if t == ActType::Q8_0 { (34, 2) } else { (36, 4) };
                for ((f, s), x) in fast.chunks_exact(bb).zip(slow.chunks_exact(bb)).zip(x.chunks_exact(32)) {
                    assert_eq!(f[..2], s[..2], "{t:?}: d differs");
                    let mut sum = 0i32;
                    for (&qf, &qs) in f[qoff..].iter().zip(&s[qoff..]) {
                        let (qf, qs) = (qf as i8 as i32, qs as i8 as i32);
                        assert!((qf - qs).abs() <= 1, "{t:?}: quants {qf} vs {qs}");
                        differing += (qf != qs) as usize;
                        values += 1;
                        sum += qf;
                    }
                    if t == ActType::Q8_1 {
                        let d32 = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                        assert_eq!(f[2..4], f16::from_f32(d32 * sum as f32).to_le_bytes(), "Q8_1: s is not d·Σq");
                    }
                }
            }
        }
    }
    assert!(differing as f64 <= 0.005 * values as f64, "{differing} of {values} quants differ");
    println!("{differing} of {values} Q8_0/Q8_1 quants differ between SIMD and scalar");
}

#[test]
fn activation_quantizer_rounding_ties() {
    // amax = 127 gives d = 1, so x·(1/d) = x exactly: every .5 is a tie.
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    let ties = [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5];
    x[1..8].copy_from_slice(&ties);
    let mut scalar_q = vec![0u8; 34];
    scalar::quantize_act(ActType::Q8_0, &x, &mut scalar_q);
    // GGML's reference (`roundf`): half away from zero.
    let away: Vec<i8> = scalar_q[3..10].iter().map(|&q| q as i8).collect();
    assert_eq!(away, [1, 2, 3, -1, -2, -3, 127]);
    // The dispatching quantizer is GGML's x86 one where SIMD is available: half to even.
    let fast = quantize_act(ActType::Q8_0, &x);
    let got: Vec<i8> = fast[3..10].iter().map(|&q| q as i8).collect();
    if Isa::detect() >= Isa::Avx2 {
        assert_eq!(got, [0, 2, 2, 0, -2, -2, 126]);
    } else {
        assert_eq!(got, away);
    }
    // Q8_K rounds half to even everywhere (GGML's `nearest_int`): max = 127 → iscale = -1.
    let mut xk = vec![0f32; 256];
    xk[0] = 127.0;
    xk[1..8].copy_from_slice(&ties);
    let k = quantize_act(ActType::Q8_K, &xk);
    let got: Vec<i8> = k[5..12].iter().map(|&q| q as i8).collect();
    assert_eq!(got, [0, -2, -2, 0, 2, 2, -126]);
    assert_eq!(f32::from_le_bytes(k[..4].try_into().unwrap()), -1.0);
}

#[test]
fn q8_k_edge_cases() {
    let mut x = vec![0f32; 512];
    // Block 0 all zero; block 1's largest magnitude is negative and appears twice with both signs.
    x[256] = 0.25;
    x[300] = -3.0;
    x[400] = 3.0;
    x[511] = 1.5;
    for a in [quantize_act(ActType::Q8_K, &x), {
        let mut a = vec![0u8; ActType::Q8_K.row_bytes(512)];
        scalar::quantize_act(ActType::Q8_K, &x, &mut a);
        a
    }] {
        assert!(a[..292].iter().all(|&b| b == 0), "zero block must be all zero bytes");
        let b = &a[292..];
        // max = -3 (the first of the two) → iscale = 127/3, d = 3/127.
        assert_eq!(f32::from_le_bytes(b[..4].try_into().unwrap()), 1.0 / (-127.0f32 / -3.0));
        assert_eq!(b[4 + 44] as i8, -127);
        assert_eq!(b[4 + 144] as i8, 127);
        assert_eq!(b[4 + 255] as i8, 64); // 1.5 · 127/3 = 63.5 → 64 (half to even)
        assert_eq!(b[4] as i8, 11); // 0.25 · 127/3 = 10.58
        let bsum = |j: usize| i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]);
        assert_eq!((bsum(0), bsum(2), bsum(9), bsum(15)), (11, -127, 127, 64));
    }
}

/// `dot(w, quantize(127·e_j)) / 127` for every `j`, against the dequantized row.
fn check_one_hot(t: WeightType, w: &[u8], n: usize, what: &str) {
    let want = dequantize(t, w, n);
    let act = t.act_type();
    let mut x = vec![0f32; n];
    for isa in Isa::available() {
        let dot = t.dot_fn_for(isa).unwrap();
        for j in 0..n {
            x[j] = 127.0;
            let a = quantize_act(act, &x);
            x[j] = 0.0;
            let got = dot(n, w, &a) / 127.0;
            // 4 ulps of the block's |d·q| + |m| (`want` already has one rounding of d·q + m).
            let (d, m) = match t.block_size() {
                1 => (want[j].abs(), 0.0),
                _ => {
                    let b = &w[(j / 32) * t.block_bytes()..];
                    let m = if t == WeightType::Q4_1 { f16_at(b, 2).abs() } else { 0.0 };
                    ((want[j] - if t == WeightType::Q4_1 { f16_at(b, 2) } else { 0.0 }).abs(), m)
                }
            };
            let tol = 4.0 * f32::EPSILON * (d + m);
            assert!(
                (got - want[j]).abs() <= tol,
                "{what} {} {isa:?} [{j}]: dot/127 {got} vs dequantized {}",
                t.name(),
                want[j]
            );
        }
    }
}

#[test]
fn one_hot_dot_extracts_dequantized_weights() {
    let mut rng = StdRng::seed_from_u64(8);
    for t in LEGACY {
        for n in [32, 160, 576] {
            let w = scalar::quantize_row(t, &random_row(&mut rng, n));
            check_one_hot(t, &w, n, "random");
        }
    }
}

#[test]
fn short_rows_panic_instead_of_reading_out_of_bounds() {
    for t in LEGACY {
        let n = 64;
        let w = vec![0u8; t.row_bytes(n).unwrap()];
        let a = vec![0u8; t.act_type().row_bytes(n)];
        for isa in Isa::available() {
            let dot = t.dot_fn_for(isa).unwrap();
            assert_eq!(dot(n, &w, &a), 0.0);
            let short_w = std::panic::catch_unwind(|| dot(n, &w[..w.len() - 1], &a));
            let short_a = std::panic::catch_unwind(|| dot(n, &w, &a[..a.len() - 1]));
            assert!(short_w.is_err() && short_a.is_err(), "{} {isa:?} accepted a short row", t.name());
            if t.block_size() > 1 {
                assert!(
                    std::panic::catch_unwind(|| dot(n - 1, &w, &a)).is_err(),
                    "{} {isa:?}: partial block",
                    t.name()
                );
            }
        }
    }
}

/// Real weights: `blk.0.ffn_down.weight` row 0 of SmolLM2-135M-Instruct.Q4_1 through one-hot
/// dots (every ISA) must equal `dequantize_row`; then SIMD vs scalar dots on rows of every
/// non-K tensor in the file.
#[test]
fn real_model_rows() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(std::path::Path::new(path).exists(), "{path} missing: run scripts/fetch-model.sh first");
    let file = sift_gguf::GgufFile::open(path).expect("open model");
    let info = file.gguf.tensor("blk.0.ffn_down.weight").expect("tensor").clone();
    let t = WeightType::from_ggml_id(info.ty.id()).expect("supported type");
    assert_eq!(t, WeightType::Q4_1, "SmolLM2 Q4_1's ffn_down");
    let n = info.dims[0] as usize;
    let data = file.tensor_bytes(&info.name).unwrap();
    let rb = t.row_bytes(n).unwrap();
    check_one_hot(t, &data[..rb], n, "blk.0.ffn_down.weight row 0");

    let mut rng = StdRng::seed_from_u64(9);
    let mut checked = 0;
    for info in &file.gguf.tensors {
        let Some(t) = WeightType::from_ggml_id(info.ty.id()) else { continue };
        if t.block_size() == 256 || info.dims.len() < 2 {
            continue; // K-quants are tests/kquants.rs's; 1-D tensors are norms.
        }
        let n = info.dims[0] as usize;
        let rb = t.row_bytes(n).unwrap();
        let data = file.tensor_bytes(&info.name).unwrap();
        let a = quantize_act(t.act_type(), &random_row(&mut rng, n));
        let rows = data.len() / rb;
        for r in (0..rows).step_by((rows / 8).max(1)) {
            let w = &data[r * rb..(r + 1) * rb];
            let (_, abs) = dot_f64(&dequantize(t, w, n), &dequantize_act(t.act_type(), &a, n));
            let want = t.dot_fn_for(Isa::Scalar).unwrap()(n, w, &a);
            for isa in Isa::available() {
                let got = t.dot_fn_for(isa).unwrap()(n, w, &a);
                assert!((got - want).abs() as f64 <= 1e-4 * abs, "{} row {r} {isa:?}: {got} vs {want}", info.name);
            }
        }
        checked += 1;
    }
    println!("checked {checked} non-K tensors of {path}");
    assert!(checked > 0);
}
