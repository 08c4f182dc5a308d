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
//!
//! [`tile_scores_rows`] and [`tile_values_rows`] run up to [`ROWS`] rows (query rows that see the
//! same keys) through one pass over the tile: on AVX-512 each key or value vector loaded serves
//! four rows instead of one, which matters because a tile of 64 keys × 128 dimensions (32 KiB,
//! and as much of values) does not stay in L1 between one row and the next. They give every row
//! the same bits as the one-row kernels (the same two FMA chains per lane, even and odd terms,
//! summed at the end), so a token's result does not depend on how rows were grouped.

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

/// Rows per pass of [`tile_scores_rows`] and [`tile_values_rows`].
pub const ROWS: usize = 4;

/// [`tile_scores`] for `rows` query rows at once: `s[r · TILE_K + j]` = row `r` of `q` (rows of
/// `hd` values) against key `j`. Each row gets the bits [`tile_scores`] gives it alone.
pub fn tile_scores_rows(q: &[f32], hd: usize, kt: &[f32], s: &mut [f32]) {
    let rows = q.len() / hd.max(1);
    assert!(hd > 0 && q.len() == rows * hd && rows <= ROWS, "1 to {ROWS} query rows of {hd} values");
    assert!(kt.len() >= hd * TILE_K && s.len() >= rows * TILE_K, "key tile or score rows too short");
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() == Isa::Avx512Vnni {
        // SAFETY: AVX-512F is part of `Isa::Avx512Vnni` (detected); `q` holds `rows` rows of `hd`,
        // `kt` `hd` rows of TILE_K and `s` `rows` rows of TILE_K (asserted above).
        unsafe {
            match rows {
                1 => x86::scores_rows_avx512::<1>(q, hd, kt, s),
                2 => x86::scores_rows_avx512::<2>(q, hd, kt, s),
                3 => x86::scores_rows_avx512::<3>(q, hd, kt, s),
                _ => x86::scores_rows_avx512::<4>(q, hd, kt, s),
            }
        }
        return;
    }
    for (qr, sr) in q.chunks_exact(hd).zip(s.chunks_exact_mut(TILE_K)) {
        tile_scores(qr, kt, sr.try_into().expect("a row of TILE_K scores"));
    }
}

/// [`tile_values`] for `rows` rows at once, each weighting the tile's first `seen` value rows:
/// row `r` of `o` (rows of `hd` values) `+= Σ_j p[r · TILE_K + j] · vt[j · hd + ·]`, `j < seen`.
/// Each row gets the bits [`tile_values`] gives it alone.
pub fn tile_values_rows(p: &[f32], seen: usize, vt: &[f32], hd: usize, o: &mut [f32]) {
    let rows = o.len() / hd.max(1);
    assert!(hd > 0 && o.len() == rows * hd && rows <= ROWS, "1 to {ROWS} output rows of {hd} values");
    assert!(seen <= TILE_K && p.len() >= rows * TILE_K && vt.len() >= seen * hd, "value tile too short");
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(64) && Isa::detect() == Isa::Avx512Vnni {
        // SAFETY: AVX-512F is part of `Isa::Avx512Vnni` (detected); `p` holds `rows` rows of
        // TILE_K, `vt` `seen` rows of `hd` (a multiple of 64) and `o` `rows` rows of `hd`
        // (asserted above).
        unsafe {
            match rows {
                1 => x86::values_rows_avx512::<1>(p, seen, vt, hd, o),
                2 => x86::values_rows_avx512::<2>(p, seen, vt, hd, o),
                3 => x86::values_rows_avx512::<3>(p, seen, vt, hd, o),
                _ => x86::values_rows_avx512::<4>(p, seen, vt, hd, o),
            }
        }
        return;
    }
    for (pr, or) in p.chunks_exact(TILE_K).zip(o.chunks_exact_mut(hd)) {
        tile_values(&pr[..seen], vt, or);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TILE_K;
    use std::arch::x86_64::*;

    /// [`super::tile_scores_rows`] for `R` rows: per half tile (32 keys) the rows' even and odd
    /// `d` in separate 2 × 16-lane accumulators (4·R registers), each key vector loaded once for
    /// the `R` rows. Lane for lane the chains of [`tile_scores_avx512`].
    ///
    /// # Safety
    /// AVX-512F present; `q` holds `R` rows of `hd`, `kt` `hd` rows of TILE_K, `s` `R` rows of
    /// TILE_K.
    #[allow(clippy::needless_range_loop)] // rows × lanes of registers, indexed as the docs say
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores_rows_avx512<const R: usize>(q: &[f32], hd: usize, kt: &[f32], s: &mut [f32]) {
        let (qp, kp) = (q.as_ptr(), kt.as_ptr());
        for half in 0..2 {
            let at = 32 * half;
            let (mut even, mut odd) = ([[_mm512_setzero_ps(); 2]; R], [[_mm512_setzero_ps(); 2]; R]);
            for d2 in 0..hd / 2 {
                // SAFETY: rows 2·d2 and 2·d2 + 1 of kt, values at..at + 32 of each, lie in kt.
                let (k0, k1) = unsafe {
                    let (r0, r1) = (kp.add(2 * d2 * TILE_K + at), kp.add((2 * d2 + 1) * TILE_K + at));
                    (
                        [_mm512_loadu_ps(r0), _mm512_loadu_ps(r0.add(16))],
                        [_mm512_loadu_ps(r1), _mm512_loadu_ps(r1.add(16))],
                    )
                };
                for r in 0..R {
                    // SAFETY: row r's values 2·d2 and 2·d2 + 1 lie in q (R rows of hd).
                    let (b0, b1) = unsafe {
                        (_mm512_set1_ps(*qp.add(r * hd + 2 * d2)), _mm512_set1_ps(*qp.add(r * hd + 2 * d2 + 1)))
                    };
                    for i in 0..2 {
                        even[r][i] = _mm512_fmadd_ps(b0, k0[i], even[r][i]);
                        odd[r][i] = _mm512_fmadd_ps(b1, k1[i], odd[r][i]);
                    }
                }
            }
            if hd % 2 == 1 {
                let d = hd - 1;
                // SAFETY: row d of kt, values at..at + 32, lies in kt.
                let k = unsafe {
                    [_mm512_loadu_ps(kp.add(d * TILE_K + at)), _mm512_loadu_ps(kp.add(d * TILE_K + at + 16))]
                };
                for r in 0..R {
                    // SAFETY: row r's value d lies in q.
                    let b = _mm512_set1_ps(unsafe { *qp.add(r * hd + d) });
                    for i in 0..2 {
                        even[r][i] = _mm512_fmadd_ps(b, k[i], even[r][i]);
                    }
                }
            }
            for r in 0..R {
                for i in 0..2 {
                    // SAFETY: s holds R rows of TILE_K: this writes row r's keys at + 16i.. + 16.
                    unsafe {
                        _mm512_storeu_ps(
                            s.as_mut_ptr().add(r * TILE_K + at + 16 * i),
                            _mm512_add_ps(even[r][i], odd[r][i]),
                        )
                    };
                }
            }
        }
    }

    /// [`super::tile_values_rows`] for `R` rows: per 32 dimensions the rows' even and odd `j` in
    /// separate 2 × 16-lane accumulators (the even ones start from `o`), each value vector loaded
    /// once for the `R` rows. Lane for lane the chains of [`tile_values_avx512`].
    ///
    /// # Safety
    /// AVX-512F present; `hd % 64 == 0`; `p` holds `R` rows of TILE_K, `vt` `seen` rows of `hd`,
    /// `o` `R` rows of `hd`; `seen <= TILE_K`.
    #[allow(clippy::needless_range_loop)] // rows × lanes of registers, indexed as the docs say
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn values_rows_avx512<const R: usize>(
        p: &[f32],
        seen: usize,
        vt: &[f32],
        hd: usize,
        o: &mut [f32],
    ) {
        let (pp, vp, op) = (p.as_ptr(), vt.as_ptr(), o.as_mut_ptr());
        for c in (0..hd).step_by(32) {
            let mut even = [[_mm512_setzero_ps(); 2]; R];
            let mut odd = [[_mm512_setzero_ps(); 2]; R];
            for r in 0..R {
                for i in 0..2 {
                    // SAFETY: row r of o holds hd values: this reads c + 16i.. + 16 (c + 32 <= hd).
                    even[r][i] = unsafe { _mm512_loadu_ps(op.add(r * hd + c + 16 * i)) };
                }
            }
            for j2 in 0..seen / 2 {
                // SAFETY: value rows 2·j2 and 2·j2 + 1 (< seen), values c..c + 32, lie in vt.
                let (v0, v1) = unsafe {
                    let (r0, r1) = (vp.add(2 * j2 * hd + c), vp.add((2 * j2 + 1) * hd + c));
                    (
                        [_mm512_loadu_ps(r0), _mm512_loadu_ps(r0.add(16))],
                        [_mm512_loadu_ps(r1), _mm512_loadu_ps(r1.add(16))],
                    )
                };
                for r in 0..R {
                    // SAFETY: row r's weights 2·j2 and 2·j2 + 1 (< seen <= TILE_K) lie in p.
                    let (b0, b1) = unsafe {
                        (_mm512_set1_ps(*pp.add(r * TILE_K + 2 * j2)), _mm512_set1_ps(*pp.add(r * TILE_K + 2 * j2 + 1)))
                    };
                    for i in 0..2 {
                        even[r][i] = _mm512_fmadd_ps(b0, v0[i], even[r][i]);
                        odd[r][i] = _mm512_fmadd_ps(b1, v1[i], odd[r][i]);
                    }
                }
            }
            if seen % 2 == 1 {
                let j = seen - 1;
                // SAFETY: value row j (< seen), values c..c + 32, lies in vt.
                let v = unsafe { [_mm512_loadu_ps(vp.add(j * hd + c)), _mm512_loadu_ps(vp.add(j * hd + c + 16))] };
                for r in 0..R {
                    // SAFETY: row r's weight j lies in p.
                    let b = _mm512_set1_ps(unsafe { *pp.add(r * TILE_K + j) });
                    for i in 0..2 {
                        even[r][i] = _mm512_fmadd_ps(b, v[i], even[r][i]);
                    }
                }
            }
            for r in 0..R {
                for i in 0..2 {
                    // SAFETY: as the loads above.
                    unsafe { _mm512_storeu_ps(op.add(r * hd + c + 16 * i), _mm512_add_ps(even[r][i], odd[r][i])) };
                }
            }
        }
    }

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

    /// The multi-row kernels give each row the bits of the one-row kernels (so a token's result
    /// does not depend on which rows share a pass), for 1 to 4 rows, head sizes on and off the
    /// SIMD paths, full and causally cut tiles; and they agree with an f64 sum.
    #[test]
    fn row_kernels_give_each_row_the_one_row_bits() {
        for hd in [17usize, 64, 80, 128, 256] {
            for rows in 1..=ROWS {
                let q = data(rows * hd, (hd + rows) as u32);
                let kt = data(hd * TILE_K, 5 + hd as u32);
                let mut s = vec![0f32; rows * TILE_K];
                tile_scores_rows(&q, hd, &kt, &mut s);
                for r in 0..rows {
                    let mut one = [0f32; TILE_K];
                    tile_scores(&q[r * hd..(r + 1) * hd], &kt, &mut one);
                    assert_eq!(
                        s[r * TILE_K..(r + 1) * TILE_K].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        one.map(f32::to_bits),
                        "scores: hd {hd}, {rows} rows, row {r}"
                    );
                    for j in 0..TILE_K {
                        let exact: f64 = (0..hd).map(|d| q[r * hd + d] as f64 * kt[d * TILE_K + j] as f64).sum();
                        let mag: f64 = (0..hd).map(|d| (q[r * hd + d] as f64 * kt[d * TILE_K + j] as f64).abs()).sum();
                        assert!(
                            (s[r * TILE_K + j] as f64 - exact).abs() <= 1e-5 * (1.0 + mag),
                            "hd {hd} row {r} key {j}"
                        );
                    }
                }
                for seen in [1usize, 2, 31, 63, 64] {
                    let p: Vec<f32> = data(rows * TILE_K, (seen + rows) as u32).iter().map(|v| v.abs() / 2.0).collect();
                    let vt = data(seen * hd, 9 + hd as u32);
                    let o0 = data(rows * hd, 13);
                    let mut o = o0.clone();
                    tile_values_rows(&p, seen, &vt, hd, &mut o);
                    for r in 0..rows {
                        let mut one = o0[r * hd..(r + 1) * hd].to_vec();
                        tile_values(&p[r * TILE_K..r * TILE_K + seen], &vt, &mut one);
                        let got = &o[r * hd..(r + 1) * hd];
                        assert!(
                            got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "values: hd {hd}, {rows} rows, seen {seen}, row {r}"
                        );
                        for d in 0..hd {
                            let terms = (0..seen).map(|j| p[r * TILE_K + j] as f64 * vt[j * hd + d] as f64);
                            let exact = o0[r * hd + d] as f64 + terms.clone().sum::<f64>();
                            let mag = o0[r * hd + d].abs() as f64 + terms.map(f64::abs).sum::<f64>();
                            assert!(
                                (got[d] as f64 - exact).abs() <= 1e-5 * (1.0 + mag),
                                "hd {hd} seen {seen} row {r} d {d}"
                            );
                        }
                    }
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
