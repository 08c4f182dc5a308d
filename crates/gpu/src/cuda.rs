//! The CUDA side of [`crate::GpuDevice`]: the driver and NVRTC through cudarc (both loaded at
//! run time), one stream, the compiled kernels and the device buffers reused across calls.

use crate::stack::{GpuHead, GpuLayer, StackDims};
use crate::{GpuError, GpuJob, GpuMatrix};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr,
    DevicePtrMut, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use sift_quant::WeightType;
use std::sync::Arc;

const SOURCE: &str = include_str!("kernels.cu");

/// Warps (rows) per thread block of the products: `WARPS_PER_BLOCK` in kernels.cu.
const WARPS_PER_BLOCK: u32 = 4;
/// Threads of an attention block (at most `ATTN_MAX_WARPS` warps in kernels.cu): a decode step
/// has one block per head, whose warps share the positions; a batch has a block per head and
/// token already.
const ATTN_THREADS_DECODE: u32 = 32 * 32;
const ATTN_THREADS_BATCH: u32 = 4 * 32;
/// Tokens a block of `matvec_multi` takes in turn (`MULTI_TOKENS` in kernels.cu).
const MULTI_TOKENS: u32 = 8;
/// The most thread blocks along the token axis (a kernel loops over further tokens).
const MAX_TOKEN_BLOCKS: u32 = 65535;
/// Threads per block of the element-wise kernels and the norms.
const THREADS: u32 = 256;

/// The product kernel of each weight type, as named in kernels.cu.
const MATVEC: [(WeightType, &str); 10] = [
    (WeightType::F32, "matvec_f32"),
    (WeightType::F16, "matvec_f16"),
    (WeightType::BF16, "matvec_bf16"),
    (WeightType::Q4_0, "matvec_q4_0"),
    (WeightType::Q4_1, "matvec_q4_1"),
    (WeightType::Q5_0, "matvec_q5_0"),
    (WeightType::Q8_0, "matvec_q8_0"),
    (WeightType::Q4_K, "matvec_q4_k"),
    (WeightType::Q5_K, "matvec_q5_k"),
    (WeightType::Q6_K, "matvec_q6_k"),
];

/// The kernels of whole-layer runs (eight launches per layer).
struct LayerKernels {
    matvec_multi: CudaFunction,
    add_norm: CudaFunction,
    qkv_finish: CudaFunction,
    /// Attention of a batch: a lane per position (measured faster for prompts and long
    /// contexts) ...
    attention: CudaFunction,
    /// ... and of a decode step: a warp per position (faster up to ~1K positions, the same at
    /// 1K; docs/benchmarks.md, issue 20).
    attention_rows: CudaFunction,
    add_rows: CudaFunction,
    silu_mul: CudaFunction,
}

/// Activations of a batch on the device, grown as batches grow.
#[derive(Default)]
struct Buffers {
    x: Option<CudaSlice<f32>>,
    h: Option<CudaSlice<f32>>,
    q: Option<CudaSlice<f32>>,
    k: Option<CudaSlice<f32>>,
    v: Option<CudaSlice<f32>>,
    att: Option<CudaSlice<f32>>,
    o: Option<CudaSlice<f32>>,
    g: Option<CudaSlice<f32>>,
    u: Option<CudaSlice<f32>>,
    logits: Option<CudaSlice<f32>>,
    /// The batch's first position, read by the RoPE, cache and attention kernels.
    pos: Option<CudaSlice<i32>>,
    /// One output per product of [`Device::matmul_many`].
    y: Vec<CudaSlice<f32>>,
}

/// What a captured decode step was captured for: the layers (by address) and their count,
/// whether the head ran, whether only their attention halves ran. A step with the same key
/// replays the graph.
type GraphKey = (usize, usize, bool, bool);

/// Device addresses of the activation buffers (`Device::pointers`).
struct Pointers {
    x: u64,
    h: u64,
    q: u64,
    k: u64,
    v: u64,
    att: u64,
    o: u64,
    g: u64,
    u: u64,
    logits: u64,
    pos: u64,
}

fn norm_cfg(rows: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

pub(crate) struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// One product kernel per weight type, in [`MATVEC`] order.
    matvec: Vec<CudaFunction>,
    layer: LayerKernels,
    buf: Buffers,
    /// Decode steps (one token) captured as CUDA graphs: launched as one, they cost a fraction
    /// of the ~15 launches per layer. Dropped when a buffer they use is reallocated.
    graphs: Vec<(GraphKey, CudaGraph)>,
    /// The hybrid tier's column product (`crate::GpuColumns`).
    cols: CudaFunction,
    /// The position in the device's `pos` (uploaded once per token, not once per layer).
    pos_now: Option<usize>,
    /// Page-locked staging of a decode step's attention half: `x` in, `x` and `h` out.
    stage: Option<PinnedHostSlice<f32>>,
}

pub(crate) fn driver(e: cudarc::driver::DriverError) -> GpuError {
    GpuError::Driver(e.to_string())
}

/// Compiles kernels.cu to PTX (NVRTC only: no device needed).
pub(crate) fn compile() -> Result<cudarc::nvrtc::Ptx, GpuError> {
    // SAFETY: only tries to load the shared library (dlopen); nothing is called through it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    cudarc::nvrtc::compile_ptx_with_opts(
        SOURCE,
        cudarc::nvrtc::CompileOptions { name: Some("sift_kernels.cu".into()), ..Default::default() },
    )
    .map_err(|e| GpuError::Compile(e.to_string()))
}

/// `buf` holding at least `n` values (a power of two, so that growing batches reallocate rarely);
/// true when it was (re)allocated.
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<bool, GpuError> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = Some(stream.alloc_zeros::<T>(n.max(1).next_power_of_two()).map_err(driver)?);
        return Ok(true);
    }
    Ok(false)
}

fn elementwise(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((total as u32).div_ceil(THREADS).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Device {
    pub(crate) fn open(ordinal: usize) -> Result<Device, GpuError> {
        // SAFETY: only tries to load the shared library (dlopen); nothing is called through it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(driver)?.max(0) as usize;
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        let ptx = compile()?;
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        // One stream of our own (the legacy default stream cannot be captured into a graph), and
        // no event tracking: everything is ordered on that one stream.
        // SAFETY: called before any buffer exists, and every use of every buffer is on `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver)?;
        let module = ctx.load_module(ptx).map_err(driver)?;
        let f = |name: &str| module.load_function(name).map_err(driver);
        let matvec = MATVEC.iter().map(|(_, name)| f(name)).collect::<Result<Vec<_>, _>>()?;
        let layer = LayerKernels {
            matvec_multi: f("matvec_multi")?,
            add_norm: f("add_norm")?,
            qkv_finish: f("qkv_finish")?,
            attention: f("attention")?,
            attention_rows: f("attention_rows")?,
            add_rows: f("add_rows")?,
            silu_mul: f("silu_mul")?,
        };
        let cols = f("axpy_cols_q8")?;
        Ok(Device {
            ctx,
            stream,
            matvec,
            layer,
            buf: Buffers::default(),
            graphs: Vec::new(),
            cols,
            pos_now: None,
            stage: None,
        })
    }

    pub(crate) fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| format!("CUDA device {}", self.ctx.ordinal()))
    }

    pub(crate) fn memory(&self) -> Result<(u64, u64), GpuError> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver)?;
        Ok((free as u64, total as u64))
    }

    pub(crate) fn context(&self) -> Arc<CudaContext> {
        self.ctx.clone()
    }

    pub(crate) fn cols_kernel(&self) -> &CudaFunction {
        &self.cols
    }

    pub(crate) fn check_free(&self, what: &str, need: u64) -> Result<(), GpuError> {
        let (free, _) = self.memory()?;
        if need > free {
            return Err(GpuError::OutOfMemory { what: what.to_string(), need, free });
        }
        Ok(())
    }

    pub(crate) fn upload(&mut self, name: &str, _ty: WeightType, data: &[u8]) -> Result<CudaSlice<u8>, GpuError> {
        self.check_free(name, data.len() as u64)?;
        self.stream.clone_htod(data).map_err(driver)
    }

    pub(crate) fn upload_f32(&mut self, v: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
        self.stream.clone_htod(v).map_err(driver)
    }

    pub(crate) fn alloc_kv(&mut self, n: usize) -> Result<(CudaSlice<u16>, CudaSlice<u16>), GpuError> {
        self.check_free("the KV cache", 4 * n as u64)?;
        let k = self.stream.alloc_zeros::<u16>(n.max(1)).map_err(driver)?;
        let v = self.stream.alloc_zeros::<u16>(n.max(1)).map_err(driver)?;
        Ok((k, v))
    }

    /// Queues `y[t * rows + r] = W[r] · x[t]` for `n_tok` rows of `x`.
    fn matvec(
        stream: &Arc<CudaStream>,
        kernels: &[CudaFunction],
        w: &GpuMatrix,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        n_tok: usize,
    ) -> Result<(), GpuError> {
        let f = &kernels[MATVEC.iter().position(|k| k.0 == w.ty).expect("every weight type has a kernel")];
        let (rows, cols, n_tok_i) = (w.rows as i32, w.cols as i32, n_tok as i32);
        let row_bytes = w.ty.row_bytes(w.cols).expect("checked at upload") as i64;
        assert!(x.len() >= w.cols * n_tok && y.len() >= w.rows * n_tok, "matvec buffers too small for {}", w.name);
        let cfg = LaunchConfig {
            grid_dim: ((w.rows as u32).div_ceil(WARPS_PER_BLOCK), (n_tok as u32).clamp(1, MAX_TOKEN_BLOCKS), 1),
            block_dim: (32 * WARPS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(f);
        launch.arg(&w.data).arg(x).arg(y).arg(&rows).arg(&cols).arg(&n_tok_i).arg(&row_bytes);
        // SAFETY: the arguments match the kernel's signature in kernels.cu (three device pointers,
        // three ints, one long long); it reads `rows` rows of `row_bytes` of the weights (their
        // upload had exactly that size, checked in `GpuDevice::upload`), `n_tok * cols` inputs and
        // writes `rows * n_tok` outputs (both asserted above).
        unsafe { launch.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    pub(crate) fn matmul_many(
        &mut self,
        x: &[f32],
        cols: usize,
        n_tok: usize,
        jobs: &mut [GpuJob<'_>],
    ) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        if grow(&stream, &mut self.buf.x, x.len())? {
            self.graphs.clear();
        }
        let dx = self.buf.x.as_mut().expect("grown above");
        stream.memcpy_htod(x, &mut dx.slice_mut(..x.len())).map_err(driver)?;
        while self.buf.y.len() < jobs.len() {
            self.buf.y.push(stream.alloc_zeros::<f32>(1).map_err(driver)?);
        }
        let dx = self.buf.x.as_ref().expect("grown above");
        for (j, dy) in jobs.iter().zip(self.buf.y.iter_mut()) {
            let need = j.w.rows * n_tok;
            if dy.len() < need {
                *dy = stream.alloc_zeros::<f32>(need.next_power_of_two()).map_err(driver)?;
            }
            Self::matvec(&stream, &self.matvec, j.w, &dx.slice(..cols * n_tok), &mut dy.slice_mut(..need), n_tok)?;
        }
        for (j, dy) in jobs.iter_mut().zip(self.buf.y.iter()) {
            let need = j.w.rows * n_tok;
            stream.memcpy_dtoh(&dy.slice(..need), &mut j.out[..need]).map_err(driver)?;
        }
        stream.synchronize().map_err(driver)
    }

    /// Every activation buffer holding a batch of `n` tokens (and `logits` head outputs); drops
    /// the captured graphs when one was reallocated.
    fn grow_buffers(&mut self, d: &StackDims, n: usize, logits: usize) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        let (e, qd, kvd, ff) = (d.n_embd, d.n_head * d.head_dim, d.n_head_kv * d.head_dim, d.n_ff);
        let b = &mut self.buf;
        let mut moved = false;
        for (buf, len) in [
            (&mut b.x, n * e),
            (&mut b.h, n * e.max(qd)),
            (&mut b.q, n * qd),
            (&mut b.k, n * kvd),
            (&mut b.v, n * kvd),
            (&mut b.att, n * qd),
            (&mut b.o, n * e),
            (&mut b.g, n * ff),
            (&mut b.u, n * ff),
            (&mut b.logits, logits),
        ] {
            moved |= grow(&stream, buf, len)?;
        }
        moved |= grow(&stream, &mut b.pos, 1)?;
        if moved {
            self.graphs.clear();
            self.pos_now = None;
        }
        Ok(())
    }

    /// Copies `x` (`n` rows) and the first position in.
    fn copy_in(&mut self, x: &[f32], pos0: usize) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        let bx = self.buf.x.as_mut().expect("grown by grow_buffers");
        stream.memcpy_htod(x, &mut bx.slice_mut(..x.len())).map_err(driver)?;
        self.set_pos(pos0)
    }

    /// The first position of the batch into the device's `pos`, unless it is there already.
    fn set_pos(&mut self, pos0: usize) -> Result<(), GpuError> {
        if self.pos_now == Some(pos0) {
            return Ok(());
        }
        let bpos = self.buf.pos.as_mut().expect("grown by grow_buffers");
        self.stream.memcpy_htod(&[pos0 as i32], &mut bpos.slice_mut(..1)).map_err(driver)?;
        self.pos_now = Some(pos0);
        Ok(())
    }

    /// Runs what `queue` queues: a decode step (`n == 1`) as the graph captured for `key` the
    /// first time, a batch directly.
    fn launch_step(
        &mut self,
        n: usize,
        key: GraphKey,
        queue: &mut dyn FnMut(&mut Self) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        if n > 1 {
            return queue(self);
        }
        let stream = self.stream.clone();
        if !self.graphs.iter().any(|(k, _)| *k == key) {
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(driver)?;
            let queued = queue(self);
            let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver);
            queued?;
            let graph = graph?.ok_or_else(|| GpuError::Driver("an empty graph was captured".into()))?;
            self.graphs.push((key, graph));
        }
        let (_, graph) = self.graphs.iter().find(|(k, _)| *k == key).expect("captured above");
        graph.launch().map_err(driver)
    }

    /// See [`crate::GpuDevice::run_layers`] (shapes checked there).
    pub(crate) fn run_layers(
        &mut self,
        d: &StackDims,
        layers: &mut [GpuLayer],
        x: &mut [f32],
        n: usize,
        pos0: usize,
        mut head: Option<GpuHead<'_>>,
    ) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        let e = d.n_embd;
        let logits = head.as_ref().map_or(0, |h| h.n_logits * h.w.rows);
        self.grow_buffers(d, n, logits)?;
        self.copy_in(x, pos0)?;
        let n_logits = head.as_ref().map_or(0, |h| h.n_logits);
        let key: GraphKey = (layers.as_ptr() as usize, layers.len(), head.is_some(), false);
        let head_ref = head.as_ref();
        self.launch_step(n, key, &mut |dev| dev.queue_layers(d, layers, n, head_ref))?;
        match head.as_mut() {
            None => {
                let bx = self.buf.x.as_ref().expect("grown above");
                stream.memcpy_dtoh(&bx.slice(..n * e), x).map_err(driver)?;
            }
            Some(h) => {
                let nv = h.w.rows;
                let dl = self.buf.logits.as_ref().expect("grown above");
                stream.memcpy_dtoh(&dl.slice(..n_logits * nv), &mut h.logits[..n_logits * nv]).map_err(driver)?;
            }
        }
        stream.synchronize().map_err(driver)
    }

    /// See [`crate::GpuDevice::run_attention`] (shapes checked there).
    pub(crate) fn run_attention(
        &mut self,
        d: &StackDims,
        layer: &mut GpuLayer,
        x: &mut [f32],
        h: &mut [f32],
        n: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        let e = d.n_embd;
        self.grow_buffers(d, n, 0)?;
        let key: GraphKey = (layer as *const GpuLayer as usize, 1, false, true);
        let mut queue = |dev: &mut Self| {
            let p = dev.pointers();
            dev.queue_attention(d, layer, n, 0, &p)
        };
        if n == 1 {
            // A decode step: its copies through page-locked staging, asynchronous, one wait.
            let mut stage = match self.stage.take() {
                Some(s) if s.len() >= 2 * e => s,
                _ => crate::cuda_columns::pinned::<f32>(&self.ctx, 2 * e)?,
            };
            let run = self.attention_step(e, &mut stage, x, h, pos0, key, &mut queue);
            if run.is_err() {
                // Copies may still use the staging: let them end before it can be freed.
                let _ = stream.synchronize();
            }
            self.stage = Some(stage);
            return run;
        }
        self.copy_in(x, pos0)?;
        self.launch_step(n, key, &mut queue)?;
        let (bx, bh) = (self.buf.x.as_ref().expect("grown above"), self.buf.h.as_ref().expect("grown above"));
        stream.memcpy_dtoh(&bx.slice(..n * e), x).map_err(driver)?;
        stream.memcpy_dtoh(&bh.slice(..n * e), &mut h[..n * e]).map_err(driver)?;
        stream.synchronize().map_err(driver)
    }

    /// One token's attention half with its copies through `stage` (page-locked, `2·e` values):
    /// `x` in, the graph, `x` and `h` out, one synchronisation.
    #[allow(clippy::too_many_arguments)]
    fn attention_step(
        &mut self,
        e: usize,
        stage: &mut PinnedHostSlice<f32>,
        x: &mut [f32],
        h: &mut [f32],
        pos0: usize,
        key: GraphKey,
        queue: &mut dyn FnMut(&mut Self) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        let st = stream.cu_stream();
        stage.as_mut_slice().map_err(driver)?[..e].copy_from_slice(&x[..e]);
        let dx = self.buf.x.as_ref().expect("grown by grow_buffers").device_ptr(&stream).0;
        let dh = self.buf.h.as_ref().expect("grown by grow_buffers").device_ptr(&stream).0;
        self.ctx.bind_to_thread().map_err(driver)?;
        // SAFETY: `stage` is page-locked, holds 2·e values and outlives the copies (the caller
        // synchronises before it could be freed); `dx` and `dh` hold at least e values (grown by
        // grow_buffers for one token).
        unsafe { result::memcpy_htod_async(dx, &stage.as_slice().map_err(driver)?[..e], st) }.map_err(driver)?;
        self.set_pos(pos0)?;
        self.launch_step(1, key, queue)?;
        {
            let out = stage.as_mut_slice().map_err(driver)?;
            let (sx, sh) = out.split_at_mut(e);
            // SAFETY: as above; the copies are ordered after the graph on `stream`.
            unsafe {
                result::memcpy_dtoh_async(sx, dx, st).map_err(driver)?;
                result::memcpy_dtoh_async(&mut sh[..e], dh, st).map_err(driver)?;
            }
        }
        stream.synchronize().map_err(driver)?;
        let out = stage.as_slice().map_err(driver)?;
        x[..e].copy_from_slice(&out[..e]);
        h[..e].copy_from_slice(&out[e..2 * e]);
        Ok(())
    }

    /// The device addresses of the activation buffers (grown by `grow_buffers`). matvec_multi
    /// and qkv_finish take several outputs and optional inputs, so kernels get raw pointers;
    /// every buffer lives on `stream` and event tracking is off, so the guards `device_ptr`
    /// returns do nothing.
    fn pointers(&mut self) -> Pointers {
        let stream = self.stream.clone();
        let b = &mut self.buf;
        let ptr = |s: &Option<CudaSlice<f32>>| s.as_ref().expect("grown by grow_buffers").device_ptr(&stream).0;
        let logits = b.logits.as_mut().expect("grown by grow_buffers").device_ptr_mut(&stream).0;
        let pos = b.pos.as_ref().expect("grown by grow_buffers").device_ptr(&stream).0;
        Pointers {
            x: ptr(&b.x),
            h: ptr(&b.h),
            q: ptr(&b.q),
            k: ptr(&b.k),
            v: ptr(&b.v),
            att: ptr(&b.att),
            o: ptr(&b.o),
            g: ptr(&b.g),
            u: ptr(&b.u),
            logits,
            pos,
        }
    }

    /// Queues every kernel of `n` tokens through `layers` (and the head): no copies, no
    /// allocations, no synchronisation, so that a decode step can be captured as a graph. Per
    /// layer: [add +] norm, q/k/v, biases + RoPE + cache store, attention, o, add + norm,
    /// gate/up, down on silu(gate)·up.
    fn queue_layers(
        &mut self,
        d: &StackDims,
        layers: &mut [GpuLayer],
        n: usize,
        head: Option<&GpuHead<'_>>,
    ) -> Result<(), GpuError> {
        let stream = self.stream.clone();
        let p = self.pointers();
        let (e_i, eps) = (d.n_embd as i32, d.eps);
        let mut add = 0i32;
        for l in layers.iter_mut() {
            self.queue_attention(d, l, n, add, &p)?;
            self.queue_ffn(d, l, n, &p)?;
            add = 1;
        }
        let k = &self.layer;
        match head {
            Some(hd) => {
                // The last layer's residual and the final norm over the last n_logits rows.
                let first = (n - hd.n_logits) as u64;
                let (xs, os) = (p.x + first * 4 * d.n_embd as u64, p.o + first * 4 * d.n_embd as u64);
                let mut launch = stream.launch_builder(&k.add_norm);
                launch.arg(&xs).arg(&os).arg(&hd.norm.data).arg(&p.h).arg(&e_i).arg(&eps).arg(&add);
                // SAFETY: as the norms in queue_attention, over the last n_logits of the n rows.
                unsafe { launch.launch(norm_cfg(hd.n_logits)) }.map_err(driver)?;
                self.multi(&[(hd.w, p.logits)], p.h, None, hd.n_logits)?;
            }
            None if add == 1 => {
                let total = (n * d.n_embd) as i64;
                let mut launch = stream.launch_builder(&k.add_rows);
                launch.arg(&p.x).arg(&p.o).arg(&total);
                // SAFETY: add_rows(float* x, const float* o, long long total) over n·e values.
                unsafe { launch.launch(elementwise(n * d.n_embd)) }.map_err(driver)?;
            }
            None => {}
        }
        Ok(())
    }

    /// Queues a layer's attention half for `n` tokens: [the residual `x += o` of the previous
    /// layer when `add`,] norm, q/k/v, biases + RoPE + cache store, attention, o, then `x += o`
    /// and the FFN's norm into `h`. Uses `l.mats[0..4]` (q, k, v, o) only.
    fn queue_attention(
        &self,
        d: &StackDims,
        l: &mut GpuLayer,
        n: usize,
        add: i32,
        p: &Pointers,
    ) -> Result<(), GpuError> {
        let stream = &self.stream;
        let k = &self.layer;
        let (e_i, eps) = (d.n_embd as i32, d.eps);
        let mut launch = stream.launch_builder(&k.add_norm);
        launch.arg(&p.x).arg(&p.o).arg(&l.attn_norm.data).arg(&p.h).arg(&e_i).arg(&eps).arg(&add);
        // SAFETY: add_norm(float* x, const float* o, const float* w, float* out, int e, float
        // eps, int add): n rows of e in x, o and h (grown by grow_buffers), e weights.
        unsafe { launch.launch(norm_cfg(n)) }.map_err(driver)?;
        self.multi(&[(&l.mats[0], p.q), (&l.mats[1], p.k), (&l.mats[2], p.v)], p.h, None, n)?;
        let bias = |b: &Option<crate::GpuVec>| b.as_ref().map_or(0, |b| b.data.device_ptr(stream).0);
        let (bqp, bkp, bvp) = (bias(&l.bq), bias(&l.bk), bias(&l.bv));
        let (kc, vc) = (l.kv.k.device_ptr_mut(stream).0, l.kv.v.device_ptr_mut(stream).0);
        let (n_i, nh, nkv, hd, rd, neox) =
            (n as i32, d.n_head as i32, d.n_head_kv as i32, d.head_dim as i32, d.rope_dim as i32, d.neox as i32);
        let mut launch = stream.launch_builder(&k.qkv_finish);
        launch.arg(&p.q).arg(&p.k).arg(&p.v).arg(&bqp).arg(&bkp).arg(&bvp).arg(&kc).arg(&vc);
        launch.arg(&n_i).arg(&nh).arg(&nkv).arg(&hd).arg(&rd).arg(&p.pos).arg(&d.theta_scale).arg(&neox);
        // SAFETY: qkv_finish(float* q, float* k, const float* v, const float* bq, const float*
        // bk, const float* bv, u16* kc, u16* vc, int n_tok, int n_head, int n_head_kv, int hd,
        // int rope_dim, const int* pos, float theta_scale, int neox): one thread per (token,
        // head) over n·(n_head + 2·n_head_kv); q, k, v hold n rows (grown by grow_buffers); the
        // biases are the layer's (qd, kvd, kvd values) or null; the caches hold
        // `positions` rows and *pos + n <= positions (checked in `GpuDevice::run_layers` and
        // `GpuDevice::run_attention`).
        unsafe { launch.launch(elementwise(n * (d.n_head + 2 * d.n_head_kv))) }.map_err(driver)?;
        let scale = 1.0 / (d.head_dim as f32).sqrt();
        let cfg = LaunchConfig {
            grid_dim: (d.n_head as u32, n as u32, 1),
            block_dim: (if n == 1 { ATTN_THREADS_DECODE } else { ATTN_THREADS_BATCH }, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(if n == 1 { &k.attention_rows } else { &k.attention });
        launch.arg(&p.q).arg(&kc).arg(&vc).arg(&p.att).arg(&nh).arg(&nkv).arg(&hd).arg(&p.pos).arg(&scale);
        // SAFETY: attention(const float* q, const u16* kc, const u16* vc, float* out, int
        // n_head, int n_head_kv, int hd, const int* pos, float scale): block (h, t) reads q
        // and writes out at row t·n_head + h (n·qd values each), and reads cache rows
        // 0..=*pos + t, all written (this batch's by qkv_finish above); head_dim is a multiple
        // of 32 up to 256 and n_head a multiple of n_head_kv (`StackDims::supported`).
        unsafe { launch.launch(cfg) }.map_err(driver)?;
        self.multi(&[(&l.mats[3], p.o)], p.att, None, n)?;
        let one = 1i32;
        let mut launch = stream.launch_builder(&k.add_norm);
        launch.arg(&p.x).arg(&p.o).arg(&l.ffn_norm.data).arg(&p.h).arg(&e_i).arg(&eps).arg(&one);
        // SAFETY: as the attention norm above.
        unsafe { launch.launch(norm_cfg(n)) }.map_err(driver)?;
        Ok(())
    }

    /// Queues a layer's SwiGLU feed-forward on `h` for `n` tokens into `o`.
    fn queue_ffn(&self, d: &StackDims, l: &GpuLayer, n: usize, p: &Pointers) -> Result<(), GpuError> {
        self.multi(&[(&l.mats[4], p.g), (&l.mats[5], p.u)], p.h, None, n)?;
        if n == 1 {
            // Decode: silu(gate)·up computed as down reads it (one launch fewer).
            return self.multi(&[(&l.mats[6], p.o)], p.g, Some(p.u), n);
        }
        // A batch: once per value, not once per row of down.
        let total = (n * d.n_ff) as i64;
        let mut launch = self.stream.launch_builder(&self.layer.silu_mul);
        launch.arg(&p.g).arg(&p.u).arg(&total);
        // SAFETY: silu_mul(float* g, const float* u, long long total) over n·n_ff values of each
        // (grown by grow_buffers).
        unsafe { launch.launch(elementwise(n * d.n_ff)) }.map_err(driver)?;
        self.multi(&[(&l.mats[6], p.o)], p.g, None, n)
    }

    /// Queues up to three products of one input in one launch (`matvec_multi`): each matrix
    /// with the device pointer of its output (`n × rows`); `input` holds `n × cols`; with `glu`
    /// (the down projection) the input is silu(input) · glu.
    fn multi(&self, mats: &[(&GpuMatrix, u64)], input: u64, glu: Option<u64>, n: usize) -> Result<(), GpuError> {
        assert!((1..=3).contains(&mats.len()) && mats.iter().all(|(w, _)| w.cols == mats[0].0.cols));
        let type_id =
            |w: &GpuMatrix| MATVEC.iter().position(|k| k.0 == w.ty).expect("every weight type has a kernel") as i32;
        let pick = |i: usize| mats.get(i).copied().unwrap_or((mats[0].0, 0));
        let (m0, m1, m2) = (pick(0), pick(1), pick(2));
        let rows = |i: usize| if i < mats.len() { mats[i].0.rows as i32 } else { 0 };
        let rb = |w: &GpuMatrix| w.ty.row_bytes(w.cols).expect("checked at upload") as i64;
        let w = |m: &GpuMatrix| m.data.device_ptr(&self.stream).0;
        let (w0, w1, w2) = (w(m0.0), w(m1.0), w(m2.0));
        let (r0, r1, r2) = (rows(0), rows(1), rows(2));
        let (t0, t1, t2) = (type_id(m0.0), type_id(m1.0), type_id(m2.0));
        let (rb0, rb1, rb2) = (rb(m0.0), rb(m1.0), rb(m2.0));
        let (cols, n_i, glu_on, u) = (mats[0].0.cols as i32, n as i32, glu.is_some() as i32, glu.unwrap_or(0));
        let total_rows = (r0 + r1 + r2) as u32;
        let cfg = LaunchConfig {
            grid_dim: (
                total_rows.div_ceil(WARPS_PER_BLOCK),
                (n as u32).div_ceil(MULTI_TOKENS).clamp(1, MAX_TOKEN_BLOCKS),
                1,
            ),
            block_dim: (32 * WARPS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&self.layer.matvec_multi);
        launch.arg(&w0).arg(&w1).arg(&w2).arg(&m0.1).arg(&m1.1).arg(&m2.1);
        launch.arg(&r0).arg(&r1).arg(&r2).arg(&t0).arg(&t1).arg(&t2).arg(&rb0).arg(&rb1).arg(&rb2);
        launch.arg(&input).arg(&u).arg(&cols).arg(&n_i).arg(&glu_on);
        // SAFETY: matvec_multi(const u8* w0..w2, float* y0..y2, int r0..r2, int t0..t2, long long
        // rb0..rb2, const float* x, const float* u, int cols, int n_tok, int glu): the warps of
        // matrices past `mats.len()` have 0 rows and do nothing; each matrix's upload holds
        // rows × row_bytes (checked in `GpuDevice::upload`), every matrix reads `cols` inputs
        // (asserted above); the callers pass outputs of n × rows and inputs of n × cols (the
        // buffers run_layers grew for the model's shapes).
        unsafe { launch.launch(cfg) }.map_err(driver)?;
        Ok(())
    }
}
