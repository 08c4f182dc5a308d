//! Quantized block formats and the kernels that read them.
//!
//! Weights arrive in GGML's block formats (a tensor row of `n` values is `n / block_size` blocks of
//! `block_bytes` each). Activations are quantized once per op to an integer format (Q8_0, Q8_1 or
//! Q8_K, the weight type's [`WeightType::act_type`]) so that a row dot product runs on integers, as
//! llama.cpp does.
//!
//! Every kernel has a scalar reference in [`scalar`]; SIMD versions (AVX2, AVX-512 + VNNI) live in
//! [`x86`] and are chosen at run time by [`Isa::detect`]. Tests compare SIMD against scalar against
//! an f32 computation on dequantized values.
//!
//! Batches of tokens (prompt processing) use the multi-token kernels: [`Dot4Fn`] (one weight row,
//! four activation rows) and [`Dot4RowsFn`] (many weight rows, four activation rows), which unpack
//! each weight block once for four tokens. Per token they are bit-identical to the single-row
//! [`DotFn`] of the same instruction set, so batched and token-by-token evaluation agree exactly
//! (`tests/dot4.rs`).
//!
//! Module map:
//! - [`blocks`]: `#[repr(C)]` block structs with `const` size asserts.
//! - [`scalar`]: reference dequantize / quantize / dot for every format.
//! - [`x86`]: AVX2 and AVX-512 kernels (`unsafe`, `#[target_feature]`) and their dispatch tables,
//!   one file per format family and instruction set: [`x86::float`] (F32 / F16 / BF16),
//!   [`x86::legacy_avx2`] and [`x86::legacy_avx512`] (the non-K formats, single- and multi-token),
//!   [`x86::pair`] (the AVX-512 multi-row four-token kernels of the non-K formats: 512-bit, token
//!   pairs interleaved), [`x86::k_quants`] (the K-quants), [`x86::quantize`] (the activation
//!   quantizers) and [`x86::columns`] (the column kernels below).
//! - [`packed`]: layouts repacked at load for multi-row decode kernels (8 Q4_K rows interleaved,
//!   [`packed::BlockQ4Kx8`]), with their scalar reference; [`packed_q5_0`]: 16 Q5_0 rows
//!   interleaved for the AVX-512 VNNI batch kernels ([`packed_q5_0::BlockQ5_0x16`]), and
//!   [`packed_q4k_x16`]: 16 Q4_K rows for the same CPUs ([`packed_q4k_x16::BlockQ4Kx16`]).
//! - [`columns`]: input-channel (column) sparse kernels over transposed, quantized matrices
//!   (`y += Σ coef·column` over the active inputs only, for activation sparsity), with the column
//!   formats' quantizers; [`x86::columns`]: their AVX2 and AVX-512 versions.
//! - this file: the public, safe, dispatching API.

/// Defines `fn $name` (a [`Dot4Fn`]) as four calls of the [`DotFn`] `$dot`, one per activation
/// row: the multi-token kernel of a format that has no faster one (bit-identical to `$dot` by
/// construction).
macro_rules! dot4_by_dot {
    ($vis:vis $name:ident = $dot:path) => {
        $vis fn $name(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            [$dot(n, w, a[0]), $dot(n, w, a[1]), $dot(n, w, a[2]), $dot(n, w, a[3])]
        }
    };
}
pub(crate) use dot4_by_dot;

/// Defines `fn $name` (a [`Dot4RowsFn`]) as one call of the [`Dot4Fn`] `$dot4` per weight row.
macro_rules! rows_by_dot4 {
    ($vis:vis $name:ident = $dot4:path) => {
        $vis fn $name(n: usize, w: &[u8], row_bytes: usize, a: [&[u8]; 4], out: &mut [[f32; 4]]) {
            for (r, o) in out.iter_mut().enumerate() {
                *o = $dot4(n, &w[r * row_bytes..], a);
            }
        }
    };
}
pub(crate) use rows_by_dot4;

pub mod blocks;
pub mod bundles;
pub mod columns;
pub mod exact;
pub mod exact_q8;
pub mod grid;
pub mod packed;
pub mod packed_q4k_x16;
pub mod packed_q5_0;
pub mod scalar;
pub mod scalar_k;
pub mod transposed_q8;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use columns::{
    axpy_cols_batch, axpy_cols_fn, check_axpy_cols, check_axpy_cols_batch, AxpyColsFn, ColMatrix, ColType, ColsError,
};
pub use exact::{axpy_exact_batch, axpy_exact_fn, ColFormat, ExactAxpyFn, ExactFormat, ExactMatrix};
pub use exact_q8::axpy_exact_q8_fn;

/// A weight storage format sift can compute with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// The format an activation vector is quantized to before a dot product with a weight row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ActType {
    /// Plain f32 (used with F32 / F16 / BF16 weights).
    F32,
    /// 32-value blocks: f16 scale `d`, 32 × i8.
    Q8_0,
    /// 32-value blocks: f16 scale `d`, f16 `s = d * sum(qs)`, 32 × i8.
    Q8_1,
    /// 256-value blocks: f32 scale `d`, 256 × i8, 16 × i16 sums of each 16 values.
    Q8_K,
}

/// Instruction sets a kernel can be built for, in increasing order: each level includes every
/// feature of the levels below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL plus VNNI, on top of [`Isa::Avx2`].
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU supports ([`Isa::hardware`]), or [`Isa::Scalar`] when the
    /// environment variable `SIFT_FORCE_SCALAR` is set, or at most [`Isa::Avx2`] when
    /// `SIFT_FORCE_AVX2` is (to compare kernels on one machine; read once, cached). Kernel
    /// selection starts here.
    pub fn detect() -> Isa {
        use std::sync::OnceLock;
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            if std::env::var_os("SIFT_FORCE_SCALAR").is_some() {
                Isa::Scalar
            } else if std::env::var_os("SIFT_FORCE_AVX2").is_some() {
                Isa::hardware().min(Isa::Avx2)
            } else {
                Isa::hardware()
            }
        })
    }

    /// The best instruction set the CPU supports, whatever `SIFT_FORCE_SCALAR` says (detected
    /// once, cached). This is the one place sift asks the CPU for its features: everything else
    /// goes through [`Isa::detect`] or [`Isa::is_supported`].
    pub fn hardware() -> Isa {
        use std::sync::OnceLock;
        static HW: OnceLock<Isa> = OnceLock::new();
        *HW.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c");
                if avx2
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    return Isa::Avx512Vnni;
                }
                if avx2 {
                    return Isa::Avx2;
                }
            }
            Isa::Scalar
        })
    }

    /// Whether this CPU has every feature of `self` (`self <= Isa::hardware()`), whatever
    /// `SIFT_FORCE_SCALAR` says. A `#[target_feature]` function compiled for no more than `self`'s
    /// features may be called once this returned `true`: that is the safety argument of every
    /// such call in sift.
    pub fn is_supported(self) -> bool {
        self <= Isa::hardware()
    }

    /// The kernels [`Isa::detect`] leads to, named for records keyed by numerics (the engine's
    /// golden logits): the instruction set, and at AVX-512 VNNI whether the column kernels have
    /// VBMI and BITALG (without them they take the AVX2 kernels' 8-bit path: other bits).
    pub fn kernel_key() -> String {
        let isa = Isa::detect();
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx512Vnni && !crate::x86::exact_vnni::has_vnni_vbmi() {
            return format!("{isa:?}NoVbmi");
        }
        format!("{isa:?}")
    }

    /// Every instruction set this CPU can run, scalar first (for tests).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|i| *i <= best).collect()
    }
}

/// Dot product of one weight row (`n` values, raw block bytes) with one activation row quantized to
/// the weight type's [`WeightType::act_type`]. Safe: lengths are checked by the dispatcher.
pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;

/// Dot products of one weight row with four activation rows (four tokens), as [`DotFn`] does for
/// one: `dot4(n, w, [a0, a1, a2, a3])[k]` is bit for bit `dot(n, w, ak)` for the [`DotFn`] of the
/// same weight type and instruction set ([`WeightType::dot4_fn`] pairs with
/// [`WeightType::dot_fn`]), so a batch of tokens gives the same numbers as one token at a time.
/// The SIMD versions unpack each weight block once for the four tokens.
pub type Dot4Fn = fn(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4];

/// [`Dot4Fn`] over consecutive weight rows: `out[r] = dot4(n, &w[r * row_bytes..], a)` for every
/// `r < out.len()`, bit for bit. The SIMD versions of the formats with f16 block headers (Q4_0,
/// Q4_1, Q5_0, Q8_0) convert the four activation rows' headers to f32 once per call instead of
/// once per weight row, so a call should cover many rows (a matmul's row chunk).
///
/// # Panics
/// If `w` is shorter than `out.len()` rows of `n` values `row_bytes` apart, `row_bytes` is shorter
/// than one row, or an activation row is shorter than `n` values.
pub type Dot4RowsFn = fn(n: usize, w: &[u8], row_bytes: usize, a: [&[u8]; 4], out: &mut [[f32; 4]]);

impl WeightType {
    /// Maps a GGML type id (as stored in GGUF) to a weight type, if sift supports it.
    pub fn from_ggml_id(id: u32) -> Option<WeightType> {
        Some(match id {
            0 => WeightType::F32,
            1 => WeightType::F16,
            2 => WeightType::Q4_0,
            3 => WeightType::Q4_1,
            6 => WeightType::Q5_0,
            8 => WeightType::Q8_0,
            12 => WeightType::Q4_K,
            13 => WeightType::Q5_K,
            14 => WeightType::Q6_K,
            30 => WeightType::BF16,
            _ => return None,
        })
    }

    /// Every weight format.
    pub const ALL: [WeightType; 10] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ];

    /// The format named `name` (as [`Self::name`] spells it).
    pub fn from_name(name: &str) -> Option<WeightType> {
        WeightType::ALL.into_iter().find(|t| t.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::BF16 => "BF16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q4_K => "Q4_K",
            WeightType::Q5_K => "Q5_K",
            WeightType::Q6_K => "Q6_K",
        }
    }

    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => 1,
            WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q5_0 | WeightType::Q8_0 => 32,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            WeightType::Q4_0 => std::mem::size_of::<blocks::BlockQ4_0>(),
            WeightType::Q4_1 => std::mem::size_of::<blocks::BlockQ4_1>(),
            WeightType::Q5_0 => std::mem::size_of::<blocks::BlockQ5_0>(),
            WeightType::Q8_0 => std::mem::size_of::<blocks::BlockQ8_0>(),
            WeightType::Q4_K => std::mem::size_of::<blocks::BlockQ4K>(),
            WeightType::Q5_K => std::mem::size_of::<blocks::BlockQ5K>(),
            WeightType::Q6_K => std::mem::size_of::<blocks::BlockQ6K>(),
        }
    }

    /// Bytes of a row of `n` values, or `None` if `n` is not a whole number of blocks.
    pub const fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        Some(n / self.block_size() * self.block_bytes())
    }

    /// The activation format this weight type's integer dot product takes (llama.cpp's `vec_dot_type`).
    pub const fn act_type(self) -> ActType {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => ActType::F32,
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => ActType::Q8_0,
            WeightType::Q4_1 => ActType::Q8_1,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => ActType::Q8_K,
        }
    }

    /// The fastest dot kernel for this CPU.
    pub fn dot_fn(self) -> DotFn {
        self.dot_fn_for(Isa::detect()).unwrap_or_else(|| self.dot_fn_for(Isa::Scalar).expect("scalar kernel exists"))
    }

    /// The dot kernel for a given instruction set, if one exists and this CPU runs it.
    pub fn dot_fn_for(self, isa: Isa) -> Option<DotFn> {
        if isa > Isa::detect() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(scalar::dot_fn(self)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_dot_fn(self),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::avx512_dot_fn(self).or_else(|| x86::avx2_dot_fn(self)),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// The fastest four-token dot kernel for this CPU; per token bit-identical to [`Self::dot_fn`].
    pub fn dot4_fn(self) -> Dot4Fn {
        self.dot4_fn_for(Isa::detect()).unwrap_or_else(|| self.dot4_fn_for(Isa::Scalar).expect("scalar kernel exists"))
    }

    /// The four-token dot kernel for a given instruction set, if one exists and this CPU runs it;
    /// per token bit-identical to [`Self::dot_fn_for`] with the same `isa` (each SIMD single-row
    /// kernel has a four-token twin built from the same code; formats without one get four
    /// single-row calls).
    pub fn dot4_fn_for(self, isa: Isa) -> Option<Dot4Fn> {
        if isa > Isa::detect() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(scalar::dot4_fn(self)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_dot4_fn(self),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::avx512_dot4_fn(self).or_else(|| x86::avx2_dot4_fn(self)),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// The fastest multi-row four-token kernel for this CPU; per row and token bit-identical to
    /// [`Self::dot_fn`].
    pub fn dot4_rows_fn(self) -> Dot4RowsFn {
        self.dot4_rows_fn_for(Isa::detect())
            .unwrap_or_else(|| self.dot4_rows_fn_for(Isa::Scalar).expect("scalar kernel exists"))
    }

    /// The multi-row four-token kernel for a given instruction set, as [`Self::dot4_fn_for`].
    pub fn dot4_rows_fn_for(self, isa: Isa) -> Option<Dot4RowsFn> {
        if isa > Isa::detect() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(scalar::dot4_rows_fn(self)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_dot4_rows_fn(self),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::avx512_dot4_rows_fn(self).or_else(|| x86::avx2_dot4_rows_fn(self)),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// Dequantizes one row of `out.len()` values from raw block bytes.
    ///
    /// # Panics
    /// If `w` is shorter than [`WeightType::row_bytes`] of `out.len()` or `out.len()` is not a
    /// multiple of the block size (callers validate shapes when a model is loaded).
    pub fn dequantize_row(self, w: &[u8], out: &mut [f32]) {
        scalar::dequantize_row(self, w, out)
    }
}

impl ActType {
    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            ActType::F32 => 1,
            ActType::Q8_0 | ActType::Q8_1 => 32,
            ActType::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            ActType::F32 => 4,
            ActType::Q8_0 => std::mem::size_of::<blocks::BlockQ8_0>(),
            ActType::Q8_1 => std::mem::size_of::<blocks::BlockQ8_1>(),
            ActType::Q8_K => std::mem::size_of::<blocks::BlockQ8K>(),
        }
    }

    /// Bytes of a quantized activation row of `n` values (n must be a multiple of the block size).
    pub const fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }

    /// Quantizes an f32 activation row into `out` (`out.len() == self.row_bytes(x.len())`), using
    /// the fastest available kernel; matches [`scalar::quantize_act`] except where a value rounds on a tie.
    pub fn quantize(self, x: &[f32], out: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() >= Isa::Avx2 {
            return x86::quantize_act(self, x, out);
        }
        scalar::quantize_act(self, x, out)
    }
}
