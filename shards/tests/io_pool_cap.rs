//! The epoll driver's blocking pool at its cap of 512 threads. Its own test binary: the pool is
//! process-wide, and this test fills it.
//!
//! 513 tasks each open a FIFO of their own for reading, which blocks in `open(2)` until a
//! writer comes: the first 512 hold every pool thread, the 513th must wait in the queue (no
//! thread beyond the cap) and run as soon as a thread frees, with nothing lost. While the pool
//! is full, a read dropped before any thread took it must let go of its file at once: it was
//! left queued (to be skipped later), holding the file's descriptor open after the `File`
//! was dropped, and keeping its loop from going idle.

mod common;
mod io_common;

use std::{
    io,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    time::{Duration, Instant},
};

use xtc_shards::{
    fs::{File, OpenOptions},
    io::DriverChoice,
    spawn_local,
    time::{sleep, timeout},
    Executor,
};

/// The pool's cap (`io/blocking.rs`, `MAX_THREADS`).
const CAP: usize = 512;

/// Pool threads alive now (their name is `xtc-blocking`).
fn pool_threads() -> usize {
    common::threads_named("xtc-blocking").len()
}

/// The device and inode of what `fd` names, or `None` if it is not open.
fn identity(fd: std::os::fd::RawFd) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a live local the kernel fills; `fd` is only asked about.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded and filled it.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// Whether this process may run about `threads` more threads: `RLIMIT_NPROC` (which binds
/// non-root users) and the cgroup's `pids.max`, where they are set.
fn room_for_threads(threads: u64) -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a plain system call filling a live local.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut lim) }, 0);
    // SAFETY: a plain system call.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < threads + 64 {
        return Err(format!("RLIMIT_NPROC is {}", lim.rlim_cur));
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in cgroup.lines() {
        // cgroup v2: "0::/path".
        if let Some(path) = line.strip_prefix("0::") {
            let max = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/pids.max"))
                .unwrap_or_default();
            if let Ok(max) = max.trim().parse::<u64>() {
                if max < threads + 64 {
                    return Err(format!("the cgroup's pids.max is {max}"));
                }
            }
        }
    }
    Ok(())
}

/// Opens the FIFO at `p` for writing without blocking: `ENXIO` while no reader has it open
/// (a reader blocked in its `open` counts as one).
fn open_writer(p: &std::path::Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
}

/// Waits on the loop (5 ms sleeps) until `done()`, for at most [`common::HANG`].
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < common::HANG, "gave up waiting for {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn a_full_pool_queues_the_next_job_runs_it_when_a_thread_frees_and_drops_a_cancelled_one_at_once() {
    // Each FIFO takes two descriptors (the reader's, the writer's), plus the test's own.
    if io_common::raise_nofile(2 * CAP as u64 + 256) < 2 * CAP as u64 + 256 {
        eprintln!(
            "WARNING: io_pool_cap not run: RLIMIT_NOFILE's hard limit is below {}",
            2 * CAP + 256
        );
        return;
    }
    if let Err(why) = room_for_threads(CAP as u64) {
        eprintln!("WARNING: io_pool_cap not run: {why}, below the pool's {CAP} threads");
        return;
    }
    let fifos: Vec<PathBuf> = (0..=CAP)
        .map(|i| common::fifo("xtc-pool-cap", &i.to_string()))
        .collect();
    let scratch = std::env::temp_dir().join(format!("xtc-pool-cap-{}-file", std::process::id()));
    std::fs::write(&scratch, b"0123456789").unwrap();

    // Samples the pool's size for the whole run: it must never pass the cap.
    let most = Arc::new(AtomicUsize::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (most, sampling) = (most.clone(), sampling.clone());
        std::thread::spawn(move || {
            while sampling.load(SeqCst) {
                most.fetch_max(pool_threads(), SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(DriverChoice::Epoll)
        .build()
        .unwrap();
    let paths = fifos.clone();
    let scratch_path = scratch.clone();
    let opened = ex
        .block_on(move || async move {
            // Opened while the pool is free: a second open would queue behind the full pool.
            let file = File::open(&scratch_path).await.unwrap();

            // Jobs queue in spawn order: the first CAP take every thread, the last waits.
            let openers: Vec<_> = paths
                .iter()
                .cloned()
                .map(|p| spawn_local(async move { OpenOptions::new().read(true).open(p).await }))
                .collect();
            wait_for("every pool thread to start", || pool_threads() == CAP).await;
            sleep(Duration::from_millis(200)).await;
            assert_eq!(pool_threads(), CAP, "the pool grew past its cap");
            assert_eq!(
                open_writer(&paths[CAP])
                    .map(drop)
                    .unwrap_err()
                    .raw_os_error(),
                Some(libc::ENXIO),
                "the job beyond the cap started: its FIFO has a reader"
            );

            // A read queued behind the full pool, dropped before any thread took it.
            let read = timeout(
                Duration::from_millis(50),
                file.read_at(Vec::with_capacity(10), 0),
            );
            assert!(read.await.is_err(), "a read behind a full pool was served");
            let fd = file.as_raw_fd();
            let before = identity(fd).expect("the file is open");
            drop(file);
            // The number may be taken again at once (the sampler opens files all the time):
            // still open means still this file.
            assert_ne!(
                identity(fd),
                Some(before),
                "the dropped read's queued job kept the file's descriptor open"
            );

            // One thread frees (its open gets a writer): it takes the queued job.
            let mut writers = vec![open_writer(&paths[0]).unwrap()];
            wait_for("the queued job to start", || {
                open_writer(&paths[CAP]).is_ok()
            })
            .await;
            writers.push(open_writer(&paths[CAP]).unwrap());
            for p in &paths[1..CAP] {
                writers.push(open_writer(p).unwrap());
            }
            let mut opened = 0;
            for (i, o) in openers.into_iter().enumerate() {
                match o.await.unwrap() {
                    Ok(_) => opened += 1,
                    Err(e) => panic!("the open of FIFO {i} failed: {e}"),
                }
            }
            drop(writers);
            opened
        })
        .unwrap();
    sampling.store(false, SeqCst);
    sampler.join().unwrap();
    for p in fifos.iter().chain([&scratch]) {
        let _ = std::fs::remove_file(p);
    }
    assert_eq!(opened, CAP + 1, "every open ended");
    let most = most.load(SeqCst);
    assert!(most <= CAP, "{most} pool threads at once, over the cap");
    assert!(most == CAP, "the sampler never saw the full pool ({most})");
}
