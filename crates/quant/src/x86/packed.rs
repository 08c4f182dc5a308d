//! AVX2 kernel of the packed Q4_K layout ([`crate::packed::BlockQ4Kx8`]): eight rows per pass,
//! bit for bit [`crate::packed::gemv_q4k_x8`] (the same exact integer sums per row and super-block,
//! then the same two fused multiply-adds).
//!
//! Per super-block: the 8 rows' scales and mins unpacked from 96 bytes with a few byte operations;
//! then per 64 values `j` and 4-value group `g` one 32-byte load of quants holds the same four
//! value positions of all eight rows (one row per 32-bit lane, in row order), so its low and high
//! nibbles multiply 4-byte broadcasts of the activations, accumulated in 16 bits (at most 8 ×
//! 2 × 15 × 128 = 30720) before one multiply by the sub-block scales per 32 values.
//!
//! # Safety invariant
//! [`gemv_q4k_x8`] is the only way in: it checks that the weights and activations are `n / 256`
//! blocks each and that the CPU has AVX2, FMA and F16C before calling the `#[target_feature]`
//! kernel, which reads only those blocks, through bounds-checked block loads.

use super::helpers::prefetch_weights;
use crate::blocks::BlockQ8K;
use crate::packed::{BlockQ4Kx8, PACK_ROWS};
use crate::scalar_k::QK_K;
use crate::Isa;
use std::arch::x86_64::*;

/// The 32 bytes of `v` from byte `off` (panics unless they are all inside `v`; with constant
/// offsets the check folds away).
#[inline]
#[target_feature(enable = "avx")]
fn load256<V: bytemuck::Pod>(v: &V, off: usize) -> __m256i {
    let b: &[u8; 32] = bytemuck::bytes_of(v)[off..off + 32].try_into().unwrap();
    // SAFETY: `b` is exactly the 32 bytes loaded (unaligned load).
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

/// The 16 bytes of `v` from byte `off`, as [`load256`].
#[inline]
#[target_feature(enable = "sse2")]
fn load128<V: bytemuck::Pod>(v: &V, off: usize) -> __m128i {
    let b: &[u8; 16] = bytemuck::bytes_of(v)[off..off + 16].try_into().unwrap();
    // SAFETY: `b` is exactly the 16 bytes loaded (unaligned load).
    unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) }
}

/// The 4 bytes of `v` from byte `off`, broadcast to every 32-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast32<V: bytemuck::Pod>(v: &V, off: usize) -> __m256i {
    let b: [u8; 4] = bytemuck::bytes_of(v)[off..off + 4].try_into().unwrap();
    _mm256_set1_epi32(i32::from_le_bytes(b))
}

/// `pshufb` control (per 128-bit lane) giving, for each of the lane's 4 rows, its scale of
/// sub-block slot `u` (0..4) as two equal 16-bit values (0x80: a zero byte).
const fn scale_pairs(u: u8) -> [u8; 32] {
    let mut c = [0x80u8; 32];
    let mut e = 0;
    while e < 8 {
        c[2 * e] = 4 * u + (e / 2) as u8;
        c[16 + 2 * e] = 4 * u + (e / 2) as u8;
        e += 1;
    }
    c
}

/// `pshufb` control giving, for each of the lane's 4 rows, its mins of slots `2v` and `2v + 1`
/// (as 16-bit values).
const fn min_pairs(v: u8) -> [u8; 32] {
    let mut c = [0x80u8; 32];
    let mut r = 0;
    while r < 4 {
        c[4 * r] = 8 * v + r as u8;
        c[4 * r + 2] = 8 * v + 4 + r as u8;
        c[16 + 4 * r] = 8 * v + r as u8;
        c[16 + 4 * r + 2] = 8 * v + 4 + r as u8;
        r += 1;
    }
    c
}

const SCALE_PAIRS: [[u8; 32]; 4] = [scale_pairs(0), scale_pairs(1), scale_pairs(2), scale_pairs(3)];
const MIN_PAIRS: [[u8; 32]; 2] = [min_pairs(0), min_pairs(1)];

#[inline]
#[target_feature(enable = "avx")]
fn ctl(c: &[u8; 32]) -> __m256i {
    load256(c, 0)
}

/// The kernel: the 8 rows of `xs` times `y` (see the module docs).
#[target_feature(enable = "avx2,fma,f16c")]
fn gemv_q4k_x8_avx2(xs: &[BlockQ4Kx8], ys: &[BlockQ8K]) -> [f32; PACK_ROWS] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m6 = _mm256_set1_epi8(0x3F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for (x, y) in xs.iter().zip(ys) {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of::<BlockQ4Kx8>());
        let dw = _mm256_cvtph_ps(load128(&x.d, 0));
        let mw = _mm256_cvtph_ps(load128(&x.dmin, 0));
        let (s0, s1, l) = (load256(&x.scm, 0), load256(&x.scm, 32), load256(&x.mnl, 0));
        let sc = [_mm256_and_si256(s0, m6), _mm256_and_si256(s1, m6)];
        let mn = [
            _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(_mm256_srli_epi16::<2>(s0), m30)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(s1), m30),
            ),
        ];
        // Mins: per row Σ_s mn_s · (sum of the activations of sub-block s).
        let bsums = load256(&y.bsums, 0);
        let bs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums));
        let bs = _mm256_broadcastsi128_si256(bs);
        let mut summ = _mm256_setzero_si256();
        for p in 0..4 {
            let pair = match p {
                0 => _mm256_shuffle_epi32::<0x00>(bs),
                1 => _mm256_shuffle_epi32::<0x55>(bs),
                2 => _mm256_shuffle_epi32::<0xAA>(bs),
                _ => _mm256_shuffle_epi32::<0xFF>(bs),
            };
            let m = _mm256_shuffle_epi8(mn[p / 2], ctl(&MIN_PAIRS[p % 2]));
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(m, pair));
        }
        // Quants: per row Σ_s sc_s · Σ q·a.
        let mut sumi = _mm256_setzero_si256();
        for j in 0..QK_K / 64 {
            let mut plo = _mm256_setzero_si256();
            let mut phi = _mm256_setzero_si256();
            for g in 0..8 {
                let q = load256(&x.qs, 256 * j + 32 * g);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                plo = _mm256_add_epi16(plo, _mm256_maddubs_epi16(lo, bcast32(&y.qs, 64 * j + 4 * g)));
                phi = _mm256_add_epi16(phi, _mm256_maddubs_epi16(hi, bcast32(&y.qs, 64 * j + 32 + 4 * g)));
            }
            let scs = sc[j / 2];
            let sl = _mm256_shuffle_epi8(scs, ctl(&SCALE_PAIRS[(2 * j) % 4]));
            let sh = _mm256_shuffle_epi8(scs, ctl(&SCALE_PAIRS[(2 * j + 1) % 4]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(plo, sl), _mm256_madd_epi16(phi, sh)));
        }
        let da = _mm256_set1_ps(y.d());
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dw, da), acc);
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(mw, da), accm);
    }
    let mut out = [0f32; PACK_ROWS];
    // SAFETY: `out` is 8 f32s, exactly one unaligned 256-bit store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, accm)) };
    out
}

/// `pshufb` control (per 128-bit lane) giving, for each of the lane's 4 rows, its scale of
/// sub-block slot `u` (0..4) as a 32-bit value.
const fn scale_i32(u: u8) -> [u8; 32] {
    let mut c = [0x80u8; 32];
    let mut r = 0;
    while r < 4 {
        c[4 * r] = 4 * u + r as u8;
        c[16 + 4 * r] = 4 * u + r as u8;
        r += 1;
    }
    c
}

const SCALE_I32: [[u8; 32]; 4] = [scale_i32(0), scale_i32(1), scale_i32(2), scale_i32(3)];

/// `vpermd` indices putting 32-bit activation group `2p` in lanes 0..8 and `2p + 1` in lanes
/// 8..16, for the pair of 4-value groups one 64-byte load of quants holds.
const fn pair_index(p: i32) -> [i32; 16] {
    let mut c = [0i32; 16];
    let mut i = 0;
    while i < 16 {
        c[i] = 2 * p + (i / 8) as i32;
        i += 1;
    }
    c
}

const PAIR_INDEX: [[i32; 16]; 4] = [pair_index(0), pair_index(1), pair_index(2), pair_index(3)];

/// The 64 bytes of `v` from byte `off`, as [`load256`].
#[inline]
#[target_feature(enable = "avx512f")]
fn load512<V: bytemuck::Pod>(v: &V, off: usize) -> __m512i {
    let b: &[u8; 64] = bytemuck::bytes_of(v)[off..off + 64].try_into().unwrap();
    // SAFETY: `b` is exactly the 64 bytes loaded (unaligned load).
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// The AVX-512 VNNI kernel: the 8 rows of `xs` times each of `T` activation rows `ys` at once (the
/// weights' nibbles unpacked once for all of them). One 64-byte load holds two 4-value groups of
/// all eight rows; `vpdpbusd` adds each row's four products into a 32-bit lane; the two halves are
/// added per sub-block and multiplied by its scale. The integer sums are the AVX2 kernel's and
/// the scalar reference's exactly, and the float steps are the same, so it is bit for bit both.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn gemm_q4k_x8_avx512<const T: usize>(xs: &[BlockQ4Kx8], ys: [&[BlockQ8K]; T]) -> [[f32; PACK_ROWS]; T] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m4w = _mm512_set1_epi8(0x0F);
    let m6 = _mm256_set1_epi8(0x3F);
    let m30 = _mm256_set1_epi8(0x30);
    let idx: [__m512i; 4] = std::array::from_fn(|p| {
        let b: &[u8; 64] = bytemuck::cast_ref(&PAIR_INDEX[p]);
        load512(b, 0)
    });
    let mut acc = [_mm256_setzero_ps(); T];
    let mut accm = [_mm256_setzero_ps(); T];
    for (b, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of::<BlockQ4Kx8>());
        let dw = _mm256_cvtph_ps(load128(&x.d, 0));
        let mw = _mm256_cvtph_ps(load128(&x.dmin, 0));
        let (s0, s1, l) = (load256(&x.scm, 0), load256(&x.scm, 32), load256(&x.mnl, 0));
        let sc = [_mm256_and_si256(s0, m6), _mm256_and_si256(s1, m6)];
        let mn = [
            _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(_mm256_srli_epi16::<2>(s0), m30)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(s1), m30),
            ),
        ];
        let mut sumi = [_mm256_setzero_si256(); T];
        for j in 0..QK_K / 64 {
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            // Each token's 32 activations of the low and of the high nibbles of this 64.
            let alo: [__m512i; T] = std::array::from_fn(|t| _mm512_castsi256_si512(load256(&ys[t][b].qs, 64 * j)));
            let ahi: [__m512i; T] = std::array::from_fn(|t| _mm512_castsi256_si512(load256(&ys[t][b].qs, 64 * j + 32)));
            for (p, ix) in idx.iter().enumerate() {
                let q = load512(&x.qs, 256 * j + 64 * p);
                let ql = _mm512_and_si512(q, m4w);
                let qh = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4w);
                for t in 0..T {
                    lo[t] = _mm512_dpbusd_epi32(lo[t], ql, _mm512_permutexvar_epi32(*ix, alo[t]));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], qh, _mm512_permutexvar_epi32(*ix, ahi[t]));
                }
            }
            let scs = sc[j / 2];
            let sl = _mm256_shuffle_epi8(scs, ctl(&SCALE_I32[(2 * j) % 4]));
            let sh = _mm256_shuffle_epi8(scs, ctl(&SCALE_I32[(2 * j + 1) % 4]));
            for t in 0..T {
                let fold = |v: __m512i| _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
                let part = _mm256_add_epi32(_mm256_mullo_epi32(fold(lo[t]), sl), _mm256_mullo_epi32(fold(hi[t]), sh));
                sumi[t] = _mm256_add_epi32(sumi[t], part);
            }
        }
        for t in 0..T {
            let y = &ys[t][b];
            // Mins: per row Σ_s mn_s · (sum of the activations of sub-block s), as the AVX2 kernel.
            let bsums = load256(&y.bsums, 0);
            let bs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums));
            let bs = _mm256_broadcastsi128_si256(bs);
            let mut summ = _mm256_setzero_si256();
            for p in 0..4 {
                let pair = match p {
                    0 => _mm256_shuffle_epi32::<0x00>(bs),
                    1 => _mm256_shuffle_epi32::<0x55>(bs),
                    2 => _mm256_shuffle_epi32::<0xAA>(bs),
                    _ => _mm256_shuffle_epi32::<0xFF>(bs),
                };
                let m = _mm256_shuffle_epi8(mn[p / 2], ctl(&MIN_PAIRS[p % 2]));
                summ = _mm256_add_epi32(summ, _mm256_madd_epi16(m, pair));
            }
            let da = _mm256_set1_ps(y.d());
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_mul_ps(dw, da), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(mw, da), accm[t]);
        }
    }
    let mut out = [[0f32; PACK_ROWS]; T];
    for t in 0..T {
        // SAFETY: `out[t]` is 8 f32s, exactly one unaligned 256-bit store.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(acc[t], accm[t])) };
    }
    out
}

/// The packed product of one group of 8 rows with `T` activation rows on `isa` where it has a
/// kernel for that (AVX-512 VNNI), `None` otherwise. Safe: checks the lengths, and that the CPU
/// runs the kernel.
///
/// # Panics
/// If `n` is not a multiple of 256 or `w` / each of `a` are not `n / 256` blocks.
pub fn gemm_q4k_x8<const T: usize>(isa: Isa, n: usize, w: &[u8], a: [&[u8]; T]) -> Option<[[f32; PACK_ROWS]; T]> {
    if isa < Isa::Avx512Vnni || !isa.is_supported() {
        return None;
    }
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ4Kx8] = bytemuck::cast_slice(w);
    let ys: [&[BlockQ8K]; T] = a.map(bytemuck::cast_slice);
    assert!(xs.len() == nb && ys.iter().all(|y| y.len() == nb), "{nb} blocks of weights and of activations");
    // SAFETY: `isa ≥ Avx512Vnni` is supported by this CPU (checked above): AVX-512 F/BW/VL/VNNI
    // with AVX2, FMA and F16C.
    Some(unsafe { gemm_q4k_x8_avx512(xs, ys) })
}

/// The packed gemv on `isa` where it has a kernel (AVX2 and up), `None` otherwise. Safe: checks
/// the lengths, and that the CPU runs the kernel.
///
/// # Panics
/// If `n` is not a multiple of 256 or `w` / `a` are not `n / 256` blocks.
pub fn gemv_q4k_x8(isa: Isa, n: usize, w: &[u8], a: &[u8]) -> Option<[f32; PACK_ROWS]> {
    if isa < Isa::Avx2 || !isa.is_supported() {
        return None;
    }
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ4Kx8] = bytemuck::cast_slice(w);
    let ys: &[BlockQ8K] = bytemuck::cast_slice(a);
    assert!(xs.len() == nb && ys.len() == nb, "{nb} blocks of weights and of activations");
    if isa >= Isa::Avx512Vnni {
        // SAFETY: `isa ≥ Avx512Vnni` is supported by this CPU (checked above).
        return Some(unsafe { gemm_q4k_x8_avx512::<1>(xs, [ys]) }[0]);
    }
    // SAFETY: `isa ≥ Avx2` is supported by this CPU (checked above), which includes FMA and F16C.
    Some(unsafe { gemv_q4k_x8_avx2(xs, ys) })
}
