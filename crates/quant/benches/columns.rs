//! Throughput of the column (input-channel) sparse kernels against the dense GEMV, one thread.
//!
//! For each case, an `O × I` matrix is stored twice: row-major (`O` rows of `I` values, as GGUF
//! stores it) for the dense product — the [`WeightType::dot_fn_for`] kernel over every row against
//! the activation quantized to the weight type's Q8 format, i.e. what the engine runs today — and
//! transposed (`I` columns of `O` values) for [`axpy_cols_fn`], called once over all output blocks
//! with a random active set of `(1 − sparsity)·I` columns, sorted ascending (as an engine would
//! pass them), with random coefficients.
//!
//! Reported per case and instruction set: the dense GEMV's GB/s of weight bytes and µs per call;
//! then for 0 / 25 / 50 / 75 % sparsity the column kernel's GB/s of weight bytes actually read
//! (`active · col_bytes / time`) and µs per call, and its speed-up over the dense call. Times are
//! the fastest of repeated calls (filters out time slices lost to other processes).
//!
//! The `mem` cases rotate through enough copies of the matrix (≥ 400 MB per layout) that every
//! call reads from DRAM even with this machine's 300 MB L3; the others are small enough to stay in
//! L2 / L3 between calls (as one layer's matrix would not, in a real model — the `mem` lines are
//! the ones that predict decode speed).
//!
//! Run with `cargo bench -p sift-quant --bench columns [-- FILTER]` (FILTER matches the case label).

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use sift_quant::{axpy_cols_batch, axpy_cols_fn, ColMatrix, ColType, Isa};
use std::hint::black_box;
use std::time::{Duration, Instant};

struct Case {
    ty: ColType,
    o: usize,
    i: usize,
    mem: bool,
    what: &'static str,
}

const CASES: &[Case] = &[
    Case { ty: ColType::Q4_1, o: 1536, i: 576, mem: false, what: "SmolLM2 ffn_up" },
    Case { ty: ColType::Q4_1, o: 576, i: 1536, mem: false, what: "SmolLM2 ffn_down" },
    Case { ty: ColType::Q8_0, o: 4864, i: 896, mem: false, what: "Qwen ffn_up" },
    Case { ty: ColType::Q5_0, o: 896, i: 4864, mem: false, what: "Qwen ffn_down" },
    Case { ty: ColType::Q4_1, o: 4864, i: 896, mem: false, what: "" },
    Case { ty: ColType::Q4_1, o: 896, i: 4864, mem: false, what: "" },
    Case { ty: ColType::Q4_1, o: 4096, i: 14336, mem: true, what: "Llama-3-8B ffn_down, mem" },
    Case { ty: ColType::Q4_1, o: 8192, i: 8192, mem: true, what: "mem" },
    Case { ty: ColType::Q5_0, o: 8192, i: 8192, mem: true, what: "mem" },
    Case { ty: ColType::Q8_0, o: 8192, i: 8192, mem: true, what: "mem" },
];

const SPARSITY: [usize; 4] = [0, 25, 50, 75];

/// Bytes of distinct matrix copies the `mem` cases rotate through (per layout).
const MEM_BYTES: usize = 400 << 20;

fn random_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `n` rows of `row_bytes`, tiled from 64 distinct quantized random rows of `len` values.
fn tiled(rng: &mut StdRng, ty: ColType, n: usize, len: usize) -> Vec<u8> {
    let rb = ty.col_bytes(len);
    let distinct: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            let mut q = vec![0u8; rb];
            ty.quantize_col(&random_vec(rng, len), &mut q);
            q
        })
        .collect();
    let mut w = Vec::with_capacity(n * rb);
    for r in 0..n {
        w.extend_from_slice(&distinct[(r * 7 + r / 64) % 64]);
    }
    w
}

/// The fastest of many timed calls of `f` over about `total` (at least 5 calls).
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
    let mut rng = StdRng::seed_from_u64(11);
    println!("best ISA on this CPU: {:?}; one thread; GB/s of weight bytes read, µs per call", Isa::detect());
    print!("{:<5} {:>11} {:<11} {:>14}", "type", "O x I", "isa", "dense GEMV");
    for s in SPARSITY {
        print!(" {:>23}", format!("cols {s}% sparse"));
    }
    println!("  case");
    for c in CASES {
        let label = format!("{} {}x{} {}", c.ty.name(), c.o, c.i, c.what);
        if filter.as_deref().is_some_and(|f| !label.contains(f)) {
            continue;
        }
        let wt = c.ty.weight_type();
        let row_bytes = wt.row_bytes(c.i).expect("whole blocks");
        let col_bytes = c.ty.col_bytes(c.o);
        let mat_bytes = c.o * row_bytes;
        let copies = if c.mem { MEM_BYTES.div_ceil(mat_bytes) } else { 1 };
        let rows_one = tiled(&mut rng, c.ty, c.o, c.i);
        let cols_one = tiled(&mut rng, c.ty, c.i, c.o);
        let rows: Vec<Vec<u8>> = (0..copies).map(|_| rows_one.clone()).collect();
        let cols: Vec<Vec<u8>> = (0..copies).map(|_| cols_one.clone()).collect();
        drop((rows_one, cols_one));
        let x = random_vec(&mut rng, c.i);
        let act = wt.act_type();
        let mut a = vec![0u8; act.row_bytes(c.i)];
        act.quantize(&x, &mut a);
        let mut out = vec![0f32; c.o];
        let budget = Duration::from_millis(if c.mem { 400 } else { 150 });
        for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
            let Some(dot) = wt.dot_fn_for(isa) else { continue };
            let mut k = 0;
            let dense = best_time(
                || {
                    let w = &rows[k % copies];
                    k += 1;
                    for (o, wr) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
                        *o = dot(c.i, black_box(wr), black_box(&a));
                    }
                    black_box(&out);
                },
                budget,
            );
            print!(
                "{:<5} {:>11} {:<11} {:>7.2} {:>6.0}",
                c.ty.name(),
                format!("{}x{}", c.o, c.i),
                format!("{isa:?}"),
                mat_bytes as f64 / dense.as_secs_f64() / 1e9,
                dense.as_secs_f64() * 1e6
            );
            let axpy = axpy_cols_fn(c.ty, isa);
            for s in SPARSITY {
                let n_active = c.i * (100 - s) / 100;
                let mut active: Vec<u32> = sample(&mut rng, c.i, n_active).into_iter().map(|v| v as u32).collect();
                active.sort_unstable();
                let coef: Vec<f32> = active.iter().map(|&j| x[j as usize]).collect();
                let mut y = vec![0f32; c.o];
                let mut k = 0;
                let t = best_time(
                    || {
                        let w = &cols[k % copies];
                        k += 1;
                        axpy(black_box(w), col_bytes, &active, &coef, 0..c.o / 32, &mut y);
                        black_box(&y);
                    },
                    budget,
                );
                print!(
                    " {:>7.2} {:>6.0} {:>5.2}x",
                    (n_active * col_bytes) as f64 / t.as_secs_f64() / 1e9,
                    t.as_secs_f64() * 1e6,
                    dense.as_secs_f64() / t.as_secs_f64()
                );
            }
            println!("  {}", c.what);
        }
    }
    batch(&mut rng, filter.as_deref());
    // The scalar reference, once, for scale.
    let (o, i) = (1536, 576);
    let cols = tiled(&mut rng, ColType::Q4_1, i, o);
    let active: Vec<u32> = (0..i as u32).collect();
    let coef = random_vec(&mut rng, i);
    let mut y = vec![0f32; o];
    let f = axpy_cols_fn(ColType::Q4_1, Isa::Scalar);
    let t = best_time(
        || f(black_box(&cols), ColType::Q4_1.col_bytes(o), &active, &coef, 0..o / 32, &mut y),
        Duration::from_millis(100),
    );
    println!(
        "scalar reference, Q4_1 {o}x{i} dense: {:.2} GB/s, {:.0} µs",
        cols.len() as f64 / t.as_secs_f64() / 1e9,
        t.as_secs_f64() * 1e6
    );
}

/// Many tokens: [`axpy_cols_batch`] against the one-token kernel run per token and against the
/// dense four-token kernel ([`sift_quant::WeightType::dot4_rows_fn_for`], 4 tokens per pass over
/// the row-major matrix), in µs per token, for inputs with each entry non-zero with probability
/// `density` (independently per token, so most columns are used by some token).
fn batch(rng: &mut StdRng, filter: Option<&str>) {
    let n_tok = 256;
    println!("batch of {n_tok} tokens, µs per token: axpy_cols_batch | axpy_cols per token | dense dot4_rows");
    for (ty, o, i) in [(ColType::Q4_1, 576, 1536), (ColType::Q5_0, 896, 4864)] {
        if filter.is_some_and(|f| !format!("batch {} {o}x{i}", ty.name()).contains(f)) {
            continue;
        }
        let wt = ty.weight_type();
        let cols = tiled(rng, ty, i, o);
        let rows = tiled(rng, ty, o, i);
        let row_bytes = wt.row_bytes(i).unwrap();
        let m = ColMatrix::new(ty, &cols, o, i).unwrap();
        for density in [0.5, 0.1] {
            let x: Vec<f32> = (0..n_tok * i)
                .map(|_| if rng.random_bool(density) { rng.random_range(-1.0f32..1.0) } else { 0.0 })
                .collect();
            for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
                let mut y = vec![0f32; n_tok * o];
                let per_tok = |t: Duration| t.as_secs_f64() * 1e6 / n_tok as f64;
                let tb = best_time(
                    || axpy_cols_batch(&m, black_box(&x), n_tok, 0..o / 32, &mut y, o, isa),
                    Duration::from_millis(200),
                );
                let axpy = axpy_cols_fn(ty, isa);
                let lists: Vec<(Vec<u32>, Vec<f32>)> = (0..n_tok)
                    .map(|t| {
                        let xr = &x[t * i..(t + 1) * i];
                        let a: Vec<u32> = (0..i as u32).filter(|&c| xr[c as usize] != 0.0).collect();
                        let c = a.iter().map(|&c| xr[c as usize]).collect();
                        (a, c)
                    })
                    .collect();
                let ta = best_time(
                    || {
                        for (t, (a, c)) in lists.iter().enumerate() {
                            axpy(black_box(&cols), m.col_bytes, a, c, 0..o / 32, &mut y[t * o..(t + 1) * o]);
                        }
                    },
                    Duration::from_millis(200),
                );
                let act = wt.act_type();
                let acts: Vec<Vec<u8>> = (0..n_tok)
                    .map(|t| {
                        let mut a = vec![0u8; act.row_bytes(i)];
                        act.quantize(&x[t * i..(t + 1) * i], &mut a);
                        a
                    })
                    .collect();
                let rows_fn = wt.dot4_rows_fn_for(isa).unwrap();
                let mut out = vec![[0f32; 4]; o];
                let td = best_time(
                    || {
                        for a in acts.chunks_exact(4) {
                            rows_fn(i, black_box(&rows), row_bytes, [&a[0], &a[1], &a[2], &a[3]], &mut out);
                            black_box(&out);
                        }
                    },
                    Duration::from_millis(200),
                );
                println!(
                    "{:<5} {:>11} {:<11} density {density:.1}: {:>8.1} | {:>8.1} | {:>8.1}",
                    ty.name(),
                    format!("{o}x{i}"),
                    format!("{isa:?}"),
                    per_tok(tb),
                    per_tok(ta),
                    per_tok(td)
                );
            }
        }
    }
}
