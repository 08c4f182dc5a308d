//! Scalar reference kernels for the K-quant weight formats (Q4_K, Q5_K, Q6_K).
//!
//! Everything here mirrors GGML's generic C code and is the ground truth the SIMD kernels in
//! `x86::k_quants` are tested against:
//!
//! - `dot_q*_k`: dot product of one weight row with one activation row quantized to Q8_K
//!   (GGML's `ggml_vec_dot_q*_K_q8_K_generic`). Per 256-value super-block the integer part is
//!   exact (i32): `Σ_sub scale_sub · Σ q·a`, minus (Q4_K / Q5_K) `Σ_sub min_sub · bsums` for the
//!   offsets; the block's contribution `d_w·d_a·sumi − dmin_w·d_a·summ` is accumulated in f32.
//! - `dequantize_q*_k`: GGML's `dequantize_row_q*_K`.
//! - `quantize_row_q*_k`: simple, correct weight quantizers for tests and tools (min/max per
//!   sub-block, 6-bit / 8-bit sub-block scales relative to an f16 super-block scale). They are not
//!   GGML's iterative error-minimising search, so they are a little less accurate than llama.cpp's
//!   quantizer: on Gaussian rows `dequantize(quantize(x))` is within about 0.6 of a quantization
//!   step of `x` (the tests allow 0.75). The f16 super-block scales are rounded up so that the
//!   largest sub-block never clips, even when they are subnormal; a sub-block whose range is far
//!   below the block's largest gets a coarse 6-bit scale, as in GGML.
//!
//! Row lengths are whole super-blocks (`n % 256 == 0`); slices that are too short panic (the
//! dispatcher validates shapes before calling).

use crate::blocks::{scale_min_k4, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use bytemuck::Zeroable;
use half::f16;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

const KMASK1: u32 = 0x3f3f_3f3f;
const KMASK2: u32 = 0x0f0f_0f0f;
const KMASK3: u32 = 0x0303_0303;

/// Unpacks the 12 packed scale bytes of a Q4_K / Q5_K block into 16 bytes: bytes 0..8 are the
/// eight 6-bit sub-block scales, bytes 8..16 the eight 6-bit mins (GGML's `utmp` shuffle).
#[inline(always)]
pub(crate) fn unpack_scales_k4(s: &[u8; 12]) -> [u32; 4] {
    let u0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let u1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let u2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let u3 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    [u0 & KMASK1, s_hi, m_lo, u3]
}

/// Splits an unpacked `[u32; 4]` (see [`unpack_scales_k4`]) into (scales, mins) byte arrays.
#[inline(always)]
fn split_scales(u: [u32; 4]) -> ([u8; 8], [u8; 8]) {
    let sc = ((u[0] as u64) | ((u[1] as u64) << 32)).to_le_bytes();
    let mn = ((u[2] as u64) | ((u[3] as u64) << 32)).to_le_bytes();
    (sc, mn)
}

fn blocks<T: bytemuck::Pod>(bytes: &[u8], nb: usize) -> &[T] {
    bytemuck::cast_slice(&bytes[..nb * std::mem::size_of::<T>()])
}

/// Σ over the 16 `bsums` of a Q8_K block, paired per 32-value sub-block, times the 8 mins.
#[inline(always)]
fn mins_dot_bsums(y: &BlockQ8K, mins: &[u8; 8]) -> i32 {
    (0..16).map(|k| y.bsum(k) as i32 * mins[k / 2] as i32).sum()
}

/// Σ q·a over 32 values (`q` unsigned quants, `a` activations); plain loops so LLVM vectorizes.
#[inline(always)]
fn dot32(q: &[u8], a: &[i8]) -> i32 {
    q[..32].iter().zip(&a[..32]).map(|(&q, &a)| q as i16 as i32 * a as i32).sum()
}

/// The 256 quants (0..16) of a Q4_K block, in value order.
#[inline(always)]
fn unpack_q4(x: &BlockQ4K, out: &mut [u8; QK_K]) {
    for j in 0..QK_K / 64 {
        for l in 0..32 {
            out[64 * j + l] = x.qs[32 * j + l] & 0xF;
            out[64 * j + 32 + l] = x.qs[32 * j + l] >> 4;
        }
    }
}

/// The 256 quants (0..32) of a Q5_K block, in value order.
#[inline(always)]
fn unpack_q5(x: &BlockQ5K, out: &mut [u8; QK_K]) {
    for j in 0..QK_K / 64 {
        for l in 0..32 {
            let h = x.qh[l] >> (2 * j);
            out[64 * j + l] = (x.qs[32 * j + l] & 0xF) | ((h & 1) << 4);
            out[64 * j + 32 + l] = (x.qs[32 * j + l] >> 4) | (((h >> 1) & 1) << 4);
        }
    }
}

/// One Q4_K / Q5_K block against its Q8_K block: (Σ scale·Σ q·a, Σ min·bsums).
#[inline(always)]
fn block_sums_k4(q: &[u8; QK_K], scales: &[u8; 12], y: &BlockQ8K) -> (i32, i32) {
    let (sc, mn) = split_scales(unpack_scales_k4(scales));
    let mut sumi = 0i32;
    for (s, (qs, a)) in q.chunks_exact(32).zip(y.qs.chunks_exact(32)).enumerate() {
        sumi += sc[s] as i32 * dot32(qs, a);
    }
    (sumi, mins_dot_bsums(y, &mn))
}

/// Dot product of a Q4_K weight row (`n / 256` blocks) with a Q8_K activation row.
pub fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ4K] = blocks(w, nb);
    let ys: &[BlockQ8K] = blocks(a, nb);
    let mut sumf = 0f32;
    let mut q = [0u8; QK_K];
    for (x, y) in xs.iter().zip(ys) {
        unpack_q4(x, &mut q);
        let (sumi, summ) = block_sums_k4(&q, &x.scales, y);
        let dy = y.d();
        sumf += x.d() * dy * sumi as f32 - x.dmin() * dy * summ as f32;
    }
    sumf
}

/// Dot product of a Q5_K weight row (`n / 256` blocks) with a Q8_K activation row.
pub fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ5K] = blocks(w, nb);
    let ys: &[BlockQ8K] = blocks(a, nb);
    let mut sumf = 0f32;
    let mut q = [0u8; QK_K];
    for (x, y) in xs.iter().zip(ys) {
        unpack_q5(x, &mut q);
        let (sumi, summ) = block_sums_k4(&q, &x.scales, y);
        let dy = y.d();
        sumf += x.d() * dy * sumi as f32 - x.dmin() * dy * summ as f32;
    }
    sumf
}

/// Dot product of a Q6_K weight row (`n / 256` blocks) with a Q8_K activation row.
pub fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ6K] = blocks(w, nb);
    let ys: &[BlockQ8K] = blocks(a, nb);
    let mut sumf = 0f32;
    for (x, y) in xs.iter().zip(ys) {
        let mut q = [0i8; QK_K];
        unpack_q6(x, &mut q);
        let mut sumi = 0i32;
        for (s, (qs, aq)) in q.chunks_exact(16).zip(y.qs.chunks_exact(16)).enumerate() {
            let mut t = 0i32;
            for l in 0..16 {
                t += qs[l] as i32 * aq[l] as i32;
            }
            sumi += x.scales[s] as i32 * t;
        }
        sumf += x.d() * y.d() * sumi as f32;
    }
    sumf
}

/// The 256 signed quants (`q − 32`, −32..32) of a Q6_K block, in value order.
#[inline(always)]
fn unpack_q6(x: &BlockQ6K, out: &mut [i8; QK_K]) {
    for half in 0..2 {
        let ql = &x.ql[64 * half..64 * half + 64];
        let qh = &x.qh[32 * half..32 * half + 32];
        let o = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            o[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            o[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

fn check_out_len(len: usize) -> usize {
    assert!(len.is_multiple_of(QK_K), "row length {len} is not a multiple of {QK_K}");
    len / QK_K
}

/// Dequantizes `out.len()` values (a multiple of 256) from Q4_K blocks.
pub fn dequantize_q4_k(w: &[u8], out: &mut [f32]) {
    let nb = check_out_len(out.len());
    let xs: &[BlockQ4K] = blocks(w, nb);
    for (x, y) in xs.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (x.d(), x.dmin());
        for j in 0..QK_K / 64 {
            let (sc1, m1) = scale_min_k4(2 * j, &x.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &x.scales);
            let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, mm2) = (d * sc2 as f32, dmin * m2 as f32);
            let q = &x.qs[32 * j..32 * j + 32];
            let y = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - mm1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - mm2;
            }
        }
    }
}

/// Dequantizes `out.len()` values (a multiple of 256) from Q5_K blocks.
pub fn dequantize_q5_k(w: &[u8], out: &mut [f32]) {
    let nb = check_out_len(out.len());
    let xs: &[BlockQ5K] = blocks(w, nb);
    for (x, y) in xs.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (x.d(), x.dmin());
        let (mut u1, mut u2) = (1u8, 2u8);
        for j in 0..QK_K / 64 {
            let (sc1, m1) = scale_min_k4(2 * j, &x.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &x.scales);
            let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, mm2) = (d * sc2 as f32, dmin * m2 as f32);
            let q = &x.qs[32 * j..32 * j + 32];
            let y = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                let h1 = if x.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if x.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((q[l] & 0xF) + h1) as f32 - mm1;
                y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - mm2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/// Dequantizes `out.len()` values (a multiple of 256) from Q6_K blocks.
pub fn dequantize_q6_k(w: &[u8], out: &mut [f32]) {
    let nb = check_out_len(out.len());
    let xs: &[BlockQ6K] = blocks(w, nb);
    for (x, y) in xs.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = x.d();
        let mut q = [0i8; QK_K];
        unpack_q6(x, &mut q);
        for (s, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let ds = d * x.scales[s] as f32;
            for (yv, &qv) in ys.iter_mut().zip(qs) {
                *yv = ds * qv as f32;
            }
        }
    }
}

/// The smallest f16 ≥ `v` (for `v ≥ 0`), so that a super-block scale rounded to f16 never forces
/// the largest sub-block scale past its integer range (which matters for tiny, subnormal scales).
fn f16_at_least(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() < v {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

/// Rounds to the nearest integer (ties away from zero) and clamps to `lo..=hi`.
#[inline(always)]
fn round_clamp(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// Shared Q4_K / Q5_K quantizer: per 32-value sub-block an offset `m ≥ 0` (minus the sub-block
/// minimum, if negative) and a step `(max − min) / nmax`, both stored as 6-bit multiples of f16
/// super-block values `dmin` and `d`. Returns (d, dmin, packed scales, quants 0..=nmax).
fn quantize_block_k4(x: &[f32], nmax: i32) -> ([u8; 2], [u8; 2], [u8; 12], [u8; QK_K]) {
    let mut step = [0f32; 8];
    let mut off = [0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let mn = sub.iter().copied().fold(0f32, f32::min);
        let mx = sub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        step[j] = (mx - mn) / nmax as f32;
        off[j] = -mn;
    }
    let max_step = step.iter().copied().fold(0f32, f32::max);
    let max_off = off.iter().copied().fold(0f32, f32::max);
    let d = f16_at_least(max_step / 63.0);
    let dmin = f16_at_least(max_off / 63.0);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let mut sc = [0u8; 8];
    let mut mi = [0u8; 8];
    for j in 0..8 {
        sc[j] = if df > 0.0 { round_clamp(step[j] / df, 0, 63) as u8 } else { 0 };
        mi[j] = if dminf > 0.0 { round_clamp(off[j] / dminf, 0, 63) as u8 } else { 0 };
    }
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = mi[j] | ((mi[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 0xF) | ((mi[j + 4] & 0xF) << 4);
    }
    let mut q = [0u8; QK_K];
    for (j, (sub, qs)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
        let (sc_j, m_j) = scale_min_k4(j, &scales);
        let (dj, mj) = (df * sc_j as f32, dminf * m_j as f32);
        for (qv, &xv) in qs.iter_mut().zip(sub) {
            *qv = if dj > 0.0 { round_clamp((xv + mj) / dj, 0, nmax) as u8 } else { 0 };
        }
    }
    (d.to_le_bytes(), dmin.to_le_bytes(), scales, q)
}

fn check_in_len(len: usize) -> usize {
    assert!(len.is_multiple_of(QK_K), "row length {len} is not a multiple of {QK_K}");
    len / QK_K
}

/// Quantizes a row (length a multiple of 256) to Q4_K block bytes.
pub fn quantize_row_q4_k(x: &[f32]) -> Vec<u8> {
    let nb = check_in_len(x.len());
    let mut out = vec![BlockQ4K::zeroed(); nb];
    for (b, xb) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (d, dmin, scales, q) = quantize_block_k4(xb, 15);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        for j in 0..QK_K / 64 {
            for l in 0..32 {
                b.qs[32 * j + l] = q[64 * j + l] | (q[64 * j + 32 + l] << 4);
            }
        }
    }
    bytemuck::cast_slice(&out).to_vec()
}

/// Quantizes a row (length a multiple of 256) to Q5_K block bytes.
pub fn quantize_row_q5_k(x: &[f32]) -> Vec<u8> {
    let nb = check_in_len(x.len());
    let mut out = vec![BlockQ5K::zeroed(); nb];
    for (b, xb) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (d, dmin, scales, q) = quantize_block_k4(xb, 31);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        for j in 0..QK_K / 64 {
            for l in 0..32 {
                let (lo, hi) = (q[64 * j + l], q[64 * j + 32 + l]);
                b.qs[32 * j + l] = (lo & 0xF) | ((hi & 0xF) << 4);
                b.qh[l] |= ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1));
            }
        }
    }
    bytemuck::cast_slice(&out).to_vec()
}

/// Quantizes a row (length a multiple of 256) to Q6_K block bytes: per 16-value sub-block a
/// symmetric step `amax / 31` stored as an i8 multiple of the f16 super-block scale `d`.
pub fn quantize_row_q6_k(x: &[f32]) -> Vec<u8> {
    let nb = check_in_len(x.len());
    let mut out = vec![BlockQ6K::zeroed(); nb];
    for (b, xb) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut step = [0f32; 16];
        for (s, sub) in xb.chunks_exact(16).enumerate() {
            step[s] = sub.iter().fold(0f32, |m, v| m.max(v.abs())) / 31.0;
        }
        let max_step = step.iter().copied().fold(0f32, f32::max);
        let d = f16_at_least(max_step / 127.0);
        let df = d.to_f32();
        b.d = d.to_le_bytes();
        let mut q = [0u8; QK_K];
        for (s, (sub, qs)) in xb.chunks_exact(16).zip(q.chunks_exact_mut(16)).enumerate() {
            let sc = if df > 0.0 { round_clamp(step[s] / df, 0, 127) } else { 0 };
            b.scales[s] = sc as i8;
            let ds = df * sc as f32;
            for (qv, &xv) in qs.iter_mut().zip(sub) {
                *qv = if ds > 0.0 { (round_clamp(xv / ds, -32, 31) + 32) as u8 } else { 32 };
            }
        }
        for half in 0..2 {
            let q = &q[128 * half..128 * half + 128];
            for l in 0..32 {
                b.ql[64 * half + l] = (q[l] & 0xF) | ((q[l + 64] & 0xF) << 4);
                b.ql[64 * half + l + 32] = (q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4);
                b.qh[32 * half + l] =
                    (q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6);
            }
        }
    }
    bytemuck::cast_slice(&out).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 6-bit quant (0..64, before the −32 offset) of value `v` (0..256) of a Q6_K block.
    fn q6_at(x: &BlockQ6K, v: usize) -> u8 {
        let (half, r) = (v / 128, v % 128);
        let (quarter, l) = (r / 32, r % 32);
        let ql = &x.ql[64 * half..];
        let qh = x.qh[32 * half + l];
        let lo = match quarter {
            0 => ql[l] & 0xF,
            1 => ql[l + 32] & 0xF,
            2 => ql[l] >> 4,
            _ => ql[l + 32] >> 4,
        };
        lo | (((qh >> (2 * quarter)) & 3) << 4)
    }

    #[test]
    fn scale_unpack_matches_scale_min_k4() {
        let s: [u8; 12] = [0xC1, 0x42, 0x83, 0xFF, 0x05, 0x86, 0xC7, 0x48, 0x9A, 0xBC, 0xDE, 0xF0];
        let (sc, mn) = split_scales(unpack_scales_k4(&s));
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &s), (sc[j], mn[j]), "sub-block {j}");
        }
    }

    #[test]
    fn q6_accessor_matches_unpack() {
        let x = BlockQ6K {
            ql: std::array::from_fn(|i| (i * 37 + 11) as u8),
            qh: std::array::from_fn(|i| (i * 91 + 5) as u8),
            scales: [1; 16],
            d: [0, 0x3c],
        };
        let mut q = [0i8; QK_K];
        unpack_q6(&x, &mut q);
        for (v, &qv) in q.iter().enumerate() {
            assert_eq!(q6_at(&x, v) as i8 - 32, qv);
        }
    }
}
