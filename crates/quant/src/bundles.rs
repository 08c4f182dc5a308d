//! Neuron bundles: a gated FFN stored one neuron per record — neuron `i`'s gate row, its up row
//! and its down column side by side (LLM in a flash's row-column bundling) — so that computing a
//! token's chosen neurons reads only their records, and one read brings a whole neuron.
//!
//! # Layout of one layer (`n_ff` records of [`BundleLayout::record_bytes`] each)
//!
//! ```text
//! record i:  gate row i (the GGUF's own blocks, n_embd inputs)
//!            up row i   (the GGUF's own blocks)
//!            down column i (exact columns, [`crate::exact`]: the GGUF's own integers)
//!            zero padding to a multiple of 64 bytes (a cache line)
//! ```
//! The down columns' scales stay in the op's scale plane ([`ExactFormat::transpose`]), shared by
//! every neuron of a source block, so every weight is the GGUF's value for value: the gate and up
//! rows are its rows byte for byte, the down column its column.
//!
//! # Kernels
//!
//! - [`Bundles::rows`]: `out[k] = row(neurons[k]) · x` for the gate or the up rows, with the
//!   weight type's own dot kernel (the product a dense matrix of plain rows gives, bit for bit).
//! - [`Bundles::down`]: `y += Σ_k coef[k] · down column neurons[k]`, on the exact column kernel
//!   of this CPU ([`crate::axpy_exact_fn`]) reading the columns inside the records
//!   ([`ExactMatrix::with_stride`]).
//! - [`Bundles::down_tokens`]: the same for several tokens over the union of their neurons
//!   (`-np` slots, verifying drafted tokens), each token with its own coefficients (zero on the
//!   neurons it did not choose).
//!
//! # Numerics: a token's result does not depend on who it is batched with
//!
//! The down kernels group coefficients (one 8-bit scale per group) and add each group's sum into
//! `y`. Here the groups are fixed by neuron index — the neurons of `[128·g, 128·g + 128)`
//! ([`BUNDLE_GROUP`]), one kernel call each, in ascending order — never by position in a list.
//! A neuron a token did not choose adds an exact zero to its group (the group's scale is its
//! largest coefficient, unchanged by zeros; its integer sums are unchanged), and a group where the
//! token chose nothing adds exactly zero to `y`. So a token's result inside any union equals its
//! result alone, bit for bit (`tests/bundles.rs`), and a list that holds every neuron computes
//! what the column kernel computes on the whole op in 128-neuron pieces.

use crate::exact::{ExactAxpyFn, ExactFormat, ExactMatrix, RUN_BREAK};
use crate::exact_q8::ExactAxpyTokensFn;
use crate::{DotFn, WeightType};
use std::fmt;
use std::ops::Range;

/// Neurons per group of the down kernels (fixed by index: see the module docs). Equal to
/// [`RUN_BREAK`], so one group is one call's whole list and the kernel never cuts it.
pub const BUNDLE_GROUP: usize = RUN_BREAK;

/// Accumulators a token's FFN is summed in ([`Bundles::ffn_lane`]): group `g` adds into lane
/// `g % BUNDLE_LANES`, the lanes are added into the output in lane order ([`add_lanes`]). A fixed
/// number, so the result does not depend on how many threads share the lanes.
pub const BUNDLE_LANES: usize = 16;

/// Records prefetched ahead of the one being computed ([`Bundles::ffn_lane`]).
const PREFETCH_RECORDS: usize = 4;

const RECORD_ALIGN: usize = 64;

/// Why a layer cannot be bundled, or a bundle's arguments were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BundleError {
    /// A weight type sift has no bundle kernel for (float gate/up, or no exact down layout).
    Type { what: &'static str, ty: WeightType },
    /// A shape the formats do not fit (`n_embd` not whole blocks, `n_ff` not whole super-blocks).
    Shape { n_embd: usize, n_ff: usize, why: &'static str },
    /// A buffer of the wrong size.
    Len { what: &'static str, expected: usize, got: usize },
    /// A neuron index past the layer's `n_ff`, or a list not strictly ascending.
    Neurons { why: String },
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BundleError::Type { what, ty } => write!(f, "neuron bundles: no bundle layout for a {what} of type {ty:?}"),
            BundleError::Shape { n_embd, n_ff, why } => {
                write!(f, "neuron bundles: an FFN of {n_embd} × {n_ff} does not fit: {why}")
            }
            BundleError::Len { what, expected, got } => {
                write!(f, "neuron bundles: {what} is {got} bytes, expected {expected}")
            }
            BundleError::Neurons { why } => write!(f, "neuron bundles: {why}"),
        }
    }
}

impl std::error::Error for BundleError {}

/// Where a neuron's parts lie in its record, and the formats they are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BundleLayout {
    /// The gate and up rows' GGUF types.
    pub gate: WeightType,
    pub up: WeightType,
    /// The down columns' exact layout (of the GGUF's down type).
    pub down: ExactFormat,
    pub n_embd: usize,
    pub n_ff: usize,
}

/// Which row of a bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BundleRow {
    Gate,
    Up,
}

impl BundleLayout {
    /// The bundle layout of a gated FFN with these GGUF types (`down`: the exact layout of the
    /// down tensor's type, narrow or wide).
    pub fn new(
        gate: WeightType,
        up: WeightType,
        down: ExactFormat,
        n_embd: usize,
        n_ff: usize,
    ) -> Result<BundleLayout, BundleError> {
        for (what, ty) in [("gate", gate), ("up", up)] {
            if ty.act_type() == crate::ActType::F32 {
                return Err(BundleError::Type { what, ty });
            }
            if ty.row_bytes(n_embd).is_none() {
                return Err(BundleError::Shape {
                    n_embd,
                    n_ff,
                    why: "n_embd is not a whole number of the rows' blocks",
                });
            }
        }
        if gate.act_type() != up.act_type() {
            return Err(BundleError::Type { what: "up (its activation format differs from gate's)", ty: up });
        }
        if !down.fits(n_embd, n_ff) {
            return Err(BundleError::Shape {
                n_embd,
                n_ff,
                why: "down's columns need n_embd a multiple of 32 and n_ff of its super-block",
            });
        }
        Ok(BundleLayout { gate, up, down, n_embd, n_ff })
    }

    /// Bytes of one row of `which`.
    pub fn row_bytes(&self, which: BundleRow) -> usize {
        let ty = match which {
            BundleRow::Gate => self.gate,
            BundleRow::Up => self.up,
        };
        ty.row_bytes(self.n_embd).expect("checked by BundleLayout::new")
    }

    /// Where `which` row starts in a record.
    pub fn row_offset(&self, which: BundleRow) -> usize {
        match which {
            BundleRow::Gate => 0,
            BundleRow::Up => self.row_bytes(BundleRow::Gate),
        }
    }

    /// Where the down column starts in a record.
    pub fn down_offset(&self) -> usize {
        self.row_bytes(BundleRow::Gate) + self.row_bytes(BundleRow::Up)
    }

    /// Bytes of a down column.
    pub fn down_bytes(&self) -> usize {
        self.down.col_bytes(self.n_embd)
    }

    /// Bytes of one neuron's record (its three parts, padded to 64).
    pub fn record_bytes(&self) -> usize {
        (self.down_offset() + self.down_bytes()).next_multiple_of(RECORD_ALIGN)
    }

    /// Bytes of a layer's records.
    pub fn records_len(&self) -> usize {
        self.n_ff * self.record_bytes()
    }

    /// Bytes of the down columns' scale plane.
    pub fn down_scales_len(&self) -> usize {
        self.down.scale_bytes(self.n_embd, self.n_ff)
    }

    /// A layer's records, in neuron order, from the GGUF's row-major gate (`n_ff` rows), up
    /// (`n_ff` rows) and down (`n_embd` rows of `n_ff`) tensors, and down's scale plane.
    pub fn build(&self, gate: &[u8], up: &[u8], down: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BundleError> {
        let db = self.down.src.row_bytes(self.n_ff).expect("checked by BundleLayout::new");
        if down.len() != db * self.n_embd {
            return Err(BundleError::Len { what: "down", expected: db * self.n_embd, got: down.len() });
        }
        self.check_rows(gate, up)?;
        let (cols, scales) = self.down.transpose(down, self.n_embd, self.n_ff);
        Ok((self.records(gate, up, &cols)?, scales))
    }

    /// [`BundleLayout::build`]'s records from down's exact columns already transposed (`n_ff`
    /// columns of [`BundleLayout::down_bytes`], as [`ExactFormat::transpose`] gives them).
    pub fn records(&self, gate: &[u8], up: &[u8], down_cols: &[u8]) -> Result<Vec<u8>, BundleError> {
        self.check_rows(gate, up)?;
        let (gb, ub) = (self.row_bytes(BundleRow::Gate), self.row_bytes(BundleRow::Up));
        let (rb, cb, d0) = (self.record_bytes(), self.down_bytes(), self.down_offset());
        if down_cols.len() != cb * self.n_ff {
            return Err(BundleError::Len { what: "down columns", expected: cb * self.n_ff, got: down_cols.len() });
        }
        let mut out = vec![0u8; self.records_len()];
        for (i, rec) in out.chunks_exact_mut(rb).enumerate() {
            rec[..gb].copy_from_slice(&gate[i * gb..][..gb]);
            rec[gb..gb + ub].copy_from_slice(&up[i * ub..][..ub]);
            rec[d0..d0 + cb].copy_from_slice(&down_cols[i * cb..][..cb]);
        }
        Ok(out)
    }

    fn check_rows(&self, gate: &[u8], up: &[u8]) -> Result<(), BundleError> {
        for (what, buf, which) in [("gate", gate, BundleRow::Gate), ("up", up, BundleRow::Up)] {
            let expected = self.row_bytes(which) * self.n_ff;
            if buf.len() != expected {
                return Err(BundleError::Len { what, expected, got: buf.len() });
            }
        }
        Ok(())
    }
}

/// One layer's bundles as the kernels read them.
#[derive(Clone, Copy, Debug)]
pub struct Bundles<'a> {
    pub layout: BundleLayout,
    /// `n_ff` records, neuron `i`'s at `i · record_bytes`.
    pub records: &'a [u8],
    /// The down columns' scale plane.
    pub down_scales: &'a [u8],
}

impl<'a> Bundles<'a> {
    /// Checks the buffers' sizes against the layout.
    pub fn new(layout: BundleLayout, records: &'a [u8], down_scales: &'a [u8]) -> Result<Bundles<'a>, BundleError> {
        if records.len() != layout.records_len() {
            return Err(BundleError::Len { what: "records", expected: layout.records_len(), got: records.len() });
        }
        if down_scales.len() != layout.down_scales_len() {
            return Err(BundleError::Len {
                what: "down scale plane",
                expected: layout.down_scales_len(),
                got: down_scales.len(),
            });
        }
        Ok(Bundles { layout, records, down_scales })
    }

    /// Neuron `i`'s `which` row.
    pub fn row(&self, which: BundleRow, i: usize) -> &'a [u8] {
        let rb = self.layout.record_bytes();
        &self.records[i * rb + self.layout.row_offset(which)..][..self.layout.row_bytes(which)]
    }

    /// The down columns as an exact matrix (column `i` inside record `i`).
    pub fn down_matrix(&self) -> ExactMatrix<'a> {
        let l = &self.layout;
        ExactMatrix::new(l.down, l.n_embd, l.n_ff, &self.records[l.down_offset()..], self.down_scales)
            .with_stride(l.record_bytes())
    }

    /// Checks a neuron list: every index below `n_ff`, strictly ascending.
    pub fn check_neurons(&self, neurons: &[u32]) -> Result<(), BundleError> {
        let n = self.layout.n_ff;
        if let Some(&i) = neurons.iter().find(|&&i| i as usize >= n) {
            return Err(BundleError::Neurons { why: format!("neuron {i} is past the layer's {n}") });
        }
        if let Some(w) = neurons.windows(2).find(|w| w[0] >= w[1]) {
            return Err(BundleError::Neurons { why: format!("the list is not ascending ({} then {})", w[0], w[1]) });
        }
        Ok(())
    }

    /// `out[k] = row(neurons[k]) · x` for the `which` rows, `x` quantized to the row type's
    /// activation format (`act`, one row of `n_embd` inputs), with `dot` (the row type's kernel:
    /// [`WeightType::dot_fn`], or another ISA's to compare).
    ///
    /// # Panics
    /// If `out` and `neurons` differ in length or a neuron is past `n_ff`.
    pub fn rows(&self, which: BundleRow, dot: DotFn, act: &[u8], neurons: &[u32], out: &mut [f32]) {
        assert_eq!(neurons.len(), out.len(), "bundle rows: one output per neuron");
        let n = self.layout.n_embd;
        for (o, &i) in out.iter_mut().zip(neurons) {
            *o = dot(n, self.row(which, i as usize), act);
        }
    }

    /// `y += Σ_k coef[k] · down column neurons[k]` for the 32-output chunks `chunks` (`y`: their
    /// `32 · chunks.len()` values), one `kernel` call per [`BUNDLE_GROUP`] of neuron indices.
    /// `neurons` is strictly ascending ([`Bundles::check_neurons`]).
    ///
    /// # Panics
    /// On arguments the kernel rejects, or `coef` not as long as `neurons`.
    pub fn down(&self, kernel: ExactAxpyFn, neurons: &[u32], coef: &[f32], chunks: Range<usize>, y: &mut [f32]) {
        assert_eq!(neurons.len(), coef.len(), "bundle down: one coefficient per neuron");
        debug_assert!(self.check_neurons(neurons).is_ok(), "bundle down: {:?}", self.check_neurons(neurons));
        let m = self.down_matrix();
        for g in groups(neurons) {
            kernel(&m, &neurons[g.clone()], &neurons[g.clone()], &coef[g], chunks.clone(), y);
        }
    }

    /// [`Bundles::down`] for `n_tok` tokens over the union of their neurons (`neurons`, strictly
    /// ascending): `coef` holds `n_tok` rows of `neurons.len()` coefficients (zero where a token
    /// did not choose the neuron), `y` token `t`'s outputs at `t · y_stride`. Each token gets what
    /// [`Bundles::down`] gives it alone on its own neurons, bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn down_tokens(
        &self,
        kernel: ExactAxpyTokensFn,
        neurons: &[u32],
        coef: &[f32],
        n_tok: usize,
        chunks: Range<usize>,
        y: &mut [f32],
        y_stride: usize,
    ) {
        let n = neurons.len();
        assert_eq!(coef.len(), n * n_tok, "bundle down: one coefficient per neuron and token");
        debug_assert!(self.check_neurons(neurons).is_ok(), "bundle down: {:?}", self.check_neurons(neurons));
        let m = self.down_matrix();
        let mut c = Vec::new();
        for g in groups(neurons) {
            c.clear();
            for t in 0..n_tok {
                c.extend_from_slice(&coef[t * n + g.start..t * n + g.end]);
            }
            kernel(&m, &neurons[g.clone()], &neurons[g], &c, n_tok, chunks.clone(), y, y_stride);
        }
    }
}

/// Where a neuron's gate value comes from in [`Bundles::ffn_lane`].
#[derive(Clone, Copy)]
pub enum Gate<'a> {
    /// From its gate row in the bundle: `act(gate row · x)`, `act` the architecture's activation
    /// applied in place to a group's values (SiLU, GELU).
    Rows { act: fn(&mut [f32]) },
    /// Already computed (gate first): `act(gate)` of every neuron, indexed by neuron.
    Given(&'a [f32]),
}

impl<'a> Bundles<'a> {
    /// One token's FFN over its chosen `neurons` (strictly ascending), the groups of lane `lane`
    /// only: for each [`BUNDLE_GROUP`] `g` with `g % BUNDLE_LANES == lane`, its neurons'
    /// `h = act(gate) · (up row · x)` and `y += Σ h · down column` ([`Bundles::down`]'s numerics:
    /// one `kernel` call per group), all outputs. `x` is the FFN input quantized to the gate and
    /// up rows' activation format; `dots` their dot kernels. Each record is read once, front to
    /// back (rows, then its down column while the group's records are still in cache), the next
    /// ones prefetched: a token's chosen bundles stream from memory as a dense matrix does.
    ///
    /// Threads share a token's lanes (each lane's `y` its own); [`add_lanes`] then adds them.
    #[allow(clippy::too_many_arguments)]
    pub fn ffn_lane(
        &self,
        lane: usize,
        neurons: &[u32],
        x: &[u8],
        gate: Gate<'_>,
        dots: (DotFn, DotFn),
        kernel: ExactAxpyFn,
        y: &mut [f32],
    ) {
        let l = &self.layout;
        assert_eq!(y.len(), l.n_embd, "bundle ffn: y holds every output");
        debug_assert!(self.check_neurons(neurons).is_ok(), "bundle ffn: {:?}", self.check_neurons(neurons));
        let (rb, n) = (l.record_bytes(), l.n_embd);
        let (go, uo, gb, ub) = (
            l.row_offset(BundleRow::Gate),
            l.row_offset(BundleRow::Up),
            l.row_bytes(BundleRow::Gate),
            l.row_bytes(BundleRow::Up),
        );
        let m = self.down_matrix();
        let mut h = [0f32; BUNDLE_GROUP];
        let mut u = [0f32; BUNDLE_GROUP];
        for grp in groups(neurons) {
            if (neurons[grp.start] as usize / BUNDLE_GROUP) % BUNDLE_LANES != lane {
                continue;
            }
            let chosen = &neurons[grp.clone()];
            let k = chosen.len();
            let record = |i: u32| &self.records[i as usize * rb..][..rb];
            let first = match gate {
                Gate::Rows { .. } => 0,
                Gate::Given(_) => uo,
            };
            for &i in chosen.iter().take(PREFETCH_RECORDS) {
                prefetch(&record(i)[first..]);
            }
            for (j, &i) in chosen.iter().enumerate() {
                if let Some(&next) = chosen.get(j + PREFETCH_RECORDS) {
                    prefetch(&record(next)[first..]);
                }
                let r = record(i);
                if let Gate::Rows { .. } = gate {
                    h[j] = (dots.0)(n, &r[go..go + gb], x);
                }
                u[j] = (dots.1)(n, &r[uo..uo + ub], x);
            }
            match gate {
                Gate::Rows { act } => act(&mut h[..k]),
                Gate::Given(g) => h[..k].iter_mut().zip(chosen).for_each(|(h, &i)| *h = g[i as usize]),
            }
            h[..k].iter_mut().zip(&u[..k]).for_each(|(h, u)| *h *= u);
            kernel(&m, chosen, chosen, &h[..k], 0..n / 32, y);
        }
    }
}

/// `y += lanes[0] + lanes[1] + …` in lane order (`lanes`: [`BUNDLE_LANES`] accumulators of
/// `y.len()` values each, back to back).
pub fn add_lanes(y: &mut [f32], lanes: &[f32]) {
    assert_eq!(lanes.len(), BUNDLE_LANES * y.len(), "add_lanes: one accumulator per lane");
    for lane in lanes.chunks_exact(y.len()) {
        y.iter_mut().zip(lane).for_each(|(y, v)| *y += v);
    }
}

/// Prefetches every cache line of `bytes` (a hint: it never faults).
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes.len()).step_by(64) {
        // SAFETY: `_mm_prefetch` only hints the cache; the address lies inside `bytes`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes[off..].as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The ranges of an ascending neuron list that fall in each [`BUNDLE_GROUP`] of indices.
fn groups(neurons: &[u32]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = i;
        let g = *neurons.get(start)? as usize / BUNDLE_GROUP;
        i += neurons[start..].partition_point(|&u| u as usize / BUNDLE_GROUP == g);
        Some(start..i)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_neuron_indices() {
        let n = [0u32, 5, 127, 128, 300, 301, 1000];
        let g: Vec<_> = groups(&n).collect();
        assert_eq!(g, vec![0..3, 3..4, 4..6, 6..7]);
        assert_eq!(groups(&[]).count(), 0);
    }
}
