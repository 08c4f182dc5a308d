//! Exact columns: a GGUF tensor's own quantized values, transposed to one contiguous column per
//! input channel, with the source's block scales kept beside them in a scale plane. The weights
//! the column kernels compute with are the GGUF's weights, value for value (nothing is
//! re-quantized); only the order of the f32 additions differs from a dense product.
//!
//! # Why
//!
//! GGML blocks run along a row's *input* dimension: a block of 32 values (256 for the K-quants)
//! shares one scale. Input-channel sparsity reads columns, so sift used to dequantize each tensor
//! and re-quantize it along the output dimension ([`crate::ColType`]): a second rounding that cost
//! SmolLM2-135M (Q4_1) 23.6 % perplexity. Here a column keeps the source's quant integers, and
//! every (output row, input block) keeps the source's scale, so the value is exactly the dense one.
//!
//! # Layout of one op (`n_out` outputs × `n_in` inputs)
//!
//! - **Columns**: column `c` (input channel `c`) is [`ExactFormat::col_bytes`]`(n_out)` bytes, in
//!   chunks of 32 outputs ([`ExactFormat::chunk_bytes`]): 16 bytes of nibbles (byte `k` holds row
//!   `k` in its low nibble and row `k + 16` in its high one, GGML's order), then for 5- and 6-bit
//!   formats one 32-bit plane per high bit (bit `k` = row `k`), or for 8-bit formats 32 bytes.
//!   The stored integer `q` is unsigned (0..2^bits); the value is `a · (q − zero) + b`.
//! - **Scales**: one record per source super-block along the input (32 inputs for the legacy
//!   formats, 256 for the K-quants), [`ExactFormat::scale_record_bytes`] each: `d` (f16 per output
//!   row), then `b` (f16 per row: Q4_1's `m`, the K-quants' `−dmin`) when the format has an
//!   offset, then for the K-quants per sub-block (32 inputs, Q6_K 16) the integer sub-scale
//!   (u8, Q6_K i8 per row) and, with an offset, the integer sub-offset (u8 per row). Row `r`'s
//!   weight at input `c` is `a · (q − zero) + b` with `a = d · sc` and `b = bd · m` (`sc = m = 1`
//!   for the legacy formats) — the products GGML's dequantizers compute, exact in f32.
//!
//! A 32-value source block becomes 32 column values of 4, 5, 6 or 8 bits plus its scales (the
//! same bytes, reordered); the K-quants' 6-bit packed sub-scales become bytes (Q4_K: 4.625 bits
//! per weight instead of 4.5).
//!
//! The 5- and 6-bit sources also have a *wide* layout ([`ExactFormat::wide`], `sift pack
//! --col-type wide`, `"exact8:Q6_K"` in a pack): the same integers one per byte, as the 8-bit
//! format stores them, and the same scale plane. Every kernel gives the narrow layout's result
//! on it bit for bit; on AVX2 the 8-bit-coefficient kernel skips the bit planes, which are ~40 %
//! of a Q6_K column product there.
//!
//! # Kernels
//!
//! [`ExactAxpyFn`] (one token): `y[k] += Σ_i coef[i] · W[32·chunks.start + k][units[i]]`, the
//! column of input `units[i]` found at `cols[idx[i]·col_bytes..]` (a cache slot, or the channel
//! itself in a whole tensor). Consecutive entries of the same sub-block form a *run* (cut at list
//! positions that are multiples of [`RUN_BREAK`]): per 32
//! outputs the run's columns are summed in registers as `t = Σ coef·q` (integers converted to
//! f32, one FMA each) with `s = Σ coef`, and the scales are applied once per run:
//! `y += a·(t − zero·s) + b·s`. The scalar reference [`axpy_exact_scalar`] computes the same sums
//! in the same order; AVX2 ([`crate::x86::exact`]) differs from it by f32 FMA rounding only, and
//! AVX-512 ([`crate::x86::exact_avx512`]) gives the AVX2 result bit for bit.
//!
//! [`axpy_exact_fn`] hands out the 8-bit-coefficient kernel of [`crate::exact_q8`] where the CPU
//! has it (AVX-512 VNNI + VBMI + BITALG, or AVX2 for every format but the 8-bit one: the
//! coefficients of a super-block quantized to `i8`, as the dense kernels quantize activations,
//! four columns per `vpdpbusd` or two per `vpmaddubsw` lane), else the f32 kernels above ([`axpy_exact_f32_fn`]).
//!
//! [`axpy_exact_batch`] (many tokens, `--all-columns`): the one-token kernel per token.

use crate::blocks::{scale_min_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8_0};
use crate::columns::{ColType, ColsError};
use crate::{Isa, WeightType};
use half::f16;
use std::ops::Range;

/// How one GGUF block format is laid out as exact columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExactFormat {
    /// The source block format.
    pub src: WeightType,
    /// Bits per stored integer: 4, 5, 6 or 8.
    pub bits: u8,
    /// The integer subtracted before scaling.
    pub zero: u8,
    /// Inputs per source super-block (one `d` per output row): 32 or 256.
    pub super_block: usize,
    /// Inputs per sub-block with its own integer sub-scale (`super_block` when there is none).
    pub sub_block: usize,
    /// Whether the format has an offset `b` (Q4_1, Q4_K, Q5_K).
    pub has_offset: bool,
    /// Whether sub-blocks carry integer scales (the K-quants), signed for Q6_K.
    pub sub_scales: SubScales,
}

/// The integer sub-scales of a K-quant format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubScales {
    None,
    Unsigned,
    Signed,
}

/// A column kernel over exact columns (see the module docs); panics on arguments
/// [`check_axpy_exact`] rejects. `y` holds the outputs of `chunks` (`32·chunks.len()` values), or
/// one such output per piece of [`RUN_BREAK`] entries of the active list ([`piece_count`]), each
/// piece's runs added into its own: several pieces in one call read each column as one stream,
/// and give what one call per piece gives, bit for bit.
pub type ExactAxpyFn =
    fn(m: &ExactMatrix<'_>, idx: &[u32], units: &[u32], coef: &[f32], chunks: Range<usize>, y: &mut [f32]);

impl ExactFormat {
    /// The exact layout of `src`, if sift has one (every quantized format it reads; not the float
    /// formats, whose columns would gain nothing over a dense read).
    pub fn of(src: WeightType) -> Option<ExactFormat> {
        use SubScales as S;
        let f = |bits, zero, super_block, sub_block, has_offset, sub_scales| ExactFormat {
            src,
            bits,
            zero,
            super_block,
            sub_block,
            has_offset,
            sub_scales,
        };
        Some(match src {
            WeightType::Q4_0 => f(4, 8, 32, 32, false, S::None),
            WeightType::Q4_1 => f(4, 0, 32, 32, true, S::None),
            WeightType::Q5_0 => f(5, 16, 32, 32, false, S::None),
            WeightType::Q8_0 => f(8, 128, 32, 32, false, S::None),
            WeightType::Q4_K => f(4, 0, 256, 32, true, S::Unsigned),
            WeightType::Q5_K => f(5, 0, 256, 32, true, S::Unsigned),
            WeightType::Q6_K => f(6, 32, 256, 16, false, S::Signed),
            _ => return None,
        })
    }

    /// The *wide* exact layout of a 5- or 6-bit source (Q5_0, Q5_K, Q6_K): the same integers and
    /// scales, one byte per value (32 bytes per chunk instead of 20 / 24). It reads 1.6x / 1.33x
    /// the bytes and saves the column kernels the bit-plane arithmetic: on a CPU without AVX-512
    /// (no bit-to-mask instructions) that arithmetic is most of a 5/6-bit column product's work,
    /// so the wide layout is the faster one there ([`wide_is_faster`]). `None` for other sources.
    pub fn wide(src: WeightType) -> Option<ExactFormat> {
        let f = ExactFormat::of(src)?;
        matches!(f.bits, 5 | 6).then_some(ExactFormat { bits: 8, ..f })
    }

    /// Whether this is a [`wide`](Self::wide) layout (8-bit storage of a narrower source).
    pub fn is_wide(&self) -> bool {
        self.bits == 8 && self.src != WeightType::Q8_0
    }

    /// The largest stored integer: `2^b − 1` for the source's `b` bits (a wide layout stores
    /// narrower integers in bytes).
    pub fn q_max(&self) -> u8 {
        match self.src {
            WeightType::Q5_0 | WeightType::Q5_K => 31,
            WeightType::Q6_K => 63,
            WeightType::Q8_0 => 255,
            _ => 15,
        }
    }

    /// The name written in a pack's table of contents (`"exact:Q4_K"`, `"exact8:Q6_K"` for a
    /// wide layout).
    pub fn name(&self) -> String {
        if self.is_wide() {
            format!("exact8:{}", self.src.name())
        } else {
            format!("exact:{}", self.src.name())
        }
    }

    /// Bytes of 32 values of one column.
    pub const fn chunk_bytes(&self) -> usize {
        match self.bits {
            4 => 16,
            5 => 20,
            6 => 24,
            _ => 32,
        }
    }

    /// Bytes of one column of `n_out` values (`n_out` a multiple of 32).
    pub const fn col_bytes(&self, n_out: usize) -> usize {
        n_out / 32 * self.chunk_bytes()
    }

    /// Sub-blocks per super-block.
    pub const fn subs(&self) -> usize {
        self.super_block / self.sub_block
    }

    /// Bytes of one super-block's scale record for `n_out` rows.
    pub const fn scale_record_bytes(&self, n_out: usize) -> usize {
        let per_row_f16 = if self.has_offset { 4 } else { 2 };
        let per_row_sub = match self.sub_scales {
            SubScales::None => 0,
            _ if self.has_offset => 2,
            _ => 1,
        };
        n_out * (per_row_f16 + per_row_sub * self.subs())
    }

    /// Bytes of an op's scale plane.
    pub const fn scale_bytes(&self, n_out: usize, n_in: usize) -> usize {
        n_in / self.super_block * self.scale_record_bytes(n_out)
    }

    /// Whether an `n_out × n_in` tensor fits this layout (whole chunks and super-blocks).
    pub const fn fits(&self, n_out: usize, n_in: usize) -> bool {
        n_out > 0 && n_out.is_multiple_of(32) && n_in > 0 && n_in.is_multiple_of(self.super_block)
    }

    /// Transposes a row-major tensor in the source format (`rows`: `n_out` rows of `n_in` values)
    /// into exact columns and their scale plane.
    ///
    /// # Panics
    /// If the shape does not [`fit`](Self::fits) or `rows` is not the tensor's size.
    pub fn transpose(&self, rows: &[u8], n_out: usize, n_in: usize) -> (Vec<u8>, Vec<u8>) {
        assert!(self.fits(n_out, n_in), "exact columns: a {n_out} × {n_in} tensor does not fit {}", self.name());
        let row_bytes = self.src.row_bytes(n_in).expect("a whole number of blocks");
        assert_eq!(rows.len(), row_bytes * n_out, "exact columns: tensor size");
        let cb = self.col_bytes(n_out);
        let mut cols = vec![0u8; cb * n_in];
        let mut scales = vec![0u8; self.scale_bytes(n_out, n_in)];
        let mut dec = DecodedRow::new(n_in, self);
        let rec = self.scale_record_bytes(n_out);
        let subs = self.subs();
        let d_at = |s: usize, r: usize| s * rec + 2 * r;
        let b_at = |s: usize, r: usize| s * rec + 2 * n_out + 2 * r;
        let f16s = if self.has_offset { 4 } else { 2 };
        let sub_stride = if self.has_offset { 2 * n_out } else { n_out };
        for r in 0..n_out {
            dec.decode(self, &rows[r * row_bytes..(r + 1) * row_bytes]);
            for s in 0..n_in / self.super_block {
                scales[d_at(s, r)..d_at(s, r) + 2].copy_from_slice(&dec.d[s].to_le_bytes());
                if self.has_offset {
                    scales[b_at(s, r)..b_at(s, r) + 2].copy_from_slice(&dec.b[s].to_le_bytes());
                }
                if self.sub_scales != SubScales::None {
                    for j in 0..subs {
                        let at = s * rec + f16s * n_out + j * sub_stride + r;
                        scales[at] = dec.sc[s * subs + j];
                        if self.has_offset {
                            scales[at + n_out] = dec.m[s * subs + j];
                        }
                    }
                }
            }
            let (chunk, k) = (r / 32, r % 32);
            for (c, &q) in dec.q.iter().enumerate() {
                let p = &mut cols[c * cb + chunk * self.chunk_bytes()..][..self.chunk_bytes()];
                put_q(self.bits, p, k, q);
            }
        }
        (cols, scales)
    }

    /// Row `r`'s scale factors at input `c`: `(a, b)` with weight `a · (q − zero) + b`.
    #[inline]
    pub fn scale_of(&self, scales: &[u8], n_out: usize, r: usize, c: usize) -> (f32, f32) {
        let rec = self.scale_record_bytes(n_out);
        let s = c / self.super_block;
        let j = (c % self.super_block) / self.sub_block;
        let base = s * rec;
        let f = |at: usize| f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
        let d = f(base + 2 * r);
        let bd = if self.has_offset { f(base + 2 * n_out + 2 * r) } else { 0.0 };
        let f16s = if self.has_offset { 4 } else { 2 };
        let sub_stride = if self.has_offset { 2 * n_out } else { n_out };
        match self.sub_scales {
            SubScales::None => (d, bd),
            ss => {
                let at = base + f16s * n_out + j * sub_stride + r;
                let sc = if ss == SubScales::Signed { scales[at] as i8 as f32 } else { scales[at] as f32 };
                let m = if self.has_offset { scales[at + n_out] as f32 } else { 0.0 };
                (d * sc, bd * m)
            }
        }
    }

    /// Row `r`'s super-block factors at input `c`: `(d, b)` as f32 (`b = 0` without an offset).
    #[inline]
    pub fn super_scale_of(&self, scales: &[u8], n_out: usize, r: usize, c: usize) -> (f32, f32) {
        let base = (c / self.super_block) * self.scale_record_bytes(n_out);
        let f = |at: usize| f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
        (f(base + 2 * r), if self.has_offset { f(base + 2 * n_out + 2 * r) } else { 0.0 })
    }

    /// Row `r`'s integer sub-block factors at input `c`: `(sc, m)`, `(1, 1)` for formats without
    /// sub-scales (then `a = d·sc`, `b = bd·m` as in [`Self::scale_of`]).
    #[inline]
    pub fn sub_scale_of(&self, scales: &[u8], n_out: usize, r: usize, c: usize) -> (i32, i32) {
        if self.sub_scales == SubScales::None {
            return (1, 1);
        }
        let f16s = if self.has_offset { 4 } else { 2 };
        let sub_stride = if self.has_offset { 2 * n_out } else { n_out };
        let at = (c / self.super_block) * self.scale_record_bytes(n_out)
            + f16s * n_out
            + ((c % self.super_block) / self.sub_block) * sub_stride
            + r;
        let sc = if self.sub_scales == SubScales::Signed { scales[at] as i8 as i32 } else { scales[at] as i32 };
        (sc, if self.has_offset { scales[at + n_out] as i32 } else { 0 })
    }

    /// Dequantizes column `c` (`col`: its bytes) into `dst` (`n_out` values), as the kernels see it.
    pub fn dequantize_col(&self, col: &[u8], scales: &[u8], c: usize, dst: &mut [f32]) {
        let n_out = dst.len();
        for (r, v) in dst.iter_mut().enumerate() {
            let q = get_q(self.bits, &col[r / 32 * self.chunk_bytes()..][..self.chunk_bytes()], r % 32);
            let (a, b) = self.scale_of(scales, n_out, r, c);
            let aq = a * (q as f32 - self.zero as f32);
            *v = if self.has_offset { aq + b } else { aq };
        }
    }
}

/// One source row decoded: integers, per super-block `d` (and `b` = the offset's f16, sign
/// included) as f16 bits, per sub-block integer scales.
pub(crate) struct DecodedRow {
    pub(crate) q: Vec<u8>,
    pub(crate) d: Vec<u16>,
    pub(crate) b: Vec<u16>,
    pub(crate) sc: Vec<u8>,
    pub(crate) m: Vec<u8>,
}

impl DecodedRow {
    pub(crate) fn new(n_in: usize, f: &ExactFormat) -> DecodedRow {
        let nsb = n_in / f.super_block;
        DecodedRow {
            q: vec![0; n_in],
            d: vec![0; nsb],
            b: vec![0; nsb],
            sc: vec![0; nsb * f.subs()],
            m: vec![0; nsb * f.subs()],
        }
    }

    pub(crate) fn decode(&mut self, f: &ExactFormat, row: &[u8]) {
        let h = |b: [u8; 2]| u16::from_le_bytes(b);
        let neg = |b: [u8; 2]| u16::from_le_bytes(b) ^ 0x8000;
        match f.src {
            WeightType::Q4_0 => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ4_0>(row).iter().enumerate() {
                    self.d[i] = h(x.d);
                    nibbles_to(&x.qs, &mut self.q[32 * i..32 * i + 32]);
                }
            }
            WeightType::Q4_1 => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ4_1>(row).iter().enumerate() {
                    (self.d[i], self.b[i]) = (h(x.d), h(x.m));
                    nibbles_to(&x.qs, &mut self.q[32 * i..32 * i + 32]);
                }
            }
            WeightType::Q5_0 => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ5_0>(row).iter().enumerate() {
                    self.d[i] = h(x.d);
                    let q = &mut self.q[32 * i..32 * i + 32];
                    nibbles_to(&x.qs, q);
                    let qh = u32::from_le_bytes(x.qh);
                    for (j, v) in q.iter_mut().enumerate() {
                        *v |= (((qh >> j) & 1) as u8) << 4;
                    }
                }
            }
            WeightType::Q8_0 => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ8_0>(row).iter().enumerate() {
                    self.d[i] = h(x.d);
                    for (v, &s) in self.q[32 * i..32 * i + 32].iter_mut().zip(&x.qs) {
                        *v = (s as i16 + 128) as u8;
                    }
                }
            }
            WeightType::Q4_K => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ4K>(row).iter().enumerate() {
                    (self.d[i], self.b[i]) = (h(x.d), neg(x.dmin));
                    for j in 0..8 {
                        (self.sc[8 * i + j], self.m[8 * i + j]) = scale_min_k4(j, &x.scales);
                    }
                    let q = &mut self.q[256 * i..256 * i + 256];
                    for j in 0..4 {
                        for l in 0..32 {
                            q[64 * j + l] = x.qs[32 * j + l] & 0xF;
                            q[64 * j + 32 + l] = x.qs[32 * j + l] >> 4;
                        }
                    }
                }
            }
            WeightType::Q5_K => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ5K>(row).iter().enumerate() {
                    (self.d[i], self.b[i]) = (h(x.d), neg(x.dmin));
                    for j in 0..8 {
                        (self.sc[8 * i + j], self.m[8 * i + j]) = scale_min_k4(j, &x.scales);
                    }
                    let q = &mut self.q[256 * i..256 * i + 256];
                    for j in 0..4 {
                        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                        for l in 0..32 {
                            let h1 = if x.qh[l] & u1 != 0 { 16 } else { 0 };
                            let h2 = if x.qh[l] & u2 != 0 { 16 } else { 0 };
                            q[64 * j + l] = (x.qs[32 * j + l] & 0xF) + h1;
                            q[64 * j + 32 + l] = (x.qs[32 * j + l] >> 4) + h2;
                        }
                    }
                }
            }
            WeightType::Q6_K => {
                for (i, x) in bytemuck::cast_slice::<u8, BlockQ6K>(row).iter().enumerate() {
                    self.d[i] = h(x.d);
                    for j in 0..16 {
                        self.sc[16 * i + j] = x.scales[j] as u8;
                    }
                    let q = &mut self.q[256 * i..256 * i + 256];
                    for half in 0..2 {
                        let ql = &x.ql[64 * half..64 * half + 64];
                        let qh = &x.qh[32 * half..32 * half + 32];
                        let o = &mut q[128 * half..128 * half + 128];
                        for l in 0..32 {
                            o[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                            o[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                            o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                            o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                        }
                    }
                }
            }
            t => unreachable!("no exact layout for {t:?}"),
        }
    }
}

/// GGML's nibble order: values 0..16 in the low nibbles, 16..32 in the high ones.
fn nibbles_to(qs: &[u8; 16], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = qs[j] & 0xF;
        out[j + 16] = qs[j] >> 4;
    }
}

/// Stores integer `q` as value `k` (< 32) of a 32-value chunk.
fn put_q(bits: u8, chunk: &mut [u8], k: usize, q: u8) {
    if bits == 8 {
        chunk[k] = q;
        return;
    }
    let (byte, shift) = (k % 16, if k < 16 { 0 } else { 4 });
    chunk[byte] |= (q & 0xF) << shift;
    for hb in 0..(bits as usize - 4) {
        if (q >> (4 + hb)) & 1 != 0 {
            chunk[16 + 4 * hb + k / 8] |= 1 << (k % 8);
        }
    }
}

/// Value `k` (< 32) of a 32-value chunk.
#[inline]
pub(crate) fn get_q(bits: u8, chunk: &[u8], k: usize) -> u8 {
    if bits == 8 {
        return chunk[k];
    }
    let mut q = (chunk[k % 16] >> if k < 16 { 0 } else { 4 }) & 0xF;
    for hb in 0..(bits as usize - 4) {
        q |= ((chunk[16 + 4 * hb + k / 8] >> (k % 8)) & 1) << (4 + hb);
    }
    q
}

/// One op's exact columns as the kernels read them.
#[derive(Clone, Copy, Debug)]
pub struct ExactMatrix<'a> {
    pub fmt: ExactFormat,
    pub n_out: usize,
    pub n_in: usize,
    /// Columns, [`ExactMatrix::stride`] bytes apart (a whole tensor, cache slots, or the down
    /// columns inside neuron bundles, [`crate::bundles`]).
    pub cols: &'a [u8],
    /// The op's whole scale plane.
    pub scales: &'a [u8],
    /// Bytes from one column's start to the next: the column's own size
    /// ([`ExactMatrix::col_bytes`]) unless the columns lie inside larger records.
    pub stride: usize,
}

impl<'a> ExactMatrix<'a> {
    /// Columns stored back to back (`fmt.col_bytes(n_out)` apart).
    pub fn new(fmt: ExactFormat, n_out: usize, n_in: usize, cols: &'a [u8], scales: &'a [u8]) -> Self {
        ExactMatrix { fmt, n_out, n_in, cols, scales, stride: fmt.col_bytes(n_out) }
    }

    /// The same columns read `stride` bytes apart (each inside a record of that size, at its
    /// start: pass `cols` from the column's offset in the first record).
    pub fn with_stride(self, stride: usize) -> Self {
        ExactMatrix { stride, ..self }
    }

    /// Bytes of one column.
    pub fn col_bytes(&self) -> usize {
        self.fmt.col_bytes(self.n_out)
    }

    /// How many columns `cols` holds: the last one needs only its own bytes after its start.
    pub fn n_cols(&self) -> usize {
        let cb = self.col_bytes();
        match self.cols.len() >= cb && self.stride > 0 {
            true => (self.cols.len() - cb) / self.stride + 1,
            false => 0,
        }
    }
}

/// Checks an [`ExactAxpyFn`]'s arguments.
pub fn check_axpy_exact(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    chunks: &Range<usize>,
    y_len: usize,
) -> Result<(), ColsError> {
    if !m.fmt.fits(m.n_out, m.n_in) {
        return Err(ColsError::Len { what: "n_out (a multiple of 32)", expected: m.n_out / 32 * 32, got: m.n_out });
    }
    let need = m.fmt.scale_bytes(m.n_out, m.n_in);
    if m.scales.len() < need {
        return Err(ColsError::TooShort { what: "scale plane", need, got: m.scales.len() });
    }
    let n_chunks = m.n_out / 32;
    if chunks.start > chunks.end || chunks.end > n_chunks {
        return Err(ColsError::Blocks { start: chunks.start, end: chunks.end, col_blocks: n_chunks });
    }
    if idx.len() != coef.len() || units.len() != coef.len() {
        return Err(ColsError::Len { what: "idx / units", expected: coef.len(), got: idx.len().min(units.len()) });
    }
    let width = 32 * chunks.len();
    if y_len != width && y_len != piece_count(coef.len()) * width {
        return Err(ColsError::Len { what: "y", expected: width, got: y_len });
    }
    if m.stride < m.col_bytes() {
        return Err(ColsError::Len { what: "column stride", expected: m.col_bytes(), got: m.stride });
    }
    let n_cols = m.n_cols();
    if let Some(&i) = idx.iter().find(|&&i| i as usize >= n_cols) {
        return Err(ColsError::Index { index: i, n_cols });
    }
    if let Some(&u) = units.iter().find(|&&u| u as usize >= m.n_in) {
        return Err(ColsError::Index { index: u, n_cols: m.n_in });
    }
    Ok(())
}

/// The pieces of [`RUN_BREAK`] entries an active list of `n` entries has (at least one).
pub const fn piece_count(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        n.div_ceil(RUN_BREAK)
    }
}

/// Where the run starting at list position `i0` adds its outputs in `y` (of `y_len` values, for
/// output blocks of `width` values): `0` when `y` is one output, or piece `i0 / RUN_BREAK`'s
/// slice when `y` holds one output per piece (see [`ExactAxpyFn`]).
#[inline]
pub(crate) fn piece_offset(i0: usize, y_len: usize, width: usize) -> usize {
    if y_len > width {
        (i0 / RUN_BREAK) * width
    } else {
        0
    }
}

/// List positions where a run always ends: a call over a part of an active list that starts at
/// a multiple of this sees the same runs as a call over the whole list, so the parts of a site
/// streamed in pieces of it add up to the whole site's result bit for bit. Each piece also has
/// its own accumulator of the op's outputs (summed in piece order), so it sets how much of those
/// a product writes and adds: 128 (64 before issue 17's eighth step) made Qwen2.5-1.5B's Top-K
/// 0.5 decode ~10 % faster, with no perplexity change through the columns.
pub const RUN_BREAK: usize = 128;

/// Runs of consecutive entries of `units` in the same sub-block, also cut at list positions
/// that are multiples of [`RUN_BREAK`]: `(start, end)` into the lists.
pub(crate) fn runs(units: &[u32], sub_block: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    // Every block size is a power of two (16, 32, 256): a shift, not a division per entry (the
    // divisions were ~45 % of the column kernels' planning on AVX2).
    assert!(sub_block.is_power_of_two(), "block size {sub_block} is not a power of two");
    let shift = sub_block.trailing_zeros();
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= units.len() {
            return None;
        }
        let g = units[i] >> shift;
        let start = i;
        let end = ((start / RUN_BREAK + 1) * RUN_BREAK).min(units.len());
        while i < end && units[i] >> shift == g {
            i += 1;
        }
        Some((start, i))
    })
}

/// The scalar reference [`ExactAxpyFn`].
pub fn axpy_exact_scalar(
    m: &ExactMatrix<'_>,
    idx: &[u32],
    units: &[u32],
    coef: &[f32],
    chunks: Range<usize>,
    y: &mut [f32],
) {
    if let Err(e) = check_axpy_exact(m, idx, units, coef, &chunks, y.len()) {
        panic!("{e}");
    }
    let (cb, kb) = (m.stride, m.fmt.chunk_bytes());
    let zero = m.fmt.zero as f32;
    for (i0, i1) in runs(units, m.fmt.sub_block) {
        let s: f32 = coef[i0..i1].iter().sum();
        let c = units[i0] as usize;
        for (ci, ch) in chunks.clone().enumerate() {
            let mut t = [0f32; 32];
            for i in i0..i1 {
                let col = &m.cols[idx[i] as usize * cb + ch * kb..][..kb];
                for (k, tv) in t.iter_mut().enumerate() {
                    *tv += coef[i] * get_q(m.fmt.bits, col, k) as f32;
                }
            }
            for (k, tv) in t.iter().enumerate() {
                let (a, b) = m.fmt.scale_of(m.scales, m.n_out, ch * 32 + k, c);
                y[piece_offset(i0, y.len(), 32 * chunks.len()) + ci * 32 + k] += a * (tv - zero * s) + b * s;
            }
        }
    }
}

/// The column kernel for `fmt` at or below `isa` on this CPU: the 8-bit-coefficient numerics of
/// [`crate::exact_q8`] on every CPU — its SIMD kernel where the CPU has one (AVX-512 VNNI with
/// VBMI and BITALG, else AVX2), else its scalar reference [`crate::exact_q8::axpy_exact_q8_scalar`],
/// which every SIMD kernel gives bit for bit. So the same pack and prompt give the same column
/// products on every machine. (The f32-coefficient kernels, [`axpy_exact_f32_fn`], are the
/// products without the coefficients' rounding, for comparisons.)
pub fn axpy_exact_fn(fmt: ExactFormat, isa: Isa) -> ExactAxpyFn {
    crate::exact_q8::axpy_exact_q8_fn(fmt, isa).unwrap_or(crate::exact_q8::axpy_exact_q8_scalar)
}

/// Whether this CPU computes [wide](ExactFormat::wide) 5/6-bit columns faster than the narrow
/// ones: without AVX-512 VNNI + VBMI + BITALG (whose kernel turns bit planes into masks in one
/// instruction), the AVX2 kernel spends ~40 % of a Q6_K column product on its bit planes
/// (`cargo bench -p sift-quant --bench exact`), more than the wide layout's extra bytes cost.
pub fn wide_is_faster() -> bool {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() >= Isa::Avx512Vnni && crate::x86::exact_vnni::has_vnni_vbmi() {
        return false;
    }
    Isa::detect() >= Isa::Avx2
}

/// The fastest f32-coefficient [`ExactAxpyFn`] for `fmt` at or below `isa` on this CPU (the
/// kernels of the module docs: AVX-512, AVX2 or the scalar reference).
pub fn axpy_exact_f32_fn(fmt: ExactFormat, isa: Isa) -> ExactAxpyFn {
    let isa = isa.min(Isa::detect());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512Vnni {
        if let Some(f) = crate::x86::exact_avx512::avx512_axpy_fn(fmt) {
            return f;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        if let Some(f) = crate::x86::exact::avx2_axpy_fn(fmt) {
            return f;
        }
    }
    axpy_exact_scalar
}

/// Many tokens (`--all-columns`): for every token `t < n_tok` and `k < 32·chunks.len()`,
/// `y[t·y_stride + k] += Σ_c x[t·n_in + c] · W[32·chunks.start + k][c]` over the whole matrix
/// (`m.cols` the whole tensor, column `c` at `c·col_bytes`), skipping zero inputs: the one-token
/// kernel of this CPU ([`axpy_exact_fn`]) per token, so a batch computes exactly what decoding
/// the same tokens one at a time computes.
///
/// # Panics
/// If `x` or `y` is too short for the shapes, or on arguments the one-token kernel refuses.
pub fn axpy_exact_batch(
    m: &ExactMatrix<'_>,
    x: &[f32],
    n_tok: usize,
    chunks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
) {
    let (n_in, width) = (m.n_in, 32 * chunks.len());
    assert!(x.len() >= n_tok * n_in, "axpy_exact_batch: x too short");
    assert!(
        n_tok == 0 || (y_stride >= width && y.len() >= (n_tok - 1) * y_stride + width),
        "axpy_exact_batch: y too short"
    );
    let f = axpy_exact_fn(m.fmt, Isa::detect());
    let (mut units, mut coef) = (Vec::with_capacity(n_in), Vec::with_capacity(n_in));
    for t in 0..n_tok {
        units.clear();
        coef.clear();
        for (c, &v) in x[t * n_in..(t + 1) * n_in].iter().enumerate() {
            if v != 0.0 {
                units.push(c as u32);
                coef.push(v);
            }
        }
        f(m, &units, &units, &coef, chunks.clone(), &mut y[t * y_stride..t * y_stride + width]);
    }
}

/// How a pack stores one op's columns: re-quantized along the output dimension (the formats of
/// [`ColType`], for sources without an exact layout: the float formats), or exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColFormat {
    Requant(ColType),
    Exact(ExactFormat),
}

impl ColFormat {
    /// The name in a pack's table of contents: `"Q4_1"` (re-quantized) or `"exact:Q4_K"`.
    pub fn name(&self) -> String {
        match self {
            ColFormat::Requant(t) => t.name().to_string(),
            ColFormat::Exact(f) => f.name(),
        }
    }

    /// The format named `name` (as [`Self::name`] writes it).
    pub fn from_name(name: &str) -> Option<ColFormat> {
        if let Some(src) = name.strip_prefix("exact8:") {
            return WeightType::from_name(src).and_then(ExactFormat::wide).map(ColFormat::Exact);
        }
        match name.strip_prefix("exact:") {
            Some(src) => WeightType::from_name(src).and_then(ExactFormat::of).map(ColFormat::Exact),
            None => ColType::from_name(name).map(ColFormat::Requant),
        }
    }

    /// Bytes of one column of `n_out` values (`n_out` a multiple of 32).
    pub fn col_bytes(&self, n_out: usize) -> usize {
        match self {
            ColFormat::Requant(t) => t.col_bytes(n_out),
            ColFormat::Exact(f) => f.col_bytes(n_out),
        }
    }

    /// Bytes of the op's scale plane (none for re-quantized columns).
    pub fn scale_bytes(&self, n_out: usize, n_in: usize) -> usize {
        match self {
            ColFormat::Requant(_) => 0,
            ColFormat::Exact(f) => f.scale_bytes(n_out, n_in),
        }
    }

    /// The re-quantized format whose kernel speed stands for this one in cost models (the
    /// simulator's device profiles measure the [`ColType`] kernels): the one with the same bits
    /// per value.
    pub fn cost_class(&self) -> ColType {
        match self {
            ColFormat::Requant(t) => *t,
            ColFormat::Exact(f) => match f.bits {
                4 => ColType::Q4_1,
                5 | 6 => ColType::Q5_0,
                _ => ColType::Q8_0,
            },
        }
    }
}

impl ColFormat {
    /// Dequantizes column `c` (`col`: its bytes; `scales`: the op's scale plane, unused for
    /// re-quantized columns) into `dst` (`n_out` values).
    pub fn dequantize_col(&self, col: &[u8], scales: &[u8], c: usize, dst: &mut [f32]) {
        match self {
            ColFormat::Requant(t) => t.dequantize_col(col, dst),
            ColFormat::Exact(f) => f.dequantize_col(col, scales, c, dst),
        }
    }
}
