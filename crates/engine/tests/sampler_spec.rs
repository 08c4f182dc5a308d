//! The sampler against its specification, not against earlier code: llama.cpp's default chain
//! (penalties → top-k → top-p → min-p → temperature → draw), each stage as llama.cpp's
//! `llama_sampler_*_apply` defines it, written out here independently of `sift_engine::sampling`:
//!
//! - top-k keeps the k largest logits;
//! - top-p takes the softmax of what is left (temperature 1), sorts it, and keeps the shortest
//!   prefix whose cumulative probability reaches p (at least one token);
//! - min-p keeps the tokens whose probability is at least `min_p` times the largest's (on the
//!   logits: `l ≥ l_max + ln min_p`);
//! - temperature divides what is left by T, and the draw follows its softmax.
//!
//! Seeded draws (40,000 per case) must follow the specified distribution: every token's count
//! within 5 standard deviations of `N·p` (and none of a token the spec drops). A sampler that
//! truncated in another order, at another temperature, or drew from another distribution fails.

use sift_engine::{Sampler, SamplerOptions};

const DRAWS: usize = 40_000;

/// Distinct logits (no ties: a tie's order is not part of the spec).
const LOGITS: [f32; 8] = [2.0, 0.5, 3.1, -1.0, 2.6, 1.3, 0.0, -2.2];

/// llama.cpp's chain without penalties, as a distribution over the vocabulary.
fn spec(logits: &[f32], temp: f32, top_k: usize, top_p: f32, min_p: f32) -> Vec<f64> {
    let mut cand: Vec<(usize, f64)> = logits.iter().map(|&l| l as f64).enumerate().collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1));
    if top_k > 0 {
        cand.truncate(top_k);
    }
    if top_p < 1.0 {
        let max = cand[0].1;
        let z: f64 = cand.iter().map(|c| (c.1 - max).exp()).sum();
        let mut cum = 0.0;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            cum += (c.1 - max).exp() / z;
            if cum >= top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    if min_p > 0.0 {
        let floor = cand[0].1 + (min_p as f64).ln();
        cand.retain(|c| c.1 >= floor);
    }
    let t = temp as f64;
    let max = cand[0].1 / t;
    let z: f64 = cand.iter().map(|c| (c.1 / t - max).exp()).sum();
    let mut p = vec![0.0; logits.len()];
    for (i, l) in cand {
        p[i] = (l / t - max).exp() / z;
    }
    p
}

/// How often each token is drawn in `DRAWS` draws.
fn counts(opts: SamplerOptions) -> Vec<usize> {
    let mut s = Sampler::new(opts);
    let mut c = vec![0usize; LOGITS.len()];
    for _ in 0..DRAWS {
        c[s.sample(&LOGITS) as usize] += 1;
    }
    c
}

fn check(temp: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) {
    let want = spec(&LOGITS, temp, top_k, top_p, min_p);
    let got = counts(SamplerOptions {
        temp,
        top_k,
        top_p,
        min_p,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: Some(seed),
        ..SamplerOptions::default()
    });
    let n = DRAWS as f64;
    for (i, (&p, &c)) in want.iter().zip(&got).enumerate() {
        let what = format!("temp {temp}, top-k {top_k}, top-p {top_p}, min-p {min_p}: token {i} (logit {})", LOGITS[i]);
        if p == 0.0 {
            assert_eq!(c, 0, "{what}: dropped by the spec, drawn {c} times ({got:?} against {want:?})");
            continue;
        }
        let sd = (n * p * (1.0 - p)).sqrt().max(1.0);
        assert!(
            (c as f64 - n * p).abs() <= 5.0 * sd,
            "{what}: drawn {c} times, the spec expects {:.0} ± {:.0} ({got:?} against {want:?})",
            n * p,
            sd
        );
    }
}

/// No truncation: the draws follow softmax(logits / T) at every temperature.
#[test]
fn draws_follow_the_softmax_at_the_temperature() {
    for (i, temp) in [0.5, 1.0, 1.7].into_iter().enumerate() {
        check(temp, 0, 1.0, 0.0, 100 + i as u64);
    }
}

/// Top-k keeps the k largest, whatever the temperature.
#[test]
fn top_k_keeps_the_k_largest() {
    check(1.0, 3, 1.0, 0.0, 7);
    check(2.5, 5, 1.0, 0.0, 8);
}

/// Top-p on the temperature-1 probabilities of what top-k left: the shortest prefix reaching p.
#[test]
fn top_p_keeps_the_shortest_prefix_reaching_p() {
    // At temperature 1 the sorted probabilities are 0.445, 0.270, 0.148, 0.074, 0.033, ...
    // (cumulative 0.445, 0.715, 0.864, 0.937, 0.970): 0.8 keeps three, 0.5 two, 0.3 one, 0.95
    // five.
    for (i, p) in [0.8f32, 0.5, 0.3, 0.95].into_iter().enumerate() {
        check(1.0, 0, p, 0.0, 20 + i as u64);
    }
    // A high temperature after top-p does not bring the dropped tokens back.
    check(3.0, 0, 0.8, 0.0, 30);
    // After top-k, top-p renormalizes over the k kept.
    check(1.0, 4, 0.7, 0.0, 31);
}

/// Min-p relative to the most likely token, before the temperature.
#[test]
fn min_p_keeps_tokens_within_a_share_of_the_best() {
    for (i, m) in [0.05f32, 0.2, 0.5].into_iter().enumerate() {
        check(1.0, 0, 1.0, m, 40 + i as u64);
    }
    check(4.0, 0, 1.0, 0.2, 50);
}

/// llama.cpp's defaults together (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8).
#[test]
fn the_default_chain_follows_the_spec() {
    let d = SamplerOptions::default();
    check(d.temp, d.top_k, d.top_p, d.min_p, 60);
    check(1.3, 6, 0.9, 0.1, 61);
}
