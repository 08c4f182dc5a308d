//! The 16-row interleaved Q5_0 layout (`sift_quant::packed_q5_0`): packing is lossless, and the
//! packed reference gemv agrees with the plain scalar dot and with an f32 dot of dequantized
//! values.
//!
//! Every instruction set's kernel equals the scalar reference bit for bit, and the four-token
//! product equals four one-token products bit for bit. Tolerances of the reference (as
//! tests/packed.rs): vs `scalar::dot_q5_0` per row `≤ 1e-4 · D` (the same integer sums, another
//! float summation order), and vs `Σ w·a` of dequantized weights and activations (f64 sum)
//! `≤ 1e-3 · D`, where `D = max(|reference|, 1e-2 · Σ|w·a|)`. Data: Gaussian rows quantized by
//! `quantize_row_q5_0`, random raw block bytes (every bit pattern of quants) with −128/127
//! activations, runs of several groups, and real weights (every Q5_0 tensor of
//! `models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` or `$SIFT_TEST_GGUF`, a few row groups each;
//! skipped with a message when absent).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_quant::blocks::BlockQ8_0;
use sift_quant::packed_q5_0::{
    gather_rows_q5_0_x16, gemm_q5_0_x16_on, gemv_q5_0_x16, gemv_q5_0_x16_on, pack_q5_0_x16, unpack_q5_0_x16,
    PACK_ROWS_Q5_0,
};
use sift_quant::{scalar, ActType, Isa, WeightType};

const ROWS: usize = PACK_ROWS_Q5_0;
const BLOCK: usize = 22;
const LENS: [usize; 4] = [32, 96, 896, 4864];

fn gaussian(rng: &mut StdRng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f32 = rng.random::<f32>().max(1e-12);
            let u2: f32 = rng.random();
            sigma * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

/// Random raw Q5_0 blocks with sane (finite, positive) f16 scales.
fn random_blocks(rng: &mut StdRng, nb: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..nb * BLOCK).map(|_| rng.random()).collect();
    for b in w.chunks_exact_mut(BLOCK) {
        b[0..2].copy_from_slice(&half::f16::from_f32(rng.random_range(1e-4f32..1e-1)).to_le_bytes());
    }
    w
}

/// Q8_0 activations: quantized Gaussian values, or raw −128/127 quants (the extremes).
fn activations(rng: &mut StdRng, n: usize, extreme: bool) -> Vec<u8> {
    let mut a = vec![0u8; ActType::Q8_0.row_bytes(n)];
    ActType::Q8_0.quantize(&gaussian(rng, n, 1.0), &mut a);
    if extreme {
        for b in bytemuck::cast_slice_mut::<u8, BlockQ8_0>(&mut a) {
            for q in b.qs.iter_mut() {
                *q = [-128, 127][rng.random_range(0..2)];
            }
        }
    }
    a
}

/// Packs the row groups `w` (plain rows, a multiple of 16), checks the round trip, the kernels
/// against the reference, and the reference against the plain scalar dot and the f32 dot.
fn check_groups(rng: &mut StdRng, n: usize, w: &[u8], a: &[u8], what: &str) {
    let nb = n / 32;
    let gb = ROWS * nb * BLOCK;
    let mut packed = vec![0u8; w.len()];
    for (src, dst) in w.chunks_exact(gb).zip(packed.chunks_exact_mut(gb)) {
        pack_q5_0_x16(src, nb, dst);
    }
    let mut back = vec![0u8; w.len()];
    for (src, dst) in packed.chunks_exact(gb).zip(back.chunks_exact_mut(gb)) {
        unpack_q5_0_x16(src, nb, dst);
    }
    assert!(back == w, "{what}: unpack(pack(rows)) differs");
    let rows = w.len() / (nb * BLOCK);
    let mut got = vec![0f32; rows];
    gemv_q5_0_x16(n, &packed, a, &mut got);
    let others: Vec<Vec<u8>> = (0..3).map(|k| activations(rng, n, k == 1)).collect();
    let four = [a, &others[0][..], &others[1][..], &others[2][..]];
    let one: Vec<Vec<f32>> = four
        .iter()
        .map(|a| {
            let mut y = vec![0f32; rows];
            gemv_q5_0_x16(n, &packed, a, &mut y);
            y
        })
        .collect();
    for isa in Isa::available() {
        let mut k = vec![0f32; rows];
        gemv_q5_0_x16_on(isa, n, &packed, a, &mut k);
        assert!(
            k.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what} n={n} {isa:?}: kernel differs from the reference"
        );
        let mut many = vec![[0f32; 4]; rows];
        gemm_q5_0_x16_on(isa, n, &packed, four, &mut many);
        for (t, one) in one.iter().enumerate() {
            assert!(
                many.iter().zip(one).all(|(m, y)| m[t].to_bits() == y.to_bits()),
                "{what} n={n} {isa:?}: token {t} of four differs from its one-token product"
            );
        }
    }
    let ad: Vec<f32> = bytemuck::cast_slice::<u8, BlockQ8_0>(a)
        .iter()
        .flat_map(|b| {
            let d = half::f16::from_le_bytes(b.d).to_f32();
            b.qs.iter().map(move |&q| d * q as f32)
        })
        .collect();
    let rb = nb * BLOCK;
    for (r, &g) in got.iter().enumerate() {
        let row = &w[r * rb..(r + 1) * rb];
        let plain = scalar::dot_q5_0(n, row, a);
        let mut wd = vec![0f32; n];
        scalar::dequantize_q5_0(row, &mut wd);
        let reference: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x * y) as f64).sum();
        let abs: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x * y).abs() as f64).sum();
        let denom = |v: f64| v.abs().max(1e-2 * abs).max(f64::MIN_POSITIVE);
        let e1 = (g as f64 - plain as f64).abs() / denom(plain as f64);
        assert!(e1 <= 1e-4, "{what} n={n} row {r}: packed {g} vs scalar {plain} (rel err {e1:.2e})");
        let e2 = (g as f64 - reference).abs() / denom(reference);
        assert!(e2 <= 1e-3, "{what} n={n} row {r}: packed {g} vs f32 {reference} (rel err {e2:.2e})");
    }
}

#[test]
fn packed_q5_0_groups_round_trip_and_agree_on_quantized_rows() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0b01);
    for &n in &LENS {
        // Two groups in one call: the kernels walk runs of groups.
        let rows: Vec<u8> =
            (0..2 * ROWS).flat_map(|r| scalar::quantize_row_q5_0(&gaussian(&mut rng, n, [0.02, 1.0][r % 2]))).collect();
        for extreme in [false, true] {
            let a = activations(&mut rng, n, extreme);
            check_groups(&mut rng, n, &rows, &a, &format!("quantized, extreme={extreme}"));
        }
    }
}

#[test]
fn packed_q5_0_groups_round_trip_and_agree_on_random_block_bytes() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0b02);
    for &n in &LENS {
        for round in 0..3 {
            let rows = random_blocks(&mut rng, (round + 1) * ROWS * n / 32);
            let a = activations(&mut rng, n, round % 2 == 1);
            check_groups(&mut rng, n, &rows, &a, &format!("random bytes, round {round}"));
        }
    }
}

#[test]
fn packed_q5_0_groups_agree_on_real_weights() {
    let path = std::env::var_os("SIFT_TEST_GGUF").map(Into::into).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    });
    assert!(path.exists(), "{} missing: run scripts/fetch-model.sh qwen2.5-0.5b first", path.display());
    let file = sift_gguf::GgufFile::open(&path).expect("open model");
    let mut rng = StdRng::seed_from_u64(0x5eed_0b03);
    let mut checked = 0;
    for t in &file.gguf.tensors {
        if WeightType::from_ggml_id(t.ty.id()) != Some(WeightType::Q5_0) || t.dims.len() != 2 {
            continue;
        }
        let (n, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        if rows % ROWS != 0 || checked >= 24 {
            continue;
        }
        let data = file.tensor_bytes(&t.name).expect("tensor data");
        let gb = ROWS * n / 32 * BLOCK;
        let g = rng.random_range(0..rows / ROWS);
        let a = activations(&mut rng, n, false);
        check_groups(&mut rng, n, &data[g * gb..(g + 1) * gb], &a, &format!("{} group {g}", t.name));
        checked += 1;
    }
    assert!(checked > 0, "no Q5_0 tensor in {}", path.display());
}

/// A group gathered from rows of other packed groups (sparse prefill's chosen neurons) is the
/// group packing those rows gives: random block bytes, rows in any order, from several groups,
/// one row twice.
#[test]
fn gathered_rows_are_the_packing_of_those_rows() {
    let mut rng = StdRng::seed_from_u64(0x5eed_6a7e);
    for &n in &LENS {
        let (nb, groups) = (n / 32, 3);
        let rb = nb * BLOCK;
        let plain = random_blocks(&mut rng, groups * PACK_ROWS_Q5_0 * nb);
        let mut packed = vec![0u8; plain.len()];
        for (s, d) in plain.chunks_exact(PACK_ROWS_Q5_0 * rb).zip(packed.chunks_exact_mut(PACK_ROWS_Q5_0 * rb)) {
            pack_q5_0_x16(s, nb, d);
        }
        let mut chosen: Vec<u32> =
            (0..PACK_ROWS_Q5_0 as u32).map(|_| rng.random_range(0..(groups * PACK_ROWS_Q5_0) as u32)).collect();
        chosen[5] = chosen[9];
        let mut rows_plain = Vec::new();
        for &r in &chosen {
            rows_plain.extend_from_slice(&plain[r as usize * rb..(r as usize + 1) * rb]);
        }
        let mut want = vec![0u8; PACK_ROWS_Q5_0 * rb];
        pack_q5_0_x16(&rows_plain, nb, &mut want);
        let mut got = vec![0xA5u8; PACK_ROWS_Q5_0 * rb];
        gather_rows_q5_0_x16(&packed, nb, &chosen, &mut got);
        assert!(got == want, "n = {n}: gathered group differs from packing the chosen rows");
        let mut back = vec![0u8; PACK_ROWS_Q5_0 * rb];
        unpack_q5_0_x16(&got, nb, &mut back);
        assert!(back == rows_plain, "n = {n}: the gathered group does not unpack to the chosen rows");
    }
}
