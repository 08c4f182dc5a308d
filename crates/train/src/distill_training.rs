//! `sift train distill`'s pipeline: sparsity-aware self-distillation ([`crate::distill`]) of the
//! model under a selector's masks into LoRA adapters, in pieces written out as checkpoints with
//! the optimizer's moments beside them, then (unless asked not to) the adapters fused into the
//! weights as a new GGUF ([`crate::lora_export`]). Progress goes to stderr.

use anyhow::Context;
use sift_engine::lora::LoraAdapters;
use sift_engine::sparsity::Method;
use sift_engine::{Engine, EngineOptions};
use sift_model::layout::OpKind;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::distill::{train, Adam, DistillOptions, LoraVars, Student};
use crate::lora_export::{calibration_moments, fuse_model, FuseRounding};

/// `--lora-ops` as a list of ops: ffn, attn, all, or a comma-separated list of
/// q,k,v,o,gate,up,down.
pub fn lora_ops(s: &str) -> anyhow::Result<Vec<OpKind>> {
    Ok(match s {
        "ffn" => vec![OpKind::Gate, OpKind::Up, OpKind::Down],
        "attn" => vec![OpKind::Q, OpKind::K, OpKind::V, OpKind::O],
        "all" => OpKind::ALL.to_vec(),
        list => {
            let mut ops = Vec::new();
            for name in list.split(',') {
                let op = match name.trim() {
                    "q" => OpKind::Q,
                    "k" => OpKind::K,
                    "v" => OpKind::V,
                    "o" => OpKind::O,
                    "gate" => OpKind::Gate,
                    "up" => OpKind::Up,
                    "down" => OpKind::Down,
                    other => anyhow::bail!(
                        "--lora-ops: unknown op '{other}' (ffn, attn, all, or a list of q,k,v,o,gate,up,down)"
                    ),
                };
                if !ops.contains(&op) {
                    ops.push(op);
                }
            }
            ops
        }
    })
}

/// The fused model's path beside the adapters `out`: `X.lora.gguf` → `X.gguf`, else
/// `out.fused.gguf`.
pub fn fused_path(out: &Path) -> PathBuf {
    let s = out.to_string_lossy();
    match s.strip_suffix(".lora.gguf") {
        Some(stem) => PathBuf::from(format!("{stem}.gguf")),
        None => PathBuf::from(format!("{s}.fused.gguf")),
    }
}

/// Where the optimizer's moments are kept beside the adapters `out`.
pub fn adam_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".adam");
    PathBuf::from(s)
}

/// One `sift train distill` run's settings.
#[derive(Clone, Debug)]
pub struct DistillTraining {
    /// The model (a pack's GGUF is used for a .sift) and the training text.
    pub model: PathBuf,
    pub file: PathBuf,
    /// The selector trained under (its method defaults to Top-K).
    pub sparsity: sift_session::SparsityOptions,
    /// The adapters' rank, LoRA alpha, and the ops adapted (`ops_label` as the user named them).
    pub rank: usize,
    pub alpha: f32,
    pub ops: Vec<OpKind>,
    pub ops_label: String,
    /// Tokens per window, optimizer steps, windows per step.
    pub seq: usize,
    pub steps: usize,
    pub accumulate: usize,
    /// Weight of the layer-wise residual loss beside the KL.
    pub layer_loss: f32,
    pub lr: f64,
    pub seed: u64,
    /// The most tokens of text read.
    pub tokens: usize,
    /// The adapters' file (default: MODEL-METHOD-RATIO.lora.gguf beside the model).
    pub output: Option<PathBuf>,
    /// Steps between checkpoints (0: at the end); `resume` continues from the output.
    pub checkpoint_every: usize,
    pub resume: bool,
    pub threads: usize,
    pub force: bool,
    /// Whether the fused model is written too, and its rounding (default: the grid when
    /// quantization-aware, else GPTQ).
    pub fuse: bool,
    pub rounding: Option<FuseRounding>,
    /// Quantization-aware training (the adapted ops rounded onto the weights' grid).
    pub qat: bool,
}

impl DistillTraining {
    /// Trains and writes the adapters (and the fused model); says what it did on stderr.
    pub fn run(&self) -> anyhow::Result<()> {
        let a = self;
        let (rank, alpha, seq, qat) = (a.rank, a.alpha, a.seq, a.qat);
        sift_session::budget::keep_large_blocks();
        let eo = EngineOptions { n_threads: a.threads, n_ctx: seq, n_batch: seq, ..EngineOptions::default() };
        // The GGUF itself (a pack's GGUF for a .sift): the student dequantizes its rows.
        let (model, tok) = sift_session::load(&a.model, &eo, &sift_session::MemoryOptions::default())?;
        let plain = sift_store::open_model(model.file.path())
            .with_context(|| format!("cannot open '{}'", model.file.path().display()))?;
        let method = a.sparsity.method.unwrap_or(Method::TopK);
        let mut sparsity = a.sparsity.clone();
        sparsity.method = Some(method);
        let mut selector = sparsity.selector(&plain)?;
        let out = a.output.clone().unwrap_or_else(|| {
            let mut s = plain.file.path().with_extension("").into_os_string();
            s.push(format!("-{method}-{}.lora.gguf", sparsity.ratio));
            PathBuf::from(s)
        });
        let calib = a.sparsity.calib.clone().unwrap_or_default();
        let inputs = [a.model.as_path(), a.file.as_path(), calib.as_path()];
        sift_session::outputs::check(&out, a.force || a.resume, &inputs)?;
        if a.fuse {
            sift_session::outputs::check(&fused_path(&out), a.force || a.resume, &inputs)?;
        }
        let init = if a.resume {
            let l = LoraAdapters::load(&out, &plain)
                .with_context(|| format!("--resume: cannot continue from '{}'", out.display()))?;
            eprintln!("sift: resuming from '{}' after {} steps", out.display(), l.info.steps);
            Some(l)
        } else {
            None
        };
        let text = sift_output::read_regular(&a.file, 1 << 30)
            .with_context(|| format!("cannot read '{}'", a.file.display()))?;
        let text = String::from_utf8_lossy(&text);
        let tokens = tok.encode_prefix(&text, true, false, a.tokens);
        anyhow::ensure!(
            tokens.len() > seq,
            "'{}' holds {} tokens, fewer than one window (--seq {seq})",
            a.file.display(),
            tokens.len()
        );
        if let Some(l) = &init {
            anyhow::ensure!(
                l.info.qat == qat,
                "--resume: '{}' was trained {}; continue it {}",
                out.display(),
                if l.info.qat { "quantization-aware" } else { "without quantization-aware rounding" },
                if l.info.qat { "with --qat" } else { "with --no-qat" }
            );
        }
        let t0 = std::time::Instant::now();
        let mut student = Student::from_model(&plain)?;
        if qat {
            student.quantization_aware(&plain, &a.ops)?;
        }
        let rounding = a.rounding.unwrap_or(if qat { FuseRounding::Grid } else { FuseRounding::Gptq });
        let lora = LoraVars::new(&plain, &a.ops, rank, alpha, a.seed, init.as_ref())?;
        let vars = lora.all();
        // The optimizer's moments: from the checkpoint beside the adapters when resuming (exactly
        // where the last run stopped), else new.
        let mut adam = match &init {
            Some(l) => match sift_output::read_regular(&adam_path(&out), 1 << 34) {
                Ok(bytes) => Adam::from_gguf(&bytes, &vars, a.lr)
                    .with_context(|| format!("--resume: '{}' does not fit the adapters", adam_path(&out).display()))?,
                Err(_) => {
                    eprintln!(
                        "sift: warning: no optimizer state at '{}': the moments start again",
                        adam_path(&out).display()
                    );
                    let mut adam = Adam::new(&vars, a.lr)?;
                    adam.step = l.info.steps;
                    adam
                }
            },
            None => Adam::new(&vars, a.lr)?,
        };
        // The learning-rate schedule spans the first run's --steps; a resumed run keeps it (and
        // continues exactly), or stretches it when asked for more steps than it planned.
        adam.horizon = adam.horizon.max(adam.step + a.steps as u64);
        anyhow::ensure!(
            init.as_ref().is_none_or(|l| l.info.steps == adam.step),
            "--resume: the adapters are at step {} and the optimizer state at {}: they are from different runs",
            init.as_ref().map_or(0, |l| l.info.steps),
            adam.step
        );
        eprintln!(
            "sift: distilling {} under {} into rank-{rank} adapters{} on {} ({} trainable values, {:.1} s to load); {} tokens of text, windows of {seq}",
            plain.file.path().display(),
            selector.describe(),
            if qat { ", quantization-aware" } else { "" },
            a.ops_label,
            vars.iter().map(|v| v.as_tensor().elem_count()).sum::<usize>(),
            t0.elapsed().as_secs_f64(),
            tokens.len()
        );
        let mut teacher_engine = Engine::new(model, &eo);
        let mut teacher = |w: &[u32]| -> anyhow::Result<Vec<f32>> {
            teacher_engine.truncate(0);
            Ok(teacher_engine.eval(w, sift_engine::Logits::All)?.to_vec())
        };
        let every = if a.checkpoint_every == 0 { a.steps } else { a.checkpoint_every };
        let steps = a.steps;
        let arch = plain.config.arch.name();
        let inputs = [a.file.as_path(), plain.file.path()];
        let save = |lora: &LoraVars, adam: &Adam, loss: f32| -> anyhow::Result<()> {
            let mut l = lora.to_adapters()?;
            l.info = sift_engine::lora::DistillInfo {
                method: method.to_string(),
                ratio: sparsity.ratio as f32,
                steps: adam.step,
                tokens: adam.step * (seq * a.accumulate) as u64,
                seed: a.seed,
                loss,
                qat,
            };
            sift_output::write(&adam_path(&out), &inputs, &adam.to_gguf()?)?;
            sift_output::write(&out, &inputs, &l.to_gguf(arch))?;
            Ok(())
        };
        let t1 = std::time::Instant::now();
        let first = adam.step;
        let mut finished = 0usize;
        let mut last = f32::NAN;
        while finished < steps {
            let n = every.min(steps - finished);
            let o =
                DistillOptions { steps: n, seq, seed: a.seed, accumulate: a.accumulate, layer_weight: a.layer_loss };
            last = train(
                &student,
                &plain,
                selector.as_mut(),
                &lora,
                &mut adam,
                &tokens,
                &o,
                &mut teacher,
                &mut |k, loss| {
                    let k = (k - first) as usize;
                    let rate = (k * seq * a.accumulate) as f64 / t1.elapsed().as_secs_f64();
                    eprint!(
                        "\rsift: step {k}/{steps} KL {loss:.4} ({rate:.0} tokens/s, {:.0} s left)   ",
                        (steps - k) as f64 * (seq * a.accumulate) as f64 / rate
                    );
                    let _ = std::io::stderr().flush();
                    Ok(())
                },
            )?;
            finished += n;
            save(&lora, &adam, last)?;
        }
        eprintln!(
            "\nsift: {} steps ({} tokens) in {:.0} s, final KL {last:.4} (mean of the last tenth); adapters written to '{}' (optimizer state: '{}')",
            steps,
            steps * seq * a.accumulate,
            t1.elapsed().as_secs_f64(),
            out.display(),
            adam_path(&out).display()
        );
        if a.fuse {
            let t2 = std::time::Instant::now();
            let fused = fused_path(&out);
            let moments = if rounding.needs_text() {
                Some(calibration_moments(&plain, &student, selector.as_mut(), Some(&lora), &tokens, seq, 16)?)
            } else {
                None
            };
            let bytes = fuse_model(&plain, &lora.to_adapters()?, rounding, moments.as_ref(), a.threads)?;
            sift_output::write(&fused, &[a.file.as_path(), plain.file.path()], &bytes)?;
            eprintln!(
                "sift: fused into the weights and re-quantized in {:.1} s: '{}' (run it as any model; --no-fuse skips this)",
                t2.elapsed().as_secs_f64(),
                fused.display()
            );
        }
        if qat {
            eprintln!(
                "sift: note: these adapters were trained quantization-aware, to be fused onto the weights' grid (`sift export-lora --rounding grid`); beside the weights (--lora) they do not compute what was trained"
            );
        }
        Ok(())
    }
}
