//! Sparsity-aware self-distillation (ActiveFlow §5) into LoRA adapters (DIP §4).
//!
//! The student is the model itself in candle, f32 weights dequantized from the GGUF and frozen,
//! run with a sift selector's masks at every site it sparsifies (the same `Selector` the engine
//! runs, so any method trains), plus trainable rank-r adapters `s · B·(A·x)` on the chosen ops,
//! computed on the op's masked input (where the engine adds them). The teacher is the dense model
//! as sift runs it (the engine's logits on the same tokens). The loss is the KL divergence from
//! the teacher's next-token distribution to the student's, averaged over tokens.
//!
//! The mask passes gradients straight through ([`ste_mask`]: forward `x ⊙ m`, backward the
//! identity), as ActiveFlow trains through its Top-K: the adapters of earlier layers learn from
//! every channel, not only the ones the mask happened to keep.

use candle_core::{DType, Device, Tensor, Var, D};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_engine::lora::{LoraAdapters, OpAdapter};
use sift_engine::sparsity::{Phase, Selection, Selector, Site};
use sift_model::layout::OpKind;
use sift_model::{Model, QTensor, RopeStyle};

/// Straight-through masking: `x ⊙ mask` forward, the identity backward.
pub fn ste_mask(x: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let masked = x.mul(mask)?;
    x.add(&(masked - x)?.detach())
}

/// A weight matrix dequantized to f32 (`rows × cols`).
fn dequantize(model: &Model, w: &QTensor) -> anyhow::Result<Tensor> {
    anyhow::ensure!(!w.packed, "{}: distillation needs the weights in their GGUF layout (not repacked)", w.name);
    let mut out = vec![0f32; w.rows * w.cols];
    for (r, row) in out.chunks_exact_mut(w.cols).enumerate() {
        w.ty.dequantize_row(model.row(w, r), row);
    }
    Ok(Tensor::from_vec(out, (w.rows, w.cols), &Device::Cpu)?)
}

struct StudentLayer {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    /// In [`OpKind::ALL`] order: rows = outputs, cols = inputs.
    w: Vec<Tensor>,
    bias: [Option<Tensor>; 3],
    /// Per op ([`OpKind::ALL`] order), the weights' own quantization grid, for ops trained
    /// quantization-aware ([`Student::quantization_aware`]).
    grids: Vec<Option<GridOp>>,
}

/// A quantized matrix's grid, value by value: level `q` of weight `k` is `offset[k] + q·step[k]`,
/// `q` in `0..=max` (the GGUF's own block scales, [`sift_quant::grid::RowGrid`]). As a candle op
/// (outside the graph) it rounds a matrix of the same shape to the nearest levels in one pass
/// over the values, without intermediates; the student adds the rounding as a detached
/// difference, so gradients pass straight through (the fake quantization of quantization-aware
/// training).
struct OpGrid {
    /// The steps, a huge number where a block's levels are all equal (so every value rounds to
    /// its one level).
    step: Vec<f32>,
    offset: Vec<f32>,
    max: f32,
    shape: (usize, usize),
}

impl OpGrid {
    fn of(model: &Model, w: &QTensor) -> anyhow::Result<OpGrid> {
        let (mut step, mut offset) = (Vec::with_capacity(w.rows * w.cols), Vec::with_capacity(w.rows * w.cols));
        let mut max = 0u8;
        for r in 0..w.rows {
            let g = sift_quant::grid::RowGrid::of(w.ty, model.row(w, r), w.cols).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: {:?} has no quantization grid to train on (--qat needs a quantized type)",
                    w.name,
                    w.ty
                )
            })?;
            max = g.max_code();
            for k in 0..w.cols {
                let a = g.step(k);
                step.push(if a == 0.0 { 1e30 } else { a });
                offset.push(g.level(k, 0));
            }
        }
        Ok(OpGrid { step, offset, max: max as f32, shape: (w.rows, w.cols) })
    }

    /// The level nearest `v` at value `k`.
    #[inline]
    fn nearest(&self, k: usize, v: f32) -> f32 {
        let q = ((v - self.offset[k]) / self.step[k]).round().clamp(0.0, self.max);
        q * self.step[k] + self.offset[k]
    }
}

/// An [`OpGrid`] as candle applies it.
type GridOp = std::sync::Arc<OpGrid>;

impl candle_core::CustomOp1 for OpGrid {
    fn name(&self) -> &'static str {
        "round-onto-grid"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let candle_core::CpuStorage::F32(v) = storage else { candle_core::bail!("round-onto-grid: f32 weights only") };
        let (Some((start, end)), true) = (layout.contiguous_offsets(), layout.dims() == [self.shape.0, self.shape.1])
        else {
            candle_core::bail!(
                "round-onto-grid: a contiguous {:?} matrix expected, got {:?}",
                self.shape,
                layout.dims()
            )
        };
        let out: Vec<f32> = v[start..end].iter().enumerate().map(|(k, &x)| self.nearest(k, x)).collect();
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// The frozen f32 model the adapters train on.
pub struct Student {
    layers: Vec<StudentLayer>,
    output_norm: Tensor,
    output: Tensor,
    cfg: sift_model::Config,
    /// The token embedding rows, dequantized on demand.
    embd: QTensor,
}

/// Trainable adapters: per layer, per op in [`OpKind::ALL`] order, `(A: r × n_in, B: n_out × r)`.
pub struct LoraVars {
    pub vars: Vec<Vec<Option<(Var, Var)>>>,
    pub rank: usize,
    pub alpha: f32,
}

impl Student {
    pub fn from_model(model: &Model) -> anyhow::Result<Student> {
        let c = &model.config;
        anyhow::ensure!(
            c.rope_dim == c.head_dim,
            "distillation needs RoPE over the whole head (rope_dim {} of {})",
            c.rope_dim,
            c.head_dim
        );
        let dev = Device::Cpu;
        let mut layers = Vec::with_capacity(c.n_layer);
        for lw in &model.layers {
            let w = OpKind::ALL.iter().map(|&op| dequantize(model, lw.op(op))).collect::<anyhow::Result<Vec<_>>>()?;
            let b = |v: &Option<Vec<f32>>| v.as_ref().map(|v| Tensor::from_slice(v, v.len(), &dev)).transpose();
            layers.push(StudentLayer {
                attn_norm: Tensor::from_slice(&lw.attn_norm, c.n_embd, &dev)?,
                ffn_norm: Tensor::from_slice(&lw.ffn_norm, c.n_embd, &dev)?,
                w,
                bias: [b(&lw.bq)?, b(&lw.bk)?, b(&lw.bv)?],
                grids: (0..OpKind::ALL.len()).map(|_| None).collect(),
            });
        }
        Ok(Student {
            layers,
            output_norm: Tensor::from_slice(&model.output_norm, c.n_embd, &dev)?,
            output: dequantize(model, &model.output)?,
            cfg: c.clone(),
            embd: model.tok_embd.clone(),
        })
    }

    /// Quantization-aware training of the adapters on `ops` (BitDistiller's, which ActiveFlow's
    /// self-distillation builds on): an adapted op computes with `W + s·B·A` rounded onto the
    /// weights' own grid (their GGUF block scales), straight through in the backward pass, so
    /// the adapters learn corrections that survive being fused and rounded onto that grid
    /// (`--rounding grid`), and the fused model is the model trained.
    pub fn quantization_aware(&mut self, model: &Model, ops: &[OpKind]) -> anyhow::Result<()> {
        for (lw, layer) in model.layers.iter().zip(&mut self.layers) {
            for (i, op) in OpKind::ALL.iter().enumerate() {
                if ops.contains(op) {
                    layer.grids[i] = Some(std::sync::Arc::new(OpGrid::of(model, lw.op(*op))?));
                }
            }
        }
        Ok(())
    }

    fn embed(&self, model: &Model, tokens: &[u32]) -> anyhow::Result<Tensor> {
        let d = self.cfg.n_embd;
        let mut x = vec![0f32; tokens.len() * d];
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            anyhow::ensure!((t as usize) < self.embd.rows, "token {t} outside the vocabulary");
            self.embd.ty.dequantize_row(model.row(&self.embd, t as usize), row);
        }
        Ok(Tensor::from_vec(x, (tokens.len(), d), &Device::Cpu)?)
    }

    /// RoPE tables for positions `0..t` (t × head_dim/2).
    fn rope_tables(&self, t: usize) -> anyhow::Result<(Tensor, Tensor)> {
        let half = self.cfg.head_dim / 2;
        // ggml's theta: pos · base^(-2i/dim), iterated in f32 as the engine does.
        let scale = self.cfg.rope_base.powf(-2.0 / self.cfg.rope_dim as f32);
        let (mut cos, mut sin) = (Vec::with_capacity(t * half), Vec::with_capacity(t * half));
        for p in 0..t {
            let mut theta = p as f32;
            for _ in 0..half {
                let (s, c) = theta.sin_cos();
                cos.push(c);
                sin.push(s);
                theta *= scale;
            }
        }
        let dev = Device::Cpu;
        Ok((Tensor::from_vec(cos, (t, half), &dev)?, Tensor::from_vec(sin, (t, half), &dev)?))
    }

    /// The student's logits (T × vocab) for `tokens` from position 0: `selector` masks every site
    /// (`None`: dense), `lora` adds its adapters.
    pub fn forward(
        &self,
        model: &Model,
        tokens: &[u32],
        selector: Option<&mut dyn Selector>,
        lora: Option<&LoraVars>,
    ) -> anyhow::Result<Tensor> {
        self.forward_tapped(model, tokens, selector, lora, &mut |_, _, _| Ok(()))
    }

    /// [`Student::forward`], handing `tap` each site's input as its ops see it (masked: T × width)
    /// with the layer and site.
    pub fn forward_tapped(
        &self,
        model: &Model,
        tokens: &[u32],
        selector: Option<&mut dyn Selector>,
        lora: Option<&LoraVars>,
        tap: &mut dyn FnMut(usize, Site, &Tensor) -> anyhow::Result<()>,
    ) -> anyhow::Result<Tensor> {
        self.run(model, tokens, selector, lora, tap, None)
    }

    /// [`Student::forward`], also giving the residual stream after every layer (T × n_embd each),
    /// for the layer-wise loss of [`train`].
    pub fn forward_with_residuals(
        &self,
        model: &Model,
        tokens: &[u32],
        selector: Option<&mut dyn Selector>,
        lora: Option<&LoraVars>,
    ) -> anyhow::Result<(Tensor, Vec<Tensor>)> {
        let mut residuals = Vec::with_capacity(self.layers.len());
        let logits = self.run(model, tokens, selector, lora, &mut |_, _, _| Ok(()), Some(&mut residuals))?;
        Ok((logits, residuals))
    }

    fn run(
        &self,
        model: &Model,
        tokens: &[u32],
        mut selector: Option<&mut dyn Selector>,
        lora: Option<&LoraVars>,
        tap: &mut dyn FnMut(usize, Site, &Tensor) -> anyhow::Result<()>,
        mut residuals: Option<&mut Vec<Tensor>>,
    ) -> anyhow::Result<Tensor> {
        let c = &self.cfg;
        let t = tokens.len();
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_head_kv);
        let mut x = self.embed(model, tokens)?;
        let (cos, sin) = self.rope_tables(t)?;
        let causal: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { f32::NEG_INFINITY } else { 0.0 }).collect();
        let causal = Tensor::from_vec(causal, (t, t), &Device::Cpu)?;
        if let Some(s) = selector.as_deref_mut() {
            s.reset();
            s.begin_batch(Phase::Generate);
        }
        let mut active = Vec::new();
        // CATS' gate first: the selector chooses the neurons on act(gate), before up.
        let gate_first = selector.as_deref().is_some_and(|s| s.gate_first());
        for (l, lw) in self.layers.iter().enumerate() {
            let mut site = |x: Tensor, site: Site| -> anyhow::Result<Tensor> {
                let x = match selector.as_deref_mut() {
                    Some(s) => mask_site(s, l, site, x, &mut active)?,
                    None => x,
                };
                tap(l, site, &x)?;
                Ok(x)
            };
            let lin = |x: &Tensor, op: OpKind| -> anyhow::Result<Tensor> {
                let i = OpKind::ALL.iter().position(|&o| o == op).expect("in ALL");
                let Some((a, b)) = lora.and_then(|v| v.vars[l][i].as_ref()) else {
                    return Ok(x.matmul(&lw.w[i].t()?)?);
                };
                let s = (lora.expect("checked").alpha / lora.expect("checked").rank as f32) as f64;
                if let Some(g) = &lw.grids[i] {
                    // The fused weights as they will be rounded, straight through.
                    let w = (&lw.w[i] + (b.as_tensor().matmul(a.as_tensor())? * s)?)?;
                    let wq = w.detach().apply_op1_no_bwd(g.as_ref())?;
                    let w = (&w + (wq - &w)?.detach())?;
                    return Ok(x.matmul(&w.t()?)?);
                }
                let y = x.matmul(&lw.w[i].t()?)?;
                Ok((y + (x.matmul(&a.as_tensor().t()?)?.matmul(&b.as_tensor().t()?)? * s)?)?)
            };
            // Attention.
            let h = candle_nn::ops::rms_norm_slow(&x, &lw.attn_norm, c.rms_eps)?;
            let h = site(h, Site::AttnIn)?;
            let mut q = lin(&h, OpKind::Q)?;
            let mut k = lin(&h, OpKind::K)?;
            let mut v = lin(&h, OpKind::V)?;
            if let Some(b) = &lw.bias[0] {
                q = q.broadcast_add(b)?;
            }
            if let Some(b) = &lw.bias[1] {
                k = k.broadcast_add(b)?;
            }
            if let Some(b) = &lw.bias[2] {
                v = v.broadcast_add(b)?;
            }
            let heads = |x: Tensor, n: usize| -> candle_core::Result<Tensor> {
                x.reshape((t, n, hd))?.transpose(0, 1)?.contiguous()?.unsqueeze(0)
            };
            let (q, k, v) = (heads(q, nh)?, heads(k, nkv)?, heads(v, nkv)?);
            let (q, k) = match c.rope_style {
                RopeStyle::Interleaved => (
                    candle_nn::rotary_emb::rope_i_slow(&q, &cos, &sin)?,
                    candle_nn::rotary_emb::rope_i_slow(&k, &cos, &sin)?,
                ),
                RopeStyle::Neox => (
                    candle_nn::rotary_emb::rope_slow(&q, &cos, &sin)?,
                    candle_nn::rotary_emb::rope_slow(&k, &cos, &sin)?,
                ),
            };
            // Grouped-query attention: query head h reads kv head h / (nh / nkv).
            let g = nh / nkv;
            let expand = |x: Tensor| -> candle_core::Result<Tensor> {
                x.squeeze(0)?.unsqueeze(1)?.broadcast_as((nkv, g, t, hd))?.contiguous()?.reshape((nh, t, hd))
            };
            let (q, k, v) = (q.squeeze(0)?, expand(k)?, expand(v)?);
            let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(&causal)?;
            let p = candle_nn::ops::softmax_last_dim(&scores)?;
            let att = p.matmul(&v)?.transpose(0, 1)?.reshape((t, nh * hd))?;
            let att = site(att, Site::AttnOut)?;
            x = (x + lin(&att, OpKind::O)?)?;
            // Feed-forward.
            let h = candle_nn::ops::rms_norm_slow(&x, &lw.ffn_norm, c.rms_eps)?;
            let h = site(h, Site::FfnIn)?;
            let glu = if gate_first {
                let act = candle_nn::ops::silu(&lin(&h, OpKind::Gate)?)?;
                let act = match selector.as_deref_mut() {
                    Some(s) => mask_site(s, l, Site::FfnMid, act, &mut active)?,
                    None => act,
                };
                let glu = (act * lin(&h, OpKind::Up)?)?;
                tap(l, Site::FfnMid, &glu)?;
                glu
            } else {
                site((candle_nn::ops::silu(&lin(&h, OpKind::Gate)?)? * lin(&h, OpKind::Up)?)?, Site::FfnMid)?
            };
            x = (x + lin(&glu, OpKind::Down)?)?;
            if let Some(r) = residuals.as_deref_mut() {
                r.push(x.clone());
            }
        }
        if let Some(s) = selector {
            s.end_batch(Phase::Generate);
        }
        let x = candle_nn::ops::rms_norm_slow(&x, &self.output_norm, c.rms_eps)?;
        Ok(x.matmul(&self.output.t()?)?)
    }
}

/// Asks `selector` for each row of `x` at `site` and masks the inactive inputs (straight
/// through).
fn mask_site(
    selector: &mut dyn Selector,
    l: usize,
    site: Site,
    x: Tensor,
    active: &mut Vec<u32>,
) -> anyhow::Result<Tensor> {
    let rows = x.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let width = rows.first().map_or(0, Vec::len);
    let mut mask = vec![1f32; rows.len() * width];
    let mut any = false;
    for (row, m) in rows.iter().zip(mask.chunks_exact_mut(width)) {
        if selector.select(l, site, Phase::Generate, row, active) == Selection::Subset {
            any = true;
            m.iter_mut().for_each(|v| *v = 0.0);
            for &j in active.iter() {
                if let Some(v) = m.get_mut(j as usize) {
                    *v = 1.0;
                }
            }
        }
    }
    if !any {
        return Ok(x);
    }
    let mask = Tensor::from_vec(mask, (rows.len(), width), &Device::Cpu)?;
    Ok(ste_mask(&x, &mask)?)
}

impl LoraVars {
    /// New adapters on `ops` of every layer: A Gaussian (std 1/√n_in), B zero (the student starts
    /// as the sparse model itself); or `init`'s values where it has them (a resumed run).
    pub fn new(
        model: &Model,
        ops: &[OpKind],
        rank: usize,
        alpha: f32,
        seed: u64,
        init: Option<&LoraAdapters>,
    ) -> anyhow::Result<LoraVars> {
        let mut rng = StdRng::seed_from_u64(seed);
        let dev = Device::Cpu;
        let mut vars = Vec::with_capacity(model.layers.len());
        for (l, lw) in model.layers.iter().enumerate() {
            let mut row = Vec::with_capacity(7);
            for op in OpKind::ALL {
                if !ops.contains(&op) {
                    row.push(None);
                    continue;
                }
                let w = lw.op(op);
                let (n_in, n_out) = (w.cols, w.rows);
                let (a, b) = match init.and_then(|i| i.get(l, op)).filter(|a| a.rank == rank) {
                    Some(a) => {
                        let mut am = vec![0f32; rank * n_in];
                        for j in 0..n_in {
                            for i in 0..rank {
                                am[i * n_in + j] = a.a_t[j * rank + i];
                            }
                        }
                        (am, sift_engine::lora::transpose(&a.b_t, rank, a.n_out))
                    }
                    None => {
                        let std = 1.0 / (n_in as f32).sqrt();
                        let am = (0..rank * n_in)
                            .map(|_| {
                                let (u1, u2): (f32, f32) = (rng.random::<f32>().max(1e-7), rng.random::<f32>());
                                std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
                            })
                            .collect();
                        (am, vec![0f32; n_out * rank])
                    }
                };
                row.push(Some((Var::from_vec(a, (rank, n_in), &dev)?, Var::from_vec(b, (n_out, rank), &dev)?)));
            }
            vars.push(row);
        }
        Ok(LoraVars { vars, rank, alpha })
    }

    pub fn all(&self) -> Vec<Var> {
        self.vars.iter().flatten().flatten().flat_map(|(a, b)| [a.clone(), b.clone()]).collect()
    }

    /// The adapters as the engine applies them.
    pub fn to_adapters(&self) -> anyhow::Result<LoraAdapters> {
        let mut out = LoraAdapters::empty(self.vars.len(), self.alpha);
        for (l, row) in self.vars.iter().enumerate() {
            for (op, v) in OpKind::ALL.iter().zip(row) {
                let Some((a, b)) = v else { continue };
                let (r, n_in) = a.as_tensor().dims2()?;
                let n_out = b.as_tensor().dims2()?.0;
                let a_t = a.as_tensor().t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                let b_t = b.as_tensor().t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                out.set(l, *op, OpAdapter { n_in, n_out, rank: r, a_t, b_t });
            }
        }
        Ok(out)
    }
}

/// The KL divergence from `teacher` (logits, T × V) to `student` (logits, T × V), mean over rows.
pub fn kl_loss(teacher: &Tensor, student: &Tensor) -> candle_core::Result<Tensor> {
    let lp = candle_nn::ops::log_softmax(teacher, D::Minus1)?;
    let p = lp.exp()?;
    let lq = candle_nn::ops::log_softmax(student, D::Minus1)?;
    let t = teacher.dims2()?.0 as f64;
    (p * (lp - lq)?)?.sum_all()? / t
}

/// The layer-wise loss: the mean over layers of the squared distance between the student's and
/// the teacher's residual streams after each layer, both RMS-normalized per token (so every
/// layer counts alike whatever its scale), averaged over tokens and channels.
pub fn residual_loss(teacher: &[Tensor], student: &[Tensor]) -> candle_core::Result<Tensor> {
    let norm = |x: &Tensor| -> candle_core::Result<Tensor> {
        let ms = (x.sqr()?.mean_keepdim(D::Minus1)? + 1e-6)?;
        x.broadcast_div(&ms.sqrt()?)
    };
    let mut sum: Option<Tensor> = None;
    for (t, s) in teacher.iter().zip(student) {
        let l = (norm(s)? - norm(t)?)?.sqr()?.mean_all()?;
        sum = Some(match sum {
            Some(acc) => (acc + l)?,
            None => l,
        });
    }
    match sum {
        Some(s) => s / teacher.len().max(1) as f64,
        None => Tensor::new(0f32, &Device::Cpu),
    }
}

/// AdamW (decoupled weight decay 0) over the adapters, with its moments kept so that a run
/// resumed from a checkpoint continues exactly where it stopped.
pub struct Adam {
    /// The peak learning rate.
    pub lr: f64,
    /// Steps taken (over every run that led here).
    pub step: u64,
    /// The schedule's length: a linear warm-up over its first 5 %, then a cosine from `lr` down
    /// to `lr / 10` at `horizon`, `lr / 10` after (0: `lr` throughout). One window per step is a
    /// noisy gradient; the decay makes the adapters the run ends with its settled ones.
    pub horizon: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

impl Adam {
    /// Zero moments for `vars`.
    pub fn new(vars: &[Var], lr: f64) -> candle_core::Result<Adam> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        Ok(Adam {
            lr,
            step: 0,
            horizon: 0,
            m: vars.iter().map(zeros).collect::<candle_core::Result<_>>()?,
            v: vars.iter().map(zeros).collect::<candle_core::Result<_>>()?,
        })
    }

    /// The learning rate of step `step` (1-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if self.horizon == 0 {
            return self.lr;
        }
        let warm = (self.horizon / 20).max(1);
        if step <= warm {
            return self.lr * step as f64 / warm as f64;
        }
        let t = ((step - warm) as f64 / (self.horizon - warm).max(1) as f64).min(1.0);
        self.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
    }

    /// One update of `vars` from the gradients of `loss`.
    pub fn backward_step(&mut self, vars: &[Var], loss: &Tensor) -> candle_core::Result<()> {
        let grads = loss.backward()?;
        let g: Vec<Option<Tensor>> = vars.iter().map(|v| grads.get(v.as_tensor()).cloned()).collect();
        self.update(vars, &g)
    }

    /// One update of `vars` from their gradients `grads` (`None`: the variable got none).
    pub fn update(&mut self, vars: &[Var], grads: &[Option<Tensor>]) -> candle_core::Result<()> {
        self.step += 1;
        let lr = self.lr_at(self.step);
        let t = self.step as i32;
        let (c1, c2) = (1.0 - BETA1.powi(t), 1.0 - BETA2.powi(t));
        for (i, var) in vars.iter().enumerate() {
            // Detached: a gradient can carry the graph it was computed from (candle tracks the
            // product of a detached gradient with a variable), which the moments would then keep
            // alive from step to step.
            let Some(g) = grads[i].as_ref().map(Tensor::detach) else { continue };
            let g = &g;
            self.m[i] = ((&self.m[i] * BETA1)? + (g * (1.0 - BETA1))?)?;
            self.v[i] = ((&self.v[i] * BETA2)? + (g.sqr()? * (1.0 - BETA2))?)?;
            let mhat = (&self.m[i] / c1)?;
            let vhat = (&self.v[i] / c2)?;
            let delta = (mhat / (vhat.sqrt()? + EPS)?)?;
            var.set(&(var.as_tensor() - (delta * lr)?)?)?;
        }
        Ok(())
    }

    /// The moments and the step count as a GGUF (`OUT.adam` beside the adapters).
    pub fn to_gguf(&self) -> anyhow::Result<Vec<u8>> {
        let mut w = sift_gguf::GgufWriter::new();
        w.meta("sift.adam.step", sift_gguf::WriteValue::U64(self.step));
        w.meta("sift.adam.horizon", sift_gguf::WriteValue::U64(self.horizon));
        for (i, (m, v)) in self.m.iter().zip(&self.v).enumerate() {
            for (name, t) in [("m", m), ("v", v)] {
                let (r, c) = t.dims2()?;
                w.tensor_f32(&format!("{i}.{name}"), r, c, t.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        Ok(w.to_bytes())
    }

    /// Moments for `vars` read back from [`Adam::to_gguf`]'s bytes; refused when they do not fit.
    pub fn from_gguf(bytes: &[u8], vars: &[Var], lr: f64) -> anyhow::Result<Adam> {
        let g = sift_gguf::Gguf::parse(bytes)?;
        let step = g.get_u64("sift.adam.step").ok_or_else(|| anyhow::anyhow!("no step count"))?;
        let mut adam = Adam::new(vars, lr)?;
        adam.step = step;
        adam.horizon = g.get_u64("sift.adam.horizon").unwrap_or(0);
        for (i, var) in vars.iter().enumerate() {
            let (r, c) = var.as_tensor().dims2()?;
            for (name, slot) in [("m", &mut adam.m[i]), ("v", &mut adam.v[i])] {
                let key = format!("{i}.{name}");
                let t =
                    g.tensor(&key).ok_or_else(|| anyhow::anyhow!("'{key}' is missing: the adapters changed shape"))?;
                anyhow::ensure!(
                    t.dims == [c as u64, r as u64] && t.ty == sift_gguf::GgmlType::F32,
                    "'{key}' has another shape"
                );
                let at = (g.data_offset + t.offset) as usize;
                let raw = bytes.get(at..at + 4 * r * c).ok_or_else(|| anyhow::anyhow!("'{key}' lies past the end"))?;
                let vals: Vec<f32> =
                    raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                anyhow::ensure!(vals.iter().all(|x| x.is_finite()), "'{key}' holds non-finite values");
                *slot = Tensor::from_vec(vals, (r, c), &Device::Cpu)?;
            }
        }
        Ok(adam)
    }
}

/// Training settings.
#[derive(Clone, Debug)]
pub struct DistillOptions {
    /// Steps of this call.
    pub steps: usize,
    pub seq: usize,
    pub seed: u64,
    /// Windows per step: their gradients are averaged before the update (a larger batch at
    /// the same memory; 1: one window per step).
    pub accumulate: usize,
    /// Weight of the layer-wise loss ([`residual_loss`] against the dense model's residual
    /// streams, computed by the student's own dense forward pass) added to the KL (0: KL only).
    pub layer_weight: f32,
}

/// Where the window of global step `step` starts: drawn from `seed` and the step alone, so a run
/// cut into pieces (checkpoints, `--resume`) draws the windows one run would.
fn window_start(seed: u64, step: u64, n: usize) -> usize {
    let mut rng = StdRng::seed_from_u64(seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    rng.random_range(0..n)
}

/// Trains `lora` for `o.steps` steps, continuing `adam` (its step count places the windows), on
/// windows of `tokens` (each `o.seq` long): `teacher(window)` gives the dense logits (T × V,
/// row-major). `progress(step, loss)` after each step (the global step). Returns the mean loss
/// of the last tenth of the steps.
#[allow(clippy::too_many_arguments)]
pub fn train(
    student: &Student,
    model: &Model,
    selector: &mut dyn Selector,
    lora: &LoraVars,
    adam: &mut Adam,
    tokens: &[u32],
    o: &DistillOptions,
    teacher: &mut dyn FnMut(&[u32]) -> anyhow::Result<Vec<f32>>,
    progress: &mut dyn FnMut(u64, f32) -> anyhow::Result<()>,
) -> anyhow::Result<f32> {
    anyhow::ensure!(
        tokens.len() > o.seq,
        "the training text has {} tokens, fewer than one window of {}",
        tokens.len(),
        o.seq
    );
    let vars = lora.all();
    let vocab = student.cfg.n_vocab;
    let tail = (o.steps / 10).max(1);
    let mut tail_sum = 0.0f64;
    let accumulate = o.accumulate.max(1);
    for i in 0..o.steps {
        let mut grads: Vec<Option<Tensor>> = vec![None; vars.len()];
        let mut v = 0.0f32;
        for k in 0..accumulate {
            // Window `k` of the step (one window per step draws exactly what it drew before).
            let draw = adam.step * accumulate as u64 + k as u64;
            let start = window_start(o.seed, draw, tokens.len() - o.seq);
            let window = &tokens[start..start + o.seq];
            let t = Tensor::from_vec(teacher(window)?, (o.seq, vocab), &Device::Cpu)?;
            let loss = if o.layer_weight > 0.0 {
                let (_, dense) = student.forward_with_residuals(model, window, None, None)?;
                let (s, sparse) = student.forward_with_residuals(model, window, Some(&mut *selector), Some(lora))?;
                (kl_loss(&t, &s)? + (residual_loss(&dense, &sparse)? * o.layer_weight as f64)?)?
            } else {
                let s = student.forward(model, window, Some(&mut *selector), Some(lora))?;
                kl_loss(&t, &s)?
            };
            let loss = (loss / accumulate as f64)?;
            let lv = loss.to_scalar::<f32>()?;
            anyhow::ensure!(lv.is_finite(), "the loss became {lv} at step {}: lower --lr", adam.step + 1);
            v += lv;
            let g = loss.backward()?;
            for (sum, var) in grads.iter_mut().zip(&vars) {
                if let Some(gv) = g.get(var.as_tensor()) {
                    *sum = Some(match sum.take() {
                        Some(acc) => (acc + gv)?,
                        None => gv.clone(),
                    });
                }
            }
        }
        adam.update(&vars, &grads)?;
        if i + tail >= o.steps {
            tail_sum += v as f64;
        }
        progress(adam.step, v)?;
    }
    Ok((tail_sum / tail.min(o.steps) as f64) as f32)
}
