//! Where weights live: sift's pack file ([`pack`]), which holds a GGUF model unchanged plus, for
//! every sparsifiable linear op, the layouts activation sparsity reads (columns stored
//! contiguously, FFN neuron bundles, cross-layer interleaved groups); the slow tier that reads
//! them from disk ([`io`]); and the fast tier that caches them in memory ([`tiered`], whose
//! per-op bookkeeping is the `sift-cache` crate, re-exported as [`cache`]).

pub use sift_cache as cache;

pub mod io;
pub mod pack;
pub mod prefetch;
pub mod simulated;
pub mod tiered;

pub use pack::{
    open_model, open_partial, pack_model, read_toc, ColPolicy, PackError, PackOptions, PackToc, PACK_VERSION,
};
pub use sift_model::layout::{BundleTensor, ColumnTensor, LayerColumns, OpKind, PackIndex};
