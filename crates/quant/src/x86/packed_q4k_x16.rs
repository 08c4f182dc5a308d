//! AVX-512 VNNI kernels for the 16-row interleaved Q4_K layout ([`crate::packed_q4k_x16`]).
//!
//! Per packed super-block (16 rows × 256 values) and pair of sub-blocks: eight 64-byte loads of
//! quants, each giving the low nibbles (first sub-block) and high nibbles (second) of 16 rows × 4
//! values; each meets every token's 4-byte activation broadcast in one `vpdpbusd`, so each row's
//! sub-block sum ends in its own lane. The sums are multiplied by the 16 rows' 6-bit scales
//! (`vpmulld`, widened from the layout's bytes once for all tokens) and added. The mins' term
//! `Σ_s mn_s · bsum_s` runs as four `vpmaddwd` per token on (sub-block pair × row) i16 vectors
//! built once per super-block. Then two converts and two fused multiply-adds per token: lane for
//! lane the scalar reference [`crate::packed_q4k_x16::gemv_q4k_x16`], so bit for bit.
//!
//! No software prefetch: the rows of a group are one sequential stream the hardware prefetcher
//! follows, and `prefetcht0` 4 KiB ahead (as the 8-row kernel does) made Qwen2.5-1.5B's decode
//! 1.5x slower on a Zen 4 (17-20 against 29-31 tok/s, `sift bench -p 0 -n 64`).
//!
//! # Safety invariant
//!
//! As in [`crate::x86`]: the kernel is an `unsafe fn` compiled with `#[target_feature]`, reachable
//! only through [`gemv`] and [`gemm`], which check the lengths and that the CPU supports
//! [`Isa::Avx512Vnni`] (AVX-512 F/BW/VL/VNNI with AVX2, FMA and F16C) before calling it.

use crate::blocks::BlockQ8K;
use crate::packed_q4k_x16::{check, BlockQ4Kx16, PACK_ROWS_X16};
use crate::Isa;
use std::arch::x86_64::*;
use std::mem::size_of;

const WB: usize = size_of::<BlockQ4Kx16>();
const AB: usize = size_of::<BlockQ8K>();
/// Offsets inside a packed super-block.
const DMIN: usize = 32;
const SCM: usize = 64;
const MNL: usize = 192;
const QS: usize = 256;
/// Offsets inside a Q8_K block: quants, then the sums of 16.
const A_QS: usize = 4;
const A_BSUMS: usize = 260;

/// `vpermw` indices from `[s0 rows 0..16, s1 rows 0..16]` to `[r0 s0, r0 s1, r1 s0, …]`.
const PAIRS: [i16; 32] = {
    let mut c = [0i16; 32];
    let mut r = 0;
    while r < 16 {
        c[2 * r] = r as i16;
        c[2 * r + 1] = 16 + r as i16;
        r += 1;
    }
    c
};

/// One group of 16 rows (`nb` packed super-blocks at `w`) times `T` tokens: the 16 rows' results
/// per token.
///
/// SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `w` points to `nb` readable packed
/// super-blocks; every `a[t]` to `nb` readable Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group<const T: usize>(nb: usize, w: *const u8, a: [*const u8; T]) -> [__m512; T] {
    let low4 = _mm512_set1_epi8(0x0F);
    let m6 = _mm512_set1_epi32(63);
    let (n4, n30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    // SAFETY: a plain 64-byte value cast; `[i16; 32]` and `__m512i` have the same size.
    let pairs = unsafe { std::mem::transmute::<[i16; 32], __m512i>(PAIRS) };
    let mut acc = [_mm512_setzero_ps(); T];
    let mut accm = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        // SAFETY: super-block `b < nb` of the group (the caller's contract); every load below is
        // inside its `WB` bytes (offsets `0..QS + 2048 = WB`).
        let x = unsafe { w.add(b * WB) };
        // SAFETY: the two 32-byte scale arrays at the start of the super-block (see above).
        let (dw, mw) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(x as *const __m256i)),
                _mm512_cvtph_ps(_mm256_loadu_si256(x.add(DMIN) as *const __m256i)),
            )
        };
        // Block `b < nb` of each token: `AB` readable bytes (the caller's contract), which every
        // read through `ya[t]` below stays in (quants at `A_QS..A_QS + 256`, sums at
        // `A_BSUMS..A_BSUMS + 32 = AB`).
        let ya: [*const u8; T] = std::array::from_fn(|t| a[t].wrapping_add(b * AB));
        let mut sumi = [_mm512_setzero_si512(); T];
        for j in 0..4 {
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            for k in 0..8 {
                // SAFETY: quant bytes `64·(8j + k)..+64` of the super-block (see above).
                let v = unsafe { _mm512_loadu_si512(x.add(QS + 64 * (8 * j + k)) as *const __m512i) };
                let ql = _mm512_and_si512(v, low4);
                let qh = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                for t in 0..T {
                    // SAFETY: see above.
                    let (al, ah) = unsafe {
                        let q = ya[t].add(A_QS + 64 * j + 4 * k);
                        (std::ptr::read_unaligned(q as *const i32), std::ptr::read_unaligned(q.add(32) as *const i32))
                    };
                    lo[t] = _mm512_dpbusd_epi32(lo[t], ql, _mm512_set1_epi32(al));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], qh, _mm512_set1_epi32(ah));
                }
            }
            // SAFETY: scale bytes of sub-blocks `2j` and `2j + 1` (16 each; see above).
            let (sl, sh) = unsafe {
                (
                    _mm512_and_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(SCM + 32 * j) as *const __m128i)), m6),
                    _mm512_and_si512(
                        _mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(SCM + 32 * j + 16) as *const __m128i)),
                        m6,
                    ),
                )
            };
            for t in 0..T {
                let part = _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl), _mm512_mullo_epi32(hi[t], sh));
                sumi[t] = _mm512_add_epi32(sumi[t], part);
            }
        }
        // The mins of sub-blocks (2p, 2p + 1) as i16 pairs per row.
        let mins: [__m512i; 4] = std::array::from_fn(|p| {
            // SAFETY: scale bytes of sub-blocks `2p`, `2p + 1` and their min nibbles (see above).
            let (s, n) = unsafe {
                (
                    _mm256_loadu_si256(x.add(SCM + 32 * p) as *const __m256i),
                    _mm256_loadu_si256(x.add(MNL + 32 * (p % 2)) as *const __m256i),
                )
            };
            let n = if p < 2 { _mm256_and_si256(n, n4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(n), n4) };
            let m = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<2>(s), n30), n);
            _mm512_permutexvar_epi16(pairs, _mm512_cvtepu8_epi16(m))
        });
        for t in 0..T {
            // SAFETY: the 16 sums and the f32 scale of the token's block (see above).
            let (bsums, da) = unsafe {
                (
                    _mm256_loadu_si256(ya[t].add(A_BSUMS) as *const __m256i),
                    _mm512_set1_ps(f32::from_le_bytes(std::ptr::read_unaligned(ya[t] as *const [u8; 4]))),
                )
            };
            // The sums of 32 (sub-blocks), as i16 pairs (2p, 2p + 1) in 32-bit lane p.
            let bs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums));
            let bs = _mm512_broadcast_i32x4(bs);
            let pair = |p: i32| _mm512_permutexvar_epi32(_mm512_set1_epi32(p), bs);
            let summ = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_madd_epi16(mins[0], pair(0)), _mm512_madd_epi16(mins[1], pair(1))),
                _mm512_add_epi32(_mm512_madd_epi16(mins[2], pair(2)), _mm512_madd_epi16(mins[3], pair(3))),
            );
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(dw, da), acc[t]);
            accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(mw, da), accm[t]);
        }
    }
    std::array::from_fn(|t| _mm512_sub_ps(acc[t], accm[t]))
}

/// The packed gemv ([`crate::packed_q4k_x16::gemv_q4k_x16`]) on `isa` where it has a kernel
/// (AVX-512 VNNI): returns whether it ran. Safe: checks the lengths, and that the CPU runs it.
///
/// # Panics
/// As the reference.
pub fn gemv(isa: Isa, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) -> bool {
    if isa < Isa::Avx512Vnni || !isa.is_supported() {
        return false;
    }
    let (nb, groups) = check(n, w, a);
    assert_eq!(out.len(), groups * PACK_ROWS_X16, "16 outputs per group");
    for (k, o) in out.chunks_exact_mut(PACK_ROWS_X16).enumerate() {
        // SAFETY: `isa ≥ Avx512Vnni` is supported (checked above); `check` verified `groups`
        // whole groups of `nb` super-blocks in `w` (`k < groups`) and `nb` blocks in `a`; `o` is
        // 16 f32, exactly one unaligned 512-bit store.
        unsafe {
            let [y] = group::<1>(nb, w.as_ptr().add(k * nb * WB), [a.as_ptr()]);
            _mm512_storeu_ps(o.as_mut_ptr(), y);
        }
    }
    true
}

/// The packed product with four tokens ([`crate::packed_q4k_x16::gemm_q4k_x16_on`]) on `isa`
/// where it has a kernel (AVX-512 VNNI): returns whether it ran. Safe: checks the lengths, and
/// that the CPU runs it.
///
/// # Panics
/// As the reference, for each token.
pub fn gemm(isa: Isa, n: usize, w: &[u8], a: [&[u8]; 4], out: &mut [[f32; 4]]) -> bool {
    if isa < Isa::Avx512Vnni || !isa.is_supported() {
        return false;
    }
    let (nb, groups) = check(n, w, a[0]);
    for a in &a[1..] {
        check(n, w, a);
    }
    assert_eq!(out.len(), groups * PACK_ROWS_X16, "16 outputs per group");
    let ap = a.map(<[u8]>::as_ptr);
    for (k, o) in out.chunks_exact_mut(PACK_ROWS_X16).enumerate() {
        // SAFETY: `isa ≥ Avx512Vnni` is supported (checked above); `check` verified `groups`
        // whole groups of `nb` super-blocks in `w` (`k < groups`) and `nb` blocks in every `a[t]`.
        unsafe {
            let acc = group::<4>(nb, w.as_ptr().add(k * nb * WB), ap);
            super::helpers::store_rows_x4(acc, o);
        }
    }
    true
}
