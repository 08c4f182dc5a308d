//! The GPU kernels against the CPU kernels and an f64 reference, on real models' weights.
//!
//! Needs a GPU: the tests that do are `#[ignore]`d (run them with `--ignored` where one is; `.ci/run`
//! does where `nvidia-smi` sees one); `no_gpu_is_a_clear_error` runs everywhere. On the GPU machine: `cargo test -p sift-gpu --features cuda` built here,
//! the test binary carried there (see docs/gpu.md). The weights: the default model (SmolLM2,
//! Q4_1 and Q8_0) when present, and every GGUF listed in `SIFT_GPU_TEST_GGUF` (colon-separated;
//! `scripts/gpu-test-tensors.sh` cuts the Qwen2.5 files' Q4_K / Q5_0 / Q6_K / Q8_0 matrices and
//! llama.cpp re-quantizations to Q4_0 / Q5_K / F16 into small files).
//!
//! Tolerances, per output of a row `w` and input `x`:
//! - GPU vs f64 over the dequantized weights: `1e-5 · Σ|w_i·x_i| + 1e-6` (f32 sums);
//! - GPU vs the CPU kernel: the CPU's rounding of each 32-value block of `x` to 8 bits, at most
//!   `Σ_b (max_b|x| / 254) · Σ_b|w|` for 32-value blocks (Q8_K's 256: `max/254` over the block),
//!   plus the f64 bound above.

use sift_gguf::GgufFile;
use sift_gpu::{GpuDevice, GpuError, GpuJob};
use sift_quant::WeightType;

fn open() -> GpuDevice {
    GpuDevice::open(0).expect("a GPU")
}

fn models() -> Vec<String> {
    let mut v = Vec::new();
    let default = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if std::path::Path::new(default).exists() {
        v.push(default.to_string());
    } else {
        eprintln!("{default} missing: run scripts/fetch-model.sh first");
    }
    if let Ok(list) = std::env::var("SIFT_GPU_TEST_GGUF") {
        v.extend(list.split(':').filter(|s| !s.is_empty()).map(String::from));
    }
    v
}

/// Deterministic inputs in -1..1 with a few large entries (activations have outliers).
fn inputs(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            if i % 97 == 0 {
                8.0 * v
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn no_gpu_is_a_clear_error() {
    if GpuDevice::built() {
        // On a machine without a driver or device `open` says which.
        if let Err(e) = GpuDevice::open(0) {
            let msg = e.to_string();
            assert!(msg.contains("driver") || msg.contains("device") || msg.contains("NVRTC"), "{msg}");
        }
        let e = GpuDevice::open(1 << 20).err().expect("no machine has a millionth GPU");
        assert!(matches!(e, GpuError::NoDevice { .. } | GpuError::NoDriver | GpuError::NoNvrtc), "{e}");
    } else {
        let e = GpuDevice::open(0).err().expect("a build without the feature has no GPU");
        assert!(matches!(e, GpuError::NotBuilt));
        assert!(e.to_string().contains("cuda"));
    }
}

/// The kernels compile wherever NVRTC is found (no device needed): catches a broken kernels.cu
/// on a machine without a GPU when libnvrtc is on the library path.
#[test]
#[ignore = "needs NVRTC (a CUDA driver install): cargo test -- --ignored where it is"]
fn kernels_compile() {
    let n = GpuDevice::compile_kernels().expect("NVRTC compiles the kernels");
    assert!(n > 1000, "PTX of {n} bytes");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --ignored on a machine with one (.ci/run does where nvidia-smi sees one)"]
fn gpu_products_match_cpu_kernels_on_real_weights() {
    let mut dev = open();
    let files = models();
    assert!(!files.is_empty(), "no weights to test with: fetch the default model (scripts/fetch-model.sh)");
    let mut tested = std::collections::BTreeMap::<&'static str, usize>::new();
    for path in &files {
        let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        for t in &f.gguf.tensors {
            let Some(ty) = WeightType::from_ggml_id(t.ty.id()) else { continue };
            if t.dims.len() != 2 || !t.name.ends_with(".weight") {
                continue;
            }
            let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
            // Enough of each type's matrices; large ones cut to their first 4096 rows.
            if *tested.get(ty.name()).unwrap_or(&0) >= 6 {
                continue;
            }
            let rows = rows.min(4096);
            let rb = ty.row_bytes(cols).unwrap();
            let data = &f.tensor_bytes(&t.name).unwrap()[..rows * rb];
            let w = dev.upload(&t.name, ty, rows, cols, data).unwrap();
            // One token and a batch of five (the kernel's token loop).
            for n_tok in [1usize, 5] {
                let x = inputs(rows as u64 * 31 + cols as u64 + n_tok as u64, cols * n_tok);
                let mut y = vec![f32::NAN; rows * n_tok];
                dev.matmul_many(&x, cols, n_tok, &mut [GpuJob { w: &w, out: &mut y }]).unwrap();
                check(&t.name, ty, data, rb, cols, &x, &y, n_tok);
            }
            *tested.entry(ty.name()).or_default() += 1;
        }
    }
    eprintln!("matrices tested per type: {tested:?}");
}

/// Every weight type on the default model's real weights re-quantized by sift's quantizers (the
/// scalar references of `sift_quant`): the types no shipped model file here uses (Q4_0, Q5_K,
/// F16, BF16, F32) and the others again. Two matrices: `blk.0.attn_q` (576 wide: the 32-value
/// types) and `blk.0.ffn_down` (1536 wide: the K-quants too).
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --ignored on a machine with one (.ci/run does where nvidia-smi sees one)"]
fn gpu_products_match_cpu_kernels_on_requantized_weights() {
    let mut dev = open();
    let path = models().into_iter().next().expect("the default model (scripts/fetch-model.sh)");
    let f = GgufFile::open(&path).unwrap();
    for name in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"] {
        let t = f.gguf.tensor(name).unwrap();
        let src_ty = WeightType::from_ggml_id(t.ty.id()).unwrap();
        let (cols, rows) = (t.dims[0] as usize, (t.dims[1] as usize).min(512));
        let src = f.tensor_bytes(name).unwrap();
        let src_rb = src_ty.row_bytes(cols).unwrap();
        let mut row = vec![0f32; cols];
        for ty in [
            WeightType::F32,
            WeightType::F16,
            WeightType::BF16,
            WeightType::Q4_0,
            WeightType::Q4_1,
            WeightType::Q5_0,
            WeightType::Q8_0,
            WeightType::Q4_K,
            WeightType::Q5_K,
            WeightType::Q6_K,
        ] {
            let Some(rb) = ty.row_bytes(cols) else { continue };
            if cols % ty.block_size() != 0 {
                continue;
            }
            let mut data = Vec::with_capacity(rows * rb);
            for r in 0..rows {
                src_ty.dequantize_row(&src[r * src_rb..(r + 1) * src_rb], &mut row);
                data.extend(sift_quant::scalar::quantize_row(ty, &row));
            }
            let w = dev.upload(name, ty, rows, cols, &data).unwrap();
            for n_tok in [1usize, 3] {
                let x = inputs(7 + n_tok as u64 + cols as u64, cols * n_tok);
                let mut y = vec![f32::NAN; rows * n_tok];
                dev.matmul_many(&x, cols, n_tok, &mut [GpuJob { w: &w, out: &mut y }]).unwrap();
                check(name, ty, &data, rb, cols, &x, &y, n_tok);
            }
            eprintln!("{name} as {}: {rows} rows ok", ty.name());
        }
    }
}

/// Several products of one input in one call (q, k, v) give what each gives alone.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --ignored on a machine with one (.ci/run does where nvidia-smi sees one)"]
fn many_products_in_one_call_equal_single_products() {
    let mut dev = open();
    let path = models().into_iter().next().expect("the default model (scripts/fetch-model.sh)");
    let f = GgufFile::open(&path).unwrap();
    let ws: Vec<_> = ["blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight"]
        .iter()
        .map(|name| {
            let t = f.gguf.tensor(name).unwrap();
            let ty = WeightType::from_ggml_id(t.ty.id()).unwrap();
            dev.upload(name, ty, t.dims[1] as usize, t.dims[0] as usize, f.tensor_bytes(name).unwrap()).unwrap()
        })
        .collect();
    let cols = ws[0].cols;
    let n_tok = 7;
    let x = inputs(99, cols * n_tok);
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows * n_tok]).collect();
    {
        let mut jobs: Vec<GpuJob<'_>> = ws.iter().zip(outs.iter_mut()).map(|(w, out)| GpuJob { w, out }).collect();
        dev.matmul_many(&x, cols, n_tok, &mut jobs).unwrap();
    }
    for (w, out) in ws.iter().zip(&outs) {
        let mut alone = vec![f32::NAN; w.rows * n_tok];
        dev.matmul_many(&x, cols, n_tok, &mut [GpuJob { w, out: &mut alone }]).unwrap();
        assert!(out.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", w.name);
    }
}

#[allow(clippy::too_many_arguments)]
fn check(name: &str, ty: WeightType, data: &[u8], rb: usize, cols: usize, x: &[f32], y: &[f32], n_tok: usize) {
    let rows = data.len() / rb;
    let act = ty.act_type();
    let dot = ty.dot_fn();
    let mut wf = vec![0f32; cols];
    let mut qa = vec![0u8; act.row_bytes(cols)];
    let ab = act.block_size();
    for t in 0..n_tok {
        let xt = &x[t * cols..(t + 1) * cols];
        act.quantize(xt, &mut qa);
        for r in 0..rows {
            let row = &data[r * rb..(r + 1) * rb];
            ty.dequantize_row(row, &mut wf);
            let exact: f64 = wf.iter().zip(xt).map(|(&w, &v)| w as f64 * v as f64).sum();
            let mag: f64 = wf.iter().zip(xt).map(|(&w, &v)| (w as f64 * v as f64).abs()).sum();
            let f64_bound = 1e-5 * mag + 1e-6;
            let got = y[t * rows + r] as f64;
            assert!(
                (got - exact).abs() <= f64_bound,
                "{name} ({}) token {t} row {r}: GPU {got} vs f64 {exact} (bound {f64_bound})",
                ty.name()
            );
            let cpu = dot(cols, row, &qa) as f64;
            let round: f64 = if ab == 1 {
                0.0
            } else {
                wf.chunks(ab)
                    .zip(xt.chunks(ab))
                    .map(|(w, v)| {
                        let m = v.iter().fold(0f32, |m, &a| m.max(a.abs())) as f64;
                        m / 254.0 * w.iter().map(|&a| a.abs() as f64).sum::<f64>()
                    })
                    .sum()
            };
            // The CPU's f16 block sums (Q8_1's `s`) round too: 1e-3 of the magnitude covers them.
            let bound = round * 1.01 + 1e-3 * mag + 2.0 * f64_bound;
            assert!(
                (got - cpu).abs() <= bound,
                "{name} ({}) token {t} row {r}: GPU {got} vs CPU {cpu} (bound {bound})",
                ty.name()
            );
        }
    }
}
