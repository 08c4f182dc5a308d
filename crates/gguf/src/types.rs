//! The ggml tensor element types a GGUF file can name, with their block geometry.
//!
//! Every ggml type stores elements in fixed-size blocks: `block_size` elements take
//! `block_bytes` bytes. Unquantized types have a block size of 1.

use std::fmt;

/// A ggml tensor element type, identified in GGUF files by a numeric id. Ordered by id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// `(id, name, block_size, block_bytes)` for this type.
    const fn info(self) -> (u32, &'static str, usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (0, "F32", 1, 4),
            F16 => (1, "F16", 1, 2),
            Q4_0 => (2, "Q4_0", 32, 18),
            Q4_1 => (3, "Q4_1", 32, 20),
            Q5_0 => (6, "Q5_0", 32, 22),
            Q5_1 => (7, "Q5_1", 32, 24),
            Q8_0 => (8, "Q8_0", 32, 34),
            Q8_1 => (9, "Q8_1", 32, 36),
            Q2_K => (10, "Q2_K", 256, 84),
            Q3_K => (11, "Q3_K", 256, 110),
            Q4_K => (12, "Q4_K", 256, 144),
            Q5_K => (13, "Q5_K", 256, 176),
            Q6_K => (14, "Q6_K", 256, 210),
            Q8_K => (15, "Q8_K", 256, 292),
            IQ2_XXS => (16, "IQ2_XXS", 256, 66),
            IQ2_XS => (17, "IQ2_XS", 256, 74),
            IQ3_XXS => (18, "IQ3_XXS", 256, 98),
            IQ1_S => (19, "IQ1_S", 256, 50),
            IQ4_NL => (20, "IQ4_NL", 32, 18),
            IQ3_S => (21, "IQ3_S", 256, 110),
            IQ2_S => (22, "IQ2_S", 256, 82),
            IQ4_XS => (23, "IQ4_XS", 256, 136),
            I8 => (24, "I8", 1, 1),
            I16 => (25, "I16", 1, 2),
            I32 => (26, "I32", 1, 4),
            I64 => (27, "I64", 1, 8),
            F64 => (28, "F64", 1, 8),
            IQ1_M => (29, "IQ1_M", 256, 56),
            BF16 => (30, "BF16", 1, 2),
            TQ1_0 => (34, "TQ1_0", 256, 54),
            TQ2_0 => (35, "TQ2_0", 256, 66),
            MXFP4 => (39, "MXFP4", 32, 17),
        }
    }

    /// The type with this GGUF/ggml id, or `None` for ids this crate does not know.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The numeric id used in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.info().0
    }

    /// Upper-case name, e.g. `"Q4_K"`, `"BF16"`.
    pub fn name(self) -> &'static str {
        self.info().1
    }

    /// Number of elements per block (1 for unquantized types).
    pub fn block_size(self) -> usize {
        self.info().2
    }

    /// Number of bytes one block occupies.
    pub fn block_bytes(self) -> usize {
        self.info().3
    }

    /// True for block-quantized types (block size greater than one).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n_elements` elements, or `None` if `n_elements` is not a multiple of
    /// the block size or the size overflows `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
