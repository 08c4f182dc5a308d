//! Column (input-channel) sparse kernels ([`sift_quant::columns`]): three-way tests and bad input.
//!
//! - SIMD vs scalar vs f64: for every column format, every instruction set this CPU runs
//!   ([`Isa::available`]), output sizes `O` of 32, 128, 576, 896 and 4864 (plus 19200, longer than
//!   one 256-block chunk of the SIMD kernels), active sets of all columns, 75 %, 50 %, 25 %, one
//!   column and none (random, unsorted, some with repeats), full and partial output block ranges,
//!   on matrices quantized from seeded random data and on random raw block bytes (every quant bit
//!   pattern), stored at odd byte offsets, accumulated into a random non-zero `y`.
//!
//! # Tolerances
//!
//! Per output `k`, with `S_k = |y0_k| + Σ_i |coef_i · w_ik|` (`w` the dequantized weights, `y0`
//! the initial value; the natural scale of the rounding error of a sum — a relative error on the
//! result itself is meaningless where the sum cancels):
//!
//! - scalar kernel vs an f64 sum of `coef · w` on [`ColType::dequantize_col`]'s values:
//!   `≤ 10⁻⁵ · S_k` (the f32 rounding of at most a few hundred additions is ~10⁻⁶);
//! - SIMD kernel vs scalar kernel: `≤ 10⁻⁵ · S'_k`, where `S'_k` is `S_k` with, for Q4_1, each
//!   `|w|` replaced by `|d·q| + |m|`: the SIMD kernels add `coef·d·q` (one FMA, `coef·d` rounded
//!   once) and, separately, `coef·m` per block, so where `d·q` and `m` nearly cancel (a value near
//!   zero in a block with a wide range) their rounding error is relative to those two terms, not to
//!   `|w|` (for the other formats `S' = S`; the terms are only added in another order);
//! - one column with `coef = 1` into a zero `y`: every kernel gives exactly the dequantized column;
//! - batched kernel vs f64 `Σ_c x_tc · w_c` per token, and vs the one-token kernel of the same
//!   instruction set: `≤ 10⁻⁵ · S'_k` (tiles of tokens that share columns little run the
//!   one-token kernel; both paths are exercised, and the batched kernel's own dequantizers give the
//!   dequantized column bit for bit).
//!
//! Weight round trip ([`ColType::quantize_col`] then [`ColType::dequantize_col`]), per element, as
//! in `tests/legacy.rs` (`d` the stored f16 scale, `d32` the f32 one it was rounded from): Q8_0
//! `≤ d·(½ + 127·2⁻¹⁰)`; Q5_0 `≤ d·(½ + 2⁻⁶)`, or `d·(1 + 2⁻⁶)` for values GGML clamps
//! (`x/d32 > 15.5`); Q4_1 `≤ d/2 + |m|·2⁻¹⁰ + 15·d·2⁻¹⁰`; each plus `10⁻⁶·amax`. The bytes equal
//! the row quantizers' ([`scalar::quantize_row`], GGML's `quantize_row_*_ref`).
//!
//! # Errors
//!
//! The kernels panic (documented) on bad arguments, with the message of the [`ColsError`] that
//! [`check_axpy_cols`] returns; tested for every kernel: column index out of range (also huge and
//! only at the end of `active`), `coef` / `y` of the wrong length, `blocks` past the column or
//! reversed, `col_bytes` zero or not a multiple of the block size; `y` is untouched. The batched
//! kernel likewise ([`check_axpy_cols_batch`]).
//!
//! `SIFT_FORCE_SCALAR`: a child process of this test binary, run with it set, checks that
//! [`Isa::detect`] is scalar and that every request, even for AVX-512, gets the scalar kernel.

use half::f16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sift_quant::columns::ColsError;
use sift_quant::{
    axpy_cols_batch, axpy_cols_fn, check_axpy_cols, check_axpy_cols_batch, scalar, AxpyColsFn, ColMatrix, ColType, Isa,
};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};

const SIZES: [usize; 5] = [32, 128, 576, 896, 4864];
const TOL: f64 = 1e-5;

fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// A random column: uniform with a per-column scale, a few outliers, sometimes an all-zero block.
fn random_col(rng: &mut StdRng, n: usize) -> Vec<f32> {
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

/// A transposed matrix of `n_cols` columns of `o` values, at byte offset `off` of its buffer,
/// with the dequantized columns.
struct Mat {
    ty: ColType,
    o: usize,
    n_cols: usize,
    buf: Vec<u8>,
    off: usize,
    deq: Vec<Vec<f32>>,
    /// Per value, the magnitude of the terms the SIMD kernels add for it: `|d·q| + |m|` for
    /// Q4_1 (which they add separately), `|w|` otherwise.
    mag: Vec<Vec<f32>>,
}

impl Mat {
    fn bytes(&self) -> &[u8] {
        &self.buf[self.off..]
    }
    fn col_bytes(&self) -> usize {
        self.ty.col_bytes(self.o)
    }

    fn from_bytes(ty: ColType, o: usize, n_cols: usize, raw: Vec<u8>, off: usize) -> Mat {
        let cb = ty.col_bytes(o);
        let mut buf = vec![0xA5u8; off];
        buf.extend_from_slice(&raw);
        let deq = (0..n_cols)
            .map(|c| {
                let mut d = vec![0f32; o];
                ty.dequantize_col(&raw[c * cb..(c + 1) * cb], &mut d);
                d
            })
            .collect::<Vec<_>>();
        let mag = if ty == ColType::Q4_1 {
            (0..n_cols)
                .map(|c| {
                    let col = &raw[c * cb..(c + 1) * cb];
                    let mut v = Vec::with_capacity(o);
                    for b in col.chunks_exact(20) {
                        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                        v.extend((0..32).map(|j| {
                            let q = if j < 16 { b[4 + j] & 0xF } else { b[4 + j - 16] >> 4 };
                            (d * q as f32).abs() + m.abs()
                        }));
                    }
                    v
                })
                .collect()
        } else {
            deq.iter().map(|c| c.iter().map(|v| v.abs()).collect()).collect()
        };
        Mat { ty, o, n_cols, buf, off, deq, mag }
    }

    /// Quantized from random f32 columns.
    fn random(rng: &mut StdRng, ty: ColType, o: usize, n_cols: usize) -> Mat {
        let cb = ty.col_bytes(o);
        let mut raw = vec![0u8; n_cols * cb];
        for c in raw.chunks_exact_mut(cb) {
            ty.quantize_col(&random_col(rng, o), c);
        }
        let off = rng.random_range(0..8);
        Mat::from_bytes(ty, o, n_cols, raw, off)
    }

    /// Random raw block bytes (every quant bit pattern) with finite scales.
    fn raw(rng: &mut StdRng, ty: ColType, o: usize, n_cols: usize) -> Mat {
        let bb = ty.block_bytes();
        let mut raw: Vec<u8> = (0..n_cols * ty.col_bytes(o)).map(|_| rng.random()).collect();
        for b in raw.chunks_exact_mut(bb) {
            let mut h = || {
                let v = rng.random_range(1e-4f32..1e-1) * if rng.random_bool(0.5) { -1.0 } else { 1.0 };
                f16::from_f32(v).to_le_bytes()
            };
            b[0..2].copy_from_slice(&h());
            if ty == ColType::Q4_1 {
                b[2..4].copy_from_slice(&h());
            }
        }
        let off = rng.random_range(0..8);
        Mat::from_bytes(ty, o, n_cols, raw, off)
    }
}

/// f64 `y0 + Σ coef·w` over outputs `blocks`, the error scale `S_k` and the SIMD error scale
/// `S'_k` (see the module doc).
struct Ref {
    y: Vec<f64>,
    s: Vec<f64>,
    s_simd: Vec<f64>,
}

fn reference(m: &Mat, active: &[u32], coef: &[f32], blocks: &Range<usize>, y0: &[f32]) -> Ref {
    let r = 32 * blocks.start..32 * blocks.end;
    let mut y: Vec<f64> = y0.iter().map(|&v| v as f64).collect();
    let mut s: Vec<f64> = y0.iter().map(|&v| (v as f64).abs()).collect();
    let mut s_simd = s.clone();
    for (&c, &a) in active.iter().zip(coef) {
        let (w, mag) = (&m.deq[c as usize][r.clone()], &m.mag[c as usize][r.clone()]);
        for (k, (&w, &mag)) in w.iter().zip(mag).enumerate() {
            y[k] += a as f64 * w as f64;
            s[k] += (a as f64 * w as f64).abs();
            s_simd[k] += (a as f64).abs() * mag as f64;
        }
    }
    Ref { y, s, s_simd }
}

fn run(f: AxpyColsFn, m: &Mat, active: &[u32], coef: &[f32], blocks: &Range<usize>, y0: &[f32]) -> Vec<f32> {
    let mut y = y0.to_vec();
    f(m.bytes(), m.col_bytes(), active, coef, blocks.clone(), &mut y);
    y
}

fn check_close(what: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (k, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(err <= tol * s + 1e-30, "{what}: output {k}: got {g}, want {w}, error {err:e} > {tol:e} * {s:e}");
    }
}

/// Active sets: all columns shuffled, 75 %, 50 %, 25 %, one column, none, and one with repeats.
fn active_sets(rng: &mut StdRng, n_cols: usize) -> Vec<(String, Vec<u32>)> {
    let mut all: Vec<u32> = (0..n_cols as u32).collect();
    all.shuffle(rng);
    let mut sets = vec![("all".to_string(), all.clone())];
    for pct in [75, 50, 25] {
        let mut s = all.clone();
        s.shuffle(rng);
        s.truncate(n_cols * pct / 100);
        sets.push((format!("{pct}%"), s));
    }
    sets.push(("one".to_string(), vec![rng.random_range(0..n_cols as u32)]));
    sets.push(("none".to_string(), vec![]));
    let rep: Vec<u32> = (0..n_cols.min(9)).map(|_| rng.random_range(0..n_cols as u32)).collect();
    sets.push(("repeats".to_string(), rep));
    sets
}

/// Full range, first block, last block, a random middle range, and empty.
fn block_ranges(rng: &mut StdRng, nb: usize) -> Vec<Range<usize>> {
    let e = nb.min(3);
    let mut r = vec![0..nb, 0..1, nb - 1..nb, e..e];
    if nb > 2 {
        let a = rng.random_range(1..nb - 1);
        let b = rng.random_range(a + 1..nb);
        r.push(a..b);
    }
    r
}

fn coefs(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0) * 10f32.powf(rng.random_range(-2.0..1.0))).collect()
}

/// Every kernel against the scalar kernel against f64, on one matrix.
fn three_way(rng: &mut StdRng, m: &Mat, label: &str) {
    let nb = m.o / 32;
    let kernels: Vec<(Isa, AxpyColsFn)> = Isa::available().into_iter().map(|i| (i, axpy_cols_fn(m.ty, i))).collect();
    let scalar_k = axpy_cols_fn(m.ty, Isa::Scalar);
    for (set_name, active) in active_sets(rng, m.n_cols) {
        let coef = coefs(rng, active.len());
        for blocks in block_ranges(rng, nb) {
            let y0: Vec<f32> = (0..32 * blocks.len()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let what = format!("{} {label} O={} I={} active {set_name} blocks {blocks:?}", m.ty.name(), m.o, m.n_cols);
            let r = reference(m, &active, &coef, &blocks, &y0);
            let ys = run(scalar_k, m, &active, &coef, &blocks, &y0);
            check_close(&format!("{what}: scalar vs f64"), &ys, &r.y, &r.s, TOL);
            let ys64: Vec<f64> = ys.iter().map(|&v| v as f64).collect();
            for &(isa, f) in &kernels {
                let yk = run(f, m, &active, &coef, &blocks, &y0);
                check_close(&format!("{what}: {isa:?} vs scalar"), &yk, &ys64, &r.s_simd, TOL);
                if active.is_empty() || blocks.is_empty() {
                    assert_eq!(yk, y0, "{what}: {isa:?}: nothing to add must leave y as it was");
                }
            }
        }
    }
}

#[test]
fn simd_scalar_f64_quantized() {
    let mut rng = StdRng::seed_from_u64(1);
    for ty in ColType::ALL {
        for o in SIZES {
            for n_cols in [1, 7, 61] {
                let m = Mat::random(&mut rng, ty, o, n_cols);
                three_way(&mut rng, &m, "quantized");
            }
        }
    }
}

#[test]
fn simd_scalar_f64_raw_bytes() {
    let mut rng = StdRng::seed_from_u64(2);
    for ty in ColType::ALL {
        for o in SIZES {
            let m = Mat::raw(&mut rng, ty, o, 23);
            three_way(&mut rng, &m, "raw");
        }
    }
}

/// Many columns (every group remainder of the SIMD kernels, prefetch of later groups) and columns
/// longer than one 256-block chunk (ranges crossing chunk ends).
#[test]
fn many_columns_and_long_columns() {
    let mut rng = StdRng::seed_from_u64(3);
    for ty in ColType::ALL {
        for n_cols in [4, 5, 6, 7, 8, 9, 203] {
            let m = Mat::random(&mut rng, ty, 32, n_cols);
            three_way(&mut rng, &m, "many");
        }
        let m = Mat::random(&mut rng, ty, 19200, 10);
        let kernels: Vec<(Isa, AxpyColsFn)> = Isa::available().into_iter().map(|i| (i, axpy_cols_fn(ty, i))).collect();
        for blocks in [0..600, 255..257, 100..530, 256..512, 511..600] {
            let active: Vec<u32> = vec![3, 9, 0, 4, 4, 7, 1];
            let coef = coefs(&mut rng, active.len());
            let y0: Vec<f32> = (0..32 * blocks.len()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let r = reference(&m, &active, &coef, &blocks, &y0);
            for &(isa, f) in &kernels {
                let y = run(f, &m, &active, &coef, &blocks, &y0);
                check_close(&format!("{} O=19200 {blocks:?} {isa:?}", ty.name()), &y, &r.y, &r.s_simd, TOL);
            }
        }
    }
}

/// One column with `coef = 1` into a zero `y` is the dequantized column, bit for bit, for every
/// kernel (the SIMD kernels compute `d·q` (+ `m`) with the same roundings).
#[test]
fn one_column_is_dequantization() {
    let mut rng = StdRng::seed_from_u64(4);
    for ty in ColType::ALL {
        for o in SIZES {
            let m = Mat::raw(&mut rng, ty, o, 5);
            for isa in Isa::available() {
                let f = axpy_cols_fn(ty, isa);
                for c in 0..5u32 {
                    let y = run(f, &m, &[c], &[1.0], &(0..o / 32), &vec![0.0; o]);
                    assert_eq!(y, m.deq[c as usize], "{} O={o} column {c} {isa:?}", ty.name());
                }
            }
        }
    }
}

/// The SIMD kernels are really SIMD where the CPU has them (so the tests above test them), and
/// the dispatch clamps to what the CPU runs.
#[test]
fn dispatch() {
    for ty in ColType::ALL {
        let sc = axpy_cols_fn(ty, Isa::Scalar) as usize;
        for isa in Isa::available() {
            let f = axpy_cols_fn(ty, isa) as usize;
            assert_eq!(f == sc, isa == Isa::Scalar, "{} {isa:?}", ty.name());
        }
        assert_eq!(axpy_cols_fn(ty, Isa::Avx512Vnni) as usize, axpy_cols_fn(ty, Isa::detect()) as usize);
        assert_eq!(ty.axpy_fn() as usize, axpy_cols_fn(ty, Isa::detect()) as usize);
        assert_eq!(ColType::from_name(ty.name()), Some(ty));
        assert_eq!(ColType::from_name(&ty.name().to_lowercase()), Some(ty));
        assert_eq!(ColType::from_weight_type(ty.weight_type()), Some(ty));
        assert_eq!(ty.block_bytes(), ty.weight_type().block_bytes());
        assert_eq!(ty.col_bytes(4864), ty.weight_type().row_bytes(4864).unwrap());
    }
    assert_eq!(ColType::from_name("Q4_0"), None);
    assert_eq!(ColType::Q4_1.col_bytes(896), 28 * 20);
    assert_eq!(ColType::Q5_0.col_bytes(64), 44);
    assert_eq!(ColType::Q8_0.col_bytes(32), 34);
}

#[test]
fn quantize_round_trip() {
    let mut rng = StdRng::seed_from_u64(5);
    for ty in ColType::ALL {
        for o in SIZES {
            for _ in 0..4 {
                let x = random_col(&mut rng, o);
                let mut q = vec![0u8; ty.col_bytes(o)];
                ty.quantize_col(&x, &mut q);
                assert_eq!(q, scalar::quantize_row(ty.weight_type(), &x), "{} O={o}: row quantizer bytes", ty.name());
                let mut back = vec![0f32; o];
                ty.dequantize_col(&q, &mut back);
                let bb = ty.block_bytes();
                for (bi, (xb, b)) in x.chunks_exact(32).zip(q.chunks_exact(bb)).enumerate() {
                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let d = f16_at(b, 0).abs();
                    let max = xb.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                    for (j, &v) in xb.iter().enumerate() {
                        let bound = 1e-6 * amax
                            + match ty {
                                ColType::Q8_0 => d * (0.5 + 127.0 * 2f32.powi(-10)),
                                ColType::Q5_0 => {
                                    let d32 = max / -16.0;
                                    let clamped = d32 != 0.0 && v / d32 > 15.5;
                                    d * (if clamped { 1.0 } else { 0.5 } + 2f32.powi(-6))
                                }
                                ColType::Q4_1 => {
                                    let m = f16_at(b, 2);
                                    0.5 * d + m.abs() * 2f32.powi(-10) + 15.0 * d * 2f32.powi(-10)
                                }
                            };
                        let e = (back[32 * bi + j] - v).abs();
                        assert!(
                            e <= bound,
                            "{} O={o} block {bi} elem {j}: x {v}, got {}, error {e} > {bound}",
                            ty.name(),
                            back[32 * bi + j]
                        );
                    }
                }
            }
        }
        // An all-zero column round-trips exactly.
        let mut q = vec![0u8; ty.col_bytes(64)];
        ty.quantize_col(&[0.0; 64], &mut q);
        let mut back = vec![1f32; 64];
        ty.dequantize_col(&q, &mut back);
        assert!(back.iter().all(|&v| v == 0.0), "{}: zero column", ty.name());
    }
}

fn panic_message(r: std::thread::Result<()>) -> String {
    match r {
        Ok(()) => panic!("expected a panic"),
        Err(e) => e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    }
}

/// A bad call: name, `active`, `coef`, `blocks`, `col_bytes`, `y.len()`, the expected error.
type BadCase = (&'static str, Vec<u32>, Vec<f32>, Range<usize>, usize, usize, ColsError);

// (The expected panics' messages go to the test harness's captured output.)
#[test]
fn bad_arguments_panic_before_touching_anything() {
    let mut rng = StdRng::seed_from_u64(6);
    for ty in ColType::ALL {
        let m = Mat::random(&mut rng, ty, 128, 6);
        let (cols, cb) = (m.bytes(), m.col_bytes());
        let cases: Vec<BadCase> = vec![
            ("index", vec![0, 6], vec![1.0; 2], 0..4, cb, 128, ColsError::Index { index: 6, n_cols: 6 }),
            (
                "late huge index",
                vec![1, 2, 3, 4, 5, 0, 1, u32::MAX],
                vec![1.0; 8],
                0..4,
                cb,
                128,
                ColsError::Index { index: u32::MAX, n_cols: 6 },
            ),
            ("coef", vec![0, 1], vec![1.0; 3], 0..4, cb, 128, ColsError::Len { what: "coef", expected: 2, got: 3 }),
            ("y", vec![0, 1], vec![1.0; 2], 0..4, cb, 96, ColsError::Len { what: "y", expected: 128, got: 96 }),
            ("blocks", vec![0], vec![1.0], 2..5, cb, 96, ColsError::Blocks { start: 2, end: 5, col_blocks: 4 }),
            #[allow(clippy::reversed_empty_ranges)]
            ("reversed", vec![0], vec![1.0], 3..2, cb, 0, ColsError::Blocks { start: 3, end: 2, col_blocks: 4 }),
            ("col_bytes", vec![0], vec![1.0], 0..1, cb + 1, 32, ColsError::ColBytes { ty, col_bytes: cb + 1 }),
            ("zero col_bytes", vec![], vec![], 0..0, 0, 0, ColsError::ColBytes { ty, col_bytes: 0 }),
        ];
        for (name, active, coef, blocks, col_bytes, y_len, err) in cases {
            assert_eq!(
                check_axpy_cols(ty, cols, col_bytes, &active, &coef, &blocks, y_len),
                Err(err.clone()),
                "{} {name}",
                ty.name()
            );
            for isa in Isa::available() {
                let f = axpy_cols_fn(ty, isa);
                let mut y = vec![7.0f32; y_len];
                let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
                    f(cols, col_bytes, &active, &coef, blocks.clone(), &mut y)
                })));
                assert_eq!(msg, err.to_string(), "{} {name} {isa:?}", ty.name());
                assert!(y.iter().all(|&v| v == 7.0), "{} {name} {isa:?}: y was written", ty.name());
            }
        }
        // A buffer holding a partial column: only whole columns count.
        let short = &cols[..6 * cb - 1];
        assert_eq!(
            check_axpy_cols(ty, short, cb, &[5], &[1.0], &(0..4), 128),
            Err(ColsError::Index { index: 5, n_cols: 5 })
        );
        assert!(check_axpy_cols(ty, short, cb, &[4], &[1.0], &(0..4), 128).is_ok());
    }
    assert!(ColsError::Index { index: 9, n_cols: 3 }.to_string().contains("column index 9 out of range"));
}

#[test]
#[should_panic(expected = "column index 10 out of range (the matrix has 2 columns)")]
fn out_of_range_index_panics_with_message() {
    let ty = ColType::Q8_0;
    let cols = vec![0u8; 2 * ty.col_bytes(64)];
    let mut y = vec![0f32; 64];
    ty.axpy_fn()(&cols, ty.col_bytes(64), &[1, 10], &[1.0, 1.0], 0..2, &mut y);
}

#[test]
#[should_panic(expected = "quantize_col: Q4_1 column of 64 values is 40 bytes")]
fn quantize_col_wrong_output_length_panics() {
    ColType::Q4_1.quantize_col(&[0.0; 64], &mut [0u8; 41]);
}

// ---------------------------------------------------------------------------------------------
// Batched kernel
// ---------------------------------------------------------------------------------------------

/// `n_tok` input rows of `n_cols`, each with roughly `density` non-zeros; column `dead` is zero in
/// every row.
fn sparse_inputs(rng: &mut StdRng, n_tok: usize, n_cols: usize, density: f64, dead: usize) -> Vec<f32> {
    let mut x = vec![0f32; n_tok * n_cols];
    for t in 0..n_tok {
        for c in 0..n_cols {
            if c != dead && rng.random_bool(density) {
                x[t * n_cols + c] = rng.random_range(-2.0f32..2.0);
            }
        }
    }
    x
}

#[test]
fn batch_matches_f64_and_per_token() {
    let mut rng = StdRng::seed_from_u64(7);
    for ty in ColType::ALL {
        for (o, n_cols, n_tok, density) in [
            (32, 5, 1, 1.0),
            (128, 9, 3, 0.5),
            (576, 40, 7, 0.3),
            (4864, 12, 40, 0.6),
            (576, 30, 300, 0.4),
            (160, 150, 70, 0.5),
            (128, 9, 64, 0.9),
        ] {
            let m = Mat::random(&mut rng, ty, o, n_cols);
            let cm = ColMatrix::new(ty, m.bytes(), o, n_cols).unwrap();
            let x = sparse_inputs(&mut rng, n_tok, n_cols, density, n_cols / 2);
            let nb = o / 32;
            for blocks in [0..nb, nb / 2..nb, 0..1] {
                let width = 32 * blocks.len();
                let stride = width + 13;
                let y0: Vec<f32> = (0..stride * n_tok).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                for isa in Isa::available() {
                    let mut y = y0.clone();
                    axpy_cols_batch(&cm, &x, n_tok, blocks.clone(), &mut y, stride, isa);
                    let axpy = axpy_cols_fn(ty, isa);
                    for t in 0..n_tok {
                        let xr = &x[t * n_cols..(t + 1) * n_cols];
                        let active: Vec<u32> = (0..n_cols as u32).filter(|&c| xr[c as usize] != 0.0).collect();
                        let coef: Vec<f32> = active.iter().map(|&c| xr[c as usize]).collect();
                        let row0 = &y0[t * stride..t * stride + width];
                        let r = reference(&m, &active, &coef, &blocks, row0);
                        let what = format!("{} O={o} I={n_cols} tok {t}/{n_tok} {blocks:?} {isa:?}", ty.name());
                        check_close(&format!("batch {what}"), &y[t * stride..t * stride + width], &r.y, &r.s_simd, TOL);
                        // Padding between rows untouched.
                        assert_eq!(&y[t * stride + width..(t + 1) * stride], &y0[t * stride + width..(t + 1) * stride]);
                        let yt = run(axpy, &m, &active, &coef, &blocks, row0);
                        let yt64: Vec<f64> = yt.iter().map(|&v| v as f64).collect();
                        let yb = &y[t * stride..t * stride + width];
                        check_close(&format!("batch vs axpy {what}"), yb, &yt64, &r.s_simd, TOL);
                    }
                }
            }
        }
    }
}

/// One token with a single input of 1 into a zero `y` gives the dequantized column, bit for bit
/// (the batched kernel's SIMD dequantizers match [`ColType::dequantize_col`] exactly).
#[test]
fn batch_one_hot_is_dequantization() {
    let mut rng = StdRng::seed_from_u64(8);
    for ty in ColType::ALL {
        for o in [32, 160, 4864] {
            let m = Mat::raw(&mut rng, ty, o, 70);
            let cm = ColMatrix::new(ty, m.bytes(), o, 70).unwrap();
            for c in [0, 33, 69] {
                // Twenty tokens share the column (so the batched kernel dequantizes it), and one
                // token alone (the one-token kernel's path).
                for n_tok in [20, 1] {
                    let mut x = vec![0f32; 70 * n_tok];
                    for t in 0..n_tok {
                        x[t * 70 + c] = 1.0;
                    }
                    for isa in Isa::available() {
                        let mut y = vec![0f32; o * n_tok];
                        axpy_cols_batch(&cm, &x, n_tok, 0..o / 32, &mut y, o, isa);
                        for t in 0..n_tok {
                            assert_eq!(&y[t * o..(t + 1) * o], m.deq[c], "{} O={o} column {c} {isa:?}", ty.name());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn batch_bad_arguments() {
    let ty = ColType::Q5_0;
    let data = vec![0u8; 3 * ty.col_bytes(64)];
    let m = ColMatrix::new(ty, &data, 64, 3).unwrap();
    assert!(ColMatrix::new(ty, &data, 64, 4).is_err());
    assert!(ColMatrix::new(ty, &data, 60, 3).is_err());
    let x = vec![1f32; 6];
    assert!(check_axpy_cols_batch(&m, &x, 2, &(0..2), 64 + 64, 64).is_ok());
    assert!(check_axpy_cols_batch(&m, &x, 2, &(0..2), 64 + 63, 64).is_err(), "y too short");
    assert!(check_axpy_cols_batch(&m, &x, 2, &(0..2), 200, 63).is_err(), "stride shorter than a row");
    assert!(check_axpy_cols_batch(&m, &x[..5], 2, &(0..2), 128, 64).is_err(), "x length");
    assert!(check_axpy_cols_batch(&m, &x, 2, &(1..3), 128, 64).is_err(), "blocks past the column");
    let bad = ColMatrix { n_cols: 4, ..m };
    assert!(check_axpy_cols_batch(&bad, &[1.0; 8], 2, &(0..2), 128, 64).is_err(), "data shorter than n_cols");
    for isa in Isa::available() {
        let mut y = vec![0f32; 127];
        let msg = panic_message(catch_unwind(AssertUnwindSafe(|| axpy_cols_batch(&m, &x, 2, 0..2, &mut y, 64, isa))));
        assert!(msg.contains("y has length 127, need at least 128"), "{isa:?}: {msg}");
    }
}

// ---------------------------------------------------------------------------------------------
// SIFT_FORCE_SCALAR
// ---------------------------------------------------------------------------------------------

/// Runs only in the child process of [`force_scalar`] (a no-op otherwise).
#[test]
fn force_scalar_child() {
    if std::env::var_os("SIFT_FORCE_SCALAR_CHILD").is_none() {
        return;
    }
    assert_eq!(Isa::detect(), Isa::Scalar);
    assert_eq!(Isa::available(), vec![Isa::Scalar]);
    for ty in ColType::ALL {
        let sc = axpy_cols_fn(ty, Isa::Scalar) as usize;
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            assert_eq!(axpy_cols_fn(ty, isa) as usize, sc, "{} {isa:?}", ty.name());
        }
    }
    println!("force-scalar child ok");
}

#[test]
fn force_scalar() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "force_scalar_child", "--nocapture", "--test-threads=1"])
        .env("SIFT_FORCE_SCALAR", "1")
        .env("SIFT_FORCE_SCALAR_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("force-scalar child ok"), "child did not run the checks:\n{stdout}");
}
