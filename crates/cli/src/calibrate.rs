//! `sift calibrate`: activation histograms, greedy per-site allocations and core-neuron clusters
//! for the calibrated selection methods (`--sparsity threshold`, `core-sim`, `wina-threshold`, `cats-threshold`), and
//! the weight columns' norms the weight-aware ones rank by.

use crate::args::CalibrateArgs;
use anyhow::Context;
use sift_engine::calibrate::{calibrate, CalibrateOptions};
use sift_engine::{Engine, EngineOptions};

pub fn run(a: CalibrateArgs) -> anyhow::Result<()> {
    let model_path = a.model_pos.clone().or(a.model.clone()).unwrap_or_else(|| crate::args::DEFAULT_MODEL.into());
    sift_session::outputs::check(&a.out, a.force, &[&model_path, &a.file])?;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("cannot read '{}'", a.file.display()))?;
    for &t in &a.targets {
        anyhow::ensure!((0.0..0.98).contains(&t), "--target must be in [0, 0.98), got {t}");
    }
    anyhow::ensure!(a.step > 0.0 && a.step < 0.5, "--step must be in (0, 0.5), got {}", a.step);
    let (model, tok) = sift_session::load(&model_path, &Default::default(), &Default::default())?;
    let tokens = tok.encode(&text, true, false)?;
    let column_norms = Some(sift_engine::weight_norms::column_norms(&model)?);
    anyhow::ensure!(
        tokens.len() > a.skip + a.window,
        "'{}' has {} tokens; calibration needs more than --skip {} + one window of {}",
        a.file.display(),
        tokens.len(),
        a.skip,
        a.window
    );
    let tokens = &tokens[a.skip..];
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads);
    let n_ctx = a.window.max(a.greedy_tokens).max(a.cluster_len + 1);
    let mut engine = Engine::new(
        model,
        &EngineOptions {
            n_threads: threads,
            n_ctx,
            n_batch: n_ctx,
            sparse_head: 0.0,
            column_kernels: true,
            all_columns: false,
            ..Default::default()
        },
    );
    let opts = CalibrateOptions {
        targets: a.targets.clone(),
        n_tokens: a.n_tokens,
        window: a.window,
        greedy_tokens: a.greedy_tokens,
        step: a.step,
        clusters: a.clusters,
        cluster_passages: a.cluster_passages,
        cluster_len: a.cluster_len,
        alpha: a.alpha,
        column_norms,
    };
    let name = model_path.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    let t0 = std::time::Instant::now();
    let calib = calibrate(&mut engine, tokens, bos, &name, &opts, |msg| eprintln!("{msg}"))?;
    let (bytes, _) = engine.site_bytes();
    let b = bytes.map(|v| v as f64);
    for al in &calib.allocations {
        let r = sift_engine::sparsity::Ratios::from_table(al.ratios.clone());
        let mean: Vec<String> = sift_engine::sparsity::Site::ALL
            .iter()
            .map(|&s| {
                let m = al.ratios.iter().map(|row| row[s.index()]).sum::<f32>() / al.ratios.len().max(1) as f32;
                format!("{} {m:.2}", s.name())
            })
            .collect();
        eprintln!("target {:.2}: overall {:.3}; mean per site: {}", al.target, r.overall(b), mean.join(", "));
    }
    calib.save(&a.out)?;
    eprintln!("wrote {} in {:.1} s", a.out.display(), t0.elapsed().as_secs_f64());
    Ok(())
}
