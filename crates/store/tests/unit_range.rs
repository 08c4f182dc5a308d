//! Unit ids out of range reach the tiered store as errors, not panics: a hot ranking naming a
//! column the tensor does not have (a calibration from another model, a damaged file) and a
//! fetch of such a column, on the real SmolLM2-135M packed, under every cache policy. The store
//! stays usable afterwards.

use sift_store::cache::Policy;
use sift_store::tiered::{open_budgeted, CacheSplit, PlanInputs, TierError, TieredOptions, TieredStore};
use sift_store::{pack_model, ColPolicy, OpKind, PackOptions};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The real model packed once per test binary (groups of 4 layers, like `sift pack`).
fn pack() -> &'static Path {
    static PACK: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    &PACK
        .get_or_init(|| {
            let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
            assert!(src.exists(), "{} missing: run scripts/fetch-model.sh first", src.display());
            let dir = test_dir("store-unit-range");
            let out = dir.join("smol.sift");
            pack_model(&src, &out, &PackOptions { cols: ColPolicy::Auto, group: 4, ..PackOptions::default() }, |_| {})
                .unwrap();
            (dir, out)
        })
        .1
}

/// A store on the pack with room for some columns of every op (the same fraction of each)
/// beyond its fixed needs.
fn store(policy: Policy) -> (TieredStore, sift_model::Model) {
    let opts = TieredOptions { policy, preload: 0, split: CacheSplit::Uniform, ..TieredOptions::default() };
    let model = open_budgeted(pack(), &opts).unwrap();
    let inputs = |budget| PlanInputs { budget, runtime: 0, kv_and_scratch: 0 };
    let fixed = TieredStore::new(&model, pack(), &opts, &inputs(u64::MAX / 4)).unwrap().plan.fixed();
    let store = TieredStore::new(&model, pack(), &opts, &inputs(fixed + (8 << 20))).unwrap();
    (store, model)
}

fn assert_out_of_range<T>(r: Result<T, TierError>, unit: u32, n_units: usize) {
    let msg = r.err().expect("an out-of-range unit must be refused").to_string();
    assert!(msg.contains(&format!("unit {unit} is out of range")), "{msg}");
    assert!(msg.contains(&format!("{n_units} units")), "{msg}");
}

const POLICIES: [Policy; 6] =
    [Policy::Lfu, Policy::Lru, Policy::TAM_DEFAULT, Policy::Static, Policy::None, Policy::Belady];

#[test]
fn fetching_a_unit_out_of_range_is_an_error() {
    for policy in POLICIES {
        let (mut st, model) = store(policy);
        let cols = model.columns.as_ref().unwrap();
        for (layer, op) in [(0, OpKind::Down), (3, OpKind::O)] {
            let n = cols.layers[layer].op(op).n_in;
            let bad = n as u32;
            assert_out_of_range(st.fetch(layer, &[op], &[0, 5, bad], 1), bad, n);
            assert_out_of_range(st.fetch(layer, &[op], &[u32::MAX - 1], 1), u32::MAX - 1, n);
            // The store still serves valid requests, with what the failed ones left untouched.
            let fetched = st.fetch(layer, &[op], &[0, 5, bad - 1], 1).unwrap();
            let (_, idx, _) = fetched.op(0);
            assert_eq!(idx.len(), 3, "{policy}: one kernel index per active unit");
        }
    }
}

#[test]
fn a_hot_ranking_naming_a_unit_out_of_range_is_an_error() {
    for policy in POLICIES {
        let (mut st, model) = store(policy);
        let n = model.columns.as_ref().unwrap().layers[2].op(OpKind::Gate).n_in;
        let (slots, _) = st.occupancy(2, OpKind::Gate);
        assert!(policy == Policy::None || (0 < slots && slots < n), "{policy}: {slots} slots of {n}");
        // Every unit ranked, hottest last, then one the tensor does not have: refused whatever
        // the policy and however far down the ranking it is.
        let mut ranking: Vec<u32> = (0..n as u32).rev().collect();
        ranking.push(n as u32 + 7);
        let before = st.cached_units(2, OpKind::Gate);
        assert_out_of_range(st.set_hot(2, OpKind::Gate, &[u32::MAX - 1, 0, 1]), u32::MAX - 1, n);
        assert_out_of_range(st.set_hot(2, OpKind::Gate, &ranking), n as u32 + 7, n);
        assert_eq!(st.cached_units(2, OpKind::Gate), before, "{policy}: a refused ranking pins nothing");
        // The valid ranking is still taken.
        ranking.pop();
        st.set_hot(2, OpKind::Gate, &ranking).unwrap();
        let mut top = ranking[..slots].to_vec();
        top.sort_unstable();
        assert_eq!(st.cached_units(2, OpKind::Gate), top, "{policy}");
    }
}

/// A folder of this test binary's own under cargo's target/tmp, re-used by every run: a pack kept
/// for the whole binary in a static is never dropped, so a temporary folder would be left behind.
fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
