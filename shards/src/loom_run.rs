//! Loom models of the run claim and the stop handshake (`executor/mod.rs`): `run()` claims the
//! executor (`ExecShared::claim_run`, a swap of `running`), its loops start or fail to
//! (`RunClaim::started`), the coordinator waits for a poke or the stop flag
//! (`quiesce::coordinate`), and the claim's drop clears the stop (when the loops started) and
//! then releases `running` (`RunClaim`'s `Drop`); `Handle::stop` is `request_stop`: the reason
//! (first wins), the flag, then a poke under the coordinator's lock. What the docs of
//! `Handle::stop` and `Executor::run` promise, checked in every interleaving:
//!
//! - a stop is never lost: a run in progress when it is asked returns, and one asked while no
//!   run is in progress (before, racing the start, during a run that fails to start) ends the
//!   next run at once (a lost stop shows as a loom deadlock: the coordinator waits for good);
//! - two runs never hold the claim together, and a run that returned released it;
//! - a stop is consumed by exactly one run: the run it stopped clears it, so it is not carried
//!   into the next one, and no stop reason is left behind without its stop.
//!
//! Shipping code driven: `ExecShared` (built with no loops, in service mode unless a model
//! needs a quiescent end), `ExecShared::claim_run`, `RunClaim` and its drop,
//! `ExecShared::request_stop` (`Handle::stop` is that with `StopReason::Requested`),
//! `ExecShared::poke` (what the last loop to go `EMPTY` does, `loop_went_empty`) and
//! `quiesce::coordinate` (which, with no loops, finds quiescence at its first poke outside
//! service mode). Transcribed: `Executor::run`'s order (claim, `started` after the start gate
//! opened, coordinate, the claim's drop), in [`run`]. Not modelled: the shard threads and the
//! start gate's mutex (they only decide `started`, on the run's own thread), the loops' parker
//! (`force_unpark`; `loom_park.rs`), `block_on`'s `runs` counter.
//!
//! Ghost state is `Relaxed` (it adds no happens-before edge the protocol lacks), and the
//! final checks come after the joins.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_run`.

use loom::{sync::Arc, thread};

use crate::{
    executor::{quiesce, Config, ExecShared, StopReason},
    sync::{
        AtomicUsize,
        Ordering::{Relaxed, SeqCst},
    },
};

/// An executor with no loops; `service` for runs that end only by a stop.
fn executor(service: bool) -> Arc<ExecShared> {
    let config = Config {
        service_mode: service,
        deadlock_grace: None,
        ..Config::default()
    };
    Arc::new(ExecShared::new(0, &config).unwrap())
}

/// `Handle::stop`.
fn stop(shared: &ExecShared) {
    shared.request_stop(StopReason::Requested);
}

/// `Executor::run` reduced to the protocol: claim (or `Err(AlreadyRunning)`: `false`), the
/// start (`starts`: the gate opened, or a shard failed to start and no loop ran), the
/// coordinator until the stop, and the claim's drop as `run` returns. With `stopper`, a
/// thread asks `stop()` once the claim is held (a task of the run, or a thread told it
/// started). `in_run` counts the runs holding the claim (ghost).
fn run(shared: &Arc<ExecShared>, in_run: &AtomicUsize, starts: bool, stopper: bool) -> bool {
    let Ok(claim) = shared.claim_run() else {
        return false;
    };
    assert_eq!(
        in_run.fetch_add(1, Relaxed),
        0,
        "two runs hold the claim at once"
    );
    let stopper = stopper.then(|| {
        let shared = shared.clone();
        thread::spawn(move || stop(&shared))
    });
    if starts {
        claim.started.set(true);
        quiesce::coordinate(shared);
    }
    in_run.fetch_sub(1, Relaxed);
    drop(claim);
    if let Some(s) = stopper {
        s.join().unwrap();
    }
    true
}

/// After every thread is joined: no stop and no reason left (each stop was consumed by the
/// run it stopped), and the claim free (a fresh claim succeeds).
///
/// Only where no `run()` was refused: loom 0.7 does not keep a read-modify-write atomic
/// against a plain store of another thread it did not observe, so a refused claim's swap
/// (which read `true` from the claim it lost to, and writes `true` back) can look newer than
/// that claim's release (`store(false)`), and a final claim would be refused, which C11 rules
/// out (the swap's write directly follows the value it read in the modification order).
fn assert_consumed_and_free(shared: &ExecShared) {
    assert_consumed(shared);
    assert!(
        shared.claim_run().is_ok(),
        "a run returned without releasing its claim"
    );
}

/// [`assert_consumed_and_free`] less the claim.
fn assert_consumed(shared: &ExecShared) {
    assert!(
        !shared.stop.load(SeqCst),
        "a stop consumed by a run was carried into the next run"
    );
    assert_eq!(
        shared.stop_reason(),
        StopReason::None as u32,
        "a stop reason was left behind without its stop"
    );
}

/// A stop racing the start of a run (asked before the claim, between the claim and the
/// coordinator's first look, or while it waits) ends that run, which consumes it.
#[test]
fn loom_run_stop_racing_the_start_is_not_lost() {
    loom::model(|| {
        let shared = executor(true);
        let in_run = Arc::new(AtomicUsize::new(0));
        let stopper = {
            let shared = shared.clone();
            thread::spawn(move || stop(&shared))
        };
        assert!(run(&shared, &in_run, true, false));
        stopper.join().unwrap();
        assert_consumed_and_free(&shared);
    });
}

/// Two threads call `run()` at once, each run stopped by a stop asked after its claim: the
/// claims exclude each other, the second run (if the second call came after the first
/// returned) is not stopped by the first's stop, nor loses its own to the first's drop.
#[test]
fn loom_run_two_runs_claim_in_turn_and_keep_their_stops() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let shared = executor(true);
        let in_run = Arc::new(AtomicUsize::new(0));
        let second = {
            let (shared, in_run) = (shared.clone(), in_run.clone());
            thread::spawn(move || run(&shared, &in_run, true, true))
        };
        let first = run(&shared, &in_run, true, true);
        let second = second.join().unwrap();
        assert!(first || second, "neither run claimed the executor");
        if first && second {
            assert_consumed_and_free(&shared);
        } else {
            // One call was refused: see `assert_consumed_and_free` on loom and that swap.
            assert_consumed(&shared);
        }
    });
}

/// A stop asked while a run fails to start is kept for the next run (it ran nothing): the
/// stop, racing both, ends the second run, which consumes it.
#[test]
fn loom_run_failed_start_keeps_the_stop() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let shared = executor(true);
        let in_run = Arc::new(AtomicUsize::new(0));
        let stopper = {
            let shared = shared.clone();
            thread::spawn(move || stop(&shared))
        };
        assert!(run(&shared, &in_run, false, false));
        assert!(run(&shared, &in_run, true, false));
        stopper.join().unwrap();
        assert_consumed_and_free(&shared);
    });
}

/// A run ending on its own (quiescence: the coordinator's `request_stop(Quiescent)` after a
/// poke) races a user's `stop()`: whichever way, the run returns and the claim is free; the
/// user's stop is consumed by that run or kept whole for the next one (its flag set, a reason
/// that is not the ended run's), never half-kept (a reason without its flag), and the next
/// run consumes a kept stop.
#[test]
fn loom_run_stop_racing_a_quiescent_end() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let shared = executor(false);
        let in_run = Arc::new(AtomicUsize::new(0));
        let stopper = {
            let shared = shared.clone();
            thread::spawn(move || stop(&shared))
        };
        let poker = {
            let shared = shared.clone();
            thread::spawn(move || shared.poke())
        };
        assert!(run(&shared, &in_run, true, false));
        stopper.join().unwrap();
        poker.join().unwrap();
        let kept = shared.stop.load(SeqCst);
        let reason = shared.stop_reason();
        assert!(
            kept || reason == StopReason::None as u32,
            "a stop reason was left behind without its stop"
        );
        assert_ne!(
            reason,
            StopReason::Quiescent as u32,
            "the ended run's reason was carried into the next run"
        );
        if kept {
            // The next run consumes the kept stop (its coordinator's first look finds it).
            assert!(run(&shared, &in_run, true, false));
        }
        assert_consumed_and_free(&shared);
    });
}

/// Outside service mode a run ends on the poke of the last loop to go `EMPTY`
/// (`loop_went_empty`): the coordinator checks, finds quiescence and stops the run itself. A
/// poke that lands before the coordinator waits, or while it waits, is not lost.
#[test]
fn loom_run_a_poke_ends_a_quiescent_run() {
    loom::model(|| {
        let shared = executor(false);
        let in_run = Arc::new(AtomicUsize::new(0));
        let poker = {
            let shared = shared.clone();
            thread::spawn(move || shared.poke())
        };
        assert!(run(&shared, &in_run, true, false));
        poker.join().unwrap();
        assert_consumed_and_free(&shared);
    });
}

/// A loop that sees the stop at its step 1 (`event_loop::run`: `stop_requested`, a `Relaxed`
/// load) reads the reason next (`worker`: `exec.stop_reason()`, to keep its queued work at
/// a quiescent stop and to list its tasks at a deadlock). Nothing between the two orders the
/// reason's write before that read, so the loop may see the flag and an older reason.
#[test]
fn loom_run_a_loop_that_sees_the_stop_sees_its_reason() {
    loom::model(|| {
        let shared = executor(false);
        let coordinator = {
            let shared = shared.clone();
            // `close`'s stop.
            thread::spawn(move || shared.request_stop(StopReason::Quiescent))
        };
        // The worker: step 1's look, then the reason.
        if shared.stop_requested() {
            assert_eq!(
                shared.seen_stop_reason(),
                StopReason::Quiescent as u32,
                "a loop saw the stop but not its reason"
            );
        }
        coordinator.join().unwrap();
    });
}
