//! The plugins' global allocator.
//!
//! A plugin is a process of a millisecond that allocates a few hundred small buffers (netlink
//! messages, JSON, strings) and exits. musl's allocator (mallocng, the libc of our static
//! release builds) maps and unmaps a group of pages for many of them and touches each afresh:
//! measured on one plugin's ADD (the one with the most to read and write), 21 `mmap` and 18 `munmap` calls and about 0.1 ms of a 1 ms
//! process. dlmalloc (the Rust port the Rust standard library uses on wasm; no C, builds for
//! every target we ship) takes its memory in a few large segments. mallocng's hardening (it
//! detects heap corruption) guards against what the plugins' safe Rust does not do; its cost
//! is paid by every plugin call.
//!
//! dlmalloc's own global wrapper takes a pthread mutex around every call, a sixth of an
//! ADD's instructions under musl. These processes have one thread, now and then two (a helper
//! thread, a deadline watcher): an uncontended spin lock is one atomic swap.
//!
//! Each plugin's `main.rs` opts in with [`global_allocator!`]; libraries, tests, tools and the
//! fuzz targets (whose sanitizers watch `malloc`) keep the platform's allocator.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// dlmalloc behind a spin lock.
pub struct Dlmalloc {
    locked: AtomicBool,
    heap: UnsafeCell<dlmalloc::Dlmalloc>,
}

// SAFETY: `heap` is only reached with `locked` held (`with`), one thread at a time.
unsafe impl Sync for Dlmalloc {}

impl Dlmalloc {
    pub const fn new() -> Dlmalloc {
        Dlmalloc { locked: AtomicBool::new(false), heap: UnsafeCell::new(dlmalloc::Dlmalloc::new()) }
    }

    fn with<T>(&self, f: impl FnOnce(&mut dlmalloc::Dlmalloc) -> T) -> T {
        let mut spins = 0u32;
        while self.locked.swap(true, Ordering::Acquire) {
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now(); // the holder may be off the CPU
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: the lock is held: no other reference to the heap exists until it is released.
        let out = f(unsafe { &mut *self.heap.get() });
        self.locked.store(false, Ordering::Release);
        out
    }
}

impl Default for Dlmalloc {
    fn default() -> Dlmalloc {
        Dlmalloc::new()
    }
}

// SAFETY: each call forwards to dlmalloc's function of the same contract, under the lock.
unsafe impl GlobalAlloc for Dlmalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as GlobalAlloc::alloc (a layout of non-zero size).
        self.with(|h| unsafe { h.malloc(layout.size(), layout.align()) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as GlobalAlloc::alloc_zeroed.
        self.with(|h| unsafe { h.calloc(layout.size(), layout.align()) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator with `layout` (the caller's contract).
        self.with(|h| unsafe { h.free(ptr, layout.size(), layout.align()) })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as GlobalAlloc::realloc (`ptr` of this allocator with `layout`).
        self.with(|h| unsafe { h.realloc(ptr, layout.size(), layout.align(), new_size) })
    }
}

/// Make [`Dlmalloc`] the binary's global allocator (one use, in a binary crate's root).
#[macro_export]
macro_rules! global_allocator {
    () => {
        #[global_allocator]
        static GLOBAL_ALLOCATOR: $crate::alloc::Dlmalloc = $crate::alloc::Dlmalloc::new();
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    static HEAP: Dlmalloc = Dlmalloc::new();

    #[test]
    fn allocates_frees_and_grows_from_several_threads() {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 1..2000usize {
                        let size = (i * 37 + t) % 5000 + 1;
                        let layout = Layout::from_size_align(size, 1 << (i % 7)).unwrap();
                        // SAFETY: a non-zero size; every pointer is freed with its layout.
                        unsafe {
                            let p = if i % 3 == 0 { HEAP.alloc_zeroed(layout) } else { HEAP.alloc(layout) };
                            assert!(!p.is_null());
                            assert_eq!(p as usize % layout.align(), 0);
                            if i % 3 == 0 {
                                assert!((0..size).all(|k| *p.add(k) == 0), "zeroed");
                            }
                            p.write_bytes(t as u8, size);
                            let q = HEAP.realloc(p, layout, size * 2);
                            assert!(!q.is_null());
                            assert!((0..size).all(|k| *q.add(k) == t as u8), "kept by realloc");
                            HEAP.dealloc(q, Layout::from_size_align(size * 2, layout.align()).unwrap());
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
