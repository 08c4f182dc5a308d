//! Neuron bundles ([`sift_quant::bundles`]): the layout against the GGUF's tensors, and the
//! bundle kernels three ways.
//!
//! - Layout: every record's gate and up rows are the source rows byte for byte, its down column
//!   the exact column [`ExactFormat::transpose`] makes, and the padding zero.
//! - Rows: [`Bundles::rows`] with a dot kernel equals that kernel on the GGUF's row bit for bit;
//!   every ISA's kernel this CPU runs against the scalar one (`≤ 10⁻⁴ · Σ|w·x|`) and against an
//!   f64 dot of the dequantized row with the unquantized input (`≤ 2·10⁻² · Σ|w·x|`, the
//!   activation's 8-bit rounding).
//! - Down: every ISA's exact kernel through [`Bundles::down`] gives the scalar reference's result
//!   bit for bit (the 8-bit-coefficient numerics are the same on every CPU), and the scalar result
//!   is within the coefficients' rounding of an f64 sum over the dequantized down rows: per
//!   output `|err| ≤ Σ_i |w_i|·s_g(i)/2 · 1.01 + 10⁻⁵·Σ_i |coef_i·w_i|`, `s_g = max|coef| / 127`
//!   over the neuron's group; all neurons (the dense FFN's down product) and a few.
//! - Union: several tokens' neurons computed together ([`Bundles::down_tokens`], and
//!   [`Bundles::down`] over the union with zero coefficients) give each token what it gets alone,
//!   bit for bit.
//! - A token's FFN by lanes ([`Bundles::ffn_lane`]): gate (from the rows through the activation,
//!   or given) times up, then per lane the down product of the lane's groups, bit for bit;
//!   [`add_lanes`] adds the lanes in order.
//! - Bad input: wrong buffer sizes, float rows, a neuron past `n_ff` or a list out of order are
//!   refused with a message.

use sift_quant::bundles::{add_lanes, BundleError, BundleLayout, BundleRow, Bundles, Gate, BUNDLE_GROUP, BUNDLE_LANES};
use sift_quant::exact_q8::{axpy_exact_q8_scalar, axpy_exact_tokens_fn};
use sift_quant::{axpy_exact_fn, scalar, ExactFormat, Isa, WeightType};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A random `rows × cols` tensor in `ty`: its GGUF bytes and its dequantized values.
fn tensor(ty: WeightType, rows: usize, cols: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    for r in 0..rows {
        let scale = 0.02 + (r % 5) as f32 * 0.2;
        let off = if r % 4 == 1 { 0.3 } else { 0.0 };
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * scale + off).collect();
        bytes.extend(scalar::quantize_row(ty, &x));
    }
    let rb = bytes.len() / rows;
    let mut dense = vec![0f32; rows * cols];
    for r in 0..rows {
        ty.dequantize_row(&bytes[r * rb..(r + 1) * rb], &mut dense[r * cols..(r + 1) * cols]);
    }
    (bytes, dense)
}

struct Ffn {
    layout: BundleLayout,
    gate: (Vec<u8>, Vec<f32>),
    up: (Vec<u8>, Vec<f32>),
    /// `n_embd` rows of `n_ff`.
    down: (Vec<u8>, Vec<f32>),
    records: Vec<u8>,
    scales: Vec<u8>,
}

impl Ffn {
    fn new(gate: WeightType, up: WeightType, down: ExactFormat, n_embd: usize, n_ff: usize, seed: u64) -> Ffn {
        let layout = BundleLayout::new(gate, up, down, n_embd, n_ff).unwrap();
        let mut rng = Rng(seed);
        let g = tensor(gate, n_ff, n_embd, &mut rng);
        let u = tensor(up, n_ff, n_embd, &mut rng);
        let d = tensor(down.src, n_embd, n_ff, &mut rng);
        let (records, scales) = layout.build(&g.0, &u.0, &d.0).unwrap();
        Ffn { layout, gate: g, up: u, down: d, records, scales }
    }

    fn bundles(&self) -> Bundles<'_> {
        Bundles::new(self.layout, &self.records, &self.scales).unwrap()
    }
}

/// The FFNs tested: the type mixes of the models sift runs (Q4_K_M's Q4_K gate/up with Q6_K or
/// Q4_K down, SmolLM2's Q4_1, Q5_0 / Q8_0) and a wide down layout.
fn ffns() -> Vec<Ffn> {
    use WeightType::*;
    let (e, f) = (256, 768);
    vec![
        Ffn::new(Q4_K, Q4_K, ExactFormat::of(Q6_K).unwrap(), e, f, 1),
        Ffn::new(Q4_K, Q4_K, ExactFormat::of(Q4_K).unwrap(), e, f, 2),
        Ffn::new(Q4_K, Q4_K, ExactFormat::wide(Q6_K).unwrap(), e, f, 3),
        Ffn::new(Q4_1, Q4_1, ExactFormat::of(Q4_1).unwrap(), e, f, 4),
        Ffn::new(Q5_0, Q5_0, ExactFormat::of(Q8_0).unwrap(), e, f, 5),
    ]
}

#[test]
fn records_hold_the_gguf_rows_and_exact_columns() {
    for ffn in ffns() {
        let l = ffn.layout;
        let (cols, scales) = l.down.transpose(&ffn.down.0, l.n_embd, l.n_ff);
        assert_eq!(scales, ffn.scales, "the down scale plane is the exact layout's");
        let b = ffn.bundles();
        let (gb, ub, cb, rb) =
            (l.row_bytes(BundleRow::Gate), l.row_bytes(BundleRow::Up), l.down_bytes(), l.record_bytes());
        assert_eq!(rb % 64, 0);
        for i in 0..l.n_ff {
            assert_eq!(b.row(BundleRow::Gate, i), &ffn.gate.0[i * gb..(i + 1) * gb], "gate row {i}");
            assert_eq!(b.row(BundleRow::Up, i), &ffn.up.0[i * ub..(i + 1) * ub], "up row {i}");
            let rec = &ffn.records[i * rb..(i + 1) * rb];
            assert_eq!(&rec[l.down_offset()..l.down_offset() + cb], &cols[i * cb..(i + 1) * cb], "down column {i}");
            assert!(rec[l.down_offset() + cb..].iter().all(|&v| v == 0), "padding of record {i}");
        }
    }
}

#[test]
fn rows_are_the_dot_kernels_on_the_gguf_rows() {
    let mut rng = Rng(11);
    for ffn in ffns() {
        let l = ffn.layout;
        let b = ffn.bundles();
        let x: Vec<f32> = (0..l.n_embd).map(|_| rng.f()).collect();
        let neurons: Vec<u32> = (0..l.n_ff as u32).filter(|i| i % 3 != 1).collect();
        for (which, ty, (bytes, dense)) in [(BundleRow::Gate, l.gate, &ffn.gate), (BundleRow::Up, l.up, &ffn.up)] {
            let mut act = vec![0u8; ty.act_type().row_bytes(l.n_embd)];
            ty.act_type().quantize(&x, &mut act);
            let rb = bytes.len() / l.n_ff;
            let scalar_dot = ty.dot_fn_for(Isa::Scalar).unwrap();
            let mut want = vec![0f32; neurons.len()];
            b.rows(which, scalar_dot, &act, &neurons, &mut want);
            for isa in Isa::available() {
                let Some(dot) = ty.dot_fn_for(isa) else { continue };
                let mut got = vec![0f32; neurons.len()];
                b.rows(which, dot, &act, &neurons, &mut got);
                for (k, &i) in neurons.iter().enumerate() {
                    let i = i as usize;
                    let row = &bytes[i * rb..(i + 1) * rb];
                    assert_eq!(got[k].to_bits(), dot(l.n_embd, row, &act).to_bits(), "{isa:?} {which:?} row {i}");
                    let w = &dense[i * l.n_embd..(i + 1) * l.n_embd];
                    let exact: f64 = w.iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
                    let mag: f64 = w.iter().zip(&x).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
                    assert!(
                        ((got[k] - want[k]) as f64).abs() <= 1e-4 * mag + 1e-6,
                        "{isa:?} vs scalar, {ty:?} row {i}"
                    );
                    assert!((got[k] as f64 - exact).abs() <= 2e-2 * mag + 1e-6, "{isa:?} vs f64, {ty:?} row {i}");
                }
            }
        }
    }
}

/// The f64 down product over `neurons` with `coef`, and each output's error bound (module docs).
fn down_reference(ffn: &Ffn, neurons: &[u32], coef: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let l = ffn.layout;
    let mut amax = vec![0f32; l.n_ff.div_ceil(BUNDLE_GROUP)];
    for (&i, &c) in neurons.iter().zip(coef) {
        let g = i as usize / BUNDLE_GROUP;
        amax[g] = amax[g].max(c.abs());
    }
    let (mut y, mut tol) = (vec![0f64; l.n_embd], vec![0f64; l.n_embd]);
    for r in 0..l.n_embd {
        let w = &ffn.down.1[r * l.n_ff..(r + 1) * l.n_ff];
        for (&i, &c) in neurons.iter().zip(coef) {
            let wi = w[i as usize] as f64;
            y[r] += c as f64 * wi;
            let s = amax[i as usize / BUNDLE_GROUP] as f64 / 127.0;
            tol[r] += wi.abs() * s / 2.0 * 1.01 + 1e-5 * (c as f64 * wi).abs();
        }
        tol[r] += 1e-6;
    }
    (y, tol)
}

fn neuron_sets(n_ff: usize, rng: &mut Rng) -> Vec<Vec<u32>> {
    let mut sets = vec![(0..n_ff as u32).collect::<Vec<_>>(), vec![3], vec![]];
    for keep in [2u64, 5, 9] {
        sets.push((0..n_ff as u32).filter(|_| rng.next() % 10 < keep).collect());
    }
    sets
}

#[test]
fn down_gives_the_scalar_reference_on_every_isa_and_the_f64_product_within_rounding() {
    let mut rng = Rng(21);
    for ffn in ffns() {
        let l = ffn.layout;
        let b = ffn.bundles();
        let chunks = l.n_embd / 32;
        for neurons in neuron_sets(l.n_ff, &mut rng) {
            let coef: Vec<f32> = neurons.iter().map(|_| rng.f() * 3.0).collect();
            let mut want = vec![0f32; l.n_embd];
            b.down(axpy_exact_q8_scalar, &neurons, &coef, 0..chunks, &mut want);
            let (exact, tol) = down_reference(&ffn, &neurons, &coef);
            for r in 0..l.n_embd {
                assert!(
                    (want[r] as f64 - exact[r]).abs() <= tol[r],
                    "{:?}, {} neurons, output {r}: {} vs {} (tolerance {})",
                    l.down,
                    neurons.len(),
                    want[r],
                    exact[r],
                    tol[r]
                );
            }
            for isa in Isa::available() {
                let mut got = vec![0f32; l.n_embd];
                b.down(axpy_exact_fn(l.down, isa), &neurons, &coef, 0..chunks, &mut got);
                assert_eq!(bits(&got), bits(&want), "{isa:?} {:?}, {} neurons", l.down, neurons.len());
                // A thread's share of the outputs gives those outputs.
                let mut half = vec![0f32; 32 * (chunks - 1)];
                b.down(axpy_exact_fn(l.down, isa), &neurons, &coef, 1..chunks, &mut half);
                assert_eq!(bits(&half), bits(&want[32..]), "{isa:?} {:?}, chunks 1..", l.down);
            }
        }
    }
}

#[test]
fn a_tokens_result_in_a_union_equals_its_result_alone() {
    let mut rng = Rng(31);
    for ffn in ffns() {
        let l = ffn.layout;
        let b = ffn.bundles();
        let chunks = l.n_embd / 32;
        // Three tokens: overlapping random sets, one with a group the others lack, one empty.
        let sets: Vec<Vec<u32>> = vec![
            (0..l.n_ff as u32).filter(|_| rng.next().is_multiple_of(2)).collect(),
            (0..l.n_ff as u32).filter(|&i| i < 128 || rng.next().is_multiple_of(3)).collect(),
            vec![],
            (300..310).collect(),
        ];
        let coefs: Vec<Vec<f32>> = sets.iter().map(|s| s.iter().map(|_| rng.f() * 2.0).collect()).collect();
        let mut union: Vec<u32> = sets.concat();
        union.sort_unstable();
        union.dedup();
        let n_tok = sets.len();
        // Each token's coefficients over the union (zero where it did not choose the neuron).
        let mut wide = vec![0f32; n_tok * union.len()];
        for t in 0..n_tok {
            for (&i, &c) in sets[t].iter().zip(&coefs[t]) {
                wide[t * union.len() + union.binary_search(&i).unwrap()] = c;
            }
        }
        for isa in Isa::available() {
            let kernel = axpy_exact_fn(l.down, isa);
            let mut together = vec![0.5f32; n_tok * l.n_embd];
            b.down_tokens(axpy_exact_tokens_fn(l.down, isa), &union, &wide, n_tok, 0..chunks, &mut together, l.n_embd);
            for t in 0..n_tok {
                let mut alone = vec![0.5f32; l.n_embd];
                b.down(kernel, &sets[t], &coefs[t], 0..chunks, &mut alone);
                let mut zeros = vec![0.5f32; l.n_embd];
                b.down(kernel, &union, &wide[t * union.len()..(t + 1) * union.len()], 0..chunks, &mut zeros);
                assert_eq!(bits(&zeros), bits(&alone), "{isa:?} {:?}: token {t} over the union, one call", l.down);
                let tog = &together[t * l.n_embd..(t + 1) * l.n_embd];
                assert_eq!(bits(tog), bits(&alone), "{isa:?} {:?}: token {t} in down_tokens", l.down);
            }
        }
    }
}

/// SiLU, as the engine applies it to a group's gate values.
fn silu(h: &mut [f32]) {
    h.iter_mut().for_each(|v| *v = *v / (1.0 + (-*v).exp()));
}

#[test]
fn a_tokens_ffn_by_lanes_is_rows_then_down_per_lane() {
    let mut rng = Rng(41);
    for ffn in ffns() {
        let l = ffn.layout;
        let b = ffn.bundles();
        let x: Vec<f32> = (0..l.n_embd).map(|_| rng.f()).collect();
        let at = l.gate.act_type();
        let mut act = vec![0u8; at.row_bytes(l.n_embd)];
        at.quantize(&x, &mut act);
        let dots = (l.gate.dot_fn(), l.up.dot_fn());
        let gate_all: Vec<f32> = (0..l.n_ff).map(|_| (rng.f() * 4.0).tanh()).collect();
        for neurons in neuron_sets(l.n_ff, &mut rng) {
            for isa in Isa::available() {
                let kernel = axpy_exact_fn(l.down, isa);
                for given in [false, true] {
                    // The reference: the gate (act(rows) or given) and up rows of the chosen
                    // neurons, then per lane the down product of its groups, lanes added in order.
                    let mut g = vec![0f32; neurons.len()];
                    let mut u = vec![0f32; neurons.len()];
                    b.rows(BundleRow::Up, dots.1, &act, &neurons, &mut u);
                    match given {
                        true => g.iter_mut().zip(&neurons).for_each(|(g, &i)| *g = gate_all[i as usize]),
                        false => {
                            b.rows(BundleRow::Gate, dots.0, &act, &neurons, &mut g);
                            // (SiLU per group, as the lanes apply it: elementwise, the same.)
                            silu(&mut g);
                        }
                    }
                    let h: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g * u).collect();
                    let mut want_lanes = vec![0f32; BUNDLE_LANES * l.n_embd];
                    let mut got_lanes = vec![0f32; BUNDLE_LANES * l.n_embd];
                    for lane in 0..BUNDLE_LANES {
                        let mine: Vec<usize> = (0..neurons.len())
                            .filter(|&k| (neurons[k] as usize / BUNDLE_GROUP) % BUNDLE_LANES == lane)
                            .collect();
                        let (n, c): (Vec<u32>, Vec<f32>) = mine.iter().map(|&k| (neurons[k], h[k])).unzip();
                        let y = &mut want_lanes[lane * l.n_embd..(lane + 1) * l.n_embd];
                        b.down(kernel, &n, &c, 0..l.n_embd / 32, y);
                        let gate = match given {
                            true => Gate::Given(&gate_all),
                            false => Gate::Rows { act: silu },
                        };
                        let y = &mut got_lanes[lane * l.n_embd..(lane + 1) * l.n_embd];
                        b.ffn_lane(lane, &neurons, &act, gate, dots, kernel, y);
                    }
                    assert_eq!(bits(&got_lanes), bits(&want_lanes), "{isa:?} {:?} given {given}", l.down);
                    let (mut a, mut c) = (vec![0.25f32; l.n_embd], vec![0.25f32; l.n_embd]);
                    add_lanes(&mut a, &got_lanes);
                    for lane in want_lanes.chunks(l.n_embd) {
                        c.iter_mut().zip(lane).for_each(|(c, v)| *c += v);
                    }
                    assert_eq!(bits(&a), bits(&c), "add_lanes adds the lanes in order");
                }
            }
        }
    }
}

#[test]
fn bad_layouts_buffers_and_lists_are_refused() {
    use WeightType::*;
    let q6 = ExactFormat::of(Q6_K).unwrap();
    assert!(matches!(BundleLayout::new(F32, Q4_K, q6, 256, 512), Err(BundleError::Type { what: "gate", .. })));
    assert!(matches!(BundleLayout::new(Q4_K, Q4_K, q6, 200, 512), Err(BundleError::Shape { .. })));
    assert!(matches!(BundleLayout::new(Q4_K, Q4_K, q6, 256, 300), Err(BundleError::Shape { .. })));
    let ffn = &ffns()[0];
    let l = ffn.layout;
    let e = l.build(&ffn.gate.0[1..], &ffn.up.0, &ffn.down.0).unwrap_err();
    assert!(e.to_string().contains("gate"), "{e}");
    let e = Bundles::new(l, &ffn.records[..ffn.records.len() - 64], &ffn.scales).unwrap_err();
    assert!(e.to_string().contains("records"), "{e}");
    let e = Bundles::new(l, &ffn.records, &ffn.scales[1..]).unwrap_err();
    assert!(e.to_string().contains("scale plane"), "{e}");
    let b = ffn.bundles();
    assert!(b.check_neurons(&[1, 5, 9]).is_ok());
    assert!(b.check_neurons(&[1, 5, 5]).unwrap_err().to_string().contains("not ascending"));
    assert!(b.check_neurons(&[1, l.n_ff as u32]).unwrap_err().to_string().contains("past"));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
