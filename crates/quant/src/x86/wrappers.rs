//! The safe side of the non-K block kernels: slice checks, the pre-conversion of activation
//! headers for the multi-row kernels, and `safe_wrapper!`, which generates each kernel's safe
//! [`DotFn`], [`Dot4Fn`] and [`Dot4RowsFn`] (invoked next to the kernels, in
//! [`super::float`], [`super::legacy_avx2`] and [`super::legacy_avx512`]).

use super::helpers::load4_u32;
use crate::WeightType;
#[cfg(doc)]
use crate::{Dot4Fn, Dot4RowsFn, DotFn};
use std::arch::x86_64::*;

/// Checks that `w` and `a` hold a whole row of `n` values of `t` and its activation type, and
/// returns the number of blocks.
#[inline(always)]
pub(super) fn check_rows(t: WeightType, n: usize, w: &[u8], a: &[u8]) -> usize {
    let bs = t.block_size();
    assert!(n.is_multiple_of(bs), "{n} values is not a whole number of {} blocks", t.name());
    let nb = n / bs;
    assert!(w.len() >= nb * t.block_bytes(), "{} weight row too short", t.name());
    assert!(a.len() >= t.act_type().row_bytes(n), "{} activation row too short", t.name());
    nb
}

/// Checks [`check_rows`] for the weight row and each of the four activation rows.
#[inline(always)]
pub(super) fn check_rows4(t: WeightType, n: usize, w: &[u8], a: [&[u8]; 4]) -> usize {
    let nb = check_rows(t, n, w, a[0]);
    for a in &a[1..] {
        check_rows(t, n, w, a);
    }
    nb
}

/// Checks that `w` holds `rows` rows of `n` values of `t`, `row_bytes` apart, and that each
/// activation row holds `n` values of its activation type; returns the number of blocks per row.
#[inline(always)]
pub(crate) fn check_row_block(
    t: WeightType,
    n: usize,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    a: [&[u8]; 4],
) -> usize {
    let bs = t.block_size();
    assert!(n.is_multiple_of(bs), "{n} values is not a whole number of {} blocks", t.name());
    let nb = n / bs;
    for a in a {
        assert!(a.len() >= t.act_type().row_bytes(n), "{} activation row too short", t.name());
    }
    let rb = nb * t.block_bytes();
    assert!(row_bytes >= rb, "{} row stride {row_bytes} shorter than a row ({rb} bytes)", t.name());
    assert!(rows == 0 || w.len() >= (rows - 1) * row_bytes + rb, "{} weight rows too short", t.name());
    nb
}

/// Rows longer than this many blocks (16384 values) skip the header pre-conversion of
/// [`act_headers`] (whose buffer lives on the stack) and run the one-row kernel per row.
pub(super) const MAX_PRE_BLOCKS: usize = 512;

/// Converts the f16 headers of `nb` activation blocks (`ab` bytes each, at `a`) to f32: for
/// block `i`, `out[2i]` and `out[2i + 1]` get its first and second f16 (`d` and, for Q8_1, `s`;
/// for Q8_0 the second is the first two quants, never used). Exactly what the block kernels
/// compute from the headers themselves (f16 → f32 is exact), so kernels reading these give the
/// same results.
///
/// # Safety
/// AVX2/F16C present; `nb` blocks of `ab >= 4` bytes readable at `a`; `2 * nb` f32 writable at
/// `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn act_headers(nb: usize, a: *const u8, ab: usize, out: *mut f32) {
    let mut i = 0;
    while i + 4 <= nb {
        // SAFETY: `i + 4 <= nb`: the headers of blocks `i..i + 4` are inside the `nb` blocks at
        // `a`, and `out[2i..2i + 8]` inside the `2 * nb` f32 at `out` (the caller's contract).
        unsafe { _mm256_storeu_ps(out.add(2 * i), _mm256_cvtph_ps(load4_u32(a.add(i * ab), ab))) };
        i += 4;
    }
    while i < nb {
        // SAFETY: `i < nb`: block `i`'s 4 header bytes are readable and `out[2i..2i + 2]` (the 8
        // bytes `_mm_store_sd` writes) writable, by the caller's contract.
        unsafe { _mm_store_sd(out.add(2 * i) as *mut f64, _mm_castps_pd(_mm_cvtph_ps(_mm_loadu_si32(a.add(i * ab))))) };
        i += 1;
    }
}

/// Safe wrappers around a block kernel `$kernel::<T, PRE>`: `$name` (a [`DotFn`]) runs its 1-token
/// instance; `$name4` (a [`Dot4Fn`]) its 4-token instance, or its 2-token instance twice
/// (`tokens = 2`); `$rows` (a [`Dot4RowsFn`], if given) converts the four activation rows' headers
/// once ([`act_headers`]) and then runs the pre-converted-header instance (`PRE = true`) on each
/// weight row. `$feat` is the kernel's target feature list. (The AVX-512 multi-row kernels are
/// [`super::pair`]'s.)
macro_rules! safe_wrapper {
    (float $name:ident, $kernel:ident, $t:expr) => {
        pub(super) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = check_rows($t, n, w, a);
            // SAFETY: this wrapper is handed out only after run-time detection of every feature
            // `$kernel` is compiled for (module invariant); `check_rows` verified that `w` and `a`
            // hold `nb` whole values, which is all the kernel reads.
            unsafe { $kernel(nb, w.as_ptr(), a.as_ptr()) }
        }
    };
    ($name:ident, $name4:ident, $kernel:ident, $t:expr, tokens = $tok:tt $(, rows = $rows:ident, $feat:literal)?) => {
        pub(super) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = check_rows($t, n, w, a);
            // SAFETY: this wrapper is handed out only after run-time detection of every feature
            // `$kernel` is compiled for (module invariant); `check_rows` verified that `w` and `a`
            // hold `nb` whole blocks, which is all the kernel reads.
            unsafe { $kernel::<1, false>(nb, w.as_ptr(), [a.as_ptr()], [std::ptr::null()])[0] }
        }
        pub(super) fn $name4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            let nb = check_rows4($t, n, w, a);
            // SAFETY: as for the 1-token wrapper; `check_rows4` verified every activation row.
            unsafe { safe_wrapper!(@call $tok, $kernel, false, nb, w.as_ptr(), a.map(<[u8]>::as_ptr), [std::ptr::null(); 4]) }
        }
        $(safe_wrapper!(@rows $rows, $name4, $kernel, $t, $feat, $tok);)?
    };
    (@rows $rows:ident, $name4:ident, $kernel:ident, $t:expr, $feat:literal, $tok:tt) => {
        pub(super) fn $rows(n: usize, w: &[u8], row_bytes: usize, a: [&[u8]; 4], out: &mut [[f32; 4]]) {
            let nb = check_row_block($t, n, w, row_bytes, out.len(), a);
            if nb > MAX_PRE_BLOCKS {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = $name4(n, &w[r * row_bytes..], a);
                }
                return;
            }
            /// SAFETY: `$feat` present; `out.len()` weight rows of `nb <= MAX_PRE_BLOCKS` blocks
            /// `row_bytes` apart at `w`; `nb` blocks in each activation row.
            #[target_feature(enable = $feat)]
            unsafe fn rows_kernel(nb: usize, w: *const u8, row_bytes: usize, a: [*const u8; 4], out: &mut [[f32; 4]]) {
                let mut buf = std::mem::MaybeUninit::<[[f32; 2 * MAX_PRE_BLOCKS]; 4]>::uninit();
                let buf = buf.as_mut_ptr() as *mut [f32; 2 * MAX_PRE_BLOCKS];
                let ab = $t.act_type().block_bytes();
                // SAFETY: the function's contract; `buf` has room for the `2 * nb` values per
                // token written here and read below.
                let ah: [*const f32; 4] = std::array::from_fn(|t| unsafe {
                    let p = (*buf.add(t)).as_mut_ptr();
                    act_headers(nb, a[t], ab, p);
                    p as *const f32
                });
                for (r, o) in out.iter_mut().enumerate() {
                    // SAFETY: as above; row `r` starts `r * row_bytes` bytes in.
                    *o = unsafe { safe_wrapper!(@call $tok, $kernel, true, nb, w.add(r * row_bytes), a, ah) };
                }
            }
            // SAFETY: handed out only after run-time detection of `$feat` (module invariant);
            // `check_row_block` verified `out.len()` weight rows of `nb` blocks `row_bytes` apart
            // and `nb` blocks in each activation row; `nb <= MAX_PRE_BLOCKS`.
            unsafe { rows_kernel(nb, w.as_ptr(), row_bytes, a.map(<[u8]>::as_ptr), out) }
        }
    };
    (@call 4, $kernel:ident, $pre:literal, $nb:expr, $w:expr, $a:expr, $ah:expr) => {
        $kernel::<4, $pre>($nb, $w, $a, $ah)
    };
    (@call 2, $kernel:ident, $pre:literal, $nb:expr, $w:expr, $a:expr, $ah:expr) => {{
        let (nb, w, a, ah): (usize, *const u8, [*const u8; 4], [*const f32; 4]) = ($nb, $w, $a, $ah);
        let [r0, r1] = $kernel::<2, $pre>(nb, w, [a[0], a[1]], [ah[0], ah[1]]);
        let [r2, r3] = $kernel::<2, $pre>(nb, w, [a[2], a[3]], [ah[2], ah[3]]);
        [r0, r1, r2, r3]
    }};
}
pub(super) use safe_wrapper;
