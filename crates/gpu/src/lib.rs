//! The CUDA tier (issue 20, KAIROX's GPU side): quantized weight matrices uploaded to an NVIDIA
//! GPU in their GGUF block layout and multiplied there by f32 activations.
//!
//! Everything runs through [`GpuDevice`]: [`GpuDevice::open`] finds the driver and the device,
//! compiles the kernels (`kernels.cu`, by NVRTC at run time), [`GpuDevice::upload`] copies a
//! matrix, and [`GpuDevice::matmul_many`] computes several products of one input (q, k, v; gate,
//! up) with one copy in and one synchronisation.
//!
//! The CUDA code is behind the `cuda` cargo feature and loads `libcuda` and `libnvrtc` at run
//! time: building needs no CUDA toolkit, and a binary built with the feature still runs on a
//! machine without a GPU. Without the feature, or without a driver or device, `open` returns a
//! [`GpuError`] that says which, and nothing else in this crate can be reached.
//!
//! Results differ from the CPU kernels' by the CPU's rounding of activations to 8 bits (the GPU
//! multiplies dequantized weights by f32 activations); `tests/kernels.rs` states the bound.

#![cfg_attr(not(feature = "cuda"), forbid(unsafe_code))]

pub mod columns;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_columns;
pub mod stack;

pub use columns::{axpy_cols_q8_ref, ColumnPoolSpec, GpuColumns, GpuProbe};
use sift_quant::WeightType;
pub use stack::{GpuHead, GpuKv, GpuLayer, GpuVec, StackDims};

/// Why the GPU tier cannot be used, or a GPU operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("this sift was built without GPU support (--no-default-features): rebuild with `cargo build --release` (the `cuda` feature)")]
    NotBuilt,
    #[error(
        "no NVIDIA driver found (libcuda.so could not be loaded): install the NVIDIA driver, or run without GPU flags"
    )]
    NoDriver,
    #[error("NVRTC (libnvrtc.so, from the CUDA toolkit) could not be loaded: it compiles sift's GPU kernels at start; install the CUDA toolkit or add its lib64 folder to LD_LIBRARY_PATH")]
    NoNvrtc,
    #[error("no CUDA device {ordinal}: this machine has {count}")]
    NoDevice { ordinal: usize, count: usize },
    #[error("the GPU kernels did not compile: {0}")]
    Compile(String),
    #[error("{what} does not fit on the GPU: {need} bytes needed, {free} free")]
    OutOfMemory { what: String, need: u64, free: u64 },
    #[error("the GPU kernels do not handle {0} weights")]
    Unsupported(&'static str),
    #[error("GPU matrix {name}: {msg}")]
    Shape { name: String, msg: String },
    #[error("CUDA: {0}")]
    Driver(String),
}

/// A matrix of `rows` × `cols` weights of type `ty` held on the GPU.
pub struct GpuMatrix {
    pub name: String,
    pub ty: WeightType,
    pub rows: usize,
    pub cols: usize,
    /// Bytes on the device.
    pub bytes: u64,
    #[cfg(feature = "cuda")]
    pub(crate) data: cudarc::driver::CudaSlice<u8>,
}

/// One product of [`GpuDevice::matmul_many`]: `out[t * w.rows + r] = W[r] · x[t]`.
pub struct GpuJob<'a> {
    pub w: &'a GpuMatrix,
    pub out: &'a mut [f32],
}

/// An opened GPU with sift's kernels loaded.
pub struct GpuDevice {
    #[cfg(feature = "cuda")]
    pub(crate) inner: cuda::Device,
    /// The device's name ("NVIDIA H200").
    pub name: String,
    pub ordinal: usize,
}

impl GpuDevice {
    /// Opens device `ordinal` (`--main-gpu`) and compiles the kernels.
    pub fn open(ordinal: usize) -> Result<GpuDevice, GpuError> {
        #[cfg(feature = "cuda")]
        {
            let inner = cuda::Device::open(ordinal)?;
            let name = inner.name();
            Ok(GpuDevice { inner, name, ordinal })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(GpuError::NotBuilt)
        }
    }

    /// Whether this build has the CUDA tier (the `cuda` feature).
    pub const fn built() -> bool {
        cfg!(feature = "cuda")
    }

    /// Compiles the kernels without opening a device (NVRTC only); returns the PTX's size.
    pub fn compile_kernels() -> Result<usize, GpuError> {
        #[cfg(feature = "cuda")]
        {
            Ok(cuda::compile()?.to_src().len())
        }
        #[cfg(not(feature = "cuda"))]
        Err(GpuError::NotBuilt)
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(u64, u64), GpuError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.memory()
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("a GpuDevice exists only in builds with the cuda feature")
    }

    /// Copies a matrix (`rows` rows of `ty`'s blocks, each `ty.row_bytes(cols)` long, in GGUF
    /// order) to the device.
    pub fn upload(
        &mut self,
        name: &str,
        ty: WeightType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<GpuMatrix, GpuError> {
        let shape = |msg: String| GpuError::Shape { name: name.to_string(), msg };
        let rb =
            ty.row_bytes(cols).ok_or_else(|| shape(format!("{cols} columns are not whole {} blocks", ty.name())))?;
        if data.len() != rows * rb {
            return Err(shape(format!("{} bytes given, {rows} rows of {rb} bytes expected", data.len())));
        }
        if rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(shape(format!("{rows} x {cols} is too large for the kernels' 32-bit indices")));
        }
        #[cfg(feature = "cuda")]
        {
            let data = self.inner.upload(name, ty, data)?;
            Ok(GpuMatrix { name: name.to_string(), ty, rows, cols, bytes: (rows * rb) as u64, data })
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("a GpuDevice exists only in builds with the cuda feature")
    }

    /// Several products over the same `n_tok` input rows `x` (each `cols` long): one copy of `x`
    /// to the device, the kernels, the outputs back, one synchronisation.
    pub fn matmul_many(
        &mut self,
        x: &[f32],
        cols: usize,
        n_tok: usize,
        jobs: &mut [GpuJob<'_>],
    ) -> Result<(), GpuError> {
        if x.len() < cols * n_tok {
            return Err(GpuError::Shape {
                name: "input".into(),
                msg: format!("{} values for {n_tok} x {cols}", x.len()),
            });
        }
        for j in jobs.iter() {
            if j.w.cols != cols || j.out.len() < j.w.rows * n_tok {
                return Err(GpuError::Shape {
                    name: j.w.name.clone(),
                    msg: format!(
                        "{} x {} with an input of {cols} columns and {} outputs for {n_tok} tokens",
                        j.w.rows,
                        j.w.cols,
                        j.out.len()
                    ),
                });
            }
        }
        #[cfg(feature = "cuda")]
        {
            self.inner.matmul_many(&x[..cols * n_tok], cols, n_tok, jobs)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("a GpuDevice exists only in builds with the cuda feature")
    }
}
