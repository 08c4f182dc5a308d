//! Where weights live: sift's pack file ([`pack`]), which holds, for every sparsifiable linear op
//! of a GGUF model, the layout activation sparsity reads (the GGUF's own values as contiguous
//! columns, optionally cross-layer interleaved groups) and refers to the GGUF itself
//! ([`source`]); the slow tier that reads both from disk ([`io`]); and the fast tier that caches
//! columns in memory ([`tiered`], whose per-op bookkeeping is the `sift-cache` crate,
//! re-exported as [`cache`]).

pub use sift_cache as cache;

pub mod io;
pub mod pack;
pub mod prefetch;
pub mod simulated;
pub mod source;
pub mod tiered;

pub use pack::{
    open_model, open_partial, pack_model, read_toc, ColPolicy, PackError, PackOptions, PackToc, UnitOrders,
    PACK_VERSION,
};
pub use sift_model::layout::{ColumnTensor, LayerColumns, OpKind, PackIndex};
pub use source::{SourceError, SourceGguf};
