//! `sift-gguf`: a bounds-checked reader for GGUF v2/v3 model files.
//!
//! GGUF is llama.cpp's single-file model format: a little-endian header, typed key/value
//! metadata, a table of tensor infos, then aligned tensor data. This crate treats the file as
//! untrusted input: it never panics on malformed bytes, never allocates based on an unchecked
//! count, and checks that every tensor's data lies inside the file. Errors say what is wrong
//! and what to do about it.
//!
//! ```no_run
//! let file = sift_gguf::GgufFile::open("model.gguf")?;
//! println!("{:?}", file.gguf.architecture());
//! let emb = file.tensor_bytes("token_embd.weight");
//! # Ok::<(), sift_gguf::GgufError>(())
//! ```

mod error;
mod file;
mod ftype;
mod gguf;
mod reader;
mod types;
mod value;
pub mod write;

pub use error::GgufError;
pub use file::{GgufFile, MappedFile};
pub use ftype::{file_type_name, FILE_TYPE_KEY};
pub use gguf::{Gguf, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use types::GgmlType;
pub use value::{MetaArray, MetaValue, StrArray};
pub use write::{GgufWriter, WriteValue};
