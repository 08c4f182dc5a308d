//! Q5_0 weights repacked at load into groups of 16 interleaved rows (issue 17), for the
//! AVX-512 VNNI (and AVX2) kernels in [`crate::x86::packed_q5_0`]: one 64-byte load of quants then holds the
//! same four value positions of all 16 rows, one `vpdpbusd` against a 4-byte broadcast of one
//! token's activations gives 16 rows' partial sums, and the block's integer sums end in the lanes
//! where its scales apply — one convert and one multiply-add per block, token and 16 rows, where
//! the plain layout needs them per row. Qwen2.5-0.5B stores q/k/v/o/gate/up as Q5_0 (rows of 896
//! values cannot be K-quants), so its prompt processing runs here.
//!
//! The layout ([`BlockQ5_0x16`], 352 bytes per 16 rows × 32 columns, exactly the 16 source
//! blocks' size, so a packed tensor keeps its byte range and a memory budget its figures):
//!
//! - `d` (32 bytes): the 16 rows' f16 scales, row `r` at index `r`;
//! - `qh` (64 bytes): eight little-endian 64-bit masks, one per quad `g` of values
//!   `4g..4g + 4`; bit `4r + i` of mask `g` is row `r`'s fifth bit of value `4g + i` — the
//!   write mask of one masked byte add;
//! - `qs` (256 bytes): `qs[64·g + 4·r + i] = row_r.qs[4·g + i]` for `g < 4`: low nibbles are
//!   values `4g + i` (quad `g`), high nibbles values `16 + 4g + i` (quad `g + 4`).
//!
//! A packed matrix is its row groups one after another, each group's blocks in column order.
//! [`gemv_q5_0_x16`] is the scalar reference of the kernels: per row and block the exact integer
//! sum `Σ q·a − 16·Σ a` (`q` the unsigned 5-bit quant), then one fused multiply-add with
//! `d_w · d_a`, in the order a SIMD kernel with one lane per row follows bit for bit.

use crate::blocks::{BlockQ5_0, BlockQ8_0};
use bytemuck::{Pod, Zeroable};

/// Rows in one packed group.
pub const PACK_ROWS_Q5_0: usize = 16;

/// Values per block (as Q5_0).
const QK: usize = 32;

/// Sixteen Q5_0 rows' blocks at one column position, interleaved (see the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0x16 {
    pub d: [u8; 32],
    pub qh: [u8; 64],
    pub qs: [u8; 256],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0x16>() == PACK_ROWS_Q5_0 * std::mem::size_of::<BlockQ5_0>());
const _: () = assert!(std::mem::align_of::<BlockQ5_0x16>() == 1);

impl BlockQ5_0x16 {
    /// Row `r`'s f16 scale as f32.
    #[inline(always)]
    pub fn d(&self, r: usize) -> f32 {
        half::f16::from_le_bytes([self.d[2 * r], self.d[2 * r + 1]]).to_f32()
    }

    /// Row `r`'s unsigned 5-bit quant of value `v` (0..32); the weight is `d · (q − 16)`.
    #[inline(always)]
    pub fn q(&self, r: usize, v: usize) -> u8 {
        let (g, i) = (v / 4, v % 4);
        let b = self.qs[64 * (g % 4) + 4 * r + i];
        let nib = if g < 4 { b & 0xF } else { b >> 4 };
        let bit = 4 * r + i;
        nib | ((self.qh[8 * g + bit / 8] >> (bit % 8)) & 1) << 4
    }
}

/// Packs the blocks of 16 rows at one column position.
pub fn pack_block_q5_0_x16(rows: [&BlockQ5_0; PACK_ROWS_Q5_0]) -> BlockQ5_0x16 {
    let mut out = BlockQ5_0x16::zeroed();
    let mut masks = [0u64; 8];
    for (r, x) in rows.iter().enumerate() {
        out.d[2 * r..2 * r + 2].copy_from_slice(&x.d);
        let qh = u64::from(u32::from_le_bytes(x.qh));
        // Quad `g`'s four fifth bits are bits `4g..4g + 4` of the row's `qh`.
        for (g, m) in masks.iter_mut().enumerate() {
            *m |= ((qh >> (4 * g)) & 0xF) << (4 * r);
        }
        for g in 0..4 {
            out.qs[64 * g + 4 * r..64 * g + 4 * r + 4].copy_from_slice(&x.qs[4 * g..4 * g + 4]);
        }
    }
    for (g, m) in masks.iter().enumerate() {
        out.qh[8 * g..8 * g + 8].copy_from_slice(&m.to_le_bytes());
    }
    out
}

/// Packs 16 rows of a Q5_0 matrix: `src` holds the rows one after another (`16 · nb` blocks of
/// 22 bytes, `nb` blocks per row), `dst` receives the same number of bytes.
///
/// # Panics
/// If `src` or `dst` is not `16 · nb · 22` bytes.
pub fn pack_q5_0_x16(src: &[u8], nb: usize, dst: &mut [u8]) {
    let blocks: &[BlockQ5_0] = bytemuck::cast_slice(src);
    assert_eq!(blocks.len(), PACK_ROWS_Q5_0 * nb, "16 rows of {nb} Q5_0 blocks");
    let out: &mut [BlockQ5_0x16] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), nb, "{nb} packed blocks");
    for (b, o) in out.iter_mut().enumerate() {
        *o = pack_block_q5_0_x16(std::array::from_fn(|r| &blocks[r * nb + b]));
    }
}

/// Row `r` of the 16 rows [`pack_q5_0_x16`] packed, in plain Q5_0 blocks again: what
/// [`unpack_q5_0_x16`] writes for that row alone.
///
/// # Panics
/// If `src` is not `16 · nb · 22` bytes, `dst` not `nb · 22`, or `r` is not below 16.
pub fn unpack_row_q5_0_x16(src: &[u8], nb: usize, r: usize, dst: &mut [u8]) {
    let packed: &[BlockQ5_0x16] = bytemuck::cast_slice(src);
    assert_eq!(packed.len(), nb, "{nb} packed blocks");
    assert!(r < PACK_ROWS_Q5_0, "row {r} of a group of 16");
    let out: &mut [BlockQ5_0] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), nb, "one row of {nb} Q5_0 blocks");
    for (p, x) in packed.iter().zip(out.iter_mut()) {
        unpack_block_row(p, r, x);
    }
}

/// Row `r`'s plain block of the packed block `p`: each of [`pack_block_q5_0_x16`]'s byte moves
/// undone.
#[inline]
fn unpack_block_row(p: &BlockQ5_0x16, r: usize, x: &mut BlockQ5_0) {
    x.d.copy_from_slice(&p.d[2 * r..2 * r + 2]);
    // Row r's fifth bits of quad g are bits 4r..4r + 4 of mask g.
    let mut qh = 0u32;
    for g in 0..8 {
        let m = u64::from_le_bytes(p.qh[8 * g..8 * g + 8].try_into().expect("8 bytes"));
        qh |= (((m >> (4 * r)) & 0xF) as u32) << (4 * g);
    }
    x.qh = qh.to_le_bytes();
    for g in 0..4 {
        x.qs[4 * g..4 * g + 4].copy_from_slice(&p.qs[64 * g + 4 * r..64 * g + 4 * r + 4]);
    }
}

/// The 16 rows [`pack_q5_0_x16`] packed, in plain Q5_0 blocks again: the source's bytes exactly
/// (each of [`pack_block_q5_0_x16`]'s byte moves undone; sparse prefill gathers chosen rows this
/// way for every prompt block, so it moves bytes rather than decoding values).
///
/// # Panics
/// If `src` or `dst` is not `16 · nb · 22` bytes.
pub fn unpack_q5_0_x16(src: &[u8], nb: usize, dst: &mut [u8]) {
    let packed: &[BlockQ5_0x16] = bytemuck::cast_slice(src);
    assert_eq!(packed.len(), nb, "{nb} packed blocks");
    let out: &mut [BlockQ5_0] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), PACK_ROWS_Q5_0 * nb, "16 rows of {nb} Q5_0 blocks");
    for (b, p) in packed.iter().enumerate() {
        for r in 0..PACK_ROWS_Q5_0 {
            unpack_block_row(p, r, &mut out[r * nb + b]);
        }
    }
}

/// One packed group made of rows of others: slot `j` of `dst` (`nb` packed blocks) receives row
/// `chosen[j] % 16` of the packed group `chosen[j] / 16` of `src` (a packed matrix, its groups of
/// `nb` blocks one after another). Bytes and fifth bits are moved from their interleaved places to
/// the slot's — what [`unpack_q5_0_x16`] then [`pack_q5_0_x16`] would give, without the plain rows
/// between (sparse prefill gathers a block's chosen neurons this way).
///
/// # Panics
/// If `chosen` is not 16 rows within `src`, or `dst` is not `nb` packed blocks.
pub fn gather_rows_q5_0_x16(src: &[u8], nb: usize, chosen: &[u32], dst: &mut [u8]) {
    let packed: &[BlockQ5_0x16] = bytemuck::cast_slice(src);
    let out: &mut [BlockQ5_0x16] = bytemuck::cast_slice_mut(dst);
    assert_eq!(chosen.len(), PACK_ROWS_Q5_0, "16 rows to a group");
    assert_eq!(out.len(), nb, "{nb} packed blocks");
    let groups = packed.len() / nb.max(1);
    assert!(chosen.iter().all(|&r| (r as usize) < groups * PACK_ROWS_Q5_0), "a chosen row outside the matrix");
    for (b, o) in out.iter_mut().enumerate() {
        let mut masks = [0u64; 8];
        for (j, &r) in chosen.iter().enumerate() {
            let (p, i) = (&packed[(r as usize / PACK_ROWS_Q5_0) * nb + b], r as usize % PACK_ROWS_Q5_0);
            o.d[2 * j..2 * j + 2].copy_from_slice(&p.d[2 * i..2 * i + 2]);
            for (g, m) in masks.iter_mut().enumerate() {
                let src = u64::from_le_bytes(p.qh[8 * g..8 * g + 8].try_into().expect("8 bytes"));
                *m |= ((src >> (4 * i)) & 0xF) << (4 * j);
            }
            for g in 0..4 {
                o.qs[64 * g + 4 * j..64 * g + 4 * j + 4].copy_from_slice(&p.qs[64 * g + 4 * i..64 * g + 4 * i + 4]);
            }
        }
        for (g, m) in masks.iter().enumerate() {
            o.qh[8 * g..8 * g + 8].copy_from_slice(&m.to_le_bytes());
        }
    }
}

/// The weight groups and activation blocks of a packed product, checked: `w` whole groups of
/// `n / 32` packed blocks, `a` at least `n / 32` Q8_0 blocks.
///
/// # Panics
/// If `n` is not a multiple of 32, `w` is not whole groups of `n / 32` blocks, or `a` is short.
pub(crate) fn check(n: usize, w: &[u8], a: &[u8]) -> (usize, usize) {
    assert!(n.is_multiple_of(QK), "row length {n} is not a multiple of {QK}");
    let nb = n / QK;
    let gb = nb * std::mem::size_of::<BlockQ5_0x16>();
    assert!(gb > 0 && w.len().is_multiple_of(gb), "{} bytes are not whole groups of {nb} packed blocks", w.len());
    assert!(a.len() >= nb * std::mem::size_of::<BlockQ8_0>(), "activation row shorter than {n} values");
    (nb, w.len() / gb)
}

/// The reference of the packed kernels: every group of 16 rows in `w` (`nb = n / 32` packed
/// blocks each) times one Q8_0 activation row `a`; `out[16·k + r]` is row `r` of group `k`.
///
/// Per row and block: the exact `sumi = Σ q·a − 16·Σ a`, then `acc = fma(d_w · d_a, sumi, acc)`.
///
/// # Panics
/// As [`check`]'s rules, or if `out` is not 16 per group.
pub fn gemv_q5_0_x16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let (nb, groups) = check(n, w, a);
    assert_eq!(out.len(), groups * PACK_ROWS_Q5_0, "16 outputs per group");
    let xs: &[BlockQ5_0x16] = bytemuck::cast_slice(w);
    let ys: &[BlockQ8_0] = bytemuck::cast_slice(&a[..nb * std::mem::size_of::<BlockQ8_0>()]);
    for (g, o) in xs.chunks_exact(nb).zip(out.chunks_exact_mut(PACK_ROWS_Q5_0)) {
        let mut acc = [0f32; PACK_ROWS_Q5_0];
        for (x, y) in g.iter().zip(ys) {
            let da = half::f16::from_le_bytes(y.d).to_f32();
            let sa: i32 = y.qs.iter().map(|&q| i32::from(q)).sum();
            for (r, acc) in acc.iter_mut().enumerate() {
                let p: i32 = (0..QK).map(|v| i32::from(x.q(r, v)) * i32::from(y.qs[v])).sum();
                *acc = (x.d(r) * da).mul_add((p - 16 * sa) as f32, *acc);
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// [`gemv_q5_0_x16`] on the best kernel `isa` has (bit for bit the same result).
///
/// # Panics
/// As [`gemv_q5_0_x16`].
pub fn gemv_q5_0_x16_on(isa: crate::Isa, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::packed_q5_0::gemv(isa, n, w, a, out) {
        return;
    }
    let _ = isa;
    gemv_q5_0_x16(n, w, a, out)
}

/// Every group of 16 rows in `w` times four activation rows: `out[16·k + r][t]` is bit for bit
/// [`gemv_q5_0_x16`]'s row `16·k + r` for `a[t]` (AVX-512 VNNI and AVX2 unpack the weights once
/// for the four tokens; elsewhere one [`gemv_q5_0_x16_on`] per token). The shape of
/// [`crate::Dot4RowsFn`]'s output, so batches take the same path as plain rows.
///
/// # Panics
/// As [`gemv_q5_0_x16`] for each activation row.
pub fn gemm_q5_0_x16_on(isa: crate::Isa, n: usize, w: &[u8], a: [&[u8]; 4], out: &mut [[f32; 4]]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::packed_q5_0::gemm(isa, n, w, a, out) {
        return;
    }
    let mut y = vec![0f32; out.len()];
    for (t, a) in a.iter().enumerate() {
        gemv_q5_0_x16_on(isa, n, w, a, &mut y);
        for (o, y) in out.iter_mut().zip(&y) {
            o[t] = *y;
        }
    }
}

/// Whether sift repacks Q5_0 matrices on `isa`: where the AVX2 or AVX-512 VNNI kernels run them
/// (elsewhere the plain layout's kernels are faster than the packed reference).
pub fn worth_packing(isa: crate::Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= crate::Isa::Avx2 && isa.is_supported()
}
