//! FastForward's block-wise sparse prefill (seed: "FastForward: accelerating LLM prefill with
//! predictive FFN sparsity"): prompts go through the model in blocks of [`PREFILL_BLOCK`] tokens,
//! and the FFN of a *sparse block* computes only `K = (1 − R)·n_ff` of its neurons, the same set
//! for every token of the block: rows of gate and up, then the matching columns of down. The first
//! block (it holds the attention sinks) and the last block of a prompt stay dense, as the paper's.
//! The blocks lie on a grid fixed by position ([`prompt_blocks`]): a prompt fed in chunks (the
//! server's), or after a cached prefix, is cut into the blocks it gets when read in one go.
//!
//! The neurons come from the trained expert predictor ([`crate::predictor`], `sift train
//! prefill`), or without training ([`PrefillMasks`]): the **oracle** (the
//! block's dense FFN's own top neurons by L2 norm over the block, GRIFFIN's labels: the quality
//! ceiling, computed from the dense gate/up, so it saves only the down projection) or a **random**
//! set of the same size (quality meaningless: it times the sparse FFN alone, the speed ceiling a
//! trained predictor can reach).
//!
//! - Gate and up: the chosen rows are copied into a compact matrix per block (whole row groups
//!   when the matrix is repacked for the group kernels, `QTensor::group_rows`: the neurons are
//!   then chosen 8 or 16 at a time) and run through the ordinary batch kernels.
//! - Down: the chosen neurons are input channels of `ffn_down`, i.e. columns. By default (a CPU
//!   with AVX-512 VNNI) from a [`DownCopy`] made at load: each layer's down projection as an 8-bit
//!   neuron-major copy ([`sift_quant::transposed_q8`]), where the chosen neurons are a plain
//!   integer GEMM at ~2× the speed of the pack's columns, for one byte per weight of memory
//!   (`--prefill-down columns` turns it off); else with a pack, its exact columns through the
//!   many-token column kernel ([`sift_quant::exact_q8::ExactAxpyTokensFn`]), each column read once
//!   for the whole block; without one, the dense kernel on the masked GLU (the same result within
//!   the kernels' rounding, no saving).
//!
//! LoRA adapters (`--lora`) apply to sparse blocks as to dense ones: gate's and up's on the chosen
//! rows, down's on the GLU of the chosen neurons.
//!
//! With a trained file that holds FastForward's error compensator, its correction is added to each
//! sparse block's FFN output ([`crate::predictor::ExpertPredictors::compensate`]; off with
//! [`Engine::set_prefill_compensator`]).
//!
//! Under a memory budget (`--memory`, the tiered store) the gate and up rows stream through the
//! store's prefill buffer as a dense batch's do (all of them are read, at 4 KiB granularity a
//! half of the rows touches nearly every page; only the chosen ones are computed), and the down
//! projection reads only the chosen neurons' columns, through the store's cache.

use crate::pool::ThreadPool;
use sift_model::{Model, QTensor};
use sift_quant::packed;
use sift_quant::transposed_q8::{QuantizedCoefs, ShapeError, TransposedQ8, PANEL};
use sift_quant::Isa;
use std::sync::Mutex;

/// Tokens per prompt block (the paper's unit).
pub const PREFILL_BLOCK: usize = 128;

/// FastForward's layerwise schedule (Algorithm 1): each layer's share of neurons kept, from its
/// importance `mass[l]` (the attention mass its non-sink blocks receive) and the overall share
/// `keep`: `b_l = min(1, mass_l / Σ mass_j · T)`, `T` the budget left (`keep · L` at first), one
/// layer after another — in decreasing order of importance, so that a layer capped at 1 leaves
/// its excess to the layers still to come. The paper's layer order lost that excess when a late
/// layer capped (`--prefill-sparsity 0.01` skipped 5 % of the neurons, not 1 %); in this order
/// the mean of the result is `keep` exactly (the shares are proportional to the masses below
/// the cap). Zero or invalid masses give the uniform schedule.
pub fn linear_schedule(mass: &[f64], keep: f32) -> Vec<f32> {
    let n = mass.len();
    if n == 0 || mass.iter().any(|m| !m.is_finite() || *m < 0.0) || mass.iter().sum::<f64>() <= 0.0 {
        return vec![keep; n];
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]).then(a.cmp(&b)));
    let mut total = keep as f64 * n as f64;
    let mut left: f64 = mass.iter().sum();
    let mut out = vec![0f32; n];
    for l in order {
        let m = mass[l];
        let b = if left > 0.0 { (m / left * total).min(1.0) } else { 0.0 };
        total -= b;
        left -= m;
        out[l] = b as f32;
    }
    out
}

/// FastForward's block grid over a prompt: block `b` holds positions `128·b .. 128·(b + 1)`,
/// counted from the start of the sequence (not from where a call, a server's chunk or a cached
/// prefix starts), so the same prompt is cut into the same blocks however it is fed. A block is
/// sparse when it is not the first (the attention sinks), not the prompt's last (the one holding
/// position `prompt_end − 1`), and whole in `start..end` (the positions evaluated now: a block
/// split between two calls has no one set of tokens to choose for, and runs dense).
///
/// Returns the pieces of `start..end` cut at the block boundaries, each with whether it is a
/// sparse block.
pub fn prompt_blocks(start: usize, end: usize, prompt_end: usize) -> Vec<(std::ops::Range<usize>, bool)> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let b = at / PREFILL_BLOCK;
        let (lo, hi) = (b * PREFILL_BLOCK, (b + 1) * PREFILL_BLOCK);
        let piece = at..hi.min(end);
        let sparse = b > 0 && piece.start == lo && piece.end == hi && hi < prompt_end;
        out.push((piece.clone(), sparse));
        at = piece.end;
    }
    out
}

/// The sparse blocks of a prompt of `n` tokens read from position 0 in one go.
pub fn sparse_blocks(n: usize) -> usize {
    prompt_blocks(0, n, n).iter().filter(|(_, s)| *s).count()
}

/// How a sparse prompt block's FFN neurons are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillMasks {
    /// The block's dense FFN's own top neurons by L2 norm over the block's tokens (computes the
    /// dense gate and up first): the quality ceiling of a predictor.
    #[default]
    Oracle,
    /// A fixed pseudo-random set per block and layer: only for timing the sparse FFN.
    Random,
    /// The trained expert predictor's top scores ([`crate::predictor`], `sift train prefill`):
    /// chosen before the FFN runs, so gate and up are computed for the chosen rows only.
    Predicted,
}

/// Every layer's down projection as an 8-bit neuron-major copy ([`TransposedQ8`]), for the
/// sparse blocks' down over their chosen neurons (see the module docs): one byte per weight.
pub struct DownCopy {
    pub(crate) layers: Vec<TransposedQ8>,
}

impl DownCopy {
    /// Whether this CPU has a kernel for the copy that beats the pack's columns (AVX-512 VNNI)
    /// and the model's width is whole panels of [`PANEL`] outputs; elsewhere the copy is not made.
    pub fn worth_it(model: &Model) -> bool {
        Isa::detect() >= Isa::Avx512Vnni && model.config.n_embd.is_multiple_of(PANEL)
    }

    /// Bytes the copy of `model`'s down projections would hold (before making it).
    pub fn bytes_for(model: &Model) -> u64 {
        model.layers.iter().map(|l| (l.w_down.rows * l.w_down.cols + 4 * (l.w_down.rows + l.w_down.cols)) as u64).sum()
    }

    /// Dequantizes and copies every layer's `ffn_down` (the layers spread over the pool).
    pub fn build(model: &Model, pool: &ThreadPool) -> Result<DownCopy, ShapeError> {
        let n = model.layers.len();
        let made: Vec<Mutex<Option<Result<TransposedQ8, ShapeError>>>> = (0..n).map(|_| Mutex::new(None)).collect();
        pool.for_each(n, 1, &|range, _| {
            for l in range {
                let w = &model.layers[l].w_down;
                let rows = model.dequantize(w);
                let r =
                    TransposedQ8::from_rows(&rows, w.rows, w.cols).map_err(|e| ShapeError(format!("{}: {e}", w.name)));
                *made[l].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            }
        });
        let layers = made
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every layer was built"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DownCopy { layers })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.bytes()).sum()
    }
}

/// FastForward on an engine (`--prefill-*`): what a sparse block does and the memory it works in.
pub(crate) struct FastForward {
    /// The share of FFN neurons a sparse block skips (0: dense prefill).
    pub ratio: f32,
    /// How a sparse block's neurons are chosen.
    pub masks: PrefillMasks,
    /// The layerwise schedule: each layer's share of neurons kept (`None`: `1 − ratio` in every
    /// layer).
    pub keep: Option<Vec<f32>>,
    /// The trained expert predictor (`--prefill-masks predicted`).
    pub predictor: Option<std::sync::Arc<crate::predictor::ExpertPredictors>>,
    /// Whether sparse blocks add the predictor file's error compensator (when it has one).
    pub compensate: bool,
    /// Sparse blocks' down projections from an 8-bit neuron-major copy ([`DownCopy`]).
    pub down: Option<std::sync::Arc<DownCopy>>,
    pub scratch: PrefillScratch,
}

impl FastForward {
    /// Sparse prefill at `ratio` with `masks`, nothing trained attached.
    pub fn new(ratio: f32, masks: PrefillMasks) -> FastForward {
        FastForward {
            ratio: ratio.clamp(0.0, 0.99),
            masks,
            keep: None,
            predictor: None,
            compensate: true,
            down: None,
            scratch: PrefillScratch::default(),
        }
    }
}

/// Working memory of sparse blocks.
#[derive(Default)]
pub(crate) struct PrefillScratch {
    /// The chosen neurons (ascending) and, for the pack's columns, their column positions.
    pub(crate) units: Vec<u32>,
    pub(crate) idx: Vec<u32>,
    /// Per neuron scores, and the selection's scratch.
    pub(crate) score: Vec<f32>,
    pub(crate) topk: Vec<u32>,
    /// The compact gate and up matrices of the chosen rows.
    pub(crate) rows: Vec<u8>,
    /// The chosen neurons' gate / GLU values (n × K) and up values.
    pub(crate) gs: Vec<f32>,
    pub(crate) us: Vec<f32>,
    /// The down copy's quantized coefficients, its panel-major output, each thread's packed panel.
    pub(crate) q8: QuantizedCoefs,
    pub(crate) yp: Vec<f32>,
    pub(crate) panels: Vec<Mutex<Vec<u8>>>,
}

/// One output group of a compact matrix: the rows `chosen` (as many as `w`'s group, ascending)
/// of `w` (its bytes `data`) into `out`, in `w`'s layout: copied for a plain matrix; for a
/// repacked one moved from their source groups' interleaved places ([`packed::gather_group`]).
pub(crate) fn gather_group(w: &QTensor, data: &[u8], chosen: &[u32], out: &mut [u8], scratch: &mut Vec<u8>) {
    let (g, rb) = (w.group_rows(), w.row_bytes);
    debug_assert_eq!(chosen.len(), g);
    if g == 1 {
        let r = chosen[0] as usize;
        out.copy_from_slice(&data[r * rb..(r + 1) * rb]);
        return;
    }
    packed::gather_group(w.ty, data, rb / w.ty.block_bytes(), chosen, out, scratch);
}

/// Makes `v` exactly `len` long, keeping what it holds (new elements `fill`): for buffers whose
/// every element is written before it is read.
pub(crate) fn grow<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
    v.truncate(len);
}

/// A pseudo-random number in `[0, 1)` from `(seed, j)` (splitmix64).
pub(crate) fn hash01(seed: u64, j: u64) -> f32 {
    let mut z = seed.wrapping_add(j.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::{gather_group, linear_schedule, prompt_blocks, sparse_blocks, PREFILL_BLOCK};
    use sift_model::QTensor;
    use sift_quant::{packed, scalar, WeightType};

    /// A compact matrix of chosen rows, gathered from a repacked matrix, holds exactly those
    /// rows: real SmolLM2 weights (layer 3's down projection, 576 rows of 1536) quantized to each
    /// type this CPU repacks, packed as at load; chosen rows spread over the groups, several from
    /// one group, a group skipped.
    #[test]
    fn gathered_groups_hold_the_chosen_rows() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let model = sift_model::Model::load(root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
        let src = &model.layers[3].w_down;
        let mut row = vec![0f32; src.cols];
        let mut tested = 0;
        for ty in [WeightType::Q5_0, WeightType::Q4_K] {
            if !packed::repacks(ty, src.rows, src.cols) {
                continue;
            }
            let g = packed::group_rows(ty).unwrap();
            let plain: Vec<u8> = (0..src.rows)
                .flat_map(|r| {
                    src.ty.dequantize_row(model.row(src, r), &mut row);
                    scalar::quantize_row(ty, &row)
                })
                .collect();
            let rb = plain.len() / src.rows;
            let nb = rb / ty.block_bytes();
            let mut data = vec![0u8; plain.len()];
            for (s, d) in plain.chunks_exact(g * rb).zip(data.chunks_exact_mut(g * rb)) {
                packed::pack_group(ty, s, nb, d);
            }
            let w = QTensor {
                ty,
                rows: src.rows,
                cols: src.cols,
                row_bytes: rb,
                packed: true,
                range: 0..data.len(),
                ..src.clone()
            };
            let chosen: Vec<u32> = (0..src.rows as u32)
                .filter(|r| r % 3 == 0 || r % 7 == 1)
                .filter(|r| !(32..48).contains(r))
                .take(2 * g)
                .collect();
            let (mut out, mut scratch) = (vec![0u8; 2 * g * rb], Vec::new());
            for (o, c) in out.chunks_exact_mut(g * rb).zip(chosen.chunks_exact(g)) {
                gather_group(&w, &data, c, o, &mut scratch);
            }
            let mut back = vec![0u8; g * rb];
            for (o, c) in out.chunks_exact(g * rb).zip(chosen.chunks_exact(g)) {
                packed::unpack_group(ty, o, nb, &mut back);
                for (slot, &r) in c.iter().enumerate() {
                    let r = r as usize;
                    assert_eq!(
                        &back[slot * rb..(slot + 1) * rb],
                        &plain[r * rb..(r + 1) * rb],
                        "{} row {r}",
                        ty.name()
                    );
                }
            }
            tested += 1;
        }
        assert!(tested > 0, "Q4_K repacks on every CPU");
    }

    /// By hand: masses 1, 1, 2 at keep 0.5: T = 1.5; the largest first, b3 = 2/4 · 1.5 = 0.75,
    /// T = 0.75; b1 = 1/2 · 0.75 = 0.375, T = 0.375; b2 = 1/1 · 0.375. A layer capped at 1
    /// leaves the rest to the others, wherever it lies.
    #[test]
    fn algorithm_one_by_hand() {
        assert_eq!(linear_schedule(&[1.0, 1.0, 2.0], 0.5), vec![0.375, 0.375, 0.75]);
        for masses in [[8.0, 1.0, 1.0], [1.0, 1.0, 8.0]] {
            let capped = linear_schedule(&masses, 0.5);
            assert_eq!(capped.iter().copied().fold(0f32, f32::max), 1.0, "{capped:?}");
            assert!((capped.iter().sum::<f32>() - 1.5).abs() < 1e-6, "{capped:?}");
        }
        assert_eq!(linear_schedule(&[0.0, 0.0], 0.3), vec![0.3, 0.3]);
        assert_eq!(linear_schedule(&[1.0, f64::NAN], 0.3), vec![0.3, 0.3]);
    }

    /// The schedule's mean is the share asked for, at every share, on masses that rise towards
    /// the last layers (where the paper's order left the capped layers' excess unspent: 0.01
    /// asked, a mean of 0.05 skipped), as real attention masses do.
    #[test]
    fn the_schedule_keeps_what_is_asked_on_average() {
        let rising: Vec<f64> = (0..30).map(|l| 0.2 + 0.03 * l as f64).collect();
        for keep in [0.99f32, 0.9, 0.7, 0.5, 0.3, 0.1] {
            let s = linear_schedule(&rising, keep);
            let mean = s.iter().sum::<f32>() / s.len() as f32;
            assert!((mean - keep).abs() < 1e-5, "keep {keep}: mean {mean} of {s:?}");
            assert!(s.iter().all(|&b| (0.0..=1.0).contains(&b)), "{s:?}");
            // The more important layer never keeps less.
            assert!(s.windows(2).all(|w| w[0] <= w[1]), "{s:?}");
        }
    }

    /// The block grid is fixed by position: the same prompt read in one go, in chunks of 256 or
    /// after a cached prefix of 384 gives the same sparse blocks; a block split between calls,
    /// the first and the prompt's last run dense.
    #[test]
    fn the_block_grid_is_fixed_by_position() {
        let sparse = |v: Vec<(std::ops::Range<usize>, bool)>| -> Vec<usize> {
            v.into_iter().filter(|(_, s)| *s).map(|(r, _)| r.start / PREFILL_BLOCK).collect()
        };
        let whole = sparse(prompt_blocks(0, 700, 700));
        assert_eq!(whole, vec![1, 2, 3, 4]);
        let chunked: Vec<usize> =
            (0..700).step_by(256).flat_map(|s| sparse(prompt_blocks(s, (s + 256).min(700), 700))).collect();
        assert_eq!(chunked, whole);
        assert_eq!(sparse(prompt_blocks(384, 700, 700)), vec![3, 4]);
        // Starting inside block 3: it runs dense, the grid stays.
        assert_eq!(sparse(prompt_blocks(400, 700, 700)), vec![4]);
        let pieces = prompt_blocks(400, 700, 700);
        assert_eq!(pieces.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(), vec![400..512, 512..640, 640..700]);
        // A prompt ending on a block boundary: its last whole block is the dense one.
        assert_eq!(sparse(prompt_blocks(0, 384, 384)), vec![1]);
        assert_eq!(sparse_blocks(256), 0);
        assert_eq!(sparse_blocks(257), 1);
    }
}
