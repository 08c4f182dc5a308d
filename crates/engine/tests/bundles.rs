//! The gate-first FFN (`--sparsity cats`) on a pack's neuron bundles, on the real SmolLM2-135M:
//! against the same method on the GGUF's rows and the down columns (the same model packed
//! without bundles), at ratio 0 against dense, and a damaged bundle section refused.
//!
//! The bundles compute the chosen neurons' up rows with the rows' own dot kernel and their down
//! columns with the exact column kernel in groups of 128 neurons fixed by index (`sift_quant::
//! bundles`, whose tests check those products against f64 sums); the pack without bundles groups
//! the down columns by list position. The roundings differ, and a token's neurons are chosen by
//! rank on values those roundings feed (later layers), so the two paths' logits drift apart
//! within a few tokens (measured: by up to ~1 of a max |logit| of 15 after three tokens, each
//! path as far from masked dense kernels); what must agree is the quality: perplexity on real
//! text within 3 % (measured below 1 %).

use sift_engine::perplexity::{perplexity, Scored};
use sift_engine::sparsity::{build_selector, Method, Ratios, SparsityConfig};
use sift_engine::{Engine, EngineOptions, Logits};
use sift_model::tokenizer::Tokenizer;
use sift_store::{open_model, pack_model, PackError, PackOptions};
use std::path::{Path, PathBuf};

const PROMPT: &str = "The tower is 324 metres (1,063 ft) tall, about the same height as an 81-storey building.";

fn gguf() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

/// Packs of the model with and without bundles, in `dir`.
fn packs(dir: &Path) -> (PathBuf, PathBuf) {
    let (with, without) = (dir.join("b.sift"), dir.join("nb.sift"));
    pack_model(&gguf(), &with, &PackOptions { bundles: true, ..PackOptions::default() }, |_| {}).unwrap();
    pack_model(&gguf(), &without, &PackOptions::default(), |_| {}).unwrap();
    (with, without)
}

/// The logits of three decoded tokens after the prompt, on `pack` with cats at `ratio`
/// (`None`: dense).
fn decode(pack: &Path, ratio: Option<f64>) -> Vec<Vec<f32>> {
    let model = open_model(pack).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    let opts = EngineOptions { n_threads: 2, n_ctx: 256, n_batch: 256, column_kernels: true, ..Default::default() };
    let mut e = Engine::new(model, &opts);
    if let Some(r) = ratio {
        let dims = e.site_dims();
        e.set_selector(build_selector(&cats(dims.n_layer, r), dims, None).unwrap());
    }
    let ids = tok.encode(PROMPT, true, false).unwrap();
    e.eval(&ids, Logits::Last).unwrap();
    [504u32, 3575, 282].iter().map(|&t| e.eval(&[t], Logits::Last).unwrap().to_vec()).collect()
}

fn cats(n_layer: usize, ratio: f64) -> SparsityConfig {
    SparsityConfig {
        method: Method::Cats,
        ratios: Ratios::uniform(Method::Cats, n_layer, ratio).unwrap(),
        gamma: 0.2,
        cache_fraction: None,
        alpha: 0.4,
        core_magnitude: false,
    }
}

/// Perplexity of WikiText-2's first 16 KiB (eight windows of 256, llama-perplexity's split) with
/// cats at `ratio` on `pack`, every product through the pack (`--all-columns`: the bundles token
/// by token where the pack has them).
fn perplexity_on(pack: &Path, ratio: f64) -> f64 {
    let model = open_model(pack).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let ids = tok.encode(&text, true, false).unwrap();
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: 256,
        n_batch: 256,
        column_kernels: true,
        all_columns: true,
        ..Default::default()
    };
    let mut e = Engine::new(model, &opts);
    let dims = e.site_dims();
    e.set_selector(build_selector(&cats(dims.n_layer, ratio), dims, None).unwrap());
    perplexity(&mut e, &ids, 256, Scored::SecondHalf, Some(8), None, |_, _| {}).unwrap().ppl
}

#[test]
fn bundles_give_the_rows_and_columns_quality() {
    let dir = tempfile::tempdir().unwrap();
    let (with, without) = packs(dir.path());
    let model = open_model(&with).unwrap();
    let index = model.columns.as_ref().unwrap();
    assert_eq!(index.layers.len(), model.config.n_layer);
    assert!(index.layers.iter().all(|l| l.bundle_layout().is_some()), "every layer of the pack has its bundles");
    let no = open_model(&without).unwrap();
    assert!(no.columns.as_ref().unwrap().layers.iter().all(|l| l.bundles.is_none()));
    drop((model, no));
    // A different path (other roundings): not the same logits, the same quality.
    let (b, nb) = (decode(&with, Some(0.5)), decode(&without, Some(0.5)));
    assert_ne!(b, nb, "the bundles' products are computed, not the columns'");
    for ratio in [0.3, 0.5] {
        let (b, nb) = (perplexity_on(&with, ratio), perplexity_on(&without, ratio));
        eprintln!("cats {ratio}: perplexity {b:.3} on bundles, {nb:.3} on rows and columns");
        assert!((b / nb - 1.0).abs() < 0.03, "cats {ratio}: perplexity {b} on bundles against {nb}");
    }
}

#[test]
fn cats_at_ratio_zero_on_bundles_is_dense_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (with, _) = packs(dir.path());
    let bits = |v: Vec<Vec<f32>>| v.concat().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(decode(&with, Some(0.0))), bits(decode(&with, None)));
}

#[test]
fn a_damaged_bundle_section_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (with, _) = packs(dir.path());
    let model = open_model(&with).unwrap();
    let b = model.columns.as_ref().unwrap().layers[3].bundles.clone().unwrap();
    drop(model);
    let mut bytes = std::fs::read(&with).unwrap();
    bytes[b.offset as usize + 1000] ^= 0x40;
    let bad = dir.path().join("bad.sift");
    std::fs::write(&bad, &bytes).unwrap();
    match open_model(&bad) {
        Err(e @ PackError::Corrupt { .. }) => {
            assert!(e.to_string().contains("layer 3 neuron bundles"), "{e}")
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a damaged bundle section opened"),
    }
}
