//! `llama`: the Llama family as llama.cpp runs it (SmolLM2, TinyLlama, Llama 2 and 3 without
//! rope scaling, Mistral): pre-norm blocks (RMS norm before attention and before the FFN),
//! grouped-query attention with RoPE on adjacent pairs (the GGUF's q and k rows are permuted for
//! it), a SwiGLU FFN, no biases, a tied or separate output head.

use super::{Arch, ArchSpec, RopeStyle};

pub const SPEC: ArchSpec = ArchSpec { arch: Arch::Llama, name: "llama", rope: RopeStyle::Interleaved, qkv_bias: false };
