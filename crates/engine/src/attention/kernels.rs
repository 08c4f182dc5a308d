//! The inner products of tiled attention, on f32 tiles of [`TILE_K`] keys:
//! - [`tile_scores`]: one query row against a tile of keys stored transposed (`kt[d][j]`), so the
//!   64 scores of a tile are 64 lanes of one accumulator set;
//! - [`tile_values`]: a tile's value rows, weighted, added into an output row.
//!
//! Each has a scalar reference beside it; AVX2+FMA and AVX-512 versions are chosen at run time
//! ([`Isa::detect`]) for head sizes that are a multiple of 64 (every other size takes the scalar
//! loop). The SIMD versions fuse multiply and add and split sums into more accumulators than the
//! reference, so they agree with it within rounding (tests: against the reference and against an
//! f64 sum, stated tolerances), and each is deterministic: the same inputs give the same bits.

use sift_quant::Isa;

/// Keys per tile.
pub const TILE_K: usize = 64;

/// `s[j] = Σ_d q[d] · kt[d · TILE_K + j]` for the tile's keys `j < TILE_K` (`kt`: `q.len()` rows
/// of [`TILE_K`] values).
pub fn tile_scores(q: &[f32], kt: &[f32], s: &mut [f32; TILE_K]) {
    assert!(kt.len() >= q.len() * TILE_K, "key tile too short for the query");
    #[cfg(target_arch = "x86_64")]
    match Isa::detect() {
        // SAFETY: the AVX-512 kernel needs AVX-512F, part of `Isa::Avx512Vnni`, which `Isa::detect`
        // reports only where the CPU has it; `kt` holds `q.len()` rows of TILE_K (asserted above).
        Isa::Avx512Vnni => return unsafe { x86::tile_scores_avx512(q, kt, s) },
        // SAFETY: as above, for AVX2 and FMA, part of `Isa::Avx2`.
        Isa::Avx2 => return unsafe { x86::tile_scores_avx2(q, kt, s) },
        Isa::Scalar => {}
    }
    tile_scores_scalar(q, kt, s)
}

/// The scalar reference of [`tile_scores`].
pub fn tile_scores_scalar(q: &[f32], kt: &[f32], s: &mut [f32; TILE_K]) {
    let mut acc = [0f32; TILE_K];
    for (&qd, row) in q.iter().zip(kt.chunks_exact(TILE_K)) {
        for (a, &k) in acc.iter_mut().zip(row) {
            *a += qd * k;
        }
    }
    *s = acc;
}

/// `o[d] += Σ_j p[j] · vt[j · o.len() + d]` over the tile's first `p.len()` value rows (`vt`: rows
/// of `o.len()` values).
pub fn tile_values(p: &[f32], vt: &[f32], o: &mut [f32]) {
    let hd = o.len();
    assert!(p.len() <= TILE_K && vt.len() >= p.len() * hd, "value tile too short");
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(64) {
        match Isa::detect() {
            // SAFETY: AVX-512F is part of `Isa::Avx512Vnni` (detected); `vt` holds p.len() rows of
            // hd values (asserted above) and hd is a multiple of 64.
            Isa::Avx512Vnni => return unsafe { x86::tile_values_avx512(p, vt, o) },
            // SAFETY: as above, for AVX2 and FMA, part of `Isa::Avx2`.
            Isa::Avx2 => return unsafe { x86::tile_values_avx2(p, vt, o) },
            Isa::Scalar => {}
        }
    }
    tile_values_scalar(p, vt, o)
}

/// The scalar reference of [`tile_values`].
pub fn tile_values_scalar(p: &[f32], vt: &[f32], o: &mut [f32]) {
    let hd = o.len();
    for (&w, row) in p.iter().zip(vt.chunks_exact(hd)) {
        for (o, &v) in o.iter_mut().zip(row) {
            *o += w * v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TILE_K;
    use std::arch::x86_64::*;

    /// [`super::tile_scores_scalar`] with 8 × 8 lanes. Needs `kt.len() >= q.len() * TILE_K`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tile_scores_avx2(q: &[f32], kt: &[f32], s: &mut [f32; TILE_K]) {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (d, &qd) in q.iter().enumerate() {
            let b = _mm256_set1_ps(qd);
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: row d of kt is kt[d * 64..(d + 1) * 64], inside kt (the caller's
                // contract); load i reads its values 8i..8i + 8.
                let k = unsafe { _mm256_loadu_ps(kt.as_ptr().add(d * TILE_K + 8 * i)) };
                *a = _mm256_fmadd_ps(b, k, *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: s holds 64 f32: store i writes s[8i..8i + 8].
            unsafe { _mm256_storeu_ps(s.as_mut_ptr().add(8 * i), *a) };
        }
    }

    /// [`super::tile_scores_scalar`] with 4 × 16 lanes, even and odd `d` in separate accumulators
    /// (two FMA chains per lane group). Needs `kt.len() >= q.len() * TILE_K`.
    #[target_feature(enable = "avx512f")]
    pub(super) fn tile_scores_avx512(q: &[f32], kt: &[f32], s: &mut [f32; TILE_K]) {
        let (mut even, mut odd) = ([_mm512_setzero_ps(); 4], [_mm512_setzero_ps(); 4]);
        let pairs = q.len() / 2;
        for d2 in 0..pairs {
            let (b0, b1) = (_mm512_set1_ps(q[2 * d2]), _mm512_set1_ps(q[2 * d2 + 1]));
            for i in 0..4 {
                // SAFETY: rows 2·d2 and 2·d2 + 1 of kt (64 values each) are inside kt (caller's
                // contract); load i reads values 16i..16i + 16 of each.
                let (k0, k1) = unsafe {
                    (
                        _mm512_loadu_ps(kt.as_ptr().add(2 * d2 * TILE_K + 16 * i)),
                        _mm512_loadu_ps(kt.as_ptr().add((2 * d2 + 1) * TILE_K + 16 * i)),
                    )
                };
                even[i] = _mm512_fmadd_ps(b0, k0, even[i]);
                odd[i] = _mm512_fmadd_ps(b1, k1, odd[i]);
            }
        }
        if q.len() % 2 == 1 {
            let d = q.len() - 1;
            let b = _mm512_set1_ps(q[d]);
            for (i, e) in even.iter_mut().enumerate() {
                // SAFETY: row d of kt is inside kt (caller's contract); values 16i..16i + 16.
                let k = unsafe { _mm512_loadu_ps(kt.as_ptr().add(d * TILE_K + 16 * i)) };
                *e = _mm512_fmadd_ps(b, k, *e);
            }
        }
        for i in 0..4 {
            // SAFETY: s holds 64 f32: store i writes s[16i..16i + 16].
            unsafe { _mm512_storeu_ps(s.as_mut_ptr().add(16 * i), _mm512_add_ps(even[i], odd[i])) };
        }
    }

    /// [`super::tile_values_scalar`] in 64-value slices of `o` held in 8 × 8 lanes. Needs
    /// `o.len() % 64 == 0` and `vt.len() >= p.len() * o.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tile_values_avx2(p: &[f32], vt: &[f32], o: &mut [f32]) {
        let hd = o.len();
        for c in (0..hd).step_by(64) {
            let out = &mut o[c..c + 64];
            let mut acc = [_mm256_setzero_ps(); 8];
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: out holds 64 values: load i reads 8i..8i + 8.
                *a = unsafe { _mm256_loadu_ps(out.as_ptr().add(8 * i)) };
            }
            for (j, &w) in p.iter().enumerate() {
                let b = _mm256_set1_ps(w);
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row j's slice vt[j·hd + c..j·hd + c + 64] is inside vt (caller's
                    // contract); load i reads its values 8i..8i + 8.
                    let v = unsafe { _mm256_loadu_ps(vt.as_ptr().add(j * hd + c + 8 * i)) };
                    *a = _mm256_fmadd_ps(b, v, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                // SAFETY: out holds 64 values: store i writes 8i..8i + 8.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), *a) };
            }
        }
    }

    /// [`super::tile_values_scalar`] in 64-value slices of `o`, even and odd rows `j` in separate
    /// 4 × 16-lane accumulators. Needs `o.len() % 64 == 0` and `vt.len() >= p.len() * o.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) fn tile_values_avx512(p: &[f32], vt: &[f32], o: &mut [f32]) {
        let hd = o.len();
        for c in (0..hd).step_by(64) {
            let out = &mut o[c..c + 64];
            let mut even = [_mm512_setzero_ps(); 4];
            let mut odd = [_mm512_setzero_ps(); 4];
            for (i, e) in even.iter_mut().enumerate() {
                // SAFETY: out holds 64 values: load i reads 16i..16i + 16.
                *e = unsafe { _mm512_loadu_ps(out.as_ptr().add(16 * i)) };
            }
            for j2 in 0..p.len() / 2 {
                let (b0, b1) = (_mm512_set1_ps(p[2 * j2]), _mm512_set1_ps(p[2 * j2 + 1]));
                for i in 0..4 {
                    // SAFETY: rows 2·j2 and 2·j2 + 1, values c..c + 64, are inside vt (caller's
                    // contract); load i reads 16 of them from c + 16i.
                    let (v0, v1) = unsafe {
                        (
                            _mm512_loadu_ps(vt.as_ptr().add(2 * j2 * hd + c + 16 * i)),
                            _mm512_loadu_ps(vt.as_ptr().add((2 * j2 + 1) * hd + c + 16 * i)),
                        )
                    };
                    even[i] = _mm512_fmadd_ps(b0, v0, even[i]);
                    odd[i] = _mm512_fmadd_ps(b1, v1, odd[i]);
                }
            }
            if p.len() % 2 == 1 {
                let j = p.len() - 1;
                let b = _mm512_set1_ps(p[j]);
                for (i, e) in even.iter_mut().enumerate() {
                    // SAFETY: row j, values c..c + 64, is inside vt (caller's contract).
                    let v = unsafe { _mm512_loadu_ps(vt.as_ptr().add(j * hd + c + 16 * i)) };
                    *e = _mm512_fmadd_ps(b, v, *e);
                }
            }
            for i in 0..4 {
                // SAFETY: out holds 64 values: store i writes 16i..16i + 16.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), _mm512_add_ps(even[i], odd[i])) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Three ways, for every head size sift's models use and a few odd ones: the dispatched kernel
    /// (SIMD where the CPU has it), the scalar reference and an f64 sum agree within
    /// 1e-5 · (1 + Σ|terms|) — the SIMD kernels fuse multiply-add and sum in another order.
    #[test]
    fn tile_scores_simd_scalar_and_f64_agree() {
        for hd in [1usize, 2, 17, 64, 80, 128, 256] {
            let q = data(hd, hd as u32);
            let kt = data(hd * TILE_K, 7 + hd as u32);
            let (mut fast, mut slow) = ([0f32; TILE_K], [0f32; TILE_K]);
            tile_scores(&q, &kt, &mut fast);
            tile_scores_scalar(&q, &kt, &mut slow);
            for j in 0..TILE_K {
                let exact: f64 = (0..hd).map(|d| q[d] as f64 * kt[d * TILE_K + j] as f64).sum();
                let mag: f64 = (0..hd).map(|d| (q[d] as f64 * kt[d * TILE_K + j] as f64).abs()).sum();
                let tol = 1e-5 * (1.0 + mag);
                assert!((fast[j] as f64 - exact).abs() <= tol, "hd {hd} key {j}: {} vs {exact}", fast[j]);
                assert!((slow[j] as f64 - exact).abs() <= tol, "hd {hd} key {j}: scalar {} vs {exact}", slow[j]);
            }
            let mut again = [0f32; TILE_K];
            tile_scores(&q, &kt, &mut again);
            assert_eq!(again.map(f32::to_bits), fast.map(f32::to_bits), "hd {hd}: not deterministic");
        }
    }

    #[test]
    fn tile_values_simd_scalar_and_f64_agree() {
        for hd in [16usize, 64, 128, 192, 256] {
            for rows in [0usize, 1, 2, 7, 63, 64] {
                let p: Vec<f32> = data(rows, rows as u32).iter().map(|v| v.abs() / 2.0).collect();
                let vt = data(rows * hd, 3 + hd as u32);
                let o0 = data(hd, 11);
                let (mut fast, mut slow) = (o0.clone(), o0.clone());
                tile_values(&p, &vt, &mut fast);
                tile_values_scalar(&p, &vt, &mut slow);
                for d in 0..hd {
                    let exact = o0[d] as f64 + (0..rows).map(|j| p[j] as f64 * vt[j * hd + d] as f64).sum::<f64>();
                    let mag = o0[d].abs() as f64
                        + (0..rows).map(|j| (p[j] as f64 * vt[j * hd + d] as f64).abs()).sum::<f64>();
                    let tol = 1e-5 * (1.0 + mag);
                    assert!((fast[d] as f64 - exact).abs() <= tol, "hd {hd} rows {rows} d {d}");
                    assert!((slow[d] as f64 - exact).abs() <= tol, "hd {hd} rows {rows} d {d}: scalar");
                }
            }
        }
    }

    /// On a CPU with AVX-512 the AVX2 kernels are tested too (dispatch picks only the best one).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernels_agree_with_the_reference_on_an_avx512_cpu() {
        if Isa::hardware() < Isa::Avx2 {
            return;
        }
        let hd = 128;
        let q = data(hd, 1);
        let kt = data(hd * TILE_K, 2);
        let (mut a, mut b) = ([0f32; TILE_K], [0f32; TILE_K]);
        // SAFETY: the CPU has AVX2 and FMA (checked above); kt holds hd rows of TILE_K.
        unsafe { x86::tile_scores_avx2(&q, &kt, &mut a) };
        tile_scores_scalar(&q, &kt, &mut b);
        for j in 0..TILE_K {
            assert!((a[j] - b[j]).abs() <= 1e-4 * (1.0 + b[j].abs()), "key {j}");
        }
        let p: Vec<f32> = data(33, 3).iter().map(|v| v.abs()).collect();
        let vt = data(33 * hd, 4);
        let (mut x, mut y) = (vec![0.5f32; hd], vec![0.5f32; hd]);
        // SAFETY: as above; vt holds 33 rows of hd (a multiple of 64) values.
        unsafe { x86::tile_values_avx2(&p, &vt, &mut x) };
        tile_values_scalar(&p, &vt, &mut y);
        for d in 0..hd {
            assert!((x[d] - y[d]).abs() <= 1e-4 * (1.0 + y[d].abs()), "dim {d}");
        }
    }
}
