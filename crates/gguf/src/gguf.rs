//! Parsing of the GGUF header, metadata and tensor table, and lookups on the result.
//!
//! The input is treated as untrusted: every count is bounded by the bytes that remain before
//! anything is allocated for it, all offset arithmetic is checked, and every tensor's data
//! range is verified to lie inside the file.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use crate::error::show;
use crate::reader::Reader;
use crate::{GgmlType, GgufError, MetaArray, MetaValue, StrArray};

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// How many levels of arrays may nest inside one another in a metadata value.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: u32 = 4;

const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Smallest encoding of one metadata pair: empty key (8) + type (4) + a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4)
/// + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Smallest encoding of one value of type `ty`, or `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 => 8,
        T_STRING => 8,
        T_ARRAY => 4 + 8,
        _ => return None,
    })
}

/// One tensor's entry in the tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, innermost first: `dims[0]` (ne\[0\]) is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of the dimensions (saturating at `u64::MAX`; parsed tensors never overflow).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX)
    }

    /// Bytes in one row of `dims[0]` elements (saturating; exact for parsed tensors).
    pub fn row_bytes(&self) -> u64 {
        let ne0 = self.dims.first().copied().unwrap_or(1);
        (ne0 / self.ty.block_size() as u64).saturating_mul(self.ty.block_bytes() as u64)
    }

    /// Number of rows: the product of all dimensions but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX)
    }
}

/// A parsed GGUF header: version, metadata and tensor table.
#[derive(Clone)]
pub struct Gguf {
    pub version: u32,
    /// Alignment of tensor data (from `general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    /// Metadata pairs in file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Length of the bytes that were parsed.
    pub file_size: u64,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("metadata", &self.metadata)
            .field("tensors", &self.tensors)
            .field("file_size", &self.file_size)
            .finish_non_exhaustive()
    }
}

impl Gguf {
    /// Parses header, metadata and tensor table from the whole file's bytes; validates every
    /// tensor's data range lies within `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        Parser { r: Reader::new(bytes) }.parse()
    }

    /// The metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        if let Some((k, v)) = self.kv_index.get(key).and_then(|&i| self.metadata.get(i)) {
            if k == key {
                return Some(v);
            }
        }
        // The public fields were edited after parsing: fall back to a scan.
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `key` as a non-negative integer of any width.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// `key` as an integer of any width that fits `i64`.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// `key` as a float (any float or integer type).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// `key` as a bool.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// `key` as an array.
    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        self.get(key)?.as_array()
    }

    /// Removes metadata `key` and returns its value: a caller that has built what it needs from a
    /// large array (the tokenizer from its vocabulary and merges) gives the parsed copy back.
    pub fn take_metadata(&mut self, key: &str) -> Option<MetaValue> {
        let i = self.metadata.iter().position(|(k, _)| k == key)?;
        let (_, value) = self.metadata.remove(i);
        self.kv_index = self.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        Some(value)
    }

    /// `general.architecture`, e.g. `"llama"`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        if let Some(t) = self.tensor_index.get(name).and_then(|&i| self.tensors.get(i)) {
            if t.name == name {
                return Some(t);
            }
        }
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Absolute byte range of `t`'s data, or `None` if it overflows `usize`.
    pub fn tensor_range(&self, t: &TensorInfo) -> Option<Range<usize>> {
        let start = self.data_offset.checked_add(t.offset)?;
        let end = start.checked_add(t.n_bytes)?;
        Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    /// The tensor's bytes within `file_bytes`, or `None` if the range does not fit (only
    /// possible when `file_bytes` or `t` are not the ones that were parsed).
    pub fn try_tensor_data<'a>(&self, file_bytes: &'a [u8], t: &TensorInfo) -> Option<&'a [u8]> {
        file_bytes.get(self.tensor_range(t)?)
    }

    /// The tensor's bytes within the file bytes (ranges were validated by parse).
    ///
    /// # Panics
    /// If `file_bytes` is shorter than the bytes that were parsed, or `t` was altered so its
    /// range lies outside them. Use [`Gguf::try_tensor_data`] to get `None` instead.
    pub fn tensor_data<'a>(&self, file_bytes: &'a [u8], t: &TensorInfo) -> &'a [u8] {
        match self.try_tensor_data(file_bytes, t) {
            Some(data) => data,
            None => panic!(
                "tensor '{}' data (offset {} + {}, {} bytes) is outside the {} bytes passed to \
                 tensor_data; pass the same bytes that were parsed",
                show(&t.name),
                self.data_offset,
                t.offset,
                t.n_bytes,
                file_bytes.len()
            ),
        }
    }
}

struct Parser<'a> {
    r: Reader<'a>,
}

impl Parser<'_> {
    fn parse(mut self) -> Result<Gguf, GgufError> {
        let magic = self.r.take(4, &|| "the magic bytes".into())?;
        if magic != GGUF_MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(magic);
            return Err(GgufError::BadMagic { found });
        }
        let version = self.r.u32(&|| "the version".into())?;
        match version {
            2 | 3 => {}
            v if v > 0xFFFF && (1..=3).contains(&v.swap_bytes()) => return Err(GgufError::BigEndian { raw: v }),
            v => return Err(GgufError::UnsupportedVersion { version: v }),
        }
        let n_tensors = self.r.u64(&|| "the tensor count".into())?;
        let n_kv = self.r.u64(&|| "the metadata entry count".into())?;
        self.check_count("the header", "metadata entries", n_kv, MIN_KV_BYTES)?;

        let (metadata, kv_index) = self.metadata(n_kv)?;
        let alignment = alignment(&metadata, &kv_index)?;
        let (tensors, tensor_index) = self.tensor_infos(n_tensors, alignment)?;

        let data_offset = self
            .r
            .pos()
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| GgufError::BadAlignment { value: alignment.to_string(), type_name: "u64" })?;
        let file_size = self.r.len();
        for t in &tensors {
            let start = u128::from(data_offset) + u128::from(t.offset);
            let end = start + u128::from(t.n_bytes);
            if end > u128::from(file_size) {
                return Err(GgufError::TensorOutOfBounds { tensor: t.name.clone(), start, end, file_size });
            }
        }
        Ok(Gguf { version, alignment, data_offset, metadata, tensors, file_size, kv_index, tensor_index })
    }

    /// Fails if `count` items of at least `min_bytes` each cannot fit in the remaining bytes.
    fn check_count(&self, what: &str, unit: &'static str, count: u64, min_bytes: u64) -> Result<(), GgufError> {
        let remaining = self.r.remaining();
        if count > remaining / min_bytes.max(1) {
            return Err(GgufError::CountTooLarge { what: what.to_owned(), unit, count, remaining, min_bytes });
        }
        Ok(())
    }

    /// Capacity to reserve for `count` items already checked against the remaining bytes.
    fn capacity(&self, count: u64, min_bytes: u64) -> usize {
        let bound = self.r.remaining() / min_bytes.max(1);
        usize::try_from(count.min(bound)).unwrap_or(0)
    }

    #[allow(clippy::type_complexity)]
    fn metadata(&mut self, n_kv: u64) -> Result<(Vec<(String, MetaValue)>, HashMap<String, usize>), GgufError> {
        let cap = self.capacity(n_kv, MIN_KV_BYTES);
        let mut metadata = Vec::with_capacity(cap);
        let mut index = HashMap::with_capacity(cap);
        for i in 0..n_kv {
            let key = self.r.string(&|| format!("the key of metadata entry #{i}"))?;
            if index.contains_key(&key) {
                return Err(GgufError::DuplicateKey { key });
            }
            let type_offset = self.r.pos();
            let ty = self.r.u32(&|| format!("the value type of metadata key '{}'", show(&key)))?;
            if min_value_bytes(ty).is_none() {
                return Err(GgufError::UnknownValueType { key, type_id: ty, offset: type_offset });
            }
            let value = self.value(ty, &key, 1)?;
            index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }
        Ok((metadata, index))
    }

    /// Reads one value of the already validated type `ty`. `level` is the array nesting level
    /// an array read here would have (1 for a top-level value).
    fn value(&mut self, ty: u32, key: &str, level: usize) -> Result<MetaValue, GgufError> {
        let what = || {
            if level == 1 {
                format!("the value of metadata key '{}'", show(key))
            } else {
                format!("an element of metadata array '{}'", show(key))
            }
        };
        let r = &mut self.r;
        Ok(match ty {
            T_U8 => MetaValue::U8(r.u8(&what)?),
            T_I8 => MetaValue::I8(r.u8(&what)? as i8),
            T_U16 => MetaValue::U16(r.u16(&what)?),
            T_I16 => MetaValue::I16(r.u16(&what)? as i16),
            T_U32 => MetaValue::U32(r.u32(&what)?),
            T_I32 => MetaValue::I32(r.u32(&what)? as i32),
            T_F32 => MetaValue::F32(f32::from_bits(r.u32(&what)?)),
            T_U64 => MetaValue::U64(r.u64(&what)?),
            T_I64 => MetaValue::I64(r.u64(&what)? as i64),
            T_F64 => MetaValue::F64(f64::from_bits(r.u64(&what)?)),
            T_BOOL => {
                let offset = r.pos();
                match r.u8(&what)? {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    value => return Err(GgufError::InvalidBool { key: key.to_owned(), value, offset }),
                }
            }
            T_STRING => MetaValue::String(r.string(&what)?),
            T_ARRAY => self.array(key, level)?,
            type_id => return Err(GgufError::UnknownValueType { key: key.to_owned(), type_id, offset: self.r.pos() }),
        })
    }

    fn array(&mut self, key: &str, level: usize) -> Result<MetaValue, GgufError> {
        let elem_offset = self.r.pos();
        let elem_ty = self.r.u32(&|| format!("the element type of metadata array '{}'", show(key)))?;
        let Some(min_bytes) = min_value_bytes(elem_ty) else {
            return Err(GgufError::UnknownValueType { key: key.to_owned(), type_id: elem_ty, offset: elem_offset });
        };
        if elem_ty == T_ARRAY && level >= MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep { key: key.to_owned(), limit: MAX_ARRAY_DEPTH });
        }
        let count = self.r.u64(&|| format!("the element count of metadata array '{}'", show(key)))?;
        let remaining = self.r.remaining();
        if count > remaining / min_bytes {
            return Err(GgufError::CountTooLarge {
                what: format!("metadata array '{}'", show(key)),
                unit: "elements",
                count,
                remaining,
                min_bytes,
            });
        }
        let what = || format!("an element of metadata array '{}'", show(key));
        let array = match elem_ty {
            // Packed forms (see `MetaArray`); an empty array stays `Values`, as `From` makes it.
            _ if count == 0 => MetaArray::Values(Vec::new()),
            T_STRING => {
                let mut s = StrArray::default();
                for _ in 0..count {
                    let item = self.r.str(&what)?;
                    if s.text_len() + item.len() > StrArray::MAX_TEXT {
                        return Err(GgufError::ArrayTooLarge { key: key.to_string() });
                    }
                    s.push(item);
                }
                s.shrink_to_fit();
                MetaArray::Strings(s)
            }
            T_I32 => {
                let mut v = Vec::with_capacity(self.capacity(count, min_bytes));
                for _ in 0..count {
                    v.push(self.r.u32(&what)? as i32);
                }
                MetaArray::I32(v)
            }
            T_F32 => {
                let mut v = Vec::with_capacity(self.capacity(count, min_bytes));
                for _ in 0..count {
                    v.push(f32::from_bits(self.r.u32(&what)?));
                }
                MetaArray::F32(v)
            }
            _ => {
                let mut items = Vec::with_capacity(self.capacity(count, min_bytes));
                for _ in 0..count {
                    items.push(self.value(elem_ty, key, level + 1)?);
                }
                MetaArray::Values(items)
            }
        };
        Ok(MetaValue::Array(array))
    }

    fn tensor_infos(
        &mut self,
        n_tensors: u64,
        alignment: u64,
    ) -> Result<(Vec<TensorInfo>, HashMap<String, usize>), GgufError> {
        self.check_count("the header", "tensors", n_tensors, MIN_TENSOR_INFO_BYTES)?;
        let cap = self.capacity(n_tensors, MIN_TENSOR_INFO_BYTES);
        let mut tensors = Vec::with_capacity(cap);
        let mut index = HashMap::with_capacity(cap);
        for i in 0..n_tensors {
            let name = self.r.string(&|| format!("the name of tensor #{i}"))?;
            if index.contains_key(&name) {
                return Err(GgufError::DuplicateTensor { name });
            }
            let n_dims = self.r.u32(&|| format!("n_dims of tensor '{}'", show(&name)))?;
            if !(1..=MAX_DIMS).contains(&n_dims) {
                return Err(GgufError::BadDimCount { tensor: name, n_dims });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(self.r.u64(&|| format!("dimension {d} of tensor '{}'", show(&name)))?);
            }
            let type_id = self.r.u32(&|| format!("the ggml type of tensor '{}'", show(&name)))?;
            let offset = self.r.u64(&|| format!("the data offset of tensor '{}'", show(&name)))?;
            let Some(ty) = GgmlType::from_id(type_id) else {
                return Err(GgufError::UnknownTensorType { tensor: name, type_id });
            };
            // ggml stores dims and element counts as i64, so stay within 63 bits.
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| i64::try_from(n).is_ok() && dims.iter().all(|&d| d <= i64::MAX as u64));
            let Some(n_elements) = n_elements else {
                return Err(GgufError::DimsOverflow { tensor: name, dims });
            };
            let block_size = ty.block_size();
            if !dims[0].is_multiple_of(block_size as u64) {
                return Err(GgufError::RowNotBlockAligned { tensor: name, ty, ne0: dims[0], block_size });
            }
            let Some(n_bytes) = ty.bytes_for(n_elements) else {
                return Err(GgufError::DimsOverflow { tensor: name, dims });
            };
            if !offset.is_multiple_of(alignment) {
                return Err(GgufError::UnalignedOffset { tensor: name, offset, alignment });
            }
            index.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo { name, dims, ty, offset, n_bytes });
        }
        // Each tensor's data ends before the next begins: an offset moved by a multiple of the
        // alignment stays aligned and within the file, but would read another tensor's bytes.
        let mut order: Vec<&TensorInfo> = tensors.iter().collect();
        order.sort_by_key(|t| t.offset);
        for w in order.windows(2) {
            let first_end = w[0].offset.saturating_add(w[0].n_bytes);
            if first_end > w[1].offset {
                return Err(GgufError::OverlappingTensors {
                    first: w[0].name.clone(),
                    second: w[1].name.clone(),
                    first_end,
                    second_start: w[1].offset,
                });
            }
        }
        Ok((tensors, index))
    }
}

/// Reads and validates `general.alignment` (default [`DEFAULT_ALIGNMENT`]).
fn alignment(metadata: &[(String, MetaValue)], index: &HashMap<String, usize>) -> Result<u64, GgufError> {
    let Some((_, value)) = index.get("general.alignment").and_then(|&i| metadata.get(i)) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(a) if a.is_power_of_two() && a <= u64::from(u32::MAX) => Ok(a),
        _ => Err(GgufError::BadAlignment { value: value.to_string(), type_name: value.type_name() }),
    }
}
