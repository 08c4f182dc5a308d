//! `sift export-lora`'s pipeline (llama.cpp's `llama-export-lora`): LoRA adapters fused into the
//! model's weights and written as a new GGUF, each adapted tensor re-quantized to its own type as
//! a [`FuseRounding`] says, the rest of the file byte for byte. [`fuse_model`] and
//! [`calibration_moments`] are shared with `sift train distill`'s fused output
//! ([`crate::distill_training`]).

use anyhow::Context;
use sift_engine::lora::{fuse, LoraAdapters, Rounding};
use sift_engine::sparsity::{Method, Selector};
use sift_model::Model;
use std::path::PathBuf;

use crate::distill::{LoraVars, Student};
use crate::fuse::{fuse_with_feedback, InputMoments, Levels};

/// How a fused model's rows are quantized again (`sift export-lora`, `sift train distill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseRounding {
    /// New block scales for the fused values, each weight to its nearest level (as
    /// llama-export-lora).
    Fresh,
    /// Each tensor's own block scales kept, each weight to its nearest level.
    Grid,
    /// GPTQ's error feedback on fresh block scales (needs calibration text).
    Gptq,
    /// GPTQ's error feedback on each tensor's own block scales (needs calibration text).
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
pub fn fuse_model(
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
pub fn calibration_moments(
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

/// One `sift export-lora` run: what to fuse into what, and how.
#[derive(Clone, Debug)]
pub struct LoraExport {
    /// The base model (a GGUF, not a pack).
    pub model: PathBuf,
    /// The adapters (a GGUF LoRA).
    pub lora: PathBuf,
    /// Scale of the adapters (llama.cpp's `--lora-scaled`).
    pub scale: f32,
    /// The rounding; `None`: GPTQ with calibration text, else the grid for adapters trained
    /// quantization-aware, else fresh scales.
    pub rounding: Option<FuseRounding>,
    /// Calibration text for the GPTQ roundings.
    pub file: Option<PathBuf>,
    /// Calibration tokens read from `file` (in windows of 256).
    pub calib_tokens: usize,
    /// The selection method the fused model will run under (`None`: dense), its ratio and
    /// calibration file.
    pub sparsity: Option<Method>,
    pub ratio: f64,
    pub calib: Option<PathBuf>,
    pub threads: usize,
    /// The fused model to write, and whether it may replace an existing file.
    pub output: PathBuf,
    pub force: bool,
}

impl LoraExport {
    /// Fuses and writes the model; says what it did on stderr.
    pub fn run(&self) -> anyhow::Result<()> {
        let (file, calib) = (self.file.clone().unwrap_or_default(), self.calib.clone().unwrap_or_default());
        sift_session::outputs::check(&self.output, self.force, &[&self.model, &self.lora, &file, &calib])?;
        let model =
            sift_store::open_model(&self.model).with_context(|| format!("cannot open '{}'", self.model.display()))?;
        anyhow::ensure!(
            model.columns.is_none(),
            "'{}' is a pack: pass the GGUF it was built from (the fused GGUF can be packed again)",
            self.model.display()
        );
        let mut lora = LoraAdapters::load(&self.lora, &model)?;
        lora.user_scale = self.scale;
        let t0 = std::time::Instant::now();
        // Quantization-aware adapters were trained on the weights' own grid: fused onto it, they
        // give exactly what was trained (calibration text, when given, still asks for GPTQ's
        // feedback).
        let rounding = self.rounding.unwrap_or(if self.file.is_some() {
            FuseRounding::Gptq
        } else if lora.info.qat {
            FuseRounding::Grid
        } else {
            FuseRounding::Fresh
        });
        anyhow::ensure!(
            self.file.is_none() || rounding.needs_text(),
            "-f (calibration text) is read only by --rounding gptq and gptq-grid"
        );
        let moments = match (&self.file, rounding) {
            (Some(f), r) if r.needs_text() => Some(self.moments(&model, &lora, f)?),
            _ => None,
        };
        let bytes = fuse_model(&model, &lora, rounding, moments.as_ref(), self.threads)
            .with_context(|| format!("{}", self.model.display()))?;
        sift_output::write(&self.output, &[self.model.as_path(), self.lora.as_path()], &bytes)?;
        eprintln!(
            "sift: {} adapted tensors of '{}' fused and re-quantized in {:.1} s; wrote '{}'",
            lora.layers.iter().flatten().flatten().count(),
            self.model.display(),
            t0.elapsed().as_secs_f64(),
            self.output.display()
        );
        Ok(())
    }

    /// The GPTQ roundings' input moments on the calibration text `f`, through the student under
    /// the selector the fused model will run with, the adapters on.
    fn moments(&self, model: &Model, lora: &LoraAdapters, f: &std::path::Path) -> anyhow::Result<InputMoments> {
        let eo = sift_engine::EngineOptions { n_threads: self.threads, ..Default::default() };
        let (_, tok) = sift_session::load(&self.model, &eo, &sift_session::MemoryOptions::default())?;
        let text = sift_output::read_regular(f, 1 << 30).with_context(|| format!("cannot read '{}'", f.display()))?;
        let tokens = tok.encode_prefix(&String::from_utf8_lossy(&text), true, false, 1 << 22);
        let method = self.sparsity.unwrap_or(Method::Dense);
        let options = sift_session::SparsityOptions::for_method(method, self.ratio, 0.2, self.calib.clone());
        let mut selector = options.selector(model)?;
        let student = Student::from_model(model)?;
        let rank = lora.layers.iter().flatten().flatten().map(|o| o.rank).max().unwrap_or(1);
        let ops: Vec<_> = sift_model::layout::OpKind::ALL
            .into_iter()
            .filter(|&op| (0..model.layers.len()).any(|l| lora.get(l, op).is_some()))
            .collect();
        let vars = LoraVars::new(model, &ops, rank, lora.scale(rank) * rank as f32, 0, Some(lora))?;
        let seq = 256;
        let n = self.calib_tokens.div_ceil(seq);
        calibration_moments(model, &student, selector.as_mut(), Some(&vars), tokens.as_slice(), seq, n)
    }
}
