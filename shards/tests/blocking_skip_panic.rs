//! A `spawn_blocking` job whose future is dropped after a pool thread took it but before it
//! started is skipped there, its closure dropped on the pool thread. A capture whose `Drop`
//! panics unwound that thread out of the pool: a slot of the pool lost for good, the job never
//! marked done. Its own test binary: it sets the process's panic hook, and the race it needs
//! (a drop just after a pool thread took the job) takes many rounds, so it stops at the first
//! thread death or after a bounded time.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use xtc_shards::spawn_blocking;

struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("test: a blocking job's capture panics when dropped");
    }
}

/// The Linux thread ids of pool threads that panicked (caught panics included).
static PANICKED: Mutex<Vec<i64>> = Mutex::new(Vec::new());

#[test]
fn a_skipped_jobs_panicking_capture_does_not_kill_its_pool_thread() {
    std::panic::set_hook(Box::new(|_| {
        if std::thread::current().name() == Some("xtc-blocking") {
            // SAFETY: a plain syscall, no arguments.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            PANICKED.lock().unwrap().push(tid);
        }
    }));
    let ran = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(3) && rounds < 20_000 {
        rounds += 1;
        let p = PanicOnDrop;
        let r = ran.clone();
        let job = spawn_blocking(move || {
            let _p = &p;
            r.fetch_add(1, SeqCst);
        });
        // Dropped 0 to 63 µs later, sweeping the window in which a pool thread woke and took
        // the job but has not started it: queued still (unqueued here, its panic comes here),
        // taken by a thread (skipped there), or already run (the panic is the job's, caught
        // there).
        let wait = Instant::now();
        while wait.elapsed() < Duration::from_micros(rounds % 64) {
            std::hint::spin_loop();
        }
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(job)));
        std::thread::sleep(Duration::from_micros(200));
        let dead: Vec<i64> = PANICKED
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|t| !std::path::Path::new(&format!("/proc/self/task/{t}")).exists())
            .collect();
        // Pool threads leave only after 10 s idle: one gone is one that died.
        assert!(
            dead.is_empty(),
            "pool thread(s) {dead:?} died of a panic after {rounds} rounds ({} jobs ran)",
            ran.load(SeqCst)
        );
    }
    let _ = std::panic::take_hook();
}
