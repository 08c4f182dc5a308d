//! The engine's hybrid decode simulated on the real SmolLM2-135M pack: with costs chosen so that
//! a token's time can be counted by hand, the simulated time is that count — every unit on the
//! CPU, every unit on the GPU, and llama.cpp's layer split; placements follow the engine's own
//! pools and budget split.

use sift_engine::balancer::BalancePolicy;
use sift_engine::hybrid::AttentionPlacement;
use sift_sim::hybrid::GpuProfile;
use sift_sim::hybrid_engine::{simulate_engine, EngineCosts, EngineRun, FfnActivity};
use sift_store::{pack_model, PackOptions};
use std::path::PathBuf;
use std::sync::OnceLock;

fn model() -> &'static sift_model::Model {
    static MODEL: OnceLock<(tempfile::TempDir, sift_model::Model)> = OnceLock::new();
    &MODEL
        .get_or_init(|| {
            let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
            assert!(src.exists(), "{} missing: run scripts/fetch-model.sh first", src.display());
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("smol.sift");
            pack_model(&src, &out, &PackOptions::default(), |_| {}).unwrap();
            let m = sift_store::open_model(&out).unwrap();
            (dir, m)
        })
        .1
}

fn zero_costs() -> EngineCosts {
    EngineCosts {
        attention_gpu_ns: 0.0,
        attention_cpu_ns: 0.0,
        site_ns: 0.0,
        gpu_queue_ns: 0.0,
        gpu_result_ns: 0.0,
        cpu_site_ns: 0.0,
        cpu_value_ns: 0.0,
        layer_ns: 0.0,
        head_gpu_ns: 0.0,
        head_cpu_ns: 0.0,
        load_issue_ns: 0.0,
        dense_gpu_layer_ns: 0.0,
        dense_cpu_layer_ns: 0.0,
        dense_round_trip_ns: 0.0,
    }
}

/// The H200's measured transfer curve (docs/results/issue20-h200-s20/gpu-probe.json, rounded).
fn gpu() -> GpuProfile {
    let mut g = GpuProfile::builtin("rtx4090-pcie4").unwrap();
    g.pcie = vec![(4096, 1.6e9), (65536, 16.7e9), (1 << 20, 47.8e9), (16 << 20, 54.3e9)];
    g
}

/// Every other unit of both FFN sites active, in every layer, for `n` tokens.
fn every_other(n: usize) -> FfnActivity {
    let c = &model().config;
    let half = |k: usize| Some((0..k as u32).filter(|u| u % 2 == 0).collect::<Vec<_>>());
    (0..n).map(|_| (0..c.n_layer).map(|_| [half(c.n_embd), half(c.n_ff)]).collect()).collect()
}

fn run(policy: Option<BalancePolicy>, gpu_bytes: u64, attention: AttentionPlacement) -> EngineRun {
    EngineRun { policy, gpu_bytes, attention, n_ctx: 1024, group_size: None }
}

#[test]
fn every_unit_on_the_cpu_costs_its_columns() {
    let c = &model().config;
    let mut costs = zero_costs();
    (costs.cpu_value_ns, costs.cpu_site_ns, costs.attention_cpu_ns, costs.layer_ns, costs.head_cpu_ns) =
        (1.0, 100.0, 1000.0, 10.0, 5e5);
    // No slot anywhere: the engine skips the balancer, so no planning is charged.
    costs.site_ns = 7777.0;
    let act = every_other(20);
    let (r, placed) =
        simulate_engine(&act, model(), &gpu(), &costs, &run(Some(BalancePolicy::Static), 0, AttentionPlacement::Cpu))
            .unwrap();
    assert!(!placed.attention && !placed.head && placed.gpu_share == 0.0, "{placed:?}");
    // Per layer: the FFN input's 288 channels times gate and up (2 x 1536 values), the GLU's 768
    // neurons times down (576 values), two sites' fixed cost, attention and the rest.
    let values = (c.n_embd / 2 * 2 * c.n_ff + c.n_ff / 2 * c.n_embd) as f64;
    let want = c.n_layer as f64 * (values + 200.0 + 1000.0 + 10.0) + 5e5;
    assert!((r.p50_ns - want).abs() < 1e-6 * want && (r.p99_ns - want).abs() < 1e-6 * want, "{} vs {want}", r.p50_ns);
    assert_eq!(r.cpu_share, 1.0);
    assert_eq!(r.reloads_per_token, 0.0);
}

#[test]
fn every_unit_on_the_gpu_costs_its_round_trips() {
    let c = &model().config;
    let mut costs = zero_costs();
    (costs.attention_gpu_ns, costs.site_ns, costs.gpu_queue_ns, costs.gpu_result_ns, costs.head_gpu_ns) =
        (50_000.0, 1_000.0, 10_000.0, 15_000.0, 20_000.0);
    costs.cpu_value_ns = 1.0;
    // A budget far above the model: attention, the head and every group on the GPU; static's
    // warm start holds every group (each has active units), so nothing is left to the CPU.
    for policy in ["static", "tam", "tam-adaptive", "lru", "eager"] {
        let p = BalancePolicy::parse(policy).unwrap();
        let (r, placed) = simulate_engine(
            &every_other(24),
            model(),
            &gpu(),
            &costs,
            &run(Some(p), 8 << 30, AttentionPlacement::Auto),
        )
        .unwrap();
        assert!(placed.attention && placed.head && placed.gpu_share == 1.0, "{policy}: {placed:?}");
        let want = c.n_layer as f64 * (50_000.0 + 2.0 * (1_000.0 + 10_000.0 + 15_000.0)) + 20_000.0;
        assert!((r.p50_ns - want).abs() < 1e-6 * want, "{policy}: {} vs {want}", r.p50_ns);
        assert_eq!(r.cpu_share, 0.0, "{policy}");
        assert_eq!(r.reloads_per_token, 0.0, "{policy}: every group was placed by the warm start");
    }
    // A site the selector left dense is not split: the FFN input's 576 channels all on the CPU.
    let mut act = every_other(8);
    for tok in &mut act {
        for sites in tok.iter_mut() {
            sites[0] = None;
        }
    }
    let (r, _) = simulate_engine(
        &act,
        model(),
        &gpu(),
        &costs,
        &run(Some(BalancePolicy::Static), 8 << 30, AttentionPlacement::Auto),
    )
    .unwrap();
    let share = c.n_embd as f64 / (c.n_embd + c.n_ff / 2) as f64;
    assert!((r.cpu_share - share).abs() < 1e-9, "CPU share {} against {share}", r.cpu_share);
    let want =
        c.n_layer as f64 * (50_000.0 + (c.n_embd * 2 * c.n_ff) as f64 + 1_000.0 + 10_000.0 + 15_000.0) + 20_000.0;
    assert!((r.p50_ns - want).abs() < 1e-6 * want, "{} vs {want}", r.p50_ns);
}

#[test]
fn a_partial_budget_splits_units_and_tam_moves_groups() {
    let mut costs = zero_costs();
    (costs.cpu_value_ns, costs.gpu_result_ns) = (1.0, 10_000.0);
    // Activity that drifts: the first half of the tokens uses the low half of the units, the
    // rest the high half; static keeps what the first tokens used, TAM follows.
    let c = &model().config;
    let side = |k: usize, hi: bool| Some((0..k as u32).filter(|&u| (u as usize >= k / 2) == hi).collect::<Vec<_>>());
    let act: FfnActivity =
        (0..64).map(|t| (0..c.n_layer).map(|_| [side(c.n_embd, t >= 32), side(c.n_ff, t >= 32)]).collect()).collect();
    let budget = 20 << 20;
    let sim = |p: &str, costs: &EngineCosts| -> sift_sim::hybrid::HybridReport {
        simulate_engine(
            &act,
            model(),
            &gpu(),
            costs,
            &run(Some(BalancePolicy::parse(p).unwrap()), budget, AttentionPlacement::Cpu),
        )
        .unwrap()
        .0
    };
    let (st, tam) = (sim("static", &costs), sim("tam", &costs));
    assert!(st.cpu_share > 0.0 && st.cpu_share < 1.0, "static CPU share {}", st.cpu_share);
    assert_eq!(st.reloads_per_token, 0.0);
    assert!(tam.reloads_per_token > 0.0, "TAM loads groups as the activity drifts");
    assert!(tam.cpu_share < st.cpu_share, "TAM {} against static {}", tam.cpu_share, st.cpu_share);
    assert!(tam.tok_s > st.tok_s, "TAM {} against static {} tok/s", tam.tok_s, st.tok_s);
    // Issuing a load costs the host: TAM's tokens take that much longer per load (less what
    // the later start saves of waiting for loads), static's none.
    costs.load_issue_ns = 20_000.0;
    let (st2, tam2) = (sim("static", &costs), sim("tam", &costs));
    assert_eq!(st2.tok_s, st.tok_s);
    let per_token = |r: &sift_sim::hybrid::HybridReport| 1e9 / r.tok_s;
    let extra = per_token(&tam2) - per_token(&tam);
    let issued = tam2.reloads_per_token * 20_000.0;
    assert!(extra > 0.5 * issued && extra <= issued * 1.0001, "{extra} ns more a token for {issued} ns of loads");
}

#[test]
fn the_layer_split_runs_whole_layers_on_each_side() {
    let c = &model().config;
    let mut costs = zero_costs();
    (costs.dense_cpu_layer_ns, costs.dense_gpu_layer_ns, costs.dense_round_trip_ns) = (80_000.0, 30_000.0, 20_000.0);
    (costs.head_cpu_ns, costs.head_gpu_ns) = (600_000.0, 10_000.0);
    let n = c.n_layer as f64;
    let all = simulate_engine(&every_other(4), model(), &gpu(), &costs, &run(None, 8 << 30, AttentionPlacement::Auto))
        .unwrap();
    assert_eq!(all.1.gpu_layers, c.n_layer);
    assert!(all.1.head);
    assert!((all.0.p50_ns - (n * 30_000.0 + 10_000.0 + 20_000.0)).abs() < 1e-3);
    let none =
        simulate_engine(&every_other(4), model(), &gpu(), &costs, &run(None, 0, AttentionPlacement::Auto)).unwrap();
    assert_eq!(none.1.gpu_layers, 0);
    assert!((none.0.p50_ns - (n * 80_000.0 + 600_000.0)).abs() < 1e-3);
    // Half the model's bytes: some layers on each side, the head on the CPU.
    let half =
        simulate_engine(&every_other(4), model(), &gpu(), &costs, &run(None, 50 << 20, AttentionPlacement::Auto))
            .unwrap();
    let k = half.1.gpu_layers as f64;
    assert!(k > 0.0 && k < n && !half.1.head, "{:?}", half.1);
    assert!((half.0.p50_ns - ((n - k) * 80_000.0 + k * 30_000.0 + 600_000.0 + 20_000.0)).abs() < 1e-3);
}

/// The engine's hybrid decode (its host emulation: the same balancer, pools and loads, the GPU's
/// share computed on the CPU) beside a CPU-only run of the same prompt traced as `sift trace`
/// traces it: simulated from that trace, the hybrid decode puts as many units on the CPU (within
/// a point) and moves as many groups (within 8 %: its warm start is the first decoded tokens, the
/// engine's the prompt) as the engine did.
#[test]
fn the_simulator_places_units_as_the_engine_does() {
    use sift_engine::hybrid::HybridOptions as EngineHybrid;
    use sift_engine::sparsity::{build_selector, Method, Ratios, SparsityConfig};
    use sift_engine::{Engine, EngineOptions, Logits};
    use sift_sim::trace::{Trace, TraceHeader, TraceWriter};
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("smol.sift");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    pack_model(&src, &pack, &PackOptions::default(), |_| {}).unwrap();
    let prompt: Vec<u32> = {
        let m = sift_model::Model::load(&src).unwrap();
        let tok = sift_model::tokenizer::Tokenizer::from_gguf(&m.file.gguf).unwrap();
        tok.encode("The history of the printing press begins in the fifteenth century, when", true, false).unwrap()
    };
    for (policy, budget, gs) in
        [("lru", 24u64 << 20, 64usize), ("eager", 24 << 20, 64), ("tam", 30 << 20, 16), ("static", 20 << 20, 16)]
    {
        let eo = EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 32, ..EngineOptions::default() };
        let mut e = Engine::new(sift_store::open_model(&pack).unwrap(), &eo);
        let n_layer = e.config().n_layer;
        let cfg = SparsityConfig {
            method: Method::TopK,
            ratios: Ratios::uniform(Method::TopK, n_layer, 0.5).unwrap(),
            gamma: 0.2,
            cache_fraction: None,
            alpha: 0.4,
            core_magnitude: false,
        };
        e.set_selector(build_selector(&cfg, e.site_dims(), None).unwrap());
        let p = BalancePolicy::parse(policy).unwrap();
        e.attach_hybrid_emulated(&EngineHybrid { policy: p, group_size: Some(gs), gpu_bytes: budget }).unwrap();
        let c = e.config().clone();
        let header = TraceHeader {
            model: "smol.sift".into(),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            dims: [c.n_embd, c.n_embd_q(), c.n_embd, c.n_ff],
            selector: e.selector().describe(),
            n_ctx: 256,
            n_batch: 32,
            runtime_bytes: 0,
            measured_tok_s: 0.0,
        };
        let path = dir.path().join(format!("{policy}-{gs}.trace"));
        let w = TraceWriter::create(&path, &header).unwrap();
        let mut cpu = Engine::new(sift_store::open_model(&pack).unwrap(), &eo);
        cpu.set_selector(build_selector(&cfg, cpu.site_dims(), None).unwrap());
        cpu.set_tracer(Some(Box::new(w.clone())));
        for eng in [&mut e, &mut cpu] {
            let mut logits = eng.eval(&prompt, Logits::Last).unwrap().to_vec();
            for _ in 0..64 {
                let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
                logits = eng.eval(&[next], Logits::Last).unwrap().to_vec();
            }
        }
        cpu.set_tracer(None);
        w.finish().unwrap();
        let real = e.hybrid().unwrap().report();
        let trace = Trace::read(&path).unwrap();
        let act = sift_sim::hybrid_engine::ffn_sites(&trace);
        let run = EngineRun {
            policy: Some(p),
            gpu_bytes: budget,
            attention: AttentionPlacement::Cpu,
            n_ctx: 256,
            group_size: Some(gs),
        };
        let (sim, _) = simulate_engine(&act, model(), &gpu(), &zero_costs(), &run).unwrap();
        eprintln!(
            "{policy}: CPU share {:.3} engine / {:.3} simulated; loads per token {:.2} / {:.2}",
            real.cpu_share, sim.cpu_share, real.reloads_per_token, sim.reloads_per_token
        );
        assert!((real.cpu_share - sim.cpu_share).abs() <= 0.01, "{policy}: {real:?} vs {sim:?}");
        let loads = (real.reloads_per_token, sim.reloads_per_token);
        assert!((loads.0 - loads.1).abs() <= 0.08 * loads.0.max(1.0), "{policy}: loads per token {loads:?}");
        assert_eq!(loads.0 == 0.0, policy == "static", "{policy}: {loads:?}");
    }
}

/// Adjacent-layer prediction scored on hand-made records: a next layer that uses exactly the
/// channels this layer's FFN input ranks highest (its norms divided out and the next layer's
/// multiplied in) is predicted in full; one that uses the lowest-ranked ones, not at all; the
/// token before, using the same channels, predicts them all.
#[test]
fn adjacent_prediction_scores_what_the_next_layer_used() {
    use sift_sim::hybrid_engine::adjacent_prediction;
    use sift_sim::trace::{Event, LayerRecord, SiteRecord, Trace, TraceHeader};
    let m = model();
    let (n, n_layer) = (m.config.n_embd, m.config.n_layer);
    let site = |input: Vec<f32>, active: Option<Vec<u32>>| SiteRecord { input, active };
    // Layer l's FFN input: channel c scaled so that, after the norms, its magnitude is c + 1.
    let record = |top: bool| -> Vec<LayerRecord> {
        (0..n_layer)
            .map(|l| {
                let next = &m.layers[(l + 1).min(n_layer - 1)].ffn_norm;
                let input: Vec<f32> = (0..n).map(|c| (c as f32 + 1.0) * m.layers[l].ffn_norm[c] / next[c]).collect();
                let used: Vec<u32> = if top { (n as u32 / 2..n as u32).collect() } else { (0..n as u32 / 4).collect() };
                LayerRecord {
                    residual: vec![0.0; n],
                    sites: [
                        site(Vec::new(), None),
                        site(Vec::new(), None),
                        site(input, Some(used)),
                        site(Vec::new(), None),
                    ],
                }
            })
            .collect()
    };
    let header = TraceHeader {
        model: "smol.sift".into(),
        n_layer,
        n_embd: n,
        dims: [n, m.config.n_embd_q(), n, m.config.n_ff],
        selector: "test".into(),
        n_ctx: 256,
        n_batch: 32,
        runtime_bytes: 0,
        measured_tok_s: 0.0,
    };
    for (top, want) in [(true, 1.0), (false, 0.0)] {
        let events = vec![
            Event::Prompt(4),
            Event::Token { pos: 4, layers: record(top) },
            Event::Token { pos: 5, layers: record(top) },
        ];
        let p = adjacent_prediction(&Trace { header: header.clone(), events }, m, 16);
        assert_eq!(p.pairs, 2 * (n_layer - 1));
        assert_eq!((p.channel_recall, p.channel_precision), (want, want), "{p:?}");
        assert_eq!(p.previous_token_recall, 1.0, "{p:?}");
    }
}
