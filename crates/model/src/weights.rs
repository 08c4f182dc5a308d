//! The model's weight tensors, viewed in place in the memory-mapped GGUF file.
//!
//! A [`QTensor`] is a 2-D matrix stored row-major in a GGML block format: `rows` output rows of
//! `cols` input values each (GGML's `ne[1]` and `ne[0]`). Small tensors (norms, biases) are
//! dequantized to f32 at load time.

use crate::{Config, ModelError};
use sift_gguf::{GgufFile, TensorInfo};
use sift_quant::WeightType;
use std::ops::Range;
use std::path::Path;

/// A quantized matrix: `rows` × `cols`, each row `row_bytes` bytes in the file.
#[derive(Clone, Debug)]
pub struct QTensor {
    pub name: String,
    pub ty: WeightType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Byte range of the whole matrix within the file.
    pub range: Range<usize>,
    /// The rows are stored in interleaved groups ([`sift_quant::packed::BlockQ4Kx8`] or, with
    /// AVX-512 VNNI, [`sift_quant::packed_q4k_x16::BlockQ4Kx16`]: 8 or 16 Q4_K rows;
    /// [`sift_quant::packed_q5_0::BlockQ5_0x16`]: 16 Q5_0 rows), repacked at load
    /// ([`Model::load_into_memory`]); `row_bytes` is still one row's share and the range the same
    /// bytes.
    pub packed: bool,
}

impl QTensor {
    /// Rows per interleaved group: the packed layout's group, 1 for plain rows. Row ranges a
    /// kernel reads start and end on a multiple of this.
    pub fn group_rows(&self) -> usize {
        if self.packed {
            sift_quant::packed::group_rows(self.ty).expect("only packable types are marked packed")
        } else {
            1
        }
    }
}

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QTensor,
    pub wk: QTensor,
    pub wv: QTensor,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: QTensor,
    pub ffn_norm: Vec<f32>,
    pub w_gate: QTensor,
    pub w_up: QTensor,
    pub w_down: QTensor,
}

impl LayerWeights {
    /// The weight of one of the seven linear ops.
    pub fn op(&self, op: crate::layout::OpKind) -> &QTensor {
        use crate::layout::OpKind;
        match op {
            OpKind::Q => &self.wq,
            OpKind::K => &self.wk,
            OpKind::V => &self.wv,
            OpKind::O => &self.wo,
            OpKind::Gate => &self.w_gate,
            OpKind::Up => &self.w_up,
            OpKind::Down => &self.w_down,
        }
    }
}

/// A loaded model: its file, config and tensor views.
pub struct Model {
    pub file: GgufFile,
    pub config: Config,
    pub tok_embd: QTensor,
    pub output_norm: Vec<f32>,
    /// The output head; the same bytes as `tok_embd` when the model ties them.
    pub output: QTensor,
    pub layers: Vec<LayerWeights>,
    /// The column layouts, when the model was opened from a sift pack.
    pub columns: Option<crate::layout::PackIndex>,
    /// The pack file, mapped (its byte ranges are `columns`'), when the model was opened from
    /// one without a memory budget.
    pub pack: Option<sift_gguf::MappedFile>,
}

impl Model {
    /// Opens a GGUF file and checks every tensor the architecture needs.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Self::from_file(GgufFile::open(path)?)
    }

    /// Builds the model from an opened GGUF (a file, or the section embedded in a sift pack).
    pub fn from_file(file: GgufFile) -> Result<Model, ModelError> {
        let config = Config::from_gguf(&file.gguf)?;
        let c = &config;
        let (e, q, kv, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        let mat = |name: &str, cols: usize, rows: usize| matrix(&file, name, cols, rows);
        let vec = |name: &str, n: usize| vector(&file, name, n);
        let opt_vec = |name: &str, n: usize| -> Result<Option<Vec<f32>>, ModelError> {
            if file.gguf.tensor(name).is_some() {
                vector(&file, name, n).map(Some)
            } else {
                Ok(None)
            }
        };
        let tok_embd = mat("token_embd.weight", e, c.n_vocab)?;
        let output = if file.gguf.tensor("output.weight").is_some() {
            mat("output.weight", e, c.n_vocab)?
        } else {
            tok_embd.clone()
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for l in 0..c.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            layers.push(LayerWeights {
                attn_norm: vec(&n("attn_norm.weight"), e)?,
                wq: mat(&n("attn_q.weight"), e, q)?,
                wk: mat(&n("attn_k.weight"), e, kv)?,
                wv: mat(&n("attn_v.weight"), e, kv)?,
                bq: opt_vec(&n("attn_q.bias"), q)?,
                bk: opt_vec(&n("attn_k.bias"), kv)?,
                bv: opt_vec(&n("attn_v.bias"), kv)?,
                wo: mat(&n("attn_output.weight"), q, e)?,
                ffn_norm: vec(&n("ffn_norm.weight"), e)?,
                w_gate: mat(&n("ffn_gate.weight"), e, ff)?,
                w_up: mat(&n("ffn_up.weight"), e, ff)?,
                w_down: mat(&n("ffn_down.weight"), ff, e)?,
            });
        }
        let output_norm = vec("output_norm.weight", e)?;
        Ok(Model { file, config, tok_embd, output_norm, output, layers, columns: None, pack: None })
    }

    /// The mapped pack's bytes (empty when the model was not opened from a mapped pack).
    pub fn pack_bytes(&self) -> &[u8] {
        self.pack.as_ref().map_or(&[], |p| p.bytes())
    }

    /// The raw bytes of a tensor.
    #[inline]
    pub fn data(&self, t: &QTensor) -> &[u8] {
        &self.file.bytes()[t.range.clone()]
    }

    /// A matrix dequantized to f32, `rows × cols` row-major, in GGUF order (a repacked matrix's
    /// groups unpacked first).
    pub fn dequantize(&self, t: &QTensor) -> Vec<f32> {
        let mut out = vec![0f32; t.rows * t.cols];
        let data = self.data(t);
        let (g, nb) = (t.group_rows(), t.row_bytes / t.ty.block_bytes());
        let mut plain = vec![0u8; g * t.row_bytes];
        for (gi, rows) in out.chunks_mut(g * t.cols).enumerate() {
            let src = &data[gi * g * t.row_bytes..(gi + 1) * g * t.row_bytes];
            let bytes = if g > 1 {
                sift_quant::packed::unpack_group(t.ty, src, nb, &mut plain);
                &plain[..]
            } else {
                src
            };
            for (r, row) in rows.chunks_exact_mut(t.cols).enumerate() {
                t.ty.dequantize_row(&bytes[r * t.row_bytes..(r + 1) * t.row_bytes], row);
            }
        }
        out
    }

    /// Row `r` of a tensor as raw block bytes.
    #[inline]
    pub fn row(&self, t: &QTensor, r: usize) -> &[u8] {
        let start = t.range.start + r * t.row_bytes;
        &self.file.bytes()[start..start + t.row_bytes]
    }

    /// Bytes of all weight tensors (what a dense decode step streams, plus the embedding table).
    pub fn weight_bytes(&self) -> u64 {
        self.file.gguf.tensors.iter().map(|t| t.n_bytes).sum()
    }

    /// Number of parameters (elements of all tensors).
    pub fn n_params(&self) -> u64 {
        self.file.gguf.tensors.iter().map(|t| t.n_elements()).sum()
    }

    /// The most common quant type among 2-D weights, e.g. "Q4_1" (for `bench` tables).
    /// The file's quantization as llama.cpp and llama-bench print it (`Q4_K - Medium`), from
    /// `general.file_type`; where the file does not say (or says something unknown), `(guessed) `
    /// and [`Model::main_quant`], as llama.cpp guesses it.
    pub fn file_type_name(&self) -> String {
        let named = self.file.gguf.get_u64(sift_gguf::FILE_TYPE_KEY).and_then(sift_gguf::file_type_name);
        match named {
            Some(n) => n.to_string(),
            None => format!("(guessed) {}", self.main_quant()),
        }
    }

    /// Copies the weights out of the file mapping into memory backed by huge pages
    /// ([`GgufFile::load_into_memory`]) and, with `repack`, repacks them as
    /// [`Model::repack_mapped`] does. Returns how many matrices were repacked. Nothing to do for
    /// a model already in memory.
    pub fn load_into_memory(&mut self, repack: bool) -> std::io::Result<usize> {
        if !self.file.is_file_backed() {
            return Ok(0);
        }
        let targets = if repack { self.repack_targets() } else { Vec::new() };
        self.file.load_into_memory_with(|bytes| repack_in_place(bytes, &targets))?;
        Ok(self.mark_packed(&targets))
    }

    /// Stores every layer's Q4_K matrix whose rows come in groups of 8 as interleaved groups
    /// ([`sift_quant::packed`]) for the 8-row kernels, in a private copy-on-write mapping of the
    /// file ([`GgufFile::edit_mapped`]): those matrices become the process's own memory (as
    /// llama.cpp's repack buffer), the rest stays mapped. The token embedding stays plain (it is
    /// read a row at a time). Returns how many matrices were repacked; none for a model that is
    /// not the file's mapping (a budgeted view, or one already loaded into memory).
    pub fn repack_mapped(&mut self) -> std::io::Result<usize> {
        let targets = self.repack_targets();
        if targets.is_empty() || !self.file.edit_mapped(|bytes| repack_in_place(bytes, &targets))? {
            return Ok(0);
        }
        Ok(self.mark_packed(&targets))
    }

    /// The byte ranges, types and blocks per row of the matrices [`Model::repack_mapped`] repacks
    /// (not packed yet): every layer matrix [`sift_quant::packed::repacks`] on this CPU.
    fn repack_targets(&self) -> Vec<RepackTarget> {
        let embd = self.tok_embd.range.clone();
        let packable = |t: &QTensor| !t.packed && sift_quant::packed::repacks(t.ty, t.rows, t.cols) && t.range != embd;
        let mut targets: Vec<RepackTarget> = Vec::new();
        for l in &self.layers {
            for t in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                if packable(t) && !targets.iter().any(|x| x.range == t.range) {
                    targets.push(RepackTarget { range: t.range.clone(), ty: t.ty, row_bytes: t.row_bytes });
                }
            }
        }
        targets
    }

    /// Marks the layers' matrices at `targets` packed; returns how many ranges there were.
    fn mark_packed(&mut self, targets: &[RepackTarget]) -> usize {
        for l in &mut self.layers {
            for t in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w_gate, &mut l.w_up, &mut l.w_down] {
                t.packed |= targets.iter().any(|x| x.range == t.range);
            }
        }
        targets.len()
    }

    pub fn main_quant(&self) -> &'static str {
        let mut counts: Vec<(&'static str, u64)> = Vec::new();
        for t in &self.file.gguf.tensors {
            if t.dims.len() == 2 {
                let name = t.ty.name();
                match counts.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, c)) => *c += t.n_bytes,
                    None => counts.push((name, t.n_bytes)),
                }
            }
        }
        counts.into_iter().max_by_key(|(_, c)| *c).map(|(n, _)| n).unwrap_or("?")
    }
}

fn find<'a>(file: &'a GgufFile, name: &str) -> Result<&'a TensorInfo, ModelError> {
    file.gguf.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))
}

fn weight_type(t: &TensorInfo) -> Result<WeightType, ModelError> {
    WeightType::from_ggml_id(t.ty.id())
        .ok_or_else(|| ModelError::UnsupportedQuant { name: t.name.clone(), ty: t.ty.name() })
}

fn matrix(file: &GgufFile, name: &str, cols: usize, rows: usize) -> Result<QTensor, ModelError> {
    let t = find(file, name)?;
    let ty = weight_type(t)?;
    let expected = vec![cols as u64, rows as u64];
    let outer: u64 = t.dims.iter().skip(1).product();
    if t.dims.first() != Some(&(cols as u64)) || outer != rows as u64 {
        return Err(ModelError::BadShape { name: name.into(), found: t.dims.clone(), expected });
    }
    let row_bytes = ty.row_bytes(cols).ok_or_else(|| ModelError::BadShape {
        name: name.into(),
        found: t.dims.clone(),
        expected: expected.clone(),
    })?;
    let start =
        usize::try_from(file.gguf.data_offset + t.offset).map_err(|_| ModelError::MissingTensor(name.into()))?;
    let len = row_bytes * rows;
    if t.n_bytes != len as u64 || start + len > file.bytes().len() {
        return Err(ModelError::BadShape { name: name.into(), found: t.dims.clone(), expected });
    }
    Ok(QTensor { name: name.to_string(), ty, rows, cols, row_bytes, range: start..start + len, packed: false })
}

fn vector(file: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let m = matrix(file, name, n, 1)?;
    let mut out = vec![0f32; n];
    m.ty.dequantize_row(&file.bytes()[m.range.clone()], &mut out);
    Ok(out)
}

/// A matrix [`Model::repack_mapped`] repacks: its bytes in the file, type and row size.
struct RepackTarget {
    range: Range<usize>,
    ty: WeightType,
    row_bytes: usize,
}

/// Repacks the matrices at `targets` of `bytes` in place, a group of rows at a time.
fn repack_in_place(bytes: &mut [u8], targets: &[RepackTarget]) {
    let mut group = Vec::new();
    for t in targets {
        let rows = sift_quant::packed::group_rows(t.ty).expect("repack targets have a packed layout");
        let gb = rows * t.row_bytes;
        let nb = t.row_bytes / t.ty.block_bytes();
        for at in (t.range.start..t.range.end).step_by(gb) {
            group.clear();
            group.extend_from_slice(&bytes[at..at + gb]);
            sift_quant::packed::pack_group(t.ty, &group, nb, &mut bytes[at..at + gb]);
        }
    }
}
