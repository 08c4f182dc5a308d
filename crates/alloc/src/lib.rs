//! A global allocator that holds what one thread allocates inside a scope to a limit.
//!
//! Some work runs code sift does not control: a chat template is a program read from the model
//! file, and minijinja bounds its instructions (fuel) but not its values, so a template that
//! doubles a string forty times asks for a terabyte in forty instructions. [`limited`] runs a
//! closure with a byte limit on the calling thread's net allocations; [`ScopedLimitAlloc`],
//! installed as the binary's `#[global_allocator]`, counts them. Rust cannot recover from a
//! failed allocation on stable (a null return aborts), so a scope that passes its limit ends the
//! process at once with exit status 1 and the scope's message: an error the user can act on,
//! where the system allocator would have taken the machine's memory first (or every byte of a
//! `--memory` budget).
//!
//! Outside a scope, or in a binary that does not install the allocator (tests of other crates),
//! nothing is counted and [`limited`] only runs its closure. The cost elsewhere is one
//! thread-local read per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// The active scope's limit in bytes (0: no scope).
    static LIMIT: Cell<usize> = const { Cell::new(0) };
    /// Net bytes allocated by this thread since the scope began (frees of older blocks count
    /// too, so it may go below zero).
    static USED: Cell<isize> = const { Cell::new(0) };
    /// What the scope is doing, for the message at the limit.
    static WHAT: Cell<&'static str> = const { Cell::new("") };
}

/// The system allocator, counting the current thread's allocations inside a [`limited`] scope.
pub struct ScopedLimitAlloc;

/// Adds `delta` bytes to the scope's count; past the limit, ends the process.
#[inline]
fn count(delta: isize) {
    let Ok(limit) = LIMIT.try_with(Cell::get) else { return };
    if limit == 0 {
        return;
    }
    let used = USED.with(|u| {
        let v = u.get().saturating_add(delta);
        u.set(v);
        v
    });
    if delta > 0 && used > limit as isize {
        over_limit(limit);
    }
}

/// Writes the scope's message to stderr and exits with status 1, without allocating (the
/// allocator is the caller) and without running exit handlers that might.
#[cold]
fn over_limit(limit: usize) -> ! {
    let what = WHAT.with(Cell::get);
    let mut buf = [0u8; 20];
    let mib = decimal(limit >> 20, &mut buf);
    for part in [&b"error: "[..], what.as_bytes(), b" (limit ", mib, b" MiB)\n"] {
        write_stderr(part);
    }
    // SAFETY: `_exit` takes no pointers and never returns; it skips atexit handlers and
    // destructors, which is the point here (they may allocate).
    unsafe { libc::_exit(1) }
}

/// `n` in decimal, in the tail of `buf`.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

fn write_stderr(mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: `b` is a live slice; `write` reads at most `b.len()` bytes from it.
        let n = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
        if n <= 0 {
            return;
        }
        b = &b[n as usize..];
    }
}

// SAFETY: every call is forwarded to `System` with the same arguments; the counting around it
// touches only const-initialised thread-locals without destructors (no allocation, no reentry).
unsafe impl GlobalAlloc for ScopedLimitAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` came from `System` (every allocation goes through it) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: as for `dealloc`; `new_size` is the caller's, valid for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` with the calling thread's net allocations held to `limit` bytes; past it the process
/// prints `error: {what} (limit N MiB)` and exits with status 1 (when [`ScopedLimitAlloc`] is
/// the global allocator). Scopes do not nest: an inner scope replaces the outer one until it ends.
pub fn limited<R>(limit: usize, what: &'static str, f: impl FnOnce() -> R) -> R {
    struct Restore(usize, isize, &'static str);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.with(|l| l.set(self.0));
            USED.with(|u| u.set(self.1));
            WHAT.with(|w| w.set(self.2));
        }
    }
    let _restore = Restore(LIMIT.with(Cell::get), USED.with(Cell::get), WHAT.with(Cell::get));
    WHAT.with(|w| w.set(what));
    USED.with(|u| u.set(0));
    LIMIT.with(|l| l.set(limit.max(1)));
    f()
}

/// Net bytes the current thread has allocated in the active scope (0 outside one, or where the
/// allocator is not installed).
pub fn scope_used() -> isize {
    if LIMIT.with(Cell::get) == 0 {
        0
    } else {
        USED.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOC: ScopedLimitAlloc = ScopedLimitAlloc;

    #[test]
    fn a_scope_counts_its_threads_net_allocations() {
        assert_eq!(scope_used(), 0);
        limited(64 << 20, "test", || {
            let v = vec![0u8; 1 << 20];
            assert!(scope_used() >= 1 << 20, "{}", scope_used());
            // Another thread's allocations are not this scope's.
            std::thread::spawn(|| vec![1u8; 8 << 20].len()).join().unwrap();
            assert!(scope_used() < 2 << 20, "{}", scope_used());
            drop(v);
            assert!(scope_used() < 1 << 20, "{}", scope_used());
        });
        assert_eq!(scope_used(), 0);
    }

    #[test]
    fn decimal_writes_numbers() {
        let mut b = [0u8; 20];
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(1234, &mut b), b"1234");
        assert_eq!(decimal(usize::MAX, &mut b), b"18446744073709551615");
    }
}
