//! The loop every non-K block kernel runs (`block_dot!`), and the byte sizes of those blocks.
//!
//! Layout of every block kernel (`block_dot!`): four blocks per iteration. The four blocks' f16
//! headers (`d`, and `m` / `s` for Q4_1 × Q8_1) are collected with four 32-bit loads per row and
//! converted with one `vcvtph2ps` per row, so `d_w · d_a` (and `m_w · s_a`) for four blocks cost one
//! multiply; the products are stored to the stack and broadcast back per block by pure loads.
//! Each block's 32 integer products are summed to eight `i32` lanes (`vpmaddubsw` + `vpmaddwd` on
//! AVX2, one `vpdpbusd` with VNNI), converted to `f32`, and FMA'd into one of four accumulators.
//! The VNNI Q4_0 / Q4_1 kernels skip the nibble shift: high nibbles are used in place (×16) and
//! the accumulator lanes holding them are scaled by 1/16 once at the end (exact).
//!
//! # Several tokens
//!
//! The block kernels are generic over the number of activation rows `T` (the single-row
//! [`DotFn`]s are `T = 1`): each weight block is unpacked once (and its header converted once),
//! then used for every token, while every token keeps its own accumulators and goes through the
//! same operations in the same order as with `T = 1` — so the [`Dot4Fn`]s (`T = 4` with AVX-512's
//! 32 registers, `T = 2` twice with AVX2's 16) are bit-identical to the [`DotFn`]s per token. Only
//! the integer method may differ where both are exact (Q8_0 with VNNI, see its kernel). With
//! `PRE = true` the activation headers come already converted to f32 (`act_headers`, in
//! [`super::wrappers`]): the AVX2 [`Dot4RowsFn`]s convert the four rows' headers once per call and
//! then run every weight row. The AVX-512 [`Dot4RowsFn`]s are [`super::pair`]'s 512-bit kernels.
//!
//! Multi-token kernels end each block with an empty `asm!` barrier (`sched_barrier`): without it
//! LLVM hoists every block's loads and products above the previous blocks' FMAs and runs out of
//! registers (measured: accumulator spills and ~15 % slower).
//!
//! Measured on the 2-core Xeon (AVX-512 VNNI) this was written on, against these alternatives:
//! 512-bit registers holding two blocks (slower: the two blocks' bytes are not contiguous, so
//! assembling them costs port-5 shuffles, and 512-bit µops leave only two vector ports), `vpgatherdd`
//! for the headers (slower), and `vpblendd` header assembly (no faster). The headers are about
//! half of the cost per block; the integer work alone runs at ~40 GB/s for Q4_1.

use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1};
#[cfg(doc)]
use crate::{Dot4Fn, Dot4RowsFn, DotFn};
use std::mem::size_of;

pub(super) const Q4_0_BYTES: usize = size_of::<BlockQ4_0>();
pub(super) const Q4_1_BYTES: usize = size_of::<BlockQ4_1>();
pub(super) const Q5_0_BYTES: usize = size_of::<BlockQ5_0>();
pub(super) const Q8_0_BYTES: usize = size_of::<BlockQ8_0>();
pub(super) const Q8_1_BYTES: usize = size_of::<BlockQ8_1>();

/// Dot products of one weight row of `nb` blocks with `T` activation rows: `$wb` / `$ab` are the
/// weight / activation block sizes in bytes, `$min` says whether the headers are (d, m) × (d, s)
/// pairs whose second products are summed (Q4_1 × Q8_1). A block's integer products are computed
/// in two steps: `$prep` unpacks the weight block at `$wp` once (into any value `$wq`), then `$int`
/// turns `$wq` and a pointer `$ap` to one token's activation block into 8 i32 lanes, for each of
/// the `T` tokens. Every block's first 4 bytes are read as its header (for d-only formats the
/// second f16 is a junk lane that is never used). With `hi_scale = s`, lanes 4..8 of every block's
/// integer sums are `1/s` times too large (see
/// [`nibbles_x16`](super::helpers::nibbles_x16)) and the accumulator's lanes 4..8
/// are multiplied by `s` (a power of two: exact) before the final sum.
///
/// Each token's arithmetic is the same sequence of operations whatever `T` is (own accumulators,
/// same block order, same final reduction), so token `t` of a `T`-token call gives bit for bit the
/// result of the 1-token call on that token alone: only the weight unpacking and the weight
/// headers' conversion are shared.
///
/// Expands inside an `unsafe fn` whose contract is: the CPU has the features the function is
/// compiled for; `$w` and every `$a[t]` point to `$nb` readable blocks; with `$PRE`, every
/// `$ah[t]` to `2 * $nb` readable f32 (the converted headers). `$wp` and `$ap` are then pointers
/// to one whole weight / activation block inside those rows: `$prep` and `$int` may read that
/// block's `$wb` / `$ab` bytes (in their own `unsafe` blocks, which is why they can rely on it).
macro_rules! block_dot {
    ($T:ident, $PRE:ident, $nb:expr, $w:expr, $a:expr, $ah:expr, $wb:expr, $ab:expr, $min:expr, |$wp:ident| $prep:expr, |$wq:ident, $ap:ident| $int:expr) => {
        block_dot!($T, $PRE, $nb, $w, $a, $ah, $wb, $ab, $min, hi_scale = 1.0, |$wp| $prep, |$wq, $ap| $int)
    };
    ($T:ident, $PRE:ident, $nb:expr, $w:expr, $a:expr, $ah:expr, $wb:expr, $ab:expr, $min:expr, hi_scale = $hs:expr, |$wp:ident| $prep:expr, |$wq:ident, $ap:ident| $int:expr) => {{
        let (nb, w, a, ah): (usize, *const u8, [*const u8; $T], [*const f32; $T]) = ($nb, $w, $a, $ah);
        let mut acc = [[_mm256_setzero_ps(); 4]; $T];
        let mut ms = [_mm256_setzero_ps(); $T];
        let mut i = 0usize;
        while i + 4 <= nb {
            // SAFETY: `i + 4 <= nb`, so blocks `i..i + 4` lie inside the `nb` blocks of the weight
            // row and of every activation row, and with `PRE` the f32 `2i..2i + 8` inside each
            // `ah[t]` ("see above" in this iteration refers to this).
            let w4 = unsafe { w.add(i * $wb) };
            prefetch_weights(w4, 4 * $wb);
            // Per token: [dw0*da0, mw0*sa0, dw1*da1, mw1*sa1, ...]
            // SAFETY: the 4-byte headers of weight blocks `i..i + 4` (see above).
            let hw = _mm256_cvtph_ps(unsafe { load4_u32(w4, $wb) });
            let mut s = [[0f32; 8]; $T];
            for t in 0..$T {
                let ha = if $PRE {
                    // SAFETY: f32 `2i..2i + 8` of `ah[t]`, inside its `2 * nb` (see above).
                    unsafe { _mm256_loadu_ps(ah[t].add(2 * i)) }
                } else {
                    // SAFETY: the headers of blocks `i..i + 4` of activation row `t` (see above).
                    _mm256_cvtph_ps(unsafe { load4_u32(a[t].add(i * $ab), $ab) })
                };
                let sc = _mm256_mul_ps(hw, ha);
                if $min {
                    ms[t] = _mm256_add_ps(ms[t], sc);
                }
                // SAFETY: `s[t]` is an `[f32; 8]`: exactly the 8 lanes stored.
                unsafe { _mm256_storeu_ps(s[t].as_mut_ptr(), sc) };
            }
            // Broadcasting each block's scale from memory is a pure load; without the barrier LLVM
            // turns it into register shuffles, which compete for port 5 with the header inserts.
            let s = std::hint::black_box(&s);
            for k in 0..4 {
                // SAFETY: `k < 4`: block `i + k < nb` of the weight row.
                let $wp = unsafe { w4.add(k * $wb) };
                let $wq = $prep;
                for t in 0..$T {
                    // SAFETY: block `i + k < nb` of activation row `t`.
                    let $ap = unsafe { a[t].add((i + k) * $ab) };
                    let p: __m256i = $int;
                    acc[t][k] = _mm256_fmadd_ps(_mm256_broadcast_ss(&s[t][2 * k]), _mm256_cvtepi32_ps(p), acc[t][k]);
                }
                if $T > 1 {
                    sched_barrier();
                }
            }
            i += 4;
        }
        let mut tail_ms = [0.0f32; $T];
        while i < nb {
            // SAFETY: `i < nb`: block `i` of the weight row and of every activation row, and with
            // `PRE` the f32 `2i..2i + 2` of each `ah[t]`, are readable ("see above" below).
            let $wp = unsafe { w.add(i * $wb) };
            // SAFETY: the 4 header bytes of weight block `i` (see above).
            let hw = _mm_cvtph_ps(unsafe { _mm_loadu_si32($wp) });
            let $wq = $prep;
            for t in 0..$T {
                // SAFETY: block `i` of activation row `t` (see above).
                let $ap = unsafe { a[t].add(i * $ab) };
                let ha = if $PRE {
                    // SAFETY: the two f32 (8 bytes) `2i..2i + 2` of `ah[t]` (see above).
                    _mm_castpd_ps(unsafe { _mm_load_sd(ah[t].add(2 * i) as *const f64) })
                } else {
                    // SAFETY: the 4 header bytes of block `i` of activation row `t` (see above).
                    _mm_cvtph_ps(unsafe { _mm_loadu_si32($ap) })
                };
                let sc = _mm_mul_ps(hw, ha);
                if $min {
                    tail_ms[t] += _mm_cvtss_f32(_mm_movehdup_ps(sc));
                }
                let p: __m256i = $int;
                acc[t][0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(sc), _mm256_cvtepi32_ps(p), acc[t][0]);
            }
            i += 1;
        }
        let hs: f32 = $hs;
        let mut out = [0f32; $T];
        for t in 0..$T {
            let acc = &acc[t];
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let sum =
                if hs != 1.0 { _mm256_mul_ps(sum, _mm256_setr_ps(1.0, 1.0, 1.0, 1.0, hs, hs, hs, hs)) } else { sum };
            let mut r = hsum_ps(sum);
            if $min {
                r += hsum_ps(_mm256_blend_ps::<0b1010_1010>(_mm256_setzero_ps(), ms[t])) + tail_ms[t];
            }
            out[t] = r;
        }
        out
    }};
}
pub(super) use block_dot;
