//! `sift train prefill`: FastForward's expert predictor trained on text through the model itself
//! (`sift_train`), written beside the model where sparse prefill finds it.

use anyhow::Context;
use clap::{Args, Subcommand};
use sift_engine::predictor::{default_path, model_identity, ExpertPredictors};
use sift_engine::{Engine, EngineOptions};
use sift_model::layout::OpKind;
use sift_train::collect::collect_blocks;
use sift_train::compensate::{collect_errors, down_transposed, train_compensator, CompOptions};
use sift_train::prefill::{recall, train_predictor, TrainOptions};
use sift_train::schedule::attention_mass;
use std::io::Write;
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
    pub rounding: Option<crate::export_lora::FuseRounding>,
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

/// The fused model's path beside the adapters `out`: `X.lora.gguf` → `X.gguf`, else
/// `out.fused.gguf`.
fn fused_path(out: &std::path::Path) -> PathBuf {
    let s = out.to_string_lossy();
    match s.strip_suffix(".lora.gguf") {
        Some(stem) => PathBuf::from(format!("{stem}.gguf")),
        None => PathBuf::from(format!("{s}.fused.gguf")),
    }
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

/// The windows of the compensator's held-out check: their prompt halves (512 tokens) hold two
/// sparse blocks.
const HELD_OUT_CTX: usize = 1024;

fn prefill(a: TrainPrefillArgs) -> anyhow::Result<()> {
    anyhow::ensure!((0.0..1.0).contains(&a.ratio) && a.ratio > 0.0, "--ratio must be in (0, 1), got {}", a.ratio);
    let out = a.output.clone().unwrap_or_else(|| default_path(&a.model));
    sift_session::outputs::check(&out, a.force || a.resume, &[&a.model, &a.file])?;
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads).max(1);
    let eo = EngineOptions {
        n_threads: threads,
        n_ctx: 128 * a.seq_blocks.max(2),
        n_batch: 128,
        ..EngineOptions::default()
    };
    let (model, tok) = sift_session::load(&a.model, &eo, &sift_session::MemoryOptions::default())?;
    let identity = model_identity(&model);
    let init = if a.resume {
        let p = ExpertPredictors::load(&out, &model)
            .with_context(|| format!("--resume: cannot continue from '{}'", out.display()))?;
        eprintln!("sift: resuming from '{}' after {} steps", out.display(), p.header.steps);
        Some(p)
    } else {
        None
    };
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("cannot read '{}'", a.file.display()))?;
    let tokens = tok.encode(&text, true, false).context("cannot tokenize the training text")?;
    let mut engine = Engine::new(model, &EngineOptions { n_ctx: eo.n_ctx.max(HELD_OUT_CTX), ..eo.clone() });
    let t0 = std::time::Instant::now();
    let data = collect_blocks(&mut engine, &tokens, a.seq_blocks, a.blocks, &mut |k| {
        eprint!("\rsift: collecting activations: block {k}/{}   ", a.blocks);
        let _ = std::io::stderr().flush();
    })?;
    eprintln!("\nsift: {} blocks of {} tokens in {:.1} s", data.blocks, 128, t0.elapsed().as_secs_f64());
    let opts = TrainOptions { steps: a.steps, batch: a.batch, lr: a.lr, keep: 1.0 - a.ratio, seed: a.seed };
    // In pieces of --checkpoint-every steps, each written out (a checkpoint to resume from).
    let every = if a.checkpoint_every == 0 { a.steps } else { a.checkpoint_every };
    let mut current = init;
    let mut done = 0;
    let t1 = std::time::Instant::now();
    while done < a.steps {
        let n = every.min(a.steps - done);
        let piece = TrainOptions { steps: n, seed: a.seed.wrapping_add(done as u64), ..opts.clone() };
        let mut p = train_predictor(&data, &piece, current.as_ref(), &mut |s, loss| {
            eprint!(
                "\rsift: training: step {}/{} loss {loss:.4} ({:.0} s)   ",
                done + s,
                a.steps,
                t1.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        })?;
        p.header.model = identity.clone();
        p.header.seed = a.seed;
        p.save(&out, &[&a.model, &a.file])?;
        done += n;
        current = Some(p);
    }
    eprintln!();
    let mut p = current.expect("at least one step");
    let r = recall(&p, &data, opts.keep);
    // The layerwise schedule's importance: attention mass past the first block, on two
    // sequences from the end of the text.
    let t4 = std::time::Instant::now();
    p.header.attn_mass = attention_mass(&mut engine, &tokens, eo.n_ctx, 2)?;
    let keep = sift_engine::prefill::linear_schedule(&p.header.attn_mass, 1.0 - a.ratio);
    let (lo, hi) = keep.iter().fold((f32::MAX, f32::MIN), |(a, b), &k| (a.min(k), b.max(k)));
    eprintln!(
        "sift: layerwise schedule from the attention mass ({:.1} s): layers keep {:.0}% to {:.0}% of their neurons at --prefill-sparsity {}",
        t4.elapsed().as_secs_f64(),
        100.0 * lo,
        100.0 * hi,
        a.ratio
    );
    p.save(&out, &[&a.model, &a.file])?;
    if a.compensator_steps > 0 {
        // The error targets: the same blocks again, each block's GLU masked by the oracle's and
        // the predictor's choice, through the down projection in its GGUF layout.
        let plain = sift_store::open_model(&a.model).with_context(|| format!("cannot open '{}'", a.model.display()))?;
        let down = down_transposed(&plain)?;
        drop(plain);
        let t2 = std::time::Instant::now();
        let errs = collect_errors(
            &mut engine,
            &tokens,
            a.seq_blocks,
            a.blocks,
            down,
            std::sync::Arc::new(p.clone()),
            opts.keep,
            &mut |k| {
                eprint!("\rsift: compensator targets: block {k}/{}   ", data.blocks);
                let _ = std::io::stderr().flush();
            },
        )?;
        eprintln!("\nsift: error targets of {} blocks in {:.1} s", errs.blocks, t2.elapsed().as_secs_f64());
        let co = CompOptions {
            steps: a.compensator_steps,
            batch: a.compensator_batch.max(1),
            lr: a.compensator_lr,
            seed: a.seed,
        };
        let t3 = std::time::Instant::now();
        train_compensator(&data, &errs, &co, &mut p, &mut |s, loss| {
            eprint!(
                "\rsift: compensator: step {s}/{} loss {loss:.4} (relative MSE; {:.0} s)   ",
                co.steps,
                t3.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        })?;
        eprintln!();
        // Kept on by default only if it lowers the perplexity of held-out text (the end of the
        // training text, past what the blocks used) under sparse prefill with the predictor, in
        // windows whose prompt half holds sparse blocks (with --seq-blocks 4 or less the
        // training context's half held none: the check compared two equal numbers).
        let ctx = eo.n_ctx.max(HELD_OUT_CTX);
        debug_assert!(sift_engine::prefill::sparse_blocks(ctx / 2) >= 2);
        if tokens.len() >= 8 * ctx {
            let held = &tokens[tokens.len() - 4 * ctx..];
            engine.set_prefill_sparsity(a.ratio);
            engine.set_prefill_predictor(Some(std::sync::Arc::new(p.clone())));
            engine.set_prefill_masks(sift_engine::prefill::PrefillMasks::Predicted);
            let mut ppl = [0f64; 2];
            for (i, on) in [true, false].into_iter().enumerate() {
                engine.set_prefill_compensator(on);
                ppl[i] = sift_engine::perplexity::perplexity(
                    &mut engine,
                    held,
                    ctx,
                    Default::default(),
                    Some(4),
                    None,
                    |_, _| {},
                )?
                .ppl;
            }
            p.header.comp_on = ppl[0] < ppl[1];
            p.header.comp_check = Some((ppl[0], ppl[1]));
            eprintln!(
                "sift: held-out perplexity (4 x {ctx} tokens, prefill sparsity {}): {:.3} with the compensator, {:.3} without: {} by default",
                a.ratio,
                ppl[0],
                ppl[1],
                if p.header.comp_on { "on" } else { "off" }
            );
        } else {
            eprintln!("sift: the training text is too short for a held-out check ({} tokens, {} needed): the compensator is on by default", tokens.len(), 8 * ctx);
        }
        p.save(&out, &[&a.model, &a.file])?;
    }
    eprintln!(
        "sift: wrote '{}': {} layers, r = {}, {} steps, loss {:.4}; top-{:.0}% recall on the training blocks {:.1}%{}",
        out.display(),
        p.header.n_layer,
        p.header.rank,
        p.header.steps,
        p.header.loss,
        100.0 * opts.keep,
        100.0 * r,
        if p.has_compensator() {
            format!(
                "; compensator r' = {}, {} steps, relative MSE {:.4}",
                p.header.comp_rank, p.header.comp_steps, p.header.comp_loss
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

/// `--lora-ops` as a list of ops.
fn parse_ops(s: &str) -> anyhow::Result<Vec<OpKind>> {
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

fn layer_loss_weight(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() && (0.0..=1000.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("--layer-loss must be in [0, 1000], got {s}"))
    }
}

/// Where `sift train distill` keeps the optimizer's moments beside the adapters `out`.
fn adam_path(out: &std::path::Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".adam");
    PathBuf::from(s)
}

fn distill(a: TrainDistillArgs) -> anyhow::Result<()> {
    use sift_engine::lora::LoraAdapters;
    use sift_train::distill::{train, Adam, DistillOptions, LoraVars, Student};
    anyhow::ensure!(a.lr.is_finite() && a.lr > 0.0 && a.lr < 1.0, "--lr must be in (0, 1), got {}", a.lr);
    let ops = parse_ops(&a.lora_ops)?;
    let rank = a.rank as usize;
    let alpha = a.lora_alpha.unwrap_or(2.0 * rank as f32);
    anyhow::ensure!(
        alpha.is_finite() && alpha > 0.0 && alpha <= 1e4,
        "--lora-alpha must be in (0, 10000], got {alpha}"
    );
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads).max(1);
    let seq = a.seq as usize;
    sift_session::budget::keep_large_blocks();
    let eo = EngineOptions { n_threads: threads, n_ctx: seq, n_batch: seq, ..EngineOptions::default() };
    // The GGUF itself (a pack's GGUF for a .sift): the student dequantizes its rows.
    let (model, tok) = sift_session::load(&a.model, &eo, &sift_session::MemoryOptions::default())?;
    let plain = sift_store::open_model(model.file.path())
        .with_context(|| format!("cannot open '{}'", model.file.path().display()))?;
    let method = a.sparsity.method.unwrap_or(sift_engine::sparsity::Method::TopK);
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
    if !a.no_fuse {
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
    let text =
        sift_output::read_regular(&a.file, 1 << 30).with_context(|| format!("cannot read '{}'", a.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let tokens = tok.encode_prefix(&text, true, false, a.tokens as usize);
    anyhow::ensure!(
        tokens.len() > seq,
        "'{}' holds {} tokens, fewer than one window (--seq {seq})",
        a.file.display(),
        tokens.len()
    );
    // Quantization-aware unless asked not to, or unless only the adapters are wanted (for
    // --lora, where they are computed beside the unrounded weights).
    let qat = a.qat || !(a.no_qat || a.no_fuse);
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
        student.quantization_aware(&plain, &ops)?;
    }
    let rounding = a.rounding.unwrap_or(if qat {
        crate::export_lora::FuseRounding::Grid
    } else {
        crate::export_lora::FuseRounding::Gptq
    });
    let lora = LoraVars::new(&plain, &ops, rank, alpha, a.seed, init.as_ref())?;
    let vars = lora.all();
    // The optimizer's moments: from the checkpoint beside the adapters when resuming (exactly
    // where the last run stopped), else new.
    let adam = match &init {
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
    let mut adam = adam;
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
        a.lora_ops,
        vars.iter().map(|v| v.as_tensor().elem_count()).sum::<usize>(),
        t0.elapsed().as_secs_f64(),
        tokens.len()
    );
    let mut teacher_engine = Engine::new(model, &eo);
    let mut teacher = |w: &[u32]| -> anyhow::Result<Vec<f32>> {
        teacher_engine.truncate(0);
        Ok(teacher_engine.eval(w, sift_engine::Logits::All)?.to_vec())
    };
    let every = if a.checkpoint_every == 0 { a.steps } else { a.checkpoint_every } as usize;
    let steps = a.steps as usize;
    let arch = plain.config.arch.name();
    let inputs = [a.file.as_path(), plain.file.path()];
    let save = |lora: &LoraVars, adam: &Adam, loss: f32| -> anyhow::Result<()> {
        let mut l = lora.to_adapters()?;
        l.info = sift_engine::lora::DistillInfo {
            method: method.to_string(),
            ratio: sparsity.ratio as f32,
            steps: adam.step,
            tokens: adam.step * (seq * a.accumulate as usize) as u64,
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
        let o = DistillOptions {
            steps: n,
            seq,
            seed: a.seed,
            accumulate: a.accumulate as usize,
            layer_weight: a.layer_loss,
        };
        last =
            train(&student, &plain, selector.as_mut(), &lora, &mut adam, &tokens, &o, &mut teacher, &mut |k, loss| {
                let k = (k - first) as usize;
                let rate = (k * seq * a.accumulate as usize) as f64 / t1.elapsed().as_secs_f64();
                eprint!(
                    "\rsift: step {k}/{steps} KL {loss:.4} ({rate:.0} tokens/s, {:.0} s left)   ",
                    (steps - k) as f64 * (seq * a.accumulate as usize) as f64 / rate
                );
                let _ = std::io::stderr().flush();
                Ok(())
            })?;
        finished += n;
        save(&lora, &adam, last)?;
    }
    eprintln!(
        "\nsift: {} steps ({} tokens) in {:.0} s, final KL {last:.4} (mean of the last tenth); adapters written to '{}' (optimizer state: '{}')",
        steps,
        steps * seq * a.accumulate as usize,
        t1.elapsed().as_secs_f64(),
        out.display(),
        adam_path(&out).display()
    );
    if !a.no_fuse {
        let t2 = std::time::Instant::now();
        let fused = fused_path(&out);
        use crate::export_lora::{calibration_moments, fuse_model};
        let moments = if rounding.needs_text() {
            Some(calibration_moments(&plain, &student, selector.as_mut(), Some(&lora), &tokens, seq, 16)?)
        } else {
            None
        };
        let bytes = fuse_model(&plain, &lora.to_adapters()?, rounding, moments.as_ref(), threads)?;
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
