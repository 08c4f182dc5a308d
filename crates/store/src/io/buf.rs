//! [`AlignedBuf`]: the zeroed, [`DIRECT_ALIGN`]-aligned buffer every read lands in (`O_DIRECT`
//! needs aligned memory); large ones are anonymous mappings that cost nothing until written.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::DIRECT_ALIGN;

/// Buffers at least this large are mapped straight from the OS (anonymous `mmap`): their pages
/// are zero and take no memory until first written, so a buffer sized for the worst case costs
/// only what is used (and a simulated store's buffers, never written, cost nothing).
const MMAP_MIN: usize = 1 << 20;

/// Heap buffer aligned to [`DIRECT_ALIGN`], its length a multiple of it, zero-initialised.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Whether `ptr` is an `mmap` of `len` bytes (else an allocator block).
    mapped: bool,
}

// SAFETY: an AlignedBuf uniquely owns its allocation, exactly like a Box<[u8]>; it has no interior
// mutability and no thread affinity, so moving it to or sharing `&` of it with another thread is
// as sound as for Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` only gives out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to a multiple of [`DIRECT_ALIGN`].
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.checked_next_multiple_of(DIRECT_ALIGN).expect("AlignedBuf length overflows usize");
        if len == 0 {
            return AlignedBuf { ptr: NonNull::dangling(), len: 0, mapped: false };
        }
        if len >= MMAP_MIN {
            // SAFETY: an anonymous private mapping of `len` bytes at an address of the kernel's
            // choosing touches no existing memory; the result is checked before use. Anonymous
            // pages are zero-filled and page-aligned (DIRECT_ALIGN is the page size).
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw != libc::MAP_FAILED {
                let ptr = NonNull::new(raw as *mut u8).expect("mmap returned null");
                return AlignedBuf { ptr, len, mapped: true };
            }
            // Fall back to the allocator (e.g. under a mapping-count limit).
        }
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size (len > 0) and a valid power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { ptr, len, mapped: false }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, DIRECT_ALIGN).expect("AlignedBuf length too large")
    }

    /// Length in bytes (a multiple of [`DIRECT_ALIGN`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for reads of `len` initialised bytes (allocated zeroed, or
        // dangling with len 0), and the borrow of `self` keeps it alive and unaliased by `&mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Raw pointer to the first byte (for I/O submission).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if self.mapped {
            // SAFETY: `ptr` is the start of a mapping of exactly `len` bytes made in `new`, owned
            // uniquely by this buffer and not unmapped before.
            unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
            return;
        }
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout and has not
        // been freed (we own it uniquely).
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut b = AlignedBuf::new(self.len);
        b.as_mut_slice().copy_from_slice(self.as_slice());
        b
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_basics() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
        let c = b.clone();
        assert_eq!(c.as_slice(), b.as_slice());
        let e = AlignedBuf::new(0);
        assert!(e.is_empty() && e.as_slice().is_empty());
        assert_eq!(AlignedBuf::new(4096).len(), 4096);
        // Send: moves through a thread.
        let b = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(b[8191], 7);
    }
}
