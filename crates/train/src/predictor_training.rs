//! `sift train prefill`'s pipeline: FastForward's expert predictor ([`crate::prefill`]) trained on
//! text through the model itself, in pieces written out as checkpoints, then the layerwise
//! schedule's attention mass ([`crate::schedule`]) and the error compensator
//! ([`crate::compensate`]), kept on by default only where it lowers held-out perplexity. The file
//! goes beside the model, where sparse prefill finds it. Progress goes to stderr.

use anyhow::Context;
use sift_engine::predictor::{default_path, model_identity, ExpertPredictors};
use sift_engine::{Engine, EngineOptions};
use std::io::Write;
use std::path::PathBuf;

use crate::collect::collect_blocks;
use crate::compensate::{collect_errors, down_transposed, train_compensator, CompOptions};
use crate::prefill::{recall, train_predictor, TrainOptions};
use crate::schedule::attention_mass;

/// The windows of the compensator's held-out check: their prompt halves (512 tokens) hold two
/// sparse blocks.
const HELD_OUT_CTX: usize = 1024;

/// One `sift train prefill` run's settings.
#[derive(Clone, Debug)]
pub struct PredictorTraining {
    /// The model (.gguf or .sift) and the training text.
    pub model: PathBuf,
    pub file: PathBuf,
    /// 128-token blocks learnt from, and blocks per sequence through the model.
    pub blocks: usize,
    pub seq_blocks: usize,
    /// The predictor's optimizer steps, blocks per step and learning rate.
    pub steps: usize,
    pub batch: usize,
    pub lr: f64,
    /// The prefill sparsity trained for, in (0, 1).
    pub ratio: f32,
    pub seed: u64,
    /// The file written (default: beside the model, where sparse prefill looks).
    pub output: Option<PathBuf>,
    /// Steps between checkpoints (0: at the end only); `resume` continues from the output.
    pub checkpoint_every: usize,
    pub resume: bool,
    pub threads: usize,
    /// The compensator's steps (0: none), blocks per step and learning rate.
    pub compensator_steps: usize,
    pub compensator_batch: usize,
    pub compensator_lr: f64,
    /// Whether an existing output may be replaced.
    pub force: bool,
}

/// Flushes a progress line written with `eprint!`.
fn flush() {
    let _ = std::io::stderr().flush();
}

impl PredictorTraining {
    /// Trains and writes the predictor (and compensator); says what it did on stderr.
    pub fn run(&self) -> anyhow::Result<()> {
        let a = self;
        let out = a.output.clone().unwrap_or_else(|| default_path(&a.model));
        sift_session::outputs::check(&out, a.force || a.resume, &[&a.model, &a.file])?;
        let eo = EngineOptions {
            n_threads: a.threads,
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
            flush();
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
                flush();
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
            self.compensator(&mut engine, &tokens, &data, &mut p, opts.keep, eo.n_ctx)?;
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

    /// Trains the error compensator into `p` and decides by held-out perplexity whether it is on
    /// by default.
    fn compensator(
        &self,
        engine: &mut Engine,
        tokens: &[u32],
        data: &crate::collect::Samples,
        p: &mut ExpertPredictors,
        keep: f32,
        n_ctx: usize,
    ) -> anyhow::Result<()> {
        let a = self;
        // The error targets: the same blocks again, each block's GLU masked by the oracle's and
        // the predictor's choice, through the down projection in its GGUF layout.
        let plain = sift_store::open_model(&a.model).with_context(|| format!("cannot open '{}'", a.model.display()))?;
        let down = down_transposed(&plain)?;
        drop(plain);
        let t2 = std::time::Instant::now();
        let errs = collect_errors(
            engine,
            tokens,
            a.seq_blocks,
            a.blocks,
            down,
            std::sync::Arc::new(p.clone()),
            keep,
            &mut |k| {
                eprint!("\rsift: compensator targets: block {k}/{}   ", data.blocks);
                flush();
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
        train_compensator(data, &errs, &co, p, &mut |s, loss| {
            eprint!(
                "\rsift: compensator: step {s}/{} loss {loss:.4} (relative MSE; {:.0} s)   ",
                co.steps,
                t3.elapsed().as_secs_f64()
            );
            flush();
        })?;
        eprintln!();
        // Kept on by default only if it lowers the perplexity of held-out text (the end of the
        // training text, past what the blocks used) under sparse prefill with the predictor, in
        // windows whose prompt half holds sparse blocks (with --seq-blocks 4 or less the
        // training context's half held none: the check compared two equal numbers).
        let ctx = n_ctx.max(HELD_OUT_CTX);
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
                    engine,
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
        Ok(())
    }
}
