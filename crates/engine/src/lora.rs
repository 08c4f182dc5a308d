//! LoRA adapters (DIP §4, ActiveFlow §5's recovery): per adapted op a low-rank correction
//! `y += s · B·(A·x)` (A: r × n_in, B: n_out × r, s = alpha / r), computed as a side product on
//! the op's *masked* input, right after the op itself: the sparse path keeps its speed (the
//! weights are read as before, only the active inputs' columns of A are read) and the adapter
//! sees what the op saw while it was trained (`sift train distill`).
//!
//! # The file
//! A GGUF LoRA as llama.cpp writes and reads it (`--lora`): `general.type = "adapter"`,
//! `adapter.type = "lora"`, `adapter.lora.alpha`, `general.architecture` the base model's, and
//! per op the tensors `blk.N.OP.weight.lora_a` (ne `[n_in, r]`) and `.lora_b` (ne `[r, n_out]`),
//! f32 or f16. sift adds `sift.distill.*` keys (how it was trained) that llama.cpp ignores. Every
//! file is untrusted: the architecture, every name, shape, rank and value is checked against the
//! model before use, with a message naming what is wrong.

use crate::sparsity::Site;
use sift_gguf::{GgmlType, Gguf, GgufWriter, WriteValue};
use sift_model::layout::OpKind;
use sift_model::Model;
use std::path::{Path, PathBuf};

/// The largest adapter file read (the adapters of a 70B model at rank 64 are ~1 GiB).
const MAX_FILE: u64 = 4 << 30;
/// The largest rank accepted.
pub const MAX_RANK: usize = 1024;
/// The largest adapter weight accepted (in magnitude).
pub const MAX_VALUE: f32 = 1e4;

/// Problems with an adapter file.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a LoRA adapter for this model: {why}; train one with `sift train distill -m MODEL -f TEXT -o FILE` (or convert it with llama.cpp's convert_lora_to_gguf.py)")]
    Format { path: PathBuf, why: String },
}

/// llama.cpp's tensor name of each op.
pub fn op_name(op: OpKind) -> &'static str {
    match op {
        OpKind::Q => "attn_q",
        OpKind::K => "attn_k",
        OpKind::V => "attn_v",
        OpKind::O => "attn_output",
        OpKind::Gate => "ffn_gate",
        OpKind::Up => "ffn_up",
        OpKind::Down => "ffn_down",
    }
}

fn op_index(op: OpKind) -> usize {
    OpKind::ALL.iter().position(|&o| o == op).expect("in ALL")
}

/// One op's adapter: `a_t` is Aᵀ (n_in × r, row j = the column of A input j multiplies), `b_t`
/// is Bᵀ (r × n_out), both row-major: the side product reads A by the active inputs and adds B
/// as r runs over the outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct OpAdapter {
    pub n_in: usize,
    pub n_out: usize,
    pub rank: usize,
    pub a_t: Vec<f32>,
    pub b_t: Vec<f32>,
}

/// How an adapter was trained (`sift.distill.*`; empty for adapters from elsewhere).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DistillInfo {
    pub method: String,
    pub ratio: f32,
    pub steps: u64,
    pub tokens: u64,
    pub seed: u64,
    pub loss: f32,
    /// Trained quantization-aware (`sift train distill --qat`, `sift.distill.qat`): the adapters
    /// are meant to be fused onto the weights' own grid, not computed beside them.
    pub qat: bool,
}

/// The adapters of a model: per layer, per op (in [`OpKind::ALL`] order), one or none.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraAdapters {
    pub alpha: f32,
    /// Multiplies `alpha / r` (llama.cpp's `--lora-scaled FILE SCALE`; 1 by default).
    pub user_scale: f32,
    pub layers: Vec<[Option<OpAdapter>; 7]>,
    pub info: DistillInfo,
}

impl LoraAdapters {
    /// No adapters yet, for `n_layer` layers.
    pub fn empty(n_layer: usize, alpha: f32) -> LoraAdapters {
        LoraAdapters { alpha, user_scale: 1.0, layers: vec![Default::default(); n_layer], info: DistillInfo::default() }
    }

    pub fn get(&self, layer: usize, op: OpKind) -> Option<&OpAdapter> {
        self.layers.get(layer)?[op_index(op)].as_ref()
    }

    pub fn set(&mut self, layer: usize, op: OpKind, a: OpAdapter) {
        self.layers[layer][op_index(op)] = Some(a);
    }

    /// The ops adapted in any layer.
    pub fn ops(&self) -> Vec<OpKind> {
        OpKind::ALL.into_iter().filter(|&op| self.layers.iter().any(|l| l[op_index(op)].is_some())).collect()
    }

    /// Bytes the adapters hold in memory.
    pub fn bytes(&self) -> usize {
        self.layers.iter().flatten().flatten().map(|a| 4 * (a.a_t.len() + a.b_t.len())).sum()
    }

    /// The factor of an adapter of rank `rank`: `scale · alpha / rank`, or `scale` alone when the
    /// file gives no alpha or 0 (llama.cpp's `llama_adapter_lora_weight::get_scale`: such a file
    /// would otherwise do nothing).
    pub fn scale(&self, rank: usize) -> f32 {
        if self.alpha == 0.0 {
            self.user_scale
        } else {
            self.user_scale * self.alpha / rank as f32
        }
    }

    /// Adds the adapter of `op` in `layer` to the outputs `rows` of that op only: `x` holds `n`
    /// rows of the op's input, `out` `n` rows of `rows.len()` outputs (a sparse prompt block's
    /// chosen gate or up rows).
    pub fn apply_rows(&self, layer: usize, op: OpKind, x: &[f32], n: usize, rows: &[u32], out: &mut [f32]) {
        let Some(a) = self.get(layer, op) else { return };
        let s = self.scale(a.rank);
        let k = rows.len();
        let mut z = vec![0f32; a.rank];
        for t in 0..n {
            z.fill(0.0);
            for (&xj, col) in x[t * a.n_in..(t + 1) * a.n_in].iter().zip(a.a_t.chunks_exact(a.rank)) {
                if xj != 0.0 {
                    for (zi, &w) in z.iter_mut().zip(col) {
                        *zi += xj * w;
                    }
                }
            }
            let out = &mut out[t * k..(t + 1) * k];
            for (&zi, brow) in z.iter().zip(a.b_t.chunks_exact(a.n_out)) {
                let zi = s * zi;
                for (o, &r) in out.iter_mut().zip(rows) {
                    *o += zi * brow[r as usize];
                }
            }
        }
    }

    /// Adds the adapter of `op` in `layer` on an input that is zero but at `units`: `vals` holds
    /// `n` rows of the values there (a sparse prompt block's GLU over its chosen neurons), `out`
    /// `n` rows of the op's outputs.
    pub fn apply_units(&self, layer: usize, op: OpKind, units: &[u32], vals: &[f32], n: usize, out: &mut [f32]) {
        let Some(a) = self.get(layer, op) else { return };
        let s = self.scale(a.rank);
        let k = units.len();
        let mut z = vec![0f32; a.rank];
        for t in 0..n {
            z.fill(0.0);
            for (&j, &v) in units.iter().zip(&vals[t * k..(t + 1) * k]) {
                if v != 0.0 {
                    let col = &a.a_t[j as usize * a.rank..(j as usize + 1) * a.rank];
                    for (zi, &w) in z.iter_mut().zip(col) {
                        *zi += v * w;
                    }
                }
            }
            let out = &mut out[t * a.n_out..(t + 1) * a.n_out];
            for (&zi, brow) in z.iter().zip(a.b_t.chunks_exact(a.n_out)) {
                let zi = s * zi;
                for (o, &b) in out.iter_mut().zip(brow) {
                    *o += zi * b;
                }
            }
        }
    }

    /// Adds every adapter of `site` in `layer` to its op's output: `x` holds `n` rows of the
    /// site's (masked) input, `outs` one output per op of the site, `n` rows each. Zero inputs
    /// (skipped by the selector) cost nothing.
    pub fn apply(&self, layer: usize, site: Site, x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        let Some(row) = self.layers.get(layer) else { return };
        for (&op, out) in site.ops().iter().zip(outs.iter_mut()) {
            let Some(a) = &row[op_index(op)] else { continue };
            let s = self.scale(a.rank);
            let mut z = vec![0f32; a.rank];
            for t in 0..n {
                let x = &x[t * a.n_in..(t + 1) * a.n_in];
                let out = &mut out[t * a.n_out..(t + 1) * a.n_out];
                crate::vecops::low_rank_add(x, &a.a_t, &a.b_t, s, &mut z, out);
            }
        }
    }

    /// The GGUF LoRA file (llama.cpp's layout) for a base model of architecture `arch`.
    pub fn to_gguf(&self, arch: &str) -> Vec<u8> {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", WriteValue::String(arch.into()))
            .meta("general.type", WriteValue::String("adapter".into()))
            .meta("adapter.type", WriteValue::String("lora".into()))
            .meta("adapter.lora.alpha", WriteValue::F32(self.alpha))
            .meta("sift.distill.method", WriteValue::String(self.info.method.clone()))
            .meta("sift.distill.ratio", WriteValue::F32(self.info.ratio))
            .meta("sift.distill.steps", WriteValue::U64(self.info.steps))
            .meta("sift.distill.tokens", WriteValue::U64(self.info.tokens))
            .meta("sift.distill.seed", WriteValue::U64(self.info.seed))
            .meta("sift.distill.loss", WriteValue::F32(self.info.loss))
            .meta("sift.distill.qat", WriteValue::U32(u32::from(self.info.qat)));
        for (l, row) in self.layers.iter().enumerate() {
            for (op, a) in OpKind::ALL.iter().zip(row) {
                let Some(a) = a else { continue };
                let name = format!("blk.{l}.{}.weight", op_name(*op));
                // lora_a: A, r rows of n_in; lora_b: B, n_out rows of r.
                let am = transpose(&a.a_t, a.n_in, a.rank);
                w.tensor_f32(&format!("{name}.lora_a"), a.rank, a.n_in, am);
                w.tensor_f32(&format!("{name}.lora_b"), a.n_out, a.rank, transpose(&a.b_t, a.rank, a.n_out));
            }
        }
        w.to_bytes()
    }

    /// Reads a GGUF LoRA for `model`, checking it against the model.
    pub fn load(path: &Path, model: &Model) -> Result<LoraAdapters, LoraError> {
        let bytes = sift_output::read_regular(path, MAX_FILE)
            .map_err(|source| LoraError::Io { path: path.to_path_buf(), source })?;
        LoraAdapters::from_gguf(&bytes, model).map_err(|why| LoraError::Format { path: path.to_path_buf(), why })
    }

    /// [`LoraAdapters::load`] on bytes in memory; the error says what is wrong.
    pub fn from_gguf(bytes: &[u8], model: &Model) -> Result<LoraAdapters, String> {
        let g = Gguf::parse(bytes).map_err(|e| e.to_string())?;
        let key = |k: &str| g.get_str(k).ok_or_else(|| format!("'{k}' is missing"));
        if key("general.type")? != "adapter" || key("adapter.type")? != "lora" {
            return Err("general.type is not 'adapter' or adapter.type is not 'lora'".into());
        }
        let arch = key("general.architecture")?;
        if arch != model.config.arch.name() {
            return Err(format!("it is for a '{arch}' model, this one is '{}'", model.config.arch.name()));
        }
        let alpha = g.get_f32("adapter.lora.alpha").unwrap_or(0.0);
        if !alpha.is_finite() || alpha.abs() > 1e6 {
            return Err(format!("adapter.lora.alpha {alpha} is not a usable scale"));
        }
        let c = &model.config;
        let mut out = LoraAdapters::empty(c.n_layer, alpha);
        out.info = DistillInfo {
            method: g.get_str("sift.distill.method").unwrap_or("").to_string(),
            ratio: g.get_f32("sift.distill.ratio").unwrap_or(0.0),
            steps: g.get_u64("sift.distill.steps").unwrap_or(0),
            tokens: g.get_u64("sift.distill.tokens").unwrap_or(0),
            seed: g.get_u64("sift.distill.seed").unwrap_or(0),
            loss: g.get_f32("sift.distill.loss").unwrap_or(0.0),
            qat: g.get_u64("sift.distill.qat").unwrap_or(0) != 0,
        };
        let read = |name: &str, rows: usize, cols: usize| -> Result<Vec<f32>, String> {
            let t = g.tensor(name).ok_or_else(|| format!("'{name}' is missing (every lora_a needs its lora_b)"))?;
            if t.dims != [cols as u64, rows as u64] {
                return Err(format!("'{name}' has shape {:?}, the model needs [{cols}, {rows}]", t.dims));
            }
            let at = g.data_offset.checked_add(t.offset).ok_or("tensor offset overflows")? as usize;
            let n = rows * cols;
            let v: Vec<f32> = match t.ty {
                GgmlType::F32 => bytes
                    .get(at..at + 4 * n)
                    .ok_or_else(|| format!("'{name}' lies past the end of the file"))?
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                GgmlType::F16 => bytes
                    .get(at..at + 2 * n)
                    .ok_or_else(|| format!("'{name}' lies past the end of the file"))?
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                other => return Err(format!("'{name}' is {} (adapters are f32 or f16)", other.name())),
            };
            if let Some(bad) = v.iter().position(|x| !x.is_finite()) {
                return Err(format!("'{name}' holds a non-finite value at {bad}"));
            }
            // Trained adapters hold values far below one; one of 1e35 overflows the model a few
            // layers on, where the error could no longer name this file.
            if let Some(bad) = v.iter().position(|x| x.abs() > MAX_VALUE) {
                return Err(format!(
                    "'{name}' holds {:e} at {bad}, beyond ±{MAX_VALUE:e}: adapter weights that large overflow the model (a damaged file?)",
                    v[bad]
                ));
            }
            Ok(v)
        };
        let mut seen = 0usize;
        for t in &g.tensors {
            let Some(base) = t.name.strip_suffix(".lora_a") else {
                if t.name.ends_with(".lora_b") {
                    continue;
                }
                return Err(format!("tensor '{}' is not a LoRA tensor (NAME.lora_a / NAME.lora_b)", t.name));
            };
            let (layer, op) = parse_name(base, c.n_layer)?;
            let w = model.layers[layer].op(op);
            let (n_in, n_out) = (w.cols, w.rows);
            let rank = t.dims.get(1).copied().unwrap_or(0) as usize;
            if rank == 0 || rank > MAX_RANK || t.dims.len() != 2 {
                return Err(format!("'{}' has shape {:?}: the rank must be 1 to {MAX_RANK}", t.name, t.dims));
            }
            let am = read(&t.name, rank, n_in)?;
            let b = read(&format!("{base}.lora_b"), n_out, rank)?;
            let (a_t, b_t) = (transpose(&am, rank, n_in), transpose(&b, n_out, rank));
            out.set(layer, op, OpAdapter { n_in, n_out, rank, a_t, b_t });
            seen += 2;
        }
        if seen != g.tensors.len() {
            return Err("a lora_b tensor has no lora_a".into());
        }
        if seen == 0 {
            return Err("it holds no adapter tensors".into());
        }
        Ok(out)
    }
}

/// Row `r` of op `op` in `layer` with its adapter fused, before quantization: the dequantized
/// row plus `s · (B·A)[r, :]` (the row unchanged where the op has no adapter).
pub fn fused_row(model: &Model, adapters: &LoraAdapters, layer: usize, op: OpKind, r: usize, row: &mut [f32]) {
    let w = model.layers[layer].op(op);
    w.ty.dequantize_row(model.row(w, r), row);
    let Some(a) = adapters.get(layer, op) else { return };
    let s = adapters.scale(a.rank);
    for (j, v) in row.iter_mut().enumerate() {
        let acol = &a.a_t[j * a.rank..(j + 1) * a.rank];
        let d: f32 = (0..a.rank).map(|i| a.b_t[i * a.n_out + r] * acol[i]).sum();
        *v += s * d;
    }
}

/// How [`fuse`] writes a fused row back into its quantized type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Rounding {
    /// Quantized afresh, new block scales chosen for the fused values (llama.cpp's
    /// `llama-export-lora`): every weight of an adapted block is rounded again, which dithers
    /// the correction into the weights.
    #[default]
    Fresh,
    /// Onto the row's own grid (`sift_quant::grid`): the block scales kept, each fused value
    /// rounded to the nearest level they express, so weights the correction moves by less than
    /// half a level keep their integers — and lose the correction there. Float types are
    /// written as they are either way.
    Grid,
}

impl std::str::FromStr for Rounding {
    type Err = String;
    fn from_str(s: &str) -> Result<Rounding, String> {
        match s {
            "fresh" => Ok(Rounding::Fresh),
            "grid" => Ok(Rounding::Grid),
            _ => Err(format!("unknown rounding '{s}' (fresh or grid)")),
        }
    }
}

/// The model's GGUF with the adapters fused into the weights they adapt: each adapted row
/// dequantized, `s · B·A` added, quantized again to its own type by `rounding`. The file keeps
/// its layout byte for byte (same types, same sizes): only the adapted tensors' data changes, so
/// llama.cpp runs it and `sift pack` packs it. See docs/sparsity.md for what survives at 4 bits.
pub fn fuse(model: &Model, adapters: &LoraAdapters, rounding: Rounding) -> Result<Vec<u8>, String> {
    if model.columns.is_some() {
        return Err("fusing needs the GGUF model, not its pack".into());
    }
    let mut bytes = model.file.bytes().to_vec();
    for (l, lw) in model.layers.iter().enumerate() {
        for op in OpKind::ALL {
            if adapters.get(l, op).is_none() {
                continue;
            }
            let w = lw.op(op);
            if w.packed {
                return Err(format!("{}: the weights are repacked; fuse from the file as it is", w.name));
            }
            let mut row = vec![0f32; w.cols];
            for r in 0..w.rows {
                fused_row(model, adapters, l, op, r, &mut row);
                let at = w.range.start + r * w.row_bytes;
                let src = &bytes[at..at + w.row_bytes];
                let q = match rounding {
                    Rounding::Grid => sift_quant::grid::round_onto_grid(w.ty, src, &row),
                    Rounding::Fresh => None,
                }
                .unwrap_or_else(|| sift_quant::scalar::quantize_row(w.ty, &row));
                bytes[at..at + w.row_bytes].copy_from_slice(&q);
            }
        }
    }
    Ok(bytes)
}

/// The transpose of `m` (`rows × cols`, row-major).
pub fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

/// `blk.N.OP.weight` → (N, op).
fn parse_name(base: &str, n_layer: usize) -> Result<(usize, OpKind), String> {
    let bad =
        || format!("'{base}' is not an adapted weight sift knows (blk.N.attn_q|k|v|output / ffn_gate|up|down.weight)");
    let rest = base.strip_prefix("blk.").ok_or_else(bad)?;
    let (n, rest) = rest.split_once('.').ok_or_else(bad)?;
    let layer: usize = n.parse().map_err(|_| bad())?;
    if layer >= n_layer {
        return Err(format!("'{base}': layer {layer}, the model has {n_layer}"));
    }
    let name = rest.strip_suffix(".weight").ok_or_else(bad)?;
    let op = OpKind::ALL.into_iter().find(|&op| op_name(op) == name).ok_or_else(bad)?;
    Ok((layer, op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(parse_name("blk.3.ffn_down.weight", 30).unwrap(), (3, OpKind::Down));
        assert_eq!(parse_name("blk.0.attn_output.weight", 30).unwrap(), (0, OpKind::O));
        assert!(parse_name("blk.30.ffn_up.weight", 30).unwrap_err().contains("layer 30"));
        assert!(parse_name("token_embd.weight", 30).is_err());
        assert!(parse_name("blk.1.ffn_norm.weight", 30).is_err());
    }

    /// A sparse block's two forms of the side product — on chosen output rows, on an input
    /// given by its non-zero units — equal the plain one's entries.
    #[test]
    fn rows_and_units_match_the_whole_product() {
        let (n_in, n_out, r) = (6, 5, 3);
        let a = OpAdapter {
            n_in,
            n_out,
            rank: r,
            a_t: (0..n_in * r).map(|i| (i as f32 * 0.37).sin()).collect(),
            b_t: (0..n_out * r).map(|i| (i as f32 * 0.71).cos()).collect(),
        };
        let mut l = LoraAdapters::empty(1, 6.0);
        l.set(0, OpKind::Gate, a.clone());
        l.set(
            0,
            OpKind::Down,
            OpAdapter {
                n_in: n_out,
                n_out: n_in,
                rank: r,
                a_t: transpose(&a.b_t, r, n_out),
                b_t: transpose(&a.a_t, n_in, r),
            },
        );
        let x: Vec<f32> = (0..2 * n_in).map(|i| (i as f32 * 1.3).sin()).collect();
        let mut whole = vec![0f32; 2 * n_out];
        let mut up = vec![0f32; 2 * n_out];
        l.apply(0, Site::FfnIn, &x, 2, &mut [&mut whole[..], &mut up[..]]);
        let rows = [1u32, 3, 4];
        let mut picked = vec![0f32; 2 * rows.len()];
        l.apply_rows(0, OpKind::Gate, &x, 2, &rows, &mut picked);
        for t in 0..2 {
            for (i, &r) in rows.iter().enumerate() {
                assert!((picked[t * 3 + i] - whole[t * n_out + r as usize]).abs() < 1e-5);
            }
        }
        // Down's input zero but at units 0, 2, 4.
        let units = [0u32, 2, 4];
        let vals: Vec<f32> = (0..2 * units.len()).map(|i| i as f32 * 0.5 - 1.0).collect();
        let mut dense = vec![0f32; 2 * n_out];
        for t in 0..2 {
            for (i, &u) in units.iter().enumerate() {
                dense[t * n_out + u as usize] = vals[t * 3 + i];
            }
        }
        let (mut want, mut got) = (vec![0f32; 2 * n_in], vec![0f32; 2 * n_in]);
        l.apply(0, Site::FfnMid, &dense, 2, &mut [&mut want[..]]);
        l.apply_units(0, OpKind::Down, &units, &vals, 2, &mut got);
        assert!(want.iter().zip(&got).all(|(a, b)| (a - b).abs() < 1e-5), "{want:?} {got:?}");
        assert!(want.iter().any(|&v| v != 0.0));
    }

    /// The side product equals B·(A·x) computed plainly, and skips zero inputs.
    #[test]
    fn apply_adds_the_low_rank_product() {
        let (n_in, n_out, r) = (5, 3, 2);
        let a = OpAdapter {
            n_in,
            n_out,
            rank: r,
            a_t: (0..n_in * r).map(|i| i as f32 * 0.1 - 0.3).collect(),
            b_t: (0..n_out * r).map(|i| 1.0 - i as f32 * 0.2).collect(),
        };
        let mut l = LoraAdapters::empty(1, 4.0);
        l.set(0, OpKind::Down, a.clone());
        let x = [1.0, 0.0, -2.0, 0.5, 3.0, 0.0, 1.0, 0.0, 0.0, 2.0];
        let mut out = vec![1.0f32; 2 * n_out];
        l.apply(0, Site::FfnMid, &x, 2, &mut [&mut out[..]]);
        for t in 0..2 {
            for o in 0..n_out {
                let mut want = 0.0;
                for i in 0..r {
                    let z: f32 = (0..n_in).map(|j| a.a_t[j * r + i] * x[t * n_in + j]).sum();
                    want += a.b_t[i * n_out + o] * z;
                }
                let got = out[t * n_out + o] - 1.0;
                assert!((got - 2.0 * want).abs() < 1e-5, "{got} vs {}", 2.0 * want);
            }
        }
    }
}
