//! Throughput of the row-dot kernels, per instruction set: one quantized activation row against
//! every row of a weight matrix (a matrix × vector product on one thread), reported as GB/s of
//! weight bytes read and ns per row. Then the four-token kernels ([`WeightType::dot4_fn_for`]):
//! four activation rows against every row, reported as ns per row and token beside the single-row
//! kernel run on the same four rows (`x4` lines; the matrix is read once per four tokens there).
//! Also times the activation quantizers.
//!
//! Run with `cargo bench -p sift-quant --bench dot [-- FILTER]` (FILTER matches the case label).
//! Shapes are the decode-time matrices of SmolLM2-135M (hidden 576, FFN 1536, vocab 49152) and
//! Qwen2.5-0.5B (hidden 896, FFN 4864); the last case is big enough to stream from memory.
//! `ggml_vec_dot.c` beside this file runs the same cases through llama.cpp's kernels.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_quant::packed::{gemm_q4k_x8_on, gemv_q4k_x8_on, pack_q4k_x8, PACK_ROWS};
use sift_quant::packed_q4k_x16::{gemm_q4k_x16_on, gemv_q4k_x16_on, pack_q4k_x16, PACK_ROWS_X16};
use sift_quant::packed_q5_0::{gemm_q5_0_x16_on, gemv_q5_0_x16_on, pack_q5_0_x16, PACK_ROWS_Q5_0};
use sift_quant::{scalar, Isa, WeightType};
use std::hint::black_box;
use std::time::{Duration, Instant};

struct Case {
    t: WeightType,
    rows: usize,
    n: usize,
    what: &'static str,
}

const CASES: &[Case] = &[
    Case { t: WeightType::Q4_1, rows: 1536, n: 576, what: "SmolLM2 ffn_up" },
    Case { t: WeightType::Q4_1, rows: 576, n: 1536, what: "SmolLM2 ffn_down" },
    Case { t: WeightType::Q8_0, rows: 49152, n: 576, what: "SmolLM2 output" },
    Case { t: WeightType::Q8_0, rows: 4864, n: 896, what: "Qwen ffn_up" },
    Case { t: WeightType::Q5_0, rows: 896, n: 4864, what: "Qwen ffn_down" },
    Case { t: WeightType::Q5_0, rows: 4864, n: 896, what: "Qwen2.5-0.5B ffn_up" },
    Case { t: WeightType::Q4_0, rows: 1536, n: 576, what: "" },
    Case { t: WeightType::F32, rows: 576, n: 576, what: "" },
    Case { t: WeightType::F16, rows: 576, n: 576, what: "" },
    Case { t: WeightType::BF16, rows: 576, n: 576, what: "" },
    Case { t: WeightType::Q4_K, rows: 896, n: 4864, what: "" },
    Case { t: WeightType::Q4_K, rows: 8960, n: 1536, what: "Qwen2.5-1.5B ffn_up" },
    Case { t: WeightType::Q5_K, rows: 896, n: 4864, what: "" },
    Case { t: WeightType::Q6_K, rows: 896, n: 4864, what: "" },
    Case { t: WeightType::Q4_1, rows: 16384, n: 4096, what: "40 MiB, streams from L3 / memory" },
];

fn random_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The fastest of many timed calls of `f` over about `total` (the minimum filters out the time
/// slices lost to other processes on a shared machine).
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
    let mut rng = StdRng::seed_from_u64(7);
    println!("best ISA on this CPU: {:?}", Isa::detect());
    println!("{:<6} {:>12}  {:<11} {:>9} {:>9}  case", "type", "rows x n", "isa", "GB/s", "ns/row");
    for c in CASES {
        let label = format!("{} {}x{} {}", c.t.name(), c.rows, c.n, c.what);
        if filter.as_deref().is_some_and(|f| !label.contains(f)) {
            continue;
        }
        let row_bytes = c.t.row_bytes(c.n).expect("whole blocks");
        let row = random_row(&mut rng, c.n);
        // Build a few distinct rows and tile them (quantizing 49152 rows would dominate the run).
        let distinct: Vec<Vec<u8>> = (0..64).map(|_| scalar::quantize_row(c.t, &random_row(&mut rng, c.n))).collect();
        let mut w = Vec::with_capacity(c.rows * row_bytes);
        for r in 0..c.rows {
            w.extend_from_slice(&distinct[r % distinct.len()]);
        }
        let act = c.t.act_type();
        let mut a = vec![0u8; act.row_bytes(c.n)];
        act.quantize(&row, &mut a);
        let mut out = vec![0f32; c.rows];
        for isa in Isa::available() {
            let Some(dot) = c.t.dot_fn_for(isa) else { continue };
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let per_rep = if isa == Isa::Scalar { Duration::from_millis(150) } else { Duration::from_millis(100) };
                best_time(
                    || {
                        for (o, wr) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
                            *o = dot(c.n, black_box(wr), black_box(&a));
                        }
                        black_box(&out);
                    },
                    per_rep,
                )
            }));
            match run {
                Ok(t) => {
                    let gbs = (c.rows * row_bytes) as f64 / t.as_secs_f64() / 1e9;
                    let ns_row = t.as_secs_f64() * 1e9 / c.rows as f64;
                    println!(
                        "{:<6} {:>12}  {:<11} {gbs:>9.2} {ns_row:>9.1}  {}",
                        c.t.name(),
                        format!("{}x{}", c.rows, c.n),
                        format!("{isa:?}"),
                        c.what
                    );
                }
                Err(_) => println!("{:<6} {:>12}  {:<11} kernel panicked", c.t.name(), "", format!("{isa:?}")),
            }
        }
        // Four tokens: single-row kernel per (row, token) vs the four-token kernel per row.
        let acts: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                let mut a = vec![0u8; act.row_bytes(c.n)];
                act.quantize(&random_row(&mut rng, c.n), &mut a);
                a
            })
            .collect();
        let a4 = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
        let mut out4 = vec![0f32; 4 * c.rows];
        for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
            let (Some(dot), Some(dot4), Some(rows)) =
                (c.t.dot_fn_for(isa), c.t.dot4_fn_for(isa), c.t.dot4_rows_fn_for(isa))
            else {
                continue;
            };
            let one = best_time(
                || {
                    for (o, wr) in out4.chunks_exact_mut(4).zip(w.chunks_exact(row_bytes)) {
                        for (o, a) in o.iter_mut().zip(a4) {
                            *o = dot(c.n, black_box(wr), black_box(a));
                        }
                    }
                    black_box(&out4);
                },
                Duration::from_millis(100),
            );
            let four = best_time(
                || {
                    for (o, wr) in out4.chunks_exact_mut(4).zip(w.chunks_exact(row_bytes)) {
                        o.copy_from_slice(&dot4(c.n, black_box(wr), black_box(a4)));
                    }
                    black_box(&out4);
                },
                Duration::from_millis(100),
            );
            let mut out_rows = vec![[0f32; 4]; c.rows];
            let multi = best_time(
                || {
                    for (o, wr) in out_rows.chunks_mut(64).zip(w.chunks(64 * row_bytes)) {
                        rows(c.n, black_box(wr), row_bytes, black_box(a4), o);
                    }
                    black_box(&out_rows);
                },
                Duration::from_millis(100),
            );
            let ns = |t: Duration| t.as_secs_f64() * 1e9 / (4 * c.rows) as f64;
            println!(
                "{:<6} {:>12}  {:<11} x4: dot {:>7.2} ns/row/token, dot4 {:>7.2} ({:.2}x), dot4_rows {:>7.2} ({:.2}x)",
                c.t.name(),
                format!("{}x{}", c.rows, c.n),
                format!("{isa:?}"),
                ns(one),
                ns(four),
                one.as_secs_f64() / four.as_secs_f64(),
                ns(multi),
                one.as_secs_f64() / multi.as_secs_f64()
            );
            if c.t == WeightType::Q4_K && c.rows.is_multiple_of(PACK_ROWS_X16) && isa == Isa::Avx512Vnni {
                // The two interleaved layouts (8 rows: every CPU; 16 rows: AVX-512 VNNI), in
                // chunks of 64 rows as the engine's batches, and one token over 256 rows.
                let (g8, g16) = (PACK_ROWS * row_bytes, PACK_ROWS_X16 * row_bytes);
                let (mut p8, mut p16) = (vec![0u8; w.len()], vec![0u8; w.len()]);
                for (src, dst) in w.chunks_exact(g8).zip(p8.chunks_exact_mut(g8)) {
                    pack_q4k_x8(src, c.n / 256, dst);
                }
                for (src, dst) in w.chunks_exact(g16).zip(p16.chunks_exact_mut(g16)) {
                    pack_q4k_x16(src, c.n / 256, dst);
                }
                let x8 = best_time(
                    || {
                        for (o, wr) in out_rows.chunks_mut(PACK_ROWS).zip(p8.chunks(g8)) {
                            let y = gemm_q4k_x8_on(isa, c.n, black_box(wr), black_box(a4));
                            for (r, o) in o.iter_mut().enumerate() {
                                *o = [y[0][r], y[1][r], y[2][r], y[3][r]];
                            }
                        }
                        black_box(&out_rows);
                    },
                    Duration::from_millis(100),
                );
                let x16 = best_time(
                    || {
                        for (o, wr) in out_rows.chunks_mut(64).zip(p16.chunks(64 * row_bytes)) {
                            gemm_q4k_x16_on(isa, c.n, black_box(wr), black_box(a4), o);
                        }
                        black_box(&out_rows);
                    },
                    Duration::from_millis(100),
                );
                let mut y = vec![0f32; c.rows];
                let v8 = best_time(
                    || {
                        for (o, wr) in y.chunks_mut(PACK_ROWS).zip(p8.chunks(g8)) {
                            o.copy_from_slice(&gemv_q4k_x8_on(isa, c.n, black_box(wr), black_box(&acts[0])));
                        }
                        black_box(&y);
                    },
                    Duration::from_millis(100),
                );
                let v16 = best_time(
                    || {
                        for (o, wr) in y.chunks_mut(256).zip(p16.chunks(256 * row_bytes)) {
                            gemv_q4k_x16_on(isa, c.n, black_box(wr), black_box(&acts[0]), o);
                        }
                        black_box(&y);
                    },
                    Duration::from_millis(100),
                );
                let per_row = |t: Duration| t.as_secs_f64() * 1e9 / c.rows as f64;
                println!(
                    "{:<6} {:>12}  {:<11} x4: packed 8 rows {:>7.2}, 16 rows {:>7.2} ns/row/token; one token: 8 rows {:>7.2}, 16 rows {:>7.2} ns/row",
                    c.t.name(),
                    format!("{}x{}", c.rows, c.n),
                    format!("{isa:?}"),
                    ns(x8),
                    ns(x16),
                    per_row(v8),
                    per_row(v16),
                );
            }
            if c.t == WeightType::Q5_0 && c.rows.is_multiple_of(PACK_ROWS_Q5_0) && isa == Isa::Avx512Vnni {
                // The 16-row interleaved layout (repacked at load): chunks of 64 rows as the
                // engine's batches, 256 rows for one token as its decode.
                let gb = PACK_ROWS_Q5_0 * row_bytes;
                let mut packed = vec![0u8; w.len()];
                for (src, dst) in w.chunks_exact(gb).zip(packed.chunks_exact_mut(gb)) {
                    pack_q5_0_x16(src, c.n / 32, dst);
                }
                let x16 = best_time(
                    || {
                        for (o, wr) in out_rows.chunks_mut(64).zip(packed.chunks(64 * row_bytes)) {
                            gemm_q5_0_x16_on(isa, c.n, black_box(wr), black_box(a4), o);
                        }
                        black_box(&out_rows);
                    },
                    Duration::from_millis(100),
                );
                let mut y = vec![0f32; c.rows];
                let gemv = best_time(
                    || {
                        for (o, wr) in y.chunks_mut(256).zip(packed.chunks(256 * row_bytes)) {
                            gemv_q5_0_x16_on(isa, c.n, black_box(wr), black_box(&acts[0]), o);
                        }
                        black_box(&y);
                    },
                    Duration::from_millis(100),
                );
                println!(
                    "{:<6} {:>12}  {:<11} x4: packed 16 rows {:>7.2} ns/row/token ({:.2}x dot4_rows); one token {:>7.2} ns/row",
                    c.t.name(),
                    format!("{}x{}", c.rows, c.n),
                    format!("{isa:?}"),
                    ns(x16),
                    multi.as_secs_f64() / x16.as_secs_f64(),
                    gemv.as_secs_f64() * 1e9 / c.rows as f64,
                );
            }
        }
    }
    // Activation quantizers (the dispatching one is SIMD where available).
    for (act, n) in
        [(sift_quant::ActType::Q8_0, 4864), (sift_quant::ActType::Q8_1, 1536), (sift_quant::ActType::Q8_K, 4864)]
    {
        let x = random_row(&mut rng, n);
        let mut out = vec![0u8; act.row_bytes(n)];
        let simd = best_time(|| act.quantize(black_box(&x), &mut out), Duration::from_millis(20));
        let sc = best_time(|| scalar::quantize_act(act, black_box(&x), &mut out), Duration::from_millis(20));
        println!(
            "quantize {act:?} n={n}: dispatch {:.2} us, scalar {:.2} us",
            simd.as_secs_f64() * 1e6,
            sc.as_secs_f64() * 1e6
        );
    }
}
