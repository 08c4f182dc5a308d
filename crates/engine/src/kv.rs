//! The KV cache: keys and values of every layer, stored as llama.cpp stores them.
//!
//! `-ctk` / `-ctv` (`--cache-type-k` / `--cache-type-v`) choose the storage type of K and V,
//! with llama.cpp's names: `f16` (the default, as in llama.cpp), `f32` and `q8_0` (blocks of 32
//! values with one f16 scale; a row's head must be a whole number of blocks). Attention
//! ([`crate::attention`]) reads them a tile at a time, converted to f32 ([`load_tile`]):
//! - K `f16`: q is rounded to f16 and K·q runs on the f16 values (in f32 arithmetic, exact
//!   conversion); V `f16`: the softmax weights are rounded to f16 before they weight the values.
//! - `q8_0`: rows are dequantized into f32.
//! - `f32`: no rounding at all (a reference, at twice the memory of f16).
//!
//! The cache is paged: [`KV_PAGE`] positions at a time are allocated as the sequence grows (up to
//! the context size), each costing [`KvType::row_bytes`] per position, K and V each, per layer
//! ([`KvCache::bytes`]); a new conversation returns every page but the first. Under a memory
//! budget the engine accounts each new page with the tiered store, whose weight cache gives the
//! room up (and takes it back when the pages are returned).

use crate::attention::TILE_K;
use half::f16;
use sift_model::Config;
use sift_quant::{ActType, WeightType};
use std::ops::Range;

/// Storage type of the K or V cache (llama.cpp's `--cache-type-k` / `--cache-type-v` values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    #[default]
    F16,
    Q8_0,
}

/// Values per Q8_0 block and bytes per block (f16 scale + 32 × i8).
const Q8_0_BLOCK: usize = 32;
const Q8_0_BYTES: usize = 34;

impl KvType {
    /// Parses llama.cpp's names (`f32`, `f16`, `q8_0`; case-insensitive). The other types
    /// llama.cpp offers are named in the error.
    pub fn parse(s: &str) -> Result<KvType, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other @ ("bf16" | "q4_0" | "q4_1" | "iq4_nl" | "q5_0" | "q5_1") => {
                Err(format!("KV cache type '{other}' is not supported by sift yet; use f16 (default), q8_0 or f32"))
            }
            other => Err(format!("unknown KV cache type '{other}': use f16 (default), q8_0 or f32")),
        }
    }

    /// The name [`KvType::parse`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of `n` values (for `q8_0`, `n` is a multiple of 32).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n / Q8_0_BLOCK * Q8_0_BYTES,
        }
    }

    /// Whether this type can store heads of `head_dim` values (`q8_0`: whole blocks of 32).
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), String> {
        if self == KvType::Q8_0 && !head_dim.is_multiple_of(Q8_0_BLOCK) {
            return Err(format!(
                "KV cache type q8_0 needs a head size that is a multiple of 32; this model's is {head_dim}: use f16"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes of a KV cache holding `positions` positions (K and V, every layer) of a model `c`,
/// rounded up to whole pages of [`KV_PAGE`] positions.
pub fn cache_bytes(c: &Config, positions: usize, k_type: KvType, v_type: KvType) -> u64 {
    let kv = c.n_embd_kv();
    let pages = positions.div_ceil(KV_PAGE) as u64;
    c.n_layer as u64 * pages * KV_PAGE as u64 * (k_type.row_bytes(kv) + v_type.row_bytes(kv)) as u64
}

/// Positions per page of the KV cache: it is allocated (and, under a budget, accounted) a page at
/// a time as the sequence grows, and pages past a new conversation's first are returned.
pub const KV_PAGE: usize = 256;

/// One layer's K or V rows, `[pos][kv_head * head_dim]`, in the cache's storage type, as pages
/// of [`KV_PAGE`] positions.
pub(crate) enum KvRows {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
    /// Q8_0 blocks, `row_bytes(kv_dim)` bytes per position.
    Q8_0(Vec<Vec<u8>>),
}

/// Position `p`'s row of `width` elements in `pages`.
#[inline]
fn row<T>(pages: &[Vec<T>], p: usize, width: usize) -> &[T] {
    let at = (p % KV_PAGE) * width;
    &pages[p / KV_PAGE][at..at + width]
}

#[inline]
fn row_mut<T>(pages: &mut [Vec<T>], p: usize, width: usize) -> &mut [T] {
    let at = (p % KV_PAGE) * width;
    &mut pages[p / KV_PAGE][at..at + width]
}

impl KvRows {
    fn new(t: KvType) -> KvRows {
        match t {
            KvType::F32 => KvRows::F32(Vec::new()),
            KvType::F16 => KvRows::F16(Vec::new()),
            KvType::Q8_0 => KvRows::Q8_0(Vec::new()),
        }
    }

    /// Keeps exactly `pages` pages (new ones zeroed; dropped ones returned to the allocator).
    fn set_pages(&mut self, pages: usize, kv_dim: usize) {
        fn resize<T: Clone>(v: &mut Vec<Vec<T>>, pages: usize, len: usize, zero: T) {
            v.truncate(pages);
            v.shrink_to(pages);
            while v.len() < pages {
                v.push(vec![zero.clone(); len]);
            }
        }
        match self {
            KvRows::F32(v) => resize(v, pages, KV_PAGE * kv_dim, 0.0),
            KvRows::F16(v) => resize(v, pages, KV_PAGE * kv_dim, f16::ZERO),
            KvRows::Q8_0(v) => resize(v, pages, KV_PAGE * KvType::Q8_0.row_bytes(kv_dim), 0),
        }
    }

    /// Stores `rows` (whole positions of `kv_dim` values) from position `pos0` on.
    fn store(&mut self, pos0: usize, kv_dim: usize, rows: &[f32]) {
        for (i, r) in rows.chunks_exact(kv_dim).enumerate() {
            let p = pos0 + i;
            match self {
                KvRows::F32(b) => row_mut(b, p, kv_dim).copy_from_slice(r),
                KvRows::F16(b) => {
                    use half::slice::HalfFloatSliceExt;
                    row_mut(b, p, kv_dim).convert_from_f32_slice(r);
                }
                KvRows::Q8_0(b) => ActType::Q8_0.quantize(r, row_mut(b, p, KvType::Q8_0.row_bytes(kv_dim))),
            }
        }
    }
}

/// Keys and values of every layer, allocated a page of [`KV_PAGE`] positions at a time up to the
/// context size.
pub(crate) struct KvCache {
    pub k: Vec<KvRows>,
    pub v: Vec<KvRows>,
    pub k_type: KvType,
    pub v_type: KvType,
    kv_dim: usize,
    /// Pages allocated per layer.
    pages: usize,
}

impl KvCache {
    /// An empty cache (no page allocated yet).
    pub fn new(c: &Config, k_type: KvType, v_type: KvType) -> KvCache {
        KvCache {
            k: (0..c.n_layer).map(|_| KvRows::new(k_type)).collect(),
            v: (0..c.n_layer).map(|_| KvRows::new(v_type)).collect(),
            k_type,
            v_type,
            kv_dim: c.n_embd_kv(),
            pages: 0,
        }
    }

    /// Bytes of `positions` positions (K and V, every layer) for `c`, rounded up to whole pages.
    pub fn bytes(c: &Config, positions: usize, k_type: KvType, v_type: KvType) -> u64 {
        cache_bytes(c, positions, k_type, v_type)
    }

    /// Positions the allocated pages hold.
    pub fn capacity(&self) -> usize {
        self.pages * KV_PAGE
    }

    /// Allocates or returns pages so that exactly `positions` positions (rounded up to pages) fit.
    pub fn set_capacity(&mut self, positions: usize) {
        let pages = positions.div_ceil(KV_PAGE);
        if pages != self.pages {
            for r in self.k.iter_mut().chain(self.v.iter_mut()) {
                r.set_pages(pages, self.kv_dim);
            }
            self.pages = pages;
        }
    }

    /// Appends layer `l`'s keys and values of positions `pos0..` (whole rows; they must fit the
    /// capacity).
    pub fn store(&mut self, l: usize, pos0: usize, k: &[f32], v: &[f32]) {
        self.k[l].store(pos0, self.kv_dim, k);
        self.v[l].store(pos0, self.kv_dim, v);
    }
}

/// Positions `p0..p0 + n` of `rows`, values `head` of each, converted to f32 into a tile of
/// [`TILE_K`] positions: transposed (`out[d · TILE_K + j]`, keys for the score kernel) or by row
/// (`out[j · head.len() + d]`, values). The positions must lie in one page (tiles start at multiples
/// of [`TILE_K`], which divides [`KV_PAGE`]). `tmp`: one row's scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_tile(
    rows: &KvRows,
    kv_dim: usize,
    head: Range<usize>,
    p0: usize,
    n: usize,
    transposed: bool,
    out: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    debug_assert!(n <= TILE_K && p0 % KV_PAGE + n <= KV_PAGE);
    let hd = head.len();
    tmp.resize(hd, 0.0);
    #[cfg(target_arch = "x86_64")]
    if let KvRows::F16(b) = rows {
        // The next tile's rows of this head, one tile ahead (in the same page): the rows of a
        // head are strided by the whole KV width, which the hardware prefetchers follow poorly.
        let next = p0 + TILE_K;
        if !next.is_multiple_of(KV_PAGE) && next + TILE_K <= p0 - p0 % KV_PAGE + KV_PAGE {
            let page = &b[p0 / KV_PAGE];
            for j in 0..TILE_K {
                let at = ((next + j) % KV_PAGE) * kv_dim + head.start;
                for line in (0..hd).step_by(32) {
                    if let Some(v) = page.get(at + line) {
                        // SAFETY: a prefetch hint of an address inside the page.
                        unsafe {
                            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                                (v as *const f16).cast(),
                            )
                        };
                    }
                }
            }
        }
    }
    let mut j0 = 0;
    #[cfg(target_arch = "x86_64")]
    if let (KvRows::F16(b), true, true) = (rows, transposed, hd.is_multiple_of(8)) {
        if sift_quant::Isa::detect() >= sift_quant::Isa::Avx2 {
            // Whole groups of 8 keys through the SIMD transpose; the rest below.
            while j0 + 8 <= n {
                let src: [&[f16]; 8] = std::array::from_fn(|r| &row(b, p0 + j0 + r, kv_dim)[head.clone()]);
                // SAFETY: AVX2 and F16C are part of `Isa::Avx2`, which `Isa::detect` reports only
                // where the CPU has them.
                unsafe { x86::transpose_f16_8(src, j0, out) };
                j0 += 8;
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let (KvRows::F16(b), false, true) = (rows, transposed, hd.is_multiple_of(8)) {
        if sift_quant::Isa::detect() >= sift_quant::Isa::Avx2 {
            // Value rows converted straight into the tile, 8 at a time.
            for j in 0..n {
                // SAFETY: as above.
                unsafe { x86::convert_f16(&row(b, p0 + j, kv_dim)[head.clone()], &mut out[j * hd..(j + 1) * hd]) };
            }
            return;
        }
    }
    for j in j0..n {
        let p = p0 + j;
        let src: &[f32] = match rows {
            KvRows::F32(b) => &row(b, p, kv_dim)[head.clone()],
            KvRows::F16(b) => {
                use half::slice::HalfFloatSliceExt;
                row(b, p, kv_dim)[head.clone()].convert_to_f32_slice(tmp);
                tmp
            }
            KvRows::Q8_0(b) => {
                let rb = KvType::Q8_0.row_bytes(kv_dim);
                WeightType::Q8_0.dequantize_row(&row(b, p, rb)[q8_0_span(&head)], tmp);
                tmp
            }
        };
        if transposed {
            for (d, &v) in src.iter().enumerate() {
                out[d * TILE_K + j] = v;
            }
        } else {
            out[j * hd..(j + 1) * hd].copy_from_slice(src);
        }
    }
}

/// The F16C transposed tile load.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TILE_K;
    use half::f16;
    use std::arch::x86_64::*;

    /// `dst = src` converted to f32 (equal lengths, a multiple of 8), exactly.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn convert_f16(src: &[f16], dst: &mut [f32]) {
        assert!(src.len() == dst.len() && src.len().is_multiple_of(8));
        for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
            // SAFETY: `s` is 8 f16 (16 bytes) and `d` 8 f32: an unaligned load and store within them.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))) };
        }
    }

    /// Keys `j0..j0 + 8` of a transposed tile from their f16 rows `src` (equal lengths, a multiple
    /// of 8): `out[d · TILE_K + j0 + r] = src[r][d]`, converted exactly, in 8 × 8 blocks transposed
    /// in registers.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn transpose_f16_8(src: [&[f16]; 8], j0: usize, out: &mut [f32]) {
        let hd = src[0].len();
        assert!(src.iter().all(|s| s.len() == hd) && hd.is_multiple_of(8) && j0 + 8 <= TILE_K);
        assert!(out.len() >= hd * TILE_K);
        for d0 in (0..hd).step_by(8) {
            // SAFETY: d0 + 8 <= hd = each row's length: every 8-value (16-byte) load is inside
            // its row (unaligned loads; f16 is a 2-byte `repr(transparent)` u16).
            let r: [__m256; 8] =
                std::array::from_fn(|k| _mm256_cvtph_ps(unsafe { _mm_loadu_si128(src[k].as_ptr().add(d0).cast()) }));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (i, c) in cols.iter().enumerate() {
                let at = (d0 + i) * TILE_K + j0;
                let dst = &mut out[at..at + 8];
                // SAFETY: `dst` is exactly the 8 f32 stored (unaligned store).
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), *c) };
            }
        }
    }
}

/// Byte range of the values `head` inside a q8_0 row.
fn q8_0_span(head: &Range<usize>) -> Range<usize> {
    head.start / Q8_0_BLOCK * Q8_0_BYTES..head.end / Q8_0_BLOCK * Q8_0_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transposed f16 tile (the SIMD 8 × 8 transpose where the CPU has it, the scalar loop for
    /// the keys past the last group of 8) and a value tile (F16C conversion) hold exactly the
    /// stored values, at every tile length, page offset and head.
    #[test]
    fn transposed_f16_tiles_hold_the_stored_values() {
        let (kv_dim, hd) = (3 * 64, 64);
        let page: Vec<f16> =
            (0..KV_PAGE * kv_dim).map(|i| f16::from_f32(((i * 7919) % 1000) as f32 / 37.0 - 13.0)).collect();
        let rows = KvRows::F16(vec![page.clone()]);
        let mut out = vec![f32::NAN; hd * TILE_K];
        let mut tmp = Vec::new();
        for (p0, n, g) in [(0, 64, 0), (64, 13, 1), (128, 8, 2), (192, 63, 1), (0, 1, 2)] {
            let head = g * hd..(g + 1) * hd;
            load_tile(&rows, kv_dim, head.clone(), p0, n, true, &mut out, &mut tmp);
            for j in 0..n {
                for d in 0..hd {
                    let want = page[(p0 + j) * kv_dim + head.start + d].to_f32();
                    assert_eq!(
                        out[d * TILE_K + j].to_bits(),
                        want.to_bits(),
                        "tile at {p0}, {n} keys, head {g}: key {j} dim {d}"
                    );
                }
            }
            load_tile(&rows, kv_dim, head.clone(), p0, n, false, &mut out, &mut tmp);
            for j in 0..n {
                for d in 0..hd {
                    let want = page[(p0 + j) * kv_dim + head.start + d].to_f32();
                    assert_eq!(
                        out[j * hd + d].to_bits(),
                        want.to_bits(),
                        "value tile at {p0}, {n} keys, head {g}: key {j} dim {d}"
                    );
                }
            }
        }
    }
}
