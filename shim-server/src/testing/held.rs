//! What a pass holds at its peak, for the unit tests: a counting allocator that counts only
//! the threads of one measuring runtime (its own thread and its blocking pool, where the
//! ledger is read), so a test can show that a pass over the ledger holds what it keeps and
//! not every record (docs/performance.md, run 32). Other tests' threads are not counted;
//! the measuring tests take [`one_at_a_time`] so that their counts do not mix.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    sync::atomic::{AtomicIsize, Ordering},
};

/// The unit tests' allocator: the system's, counting the bytes the measured threads hold.
pub struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted (const: no lazy init, no destructor,
    /// so reading it inside the allocator never allocates).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Bytes the counted threads allocated and have not freed since [`measure`] began (frees of
/// older memory make it lower: the peak is a floor of what was held, never inflated).
static IN_USE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

fn grow(by: isize) {
    let now = IN_USE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed to the system allocator unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && counted() {
            grow(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() && counted() {
            grow(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        if counted() {
            IN_USE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && counted() {
            grow(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Taken by every test that measures, so that two never count at once.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A runtime whose threads are counted: its blocking pool (where `Core::ledger` reads) from
/// their start, and the calling thread while [`measure`] runs on it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(|| COUNTED.with(|c| c.set(true)))
        .build()
        .expect("a test runtime")
}

/// Runs `fut` on `rt` and returns its output and the most bytes its threads held at once
/// beyond what they held when it began.
pub fn measure<T>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T>,
) -> (T, usize) {
    IN_USE.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    COUNTED.with(|c| c.set(true));
    let out = rt.block_on(fut);
    COUNTED.with(|c| c.set(false));
    let peak = PEAK.load(Ordering::SeqCst).max(0) as usize;
    (out, peak)
}
