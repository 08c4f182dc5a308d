//! `sift export-lora`: LoRA adapters fused into the model's weights and written as a new GGUF
//! (llama.cpp's `llama-export-lora`): each adapted tensor re-quantized to its own type, the rest
//! of the file byte for byte.

use anyhow::Context;
use clap::Args;
use sift_engine::lora::{fuse, LoraAdapters, Rounding};
use sift_engine::sparsity::Selector;
use sift_model::Model;
use sift_train::distill::{LoraVars, Student};
use sift_train::fuse::{fuse_with_feedback, InputMoments, Levels};
use std::path::PathBuf;

/// How a fused model's rows are quantized again (`sift export-lora`, `sift train distill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseRounding {
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

impl FuseRounding {
    /// Whether this rounding calibrates on text.
    pub fn needs_text(self) -> bool {
        matches!(self, FuseRounding::Gptq | FuseRounding::GptqGrid)
    }
}

/// The model's GGUF with `lora` fused in, rounded as `rounding` says; the feedback kinds need
/// `moments`.
pub(crate) fn fuse_model(
    model: &Model,
    lora: &LoraAdapters,
    rounding: FuseRounding,
    moments: Option<&InputMoments>,
    threads: usize,
) -> anyhow::Result<Vec<u8>> {
    let plain = |r| fuse(model, lora, r).map_err(|e| anyhow::anyhow!("fusing: {e}"));
    match (rounding, moments) {
        (FuseRounding::Fresh, _) => plain(Rounding::Fresh),
        (FuseRounding::Grid, _) => plain(Rounding::Grid),
        (FuseRounding::Gptq, Some(m)) => fuse_with_feedback(model, lora, Levels::Fresh, m, threads),
        (FuseRounding::GptqGrid, Some(m)) => fuse_with_feedback(model, lora, Levels::Own, m, threads),
        (_, None) => anyhow::bail!("--rounding gptq and gptq-grid need calibration text (-f FILE)"),
    }
}

/// The input moments for GPTQ-style fusing: `n` windows of `seq` tokens spread evenly over
/// `tokens`, through the student under `selector` with `lora` on.
pub(crate) fn calibration_moments(
    model: &Model,
    student: &Student,
    selector: &mut dyn Selector,
    lora: Option<&LoraVars>,
    tokens: &[u32],
    seq: usize,
    n: usize,
) -> anyhow::Result<InputMoments> {
    anyhow::ensure!(tokens.len() >= seq, "the calibration text holds {} tokens, fewer than {seq}", tokens.len());
    let span = tokens.len() - seq;
    let windows: Vec<&[u32]> = (0..n.max(1)).map(|i| &tokens[span * i / n.max(1)..][..seq]).collect();
    InputMoments::collect(student, model, selector, lora, &windows)
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
    pub rounding: Option<FuseRounding>,
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
    let (file, calib) = (a.file.clone().unwrap_or_default(), a.calib.clone().unwrap_or_default());
    sift_session::outputs::check(&a.output, a.force, &[&a.model, &a.lora, &file, &calib])?;
    let model = sift_store::open_model(&a.model).with_context(|| format!("cannot open '{}'", a.model.display()))?;
    anyhow::ensure!(
        model.columns.is_none(),
        "'{}' is a pack: pass the GGUF it was built from (the fused GGUF can be packed again)",
        a.model.display()
    );
    let mut lora = LoraAdapters::load(&a.lora, &model)?;
    lora.user_scale = a.scale;
    let t0 = std::time::Instant::now();
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads).max(1);
    // Quantization-aware adapters were trained on the weights' own grid: fused onto it, they give
    // exactly what was trained (calibration text, when given, still asks for GPTQ's feedback).
    let rounding = a.rounding.unwrap_or(if a.file.is_some() {
        FuseRounding::Gptq
    } else if lora.info.qat {
        FuseRounding::Grid
    } else {
        FuseRounding::Fresh
    });
    anyhow::ensure!(
        a.file.is_none() || rounding.needs_text(),
        "-f (calibration text) is read only by --rounding gptq and gptq-grid"
    );
    let moments = match (&a.file, rounding) {
        (Some(f), r) if r.needs_text() => {
            let eo = sift_engine::EngineOptions { n_threads: threads, ..Default::default() };
            let (_, tok) = sift_session::load(&a.model, &eo, &sift_session::MemoryOptions::default())?;
            let text =
                sift_output::read_regular(f, 1 << 30).with_context(|| format!("cannot read '{}'", f.display()))?;
            let tokens = tok.encode_prefix(&String::from_utf8_lossy(&text), true, false, 1 << 22);
            let method = a.sparsity.unwrap_or(sift_engine::sparsity::Method::Dense);
            let options = sift_session::SparsityOptions::for_method(method, a.ratio, 0.2, a.calib.clone());
            let mut selector = options.selector(&model)?;
            let student = Student::from_model(&model)?;
            let rank = lora.layers.iter().flatten().flatten().map(|o| o.rank).max().unwrap_or(1);
            let ops: Vec<_> = sift_model::layout::OpKind::ALL
                .into_iter()
                .filter(|&op| (0..model.layers.len()).any(|l| lora.get(l, op).is_some()))
                .collect();
            let vars = LoraVars::new(&model, &ops, rank, lora.scale(rank) * rank as f32, 0, Some(&lora))?;
            let seq = 256;
            let n = (a.calib_tokens as usize).div_ceil(seq);
            Some(calibration_moments(&model, &student, selector.as_mut(), Some(&vars), &tokens, seq, n)?)
        }
        _ => None,
    };
    let bytes = fuse_model(&model, &lora, rounding, moments.as_ref(), threads)
        .with_context(|| format!("{}", a.model.display()))?;
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
