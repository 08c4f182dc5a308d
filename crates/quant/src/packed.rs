//! Weights repacked at load into layouts the decode kernels want (issue 17, as llama.cpp's CPU
//! "repack" buffer type does): eight rows of a Q4_K matrix interleaved in one [`BlockQ4Kx8`], so
//! that one pass over the packed bytes computes eight dot products and every 32-byte load of
//! quants feeds all eight rows. [`group_rows`], [`repacks`], [`pack_group`] and [`unpack_group`]
//! cover every packed layout (also [`crate::packed_q5_0`]'s 16 Q5_0 rows).
//!
//! The layout (1152 bytes per 8 rows × 256 columns, exactly the 8 source blocks' size, so a packed
//! tensor keeps its byte range):
//!
//! - `d`, `dmin`: the 8 rows' f16 super-block scales, row `r` at index `r`;
//! - `scm` (64 bytes) and `mnl` (32 bytes): the 6-bit sub-block scales and mins of every
//!   (row `r`, sub-block `s`) at slot `k(r, s) = 32·(s/4) + 16·(r/4) + 4·(s%4) + r%4`:
//!   `scm[k] = sc | (mn >> 4) << 6`, and the min's low nibble in `mnl[k % 32]` (low nibble for
//!   `k < 32`, high for `k ≥ 32`); a kernel unpacks all 64 pairs with a few byte operations;
//! - `qs` (1024 bytes): `qs[256·j + 32·g + 4·r + i] = row_r.qs[32·j + 4·g + i]` for `j < 4`,
//!   `g < 8`, `r < 8`, `i < 4` — four bytes of each row in turn, so a 32-byte load holds the same
//!   four value positions of all eight rows (low nibbles: values `64j + 4g ..+4` of sub-block
//!   `2j`; high nibbles: values `64j + 32 + 4g ..+4` of sub-block `2j + 1`) and the activations
//!   need only a 4-byte broadcast.
//!
//! A packed matrix is its row groups one after another, each group's super-blocks in order.
//! [`pack_q4k_x8`] and [`unpack_q4k_x8`] convert 8 rows; [`gemv_q4k_x8`] is the scalar reference
//! of the kernels: per row and super-block the exact integer sums, then two fused multiply-adds,
//! in an order a SIMD kernel can follow bit for bit.

use crate::blocks::{scale_min_k4, BlockQ4K, BlockQ8K};
use crate::scalar_k::QK_K;
use bytemuck::{Pod, Zeroable};

/// Rows in one packed group.
pub const PACK_ROWS: usize = 8;

/// Eight Q4_K rows' super-blocks at one column position, interleaved (see the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4Kx8 {
    pub d: [u8; 16],
    pub dmin: [u8; 16],
    pub scm: [u8; 64],
    pub mnl: [u8; 32],
    pub qs: [u8; 1024],
}

const _: () = assert!(std::mem::size_of::<BlockQ4Kx8>() == PACK_ROWS * std::mem::size_of::<BlockQ4K>());
const _: () = assert!(std::mem::align_of::<BlockQ4Kx8>() == 1);

/// The slot of row `r`'s sub-block `s` in `scm` / `mnl`.
#[inline(always)]
pub const fn scale_slot(r: usize, s: usize) -> usize {
    32 * (s / 4) + 16 * (r / 4) + 4 * (s % 4) + r % 4
}

/// Where row `r`'s quant byte `b` (0..128 of its Q4_K block) lies in `qs`.
#[inline(always)]
const fn quant_slot(r: usize, b: usize) -> usize {
    let (j, g, i) = (b / 32, (b % 32) / 4, b % 4);
    256 * j + 32 * g + 4 * r + i
}

impl BlockQ4Kx8 {
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
        let k = scale_slot(r, s);
        let lo = if k < 32 { self.mnl[k] & 0xF } else { self.mnl[k - 32] >> 4 };
        (self.scm[k] & 63, lo | (self.scm[k] >> 6) << 4)
    }

    /// Row `r`'s 4-bit quant of value `v` (0..256).
    #[inline(always)]
    pub fn q(&self, r: usize, v: usize) -> u8 {
        let (j, w) = (v / 64, v % 64);
        let b = self.qs[quant_slot(r, 32 * j + w % 32)];
        if w < 32 {
            b & 0xF
        } else {
            b >> 4
        }
    }
}

/// Packs the super-blocks of 8 rows at one column position.
pub fn pack_block_q4k_x8(rows: [&BlockQ4K; PACK_ROWS]) -> BlockQ4Kx8 {
    let mut out = BlockQ4Kx8::zeroed();
    for (r, x) in rows.iter().enumerate() {
        out.d[2 * r..2 * r + 2].copy_from_slice(&x.d);
        out.dmin[2 * r..2 * r + 2].copy_from_slice(&x.dmin);
        for s in 0..8 {
            let (sc, mn) = scale_min_k4(s, &x.scales);
            let k = scale_slot(r, s);
            out.scm[k] = sc | (mn >> 4) << 6;
            if k < 32 {
                out.mnl[k] |= mn & 0xF;
            } else {
                out.mnl[k - 32] |= (mn & 0xF) << 4;
            }
        }
        for (b, &q) in x.qs.iter().enumerate() {
            out.qs[quant_slot(r, b)] = q;
        }
    }
    out
}

/// Packs 8 rows of a Q4_K matrix: `src` holds the rows one after another (`8 · nb` blocks of
/// 144 bytes, `nb` super-blocks per row), `dst` receives the same number of bytes.
///
/// # Panics
/// If `src` or `dst` is not `8 · nb · 144` bytes.
pub fn pack_q4k_x8(src: &[u8], nb: usize, dst: &mut [u8]) {
    let blocks: &[BlockQ4K] = bytemuck::cast_slice(src);
    assert_eq!(blocks.len(), PACK_ROWS * nb, "8 rows of {nb} Q4_K blocks");
    let out: &mut [BlockQ4Kx8] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), nb, "{nb} packed blocks");
    for (b, o) in out.iter_mut().enumerate() {
        *o = pack_block_q4k_x8(std::array::from_fn(|r| &blocks[r * nb + b]));
    }
}

/// The 8 rows [`pack_q4k_x8`] packed, in plain Q4_K blocks again: the source's bytes exactly
/// (the 12-byte scale encoding uses every bit, so re-encoding the unpacked 6-bit scales and mins
/// gives the same bytes).
///
/// # Panics
/// If `src` or `dst` is not `8 · nb · 144` bytes.
pub fn unpack_q4k_x8(src: &[u8], nb: usize, dst: &mut [u8]) {
    let packed: &[BlockQ4Kx8] = bytemuck::cast_slice(src);
    assert_eq!(packed.len(), nb, "{nb} packed blocks");
    let out: &mut [BlockQ4K] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), PACK_ROWS * nb, "8 rows of {nb} Q4_K blocks");
    for (b, p) in packed.iter().enumerate() {
        for r in 0..PACK_ROWS {
            let x = &mut out[r * nb + b];
            x.d.copy_from_slice(&p.d[2 * r..2 * r + 2]);
            x.dmin.copy_from_slice(&p.dmin[2 * r..2 * r + 2]);
            let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
            for s in 0..8 {
                (sc[s], mn[s]) = p.scale_min(r, s);
            }
            x.scales = encode_scales_k4(&sc, &mn);
            for (i, q) in x.qs.iter_mut().enumerate() {
                *q = p.qs[quant_slot(r, i)];
            }
        }
    }
}

/// The 12-byte Q4_K encoding of 8 6-bit scales and mins (the inverse of [`scale_min_k4`]).
pub(crate) fn encode_scales_k4(sc: &[u8], mn: &[u8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | (sc[j + 4] >> 4) << 6;
        q[j + 4] = (mn[j] & 63) | (mn[j + 4] >> 4) << 6;
        q[j + 8] = (sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4;
    }
    q
}

/// The reference of the packed kernels: the 8 rows of one packed group (`w`: `nb` blocks of
/// [`BlockQ4Kx8`], `n = 256 · nb` columns) times one Q8_K activation row `a`.
///
/// Per row and super-block: the exact integer sums `sumi = Σ_s sc_s · Σ q·a` and
/// `summ = Σ_s mn_s · (bsum_2s + bsum_2s+1)`, then `acc = fma(d · da, sumi, acc)` and
/// `accm = fma(dmin · da, summ, accm)`; the row's result is `acc − accm`.
///
/// # Panics
/// If `n` is not a multiple of 256 or the slices are not `n / 256` blocks.
pub fn gemv_q4k_x8(n: usize, w: &[u8], a: &[u8]) -> [f32; PACK_ROWS] {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ4Kx8] = bytemuck::cast_slice(w);
    let ys: &[BlockQ8K] = bytemuck::cast_slice(a);
    assert!(xs.len() == nb && ys.len() == nb, "{nb} blocks of weights and of activations");
    let mut acc = [0f32; PACK_ROWS];
    let mut accm = [0f32; PACK_ROWS];
    for (x, y) in xs.iter().zip(ys) {
        let da = y.d();
        let bsum = |i: usize| i32::from(i16::from_le_bytes(y.bsums[i]));
        for r in 0..PACK_ROWS {
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
    std::array::from_fn(|r| acc[r] - accm[r])
}

/// [`gemv_q4k_x8`] on the best kernel `isa` has (bit for bit the same result).
///
/// # Panics
/// As [`gemv_q4k_x8`].
pub fn gemv_q4k_x8_on(isa: crate::Isa, n: usize, w: &[u8], a: &[u8]) -> [f32; PACK_ROWS] {
    #[cfg(target_arch = "x86_64")]
    if let Some(out) = crate::x86::packed::gemv_q4k_x8(isa, n, w, a) {
        return out;
    }
    let _ = isa;
    gemv_q4k_x8(n, w, a)
}

/// Tokens per call of [`gemm_q4k_x8_on`].
pub const GEMM_TOKENS: usize = 4;

/// The 8 rows of one packed group times [`GEMM_TOKENS`] activation rows: `out[t]` is bit for bit
/// [`gemv_q4k_x8`] of `a[t]` (AVX-512 VNNI unpacks the weights once for all of them; elsewhere one
/// [`gemv_q4k_x8_on`] per token).
pub fn gemm_q4k_x8_on(isa: crate::Isa, n: usize, w: &[u8], a: [&[u8]; GEMM_TOKENS]) -> [[f32; PACK_ROWS]; GEMM_TOKENS] {
    #[cfg(target_arch = "x86_64")]
    if let Some(out) = crate::x86::packed::gemm_q4k_x8(isa, n, w, a) {
        return out;
    }
    a.map(|a| gemv_q4k_x8_on(isa, n, w, a))
}

/// Whether Q4_K matrices are packed 16 rows to a group ([`crate::packed_q4k_x16`]) rather than 8
/// ([`BlockQ4Kx8`]) on `isa`: where the AVX-512 VNNI kernels run.
pub fn q4k_x16(isa: crate::Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= crate::Isa::Avx512Vnni && isa.is_supported()
}

/// Rows per interleaved group of `ty`'s repacked layout on this CPU ([`crate::Isa::detect`]):
/// Q4_K 16 ([`crate::packed_q4k_x16::BlockQ4Kx16`]) with AVX-512 VNNI, else 8 ([`BlockQ4Kx8`]);
/// Q5_0 16 ([`crate::packed_q5_0::BlockQ5_0x16`]); `None` for types sift does not repack.
pub fn group_rows(ty: crate::WeightType) -> Option<usize> {
    match ty {
        crate::WeightType::Q4_K if q4k_x16(crate::Isa::detect()) => Some(crate::packed_q4k_x16::PACK_ROWS_X16),
        crate::WeightType::Q4_K => Some(PACK_ROWS),
        crate::WeightType::Q5_0 => Some(crate::packed_q5_0::PACK_ROWS_Q5_0),
        _ => None,
    }
}

/// Whether sift repacks a `ty` matrix of `rows × cols` at load on this CPU: whole groups of rows
/// and whole blocks per row, and a kernel that is faster on the packed layout (Q4_K on every CPU;
/// Q5_0 where the AVX2 or AVX-512 VNNI kernels run).
pub fn repacks(ty: crate::WeightType, rows: usize, cols: usize) -> bool {
    let Some(g) = group_rows(ty) else { return false };
    let cols_ok = match ty {
        crate::WeightType::Q4_K => cols.is_multiple_of(QK_K),
        _ => cols.is_multiple_of(32) && crate::packed_q5_0::worth_packing(crate::Isa::detect()),
    };
    cols_ok && rows.is_multiple_of(g)
}

/// Packs one group of rows of `ty` ([`group_rows`] rows of `nb` blocks, one after another in
/// `src`) into `dst` (the same number of bytes), in this CPU's layout for `ty`.
///
/// # Panics
/// If `ty` has no packed layout, or the lengths are not one group.
pub fn pack_group(ty: crate::WeightType, src: &[u8], nb: usize, dst: &mut [u8]) {
    match (ty, group_rows(ty)) {
        (crate::WeightType::Q4_K, Some(16)) => crate::packed_q4k_x16::pack_q4k_x16(src, nb, dst),
        (crate::WeightType::Q4_K, _) => pack_q4k_x8(src, nb, dst),
        (crate::WeightType::Q5_0, _) => crate::packed_q5_0::pack_q5_0_x16(src, nb, dst),
        _ => panic!("{} has no packed layout", ty.name()),
    }
}

/// The inverse of [`pack_group`]: the group's rows in the GGUF layout, the source bytes exactly.
///
/// # Panics
/// As [`pack_group`].
pub fn unpack_group(ty: crate::WeightType, src: &[u8], nb: usize, dst: &mut [u8]) {
    match (ty, group_rows(ty)) {
        (crate::WeightType::Q4_K, Some(16)) => crate::packed_q4k_x16::unpack_q4k_x16(src, nb, dst),
        (crate::WeightType::Q4_K, _) => unpack_q4k_x8(src, nb, dst),
        (crate::WeightType::Q5_0, _) => crate::packed_q5_0::unpack_q5_0_x16(src, nb, dst),
        _ => panic!("{} has no packed layout", ty.name()),
    }
}

/// One group of a compact matrix made of chosen rows of a packed one: slot `j` of `dst` (one
/// group, `nb` blocks per row) receives row `chosen[j]` of the packed matrix `src`, in the same
/// layout — the bytes unpacking `src`'s groups and packing the chosen rows again would give.
/// The 16-row layouts move each row's bytes straight to their new places
/// ([`crate::packed_q4k_x16::gather_rows_q4k_x16`], [`crate::packed_q5_0::gather_rows_q5_0_x16`]);
/// the 8-row Q4_K layout unpacks the source groups into `scratch` and packs again.
///
/// # Panics
/// As [`pack_group`]; if `chosen` is not one group of rows within `src`.
pub fn gather_group(
    ty: crate::WeightType,
    src: &[u8],
    nb: usize,
    chosen: &[u32],
    dst: &mut [u8],
    scratch: &mut Vec<u8>,
) {
    match (ty, group_rows(ty)) {
        (crate::WeightType::Q4_K, Some(16)) => crate::packed_q4k_x16::gather_rows_q4k_x16(src, nb, chosen, dst),
        (crate::WeightType::Q5_0, _) => crate::packed_q5_0::gather_rows_q5_0_x16(src, nb, chosen, dst),
        (_, Some(g)) => {
            assert_eq!(chosen.len(), g, "{g} rows to a group");
            let rb = dst.len() / g;
            let gb = g * rb;
            scratch.resize(2 * gb, 0);
            let (plain, unpacked) = scratch.split_at_mut(gb);
            let mut have = usize::MAX;
            for (slot, &r) in chosen.iter().enumerate() {
                let (s, row) = (r as usize / g, r as usize % g);
                if s != have {
                    unpack_group(ty, &src[s * gb..(s + 1) * gb], nb, unpacked);
                    have = s;
                }
                plain[slot * rb..(slot + 1) * rb].copy_from_slice(&unpacked[row * rb..(row + 1) * rb]);
            }
            pack_group(ty, plain, nb, dst);
        }
        _ => panic!("{} has no packed layout", ty.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_every_byte_once() {
        let mut seen = [false; 64];
        for r in 0..8 {
            for s in 0..8 {
                let k = scale_slot(r, s);
                assert!(!seen[k], "slot {k} twice");
                seen[k] = true;
            }
        }
        let mut seen = vec![false; 1024];
        for r in 0..8 {
            for b in 0..128 {
                let k = quant_slot(r, b);
                assert!(!seen[k], "quant slot {k} twice");
                seen[k] = true;
            }
        }
    }
}
