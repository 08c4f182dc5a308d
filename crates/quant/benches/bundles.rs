//! Neuron bundles against the repacked dense kernels, on the FFN layers of Qwen2.5-1.5B.
//!
//! 28 layers of `n_embd` 1536 × `n_ff` 8960 with Q4_K_M's types (gate and up Q4_K; down Q6_K on
//! the layers llama.cpp's Q4_K_M gives more bits — the first and last eighth and every third
//! between — Q4_K elsewhere), random weights: ~0.7 GB per layout, more than any L3, so every
//! token reads its weights from DRAM as a decode step does. Two threads, as the engine runs them:
//!
//! - **dense**: gate and up on the layout sift repacks Q4_K into at load (16- or 8-row groups),
//!   then down on the GGUF's rows (Q6_K is not repacked), each half of the rows per thread, the
//!   threads meeting after gate/up and after down (the engine's two dispatches per FFN);
//! - **bundles** at 30 / 50 / 70 % of the neurons chosen (uniformly at random, a fresh set per
//!   layer and token): [`Bundles::ffn_lane`] — per group of 128 neurons, the chosen ones' gate and
//!   up rows, SiLU, then their down columns — the lanes split between the threads, which meet
//!   once per layer.
//!
//! Reported per case: ms per token (all 28 layers; the median of the timed tokens), GB/s of the
//! weight bytes it reads — dense: the three GGUF tensors; bundles: the chosen records (gate row,
//! up row, down column, padding), not counting down's scale plane, which is read too — and the
//! bundles' GB/s relative to dense. The target (issue 59): ≥ 0.85 at every share.
//!
//! Run with `cargo bench -p sift-quant --bench bundles` (`BUNDLE_HUGE=1`: the records in 2 MiB
//! pages; `BUNDLE_LAYERS=N`: fewer layers).

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::SeedableRng;
use sift_quant::bundles::{BundleLayout, Bundles, Gate, BUNDLE_LANES};
use sift_quant::packed::{gemv_q4k_x8_on, group_rows, pack_group, PACK_ROWS};
use sift_quant::packed_q4k_x16::gemv_q4k_x16_on;
use sift_quant::{axpy_exact_fn, scalar, ExactFormat, Isa, WeightType};
use std::sync::Barrier;
use std::time::Instant;

const N_EMBD: usize = 1536;
const N_FF: usize = 8960;
const LAYERS: usize = 28;
fn layers_n() -> usize {
    std::env::var("BUNDLE_LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(LAYERS)
}
const TOKENS: usize = 15;
const THREADS: usize = 2;

/// llama.cpp's `use_more_bits`: the Q4_K_M layers whose ffn_down is Q6_K.
fn down_type(l: usize) -> WeightType {
    let n = LAYERS;
    match l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2 {
        true => WeightType::Q6_K,
        false => WeightType::Q4_K,
    }
}

/// A `rows × cols` tensor in `ty`: 64 distinct random quantized rows repeated (the values do not
/// change the kernels' speed; every byte is its own memory).
fn tensor(ty: WeightType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut f = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let pool: Vec<Vec<u8>> =
        (0..64).map(|_| scalar::quantize_row(ty, &(0..cols).map(|_| f()).collect::<Vec<_>>())).collect();
    let mut out = Vec::with_capacity(pool[0].len() * rows);
    for r in 0..rows {
        out.extend_from_slice(&pool[r % 64]);
    }
    out
}

/// `BUNDLE_HUGE=1`: the records in anonymous memory asked to be backed by 2 MiB pages
/// (`MADV_HUGEPAGE`, as `--no-mmap` loads the GGUF); else in a plain allocation.
fn huge_pages() -> bool {
    std::env::var("BUNDLE_HUGE").is_ok_and(|v| v == "1")
}

/// A layer's bundle records, in 4 KiB or (asked for) 2 MiB pages.
enum Records {
    Plain(Vec<u8>),
    Huge(memmap2::MmapMut),
}

impl Records {
    fn copy(bytes: &[u8], huge: bool) -> Records {
        if !huge {
            return Records::Plain(bytes.to_vec());
        }
        let mut m = memmap2::MmapMut::map_anon(bytes.len()).unwrap();
        let _ = m.advise(memmap2::Advice::HugePage);
        m.copy_from_slice(bytes);
        Records::Huge(m)
    }
}

impl std::ops::Deref for Records {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Records::Plain(v) => v,
            Records::Huge(m) => m,
        }
    }
}

struct Layer {
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
    down_ty: WeightType,
    layout: BundleLayout,
    records: Records,
    scales: Vec<u8>,
}

fn repack(ty: WeightType, rows: &[u8], n_rows: usize, n_cols: usize) -> Vec<u8> {
    let g = group_rows(ty).expect("Q4_K repacks");
    let nb = n_cols / ty.block_size();
    let gb = g * nb * ty.block_bytes();
    let mut out = vec![0u8; rows.len()];
    for k in 0..n_rows / g {
        pack_group(ty, &rows[k * gb..(k + 1) * gb], nb, &mut out[k * gb..(k + 1) * gb]);
    }
    out
}

fn main() {
    let isa = Isa::detect();
    let q4k = WeightType::Q4_K;
    let g16 = group_rows(q4k) == Some(16);
    println!(
        "ISA {isa:?}; wide 6-bit down columns: {}; records in 2 MiB pages: {}; {THREADS} threads; {LAYERS} layers of {N_EMBD} × {N_FF}; building the layers ...",
        sift_quant::exact::wide_is_faster(),
        huge_pages()
    );

    // One layer of each down type, built once; the 28 layers are copies (each its own memory).
    let mut proto = Vec::new();
    for (k, dty) in [WeightType::Q4_K, WeightType::Q6_K].into_iter().enumerate() {
        let gate = tensor(q4k, N_FF, N_EMBD, 10 + k as u64);
        let up = tensor(q4k, N_FF, N_EMBD, 20 + k as u64);
        let down = tensor(dty, N_EMBD, N_FF, 30 + k as u64);
        // The down layout `sift pack` writes on this CPU (wide 6-bit columns where they are faster).
        let fmt = match sift_quant::exact::wide_is_faster() {
            true => ExactFormat::wide(dty).or(ExactFormat::of(dty)),
            false => ExactFormat::of(dty),
        };
        let layout = BundleLayout::new(q4k, q4k, fmt.unwrap(), N_EMBD, N_FF).unwrap();
        let (records, scales) = layout.build(&gate, &up, &down).unwrap();
        let (gate, up) = (repack(q4k, &gate, N_FF, N_EMBD), repack(q4k, &up, N_FF, N_EMBD));
        proto.push(Layer { gate, up, down, down_ty: dty, layout, records: Records::copy(&records, false), scales });
    }
    let layers: Vec<Layer> = (0..layers_n())
        .map(|l| {
            let p = &proto[(down_type(l) == WeightType::Q6_K) as usize];
            Layer {
                gate: p.gate.clone(),
                up: p.up.clone(),
                down: p.down.clone(),
                down_ty: p.down_ty,
                layout: p.layout,
                records: Records::copy(&p.records, huge_pages()),
                scales: p.scales.clone(),
            }
        })
        .collect();
    drop(proto);
    let mut x = vec![0f32; N_EMBD.max(N_FF)];
    x.iter_mut().enumerate().for_each(|(i, v)| *v = ((i * 7919) % 1000) as f32 / 500.0 - 1.0);
    let act_k = {
        let mut a = vec![0u8; q4k.act_type().row_bytes(N_EMBD)];
        q4k.act_type().quantize(&x[..N_EMBD], &mut a);
        a
    };
    let act_ff = {
        let mut a = vec![0u8; q4k.act_type().row_bytes(N_FF)];
        q4k.act_type().quantize(&x[..N_FF], &mut a);
        a
    };

    // Dense: gate/up groups split between the threads, a barrier, down rows split, a barrier.
    let dense_bytes: usize = layers.iter().map(|l| l.gate.len() + l.up.len() + l.down.len()).sum();
    let barrier = Barrier::new(THREADS);
    let dense = time_tokens(|| {
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (layers, barrier, act_k, act_ff) = (&layers, &barrier, &act_k, &act_ff);
                sc.spawn(move || {
                    let g = if g16 { 16 } else { PACK_ROWS };
                    let nb = N_EMBD / 256;
                    let gb = g * nb * q4k.block_bytes();
                    let mut out = [0f32; 16];
                    let mut sink = 0f32;
                    for l in layers {
                        let groups = N_FF / g;
                        for k in split(groups, t) {
                            for w in [&l.gate, &l.up] {
                                let wg = &w[k * gb..(k + 1) * gb];
                                if g16 {
                                    gemv_q4k_x16_on(isa, N_EMBD, wg, act_k, &mut out);
                                } else {
                                    out[..8].copy_from_slice(&gemv_q4k_x8_on(isa, N_EMBD, wg, act_k));
                                }
                                sink += out[0];
                            }
                        }
                        barrier.wait();
                        let dot = l.down_ty.dot_fn();
                        let rb = l.down_ty.row_bytes(N_FF).unwrap();
                        for r in split(N_EMBD, t) {
                            sink += dot(N_FF, &l.down[r * rb..(r + 1) * rb], act_ff);
                        }
                        barrier.wait();
                    }
                    std::hint::black_box(sink);
                });
            }
        })
    });
    let gbs = |bytes: usize, ms: f64| bytes as f64 / ms / 1e6;
    println!(
        "dense (repacked gate/up, down rows): {:.2} ms/token, {:.2} GB/s of {:.0} MB",
        dense,
        gbs(dense_bytes, dense),
        dense_bytes as f64 / 1e6
    );

    // One thread, the first 256 neurons of a layer of each down type (in L2): the kernels' own
    // speed, without DRAM — ns per neuron for its gate and up rows, for its down column, for both.
    let kinds = [WeightType::Q4_K, WeightType::Q6_K].map(|ty| layers.iter().find(|l| l.down_ty == ty));
    for l in kinds.into_iter().flatten() {
        let b = Bundles::new(l.layout, &l.records, &l.scales).unwrap();
        let kernel = axpy_exact_fn(l.layout.down, isa);
        let dot = q4k.dot_fn();
        let chosen: Vec<u32> = (0..256).collect();
        let mut acc = vec![0f32; N_EMBD];
        let mut out = vec![0f32; 256];
        let coef = vec![0.5f32; 256];
        let reps = 400;
        let time = |f: &mut dyn FnMut()| {
            f();
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() * 1e9 / (reps * 256) as f64
        };
        let rows = time(&mut || {
            b.rows(sift_quant::bundles::BundleRow::Gate, dot, &act_k, &chosen, &mut out);
            b.rows(sift_quant::bundles::BundleRow::Up, dot, &act_k, &chosen, &mut out);
        });
        let down = time(&mut || b.down(kernel, &chosen, &coef, 0..N_EMBD / 32, &mut acc));
        let silu: fn(&mut [f32]) = |h| h.iter_mut().for_each(|v| *v = *v / (1.0 + (-*v).exp()));
        let ffn = time(&mut || {
            for lane in 0..BUNDLE_LANES {
                b.ffn_lane(lane, &chosen, &act_k, Gate::Rows { act: silu }, (dot, dot), kernel, &mut acc)
            }
        });
        let rb = l.layout.record_bytes() as f64;
        println!(
            "in L2, one thread, down {:?} ({} B records): gate+up rows {rows:.0} ns/neuron, down column {down:.0} ns, ffn_lane {ffn:.0} ns ({:.1} GB/s)",
            l.down_ty, rb, rb / ffn
        );
    }
    let mut rng = StdRng::seed_from_u64(7);
    for pct in [30usize, 50, 70] {
        let k = N_FF * pct / 100;
        // A fresh set per layer and token (ascending, as selectors give them).
        let sets: Vec<Vec<Vec<u32>>> = (0..TOKENS + 1)
            .map(|_| {
                (0..layers_n())
                    .map(|_| {
                        let mut s: Vec<u32> = sample(&mut rng, N_FF, k).into_iter().map(|i| i as u32).collect();
                        s.sort_unstable();
                        s
                    })
                    .collect()
            })
            .collect();
        let bytes: usize = layers.iter().map(|l| k * l.layout.record_bytes()).sum();
        let mut token = 0;
        let ms = time_tokens(|| {
            let set = &sets[token % sets.len()];
            token += 1;
            std::thread::scope(|sc| {
                for t in 0..THREADS {
                    let (layers, barrier, act_k) = (&layers, &barrier, &act_k);
                    sc.spawn(move || {
                        let dot = q4k.dot_fn();
                        let mut acc = vec![0f32; N_EMBD];
                        let silu: fn(&mut [f32]) = |h| h.iter_mut().for_each(|v| *v = *v / (1.0 + (-*v).exp()));
                        for (l, chosen) in layers.iter().zip(set) {
                            let b = Bundles::new(l.layout, &l.records, &l.scales).unwrap();
                            let kernel = axpy_exact_fn(l.layout.down, isa);
                            for lane in (t..BUNDLE_LANES).step_by(THREADS) {
                                acc.iter_mut().for_each(|v| *v = 0.0);
                                b.ffn_lane(lane, chosen, act_k, Gate::Rows { act: silu }, (dot, dot), kernel, &mut acc);
                            }
                            // (The engine adds the lanes into the residual here.)
                            barrier.wait();
                        }
                        std::hint::black_box(&acc);
                    });
                }
            })
        });
        let (bw, dw) = (gbs(bytes, ms), gbs(dense_bytes, dense));
        println!(
            "bundles {pct:>2} % chosen: {ms:.2} ms/token, {bw:.2} GB/s of {:.0} MB; {:.2}x dense's GB/s, {:.2}x dense's speed",
            bytes as f64 / 1e6,
            bw / dw,
            dense / ms
        );
        // The memory system alone on the same records: one load per cache line, no compute.
        let mut token = 0;
        let read = time_tokens(|| {
            let set = &sets[token % sets.len()];
            token += 1;
            std::thread::scope(|sc| {
                for t in 0..THREADS {
                    let (layers, barrier) = (&layers, &barrier);
                    sc.spawn(move || {
                        let mut sum = 0u64;
                        for (l, chosen) in layers.iter().zip(set) {
                            let rb = l.layout.record_bytes();
                            for &i in chosen.iter().filter(|&&i| (i as usize / 128) % THREADS == t) {
                                let r = &l.records[i as usize * rb..][..rb];
                                sum += r.iter().step_by(64).map(|&b| b as u64).sum::<u64>();
                            }
                            barrier.wait();
                        }
                        std::hint::black_box(sum);
                    });
                }
            })
        });
        println!("  the same records read without compute: {read:.2} ms/token, {:.2} GB/s", gbs(bytes, read));
    }
}

/// Thread `t`'s share of `n` items.
fn split(n: usize, t: usize) -> std::ops::Range<usize> {
    let per = n.div_ceil(THREADS);
    (t * per).min(n)..((t + 1) * per).min(n)
}

/// The median ms of `TOKENS` calls after one warm-up.
fn time_tokens(mut f: impl FnMut()) -> f64 {
    f();
    let mut ms: Vec<f64> = (0..TOKENS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    ms[TOKENS / 2]
}
