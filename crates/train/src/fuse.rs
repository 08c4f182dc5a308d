//! Quantization-aware fusing of distilled adapters: GPTQ's error feedback (Frantar et al., 2023)
//! when `s·B·A` is added into 4-bit weights.
//!
//! Rounding each fused weight on its own ([`sift_engine::lora::fuse`]) adds an error per weight
//! that is as large as the correction itself at 4 bits. What matters is the error of the op's
//! *output* on the inputs the model really sees, `E‖(Ŵ − W)·x‖²`, which depends on the inputs'
//! second moments `H = E[x·xᵀ]`. GPTQ rounds one input column at a time and moves the rounding
//! error of each weight onto the row's weights not yet rounded, in proportion to how their inputs
//! correlate (the rows of the upper Cholesky factor of `H⁻¹`), so the row's output error stays
//! small even where each weight's own error is not.
//!
//! Here `H` is measured on the student under the selector's masks, adapters on (the inputs the
//! fused model will multiply), in windows of [`WINDOW`] inputs: the feedback runs within a
//! window (a block-diagonal `H`), which keeps the factorizations small on wide ops (Qwen's down
//! projection reads 4,864 inputs). The levels are a tensor's own grid or block scales chosen
//! afresh for the fused values ([`Levels`]), written by `sift_quant::grid`.

use crate::distill::{LoraVars, Student};
use candle_core::Tensor;
use sift_engine::lora::{fused_row, LoraAdapters};
use sift_engine::sparsity::Selector;
use sift_model::layout::OpKind;
use sift_model::Model;
use sift_quant::grid::RowGrid;

/// Inputs per feedback window (a block of `H` factored on its own).
pub const WINDOW: usize = 512;

/// GPTQ's damping: `λ = DAMP · mean(diag H)` added to the diagonal.
const DAMP: f64 = 0.01;

/// One site's input second moments, `Σ x·xᵀ` over the calibration tokens, per window of inputs.
pub struct SiteMoments {
    width: usize,
    /// Per window (`WINDOW` inputs, the last one shorter): its `len × len` block, row-major.
    blocks: Vec<Vec<f64>>,
}

impl SiteMoments {
    fn new(width: usize) -> SiteMoments {
        let blocks = (0..width).step_by(WINDOW).map(|c0| vec![0f64; (width - c0).min(WINDOW).pow(2)]).collect();
        SiteMoments { width, blocks }
    }

    fn add(&mut self, x: &Tensor) -> anyhow::Result<()> {
        for (w, block) in self.blocks.iter_mut().enumerate() {
            let c0 = w * WINDOW;
            let len = (self.width - c0).min(WINDOW);
            let xw = x.narrow(1, c0, len)?.contiguous()?;
            let g = xw.t()?.matmul(&xw)?.flatten_all()?.to_vec1::<f32>()?;
            for (b, v) in block.iter_mut().zip(g) {
                *b += v as f64;
            }
        }
        Ok(())
    }
}

/// Every layer's and site's [`SiteMoments`].
pub struct InputMoments {
    layers: Vec<Vec<SiteMoments>>,
    /// Calibration tokens seen.
    pub tokens: usize,
}

impl InputMoments {
    /// The moments of the student's site inputs over `windows` (each from position 0), under
    /// `selector` (masked inputs; the dense selector for none) with `lora` on.
    pub fn collect(
        student: &Student,
        model: &Model,
        selector: &mut dyn Selector,
        lora: Option<&LoraVars>,
        windows: &[&[u32]],
    ) -> anyhow::Result<InputMoments> {
        let c = &model.config;
        let widths = sift_model::layout::SiteDims::of(c).units;
        let mut layers: Vec<Vec<SiteMoments>> =
            (0..c.n_layer).map(|_| widths.iter().map(|&w| SiteMoments::new(w)).collect()).collect();
        let mut tokens = 0;
        for w in windows {
            student.forward_tapped(model, w, Some(&mut *selector), lora, &mut |l, site, x| {
                layers[l][site as usize].add(x)
            })?;
            tokens += w.len();
        }
        Ok(InputMoments { layers, tokens })
    }
}

/// Lower Cholesky factor of the symmetric positive definite `a` (`n × n`, row-major), in place
/// (the upper triangle left as it was); `false` if `a` is not positive definite.
fn cholesky(a: &mut [f64], n: usize) -> bool {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d <= 0.0 || !d.is_finite() {
            return false;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    true
}

/// GPTQ's factor: the upper Cholesky factor `U` of `(H + λI)⁻¹` (`n × n`, row-major, f32), or
/// `None` when `H` cannot be factored even damped. Inputs never seen (a zero diagonal) get a unit
/// diagonal: their weights are rounded to the nearest level and pass no error on.
fn feedback_factor(h: &[f64], n: usize) -> Option<Vec<f32>> {
    let mut a = h.to_vec();
    let mean = (0..n).map(|i| a[i * n + i]).sum::<f64>() / n as f64;
    for i in 0..n {
        if a[i * n + i] <= 0.0 {
            for j in 0..n {
                a[i * n + j] = 0.0;
                a[j * n + i] = 0.0;
            }
            a[i * n + i] = 1.0;
        }
        a[i * n + i] += DAMP * mean.max(f64::MIN_POSITIVE);
    }
    if !cholesky(&mut a, n) {
        return None;
    }
    // L⁻¹ kept transposed (`lt[j·n + k]` = L⁻¹[k][j], upper), so every sum below runs along
    // rows; then H⁻¹ = L⁻ᵀ·L⁻¹, its Cholesky factor, transposed.
    let mut lt = vec![0f64; n * n];
    for i in 0..n {
        let d = a[i * n + i];
        lt[i * n + i] = 1.0 / d;
        let ai = &a[i * n..i * n + i];
        for j in 0..i {
            let s: f64 = ai[j..].iter().zip(&lt[j * n + j..j * n + i]).map(|(x, y)| x * y).sum();
            lt[j * n + i] = -s / d;
        }
    }
    let mut inv = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = lt[i * n + i..(i + 1) * n].iter().zip(&lt[j * n + i..(j + 1) * n]).map(|(x, y)| x * y).sum();
            inv[i * n + j] = s;
            inv[j * n + i] = s;
        }
    }
    if !cholesky(&mut inv, n) {
        return None;
    }
    let mut u = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..=i {
            u[j * n + i] = inv[i * n + j] as f32;
        }
    }
    Some(u)
}

/// One window's feedback: its inputs in the order they are rounded (largest second moment
/// first, GPTQ's "act order": the inputs that matter most are rounded while the most weights are
/// left to take their error) and [`feedback_factor`] of the moments in that order.
struct WindowFeedback {
    order: Vec<usize>,
    u: Option<Vec<f32>>,
}

/// A site's feedback, per window.
fn site_factors(m: &SiteMoments) -> Vec<WindowFeedback> {
    m.blocks
        .iter()
        .enumerate()
        .map(|(w, b)| {
            let len = (m.width - w * WINDOW).min(WINDOW);
            let mut order: Vec<usize> = (0..len).collect();
            order.sort_by(|&i, &j| b[j * len + j].total_cmp(&b[i * len + i]));
            let mut p = vec![0f64; len * len];
            for (i, &oi) in order.iter().enumerate() {
                for (j, &oj) in order.iter().enumerate() {
                    p[i * len + j] = b[oi * len + oj];
                }
            }
            WindowFeedback { u: feedback_factor(&p, len), order }
        })
        .collect()
}

/// Rounds `rows` (`target`: `rows.len() × n` fused values, consumed as scratch) onto `grids`
/// with error feedback inside each window, `factors` from [`site_factors`].
fn round_with_feedback(target: &mut [f32], grids: &mut [RowGrid], n: usize, factors: &[WindowFeedback]) {
    for (w, f) in factors.iter().enumerate() {
        let c0 = w * WINDOW;
        let len = f.order.len();
        for (row, g) in target.chunks_exact_mut(n).zip(grids.iter_mut()) {
            let win = &mut row[c0..c0 + len];
            for (i, &k) in f.order.iter().enumerate() {
                let v = win[k];
                let q = g.round(c0 + k, v);
                let Some(u) = &f.u else { continue };
                let e = (v - q) / u[i * len + i];
                for (&j, uu) in f.order[i + 1..].iter().zip(&u[i * len + i + 1..(i + 1) * len]) {
                    win[j] -= e * uu;
                }
            }
        }
    }
}

/// Which levels [`fuse_with_feedback`] rounds onto.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Levels {
    /// Each row's own block scales (the file's grid).
    Own,
    /// Block scales chosen afresh for the fused values.
    Fresh,
}

/// The model's GGUF with `adapters` fused into the weights they adapt, each adapted tensor
/// rounded onto `levels` with GPTQ's error feedback from `moments` (see the module docs);
/// the file's layout unchanged, as [`sift_engine::lora::fuse`]. Float tensors are written as
/// they are; `threads` split the rows.
pub fn fuse_with_feedback(
    model: &Model,
    adapters: &LoraAdapters,
    levels: Levels,
    moments: &InputMoments,
    threads: usize,
) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(model.columns.is_none(), "fusing needs the GGUF model, not its pack");
    anyhow::ensure!(moments.layers.len() == model.layers.len(), "input moments of another model");
    let mut bytes = model.file.bytes().to_vec();
    for (l, lw) in model.layers.iter().enumerate() {
        let mut factors: [Option<Vec<WindowFeedback>>; 4] = Default::default();
        for op in OpKind::ALL {
            if adapters.get(l, op).is_none() {
                continue;
            }
            let w = lw.op(op);
            anyhow::ensure!(!w.packed, "{}: the weights are repacked; fuse from the file as it is", w.name);
            let m = &moments.layers[l][op.site_index()];
            let f: &[WindowFeedback] = factors[op.site_index()].get_or_insert_with(|| site_factors(m));
            anyhow::ensure!(m.width == w.cols, "{}: input moments of width {} for {} inputs", w.name, m.width, w.cols);
            let n = w.cols;
            let mut target = vec![0f32; w.rows * n];
            for (r, row) in target.chunks_exact_mut(n).enumerate() {
                fused_row(model, adapters, l, op, r, row);
            }
            let file = &bytes[w.range.clone()];
            let src = |r: usize| &file[r * w.row_bytes..(r + 1) * w.row_bytes];
            if RowGrid::of(w.ty, src(0), n).is_none() {
                // A float tensor: the fused values as they are.
                for (r, row) in target.chunks_exact(n).enumerate() {
                    let at = w.range.start + r * w.row_bytes;
                    bytes[at..at + w.row_bytes].copy_from_slice(&sift_quant::scalar::quantize_row(w.ty, row));
                }
                continue;
            }
            let round_row = |r: usize, t: &[f32]| -> RowGrid {
                let mut g = match levels {
                    Levels::Own => RowGrid::of(w.ty, src(r), n),
                    Levels::Fresh => RowGrid::of(w.ty, &sift_quant::scalar::quantize_row(w.ty, t), n),
                }
                .expect("a quantized row has a grid");
                round_with_feedback(&mut t.to_vec(), std::slice::from_mut(&mut g), n, f);
                g
            };
            let per = w.rows.div_ceil(threads.max(1));
            let rows: Vec<RowGrid> = std::thread::scope(|s| {
                let handles: Vec<_> = target
                    .chunks(per * n)
                    .enumerate()
                    .map(|(c, t)| {
                        let round_row = &round_row;
                        s.spawn(move || {
                            t.chunks_exact(n).enumerate().map(|(i, t)| round_row(c * per + i, t)).collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().expect("a fusing thread panicked")).collect()
            });
            for (r, g) in rows.iter().enumerate() {
                let at = w.range.start + r * w.row_bytes;
                g.write(&mut bytes[at..at + w.row_bytes]);
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `U` is the upper Cholesky factor of `(H + λI)⁻¹`: `Uᵀ·U·(H + λI) = I`.
    #[test]
    fn the_feedback_factor_inverts_the_damped_moments() {
        let n = 7;
        let x: Vec<f64> = (0..n * 20).map(|i| ((i * 37 % 23) as f64 - 11.0) / 7.0 + (i % n) as f64 * 0.1).collect();
        let mut h = vec![0f64; n * n];
        for t in 0..20 {
            for i in 0..n {
                for j in 0..n {
                    h[i * n + j] += x[t * n + i] * x[t * n + j];
                }
            }
        }
        let u = feedback_factor(&h, n).unwrap();
        let mean = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
        for i in 0..n {
            for j in 0..i {
                assert_eq!(u[i * n + j], 0.0, "upper triangular");
            }
        }
        for i in 0..n {
            for j in 0..n {
                // (UᵀU)(H + λI) row i, column j.
                let mut s = 0f64;
                for k in 0..n {
                    let utu: f64 = (0..n).map(|p| u[p * n + i] as f64 * u[p * n + k] as f64).sum();
                    s += utu * (h[k * n + j] + if k == j { DAMP * mean } else { 0.0 });
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-4, "({i},{j}): {s}");
            }
        }
    }

    /// With error feedback the output error on the calibration inputs is smaller than with
    /// each weight rounded on its own, on correlated inputs.
    #[test]
    fn feedback_lowers_the_output_error_on_correlated_inputs() {
        use sift_quant::WeightType;
        let (n, rows, t) = (64, 8, 200);
        // Inputs with a strong shared component (correlated channels).
        let xs: Vec<f32> = (0..t * n)
            .map(|i| {
                let (tok, c) = (i / n, i % n);
                ((tok * 7919 % 101) as f32 / 50.0 - 1.0) + 0.3 * (((tok * 31 + c * 17) % 29) as f32 / 14.0 - 1.0)
            })
            .collect();
        let x = Tensor::from_vec(xs.clone(), (t, n), &candle_core::Device::Cpu).unwrap();
        let mut m = SiteMoments::new(n);
        m.add(&x).unwrap();
        let w: Vec<f32> = (0..rows * n).map(|i| (((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5) * 0.1).collect();
        let out_err = |q: &[f32]| -> f64 {
            let mut e = 0f64;
            for tok in 0..t {
                for r in 0..rows {
                    let d: f32 = (0..n).map(|c| (q[r * n + c] - w[r * n + c]) * xs[tok * n + c]).sum();
                    e += (d as f64).powi(2);
                }
            }
            e
        };
        let ty = WeightType::Q4_1;
        let grids = || -> Vec<RowGrid> {
            w.chunks(n).map(|r| RowGrid::of(ty, &sift_quant::scalar::quantize_row(ty, r), n).unwrap()).collect()
        };
        let mut plain = grids();
        let rtn: Vec<f32> = plain
            .iter_mut()
            .zip(w.chunks(n))
            .flat_map(|(g, r)| (0..n).map(|k| g.round(k, r[k])).collect::<Vec<_>>())
            .collect();
        let mut fb = grids();
        let mut scratch = w.clone();
        round_with_feedback(&mut scratch, &mut fb, n, &site_factors(&m));
        let gq: Vec<f32> = fb.iter().flat_map(|g| (0..n).map(|k| g.value(k)).collect::<Vec<_>>()).collect();
        let (e0, e1) = (out_err(&rtn), out_err(&gq));
        assert!(e1 < 0.7 * e0, "feedback {e1} vs nearest {e0}");
    }
}
