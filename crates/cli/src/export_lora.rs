//! `sift export-lora`'s flags: LoRA adapters fused into the model's weights and written as a new
//! GGUF (llama.cpp's `llama-export-lora`; the pipeline is `sift_train::lora_export`).

use clap::Args;
use sift_train::lora_export::{FuseRounding, LoraExport};
use std::path::PathBuf;

/// `--rounding`: how a fused model's rows are quantized again (`sift export-lora`, `sift train
/// distill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RoundingFlag {
    /// New block scales for the fused values, each weight to its nearest level (as
    /// llama-export-lora)
    Fresh,
    /// Each tensor's own block scales kept, each weight to its nearest level (weights the
    /// adapters barely move keep their integers, and lose the correction)
    Grid,
    /// GPTQ's error feedback on fresh block scales: each weight's rounding error passed on to
    /// the row's next weights as the inputs' second moments on calibration text say (needs text)
    Gptq,
    /// GPTQ's error feedback on each tensor's own block scales (needs text)
    GptqGrid,
}

impl From<RoundingFlag> for FuseRounding {
    fn from(r: RoundingFlag) -> FuseRounding {
        match r {
            RoundingFlag::Fresh => FuseRounding::Fresh,
            RoundingFlag::Grid => FuseRounding::Grid,
            RoundingFlag::Gptq => FuseRounding::Gptq,
            RoundingFlag::GptqGrid => FuseRounding::GptqGrid,
        }
    }
}

#[derive(Args)]
pub struct ExportLoraArgs {
    /// The base model (.gguf)
    #[arg(short = 'm', long = "model", default_value = crate::args::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// The adapters (a GGUF LoRA: `sift train distill`'s, or llama.cpp's)
    #[arg(long = "lora", value_name = "FILE")]
    pub lora: PathBuf,
    /// Scale of the adapters (llama.cpp's --lora-scaled)
    #[arg(long = "scale", default_value_t = 1.0, value_parser = sift_session::ranges::weight_f32)]
    pub scale: f32,
    /// How fused rows are quantized again (default: gptq with -f, else grid for adapters trained
    /// quantization-aware, else fresh)
    #[arg(long = "rounding", value_enum)]
    pub rounding: Option<RoundingFlag>,
    /// Calibration text for --rounding gptq / gptq-grid: the inputs whose products the rounding
    /// keeps (plain text; not an evaluation set)
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Calibration tokens read from --file (in windows of 256)
    #[arg(long = "calib-tokens", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(256..=1_000_000))]
    pub calib_tokens: u32,
    /// The selection method the fused model will run under (its masked inputs are what GPTQ
    /// weighs), as for generate (default: dense)
    #[arg(long = "sparsity")]
    pub sparsity: Option<sift_engine::sparsity::Method>,
    /// Fraction of units skipped at each sparsified site, as for generate
    #[arg(long = "ratio", default_value_t = 0.5, value_parser = sift_session::ranges::skip_ratio)]
    pub ratio: f64,
    /// Calibration file from `sift calibrate` (threshold, core-sim), as for generate
    #[arg(long = "calib")]
    pub calib: Option<PathBuf>,
    /// Threads to compute with (default: all cores)
    #[arg(short = 't', long = "threads", value_parser = crate::args::threads_in_range)]
    pub threads: Option<usize>,
    /// The fused model to write (.gguf)
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Replace the output file if it exists
    #[arg(long = "force")]
    pub force: bool,
}

pub fn run(a: ExportLoraArgs) -> anyhow::Result<()> {
    LoraExport {
        model: a.model,
        lora: a.lora,
        scale: a.scale,
        rounding: a.rounding.map(Into::into),
        file: a.file,
        calib_tokens: a.calib_tokens as usize,
        sparsity: a.sparsity,
        ratio: a.ratio,
        calib: a.calib,
        threads: a.threads.unwrap_or_else(sift_engine::default_threads).max(1),
        output: a.output,
        force: a.force,
    }
    .run()
}
