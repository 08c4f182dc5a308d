//! AVX2 and AVX-512 (+VNNI) dot kernels for the K-quant weight formats against Q8_K activations.
//!
//! Each public function is a safe wrapper that checks slice lengths once and then calls a
//! `#[target_feature]` kernel. The kernels are safe functions over slices of blocks (every load is
//! a bounds-checked `load128` / `load256` / `load512` of a block field); calling one is
//! `unsafe` only because of its target features. The wrappers are only handed out by the
//! dispatcher (`x86::avx2_dot_fn` / `x86::avx512_dot_fn`, behind
//! [`crate::WeightType::dot_fn_for`]) after [`crate::Isa::is_supported`] confirmed every feature
//! the kernel is compiled for: AVX2 + FMA + F16C, plus AVX-512 F/BW/VL + VNNI for the `avx512_*`
//! ones.
//!
//! - AVX2 kernels follow GGML's x86 versions: `vpmaddubsw` (u8 quant × i8 activation → i16 pairs),
//!   then `vpmaddwd` with the sub-block scale (→ i32), one f32 FMA per super-block.
//! - AVX-512 Q4_K / Q5_K stay in 256-bit registers, where the integer multiplies issue on two
//!   ports instead of one: per 32-value sub-block one `vpmaddubsw` and one VNNI `vpdpwssd` whose
//!   scale operand is broadcast straight from a per-block stack array (`{1to8}`), so scales cost
//!   no shuffles. Q5_K's fifth bit is moved to bit 4 with a shift and merged with `vpternlogd`.
//! - AVX-512 Q6_K uses 512-bit registers of 64 values: a 16-value sub-block fills one 128-bit lane,
//!   so each register's scales are one `vpermw`; quants are assembled with `vpternlogd` bit
//!   selects, and the `−32` offset is taken out once per block as `32 · Σ scale · bsum`.
//! - `vpdpwssd` is written as inline asm (see `dpwssd512!`), because LLVM's generic tuning splits
//!   the intrinsic into `vpmaddwd` + `vpaddd`.
//!
//! Every kernel is generic over the number of activation rows `T` (see "Multi-token kernels"
//! below): `T = 1` is the single-row [`crate::DotFn`], `T = 4` (AVX-512) or `T = 2` twice (AVX2)
//! the [`crate::Dot4Fn`], bit-identical to it per token. The [`crate::Dot4RowsFn`]s run the
//! four-token kernel row by row (the Q8_K headers need no conversion to share).
//!
//! The i32 sums per super-block are exact (no `vpmaddubsw` saturation is possible: q ≤ 63,
//! |a| ≤ 128), so results differ from the scalar reference only by f32 rounding. Loads are
//! unaligned; horizontal sums happen once per row.
//!
//! Throughput on the development VM (Xeon with AVX-512 VNNI, 2 cores shared with other builds;
//! one thread, best of 400 products of a 896 × 4864 matrix with a vector, GB/s of weight bytes,
//! `tests/kquants.rs::throughput`): Q4_K AVX2 15.3, AVX-512 22.3; Q5_K 15.6 / 21.2; Q6_K
//! 19.2 / 24.7. llama.cpp's kernels measured alongside: `ggml_vec_dot_q4_K_q8_K` 17.5, its
//! repacked 8-row Q4_K GEMV 18.4, `ggml_vec_dot_q6_K_q8_K` 23.4.

use super::helpers::prefetch_weights;
use crate::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::scalar_k::{unpack_scales_k4, QK_K};
use crate::Isa;
use std::arch::asm;
use std::arch::x86_64::*;

/// Checks `n` and the slice lengths once and views the weight row and each of the `T` activation
/// rows as `n / 256` blocks.
#[inline(always)]
fn as_blocks<'a, W: bytemuck::Pod, const T: usize>(
    n: usize,
    w: &'a [u8],
    a: [&'a [u8]; T],
) -> (&'a [W], [&'a [BlockQ8K]; T]) {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let wb = nb * std::mem::size_of::<W>();
    let ab = nb * std::mem::size_of::<BlockQ8K>();
    for a in &a {
        assert!(w.len() >= wb && a.len() >= ab, "row of {n} values: {} weight / {} activation bytes", w.len(), a.len());
    }
    (bytemuck::cast_slice(&w[..wb]), a.map(|a| bytemuck::cast_slice(&a[..ab])))
}

/// Safe wrappers: `$name` (a [`crate::DotFn`]) runs the kernel's 1-token instance, `$name4` (a
/// [`crate::Dot4Fn`]) its 4-token instance, or its 2-token instance twice (`tokens = 2`, for
/// AVX2, whose 16 registers do not hold four tokens' state).
macro_rules! safe_wrappers {
    ($($(#[$doc:meta])* $name:ident, $name4:ident => $kernel:ident($wty:ty), $isa:expr, tokens = $tok:tt;)*) => {$(
        $(#[$doc])*
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            debug_assert!($isa.is_supported(), concat!(stringify!($name), " needs ", stringify!($isa)));
            let (xs, [ys]) = as_blocks::<$wty, 1>(n, w, [a]);
            // SAFETY: this function is only handed out by the dispatcher (`x86::avx2_dot_fn` /
            // `x86::avx512_dot_fn`) after `Isa::is_supported` confirmed at run time every feature
            // the kernel is compiled for (the kernel itself checks the slice lengths).
            unsafe { $kernel::<1>(xs, [ys])[0] }
        }
        safe_wrappers!(@four $(#[$doc])* $name4, $kernel, $wty, $isa, $tok);
    )*};
    (@four $(#[$doc:meta])* $name4:ident, $kernel:ident, $wty:ty, $isa:expr, 4) => {
        $(#[$doc])*
        /// Four tokens.
        pub(crate) fn $name4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            debug_assert!($isa.is_supported(), concat!(stringify!($name4), " needs ", stringify!($isa)));
            let (xs, ys) = as_blocks::<$wty, 4>(n, w, a);
            // SAFETY: as for the 1-token wrapper (dispatched by `x86::avx*_dot4_fn` after the same
            // check of the features).
            unsafe { $kernel::<4>(xs, ys) }
        }
    };
    (@four $(#[$doc:meta])* $name4:ident, $kernel:ident, $wty:ty, $isa:expr, 2) => {
        $(#[$doc])*
        /// Four tokens, two at a time.
        pub(crate) fn $name4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            debug_assert!($isa.is_supported(), concat!(stringify!($name4), " needs ", stringify!($isa)));
            let (xs, ys) = as_blocks::<$wty, 4>(n, w, a);
            // SAFETY: as for the 1-token wrapper (dispatched by `x86::avx*_dot4_fn` after the same
            // check of the features).
            let ([r0, r1], [r2, r3]) = unsafe { ($kernel::<2>(xs, [ys[0], ys[1]]), $kernel::<2>(xs, [ys[2], ys[3]])) };
            [r0, r1, r2, r3]
        }
    };
}

// Multi-row kernels: one four-token call per row (K-quant headers need no conversion).
crate::rows_by_dot4!(pub(crate) avx2_dot4_rows_q4_k = avx2_dot4_q4_k);
crate::rows_by_dot4!(pub(crate) avx2_dot4_rows_q5_k = avx2_dot4_q5_k);
crate::rows_by_dot4!(pub(crate) avx2_dot4_rows_q6_k = avx2_dot4_q6_k);
crate::rows_by_dot4!(pub(crate) avx512_dot4_rows_q4_k = avx512_dot4_q4_k);
crate::rows_by_dot4!(pub(crate) avx512_dot4_rows_q5_k = avx512_dot4_q5_k);
crate::rows_by_dot4!(pub(crate) avx512_dot4_rows_q6_k = avx512_dot4_q6_k);

safe_wrappers! {
    /// Q4_K · Q8_K, AVX2 + FMA + F16C.
    avx2_dot_q4_k, avx2_dot4_q4_k => q4k_avx2(BlockQ4K), Isa::Avx2, tokens = 2;
    /// Q5_K · Q8_K, AVX2 + FMA + F16C.
    avx2_dot_q5_k, avx2_dot4_q5_k => q5k_avx2(BlockQ5K), Isa::Avx2, tokens = 2;
    /// Q6_K · Q8_K, AVX2 + FMA + F16C.
    avx2_dot_q6_k, avx2_dot4_q6_k => q6k_avx2(BlockQ6K), Isa::Avx2, tokens = 2;
    /// Q4_K · Q8_K, AVX-512 F/BW/VL + VNNI.
    avx512_dot_q4_k, avx512_dot4_q4_k => q4k_avx512(BlockQ4K), Isa::Avx512Vnni, tokens = 4;
    /// Q5_K · Q8_K, AVX-512 F/BW/VL + VNNI.
    avx512_dot_q5_k, avx512_dot4_q5_k => q5k_avx512(BlockQ5K), Isa::Avx512Vnni, tokens = 4;
    /// Q6_K · Q8_K, AVX-512 F/BW/VL + VNNI.
    avx512_dot_q6_k, avx512_dot4_q6_k => q6k_avx512(BlockQ6K), Isa::Avx512Vnni, tokens = 4;
}

/// f16 (little-endian bytes) → f32 with F16C.
#[inline]
#[target_feature(enable = "f16c")]
fn f16_to_f32(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32)))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_ps_256(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_ps_128(x: __m128) -> f32 {
    let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// The 16 bytes of `v` (a block field) from byte `off` (panics unless they are all inside `v`;
/// with the kernels' constant offsets the check folds away).
#[inline]
#[target_feature(enable = "sse2")]
fn load128<V: bytemuck::Pod>(v: &V, off: usize) -> __m128i {
    let b: &[u8; 16] = bytemuck::bytes_of(v)[off..off + 16].try_into().unwrap();
    // SAFETY: `b` is exactly the 16 bytes loaded (unaligned load).
    unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) }
}

/// The 32 bytes of `v` from byte `off`, as [`load128`].
#[inline]
#[target_feature(enable = "avx")]
fn load256<V: bytemuck::Pod>(v: &V, off: usize) -> __m256i {
    let b: &[u8; 32] = bytemuck::bytes_of(v)[off..off + 32].try_into().unwrap();
    // SAFETY: `b` is exactly the 32 bytes loaded (unaligned load).
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

/// The 64 bytes of `v` from byte `off`, as [`load128`].
#[inline]
#[target_feature(enable = "avx512f")]
fn load512<V: bytemuck::Pod>(v: &V, off: usize) -> __m512i {
    let b: &[u8; 64] = bytemuck::bytes_of(v)[off..off + 64].try_into().unwrap();
    // SAFETY: `b` is exactly the 64 bytes loaded (unaligned load).
    unsafe { _mm512_loadu_si512(b.as_ptr() as *const __m512i) }
}

/// GGML's `get_scale_shuffle_k4(i)`: every i16 lane picks i16 number `i` of a 16-byte register.
#[inline(always)]
fn shuffle_k4(i: usize) -> i16 {
    (((2 * i + 1) << 8) | (2 * i)) as i16
}

/// The `T` activation rows cut to `n` blocks each (panics if one is shorter), so that a kernel
/// iterating over `n` weight blocks can take block `i` of each with [`act_blocks`].
#[inline(always)]
fn act_rows<const T: usize>(ys: [&[BlockQ8K]; T], n: usize) -> [&[BlockQ8K]; T] {
    ys.map(|y| &y[..n])
}

/// Block `i` of each token's activation row.
///
/// # Safety
/// `i < ys[t].len()` for every `t`.
#[inline(always)]
unsafe fn act_blocks<'a, const T: usize>(ys: &[&'a [BlockQ8K]; T], i: usize) -> [&'a BlockQ8K; T] {
    // SAFETY: `i < ys[t].len()` for every `t`, by the caller's contract.
    std::array::from_fn(|t| unsafe { ys[t].get_unchecked(i) })
}

// ---------------------------------------------------------------------------------------------
// Multi-token kernels
// ---------------------------------------------------------------------------------------------
//
// Every kernel takes one weight row and `T` activation rows (`T` = 1: the single-row dot) and
// keeps per token its own accumulators, updated by the same operations in the same order whatever
// `T` is; only the weight unpacking (quants, sub-block scales, f16 block scales) is shared. So
// token `t` of a `T`-token call is bit for bit the 1-token result for that token.

// ---------------------------------------------------------------------------------------------
// AVX2
// ---------------------------------------------------------------------------------------------

/// Token `t`'s dot product of the weight row `xs` with `ys[t]` (AVX2 + FMA + F16C).
///
/// # Panics
/// If some `ys[t]` is shorter than `xs`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_avx2<const T: usize>(xs: &[BlockQ4K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm_setzero_ps(); T];
    let ys = act_rows(ys, xs.len());
    for (i, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of_val(x));
        // SAFETY: `i < xs.len()`, the length of every `ys[t]` after `act_rows`.
        let y = unsafe { act_blocks(&ys, i) };
        let (xd, xdmin) = (f16_to_f32(x.d), f16_to_f32(x.dmin));
        let u = unpack_scales_k4(&x.scales);
        let mins_and_scales = _mm256_cvtepu8_epi16(load128(&u, 0));
        let mins = _mm256_extracti128_si256::<1>(mins_and_scales);
        let mut d = [0f32; T];
        for t in 0..T {
            let dy = f32::from_le_bytes(y[t].d);
            d[t] = dy * xd;
            let dmin = -dy * xdmin;
            let q8sums = load256(&y[t].bsums, 0);
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            let prod = _mm_madd_epi16(mins, q8s);
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[t]);
        }

        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_set_m128i(sc128, sc128);
        let mut sumi = [_mm256_setzero_si256(); T];
        for j in 0..QK_K / 64 {
            let scale_l = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(shuffle_k4(2 * j)));
            let scale_h = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(shuffle_k4(2 * j + 1)));
            let q4bits = load256(&x.qs, 32 * j);
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
            for t in 0..T {
                let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load256(&y[t].qs, 64 * j)));
                let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, load256(&y[t].qs, 64 * j + 32)));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p16l, p16h));
            }
        }
        for t in 0..T {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d[t]), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum_ps_256(acc[t]) + hsum_ps_128(acc_m[t]);
    }
    out
}

/// Token `t`'s dot product of the weight row `xs` with `ys[t]` (AVX2 + FMA + F16C).
///
/// # Panics
/// If some `ys[t]` is shorter than `xs`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q5k_avx2<const T: usize>(xs: &[BlockQ5K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0xF);
    let mone = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm_setzero_ps(); T];
    let ys = act_rows(ys, xs.len());
    for (i, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of_val(x));
        // SAFETY: `i < xs.len()`, the length of every `ys[t]` after `act_rows`.
        let y = unsafe { act_blocks(&ys, i) };
        let (xd, xdmin) = (f16_to_f32(x.d), f16_to_f32(x.dmin));
        let u = unpack_scales_k4(&x.scales);
        let mins_and_scales = _mm256_cvtepu8_epi16(load128(&u, 0));
        let mins = _mm256_extracti128_si256::<1>(mins_and_scales);
        let mut d = [0f32; T];
        for t in 0..T {
            let dy = f32::from_le_bytes(y[t].d);
            d[t] = dy * xd;
            let dmin = -dy * xdmin;
            let q8sums = load256(&y[t].bsums, 0);
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            let prod = _mm_madd_epi16(mins, q8s);
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[t]);
        }

        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_set_m128i(sc128, sc128);
        let hbits = load256(&x.qh, 0);
        let mut sumi = [_mm256_setzero_si256(); T];
        for j in 0..QK_K / 64 {
            let scale_0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(shuffle_k4(2 * j)));
            let scale_1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(shuffle_k4(2 * j + 1)));
            let q5bits = load256(&x.qs, 32 * j);
            // Bit 2j (low nibbles) / 2j+1 (high nibbles) of qh → bit 4 of each byte.
            let h0 = _mm256_and_si256(hbits, _mm256_set1_epi8(1 << (2 * j)));
            let h1 = _mm256_and_si256(hbits, _mm256_set1_epi8(1 << (2 * j + 1)));
            let h0 = _mm256_min_epu8(h0, mone); // 0 or 1
            let h1 = _mm256_min_epu8(h1, mone);
            let q5_0 = _mm256_or_si256(_mm256_and_si256(q5bits, m4), _mm256_slli_epi16::<4>(h0));
            let q5_1 =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q5bits), m4), _mm256_slli_epi16::<4>(h1));
            for t in 0..T {
                let p16_0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q5_0, load256(&y[t].qs, 64 * j)));
                let p16_1 = _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(q5_1, load256(&y[t].qs, 64 * j + 32)));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p16_0, p16_1));
            }
        }
        for t in 0..T {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d[t]), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum_ps_256(acc[t]) + hsum_ps_128(acc_m[t]);
    }
    out
}

/// Token `t`'s dot product of the weight row `xs` with `ys[t]` (AVX2 + FMA + F16C).
///
/// # Panics
/// If some `ys[t]` is shorter than `xs`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_avx2<const T: usize>(xs: &[BlockQ6K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); T];
    let ys = act_rows(ys, xs.len());
    for (i, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of_val(x));
        // SAFETY: `i < xs.len()`, the length of every `ys[t]` after `act_rows`.
        let y = unsafe { act_blocks(&ys, i) };
        let xd = f16_to_f32(x.d);
        let scales = load128(&x.scales, 0);
        let scales_16 = _mm256_cvtepi8_epi16(scales);
        let mut sumi = [_mm256_setzero_si256(); T];
        for j in 0..QK_K / 128 {
            let q4bits1 = load256(&x.ql, 64 * j);
            let q4bits2 = load256(&x.ql, 64 * j + 32);
            let q4bits_h = load256(&x.qh, 32 * j);

            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(q4bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)));

            let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            let q4_2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15), q4h_2);
            let q4_3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15), q4h_3);

            // Sub-blocks 8j + 2k, 8j + 2k + 1 for the k-th 32 values.
            let sc = |k: usize| {
                let lo = (8 * j + 2 * k) as u64 * 0x0101_0101_0101_0101;
                let hi = (8 * j + 2 * k + 1) as u64 * 0x0101_0101_0101_0101;
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, _mm_set_epi64x(hi as i64, lo as i64)))
            };
            let sc = [sc(0), sc(1), sc(2), sc(3)];

            for t in 0..T {
                let p16_0 = _mm256_madd_epi16(sc[0], _mm256_maddubs_epi16(q4_0, load256(&y[t].qs, 128 * j)));
                let p16_1 = _mm256_madd_epi16(sc[1], _mm256_maddubs_epi16(q4_1, load256(&y[t].qs, 128 * j + 32)));
                let p16_2 = _mm256_madd_epi16(sc[2], _mm256_maddubs_epi16(q4_2, load256(&y[t].qs, 128 * j + 64)));
                let p16_3 = _mm256_madd_epi16(sc[3], _mm256_maddubs_epi16(q4_3, load256(&y[t].qs, 128 * j + 96)));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p16_0, p16_1));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p16_2, p16_3));
            }
        }
        for t in 0..T {
            let d = f32::from_le_bytes(y[t].d) * xd;
            // The −32 offset of every quant: 32 · Σ scale · bsum, taken out once per block.
            let q8sums = load256(&y[t].bsums, 0);
            let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
            let s = _mm256_sub_epi32(sumi[t], q8sclsub);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum_ps_256(acc[t]);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// AVX-512 + VNNI
// ---------------------------------------------------------------------------------------------
//
// `vpdpwssd` is emitted with inline asm: for generic x86-64 tuning LLVM splits the intrinsic into
// `vpmaddwd` + `vpaddd`, an extra uop on the ports these kernels saturate (about 8 % on Q4_K).
// Each asm statement is one register-only (or stack-reading) VNNI instruction that touches no
// flags and no memory other than the operand named.

/// `acc += vpdpwssd(p, s)` on `zmm` registers (`$acc`: a place, e.g. `sumi[t]`).
macro_rules! dpwssd512 {
    ($acc:expr, $p:expr, $s:expr) => {{
        let (p, s): (__m512i, __m512i) = ($p, $s);
        // SAFETY: the enclosing function is compiled for AVX-512 VNNI (and runs only where the
        // CPU has it); the instruction reads and writes the named registers only.
        unsafe {
            asm!("vpdpwssd {acc}, {p}, {s}", acc = inout(zmm_reg) $acc, p = in(zmm_reg) p, s = in(zmm_reg) s,
                options(pure, nomem, nostack, preserves_flags))
        };
    }};
}

/// `s0 += vpdpwssd(p0, broadcast(sp[k0]))`, `s1 += vpdpwssd(p1, broadcast(sp[k0 + 1]))` on `ymm`
/// registers, the i32 scale pairs broadcast from memory for free (`{1to8}`). `$s0` / `$s1` are
/// places (e.g. `s0[t]`); `$sp` is a `&[u32; 8]`.
macro_rules! dpwssd256_bcast2 {
    ($s0:expr, $p0:expr, $s1:expr, $p1:expr, $sp:expr, $k0:expr) => {{
        let (p0, p1, sp): (__m256i, __m256i, &[u32; 8]) = ($p0, $p1, $sp);
        const { assert!(($k0) + 1 < 8) };
        // SAFETY: the enclosing function is compiled for AVX-512 VNNI + VL (and runs only where
        // the CPU has them); the two memory operands are `sp[k0]` and `sp[k0 + 1]`, inside the
        // borrowed `[u32; 8]` because `k0 + 1 < 8` (checked at compile time), and only read.
        unsafe {
            asm!(
                "vpdpwssd {s0}, {p0}, dword ptr [{sp} + {o0}]{{1to8}}",
                "vpdpwssd {s1}, {p1}, dword ptr [{sp} + {o1}]{{1to8}}",
                s0 = inout(ymm_reg) $s0, p0 = in(ymm_reg) p0, s1 = inout(ymm_reg) $s1, p1 = in(ymm_reg) p1,
                sp = in(reg) sp.as_ptr(), o0 = const 4 * ($k0), o1 = const 4 * ($k0) + 4,
                options(pure, readonly, nostack, preserves_flags)
            )
        };
    }};
}

/// The first 4 bytes of a block (both f16 scales of a Q4_K / Q5_K block), in one load.
#[inline(always)]
fn header<T: bytemuck::Pod>(x: &T) -> i32 {
    let b = bytemuck::bytes_of(x);
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The eight 6-bit sub-block scales of a Q4_K / Q5_K block as `(sc, sc)` i16 pairs (for
/// `vpdpwssd`), and its eight mins as `(min, min)` i16 pairs: `madd(bsums, mins2)` is
/// `Σ_k bsums[k] · min[k / 2]` as 8 i32 lanes (`bsums`: a Q8_K block's 16 sums).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn scales_and_mins_k4(scales: &[u8; 12]) -> (__m256i, __m256i) {
    let u = unpack_scales_k4(scales);
    let sc = _mm_cvtsi64_si128(((u[0] as u64) | ((u[1] as u64) << 32)) as i64);
    let mn = _mm_cvtsi64_si128(((u[2] as u64) | ((u[3] as u64) << 32)) as i64);
    let mins2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
    let s32 = _mm256_cvtepu8_epi32(sc);
    (_mm256_or_si256(s32, _mm256_slli_epi32::<16>(s32)), mins2)
}

/// One token's super-block epilogue of the Q4_K / Q5_K AVX-512 kernels: `acc += d · sumi`,
/// `acc_m += dmin · Σ bsum · min`, with `[d, dmin] = [d_w, dmin_w] · d_a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn k4_epilogue(hw: __m128, y: &BlockQ8K, mins2: __m256i, sumi: __m256i, acc: &mut __m256, acc_m: &mut __m256) {
    let dd = _mm_mul_ps(hw, _mm_set1_ps(f32::from_le_bytes(y.d)));
    let mins = _mm256_madd_epi16(load256(&y.bsums, 0), mins2);
    *acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), *acc);
    let vdmin = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dd), _mm256_set1_epi32(1));
    *acc_m = _mm256_fmadd_ps(vdmin, _mm256_cvtepi32_ps(mins), *acc_m);
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_diff_256(acc: __m256, acc_m: __m256) -> f32 {
    hsum_ps_256(_mm256_sub_ps(acc, acc_m))
}

/// Token `t`'s dot product of the weight row `xs` with `ys[t]` (AVX-512 F/BW/VL + VNNI, AVX2, FMA,
/// F16C).
///
/// # Panics
/// If some `ys[t]` is shorter than `xs`.
///
/// 256-bit registers throughout (the multiplies then issue on two ports, not one): per 64 values
/// one 32-byte quant load and nibble split (shared by the tokens), then per token two
/// `vpmaddubsw` and two `vpdpwssd` whose scale operand is broadcast from a small stack array.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4k_avx512<const T: usize>(xs: &[BlockQ4K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm256_setzero_ps(); T];
    let mut sbuf = [0u32; 8];
    let ys = act_rows(ys, xs.len());
    for (i, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of_val(x));
        // SAFETY: `i < xs.len()`, the length of every `ys[t]` after `act_rows`.
        let y = unsafe { act_blocks(&ys, i) };
        let hw = _mm_cvtph_ps(_mm_cvtsi32_si128(header(x)));
        let (sc_pairs, mins2) = scales_and_mins_k4(&x.scales);
        // SAFETY: `sbuf` is a `[u32; 8]`: exactly the 32 bytes stored.
        unsafe { _mm256_storeu_si256(sbuf.as_mut_ptr() as *mut __m256i, sc_pairs) };
        let sp = &sbuf;
        let mut s0 = [_mm256_setzero_si256(); T];
        let mut s1 = [_mm256_setzero_si256(); T];
        macro_rules! chunk {
            ($j:literal) => {{
                let qb = load256(&x.qs, 32 * $j);
                let lo = _mm256_and_si256(qb, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4);
                for t in 0..T {
                    let plo = _mm256_maddubs_epi16(lo, load256(&y[t].qs, 64 * $j));
                    let phi = _mm256_maddubs_epi16(hi, load256(&y[t].qs, 64 * $j + 32));
                    dpwssd256_bcast2!(s0[t], plo, s1[t], phi, sp, 2 * $j);
                }
            }};
        }
        chunk!(0);
        chunk!(1);
        chunk!(2);
        chunk!(3);
        for t in 0..T {
            k4_epilogue(hw, y[t], mins2, _mm256_add_epi32(s0[t], s1[t]), &mut acc[t], &mut acc_m[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum_diff_256(acc[t], acc_m[t]);
    }
    out
}

/// Token `t`'s dot product of the weight row `xs` with `ys[t]` (AVX-512 F/BW/VL + VNNI, AVX2, FMA,
/// F16C).
///
/// # Panics
/// If some `ys[t]` is shorter than `xs`.
///
/// As [`q4k_avx512`]; the fifth bit of chunk `j` (bit `2j` / `2j + 1` of `qh`) is shifted to bit 4
/// and merged with one `vpternlogd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q5k_avx512<const T: usize>(xs: &[BlockQ5K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0xF);
    let m16 = _mm256_set1_epi8(16);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm256_setzero_ps(); T];
    let mut sbuf = [0u32; 8];
    let ys = act_rows(ys, xs.len());
    for (i, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of_val(x));
        // SAFETY: `i < xs.len()`, the length of every `ys[t]` after `act_rows`.
        let y = unsafe { act_blocks(&ys, i) };
        let hw = _mm_cvtph_ps(_mm_cvtsi32_si128(header(x)));
        let (sc_pairs, mins2) = scales_and_mins_k4(&x.scales);
        // SAFETY: `sbuf` is a `[u32; 8]`: exactly the 32 bytes stored.
        unsafe { _mm256_storeu_si256(sbuf.as_mut_ptr() as *mut __m256i, sc_pairs) };
        let sp = &sbuf;
        let hb = load256(&x.qh, 0);
        let mut s0 = [_mm256_setzero_si256(); T];
        let mut s1 = [_mm256_setzero_si256(); T];
        // `a | (b & c)`.
        const OR_AND: i32 = 0xF8;
        macro_rules! chunk {
            ($j:literal, $hlo:expr, $hhi:expr) => {{
                let qb = load256(&x.qs, 32 * $j);
                let lo = _mm256_ternarylogic_epi32::<OR_AND>(_mm256_and_si256(qb, m4), $hlo, m16);
                let hi =
                    _mm256_ternarylogic_epi32::<OR_AND>(_mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4), $hhi, m16);
                for t in 0..T {
                    let plo = _mm256_maddubs_epi16(lo, load256(&y[t].qs, 64 * $j));
                    let phi = _mm256_maddubs_epi16(hi, load256(&y[t].qs, 64 * $j + 32));
                    dpwssd256_bcast2!(s0[t], plo, s1[t], phi, sp, 2 * $j);
                }
            }};
        }
        // 16-bit shifts move bit k of every byte to bit 4 of the same byte (|4 − k| ≤ 4).
        chunk!(0, _mm256_slli_epi16::<4>(hb), _mm256_slli_epi16::<3>(hb));
        chunk!(1, _mm256_slli_epi16::<2>(hb), _mm256_slli_epi16::<1>(hb));
        chunk!(2, hb, _mm256_srli_epi16::<1>(hb));
        chunk!(3, _mm256_srli_epi16::<2>(hb), _mm256_srli_epi16::<3>(hb));
        for t in 0..T {
            k4_epilogue(hw, y[t], mins2, _mm256_add_epi32(s0[t], s1[t]), &mut acc[t], &mut acc_m[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum_diff_256(acc[t], acc_m[t]);
    }
    out
}

/// Mask of the upper 32 bytes (upper 16 i16 lanes) of a `zmm`.
const UPPER_HALF_W: __mmask32 = 0xFFFF_0000;

/// Token `t`'s dot product of the weight row `xs` with `ys[t]` (AVX-512 F/BW/VL + VNNI, AVX2, FMA,
/// F16C).
///
/// # Panics
/// If some `ys[t]` is shorter than `xs`.
///
/// 512-bit registers, 64 values each: a 16-value sub-block fills one 128-bit lane, so the scale
/// vector for a register is one `vpermw` of the sixteen sign-extended scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q6k_avx512<const T: usize>(xs: &[BlockQ6K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m33 = _mm512_set1_epi8(0x33);
    // vpermw indices for 64-value chunk c: sub-block 4c + k fills 128-bit lane k.
    let sidx: [__m512i; 4] = std::array::from_fn(|c| {
        let lane = |k: usize| 0x0001_0001_0001_0001 * (4 * c + k) as i64;
        _mm512_set_epi64(lane(3), lane(3), lane(2), lane(2), lane(1), lane(1), lane(0), lane(0))
    });
    let mut acc = [_mm512_setzero_ps(); T];
    let ys = act_rows(ys, xs.len());
    for (i, x) in xs.iter().enumerate() {
        prefetch_weights(std::ptr::from_ref(x).cast::<u8>(), std::mem::size_of_val(x));
        // SAFETY: `i < xs.len()`, the length of every `ys[t]` after `act_rows`.
        let y = unsafe { act_blocks(&ys, i) };
        let xd = f16_to_f32(x.d);
        let sc16 = _mm256_cvtepi8_epi16(load128(&x.scales, 0));
        let sc512 = _mm512_castsi256_si512(sc16);
        let mut sumi = [_mm512_setzero_si512(); T];
        for t in 0..T {
            // −32 · Σ scale · bsum: the quants' offset, seeded into the accumulator.
            let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load256(&y[t].bsums, 0), sc16));
            sumi[t] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), corr));
        }
        for h in 0..QK_K / 128 {
            let l = load512(&x.ql, 64 * h);
            // qh for values 0..32 in the low half, qh >> 2 for values 32..64 in the high half;
            // bits 0-1 then feed the first 64 values, bits 4-5 the next 64.
            let hb = _mm512_broadcast_i64x4(load256(&x.qh, 32 * h));
            let hb = _mm512_and_si512(_mm512_mask_srli_epi16::<2>(hb, UPPER_HALF_W, hb), m33);
            // Bitwise select (imm 0xE4): bits 0-3 from the nibble, bits 4-7 from the high bits.
            let z01 = _mm512_ternarylogic_epi32::<0xE4>(l, _mm512_slli_epi16::<4>(hb), m4);
            let z23 = _mm512_ternarylogic_epi32::<0xE4>(_mm512_srli_epi16::<4>(l), hb, m4);
            let s01 = _mm512_permutexvar_epi16(sidx[2 * h], sc512);
            let s23 = _mm512_permutexvar_epi16(sidx[2 * h + 1], sc512);
            for t in 0..T {
                let p01 = _mm512_maddubs_epi16(z01, load512(&y[t].qs, 128 * h));
                let p23 = _mm512_maddubs_epi16(z23, load512(&y[t].qs, 128 * h + 64));
                dpwssd512!(sumi[t], p01, s01);
                dpwssd512!(sumi[t], p23, s23);
            }
        }
        for t in 0..T {
            let d = f32::from_le_bytes(y[t].d) * xd;
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = _mm512_reduce_add_ps(acc[t]);
    }
    out
}
