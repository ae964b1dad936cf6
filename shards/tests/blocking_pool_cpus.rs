//! The blocking pool's threads run on the allowed CPUs of every executor built so far, not
//! only the first one's. Its own binary: the pool's CPUs are process-wide. From the placement
//! audit of stop 49.
mod common;

use std::time::Duration;

use common::affinity;

use xtc_shards::{self as xtc, Executor};

/// An executor built (not even run) on a thread narrowed to CPU 0, e.g. inside a task of a
/// pinned shard, as `Builder::shards`' docs describe; then a full-machine executor. A
/// `spawn_blocking` job from the second executor's shard 1 ran on CPU 0 only: the pool bound
/// its threads to the first recorded topology's allowed CPUs for the process's life.
#[test]
fn pool_threads_run_on_every_built_executors_cpus() {
    let all = affinity();
    if all.len() < 2 {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: as above; this changes the spawned thread's mask only.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let first = Executor::builder().build().unwrap();
        let _ = tx.send(first.placement().cpus().to_vec());
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)).unwrap(), vec![0]);

    let ex = Executor::builder().shards(2).build().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    ex.spawn_on(1, move || async move {
        let a = xtc::spawn_blocking(affinity).await.unwrap();
        let _ = tx.send(a);
    })
    .unwrap();
    ex.run().unwrap();
    let seen = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(
        seen, all,
        "a pool job of the second executor runs on {seen:?}, not on the allowed CPUs {all:?}"
    );
}
