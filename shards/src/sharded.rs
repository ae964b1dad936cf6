//! [`Sharded<T>`]: one value per shard, reached without locks.

use std::{cell::UnsafeCell, fmt};

use crossbeam_utils::CachePadded;

use crate::{
    context::with_core,
    sync::{AtomicU64, Ordering::Relaxed},
    Error, Result, MAX_SHARDS,
};

struct Slot<T> {
    /// Identity of the loop that owns this slot (`LoopShared::uid`: its executor's id, never
    /// reused in the process, and its index), 0 while unclaimed. Not an address: a freed loop's
    /// address can come back as another loop's, whose thread would then share the slot with
    /// references still held on the old loop's thread.
    owner: AtomicU64,
    value: UnsafeCell<T>,
}

/// Per-shard state: slot `i` belongs to shard `i`, and only code running on that shard's loop
/// can reach it through `get()`. A reference it returns to a `T` that is not `Sync` stays on
/// that thread (it is not `Send`); to a `Sync` `T` (an atomic counter) a migratable task may
/// carry it across an `.await` to another shard and use shard `i`'s slot from there, which is
/// sound but credits the wrong shard: migratable code calls `get()` again after each `.await`
/// (the `shard::id()` idiom). `get()` costs a thread-local read and one atomic load of a line that only this
/// shard uses; no lock, no read-modify-write after the first access. Slots are cache-line padded
/// so shards do not false-share. Shared between threads (in an `Arc`, a `static`, a leaked
/// `&'static`) it needs `T: Send`: it is `Sync` for any `T: Send`, also a `!Sync` one such as a
/// `Cell` or a `RefCell`. For a `!Send` value (an `Rc`, a `channel::local` end, a socket),
/// built on its shard and dropped there at the run's end, use [`ShardLocal`](crate::ShardLocal).
///
/// Reaching it through an `Arc` (as below) costs each `submit_to` closure that captures a
/// clone two atomic read-modify-writes on the one count every shard touches. State that lives
/// as long as the program can be leaked instead,
/// `let store: &'static Sharded<_> = Box::leak(Box::new(Sharded::new(n, ..)))`: closures then
/// copy a reference, and no shared count moves per call (`examples/kv.rs` does this).
///
/// ```
/// # use xtc_shards as xtc;
/// use std::{cell::Cell, sync::Arc};
/// let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
/// let hits = Arc::new(xtc::Sharded::new(2, |_| Cell::new(0u64)));
/// for i in 0..2 {
///     let hits = hits.clone();
///     exec.spawn_on(i, move || async move { hits.get().set(hits.get().get() + 1) })?;
/// }
/// exec.run()?;
/// let counts: Vec<u64> = Arc::try_unwrap(hits).ok().unwrap().into_inner().into_iter().map(Cell::into_inner).collect();
/// assert_eq!(counts, vec![1, 1]);
/// # Ok::<(), xtc::Error>(())
/// ```
pub struct Sharded<T> {
    slots: Box<[CachePadded<Slot<T>>]>,
}

// SAFETY: a `&Sharded<T>` on several threads gives each at most the slot of the loop it runs:
// `try_get` hands out `&T` for slot `i` only on the thread currently running the loop that
// claimed slot `i` (first access wins, checked on every call; loops are told apart by an id
// that is never reused), and a loop runs on one thread at a time. The returned `&T` is bound
// to `&self` and, for a `!Sync` `T`, is itself `!Send`, so it cannot be carried to another
// thread; it can outlive the loop's run on its own thread (returned from a `block_on`, kept in
// a thread-local), so no other thread may ever run that loop while such a reference can live:
// an `Executor`'s loop runs on a worker thread that exits (and is joined) when its `run()`
// ends, with every reference it held, before the loop can run on a new worker; a
// `LocalExecutor` is `!Send`, so its loop only ever runs on the thread that made it. So each
// `T` that is not `Sync` is only ever accessed from one thread at a time (a reference to it is
// not `Send`, so no task output, migratable future or `Send` closure carries one off that
// thread), which needs `T: Send` (the value may have been created on another thread and is
// reached from the loop's). A `Sync` `T` may be reached from other threads through such a
// reference, which `Sync` permits.
unsafe impl<T: Send> Sync for Sharded<T> {}

impl<T> Sharded<T> {
    /// One value per shard, `init(shard)` for shards `0..count`. Cost: one allocation of
    /// `count` slots, each `T` plus a `u64` padded to a multiple of the cache-line size
    /// (128 bytes on x86_64 and aarch64).
    ///
    /// # Panics
    /// If `init` panics (the values made so far are dropped), or if `count` is more shards than
    /// any executor can have (`MAX_SHARDS_PER_CPU` times the 8192 CPUs Linux supports at most:
    /// slots past the executor's `shard_count()` are never reached, and such a count could only
    /// fail to allocate, which aborts the process). Where the count comes from input, use
    /// [`try_new`](Self::try_new).
    #[track_caller]
    pub fn new(count: usize, init: impl FnMut(usize) -> T) -> Sharded<T> {
        match Self::try_new(count, init) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`new`](Self::new), with `Err(InvalidArgument)` rather than a panic for a `count`
    /// above the largest shard count any executor can have. Cost: as `new`.
    ///
    /// # Errors
    /// `InvalidArgument` naming the count and the range to give (the executor's
    /// `shard_count()`).
    ///
    /// # Panics
    /// If `init` panics (the values made so far are dropped).
    pub fn try_new(count: usize, mut init: impl FnMut(usize) -> T) -> Result<Sharded<T>> {
        if count > MAX_SHARDS {
            return Err(Error::InvalidArgument(format!(
                "Sharded::new({count}): give the executor's shard_count() (at most {MAX_SHARDS})"
            )));
        }
        Ok(Sharded {
            slots: (0..count)
                .map(|i| {
                    CachePadded::new(Slot {
                        owner: AtomicU64::new(0),
                        value: UnsafeCell::new(init(i)),
                    })
                })
                .collect(),
        })
    }

    /// Number of slots. Cost: a field read.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots. Cost: a field read.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The current shard's value, or `None` off any loop, for a shard index beyond
    /// [`len`](Self::len), or when another executor's loop with the same index claimed the slot
    /// first. The first access from a loop claims the slot for it (one compare-and-swap).
    /// Cost otherwise: a thread-local read and one relaxed atomic load; no lock.
    pub fn try_get(&self) -> Option<&T> {
        let (index, me) = with_core(|c| (c.index(), c.shared.uid()))?;
        let slot = self.slots.get(index)?;
        let owner = slot.owner.load(Relaxed);
        if owner != me
            && (owner != 0
                || slot
                    .owner
                    .compare_exchange(0, me, Relaxed, Relaxed)
                    .is_err())
        {
            return None;
        }
        // SAFETY: this thread runs the loop that owns the slot (checked above), so no other
        // thread can be inside this slot now (see the `Sync` impl).
        Some(unsafe { &*slot.value.get() })
    }

    /// The current shard's value.
    ///
    /// # Panics
    /// Where [`try_get`](Self::try_get) gives `None`: off any loop, on a shard the value
    /// was not made for, or where another executor's loop claimed the slot first; the message
    /// says which. Cost: as [`try_get`](Self::try_get).
    pub fn get(&self) -> &T {
        match self.try_get() {
            Some(v) => v,
            None => self.no_slot(),
        }
    }

    /// `get`'s panic, naming which of `try_get`'s causes it met and what to do.
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn no_slot(&self) -> ! {
        let len = self.slots.len();
        match with_core(|c| c.index()) {
            None => panic!(
                "Sharded::get called off any xtc loop: call it inside a task (size the value \
                 with the executor's shard_count(); shard::count() is 0 off any loop)"
            ),
            Some(i) if i >= len => panic!(
                "Sharded::get runs on shard {i}, but this value has {len} slots: size it with \
                 the executor's shard_count() (shard::count() is 0 off any loop)"
            ),
            Some(i) => panic!(
                "Sharded::get: slot {i} was claimed first by another loop (another executor's \
                 shard {i}, or a LocalExecutor's): give each executor its own Sharded"
            ),
        }
    }

    /// Every slot, mutably, in shard order: exclusive access makes the ownership check
    /// unnecessary. Cost: no atomics, no allocation.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().map(|s| s.value.get_mut())
    }

    /// The values, in shard order. Cost: one allocation of the `Vec` (the slots are moved
    /// out, then freed).
    pub fn into_inner(self) -> Vec<T> {
        self.slots
            .into_vec()
            .into_iter()
            .map(|s| CachePadded::into_inner(s).value.into_inner())
            .collect()
    }
}

impl<T> fmt::Debug for Sharded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sharded")
            .field("len", &self.slots.len())
            .finish_non_exhaustive()
    }
}
