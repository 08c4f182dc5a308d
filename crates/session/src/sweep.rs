//! `sift sweep`: perplexity, optionally a multiple-choice eval (`sift_eval`) and decode speed,
//! over selection methods × ratios, written as a CSV row per run as soon as it finishes, then
//! Pareto plots (SVG, `sift_eval::plot`): quality vs active weight bytes per token, and decode
//! tok/s vs ratio. Progress goes to stderr.

use crate::SparsityOptions;
use anyhow::Context;
use sift_engine::perplexity::{perplexity, Scored};
use sift_engine::sparsity::Method;
use sift_engine::{Engine, EngineOptions, Logits};
use sift_eval::plot::{Chart, Series};
use sift_eval::{evaluate, EngineScorer, EvalOptions};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// What `sift sweep` runs.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// The model and the text perplexity is measured on, in windows of `ctx_size` tokens,
    /// `chunks` of them per run.
    pub model: PathBuf,
    pub file: PathBuf,
    pub ctx_size: usize,
    pub chunks: usize,
    /// The methods and ratios swept (dense runs once), with their calibration file, DIP-CA's
    /// gamma and SparseInfer's alpha.
    pub methods: Vec<Method>,
    pub ratios: Vec<f64>,
    pub calib: Option<PathBuf>,
    pub gamma: f32,
    pub alpha: f32,
    /// Decode steps timed per run (0: none).
    pub tg: usize,
    pub threads: usize,
    /// The folder sweep.csv and the plots go to.
    pub out: PathBuf,
    /// Time decoding on dense kernels with masked inputs (a pack).
    pub dense_kernels: bool,
    /// A multiple-choice set scored per run, and its items per run.
    pub eval: Option<PathBuf>,
    pub eval_limit: usize,
}

/// One finished run.
#[derive(Clone, Debug)]
struct Row {
    method: String,
    ratio: f64,
    ppl: f64,
    ppl_err: f64,
    active_mib: f64,
    tok_s: f64,
    acc: f64,
    acc_norm: f64,
}

impl Sweep {
    /// Runs the sweep, writing sweep.csv and the plots into [`Sweep::out`].
    pub fn run(&self) -> anyhow::Result<()> {
        let a = self;
        let text = std::fs::read_to_string(&a.file).with_context(|| format!("cannot read '{}'", a.file.display()))?;
        let (model, tok) = crate::load(&a.model, &Default::default(), &Default::default())?;
        let tokens = tok.encode(&text, true, false)?;
        let bos = if tok.add_bos() { tok.bos() } else { None };
        std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create '{}'", a.out.display()))?;
        let opts = EngineOptions {
            n_threads: a.threads,
            n_ctx: a.ctx_size.max(a.tg + 64),
            n_batch: a.ctx_size.max(1),
            sparse_head: 0.0,
            column_kernels: !a.dense_kernels,
            all_columns: false,
            ..Default::default()
        };
        let eval_set = match &a.eval {
            Some(f) => {
                let ds = sift_eval::load(f, None, None)
                    .with_context(|| format!("cannot load eval set '{}'", f.display()))?;
                let n = a.eval_limit.min(ds.items.len());
                Some((ds, n))
            }
            None => None,
        };
        let mut engine = Engine::new(model, &opts);
        let csv_path = a.out.join("sweep.csv");
        // Written as the runs finish (a long sweep shows its progress), so checked here as an output.
        let (calib, eval) = (a.calib.clone().unwrap_or_default(), a.eval.clone().unwrap_or_default());
        crate::outputs::check(&csv_path, true, &[&a.model, &a.file, &calib, &eval])?;
        let mut csv =
            std::fs::File::create(&csv_path).with_context(|| format!("cannot create '{}'", csv_path.display()))?;
        writeln!(csv, "model,method,ratio,ppl,ppl_err,active_mib_per_token,decode_tok_s,eval_acc,eval_acc_norm")?;
        let model_name = a.model.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let mut runs: Vec<(Method, f64)> = vec![(Method::Dense, 0.0)];
        for &m in &a.methods {
            for &r in &a.ratios {
                if m != Method::Dense && r > 0.0 {
                    runs.push((m, r));
                }
            }
        }
        let mut rows = Vec::new();
        for (i, &(method, ratio)) in runs.iter().enumerate() {
            let sp = SparsityOptions {
                method: Some(method),
                ratio,
                config: None,
                calib: a.calib.clone(),
                gamma: a.gamma,
                cache_frac: None,
                alpha: a.alpha,
                core_magnitude: false,
                sparse_head: 0.0,
                dense_kernels: a.dense_kernels,
                all_columns: false,
                prefill_sparsity: 0.0,
                prefill_masks: Default::default(),
                prefill_predictor: None,
                prefill_compensator: None,
                prefill_schedule: "layerwise".into(),
                prefill_down: "columns".into(),
                lora: None,
            };
            sp.apply(&mut engine).with_context(|| format!("{method} ratio {ratio}"))?;
            engine.reset_stats();
            let t0 = Instant::now();
            let p = perplexity(&mut engine, &tokens, a.ctx_size, Scored::SecondHalf, Some(a.chunks), bos, |_, _| {})?;
            let active_mib = engine.active_bytes_per_token() / (1 << 20) as f64;
            let tok_s = if a.tg > 0 { decode_speed(&mut engine, &tokens, a.tg)? } else { f64::NAN };
            let (acc, acc_norm) = match &eval_set {
                Some((ds, n)) => {
                    let mut scorer = EngineScorer::new(&mut engine);
                    scorer.reuse_prefix = method == Method::Dense;
                    let eo = EvalOptions { max_tokens: scorer.max_tokens(), shots: Vec::new() };
                    let rep = evaluate(&ds.task, &ds.items[..*n], &tok, &mut scorer, &eo, |_| {})?;
                    (rep.acc.value, rep.acc_norm.value)
                }
                None => (f64::NAN, f64::NAN),
            };
            let row = Row {
                method: method.name().into(),
                ratio,
                ppl: p.ppl,
                ppl_err: p.ppl_err,
                active_mib,
                tok_s,
                acc,
                acc_norm,
            };
            eprintln!(
            "[{}/{}] {:<9} r={:.2}: PPL {:.4} +/- {:.4}, {:.2} MiB/token, {:.1} tok/s, acc {:.4} acc_norm {:.4} ({:.0} s)",
            i + 1,
            runs.len(),
            row.method,
            ratio,
            p.ppl,
            p.ppl_err,
            active_mib,
            tok_s,
            acc,
            acc_norm,
            t0.elapsed().as_secs_f64()
        );
            writeln!(
                csv,
                "{model_name},{},{:.2},{:.4},{:.4},{:.3},{:.2},{:.4},{:.4}",
                row.method, row.ratio, row.ppl, row.ppl_err, row.active_mib, row.tok_s, row.acc, row.acc_norm
            )?;
            csv.flush()?;
            rows.push(row);
        }
        write_plots(&a.out, &model_name, &rows, &[&a.model, &a.file, &calib, &eval])?;
        eprintln!("wrote {} and plots in {}", csv_path.display(), a.out.display());
        Ok(())
    }
}

/// Decode tok/s: a 32-token prompt from the text, then `n` single-token steps (median of 3).
fn decode_speed(engine: &mut Engine, tokens: &[u32], n: usize) -> anyhow::Result<f64> {
    let prompt = &tokens[..32.min(tokens.len())];
    let mut samples = Vec::new();
    for _ in 0..3 {
        engine.truncate(0);
        engine.eval(prompt, Logits::Last)?;
        let t = Instant::now();
        for &tk in &tokens[32..32 + n] {
            engine.eval(&[tk], Logits::Last)?;
        }
        samples.push(n as f64 / t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[1])
}

fn write_plots(dir: &std::path::Path, model: &str, rows: &[Row], inputs: &[&std::path::Path]) -> anyhow::Result<()> {
    let dense = rows.iter().find(|r| r.method == "dense").cloned();
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        if !names.contains(&r.method) {
            names.push(r.method.clone());
        }
    }
    let series = |f: &dyn Fn(&Row) -> (f64, f64)| -> Vec<Series> {
        names
            .iter()
            .map(|n| {
                let mut pts: Vec<(f64, f64)> = rows.iter().filter(|r| &r.method == n).map(f).collect();
                if n != "dense" {
                    if let Some(d) = &dense {
                        pts.push(f(d));
                    }
                }
                Series { name: n.clone(), points: pts }
            })
            .collect()
    };
    let quality = Chart {
        title: format!("{model}: perplexity vs active weight bytes"),
        x_label: "active weight MiB per token (7 linears + head)".into(),
        y_label: "wikitext-2 perplexity (log)".into(),
        log_y: true,
        series: series(&|r: &Row| (r.active_mib, r.ppl)),
    };
    crate::outputs::write_in(dir, "ppl_vs_bytes.svg", inputs, quality.to_svg().as_bytes())?;
    if rows.iter().any(|r| r.acc_norm.is_finite()) {
        let acc = Chart {
            title: format!("{model}: accuracy vs active weight bytes"),
            x_label: "active weight MiB per token (7 linears + head)".into(),
            y_label: "acc_norm".into(),
            log_y: false,
            series: series(&|r: &Row| (r.active_mib, r.acc_norm)),
        };
        crate::outputs::write_in(dir, "acc_vs_bytes.svg", inputs, acc.to_svg().as_bytes())?;
    }
    if rows.iter().any(|r| r.tok_s.is_finite()) {
        let speed = Chart {
            title: format!("{model}: decode speed vs ratio"),
            x_label: "ratio (fraction of units skipped)".into(),
            y_label: "decode tok/s".into(),
            log_y: false,
            series: series(&|r: &Row| (r.ratio, r.tok_s)),
        };
        crate::outputs::write_in(dir, "toks_vs_ratio.svg", inputs, speed.to_svg().as_bytes())?;
    }
    Ok(())
}
