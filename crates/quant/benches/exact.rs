//! Exact columns against re-quantized columns: the one-token column kernels on the same matrix,
//! one thread.
//!
//! For each case an `O × I` matrix is quantized from random data in the source format (a GGUF's
//! row-major blocks), transposed into exact columns ([`ExactFormat::transpose`]), and also
//! dequantized and re-quantized into the [`ColType`] of the same bits per value (what packs held
//! before exact columns: Q4_1 for 4-bit sources, Q5_0 for 5- and 6-bit, Q8_0 for 8-bit). The
//! kernels then run over the same random active set (sorted ascending, as selectors give it) at
//! 0 / 50 / 75 % sparsity: the fastest exact kernel of this CPU (8-bit coefficients,
//! [`sift_quant::exact_q8`], where it has AVX-512 VBMI/BITALG), the f32-coefficient exact kernel,
//! and the re-quantized one. Reported: µs per call of each (the fastest of repeated calls) and the
//! fastest exact kernel's speed relative to the f32 one (> 1: faster). The `mem` cases
//! rotate through enough copies (≥ 400 MB per layout) that every call reads from DRAM, as a
//! decode step does; the others stay in cache.
//!
//! Run with `cargo bench -p sift-quant --bench exact [-- FILTER]`.

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use sift_quant::exact::axpy_exact_f32_fn;
use sift_quant::exact::ExactMatrix;
use sift_quant::transposed_q8::{gemm_chosen_fn, QuantizedCoefs, TransposedQ8};
use sift_quant::{axpy_cols_fn, axpy_exact_fn, scalar, ColType, ExactFormat, Isa, WeightType};
use std::hint::black_box;
use std::time::{Duration, Instant};

const CASES: &[(WeightType, usize, usize, bool, &str)] = &[
    (WeightType::Q4_1, 1536, 576, false, "SmolLM2 ffn_up"),
    (WeightType::Q4_1, 576, 1536, false, "SmolLM2 ffn_down"),
    (WeightType::Q5_0, 4864, 896, false, "Qwen-0.5B ffn_up"),
    (WeightType::Q4_K, 8960, 1536, true, "Qwen-1.5B ffn_up, mem"),
    (WeightType::Q4_K, 8960, 1536, false, "Qwen-1.5B ffn_up, cache"),
    (WeightType::Q6_K, 1536, 8960, true, "Qwen-1.5B ffn_down, mem"),
    (WeightType::Q6_K, 1536, 8960, true, "Qwen-1.5B ffn_down, wide layout, mem"),
    (WeightType::Q5_0, 4864, 896, false, "Qwen-0.5B ffn_up, wide layout"),
    (WeightType::Q4_1, 8192, 8192, true, "mem"),
];

const SPARSITY: [usize; 3] = [0, 50, 75];
const MEM_BYTES: usize = 400 << 20;

fn best_time(mut f: impl FnMut(), total: Duration) -> Duration {
    f();
    let mut best = Duration::MAX;
    let start = Instant::now();
    let mut calls = 0;
    while calls < 5 || start.elapsed() < total {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
        calls += 1;
    }
    best
}

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let isa = Isa::detect();
    println!("ISA {isa:?}; one thread; µs per call: exact (this CPU's fastest: 8-bit coefficients where it has them) | exact, f32 coefficients | re-quantized | fastest exact relative to f32");
    let mut rng = StdRng::seed_from_u64(5);
    for &(src, o, i, mem, what) in CASES {
        let label = format!("{} {o}x{i} {what}", src.name());
        if filter.as_deref().is_some_and(|f| !label.contains(f)) {
            continue;
        }
        // "wide layout" cases: the 5/6-bit integers in bytes (`ExactFormat::wide`).
        let fmt = if what.contains("wide") { ExactFormat::wide(src) } else { ExactFormat::of(src) }.unwrap();
        let req = match fmt.bits {
            4 => ColType::Q4_1,
            8 => ColType::Q8_0,
            _ => ColType::Q5_0,
        };
        // 64 distinct random rows, tiled.
        let distinct: Vec<Vec<f32>> =
            (0..64).map(|_| (0..i).map(|_| rng.random_range(-1.0f32..1.0)).collect()).collect();
        let mut rows = Vec::new();
        let mut dense = vec![0f32; o * i];
        for r in 0..o {
            let x = &distinct[(r * 7 + r / 64) % 64];
            let q = scalar::quantize_row(src, x);
            src.dequantize_row(&q, &mut dense[r * i..(r + 1) * i]);
            rows.extend(q);
        }
        let (ecols, scales) = fmt.transpose(&rows, o, i);
        let rcb = req.col_bytes(o);
        let mut rcols = vec![0u8; rcb * i];
        let mut col = vec![0f32; o];
        for c in 0..i {
            for (r, v) in col.iter_mut().enumerate() {
                *v = dense[r * i + c];
            }
            req.quantize_col(&col, &mut rcols[c * rcb..(c + 1) * rcb]);
        }
        let copies = if mem { MEM_BYTES.div_ceil(ecols.len()) } else { 1 };
        // Columns at 64-byte aligned addresses, as a pack's (4 KiB aligned, whole cache lines per
        // column chunk): a plain `Vec`'s large allocation sits 16 bytes past a page.
        let aligned = |v: &[u8]| {
            let mut buf = vec![0u8; v.len() + 64];
            let off = buf.as_ptr().align_offset(64);
            buf[off..off + v.len()].copy_from_slice(v);
            (buf, off)
        };
        let ebufs: Vec<(Vec<u8>, usize)> = (0..copies).map(|_| aligned(&ecols)).collect();
        let ecopies: Vec<&[u8]> = ebufs.iter().map(|(b, o)| &b[*o..*o + ecols.len()]).collect();
        let rcopies: Vec<Vec<u8>> = (0..copies).map(|_| rcols.clone()).collect();
        let (fe, ff, fr) = (axpy_exact_fn(fmt, isa), axpy_exact_f32_fn(fmt, isa), axpy_cols_fn(req, isa));
        let budget = Duration::from_millis(if mem { 400 } else { 150 });
        print!("{:<5} {:>10} vs {:<5}", src.name(), format!("{o}x{i}"), req.name());
        for s in SPARSITY {
            let n_active = i * (100 - s) / 100;
            let mut active: Vec<u32> = sample(&mut rng, i, n_active).into_iter().map(|v| v as u32).collect();
            active.sort_unstable();
            let coef: Vec<f32> = active.iter().map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let mut y = vec![0f32; o];
            let mut k = 0;
            let te = best_time(
                || {
                    let m = ExactMatrix::new(fmt, o, i, ecopies[k % copies], &scales);
                    k += 1;
                    fe(black_box(&m), &active, &active, &coef, 0..o / 32, &mut y);
                    black_box(&y);
                },
                budget,
            );
            let tf = best_time(
                || {
                    let m = ExactMatrix::new(fmt, o, i, ecopies[k % copies], &scales);
                    k += 1;
                    ff(black_box(&m), &active, &active, &coef, 0..o / 32, &mut y);
                    black_box(&y);
                },
                budget,
            );
            let tr = best_time(
                || {
                    fr(black_box(&rcopies[k % copies]), rcb, &active, &coef, 0..o / 32, &mut y);
                    k += 1;
                    black_box(&y);
                },
                budget,
            );
            print!(
                "  {s:>2}%: {:>5.0} | {:>5.0} | {:>5.0} | {:>4.2}x",
                te.as_secs_f64() * 1e6,
                tf.as_secs_f64() * 1e6,
                tr.as_secs_f64() * 1e6,
                tf.as_secs_f64() / te.as_secs_f64()
            );
        }
        println!("  {what}");
    }
    tokens_section(filter.as_deref(), isa);
}

/// Many tokens over one active list (FastForward's block-wise sparse FFN down projection): the
/// many-token kernel against the one-token kernel per token, and the dense four-token row kernel
/// over the whole matrix (every input), for a 128-token block; one thread, µs per block.
fn tokens_section(filter: Option<&str>, isa: Isa) {
    const CASES: &[(WeightType, usize, usize, &str)] = &[
        (WeightType::Q4_K, 896, 4864, "Qwen-0.5B ffn_down"),
        (WeightType::Q6_K, 896, 4864, "Qwen-0.5B ffn_down (Q6_K layers)"),
        (WeightType::Q4_1, 576, 1536, "SmolLM2 ffn_down"),
        (WeightType::Q4_K, 1536, 8960, "Qwen-1.5B ffn_down"),
        (WeightType::Q6_K, 1536, 8960, "Qwen-1.5B ffn_down (Q6_K layers)"),
    ];
    let n_tok = 128;
    println!("tokens: {n_tok}-token block, one thread, µs: many-token kernel | one-token kernel per token | dense rows (all inputs) | neuron-major 8-bit copy (coefficients quantized + kernel)");
    let mut rng = StdRng::seed_from_u64(9);
    for &(src, o, i, what) in CASES {
        let label = format!("tokens {} {o}x{i} {what}", src.name());
        if filter.is_some_and(|f| !label.contains(f)) {
            continue;
        }
        // "wide layout" cases: the 5/6-bit integers in bytes (`ExactFormat::wide`).
        let fmt = if what.contains("wide") { ExactFormat::wide(src) } else { ExactFormat::of(src) }.unwrap();
        let mut rows = Vec::new();
        for _ in 0..o {
            let x: Vec<f32> = (0..i).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            rows.extend(scalar::quantize_row(src, &x));
        }
        let (cols, scales) = fmt.transpose(&rows, o, i);
        let m = ExactMatrix::new(fmt, o, i, &cols, &scales);
        let mut wf = vec![0f32; o * i];
        for (r, out) in wf.chunks_exact_mut(i).enumerate() {
            scalar::dequantize_row(src, &rows[r * (rows.len() / o)..(r + 1) * (rows.len() / o)], out);
        }
        let t8 = TransposedQ8::from_rows(&wf, o, i).unwrap();
        let gemm8 = gemm_chosen_fn(isa);
        let many = sift_quant::exact_q8::axpy_exact_tokens_fn(fmt, isa);
        let one = axpy_exact_fn(fmt, isa);
        // Dense: activations quantized once, the four-token row kernel over all rows.
        let at = src.act_type();
        let x: Vec<f32> = (0..n_tok * i).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut acts = vec![0u8; n_tok * at.row_bytes(i)];
        let ab = at.row_bytes(i);
        for t in 0..n_tok {
            scalar::quantize_act(at, &x[t * i..(t + 1) * i], &mut acts[t * ab..(t + 1) * ab]);
        }
        let rb = rows.len() / o;
        let d4 = src.dot4_rows_fn();
        let mut out = vec![[0f32; 4]; o];
        let td = best_time(
            || {
                for t in (0..n_tok).step_by(4) {
                    let a = [0, 1, 2, 3].map(|k| &acts[(t + k) * ab..(t + k + 1) * ab]);
                    d4(i, &rows, rb, a, &mut out);
                }
                black_box(&out);
            },
            Duration::from_millis(300),
        );
        print!("{:<5} {:>10}", src.name(), format!("{o}x{i}"));
        for s in [0usize, 50] {
            let n_active = i * (100 - s) / 100;
            let mut active: Vec<u32> = sample(&mut rng, i, n_active).into_iter().map(|v| v as u32).collect();
            active.sort_unstable();
            let coef: Vec<f32> = (0..n_tok * n_active).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let mut y = vec![0f32; n_tok * o];
            let tm = best_time(
                || {
                    many(&m, &active, &active, &coef, n_tok, 0..o / 32, &mut y, o);
                    black_box(&y);
                },
                Duration::from_millis(300),
            );
            let t1 = best_time(
                || {
                    for t in 0..n_tok {
                        one(
                            &m,
                            &active,
                            &active,
                            &coef[t * n_active..(t + 1) * n_active],
                            0..o / 32,
                            &mut y[t * o..(t + 1) * o],
                        );
                    }
                    black_box(&y);
                },
                Duration::from_millis(300),
            );
            let (mut qc, mut y8, mut scratch) = (QuantizedCoefs::default(), vec![0f32; n_tok * o], Vec::new());
            let t8t = best_time(
                || {
                    qc.reset(&t8, &active, n_tok).unwrap();
                    qc.quantize(&coef);
                    gemm8(&t8, &active, &qc, 0..t8.n_panels(), &mut y8, &mut scratch);
                    black_box(&y8);
                },
                Duration::from_millis(300),
            );
            print!(
                "  {s:>2}%: {:>6.0} | {:>6.0} | {:>6.0} | {:>6.0}",
                tm.as_secs_f64() * 1e6,
                t1.as_secs_f64() * 1e6,
                td.as_secs_f64() * 1e6,
                t8t.as_secs_f64() * 1e6
            );
        }
        println!("  {what}");
    }
}
