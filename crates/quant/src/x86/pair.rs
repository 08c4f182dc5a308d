//! AVX-512 multi-row, four-token kernels for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q8_0):
//! the fast path behind [`crate::WeightType::dot4_rows_fn`] on CPUs with AVX-512 VNNI.
//!
//! # Why a separate design
//!
//! The one-row kernels in [`super::legacy_avx512`] stay in 256-bit registers: for one token every
//! 512-bit register of two blocks would have to be assembled with shuffles, and 512-bit µops leave
//! two vector ports instead of three. With four tokens the picture changes: the core of the work
//! (`vpdpbusd`, `vcvtdq2ps`, `vfmadd231ps` per block and token) then dominates, and in 512-bit
//! registers those run two per cycle on 16 lanes instead of two per cycle on 8.
//!
//! # Layout: token pairs, interleaved
//!
//! The four tokens are processed as two pairs `(A, B)`. A 512-bit register holds one block of
//! both tokens of a pair with their 32-bit lanes interleaved: lane `2j` is token A's lane `j` of
//! the one-row kernel, lane `2j + 1` token B's. Every lane therefore goes through exactly the
//! operations the one-row kernel applies to that lane (same integer sums, same `f32` products,
//! same FMA into the same accumulator in the same block order, same final reduction after
//! de-interleaving), so each result is bit for bit the one-row kernel's.
//!
//! - Activations are rearranged once per call (a call covers many weight rows; see
//!   `prepare`): per pair and block, 64 bytes of interleaved quants (`vpermt2d`), 64 bytes of
//!   per-lane offset corrections, and the f16 block headers converted to f32 as
//!   `[d_A, d_B, s_A, s_B]`.
//! - Weights are unpacked once per block for both pairs into an unsigned byte form with every
//!   32-bit group duplicated (`vpermd`), so one `vpdpbusd` against the interleaved activations
//!   gives both tokens' lane sums. Formats whose quants are offset or signed use the unsigned
//!   form `q + k` and subtract `k · Σ a` per lane, which depends on the activations only and is
//!   prepared once: Q4_0 `q` with the `×16` high nibbles of [`super::legacy_avx512`] and
//!   `k = 8 / 128`, Q5_0 `q` in `0..32` and `k = 16`, Q8_0 `q ^ 0x80 = q + 128` and `k = 128`;
//!   Q4_1 needs none.
//!   The integer sums are exact, so they equal the one-row kernel's whatever method computes them.
//! - Scales: `d_w · d_a` for four blocks and both tokens are one 512-bit multiply of the weights'
//!   headers (gathered and duplicated by one `vpermw` / `vpermt2w`, converted by one `vcvtph2ps`)
//!   with the prepared activation headers, computed one group of blocks ahead; each block's pair
//!   of products is then broadcast from the stack with `vbroadcastsd` (a pure load) in the
//!   interleaved lane order.
//! - The final reductions are lane-wise up to the horizontal sums, so they run on the interleaved
//!   registers; the four tokens' horizontal sums then run side by side in one register
//!   (`hsum4`), step for step as the one-row kernel's `hsum_ps`.
//!
//! # Performance
//!
//! One thread, rows of 896 values, 16 rows per call (`cargo bench -p sift-quant --bench dot`
//! prints the current numbers), ns per block and token on the development Xeon: Q4_1 0.60
//! (256-bit four-token kernel 0.67, single-row kernel ~1.1), Q5_0 0.72 (0.9), Q8_0 0.63 (0.85).
//! Preparing the activations costs about as much as one or two weight rows, so callers should
//! pass many rows per call (the engine passes 64).
//!
//! # Safety invariant
//!
//! As in [`crate::x86`]: every kernel is an `unsafe fn` compiled with `#[target_feature]`, whose
//! `SAFETY:` doc line is its contract and whose `unsafe` blocks say which part of it covers each
//! pointer access; the kernels are reachable only through the safe wrappers at the bottom of this
//! file, which `x86::avx512_dot4_rows_fn` hands out only after [`crate::Isa::is_supported`]
//! confirmed AVX-512 F/BW/VL + VNNI (and AVX2/FMA/F16C). The wrappers check all slice lengths
//! once; the kernels read exactly the blocks checked and write only the scratch buffer they are
//! given.

use super::helpers::{load4_u32, nibbles, prefetch_weights, sched_barrier};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1};
use crate::WeightType;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::mem::size_of;

const Q4_0_BYTES: usize = size_of::<BlockQ4_0>();
const Q4_1_BYTES: usize = size_of::<BlockQ4_1>();
const Q5_0_BYTES: usize = size_of::<BlockQ5_0>();
const Q8_0_BYTES: usize = size_of::<BlockQ8_0>();
const Q8_1_BYTES: usize = size_of::<BlockQ8_1>();

/// Bytes of prepared activation data per pair and block: interleaved quants, corrections, headers.
const PREP_Q: usize = 64;
const PREP_C: usize = 64;
const PREP_H: usize = 16;

/// Interleaves the 32-bit lanes of two 256-bit values: `[a0, b0, a1, b1, …, a7, b7]`.
const INTERLEAVE: [i32; 16] = [0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23];
/// Duplicates each 32-bit lane of a 256-bit value: `[x0, x0, x1, x1, …, x7, x7]`.
const DUPLICATE: [i32; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];
/// Even lanes (token A of a pair) to the low 256 bits, odd lanes (token B) to the high ones.
const DEINTERLEAVE: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];

/// `vpermw` / `vpermt2w` indices that gather the two f16 header fields of four blocks `wb` bytes
/// apart, each twice — `[d0, d0, m0, m0, d1, d1, …, m3, m3]` — from a 64-byte load at the first
/// block (words `0..32`) and one at [`header_hi`] (words `32..64`).
const fn header_idx(wb: usize) -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut l = 0;
    while l < 16 {
        let off = (l / 4) * wb + 2 * ((l / 2) % 2);
        out[l] = if off + 2 <= 64 { (off / 2) as i16 } else { (32 + (off - header_hi(wb)) / 2) as i16 };
        l += 1;
    }
    out
}

/// Offset of the second 64-byte header load for blocks of `wb` bytes: byte 64 if the four blocks
/// reach that far, else the last 64 bytes of the four blocks.
const fn header_hi(wb: usize) -> usize {
    if 4 * wb >= 128 {
        64
    } else {
        4 * wb - 64
    }
}

/// The headers of the four blocks at `w4` (`WB` bytes each) as f32, each field duplicated for
/// the two tokens of a pair: `[dw0, dw0, mw0, mw0, dw1, …]` (for d-only formats the `m` lanes
/// are junk, as in the one-row kernels). Equal to the one-row kernels' `cvtph(load4_u32)` values.
///
/// SAFETY: AVX-512 F/BW present; the `4 * WB >= 64` bytes at `w4` readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn weight_headers<const WB: usize>(w4: *const u8) -> __m512 {
    // The loads stay inside the four blocks and reach the last header field.
    const {
        assert!(4 * WB >= 64 && WB.is_multiple_of(2));
        assert!(3 * WB + 4 <= 64 || (header_hi(WB) + 64 <= 4 * WB && 3 * WB + 4 <= header_hi(WB) + 64));
    };
    let i: [i16; 32] = const { header_idx(WB) };
    // SAFETY: a plain 64-byte value cast; `[i16; 32]` and `__m512i` have the same size.
    let i = unsafe { std::mem::transmute::<[i16; 32], __m512i>(i) };
    // SAFETY: bytes `0..64` of the `4 * WB >= 64` readable at `w4` (the caller's contract).
    let lo = unsafe { _mm512_loadu_si512(w4 as *const __m512i) };
    let h = if 3 * WB + 4 <= 64 {
        _mm512_permutexvar_epi16(i, lo)
    } else {
        // SAFETY: bytes `header_hi(WB)..header_hi(WB) + 64`, inside the `4 * WB` readable at
        // `w4` (the const assertion above).
        let hi = unsafe { _mm512_loadu_si512(w4.add(const { header_hi(WB) }) as *const __m512i) };
        _mm512_permutex2var_epi16(lo, i, hi)
    };
    _mm512_cvtph_ps(_mm512_castsi512_si256(h))
}

/// The scales `d_w · d_a` (and `m_w · s_a`) of the four blocks `i..i + 4` (weights at `w4`) for
/// both pairs, stored to `dst[p]` as `[dw0·dA0, dw0·dB0, mw0·sA0, mw0·sB0, dw1·dA1, …]`; with
/// `MIN`, also added to the pairs' `m·s` accumulators `ms` (one add per group, as in the one-row
/// kernels).
///
/// SAFETY: AVX-512 F/BW present; the four blocks at `w4` readable; `h[p]` has `i + 4` blocks of
/// prepared headers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_scales<const WB: usize, const MIN: bool>(
    w4: *const u8,
    h: [*const f32; 2],
    i: usize,
    ms: &mut [__m512; 2],
    dst: &mut [[f32; 16]; 2],
) {
    // [dw0, dw0, mw0, mw0, dw1, dw1, …]: each weight header next to both tokens' ones.
    // SAFETY: the four blocks at `w4` are readable (the caller's contract).
    let hw = unsafe { weight_headers::<WB>(w4) };
    for p in 0..2 {
        // SAFETY: the 16 f32 of blocks `i..i + 4` (4 per block) of `h[p]`, which has `i + 4`
        // blocks (the caller's contract).
        let sc = _mm512_mul_ps(hw, unsafe { _mm512_loadu_ps(h[p].add(4 * i)) });
        if MIN {
            ms[p] = _mm512_add_ps(ms[p], sc);
        }
        // SAFETY: `dst[p]` is an `[f32; 16]`: exactly the 16 lanes stored.
        unsafe { _mm512_storeu_ps(dst[p].as_mut_ptr(), sc) };
    }
}

/// 64-byte alignment for the stack copy of the scales (a store split over two cache lines would
/// not forward to the broadcasts that read it).
#[repr(C, align(64))]
struct Align64<T>(T);

/// The horizontal sums of four 8-lane vectors, `[A | B]` in `z0` and `[C | D]` in `z1`, each
/// computed by exactly the steps of [`hsum_ps`](super::helpers::hsum_ps) (`lo128 + hi128`, then
/// `+ movehl`, then lane 0 + lane 1), four at a time: returns `[ΣA, ΣB, ΣC, ΣD]`.
///
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn hsum4(z0: __m512, z1: __m512) -> __m128 {
    // [A_lo, B_lo, C_lo, D_lo] + [A_hi, B_hi, C_hi, D_hi]
    let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(z0, z1);
    let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(z0, z1);
    let s = _mm512_add_ps(lo, hi);
    // Per 128-bit lane: s + movehl(s, s), then lane 0 + lane 1 (`movehdup`).
    let s = _mm512_add_ps(s, _mm512_shuffle_ps::<0b11_10_11_10>(s, s));
    let s = _mm512_add_ps(s, _mm512_movehdup_ps(s));
    _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s))
}

#[inline(always)]
fn idx(v: [i32; 16]) -> __m512i {
    // SAFETY: a plain 64-byte value cast; `[i32; 16]` and `__m512i` have the same size.
    unsafe { std::mem::transmute::<[i32; 16], __m512i>(v) }
}

/// Activation rows prepared by [`prepare`] for one call: pointers to the two pairs' quants,
/// corrections and headers (each `nb` blocks).
#[derive(Clone, Copy)]
struct Prepared {
    q: [*const u8; 2],
    c: [*const u8; 2],
    h: [*const f32; 2],
}

/// What [`prepare`] does with an activation format.
#[derive(Clone, Copy)]
struct ActPrep {
    /// Bytes per activation block and offset of its quants.
    ab: usize,
    qoff: usize,
    /// Per-byte multiplier `k` of the correction `−Σ k·a` per 32-bit lane, as a byte pattern for
    /// the low (lanes 0..8) and high (lanes 8..16) half of the interleaved register; `None`: no
    /// correction.
    k: Option<(i8, i8)>,
}

/// Rearranges four activation rows of `nb` blocks for the pair kernels (see the module doc).
///
/// SAFETY: AVX-512 F/BW/VL + VNNI, AVX2, F16C present; every `a[t]` points to `nb` blocks of
/// `p.ab` bytes; `out` has room for `2 * nb * (PREP_Q + PREP_C + PREP_H)` bytes (any alignment).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn prepare(nb: usize, a: [*const u8; 4], p: ActPrep, out: *mut u8) -> Prepared {
    let il = idx(INTERLEAVE);
    // The scratch at `out` is laid out as: quants (`2 * nb * PREP_Q` bytes), corrections
    // (`2 * nb * PREP_C`), headers (`2 * nb * PREP_H`), each region split into the two pairs' `nb`
    // blocks; every offset computed below stays inside that `2 * nb * (PREP_Q + PREP_C + PREP_H)`
    // bytes the caller provides.
    let q0 = out;
    // SAFETY: the start of the correction region (see above).
    let c0 = unsafe { out.add(2 * nb * PREP_Q) };
    // SAFETY: the start of the header region (see above).
    let h0 = unsafe { out.add(2 * nb * (PREP_Q + PREP_C)) } as *mut f32;
    let kz = p.k.map(|(lo, hi)| _mm512_inserti64x4::<1>(_mm512_set1_epi8(lo), _mm256_set1_epi8(hi)));
    for pair in 0..2 {
        let (pa, pb) = (a[2 * pair], a[2 * pair + 1]);
        // SAFETY: `pair < 2`: the starts of this pair's `nb` blocks in each region (see above).
        let (q, c, h) = unsafe { (q0.add(pair * nb * PREP_Q), c0.add(pair * nb * PREP_C), h0.add(pair * nb * 4)) };
        for i in 0..nb {
            // SAFETY: `i < nb`: block `i` (`p.ab` bytes, its 32 quants at `p.qoff`) of the two
            // activation rows, each `nb` blocks long (the caller's contract).
            let (xa, xb) = unsafe {
                (
                    _mm256_loadu_si256(pa.add(i * p.ab + p.qoff) as *const __m256i),
                    _mm256_loadu_si256(pb.add(i * p.ab + p.qoff) as *const __m256i),
                )
            };
            let x = _mm512_permutex2var_epi32(_mm512_castsi256_si512(xa), il, _mm512_castsi256_si512(xb));
            // SAFETY: `i < nb`: block `i` (`PREP_Q` bytes) of this pair's quant region.
            unsafe { _mm512_storeu_si512(q.add(i * PREP_Q) as *mut __m512i, x) };
            if let Some(kz) = kz {
                let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), kz, x);
                // SAFETY: `i < nb`: block `i` (`PREP_C` bytes) of this pair's correction region.
                unsafe {
                    _mm512_storeu_si512(c.add(i * PREP_C) as *mut __m512i, _mm512_sub_epi32(_mm512_setzero_si512(), s))
                };
            }
        }
        // Headers: [d_A, d_B, s_A, s_B] per block (the second f16 of a Q8_0 block is its first
        // two quants: a junk value that no kernel uses, as in the one-row kernels).
        let mut i = 0;
        while i + 4 <= nb {
            // SAFETY: `i + 4 <= nb`: the 4-byte headers of blocks `i..i + 4` of both activation
            // rows are readable, and the 16 f32 of those blocks in this pair's header region
            // (4 per block) writable.
            unsafe {
                let ha = _mm256_cvtph_ps(load4_u32(pa.add(i * p.ab), p.ab));
                let hb = _mm256_cvtph_ps(load4_u32(pb.add(i * p.ab), p.ab));
                let hz = _mm512_permutex2var_ps(_mm512_castps256_ps512(ha), il, _mm512_castps256_ps512(hb));
                _mm512_storeu_ps(h.add(4 * i), hz);
            }
            i += 4;
        }
        while i < nb {
            // SAFETY: `i < nb`: the 4-byte header of block `i` of both activation rows, and the
            // 4 f32 of block `i` in this pair's header region.
            unsafe {
                let ha = _mm_cvtph_ps(_mm_loadu_si32(pa.add(i * p.ab)));
                let hb = _mm_cvtph_ps(_mm_loadu_si32(pb.add(i * p.ab)));
                _mm_storeu_ps(h.add(4 * i), _mm_unpacklo_ps(ha, hb));
            }
            i += 1;
        }
    }
    // SAFETY: the second pair's starts in each region, as in the loop above.
    unsafe { Prepared { q: [q0, q0.add(nb * PREP_Q)], c: [c0, c0.add(nb * PREP_C)], h: [h0, h0.add(nb * 4)] } }
}

/// One weight row of `nb` blocks (`$wb` bytes each, at `$w`) against the prepared activations
/// `$pr` (two token pairs): returns the four tokens' results. `$prep` unpacks the weight block at
/// `$wp` into the duplicated unsigned form (a `__m512i`); `$corr` says whether the prepared
/// corrections seed the `vpdpbusd` accumulator. `$min` and `hi_scale` as in the one-row
/// `block_dot!` of [`super::block_dot`], whose arithmetic this reproduces lane for lane.
///
/// Expands inside an `unsafe fn` whose contract is: the CPU has AVX-512 F/BW/VL/VNNI + AVX2/FMA/
/// F16C; `$w` points to `$nb` readable blocks; `$pr` was prepared by [`prepare`] from `$nb` blocks
/// of every token (so each pair has `$nb` blocks of quants, corrections and headers). `$wp` is
/// then a pointer to one whole weight block: `$prep` may read its `$wb` bytes (in its own `unsafe`
/// block, which is why it can rely on that).
macro_rules! pair_dot {
    ($nb:expr, $w:expr, $pr:expr, $wb:expr, $min:expr, $corr:expr, hi_scale = $hs:expr, |$wp:ident| $prep:expr) => {{
        let (nb, w, pr): (usize, *const u8, Prepared) = ($nb, $w, $pr);
        let mut acc = [[_mm512_setzero_ps(); 4]; 2];
        let mut ms = [_mm512_setzero_ps(); 2];
        // The scales of each group of four blocks are computed one group ahead (into the other
        // half of a double buffer), off the critical path of the group's FMAs.
        let mut sbuf = Align64([[[0f32; 16]; 2]; 2]);
        let groups = nb / 4;
        if groups > 0 {
            // SAFETY: `nb >= 4`: weight blocks `0..4` and prepared headers of blocks `0..4`.
            unsafe { group_scales::<{ $wb }, { $min }>(w, pr.h, 0, &mut ms, &mut sbuf.0[0]) };
        }
        let mut i = 0usize;
        while i + 4 <= nb {
            // SAFETY: `i + 4 <= nb`: blocks `i..i + 4` of the weight row and of every prepared
            // pair are inside their `nb` blocks ("see above" in this iteration refers to this).
            let w4 = unsafe { w.add(i * $wb) };
            prefetch_weights(w4, 4 * $wb);
            if i + 8 <= nb {
                // SAFETY: `i + 8 <= nb`: weight blocks `i + 4..i + 8` and the prepared headers of
                // blocks up to `i + 8`.
                unsafe {
                    group_scales::<{ $wb }, { $min }>(
                        w4.add(4 * $wb),
                        pr.h,
                        i + 4,
                        &mut ms,
                        &mut sbuf.0[(i / 4 + 1) % 2],
                    )
                };
            }
            // Scales are broadcast from memory (pure loads), as in the one-row kernels.
            let s = &std::hint::black_box(&sbuf).0[(i / 4) % 2];
            for k in 0..4 {
                // SAFETY: `k < 4`: weight block `i + k < nb` (see above).
                let $wp = unsafe { w4.add(k * $wb) };
                let wq: __m512i = $prep;
                for p in 0..2 {
                    // SAFETY: `k < 4`: f32 `4k..4k + 2` (8 bytes) of the `[f32; 16]` `s[p]`.
                    let d = _mm512_castpd_ps(_mm512_set1_pd(unsafe {
                        std::ptr::read_unaligned(s[p].as_ptr().add(4 * k) as *const f64)
                    }));
                    // SAFETY: block `i + k < nb` (`PREP_Q` bytes) of pair `p`'s prepared quants.
                    let x = unsafe { _mm512_loadu_si512(pr.q[p].add((i + k) * PREP_Q) as *const __m512i) };
                    let seed = if $corr {
                        // SAFETY: block `i + k < nb` (`PREP_C` bytes) of pair `p`'s corrections.
                        unsafe { _mm512_loadu_si512(pr.c[p].add((i + k) * PREP_C) as *const __m512i) }
                    } else {
                        _mm512_setzero_si512()
                    };
                    // One block's lane sums for pair `p`: `Σ q·a` (+ correction), 16 i32 lanes.
                    let sums = _mm512_dpbusd_epi32(seed, wq, x);
                    acc[p][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc[p][k]);
                }
                sched_barrier();
            }
            i += 4;
        }
        let mut tail_ms = [0f32; 4];
        while i < nb {
            // SAFETY: `i < nb`: block `i` of the weight row and of every prepared pair is inside
            // their `nb` blocks ("see above" in this iteration refers to this).
            let $wp = unsafe { w.add(i * $wb) };
            // SAFETY: the 4 header bytes of weight block `i` (see above).
            let hw = _mm_cvtph_ps(unsafe { _mm_loadu_si32($wp) });
            let hw = _mm_unpacklo_ps(hw, hw);
            let wq: __m512i = $prep;
            for p in 0..2 {
                // [dw·dA, dw·dB, mw·sA, mw·sB]
                // SAFETY: the 4 prepared header f32 of block `i` of pair `p` (see above).
                let sc = _mm_mul_ps(hw, unsafe { _mm_loadu_ps(pr.h[p].add(4 * i)) });
                if $min {
                    tail_ms[2 * p] += _mm_cvtss_f32(_mm_movehl_ps(sc, sc));
                    tail_ms[2 * p + 1] += _mm_cvtss_f32(_mm_shuffle_ps::<0b11>(_mm_movehl_ps(sc, sc), sc));
                }
                let d = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(sc)));
                // SAFETY: block `i` (`PREP_Q` bytes) of pair `p`'s prepared quants (see above).
                let x = unsafe { _mm512_loadu_si512(pr.q[p].add(i * PREP_Q) as *const __m512i) };
                let seed = if $corr {
                    // SAFETY: block `i` (`PREP_C` bytes) of pair `p`'s corrections (see above).
                    unsafe { _mm512_loadu_si512(pr.c[p].add(i * PREP_C) as *const __m512i) }
                } else {
                    _mm512_setzero_si512()
                };
                let sums = _mm512_dpbusd_epi32(seed, wq, x);
                acc[p][0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc[p][0]);
            }
            i += 1;
        }
        // Per token: exactly the one-row kernel's reduction. Its first steps are lane-wise, so they
        // run on the interleaved registers; then each pair is de-interleaved (token A's lanes to
        // the low half, B's to the high half) and the four tokens' horizontal sums run together.
        let hs: f32 = $hs;
        let deint = idx(DEINTERLEAVE);
        let mut sums = [_mm512_setzero_ps(); 2];
        for p in 0..2 {
            let a = &acc[p];
            let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
            let sum = _mm512_permutexvar_ps(deint, sum);
            sums[p] = if hs != 1.0 {
                let v = _mm256_setr_ps(1.0, 1.0, 1.0, 1.0, hs, hs, hs, hs);
                let v = _mm512_castps256_ps512(v);
                _mm512_mul_ps(sum, _mm512_shuffle_f32x4::<0b01_00_01_00>(v, v))
            } else {
                sum
            };
        }
        let r = hsum4(sums[0], sums[1]);
        let r = if $min {
            let m0 = _mm512_maskz_permutexvar_ps(0b1010_1010_1010_1010, deint, ms[0]);
            let m1 = _mm512_maskz_permutexvar_ps(0b1010_1010_1010_1010, deint, ms[1]);
            // SAFETY: `tail_ms` is an `[f32; 4]`: exactly the 4 lanes loaded.
            _mm_add_ps(r, _mm_add_ps(hsum4(m0, m1), unsafe { _mm_loadu_ps(tail_ms.as_ptr()) }))
        } else {
            r
        };
        let mut out = [0f32; 4];
        // SAFETY: `out` is an `[f32; 4]`: exactly the 4 lanes stored.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), r) };
        out
    }};
}

/// The quants of a 16-byte nibble block at `p` in the `×16` layout of the one-row VNNI kernels
/// (low nibbles, then high nibbles times 16), each 32-bit group duplicated.
///
/// SAFETY: AVX-512 F/BW/VL present; `p..p + 16` readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles_x16_dup(p: *const u8) -> __m512i {
    // SAFETY: an unaligned 16-byte load of `p..p + 16`, readable by the caller's contract.
    let q = _mm512_castsi128_si512(unsafe { _mm_loadu_si128(p as *const __m128i) });
    let q = _mm512_permutexvar_epi32(idx([0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3]), q);
    _mm512_and_si512(q, _mm512_inserti64x4::<1>(_mm512_set1_epi8(0x0F), _mm256_set1_epi8(0xF0u8 as i8)))
}

/// Q4_1 × Q8_1 for one weight row. SAFETY: AVX-512 F/BW/VL/VNNI + AVX2/FMA/F16C present; `w`
/// points to `nb` blocks; `pr` was prepared from `nb` blocks of each token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q4_1(nb: usize, w: *const u8, pr: Prepared) -> [f32; 4] {
    pair_dot!(nb, w, pr, Q4_1_BYTES, true, false, hi_scale = 1.0 / 16.0, |wp| {
        // SAFETY: `wp` is a whole Q4_1 block (`pair_dot!`); its 16 quant bytes start at byte 4.
        unsafe { nibbles_x16_dup(wp.add(4)) }
    })
}

/// Q4_0 × Q8_0 for one weight row (quants as Q4_1's, offset `8` / `8·16` prepared). SAFETY: as
/// [`row_q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q4_0(nb: usize, w: *const u8, pr: Prepared) -> [f32; 4] {
    pair_dot!(nb, w, pr, Q4_0_BYTES, false, true, hi_scale = 1.0 / 16.0, |wp| {
        // SAFETY: `wp` is a whole Q4_0 block (`pair_dot!`); its 16 quant bytes start at byte 2.
        unsafe { nibbles_x16_dup(wp.add(2)) }
    })
}

/// Q5_0 × Q8_0 for one weight row (`q` in `0..32`, offset `16` prepared). SAFETY: as
/// [`row_q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q5_0(nb: usize, w: *const u8, pr: Prepared) -> [f32; 4] {
    let dup = idx(DUPLICATE);
    pair_dot!(nb, w, pr, Q5_0_BYTES, false, true, hi_scale = 1.0, |wp| {
        // SAFETY: `wp` is a whole Q5_0 block (`pair_dot!`): its 4 high-bit bytes start at byte 2,
        // its 16 nibble bytes at byte 6.
        let (qh, nib): (__mmask32, _) =
            unsafe { (std::ptr::read_unaligned(wp.add(2) as *const u32), nibbles(wp.add(6))) };
        let q = _mm256_mask_add_epi8(nib, qh, nib, _mm256_set1_epi8(16));
        _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(q))
    })
}

/// Q8_0 × Q8_0 for one weight row (`q + 128` unsigned, offset `128` prepared). SAFETY: as
/// [`row_q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q8_0(nb: usize, w: *const u8, pr: Prepared) -> [f32; 4] {
    let dup = idx(DUPLICATE);
    let x80 = _mm512_set1_epi8(0x80u8 as i8);
    pair_dot!(nb, w, pr, Q8_0_BYTES, false, true, hi_scale = 1.0, |wp| {
        // SAFETY: `wp` is a whole Q8_0 block (`pair_dot!`); its 32 quants start at byte 2.
        let q = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(wp.add(2) as *const __m256i) });
        _mm512_xor_si512(_mm512_permutexvar_epi32(dup, q), x80)
    })
}

thread_local! {
    /// Scratch for [`prepare`], reused across calls (64-byte units for alignment).
    static SCRATCH: RefCell<Vec<__m512i>> = const { RefCell::new(Vec::new()) };
}

/// Safe [`crate::Dot4RowsFn`] wrappers: check lengths (`x86::check_row_block`), prepare the
/// activations into the thread's scratch buffer, run the row kernel on every row.
macro_rules! rows_wrapper {
    ($name:ident, $kernel:ident, $t:expr, $act:expr) => {
        pub(crate) fn $name(n: usize, w: &[u8], row_bytes: usize, a: [&[u8]; 4], out: &mut [[f32; 4]]) {
            let nb = super::wrappers::check_row_block($t, n, w, row_bytes, out.len(), a);
            if out.is_empty() {
                return;
            }
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                let units = 2 * nb * (PREP_Q + PREP_C + PREP_H) / 64 + 1;
                if s.len() < units {
                    // SAFETY: an all-zero `__m512i` is a valid value.
                    s.resize(units, unsafe { std::mem::zeroed() });
                }
                let buf = s.as_mut_ptr() as *mut u8;
                let a = a.map(<[u8]>::as_ptr);
                // SAFETY: handed out by `x86::avx512_dot4_rows_fn` only after detecting every
                // feature the kernels are compiled for (module invariant); `check_row_block`
                // verified `out.len()` weight rows of `nb` blocks `row_bytes` apart and `nb`
                // blocks in each activation row; `buf` holds `units` 64-byte units, enough for
                // `prepare`.
                unsafe {
                    let pr = prepare(nb, a, $act, buf);
                    for (r, o) in out.iter_mut().enumerate() {
                        *o = $kernel(nb, w.as_ptr().add(r * row_bytes), pr);
                    }
                }
            })
        }
    };
}

rows_wrapper!(rows_q4_1, row_q4_1, WeightType::Q4_1, ActPrep { ab: Q8_1_BYTES, qoff: 4, k: None });
rows_wrapper!(rows_q4_0, row_q4_0, WeightType::Q4_0, ActPrep { ab: Q8_0_BYTES, qoff: 2, k: Some((8, -128)) });
rows_wrapper!(rows_q5_0, row_q5_0, WeightType::Q5_0, ActPrep { ab: Q8_0_BYTES, qoff: 2, k: Some((16, 16)) });
rows_wrapper!(rows_q8_0, row_q8_0, WeightType::Q8_0, ActPrep { ab: Q8_0_BYTES, qoff: 2, k: Some((-128, -128)) });
