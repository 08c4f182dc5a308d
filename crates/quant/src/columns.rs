//! Input-channel (column) sparse kernels: `y += W · x` reading only the columns of `W` whose
//! input `x[j]` is non-zero.
//!
//! # Layout
//!
//! A linear op `y = W x` (`W`: `O` output rows × `I` input columns) is stored transposed: column
//! `j` of `W` (its `O` values) is contiguous, quantized in 32-value blocks along the output
//! dimension with GGML's block structs ([`crate::blocks`]). A column is therefore exactly a row of
//! `Wᵀ` in that format, [`ColType::col_bytes`]`(O) = O / 32 · block_bytes` bytes, and column `c`
//! of the matrix starts at byte `c · col_bytes`. `O` must be a multiple of 32.
//!
//! # Kernels
//!
//! - [`AxpyColsFn`] (one token, decode): `y[k] += coef[i] · Wᵀ[active[i]][32·blocks.start + k]`
//!   for every `i` and every `k < 32 · blocks.len()`, i.e. the contribution of the selected columns
//!   to output blocks `blocks` (a thread's slice of the outputs). [`axpy_cols_fn`] picks the
//!   kernel: a scalar reference, AVX2 and AVX-512 (F/BW/VL) versions in [`crate::x86::columns`].
//! - [`axpy_cols_batch`] (many tokens, prefill / perplexity): dequantizes each used column's block
//!   range once per tile of tokens into an f32 scratch and adds it, scaled, to every token whose
//!   input is non-zero (tiles whose tokens share columns too little run the one-token kernel).
//!
//! # Numerics
//!
//! The scalar reference computes `y[k] += coef · w` with `w` the dequantized weight exactly as
//! [`WeightType::dequantize_row`] computes it (`d·q + m`, `d·(q − 16)`, `d·q`), one column at a
//! time in `active` order. The SIMD kernels compute the same sum with `coef·d` folded into one
//! FMA per value, Q4_1's `coef·m` summed over the columns separately, and several columns per pass
//! over `y`: they differ from the reference only by f32 rounding, tested to `10⁻⁵ · S` per output
//! where `S = |y₀| + Σ|coef·w|` — for Q4_1 `Σ|coef|·(|d·q| + |m|)`, since its two terms are
//! rounded separately and may cancel (`tests/columns.rs`). That is far below the error of the Q8
//! activation quantization the dense kernels use.
//!
//! # Errors
//!
//! The kernels are plain `fn`s without a result, so bad arguments panic, with the message of the
//! [`ColsError`] that [`check_axpy_cols`] / [`check_axpy_cols_batch`] return for them; callers
//! handling untrusted shapes can run those checks first. Every argument is checked before any
//! weight byte is read (an out-of-range column index is caught by one scan of `active` per call),
//! so no input makes a kernel read out of bounds.

use crate::blocks::{BlockQ4_1, BlockQ5_0, BlockQ8_0};
use crate::{scalar, Isa, WeightType};
use std::fmt;
use std::ops::Range;

/// A column storage format: the GGML block formats the column kernels read (32 values per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ColType {
    /// 20-byte blocks: f16 `d`, f16 `m`, 16 bytes of nibbles; `w = d·q + m`.
    Q4_1,
    /// 22-byte blocks: f16 `d`, 32 high bits, 16 bytes of nibbles; `w = d·(q − 16)`.
    Q5_0,
    /// 34-byte blocks: f16 `d`, 32 × i8; `w = d·q`.
    Q8_0,
}

/// `y += Σ_i coef[i] · column active[i]`, restricted to output blocks `blocks`:
/// `y[k] += coef[i] · Wᵀ[active[i]][32·blocks.start + k]` for every `i < active.len()` and
/// `k < 32·blocks.len()`.
///
/// - `cols`: the whole transposed matrix; column `c` is `cols[c·col_bytes..(c + 1)·col_bytes]`,
///   so the matrix has `cols.len() / col_bytes` columns.
/// - `col_bytes`: bytes per column, a non-zero multiple of the block size ([`ColType::col_bytes`]).
/// - `active`, `coef`: the columns to add and their factors (the non-zero inputs); any order,
///   repeats allowed; the same length.
/// - `blocks`: the 32-value output blocks to compute (`blocks.end ≤ col_bytes / block_bytes`).
/// - `y`: exactly `32 · blocks.len()` values, accumulated into.
///
/// # Panics
/// On any argument [`check_axpy_cols`] rejects, with its message. Nothing is read or written
/// before the checks pass.
pub type AxpyColsFn =
    fn(cols: &[u8], col_bytes: usize, active: &[u32], coef: &[f32], blocks: Range<usize>, y: &mut [f32]);

/// Why a column kernel's arguments were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColsError {
    /// `col_bytes` is zero or not a whole number of the format's blocks.
    ColBytes { ty: ColType, col_bytes: usize },
    /// `blocks` is reversed or reaches past the end of a column (`col_blocks` blocks).
    Blocks { start: usize, end: usize, col_blocks: usize },
    /// A column index is not below the number of columns.
    Index { index: u32, n_cols: usize },
    /// A slice or count has the wrong size.
    Len { what: &'static str, expected: usize, got: usize },
    /// A slice is shorter than it must be.
    TooShort { what: &'static str, need: usize, got: usize },
    /// A size computation overflowed `usize`.
    Overflow,
}

impl fmt::Display for ColsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColsError::ColBytes { ty, col_bytes } => write!(
                f,
                "column kernels: col_bytes {col_bytes} is not a non-zero multiple of the {} block size ({} bytes)",
                ty.name(),
                ty.block_bytes()
            ),
            ColsError::Blocks { start, end, col_blocks } => {
                write!(f, "column kernels: output blocks {start}..{end} are not within a column of {col_blocks} blocks")
            }
            ColsError::Index { index, n_cols } => {
                write!(f, "column kernels: column index {index} out of range (the matrix has {n_cols} columns)")
            }
            ColsError::Len { what, expected, got } => {
                write!(f, "column kernels: {what} has length {got}, expected {expected}")
            }
            ColsError::TooShort { what, need, got } => {
                write!(f, "column kernels: {what} has length {got}, need at least {need}")
            }
            ColsError::Overflow => write!(f, "column kernels: size overflows usize"),
        }
    }
}

impl std::error::Error for ColsError {}

impl ColType {
    /// Every column format.
    pub const ALL: [ColType; 3] = [ColType::Q4_1, ColType::Q5_0, ColType::Q8_0];

    /// Values per block (always 32).
    pub const BLOCK: usize = 32;

    /// Bytes per 32-value block.
    pub const fn block_bytes(self) -> usize {
        match self {
            ColType::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
            ColType::Q5_0 => std::mem::size_of::<BlockQ5_0>(),
            ColType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
        }
    }

    /// Bytes of one column of `o` values (`o / 32` blocks).
    ///
    /// # Panics
    /// If `o` is not a multiple of 32.
    pub const fn col_bytes(self, o: usize) -> usize {
        assert!(o.is_multiple_of(32), "a column's length must be a multiple of 32 values");
        o / 32 * self.block_bytes()
    }

    /// The GGML name (`"Q4_1"`, `"Q5_0"`, `"Q8_0"`).
    pub const fn name(self) -> &'static str {
        match self {
            ColType::Q4_1 => "Q4_1",
            ColType::Q5_0 => "Q5_0",
            ColType::Q8_0 => "Q8_0",
        }
    }

    /// The format named `name` (as [`Self::name`] spells it, ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<ColType> {
        ColType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The same block format as a [`WeightType`].
    pub const fn weight_type(self) -> WeightType {
        match self {
            ColType::Q4_1 => WeightType::Q4_1,
            ColType::Q5_0 => WeightType::Q5_0,
            ColType::Q8_0 => WeightType::Q8_0,
        }
    }

    /// The column format with the same block format as `t`, if it is one.
    pub const fn from_weight_type(t: WeightType) -> Option<ColType> {
        match t {
            WeightType::Q4_1 => Some(ColType::Q4_1),
            WeightType::Q5_0 => Some(ColType::Q5_0),
            WeightType::Q8_0 => Some(ColType::Q8_0),
            _ => None,
        }
    }

    /// Quantizes one column (`src`: its `O` f32 values) into `dst` with GGML's reference
    /// quantizers (`quantize_row_q4_1_ref`, `quantize_row_q5_0_ref`, `quantize_row_q8_0_ref`:
    /// the same bytes; these are [`scalar`]'s quantizers, shared with the row formats).
    ///
    /// # Panics
    /// If `src.len()` is not a multiple of 32 or `dst.len() != self.col_bytes(src.len())`.
    pub fn quantize_col(self, src: &[f32], dst: &mut [u8]) {
        assert!(src.len().is_multiple_of(32), "quantize_col: {} values is not a whole number of blocks", src.len());
        let need = self.col_bytes(src.len());
        assert_eq!(dst.len(), need, "quantize_col: {} column of {} values is {need} bytes", self.name(), src.len());
        match self {
            ColType::Q4_1 => scalar::quantize_q4_1(src, dst),
            ColType::Q5_0 => scalar::quantize_q5_0(src, dst),
            ColType::Q8_0 => scalar::quantize_q8_0(src, dst),
        }
    }

    /// Dequantizes one column of `dst.len()` values from `src` (at least
    /// [`Self::col_bytes`]`(dst.len())` bytes), as [`WeightType::dequantize_row`].
    ///
    /// # Panics
    /// If `dst.len()` is not a multiple of 32 or `src` is too short.
    pub fn dequantize_col(self, src: &[u8], dst: &mut [f32]) {
        scalar::dequantize_row(self.weight_type(), src, dst)
    }

    /// The fastest [`AxpyColsFn`] for this format on this CPU ([`axpy_cols_fn`] with
    /// [`Isa::detect`]).
    pub fn axpy_fn(self) -> AxpyColsFn {
        axpy_cols_fn(self, Isa::detect())
    }
}

/// The column kernel for `ty`: the fastest one at or below `isa` that this CPU runs (`isa` is
/// clamped to [`Isa::detect`], so `SIFT_FORCE_SCALAR` selects the scalar reference; asking for
/// [`Isa::Scalar`] always gives it). The AVX-512 kernel needs only AVX-512 F/BW/VL, but is chosen
/// at [`Isa::Avx512Vnni`] (the level [`Isa::detect`] reports for AVX-512 CPUs).
pub fn axpy_cols_fn(ty: ColType, isa: Isa) -> AxpyColsFn {
    let isa = isa.min(Isa::detect());
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512Vnni {
            if let Some(f) = crate::x86::columns::avx512_axpy_fn(ty) {
                return f;
            }
        }
        if isa >= Isa::Avx2 {
            if let Some(f) = crate::x86::columns::avx2_axpy_fn(ty) {
                return f;
            }
        }
    }
    match ty {
        ColType::Q4_1 => axpy_scalar_q4_1,
        ColType::Q5_0 => axpy_scalar_q5_0,
        ColType::Q8_0 => axpy_scalar_q8_0,
    }
}

/// Checks the arguments of an [`AxpyColsFn`] for format `ty` (see there); returns the number of
/// columns in `cols`.
pub fn check_axpy_cols(
    ty: ColType,
    cols: &[u8],
    col_bytes: usize,
    active: &[u32],
    coef: &[f32],
    blocks: &Range<usize>,
    y_len: usize,
) -> Result<usize, ColsError> {
    let bb = ty.block_bytes();
    if col_bytes == 0 || !col_bytes.is_multiple_of(bb) {
        return Err(ColsError::ColBytes { ty, col_bytes });
    }
    let col_blocks = col_bytes / bb;
    if blocks.start > blocks.end || blocks.end > col_blocks {
        return Err(ColsError::Blocks { start: blocks.start, end: blocks.end, col_blocks });
    }
    if coef.len() != active.len() {
        return Err(ColsError::Len { what: "coef", expected: active.len(), got: coef.len() });
    }
    if y_len != 32 * blocks.len() {
        return Err(ColsError::Len { what: "y", expected: 32 * blocks.len(), got: y_len });
    }
    let n_cols = cols.len() / col_bytes;
    if let Some(&index) = active.iter().max() {
        if index as usize >= n_cols {
            return Err(ColsError::Index { index, n_cols });
        }
    }
    Ok(n_cols)
}

/// [`check_axpy_cols`], panicking with its message.
#[inline]
pub(crate) fn assert_axpy_cols(
    ty: ColType,
    cols: &[u8],
    col_bytes: usize,
    active: &[u32],
    coef: &[f32],
    blocks: &Range<usize>,
    y_len: usize,
) {
    if let Err(e) = check_axpy_cols(ty, cols, col_bytes, active, coef, blocks, y_len) {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar reference
// ---------------------------------------------------------------------------------------------

/// The scalar kernels: for each column in `active` order, `y[k] += coef · w[k]` with `w` the
/// dequantized block value (the f32 expression of [`scalar::dequantize_row`]). `$deq(block, out)`
/// dequantizes one block into 32 values.
macro_rules! scalar_axpy {
    ($name:ident, $ty:expr, $block:ty, |$b:ident, $w:ident| $deq:block) => {
        fn $name(cols: &[u8], col_bytes: usize, active: &[u32], coef: &[f32], blocks: Range<usize>, y: &mut [f32]) {
            assert_axpy_cols($ty, cols, col_bytes, active, coef, &blocks, y.len());
            let bb = $ty.block_bytes();
            for (&c, &a) in active.iter().zip(coef) {
                let col = &cols[c as usize * col_bytes..][..col_bytes];
                let col = &col[blocks.start * bb..blocks.end * bb];
                let mut $w = [0f32; 32];
                for ($b, yb) in scalar::blocks::<$block>(col, blocks.len()).iter().zip(y.chunks_exact_mut(32)) {
                    $deq
                    for (y, w) in yb.iter_mut().zip(&$w) {
                        *y += a * w;
                    }
                }
            }
        }
    };
}

scalar_axpy!(axpy_scalar_q4_1, ColType::Q4_1, BlockQ4_1, |b, w| {
    let (d, m) = (b.d(), b.m());
    for j in 0..16 {
        w[j] = (b.qs[j] & 0xF) as f32 * d + m;
        w[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
    }
});

scalar_axpy!(axpy_scalar_q5_0, ColType::Q5_0, BlockQ5_0, |b, w| {
    let (d, qh) = (b.d(), b.qh());
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        w[j] = (((b.qs[j] & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
        w[j + 16] = (((b.qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
});

scalar_axpy!(axpy_scalar_q8_0, ColType::Q8_0, BlockQ8_0, |b, w| {
    let d = b.d();
    for (w, &q) in w.iter_mut().zip(&b.qs) {
        *w = q as f32 * d;
    }
});

// ---------------------------------------------------------------------------------------------
// Many tokens
// ---------------------------------------------------------------------------------------------

/// A transposed quantized matrix as the column kernels read it: `n_cols` columns (one per input)
/// of `col_bytes` bytes each, column `c` at `data[c · col_bytes..]`.
#[derive(Clone, Copy, Debug)]
pub struct ColMatrix<'a> {
    pub ty: ColType,
    pub data: &'a [u8],
    pub col_bytes: usize,
    pub n_cols: usize,
}

impl<'a> ColMatrix<'a> {
    /// Views `data` as the transposed form of an `n_out × n_in` matrix (`n_in` columns of `n_out`
    /// values). `data` must be exactly `n_in · col_bytes(n_out)` bytes and `n_out` a multiple of 32.
    pub fn new(ty: ColType, data: &'a [u8], n_out: usize, n_in: usize) -> Result<Self, ColsError> {
        if !n_out.is_multiple_of(32) {
            return Err(ColsError::Len { what: "n_out (a multiple of 32)", expected: n_out / 32 * 32, got: n_out });
        }
        let col_bytes = ty.col_bytes(n_out);
        let need = col_bytes.checked_mul(n_in).ok_or(ColsError::Overflow)?;
        if data.len() != need {
            return Err(ColsError::Len { what: "matrix data", expected: need, got: data.len() });
        }
        Ok(ColMatrix { ty, data, col_bytes, n_cols: n_in })
    }
}

/// Checks the arguments of [`axpy_cols_batch`] (see there).
pub fn check_axpy_cols_batch(
    m: &ColMatrix<'_>,
    x: &[f32],
    n_tok: usize,
    blocks: &Range<usize>,
    y_len: usize,
    y_stride: usize,
) -> Result<(), ColsError> {
    let bb = m.ty.block_bytes();
    if m.col_bytes == 0 || !m.col_bytes.is_multiple_of(bb) {
        return Err(ColsError::ColBytes { ty: m.ty, col_bytes: m.col_bytes });
    }
    let need = m.col_bytes.checked_mul(m.n_cols).ok_or(ColsError::Overflow)?;
    if m.data.len() < need {
        return Err(ColsError::TooShort { what: "matrix data", need, got: m.data.len() });
    }
    let col_blocks = m.col_bytes / bb;
    if blocks.start > blocks.end || blocks.end > col_blocks {
        return Err(ColsError::Blocks { start: blocks.start, end: blocks.end, col_blocks });
    }
    let nx = m.n_cols.checked_mul(n_tok).ok_or(ColsError::Overflow)?;
    if x.len() != nx {
        return Err(ColsError::Len { what: "x (n_tok · n_cols)", expected: nx, got: x.len() });
    }
    let width = 32 * blocks.len();
    if n_tok > 1 && y_stride < width {
        return Err(ColsError::TooShort { what: "y_stride", need: width, got: y_stride });
    }
    if n_tok > 0 {
        let need = y_stride.checked_mul(n_tok - 1).and_then(|v| v.checked_add(width)).ok_or(ColsError::Overflow)?;
        if y_len < need {
            return Err(ColsError::TooShort { what: "y", need, got: y_len });
        }
    }
    Ok(())
}

/// Output blocks per pass of [`axpy_cols_batch`] (a token adds each of its terms to these
/// `32·BATCH_BLOCKS` outputs, held in registers).
const BATCH_BLOCKS: usize = 4;
/// Columns dequantized per group in [`axpy_cols_batch`] (their scratch, `BATCH_COLS ×
/// BATCH_BLOCKS` blocks of f32, is 32 KiB).
const BATCH_COLS: usize = 64;
/// Tokens per tile of [`axpy_cols_batch`] (their outputs of one pass are 32 KiB; 32 to 256 tokens
/// per tile and 32 or 64 columns per group measured within noise of each other).
const BATCH_TOKENS: usize = 64;
/// Below this many non-zero inputs per used column in a tile, [`axpy_cols_batch`] runs the
/// one-token kernel per token instead (sharing a dequantized column between fewer tokens does not
/// pay for dequantizing it and the per-group overhead; on the development machine the shared path
/// was ~1.1× faster at 32 inputs per column and ~1.5× slower at 3).
const BATCH_MIN_SHARE: usize = 16;

/// Many tokens at once (prefill, perplexity): for every token `t < n_tok` and `k < 32·blocks.len()`,
/// `y[t·y_stride + k] += Σ_c x[t·n_cols + c] · Wᵀ[c][32·blocks.start + k]`, skipping the zero
/// terms.
///
/// `x` is row-major, `n_tok` rows of `m.n_cols` inputs; `y` holds `n_tok` rows of
/// `32·blocks.len()` outputs, `y_stride` apart (the last row needs only its outputs), accumulated
/// into. `isa` as for [`axpy_cols_fn`].
///
/// How: tokens are taken 64 (`BATCH_TOKENS`) at a time. For a tile, the non-zero inputs are listed
/// per token; then, 4 (`BATCH_BLOCKS`) output blocks at a time, the columns the tile uses (the
/// others are never read) are dequantized 64 (`BATCH_COLS`) at a time into an f32 scratch — once
/// for all the tile's tokens — and each token adds `x · column` for its non-zero inputs among
/// them (f32 FMAs, its outputs in registers across its terms): an FMA and a load per 16 values
/// and term instead of the one-token kernel's unpacking. Where the tile's tokens share columns
/// too little for that to pay (fewer than 16 (`BATCH_MIN_SHARE`) non-zero inputs per used column),
/// the tile runs the one-token [`AxpyColsFn`] per token instead. Either way weights are read in
/// short pieces, not at dense speed: for nearly dense inputs the dense multi-token kernels are
/// faster.
///
/// Numerically the shared path adds `x · w` with `w` the dequantized weight exactly as
/// [`ColType::dequantize_col`] gives it (as the scalar [`AxpyColsFn`] does; only the order of the
/// f32 additions differs); the per-token path is the [`AxpyColsFn`] of `isa`.
///
/// # Panics
/// On any argument [`check_axpy_cols_batch`] rejects, with its message.
pub fn axpy_cols_batch(
    m: &ColMatrix<'_>,
    x: &[f32],
    n_tok: usize,
    blocks: Range<usize>,
    y: &mut [f32],
    y_stride: usize,
    isa: Isa,
) {
    if let Err(e) = check_axpy_cols_batch(m, x, n_tok, &blocks, y.len(), y_stride) {
        panic!("{e}");
    }
    let n_cols = m.n_cols;
    if n_tok == 0 || blocks.is_empty() || n_cols == 0 {
        return;
    }
    let k = BatchKernels { deq: dequant_fn(m.ty, isa), madd: madd_fn(isa), axpy: axpy_cols_fn(m.ty, isa) };
    let mut t0 = 0;
    while t0 < n_tok {
        let nt = BATCH_TOKENS.min(n_tok - t0);
        let y_tile = &mut y[t0 * y_stride..];
        batch_tile(m, &x[t0 * n_cols..(t0 + nt) * n_cols], nt, &blocks, y_tile, y_stride, &k);
        t0 += nt;
    }
}

struct BatchKernels {
    deq: DeqFn,
    madd: MaddFn,
    axpy: AxpyColsFn,
}

/// [`axpy_cols_batch`] for one tile of `n_tok` tokens (arguments checked by the caller).
fn batch_tile(
    m: &ColMatrix<'_>,
    x: &[f32],
    n_tok: usize,
    blocks: &Range<usize>,
    y: &mut [f32],
    y_stride: usize,
    k: &BatchKernels,
) {
    let n_cols = m.n_cols;
    let width = 32 * blocks.len();
    // The non-zero inputs of each token (columns ascending; compacted without branches, as
    // inputs are zero at random), and which columns any token uses.
    let mut nz: Vec<(u32, f32)> = Vec::new();
    let mut row_start = Vec::with_capacity(n_tok + 1);
    let mut row = vec![(0u32, 0f32); n_cols];
    let mut used_flag = vec![false; n_cols];
    for xr in x.chunks_exact(n_cols).take(n_tok) {
        let mut n = 0;
        for (c, &v) in xr.iter().enumerate() {
            row[n] = (c as u32, v);
            n += (v != 0.0) as usize;
            used_flag[c] |= v != 0.0;
        }
        row_start.push(nz.len());
        nz.extend_from_slice(&row[..n]);
    }
    row_start.push(nz.len());
    // Used columns in order; column `used[i]` is slot `i % BATCH_COLS` of group `i / BATCH_COLS`.
    let mut index_of = vec![0u32; n_cols];
    let mut used = Vec::new();
    for (c, &u) in used_flag.iter().enumerate() {
        if u {
            index_of[c] = used.len() as u32;
            used.push(c as u32);
        }
    }
    if used.is_empty() {
        return;
    }
    if nz.len() < BATCH_MIN_SHARE * used.len() {
        let mut active = Vec::new();
        let mut coef = Vec::new();
        for t in 0..n_tok {
            let r = &nz[row_start[t]..row_start[t + 1]];
            active.clear();
            coef.clear();
            active.extend(r.iter().map(|e| e.0));
            coef.extend(r.iter().map(|e| e.1));
            (k.axpy)(m.data, m.col_bytes, &active, &coef, blocks.clone(), &mut y[t * y_stride..][..width]);
        }
        return;
    }
    let n_groups = used.len().div_ceil(BATCH_COLS);
    // Each token's terms as (input, slot in its group), and where each group's terms start: the
    // terms of token `t` in group `g` are `terms[seg[t·(n_groups + 1) + g]..seg[.. + g + 1]]`.
    let terms: Vec<(f32, usize)> = nz.iter().map(|&(c, v)| (v, index_of[c as usize] as usize % BATCH_COLS)).collect();
    let mut seg = Vec::with_capacity(n_tok * (n_groups + 1));
    for t in 0..n_tok {
        let mut p = row_start[t];
        for g in 0..=n_groups {
            while p < row_start[t + 1] && (index_of[nz[p].0 as usize] as usize) < g * BATCH_COLS {
                p += 1;
            }
            seg.push(p);
        }
    }
    let (bb, cb) = (m.ty.block_bytes(), m.col_bytes);
    let mut scratch = vec![0f32; BATCH_COLS * 32 * BATCH_BLOCKS];
    let mut b0 = blocks.start;
    while b0 < blocks.end {
        let b1 = (b0 + BATCH_BLOCKS).min(blocks.end);
        let w = 32 * (b1 - b0);
        let yoff = 32 * (b0 - blocks.start);
        for (g, group) in used.chunks(BATCH_COLS).enumerate() {
            for (slot, &c) in group.iter().enumerate() {
                let col = &m.data[c as usize * cb..][b0 * bb..b1 * bb];
                (k.deq)(col, &mut scratch[slot * w..(slot + 1) * w]);
            }
            for t in 0..n_tok {
                let sg = &seg[t * (n_groups + 1) + g..];
                if sg[1] > sg[0] {
                    let yt = &mut y[t * y_stride + yoff..][..w];
                    (k.madd)(yt, &scratch[..group.len() * w], w, &terms[sg[0]..sg[1]]);
                }
            }
        }
        b0 = b1;
    }
}

/// Dequantizes the whole blocks of `src` into `dst` (`dst.len()` a multiple of 32, `src` at least
/// `dst.len() / 32` blocks), bit for bit as [`ColType::dequantize_col`].
pub(crate) type DeqFn = fn(src: &[u8], dst: &mut [f32]);

fn dequant_fn(ty: ColType, isa: Isa) -> DeqFn {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = crate::x86::columns::dequant_fn(ty, isa.min(Isa::detect())) {
        return f;
    }
    let _ = isa;
    match ty {
        ColType::Q4_1 => scalar::dequantize_q4_1,
        ColType::Q5_0 => scalar::dequantize_q5_0,
        ColType::Q8_0 => scalar::dequantize_q8_0,
    }
}

/// `y += Σ (a, g) in terms: a · s[g·w..(g + 1)·w]` (`y.len() == w`, a multiple of 32, and every
/// `g·w + w ≤ s.len()`).
pub(crate) type MaddFn = fn(y: &mut [f32], s: &[f32], w: usize, terms: &[(f32, usize)]);

fn madd_fn(isa: Isa) -> MaddFn {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = crate::x86::columns::madd_fn(isa.min(Isa::detect())) {
        return f;
    }
    let _ = isa;
    madd_scalar
}

/// Checks a [`MaddFn`]'s arguments.
#[inline]
pub(crate) fn check_madd(y: &[f32], s: &[f32], w: usize, terms: &[(f32, usize)]) {
    assert!(y.len() == w && w.is_multiple_of(32), "madd: y length {} for width {w}", y.len());
    for &(_, g) in terms {
        assert!(g < s.len() / w.max(1), "madd: scratch column {g} out of range");
    }
}

fn madd_scalar(y: &mut [f32], s: &[f32], w: usize, terms: &[(f32, usize)]) {
    check_madd(y, s, w, terms);
    for &(a, g) in terms {
        for (y, &s) in y.iter_mut().zip(&s[g * w..(g + 1) * w]) {
            *y += a * s;
        }
    }
}
