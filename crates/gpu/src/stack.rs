//! Whole transformer layers held on the GPU: their matrices, norm weights, biases and an f16 KV
//! cache, run for a batch of tokens with one copy in and one copy out ([`GpuDevice::run_layers`]).
//!
//! The engine decides what a layer is (`sift_engine::gpu`); this module only runs the pre-norm
//! SwiGLU block the llama and qwen2 architectures share: `h = rms_norm(x)·w_attn`; q, k, v (+
//! biases); RoPE; K and V into the cache; causal grouped-query attention; `x += o(att)`;
//! `h = rms_norm(x)·w_ffn`; `x += down(silu(gate(h))·up(h))`.

use crate::{GpuDevice, GpuError, GpuMatrix};

/// f32 values held on the GPU (norm weights, biases).
pub struct GpuVec {
    pub len: usize,
    #[cfg(feature = "cuda")]
    pub(crate) data: cudarc::driver::CudaSlice<f32>,
}

/// One layer's f16 KV cache: `positions` rows of `kvd` keys and as many values.
pub struct GpuKv {
    pub positions: usize,
    pub kvd: usize,
    #[cfg(feature = "cuda")]
    pub(crate) k: cudarc::driver::CudaSlice<u16>,
    #[cfg(feature = "cuda")]
    pub(crate) v: cudarc::driver::CudaSlice<u16>,
}

impl GpuKv {
    /// Device bytes of a cache of `positions` × `kvd` keys and values.
    pub const fn bytes_for(positions: usize, kvd: usize) -> u64 {
        (positions * kvd * 2 * 2) as u64
    }
}

/// A transformer layer held whole on the GPU.
pub struct GpuLayer {
    /// q, k, v, o, gate, up, down.
    pub mats: Vec<GpuMatrix>,
    pub attn_norm: GpuVec,
    pub ffn_norm: GpuVec,
    pub bq: Option<GpuVec>,
    pub bk: Option<GpuVec>,
    pub bv: Option<GpuVec>,
    pub kv: GpuKv,
}

/// The shapes and constants of the layers [`GpuDevice::run_layers`] runs.
#[derive(Clone, Copy, Debug)]
pub struct StackDims {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub rope_dim: usize,
    /// RoPE pairs (i, i + rope_dim/2) (qwen2) rather than (2i, 2i + 1) (llama).
    pub neox: bool,
    /// `freq_base^(-2/rope_dim)`.
    pub theta_scale: f32,
    pub eps: f32,
}

impl StackDims {
    /// Whether the kernels can run these shapes: head_dim a multiple of 32 up to 256, query heads
    /// a multiple of the KV heads. Otherwise the engine runs such a model op by op.
    pub fn supported(&self) -> Result<(), String> {
        if !self.head_dim.is_multiple_of(32) || self.head_dim > 256 {
            return Err(format!("head size {} (the GPU attention takes multiples of 32 up to 256)", self.head_dim));
        }
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(format!("{} query heads over {} KV heads", self.n_head, self.n_head_kv));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return Err(format!("RoPE over {} of {} values", self.rope_dim, self.head_dim));
        }
        Ok(())
    }
}

/// The final norm and output head, when the GPU holds them: logits of the last `n_logits` tokens.
pub struct GpuHead<'a> {
    pub norm: &'a GpuVec,
    pub w: &'a GpuMatrix,
    pub n_logits: usize,
    /// `n_logits × w.rows` values.
    pub logits: &'a mut [f32],
}

impl GpuDevice {
    /// Copies f32 values (a norm's weights, a bias) to the device.
    pub fn upload_f32(&mut self, v: &[f32]) -> Result<GpuVec, GpuError> {
        #[cfg(feature = "cuda")]
        {
            Ok(GpuVec { len: v.len(), data: self.inner.upload_f32(v)? })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = v;
            unreachable!("a GpuDevice exists only in builds with the cuda feature")
        }
    }

    /// An f16 KV cache of `positions` × `kvd`, zeroed.
    pub fn alloc_kv(&mut self, positions: usize, kvd: usize) -> Result<GpuKv, GpuError> {
        #[cfg(feature = "cuda")]
        {
            let (k, v) = self.inner.alloc_kv(positions * kvd)?;
            Ok(GpuKv { positions, kvd, k, v })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (positions, kvd);
            unreachable!("a GpuDevice exists only in builds with the cuda feature")
        }
    }

    /// Runs `n` tokens (rows of `x`, each `n_embd` long, at positions `pos0..pos0 + n`) through
    /// `layers` in order. Without `head`, `x` receives the last layer's output; with it, the head
    /// writes the last `n_logits` tokens' logits and `x` is left as it was.
    pub fn run_layers(
        &mut self,
        dims: &StackDims,
        layers: &mut [GpuLayer],
        x: &mut [f32],
        n: usize,
        pos0: usize,
        head: Option<GpuHead<'_>>,
    ) -> Result<(), GpuError> {
        dims.supported().map_err(|msg| GpuError::Shape { name: "layers".into(), msg })?;
        if x.len() < n * dims.n_embd {
            return Err(GpuError::Shape { name: "input".into(), msg: format!("{} values for {n} tokens", x.len()) });
        }
        for l in layers.iter() {
            if pos0 + n > l.kv.positions {
                return Err(GpuError::Shape {
                    name: "KV cache".into(),
                    msg: format!("positions {pos0}..{} past its {}", pos0 + n, l.kv.positions),
                });
            }
        }
        if let Some(h) = &head {
            if h.n_logits > n || h.logits.len() < h.n_logits * h.w.rows {
                return Err(GpuError::Shape { name: "output head".into(), msg: format!("{} logits", h.n_logits) });
            }
        }
        #[cfg(feature = "cuda")]
        {
            self.inner.run_layers(dims, layers, &mut x[..n * dims.n_embd], n, pos0, head)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("a GpuDevice exists only in builds with the cuda feature")
    }

    /// Runs the attention half of `layer` for `n` tokens (rows of `x`, at positions `pos0..`):
    /// norm, q/k/v, RoPE, the layer's KV cache, attention, o, and the residual — `x` receives
    /// `x + attention(x)` — then the FFN's norm of it into `h` (`n × n_embd`). KAIROX's placement
    /// of the hybrid decode: attention on the GPU, the FFN split between the GPU and the CPU.
    /// Needs only the layer's first four matrices (q, k, v, o).
    pub fn run_attention(
        &mut self,
        dims: &StackDims,
        layer: &mut GpuLayer,
        x: &mut [f32],
        h: &mut [f32],
        n: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        dims.supported().map_err(|msg| GpuError::Shape { name: "attention".into(), msg })?;
        let e = dims.n_embd;
        if x.len() < n * e || h.len() < n * e {
            return Err(GpuError::Shape {
                name: "attention".into(),
                msg: format!("{} inputs and {} outputs for {n} tokens of {e}", x.len(), h.len()),
            });
        }
        if pos0 + n > layer.kv.positions {
            return Err(GpuError::Shape {
                name: "KV cache".into(),
                msg: format!("positions {pos0}..{} past its {}", pos0 + n, layer.kv.positions),
            });
        }
        if layer.mats.len() < 4 {
            return Err(GpuError::Shape { name: "attention".into(), msg: "the layer holds no q, k, v, o".into() });
        }
        #[cfg(feature = "cuda")]
        {
            self.inner.run_attention(dims, layer, &mut x[..n * e], h, n, pos0)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("a GpuDevice exists only in builds with the cuda feature")
    }
}
