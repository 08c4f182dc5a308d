//! Four-token dot kernels ([`WeightType::dot4_fn_for`]) against the single-row ones.
//!
//! - Bit identity: for every weight type and every instruction set this CPU runs
//!   ([`Isa::available`]), `dot4(n, w, [a0, a1, a2, a3])[k]` has exactly the bits of
//!   `dot(n, w, ak)` from [`WeightType::dot_fn_for`] with the same ISA (and the dispatching
//!   [`WeightType::dot4_fn`] those of [`WeightType::dot_fn`]). The engine relies on this: a batch
//!   of tokens must give the numbers that token-by-token evaluation gives. Checked on rows of every
//!   length class (1 to 7 blocks and longer rows, so every tail length of the 4-block loops),
//!   unaligned, from quantized random data and from random raw block bytes (every quant bit
//!   pattern), with the four activation rows distinct or repeated.
//! - Against the scalar reference, within the tolerances of `tests/legacy.rs` (non-K formats:
//!   `≤ 10⁻⁴·Σ|w·a|`) and `tests/kquants.rs` (K-quants: `≤ 10⁻⁴·max(|ref|, 10⁻²·Σ|w·a|)`), where
//!   `Σ|w·a|` sums the magnitudes of the products of dequantized weights and activations.
//! - Real tensors: rows of every 2-D tensor of SmolLM2-135M-Instruct.Q4_1 (Q4_1, Q8_0) and
//!   qwen2.5-coder-0.5b-instruct-q4_k_m (Q5_0, Q8_0, Q4_K, Q6_K) in `models/`, both checks
//!   (skipped with a message when a file is absent).
//! - The multi-row form ([`WeightType::dot4_rows_fn_for`]): bit-identical to the single-row kernel
//!   for every row and token, for 0, 1, 3, 16 and 17 rows, with and without padding between rows.
//! - Short rows panic instead of being read out of bounds.

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sift_quant::{scalar, ActType, Isa, WeightType};

const ALL: [WeightType; 10] = [
    WeightType::F32,
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q8_0,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
];

/// Row lengths in blocks: every remainder mod 4 several times over, and real row lengths.
fn block_counts(t: WeightType) -> Vec<usize> {
    if t.block_size() == 256 {
        vec![1, 2, 3, 4, 5, 6, 7, 19]
    } else if t.block_size() == 32 {
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 18, 48, 152]
    } else {
        vec![1, 7, 31, 32, 33, 100, 576]
    }
}

fn is_k(t: WeightType) -> bool {
    t.block_size() == 256
}

/// A random row with a per-row scale and a few outliers.
fn random_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let scale = 10f32.powf(rng.random_range(-2.0..1.0));
    let mut x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect();
    for _ in 0..n / 64 + 1 {
        let i = rng.random_range(0..n);
        x[i] *= rng.random_range(2.0f32..20.0);
    }
    x
}

fn quantize_act(t: ActType, x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; t.row_bytes(x.len())];
    t.quantize(x, &mut a);
    a
}

/// Random raw weight blocks with finite, positive scales (quants: every bit pattern).
fn random_block_bytes(rng: &mut StdRng, t: WeightType, nb: usize) -> Vec<u8> {
    let bb = t.block_bytes();
    let mut w: Vec<u8> = (0..nb * bb).map(|_| rng.random()).collect();
    for b in w.chunks_exact_mut(bb) {
        let mut f16r = || f16::from_f32(rng.random_range(1e-4f32..1e-1)).to_le_bytes();
        match t {
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => b[0..2].copy_from_slice(&f16r()),
            WeightType::Q4_1 | WeightType::Q4_K | WeightType::Q5_K => {
                b[0..2].copy_from_slice(&f16r());
                b[2..4].copy_from_slice(&f16r());
            }
            WeightType::Q6_K => b[bb - 2..].copy_from_slice(&f16r()),
            _ => unreachable!("float formats get quantized rows"),
        }
    }
    w
}

/// Random Q8_K blocks, optionally with only the extreme quants −128 and 127.
fn random_q8k(rng: &mut StdRng, nb: usize, extreme: bool) -> Vec<u8> {
    let mut a = vec![0u8; nb * ActType::Q8_K.block_bytes()];
    for b in a.chunks_exact_mut(ActType::Q8_K.block_bytes()) {
        b[..4].copy_from_slice(&rng.random_range(1e-3f32..1.0).to_le_bytes());
        for q in &mut b[4..260] {
            *q = if extreme { [0x80u8, 127][rng.random_range(0..2)] } else { rng.random() };
        }
        for j in 0..16 {
            let s: i32 = b[4 + 16 * j..4 + 16 * j + 16].iter().map(|&q| q as i8 as i32).sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
    a
}

/// Dequantized activation row (the activation formats have no public dequantizer).
fn dequantize_act(t: ActType, a: &[u8], n: usize) -> Vec<f32> {
    let f16_at = |b: &[u8], off: usize| f16::from_le_bytes([b[off], b[off + 1]]).to_f32();
    match t {
        ActType::F32 => a.chunks_exact(4).take(n).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        ActType::Q8_0 | ActType::Q8_1 => {
            let (bb, qoff) = if t == ActType::Q8_0 { (34, 2) } else { (36, 4) };
            let mut out = Vec::with_capacity(n);
            for b in a.chunks_exact(bb).take(n / 32) {
                let d = f16_at(b, 0);
                out.extend(b[qoff..qoff + 32].iter().map(|&q| q as i8 as f32 * d));
            }
            out
        }
        ActType::Q8_K => {
            let mut out = Vec::with_capacity(n);
            for b in a.chunks_exact(292).take(n / 256) {
                let d = f32::from_le_bytes(b[..4].try_into().unwrap());
                out.extend(b[4..260].iter().map(|&q| q as i8 as f32 * d));
            }
            out
        }
    }
}

/// Copies `b` to offset `off` of a fresh buffer (kernels must not depend on alignment).
fn misaligned(b: &[u8], off: usize) -> Vec<u8> {
    let mut v = vec![0xA5u8; b.len() + off];
    v[off..].copy_from_slice(b);
    v
}

/// Checks one weight row against four activation rows: bit identity of every ISA's dot4 with the
/// same ISA's dot, and closeness of every ISA's dot4 to the scalar dot.
fn check(t: WeightType, n: usize, w: &[u8], acts: [&[u8]; 4], what: &str) {
    let wd = {
        let mut v = vec![0f32; n];
        t.dequantize_row(w, &mut v);
        v
    };
    let scalar_dot = t.dot_fn_for(Isa::Scalar).unwrap();
    let mut tol = [0f64; 4];
    let mut want = [0f32; 4];
    for k in 0..4 {
        let ad = dequantize_act(t.act_type(), acts[k], n);
        let abs: f64 = wd.iter().zip(&ad).map(|(&w, &a)| (w as f64 * a as f64).abs()).sum();
        want[k] = scalar_dot(n, w, acts[k]);
        tol[k] = if is_k(t) { 1e-4 * (want[k].abs() as f64).max(1e-2 * abs) } else { 1e-4 * abs };
    }
    for isa in Isa::available() {
        let dot = t.dot_fn_for(isa).unwrap();
        let dot4 = t.dot4_fn_for(isa).unwrap_or_else(|| panic!("{} has a dot but no dot4 for {isa:?}", t.name()));
        let got = dot4(n, w, acts);
        for k in 0..4 {
            let single = dot(n, w, acts[k]);
            assert_eq!(
                got[k].to_bits(),
                single.to_bits(),
                "{} {isa:?} {what}, n={n}, token {k}: dot4 {} vs dot {single}",
                t.name(),
                got[k]
            );
            assert!(
                (got[k] as f64 - want[k] as f64).abs() <= tol[k],
                "{} {isa:?} {what}, n={n}, token {k}: dot4 {} vs scalar {} (tol {})",
                t.name(),
                got[k],
                want[k],
                tol[k]
            );
        }
    }
    // The dispatching pair.
    let got = t.dot4_fn()(n, w, acts);
    for k in 0..4 {
        assert_eq!(got[k].to_bits(), t.dot_fn()(n, w, acts[k]).to_bits(), "{} dispatch {what}, token {k}", t.name());
    }
}

/// Checks [`WeightType::dot4_rows_fn_for`] on `rows` weight rows `row_bytes` apart against the
/// single-row kernel of the same ISA, bit for bit.
fn check_rows(t: WeightType, n: usize, w: &[u8], row_bytes: usize, rows: usize, acts: [&[u8]; 4], what: &str) {
    for isa in Isa::available() {
        let dot = t.dot_fn_for(isa).unwrap();
        let f =
            t.dot4_rows_fn_for(isa).unwrap_or_else(|| panic!("{} has a dot but no dot4_rows for {isa:?}", t.name()));
        let mut out = vec![[f32::NAN; 4]; rows];
        f(n, w, row_bytes, acts, &mut out);
        for (r, o) in out.iter().enumerate() {
            for k in 0..4 {
                let single = dot(n, &w[r * row_bytes..], acts[k]);
                assert_eq!(
                    o[k].to_bits(),
                    single.to_bits(),
                    "{} {isa:?} {what}, n={n}, row {r} of {rows}, token {k}: dot4_rows {} vs dot {single}",
                    t.name(),
                    o[k]
                );
            }
        }
    }
}

#[test]
fn dot4_rows_matches_dot() {
    let mut rng = StdRng::seed_from_u64(0x5eed_d077);
    for t in ALL {
        for nb in block_counts(t) {
            let n = nb * t.block_size();
            let rb = t.row_bytes(n).unwrap();
            for (rows, pad) in [(0, 0), (1, 0), (3, 5), (17, 0), (16, 64)] {
                let row_bytes = rb + pad;
                let mut w = vec![0u8; rows * row_bytes + 3];
                for r in 0..rows {
                    let row = if t.block_size() > 1 && r % 3 == 2 {
                        random_block_bytes(&mut rng, t, nb)
                    } else {
                        scalar::quantize_row(t, &random_row(&mut rng, n))
                    };
                    w[3 + r * row_bytes..3 + r * row_bytes + rb].copy_from_slice(&row);
                }
                let acts: Vec<Vec<u8>> = (0..4)
                    .map(|k| {
                        let a = quantize_act(t.act_type(), &random_row(&mut rng, n));
                        misaligned(&a, k + 1)
                    })
                    .collect();
                let a = [&acts[0][1..], &acts[1][2..], &acts[2][3..], &acts[3][4..]];
                check_rows(t, n, &w[3..], row_bytes, rows, a, &format!("{rows} rows, stride +{pad}"));
            }
        }
    }
}

#[test]
fn every_isa_with_a_dot_has_a_dot4() {
    for t in ALL {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni] {
            assert_eq!(t.dot_fn_for(isa).is_some(), t.dot4_fn_for(isa).is_some(), "{} {isa:?}", t.name());
            assert_eq!(t.dot_fn_for(isa).is_some(), t.dot4_rows_fn_for(isa).is_some(), "{} {isa:?}", t.name());
        }
    }
    println!("ISAs on this CPU: {:?}", Isa::available());
}

#[test]
fn dot4_matches_dot_on_quantized_random_rows() {
    let mut rng = StdRng::seed_from_u64(0x5eed_d074);
    for t in ALL {
        for nb in block_counts(t) {
            let n = nb * t.block_size();
            for rep in 0..3 {
                let w = scalar::quantize_row(t, &random_row(&mut rng, n));
                let acts: Vec<Vec<u8>> = (0..4).map(|_| quantize_act(t.act_type(), &random_row(&mut rng, n))).collect();
                // Odd offsets, different per row.
                let wm = misaligned(&w, 1 + rep);
                let am: Vec<Vec<u8>> = acts.iter().enumerate().map(|(k, a)| misaligned(a, 3 + k)).collect();
                let ar = [&am[0][3..], &am[1][4..], &am[2][5..], &am[3][6..]];
                check(t, n, &wm[1 + rep..], ar, &format!("random rows rep {rep}"));
                // The same activation row more than once.
                check(t, n, &w, [&acts[0], &acts[1], &acts[0], &acts[0]], "repeated rows");
            }
        }
    }
}

#[test]
fn dot4_matches_dot_on_random_block_bytes() {
    let mut rng = StdRng::seed_from_u64(0x5eed_d075);
    for t in ALL.into_iter().filter(|t| t.block_size() > 1) {
        for nb in block_counts(t) {
            let n = nb * t.block_size();
            for rep in 0..4 {
                let w = random_block_bytes(&mut rng, t, nb);
                let acts: Vec<Vec<u8>> = (0..4)
                    .map(|k| {
                        if is_k(t) {
                            random_q8k(&mut rng, nb, rep == 3 && k % 2 == 0)
                        } else {
                            quantize_act(t.act_type(), &random_row(&mut rng, n))
                        }
                    })
                    .collect();
                check(t, n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]], &format!("random bytes rep {rep}"));
            }
        }
    }
}

#[test]
fn dot4_short_rows_panic() {
    for t in ALL {
        let n = 4 * t.block_size();
        let w = vec![0u8; t.row_bytes(n).unwrap()];
        let a = vec![0u8; t.act_type().row_bytes(n)];
        let short_a = &a[..a.len() - 1];
        for isa in Isa::available() {
            let dot4 = t.dot4_fn_for(isa).unwrap();
            for k in 0..4 {
                let mut acts = [&a[..]; 4];
                acts[k] = short_a;
                let r = std::panic::catch_unwind(|| dot4(n, &w, acts));
                assert!(r.is_err(), "{} {isa:?}: short activation row {k} accepted", t.name());
            }
            let r = std::panic::catch_unwind(|| dot4(n, &w[..w.len() - 1], [&a[..]; 4]));
            assert!(r.is_err(), "{} {isa:?}: short weight row accepted", t.name());
            if t.block_size() > 1 {
                let r = std::panic::catch_unwind(|| dot4(n - 1, &w, [&a[..]; 4]));
                assert!(r.is_err(), "{} {isa:?}: partial block accepted", t.name());
            }
        }
    }
}

/// Rows of every 2-D tensor of a model file against four quantized random activation rows.
fn check_model(file_name: &str, expect: &[WeightType]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file_name);
    assert!(path.exists(), "{} missing: run scripts/fetch-model.sh (and qwen2.5-0.5b) first", path.display());
    let file = sift_gguf::GgufFile::open(&path).expect("open model");
    let mut rng = StdRng::seed_from_u64(0x5eed_d076);
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for info in &file.gguf.tensors {
        let Some(t) = WeightType::from_ggml_id(info.ty.id()) else { continue };
        if info.dims.len() < 2 {
            continue;
        }
        let n = info.dims[0] as usize;
        let rb = t.row_bytes(n).unwrap();
        let data = file.tensor_bytes(&info.name).unwrap();
        let rows = data.len() / rb;
        let acts: Vec<Vec<u8>> = (0..4).map(|_| quantize_act(t.act_type(), &random_row(&mut rng, n))).collect();
        for r in [0, rows / 3, rows / 2 + 1, rows - 1] {
            let w = &data[r * rb..(r + 1) * rb];
            check(t, n, w, [&acts[0], &acts[1], &acts[2], &acts[3]], &format!("{} row {r}", info.name));
        }
        let r0 = rows / 2;
        let chunk = (rows - r0).min(16);
        let a = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
        check_rows(t, n, &data[r0 * rb..], rb, chunk, a, &format!("{} rows {r0}..", info.name));
        *seen.entry(t.name()).or_default() += 1;
    }
    println!("checked tensors of {file_name}: {seen:?}");
    for t in expect {
        assert!(seen.contains_key(t.name()), "expected {} tensors in {file_name}, saw {seen:?}", t.name());
    }
}

#[test]
fn dot4_matches_dot_on_smollm2_tensors() {
    check_model("SmolLM2-135M-Instruct.Q4_1.gguf", &[WeightType::Q4_1, WeightType::Q8_0]);
}

#[test]
fn dot4_matches_dot_on_qwen_tensors() {
    check_model(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        &[WeightType::Q5_0, WeightType::Q8_0, WeightType::Q4_K, WeightType::Q6_K],
    );
}
