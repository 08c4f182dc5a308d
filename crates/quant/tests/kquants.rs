//! K-quant (Q4_K, Q5_K, Q6_K) kernels, checked three ways as in candle's `k_quants` tests:
//! SIMD dot vs scalar dot vs an f32 dot of dequantized values.
//!
//! Tolerances:
//! - Round trip `dequantize(quantize_row(x))` on seeded Gaussian rows (n = 256, 1024, 4864):
//!   every value is within 0.75 of a quantization step of `x`, where a step is the sub-block's
//!   range / 15 (Q4_K), range / 31 (Q5_K) or max |x| / 31 (Q6_K) (the ideal is half a step; the
//!   rest is room for rounding the sub-block scales to 6 / 8 bits), and the RMS error relative to
//!   the row's RMS is below 9 % (Q4_K), 4.5 % (Q5_K) and 2.5 % (Q6_K) (measured: 7.9 %, 3.8 %,
//!   1.9 % on Gaussian data).
//! - Every ISA in [`Isa::available`] vs the scalar dot: `|simd − scalar| ≤ 1e-4 · D`.
//! - Scalar dot vs `Σ w·a` of dequantized weights and dequantized Q8_K activations (f64 sum):
//!   `|scalar − f32| ≤ 1e-3 · D`.
//!
//!   Here `D = max(|reference|, 1e-2 · Σ|w·a|)`: relative to the result, with a floor of 1 % of the
//!   sum of absolute products so that a dot product that happens to cancel to almost zero is not
//!   held to a tolerance below f32 rounding of its terms.
//! - Random raw block bytes (every bit pattern of quants, high bits and scales, incl. negative
//!   Q6_K scales and −128 activations) with the same dot tolerances.
//! - Real weights: every Q4_K / Q5_K / Q6_K tensor of
//!   `models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` (or `$SIFT_TEST_GGUF`), a few rows each,
//!   with the same dot tolerances. Skipped (with a message) when the file is absent.
//!
//! `cargo test --release -p sift-quant --test kquants -- --ignored --nocapture` runs the
//! throughput measurement (GB/s of weight bytes for a 896 × 4864 matrix-vector product per ISA).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_quant::blocks::BlockQ8K;
use sift_quant::scalar_k;
use sift_quant::{ActType, Isa, WeightType};

const QK_K: usize = 256;

/// One K-quant format: its type and scalar reference functions.
struct Fmt {
    ty: WeightType,
    quantize: fn(&[f32]) -> Vec<u8>,
    dequantize: fn(&[u8], &mut [f32]),
    dot: fn(usize, &[u8], &[u8]) -> f32,
    /// Quantization step as a fraction of the sub-block's spread (see module doc).
    step_frac: f32,
    /// Sub-block length the spread is measured over.
    sub: usize,
    /// Bound on RMS(error) / RMS(x).
    rms_frac: f32,
}

const FMTS: [Fmt; 3] = [
    Fmt {
        ty: WeightType::Q4_K,
        quantize: scalar_k::quantize_row_q4_k,
        dequantize: scalar_k::dequantize_q4_k,
        dot: scalar_k::dot_q4_k,
        step_frac: 1.0 / 15.0,
        sub: 32,
        rms_frac: 0.09,
    },
    Fmt {
        ty: WeightType::Q5_K,
        quantize: scalar_k::quantize_row_q5_k,
        dequantize: scalar_k::dequantize_q5_k,
        dot: scalar_k::dot_q5_k,
        step_frac: 1.0 / 31.0,
        sub: 32,
        rms_frac: 0.045,
    },
    Fmt {
        ty: WeightType::Q6_K,
        quantize: scalar_k::quantize_row_q6_k,
        dequantize: scalar_k::dequantize_q6_k,
        dot: scalar_k::dot_q6_k,
        step_frac: 1.0 / 31.0,
        sub: 16,
        rms_frac: 0.025,
    },
];

const LENS: [usize; 3] = [256, 1024, 4864];

fn gaussian(rng: &mut StdRng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            // Box–Muller.
            let u1: f32 = rng.random::<f32>().max(1e-12);
            let u2: f32 = rng.random();
            sigma * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

/// GGML's `quantize_row_q8_K_ref`: per 256 values the signed value `max` of largest |x|,
/// `iscale = −127 / max`, `q = min(127, round_half_even(iscale · x))`, `d = 1 / iscale`.
fn quantize_q8k(x: &[f32]) -> Vec<u8> {
    assert_eq!(x.len() % QK_K, 0);
    let mut out = vec![0u8; ActType::Q8_K.row_bytes(x.len())];
    let blocks: &mut [BlockQ8K] = bytemuck::cast_slice_mut(&mut out);
    for (b, xb) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        fill_bsums(b);
        b.d = (1.0 / iscale).to_le_bytes();
    }
    out
}

/// The crate's activation quantizers (scalar and dispatched) produce the same Q8_K bytes as the
/// local mirror of GGML's reference used by these tests.
#[test]
fn q8k_quantizers_match_reference() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0006);
    for (k, &n) in LENS.iter().enumerate() {
        let mut x = gaussian(&mut rng, n, [1.0, 1e-3, 50.0][k]);
        x[..QK_K].fill(0.0); // an all-zero block
        let want = quantize_q8k(&x);
        let mut got = vec![0u8; ActType::Q8_K.row_bytes(n)];
        sift_quant::scalar::quantize_act(ActType::Q8_K, &x, &mut got);
        assert_eq!(got, want, "scalar::quantize_act Q8_K, n={n}");
        got.fill(0xAA);
        ActType::Q8_K.quantize(&x, &mut got);
        assert_eq!(got, want, "ActType::Q8_K.quantize, n={n}");
    }
}

fn fill_bsums(b: &mut BlockQ8K) {
    for (j, s) in b.bsums.iter_mut().enumerate() {
        let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
        *s = (sum as i16).to_le_bytes();
    }
}

fn dequantize_q8k(a: &[u8]) -> Vec<f32> {
    let blocks: &[BlockQ8K] = bytemuck::cast_slice(a);
    blocks.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d() * q as f32)).collect()
}

/// The f32 reference (f64 sum of f32 products of dequantized values) and `Σ|w·a|`.
fn f32_dot(fmt: &Fmt, n: usize, w: &[u8], a: &[u8]) -> (f64, f64) {
    let mut wd = vec![0f32; n];
    (fmt.dequantize)(w, &mut wd);
    let ad = dequantize_q8k(a);
    assert!(wd.iter().all(|v| v.is_finite()), "{}: non-finite dequantized weight", fmt.ty.name());
    let dot = wd.iter().zip(&ad).map(|(&x, &y)| (x * y) as f64).sum();
    let abs = wd.iter().zip(&ad).map(|(&x, &y)| (x * y).abs() as f64).sum();
    (dot, abs)
}

/// Checks one weight row against one activation row three ways (see the module doc).
fn check_dot(fmt: &Fmt, n: usize, w: &[u8], a: &[u8], what: &str) {
    let scalar = (fmt.dot)(n, w, a);
    let (reference, abs) = f32_dot(fmt, n, w, a);
    let denom = |r: f64| r.abs().max(1e-2 * abs).max(f64::MIN_POSITIVE);
    let err = (scalar as f64 - reference).abs() / denom(reference);
    assert!(
        err <= 1e-3,
        "{} {what} n={n}: scalar {scalar} vs f32 {reference} (rel err {err:.2e}, Σ|wa| {abs})",
        fmt.ty.name()
    );
    for isa in Isa::available() {
        let f = fmt.ty.dot_fn_for(isa).unwrap_or_else(|| panic!("no {} kernel for {isa:?}", fmt.ty.name()));
        let got = f(n, w, a);
        let err = (got as f64 - scalar as f64).abs() / denom(scalar as f64);
        assert!(err <= 1e-4, "{} {what} n={n} {isa:?}: {got} vs scalar {scalar} (rel err {err:.2e})", fmt.ty.name());
    }
}

#[test]
fn round_trip_is_within_a_step() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    for fmt in &FMTS {
        for &n in &LENS {
            for row in 0..4 {
                let sigma = [1.0, 0.02, 30.0, 1e-3][row];
                let x = gaussian(&mut rng, n, sigma);
                let q = (fmt.quantize)(&x);
                assert_eq!(q.len(), fmt.ty.row_bytes(n).unwrap());
                let mut y = vec![0f32; n];
                (fmt.dequantize)(&q, &mut y);
                // Same through the public dispatcher.
                let mut y2 = vec![0f32; n];
                fmt.ty.dequantize_row(&q, &mut y2);
                assert_eq!(y, y2, "{}: dequantize_row differs from scalar_k", fmt.ty.name());
                for (s, (xs, ys)) in x.chunks(fmt.sub).zip(y.chunks(fmt.sub)).enumerate() {
                    let spread = if fmt.ty == WeightType::Q6_K {
                        xs.iter().fold(0f32, |m, v| m.max(v.abs()))
                    } else {
                        let mn = xs.iter().copied().fold(0f32, f32::min);
                        let mx = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        mx - mn
                    };
                    let bound = 0.75 * spread * fmt.step_frac;
                    for (i, (a, b)) in xs.iter().zip(ys).enumerate() {
                        assert!(
                            (a - b).abs() <= bound,
                            "{} n={n} sigma={sigma} sub-block {s} value {i}: {a} → {b} (bound {bound})",
                            fmt.ty.name()
                        );
                    }
                }
                let rms = |v: &mut dyn Iterator<Item = f32>| {
                    let (s, c) = v.fold((0f64, 0usize), |(s, c), e| (s + (e as f64).powi(2), c + 1));
                    (s / c as f64).sqrt()
                };
                let e = rms(&mut x.iter().zip(&y).map(|(a, b)| a - b));
                let r = rms(&mut x.iter().copied());
                assert!(e / r <= fmt.rms_frac as f64, "{} n={n}: rms error {:.4} of rms", fmt.ty.name(), e / r);
            }
        }
    }
}

#[test]
fn zero_and_constant_rows() {
    for fmt in &FMTS {
        for c in [0.0f32, 0.75, -2.5] {
            let x = vec![c; 512];
            let q = (fmt.quantize)(&x);
            let mut y = vec![f32::NAN; 512];
            (fmt.dequantize)(&q, &mut y);
            for &v in &y {
                assert!((v - c).abs() <= c.abs() * 0.02, "{} constant {c}: got {v}", fmt.ty.name());
            }
            let a = quantize_q8k(&vec![1.0; 512]);
            check_dot(fmt, 512, &q, &a, &format!("constant {c}"));
        }
    }
}

#[test]
fn dots_agree_on_random_rows() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0002);
    for fmt in &FMTS {
        for &n in &LENS {
            for row in 0..6 {
                let x = gaussian(&mut rng, n, [1.0, 0.05, 8.0][row % 3]);
                let mut y = gaussian(&mut rng, n, [1.0, 3.0][row % 2]);
                if row == 5 {
                    // Outliers in the activations, as real hidden states have.
                    for i in (0..n).step_by(97) {
                        y[i] *= 40.0;
                    }
                }
                let w = (fmt.quantize)(&x);
                let a = quantize_q8k(&y);
                check_dot(fmt, n, &w, &a, &format!("row {row}"));
            }
        }
    }
}

/// Fills a weight block with random bytes, then sane (finite, positive) f16 scales.
fn random_block_bytes(rng: &mut StdRng, ty: WeightType, nb: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut w: Vec<u8> = (0..nb * bb).map(|_| rng.random()).collect();
    for b in w.chunks_exact_mut(bb) {
        let d = half::f16::from_f32(rng.random_range(1e-4f32..1e-1)).to_le_bytes();
        let dmin = half::f16::from_f32(rng.random_range(1e-4f32..1e-1)).to_le_bytes();
        match ty {
            WeightType::Q4_K | WeightType::Q5_K => {
                b[0..2].copy_from_slice(&d);
                b[2..4].copy_from_slice(&dmin);
            }
            WeightType::Q6_K => b[bb - 2..].copy_from_slice(&d),
            _ => unreachable!(),
        }
    }
    w
}

fn random_q8k(rng: &mut StdRng, nb: usize, extreme: bool) -> Vec<u8> {
    let mut a = vec![0u8; nb * ActType::Q8_K.block_bytes()];
    let blocks: &mut [BlockQ8K] = bytemuck::cast_slice_mut(&mut a);
    for b in blocks {
        for q in b.qs.iter_mut() {
            *q = if extreme { [-128, 127][rng.random_range(0..2)] } else { rng.random() };
        }
        fill_bsums(b);
        b.d = rng.random_range(1e-3f32..1.0).to_le_bytes();
    }
    a
}

#[test]
fn dots_agree_on_random_block_bytes() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0003);
    for fmt in &FMTS {
        for &n in &LENS {
            for row in 0..8 {
                let w = random_block_bytes(&mut rng, fmt.ty, n / QK_K);
                let a = random_q8k(&mut rng, n / QK_K, row % 4 == 3);
                check_dot(fmt, n, &w, &a, &format!("random bytes {row}"));
            }
        }
    }
    // Largest quants against saturated activations: the i16 pair sums must not saturate.
    for fmt in &FMTS {
        let mut w = random_block_bytes(&mut rng, fmt.ty, 2);
        let bb = fmt.ty.block_bytes();
        for b in w.chunks_exact_mut(bb) {
            let (lo, hi) = if fmt.ty == WeightType::Q6_K { (0, bb - 2 - 16) } else { (4, bb) };
            b[lo..hi].fill(0xFF);
        }
        let mut a = vec![0u8; 2 * ActType::Q8_K.block_bytes()];
        for (k, b) in bytemuck::cast_slice_mut::<u8, BlockQ8K>(&mut a).iter_mut().enumerate() {
            b.qs.fill(if k == 0 { -128 } else { 127 });
            fill_bsums(b);
            b.d = 0.5f32.to_le_bytes();
        }
        check_dot(fmt, 512, &w, &a, "saturation");
    }
}

fn model_path() -> std::path::PathBuf {
    std::env::var_os("SIFT_TEST_GGUF").map(Into::into).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    })
}

#[test]
fn dots_agree_on_real_weights() {
    let path = model_path();
    assert!(path.exists(), "{} missing: run scripts/fetch-model.sh qwen2.5-0.5b first", path.display());
    let file = sift_gguf::GgufFile::open(&path).expect("open model");
    let mut rng = StdRng::seed_from_u64(0x5eed_0004);
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for t in &file.gguf.tensors {
        let Some(ty) = WeightType::from_ggml_id(t.ty.id()) else { continue };
        let Some(fmt) = FMTS.iter().find(|f| f.ty == ty) else { continue };
        let n = t.dims[0] as usize;
        let rows = t.n_rows() as usize;
        let row_bytes = ty.row_bytes(n).expect("K-quant row is whole blocks");
        let data = file.tensor_bytes(&t.name).expect("tensor data");
        assert_eq!(data.len(), rows * row_bytes, "{}", t.name);
        *seen.entry(ty.name()).or_default() += 1;
        for r in [0, rows / 3, rows / 2 + 1, rows - 1] {
            let w = &data[r * row_bytes..(r + 1) * row_bytes];
            let a = quantize_q8k(&gaussian(&mut rng, n, 1.0));
            check_dot(fmt, n, w, &a, &format!("{} row {r}", t.name));
        }
    }
    eprintln!("checked K-quant tensors: {seen:?}");
    assert!(seen.contains_key("Q4_K") && seen.contains_key("Q6_K"), "expected Q4_K and Q6_K tensors, saw {seen:?}");
}

/// Throughput of one matrix-vector product (896 rows × 4864) per ISA, in GB/s of weight bytes.
#[test]
#[ignore = "benchmark; run with --release -- --ignored --nocapture"]
fn throughput() {
    // SIFT_BENCH_ROWS=128 (say) measures a matrix that stays in L2.
    let rows: usize = std::env::var("SIFT_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(896);
    let n = 4864usize;
    let mut rng = StdRng::seed_from_u64(0x5eed_0005);
    let x = gaussian(&mut rng, rows * n, 0.02);
    let a = quantize_q8k(&gaussian(&mut rng, n, 1.0));
    for fmt in &FMTS {
        let w = (fmt.quantize)(&x);
        let rb = fmt.ty.row_bytes(n).unwrap();
        for isa in Isa::available() {
            let f = fmt.ty.dot_fn_for(isa).unwrap();
            let run = || {
                let mut s = 0f32;
                for r in 0..rows {
                    s += f(n, &w[r * rb..(r + 1) * rb], &a);
                }
                std::hint::black_box(s)
            };
            run();
            // Best of many single products: robust to other processes sharing the cores.
            let trials = if isa == Isa::Scalar { 20 } else { 400 };
            let best = (0..trials)
                .map(|_| {
                    let t = std::time::Instant::now();
                    run();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            println!(
                "{} {rows}x{n} {isa:?}: {:8.1} us/matvec  {:6.2} GB/s",
                fmt.ty.name(),
                best * 1e6,
                w.len() as f64 / best / 1e9
            );
        }
    }
}
