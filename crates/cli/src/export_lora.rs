//! `sift export-lora`: LoRA adapters fused into the model's weights and written as a new GGUF
//! (llama.cpp's `llama-export-lora`): each adapted tensor re-quantized to its own type, the rest
//! of the file byte for byte.

use anyhow::Context;
use clap::Args;
use sift_engine::lora::{fuse, LoraAdapters};
use std::path::PathBuf;

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
    /// The fused model to write (.gguf)
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Replace the output file if it exists
    #[arg(long = "force")]
    pub force: bool,
}

pub fn run(a: ExportLoraArgs) -> anyhow::Result<()> {
    sift_output::check_new(&a.output, a.force)?;
    let model = sift_store::open_model(&a.model).with_context(|| format!("cannot open '{}'", a.model.display()))?;
    anyhow::ensure!(
        model.columns.is_none(),
        "'{}' is a pack: pass the GGUF it was built from (the fused GGUF can be packed again)",
        a.model.display()
    );
    let mut lora = LoraAdapters::load(&a.lora, &model)?;
    lora.user_scale = a.scale;
    let t0 = std::time::Instant::now();
    let bytes = fuse(&model, &lora).map_err(|e| anyhow::anyhow!("{}: {e}", a.model.display()))?;
    sift_output::write(&a.output, &[a.model.as_path(), a.lora.as_path()], &bytes)?;
    eprintln!(
        "sift: {} adapted tensors of '{}' fused and re-quantized in {:.1} s; wrote '{}'",
        lora.layers.iter().flatten().flatten().count(),
        a.model.display(),
        t0.elapsed().as_secs_f64(),
        a.output.display()
    );
    Ok(())
}
