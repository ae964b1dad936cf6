//! [`Home`]: a task's reference to its home loop, counted without an atomic read-modify-write
//! when the task is made and freed on that loop.
//!
//! Every task's metadata names its home loop (`TaskMeta::home`), and that loop's
//! [`LoopShared`] must stay allocated while the task does: a waker may fire, or a
//! `JoinHandle` be dropped, on any thread after the executor is gone, and both reach the
//! loop through it. An `Arc<LoopShared>` per task did that with an atomic increment at spawn
//! and an atomic decrement at free: two locked instructions, each of which waits for the
//! stores before it (the new task's initialisation) to drain. Counted as below, a million
//! `spawn_local`s each joined ran at 9.7 to 10.1 M tasks/s against 9.0 to 9.2 with the `Arc`
//! (three interleaved runs of one harness on the development VM, `bench/RESULTS.md`), as fast
//! as a build that (unsoundly, to measure) counted nothing at all. No crate counts references
//! this way (biased toward one thread, in bulk), so it is written here.
//!
//! # Protocol
//!
//! A loop's `task_refs` counts *units*; each [`Home`] owns one.
//!
//! 1. **The collective reference.** While `task_refs` is above zero, the units together own
//!    one strong count of the loop's `Arc`: whoever moves `task_refs` up from zero adds it
//!    (and holds an `Arc` of its own meanwhile, so the loop is alive for the add), and
//!    whoever moves it down to zero gives it back. The two alternate in `task_refs`'s
//!    modification order, so the count is held exactly while units exist.
//! 2. **The bank.** A running loop (its `Core`) keeps spare units in `Core::home_bank`, a plain
//!    counter only its own thread touches. A `Home` made on that loop's thread takes a unit
//!    from the bank, or, with the bank empty, adds [`REFILL`] units at once with one
//!    `fetch_add` and banks the rest. A `Home` dropped on that loop's thread (found by the
//!    thread's current loop, as every other owner check in xtc) puts its unit back in the
//!    bank. No atomic is touched on either path.
//! 3. **Elsewhere.** A `Home` made off its loop (a `spawn_on` from another thread, a
//!    migratable task spawned for another loop) adds one unit with `fetch_add`; one dropped
//!    off its loop (a task freed by a foreign waker's drop, a stolen migratable task) gives
//!    its unit back with `fetch_sub`. Releases are `AcqRel`: the release that reaches zero
//!    then drops the collective count (rule 1) after every holder's last use of the loop.
//! 4. **Closing the bank.** A `Core` gives its banked units back, with one `fetch_sub`, when it
//!    is dropped. Its thread's current-loop pointer is reset before that (the `Enter` guard
//!    borrows the `Core`), so no `Home` drop can bank into a `Core` that has already closed its
//!    bank: later drops on that thread take rule 3.
//!
//! Units are interchangeable: a unit made in one run of a loop (or off it) may come back to
//! the bank of a later run. Every unit is in a `Home`, in a bank (which lives as long as its
//! `Core`, and a run always drops its `Core`), or given back, so the loop is freed once the
//! executor, the loop's threads and every task that names it are gone, as with the `Arc` per
//! task (`tests` below check both).
//!
//! The counts are `usize` and nothing caps them: a bank grows by one for each task made
//! elsewhere and freed on its loop, for the life of its `Core`. On a 64-bit target that needs
//! 2^64 such tasks to wrap (xtc builds only for x86_64 Linux today); a 32-bit port would need
//! a cap (trim a bank above a few `REFILL`s with one `fetch_sub`), or a wrap would read as the
//! last release while units are still out.

use std::{ops::Deref, ptr::NonNull, sync::Arc};

use crate::{
    context::Core,
    event_loop::LoopShared,
    sync::{
        AtomicUsize,
        Ordering::{AcqRel, Relaxed},
    },
};

/// Units a loop adds to its bank at once when it runs out (rule 2): one `fetch_add` per this
/// many tasks spawned on a loop whose tasks do not come back to it. Units are only a count:
/// a large bank costs no memory.
const REFILL: usize = 256;

/// A task's counted reference to its home loop; dereferences to the loop's [`LoopShared`].
/// Cost: see the module doc (no atomic when made and dropped on the loop's own thread).
pub(crate) struct Home(NonNull<LoopShared>);

// SAFETY: a `Home` gives out `&LoopShared` and owned `Arc<LoopShared>`s (`Home::arc`), and
// `LoopShared` is `Send + Sync`; its drop may run on any thread (rule 3's path is an atomic;
// rule 2's touches only the dropping thread's own loop).
unsafe impl Send for Home {}
// SAFETY: as above: shared access is `&LoopShared` alone.
unsafe impl Sync for Home {}

impl Home {
    /// A reference to `shared`'s loop: from this thread's bank when this thread runs that loop
    /// (rule 2), else one unit added (rule 3). Inline: it is on every spawn's path.
    #[inline]
    pub(crate) fn new(shared: &Arc<LoopShared>) -> Home {
        let ptr = Arc::as_ptr(shared);
        let banked = crate::context::with_core(|c| c.runs(ptr) && take_banked(c));
        if banked != Some(true) {
            add_units(shared, 1);
        }
        Home::at(shared)
    }

    /// [`Home::new`] for the loop `core` runs, by its own thread (which holds `core`
    /// already, so there is no thread-local look-up): always from the bank (rule 2).
    #[inline]
    pub(crate) fn of_core(core: &Core) -> Home {
        let _ = take_banked(core);
        Home::at(&core.shared)
    }

    /// The `Home` of `shared`'s loop, whose unit the caller has just taken.
    #[inline]
    fn at(shared: &Arc<LoopShared>) -> Home {
        // From `Arc::as_ptr`, not from a reference to the loop: the pointer must carry the
        // whole allocation's provenance, counts included, for `arc` and the release's
        // `decrement_strong_count` (Miri rejected a reference-derived one).
        // SAFETY: an `Arc`'s pointer is never null.
        Home(unsafe { NonNull::new_unchecked(Arc::as_ptr(shared).cast_mut()) })
    }

    /// The loop's address, for identity checks.
    pub(crate) fn as_ptr(this: &Home) -> *const LoopShared {
        this.0.as_ptr()
    }

    /// A strong `Arc` of the loop, for a caller that must keep it past this `Home` (a wake that
    /// pushes into the inbox of a loop whose task may finish at once). One atomic increment.
    pub(crate) fn arc(this: &Home) -> Arc<LoopShared> {
        let ptr = this.0.as_ptr().cast_const();
        // SAFETY: `ptr` came from an `Arc<LoopShared>` (`Home::new`), and the collective count
        // that this `Home`'s unit keeps (rule 1) holds it alive, so adding a strong count and
        // rebuilding an `Arc` that owns it is sound.
        unsafe {
            Arc::increment_strong_count(ptr);
            Arc::from_raw(ptr)
        }
    }
}

impl Deref for Home {
    type Target = LoopShared;

    fn deref(&self) -> &LoopShared {
        // SAFETY: this `Home`'s unit keeps the loop allocated (rule 1) while it lives.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for Home {
    // Inline: every task's free runs it, from async-task code built in the user's crate.
    #[inline]
    fn drop(&mut self) {
        let ptr = self.0.as_ptr().cast_const();
        let banked = crate::context::with_core(|c| {
            let mine = c.runs(ptr);
            if mine {
                c.home_bank.set(c.home_bank.get() + 1);
            }
            mine
        });
        if banked != Some(true) {
            // SAFETY: this `Home`'s unit keeps the loop alive up to this release.
            unsafe { release_units(ptr, 1) };
        }
    }
}

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Home").field(&self.index).finish()
    }
}

/// Takes one unit from `core`'s bank (rule 2), refilling it first if it is empty. Returns
/// `true` (it always takes one), for [`Home::new`]'s condition.
#[inline]
fn take_banked(core: &Core) -> bool {
    let left = core.home_bank.get();
    if left > 0 {
        core.home_bank.set(left - 1);
    } else {
        add_units(&core.shared, REFILL);
        core.home_bank.set(REFILL - 1);
    }
    true
}

/// Rule 1's add, on a unit counter: `n` units more. Returns whether there were none, in which
/// case the caller, who holds a strong count of its own meanwhile, must take the collective
/// one. (The loom model `loom_home` runs this and [`release`] as they ship.)
pub(crate) fn add(refs: &AtomicUsize, n: usize) -> bool {
    // Relaxed: a unit is made by a holder of a strong count, which orders nothing it needs;
    // the release that reaches zero orders itself after this add through the counter.
    refs.fetch_add(n, Relaxed) == 0
}

/// Rules 1 and 3's release, on a unit counter: `n` units fewer. Returns whether that ended the
/// last unit, in which case the caller must give the collective count back (after this
/// returns: the counter may then be freed). `AcqRel`: every holder's earlier use of the loop
/// happens before the release that ends the last unit, and so before the loop is freed.
pub(crate) fn release(refs: &AtomicUsize, n: usize) -> bool {
    let prev = refs.fetch_sub(n, AcqRel);
    debug_assert!(prev >= n, "released {n} units of {prev}");
    prev == n
}

/// Adds `n` units to `shared`'s loop, taking the collective count if there were none (rule 1).
/// The caller's `Arc` keeps the loop alive meanwhile. Out of line: off the usual path.
#[inline(never)]
fn add_units(shared: &Arc<LoopShared>, n: usize) {
    if add(&shared.task_refs, n) {
        // The collective count (rule 1), given back by the release that reaches zero.
        std::mem::forget(Arc::clone(shared));
    }
}

/// Gives back `n` units of the loop at `ptr`; the release that reaches zero drops the
/// collective count (rule 1), which may free the loop.
///
/// # Safety
/// The caller owns `n` units of that loop (so it is alive until this call returns the last).
#[inline(never)]
pub(crate) unsafe fn release_units(ptr: *const LoopShared, n: usize) {
    // SAFETY: the caller's units keep the loop alive until `release`'s `fetch_sub`. When that
    // is not the last release, another thread may free the loop before `release` returns,
    // while it still holds this reference, with nothing read through it after the
    // decrement: the pattern of std's `Arc::drop`, sound for a reference to an atomic
    // (interior mutability, rust-lang/rust#55005).
    let last = release(unsafe { &(*ptr).task_refs }, n);
    if last {
        // SAFETY: the units together owned one strong count of this `Arc` (rule 1), and this
        // release ended the last of them: it is ours to give back.
        unsafe { Arc::decrement_strong_count(ptr) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::{Arc, Weak};

    use crate::{event_loop::LoopShared, sync::Ordering::Relaxed};

    /// Units out of `weak`'s loop, `None` once it is freed.
    fn units(weak: &Weak<LoopShared>) -> Option<usize> {
        weak.upgrade().map(|l| l.task_refs.load(Relaxed))
    }

    /// Tasks made and joined on the loop take and return units through the bank (more than
    /// one refill's worth); when the run ends its bank is closed, so exactly the tasks still
    /// alive hold units. Those keep the loop allocated past the executor, and the last one,
    /// freed on another thread, frees it.
    #[test]
    fn units_count_the_live_tasks_and_the_last_one_frees_the_loop() {
        let ex = crate::LocalExecutor::new().unwrap();
        let weak = Arc::downgrade(&ex.shared.loops[0]);
        let spawned = 3 * super::REFILL;
        let kept = ex.block_on(async move {
            let mut handles: Vec<_> = (0..spawned)
                .map(|i| crate::spawn_local(async move { i }))
                .collect();
            let kept = handles.split_off(spawned - 100);
            for (i, h) in handles.into_iter().enumerate() {
                assert_eq!(h.await.unwrap(), i);
            }
            kept
        });
        assert_eq!(
            units(&weak),
            Some(100),
            "one unit per live task, none banked"
        );
        drop(ex);
        assert_eq!(
            units(&weak),
            Some(100),
            "live tasks keep their loop allocated"
        );
        std::thread::spawn(move || drop(kept)).join().unwrap();
        assert_eq!(units(&weak), None, "the last task's unit freed the loop");
    }

    /// Across loops and threads: tasks spawned on shard 0 from another thread (rule 3), on
    /// shard 1 by a task there (rule 2), migratable ones stolen or not, a call between the
    /// two shards. Once the executor and every handle are gone, both loops are freed: no unit
    /// is left out, in a bank or anywhere else.
    #[test]
    fn every_unit_comes_back_across_loops() {
        let exec = crate::Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .build()
            .unwrap();
        let loops: Vec<Weak<LoopShared>> = (0..2)
            .map(|i| Arc::downgrade(&exec.handle().shared.loops[i]))
            .collect();
        let outside: Vec<_> = (0..50)
            .map(|i| exec.spawn_on(0, move || async move { i }).unwrap())
            .collect();
        let on_one = exec
            .spawn_on(1, || async {
                let local: Vec<_> = (0..300)
                    .map(|i| crate::spawn_local(async move { i }))
                    .collect();
                // Fewer than a deque's first buffer holds: a resized deque's old buffer is
                // crossbeam-epoch's garbage, which Miri (`scripts/miri`) would report as leaked.
                let moving: Vec<_> = (0..50).map(|i| crate::spawn(async move { i })).collect();
                let mut sum = 0;
                for h in local.into_iter().chain(moving) {
                    sum += h.await.unwrap();
                }
                sum += crate::shard::submit_to(0, || async { 7 }).await.unwrap();
                sum
            })
            .unwrap();
        exec.run().unwrap();
        let sum = futures::executor::block_on(on_one).unwrap();
        assert_eq!(sum, (0..300).sum::<usize>() + (0..50).sum::<usize>() + 7);
        drop(exec);
        assert!(
            units(&loops[0]).is_some_and(|u| u >= 50),
            "held by the 50 handles"
        );
        drop(outside);
        for (i, l) in loops.iter().enumerate() {
            assert_eq!(units(l), None, "loop {i} is freed");
        }
    }
}
