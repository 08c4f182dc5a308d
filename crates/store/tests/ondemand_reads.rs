//! The on-demand reads of the tiered store against plain per-unit reads: for random miss sets
//! (random active units of random sites, cache budgets from none to a few MiB, so fetches come
//! in prefixes and parts, merged into large reads across gaps), every column a fetch hands the
//! kernels holds exactly the pack file's bytes of that unit's column. Real SmolLM2-135M, packed.

use proptest::prelude::*;
use sift_model::layout::SITE_OPS;
use sift_store::cache::Policy;
use sift_store::tiered::{open_budgeted, CacheSplit, PlanInputs, TieredOptions, TieredStore};
use sift_store::{pack_model, ColPolicy, PackOptions};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The real model packed once per test binary, and the pack's bytes.
fn pack() -> &'static (PathBuf, PathBuf, Vec<u8>) {
    static PACK: OnceLock<(PathBuf, PathBuf, Vec<u8>)> = OnceLock::new();
    PACK.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(src.exists(), "{} missing: run scripts/fetch-model.sh first", src.display());
        let dir = test_dir("store-ondemand");
        let out = dir.join("smol.sift");
        pack_model(&src, &out, &PackOptions { cols: ColPolicy::Auto, group: 4, ..PackOptions::default() }, |_| {})
            .unwrap();
        let bytes = std::fs::read(&out).unwrap();
        (dir, out, bytes)
    })
}

fn path() -> &'static Path {
    &pack().1
}

/// A store with `cache` bytes beyond its fixed needs.
fn store(policy: Policy, cache: u64) -> (TieredStore, sift_model::Model) {
    let opts = TieredOptions { policy, preload: 0, split: CacheSplit::Uniform, ..TieredOptions::default() };
    let model = open_budgeted(path(), &opts).unwrap();
    let inputs = |budget| PlanInputs { budget, runtime: 0, kv_and_scratch: 0 };
    let fixed = TieredStore::new(&model, path(), &opts, &inputs(u64::MAX / 4)).unwrap().plan.fixed();
    let store = TieredStore::new(&model, path(), &opts, &inputs(fixed + cache)).unwrap();
    (store, model)
}

/// xorshift, for the active sets.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_fetched_column_is_the_files_bytes(
        seed in 1u64..u64::MAX,
        density in 0.02f64..1.0,
        cache_kib in prop_oneof![Just(0u64), 1u64..6144],
        policy in prop_oneof![Just(Policy::Lfu), Just(Policy::Lru), Just(Policy::TAM_DEFAULT)],
        steps in 1usize..6,
    ) {
        let (mut st, model) = store(policy, cache_kib << 10);
        let index = model.columns.clone().unwrap();
        let file = &pack().2;
        let mut rng = Rng(seed);
        for _ in 0..steps {
            let l = (rng.next() % index.layers.len() as u64) as usize;
            let ops = SITE_OPS[(rng.next() % 4) as usize];
            let n = index.layers[l].op(ops[0]).n_in;
            let active: Vec<u32> =
                (0..n as u32).filter(|_| (rng.next() % 10_000) as f64 / 10_000.0 < density).collect();
            let mut done = 0;
            while done < active.len() {
                let rest = &active[done..];
                let f = st.fetch(l, ops, rest, 64).unwrap();
                prop_assert!(f.taken > 0 && f.taken <= rest.len());
                let units = &rest[..f.taken];
                for (k, &op) in ops.iter().enumerate() {
                    let (arena, idx, _) = f.op(k);
                    prop_assert_eq!(idx.len(), units.len());
                    let cb = index.layers[l].op(op).col_bytes;
                    for (&u, &i) in units.iter().zip(idx) {
                        let at = index.layers[l].column_offset(op, u) as usize;
                        let got = &arena[i as usize * cb..(i as usize + 1) * cb];
                        prop_assert!(got == &file[at..at + cb], "layer {} {:?} unit {}: wrong bytes", l, op, u);
                    }
                }
                done += f.taken;
            }
        }
    }
}

/// A folder of this test binary's own under cargo's target/tmp, re-used by every run: a pack kept
/// for the whole binary in a static is never dropped, so a temporary folder would be left behind.
fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
