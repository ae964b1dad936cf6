//! The blocking pool at its cap of 512 threads, through `spawn_blocking`. Its own test
//! binary: the pool is process-wide, and this test fills it.
//!
//! A `spawn_blocking` job queued behind the full pool, whose future (which is `Send`) is
//! dropped on another thread, leaves the queue unrun. That took its loop's in-flight count to
//! zero without waking the loop, parked `WAITING` on it: `run()` never returned.

mod common;

use std::{
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use xtc_shards::spawn_blocking;

/// The pool's cap (`io/blocking.rs`, `MAX_THREADS`).
const CAP: usize = 512;

#[test]
fn a_queued_job_dropped_off_its_loops_thread_lets_run_return() {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let open = |gate: &Arc<(Mutex<bool>, Condvar)>| {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    };
    // Every pool thread held, from this thread (`spawn_blocking` works off any loop).
    let fillers: Vec<_> = (0..CAP)
        .map(|_| {
            let g = gate.clone();
            spawn_blocking(move || {
                let (open, cv) = &*g;
                let mut o = open.lock().unwrap();
                while !*o {
                    o = cv.wait(o).unwrap();
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    while common::threads_named("xtc-blocking").len() < CAP {
        if t0.elapsed() > Duration::from_secs(60) {
            open(&gate);
            panic!("the pool never filled (a thread limit below {CAP}?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let exec = common::exec(1);
    let (tx, rx) = std::sync::mpsc::channel();
    exec.spawn_on(0, move || async move {
        // Queued: every pool thread is busy and the pool is at its cap.
        let job = spawn_blocking(|| ());
        tx.send(job).unwrap();
    })
    .unwrap();
    let dropper = std::thread::spawn(move || {
        let job = rx.recv().unwrap();
        // Past the loop's park on the job.
        std::thread::sleep(Duration::from_millis(300));
        drop(job); // unqueued, on this thread
    });
    let ran = common::run_within(&exec, Duration::from_secs(20));
    dropper.join().unwrap();
    open(&gate);
    for f in fillers {
        futures::executor::block_on(f).unwrap();
    }
    assert!(
        matches!(ran, Some(Ok(()))),
        "run() did not return once the queued job was dropped: {ran:?} (None: hung)"
    );
}
