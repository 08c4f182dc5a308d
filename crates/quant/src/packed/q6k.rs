//! Eight Q6_K rows interleaved ([`BlockQ6Kx8`]), for the AVX-512 VNNI kernel
//! ([`crate::x86::packed`]); the same scheme as the Q4_K layout of the parent module.
//!
//! The layout (1680 bytes per 8 rows × 256 columns, the 8 source blocks' size):
//!
//! - `d`: the 8 rows' f16 scales, row `r` at index `r`;
//! - `sc`: the signed 8-bit scale of row `r`'s sub-block `s` (16 values) at `8·s + r`, so one
//!   8-byte load gives a sub-block's scales for all eight rows;
//! - `ql` (1024 bytes): the low 4 bits of the 6-bit quants (0..64), laid out as the Q4_K layout's
//!   `qs`: byte `256·j + 32·g + 4·r + i` holds, in its low nibble, value `64j + 4g + i` of row
//!   `r` and, in its high nibble, value `64j + 32 + 4g + i`;
//! - `qh` (512 bytes): the high 2 bits: byte `128·j + 32·p + 4·r + i` holds those of the two
//!   values of `ql`'s byte for `g = 2p` in bits 0-1 (low nibble's value) and 2-3 (high nibble's),
//!   and of `g = 2p + 1` in bits 4-5 and 6-7. A kernel's 64-byte load of `ql` covers `g = 2p` and
//!   `2p + 1` for all rows, and one 32-byte load of `qh`, shifted by 4 for the upper half, matches
//!   it.
//!
//! [`gemv_q6k_x8`] is the scalar reference of the kernel: per row and super-block the exact
//! integer sum `Σ_s sc_s · (Σ q·a − 32 · bsum_s)`, then one fused multiply-add.

use super::PACK_ROWS;
use crate::blocks::{BlockQ6K, BlockQ8K};
use crate::scalar_k::QK_K;
use bytemuck::{Pod, Zeroable};

/// Eight Q6_K rows' super-blocks at one column position, interleaved (see the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6Kx8 {
    pub d: [u8; 16],
    pub sc: [u8; 128],
    pub ql: [u8; 1024],
    pub qh: [u8; 512],
}

const _: () = assert!(std::mem::size_of::<BlockQ6Kx8>() == PACK_ROWS * std::mem::size_of::<BlockQ6K>());
const _: () = assert!(std::mem::align_of::<BlockQ6Kx8>() == 1);

/// Where value `v` (0..256) of row `r` lies: (`ql` byte, its nibble shift, `qh` byte, its shift).
#[inline(always)]
const fn slots(r: usize, v: usize) -> (usize, u32, usize, u32) {
    let (j, w) = (v / 64, v % 64);
    let (hi, u) = (w / 32, w % 32);
    let (g, i) = (u / 4, u % 4);
    let (p, odd) = (g / 2, g % 2);
    (256 * j + 32 * g + 4 * r + i, 4 * hi as u32, 128 * j + 32 * p + 4 * r + i, (4 * odd + 2 * hi) as u32)
}

/// The 256 unsigned 6-bit quants (0..64, value order) of a Q6_K block.
fn q6_values(x: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&x.ql[64 * h..64 * h + 64], &x.qh[32 * h..32 * h + 32]);
        for l in 0..32 {
            q[128 * h + l] = (ql[l] & 0xF) | (qh[l] & 3) << 4;
            q[128 * h + l + 32] = (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4;
            q[128 * h + l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            q[128 * h + l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        }
    }
    q
}

impl BlockQ6Kx8 {
    /// Row `r`'s f16 scale as f32.
    #[inline(always)]
    pub fn d(&self, r: usize) -> f32 {
        half::f16::from_le_bytes([self.d[2 * r], self.d[2 * r + 1]]).to_f32()
    }

    /// Row `r`'s scale of sub-block `s` (0..16).
    #[inline(always)]
    pub fn scale(&self, r: usize, s: usize) -> i8 {
        self.sc[8 * s + r] as i8
    }

    /// Row `r`'s unsigned 6-bit quant of value `v` (0..256).
    #[inline(always)]
    pub fn q(&self, r: usize, v: usize) -> u8 {
        let (l, ls, h, hs) = slots(r, v);
        (self.ql[l] >> ls) & 0xF | ((self.qh[h] >> hs) & 3) << 4
    }
}

/// Packs the super-blocks of 8 rows at one column position.
pub fn pack_block_q6k_x8(rows: [&BlockQ6K; PACK_ROWS]) -> BlockQ6Kx8 {
    let mut out = BlockQ6Kx8::zeroed();
    for (r, x) in rows.iter().enumerate() {
        out.d[2 * r..2 * r + 2].copy_from_slice(&x.d);
        for s in 0..16 {
            out.sc[8 * s + r] = x.scales[s] as u8;
        }
        for (v, q) in q6_values(x).into_iter().enumerate() {
            let (l, ls, h, hs) = slots(r, v);
            out.ql[l] |= (q & 0xF) << ls;
            out.qh[h] |= (q >> 4) << hs;
        }
    }
    out
}

/// Packs 8 rows of a Q6_K matrix: `src` holds the rows one after another (`8 · nb` blocks of
/// 210 bytes), `dst` receives the same number of bytes.
///
/// # Panics
/// If `src` or `dst` is not `8 · nb · 210` bytes.
pub fn pack_q6k_x8(src: &[u8], nb: usize, dst: &mut [u8]) {
    let blocks: &[BlockQ6K] = bytemuck::cast_slice(src);
    assert_eq!(blocks.len(), PACK_ROWS * nb, "8 rows of {nb} Q6_K blocks");
    let out: &mut [BlockQ6Kx8] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), nb, "{nb} packed blocks");
    for (b, o) in out.iter_mut().enumerate() {
        *o = pack_block_q6k_x8(std::array::from_fn(|r| &blocks[r * nb + b]));
    }
}

/// The 8 rows [`pack_q6k_x8`] packed, in plain Q6_K blocks again (the source's bytes exactly).
///
/// # Panics
/// If `src` or `dst` is not `8 · nb · 210` bytes.
pub fn unpack_q6k_x8(src: &[u8], nb: usize, dst: &mut [u8]) {
    let packed: &[BlockQ6Kx8] = bytemuck::cast_slice(src);
    assert_eq!(packed.len(), nb, "{nb} packed blocks");
    let out: &mut [BlockQ6K] = bytemuck::cast_slice_mut(dst);
    assert_eq!(out.len(), PACK_ROWS * nb, "8 rows of {nb} Q6_K blocks");
    for (b, p) in packed.iter().enumerate() {
        for r in 0..PACK_ROWS {
            let x = &mut out[r * nb + b];
            x.d.copy_from_slice(&p.d[2 * r..2 * r + 2]);
            for s in 0..16 {
                x.scales[s] = p.scale(r, s);
            }
            let q: [u8; QK_K] = std::array::from_fn(|v| p.q(r, v));
            for h in 0..2 {
                for l in 0..32 {
                    let at = |k: usize| q[128 * h + l + 32 * k];
                    x.ql[64 * h + l] = (at(0) & 0xF) | (at(2) & 0xF) << 4;
                    x.ql[64 * h + l + 32] = (at(1) & 0xF) | (at(3) & 0xF) << 4;
                    x.qh[32 * h + l] = (at(0) >> 4) | (at(1) >> 4) << 2 | (at(2) >> 4) << 4 | (at(3) >> 4) << 6;
                }
            }
        }
    }
}

/// The reference of the packed Q6_K kernel: the 8 rows of one packed group (`w`: `nb` blocks of
/// [`BlockQ6Kx8`], `n = 256 · nb` columns) times one Q8_K activation row `a`. Per row and
/// super-block the exact `sumi = Σ_s sc_s · (Σ q·a − 32 · bsum_s)` over the 16 sub-blocks, then
/// `acc = fma(d · da, sumi, acc)`.
///
/// # Panics
/// If `n` is not a multiple of 256 or the slices are not `n / 256` blocks.
pub fn gemv_q6k_x8(n: usize, w: &[u8], a: &[u8]) -> [f32; PACK_ROWS] {
    assert!(n.is_multiple_of(QK_K), "row length {n} is not a multiple of {QK_K}");
    let nb = n / QK_K;
    let xs: &[BlockQ6Kx8] = bytemuck::cast_slice(w);
    let ys: &[BlockQ8K] = bytemuck::cast_slice(a);
    assert!(xs.len() == nb && ys.len() == nb, "{nb} blocks of weights and of activations");
    let mut acc = [0f32; PACK_ROWS];
    for (x, y) in xs.iter().zip(ys) {
        let da = y.d();
        for (r, acc) in acc.iter_mut().enumerate() {
            let mut sumi = 0i32;
            for s in 0..16 {
                let p: i32 = (0..16).map(|v| i32::from(x.q(r, 16 * s + v)) * i32::from(y.qs[16 * s + v])).sum();
                let bsum = i32::from(i16::from_le_bytes(y.bsums[s]));
                sumi += i32::from(x.scale(r, s)) * (p - 32 * bsum);
            }
            *acc = (x.d(r) * da).mul_add(sumi as f32, *acc);
        }
    }
    acc
}
