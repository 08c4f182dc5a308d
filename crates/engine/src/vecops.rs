//! Small f32 vector kernels used between the matrix products: dot, axpy, RMS norm, SiLU·mul,
//! softmax. Each is a plain loop that LLVM vectorizes; an AVX2+FMA build of the same loop is
//! chosen at run time (the default x86-64 target only has SSE2).

use crate::pool::{split, SharedMut, ThreadPool};
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
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? { generic($($arg),*) }
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
    /// g = silu(g) · u.
    pub fn silu_mul(g: &mut [f32], u: &[f32]) {
        for (g, u) in g.iter_mut().zip(u) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
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

    #[test]
    fn rms_norm_normalises() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
        let w = vec![1f32; 64];
        let mut o = vec![0f32; 64];
        rms_norm(&x, &w, 0.0, &mut o);
        let ms: f32 = o.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-4);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1e9];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] == 0.0 && x[2] > x[1]);
    }
}
