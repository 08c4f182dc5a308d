//! `sift bench`: llama-bench's tests and output shapes (markdown table or JSON array), on a
//! session opened as `sift generate` opens one; under a budget, each decode beside its bound.

use crate::{MemoryOptions, Session, SessionOptions, SparsityOptions};
use sift_engine::bench::{bench_pp, bench_tg_measured, BenchResult};
use sift_engine::kv::KvType;
use sift_engine::EngineOptions;
use std::io::Write;
use std::path::PathBuf;

/// What `sift bench` measures.
#[derive(Clone, Debug)]
pub struct Bench {
    /// The model, opened with these session flags.
    pub model: PathBuf,
    pub sparsity: SparsityOptions,
    pub memory: MemoryOptions,
    /// The KV cache's types.
    pub cache_type_k: KvType,
    pub cache_type_v: KvType,
    /// Thread counts tested (empty: all cores), and the idle threads' polling (0-100).
    pub threads: Vec<usize>,
    pub poll: u8,
    /// Prompt lengths, generation lengths and context depths tested (0 skips a test).
    pub n_prompt: Vec<usize>,
    pub n_gen: Vec<usize>,
    pub n_depth: Vec<usize>,
    /// Repetitions of each test, and the prompt batch.
    pub reps: usize,
    pub batch_size: usize,
    /// A JSON array instead of the markdown table.
    pub json: bool,
}

impl Bench {
    /// Runs the tests, writing the table (row by row) or the JSON array to `out`.
    pub fn run(&self, out: &mut dyn Write) -> anyhow::Result<()> {
        let a = self;
        let threads = if a.threads.is_empty() { vec![sift_engine::default_threads()] } else { a.threads.clone() };
        anyhow::ensure!(threads.iter().all(|&t| t > 0), "-t must be at least 1");
        let depths: Vec<usize> = if a.n_depth.is_empty() { vec![0] } else { a.n_depth.clone() };
        let longest = a.n_prompt.iter().chain(&a.n_gen).copied().max().unwrap_or(0);
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let n_ctx = longest.checked_add(deepest).ok_or_else(|| anyhow::anyhow!("-d {deepest} is too large"))?.max(16);
        let opts = |t: usize| {
            let eo = EngineOptions {
                n_threads: t,
                n_ctx,
                n_batch: a.batch_size.max(1),
                poll: a.poll,
                cache_type_k: a.cache_type_k,
                cache_type_v: a.cache_type_v,
                ..EngineOptions::default()
            };
            SessionOptions::from_flags(&a.model, eo, &a.sparsity, &a.memory)
        };
        let mut session =
            Session::open(&SessionOptions::from_flags(&a.model, opts(threads[0])?.engine, &a.sparsity, &a.memory)?)?;
        if let Some(line) = &session.planned {
            eprintln!("{line}");
        }
        let model = &session.engine.model;
        let size = model.weight_bytes();
        let params = model.n_params();
        let desc = format!("{} {} {}", model.config.arch.name(), human_params(params), model.file_type_name());
        let filename = a.model.display().to_string();
        let mut rows: Vec<(usize, BenchResult, Option<serde_json::Value>, usize)> = Vec::new();
        let mut hybrid: Option<serde_json::Value> = None;
        let md = !a.json;
        if md {
            writeln!(out, "| model                          |       size |     params | backend    | threads |            test |                  t/s |")?;
            writeln!(out, "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |")?;
        }
        for &t in &threads {
            if t != session.engine.n_threads() {
                session = session.rebuild(&opts(t)?)?;
            }
            // The device profile the bound takes the disk's bandwidth from (the planner's), and where
            // the run's measurements are recorded (this machine's cached profile).
            let machine = session.profile.clone();
            let engine = &mut session.engine;
            let mut tests: Vec<BenchResult> = Vec::new();
            let mut telemetry = std::collections::HashMap::new();
            for &d in &depths {
                for &p in a.n_prompt.iter().filter(|&&p| p > 0) {
                    tests.push(bench_pp(engine, p, d, a.reps)?);
                    if md {
                        print_row(out, &desc, size, params, backend(engine), t, tests.last().expect("just pushed"))?;
                    }
                }
                for &n in a.n_gen.iter().filter(|&&n| n > 0) {
                    // Under a budget: the counters and the activation log cover the measured runs only.
                    // The bound's optimal cache starts from what the store holds after the warm-up.
                    let log = crate::report::record_decode(engine)?;
                    let mut start = None;
                    let mut restart = |e: &mut sift_engine::Engine| {
                        let n_layer = e.config().n_layer;
                        if let Some(s) = e.memory_mut() {
                            s.reset_stats();
                            start = Some(sift_sim::bound::CacheContent::of(s, n_layer));
                        }
                        if let Some(l) = &log {
                            l.clear().ok();
                        }
                    };
                    restart(engine);
                    let t0 = std::time::Instant::now();
                    let r = bench_tg_measured(engine, n, d, a.reps, &mut restart)?;
                    let decode_s = r.samples_ns.iter().sum::<u64>() as f64 * 1e-9;
                    tests.push(r);
                    if let (Some(l), Some(start), Some(m)) = (&log, &start, &machine) {
                        let tm = crate::report::decode_telemetry(engine, l, start, decode_s, &m.profile)?;
                        crate::machine::record_run_if_cached(m, &tm);
                        if md {
                            eprintln!("sift: decode {}", tm.line());
                        }
                        telemetry.insert(tests.len() - 1, tm);
                    }
                    if md {
                        print_row(out, &desc, size, params, backend(engine), t, tests.last().expect("just pushed"))?;
                        for line in crate::report::memory_report(engine, t0.elapsed().as_secs_f64()) {
                            eprintln!("{line}");
                        }
                    }
                }
            }
            let store = crate::report::stats_json(engine);
            let ngl = engine.gpu().map_or(0, |g| g.placement.n_gpu_layers());
            if md {
                for line in crate::report::hybrid_lines(engine) {
                    eprintln!("{line}");
                }
            }
            hybrid = engine.hybrid().and_then(|h| serde_json::to_value(h.report()).ok());
            rows.extend(tests.into_iter().enumerate().map(|(i, r)| {
                let mut st = store.clone();
                if let (Some(st), Some(tm)) = (st.as_mut(), telemetry.remove(&i)) {
                    st["decode"] = serde_json::to_value(tm).unwrap_or_default();
                }
                (t, r, st, ngl)
            }));
        }
        if md {
            writeln!(
                out,
                "\nbuild: sift {} ({})",
                env!("CARGO_PKG_VERSION"),
                format!("{:?}", sift_quant::Isa::detect()).to_lowercase()
            )?;
        } else {
            let arr: Vec<serde_json::Value> = rows
                .iter()
                .map(|(t, r, store, ngl)| {
                    let mut v = serde_json::json!({
                        "build_commit": "sift",
                        "model_filename": filename,
                        "model_type": desc,
                        "model_size": size,
                        "model_n_params": params,
                        "n_threads": t,
                        "n_gpu_layers": ngl,
                        "poll": a.poll,
                        "n_batch": a.batch_size,
                        "type_k": a.cache_type_k.name(),
                        "type_v": a.cache_type_v.name(),
                        "test": r.test_name(),
                        "n_prompt": r.n_prompt,
                        "n_gen": r.n_gen,
                        "n_depth": r.n_depth,
                        "avg_ns": r.avg_ns as u64,
                        "stddev_ns": r.stddev_ns as u64,
                        "avg_ts": r.avg_ts,
                        "stddev_ts": r.stddev_ts,
                        "samples_ns": r.samples_ns,
                        "samples_ts": r.samples_ts,
                    });
                    if let Some(st) = store {
                        v["tiered"] = st.clone();
                    }
                    if let Some(h) = &hybrid {
                        v["hybrid"] = h.clone();
                    }
                    v
                })
                .collect();
            writeln!(out, "{}", serde_json::to_string_pretty(&arr)?)?;
        }
        Ok(())
    }
}

/// The backend column, as llama-bench names it: "CPU", or "CUDA" with layers on the GPU.
fn backend(e: &sift_engine::Engine) -> &'static str {
    if e.gpu().is_some() || e.hybrid().is_some() {
        "CUDA"
    } else {
        "CPU"
    }
}

/// One row of the markdown table.
fn print_row(
    out: &mut dyn Write,
    desc: &str,
    size: u64,
    params: u64,
    backend: &str,
    threads: usize,
    r: &BenchResult,
) -> std::io::Result<()> {
    writeln!(
        out,
        "| {desc:<30} | {:>6.2} MiB | {:>8.2} M | {backend:<10} | {threads:>7} | {:>15} | {:>20} |",
        size as f64 / (1 << 20) as f64,
        params as f64 / 1e6,
        r.test_name(),
        format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts)
    )
}

/// A parameter count as llama-bench's model column says it (135M, 1.5B).
fn human_params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", n / 1_000_000)
    }
}
