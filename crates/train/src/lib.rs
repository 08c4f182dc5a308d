//! Training in sift, on the CPU (issue 18; recovery training, issue 19, builds on it): the data
//! collected from the model itself through the engine, models and losses on candle
//! (`candle-core` / `candle-nn`: reverse-mode autograd and AdamW in pure Rust), and the result
//! written as a side file the engine loads beside the model.
//!
//! - [`collect`]: runs training text through the dense model in 128-token blocks and keeps, per
//!   layer and block, the FFN's input and each neuron's activation norm (GRIFFIN's labels).
//! - [`prefill`]: FastForward's expert predictor, trained with the paper's weighted BCE, saved
//!   as `sift_engine::predictor::ExpertPredictors`.
//! - [`distill`]: sparsity-aware self-distillation into LoRA adapters (ActiveFlow §5, DIP §4):
//!   the model in candle under a selector's masks, KL to the dense engine's logits.
//! - [`compensate`]: FastForward's error compensator, trained by layerwise distillation on the
//!   model's own errors under the oracle's and the predictor's masks, saved in the same file.
//! - [`fuse`]: GPTQ's error feedback when adapters are fused into quantized weights.
//!
//! The commands' pipelines, from plain option structs (the CLI maps its flags onto them):
//! [`predictor_training`] (`sift train prefill`), [`distill_training`] (`sift train distill`) and
//! [`lora_export`] (`sift export-lora`).

#![forbid(unsafe_code)]

pub mod collect;
pub mod compensate;
pub mod distill;
pub mod distill_training;
pub mod fuse;
pub mod lora_export;
pub mod predictor_training;
pub mod prefill;
pub mod schedule;
