//! Q4_K weights repacked at load into groups of 16 interleaved rows, for the AVX-512 VNNI kernels
//! in [`crate::x86::packed_q4k_x16`] (issue 17). The 8-row layout of [`crate::packed`] suits
//! 256-bit registers (one 32-byte load = 8 rows × 4 bytes against a 4-byte broadcast); in a
//! 512-bit register its two halves hold two different value positions, so every token's
//! activations need a permute per `vpdpbusd`. Here one 64-byte load holds the same four byte
//! positions of 16 rows, so the activations are a plain broadcast (a load, no shuffle), each
//! `vpdpbusd` serves 16 rows, and the sub-block scales multiply 16 lanes at once. CPUs without
//! AVX-512 VNNI keep the 8-row layout.
//!
//! The layout ([`BlockQ4Kx16`], 2304 bytes per 16 rows × 256 columns, exactly the 16 source
//! super-blocks' size, so a packed tensor keeps its byte range):
//!
//! - `d`, `dmin` (32 bytes each): the 16 rows' f16 super-block scales, row `r` at index `r`;
//! - `scm` (128 bytes): `scm[16·s + r] = sc(r, s) | (mn(r, s) >> 4) << 6` — sub-block `s`'s
//!   6-bit scale of row `r`, and its min's top two bits;
//! - `mnl` (64 bytes): the min's low nibble, `mnl[16·(s % 4) + r]`, low nibble for `s < 4`, high
//!   for `s ≥ 4`;
//! - `qs` (2048 bytes): `qs[64·q + 4·r + i] = row_r.qs[4·q + i]` for `q < 32`: low nibbles are
//!   values `64·(q/8) + 4·(q%8) + i` (sub-block `2·(q/8)`), high nibbles the same plus 32 (sub-block
//!   `2·(q/8) + 1`).
//!
//! [`gemv_q4k_x16`] is the scalar reference: per row and super-block the exact integer sums
//! `sumi = Σ_s sc_s · Σ q·a` and `summ = Σ_s mn_s · (bsum_2s + bsum_2s+1)`, then
//! `acc = fma(d · da, sumi, acc)` and `accm = fma(dmin · da, summ, accm)`; the row's result is
//! `acc − accm` — [`crate::packed::gemv_q4k_x8`]'s arithmetic, row for row.

use crate::blocks::{scale_min_k4, BlockQ4K, BlockQ8K};
use crate::scalar_k::QK_K;
use bytemuck::{Pod, Zeroable};

/// Rows in one packed group.
pub const PACK_ROWS_X16: usize = 16;

/// Sixteen Q4_K rows' super-blocks at one column position, interleaved (see the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4Kx16 {
    pub d: [u8; 32],
    pub dmin: [u8; 32],
    pub scm: [u8; 128],
    pub mnl: [u8; 64],
    pub qs: [u8; 2048],
}

const _: () = assert!(std::mem::size_of::<BlockQ4Kx16>() == PACK_ROWS_X16 * std::mem::size_of::<BlockQ4K>());
const _: () = assert!(std::mem::align_of::<BlockQ4Kx16>() == 1);

impl BlockQ4Kx16 {
    /// Row `r`'s f16 super-block scale as f32.
    #[inline(always)]
    pub fn d(&self, r: usize) -> f32 {
        half::f16::from_le_bytes([self.d[2 * r], self.d[2 * r + 1]]).to_f32()
    }

    /// Row `r`'s f16 super-block min scale as f32.
    #[inline(always)]
    pub fn dmin(&self, r: usize) -> f32 {
        half::f16::from_le_bytes([self.dmin[2 * r], self.dmin[2 * r + 1]]).to_f32()
    }

    /// Row `r`'s 6-bit (scale, min) of sub-block `s`.
    #[inline(always)]
    pub fn scale_min(&self, r: usize, s: usize) -> (u8, u8) {
        let b = self.scm[16 * s + r];
        let n = self.mnl[16 * (s % 4) + r];
        let lo = if s < 4 { n & 0xF } else { n >> 4 };
        (b & 63, lo | (b >> 6) << 4)
    }

    /// Row `r`'s quant byte `b` (0..128) of its Q4_K block.
    #[inline(always)]
    fn byte(&self, r: usize, b: usize) -> u8 {
        self.qs[64 * (b / 4) + 4 * r + b % 4]
    }

    /// Row `r`'s 4-bit quant of value `v` (0..256).
    #[inline(always)]
    pub fn q(&self, r: usize, v: usize) -> u8 {
        let (j, w) = (v / 64, v % 64);
        let b = self.byte(r, 32 * j + w % 32);
        if w < 32 {
            b & 0xF
        } else {
            b >> 4
        }
    }
}

/// Packs the super-blocks of 16 rows at one column position.
pub fn pack_block_q4k_x16(rows: [&BlockQ4K; PACK_ROWS_X16]) -> BlockQ4Kx16 {
    let mut out = BlockQ4Kx16::zeroed();
    for (r, x) in rows.iter().enumerate() {
        out.d[2 * r..2 * r + 2].copy_from_slice(&x.d);
        out.dmin[2 * r..2 * r + 2].copy_from_slice(&x.dmin);
        for s in 0..8 {
            let (sc, mn) = scale_min_k4(s, &x.scales);
            out.scm[16 * s + r] = sc | (mn >> 4) << 6;
            out.mnl[16 * (s % 4) + r] |= if s < 4 { mn & 0xF } else { (mn & 0xF) << 4 };
        }
        for (q, four) in x.qs.chunks_exact(4).enumerate() {
            out.qs[64 * q + 4 * r..64 * q + 4 * r + 4].copy_from_slice(four);
        }
    }
    out
}

/// Packs 16 rows of a Q4_K matrix: `src` holds the rows one after another (`16 · nb` blocks of
/// 144 bytes), `dst` receives the same number of bytes.
///
/// # Panics
/// If `src` or `dst` is not `16 · nb · 144` bytes.
pub fn pack_q4k_x16(src: &[u8], nb: usize, dst: &mut [u8]) {
    let blocks: &[BlockQ4K] = bytemuck::cast_slice(src);
    assert_eq!(blocks.len(), PACK_ROWS_X16 * nb, "16 rows of {nb} Q4_K blocks");
    let out: &mut [BlockQ4Kx16] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), nb, "{nb} packed blocks");
    for (b, o) in out.iter_mut().enumerate() {
        *o = pack_block_q4k_x16(std::array::from_fn(|r| &blocks[r * nb + b]));
    }
}

/// The 16 rows [`pack_q4k_x16`] packed, in plain Q4_K blocks again: the source's bytes exactly.
///
/// # Panics
/// If `src` or `dst` is not `16 · nb · 144` bytes.
pub fn unpack_q4k_x16(src: &[u8], nb: usize, dst: &mut [u8]) {
    let packed: &[BlockQ4Kx16] = bytemuck::cast_slice(src);
    assert_eq!(packed.len(), nb, "{nb} packed blocks");
    let out: &mut [BlockQ4K] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), PACK_ROWS_X16 * nb, "16 rows of {nb} Q4_K blocks");
    for (b, p) in packed.iter().enumerate() {
        for r in 0..PACK_ROWS_X16 {
            let x = &mut out[r * nb + b];
            x.d.copy_from_slice(&p.d[2 * r..2 * r + 2]);
            x.dmin.copy_from_slice(&p.dmin[2 * r..2 * r + 2]);
            let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
            for s in 0..8 {
                (sc[s], mn[s]) = p.scale_min(r, s);
            }
            x.scales = crate::packed::encode_scales_k4(&sc, &mn);
            for (i, q) in x.qs.iter_mut().enumerate() {
                *q = p.byte(r, i);
            }
        }
    }
}

/// One packed group made of rows of others: slot `j` of `dst` (`nb` packed blocks) receives row
/// `chosen[j] % 16` of the packed group `chosen[j] / 16` of `src` (a packed matrix, its groups of
/// `nb` blocks one after another). Each row's bytes are moved from their interleaved places to the
/// slot's — the bytes [`unpack_q4k_x16`] then [`pack_q4k_x16`] would give, without the plain rows
/// between (sparse prefill gathers a block's chosen neurons this way).
///
/// # Panics
/// If `chosen` is not 16 rows within `src`, or `dst` is not `nb` packed blocks.
pub fn gather_rows_q4k_x16(src: &[u8], nb: usize, chosen: &[u32], dst: &mut [u8]) {
    let packed: &[BlockQ4Kx16] = bytemuck::cast_slice(src);
    let out: &mut [BlockQ4Kx16] = bytemuck::cast_slice_mut(dst);
    assert_eq!(chosen.len(), PACK_ROWS_X16, "16 rows to a group");
    assert_eq!(out.len(), nb, "{nb} packed blocks");
    let groups = packed.len() / nb.max(1);
    assert!(chosen.iter().all(|&r| (r as usize) < groups * PACK_ROWS_X16), "a chosen row outside the matrix");
    for (b, o) in out.iter_mut().enumerate() {
        for (j, &r) in chosen.iter().enumerate() {
            let (p, i) = (&packed[(r as usize / PACK_ROWS_X16) * nb + b], r as usize % PACK_ROWS_X16);
            o.d[2 * j..2 * j + 2].copy_from_slice(&p.d[2 * i..2 * i + 2]);
            o.dmin[2 * j..2 * j + 2].copy_from_slice(&p.dmin[2 * i..2 * i + 2]);
            for s in 0..8 {
                o.scm[16 * s + j] = p.scm[16 * s + i];
            }
            for s in 0..4 {
                o.mnl[16 * s + j] = p.mnl[16 * s + i];
            }
            for q in 0..32 {
                o.qs[64 * q + 4 * j..64 * q + 4 * j + 4].copy_from_slice(&p.qs[64 * q + 4 * i..64 * q + 4 * i + 4]);
            }
        }
    }
}

/// The weight groups and activation blocks of a packed product, checked: `w` whole groups of
/// `n / 256` packed blocks, `a` at least `n / 256` Q8_K blocks. Returns (blocks, groups).
///
/// # Panics
/// If `n` is not a multiple of 256, `w` is not whole groups, or `a` is short.
pub(crate) fn check(n: usize, w: &[u8], a: &[u8]) -> (usize, usize) {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let gb = nb * std::mem::size_of::<BlockQ4Kx16>();
    assert!(gb > 0 && w.len().is_multiple_of(gb), "{} bytes are not whole groups of {nb} packed blocks", w.len());
    assert!(a.len() >= nb * std::mem::size_of::<BlockQ8K>(), "activation row shorter than {n} values");
    (nb, w.len() / gb)
}

/// The reference of the packed kernels: every group of 16 rows in `w` (`n / 256` packed blocks
/// each) times one Q8_K activation row `a`; `out[16·k + r]` is row `r` of group `k`.
///
/// # Panics
/// As [`check`]'s rules, or if `out` is not 16 per group.
pub fn gemv_q4k_x16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let (nb, groups) = check(n, w, a);
    assert_eq!(out.len(), groups * PACK_ROWS_X16, "16 outputs per group");
    let xs: &[BlockQ4Kx16] = bytemuck::cast_slice(w);
    let ys: &[BlockQ8K] = bytemuck::cast_slice(&a[..nb * std::mem::size_of::<BlockQ8K>()]);
    for (g, o) in xs.chunks_exact(nb).zip(out.chunks_exact_mut(PACK_ROWS_X16)) {
        let mut acc = [0f32; PACK_ROWS_X16];
        let mut accm = [0f32; PACK_ROWS_X16];
        for (x, y) in g.iter().zip(ys) {
            let da = y.d();
            let bsum = |i: usize| i32::from(i16::from_le_bytes(y.bsums[i]));
            for r in 0..PACK_ROWS_X16 {
                let (mut sumi, mut summ) = (0i32, 0i32);
                for s in 0..8 {
                    let (sc, mn) = x.scale_min(r, s);
                    let p: i32 = (0..32).map(|v| i32::from(x.q(r, 32 * s + v)) * i32::from(y.qs[32 * s + v])).sum();
                    sumi += i32::from(sc) * p;
                    summ += i32::from(mn) * (bsum(2 * s) + bsum(2 * s + 1));
                }
                acc[r] = (x.d(r) * da).mul_add(sumi as f32, acc[r]);
                accm[r] = (x.dmin(r) * da).mul_add(summ as f32, accm[r]);
            }
        }
        for (o, (a, m)) in o.iter_mut().zip(acc.iter().zip(&accm)) {
            *o = a - m;
        }
    }
}

/// [`gemv_q4k_x16`] on the best kernel `isa` has (bit for bit the same result).
///
/// # Panics
/// As [`gemv_q4k_x16`].
pub fn gemv_q4k_x16_on(isa: crate::Isa, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::packed_q4k_x16::gemv(isa, n, w, a, out) {
        return;
    }
    let _ = isa;
    gemv_q4k_x16(n, w, a, out)
}

/// Every group of 16 rows in `w` times four activation rows: `out[16·k + r][t]` is bit for bit
/// [`gemv_q4k_x16`]'s row `16·k + r` for `a[t]` (AVX-512 VNNI unpacks the weights once for the
/// four tokens; elsewhere one [`gemv_q4k_x16_on`] per token).
///
/// # Panics
/// As [`gemv_q4k_x16`] for each activation row.
pub fn gemm_q4k_x16_on(isa: crate::Isa, n: usize, w: &[u8], a: [&[u8]; 4], out: &mut [[f32; 4]]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::packed_q4k_x16::gemm(isa, n, w, a, out) {
        return;
    }
    let mut y = vec![0f32; out.len()];
    for (t, a) in a.iter().enumerate() {
        gemv_q4k_x16_on(isa, n, w, a, &mut y);
        for (o, y) in out.iter_mut().zip(&y) {
            o[t] = *y;
        }
    }
}
