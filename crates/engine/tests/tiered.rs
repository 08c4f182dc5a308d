//! Running the real SmolLM2-135M from a pack under a memory budget: swapping changes speed, not
//! results. Tokens and logits with a tiny cache equal those with every column cached, for every
//! policy, preload mode and slow tier, and equal the in-memory column path; a budget too small to
//! run is refused up front; a pack truncated mid-run gives an error, not a wrong token.

use sift_engine::sparsity::{build_selector, Method, Ratios, SparsityConfig};
use sift_engine::{Engine, EngineOptions, EvalError, Logits};
use sift_model::tokenizer::Tokenizer;
use sift_store::cache::Policy;
use sift_store::io::TierKind;
use sift_store::tiered::{open_budgeted, PlanInputs, TieredOptions, TieredStore};
use sift_store::{pack_model, ColPolicy, OpKind, PackOptions};
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
            let dir = test_dir("engine-tiered");
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

/// An engine on `path` under a budget of (fixed needs + `cache` bytes).
fn budgeted(path: &Path, opts: &TieredOptions, cache: u64) -> Engine {
    budgeted_with(path, opts, cache, |_, _| {})
}

/// [`budgeted`], with the store set up by `prepare` before the engine takes it (as the session
/// pins the static policy's hot set).
fn budgeted_with(
    path: &Path,
    opts: &TieredOptions,
    cache: u64,
    prepare: impl FnOnce(&sift_model::Model, &mut TieredStore),
) -> Engine {
    let model = open_budgeted(path, opts).unwrap();
    let kv = Engine::kv_and_scratch_bytes(&model, &eo());
    let inputs = |budget| PlanInputs { budget, runtime: 0, kv_and_scratch: kv };
    let fixed = TieredStore::new(&model, path, opts, &inputs(u64::MAX / 4)).unwrap().plan.fixed();
    let mut store = TieredStore::new(&model, path, opts, &inputs(fixed + cache)).unwrap();
    prepare(&model, &mut store);
    let mut engine = Engine::new(model, &eo());
    engine.attach_store(store).unwrap();
    engine
}

/// Greedy decoding: the prompt's logits, then `n` tokens with each step's logits.
fn decode(engine: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    engine.truncate(0);
    let mut logits = vec![engine.eval(prompt, Logits::Last).unwrap().to_vec()];
    let mut out = Vec::new();
    for _ in 0..n {
        let last = logits.last().unwrap();
        let next = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        out.push(next);
        logits.push(engine.eval(&[next], Logits::Last).unwrap().to_vec());
    }
    (out, logits)
}

fn prompt() -> Vec<u32> {
    let model = sift_model::Model::load(root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    tok.encode("The history of the printing press begins in", true, false).unwrap()
}

#[test]
fn a_tiny_budget_gives_the_same_tokens_and_logits_as_an_unlimited_one() {
    let prompt = prompt();
    // Reference: the pack fully in memory (mmap), same selector, same column kernels.
    let mut mem = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    topk(&mut mem, 0.5);
    let (want_tokens, want_logits) = decode(&mut mem, &prompt, 12);
    let all = TieredOptions { policy: Policy::Lfu, preload: 4, ..TieredOptions::default() };
    let mut unlimited = budgeted(pack(), &all, 1 << 30);
    topk(&mut unlimited, 0.5);
    assert_eq!(decode(&mut unlimited, &prompt, 12), (want_tokens.clone(), want_logits.clone()));
    let s = unlimited.memory().unwrap();
    assert_eq!(s.plan().cache_fraction, 1.0);
    assert!(s.stats().hits > 0 && s.stats().hit_rate() > 0.5, "hit rate {}", s.stats().hit_rate());
    for (policy, preload) in [
        (Policy::Lfu, 4),
        (Policy::Lfu, 0),
        (Policy::Lru, 1),
        (Policy::Tam { lambda: 0.8, eps: 0.05 }, 4),
        (Policy::None, 4),
    ] {
        let opts = TieredOptions { policy, preload, ..TieredOptions::default() };
        // 1 MiB of cache: about 2% of the columns.
        let mut tiny = budgeted(pack(), &opts, 1 << 20);
        topk(&mut tiny, 0.5);
        let got = decode(&mut tiny, &prompt, 12);
        assert_eq!(got.0, want_tokens, "{policy:?} preload {preload}: tokens differ");
        assert!(got.1 == want_logits, "{policy:?} preload {preload}: logits differ");
        let store = tiny.memory().unwrap();
        assert!(store.plan().cache_fraction < 0.05);
        assert!(store.stats().bytes_ondemand > 0);
        if preload > 0 {
            assert!(store.stats().bytes_preload > 0, "{policy:?}: preloading read nothing");
            let p = store.stats().preload_precision();
            assert!(p > 0.0 && p <= 1.0, "precision {p}");
        }
        // The cache never holds more than its slots, and its slots fit the plan.
        let mut cached = 0u64;
        let cols = tiny.model.columns.as_ref().unwrap();
        for l in 0..tiny.config().n_layer {
            for op in OpKind::ALL {
                let (slots, used) = store.occupancy(l, op);
                assert!(used <= slots);
                cached += (slots * cols.layers[l].op(op).col_bytes) as u64;
            }
        }
        let plan = store.plan();
        assert!(cached <= plan.cache && plan.fixed() + plan.cache <= plan.budget);
    }
}

/// The real model packed with every site's units in a shuffled order of its own (seeded).
fn shuffled_pack() -> &'static Path {
    static PACK: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    &PACK
        .get_or_init(|| {
            let src = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
            let c = sift_model::Model::load(&src).unwrap().config;
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut shuffled = |n: usize| {
                let mut order: Vec<u32> = (0..n as u32).collect();
                for i in (1..n).rev() {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    order.swap(i, (state >> 33) as usize % (i + 1));
                }
                Some(order)
            };
            let unit_orders = (0..c.n_layer)
                .map(|_| [shuffled(c.n_embd), shuffled(c.n_embd_q()), shuffled(c.n_embd), shuffled(c.n_ff)])
                .collect();
            let dir = test_dir("engine-tiered");
            let out = dir.join("shuffled.sift");
            let opts = PackOptions { group: 4, unit_orders, ..PackOptions::default() };
            pack_model(&src, &out, &opts, |_| {}).unwrap();
            (dir, out)
        })
        .1
}

#[test]
fn a_pack_in_its_own_unit_order_gives_the_same_tokens_and_logits() {
    let prompt = prompt();
    let mut mem = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    topk(&mut mem, 0.5);
    let want = decode(&mut mem, &prompt, 8);
    // The columns lie elsewhere in the file, each unit's column is the same bytes.
    let (plain, shuffled) = (sift_store::open_model(pack()).unwrap(), sift_store::open_model(shuffled_pack()).unwrap());
    let (a, b) = (plain.columns.as_ref().unwrap(), shuffled.columns.as_ref().unwrap());
    let t = b.layers[3].op(OpKind::Down);
    assert!(b.layers[3].positions(OpKind::Down).is_some() && a.layers[3].positions(OpKind::Down).is_none());
    for u in [0u32, 1, 700, 1535] {
        let col = |m: &sift_model::Model, i: &sift_store::PackIndex| {
            let at = i.layers[3].column_offset(OpKind::Down, u) as usize;
            m.pack_bytes()[at..at + t.col_bytes].to_vec()
        };
        assert_eq!(col(&plain, a), col(&shuffled, b), "unit {u}");
    }
    assert_ne!(b.layers[3].column_offset(OpKind::Down, 0), a.layers[3].column_offset(OpKind::Down, 0));
    // In memory: one token on the active columns at their positions.
    let mut e = Engine::new(shuffled, &eo());
    topk(&mut e, 0.5);
    let got = decode(&mut e, &prompt, 8);
    assert!(got == want, "in memory: tokens {:?}, want {:?} (or logits differ)", got.0, want.0);
    // Under a budget: reads at the positions, with and without preloading.
    for preload in [0, 4] {
        let opts = TieredOptions { policy: Policy::Lfu, preload, ..TieredOptions::default() };
        let mut tiny = budgeted(shuffled_pack(), &opts, 1 << 20);
        topk(&mut tiny, 0.5);
        let got = decode(&mut tiny, &prompt, 8);
        assert!(got == want, "budgeted, preload {preload}: tokens {:?}, want {:?} (or logits differ)", got.0, want.0);
    }
    // A batch on whole column tensors (`--all-columns`) reads every column at its position.
    let all = EngineOptions { all_columns: true, ..eo() };
    let logits = |path: &Path| {
        let mut e = Engine::new(sift_store::open_model(path).unwrap(), &all);
        e.truncate(0);
        e.eval(&prompt, Logits::All).unwrap().to_vec()
    };
    assert!(logits(shuffled_pack()) == logits(pack()), "--all-columns logits differ");
}

#[test]
fn a_damaged_or_invalid_unit_order_is_refused() {
    let bytes = std::fs::read(shuffled_pack()).unwrap();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let (toc_off, toc_len) = (word(16), word(24));
    let toc: serde_json::Value = serde_json::from_slice(&bytes[toc_off..toc_off + toc_len]).unwrap();
    let order = &toc["orders"][5];
    let off = order["offset"].as_u64().unwrap() as usize;
    // One unit's entry changed: the section fails its checksum, in memory and under a budget.
    let mut bad = bytes.clone();
    bad[off + 8] ^= 1;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad-order.sift");
    std::fs::write(&path, &bad).unwrap();
    for err in [
        sift_store::open_model(&path).err().map(|e| e.to_string()),
        open_budgeted(&path, &TieredOptions::default()).err().map(|e| e.to_string()),
    ] {
        let err = err.expect("a damaged unit order is refused");
        let want = format!("layer {} site {} unit order fails its checksum", order["layer"], order["site"]);
        assert!(err.contains(&want) && err.contains("sift pack"), "{err}");
    }
    // An order that is not a permutation is refused before anything is written.
    let src = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let c = sift_model::Model::load(&src).unwrap().config;
    let mut unit_orders: sift_store::UnitOrders = vec![Default::default(); c.n_layer];
    unit_orders[2][3] = Some((0..c.n_ff as u32).map(|u| u.min(5)).collect());
    let out = dir.path().join("never.sift");
    let err = pack_model(&src, &out, &PackOptions { unit_orders, ..PackOptions::default() }, |_| {}).unwrap_err();
    assert!(err.to_string().contains("layer 2 site 3 unit order: unit 5 appears twice"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("never."))
        .collect();
    assert!(!out.exists() && left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_site_streamed_in_parts_gives_the_same_tokens() {
    let prompt = prompt();
    let whole = TieredOptions { policy: Policy::Lfu, preload: 0, ..TieredOptions::default() };
    let mut reference = budgeted(pack(), &whole, 1 << 20);
    topk(&mut reference, 0.5);
    let (want_tokens, want_logits) = decode(&mut reference, &prompt, 12);
    assert_eq!(reference.memory().unwrap().stats().partial_fetches, 0, "the default buffers hold a whole site");
    // 64 KiB buffers: a token's missing columns come in several parts (added up), a prompt's
    // rows in chunks of one op (disjoint outputs).
    let parts = TieredOptions { stream_buf: 64 << 10, ..whole };
    let mut streamed = budgeted(pack(), &parts, 1 << 20);
    topk(&mut streamed, 0.5);
    let (tokens, logits) = decode(&mut streamed, &prompt, 12);
    assert!(streamed.memory().unwrap().stats().partial_fetches > 0, "no site was split");
    // Parts are cut at the kernels' pieces and rows chunks are disjoint: the same bits.
    assert_eq!(tokens, want_tokens);
    assert!(logits == want_logits, "logits differ");
    let plan = &streamed.memory().unwrap().plan();
    assert!(plan.buffers < reference.memory().unwrap().plan().buffers);
}

#[test]
fn every_slow_tier_gives_the_same_results() {
    let prompt = prompt();
    let mut runs = Vec::new();
    for tier in [TierKind::Auto, TierKind::Pread, TierKind::Memory] {
        let opts = TieredOptions { tier, preload: 4, ..TieredOptions::default() };
        let mut e = budgeted(pack(), &opts, 2 << 20);
        topk(&mut e, 0.3);
        runs.push((e.memory().unwrap().settings().io, decode(&mut e, &prompt, 6)));
    }
    assert!(["io_uring", "pread"].contains(&runs[0].0), "auto picked {}", runs[0].0);
    assert_eq!(runs[1].0, "pread");
    assert_eq!(runs[2].0, "memory");
    assert!(runs.windows(2).all(|w| w[0].1 == w[1].1), "tiers disagree");
}

#[test]
fn the_dense_selector_runs_through_the_store_too() {
    // No selector: every column of every op is active and comes through the cache.
    let prompt = prompt();
    let opts = TieredOptions::default();
    let mut tiny = budgeted(pack(), &opts, 1 << 20);
    let mut big = budgeted(pack(), &opts, 1 << 30);
    assert_eq!(decode(&mut tiny, &prompt, 4), decode(&mut big, &prompt, 4));
    // Prompt batches read each layer's rows (exact GGUF weights): the prompt's logits equal the
    // in-memory GGUF engine's bit for bit.
    let mut mem = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    mem.truncate(0);
    tiny.truncate(0);
    let want = mem.eval(&prompt, Logits::Last).unwrap().to_vec();
    assert!(tiny.eval(&prompt, Logits::Last).unwrap() == &want[..]);
}

#[test]
fn a_budget_too_small_is_refused_with_what_it_needs() {
    let opts = TieredOptions::default();
    let model = open_budgeted(pack(), &opts).unwrap();
    let inputs =
        PlanInputs { budget: 8 << 20, runtime: 0, kv_and_scratch: Engine::kv_and_scratch_bytes(&model, &eo()) };
    let err = TieredStore::new(&model, pack(), &opts, &inputs).err().expect("8 MiB cannot run").to_string();
    assert!(err.contains("too small") && err.contains("resident weights") && err.contains("raise --memory"), "{err}");
    // A GGUF is not enough: the budget streams the pack's columns.
    let gguf = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let err = open_budgeted(&gguf, &opts).err().expect("a GGUF is refused").to_string();
    assert!(err.contains("sift pack"), "{err}");
}

#[test]
fn a_pack_truncated_mid_run_is_an_error_not_a_wrong_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.sift");
    std::fs::copy(pack(), &path).unwrap();
    let opts = TieredOptions { policy: Policy::None, preload: 0, ..TieredOptions::default() };
    let mut e = budgeted(&path, &opts, 0);
    topk(&mut e, 0.5);
    let prompt = prompt();
    e.eval(&prompt, Logits::Last).unwrap();
    e.eval(&[42], Logits::Last).unwrap();
    let n_past = e.n_past();
    // Cut the file after its header: every column is gone.
    let cut = 4096;
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(cut).unwrap();
    let err = e.eval(&[43], Logits::Last).expect_err("reading cut columns must fail");
    assert!(matches!(err, EvalError::Store(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("reading weights") && msg.contains("cut.sift"), "{msg}");
    assert_eq!(e.n_past(), n_past, "a failed token leaves the context as it was");
}

#[test]
fn static_pins_its_hot_set_and_never_changes_it() {
    let prompt = prompt();
    let mut mem = Engine::new(sift_store::open_model(pack()).unwrap(), &eo());
    topk(&mut mem, 0.5);
    let want = decode(&mut mem, &prompt, 8);
    let opts = TieredOptions { policy: Policy::Static, preload: 0, ..TieredOptions::default() };
    let mut pinned = Vec::new();
    let mut e = budgeted_with(pack(), &opts, 4 << 20, |model, store| {
        for l in 0..model.config.n_layer {
            for op in OpKind::ALL {
                // A hot set ranked from the last channel down (any ranking will do).
                let n_in = model.columns.as_ref().unwrap().layers[l].op(op).n_in as u32;
                let ranking: Vec<u32> = (0..n_in).rev().collect();
                store.set_hot(l, op, &ranking).unwrap();
                let (slots, used) = store.occupancy(l, op);
                let cached = store.cached_units(l, op);
                assert_eq!(used, slots, "the hot set fills every slot");
                let mut top: Vec<u32> = ranking[..slots].to_vec();
                top.sort_unstable();
                assert_eq!(cached, top, "layer {l} {op:?}: the top of the ranking is pinned");
                pinned.push(cached);
            }
        }
    });
    topk(&mut e, 0.5);
    let n_layer = e.config().n_layer;
    assert_eq!(decode(&mut e, &prompt, 8), want, "a pinned cache changes no result");
    let store = e.memory().unwrap();
    assert!(store.stats().hits > 0 && store.stats().misses > 0);
    let after: Vec<Vec<u32>> = (0..n_layer).flat_map(|l| OpKind::ALL.map(|op| store.cached_units(l, op))).collect();
    assert_eq!(after, pinned, "static never admits or evicts");
}

/// The cached units shown to a selector, per call: (layer, site, units).
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(usize, sift_engine::sparsity::Site, Vec<u32>)>>>;

/// Wraps a selector, asks for the cache state and records what the engine showed it.
struct CacheWatcher {
    inner: Box<dyn sift_engine::sparsity::Selector>,
    seen: Seen,
}

impl sift_engine::sparsity::Selector for CacheWatcher {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn wants_cache_state(&self) -> bool {
        true
    }
    fn observe_cache(&mut self, layer: usize, site: sift_engine::sparsity::Site, cached: &[bool]) {
        let units = (0..cached.len() as u32).filter(|&u| cached[u as usize]).collect();
        self.seen.lock().unwrap().push((layer, site, units));
        self.inner.observe_cache(layer, site, cached);
    }
    fn select(
        &mut self,
        layer: usize,
        site: sift_engine::sparsity::Site,
        phase: sift_engine::sparsity::Phase,
        x: &[f32],
        active: &mut Vec<u32>,
    ) -> sift_engine::sparsity::Selection {
        self.inner.select(layer, site, phase, x, active)
    }
}

#[test]
fn dip_ca_reweights_by_the_live_cache() {
    use sift_engine::sparsity::Site;
    let prompt = prompt();
    let opts = TieredOptions { preload: 0, ..TieredOptions::default() };
    let mut e = budgeted(pack(), &opts, 8 << 20);
    let n_layer = e.config().n_layer;
    let cfg = SparsityConfig {
        method: Method::DipCa,
        ratios: Ratios::uniform(Method::DipCa, n_layer, 0.5).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    let inner = build_selector(&cfg, e.site_dims(), None).unwrap();
    assert!(inner.wants_cache_state(), "DIP-CA asks for the cache state");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    e.set_selector(Box::new(CacheWatcher { inner, seen: seen.clone() }));
    decode(&mut e, &prompt, 4);
    // One more token: what the selector was shown at each layer is the cache as it stood when
    // the token started (a layer's cache changes only at its own fetches, after the selection).
    let store = e.memory().unwrap();
    let before: Vec<[Vec<u32>; 2]> =
        (0..n_layer).map(|l| [store.cached_units(l, OpKind::Gate), store.cached_units(l, OpKind::Down)]).collect();
    seen.lock().unwrap().clear();
    e.eval(&[42], Logits::Last).unwrap();
    let views = seen.clone();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4 * n_layer, "one cache view per site and layer");
    for (l, site, units) in seen.iter() {
        match site {
            Site::FfnIn => assert_eq!(units, &before[*l][0], "layer {l} gate/up"),
            Site::FfnMid => assert_eq!(units, &before[*l][1], "layer {l} down"),
            _ => {}
        }
    }
    assert!(seen.iter().any(|(_, _, u)| !u.is_empty()), "the cache is not empty after 5 tokens");
    drop(seen);
    // A prompt batch too: every row sees the store's cache, so DIP-CA under a budget never
    // consults its stand-in cache.
    views.lock().unwrap().clear();
    e.eval(&[42, 43, 44], Logits::Last).unwrap();
    assert_eq!(views.lock().unwrap().len(), 3 * 4 * n_layer, "one cache view per row, site and layer");
}

#[test]
fn a_budget_change_mid_generation_keeps_the_text_and_returns_the_memory() {
    let prompt = prompt();
    let opts = TieredOptions::default();
    let mut steady = budgeted(pack(), &opts, 8 << 20);
    topk(&mut steady, 0.5);
    let (want_tokens, want_logits) = decode(&mut steady, &prompt, 18);

    let mut e = budgeted(pack(), &opts, 8 << 20);
    topk(&mut e, 0.5);
    let fixed = e.memory().unwrap().plan().fixed();
    let transient = |e: &Engine| {
        let s = e.memory().unwrap();
        s.arena_bytes() as u64 - s.plan().cache
    };
    let handle = e.budget_handle();
    e.truncate(0);
    let mut logits = vec![e.eval(&prompt, Logits::Last).unwrap().to_vec()];
    let mut tokens = Vec::new();
    for i in 0..18 {
        match i {
            // Shrink to 1 MiB of cache through the library call.
            6 => {
                let before = e.memory().unwrap().arena_bytes();
                let plan = e.set_memory_budget(fixed + (1 << 20)).unwrap();
                assert!(plan.cache <= 1 << 20 && plan.budget == fixed + (1 << 20));
                let s = e.memory().unwrap();
                assert!(s.arena_bytes() < before, "the arena shrank");
                assert!(s.arena_bytes() as u64 <= plan.cache + transient(&e) + 64);
                for l in 0..e.config().n_layer {
                    for op in OpKind::ALL {
                        let (slots, used) = s.occupancy(l, op);
                        assert!(used <= slots);
                    }
                }
            }
            // Grow to 16 MiB from another thread: applied before the next token.
            12 => {
                let h = handle.clone();
                std::thread::spawn(move || h.request(fixed + (16 << 20))).join().unwrap();
            }
            _ => {}
        }
        let last = logits.last().unwrap();
        let next = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        tokens.push(next);
        logits.push(e.eval(&[next], Logits::Last).unwrap().to_vec());
    }
    assert_eq!(tokens, want_tokens, "a budget change must not change the text");
    assert_eq!(logits, want_logits, "nor a single logit");
    let log = e.take_budget_log();
    assert_eq!(log.len(), 1, "the handle's request was applied once");
    let plan = log[0].result.as_ref().unwrap();
    assert_eq!(plan.budget, fixed + (16 << 20));
    assert!(plan.cache > 8 << 20 && plan.cache <= 16 << 20);
    // A budget below the fixed part is refused and changes nothing.
    let err = e.set_memory_budget(fixed / 2).unwrap_err().to_string();
    assert!(err.contains("too small"), "{err}");
    assert_eq!(e.memory().unwrap().plan().budget, fixed + (16 << 20));
}

/// A selection bug that panics once, inside the `panic_at` layer of the first prompt batch (the
/// server catches such panics per request, resets the KV cache and goes on).
struct PanicsOnce {
    inner: Box<dyn sift_engine::sparsity::Selector>,
    panic_at: Option<usize>,
}

impl sift_engine::sparsity::Selector for PanicsOnce {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn select(
        &mut self,
        layer: usize,
        site: sift_engine::sparsity::Site,
        phase: sift_engine::sparsity::Phase,
        x: &[f32],
        active: &mut Vec<u32>,
    ) -> sift_engine::sparsity::Selection {
        if self.panic_at == Some(layer) && phase == sift_engine::sparsity::Phase::Prompt {
            self.panic_at = None;
            panic!("injected selection bug");
        }
        self.inner.select(layer, site, phase, x, active)
    }
}

#[test]
fn a_panic_inside_a_prompt_batch_leaves_the_store_usable() {
    // Before the weight-source interface, the engine held the store's prefill buffer while a
    // prompt layer ran: a panic there lost it, and every later prompt panicked too.
    let prompt = prompt();
    let opts = TieredOptions { policy: Policy::Lfu, preload: 4, ..TieredOptions::default() };
    let mut fresh = budgeted(pack(), &opts, 1 << 20);
    topk(&mut fresh, 0.5);
    let want = decode(&mut fresh, &prompt, 4);
    let mut e = budgeted(pack(), &opts, 1 << 20);
    let n_layer = e.config().n_layer;
    let cfg = SparsityConfig {
        method: Method::TopK,
        ratios: Ratios::uniform(Method::TopK, n_layer, 0.5).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    };
    let inner = build_selector(&cfg, e.site_dims(), None).unwrap();
    e.set_selector(Box::new(PanicsOnce { inner, panic_at: Some(5) }));
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = e.eval(&prompt, Logits::Last);
    }));
    std::panic::set_hook(hook);
    assert!(ran.is_err(), "the injected bug must panic");
    // What the server does after a panic: forget the sequence, run the next request.
    e.truncate(0);
    assert_eq!(decode(&mut e, &prompt, 4), want, "after a panic the store must give the same results");
}

/// A folder of this test binary's own under cargo's target/tmp, re-used by every run: a pack kept
/// for the whole binary in a static is never dropped, so a temporary folder would be left behind.
fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// FastForward's sparse prefill under a budget: the same neurons (random masks: seeded per block
/// and layer) computed from rows streamed through the store and the chosen down columns read
/// through its cache give, bit for bit, what the pack in memory gives (the same kernels on the
/// same bytes), with a whole cache and with 16 MiB (the KV cache of 300 positions takes 11 of them); and
/// the middle block is sparse.
#[test]
fn sparse_prefill_under_a_budget_equals_sparse_prefill_in_memory() {
    use sift_engine::prefill::PrefillMasks;
    let model = sift_model::Model::load(root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    let text = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap()[..300].to_vec();
    let opts = |sparsity: f32| EngineOptions {
        n_threads: 2,
        n_ctx: 512,
        n_batch: 512,
        prefill_sparsity: sparsity,
        prefill_masks: PrefillMasks::Random,
        ..EngineOptions::default()
    };
    let mut mem = Engine::new(sift_store::open_model(pack()).unwrap(), &opts(0.5));
    let want = mem.eval(&ids, Logits::Last).unwrap().to_vec();
    assert_eq!(mem.sparsity_stats().prefill_neurons[1], (128 * 30 * 1536) as u64, "one sparse block");
    let budgeted_with = |cache: u64, sparsity: f32| {
        let t = TieredOptions { policy: Policy::Lfu, preload: 0, ..TieredOptions::default() };
        let model = open_budgeted(pack(), &t).unwrap();
        let kv = Engine::kv_and_scratch_bytes(&model, &opts(sparsity));
        let inputs = |budget| PlanInputs { budget, runtime: 0, kv_and_scratch: kv };
        let fixed = TieredStore::new(&model, pack(), &t, &inputs(u64::MAX / 4)).unwrap().plan.fixed();
        let store = TieredStore::new(&model, pack(), &t, &inputs(fixed + cache)).unwrap();
        let mut e = Engine::new(model, &opts(sparsity));
        e.attach_store(store).unwrap();
        e
    };
    for cache in [1u64 << 30, 16 << 20] {
        let mut e = budgeted_with(cache, 0.5);
        let got = e.eval(&ids, Logits::Last).unwrap().to_vec();
        assert!(got == want, "cache {cache}: the budgeted sparse prefill differs");
        let st = e.sparsity_stats().prefill_neurons;
        assert_eq!(st[0] * 2, st[1], "cache {cache}: half the neurons of the sparse block");
        assert!(e.memory().unwrap().stats().bytes_ondemand > 0, "cache {cache}: columns read for down");
    }
    // And sparse prefill changed the result: the dense prefill under the same budget differs.
    let mut dense = budgeted_with(1 << 30, 0.0);
    let d = dense.eval(&ids, Logits::Last).unwrap().to_vec();
    let max = d.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max > 1e-3, "sparse prefill under a budget gave the dense logits");
    // The sparse block's working memory is counted in the budget's fixed needs.
    let m = open_budgeted(pack(), &TieredOptions::default()).unwrap();
    assert!(Engine::kv_and_scratch_bytes(&m, &opts(0.5)) > Engine::kv_and_scratch_bytes(&m, &opts(0.0)));
}
