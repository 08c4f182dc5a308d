//! Re-quantization on a row's own grid: new values written into a quantized row as the nearest
//! levels its existing block scales can express, the scales left as they are.
//!
//! # Why
//!
//! Fusing a small correction (a LoRA adapter's `s·B·A`) into 4-bit weights by quantizing the sum
//! afresh picks new block scales, so every weight of the block is rounded again onto a shifted
//! grid: a second rounding error as large as the first, spread over the whole tensor, on top of
//! the correction. On the row's own grid the weights the correction does not move keep their
//! integers exactly, and those it moves change by whole levels. [`RowGrid`] exposes the levels,
//! so a caller can choose them with more than the nearest-level rule (the error feedback of
//! GPTQ-style rounding: `sift_engine::lora::fuse`).
//!
//! A row's value `k` is `a_k · (q_k − zero) + b_k` with `q_k` in `0..2^bits` (the exact columns'
//! decomposition, [`crate::exact`]): `a = d·sc`, `b = bd·m`, computed as GGML's dequantizers
//! compute them, so [`RowGrid::value`] equals [`crate::scalar::dequantize_row`] bit for bit.

use crate::blocks::{BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8_0};
use crate::exact::{DecodedRow, ExactFormat, SubScales};
use crate::WeightType;
use half::f16;

/// One quantized row's grid: per value its scale `a`, offset `b` and current integer, and the
/// row's bytes (its scales).
pub struct RowGrid {
    fmt: ExactFormat,
    a: Vec<f32>,
    b: Vec<f32>,
    codes: Vec<u8>,
    row: Vec<u8>,
}

impl RowGrid {
    /// The grid of `row` (`n` values of `src`); `None` for a format without quant integers (the
    /// float types) or a row that is not a whole number of blocks.
    pub fn of(src: WeightType, row: &[u8], n: usize) -> Option<RowGrid> {
        let fmt = ExactFormat::of(src)?;
        if n == 0 || !n.is_multiple_of(fmt.super_block) || src.row_bytes(n) != Some(row.len()) {
            return None;
        }
        let mut dec = DecodedRow::new(n, &fmt);
        dec.decode(&fmt, row);
        let h = |bits: u16| f16::from_bits(bits).to_f32();
        let subs = fmt.subs();
        let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for k in 0..n {
            let s = k / fmt.super_block;
            let j = s * subs + (k % fmt.super_block) / fmt.sub_block;
            let d = h(dec.d[s]);
            let (sc, m) = match fmt.sub_scales {
                SubScales::None => (1.0, 1.0),
                SubScales::Unsigned => (dec.sc[j] as f32, dec.m[j] as f32),
                SubScales::Signed => (dec.sc[j] as i8 as f32, 0.0),
            };
            a.push(if fmt.sub_scales == SubScales::None { d } else { d * sc });
            b.push(match (fmt.has_offset, fmt.sub_scales) {
                (false, _) => 0.0,
                (true, SubScales::None) => h(dec.b[s]),
                (true, _) => h(dec.b[s]) * m,
            });
        }
        Some(RowGrid { fmt, a, b, codes: dec.q, row: row.to_vec() })
    }

    /// Values in the row.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// Whether the row is empty (never: [`RowGrid::of`] refuses empty rows).
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// The largest integer a value can hold.
    pub fn max_code(&self) -> u8 {
        ((1u16 << self.fmt.bits) - 1) as u8
    }

    /// Value `k`'s integer.
    pub fn code(&self, k: usize) -> u8 {
        self.codes[k]
    }

    /// Value `k`'s step between adjacent levels (its block's scale; 0 when every level is equal).
    pub fn step(&self, k: usize) -> f32 {
        self.a[k]
    }

    /// The level of integer `q` at value `k`.
    #[inline]
    pub fn level(&self, k: usize, q: u8) -> f32 {
        let aq = self.a[k] * (q as f32 - self.fmt.zero as f32);
        if self.fmt.has_offset {
            aq + self.b[k]
        } else {
            aq
        }
    }

    /// Value `k` as the row holds it now.
    pub fn value(&self, k: usize) -> f32 {
        self.level(k, self.codes[k])
    }

    /// Sets value `k` to the level nearest `v` and returns that level. A block whose scale is
    /// zero (every level equal) and a value that is not finite leave the integer as it is.
    pub fn round(&mut self, k: usize, v: f32) -> f32 {
        let a = self.a[k];
        let t = (v - self.b[k]) / a + self.fmt.zero as f32;
        if a != 0.0 && t.is_finite() {
            self.codes[k] = t.round().clamp(0.0, self.max_code() as f32) as u8;
        }
        self.value(k)
    }

    /// Writes the row into `row`: the scales of the row this grid was taken from, with the
    /// integers as they are now.
    ///
    /// # Panics
    /// If `row` is not the size of the row the grid came from.
    pub fn write(&self, row: &mut [u8]) {
        assert_eq!(row.len(), self.row.len(), "RowGrid::write: another row's size");
        row.copy_from_slice(&self.row);
        let q = &self.codes;
        let nibbles = |qs: &mut [u8; 16], q: &[u8]| {
            for j in 0..16 {
                qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
            }
        };
        match self.fmt.src {
            WeightType::Q4_0 => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ4_0>(row).iter_mut().enumerate() {
                    nibbles(&mut x.qs, &q[32 * i..32 * i + 32]);
                }
            }
            WeightType::Q4_1 => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ4_1>(row).iter_mut().enumerate() {
                    nibbles(&mut x.qs, &q[32 * i..32 * i + 32]);
                }
            }
            WeightType::Q5_0 => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ5_0>(row).iter_mut().enumerate() {
                    let q = &q[32 * i..32 * i + 32];
                    nibbles(&mut x.qs, q);
                    let qh = q.iter().enumerate().fold(0u32, |h, (j, &v)| h | ((v as u32 >> 4) & 1) << j);
                    x.qh = qh.to_le_bytes();
                }
            }
            WeightType::Q8_0 => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ8_0>(row).iter_mut().enumerate() {
                    for (s, &v) in x.qs.iter_mut().zip(&q[32 * i..32 * i + 32]) {
                        *s = (v as i16 - 128) as i8;
                    }
                }
            }
            WeightType::Q4_K => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ4K>(row).iter_mut().enumerate() {
                    let q = &q[256 * i..256 * i + 256];
                    for j in 0..4 {
                        for l in 0..32 {
                            x.qs[32 * j + l] = (q[64 * j + l] & 0xF) | ((q[64 * j + 32 + l] & 0xF) << 4);
                        }
                    }
                }
            }
            WeightType::Q5_K => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ5K>(row).iter_mut().enumerate() {
                    let q = &q[256 * i..256 * i + 256];
                    x.qh = [0; 32];
                    for j in 0..4 {
                        for l in 0..32 {
                            let (lo, hi) = (q[64 * j + l], q[64 * j + 32 + l]);
                            x.qs[32 * j + l] = (lo & 0xF) | ((hi & 0xF) << 4);
                            x.qh[l] |= ((lo >> 4) & 1) << (2 * j) | ((hi >> 4) & 1) << (2 * j + 1);
                        }
                    }
                }
            }
            WeightType::Q6_K => {
                for (i, x) in bytemuck::cast_slice_mut::<u8, BlockQ6K>(row).iter_mut().enumerate() {
                    let q = &q[256 * i..256 * i + 256];
                    for half in 0..2 {
                        let o = &q[128 * half..128 * half + 128];
                        for l in 0..32 {
                            x.ql[64 * half + l] = (o[l] & 0xF) | ((o[l + 64] & 0xF) << 4);
                            x.ql[64 * half + l + 32] = (o[l + 32] & 0xF) | ((o[l + 96] & 0xF) << 4);
                            x.qh[32 * half + l] = (o[l] >> 4)
                                | ((o[l + 32] >> 4) << 2)
                                | ((o[l + 64] >> 4) << 4)
                                | ((o[l + 96] >> 4) << 6);
                        }
                    }
                }
            }
            t => unreachable!("no grid for {t:?}"),
        }
    }
}

/// `row` (`target.len()` values of `src`) with every value set to the level of its own grid
/// nearest `target`, scales unchanged; `None` for a format without quant integers.
pub fn round_onto_grid(src: WeightType, row: &[u8], target: &[f32]) -> Option<Vec<u8>> {
    let mut g = RowGrid::of(src, row, target.len())?;
    for (k, &v) in target.iter().enumerate() {
        g.round(k, v);
    }
    let mut out = vec![0u8; row.len()];
    g.write(&mut out);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalar::{dequantize_row, quantize_row};

    const TYPES: [WeightType; 7] = [
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ];

    /// A row of weight-like values: a smooth part, a spread and a few large ones.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s as f32 / u32::MAX as f32) - 0.5;
                let big = if i % 97 == 5 { 6.0 } else { 1.0 };
                0.05 * big * u + 0.01 * ((i as f32) * 0.37).sin()
            })
            .collect()
    }

    /// The grid's values are the dequantizer's, bit for bit; writing the integers back gives the
    /// row byte for byte; rounding the row's own values changes nothing.
    #[test]
    fn grid_values_are_the_dequantized_row_and_write_back_exactly() {
        for ty in TYPES {
            for seed in 0..4 {
                let x = values(512, seed);
                let row = quantize_row(ty, &x);
                let mut deq = vec![0f32; x.len()];
                dequantize_row(ty, &row, &mut deq);
                let g = RowGrid::of(ty, &row, x.len()).expect("a quantized type");
                for (k, &v) in deq.iter().enumerate() {
                    assert_eq!(g.value(k).to_bits(), v.to_bits(), "{ty:?} value {k}");
                }
                let mut back = vec![0u8; row.len()];
                g.write(&mut back);
                assert_eq!(back, row, "{ty:?}: write-back");
                assert_eq!(round_onto_grid(ty, &row, &deq).unwrap(), row, "{ty:?}: own values");
            }
        }
    }

    /// Moved values land on the nearest level: within half a step of the target inside the
    /// grid's range, and values moved by less than half a step keep their integers.
    #[test]
    fn rounding_picks_the_nearest_level_and_keeps_small_moves() {
        for ty in TYPES {
            let x = values(512, 7);
            let row = quantize_row(ty, &x);
            let g0 = RowGrid::of(ty, &row, x.len()).unwrap();
            let target: Vec<f32> = (0..x.len())
                .map(|k| {
                    let step = (g0.level(k, 1) - g0.level(k, 0)).abs();
                    g0.value(k) + step * (((k * 7) % 13) as f32 / 13.0 - 0.5) * if k % 3 == 0 { 0.9 } else { 4.0 }
                })
                .collect();
            let mut g = RowGrid::of(ty, &row, x.len()).unwrap();
            for (k, &v) in target.iter().enumerate() {
                let got = g.round(k, v);
                let best = (0..=g.max_code()).map(|q| (g.level(k, q) - v).abs()).fold(f32::INFINITY, f32::min);
                assert!((got - v).abs() <= best * (1.0 + 1e-5) + 1e-9, "{ty:?} value {k}: {got} for {v}");
                let step = (g0.level(k, 1) - g0.level(k, 0)).abs();
                if (v - g0.value(k)).abs() < 0.49 * step {
                    assert_eq!(g.code(k), g0.code(k), "{ty:?} value {k}: a small move kept its level");
                }
            }
            let mut out = vec![0xA5u8; row.len()];
            g.write(&mut out);
            let mut deq = vec![0f32; x.len()];
            dequantize_row(ty, &out, &mut deq);
            for (k, v) in deq.iter().enumerate() {
                assert_eq!(v.to_bits(), g.value(k).to_bits(), "{ty:?}: written value {k}");
            }
        }
    }

    #[test]
    fn float_types_and_partial_rows_have_no_grid() {
        assert!(RowGrid::of(WeightType::F16, &[0u8; 64], 32).is_none());
        let row = quantize_row(WeightType::Q4_K, &values(256, 1));
        assert!(RowGrid::of(WeightType::Q4_K, &row, 32).is_none());
        assert!(RowGrid::of(WeightType::Q4_K, &row[..100], 256).is_none());
    }
}
