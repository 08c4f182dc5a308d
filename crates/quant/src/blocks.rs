//! GGML block layouts as `#[repr(C)]` structs.
//!
//! Every field is a byte array, so every block has alignment 1 and a `&[u8]` of whole blocks can be
//! viewed as `&[Block]` with [`bytemuck::cast_slice`] wherever it sits in a file or buffer. Scales
//! are decoded by the accessor methods. Sizes are asserted at compile time against GGML's.

use bytemuck::{Pod, Zeroable};
use half::f16;

#[inline(always)]
fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// 32 values: `x = d * (q - 8)`, q in 0..16. Low nibbles hold values 0..16, high nibbles 16..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

/// 32 values: `x = d * q + m`, q in 0..16 (nibble order as Q4_0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; 16],
}

/// 32 values: `x = d * (q - 16)`, q = nibble | (bit j of qh) << 4.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// 32 values: `x = d * q`, q in -127..=127. Also the activation format for Q4_0 / Q5_0 / Q8_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; 32],
}

/// Activation format for Q4_1: as Q8_0 plus `s = d * sum(qs)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: [u8; 2],
    pub s: [u8; 2],
    pub qs: [i8; 32],
}

/// 256 values in 8 sub-blocks of 32: `x = d * sc * q - dmin * m`, 6-bit sc/m packed in `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// As Q4_K with a fifth bit per value in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

/// 256 values in 16 sub-blocks of 16: `x = d * scale * (q - 32)`, q 6-bit (4 in `ql`, 2 in `qh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: [u8; 2],
}

/// Activation format for the K-quants: f32 scale, 256 × i8, sums of each 16 consecutive values.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; 256],
    pub bsums: [[u8; 2]; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ8K>() == 1);

impl BlockQ4_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}
impl BlockQ4_1 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn m(&self) -> f32 {
        f16_le(self.m)
    }
}
impl BlockQ5_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
}
impl BlockQ8_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}
impl BlockQ8_1 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn s(&self) -> f32 {
        f16_le(self.s)
    }
}
impl BlockQ4K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn dmin(&self) -> f32 {
        f16_le(self.dmin)
    }
}
impl BlockQ5K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn dmin(&self) -> f32 {
        f16_le(self.dmin)
    }
}
impl BlockQ6K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}
impl BlockQ8K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
    #[inline(always)]
    pub fn bsum(&self, i: usize) -> i16 {
        i16::from_le_bytes(self.bsums[i])
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block (GGML's `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}
