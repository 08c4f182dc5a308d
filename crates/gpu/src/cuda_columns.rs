//! The CUDA side of [`crate::GpuColumns`]: two streams, pinned host tables and staging, raw
//! asynchronous copies (cudarc's safe copies take whole host slices; loads copy one group of a
//! table), and the `axpy_cols_q8` kernel.

use crate::columns::ColumnPoolSpec;
use crate::cuda::{driver, Device};
use crate::GpuError;
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use std::sync::Arc;

/// Active columns per chunk of the kernel's grid (`COL_CHUNK` in kernels.cu).
const COL_CHUNK: u32 = 64;
const THREADS: u32 = 256;

pub(crate) struct Columns {
    ctx: Arc<CudaContext>,
    critical: Arc<CudaStream>,
    reload: Arc<CudaStream>,
    kernel: CudaFunction,
    tables: Vec<PinnedHostSlice<u8>>,
    slots: Vec<CudaSlice<u8>>,
    /// Per pool: recorded on the reload stream after its last load, and whether a computation
    /// has yet to wait for it.
    loaded: Vec<(CudaEvent, bool)>,
    /// Per pool: recorded on the critical stream after its last computation, and whether a load
    /// has yet to wait for it.
    used: Vec<(CudaEvent, bool)>,
    /// A product's arguments, staged: its `n` column indices, then their `n` factors (as f32
    /// bits), so that one copy takes both.
    h_args: PinnedHostSlice<u32>,
    h_y: PinnedHostSlice<f32>,
    d_args: CudaSlice<u32>,
    d_y: CudaSlice<f32>,
    done: CudaEvent,
    /// Outputs of the computation in flight.
    in_flight: Option<usize>,
}

pub(crate) fn pinned<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    n: usize,
) -> Result<PinnedHostSlice<T>, GpuError> {
    // SAFETY: plain page-locked memory (no write-combining: the host reads the outputs back);
    // it is written before every read (tables by `fill`, staging by `compute`), and zeroed here
    // all the same.
    let mut p = unsafe { ctx.alloc_pinned_with_flags::<T>(n.max(1), 0) }.map_err(driver)?;
    let s = p.as_mut_slice().map_err(driver)?;
    // SAFETY: T is ValidAsZeroBits: all-zero bytes are a valid T.
    unsafe { std::ptr::write_bytes(s.as_mut_ptr(), 0, s.len()) };
    Ok(p)
}

impl Columns {
    pub(crate) fn new(
        dev: &Device,
        specs: &[ColumnPoolSpec],
        fill: &mut dyn FnMut(usize, &mut [u8]),
    ) -> Result<Columns, GpuError> {
        let ctx = dev.context();
        let need: u64 = specs.iter().map(|s| s.device_bytes()).sum();
        dev.check_free("the column pools", need)?;
        let critical = ctx.new_stream().map_err(driver)?;
        let reload = ctx.new_stream().map_err(driver)?;
        let mut tables = Vec::with_capacity(specs.len());
        let mut slots = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let mut t = pinned::<u8>(&ctx, s.table_bytes() as usize)?;
            fill(i, &mut t.as_mut_slice().map_err(driver)?[..s.table_bytes() as usize]);
            tables.push(t);
            slots.push(critical.alloc_zeros::<u8>((s.device_bytes() as usize).max(1)).map_err(driver)?);
        }
        let max_cols = specs.iter().map(|s| s.slots * s.group_size).max().unwrap_or(0).max(1);
        let max_out = specs.iter().map(|s| s.n_out).max().unwrap_or(0).max(1);
        let event = || ctx.new_event(None).map_err(driver);
        let loaded = specs.iter().map(|_| Ok((event()?, false))).collect::<Result<Vec<_>, GpuError>>()?;
        let used = specs.iter().map(|_| Ok((event()?, false))).collect::<Result<Vec<_>, GpuError>>()?;
        critical.synchronize().map_err(driver)?;
        Ok(Columns {
            kernel: dev.cols_kernel().clone(),
            tables,
            slots,
            loaded,
            used,
            h_args: pinned(&ctx, 2 * max_cols)?,
            h_y: pinned(&ctx, max_out)?,
            d_args: critical.alloc_zeros::<u32>(2 * max_cols).map_err(driver)?,
            d_y: critical.alloc_zeros::<f32>(max_out).map_err(driver)?,
            done: event()?,
            in_flight: None,
            critical,
            reload,
            ctx,
        })
    }

    pub(crate) fn load(&mut self, s: &ColumnPoolSpec, pool: usize, group: usize, slot: usize) -> Result<(), GpuError> {
        let gb = s.group_bytes();
        let (used, wait) = &mut self.used[pool];
        if *wait {
            // The slot may be read by the pool's last computation: overwrite it after that.
            self.reload.wait(used).map_err(driver)?;
            *wait = false;
        }
        let src = &self.tables[pool].as_slice().map_err(driver)?[group * gb..(group + 1) * gb];
        let dst = self.slots[pool].device_ptr(&self.reload).0 + (slot * gb) as u64;
        self.ctx.bind_to_thread().map_err(driver)?;
        // SAFETY: `src` is page-locked memory owned by `self` for as long as the copy can run
        // (tables are never written after `new`, nor freed before the streams are done: `Drop`
        // synchronises); `dst .. dst + gb` lies in the pool's slots (slot < slots, checked by
        // the caller), which live as long as `self`.
        unsafe { result::memcpy_htod_async(dst, src, self.reload.cu_stream()) }.map_err(driver)?;
        let (loaded, pending) = &mut self.loaded[pool];
        loaded.record(&self.reload).map_err(driver)?;
        *pending = true;
        Ok(())
    }

    pub(crate) fn loads_ready(&self, pool: usize) -> bool {
        let (ev, pending) = &self.loaded[pool];
        !*pending || ev.is_complete()
    }

    pub(crate) fn compute(
        &mut self,
        s: &ColumnPoolSpec,
        pool: usize,
        idx: &[u32],
        coef: &[f32],
    ) -> Result<(), GpuError> {
        if self.in_flight.is_some() {
            return Err(GpuError::Driver("a column computation is already in flight".into()));
        }
        let n = idx.len();
        let (loaded, pending) = &mut self.loaded[pool];
        if *pending {
            self.critical.wait(loaded).map_err(driver)?;
            *pending = false;
        }
        // The staging buffers are free: the previous computation was finished (synchronised).
        let args = &mut self.h_args.as_mut_slice().map_err(driver)?[..2 * n];
        for (a, &c) in args[..n].iter_mut().zip(idx) {
            *a = c;
        }
        for (a, &f) in args[n..].iter_mut().zip(coef) {
            *a = f.to_bits();
        }
        let st = self.critical.cu_stream();
        let (d_idx, d_y) = (self.d_args.device_ptr(&self.critical).0, self.d_y.device_ptr(&self.critical).0);
        let d_coef = d_idx + 4 * n as u64;
        self.ctx.bind_to_thread().map_err(driver)?;
        // SAFETY: the source is the first 2n values of a page-locked staging buffer sized for
        // twice the largest pool's columns (n <= slots·group_size, checked by the caller),
        // untouched until `finish` has synchronised; `d_args` holds as many values; `d_y` holds
        // n_out.
        unsafe {
            result::memcpy_htod_async(d_idx, &self.h_args.as_slice().map_err(driver)?[..2 * n], st).map_err(driver)?;
            result::memset_d8_async(d_y, 0, s.n_out * 4, st).map_err(driver)?;
        }
        if n > 0 {
            let cfg = LaunchConfig {
                grid_dim: ((s.n_out as u32).div_ceil(THREADS), (n as u32).div_ceil(COL_CHUNK), 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (cb, n_i, n_out) = (s.unit_bytes() as i64, n as i32, s.n_out as i32);
            let mut launch = self.critical.launch_builder(&self.kernel);
            launch.arg(&self.slots[pool]).arg(&cb).arg(&d_idx).arg(&d_coef).arg(&n_i).arg(&self.d_y).arg(&n_out);
            // SAFETY: axpy_cols_q8(const u8* pool, long long col_bytes, const int* idx, const
            // float* coef, int n_active, float* y, int n_out): every index < slots·group_size
            // (checked by the caller), so each column read lies in the pool's slots of
            // slots·group_size columns of `cb` bytes; n indices then n factors in `d_args`
            // (copied above; event tracking is off, so the raw addresses need no guard), n_out
            // outputs.
            unsafe { launch.launch(cfg) }.map_err(driver)?;
        }
        // SAFETY: `h_y` is page-locked and holds at least n_out values; read only after `done`.
        unsafe {
            let hy = &mut self.h_y.as_mut_slice().map_err(driver)?[..s.n_out];
            result::memcpy_dtoh_async(hy, d_y, st).map_err(driver)?;
        }
        let (used, wait) = &mut self.used[pool];
        used.record(&self.critical).map_err(driver)?;
        *wait = true;
        self.done.record(&self.critical).map_err(driver)?;
        self.in_flight = Some(s.n_out);
        Ok(())
    }

    pub(crate) fn finish(&mut self, y: &mut [f32]) -> Result<(), GpuError> {
        let Some(n_out) = self.in_flight.take() else {
            return Err(GpuError::Driver("no column computation in flight".into()));
        };
        self.done.synchronize().map_err(driver)?;
        let hy = &self.h_y.as_slice().map_err(driver)?[..n_out];
        for (o, v) in y.iter_mut().zip(hy) {
            *o += v;
        }
        Ok(())
    }

    pub(crate) fn sync_loads(&mut self) -> Result<(), GpuError> {
        self.reload.synchronize().map_err(driver)
    }
}

impl Drop for Columns {
    fn drop(&mut self) {
        // Copies may still read the tables and staging: let them end before those are freed.
        let _ = self.reload.synchronize();
        let _ = self.critical.synchronize();
    }
}

/// See [`crate::GpuDevice::probe`].
pub(crate) fn probe(dev: &Device) -> Result<crate::GpuProbe, GpuError> {
    const SPAN: usize = 64 << 20;
    let ctx = dev.context();
    let stream = ctx.new_stream().map_err(driver)?;
    let host = pinned::<u8>(&ctx, SPAN)?;
    let src = host.as_slice().map_err(driver)?;
    let dst = stream.alloc_zeros::<u8>(SPAN).map_err(driver)?;
    let mut other = stream.alloc_zeros::<u8>(SPAN).map_err(driver)?;
    let base = dst.device_ptr(&stream).0;
    ctx.bind_to_thread().map_err(driver)?;
    let mut h2d = Vec::new();
    for size in [4usize << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20] {
        let n = SPAN / size;
        let mut best = f64::MAX;
        for _ in 0..3 {
            stream.synchronize().map_err(driver)?;
            let t = std::time::Instant::now();
            for i in 0..n {
                // SAFETY: `src` is page-locked and outlives the copy (synchronised below);
                // `base + i·size .. + size` lies in `dst` (n·size <= SPAN).
                unsafe {
                    result::memcpy_htod_async(
                        base + (i * size) as u64,
                        &src[i * size..(i + 1) * size],
                        stream.cu_stream(),
                    )
                }
                .map_err(driver)?;
            }
            stream.synchronize().map_err(driver)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        h2d.push((size as u64, (n * size) as f64 / best));
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        stream.synchronize().map_err(driver)?;
        let t = std::time::Instant::now();
        stream.memcpy_dtod(&dst, &mut other).map_err(driver)?;
        stream.synchronize().map_err(driver)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let device_bw = 2.0 * SPAN as f64 / best;
    // A product's fixed cost, as `Columns::compute` + `finish` pay it: two small copies in, a
    // clear, a copy back, an event waited for.
    let mut small = pinned::<f32>(&ctx, 64)?;
    let small = small.as_mut_slice().map_err(driver)?;
    let (d, e) = (other.device_ptr(&stream).0, ctx.new_event(None).map_err(driver)?);
    let reps = 200;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        // SAFETY: 256 bytes into and out of `other` (64 MiB); `small` is page-locked and lives
        // across the wait.
        unsafe {
            result::memcpy_htod_async(d, &src[..256], stream.cu_stream()).map_err(driver)?;
            result::memcpy_htod_async(d + 256, &src[..256], stream.cu_stream()).map_err(driver)?;
            result::memset_d8_async(d + 512, 0, 256, stream.cu_stream()).map_err(driver)?;
            result::memcpy_dtoh_async(&mut small[..64], d + 512, stream.cu_stream()).map_err(driver)?;
        }
        e.record(&stream).map_err(driver)?;
        e.synchronize().map_err(driver)?;
    }
    let round_trip_ns = t.elapsed().as_nanos() as f64 / reps as f64;
    drop(dst);
    Ok(crate::GpuProbe { name: String::new(), h2d, device_bw, round_trip_ns })
}
