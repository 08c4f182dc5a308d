//! The simulator against the real engine on the real SmolLM2-135M pack: a trace recorded under a
//! memory budget replays to exactly the hits, misses and preload hits the engine counted;
//! Belady's policy is never beaten by lfu, lru, tam or static on the same trace; the read bound
//! of a live run and of its simulated trace agree, and is what the optimal cache misses; the planner's plans fit
//! their budgets; damaged or foreign traces are refused with a clear error.

use sift_engine::sparsity::{build_selector, Method, Ratios, SparsityConfig};
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::tokenizer::Tokenizer;
use sift_sim::bound::{must_read_bytes, ActivationLog, CacheContent, DecodeTelemetry, ReadBound};
use sift_sim::planner::{plan, PlanRequest};
use sift_sim::profile::DeviceProfile;
use sift_sim::replay::{simulate, Replay, SimOptions};
use sift_sim::trace::{Trace, TraceError, TraceHeader, TraceWriter};
use sift_store::cache::Policy;
use sift_store::tiered::{open_budgeted, PlanInputs, TieredOptions, TieredStore};
use sift_store::{pack_model, ColPolicy, PackOptions};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The real model packed once per test binary (groups of 4 layers, like `sift pack`).
fn pack() -> &'static Path {
    static PACK: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    &PACK
        .get_or_init(|| {
            let src = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
            assert!(src.exists(), "{} missing: run scripts/fetch-model.sh first", src.display());
            let dir = test_dir("sim-replay");
            let out = dir.join("smol.sift");
            pack_model(&src, &out, &PackOptions { cols: ColPolicy::Auto, group: 4, ..PackOptions::default() }, |_| {})
                .unwrap();
            (dir, out)
        })
        .1
}

fn eo() -> EngineOptions {
    EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 32, ..EngineOptions::default() }
}

/// A seed profile whose disk reads at the alignment this machine's disk needs for the pack, so
/// that the simulated store cuts its reads (and fills its preload buffers) as the real one does.
fn profile() -> DeviceProfile {
    let mut p = DeviceProfile::builtin("dip-a18").expect("builtin profile");
    let tier = sift_store::io::open_slow_tier(pack(), sift_store::io::TierKind::Auto).expect("the pack opens");
    p.read_align = Some(tier.read_align());
    p
}

fn topk(engine: &mut Engine, ratio: f64) {
    let n_layer = engine.config().n_layer;
    let cfg = SparsityConfig {
        method: Method::TopK,
        ratios: Ratios::uniform(Method::TopK, n_layer, ratio).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    engine.set_selector(build_selector(&cfg, engine.site_dims(), None).unwrap());
}

fn prompts() -> Vec<Vec<u32>> {
    let model = sift_model::Model::load(root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    ["The history of the printing press begins in", "A recipe for bread needs flour, water and"]
        .iter()
        .map(|p| tok.encode(p, true, false).unwrap())
        .collect()
}

fn header(engine: &Engine) -> TraceHeader {
    let c = engine.config();
    TraceHeader {
        model: "smol.sift".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        dims: [c.n_embd, c.n_embd_q(), c.n_embd, c.n_ff],
        selector: engine.selector().describe(),
        n_ctx: 256,
        n_batch: 32,
        runtime_bytes: 0,
        measured_tok_s: 0.0,
    }
}

/// Greedy decoding of `n` tokens after each prompt (a new sequence each), traced into `path`.
fn record(engine: &mut Engine, path: &Path, n: usize) {
    let w = TraceWriter::create(path, &header(engine)).unwrap();
    engine.set_tracer(Some(Box::new(w.clone())));
    for p in prompts() {
        engine.truncate(0);
        let mut logits = engine.eval(&p, Logits::Last).unwrap().to_vec();
        for _ in 0..n {
            let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            logits = engine.eval(&[next], Logits::Last).unwrap().to_vec();
        }
    }
    engine.set_tracer(None);
    assert_eq!(w.finish().unwrap(), 2 * n);
}

/// The budget that leaves `cache` bytes of cache after the fixed part of the plan.
fn budget_for(opts: &TieredOptions, cache: u64) -> u64 {
    let model = open_budgeted(pack(), opts).unwrap();
    let kv = Engine::kv_and_scratch_bytes(&model, &eo());
    let inputs = PlanInputs { budget: u64::MAX / 4, runtime: 0, kv_and_scratch: kv };
    TieredStore::new(&model, pack(), opts, &inputs).unwrap().plan.fixed() + cache
}

fn sim_opts(budget: u64, policy: Policy, preload: usize) -> SimOptions {
    SimOptions {
        budget,
        inputs: None,
        tiered: TieredOptions { policy, preload, ..TieredOptions::default() },
        replay: Replay::Recorded,
        calibration: None,
        label: String::new(),
    }
}

#[test]
fn replaying_a_recorded_trace_reproduces_the_engines_hits_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mapped = sift_store::open_model(pack()).unwrap();
    for (policy, preload) in [(Policy::Lfu, 4), (Policy::Lru, 1), (Policy::TAM_DEFAULT, 4), (Policy::Lfu, 0)] {
        let opts = TieredOptions { policy, preload, ..TieredOptions::default() };
        let budget = budget_for(&opts, 3 << 20);
        let model = open_budgeted(pack(), &opts).unwrap();
        let kv = Engine::kv_and_scratch_bytes(&model, &eo());
        let store =
            TieredStore::new(&model, pack(), &opts, &PlanInputs { budget, runtime: 0, kv_and_scratch: kv }).unwrap();
        let mut engine = Engine::new(model, &eo());
        engine.attach_store(store).unwrap();
        topk(&mut engine, 0.5);
        let path = dir.path().join(format!("{}-{preload}.trace", policy.name()));
        record(&mut engine, &path, 10);
        let real = engine.memory().unwrap().stats().clone();
        assert!(real.hits > 0 && real.misses > 0, "{policy:?}: a 3 MiB cache must both hit and miss");
        let trace = Trace::read(&path).unwrap();
        assert_eq!(trace.n_tokens(), 20);
        let r = simulate(&mapped, pack(), &trace, &profile(), sim_opts(budget, policy, preload)).unwrap();
        assert_eq!(r.plan.cache, engine.memory().unwrap().plan().cache, "{policy:?}: same plan");
        assert_eq!((r.stats.hits, r.stats.misses), (real.hits, real.misses), "{policy:?} preload {preload}");
        assert_eq!(r.stats.preload_hits, real.preload_hits, "{policy:?} preload {preload}: preload hits");
        assert_eq!(r.stats.bytes_preload, real.bytes_preload, "{policy:?} preload {preload}: preload bytes");
        assert!(r.tok_s > 0.0 && r.decode_s > 0.0 && r.compute_s <= r.decode_s + 1e-9);
    }
}

/// A budgeted engine (LFU, no preload, `cache` bytes of cache) at topk 0.5.
fn budgeted_engine(cache: u64) -> Engine {
    let opts = TieredOptions { policy: Policy::Lfu, preload: 0, ..TieredOptions::default() };
    let budget = budget_for(&opts, cache);
    let model = open_budgeted(pack(), &opts).unwrap();
    let kv = Engine::kv_and_scratch_bytes(&model, &eo());
    let store =
        TieredStore::new(&model, pack(), &opts, &PlanInputs { budget, runtime: 0, kv_and_scratch: kv }).unwrap();
    let mut engine = Engine::new(model, &eo());
    engine.attach_store(store).unwrap();
    topk(&mut engine, 0.5);
    engine
}

#[test]
fn the_bound_is_what_the_best_cache_must_read() {
    let dir = tempfile::tempdir().unwrap();
    let mapped = sift_store::open_model(pack()).unwrap();
    for cache in [3u64 << 20, 1 << 30] {
        // A live run, its decode logged.
        let mut engine = budgeted_engine(cache);
        let log = ActivationLog::new(engine.config().n_layer, engine.site_dims().units).unwrap();
        engine.set_tracer(Some(Box::new(log.clone())));
        for p in prompts() {
            engine.truncate(0);
            let mut logits = engine.eval(&p, Logits::Last).unwrap().to_vec();
            for _ in 0..10 {
                let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
                logits = engine.eval(&[next], Logits::Last).unwrap().to_vec();
            }
        }
        engine.set_tracer(None);
        assert_eq!(log.tokens(), 20);
        let store = engine.memory().unwrap();
        let stats = store.stats().clone();
        let index = engine.model.columns.as_ref().unwrap();
        let empty = CacheContent::empty(engine.config().n_layer);
        let must = must_read_bytes(index, store, &empty, |l, si| log.steps(l, si)).unwrap();
        if cache == 1 << 30 {
            // Room for every column: the only misses, for LFU and for the optimum, are first uses.
            assert_eq!(must, stats.miss_bytes);
        } else {
            assert!(
                must > 0 && must < stats.miss_bytes,
                "must read {must} of the run's {} missed bytes",
                stats.miss_bytes
            );
        }
        // The same decode recorded as a trace and simulated gives the same bound.
        let path = dir.path().join(format!("{cache}.trace"));
        let mut twin = budgeted_engine(cache);
        record(&mut twin, &path, 10);
        let trace = Trace::read(&path).unwrap();
        let budget = budget_for(&TieredOptions { policy: Policy::Lfu, preload: 0, ..TieredOptions::default() }, cache);
        let r = simulate(&mapped, pack(), &trace, &profile(), sim_opts(budget, Policy::Lfu, 0)).unwrap();
        assert_eq!(r.telemetry.bound.must_read_per_token * 20.0, must as f64);
        assert_eq!(r.stats.miss_bytes, stats.miss_bytes);
        // The bound: the slower of reading the must-read bytes at the best bandwidth and computing.
        let b = ReadBound::new(20, must, 1e9, 0.02);
        let per_token = (must as f64 / 20.0 / 1e9).max(0.001);
        assert!((b.tok_s - 1.0 / per_token).abs() < 1e-9 * b.tok_s);
        let t = DecodeTelemetry::new(b.clone(), 2.0, &stats);
        assert!((t.tok_s - 10.0).abs() < 1e-12 && (t.pct_of_bound - 1000.0 / b.tok_s).abs() < 1e-9);
        assert!(t.read_amplification >= 1.0, "reads are whole pages: amplification {}", t.read_amplification);
        assert!((0.0..=1.0).contains(&t.hit_rate_bytes));
    }
}

#[test]
fn belady_is_never_beaten_on_the_same_trace() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    topk(&mut engine, 0.5);
    let path = dir.path().join("mem.trace");
    record(&mut engine, &path, 12);
    let trace = Trace::read(&path).unwrap();
    let mapped = sift_store::open_model(pack()).unwrap();
    let opts = TieredOptions::default();
    for cache in [1u64 << 20, 4 << 20, 12 << 20] {
        let budget = budget_for(&opts, cache);
        let run = |policy| simulate(&mapped, pack(), &trace, &profile(), sim_opts(budget, policy, 4)).unwrap();
        let belady = run(Policy::Belady);
        assert!(belady.stats.hits > 0);
        // Static pins the trace's hottest units first; Belady starts from the same fill.
        for policy in [Policy::Lfu, Policy::Lru, Policy::TAM_DEFAULT, Policy::Static] {
            let other = run(policy);
            assert_eq!(other.stats.hits + other.stats.misses, belady.stats.hits + belady.stats.misses);
            assert!(
                belady.stats.hits >= other.stats.hits,
                "cache {cache}: belady {} < {} {}",
                belady.stats.hits,
                policy.name(),
                other.stats.hits
            );
        }
    }
}

#[test]
fn the_planners_plans_fit_their_budgets() {
    let model = sift_store::open_model(pack()).unwrap();
    let size = model.columns.as_ref().unwrap().gguf_len;
    let kv = Engine::kv_and_scratch_bytes(&model, &eo());
    let mut last_ratio = 1.0;
    // From 100%: below it SmolLM2's fixed part (77 MiB with the exact columns' 13 MiB of scales)
    // does not fit.
    for pct in [100u64, 150, 300, 600] {
        let budget = size * pct / 100;
        let req = PlanRequest {
            inputs: PlanInputs { budget, runtime: 20 << 20, kv_and_scratch: kv },
            policy: Policy::Lfu,
            max_ratio: 0.7,
            min_ratio: 0.0,
            fixed_ratio: None,
            base: TieredOptions::default(),
            sequences: 1,
        };
        let p = plan(&model, pack(), &profile(), &req, None).unwrap();
        assert!(p.memory.fixed() + p.memory.cache <= budget, "{pct}%: plan {:?} over {budget}", p.memory);
        assert!((0.0..=0.7).contains(&p.ratio), "{pct}%: ratio {}", p.ratio);
        assert!(p.ratio <= last_ratio, "more memory never needs more sparsity");
        assert!(p.predicted_tok_s > 0.0);
        last_ratio = p.ratio;
    }
    // Several sequences decoded together: their union must fit the cache, so the same budget
    // needs at least as much sparsity, and the prediction counts all their tokens.
    let total = model.columns.as_ref().unwrap().column_bytes();
    let req = |budget, sequences| PlanRequest {
        inputs: PlanInputs { budget, runtime: 20 << 20, kv_and_scratch: kv },
        policy: Policy::Lfu,
        max_ratio: 0.9,
        min_ratio: 0.0,
        fixed_ratio: None,
        base: TieredOptions::default(),
        sequences,
    };
    // A budget whose cache holds about half the columns.
    let fixed = plan(&model, pack(), &profile(), &req(size * 3, 1), None).unwrap().memory.fixed();
    let budget = fixed + total / 2;
    let one = plan(&model, pack(), &profile(), &req(budget, 1), None).unwrap();
    let four = plan(&model, pack(), &profile(), &req(budget, 4), None).unwrap();
    eprintln!(
        "budget {budget}: ratio {} / {}, {} / {} tok/s",
        one.ratio, four.ratio, one.predicted_tok_s, four.predicted_tok_s
    );
    assert!(four.ratio > one.ratio, "4 sequences {} vs 1 {}", four.ratio, one.ratio);
    assert!(four.predicted_tok_s > one.predicted_tok_s, "{} vs {}", four.predicted_tok_s, one.predicted_tok_s);
    assert_eq!(sift_sim::planner::union_fraction(0.5, 1), 0.5);
    assert_eq!(sift_sim::planner::union_fraction(0.5, 2), 0.75);
    // A budget below the fixed part cannot be planned.
    let req = PlanRequest {
        inputs: PlanInputs { budget: 10 << 20, runtime: 20 << 20, kv_and_scratch: kv },
        policy: Policy::Lfu,
        max_ratio: 0.7,
        min_ratio: 0.0,
        fixed_ratio: None,
        base: TieredOptions::default(),
        sequences: 1,
    };
    let err = plan(&model, pack(), &profile(), &req, None).unwrap_err().to_string();
    assert!(err.contains("too small"), "{err}");
}

#[test]
fn damaged_or_foreign_traces_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    topk(&mut engine, 0.5);
    let path = dir.path().join("t.trace");
    record(&mut engine, &path, 2);
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = Trace::read(&cut).unwrap_err();
    assert!(matches!(e, TraceError::Format { .. }) && e.to_string().contains("truncated"), "{e}");
    let junk = dir.path().join("junk.trace");
    std::fs::write(&junk, b"GGUF\x03\0\0\0 not a trace").unwrap();
    assert!(Trace::read(&junk).unwrap_err().to_string().contains("not a sift trace"));
    // Bytes after the end marker (bench/file_probe.py found them ignored).
    let appended = dir.path().join("appended.trace");
    std::fs::write(&appended, [&bytes[..], b"more"].concat()).unwrap();
    let e = Trace::read(&appended).unwrap_err();
    assert!(e.to_string().contains("after the end of the recording"), "{e}");
    // A trace claims a shape no model has.
    let mut h = header(&engine);
    h.n_layer = 7;
    let other = dir.path().join("other.trace");
    TraceWriter::create(&other, &h).unwrap().finish().unwrap();
    let t = Trace::read(&other).unwrap();
    let model = sift_store::open_model(pack()).unwrap();
    let e = t.header.check_model(&other, &model).unwrap_err();
    assert!(matches!(e, TraceError::WrongModel { .. }), "{e}");
}

/// Adaptive TAM on a replayed trace: with a small cache on a slow disk every layer waits for
/// reads, so λ climbs from its start (more inertia, fewer loads); on a disk so fast that nothing
/// is waited for, every layer is compute-bound, so λ falls (the cache follows recent
/// activations). KAIROX's rule (§7), whatever it does to the hit rate.
#[test]
fn adaptive_tam_follows_the_stall_type_of_each_layer() {
    use sift_sim::profile::{DiskPoint, DiskTable};
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    topk(&mut engine, 0.5);
    let n_layer = engine.config().n_layer;
    let path = dir.path().join("adaptive.trace");
    record(&mut engine, &path, 12);
    let trace = Trace::read(&path).unwrap();
    let mapped = sift_store::open_model(pack()).unwrap();
    let budget = budget_for(&TieredOptions::default(), 1 << 20);
    let start = 0.8;
    // The last λ each layer reached.
    let last_lambdas = |profile: &DeviceProfile| {
        let r = simulate(&mapped, pack(), &trace, profile, sim_opts(budget, Policy::TAM_ADAPTIVE_DEFAULT, 0)).unwrap();
        assert!(!r.lambda.is_empty(), "adaptive TAM records its steps");
        let mut last = vec![start; n_layer];
        for s in &r.lambda {
            last[s.layer as usize] = s.lambda;
        }
        (last, r)
    };
    let (io_bound, r) = last_lambdas(&profile());
    assert!(r.stall_s > r.compute_s, "a 1 MiB cache on this disk waits for reads");
    let raised = io_bound.iter().filter(|&&l| l > start).count();
    assert!(raised * 4 >= n_layer * 3, "λ rose in {raised} of {n_layer} layers: {io_bound:?}");
    assert!(io_bound.iter().all(|&l| l <= 0.95 + 1e-6));
    let mut fast = profile();
    let points = [4096u64, 1 << 20, 4 << 20]
        .into_iter()
        .flat_map(|size| [1usize, 64].map(|qd| DiskPoint { size, qd, bw: 1e14, lat_ns: 1.0 }))
        .collect();
    fast.disk = DiskTable::new(64, points).unwrap();
    let (compute_bound, r) = last_lambdas(&fast);
    assert!(r.stall_s < 0.01 * r.compute_s, "stalls {} s", r.stall_s);
    let lowered = compute_bound.iter().filter(|&&l| l < start).count();
    assert!(lowered * 4 >= n_layer * 3, "λ fell in {lowered} of {n_layer} layers: {compute_bound:?}");
    assert!(compute_bound.iter().all(|&l| l >= 0.5 - 1e-6));
}

/// A folder of this test binary's own under cargo's target/tmp, re-used by every run: a pack kept
/// for the whole binary in a static is never dropped, so a temporary folder would be left behind.
fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
