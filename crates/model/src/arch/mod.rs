//! One place per architecture: what differs between the architectures sift runs is described
//! here, one file each ([`llama`], [`qwen2`]), and read by the config and the engine — adding an
//! architecture is a new file and its tests, not a new `if arch ==` in the engine.
//!
//! A description says how the model computes where architectures differ (today: how RoPE pairs
//! dimensions, whether q/k/v carry biases); [`crate::Config::from_gguf`] takes the shapes from
//! the file's `<arch>.*` keys and the rest from here.

pub mod llama;
pub mod qwen2;

/// Architectures sift can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (SmolLM2, TinyLlama, Llama 2/3, Mistral): no biases.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
}

impl Arch {
    /// The name in `general.architecture`.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The architecture's description.
    pub fn spec(self) -> &'static ArchSpec {
        match self {
            Arch::Llama => &llama::SPEC,
            Arch::Qwen2 => &qwen2::SPEC,
        }
    }
}

/// How RoPE pairs dimensions (llama.cpp's `LLAMA_ROPE_TYPE_NORM` vs `_NEOX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]) — GGUF llama files have q/k permuted for this.
    Interleaved,
    /// Halves (x[i], x[i + d/2]).
    Neox,
}

/// What an architecture computes where architectures differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchSpec {
    pub arch: Arch,
    /// `general.architecture`, and the prefix of its `<arch>.*` keys.
    pub name: &'static str,
    pub rope: RopeStyle,
    /// Whether q, k and v carry biases (`blk.N.attn_{q,k,v}.bias`; read when present either way).
    pub qkv_bias: bool,
}

/// Every architecture sift runs.
pub const ALL: [&ArchSpec; 2] = [&llama::SPEC, &qwen2::SPEC];

/// The description of the architecture named `name` (`general.architecture`), if sift runs it.
pub fn find(name: &str) -> Option<&'static ArchSpec> {
    ALL.into_iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_architecture_is_found_by_its_name() {
        for s in ALL {
            assert_eq!(find(s.name), Some(s));
            assert_eq!(s.arch.spec(), s);
            assert_eq!(s.arch.name(), s.name);
        }
        assert_eq!(find("gemma3"), None);
    }
}
