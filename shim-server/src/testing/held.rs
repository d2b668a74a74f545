//! What a pass holds at its peak, for the unit tests: a counting allocator that counts only
//! the threads of one measuring runtime (its own thread and its blocking pool, where the
//! ledger is read), so a test can show that a pass over the ledger holds what it keeps and
//! not every record (docs/performance.md, run 32). Other tests' threads are not counted;
//! the measuring tests take [`one_at_a_time`] so that their counts do not mix.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    sync::atomic::{AtomicIsize, AtomicU64, Ordering},
};

/// The unit tests' allocator: the system's, counting the bytes the measured threads hold.
pub struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted (const: no lazy init, no destructor,
    /// so reading it inside the allocator never allocates).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Bytes the counted threads allocated since [`measure`] began and that are not freed yet
/// (by any thread); memory from before is never counted, so frees of it (sled's cache
/// evicting pages, say) cannot hide what the measured code holds. Each block carries the
/// measure it was allocated in, in a header before it.
static IN_USE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
/// The measure under way (0: none).
static EPOCH: AtomicU64 = AtomicU64::new(0);

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

/// The header's size for `layout`: room for the epoch, keeping the block's alignment.
fn header(layout: Layout) -> usize {
    layout.align().max(16)
}

// SAFETY: each block is the system's, `header` bytes larger and as aligned, with the epoch
// written just before the caller's part; `dealloc` finds it with the same layout.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let h = header(layout);
        let Ok(full) = Layout::from_size_align(layout.size() + h, layout.align().max(16)) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `full` has a non-zero size.
        let base = unsafe { System.alloc(full) };
        if base.is_null() {
            return base;
        }
        let epoch = if counted() {
            EPOCH.load(Ordering::Relaxed)
        } else {
            0
        };
        if epoch != 0 {
            let now = IN_USE.fetch_add(layout.size() as isize, Ordering::Relaxed)
                + layout.size() as isize;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        // SAFETY: `base + h` is inside the block, and the 8 bytes before it too (h >= 16).
        unsafe {
            let user = base.add(h);
            user.cast::<u64>().sub(1).write_unaligned(epoch);
            user
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout);
        // SAFETY: `ptr` came from `alloc` with this layout: its header is just before it.
        let epoch = unsafe { ptr.cast::<u64>().sub(1).read_unaligned() };
        if epoch != 0 && epoch == EPOCH.load(Ordering::Relaxed) {
            IN_USE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: the block `alloc` made, with the layout it made it with.
        unsafe {
            System.dealloc(
                ptr.sub(h),
                Layout::from_size_align_unchecked(layout.size() + h, layout.align().max(16)),
            )
        };
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
/// of what they allocated while it ran, not freed yet.
pub fn measure<T>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T>,
) -> (T, usize) {
    IN_USE.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    EPOCH.fetch_add(1, Ordering::SeqCst);
    COUNTED.with(|c| c.set(true));
    let out = rt.block_on(fut);
    COUNTED.with(|c| c.set(false));
    let peak = PEAK.load(Ordering::SeqCst).max(0) as usize;
    (out, peak)
}

/// [`measure`], and the bytes its threads allocated while it ran that are still held when it
/// ends (what the measured code keeps).
pub fn measure_kept<T>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T>,
) -> (T, usize, usize) {
    let (out, peak) = measure(rt, fut);
    let kept = IN_USE.load(Ordering::SeqCst).max(0) as usize;
    (out, peak, kept)
}

/// The least of `times` measures of the future `make` returns, with the last one's output.
///
/// For a test that compares two peaks: sled's background flusher and its page cache run on
/// their own clock, so one read can now and then pull a node back from disk that another
/// found cached, adding a one-off buffer that is not the measured code's cost (a page of 100
/// read 1.64 MB once where it reads 0.81 MB in hundreds of other runs). A cost that grows with
/// the ledger shows in every measure, so in the least one too.
pub fn least<T, F: std::future::Future<Output = T>>(
    rt: &tokio::runtime::Runtime,
    times: usize,
    mut make: impl FnMut() -> F,
) -> (T, usize) {
    let (mut out, mut least) = measure(rt, make());
    for _ in 1..times {
        let (next, peak) = measure(rt, make());
        out = next;
        least = least.min(peak);
    }
    (out, least)
}
