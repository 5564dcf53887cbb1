//! Surviving an allocation failure with at most the current step lost (issue #6).
//!
//! Rust aborts the process when an allocation fails, and a global allocator must not unwind, so the
//! failure itself cannot be caught. The trainer keeps a reserve instead: address space mapped when
//! a run starts ([`reserve`]: private, writable, never touched — it costs no RSS, but it counts
//! against the limits that make allocations fail: `RLIMIT_AS`, `RLIMIT_DATA`, and the commit limit
//! under strict overcommit). [`ReserveAllocator`], the `memfit` binary's global allocator, gives it
//! back the first time the system allocator returns null, and retries once. Giving it back raises
//! [`released`], which the training loop treats like the memory guard's hard limit: it stops
//! before the next micro-batch, checkpoints the state before the step and exits 75.
//!
//! What it cannot cover: an allocation larger than the reserve, or one that fails again after the
//! reserve is gone, still aborts (the newest checkpoint is then the protection); and under the
//! kernel's default overcommit an exhausted machine does not fail allocations at all, its OOM killer
//! sends SIGKILL. The memory guard's budget is what acts before either.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, munmap};

/// The smallest reserve: room for the rest of a micro-batch of a small model and the staging
/// buffers of a checkpoint write.
pub const MIN_RESERVE_BYTES: usize = 64 << 20;

/// The process's reserve, which [`ReserveAllocator`] gives back.
static RESERVE: Reserve = Reserve::new();

/// The system allocator, with the reserve given back and one retry when an allocation fails.
pub struct ReserveAllocator;

// SAFETY: every call is forwarded to `System` with the caller's arguments; the retry happens only
// after a null result, when nothing was allocated.
unsafe impl GlobalAlloc for ReserveAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() && RESERVE.release() {
            // SAFETY: as above.
            return unsafe { System.alloc(layout) };
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() && RESERVE.release() {
            // SAFETY: as above.
            return unsafe { System.alloc_zeroed(layout) };
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received; a failed realloc leaves `ptr` valid, so it can be retried.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() && RESERVE.release() {
            // SAFETY: as above.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Maps the process's reserve: `bytes`, at least [`MIN_RESERVE_BYTES`], replacing any earlier one.
pub fn reserve(bytes: usize) -> std::io::Result<()> {
    RESERVE.map(bytes)
}

/// The process's reserve in bytes (0: none held).
pub fn reserved_bytes() -> usize {
    RESERVE.bytes()
}

/// Whether an allocation failed and the reserve was given back for it: the run must stop.
pub fn released() -> bool {
    RESERVE.released.load(Ordering::SeqCst)
}

/// Address space held back, and whether it was given back.
struct Reserve {
    ptr: AtomicPtr<c_void>,
    len: AtomicUsize,
    released: AtomicBool,
}

impl Reserve {
    const fn new() -> Self {
        Self {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
            released: AtomicBool::new(false),
        }
    }

    fn map(&self, bytes: usize) -> std::io::Result<()> {
        let len = NonZeroUsize::new(bytes.max(MIN_RESERVE_BYTES)).expect("a positive size");
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases nothing.
        let mapping = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        self.unmap(self.ptr.swap(std::ptr::null_mut(), Ordering::SeqCst));
        self.len.store(len.get(), Ordering::SeqCst);
        self.ptr.store(mapping.as_ptr(), Ordering::SeqCst);
        Ok(())
    }

    fn bytes(&self) -> usize {
        if self.ptr.load(Ordering::SeqCst).is_null() {
            0
        } else {
            self.len.load(Ordering::SeqCst)
        }
    }

    /// Gives the reserve back; `false` when there was none to give. Allocates nothing (it runs
    /// inside the allocator).
    fn release(&self) -> bool {
        let taken = self.ptr.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if taken.is_null() {
            return false;
        }
        self.unmap(taken);
        self.released.store(true, Ordering::SeqCst);
        true
    }

    fn unmap(&self, ptr: *mut c_void) {
        if let Some(ptr) = NonNull::new(ptr) {
            // SAFETY: `ptr` came from `map`'s mapping of `len` bytes, was swapped out of `ptr` (so
            // no one else unmaps it) and was never handed to anyone.
            let _ = unsafe { munmap(ptr, self.len.load(Ordering::SeqCst)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reserve is address space, not memory: its mapping in /proc/self/smaps has the asked
    /// size and no resident page, and releasing it removes the mapping. (The allocator's retry is
    /// tested end to end in `crates/memfit/tests/cli_train_alloc_failure.rs`, under a real
    /// `RLIMIT_AS`.)
    #[test]
    fn the_reserve_is_address_space_that_release_gives_back() {
        /// (size, resident) in bytes of the mapping that starts at `start`, if any.
        fn mapping(start: usize) -> Option<(u64, u64)> {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut lines = smaps.lines();
            while let Some(line) = lines.next() {
                let range = line.split_whitespace().next().unwrap_or("");
                let Some((from, _)) = range.split_once('-') else {
                    continue;
                };
                if usize::from_str_radix(from, 16) != Ok(start) {
                    continue;
                }
                let kib = |name: &str, lines: &mut std::str::Lines| -> u64 {
                    let l = lines.find(|l| l.starts_with(name)).unwrap();
                    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
                };
                let size = kib("Size:", &mut lines);
                return Some((size, kib("Rss:", &mut lines)));
            }
            None
        }
        let size = 256 << 20;
        let r = Reserve::new();
        r.map(size).unwrap();
        assert_eq!(r.bytes(), size);
        let start = r.ptr.load(Ordering::SeqCst) as usize;
        assert_eq!(
            mapping(start),
            Some((size as u64, 0)),
            "mapped, nothing resident"
        );
        assert!(!r.released.load(Ordering::SeqCst));
        assert!(r.release());
        assert!(r.released.load(Ordering::SeqCst));
        assert_eq!(r.bytes(), 0);
        assert_eq!(mapping(start), None, "the address space went back");
        assert!(!r.release(), "nothing left to give back");
    }
}
