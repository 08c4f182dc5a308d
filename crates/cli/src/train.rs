//! `sift train`'s flags: `prefill` (FastForward's expert predictor, written beside the model where
//! sparse prefill finds it; `sift_train::predictor_training`) and `distill` (LoRA adapters that
//! recover what sparsity costs; `sift_train::distill_training`).

use clap::{Args, Subcommand};
use sift_train::distill_training::{lora_ops, DistillTraining};
use sift_train::predictor_training::PredictorTraining;
use std::path::PathBuf;

#[derive(Args)]
pub struct TrainArgs {
    #[command(subcommand)]
    pub what: TrainCommand,
}

#[derive(Subcommand)]
pub enum TrainCommand {
    /// FastForward's expert predictor for sparse prefill (--prefill-sparsity): per layer, which
    /// FFN neurons a 128-token block needs, learned from the model's own activations on TEXT
    Prefill(TrainPrefillArgs),
    /// Sparsity-aware self-distillation (ActiveFlow §5) into LoRA adapters (DIP §4): the model
    /// under a selector's masks learns the dense model's next-token distribution on TEXT; the
    /// adapters load with --lora (sift's and llama.cpp's)
    Distill(TrainDistillArgs),
}

#[derive(Args)]
pub struct TrainDistillArgs {
    /// Model file (.gguf; a pack's GGUF is used for a .sift)
    #[arg(short = 'm', long = "model", default_value = crate::args::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Training text (plain text; the repository's evaluation sets are not for training)
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// The selector the adapters are trained under (--sparsity, --ratio, --calib, ... as for
    /// generate); default topk
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    /// The adapters' rank
    #[arg(long = "rank", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub rank: u32,
    /// LoRA alpha: the adapters are scaled by alpha / rank (default: 2 × rank)
    #[arg(long = "lora-alpha", value_parser = sift_session::ranges::positive_weight_f32)]
    pub lora_alpha: Option<f32>,
    /// The ops adapted: ffn (gate, up, down: DIP's choice), attn (q, k, v, output), all, or a
    /// comma-separated list of q,k,v,o,gate,up,down
    #[arg(long = "lora-ops", default_value = "ffn")]
    pub lora_ops: String,
    /// Tokens per training window (each step: one window, the teacher's and the student's
    /// logits over all of it)
    #[arg(long = "seq", default_value_t = 256, value_parser = clap::value_parser!(u32).range(8..=8192))]
    pub seq: u32,
    /// Optimizer steps (AdamW, a cosine decay over them): 150 windows of 256 tokens recover as
    /// much as 300 did on the models measured (docs/sparsity.md)
    #[arg(long = "steps", default_value_t = 150, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub steps: u32,
    /// Windows per optimizer step: their gradients are averaged (a batch of N windows at the
    /// memory of one; each step costs N windows' time)
    #[arg(long = "accumulate", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub accumulate: u32,
    /// Weight of a layer-wise loss added to the KL: the distance between the student's and the
    /// dense model's residual streams after every layer (RMS-normalized; 0: the KL alone, about
    /// half the time a step)
    #[arg(long = "layer-loss", default_value_t = 4.0, value_parser = layer_loss_weight)]
    pub layer_loss: f32,
    /// Learning rate
    #[arg(long = "lr", default_value_t = 1e-3, value_parser = sift_session::ranges::learning_rate)]
    pub lr: f64,
    /// Random seed (windows drawn, initial weights)
    #[arg(long = "seed", default_value_t = 42)]
    pub seed: u64,
    /// The most tokens of TEXT read (the windows are drawn from them)
    #[arg(long = "tokens", default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(16..=100_000_000))]
    pub tokens: u32,
    /// Output file, a GGUF LoRA (default: MODEL-METHOD-RATIO.lora.gguf beside the model)
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Write the adapters every N steps (a checkpoint `--resume` continues from; 0: at the end)
    #[arg(long = "checkpoint-every", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub checkpoint_every: u32,
    /// Continue from the adapters at the output path (the optimizer's moments start again)
    #[arg(long = "resume")]
    pub resume: bool,
    /// Threads to compute with (default: all cores)
    #[arg(short = 't', long = "threads", value_parser = crate::args::threads_in_range)]
    pub threads: Option<usize>,
    /// Replace the output file if it exists
    #[arg(long = "force")]
    pub force: bool,
    /// Do not write the fused model (by default the adapters are also fused into the weights
    /// and written as OUT without `.lora`: a GGUF that decodes as fast as the original, which
    /// sift and llama.cpp load like any model)
    #[arg(long = "no-fuse")]
    pub no_fuse: bool,
    /// How the fused model's rows are quantized again (see `sift export-lora`; default: gptq, or
    /// grid with --qat); the GPTQ kinds calibrate on 16 windows of the training text, under the
    /// selector, adapters on
    #[arg(long = "rounding", value_enum)]
    pub rounding: Option<crate::export_lora::RoundingFlag>,
    /// Quantization-aware (the default, unless --no-fuse): train the adapted ops as `W + s·B·A`
    /// rounded onto the weights' own grid (straight through), so that the fused model
    /// (`--rounding grid`, the default then) computes what was trained, the correction kept
    /// through the rounding; the adapters are then for fusing, not for --lora
    #[arg(long = "qat", overrides_with = "no_qat")]
    pub qat: bool,
    /// Plain adapters, computed beside the weights (--lora) or fused with GPTQ's rounding
    /// (the default with --no-fuse)
    #[arg(long = "no-qat", overrides_with = "qat")]
    pub no_qat: bool,
}

#[derive(Args)]
pub struct TrainPrefillArgs {
    /// Model file (.gguf or .sift)
    #[arg(short = 'm', long = "model", default_value = crate::args::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Training text (plain text; the repository's evaluation sets are not for training)
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// 128-token blocks of text to learn from (each sequence's first block is run, not kept)
    #[arg(long = "blocks", default_value_t = 96, value_parser = sift_session::ranges::count_in::<1, 65536>)]
    pub blocks: usize,
    /// Blocks per sequence through the model (the context the activations see)
    #[arg(long = "seq-blocks", default_value_t = 8, value_parser = sift_session::ranges::count_in::<1, 1024>)]
    pub seq_blocks: usize,
    /// Optimizer steps (AdamW)
    #[arg(long = "steps", default_value_t = 300, value_parser = sift_session::ranges::count_in::<1, 10_000_000>)]
    pub steps: usize,
    /// Blocks per step
    #[arg(long = "batch", default_value_t = 16, value_parser = sift_session::ranges::count_in::<1, 4096>)]
    pub batch: usize,
    /// Learning rate
    #[arg(long = "lr", default_value_t = 2e-3, value_parser = sift_session::ranges::learning_rate)]
    pub lr: f64,
    /// Sparsity the predictor is trained for: the top (1 − R) neurons of each block are its
    /// positives (use the --prefill-sparsity you will run with)
    #[arg(long = "ratio", default_value_t = 0.5, value_parser = sift_session::ranges::skip_ratio_f32)]
    pub ratio: f32,
    /// Random seed (blocks drawn, initial weights): the same seed and inputs give the same file
    #[arg(long = "seed", default_value_t = 42)]
    pub seed: u64,
    /// Output file (default: MODEL.prefill beside the model, where sparse prefill looks)
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Write the predictor every N steps (a checkpoint `--resume` continues from; 0: at the end only)
    #[arg(long = "checkpoint-every", default_value_t = 100, value_parser = sift_session::ranges::count_in::<0, 10_000_000>)]
    pub checkpoint_every: usize,
    /// Continue from the predictor already at the output path (its weights; the optimizer's
    /// moments start again)
    #[arg(long = "resume")]
    pub resume: bool,
    /// Threads to compute with (default: all cores)
    #[arg(short = 't', long = "threads", value_parser = crate::args::threads_in_range)]
    pub threads: Option<usize>,
    /// Steps of the error compensator's training after the predictor's (0: no compensator);
    /// the first third on the oracle's masks, the rest on the predictor's
    #[arg(long = "compensator-steps", default_value_t = 300, value_parser = sift_session::ranges::count_in::<0, 1_048_576>)]
    pub compensator_steps: usize,
    /// Blocks (128 tokens each) per compensator step
    #[arg(long = "compensator-batch", default_value_t = 4, value_parser = sift_session::ranges::count_in::<1, 4096>)]
    pub compensator_batch: usize,
    /// The compensator's learning rate
    #[arg(long = "compensator-lr", default_value_t = 1e-3, value_parser = sift_session::ranges::learning_rate)]
    pub compensator_lr: f64,
    /// Replace the output file if it exists (without it, an existing file is an error)
    #[arg(long = "force")]
    pub force: bool,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    match a.what {
        TrainCommand::Prefill(a) => prefill(a),
        TrainCommand::Distill(a) => distill(a),
    }
}

fn threads(t: Option<usize>) -> usize {
    t.unwrap_or_else(sift_engine::default_threads).max(1)
}

fn prefill(a: TrainPrefillArgs) -> anyhow::Result<()> {
    anyhow::ensure!((0.0..1.0).contains(&a.ratio) && a.ratio > 0.0, "--ratio must be in (0, 1), got {}", a.ratio);
    PredictorTraining {
        model: a.model,
        file: a.file,
        blocks: a.blocks,
        seq_blocks: a.seq_blocks,
        steps: a.steps,
        batch: a.batch,
        lr: a.lr,
        ratio: a.ratio,
        seed: a.seed,
        output: a.output,
        checkpoint_every: a.checkpoint_every,
        resume: a.resume,
        threads: threads(a.threads),
        compensator_steps: a.compensator_steps,
        compensator_batch: a.compensator_batch,
        compensator_lr: a.compensator_lr,
        force: a.force,
    }
    .run()
}

fn layer_loss_weight(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() && (0.0..=1000.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("--layer-loss must be in [0, 1000], got {s}"))
    }
}

fn distill(a: TrainDistillArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.lr.is_finite() && a.lr > 0.0 && a.lr < 1.0, "--lr must be in (0, 1), got {}", a.lr);
    let ops = lora_ops(&a.lora_ops)?;
    let alpha = a.lora_alpha.unwrap_or(2.0 * a.rank as f32);
    anyhow::ensure!(
        alpha.is_finite() && alpha > 0.0 && alpha <= 1e4,
        "--lora-alpha must be in (0, 10000], got {alpha}"
    );
    DistillTraining {
        model: a.model,
        file: a.file,
        sparsity: a.sparsity,
        rank: a.rank as usize,
        alpha,
        ops,
        ops_label: a.lora_ops,
        seq: a.seq as usize,
        steps: a.steps as usize,
        accumulate: a.accumulate as usize,
        layer_loss: a.layer_loss,
        lr: a.lr,
        seed: a.seed,
        tokens: a.tokens as usize,
        output: a.output,
        checkpoint_every: a.checkpoint_every as usize,
        resume: a.resume,
        threads: threads(a.threads),
        force: a.force,
        fuse: !a.no_fuse,
        rounding: a.rounding.map(Into::into),
        // Quantization-aware unless asked not to, or unless only the adapters are wanted (for
        // --lora, where they are computed beside the unrounded weights).
        qat: a.qat || !(a.no_qat || a.no_fuse),
    }
    .run()
}
