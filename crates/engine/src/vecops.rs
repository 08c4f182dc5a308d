//! Small f32 vector kernels used between the matrix products: dot, axpy, RMS norm, SiLU·mul,
//! softmax. Each is a plain loop that LLVM vectorizes; an AVX-512 or AVX2+FMA build of the same
//! loop is chosen at run time (the default x86-64 target only has SSE2). The builds give the same
//! bits: LLVM neither fuses nor reorders float operations it was not told to, and the sums keep
//! their own fixed lanes.

use crate::pool::{split, SharedMut, ThreadPool};
use half::f16;
use sift_quant::Isa;

macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[inline]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? { generic($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? { generic($($arg),*) }
                if Isa::detect() == Isa::Avx512Vnni {
                    // SAFETY: `avx512` needs AVX-512 F/BW/VL, AVX2 and FMA, part of
                    // `Isa::Avx512Vnni`, which `Isa::detect` reports only where the CPU has them.
                    return unsafe { avx512($($arg),*) };
                }
                if Isa::detect() >= Isa::Avx2 {
                    // SAFETY: `avx2` needs AVX2 and FMA, part of `Isa::Avx2`, which `Isa::detect`
                    // reports only where the CPU has them.
                    return unsafe { avx2($($arg),*) };
                }
            }
            generic($($arg),*)
        }
    };
}

multiversion! {
    /// Σ a[i]·b[i] (lengths must match).
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let mut acc = [0f32; 16];
        let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..16 {
                acc[i] += x[i] * y[i];
            }
        }
        let mut s: f32 = acc.iter().sum();
        for (x, y) in ra.iter().zip(rb) {
            s += x * y;
        }
        s
    }
}

multiversion! {
    /// y += a·x.
    pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }
}

multiversion! {
    /// out += s · B·(A·x) for one token, with Aᵀ (`x.len()` rows of r = `z.len()`) and Bᵀ (r rows
    /// of `out.len()`): a LoRA adapter's side product. Zero inputs (masked) are skipped; `z` is
    /// scratch.
    pub fn low_rank_add(x: &[f32], a_t: &[f32], b_t: &[f32], s: f32, z: &mut [f32], out: &mut [f32]) {
        let r = z.len();
        z.fill(0.0);
        for (&xj, col) in x.iter().zip(a_t.chunks_exact(r)) {
            if xj != 0.0 {
                for (zi, &w) in z.iter_mut().zip(col) {
                    *zi += xj * w;
                }
            }
        }
        for (&zi, brow) in z.iter().zip(b_t.chunks_exact(out.len())) {
            let zi = s * zi;
            for (o, &b) in out.iter_mut().zip(brow) {
                *o += zi * b;
            }
        }
    }
}

multiversion! {
    /// y += x.
    pub fn add_assign(y: &mut [f32], x: &[f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y += x;
        }
    }
}

multiversion! {
    /// out = x / sqrt(mean(x²) + eps) · w (sum in f64, as ggml does).
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let mut acc = [0f64; 8];
        let c = x.chunks_exact(8);
        let r = c.remainder();
        for v in c {
            for i in 0..8 {
                acc[i] += (v[i] as f64) * (v[i] as f64);
            }
        }
        let mut ss: f64 = acc.iter().sum();
        for v in r {
            ss += (*v as f64) * (*v as f64);
        }
        let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
        for ((o, x), w) in out.iter_mut().zip(x).zip(w) {
            *o = x * scale * w;
        }
    }
}

multiversion! {
    /// g = silu(g) = g / (1 + e^−g): [`silu_mul`]'s expression before its product, so `silu`
    /// then [`mul_assign`] gives [`silu_mul`]'s bits (a gate-first FFN ranks neurons between
    /// the two).
    pub fn silu(g: &mut [f32]) {
        for g in g.iter_mut() {
            *g = *g / (1.0 + exp_poly(-*g));
        }
    }
}

multiversion! {
    /// y = y · x, elementwise.
    pub fn mul_assign(y: &mut [f32], x: &[f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y *= x;
        }
    }
}

multiversion! {
    /// g = silu(g) · u, with e^−g from [`exp_poly`] (within 2 ulp of `f32::exp`; a call to libm's
    /// `expf` per value cost ~5 % of a prompt's time): g for g → ∞, and towards 0 for g → −∞
    /// (the exp clamps at e^88, so g·e^−88 below −88: −6e-9 at −1e30).
    pub fn silu_mul(g: &mut [f32], u: &[f32]) {
        for (g, u) in g.iter_mut().zip(u) {
            *g = *g / (1.0 + exp_poly(-*g)) * u;
        }
    }
}

/// e^x for x in [−87, 0] (larger inputs are clamped to 88, smaller to −87: e^−87 is 1.6e−38,
/// the smallest normal range) as a degree-6 polynomial after range reduction (Cephes' `expf`),
/// within 2 ulp of [`f32::exp`]; a plain expression LLVM vectorizes.
#[inline(always)]
fn exp_poly(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let z = x * LOG2E + ROUND;
    let n = z - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    let k = z.to_bits() as i32 - ROUND.to_bits() as i32;
    p * f32::from_bits(((k + 127) << 23) as u32)
}

multiversion! {
    /// `x[i] = e^(x[i] − m)` (for `x[i] ≤ m`: a softmax's numerators against its running maximum;
    /// within 2 ulp of `f32::exp`), returning Σ of the results (16 partial sums, added in order).
    pub fn exp_shifted_sum(x: &mut [f32], m: f32) -> f32 {
        let mut acc = [0f32; 16];
        let mut chunks = x.chunks_exact_mut(16);
        for c in &mut chunks {
            for i in 0..16 {
                c[i] = exp_poly(c[i] - m);
                acc[i] += c[i];
            }
        }
        let mut s = 0f32;
        for v in chunks.into_remainder() {
            *v = exp_poly(*v - m);
            s += *v;
        }
        acc.iter().sum::<f32>() + s
    }
}

multiversion! {
    /// The largest value of `x` ignoring NaN (−∞ for none), as `fold(−∞, f32::max)` gives it, in
    /// sixteen independent lanes (vector code instead of one chain of dependent maxima).
    pub fn max_value(x: &[f32]) -> f32 {
        let mut m = [f32::NEG_INFINITY; 16];
        let blocks = x.chunks_exact(16);
        let tail = blocks.remainder();
        for b in blocks {
            for i in 0..16 {
                m[i] = m[i].max(b[i]);
            }
        }
        for (i, &v) in tail.iter().enumerate() {
            m[i] = m[i].max(v);
        }
        // The lanes halved in place (a maximum is the same in any order; no lane is NaN).
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                m[i] = m[i].max(m[i + w]);
            }
        }
        m[0]
    }
}

/// In-place softmax; returns nothing, `x` sums to 1 afterwards.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// RMS-normalises each of the rows of `x` (row length `e`) into `out`.
pub fn rms_norm_rows(pool: &ThreadPool, x: &[f32], w: &[f32], eps: f32, out: &mut [f32], e: usize) {
    let n = x.len() / e;
    if n == 1 {
        rms_norm(x, w, eps, &mut out[..e]);
        return;
    }
    let sm = SharedMut::new(out);
    pool.run(&|tid, nth| {
        for t in split(n, nth, tid) {
            // SAFETY: each row is written by one thread.
            let o = unsafe { sm.slice(t * e..(t + 1) * e) };
            rms_norm(&x[t * e..(t + 1) * e], w, eps, o);
        }
    });
}

/// [`silu_mul`] over a batch, split over the pool's threads (elementwise: the same bits as one
/// call). One token's worth (or less) runs on the calling thread.
pub fn silu_mul_rows(pool: &ThreadPool, g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "silu_mul_rows: lengths differ");
    in_pieces(pool, g, &|g, r| silu_mul(g, &u[r]));
}

/// [`silu`] over a batch, split over the pool's threads as [`silu_mul_rows`] is.
pub fn silu_rows(pool: &ThreadPool, g: &mut [f32]) {
    in_pieces(pool, g, &|g, _| silu(g));
}

/// [`mul_assign`] over a batch, split over the pool's threads as [`silu_mul_rows`] is.
pub fn mul_rows(pool: &ThreadPool, y: &mut [f32], x: &[f32]) {
    assert_eq!(y.len(), x.len(), "mul_rows: lengths differ");
    in_pieces(pool, y, &|y, r| mul_assign(y, &x[r]));
}

/// Runs the elementwise `f` on pieces of `y` (each with its range in `y`) over the pool's
/// threads; one token's worth (or less) on the calling thread.
fn in_pieces(pool: &ThreadPool, y: &mut [f32], f: &(dyn Fn(&mut [f32], std::ops::Range<usize>) + Sync)) {
    const PIECE: usize = 8192;
    let len = y.len();
    if len <= PIECE || pool.n_threads() == 1 {
        f(y, 0..len);
        return;
    }
    let sm = SharedMut::new(y);
    pool.for_each(len.div_ceil(PIECE), 1, &|range, _| {
        for p in range {
            let r = p * PIECE..((p + 1) * PIECE).min(len);
            // SAFETY: each piece is written by one item.
            f(unsafe { sm.slice(r.clone()) }, r);
        }
    });
}

/// Σ a[i]·b[i] with `b` in f16 (lengths must match): bit for bit [`dot`] of `a` and `b`
/// converted to f32 (the same 16 partial sums, each a product then an add, summed in order).
#[inline]
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() >= Isa::Avx2 {
        // SAFETY: `x86::dot_f16` needs AVX2, FMA and F16C, all part of `Isa::Avx2`, which
        // `Isa::detect` reports only where the CPU has them.
        return unsafe { x86::dot_f16(a, b) };
    }
    dot_f16_scalar(a, b)
}

/// The scalar reference of [`dot_f16`].
pub fn dot_f16_scalar(a: &[f32], b: &[f16]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i].to_f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y.to_f32();
    }
    s
}

/// y += a·x with `x` in f16: bit for bit [`axpy`] of `x` converted to f32.
#[inline]
pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() >= Isa::Avx2 {
        // SAFETY: as in `dot_f16`: the features `x86::axpy_f16` needs are part of `Isa::Avx2`.
        return unsafe { x86::axpy_f16(a, &x[..n], &mut y[..n]) };
    }
    axpy_f16_scalar(a, &x[..n], &mut y[..n])
}

/// The scalar reference of [`axpy_f16`].
pub fn axpy_f16_scalar(a: f32, x: &[f16], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x.to_f32();
    }
}

/// F16C versions of the f16 kernels.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// [`super::dot_f16_scalar`] on 2 × 8 lanes. Needs `a.len() == b.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        let n = a.len().min(b.len()) / 16 * 16;
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= a.len(), b.len(): both 16-value loads are inside the slices
            // (unaligned loads; f16 is a 2-byte `repr(transparent)` u16).
            let (x0, x1, h0, h1) = unsafe {
                (
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm_loadu_si128(b.as_ptr().add(i).cast()),
                    _mm_loadu_si128(b.as_ptr().add(i + 8).cast()),
                )
            };
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(x0, _mm256_cvtph_ps(h0)));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(x1, _mm256_cvtph_ps(h1)));
            i += 16;
        }
        let mut acc = [0f32; 16];
        // SAFETY: `acc` holds 16 f32: the two 8-lane stores at 0 and 8 fill it exactly.
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), acc0);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), acc1);
        }
        let mut s: f32 = acc.iter().sum();
        for j in n..a.len().min(b.len()) {
            s += a[j] * b[j].to_f32();
        }
        s
    }

    /// [`super::axpy_f16_scalar`] on 8 lanes. Needs `x.len() == y.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
        let len = x.len().min(y.len());
        let n = len / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= x.len(), y.len(): the 8-value load of x and the load and
            // store of y are inside the slices.
            unsafe {
                let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i).cast()));
                let yp = y.as_mut_ptr().add(i);
                _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(va, xv)));
            }
            i += 8;
        }
        for j in n..len {
            y[j] += a * x[j].to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_plain_loops() {
        let a: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..100).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-4);
        let mut y = b.clone();
        axpy(0.5, &a, &mut y);
        for i in 0..100 {
            assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
        }
    }

    /// The f16 kernels (SIMD where the CPU has it, and the scalar reference) equal the f32 ones on
    /// the converted values bit for bit, at every length (remainders included), subnormals too.
    #[test]
    fn f16_kernels_equal_the_f32_kernels_on_converted_values() {
        for n in [0usize, 1, 7, 8, 15, 16, 17, 64, 100, 129] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let mut b16: Vec<f16> = (0..n).map(|i| f16::from_f32((i as f32 * 0.11).cos() * 2.0)).collect();
            if n > 3 {
                b16[3] = f16::from_bits(0x0001); // the smallest subnormal
            }
            let b: Vec<f32> = b16.iter().map(|v| v.to_f32()).collect();
            let want = dot(&a, &b);
            assert_eq!(dot_f16(&a, &b16).to_bits(), want.to_bits(), "dot, n = {n}");
            assert_eq!(dot_f16_scalar(&a, &b16).to_bits(), want.to_bits(), "scalar dot, n = {n}");
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((want - plain).abs() <= 1e-4 * (1.0 + plain.abs()), "dot against a plain sum, n = {n}");
            let (mut y, mut y16, mut ys) = (a.clone(), a.clone(), a.clone());
            axpy(0.7, &b, &mut y);
            axpy_f16(0.7, &b16, &mut y16);
            axpy_f16_scalar(0.7, &b16, &mut ys);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y16), bits(&y), "axpy, n = {n}");
            assert_eq!(bits(&ys), bits(&y), "scalar axpy, n = {n}");
        }
    }

    #[test]
    fn rms_norm_normalises() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
        let w = vec![1f32; 64];
        let mut o = vec![0f32; 64];
        rms_norm(&x, &w, 0.0, &mut o);
        let ms: f32 = o.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-4);
    }

    /// The vectorized exp against f64's over [−87, 0] and the clamps beyond; the sum is the
    /// results' sum.
    #[test]
    fn exp_shifted_sum_is_within_two_ulp_of_exp() {
        let xs: Vec<f32> =
            (0..20001).map(|i| -87.0 * i as f32 / 20000.0).chain([-1e30, f32::NEG_INFINITY, -90.0]).collect();
        let mut y = xs.clone();
        let sum = exp_shifted_sum(&mut y, 0.0);
        for (&x, &e) in xs.iter().zip(&y) {
            let want = (x.max(-87.0) as f64).exp();
            assert!((e as f64 - want).abs() <= 2.5 * f32::EPSILON as f64 * want, "exp({x}) = {e}, want {want}");
        }
        let plain: f64 = y.iter().map(|&v| v as f64).sum();
        assert!((sum as f64 - plain).abs() <= 1e-5 * plain);
        let mut z = vec![3.0f32, 1.0, 3.0];
        exp_shifted_sum(&mut z, 3.0);
        assert_eq!(z[0], 1.0);
    }

    /// A gate-first FFN's `silu` then `mul_assign` (pieces over the pool included) gives
    /// `silu_mul`'s bits: a selection that keeps every neuron computes the dense FFN.
    #[test]
    fn silu_then_product_is_silu_mul_bit_for_bit() {
        let pool = ThreadPool::new(2);
        let g: Vec<f32> = (0..20_011).map(|i| -30.0 + 60.0 * ((i * 7919) % 20_011) as f32 / 20_011.0).collect();
        let u: Vec<f32> = (0..g.len()).map(|i| -2.0 + (i % 13) as f32 * 0.3).collect();
        let mut fused = g.clone();
        silu_mul_rows(&pool, &mut fused, &u);
        let mut split = g.clone();
        silu_rows(&pool, &mut split);
        mul_rows(&pool, &mut split, &u);
        for (i, (a, b)) in fused.iter().zip(&split).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "element {i}: silu_mul {a} vs silu then product {b}");
        }
    }

    /// SiLU·up with the polynomial exp against f64's over [−100, 100]: a few ulp of the result
    /// (or of 1e-30 where it underflows towards 0), and the limits at both ends.
    #[test]
    fn silu_mul_is_within_a_few_ulp_of_f64() {
        let g: Vec<f32> = (0..40001).map(|i| -100.0 + 200.0 * i as f32 / 40000.0).collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mut y = g.clone();
        silu_mul(&mut y, &u);
        for ((&x, &w), &got) in g.iter().zip(&u).zip(&y) {
            let want = x as f64 / (1.0 + (-x as f64).exp()) * w as f64;
            let tol = 4.0 * f32::EPSILON as f64 * want.abs() + 1e-30;
            assert!((got as f64 - want).abs() <= tol, "silu({x})·{w} = {got}, want {want}");
        }
        // Far below −88 the clamped exp leaves g·e^−88 (−6e-9 at −1e30): zero to the FFN.
        let mut ends = vec![-1e30f32, 1e30, 0.0];
        silu_mul(&mut ends, &[1.0, 1.0, 1.0]);
        assert!(ends[0] <= 0.0 && ends[0] > -1e-8 && ends[1] == 1e30 && ends[2] == 0.0, "{ends:?}");
    }

    #[test]
    fn max_value_is_the_folds_maximum() {
        for n in [0usize, 1, 15, 16, 17, 64, 100] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
            assert_eq!(max_value(&x), x.iter().copied().fold(f32::NEG_INFINITY, f32::max), "{n} values");
        }
        assert_eq!(max_value(&[f32::NAN, -3.0, f32::NAN]), -3.0);
        assert_eq!(max_value(&[f32::NAN; 20]), f32::NEG_INFINITY);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1e9];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] == 0.0 && x[2] > x[1]);
    }
}
