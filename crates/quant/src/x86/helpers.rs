//! Register helpers shared by the x86 kernels: the horizontal sum of a `__m256`, loads that
//! gather block headers or unpack nibbles and bits, unsigned × signed byte products (AVX2 and
//! VNNI), the scheduling barrier of the multi-token kernels and the weight prefetch.

use std::arch::x86_64::*;

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The four u32s at `p`, `p + stride`, `p + 2 * stride`, `p + 3 * stride`.
///
/// # Safety
/// AVX2 present; all four 4-byte ranges must be readable (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load4_u32(p: *const u8, stride: usize) -> __m128i {
    // SAFETY: the four unaligned 4-byte loads are exactly the ranges the caller guarantees
    // readable.
    let [a, b, c, d] = unsafe {
        [
            _mm_loadu_si32(p),
            _mm_loadu_si32(p.add(stride)),
            _mm_loadu_si32(p.add(2 * stride)),
            _mm_loadu_si32(p.add(3 * stride)),
        ]
    };
    _mm_unpacklo_epi64(_mm_unpacklo_epi32(a, b), _mm_unpacklo_epi32(c, d))
}

/// 16 bytes of packed nibbles at `p` as 32 bytes in `0..16`: low nibbles (elements 0..16) in the
/// low lane, high nibbles (elements 16..32) in the high lane — GGML's element order.
///
/// # Safety
/// AVX2 present; `p..p + 16` must be readable (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: an unaligned 16-byte load of `p..p + 16`, readable by the caller's contract.
    let b = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p as *const __m128i) });
    // Shifting whole dwords is fine: the mask keeps, in every byte, bits that came from that byte.
    let b = _mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

/// 16 bytes of packed nibbles at `p` as 32 bytes: low lane `byte & 0x0F` (elements 0..16), high
/// lane `byte & 0xF0` — elements 16..32 times 16, which saves the shift; the sums of the high
/// lane must be divided by 16 (exact). Only for `vpdpbusd` (i32 sums: `240 · 127 · 4` fits),
/// never `vpmaddubsw`, whose i16 pair sums would saturate.
///
/// # Safety
/// AVX2 present; `p..p + 16` must be readable (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles_x16(p: *const u8) -> __m256i {
    // SAFETY: an unaligned 16-byte load of `p..p + 16`, readable by the caller's contract.
    let b = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p as *const __m128i) });
    const LO: i64 = 0x0F0F_0F0F_0F0F_0F0F;
    const HI: i64 = !LO;
    _mm256_and_si256(b, _mm256_setr_epi64x(LO, LO, HI, HI))
}

/// 32 bits at `p` spread to 32 bytes, `0xFF` where the bit is set (GGML's `bytes_from_bits_32`).
///
/// # Safety
/// AVX2 present; `p..p + 4` must be readable (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bytes_from_bits(p: *const u8) -> __m256i {
    // SAFETY: an unaligned read of the 4 bytes `p..p + 4`, readable by the caller's contract.
    let x = _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(p as *const i32) });
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(x, shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// 32 unsigned bytes × 32 signed bytes, summed in groups of 4 into 8 i32 lanes (AVX2; exact as
/// long as `u * s` pairs fit an i16, which holds for `u <= 128` and `|s| <= 127`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mul_us_avx2(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// The same with VNNI: one `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn mul_us_vnni(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

/// An empty `asm!` statement that LLVM must assume reads and writes memory: loads are not moved
/// across it at compile time (at run time it is nothing). The multi-token block kernels put one
/// after each block, because otherwise the scheduler hoists every block's loads and integer
/// products above the previous blocks' FMAs, which needs more registers than there are and spills
/// accumulators.
#[inline(always)]
pub(crate) fn sched_barrier() {
    // SAFETY: an empty instruction sequence; it touches no registers, stack or flags.
    unsafe { std::arch::asm!("", options(nostack, preserves_flags)) }
}

/// How far ahead of the block being read the kernels prefetch weights. Rows of a matrix are
/// contiguous, so near the end of a row this fetches the start of the next one. Measured on the
/// target machine: +20–30 % on matrices that stream from L3 / memory (the output head), neutral on
/// L2-resident ones; 2–8 KiB all work, 256 B is too short.
const PREFETCH_BYTES: usize = 4096;

/// Prefetches (into L1) every cache line of the `len` weight bytes `PREFETCH_BYTES` past `p`.
/// A prefetch is only a hint: it never faults and is not a memory access in Rust's sense, so
/// addresses past the end of the slice are fine (`wrapping_add` keeps computing them defined).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch_weights(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES + off) as *const i8);
        off += 64;
    }
}

/// Four tokens' sums of 16 rows (`acc[t]` lane `r` = row `r`, token `t`) into `out[r][t]`: a
/// 4 × 16 transpose in registers (in-lane unpacks, then a 4 × 4 transpose of 128-bit lanes) and
/// four stores, for the group kernels whose output is row-major over four tokens.
///
/// # Panics
/// If `out` does not hold 16 rows.
#[target_feature(enable = "avx512f")]
pub(crate) fn store_rows_x4(acc: [__m512; 4], out: &mut [[f32; 4]]) {
    assert_eq!(out.len(), 16, "16 rows of four tokens");
    let (l01, h01) = (_mm512_unpacklo_ps(acc[0], acc[1]), _mm512_unpackhi_ps(acc[0], acc[1]));
    let (l23, h23) = (_mm512_unpacklo_ps(acc[2], acc[3]), _mm512_unpackhi_ps(acc[2], acc[3]));
    let pd = _mm512_castps_pd;
    // Lane k of r[i] holds row 4k + i of the four tokens.
    let r = [
        _mm512_castpd_ps(_mm512_unpacklo_pd(pd(l01), pd(l23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(pd(l01), pd(l23))),
        _mm512_castpd_ps(_mm512_unpacklo_pd(pd(h01), pd(h23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(pd(h01), pd(h23))),
    ];
    let t0 = _mm512_shuffle_f32x4::<0x44>(r[0], r[1]);
    let t1 = _mm512_shuffle_f32x4::<0xEE>(r[0], r[1]);
    let t2 = _mm512_shuffle_f32x4::<0x44>(r[2], r[3]);
    let t3 = _mm512_shuffle_f32x4::<0xEE>(r[2], r[3]);
    let rows = [
        _mm512_shuffle_f32x4::<0x88>(t0, t2),
        _mm512_shuffle_f32x4::<0xDD>(t0, t2),
        _mm512_shuffle_f32x4::<0x88>(t1, t3),
        _mm512_shuffle_f32x4::<0xDD>(t1, t3),
    ];
    let p = out.as_mut_ptr() as *mut f32;
    for (k, v) in rows.into_iter().enumerate() {
        // SAFETY: `out` holds 16 rows of 4 f32 (asserted), 64 contiguous values: store k writes
        // values 16k..16k + 16.
        unsafe { _mm512_storeu_ps(p.add(16 * k), v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_rows_x4_transposes_four_tokens_of_sixteen_rows() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let v: Vec<f32> = (0..64).map(|i| i as f32).collect();
        let mut out = [[0f32; 4]; 16];
        // SAFETY: AVX-512F present (checked); the loads read 16 of `v`'s 64 values each.
        unsafe {
            let acc = [0, 1, 2, 3].map(|t| _mm512_loadu_ps(v.as_ptr().add(16 * t)));
            store_rows_x4(acc, &mut out);
        }
        for (r, row) in out.iter().enumerate() {
            assert_eq!(*row, [0, 1, 2, 3].map(|t| (16 * t + r) as f32), "row {r}");
        }
    }
}
