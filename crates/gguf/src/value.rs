//! Metadata values stored in a GGUF file's key/value section, with lenient typed accessors.
//!
//! Arrays ([`MetaArray`]) are stored by element type: a tokenizer's 150k token strings packed in
//! one buffer, its token types and scores in plain `i32`/`f32` vectors. One [`MetaValue`] per
//! element would cost Qwen2.5's vocabulary about 20 MiB of heap, held as long as the model.

use std::fmt;

/// One metadata value. Arrays parsed from a file are homogeneous (all elements share one type).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// Arrays with more elements than this are abbreviated by `Display`.
const DISPLAY_MAX_ITEMS: usize = 8;
/// How many leading elements an abbreviated array shows.
const DISPLAY_HEAD_ITEMS: usize = 3;

impl MetaValue {
    /// The value as `u64` if it is an integer of any width that is `>= 0`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as `i64` if it is an integer of any width that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as `f64` if it is a float or an integer (large integers are rounded).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as `f32` if it is `F32`, `F64` (rounded) or any integer (rounded).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            MetaValue::U64(v) => Some(v as f32),
            MetaValue::I64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    /// The value if it is a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value if it is a `String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements if the value is an `Array`.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Type name of a non-array value, e.g. `"u32"`, or `None` for arrays.
    fn scalar_type_name(&self) -> Option<&'static str> {
        Some(match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
            MetaValue::Array(_) => return None,
        })
    }

    /// Human type name: `"u32"`, `"string"`, `"array[string]"`, `"array[array[i32]]"`.
    ///
    /// The element type is taken from the first element; an empty array is `"array"`, and
    /// arrays nested more than two deep are `"array[array[array]]"`.
    pub fn type_name(&self) -> &'static str {
        let MetaValue::Array(items) = self else {
            return self.scalar_type_name().unwrap_or("array");
        };
        let Some(first) = items.get(0) else {
            return "array";
        };
        match first {
            MetaValue::Array(inner) => match inner.get(0) {
                None => "array[array]",
                Some(MetaValue::Array(_)) => "array[array[array]]",
                Some(v) => match v.scalar_type_name().unwrap_or("") {
                    "u8" => "array[array[u8]]",
                    "i8" => "array[array[i8]]",
                    "u16" => "array[array[u16]]",
                    "i16" => "array[array[i16]]",
                    "u32" => "array[array[u32]]",
                    "i32" => "array[array[i32]]",
                    "f32" => "array[array[f32]]",
                    "bool" => "array[array[bool]]",
                    "string" => "array[array[string]]",
                    "u64" => "array[array[u64]]",
                    "i64" => "array[array[i64]]",
                    "f64" => "array[array[f64]]",
                    _ => "array[array]",
                },
            },
            v => match v.scalar_type_name().unwrap_or("") {
                "u8" => "array[u8]",
                "i8" => "array[i8]",
                "u16" => "array[u16]",
                "i16" => "array[i16]",
                "u32" => "array[u32]",
                "i32" => "array[i32]",
                "f32" => "array[f32]",
                "bool" => "array[bool]",
                "string" => "array[string]",
                "u64" => "array[u64]",
                "i64" => "array[i64]",
                "f64" => "array[f64]",
                _ => "array",
            },
        }
    }
}

/// An array value, stored by element type. Build one from values with `MetaArray::from(vec)`
/// (which picks the packed form), read it with [`MetaArray::get`], [`MetaArray::iter`] or the
/// typed views [`MetaArray::strings`], [`MetaArray::i32s`], [`MetaArray::f32s`].
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// Strings packed in one buffer.
    Strings(StrArray),
    /// `i32` elements (token types).
    I32(Vec<i32>),
    /// `f32` elements (token scores).
    F32(Vec<f32>),
    /// Any other element type (and the empty array), one value per element.
    Values(Vec<MetaValue>),
}

impl MetaArray {
    pub fn len(&self) -> usize {
        match self {
            MetaArray::Strings(s) => s.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Values(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a value (a string element is copied).
    pub fn get(&self, i: usize) -> Option<MetaValue> {
        match self {
            MetaArray::Strings(s) => s.get(i).map(|x| MetaValue::String(x.to_owned())),
            MetaArray::I32(v) => v.get(i).map(|&x| MetaValue::I32(x)),
            MetaArray::F32(v) => v.get(i).map(|&x| MetaValue::F32(x)),
            MetaArray::Values(v) => v.get(i).cloned(),
        }
    }

    /// The elements as values, in order.
    pub fn iter(&self) -> impl Iterator<Item = MetaValue> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The elements if they are strings.
    pub fn strings(&self) -> Option<&StrArray> {
        match self {
            MetaArray::Strings(s) => Some(s),
            _ => None,
        }
    }

    /// The elements if they are `i32`.
    pub fn i32s(&self) -> Option<&[i32]> {
        match self {
            MetaArray::I32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements if they are `f32`.
    pub fn f32s(&self) -> Option<&[f32]> {
        match self {
            MetaArray::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl From<Vec<MetaValue>> for MetaArray {
    /// The packed form of `values` when they are all strings, all `i32` or all `f32` (and not
    /// empty); otherwise the values as they are.
    fn from(values: Vec<MetaValue>) -> MetaArray {
        let all = |f: fn(&MetaValue) -> bool| !values.is_empty() && values.iter().all(f);
        if all(|v| matches!(v, MetaValue::String(_))) {
            let mut s = StrArray::default();
            for v in &values {
                s.push(v.as_str().unwrap_or(""));
            }
            MetaArray::Strings(s)
        } else if all(|v| matches!(v, MetaValue::I32(_))) {
            MetaArray::I32(values.iter().map(|v| v.as_i64().unwrap_or(0) as i32).collect())
        } else if all(|v| matches!(v, MetaValue::F32(_))) {
            MetaArray::F32(values.iter().map(|v| v.as_f32().unwrap_or(0.0)).collect())
        } else {
            MetaArray::Values(values)
        }
    }
}

impl FromIterator<MetaValue> for MetaArray {
    fn from_iter<I: IntoIterator<Item = MetaValue>>(iter: I) -> MetaArray {
        MetaArray::from(iter.into_iter().collect::<Vec<_>>())
    }
}

/// Strings packed one after another in one buffer, with their end offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrArray {
    text: String,
    /// Byte offsets: the parser refuses an array past 4 GiB of text (`StrArray::MAX_TEXT`).
    ends: Vec<u32>,
}

impl StrArray {
    pub const fn new() -> StrArray {
        StrArray { text: String::new(), ends: Vec::new() }
    }

    /// Most bytes of text an array holds.
    pub const MAX_TEXT: usize = u32::MAX as usize;

    /// Appends `s`. Panics past [`StrArray::MAX_TEXT`] bytes in all (the GGUF parser checks first).
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        let end = u32::try_from(self.text.len()).expect("a StrArray holds at most 4 GiB of text");
        self.ends.push(end);
    }

    /// Bytes of text held.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text.get(start..end)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Gives back the buffers' growth room.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

/// Short human form: integers and bools plainly, floats with a decimal point, strings quoted
/// and escaped, arrays as `[a, b]` or, beyond 8 items, `[a, b, c, ... (N items)]`.
impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v:?}"),
            MetaValue::F64(v) => write!(f, "{v:?}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(s) => write!(f, "\"{}\"", s.escape_debug()),
            MetaValue::Array(items) => {
                let shown = if items.len() > DISPLAY_MAX_ITEMS { DISPLAY_HEAD_ITEMS } else { items.len() };
                f.write_str("[")?;
                for (i, item) in items.iter().take(shown).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                if shown < items.len() {
                    write!(f, ", ... ({} items)", items.len())?;
                }
                f.write_str("]")
            }
        }
    }
}
