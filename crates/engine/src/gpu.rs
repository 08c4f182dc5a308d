//! Layers held on the GPU: sift's dense GPU path, llama.cpp's layer split (`-ngl N`,
//! `--gpu-memory`), the first piece of KAIROX's CUDA tier (issue 20).
//!
//! [`GpuPlacement`] says which layers go to the GPU, as llama.cpp places them: the last
//! `n_gpu_layers` transformer layers, and the output head when `n_gpu_layers` exceeds the layer
//! count; [`GpuPlacement::fit`] picks the most that fit a byte budget, their KV cache counted in.
//! [`GpuLayers`] holds those layers on the device: their seven matrices in GGUF layout (Q4_K
//! matrices the CPU repacked are unpacked on the way), norms, biases and an f16 KV cache.
//!
//! Two ways to run them:
//! - **whole layers** (dense runs): the batch's hidden state goes to the GPU once, every held
//!   layer runs there (norms, products, RoPE, attention over the GPU's KV cache), and the hidden
//!   state — or, when the GPU holds the head, the logits — comes back once
//!   ([`GpuLayers::run_layers`]);
//! - **op by op** (a sparsity method chooses inputs, a tracer watches, or the kernels do not take
//!   the model's shapes): at each selection site the (masked) input goes to the GPU and the site's
//!   products come back; norms and attention run on the CPU over the CPU's KV cache. A masked
//!   input is multiplied densely (the numbers of the CPU's masked dense kernels, without the
//!   column kernels' savings); a fixed neuron set (core neurons) needs no row gather, as the
//!   selector masks the other neurons at the down projection.
//!
//! - **attention only** ([`GpuLayers::upload_attention`], KAIROX's placement under the hybrid
//!   decode of [`crate::hybrid`]): every layer's attention half runs on the GPU over the GPU's KV
//!   cache — the residual stream goes there and back once per layer ([`GpuLayers::run_attention`])
//!   — and the FFN runs on the CPU, its active units split with the GPU's column pools. Attention
//!   then runs dense: the selector is asked at the FFN's sites only.
//!
//! A sequence's keys and values of the held layers live where its tokens ran; switching ways
//! mid-sequence is refused with an error (the positions of the other side would be missing).

use sift_gpu::{GpuDevice, GpuError, GpuHead, GpuJob, GpuKv, GpuLayer, GpuMatrix, GpuVec, StackDims};
use sift_model::layout::OpKind;
use sift_model::{Model, QTensor, RopeStyle};
use sift_quant::packed::unpack_group;
use sift_sparsity::Site;

/// Which parts of a model the GPU holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuPlacement {
    /// Layers `first_layer..n_layer` are on the GPU.
    pub first_layer: usize,
    pub n_layer: usize,
    /// The output head too.
    pub output: bool,
}

impl GpuPlacement {
    /// llama.cpp's `-ngl N`: the last `N` layers, the output head when `N > n_layer` (`-ngl 99`:
    /// everything).
    pub fn from_layers(n_gpu_layers: usize, n_layer: usize) -> GpuPlacement {
        GpuPlacement { first_layer: n_layer.saturating_sub(n_gpu_layers), n_layer, output: n_gpu_layers > n_layer }
    }

    /// The `-ngl` this placement is.
    pub fn n_gpu_layers(&self) -> usize {
        self.n_layer - self.first_layer + self.output as usize
    }

    /// The most layers (in llama.cpp's order) whose matrices and KV cache for `kv_positions`
    /// positions fit in `budget` bytes.
    pub fn fit(model: &Model, budget: u64, kv_positions: usize) -> GpuPlacement {
        let n_layer = model.layers.len();
        let mut best = GpuPlacement::from_layers(0, n_layer);
        for n in 1..=n_layer + 1 {
            let p = GpuPlacement::from_layers(n, n_layer);
            if p.bytes(model, kv_positions) > budget {
                break;
            }
            best = p;
        }
        best
    }

    /// Device bytes of what this placement holds: matrices, norms, biases, and the KV cache of
    /// `kv_positions` positions.
    pub fn bytes(&self, model: &Model, kv_positions: usize) -> u64 {
        let layers: u64 = (self.first_layer..self.n_layer).map(|l| layer_bytes(model, l, kv_positions)).sum();
        layers + if self.output { tensor_bytes(&model.output) + 4 * model.output_norm.len() as u64 } else { 0 }
    }

    pub fn holds_layer(&self, l: usize) -> bool {
        (self.first_layer..self.n_layer).contains(&l)
    }
}

fn tensor_bytes(t: &QTensor) -> u64 {
    (t.rows * t.row_bytes) as u64
}

/// Device bytes of layer `l` on the GPU: its seven matrices, norms and biases, and its KV cache
/// of `kv_positions` positions.
pub fn layer_bytes(model: &Model, l: usize, kv_positions: usize) -> u64 {
    let lw = &model.layers[l];
    let mats: u64 = OpKind::ALL.iter().map(|&op| tensor_bytes(lw.op(op))).sum();
    let vecs = lw.attn_norm.len()
        + lw.ffn_norm.len()
        + [&lw.bq, &lw.bk, &lw.bv].iter().flat_map(|b| b.as_ref()).map(|b| b.len()).sum::<usize>();
    mats + 4 * vecs as u64 + GpuKv::bytes_for(kv_positions, model.config.n_embd_kv())
}

/// Device bytes of the final norm and the output head.
pub fn head_bytes(model: &Model) -> u64 {
    tensor_bytes(&model.output) + 4 * model.output_norm.len() as u64
}

/// The four matrices of a layer's attention half.
const ATTENTION_OPS: [OpKind; 4] = [OpKind::Q, OpKind::K, OpKind::V, OpKind::O];

/// Device bytes of every layer's attention half on the GPU ([`GpuLayers::upload_attention`]):
/// q, k, v, o, both norms, the biases and the KV cache of `kv_positions` positions.
pub fn attention_bytes(model: &Model, kv_positions: usize) -> u64 {
    let kv = GpuKv::bytes_for(kv_positions, model.config.n_embd_kv());
    model
        .layers
        .iter()
        .map(|lw| {
            let mats: u64 = ATTENTION_OPS.iter().map(|&op| tensor_bytes(lw.op(op))).sum();
            let vecs = lw.attn_norm.len()
                + lw.ffn_norm.len()
                + [&lw.bq, &lw.bk, &lw.bv].iter().flat_map(|b| b.as_ref()).map(|b| b.len()).sum::<usize>();
            mats + 4 * vecs as u64 + kv
        })
        .sum()
}

/// The layers a [`GpuPlacement`] names, on the device.
pub struct GpuLayers {
    dev: GpuDevice,
    pub placement: GpuPlacement,
    /// The held layers `placement.first_layer..`, in order (matrices in [`OpKind::ALL`] order).
    held: Vec<GpuLayer>,
    /// The final norm and output head, when held.
    output: Option<(GpuVec, GpuMatrix)>,
    /// The shapes whole-layer runs use; `None` when the kernels do not take them (op by op).
    dims: Option<StackDims>,
    /// Why whole-layer runs are off, if they are.
    pub whole_layers_off: Option<String>,
    /// Positions of the current sequence whose keys and values of the held layers are in the
    /// GPU's cache (whole-layer runs) and in the CPU's (op-by-op runs).
    kv_on_gpu: usize,
    kv_on_cpu: usize,
    /// Device bytes of all of it.
    pub bytes: u64,
    /// Only the layers' attention halves are held ([`GpuLayers::upload_attention`]).
    attention_only: bool,
}

/// How a batch runs the held layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuWay {
    WholeLayers,
    OpByOp,
    /// Attention halves on the GPU, the FFN on the CPU (with the hybrid tier's split).
    Attention,
}

/// A matrix's bytes in GGUF order (a repacked matrix unpacked).
fn gguf_rows<'a>(model: &'a Model, t: &QTensor, buf: &'a mut Vec<u8>) -> &'a [u8] {
    let data = &model.file.bytes()[t.range.clone()];
    if !t.packed {
        return data;
    }
    let nb = t.row_bytes / t.ty.block_bytes();
    let group = t.group_rows() * t.row_bytes;
    buf.resize(data.len(), 0);
    for (src, dst) in data.chunks_exact(group).zip(buf.chunks_exact_mut(group)) {
        unpack_group(t.ty, src, nb, dst);
    }
    buf
}

impl GpuLayers {
    /// Copies what the placement names to `dev`, with a KV cache of `kv_positions` per layer.
    pub fn upload(
        model: &Model,
        dev: GpuDevice,
        placement: GpuPlacement,
        kv_positions: usize,
    ) -> Result<GpuLayers, GpuError> {
        Self::upload_ops(model, dev, placement, kv_positions, &OpKind::ALL)
    }

    /// Copies every layer's attention half to `dev` (q, k, v, o, norms, biases, a KV cache of
    /// `kv_positions`): KAIROX's placement for the hybrid decode, run by
    /// [`GpuLayers::run_attention`]. Fails when the GPU's attention does not take the model's
    /// shapes. With `head`, the final norm and the output head too (run by
    /// [`GpuLayers::output_head`] on the CPU's final norm).
    pub fn upload_attention(
        model: &Model,
        dev: GpuDevice,
        kv_positions: usize,
        head: bool,
    ) -> Result<GpuLayers, GpuError> {
        let n_layer = model.layers.len();
        let placement = GpuPlacement::from_layers(n_layer + head as usize, n_layer);
        let mut g = Self::upload_ops(model, dev, placement, kv_positions, &ATTENTION_OPS)?;
        if let Some(why) = &g.whole_layers_off {
            return Err(GpuError::Shape {
                name: "attention".into(),
                msg: format!("the GPU's attention does not take {why}"),
            });
        }
        g.attention_only = true;
        g.bytes = attention_bytes(model, kv_positions) + if head { head_bytes(model) } else { 0 };
        Ok(g)
    }

    fn upload_ops(
        model: &Model,
        mut dev: GpuDevice,
        placement: GpuPlacement,
        kv_positions: usize,
        ops: &[OpKind],
    ) -> Result<GpuLayers, GpuError> {
        let c = &model.config;
        let mut buf = Vec::new();
        let mut up = |dev: &mut GpuDevice, t: &QTensor| {
            let data = gguf_rows(model, t, &mut buf);
            dev.upload(&t.name, t.ty, t.rows, t.cols, data)
        };
        let mut held = Vec::new();
        for l in placement.first_layer..placement.n_layer {
            let lw = &model.layers[l];
            let mats = ops.iter().map(|&op| up(&mut dev, lw.op(op))).collect::<Result<Vec<_>, _>>()?;
            let mut vec = |v: &Option<Vec<f32>>| v.as_ref().map(|v| dev.upload_f32(v)).transpose();
            let (bq, bk, bv) = (vec(&lw.bq)?, vec(&lw.bk)?, vec(&lw.bv)?);
            held.push(GpuLayer {
                mats,
                attn_norm: dev.upload_f32(&lw.attn_norm)?,
                ffn_norm: dev.upload_f32(&lw.ffn_norm)?,
                bq,
                bk,
                bv,
                kv: dev.alloc_kv(kv_positions, c.n_embd_kv())?,
            });
        }
        let output = if placement.output {
            let w = up(&mut dev, &model.output)?;
            Some((dev.upload_f32(&model.output_norm)?, w))
        } else {
            None
        };
        let dims = StackDims {
            n_embd: c.n_embd,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            n_ff: c.n_ff,
            rope_dim: c.rope_dim,
            neox: c.rope_style == RopeStyle::Neox,
            theta_scale: c.rope_theta_scale(),
            eps: c.rms_eps,
        };
        let whole_layers_off = dims.supported().err();
        Ok(GpuLayers {
            bytes: placement.bytes(model, kv_positions),
            dev,
            placement,
            held,
            output,
            dims: whole_layers_off.is_none().then_some(dims),
            whole_layers_off,
            kv_on_gpu: 0,
            kv_on_cpu: 0,
            attention_only: false,
        })
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// Whether the GPU runs layer `l` whole (or its ops one by one).
    pub fn holds(&self, l: usize) -> bool {
        !self.attention_only && self.placement.holds_layer(l)
    }

    /// Whether the GPU holds only the layers' attention halves.
    pub fn attention_only(&self) -> bool {
        self.attention_only
    }

    /// The first held layer (`n_layer` when none is).
    pub fn first_layer(&self) -> usize {
        self.placement.first_layer
    }

    /// Whether whole-layer runs are possible for this model.
    pub fn whole_layers(&self) -> bool {
        self.dims.is_some() && !self.attention_only
    }

    /// The sequence was cut to its first `n` positions.
    pub fn truncate(&mut self, n: usize) {
        self.kv_on_gpu = self.kv_on_gpu.min(n);
        self.kv_on_cpu = self.kv_on_cpu.min(n);
    }

    /// Checks that a batch at `n_past` can run `way` (the cache of that side holds every earlier
    /// position) and records the `n` positions it adds.
    pub fn begin_batch(&mut self, way: GpuWay, n_past: usize, n: usize) -> Result<(), GpuError> {
        let (have, other) = match way {
            GpuWay::WholeLayers | GpuWay::Attention => (&mut self.kv_on_gpu, &mut self.kv_on_cpu),
            GpuWay::OpByOp => (&mut self.kv_on_cpu, &mut self.kv_on_gpu),
        };
        if *have < n_past {
            return Err(GpuError::Shape {
                name: "KV cache".into(),
                msg: format!(
                    "this sequence's first {n_past} positions ran {} on the GPU layers, this batch runs {}: a sparsity method, tracer or sparse prefill changed mid-sequence; start a new sequence",
                    if way == GpuWay::WholeLayers { "op by op" } else { "as whole layers" },
                    if way == GpuWay::WholeLayers { "whole layers" } else { "op by op" },
                ),
            });
        }
        *have = n_past + n;
        *other = (*other).min(n_past);
        Ok(())
    }

    /// Runs `n` tokens' hidden states `x` (at positions `n_past..`) through every held layer as
    /// whole layers; with `head` (the last `n_logits` tokens' logits buffer) the GPU's output
    /// head writes the logits, else `x` receives the last layer's output.
    pub fn run_layers(
        &mut self,
        x: &mut [f32],
        n: usize,
        n_past: usize,
        head: Option<(usize, &mut [f32])>,
    ) -> Result<(), GpuError> {
        let dims = self.dims.expect("whole layers checked by the caller");
        let head = match (head, &self.output) {
            (Some((n_logits, logits)), Some((norm, w))) => Some(GpuHead { norm, w, n_logits, logits }),
            _ => None,
        };
        self.dev.run_layers(&dims, &mut self.held, x, n, n_past, head)
    }

    /// Layer `l`'s attention half on `n` tokens' hidden states `x` (at positions `n_past..`):
    /// `x` receives the residual after attention, `h` the FFN's norm of it.
    pub fn run_attention(
        &mut self,
        l: usize,
        x: &mut [f32],
        h: &mut [f32],
        n: usize,
        n_past: usize,
    ) -> Result<(), GpuError> {
        let dims = self.dims.expect("attention only with supported shapes (checked at upload)");
        let layer = &mut self.held[l - self.placement.first_layer];
        self.dev.run_attention(&dims, layer, x, h, n, n_past)
    }

    pub fn holds_output(&self) -> bool {
        self.output.is_some()
    }

    /// One line for the user, as llama.cpp's "offloaded 31/31 layers to GPU".
    pub fn summary(&self) -> String {
        let p = &self.placement;
        if self.attention_only {
            return format!(
                "attention of {}/{} layers{} on GPU {} ({}): {:.1} MiB with the KV cache (f16)",
                p.n_layer - p.first_layer,
                p.n_layer,
                if p.output { " and the output head" } else { "" },
                self.dev.ordinal,
                self.dev.name,
                self.bytes as f64 / (1 << 20) as f64
            );
        }
        let way = match &self.whole_layers_off {
            None => "whole layers, KV cache on the GPU (f16)".to_string(),
            Some(why) => format!("op by op ({why}), KV cache in host memory"),
        };
        format!(
            "offloaded {}/{} layers to GPU {} ({}): {:.1} MiB; {way}",
            p.n_gpu_layers(),
            p.n_layer + 1,
            self.dev.ordinal,
            self.dev.name,
            self.bytes as f64 / (1 << 20) as f64
        )
    }

    /// The products of `site` in held layer `l` on `n` input rows of `width`: one output per op
    /// of the site (`outs`, each `n × rows`).
    pub fn project(
        &mut self,
        l: usize,
        site: Site,
        x: &[f32],
        width: usize,
        n: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), GpuError> {
        let ms = &self.held[l - self.placement.first_layer].mats;
        let ops = site.ops();
        let mut jobs: Vec<GpuJob<'_>> =
            ops.iter().zip(outs.iter_mut()).map(|(&op, out)| GpuJob { w: &ms[op_index(op)], out }).collect();
        self.dev.matmul_many(x, width, n, &mut jobs)
    }

    /// The output head on `n` normed rows of `e` into `out` (`n × n_vocab`).
    pub fn output_head(&mut self, x: &[f32], e: usize, n: usize, out: &mut [f32]) -> Result<(), GpuError> {
        let (_, w) = self.output.as_ref().expect("output head on the GPU");
        self.dev.matmul_many(x, e, n, &mut [GpuJob { w, out }])
    }
}

fn op_index(op: OpKind) -> usize {
    OpKind::ALL.iter().position(|&o| o == op).expect("one of the seven ops")
}
