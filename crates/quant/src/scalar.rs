//! Scalar reference kernels: dequantize, quantize and dot product for every format.
//!
//! This is the readable definition of each format's numerics; the SIMD kernels in `x86` are tested
//! against it. Everything mirrors GGML's reference C code (`ggml-quants.c` and the `_generic` dot
//! products in `ggml-cpu/quants.c`):
//!
//! - per-block integer sums are exact `i32`s; each block adds `(d_w * d_a) * sumi` (plus
//!   `m_w * s_a` for Q4_1) to an `f32` running sum, in block order;
//! - scales are stored as IEEE half (`f16`, round-to-nearest-even), except Q8_K's `f32`;
//! - the activation quantizers round half away from zero (C `roundf`) for Q8_0 / Q8_1 and half to
//!   even (GGML's `nearest_int`) for Q8_K, exactly as GGML's `quantize_row_*_ref` do.
//!
//! The K-quant formats (Q4_K, Q5_K, Q6_K) live in [`crate::scalar_k`]; [`dot_fn`] and
//! [`dequantize_row`] forward to it.
//!
//! All functions panic (never read out of bounds) on rows whose byte length is too short or whose
//! value count is not a whole number of blocks.

use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::{scalar_k, ActType, Dot4Fn, Dot4RowsFn, DotFn, WeightType};
use bytemuck::Pod;
use half::{bf16, f16};

/// Views the first `nb` blocks of `bytes` as block structs (blocks have alignment 1, so this never
/// fails for a long enough slice).
///
/// # Panics
/// If `bytes` holds fewer than `nb` blocks.
#[inline]
pub(crate) fn blocks<B: Pod>(bytes: &[u8], nb: usize) -> &[B] {
    let need = nb * std::mem::size_of::<B>();
    assert!(bytes.len() >= need, "row too short: {} bytes, need {need}", bytes.len());
    bytemuck::cast_slice(&bytes[..need])
}

/// Mutable version of [`blocks`].
#[inline]
fn blocks_mut<B: Pod>(bytes: &mut [u8], nb: usize) -> &mut [B] {
    let need = nb * std::mem::size_of::<B>();
    assert!(bytes.len() >= need, "output too short: {} bytes, need {need}", bytes.len());
    bytemuck::cast_slice_mut(&mut bytes[..need])
}

/// Number of `bs`-value blocks in `n` values; panics if `n` is not a multiple of `bs`.
#[inline]
pub(crate) fn block_count(n: usize, bs: usize) -> usize {
    assert!(n.is_multiple_of(bs), "{n} values is not a whole number of {bs}-value blocks");
    n / bs
}

#[inline(always)]
fn f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// Reads `n` little-endian f32 values from the front of `b` (which may be unaligned).
#[inline]
fn f32s(b: &[u8], n: usize) -> impl Iterator<Item = f32> + '_ {
    assert!(b.len() >= 4 * n, "row too short: {} bytes, need {}", b.len(), 4 * n);
    b[..4 * n].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Reads `n` little-endian u16 values from the front of `b`.
#[inline]
fn u16s(b: &[u8], n: usize) -> impl Iterator<Item = u16> + '_ {
    assert!(b.len() >= 2 * n, "row too short: {} bytes, need {}", b.len(), 2 * n);
    b[..2 * n].chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------

/// The scalar dot kernel for a weight type (weights × activations quantized to
/// [`WeightType::act_type`]).
pub fn dot_fn(t: WeightType) -> DotFn {
    match t {
        WeightType::F32 => dot_f32,
        WeightType::F16 => dot_f16,
        WeightType::BF16 => dot_bf16,
        WeightType::Q4_0 => dot_q4_0,
        WeightType::Q4_1 => dot_q4_1,
        WeightType::Q5_0 => dot_q5_0,
        WeightType::Q8_0 => dot_q8_0,
        WeightType::Q4_K => scalar_k::dot_q4_k,
        WeightType::Q5_K => scalar_k::dot_q5_k,
        WeightType::Q6_K => scalar_k::dot_q6_k,
    }
}

crate::dot4_by_dot!(dot4_f32 = dot_f32);
crate::dot4_by_dot!(dot4_f16 = dot_f16);
crate::dot4_by_dot!(dot4_bf16 = dot_bf16);
crate::dot4_by_dot!(dot4_q4_0 = dot_q4_0);
crate::dot4_by_dot!(dot4_q4_1 = dot_q4_1);
crate::dot4_by_dot!(dot4_q5_0 = dot_q5_0);
crate::dot4_by_dot!(dot4_q8_0 = dot_q8_0);
crate::dot4_by_dot!(dot4_q4_k = scalar_k::dot_q4_k);
crate::dot4_by_dot!(dot4_q5_k = scalar_k::dot_q5_k);
crate::dot4_by_dot!(dot4_q6_k = scalar_k::dot_q6_k);

/// The scalar four-token dot kernel for a weight type: four calls of [`dot_fn`]`(t)`.
pub fn dot4_fn(t: WeightType) -> Dot4Fn {
    match t {
        WeightType::F32 => dot4_f32,
        WeightType::F16 => dot4_f16,
        WeightType::BF16 => dot4_bf16,
        WeightType::Q4_0 => dot4_q4_0,
        WeightType::Q4_1 => dot4_q4_1,
        WeightType::Q5_0 => dot4_q5_0,
        WeightType::Q8_0 => dot4_q8_0,
        WeightType::Q4_K => dot4_q4_k,
        WeightType::Q5_K => dot4_q5_k,
        WeightType::Q6_K => dot4_q6_k,
    }
}

crate::rows_by_dot4!(rows_f32 = dot4_f32);
crate::rows_by_dot4!(rows_f16 = dot4_f16);
crate::rows_by_dot4!(rows_bf16 = dot4_bf16);
crate::rows_by_dot4!(rows_q4_0 = dot4_q4_0);
crate::rows_by_dot4!(rows_q4_1 = dot4_q4_1);
crate::rows_by_dot4!(rows_q5_0 = dot4_q5_0);
crate::rows_by_dot4!(rows_q8_0 = dot4_q8_0);
crate::rows_by_dot4!(rows_q4_k = dot4_q4_k);
crate::rows_by_dot4!(rows_q5_k = dot4_q5_k);
crate::rows_by_dot4!(rows_q6_k = dot4_q6_k);

/// The scalar multi-row four-token kernel: [`dot4_fn`]`(t)` per row.
pub fn dot4_rows_fn(t: WeightType) -> Dot4RowsFn {
    match t {
        WeightType::F32 => rows_f32,
        WeightType::F16 => rows_f16,
        WeightType::BF16 => rows_bf16,
        WeightType::Q4_0 => rows_q4_0,
        WeightType::Q4_1 => rows_q4_1,
        WeightType::Q5_0 => rows_q5_0,
        WeightType::Q8_0 => rows_q8_0,
        WeightType::Q4_K => rows_q4_k,
        WeightType::Q5_K => rows_q5_k,
        WeightType::Q6_K => rows_q6_k,
    }
}

/// Dequantizes one row of `out.len()` values from raw block bytes.
///
/// # Panics
/// If `out.len()` is not a multiple of the block size or `w` is shorter than the row.
pub fn dequantize_row(t: WeightType, w: &[u8], out: &mut [f32]) {
    match t {
        WeightType::F32 => dequantize_f32(w, out),
        WeightType::F16 => dequantize_f16(w, out),
        WeightType::BF16 => dequantize_bf16(w, out),
        WeightType::Q4_0 => dequantize_q4_0(w, out),
        WeightType::Q4_1 => dequantize_q4_1(w, out),
        WeightType::Q5_0 => dequantize_q5_0(w, out),
        WeightType::Q8_0 => dequantize_q8_0(w, out),
        WeightType::Q4_K => scalar_k::dequantize_q4_k(w, out),
        WeightType::Q5_K => scalar_k::dequantize_q5_k(w, out),
        WeightType::Q6_K => scalar_k::dequantize_q6_k(w, out),
    }
}

/// Quantizes an f32 activation row into `out` (GGML's reference quantizers).
///
/// # Panics
/// If `x.len()` is not a multiple of the block size or `out.len() != t.row_bytes(x.len())`.
pub fn quantize_act(t: ActType, x: &[f32], out: &mut [u8]) {
    block_count(x.len(), t.block_size());
    assert_eq!(out.len(), t.row_bytes(x.len()), "activation buffer size for {t:?}");
    match t {
        ActType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActType::Q8_0 => quantize_q8_0(x, out),
        ActType::Q8_1 => quantize_q8_1(x, out),
        ActType::Q8_K => quantize_q8_k(x, out),
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantization
// ---------------------------------------------------------------------------------------------

/// F32 row: little-endian f32 values.
pub fn dequantize_f32(w: &[u8], out: &mut [f32]) {
    let n = out.len();
    for (o, v) in out.iter_mut().zip(f32s(w, n)) {
        *o = v;
    }
}

/// F16 row: IEEE binary16 values.
pub fn dequantize_f16(w: &[u8], out: &mut [f32]) {
    let n = out.len();
    for (o, h) in out.iter_mut().zip(u16s(w, n)) {
        *o = f16::from_bits(h).to_f32();
    }
}

/// BF16 row: the top 16 bits of an f32.
pub fn dequantize_bf16(w: &[u8], out: &mut [f32]) {
    let n = out.len();
    for (o, h) in out.iter_mut().zip(u16s(w, n)) {
        *o = bf16::from_bits(h).to_f32();
    }
}

/// Q4_0: `x = d * (q - 8)`; byte `j` holds element `j` (low nibble) and `j + 16` (high nibble).
pub fn dequantize_q4_0(w: &[u8], out: &mut [f32]) {
    let nb = block_count(out.len(), 32);
    for (b, y) in blocks::<BlockQ4_0>(w, nb).iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d();
        for j in 0..16 {
            y[j] = ((b.qs[j] & 0xF) as i32 - 8) as f32 * d;
            y[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Q4_1: `x = d * q + m`.
pub fn dequantize_q4_1(w: &[u8], out: &mut [f32]) {
    let nb = block_count(out.len(), 32);
    for (b, y) in blocks::<BlockQ4_1>(w, nb).iter().zip(out.chunks_exact_mut(32)) {
        let (d, m) = (b.d(), b.m());
        for j in 0..16 {
            y[j] = (b.qs[j] & 0xF) as f32 * d + m;
            y[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// Q5_0: `x = d * (q - 16)` with `q = nibble | (bit j of qh) << 4` for element `j`.
pub fn dequantize_q5_0(w: &[u8], out: &mut [f32]) {
    let nb = block_count(out.len(), 32);
    for (b, y) in blocks::<BlockQ5_0>(w, nb).iter().zip(out.chunks_exact_mut(32)) {
        let (d, qh) = (b.d(), b.qh());
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = (((b.qs[j] & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((b.qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }
}

/// Q8_0: `x = d * q`.
pub fn dequantize_q8_0(w: &[u8], out: &mut [f32]) {
    let nb = block_count(out.len(), 32);
    for (b, y) in blocks::<BlockQ8_0>(w, nb).iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Weight quantizers (GGML's `quantize_row_*_ref`; used to make test data)
// ---------------------------------------------------------------------------------------------

/// Quantizes a weight row of `x.len()` values to `t`'s block bytes with the reference quantizer
/// (the K-quant ones are [`scalar_k`]'s). For tests, benchmarks and tools.
///
/// # Panics
/// If `x.len()` is not a multiple of the block size.
pub fn quantize_row(t: WeightType, x: &[f32]) -> Vec<u8> {
    match t {
        WeightType::F32 => quantize_row_f32(x),
        WeightType::F16 => quantize_row_f16(x),
        WeightType::BF16 => quantize_row_bf16(x),
        WeightType::Q4_0 => quantize_row_q4_0(x),
        WeightType::Q4_1 => quantize_row_q4_1(x),
        WeightType::Q5_0 => quantize_row_q5_0(x),
        WeightType::Q8_0 => quantize_row_q8_0(x),
        WeightType::Q4_K => scalar_k::quantize_row_q4_k(x),
        WeightType::Q5_K => scalar_k::quantize_row_q5_k(x),
        WeightType::Q6_K => scalar_k::quantize_row_q6_k(x),
    }
}

/// The value of largest magnitude in `x`, with its sign (the first one on a tie), as GGML finds it.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// F32 weight row (little-endian bytes).
pub fn quantize_row_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// F16 weight row (round to nearest even).
pub fn quantize_row_f16(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect()
}

/// BF16 weight row (round to nearest even, as GGML's `ggml_compute_fp32_to_bf16`).
pub fn quantize_row_bf16(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect()
}

/// Q4_0 weight row: `d = max / -8` (max = signed value of largest magnitude),
/// `q = min(15, trunc(x / d + 8.5))`.
pub fn quantize_row_q4_0(x: &[f32]) -> Vec<u8> {
    let nb = block_count(x.len(), 32);
    let mut out = vec![0u8; nb * std::mem::size_of::<BlockQ4_0>()];
    for (b, x) in blocks_mut::<BlockQ4_0>(&mut out, nb).iter_mut().zip(x.chunks_exact(32)) {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bits(d);
        for j in 0..16 {
            // `as i8` then `min(15)` as GGML's `MIN(15, (int8_t)(x0 + 8.5f))`.
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
    out
}

/// Q4_1 weight row: `d = (max - min) / 15`, `m = min`, `q = min(15, trunc((x - min) / d + 0.5))`.
pub fn quantize_row_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; block_count(x.len(), 32) * std::mem::size_of::<BlockQ4_1>()];
    quantize_q4_1(x, &mut out);
    out
}

/// [`quantize_row_q4_1`] into a caller's buffer (`out` must hold at least the row's blocks).
pub fn quantize_q4_1(x: &[f32], out: &mut [u8]) {
    let nb = block_count(x.len(), 32);
    for (b, x) in blocks_mut::<BlockQ4_1>(out, nb).iter_mut().zip(x.chunks_exact(32)) {
        let min = x.iter().fold(f32::MAX, |a, &v| if v < a { v } else { a });
        let max = x.iter().fold(-f32::MAX, |a, &v| if v > a { v } else { a });
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bits(d);
        b.m = f16_bits(min);
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Q5_0 weight row: `d = max / -16`, `q = min(31, trunc(x / d + 16.5))`, fifth bits in `qh`.
pub fn quantize_row_q5_0(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; block_count(x.len(), 32) * std::mem::size_of::<BlockQ5_0>()];
    quantize_q5_0(x, &mut out);
    out
}

/// [`quantize_row_q5_0`] into a caller's buffer (`out` must hold at least the row's blocks).
pub fn quantize_q5_0(x: &[f32], out: &mut [u8]) {
    let nb = block_count(x.len(), 32);
    for (b, x) in blocks_mut::<BlockQ5_0>(out, nb).iter_mut().zip(x.chunks_exact(32)) {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bits(d);
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let q1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
            b.qs[j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
            qh |= ((q0 as u32 & 0x10) >> 4) << j;
            qh |= ((q1 as u32 & 0x10) >> 4) << (j + 16);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// Q8_0 weight row; the same bytes as the Q8_0 activation quantizer.
pub fn quantize_row_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ActType::Q8_0.row_bytes(block_count(x.len(), 32) * 32)];
    quantize_q8_0(x, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers
// ---------------------------------------------------------------------------------------------

/// `d` and `1/d` of a Q8_0 / Q8_1 block: `d = amax / 127`.
#[inline]
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// Q8_0 (GGML `quantize_row_q8_0_ref`): `d = amax / 127`, `q = round(x / d)` (half away from zero).
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let nb = block_count(x.len(), 32);
    for (b, x) in blocks_mut::<BlockQ8_0>(out, nb).iter_mut().zip(x.chunks_exact(32)) {
        let (d, id) = q8_scale(x);
        b.d = f16_bits(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Q8_1 (GGML `quantize_row_q8_1_ref`): as Q8_0, plus `s = d * sum(q)` (f32 `d`, stored as f16).
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    let nb = block_count(x.len(), 32);
    for (b, x) in blocks_mut::<BlockQ8_1>(out, nb).iter_mut().zip(x.chunks_exact(32)) {
        let (d, id) = q8_scale(x);
        b.d = f16_bits(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.s = f16_bits(sum as f32 * d);
    }
}

/// Q8_K (GGML `quantize_row_q8_K_ref`): `iscale = -127 / max` (max = signed value of largest
/// magnitude), `q = min(127, round_half_even(iscale * x))`, `d = 1 / iscale`, `bsums[j]` = sum of
/// `q[16j..16j+16]`. An all-zero block gets `d = 0` and zero quants (and zero sums).
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let nb = block_count(x.len(), 256);
    for (b, x) in blocks_mut::<BlockQ8K>(out, nb).iter_mut().zip(x.chunks_exact(256)) {
        let max = signed_absmax(x);
        if max == 0.0 {
            *b = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (j, s) in b.bsums.iter_mut().enumerate() {
            let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            *s = (sum as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

// ---------------------------------------------------------------------------------------------
// Dot products
// ---------------------------------------------------------------------------------------------

/// F32 weights × F32 activations: a plain sequential f32 sum.
pub fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    f32s(w, n).zip(f32s(a, n)).map(|(w, a)| w * a).sum()
}

/// F16 weights × F32 activations.
pub fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    u16s(w, n).zip(f32s(a, n)).map(|(w, a)| f16::from_bits(w).to_f32() * a).sum()
}

/// BF16 weights × F32 activations.
pub fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    u16s(w, n).zip(f32s(a, n)).map(|(w, a)| bf16::from_bits(w).to_f32() * a).sum()
}

/// Q4_0 × Q8_0: `Σ_blocks (d_w * d_a) * Σ (q_w - 8) * q_a`.
pub fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = block_count(n, 32);
    let mut sumf = 0.0f32;
    for (x, y) in blocks::<BlockQ4_0>(w, nb).iter().zip(blocks::<BlockQ8_0>(a, nb)) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += ((x.qs[j] & 0xF) as i32 - 8) * y.qs[j] as i32;
            sumi += ((x.qs[j] >> 4) as i32 - 8) * y.qs[j + 16] as i32;
        }
        sumf += (x.d() * y.d()) * sumi as f32;
    }
    sumf
}

/// Q4_1 × Q8_1: `Σ_blocks (d_w * d_a) * Σ q_w * q_a + m_w * s_a`.
pub fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = block_count(n, 32);
    let mut sumf = 0.0f32;
    for (x, y) in blocks::<BlockQ4_1>(w, nb).iter().zip(blocks::<BlockQ8_1>(a, nb)) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (x.qs[j] & 0xF) as i32 * y.qs[j] as i32;
            sumi += (x.qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        sumf += (x.d() * y.d()) * sumi as f32 + x.m() * y.s();
    }
    sumf
}

/// Q5_0 × Q8_0: `Σ_blocks (d_w * d_a) * Σ (q_w - 16) * q_a`.
pub fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = block_count(n, 32);
    let mut sumf = 0.0f32;
    for (x, y) in blocks::<BlockQ5_0>(w, nb).iter().zip(blocks::<BlockQ8_0>(a, nb)) {
        let qh = x.qh();
        let mut sumi = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            sumi += (((x.qs[j] & 0xF) as u32 | h0) as i32 - 16) * y.qs[j] as i32;
            sumi += (((x.qs[j] >> 4) as u32 | h1) as i32 - 16) * y.qs[j + 16] as i32;
        }
        sumf += (x.d() * y.d()) * sumi as f32;
    }
    sumf
}

/// Q8_0 × Q8_0: `Σ_blocks (d_w * d_a) * Σ q_w * q_a`.
pub fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = block_count(n, 32);
    let mut sumf = 0.0f32;
    for (x, y) in blocks::<BlockQ8_0>(w, nb).iter().zip(blocks::<BlockQ8_0>(a, nb)) {
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sumf += (x.d() * y.d()) * sumi as f32;
    }
    sumf
}
