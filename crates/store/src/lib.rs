//! Where weights live. For now: sift's pack file ([`pack`]), which holds a GGUF model unchanged
//! plus, for every sparsifiable linear op, the layouts activation sparsity reads: columns (input
//! channels) stored contiguously, and FFN neuron bundles (gate row + up row + down column).
//! The tiered store (flash ↔ DRAM caches, prefetching) builds on these units.

pub mod pack;

pub use pack::{open_model, pack_model, ColPolicy, PackError, PackOptions, PACK_VERSION};
pub use sift_model::layout::{BundleTensor, ColumnTensor, LayerColumns, OpKind, PackIndex};
