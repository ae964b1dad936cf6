//! Loom model of the task-reference units (`task/home.rs`): a loop's shared state, kept alive by
//! the strong counts of an `Arc` and by units that together own one more (rule 1), is freed
//! exactly once, never while a unit is out, whatever the order in which a bank (rules 2 and 4)
//! and holders on other threads (rule 3) add and give back units. The model runs the shipping
//! `add` and `release` over loom's `Arc` and atomics: a collective count taken twice or never
//! given back leaks the state (loom reports the leaked `Arc`), and one given back early frees it
//! while a unit is out (the state's `Drop` finds the counter above zero).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{
    cell::UnsafeCell,
    sync::{atomic::Ordering::Acquire, Arc},
    thread,
};

use crate::{
    sync::AtomicUsize,
    task::home::{add, release},
};

/// The loop's shared state: its unit counter, and data a unit's holder writes before it gives
/// the unit back (a task's last touch of its loop), read when the loop is freed: loom reports a
/// free not ordered after that write (a release without `Release`).
struct Loop {
    units: AtomicUsize,
    touched: UnsafeCell<usize>,
}

impl Loop {
    fn new() -> Arc<Loop> {
        Arc::new(Loop {
            units: AtomicUsize::new(0),
            touched: UnsafeCell::new(0),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        assert_eq!(
            self.units.load(Acquire),
            0,
            "the loop was freed with units still out"
        );
        // SAFETY: `&mut self`: nobody else holds the loop; loom checks the write was ordered
        // before this read.
        self.touched.with_mut(|t| assert!(unsafe { *t } <= 1));
    }
}

/// A unit held on some thread: the loop's address (what a `Home` holds).
struct Unit(*const Loop);

// SAFETY: model only: the unit's loop is `Sync`, and the unit itself keeps it alive (the claim
// under test).
unsafe impl Send for Unit {}

/// `add_units`: `n` units by a holder of the strong count `arc`.
fn add_units(arc: &Arc<Loop>, n: usize) -> Vec<Unit> {
    if add(&arc.units, n) {
        std::mem::forget(arc.clone());
    }
    (0..n).map(|_| Unit(Arc::as_ptr(arc))).collect()
}

/// `release_units`: gives back `units` (all of one loop) at once.
fn release_units(units: Vec<Unit>) {
    let Some(ptr) = units.first().map(|u| u.0) else {
        return;
    };
    // SAFETY: the units keep the loop alive for the call; the reference ends with it.
    let last = release(unsafe { &(*ptr).units }, units.len());
    if last {
        // SAFETY: the collective count, taken by the `add` that found none (rule 1).
        unsafe { Arc::decrement_strong_count(ptr) };
    }
}

/// A loop's bank takes a refill of two units and hands one to a task freed on another thread
/// (rule 3), which gives it back while the loop closes its bank (rule 4) and drops its `Arc`;
/// a second thread, with a strong count of its own, adds a unit and gives it back meanwhile.
#[test]
fn loom_units_keep_the_loop_alive_and_free_it_once() {
    loom::model(|| {
        let core = Loop::new();
        let mut bank = add_units(&core, 2);
        let away = vec![bank.pop().expect("a refill of two")];
        let foreign = core.clone();
        let freed_away = thread::spawn(move || {
            // SAFETY: the unit keeps the loop alive; this thread is the one writer, and the
            // loop's drop the one reader, which loom checks is ordered after this write.
            unsafe { &*away[0].0 }
                .touched
                .with_mut(|t| unsafe { *t += 1 });
            release_units(away);
        });
        let spawner = thread::spawn(move || {
            let unit = add_units(&foreign, 1);
            drop(foreign);
            release_units(unit);
        });
        release_units(bank);
        drop(core);
        freed_away.join().unwrap();
        spawner.join().unwrap();
    });
}

/// The counter goes to zero and back up: a bank that gave everything back refills while the
/// last unit out is released on another thread, so the collective count is given back and
/// taken again in either order.
#[test]
fn loom_units_refill_after_reaching_zero() {
    loom::model(|| {
        let core = Loop::new();
        let mut bank = add_units(&core, 2);
        let away = vec![bank.pop().expect("a refill of two")];
        let freed_away = thread::spawn(move || release_units(away));
        release_units(bank);
        let again = add_units(&core, 1);
        release_units(again);
        drop(core);
        freed_away.join().unwrap();
    });
}
