//! Loom model of the close protocol (`executor/mod.rs`): an `Executor` dropped while a
//! `Handle` on another thread queues a task. The dropping side marks the executor closed and
//! sweeps the queues (`ExecShared::close`, [`announce_closed`]); the handle's side checks the
//! flag, pushes, and checks it again, sweeping what it queued itself if the close came in
//! between (`ExecShared::spawn_on_open`, `drop_if_closed`, [`closed_after_push`]). Whatever
//! the interleaving, no task is left in a queue of the closed executor, where nobody would
//! ever free it. The model runs the shipping `Inbox` (the queue a foreign thread's spawn goes
//! to) and the shipping halves of the protocol; the sweep is `ExecShared::sweep`'s loop over
//! one inbox.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{sync::Arc, thread};

use crate::{
    event_loop::Inbox,
    executor::{announce_closed, closed_after_push},
    sync::{
        AtomicBool, AtomicUsize,
        Ordering::{Relaxed, SeqCst},
    },
};

/// A queued task: counts its drop (what a sweep's cancel does to it).
struct Task(Arc<AtomicUsize>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.fetch_add(1, Relaxed);
    }
}

/// `ExecShared::sweep` over one inbox: drains until a round finds nothing, dropping each task.
fn sweep(inbox: &Inbox<Task>) {
    let mut batch = Vec::new();
    while inbox.drain_into(&mut batch) > 0 {
        batch.clear();
    }
}

/// One `Handle` spawn racing the close; `recheck` false leaves out `drop_if_closed` (the
/// expected-fail variant). Returns whether the spawn queued its task.
fn race(recheck: bool) {
    loom::model(move || {
        let closed = Arc::new(AtomicBool::new(false));
        let inbox = Arc::new(Inbox::new());
        let dropped = Arc::new(AtomicUsize::new(0));
        let spawner = {
            let (closed, inbox, dropped) = (closed.clone(), inbox.clone(), dropped.clone());
            thread::spawn(move || {
                // `spawn_on_open`: refused once closed, else queued and rechecked.
                if closed.load(SeqCst) {
                    return false;
                }
                inbox.push(Task(dropped));
                if recheck && closed_after_push(&closed) {
                    sweep(&inbox);
                }
                true
            })
        };
        // The `Executor`'s drop.
        announce_closed(&closed);
        sweep(&inbox);
        let queued = spawner.join().unwrap();
        assert_eq!(
            dropped.load(Relaxed),
            usize::from(queued),
            "a task queued while the executor closed was left in its inbox"
        );
    });
}

/// Both halves as shipped: every task queued is swept by one side or the other.
#[test]
fn loom_a_spawn_racing_the_close_is_swept_by_one_side() {
    race(true);
}

/// Without the pusher's recheck the model finds the interleaving that leaks the task (the
/// sweep ran before the push): the model above is not vacuous.
#[test]
#[should_panic(expected = "left in its inbox")]
fn loom_a_spawn_without_the_recheck_leaks_into_a_closed_executor() {
    race(false);
}
