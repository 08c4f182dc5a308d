//! The AVX-512 VNNI kernel of [`crate::transposed_q8`]: a block of tokens' product with a chosen
//! subset of a neuron-major 8-bit matrix's inputs, panel by panel ([`PANEL`] = 64 outputs).
//!
//! Per panel the chosen neurons' 64-byte rows are first *packed* into a buffer that stays in L2:
//! four neurons (a quad) at a time, interleaved with in-lane byte and word unpacks so that each
//! dword holds one output's four weights, the operand `vpdpbusd` multiplies with four
//! coefficients of one token. The unpacks leave a 128-bit lane's outputs spread over the four
//! vectors of a quad (vector `v`, lane `L`, dword `i` = output `16·L + 4·v + i`); the sums are
//! put back in order once per tile with a 4 × 4 transpose of 128-bit lanes. Then tiles of three
//! tokens × 64 outputs (12 integer and 12 float accumulators) run over the packed panel: per quad
//! 4 loads, 3 broadcasts and 12 `vpdpbusd`; per [`COEF_BLOCK`] the integer sums are converted and
//! multiply-added with the block's coefficient scale. Bit for bit
//! [`crate::transposed_q8::gemm_chosen_scalar`].
//!
//! # Safety invariant
//!
//! [`gemm_chosen_vnni`] asserts the CPU's features and runs [`check_gemm_chosen`] before the
//! `unsafe` kernels; every pointer they form stays within the bounds that check establishes
//! (chosen neurons `< n_in`, `k4 = 4·⌈k/4⌉` coefficients per token, `n_tok` tokens, the panels'
//! output tiles) and the packed buffer sized here.

use crate::transposed_q8::{check_gemm_chosen, QuantizedCoefs, TransposedQ8, COEF_BLOCK, PANEL};
use crate::Isa;
use std::arch::x86_64::*;
use std::ops::Range;

/// Quads of neurons between a packed row's loads and its prefetch.
const PREFETCH_QUADS: usize = 8;

/// [`crate::transposed_q8::GemmChosenFn`] on AVX-512 VNNI.
pub fn gemm_chosen_vnni(
    w: &TransposedQ8,
    chosen: &[u32],
    c: &QuantizedCoefs,
    panels: Range<usize>,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
) {
    assert!(Isa::Avx512Vnni.is_supported(), "the AVX-512 VNNI kernel needs AVX-512 F/BW/VNNI");
    if let Err(e) = check_gemm_chosen(w, chosen, c, &panels, y.len()) {
        panic!("{e}");
    }
    if c.k == 0 {
        y.fill(0.0);
        return;
    }
    let nq = c.k4 / 4;
    scratch.resize(nq * 4 * PANEL + 64, 0);
    let off = scratch.as_ptr().align_offset(64);
    let n_tok = c.n_tok;
    for (pi, p) in panels.enumerate() {
        let tile_out = &mut y[pi * n_tok * PANEL..(pi + 1) * n_tok * PANEL];
        // SAFETY: features asserted above; `chosen` checked against `n_in`, the buffer holds
        // `nq` quads of 256 bytes from a 64-byte aligned start, the output tile `n_tok × 64`.
        unsafe {
            let buf = scratch.as_mut_ptr().add(off);
            pack_panel(w, p, chosen, buf);
            let rs = w.row_scales()[p * PANEL..(p + 1) * PANEL].as_ptr();
            let mut t0 = 0;
            while t0 + 3 <= n_tok {
                tile::<3>(buf, nq, c, t0, rs, tile_out.as_mut_ptr().add(t0 * PANEL));
                t0 += 3;
            }
            match n_tok - t0 {
                2 => tile::<2>(buf, nq, c, t0, rs, tile_out.as_mut_ptr().add(t0 * PANEL)),
                1 => tile::<1>(buf, nq, c, t0, rs, tile_out.as_mut_ptr().add(t0 * PANEL)),
                _ => {}
            }
        }
    }
}

/// [`crate::transposed_q8::QuantizeBlockFn`] on AVX-512: the scalar reference's operations on
/// 16 lanes (`vcvtps2dq` rounds to nearest even, as `round_ties_even`).
pub fn quantize_block_avx512(c: &[f32], ns: &[f32], q: &mut [i8]) -> (f32, i32) {
    assert!(Isa::Avx512Vnni.is_supported(), "the AVX-512 quantizer needs AVX-512 F/BW");
    assert!(c.len() == ns.len() && c.len() == q.len() && c.len() <= COEF_BLOCK, "one block's values");
    // SAFETY: features asserted; every access is masked to `c.len()` values of the three slices.
    unsafe { quantize_block_inner(c, ns, q) }
}

/// # Safety
/// AVX-512 F/BW; `c`, `ns`, `q` of one length.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block_inner(c: &[f32], ns: &[f32], q: &mut [i8]) -> (f32, i32) {
    // SAFETY: the caller's contract; loads and stores are masked to the slices' length.
    unsafe {
        let n = c.len();
        let mut x = [_mm512_setzero_ps(); COEF_BLOCK / 16];
        let (mut amax, mut fin) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for (v, xv) in x.iter_mut().enumerate().take(n.div_ceil(16)) {
            let m: __mmask16 = if n - 16 * v >= 16 { 0xFFFF } else { (1u16 << (n - 16 * v)) - 1 };
            let a = _mm512_maskz_loadu_ps(m, c.as_ptr().add(16 * v));
            let s = _mm512_maskz_loadu_ps(m, ns.as_ptr().add(16 * v));
            *xv = _mm512_mul_ps(a, s);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(*xv));
            fin = _mm512_add_ps(fin, _mm512_sub_ps(*xv, *xv));
        }
        let amax = _mm512_reduce_max_ps(amax);
        let finite = _mm512_reduce_add_ps(fin) == 0.0;
        let d = if finite { amax / 127.0 } else { f32::NAN };
        let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
        let mut sum = _mm512_setzero_si512();
        for (v, xv) in x.iter().enumerate().take(n.div_ceil(16)) {
            let m: __mmask16 = if n - 16 * v >= 16 { 0xFFFF } else { (1u16 << (n - 16 * v)) - 1 };
            // NaN and overflow convert to i32::MIN; the scalar clamp sends NaN to 0 through `as`.
            let r = _mm512_mul_ps(*xv, id);
            let iv = _mm512_cvtps_epi32(r);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(r, r);
            let iv = _mm512_mask_mov_epi32(_mm512_min_epi32(_mm512_max_epi32(iv, lo), hi), nan, _mm512_setzero_si512());
            let iv = _mm512_maskz_mov_epi32(m, iv);
            sum = _mm512_add_epi32(sum, iv);
            _mm_mask_storeu_epi8(q.as_mut_ptr().add(16 * v), m, _mm512_cvtepi32_epi8(iv));
        }
        (d, _mm512_reduce_add_epi32(sum))
    }
}

/// Packs panel `p`'s rows of the chosen neurons into `buf` (`⌈k/4⌉` quads of 256 bytes; a last
/// quad's missing neurons repeat the last one: their coefficients are zero).
///
/// # Safety
/// AVX-512 F/BW; every `chosen[i] < w.n_in()`; `buf` 64-byte aligned with room for the quads.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_panel(w: &TransposedQ8, p: usize, chosen: &[u32], buf: *mut u8) {
    // SAFETY: the caller's contract (see above).
    unsafe {
        let k = chosen.len();
        let base = w.panel_row(p, 0).as_ptr();
        let row = |i: usize| base.add(*chosen.get_unchecked(i.min(k - 1)) as usize * PANEL);
        for q in 0..k.div_ceil(4) {
            if (q + PREFETCH_QUADS) * 4 < k {
                for i in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(row((q + PREFETCH_QUADS) * 4 + i) as *const i8);
                }
            }
            let r0 = _mm512_loadu_si512(row(4 * q) as *const _);
            let r1 = _mm512_loadu_si512(row(4 * q + 1) as *const _);
            let r2 = _mm512_loadu_si512(row(4 * q + 2) as *const _);
            let r3 = _mm512_loadu_si512(row(4 * q + 3) as *const _);
            let (lo01, hi01) = (_mm512_unpacklo_epi8(r0, r1), _mm512_unpackhi_epi8(r0, r1));
            let (lo23, hi23) = (_mm512_unpacklo_epi8(r2, r3), _mm512_unpackhi_epi8(r2, r3));
            let dst = buf.add(q * 4 * PANEL);
            _mm512_store_si512(dst as *mut _, _mm512_unpacklo_epi16(lo01, lo23));
            _mm512_store_si512(dst.add(64) as *mut _, _mm512_unpackhi_epi16(lo01, lo23));
            _mm512_store_si512(dst.add(128) as *mut _, _mm512_unpacklo_epi16(hi01, hi23));
            _mm512_store_si512(dst.add(192) as *mut _, _mm512_unpackhi_epi16(hi01, hi23));
        }
    }
}

/// Tokens `t0..t0 + T` over a packed panel of `nq` quads into `y` (`T × 64`, row scales `rs`).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `buf` as [`pack_panel`] left it; tokens `t0 + T ≤ c.n_tok`; `rs` 64
/// values; `y` room for `T × 64`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const T: usize>(buf: *const u8, nq: usize, c: &QuantizedCoefs, t0: usize, rs: *const f32, y: *mut f32) {
    // SAFETY: the caller's contract (see above).
    unsafe {
        let nb = c.n_blocks();
        let k4 = c.k4;
        let mut facc = [[_mm512_setzero_ps(); 4]; T];
        for b in 0..nb {
            let (q_lo, q_hi) = (b * COEF_BLOCK / 4, ((b + 1) * COEF_BLOCK / 4).min(nq));
            let mut acc = [[_mm512_setzero_si512(); 4]; T];
            for (t, a) in acc.iter_mut().enumerate() {
                *a = [_mm512_set1_epi32(*c.start.get_unchecked((t0 + t) * nb + b)); 4];
            }
            let qp = c.q.as_ptr();
            for q in q_lo..q_hi {
                let wq = buf.add(q * 4 * PANEL);
                let w0 = _mm512_load_si512(wq as *const _);
                let w1 = _mm512_load_si512(wq.add(64) as *const _);
                let w2 = _mm512_load_si512(wq.add(128) as *const _);
                let w3 = _mm512_load_si512(wq.add(192) as *const _);
                for (t, a) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_epi32((qp.add((t0 + t) * k4 + 4 * q) as *const i32).read_unaligned());
                    a[0] = _mm512_dpbusd_epi32(a[0], w0, x);
                    a[1] = _mm512_dpbusd_epi32(a[1], w1, x);
                    a[2] = _mm512_dpbusd_epi32(a[2], w2, x);
                    a[3] = _mm512_dpbusd_epi32(a[3], w3, x);
                }
            }
            for (t, (f, a)) in facc.iter_mut().zip(&acc).enumerate() {
                let d = _mm512_set1_ps(*c.d.get_unchecked((t0 + t) * nb + b));
                for v in 0..4 {
                    f[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[v]), d, f[v]);
                }
            }
        }
        for (t, f) in facc.iter().enumerate() {
            // Lane L of vector v holds outputs 16·L + 4·v .. + 4: chunk L = lane L of v = 0..4.
            let t0_ = _mm512_shuffle_f32x4::<0x44>(f[0], f[1]);
            let t1_ = _mm512_shuffle_f32x4::<0xEE>(f[0], f[1]);
            let t2_ = _mm512_shuffle_f32x4::<0x44>(f[2], f[3]);
            let t3_ = _mm512_shuffle_f32x4::<0xEE>(f[2], f[3]);
            let chunks = [
                _mm512_shuffle_f32x4::<0x88>(t0_, t2_),
                _mm512_shuffle_f32x4::<0xDD>(t0_, t2_),
                _mm512_shuffle_f32x4::<0x88>(t1_, t3_),
                _mm512_shuffle_f32x4::<0xDD>(t1_, t3_),
            ];
            for (l, ch) in chunks.into_iter().enumerate() {
                let r = _mm512_loadu_ps(rs.add(16 * l));
                _mm512_storeu_ps(y.add(t * PANEL + 16 * l), _mm512_mul_ps(r, ch));
            }
        }
    }
}
