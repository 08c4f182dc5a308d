//! KAIROX's hybrid decode (`sift_engine::hybrid`) on the real SmolLM2-135M pack and WikiText-2,
//! without a GPU: the column pools emulated in host memory (`GpuColumns::emulated`, the scalar
//! reference the CUDA kernel is tested against in tests/gpu.rs). For every policy, a prompt and
//! 24 teacher-forced decode steps give the CPU's logits up to the Q8_0 copies of the columns,
//! twice (the second sequence starts from the first one's groups); the GPU's share is real, and
//! every policy but static moves groups.

use sift_engine::balancer::BalancePolicy;
use sift_engine::hybrid::HybridOptions;
use sift_engine::sparsity::{build_selector, Method, Ratios, SparsityConfig};
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::tokenizer::Tokenizer;
use sift_sparsity::{Phase, Selection, Selector, Site};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn opts() -> EngineOptions {
    EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 64, ..EngineOptions::default() }
}

fn topk_half(e: &mut Engine) {
    let cfg = SparsityConfig {
        method: Method::TopK,
        ratios: Ratios::uniform(Method::TopK, e.config().n_layer, 0.5).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    e.set_selector(build_selector(&cfg, e.site_dims(), None).unwrap());
}

fn decode_logits(e: &mut Engine, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    e.truncate(0);
    e.eval(prompt, Logits::Last).unwrap();
    forced.iter().map(|&t| e.eval(&[t], Logits::Last).unwrap().to_vec()).collect()
}

/// Greedy agreement and mean |Δlogit| over the logits' spread (per step, averaged).
fn compare(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f64, f64) {
    let top = |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    let agree = got.iter().zip(want).filter(|(g, w)| top(g) == top(w)).count() as f64 / want.len() as f64;
    let mut rel = 0.0;
    for (g, w) in got.iter().zip(want) {
        let mean = w.iter().map(|&v| v as f64).sum::<f64>() / w.len() as f64;
        let spread = (w.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
        rel += g.iter().zip(w).map(|(a, b)| (a - b).abs() as f64).sum::<f64>() / w.len() as f64 / spread;
    }
    (agree, rel / want.len() as f64)
}

/// Every other input unit of every site, whatever the values: a selection that small numeric
/// differences cannot change, so the hybrid split is checked without Top-K's cascades.
struct EveryOther;

impl Selector for EveryOther {
    fn describe(&self) -> String {
        "every other unit".into()
    }
    fn select(&mut self, _: usize, _: Site, _: Phase, row: &[f32], active: &mut Vec<u32>) -> Selection {
        active.clear();
        active.extend((0..row.len() as u32).filter(|j| j % 2 == 0));
        Selection::Subset
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    pack: PathBuf,
    gguf: PathBuf,
    prompt: Vec<u32>,
    forced: Vec<u32>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("smol.sift");
    let gguf = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    sift_store::pack_model(&gguf, &pack, &sift_store::PackOptions::default(), |_| {}).unwrap();
    let model = sift_model::Model::load(&gguf).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    Setup { _dir: dir, pack, gguf, prompt: ids[..40].to_vec(), forced: ids[40..64].to_vec() }
}

fn hybrid(s: &Setup, policy: &str, select: fn(&mut Engine)) -> Engine {
    let mut e = Engine::new(sift_store::open_model(&s.pack).unwrap(), &opts());
    select(&mut e);
    // 16-unit groups, half of the FFN columns' Q8_0 bytes (84.6 MB in all).
    let o = HybridOptions { policy: BalancePolicy::parse(policy).unwrap(), group_size: Some(16), gpu_bytes: 42 << 20 };
    e.attach_hybrid_emulated(&o).unwrap();
    e
}

fn every_other(e: &mut Engine) {
    e.set_selector(Box::new(EveryOther));
}

#[test]
fn emulated_hybrid_decode_gives_the_cpu_logits_for_every_policy() {
    let s = setup();
    let mut cpu = Engine::new(sift_store::open_model(&s.pack).unwrap(), &opts());
    every_other(&mut cpu);
    let want = decode_logits(&mut cpu, &s.prompt, &s.forced);
    for name in BalancePolicy::NAMES {
        let mut e = hybrid(&s, name, every_other);
        // Twice: the second sequence starts from the first one's groups.
        for round in 0..2 {
            let got = decode_logits(&mut e, &s.prompt, &s.forced);
            let (agree, rel) = compare(&got, &want);
            let r = e.hybrid().unwrap().report();
            eprintln!(
                "{name} round {round}: greedy agree {:.1} %, mean |Δlogit| {:.2} % of the spread; CPU share {:.1} %, {:.2} loads/token",
                agree * 100.0,
                rel * 100.0,
                r.cpu_share * 100.0,
                r.reloads_per_token
            );
            assert!(agree >= 0.95, "{name}: greedy choices agree at {agree}");
            assert!(rel <= 0.02, "{name}: mean |Δlogit| {rel} of the spread");
            assert!(r.cpu_share < 0.8, "{name}: the GPU's share is {:.1} % only", 100.0 * (1.0 - r.cpu_share));
            // The breakdown of a token's time adds up to the tokens' mean, and the CPU's share
            // (half the units or more) takes part of it.
            let parts = r.queue_ms
                + r.cpu_ffn_ms
                + r.gpu_wait_ms
                + r.cpu_attention_ms
                + r.head_ms
                + r.gpu_attention_ms
                + r.other_ms;
            assert!(r.cpu_ffn_ms > 0.0 && r.other_ms > 0.0, "{name}: breakdown {r:?}");
            // Attention and the head ran on the CPU (nothing placed them on the GPU) and took time.
            assert!(!r.attention_on_gpu && !r.head_on_gpu && r.gpu_attention_ms == 0.0, "{name}: {r:?}");
            assert!(r.cpu_attention_ms > 0.0 && r.head_ms > 0.0, "{name}: breakdown {r:?}");
            // Every token asks both FFN sites of every layer; the CPU computed some units' columns.
            let n_layer = e.model.config.n_layer as f64;
            assert_eq!(r.sites_per_token, 2.0 * n_layer, "{name}: site products per token");
            assert!(r.gpu_products_per_token > 0.0 && r.gpu_products_per_token <= r.sites_per_token, "{name}: {r:?}");
            assert!(r.cpu_values_per_token > 0.0, "{name}: {r:?}");
            // Policies that move groups spend time issuing the loads; static and eager's
            // first-token ones aside, the others none.
            assert_eq!(r.load_ms > 0.0, r.reloads_per_token > 0.0, "{name}: {r:?}");
            assert!(
                parts >= r.p50_ms * 0.5 && parts <= r.p99_ms * 1.01,
                "{name}: parts {parts} ms against p50 {} / p99 {}",
                r.p50_ms,
                r.p99_ms
            );
        }
    }
}

/// Under Top-K, a small difference in a product can change a later layer's selection, and the
/// changes cascade: the CPU's own two kernel paths (masked dense kernels on 8-bit activations,
/// and the pack's columns) differ by about half the logits' spread over 24 steps. The hybrid
/// path stays within 1.5x that difference of the columns; LRU and TAM move groups (the
/// activity of 16-unit groups under Top-K 0.5 is not saturated).
#[test]
fn emulated_hybrid_topk_stays_within_the_cpu_kernels_own_spread() {
    let s = setup();
    let mut cpu = Engine::new(sift_store::open_model(&s.pack).unwrap(), &opts());
    topk_half(&mut cpu);
    let want = decode_logits(&mut cpu, &s.prompt, &s.forced);
    let mut dense = Engine::new(sift_model::Model::load(&s.gguf).unwrap(), &opts());
    topk_half(&mut dense);
    let (_, own) = compare(&decode_logits(&mut dense, &s.prompt, &s.forced), &want);
    for name in ["lru", "tam-adaptive"] {
        let mut e = hybrid(&s, name, topk_half);
        let (agree, rel) = compare(&decode_logits(&mut e, &s.prompt, &s.forced), &want);
        let r = e.hybrid().unwrap().report();
        eprintln!(
            "topk {name}: greedy agree {:.1} %, mean |Δlogit| {:.1} % of the spread (CPU kernels among themselves {:.1} %); {:.2} loads/token",
            agree * 100.0,
            rel * 100.0,
            own * 100.0,
            r.reloads_per_token
        );
        assert!(rel <= 1.5 * own + 0.02, "{name}: {rel} vs the CPU's own {own}");
        assert!(r.reloads_per_token > 0.0, "{name}: no loads while decoding");
    }
}

/// A budget with no room for a group: every unit on the CPU through the pack's columns, as the
/// plain engine computes them — the same logits to the bit, nothing queued for the GPU.
#[test]
fn emulated_hybrid_without_slots_is_the_cpu_path() {
    let s = setup();
    let mut cpu = Engine::new(sift_store::open_model(&s.pack).unwrap(), &opts());
    topk_half(&mut cpu);
    let want = decode_logits(&mut cpu, &s.prompt, &s.forced);
    for name in ["static", "tam-adaptive"] {
        let mut e = Engine::new(sift_store::open_model(&s.pack).unwrap(), &opts());
        topk_half(&mut e);
        let o = HybridOptions { policy: BalancePolicy::parse(name).unwrap(), group_size: Some(16), gpu_bytes: 0 };
        e.attach_hybrid_emulated(&o).unwrap();
        let got = decode_logits(&mut e, &s.prompt, &s.forced);
        assert_eq!(got, want, "{name}: logits differ from the CPU's");
        let r = e.hybrid().unwrap().report();
        assert_eq!((r.cpu_share, r.gpu_products_per_token, r.queue_ms), (1.0, 0.0, 0.0), "{name}: {r:?}");
        assert!(r.cpu_ffn_ms > 0.0 && r.cpu_values_per_token > 0.0, "{name}: {r:?}");
    }
}
