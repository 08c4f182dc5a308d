//! Metadata values stored in a GGUF file's key/value section, with lenient typed accessors.

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
    Array(Vec<MetaValue>),
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
    pub fn as_array(&self) -> Option<&[MetaValue]> {
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
        let Some(first) = items.first() else {
            return "array";
        };
        match first {
            MetaValue::Array(inner) => match inner.first() {
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
