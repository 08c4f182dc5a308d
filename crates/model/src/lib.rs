//! What a model is, read from a GGUF file: its architecture config, its weight tensors, its
//! tokenizer and its chat template.
//!
//! - [`config`]: hyper-parameters from metadata (`llama`, `qwen2`), validated.
//! - [`weights`]: the tensors of every layer, checked against the config, viewed in place (mmap).
//! - [`tokenizer`]: BPE / SentencePiece tokenizer built from `tokenizer.ggml.*` metadata.
//! - [`chat`]: `tokenizer.chat_template` rendered with minijinja.
//! - [`layout`]: the column / neuron-bundle layouts a sift pack adds (input-channel sparsity).

#![forbid(unsafe_code)]

pub mod arch;
pub mod chat;
pub mod config;
pub mod layout;
pub mod tokenizer;
pub mod weights;

pub use config::{Arch, Config, RopeStyle};
pub use weights::{LayerWeights, Model, QTensor};

/// Errors raised while turning a GGUF file into a runnable model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] sift_gguf::GgufError),
    #[error(
        "unsupported architecture '{0}': sift runs llama (SmolLM2, TinyLlama, Llama 2/3, Mistral) and qwen2 models"
    )]
    UnsupportedArch(String),
    #[error("model metadata is missing '{0}'; the GGUF file is incomplete or not a language model")]
    MissingKey(String),
    #[error("model metadata '{key}' is invalid: {why}")]
    BadKey { key: String, why: String },
    #[error("tensor '{0}' is missing from the model file")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    BadShape { name: String, found: Vec<u64>, expected: Vec<u64> },
    #[error("tensor '{name}' uses quant type {ty}, which sift does not support yet (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K); re-quantize the model with llama-quantize to one of these")]
    UnsupportedQuant { name: String, ty: &'static str },
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
}
