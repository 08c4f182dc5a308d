//! Test support: locating the real models and a small GGUF writer for synthetic files.
#![allow(dead_code)]

use std::path::PathBuf;

use sift_gguf::{GgmlType, MetaValue};

/// Path of the SmolLM2 test model: `$SIFT_MODEL`, else `models/` at the workspace root.
pub fn smollm_path() -> PathBuf {
    let path = match std::env::var_os("SIFT_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(path.is_file(), "test model {} is missing; run scripts/fetch-model.sh first", path.display());
    path
}

/// Path of the optional Qwen2.5 test model, if present.
pub fn qwen_path() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    path.is_file().then_some(path)
}

/// The first `n` bytes of the SmolLM2 model (the whole file if shorter).
pub fn smollm_prefix(n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(n);
    std::fs::File::open(smollm_path()).unwrap().take(n as u64).read_to_end(&mut buf).unwrap();
    buf
}

/// A unique path under cargo's per-test-target scratch directory.
pub fn scratch_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{name}", std::process::id()))
}

/// Asserts `err`'s message contains every one of `words`.
#[track_caller]
pub fn assert_msg<T: std::fmt::Debug>(res: Result<T, sift_gguf::GgufError>, words: &[&str]) {
    let err = match res {
        Ok(v) => panic!("expected an error containing {words:?}, got Ok({v:?})"),
        Err(e) => e,
    };
    let msg = err.to_string();
    for w in words {
        assert!(msg.contains(w), "error message lacks {w:?}: {msg}");
    }
}

/// GGUF value type id of `v` (arrays are 9).
pub fn value_type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

/// Low-level little-endian writer for hand-made (possibly malformed) GGUF bytes.
#[derive(Default, Clone)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.raw(&[v])
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    /// A GGUF string: u64 length + bytes (need not be UTF-8).
    pub fn str_bytes(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).raw(s)
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.str_bytes(s.as_bytes())
    }
    /// Magic, version and the two counts.
    pub fn header(&mut self, version: u32, n_tensors: u64, n_kv: u64) -> &mut Self {
        self.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)
    }
    /// A metadata pair: key, type id, value.
    pub fn kv(&mut self, key: &str, v: &MetaValue) -> &mut Self {
        self.str(key).u32(value_type_id(v)).value_body(v)
    }
    /// A value without its type id. Empty arrays are written with element type u8.
    pub fn value_body(&mut self, v: &MetaValue) -> &mut Self {
        match v {
            MetaValue::U8(x) => self.u8(*x),
            MetaValue::I8(x) => self.raw(&x.to_le_bytes()),
            MetaValue::U16(x) => self.raw(&x.to_le_bytes()),
            MetaValue::I16(x) => self.raw(&x.to_le_bytes()),
            MetaValue::U32(x) => self.u32(*x),
            MetaValue::I32(x) => self.raw(&x.to_le_bytes()),
            MetaValue::F32(x) => self.raw(&x.to_le_bytes()),
            MetaValue::Bool(x) => self.u8(*x as u8),
            MetaValue::String(s) => self.str(s),
            MetaValue::U64(x) => self.u64(*x),
            MetaValue::I64(x) => self.raw(&x.to_le_bytes()),
            MetaValue::F64(x) => self.raw(&x.to_le_bytes()),
            MetaValue::Array(items) => {
                let elem = items.get(0).as_ref().map_or(0, value_type_id);
                self.u32(elem).u64(items.len() as u64);
                for it in items.iter() {
                    self.value_body(&it);
                }
                self
            }
        }
    }
    /// A tensor info with the given raw fields.
    pub fn tensor_info(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }
    /// Zero padding up to a multiple of `align`.
    pub fn pad_to(&mut self, align: usize) -> &mut Self {
        while !self.buf.len().is_multiple_of(align) {
            self.buf.push(0);
        }
        self
    }
}

/// One tensor for [`GgufBuilder`].
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

/// Builds valid synthetic GGUF files: metadata in order, tensors laid out back to back at
/// aligned offsets, data filled with a per-tensor byte pattern.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorSpec>,
}

/// Result of [`GgufBuilder::build`].
pub struct Built {
    pub bytes: Vec<u8>,
    /// Offset where the tensor infos start.
    pub tensor_infos_start: usize,
    /// Offset just past the last tensor info.
    pub tensor_infos_end: usize,
    pub data_offset: usize,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufBuilder {
    pub fn new() -> Self {
        GgufBuilder { version: 3, metadata: Vec::new(), tensors: Vec::new() }
    }
    pub fn kv(mut self, key: &str, v: MetaValue) -> Self {
        self.metadata.push((key.to_owned(), v));
        self
    }
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType) -> Self {
        self.tensors.push(TensorSpec { name: name.to_owned(), dims: dims.to_vec(), ty });
        self
    }
    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two() && *a <= 1 << 16)
            .unwrap_or(32)
    }
    /// Byte size of a tensor's data.
    pub fn n_bytes(t: &TensorSpec) -> u64 {
        let n: u64 = t.dims.iter().product();
        n / t.ty.block_size() as u64 * t.ty.block_bytes() as u64
    }
    pub fn build(&self) -> Built {
        let align = self.alignment();
        let mut w = Writer::new();
        w.header(self.version, self.tensors.len() as u64, self.metadata.len() as u64);
        for (k, v) in &self.metadata {
            w.kv(k, v);
        }
        let tensor_infos_start = w.buf.len();
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            offsets.push(offset);
            w.tensor_info(&t.name, &t.dims, t.ty.id(), offset);
            offset = (offset + Self::n_bytes(t)).next_multiple_of(align);
        }
        let tensor_infos_end = w.buf.len();
        w.pad_to(align as usize);
        let data_offset = w.buf.len();
        for (i, (t, &off)) in self.tensors.iter().zip(&offsets).enumerate() {
            w.buf.resize(data_offset + off as usize, 0);
            let n = Self::n_bytes(t) as usize;
            w.buf.extend((0..n).map(|j| (j * 31 + i * 7) as u8));
        }
        Built { bytes: w.buf, tensor_infos_start, tensor_infos_end, data_offset }
    }
    /// Just the bytes of [`GgufBuilder::build`].
    pub fn bytes(&self) -> Vec<u8> {
        self.build().bytes
    }
}

/// Expected data byte `j` of tensor number `i` in a [`GgufBuilder`] file.
pub fn pattern_byte(i: usize, j: usize) -> u8 {
    (j * 31 + i * 7) as u8
}

/// One value of every scalar type plus strings and nested arrays.
pub fn all_value_types() -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let kvs = vec![
        ("t.u8", U8(250)),
        ("t.i8", I8(-7)),
        ("t.u16", U16(65000)),
        ("t.i16", I16(-30000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.f32", F32(1.5e-5)),
        ("t.bool.true", Bool(true)),
        ("t.bool.false", Bool(false)),
        ("t.string", String("héllo\n\"wörld\" ✓".into())),
        ("t.string.empty", String(std::string::String::new())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(-1234.5678e100)),
        ("t.arr.u8", Array((0..20).map(U8).collect())),
        ("t.arr.i32", Array(vec![I32(-1), I32(0), I32(7)].into())),
        ("t.arr.f32", Array(vec![F32(0.25), F32(-3.0)].into())),
        ("t.arr.bool", Array(vec![Bool(true), Bool(false)].into())),
        ("t.arr.string", Array(vec![String("a".into()), String("".into()), String("ü".into())].into())),
        ("t.arr.u64", Array(vec![U64(1), U64(u64::MAX)].into())),
        ("t.arr.f64", Array(vec![F64(0.5)].into())),
        ("t.arr.empty", Array(vec![].into())),
        (
            "t.arr.nested",
            Array(vec![Array(vec![I16(1), I16(-2)].into()), Array(vec![I16(3)].into()), Array(vec![].into())].into()),
        ),
        ("t.arr.nested3", Array(vec![Array(vec![Array(vec![String("deep".into())].into())].into())].into())),
    ];
    kvs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A small valid file using every value type and a few tensor types.
pub fn sample_builder() -> GgufBuilder {
    let mut b = GgufBuilder::new().kv("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in all_value_types() {
        b = b.kv(&k, v);
    }
    b.tensor("tok.weight", &[64, 3], GgmlType::Q8_0)
        .tensor("norm.weight", &[5], GgmlType::F32)
        .tensor("blk.0.q.weight", &[256, 2], GgmlType::Q4_K)
        .tensor("x.3d", &[2, 3, 4], GgmlType::F16)
        .tensor("x.4d", &[32, 1, 2, 1], GgmlType::MXFP4)
}
