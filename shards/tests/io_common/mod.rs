//! Helpers shared by the I/O integration tests (`io_*.rs`): run a body once per I/O driver,
//! hang guards, file-descriptor limits and the child-process re-exec.
#![allow(dead_code, unreachable_pub)]

use std::{future::Future, process::Command, time::Duration};

use xtc_shards::{
    io::{Driver, DriverChoice},
    Builder, Executor,
};

/// A generous bound for an operation that must not hang (a hang guard, not a timing
/// assertion).
pub const HANG: Duration = Duration::from_secs(60);

/// One driver a test body runs on.
#[derive(Debug, Clone)]
pub struct Case {
    /// `None`: the builder's default (`XTC_IO` if set, else auto).
    pub choice: Option<DriverChoice>,
    pub label: String,
}

/// io_uring and epoll, forced; plus, when `XTC_IO` is set, the builder's default choice (so a
/// CI run with `XTC_IO=epoll` exercises the environment path in every test).
///
/// `XTC_TEST_DRIVERS` (a comma list of `io_uring`, `epoll`, `default`) narrows this, e.g. for
/// `scripts/valgrind`, which runs each driver separately with `XTC_IO=<driver>
/// XTC_TEST_DRIVERS=default`.
pub fn cases() -> Vec<Case> {
    let env = std::env::var("XTC_IO")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let mut v = vec![
        Case {
            choice: Some(DriverChoice::IoUring),
            label: "io_uring".into(),
        },
        Case {
            choice: Some(DriverChoice::Epoll),
            label: "epoll".into(),
        },
    ];
    if let Some(env) = &env {
        v.push(Case {
            choice: None,
            label: format!("default (XTC_IO={env})"),
        });
    }
    if let Ok(only) = std::env::var("XTC_TEST_DRIVERS") {
        let only: Vec<String> = only
            .split(',')
            .map(|s| s.trim().to_ascii_lowercase())
            .collect();
        let name = |c: &Case| match c.choice {
            Some(DriverChoice::IoUring) => "io_uring",
            Some(DriverChoice::Epoll) => "epoll",
            _ => "default",
        };
        v.retain(|c| only.iter().any(|o| o == name(c)));
        if only.iter().any(|o| o == "default") && env.is_none() {
            v.push(Case {
                choice: None,
                label: "default (XTC_IO unset)".into(),
            });
        }
    }
    v
}

/// The driver `XTC_IO` asks for, if it names one (`auto` and unset: `None`).
pub fn env_driver() -> Option<Driver> {
    match std::env::var("XTC_IO").ok()?.parse::<DriverChoice>().ok()? {
        DriverChoice::IoUring => Some(Driver::IoUring),
        DriverChoice::Epoll => Some(Driver::Epoll),
        DriverChoice::Auto => None,
    }
}

/// Builds an executor from `configure(builder)` (shards, oversubscribed) once per driver and
/// calls `body` with it. A forced io_uring that `build()` refuses is skipped with a note;
/// every other build error fails the test.
pub fn each_driver(
    test: &str,
    shards: usize,
    configure: impl Fn(Builder) -> Builder,
    mut body: impl FnMut(Driver, Executor),
) {
    for case in cases() {
        let mut b = Executor::builder().shards(shards).oversubscribe(true);
        if let Some(c) = case.choice {
            b = b.io_driver(c);
        }
        let exec = match configure(b).build() {
            Ok(e) => e,
            Err(e) if case.choice == Some(DriverChoice::IoUring) => {
                println!("{test}: skipping io_uring (unavailable here): {e}");
                continue;
            }
            Err(e) => panic!("{test} [{}]: build: {e}", case.label),
        };
        let driver = exec.io_driver();
        if let Some(DriverChoice::IoUring) = case.choice {
            assert_eq!(driver, Driver::IoUring);
        }
        if let Some(DriverChoice::Epoll) = case.choice {
            assert_eq!(driver, Driver::Epoll);
        }
        if case.choice.is_none() {
            if let Some(want) = env_driver() {
                assert_eq!(driver, want, "XTC_IO must pick the driver");
            }
        }
        println!("{test}: running on {driver} [{}]", case.label);
        start_tickers(&exec);
        body(driver, exec);
    }
}

/// [`each_driver`] with a `block_on` of `make()` on shard 0; checks that the loop used the
/// driver the executor reports.
pub fn on_each_driver<F, Fut>(test: &str, shards: usize, make: F)
where
    F: Fn(Driver) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    each_driver(
        test,
        shards,
        |b| b,
        |driver, exec| {
            let make = make.clone();
            exec.block_on(move || async move {
                assert_eq!(xtc_shards::io::current_driver(), Some(driver));
                make(driver).await
            })
            .unwrap_or_else(|e| panic!("{test} [{driver}]: {e}"));
            assert_eq!(exec.loop_stats(0).unwrap().io_driver, Some(driver));
        },
    );
}

/// For `scripts/valgrind`'s io_uring pass (`XTC_TEST_TICK=1`): valgrind 3.19 runs a thread
/// blocked in `io_uring_enter` without releasing its scheduler lock, so no other thread (a
/// peer shard, a client thread, the coordinator) runs until that wait ends. With the variable
/// set, [`each_driver`] spawns a 1 ms timer task on every shard before the body runs (before
/// any loop can first park), so every wait ends soon. Such timers keep a `run()` from ever
/// going quiescent: the script skips the `run()`-based tests (`run_*`).
fn start_tickers(exec: &Executor) {
    if std::env::var_os("XTC_TEST_TICK").is_none() {
        return;
    }
    for i in 0..exec.shard_count() {
        exec.spawn_on(i, || async {
            loop {
                xtc_shards::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .expect("start a ticker");
    }
}

/// Runs `exec` on a helper thread until it returns (keeping it for the caller); fails the test
/// naming `what` if it has not returned within [`HANG`] (then stopping it, so the helper
/// thread ends) or if it returned an error.
pub fn run_or_fail(exec: &Executor, what: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = exec.handle();
    std::thread::scope(|s| {
        let runner = s.spawn(|| {
            let r = exec.run();
            let _ = tx.send(());
            r
        });
        if rx.recv_timeout(HANG).is_err() {
            h.stop();
            panic!("{what}: run() hung");
        }
        if let Err(e) = runner.join().expect("the run's thread panicked") {
            panic!("{what}: run: {e}");
        }
    });
}

/// A connected TCP pair on loopback, made on the current loop: (client, accepted side).
pub async fn tcp_pair() -> (xtc_shards::net::TcpStream, xtc_shards::net::TcpStream) {
    let l = xtc_shards::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let accept = xtc_shards::spawn_local(async move { l.accept().await.unwrap().0 });
    let c = xtc_shards::net::TcpStream::connect(addr).await.unwrap();
    let s = guard("accept", accept).await.unwrap();
    (c, s)
}

/// Awaits `fut` under the [`HANG`] guard; panics naming `what` if it does not finish.
pub async fn guard<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match xtc_shards::time::timeout(HANG, fut).await {
        Ok(v) => v,
        Err(_) => panic!("hang guard: {what} did not finish within {HANG:?}"),
    }
}

/// Raises the soft `RLIMIT_NOFILE` to at least `want` (never lowers it, never past the hard
/// limit). Returns the soft limit now in force.
pub fn raise_nofile(want: libc::rlim_t) -> libc::rlim_t {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a live local of the type getrlimit fills.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if lim.rlim_cur >= want || lim.rlim_cur >= lim.rlim_max {
        return lim.rlim_cur;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max.min(want),
        rlim_max: lim.rlim_max,
    };
    // SAFETY: `raised` is a live local; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        raised.rlim_cur
    } else {
        lim.rlim_cur
    }
}

/// Sets the soft and hard `RLIMIT_NOFILE` to `n` (only in a child process: it is process-wide).
pub fn lower_nofile(n: libc::rlim_t) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: `lim` is a live local.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit({n}): {}", std::io::Error::last_os_error());
}

/// The environment variable that turns a test into its child-process body.
pub const CHILD_ENV: &str = "XTC_TEST_CHILD";

/// Whether this process is the child `role` of a re-executed test.
pub fn is_child(role: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(role)
}

/// Re-executes this test binary running only `test` as child `role` (with `XTC_IO` removed, so
/// the child sees the defaults unless `env` sets it), and asserts it exits successfully.
pub fn run_child(test: &str, role: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env_remove("XTC_IO")
        .env_remove("XTC_TEST_DRIVERS")
        .env_remove("XTC_TEST_TICK");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- child {role} stdout ---\n{stdout}--- child {role} stderr ---\n{stderr}");
    assert!(
        out.status.success(),
        "child {role} ({test}) failed: {:?}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "child {role} did not run {test} (filter matched nothing?)"
    );
}

/// The owned-buffer stream API shared by `TcpStream` and `UnixStream`.
pub trait Stream {
    fn read<B: xtc_shards::io::IoBufMut>(
        &self,
        buf: B,
    ) -> impl Future<Output = xtc_shards::io::BufResult<usize, B>>;
    fn write_all<B: xtc_shards::io::IoBuf>(
        &self,
        buf: B,
    ) -> impl Future<Output = xtc_shards::io::BufResult<(), B>>;
}

/// `Stream` for the stream types, by their inherent methods.
macro_rules! stream_by_inherent {
    ($($t:ty),*) => {$(
        impl Stream for $t {
            fn read<B: xtc_shards::io::IoBufMut>(
                &self,
                buf: B,
            ) -> impl Future<Output = xtc_shards::io::BufResult<usize, B>> {
                <$t>::read(self, buf)
            }
            fn write_all<B: xtc_shards::io::IoBuf>(
                &self,
                buf: B,
            ) -> impl Future<Output = xtc_shards::io::BufResult<(), B>> {
                <$t>::write_all(self, buf)
            }
        }
    )*};
}
stream_by_inherent!(xtc_shards::net::TcpStream, xtc_shards::net::UnixStream);

/// `Stream` for what points at one.
macro_rules! stream_by_deref {
    ($($t:ty),*) => {$(
        impl<T: Stream> Stream for $t {
            fn read<B: xtc_shards::io::IoBufMut>(
                &self,
                buf: B,
            ) -> impl Future<Output = xtc_shards::io::BufResult<usize, B>> {
                (**self).read(buf)
            }
            fn write_all<B: xtc_shards::io::IoBuf>(
                &self,
                buf: B,
            ) -> impl Future<Output = xtc_shards::io::BufResult<(), B>> {
                (**self).write_all(buf)
            }
        }
    )*};
}
stream_by_deref!(&T, std::rc::Rc<T>);

/// Fills `a`'s socket with plain non-blocking sends of zeros until it refuses; the bytes sent.
pub fn fill(a: &impl std::os::fd::AsRawFd) -> usize {
    let zeros = [0u8; 4096];
    let mut filled = 0usize;
    loop {
        // SAFETY: a send from a live local buffer on an open descriptor.
        let n = unsafe {
            libc::send(
                std::os::fd::AsRawFd::as_raw_fd(a),
                zeros.as_ptr().cast(),
                zeros.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            break;
        }
        filled += n as usize;
    }
    filled
}

/// An empty buffer with no memory behind it: a null pointer, as the traits allow for 0 bytes
/// (the kernel takes a null, 0-byte iovec).
pub struct NoMemory;

// SAFETY: 0 bytes, none initialized: there is nothing to point at.
unsafe impl xtc_shards::io::IoBuf for NoMemory {
    fn stable_ptr(&self) -> *const u8 {
        std::ptr::null()
    }
    fn bytes_init(&self) -> usize {
        0
    }
    fn bytes_total(&self) -> usize {
        0
    }
}

// SAFETY: as above.
unsafe impl xtc_shards::io::IoBufMut for NoMemory {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        std::ptr::null_mut()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}
