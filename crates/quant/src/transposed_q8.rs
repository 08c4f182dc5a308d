//! A neuron-major 8-bit copy of a matrix for products over a *chosen subset of its inputs* by a
//! block of tokens: FastForward's sparse prefill, where every token of a 128-token block uses the
//! same chosen FFN neurons, so the down projection is a small GEMM over those neurons' columns.
//!
//! In the GGUF a matrix's rows run over its inputs in quantization blocks of 32-256 values, so
//! a subset of inputs (columns) cannot be fed to the row kernels; the pack's exact columns
//! ([`crate::exact_q8`]) can, but a 4-bit column is unpacked and scaled per 32 values for every
//! group of tokens, ~2× the row kernels' cost per multiply-add. Here each input `j` (a neuron)
//! owns one contiguous 8-bit row of the matrix's column, scaled twice — per output row
//! (`row_scale[o]`) and per neuron (`neuron_scale[j]`, folded into the coefficients) — so any
//! subset of neurons, in any order, is a plain integer GEMM:
//!
//! `y[t][o] ≈ row_scale[o] · Σ_b d[t][b] · Σ_{i ∈ b} q[t][i] · w[chosen[i]][o]`
//!
//! with the coefficients `coef[t][i] · neuron_scale[chosen[i]]` quantized to `i8` per token and
//! block `b` of [`COEF_BLOCK`] chosen neurons (scale `d`), as the dense path quantizes a token's
//! activations per block ([`QuantizedCoefs`]). The weights are stored as `u8 = q + 128` (the
//! operand order of AVX-512 VNNI's `vpdpbusd`); each block's integer sum starts at
//! `−128 · Σ_{i ∈ b} q[t][i]` to remove the offset exactly.
//!
//! The bytes are stored per *panel* of [`PANEL`] outputs, neuron after neuron
//! (`data[p][j][0..64]`), so one panel's chosen neurons are read in ascending addresses from one
//! stretch of memory. A kernel ([`GemmChosenFn`]) computes whole panels; [`gemm_chosen_scalar`]
//! is the reference, and the AVX-512 VNNI kernel (`x86::transposed_q8`) equals it bit for bit.
//!
//! The copy costs one byte per weight plus 4 bytes per row and per neuron: for Qwen2.5-1.5B's 28
//! down projections (1536 × 8960) 385 MB, for Qwen2.5-0.5B's 105 MB. The weights are rounded a
//! second time (8 bits over the stored 4-6-bit values: a small error next to theirs).

use crate::Isa;
use std::ops::Range;

/// Outputs per panel (the kernels' width: four 16-lane vectors).
pub const PANEL: usize = 64;
/// Chosen neurons per coefficient scale (per token).
pub const COEF_BLOCK: usize = 128;

/// A matrix `n_out × n_in` stored neuron-major in 8 bits (see the module docs).
#[derive(Clone, Debug)]
pub struct TransposedQ8 {
    n_out: usize,
    n_in: usize,
    /// `data[(p·n_in + j)·PANEL + c]` = `q + 128` of output `p·PANEL + c`, input `j`.
    data: Vec<u8>,
    row_scale: Vec<f32>,
    neuron_scale: Vec<f32>,
}

/// Why a matrix or a call does not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

impl TransposedQ8 {
    /// Quantizes `w` (`n_out` rows of `n_in` values, row-major, as a GGUF matrix dequantized).
    /// `n_out` must be a multiple of [`PANEL`]. Per neuron `j` the scale is its column's largest
    /// magnitude; per output row, the largest magnitude of the row so scaled, over 127.
    /// Non-finite weights are refused.
    pub fn from_rows(w: &[f32], n_out: usize, n_in: usize) -> Result<Self, ShapeError> {
        if n_out == 0 || n_in == 0 || !n_out.is_multiple_of(PANEL) || w.len() != n_out * n_in {
            return Err(ShapeError(format!(
                "an 8-bit neuron-major copy needs a non-empty matrix with a multiple of {PANEL} rows and \
                 rows × columns values: got {n_out} × {n_in} with {} values",
                w.len()
            )));
        }
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(ShapeError(format!(
                "weight {} (row {}, column {}) is not finite: the matrix cannot be copied to 8 bits",
                i,
                i / n_in,
                i % n_in
            )));
        }
        let mut neuron_scale = vec![0f32; n_in];
        for row in w.chunks_exact(n_in) {
            for (s, v) in neuron_scale.iter_mut().zip(row) {
                *s = s.max(v.abs());
            }
        }
        for s in &mut neuron_scale {
            if *s == 0.0 {
                *s = 1.0;
            }
        }
        let inv: Vec<f32> = neuron_scale.iter().map(|s| 1.0 / s).collect();
        let mut row_scale = vec![0f32; n_out];
        let mut data = vec![128u8; n_out * n_in];
        for (o, row) in w.chunks_exact(n_in).enumerate() {
            let amax = row.iter().zip(&inv).fold(0f32, |m, (v, i)| m.max((v * i).abs()));
            let r = amax / 127.0;
            row_scale[o] = r;
            let ir = if r > 0.0 { 1.0 / r } else { 0.0 };
            let (p, c) = (o / PANEL, o % PANEL);
            for (j, (v, i)) in row.iter().zip(&inv).enumerate() {
                // Rounded half up: `floor(x + 128.5)` by truncation of a positive value (no libm
                // call), the stored byte `q + 128` in 1..=255.
                data[(p * n_in + j) * PANEL + c] = ((v * i * ir).clamp(-127.0, 127.0) + 128.5) as u8;
            }
        }
        Ok(TransposedQ8 { n_out, n_in, data, row_scale, neuron_scale })
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    pub fn n_in(&self) -> usize {
        self.n_in
    }

    /// Panels of [`PANEL`] outputs.
    pub fn n_panels(&self) -> usize {
        self.n_out / PANEL
    }

    /// Bytes held (weights and scales).
    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * (self.row_scale.len() + self.neuron_scale.len())
    }

    /// Output row `o`'s scale.
    pub fn row_scale(&self, o: usize) -> f32 {
        self.row_scale[o]
    }

    /// Neuron (input) `j`'s scale: the largest magnitude of its column.
    pub fn neuron_scale(&self, j: usize) -> f32 {
        self.neuron_scale[j]
    }

    /// The stored value of weight (`o`, `j`), as the kernels use it.
    pub fn weight(&self, o: usize, j: usize) -> f32 {
        let (p, c) = (o / PANEL, o % PANEL);
        let q = self.data[(p * self.n_in + j) * PANEL + c] as i32 - 128;
        self.row_scale[o] * self.neuron_scale[j] * q as f32
    }

    /// Neuron `j`'s [`PANEL`] bytes in panel `p`.
    #[inline]
    pub(crate) fn panel_row(&self, p: usize, j: usize) -> &[u8] {
        &self.data[(p * self.n_in + j) * PANEL..][..PANEL]
    }

    pub(crate) fn row_scales(&self) -> &[f32] {
        &self.row_scale
    }
}

/// A block of tokens' coefficients over the chosen neurons, quantized for the kernels: per token
/// `k4` values (`k` rounded up to a multiple of 4, zeros after `k`), one scale per
/// [`COEF_BLOCK`] and the integer start of each block's sum (`−128 · Σ q`).
#[derive(Clone, Debug, Default)]
pub struct QuantizedCoefs {
    pub(crate) n_tok: usize,
    pub(crate) k: usize,
    pub(crate) k4: usize,
    /// The chosen neurons' scales.
    ns: Vec<f32>,
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) start: Vec<i32>,
}

impl QuantizedCoefs {
    /// Blocks of [`COEF_BLOCK`] chosen neurons per token.
    pub fn n_blocks(&self) -> usize {
        self.k.div_ceil(COEF_BLOCK)
    }

    /// Sets the shape for `n_tok` tokens over the neurons `chosen` of `w` (buffers grown, kept
    /// across calls). A neuron past `w`'s inputs is refused.
    pub fn reset(&mut self, w: &TransposedQ8, chosen: &[u32], n_tok: usize) -> Result<(), ShapeError> {
        if let Some(j) = chosen.iter().find(|&&j| j as usize >= w.n_in) {
            return Err(ShapeError(format!("chosen neuron {j} is past the matrix's {} inputs", w.n_in)));
        }
        let k = chosen.len();
        self.n_tok = n_tok;
        self.k = k;
        self.k4 = k.next_multiple_of(4);
        self.ns.clear();
        self.ns.extend(chosen.iter().map(|&j| w.neuron_scale[j as usize]));
        let nb = k.div_ceil(COEF_BLOCK);
        self.q.resize(n_tok * self.k4, 0);
        self.d.resize(n_tok * nb, 0.0);
        self.start.resize(n_tok * nb, 0);
        Ok(())
    }

    /// Quantizes every token's coefficients (`coef`: `n_tok × k` values, token after token,
    /// in the order of the neurons given to [`QuantizedCoefs::reset`]).
    pub fn quantize(&mut self, coef: &[f32]) {
        let n = self.n_tok.max(1);
        for mut part in self.token_chunks(n) {
            part.quantize(coef);
        }
    }

    /// The buffers in chunks of `per` tokens (the last one shorter), for quantizing them on
    /// several threads: chunk `i` holds tokens `i·per ..`.
    pub fn token_chunks(&mut self, per: usize) -> Vec<QuantizedCoefsMut<'_>> {
        let (k, k4, nb, per, n) = (self.k, self.k4, self.n_blocks(), per.max(1), self.n_tok);
        let ns = &self.ns[..];
        let (mut q, mut d, mut start) = (&mut self.q[..n * k4], &mut self.d[..n * nb], &mut self.start[..n * nb]);
        let mut out = Vec::with_capacity(n.div_ceil(per));
        for t0 in (0..n).step_by(per) {
            let m = per.min(n - t0);
            let (q0, q1) = std::mem::take(&mut q).split_at_mut(m * k4);
            let (d0, d1) = std::mem::take(&mut d).split_at_mut(m * nb);
            let (s0, s1) = std::mem::take(&mut start).split_at_mut(m * nb);
            (q, d, start) = (q1, d1, s1);
            out.push(QuantizedCoefsMut { k, t0, n_tok: m, ns, q: q0, d: d0, start: s0 });
        }
        out
    }
}

/// Some tokens' buffers of a [`QuantizedCoefs`] (from [`QuantizedCoefs::token_chunks`]).
pub struct QuantizedCoefsMut<'a> {
    k: usize,
    t0: usize,
    n_tok: usize,
    ns: &'a [f32],
    q: &'a mut [i8],
    d: &'a mut [f32],
    start: &'a mut [i32],
}

impl QuantizedCoefsMut<'_> {
    /// Quantizes these tokens' coefficients: `coef` holds every token's `k` values (the whole
    /// block's, token after token; this part takes its own tokens' rows). A block holding a
    /// non-finite coefficient gets a NaN scale, so its outputs are NaN, as a dense product's.
    pub fn quantize(&mut self, coef: &[f32]) {
        let k = self.k;
        let (k4, nb) = (k.next_multiple_of(4), k.div_ceil(COEF_BLOCK));
        assert!(coef.len() >= (self.t0 + self.n_tok) * k, "coefficients for every token");
        let block = quantize_block_fn(Isa::detect());
        for t in 0..self.n_tok {
            let ct = &coef[(self.t0 + t) * k..(self.t0 + t + 1) * k];
            let qt = &mut self.q[t * k4..(t + 1) * k4];
            for b in 0..nb {
                let r = b * COEF_BLOCK..((b + 1) * COEF_BLOCK).min(k);
                let (dd, sum) = block(&ct[r.clone()], &self.ns[r.clone()], &mut qt[r]);
                self.d[t * nb + b] = dd;
                self.start[t * nb + b] = -128 * sum;
            }
            qt[k..].fill(0);
        }
    }
}

/// Quantizes one block of at most [`COEF_BLOCK`] coefficients `c · ns` to `q`: returns the
/// block's scale `d` (its largest magnitude over 127; NaN when a value is not finite) and `Σ q`.
pub type QuantizeBlockFn = fn(c: &[f32], ns: &[f32], q: &mut [i8]) -> (f32, i32);

/// The reference of [`QuantizeBlockFn`]: `q = round_ties_even(c·ns / d)`, clamped to ±127.
pub fn quantize_block_scalar(c: &[f32], ns: &[f32], q: &mut [i8]) -> (f32, i32) {
    assert!(c.len() == ns.len() && c.len() == q.len() && c.len() <= COEF_BLOCK, "one block's values");
    let mut x = [0f32; COEF_BLOCK];
    let xs = &mut x[..c.len()];
    for ((xv, &cv), &s) in xs.iter_mut().zip(c).zip(ns) {
        *xv = cv * s;
    }
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let finite = xs.iter().all(|v| v.is_finite());
    let d = if finite { amax / 127.0 } else { f32::NAN };
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (qv, xv) in q.iter_mut().zip(xs.iter()) {
        let v = (xv * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        *qv = v;
        sum += v as i32;
    }
    (d, sum)
}

/// The fastest [`QuantizeBlockFn`] for `isa`, bit for bit [`quantize_block_scalar`].
pub fn quantize_block_fn(isa: Isa) -> QuantizeBlockFn {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_supported() {
        return crate::x86::transposed_q8::quantize_block_avx512;
    }
    let _ = isa;
    quantize_block_scalar
}

/// `y[(p − panels.start)·n_tok·PANEL + t·PANEL + c] = Σ_i coef[t][i] · w[p·PANEL + c][chosen[i]]`
/// for the panels `panels` and every token of `c` (quantized for the same `w` and `chosen`): the
/// output is panel-major, each panel a `n_tok × PANEL` tile, so threads can own panels.
/// `scratch` holds a kernel's packed panel between calls.
pub type GemmChosenFn = fn(
    w: &TransposedQ8,
    chosen: &[u32],
    c: &QuantizedCoefs,
    panels: Range<usize>,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
);

/// Checks a [`GemmChosenFn`] call's shapes (the kernels rely on them).
pub fn check_gemm_chosen(
    w: &TransposedQ8,
    chosen: &[u32],
    c: &QuantizedCoefs,
    panels: &Range<usize>,
    y_len: usize,
) -> Result<(), ShapeError> {
    let nb = c.k.div_ceil(COEF_BLOCK);
    if chosen.len() != c.k
        || c.k4 != c.k.next_multiple_of(4)
        || c.q.len() < c.n_tok * c.k4
        || c.d.len() < c.n_tok * nb
        || c.start.len() < c.n_tok * nb
    {
        return Err(ShapeError(format!("coefficients quantized for {} neurons, {} chosen", c.k, chosen.len())));
    }
    if let Some(j) = chosen.iter().find(|&&j| j as usize >= w.n_in) {
        return Err(ShapeError(format!("chosen neuron {j} is past the matrix's {} inputs", w.n_in)));
    }
    if panels.start > panels.end || panels.end > w.n_panels() {
        return Err(ShapeError(format!("panels {panels:?} outside the matrix's {}", w.n_panels())));
    }
    if y_len != panels.len() * c.n_tok * PANEL {
        return Err(ShapeError(format!("output of {y_len} values for {} panels of {} tokens", panels.len(), c.n_tok)));
    }
    Ok(())
}

/// The reference kernel: the integer sums, then per block `facc = fma(sum, d, facc)` in block
/// order, then `row_scale · facc` — the SIMD kernel's operations in its order.
pub fn gemm_chosen_scalar(
    w: &TransposedQ8,
    chosen: &[u32],
    c: &QuantizedCoefs,
    panels: Range<usize>,
    y: &mut [f32],
    _scratch: &mut Vec<u8>,
) {
    if let Err(e) = check_gemm_chosen(w, chosen, c, &panels, y.len()) {
        panic!("{e}");
    }
    let (n_tok, k4, nb) = (c.n_tok, c.k4, c.n_blocks());
    for (pi, p) in panels.enumerate() {
        for t in 0..n_tok {
            let qt = &c.q[t * k4..(t + 1) * k4];
            for col in 0..PANEL {
                let mut facc = 0f32;
                for b in 0..nb {
                    let mut s = c.start[t * nb + b];
                    for i in b * COEF_BLOCK..((b + 1) * COEF_BLOCK).min(c.k) {
                        s += w.panel_row(p, chosen[i] as usize)[col] as i32 * qt[i] as i32;
                    }
                    facc = (s as f32).mul_add(c.d[t * nb + b], facc);
                }
                y[(pi * n_tok + t) * PANEL + col] = w.row_scale[p * PANEL + col] * facc;
            }
        }
    }
}

/// The best kernel for `isa` (the scalar one where the CPU lacks AVX-512 VNNI).
pub fn gemm_chosen_fn(isa: Isa) -> GemmChosenFn {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_supported() {
        return crate::x86::transposed_q8::gemm_chosen_vnni;
    }
    let _ = isa;
    gemm_chosen_scalar
}
