//! Architecture hyper-parameters from GGUF metadata (`<arch>.block_count`, ... ).

use crate::ModelError;
use sift_gguf::Gguf;

pub use crate::arch::{Arch, RopeStyle};

/// Everything the forward pass needs to know about the model's shape.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
}

impl Config {
    /// Reads and validates the config of a GGUF model.
    pub fn from_gguf(g: &Gguf) -> Result<Config, ModelError> {
        let arch_name = g.architecture().ok_or_else(|| ModelError::MissingKey("general.architecture".into()))?;
        // What differs between architectures is described in their own files (`crate::arch`).
        let spec = crate::arch::find(arch_name).ok_or_else(|| ModelError::UnsupportedArch(arch_name.to_string()))?;
        let arch = spec.arch;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            let k = key(k);
            let v = g.get(&k).ok_or_else(|| ModelError::MissingKey(k.clone()))?;
            let v = v.as_u64().ok_or_else(|| ModelError::BadKey {
                key: k.clone(),
                why: format!("expected an integer, found {}", v.type_name()),
            })?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v <= 1 << 24)
                .ok_or(ModelError::BadKey { key: k, why: format!("value {v} out of range") })
        };
        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = match g.get(&key("attention.head_count_kv")) {
            Some(_) => req("attention.head_count_kv")?,
            None => n_head,
        };
        let n_ctx_train = req("context_length")?;
        if n_embd % n_head != 0 {
            return Err(ModelError::BadKey {
                key: key("attention.head_count"),
                why: format!("{n_head} heads do not divide embedding length {n_embd}"),
            });
        }
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadKey {
                key: key("attention.head_count_kv"),
                why: format!("{n_head_kv} kv heads do not divide {n_head} heads"),
            });
        }
        let head_dim = match g.get(&key("attention.key_length")) {
            Some(_) => req("attention.key_length")?,
            None => n_embd / n_head,
        };
        let rope_dim = match g.get(&key("rope.dimension_count")) {
            Some(_) => req("rope.dimension_count")?,
            None => head_dim,
        };
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::BadKey {
                key: key("rope.dimension_count"),
                why: format!("{rope_dim} is odd or larger than the head size {head_dim}"),
            });
        }
        let rms_eps = g.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5);
        let rope_base = g.get_f32(&key("rope.freq_base")).unwrap_or(10000.0);
        if !(rms_eps.is_finite() && rms_eps >= 0.0 && rope_base.is_finite() && rope_base > 0.0) {
            return Err(ModelError::BadKey {
                key: key("rope.freq_base"),
                why: "rms epsilon or rope base is not a positive finite number".into(),
            });
        }
        let n_vocab = g
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?;
        Ok(Config {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_dim,
            rope_style: spec.rope,
        })
    }

    /// RoPE's frequency step `freq_base^(-2/rope_dim)`, iterated as ggml does (`theta *= it`).
    pub fn rope_theta_scale(&self) -> f32 {
        self.rope_base.powf(-2.0 / self.rope_dim as f32)
    }

    /// Width of the k and v projections.
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the q projection.
    pub fn n_embd_q(&self) -> usize {
        self.n_head * self.head_dim
    }
}
