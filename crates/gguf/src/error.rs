//! The error type for opening and parsing GGUF files.
//!
//! Every message says what is wrong, where, and what the user can do about it. Names and keys
//! read from the file are escaped and shortened before they are shown, since the file is
//! untrusted.

use std::path::PathBuf;

use crate::GgmlType;

/// Why a GGUF file could not be opened or parsed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The caller of [`crate::GgufFile::from_parts`] refused to load the resident tensors.
    #[error("{0}")]
    Refused(String),
    /// The file could not be opened, inspected or mapped.
    #[error("cannot read GGUF file '{}': {source}; check that the path exists and is a readable file", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is '{}' (expected 'GGUF'); {}", escape_bytes(.found), magic_hint(.found))]
    BadMagic { found: [u8; 4] },

    /// A little-endian version this crate does not read.
    #[error("unsupported GGUF version {version} (sift reads versions 2 and 3); {}", version_hint(*.version))]
    UnsupportedVersion { version: u32 },

    /// The version field looks byte-swapped: the file was written big-endian.
    #[error("big-endian GGUF file (version field reads {raw:#010x}, i.e. version {} byte-swapped); sift reads only little-endian GGUF files; convert the model to a little-endian GGUF", .raw.swap_bytes())]
    BigEndian { raw: u32 },

    /// The file ends before a field that the header says is there.
    #[error("truncated GGUF file: needed {needed} bytes at offset {offset} to read {what}, file is {file_size} bytes; the download may be incomplete")]
    Truncated { what: String, needed: u64, offset: u64, file_size: u64 },

    /// A count (entries, tensors, array elements) that cannot fit in the rest of the file.
    #[error("{what} claims {count} {unit} but only {remaining} bytes remain (each needs at least {min_bytes} bytes); {}", count_hint(*.count))]
    CountTooLarge { what: String, unit: &'static str, count: u64, remaining: u64, min_bytes: u64 },

    /// A key, string value or tensor name is not valid UTF-8.
    #[error("invalid UTF-8 in {what} at offset {offset}; the file is corrupt")]
    InvalidUtf8 { what: String, offset: u64 },

    /// A metadata value (or array element) type id outside 0..=12.
    #[error("metadata key '{}' has unknown value type {type_id} at offset {offset} (known types are 0 to 12); the file is corrupt or needs a newer sift", show(.key))]
    UnknownValueType { key: String, type_id: u32, offset: u64 },

    /// A bool byte that is neither 0 nor 1.
    #[error("metadata key '{}' has invalid bool byte {value} at offset {offset} (expected 0 or 1); the file is corrupt", show(.key))]
    InvalidBool { key: String, value: u8, offset: u64 },

    /// A string array with more text than one array holds.
    #[error("metadata array '{}' holds more than 4 GiB of strings; the file is corrupt", show(.key))]
    ArrayTooLarge { key: String },

    /// Arrays nested deeper than the limit.
    #[error("metadata key '{}' nests arrays deeper than {limit} levels; the file is corrupt", show(.key))]
    NestingTooDeep { key: String, limit: usize },

    /// The same metadata key appears twice.
    #[error("duplicate metadata key '{}'; the file is corrupt", show(.key))]
    DuplicateKey { key: String },

    /// `general.alignment` is not an integer, zero, not a power of two, or too large.
    #[error("bad general.alignment {value} (type {type_name}): it must be a nonzero power of two stored as u32; the file is corrupt")]
    BadAlignment { value: String, type_name: &'static str },

    /// A tensor with zero or more than four dimensions.
    #[error("tensor '{}' has n_dims = {n_dims}, out of range (must be 1 to 4); the file is corrupt", show(.tensor))]
    BadDimCount { tensor: String, n_dims: u32 },

    /// A tensor whose element count or byte size does not fit in 64 bits.
    #[error("tensor '{}' dims {dims:?} overflow: the element count or byte size does not fit in 63 bits; the file is corrupt", show(.tensor))]
    DimsOverflow { tensor: String, dims: Vec<u64> },

    /// A tensor type id this crate does not know.
    #[error("tensor '{}' has unknown ggml type id {type_id}; this file needs a newer sift", show(.tensor))]
    UnknownTensorType { tensor: String, type_id: u32 },

    /// `ne[0]` is not a whole number of blocks.
    #[error("tensor '{}' of type {ty} has row length ne[0] = {ne0}, not a multiple of the block size {block_size}; the file is corrupt", show(.tensor))]
    RowNotBlockAligned { tensor: String, ty: GgmlType, ne0: u64, block_size: usize },

    /// Two tensors share a name.
    #[error("duplicate tensor name '{}'; the file is corrupt", show(.name))]
    DuplicateTensor { name: String },

    /// A tensor data offset that is not a multiple of the alignment.
    #[error("tensor '{}' data offset {offset} is not a multiple of the alignment {alignment}; the file is corrupt", show(.tensor))]
    UnalignedOffset { tensor: String, offset: u64, alignment: u64 },

    /// Two tensors whose data overlap (ggml lays them out one after the other).
    #[error("tensors '{}' and '{}' overlap (data at {first_end} and {second_start}); the file is corrupt", show(.first), show(.second))]
    OverlappingTensors { first: String, second: String, first_end: u64, second_start: u64 },

    /// A tensor whose data extends past the end of the file.
    #[error("tensor '{}' data [{start}, {end}) lies past the end of the file (size {file_size}); the file is truncated or corrupt, the download may be incomplete", show(.tensor))]
    TensorOutOfBounds { tensor: String, start: u128, end: u128, file_size: u64 },
}

/// Longest name or key shown in a message, in characters.
const SHOW_MAX_CHARS: usize = 120;

/// Escapes control characters and shortens long names so messages stay one readable line.
pub(crate) fn show(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == SHOW_MAX_CHARS {
            out.push_str(&format!("... ({} bytes)", s.len()));
            break;
        }
        out.extend(c.escape_debug());
    }
    out
}

/// Shows magic bytes as text with non-printable bytes as `\xNN`.
fn escape_bytes(b: &[u8; 4]) -> String {
    b.iter()
        .map(|&c| if c.is_ascii_graphic() || c == b' ' { (c as char).to_string() } else { format!("\\x{c:02X}") })
        .collect()
}

/// Suggests what a file with these leading bytes probably is.
fn magic_hint(b: &[u8; 4]) -> &'static str {
    match b {
        b"lmgg" | b"fmgg" | b"tjgg" | b"algg" => {
            "this is a legacy GGML/GGJT model; re-convert it to GGUF with a current llama.cpp"
        }
        [b'P', b'K', 3, 4] => "this looks like a zip archive; extract the .gguf file from it first",
        [0x80, ..] => "this looks like a PyTorch pickle; convert it to GGUF with llama.cpp first",
        _ => "pass a .gguf model file",
    }
}

/// Counts this large never occur in real models, so the count itself is damaged; smaller
/// ones are as likely to come from a file cut short.
fn count_hint(count: u64) -> &'static str {
    if count > u64::from(u32::MAX) {
        "the file is corrupt"
    } else {
        "the file is truncated or corrupt; the download may be incomplete"
    }
}

fn version_hint(version: u32) -> &'static str {
    if version <= 1 {
        "GGUF v1 is obsolete; re-convert the model with a current llama.cpp"
    } else {
        "this file needs a newer sift"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_escapes_and_truncates() {
        assert_eq!(show("a\nb"), "a\\nb");
        let long = "x".repeat(500);
        let s = show(&long);
        assert!(s.len() < 200 && s.ends_with("(500 bytes)"), "{s}");
    }

    #[test]
    fn magic_is_escaped() {
        let e = GgufError::BadMagic { found: [b'P', b'K', 3, 4] };
        let m = e.to_string();
        assert!(m.contains("'PK\\x03\\x04'"), "{m}");
    }
}
