//! Exact columns ([`sift_quant::exact`]): the transposed layout against the source rows, and the
//! column kernels three ways.
//!
//! - Layout: for every format with an exact layout, a tensor quantized from seeded random data is
//!   transposed; every column, dequantized ([`ExactFormat::dequantize_col`]), equals the source
//!   rows' values ([`WeightType::dequantize_row`]) **bit for bit** (the same f32 products GGML's
//!   dequantizers compute).
//! - Kernels: scalar and every SIMD kernel this CPU runs vs an f64 sum of `coef · w` over the
//!   dequantized columns, for all / 50 % / 10 % / one / no active columns (ascending, as selectors
//!   give them; and an unsorted list with repeats), whole and partial output ranges, columns reached
//!   through a permuted slot index (as from a cache). Tolerance per output `k`:
//!   `≤ 2·10⁻⁵ · S_k`, `S_k = |y0_k| + Σ_i |coef_i|·(|a·(q − zero)| + |b|)`: the kernels sum
//!   `coef · q` per run then scale, so rounding is relative to the two terms of each weight.
//! - Batch kernel vs the one-token scalar kernel per token, same tolerance.
//! - Pieces: one call with one output per piece of [`RUN_BREAK`] entries gives, bit for bit, what
//!   one call per piece gives, for every kernel.
//! - AVX-512 vs AVX2, bit for bit (the same operations per lane in the same order), where the CPU
//!   runs both.
//! - Bad arguments panic with the checker's message, before anything is written.

use sift_quant::exact::{
    axpy_exact_f32_fn, axpy_exact_scalar, check_axpy_exact, piece_count, ExactFormat, ExactMatrix, RUN_BREAK,
};
use sift_quant::exact_q8::{
    axpy_exact_q8_fn, axpy_exact_q8_scalar, axpy_exact_tokens_fn, axpy_exact_tokens_q8_scalar, check_axpy_exact_tokens,
    group_scales, quantize_group, ExactAxpyTokensFn,
};
use sift_quant::{axpy_exact_batch, axpy_exact_fn, scalar, ColFormat, ExactAxpyFn, Isa, WeightType};

/// Every source format with an exact layout, each in its own layout and, for the 5- and 6-bit
/// ones, also in the wide one ([`ExactFormat::wide`]).
fn formats() -> Vec<ExactFormat> {
    let narrow = FORMATS.map(|t| ExactFormat::of(t).unwrap());
    narrow.into_iter().chain(FORMATS.into_iter().filter_map(ExactFormat::wide)).collect()
}

const FORMATS: [WeightType; 7] = [
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q8_0,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A random `n_out × n_in` tensor in `f`'s source format, its dequantized rows, and its exact
/// columns in layout `f`.
fn tensor(f: ExactFormat, n_out: usize, n_in: usize, seed: u64) -> (Vec<f32>, Vec<u8>, Vec<u8>) {
    let t = f.src;
    let mut rng = Rng(seed);
    let mut rows = Vec::new();
    for r in 0..n_out {
        // Rows of different magnitudes, some with an offset (Q4_1 / K-quant minimums matter).
        let scale = 0.01 + (r % 7) as f32 * 0.3;
        let off = if r % 3 == 0 { 0.5 } else { 0.0 };
        let x: Vec<f32> = (0..n_in).map(|_| rng.f() * scale + off).collect();
        rows.extend(scalar::quantize_row(t, &x));
    }
    let mut dense = vec![0f32; n_out * n_in];
    let rb = rows.len() / n_out;
    for r in 0..n_out {
        t.dequantize_row(&rows[r * rb..(r + 1) * rb], &mut dense[r * n_in..(r + 1) * n_in]);
    }
    let (cols, scales) = f.transpose(&rows, n_out, n_in);
    (dense, cols, scales)
}

#[test]
fn columns_hold_the_source_weights_bit_for_bit() {
    for f in formats() {
        let t = f.name();
        let (n_out, n_in) = (96, 512);
        let (dense, cols, scales) = tensor(f, n_out, n_in, 7);
        assert_eq!(cols.len(), f.col_bytes(n_out) * n_in);
        assert_eq!(scales.len(), f.scale_bytes(n_out, n_in));
        let cb = f.col_bytes(n_out);
        let mut col = vec![0f32; n_out];
        for c in 0..n_in {
            f.dequantize_col(&cols[c * cb..(c + 1) * cb], &scales, c, &mut col);
            for r in 0..n_out {
                assert_eq!(col[r].to_bits(), dense[r * n_in + c].to_bits(), "{t:?} row {r} col {c}");
            }
        }
    }
}

#[test]
fn exact_sizes_match_the_source() {
    // Bytes per weight: the legacy formats keep theirs; K-quants' 6-bit sub-scales become bytes.
    let bpw = |t: WeightType| {
        let f = ExactFormat::of(t).unwrap();
        (f.col_bytes(256) * 256 + f.scale_bytes(256, 256)) as f64 * 8.0 / (256.0 * 256.0)
    };
    assert_eq!(bpw(WeightType::Q4_0), 4.5);
    assert_eq!(bpw(WeightType::Q4_1), 5.0);
    assert_eq!(bpw(WeightType::Q5_0), 5.5);
    assert_eq!(bpw(WeightType::Q8_0), 8.5);
    assert_eq!(bpw(WeightType::Q4_K), 4.625);
    assert_eq!(bpw(WeightType::Q5_K), 5.625);
    assert_eq!(bpw(WeightType::Q6_K), 6.5625);
}

#[test]
fn wide_layouts_exist_only_for_5_and_6_bit_sources() {
    for t in [WeightType::Q4_0, WeightType::Q4_1, WeightType::Q4_K, WeightType::Q8_0, WeightType::F16] {
        assert_eq!(ExactFormat::wide(t), None, "{t:?}");
        // A pack naming one is refused (its table of contents fails to parse, naming the format).
        assert_eq!(ColFormat::from_name(&format!("exact8:{}", t.name())), None, "{t:?}");
    }
    assert_eq!(ExactFormat::of(WeightType::Q8_0).unwrap().name(), "exact:Q8_0");
    assert_eq!(ExactFormat::wide(WeightType::Q6_K).unwrap().name(), "exact8:Q6_K");
}

#[test]
fn wide_layouts_give_the_narrow_results_bit_for_bit() {
    // The same integers and scales in bytes: every kernel gives what it gives on the narrow layout.
    let mut rng = Rng(57);
    for t in [WeightType::Q5_0, WeightType::Q5_K, WeightType::Q6_K] {
        let (narrow, wide) = (ExactFormat::of(t).unwrap(), ExactFormat::wide(t).unwrap());
        assert!(wide.is_wide() && !narrow.is_wide() && wide.q_max() == narrow.q_max());
        assert_eq!(wide.col_bytes(64), 64);
        assert_eq!(ColFormat::from_name(&wide.name()), Some(ColFormat::Exact(wide)), "{}", wide.name());
        assert_eq!(ColFormat::from_name(&narrow.name()), Some(ColFormat::Exact(narrow)), "{}", narrow.name());
        let (n_out, n_in) = (160, 512);
        let (_, nc, ns) = tensor(narrow, n_out, n_in, 8);
        let (_, wc, ws) = tensor(wide, n_out, n_in, 8);
        assert_eq!(ns, ws, "{t:?}: the scale planes differ");
        let units: Vec<u32> = (0..n_in as u32).filter(|_| !rng.next().is_multiple_of(3)).collect();
        let coef: Vec<f32> = units.iter().map(|_| rng.f() * 2.0).collect();
        let isas = Isa::available();
        for ((name, kn, _), (_, kw, _)) in all_kernels(narrow, &isas).into_iter().zip(all_kernels(wide, &isas)) {
            let (mut a, mut b) = (vec![0.5f32; n_out], vec![0.5f32; n_out]);
            kn(&ExactMatrix::new(narrow, n_out, n_in, &nc, &ns), &units, &units, &coef, 0..n_out / 32, &mut a);
            kw(&ExactMatrix::new(wide, n_out, n_in, &wc, &ws), &units, &units, &coef, 0..n_out / 32, &mut b);
            let same = a.iter().zip(&b).all(|(x, z)| x.to_bits() == z.to_bits());
            assert!(same, "{t:?} {name}: the wide layout's result differs");
        }
    }
}

/// Per-output bound scale `S_k` for the kernels (module docs).
fn bound(
    f: &ExactFormat,
    cols: &[u8],
    scales: &[u8],
    n_out: usize,
    units: &[u32],
    coef: &[f32],
    y0: &[f32],
) -> Vec<f64> {
    weighted_sum(f, cols, scales, n_out, units, coef, y0)
}

/// `|y0_k| + Σ_i |coef_i|·(|a·(q − zero)| + |b|)` per output `k`.
fn weighted_sum(
    f: &ExactFormat,
    cols: &[u8],
    scales: &[u8],
    n_out: usize,
    units: &[u32],
    coef: &[f32],
    y0: &[f32],
) -> Vec<f64> {
    let cb = f.col_bytes(n_out);
    let mut s: Vec<f64> = y0.iter().map(|v| v.abs() as f64).collect();
    let mut q = vec![0f32; n_out];
    for (&u, &c) in units.iter().zip(coef) {
        // |a·(q − zero)| + |b|, from the dequantized value and the offset.
        f.dequantize_col(&cols[u as usize * cb..(u as usize + 1) * cb], scales, u as usize, &mut q);
        for (r, sv) in s.iter_mut().enumerate() {
            let (_, b) = f.scale_of(scales, n_out, r, u as usize);
            let aq = (q[r] - b) as f64;
            *sv += (c.abs() as f64) * (aq.abs() + b.abs() as f64);
        }
    }
    s
}

/// The 8-bit kernels' extra error bound per output: each coefficient is rounded by at most half
/// its group's scale ([`group_scales`]), so `Σ_i s_i/2 · (|a·(q − zero)| + |b|)`.
fn q8_bound(f: &ExactFormat, cols: &[u8], scales: &[u8], n_out: usize, units: &[u32], coef: &[f32]) -> Vec<f64> {
    let half: Vec<f32> = group_scales(units, f, coef).iter().map(|s| s / 2.0).collect();
    weighted_sum(f, cols, scales, n_out, units, &half, &vec![0.0; n_out])
}

fn reference(
    dense: &[f32],
    n_in: usize,
    units: &[u32],
    coef: &[f32],
    rows: std::ops::Range<usize>,
    y0: &[f32],
) -> Vec<f64> {
    rows.enumerate()
        .map(|(k, r)| {
            y0[k] as f64
                + units.iter().zip(coef).map(|(&u, &c)| c as f64 * dense[r * n_in + u as usize] as f64).sum::<f64>()
        })
        .collect()
}

/// Every kernel this CPU runs for `f`: `(name, kernel, has 8-bit coefficients)`.
fn all_kernels(f: ExactFormat, isas: &[Isa]) -> Vec<(String, ExactAxpyFn, bool)> {
    let mut k: Vec<(String, ExactAxpyFn, bool)> = vec![
        ("scalar".into(), axpy_exact_scalar as ExactAxpyFn, false),
        ("q8 scalar".into(), axpy_exact_q8_scalar as ExactAxpyFn, true),
    ];
    for &isa in isas {
        k.push((format!("{isa:?}"), axpy_exact_f32_fn(f, isa), false));
        if let Some(q) = axpy_exact_q8_fn(f, isa) {
            k.push((format!("q8 {isa:?}"), q, true));
        }
    }
    k
}

#[test]
fn kernels_agree_with_f64_sums() {
    let isas: Vec<Isa> = Isa::available();
    for f in formats() {
        let t = f.name();
        for &(n_out, n_in) in &[(32usize, 256usize), (128, 512), (896, 768)] {
            let (dense, cols, scales) = tensor(f, n_out, n_in, n_out as u64 * 31 + n_in as u64);
            let cb = f.col_bytes(n_out);
            // The same columns in a "cache": slot p holds column perm[p].
            let perm: Vec<usize> = (0..n_in).map(|c| (c * 7 + 3) % n_in).collect();
            let mut slots = vec![0u8; cols.len()];
            let mut slot_of = vec![0u32; n_in];
            for (p, &c) in perm.iter().enumerate() {
                slots[p * cb..(p + 1) * cb].copy_from_slice(&cols[c * cb..(c + 1) * cb]);
                slot_of[c] = p as u32;
            }
            let mut rng = Rng(99 + n_out as u64);
            let mut sets: Vec<Vec<u32>> = vec![
                (0..n_in as u32).collect(),
                (0..n_in as u32).filter(|_| rng.next().is_multiple_of(2)).collect(),
                (0..n_in as u32).filter(|_| rng.next().is_multiple_of(10)).collect(),
                vec![(n_in / 2) as u32],
                vec![],
            ];
            sets.push(vec![5, 3, 3, (n_in - 1) as u32, 0, 40]);
            for units in &sets {
                let coef: Vec<f32> = units.iter().map(|_| rng.f() * 3.0).collect();
                for chunks in [0..n_out / 32, (n_out / 32) / 2..n_out / 32] {
                    let rows = chunks.start * 32..chunks.end * 32;
                    let y0: Vec<f32> = rows.clone().map(|_| rng.f()).collect();
                    let want = reference(&dense, n_in, units, &coef, rows.clone(), &y0);
                    let s_all = bound(&f, &cols, &scales, n_out, units, &coef, &vec![0.0; n_out]);
                    for (name, data, idx) in [
                        ("tensor", &cols, units.clone()),
                        ("slots", &slots, units.iter().map(|&u| slot_of[u as usize]).collect::<Vec<u32>>()),
                    ] {
                        let m = ExactMatrix::new(f, n_out, n_in, data, &scales);
                        let q8 = q8_bound(&f, &cols, &scales, n_out, units, &coef);
                        for (kname, k, is_q8) in all_kernels(f, &isas) {
                            let mut y = y0.clone();
                            k(&m, &idx, units, &coef, chunks.clone(), &mut y);
                            for (j, r) in rows.clone().enumerate() {
                                let extra = if is_q8 { 1.0001 * q8[r] } else { 0.0 };
                                let tol = 2e-5 * (s_all[r] + y0[j].abs() as f64) + extra + 1e-30;
                                let err = (y[j] as f64 - want[j]).abs();
                                assert!(
                                    err <= tol,
                                    "{t:?} {n_out}x{n_in} {kname} {name} {} active, row {r}: {} vs {} (tol {tol})",
                                    units.len(),
                                    y[j],
                                    want[j]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs AVX-512 VNNI: .ci/run runs the avx512_ tests with --ignored where the CPU has it"]
fn avx512_gives_the_avx2_result_bit_for_bit() {
    assert!(Isa::available().contains(&Isa::Avx512Vnni), "this CPU has no AVX-512 VNNI");
    let mut rng = Rng(11);
    for f in formats() {
        let t = f.name();
        let (n_out, n_in) = (96, 1024);
        let (_, cols, scales) = tensor(f, n_out, n_in, 9);
        let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
        for keep in [1, 2, 5, 64] {
            // Runs of every length, up to whole sub-blocks and more than one group of columns.
            let units: Vec<u32> = (0..n_in as u32).filter(|_| rng.next() % 64 < keep).collect();
            let coef: Vec<f32> = units.iter().map(|_| rng.f() * 2.0).collect();
            for chunks in [0..n_out / 32, 1..2] {
                let y0: Vec<f32> = (0..32 * chunks.len()).map(|_| rng.f()).collect();
                let (mut a, mut b) = (y0.clone(), y0.clone());
                axpy_exact_f32_fn(f, Isa::Avx2)(&m, &units, &units, &coef, chunks.clone(), &mut a);
                axpy_exact_f32_fn(f, Isa::Avx512Vnni)(&m, &units, &units, &coef, chunks.clone(), &mut b);
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{t:?}, {} active, chunks {chunks:?}: AVX-512 differs from AVX2", units.len());
            }
        }
    }
}

#[test]
fn batch_kernel_agrees_with_the_one_token_kernel() {
    let wide_q6k = ExactFormat::wide(WeightType::Q6_K).unwrap();
    for f in [WeightType::Q4_1, WeightType::Q4_K, WeightType::Q6_K, WeightType::Q5_0]
        .map(|t| ExactFormat::of(t).unwrap())
        .into_iter()
        .chain([wide_q6k])
    {
        let t = f.name();
        let (n_out, n_in, n_tok) = (128, 512, 5);
        let (_, cols, scales) = tensor(f, n_out, n_in, 5);
        let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
        let mut rng = Rng(3);
        let x: Vec<f32> = (0..n_tok * n_in).map(|_| if rng.next().is_multiple_of(3) { rng.f() } else { 0.0 }).collect();
        let mut y = vec![0f32; n_tok * n_out];
        axpy_exact_batch(&m, &x, n_tok, 0..n_out / 32, &mut y, n_out);
        for tk in 0..n_tok {
            let xr = &x[tk * n_in..(tk + 1) * n_in];
            let units: Vec<u32> = (0..n_in as u32).filter(|&c| xr[c as usize] != 0.0).collect();
            let coef: Vec<f32> = units.iter().map(|&c| xr[c as usize]).collect();
            // The batch runs this CPU's one-token kernel per token: the same bits.
            let mut want = vec![0f32; n_out];
            axpy_exact_fn(f, Isa::detect())(&m, &units, &units, &coef, 0..n_out / 32, &mut want);
            for r in 0..n_out {
                let got = y[tk * n_out + r];
                assert_eq!(got.to_bits(), want[r].to_bits(), "{t:?} token {tk} row {r}: {got} vs {}", want[r]);
            }
        }
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_is_written() {
    let t = WeightType::Q4_K;
    let f = ExactFormat::of(t).unwrap();
    let (n_out, n_in) = (64, 256);
    let (_, cols, scales) = tensor(f, n_out, n_in, 1);
    let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
    let ok = check_axpy_exact(&m, &[0], &[0], &[1.0], &(0..2), 64);
    assert!(ok.is_ok());
    // (idx, units, output chunks, y length, the message).
    type Case<'a> = (&'a [u32], &'a [u32], std::ops::Range<usize>, usize, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (&[256], &[0], 0..2, 64, "column index 256 out of range"),
        (&[0], &[300], 0..2, 64, "column index 300 out of range"),
        (&[0], &[0], 0..3, 96, "output blocks 0..3"),
        (&[0], &[0], 0..2, 32, "y has length 32"),
    ];
    for (idx, units, chunks, ylen, msg) in cases {
        let e = check_axpy_exact(&m, idx, units, &[1.0], &chunks, ylen).unwrap_err().to_string();
        assert!(e.contains(msg), "{e} lacks {msg}");
        for (name, k, _) in all_kernels(f, &Isa::available()) {
            let isa = name;
            let mut y = vec![7.0f32; ylen];
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                k(&m, idx, units, &[1.0], chunks.clone(), &mut y)
            }));
            assert!(r.is_err(), "{isa:?} accepted {msg}");
            assert!(y.iter().all(|&v| v == 7.0), "{isa:?} wrote before refusing");
        }
    }
    let short = ExactMatrix { scales: &scales[..scales.len() - 1], ..m };
    assert!(check_axpy_exact(&short, &[0], &[0], &[1.0], &(0..2), 64).unwrap_err().to_string().contains("scale plane"));
}

#[test]
fn one_call_over_pieces_gives_one_call_per_piece() {
    let mut rng = Rng(31);
    for f in formats() {
        let t = f.name();
        let (n_out, n_in) = (96, 1024);
        let (_, cols, scales) = tensor(f, n_out, n_in, 17);
        let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
        // Runs that cross piece boundaries (consecutive units), and a last piece that is short.
        let units: Vec<u32> = (0..n_in as u32).filter(|_| rng.next() % 8 < 5).take(3 * RUN_BREAK + 17).collect();
        let coef: Vec<f32> = units.iter().map(|_| rng.f() * 2.0).collect();
        let pieces = piece_count(units.len());
        assert_eq!(pieces, 4);
        for (name, k, _) in &all_kernels(f, &Isa::available()) {
            for chunks in [0..n_out / 32, 1..2] {
                let width = 32 * chunks.len();
                let mut together = vec![0f32; pieces * width];
                k(&m, &units, &units, &coef, chunks.clone(), &mut together);
                for p in 0..pieces {
                    let r = p * RUN_BREAK..((p + 1) * RUN_BREAK).min(units.len());
                    let mut alone = vec![0f32; width];
                    k(&m, &units[r.clone()], &units[r.clone()], &coef[r], chunks.clone(), &mut alone);
                    let same = alone.iter().zip(&together[p * width..]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{t:?} {name} piece {p}, chunks {chunks:?}");
                }
            }
        }
    }
}

#[test]
fn q8_kernel_gives_its_scalar_reference_bit_for_bit() {
    // Every instruction set with a kernel of its own: AVX2, and AVX-512 VNNI + VBMI + BITALG
    // (an AVX-512 CPU without VBMI gets the AVX2 kernel at its level too).
    let isas: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|&i| axpy_exact_q8_fn(ExactFormat::of(WeightType::Q4_0).unwrap(), i).is_some())
        .collect();
    // Every machine sift runs its tests on has AVX2 at least.
    assert!(!isas.is_empty(), "this CPU has no 8-bit-coefficient kernel (AVX2, or AVX-512 VNNI + VBMI + BITALG)");
    let mut rng = Rng(23);
    for (isa, f) in isas.iter().flat_map(|&i| formats().into_iter().map(move |f| (i, f))) {
        let t = f.name();
        // Every format has one on both (the 8-bit format on AVX2 with 16-bit products).
        let simd = axpy_exact_q8_fn(f, isa).unwrap_or_else(|| panic!("{t:?}: no 8-bit-coefficient kernel on {isa:?}"));
        for &(n_out, n_in) in &[(32usize, 256usize), (96, 1024), (640, 512)] {
            let (_, cols, scales) = tensor(f, n_out, n_in, 3 + n_out as u64);
            let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
            let mut sets: Vec<Vec<u32>> = [1u64, 2, 5, 13, 32, 64]
                .iter()
                .map(|&keep| (0..n_in as u32).filter(|_| rng.next() % 64 < keep).collect())
                .collect();
            // Unsorted with repeats; one column 70 times (runs longer than a sub-block, cut at
            // RUN_BREAK); none.
            sets.push(vec![5, 3, 3, (n_in - 1) as u32, 0, 40, 41, 3, 200]);
            sets.push(vec![7; 70]);
            sets.push(vec![]);
            for units in &sets {
                // Coefficients of mixed magnitudes, some exactly zero.
                let coef: Vec<f32> =
                    units.iter().map(|_| if rng.next().is_multiple_of(9) { 0.0 } else { rng.f() * 4.0 }).collect();
                // Whole columns, halves, and ranges whose four-chunk steps (4-bit formats: 128
                // rows from one 64-byte line per column) leave 1-3 chunks over or start unaligned.
                let n = n_out / 32;
                for chunks in [0..n, n / 2..n, 1..n, (n / 3)..(n / 3 + 7).min(n)] {
                    let y0: Vec<f32> = (0..32 * chunks.len()).map(|_| rng.f()).collect();
                    let (mut a, mut b) = (y0.clone(), y0.clone());
                    axpy_exact_q8_scalar(&m, units, units, &coef, chunks.clone(), &mut a);
                    simd(&m, units, units, &coef, chunks.clone(), &mut b);
                    for (r, (x, z)) in a.iter().zip(&b).enumerate() {
                        assert_eq!(
                            x.to_bits(),
                            z.to_bits(),
                            "{isa:?} {t:?} {n_out}x{n_in}, {} active, chunks {chunks:?}, row {r}: {x} vs {z}",
                            units.len()
                        );
                    }
                }
            }
        }
    }
}

/// Q8_0 rows holding every byte value, −128 included (a quantizer gives −127..=127, a file may
/// hold −128): the 8-bit format's SIMD kernels (AVX2's 16-bit products, the VNNI one) give the
/// scalar reference's bits over the whole integer range.
#[test]
fn q8_kernel_covers_every_q8_0_byte() {
    let t = WeightType::Q8_0;
    let f = ExactFormat::of(t).unwrap();
    let (n_out, n_in) = (64usize, 256usize);
    let mut rows = Vec::new();
    for r in 0..n_out {
        for b in 0..n_in / 32 {
            // Q8_0: an f16 scale, then 32 signed bytes.
            rows.extend_from_slice(&half::f16::from_f32(0.01 + 0.001 * (r % 5) as f32).to_le_bytes());
            rows.extend((0..32).map(|i| ((r * 37 + b * 32 + i * 7) % 256) as u8));
        }
    }
    let (cols, scales) = f.transpose(&rows, n_out, n_in);
    let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
    let mut rng = Rng(5);
    let units: Vec<u32> = (0..n_in as u32).filter(|_| !rng.next().is_multiple_of(3)).collect();
    let coef: Vec<f32> = units.iter().map(|_| rng.f() * 3.0 - 1.5).collect();
    let mut want = vec![0f32; n_out];
    axpy_exact_q8_scalar(&m, &units, &units, &coef, 0..n_out / 32, &mut want);
    let mut tested = 0;
    for isa in Isa::available() {
        let Some(k) = axpy_exact_q8_fn(f, isa) else { continue };
        let mut got = vec![0f32; n_out];
        k(&m, &units, &units, &coef, 0..n_out / 32, &mut got);
        assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}: {want:?} vs {got:?}");
        tested += 1;
    }
    assert!(tested > 0, "a SIMD kernel for Q8_0 on this CPU");
}

#[test]
fn q8_coefficients_keep_a_nan_visible() {
    let mut c8 = [0i8; 3];
    assert_eq!(quantize_group(&[0.5, -1.27, 0.0], &mut c8), 0.01);
    assert_eq!(c8, [50, -127, 0]);
    assert_eq!(quantize_group(&[0.0, 0.0, 0.0], &mut c8), 0.0);
    assert!(quantize_group(&[1.0, f32::NAN, 2.0], &mut c8).is_nan());
    let t = WeightType::Q4_K;
    let f = ExactFormat::of(t).unwrap();
    let (_, cols, scales) = tensor(f, 64, 256, 2);
    let m = ExactMatrix::new(f, 64, 256, &cols, &scales);
    for (name, k, _) in all_kernels(f, &Isa::available()) {
        let mut y = vec![0f32; 64];
        k(&m, &[1, 2], &[1, 2], &[0.5, f32::NAN], 0..2, &mut y);
        assert!(y.iter().all(|v| v.is_nan()), "{name}: a NaN coefficient was lost");
    }
}

#[test]
fn tokens_kernel_gives_the_one_token_kernel_per_token_bit_for_bit() {
    let mut rng = Rng(41);
    for f in formats() {
        let t = f.name();
        let fast = axpy_exact_tokens_fn(f, Isa::detect());
        let one = axpy_exact_fn(f, Isa::detect());
        for &(n_out, n_in) in &[(64usize, 512usize), (160, 1024)] {
            let (_, cols, scales) = tensor(f, n_out, n_in, 77 + n_out as u64);
            let m = ExactMatrix::new(f, n_out, n_in, &cols, &scales);
            let mut sets: Vec<Vec<u32>> = [3u64, 32, 60]
                .iter()
                .map(|&keep| (0..n_in as u32).filter(|_| rng.next() % 64 < keep).collect())
                .collect();
            sets.push(vec![5, 3, 3, (n_in - 1) as u32, 0, 40, 41, 3, 200]);
            sets.push(vec![9; 70]);
            sets.push(vec![]);
            for units in &sets {
                for n_tok in [1usize, 3, 4, 5, 9] {
                    let n = units.len();
                    let coef: Vec<f32> = (0..n * n_tok)
                        .map(|i| if rng.next().is_multiple_of(11) { 0.0 } else { rng.f() * (1.0 + (i % 5) as f32) })
                        .collect();
                    for chunks in [0..n_out / 32, 1..n_out / 32 - 1] {
                        let width = 32 * chunks.len();
                        let stride = width + 7;
                        let y0: Vec<f32> = (0..n_tok * stride).map(|_| rng.f()).collect();
                        let (mut a, mut b) = (y0.clone(), y0.clone());
                        fast(&m, units, units, &coef, n_tok, chunks.clone(), &mut a, stride);
                        axpy_exact_tokens_q8_scalar(&m, units, units, &coef, n_tok, chunks.clone(), &mut b, stride);
                        let mut c = y0.clone();
                        for tk in 0..n_tok {
                            let y = &mut c[tk * stride..tk * stride + width];
                            one(&m, units, units, &coef[tk * n..(tk + 1) * n], chunks.clone(), y);
                        }
                        let q8 = axpy_exact_q8_fn(f, Isa::detect()).is_some();
                        for (i, ((x, z), w)) in a.iter().zip(&b).zip(&c).enumerate() {
                            let what = format!(
                                "{t:?} {n_out}x{n_in}, {n} active, {n_tok} tokens, chunks {chunks:?}, value {i}"
                            );
                            assert_eq!(x.to_bits(), w.to_bits(), "{what}: many tokens {x} vs one token {w}");
                            if q8 {
                                assert_eq!(x.to_bits(), z.to_bits(), "{what}: {x} vs the scalar reference {z}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn tokens_kernel_refuses_bad_arguments_before_writing() {
    let t = WeightType::Q4_K;
    let f = ExactFormat::of(t).unwrap();
    let (_, cols, scales) = tensor(f, 64, 256, 1);
    let m = ExactMatrix::new(f, 64, 256, &cols, &scales);
    // (units, coef length, tokens, y length, y stride, the message).
    type Case<'a> = (&'a [u32], usize, usize, usize, usize, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (&[0, 1], 3, 2, 128, 64, "coef (n_tok rows of the active list) has length 3, expected 4"),
        (&[0, 300], 4, 2, 128, 64, "column index 300 out of range"),
        (&[0, 1], 4, 2, 127, 64, "y has length 127, need at least 128"),
        (&[0, 1], 4, 2, 128, 63, "y_stride has length 63, need at least 64"),
        (&[0, 1], 2, usize::MAX, 128, 64, "overflows"),
    ];
    for (units, n_coef, n_tok, ylen, stride, msg) in cases {
        let coef = vec![1.0f32; n_coef];
        let e = check_axpy_exact_tokens(&m, units, units, &coef, n_tok, &(0..2), ylen, stride).unwrap_err().to_string();
        assert!(e.contains(msg), "{e} lacks {msg}");
        for k in [axpy_exact_tokens_fn(f, Isa::detect()), axpy_exact_tokens_q8_scalar as ExactAxpyTokensFn] {
            let mut y = vec![7.0f32; ylen];
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                k(&m, units, units, &coef, n_tok, 0..2, &mut y, stride)
            }));
            assert!(r.is_err(), "accepted {msg}");
            assert!(y.iter().all(|&v| v == 7.0), "wrote before refusing {msg}");
        }
    }
}
