//! Loom model of a steal against the quiescence snapshot (`executor/quiesce.rs`,
//! `steal::try_steal`). crossbeam-deque's `steal_batch_and_pop` hands the stolen task back to
//! the thief before the thief pushes it into its own deque, so for a moment the task is in no
//! queue. The thief raises its `StealShared::stealing` flag (SeqCst) before it takes and
//! lowers it after the push, and the snapshot counts a raised flag as queued. What the
//! coordinator needs: two snapshots in a row never both miss the task (a missed task read as
//! parked was reported as a deadlock and dropped). One snapshot alone may miss it (it reads the
//! thief's flag before the steal and the victim's queue after it); the second then sees the
//! raised flag or the task in the thief's deque.
//!
//! crossbeam's deques do not run under loom: a queue here is the count of tasks it holds, and
//! the snapshot reads the loops in index order, each loop's flag and then its queue, as
//! `Snapshot::take` does. The thief's pop of the task (to run it) is not modelled: it
//! publishes `BUSY` first, a new epoch that makes the two snapshots differ.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{sync::Arc, thread};

use crate::sync::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// One loop as the snapshot sees it: its steal flag and how many tasks its queues hold.
#[derive(Default)]
struct Loop {
    stealing: AtomicBool,
    queued: AtomicUsize,
}

/// `Snapshot::take`'s `queued`, over the loops in index order.
fn snapshot_queued(loops: &[Loop; 2]) -> bool {
    loops
        .iter()
        .any(|l| l.stealing.load(SeqCst) || l.queued.load(SeqCst) > 0)
}

/// The thief (loop `thief`) steals the one task queued at the other loop while the
/// coordinator takes two snapshots; `flag` false leaves the flag out (the expected-fail
/// variant, the code before the fix).
fn race(thief: usize, flag: bool) {
    loom::model(move || {
        let loops = Arc::new(<[Loop; 2]>::default());
        let victim = 1 - thief;
        loops[victim].queued.store(1, SeqCst);
        let stealer = {
            let loops = loops.clone();
            thread::spawn(move || {
                let me = &loops[thief];
                if flag {
                    me.stealing.store(true, SeqCst);
                }
                // `steal_batch_and_pop`: out of the victim's queue, into the thief's hands.
                loops[victim].queued.fetch_sub(1, SeqCst);
                // `w.push(r)`.
                me.queued.fetch_add(1, SeqCst);
                if flag {
                    me.stealing.store(false, SeqCst);
                }
            })
        };
        let first = snapshot_queued(&loops);
        let second = snapshot_queued(&loops);
        assert!(
            first || second,
            "two snapshots in a row missed a task in a thief's hands"
        );
        stealer.join().unwrap();
    });
}

#[test]
fn loom_steal_window_a_lower_thief_is_seen_by_one_of_two_snapshots() {
    race(0, true);
}

#[test]
fn loom_steal_window_a_higher_thief_is_seen_by_one_of_two_snapshots() {
    race(1, true);
}

/// Without the flag two snapshots can both miss it (loom finds the interleaving).
#[test]
#[should_panic(expected = "two snapshots in a row missed")]
fn loom_steal_window_without_the_flag_is_missed() {
    race(1, false);
}
