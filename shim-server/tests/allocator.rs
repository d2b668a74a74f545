//! dipamd's allocator tuning (daemon/mod.rs, `tune_allocator`), in a process of its own: the
//! tuning is process-wide, and a test binary of one test has no other test's threads
//! allocating beside it.

use dipam_shim::l7_daemon::daemon::{MMAP_THRESHOLD, tune_allocator};

/// Blocks mapped on their own right now (glibc's count).
fn mapped_blocks() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    unsafe { libc::mallinfo2() }.hblks
}

/// After a large block is freed, a block above the threshold still gets a mapping of its own
/// (so its pages go back to the system when it is freed): glibc's default would have raised
/// its threshold to the freed block's size, and served the next one from the heap, where its
/// pages stay (docs/performance.md, run 48).
#[test]
fn a_large_block_is_mapped_even_after_a_larger_one_was_freed() {
    tune_allocator();
    let huge = vec![1u8; 16 << 20];
    std::hint::black_box(&huge);
    drop(huge);
    let before = mapped_blocks();
    let block = vec![1u8; 4 * MMAP_THRESHOLD];
    std::hint::black_box(&block);
    assert_eq!(
        mapped_blocks(),
        before + 1,
        "a {} KiB block came from the heap after a 16 MiB one was freed",
        block.len() / 1024
    );
    drop(block);
    assert_eq!(
        mapped_blocks(),
        before,
        "the block's mapping was not given back"
    );
}
