//! What spawning a task allocates, measured with a counting global allocator (its own test
//! binary, so no other test's allocations are counted).
//!
//! A trivial task must cost one allocation of at most 120 bytes: glibc's malloc serves
//! requests up to that size from its fast bins, and larger ones from the general bins, which
//! made spawn+join a third slower when `local --only spawn` holds a million handles
//! (bench/src/bin/local.rs).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
};

use xtc_shards as xtc;

struct Counting;

/// Allocation sizes are counted per byte up to this; larger ones share the last bucket.
const BUCKETS: usize = 512;

static COUNTING: AtomicBool = AtomicBool::new(false);
static BY_SIZE: [AtomicUsize; BUCKETS + 1] = [const { AtomicUsize::new(0) }; BUCKETS + 1];

// SAFETY: every call forwards to the system allocator with the caller's arguments; the counters
// are plain atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            BY_SIZE[layout.size().min(BUCKETS)].fetch_add(1, Relaxed);
        }
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout (above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Spawns `n` tasks with `spawn` while counting, and returns the sizes allocated at least `n`
/// times (what each task costs, once per task) and the number of all other allocations (queue
/// growth, which a warm-up cannot rule out: crossbeam's deque shrinks again when it drains).
/// A size allocated `c >= n` times counts `n` as the tasks' and the `c - n` beyond as other
/// allocations: two allocations of one size per task make `n` others, not one per-task size.
fn per_task_sizes(n: usize, spawn: impl Fn() -> xtc::JoinHandle<()>) -> (Vec<usize>, usize) {
    let mut handles = Vec::with_capacity(n);
    for b in &BY_SIZE {
        b.store(0, Relaxed);
    }
    COUNTING.store(true, Relaxed);
    for _ in 0..n {
        handles.push(spawn());
    }
    COUNTING.store(false, Relaxed);
    drop(handles);
    let (mut per_task, mut other) = (Vec::new(), 0);
    for (size, b) in BY_SIZE.iter().enumerate() {
        match b.load(Relaxed) {
            c if c >= n => {
                per_task.push(size);
                other += c - n;
            }
            c => other += c,
        }
    }
    (per_task, other)
}

fn check(what: &str, (per_task, other): (Vec<usize>, usize), n: usize) {
    assert_eq!(
        per_task.len(),
        1,
        "{what}: one allocation per task, got sizes {per_task:?}"
    );
    assert!(
        per_task[0] <= 120,
        "{what} allocates {} bytes per task; keep it at most 120",
        per_task[0]
    );
    assert!(
        other < n / 8,
        "{what}: {other} allocations besides the tasks'"
    );
}

#[test]
fn a_trivial_task_is_one_fast_bin_allocation() {
    const N: usize = 256;
    let exec = xtc::Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .build()
        .expect("one-shard executor");
    exec.block_on(|| async {
        // Warm up the loop's queue and deque so their growth is mostly not counted.
        let warm: Vec<_> = (0..1024)
            .flat_map(|_| [xtc::spawn_local(async {}), xtc::spawn(async {})])
            .collect();
        for h in warm {
            h.await.expect("warm-up task");
        }
        check(
            "spawn_local",
            per_task_sizes(N, || xtc::spawn_local(async {})),
            N,
        );
        check("spawn", per_task_sizes(N, || xtc::spawn(async {})), N);
    })
    .expect("block_on");
}
