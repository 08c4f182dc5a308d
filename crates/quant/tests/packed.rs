//! The 8-row interleaved Q4_K layout (`sift_quant::packed`): packing is lossless, and the packed
//! reference gemv agrees with the plain scalar dot and with an f32 dot of dequantized values.
//!
//! Every instruction set's kernel equals the scalar reference bit for bit. Tolerances of the
//! reference (as tests/kquants.rs): packed gemv vs `scalar_k::dot_q4_k` per row `≤ 1e-4 · D`
//! (the same integer sums, a different float summation order), and vs `Σ w·a` of dequantized
//! weights and activations (f64 sum) `≤ 1e-3 · D`, where `D = max(|reference|, 1e-2 · Σ|w·a|)`.
//! Data: Gaussian rows quantized by `quantize_row_q4_k`, random raw block bytes (every bit pattern
//! of quants and scales) with −128/127 activations, and real weights (every Q4_K tensor of
//! `models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` or `$SIFT_TEST_GGUF`, a few row groups each;
//! skipped with a message when absent).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_quant::blocks::BlockQ8K;
use sift_quant::packed::{gemm_q4k_x8_on, gemv_q4k_x8, gemv_q4k_x8_on, pack_q4k_x8, unpack_q4k_x8, PACK_ROWS};
use sift_quant::{scalar_k, ActType, Isa, WeightType};

const QK_K: usize = 256;
const LENS: [usize; 3] = [256, 1536, 4864];

fn gaussian(rng: &mut StdRng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f32 = rng.random::<f32>().max(1e-12);
            let u2: f32 = rng.random();
            sigma * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

/// Random raw Q4_K blocks with sane (finite, positive) f16 scales.
fn random_blocks(rng: &mut StdRng, nb: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..nb * 144).map(|_| rng.random()).collect();
    for b in w.chunks_exact_mut(144) {
        b[0..2].copy_from_slice(&half::f16::from_f32(rng.random_range(1e-4f32..1e-1)).to_le_bytes());
        b[2..4].copy_from_slice(&half::f16::from_f32(rng.random_range(1e-4f32..1e-1)).to_le_bytes());
    }
    w
}

/// Q8_K activations: quantized Gaussian values, or raw ±127/−128 quants (the extremes).
fn activations(rng: &mut StdRng, n: usize, extreme: bool) -> Vec<u8> {
    let mut a = vec![0u8; ActType::Q8_K.row_bytes(n)];
    ActType::Q8_K.quantize(&gaussian(rng, n, 1.0), &mut a);
    if extreme {
        for b in bytemuck::cast_slice_mut::<u8, BlockQ8K>(&mut a) {
            for q in b.qs.iter_mut() {
                *q = [-128, 127][rng.random_range(0..2)];
            }
            for (j, s) in b.bsums.iter_mut().enumerate() {
                let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
                *s = (sum as i16).to_le_bytes();
            }
        }
    }
    a
}

/// Q8_K activation blocks `a` with each block's quants rotated by `s` places (sums recomputed):
/// another valid activation row.
fn rotate_activation(a: &[u8], s: usize) -> Vec<u8> {
    let mut blocks: Vec<BlockQ8K> = bytemuck::cast_slice::<u8, BlockQ8K>(a).to_vec();
    for b in &mut blocks {
        b.qs.rotate_left(s);
        for (k, sum) in b.bsums.iter_mut().enumerate() {
            *sum = b.qs[16 * k..16 * (k + 1)].iter().map(|&q| q as i16).sum::<i16>().to_le_bytes();
        }
    }
    bytemuck::cast_slice(&blocks).to_vec()
}

/// Packs the 8 rows `w` (plain, one after another), checks the round trip, and checks the
/// packed gemv against the plain scalar dot and the f32 dot of every row.
fn check_group(n: usize, w: &[u8], a: &[u8], what: &str) {
    let nb = n / QK_K;
    let mut packed = vec![0u8; w.len()];
    pack_q4k_x8(w, nb, &mut packed);
    let mut back = vec![0u8; w.len()];
    unpack_q4k_x8(&packed, nb, &mut back);
    assert!(back == w, "{what}: unpack(pack(rows)) differs");
    let got = gemv_q4k_x8(n, &packed, a);
    // Every kernel is the reference bit for bit.
    for isa in Isa::available() {
        let k = gemv_q4k_x8_on(isa, n, &packed, a);
        assert!(k.map(f32::to_bits) == got.map(f32::to_bits), "{what} n={n} {isa:?}: {k:?} vs reference {got:?}");
        // Four tokens at once (here the same row among three others with its bytes rotated):
        // each is its own one-token product, bit for bit.
        let others: Vec<Vec<u8>> = (1..4).map(|s| rotate_activation(a, s)).collect();
        let four = [a, &others[0][..], &others[1][..], &others[2][..]];
        let many = gemm_q4k_x8_on(isa, n, &packed, four);
        for (t, at) in four.iter().enumerate() {
            let one = gemv_q4k_x8(n, &packed, at);
            assert!(many[t].map(f32::to_bits) == one.map(f32::to_bits), "{what} n={n} {isa:?}: token {t} of four");
        }
    }
    let ad: Vec<f32> = bytemuck::cast_slice::<u8, BlockQ8K>(a)
        .iter()
        .flat_map(|b| b.qs.iter().map(move |&q| b.d() * q as f32))
        .collect();
    let rb = nb * 144;
    for (r, &g) in got.iter().enumerate() {
        let row = &w[r * rb..(r + 1) * rb];
        let scalar = scalar_k::dot_q4_k(n, row, a);
        let mut wd = vec![0f32; n];
        scalar_k::dequantize_q4_k(row, &mut wd);
        let reference: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x * y) as f64).sum();
        let abs: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x * y).abs() as f64).sum();
        let denom = |v: f64| v.abs().max(1e-2 * abs).max(f64::MIN_POSITIVE);
        let e1 = (g as f64 - scalar as f64).abs() / denom(scalar as f64);
        assert!(e1 <= 1e-4, "{what} n={n} row {r}: packed {g} vs scalar {scalar} (rel err {e1:.2e})");
        let e2 = (g as f64 - reference).abs() / denom(reference);
        assert!(e2 <= 1e-3, "{what} n={n} row {r}: packed {g} vs f32 {reference} (rel err {e2:.2e})");
    }
}

#[test]
fn packed_groups_round_trip_and_agree_on_quantized_rows() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0a01);
    for &n in &LENS {
        let rows: Vec<u8> = (0..PACK_ROWS)
            .flat_map(|r| scalar_k::quantize_row_q4_k(&gaussian(&mut rng, n, [0.02, 1.0][r % 2])))
            .collect();
        for extreme in [false, true] {
            let a = activations(&mut rng, n, extreme);
            check_group(n, &rows, &a, &format!("quantized, extreme={extreme}"));
        }
    }
}

#[test]
fn packed_groups_round_trip_and_agree_on_random_block_bytes() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0a02);
    for &n in &LENS {
        for round in 0..4 {
            let rows = random_blocks(&mut rng, PACK_ROWS * n / QK_K);
            let a = activations(&mut rng, n, round % 2 == 1);
            check_group(n, &rows, &a, &format!("random bytes, round {round}"));
        }
    }
}

#[test]
fn packed_groups_agree_on_real_weights() {
    let path = std::env::var_os("SIFT_TEST_GGUF").map(Into::into).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    });
    assert!(path.exists(), "{} missing: run scripts/fetch-model.sh qwen2.5-0.5b first", path.display());
    let file = sift_gguf::GgufFile::open(&path).expect("open model");
    let mut rng = StdRng::seed_from_u64(0x5eed_0a03);
    let mut checked = 0;
    for t in &file.gguf.tensors {
        if WeightType::from_ggml_id(t.ty.id()) != Some(WeightType::Q4_K) || t.dims.len() != 2 {
            continue;
        }
        let (n, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let data = file.tensor_bytes(&t.name).expect("tensor data");
        let rb = n / QK_K * 144;
        for _ in 0..2 {
            let g = rng.random_range(0..rows / PACK_ROWS);
            let w = &data[g * PACK_ROWS * rb..(g + 1) * PACK_ROWS * rb];
            let a = activations(&mut rng, n, false);
            check_group(n, w, &a, &format!("{} group {g}", t.name));
            checked += 1;
        }
    }
    assert!(checked > 0, "no Q4_K tensor in {}", path.display());
}
