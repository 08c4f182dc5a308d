//! `qwen2`: Qwen2 and Qwen2.5 as llama.cpp runs them: the `llama` block with biases on q, k and
//! v, and RoPE on the two halves of each head (NEOX).

use super::{Arch, ArchSpec, RopeStyle};

pub const SPEC: ArchSpec = ArchSpec { arch: Arch::Qwen2, name: "qwen2", rope: RopeStyle::Neox, qkv_bias: true };
