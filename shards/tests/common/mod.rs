//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use xtc_shards::Executor;

/// A generous bound for something that must not hang (a hang guard, not a timing assertion).
pub const HANG: Duration = Duration::from_secs(60);

/// An executor of `n` shards, oversubscribed so any `n` runs on a 2-CPU machine.
pub fn exec(n: usize) -> Executor {
    Executor::builder()
        .shards(n)
        .oversubscribe(true)
        .build()
        .expect("build executor")
}

/// [`exec`] with a deadlock grace period of `grace` (a test that expects, or rules out, a
/// deadlock report without waiting the default seconds).
pub fn exec_with_grace(n: usize, grace: Duration) -> Executor {
    Executor::builder()
        .shards(n)
        .oversubscribe(true)
        .deadlock_grace(Some(grace))
        .build()
        .expect("build executor")
}

/// Blocks the calling thread, 1 ms at a time, until `done()`; panics after [`HANG`] (the
/// callers wait for a precondition, "the task has parked": given up on quietly, the test ran
/// another scenario and could pass). On a loop thread it holds the loop, which is what some
/// tests want (a long poll); a panic there fails the task, whose join the test checks.
pub fn block_until(done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < HANG,
            "block_until: the condition did not hold within {HANG:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Inside a task: sleeps on the loop's timer, 1 ms at a time, until `done()` or for at most
/// [`HANG`] (a hang guard: the caller's assertions say what was missed), and returns `done()`.
/// The loop runs its other tasks meanwhile, unlike [`block_until`].
pub async fn sleep_until(done: impl Fn() -> bool) -> bool {
    let t = Instant::now();
    while !done() && t.elapsed() < HANG {
        xtc_shards::time::sleep(Duration::from_millis(1)).await;
    }
    done()
}

/// Spins the CPU for `d` (a CPU-bound task body).
pub fn burn(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs `ex` on another thread and waits at most `limit` for `run()` to return: a hang fails
/// the test (naming `what`) instead of blocking the suite.
pub fn run_or_fail(ex: Executor, limit: Duration, what: &str) -> xtc_shards::Result<()> {
    run_within(&ex, limit).unwrap_or_else(|| panic!("run() hung: {what}"))
}

/// Runs `ex` on a scoped thread (it may be run again afterwards); `None` if it had not
/// returned after `limit`: it is then stopped, so the test fails instead of hanging.
pub fn run_within(ex: &Executor, limit: Duration) -> Option<xtc_shards::Result<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = ex.handle();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = tx.send(ex.run());
        });
        match rx.recv_timeout(limit) {
            Ok(r) => Some(r),
            Err(_) => {
                h.stop();
                let _ = rx.recv_timeout(HANG);
                None
            }
        }
    })
}

/// Adds one to its counter when dropped (did a value go, and only once?).
pub struct CountDrop(pub std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A waker whose `wake` panics: user code, as when a future is polled with a custom waker.
pub fn panicking_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(p: *const ()) -> RawWaker {
        RawWaker::new(p, &VTABLE)
    }
    fn wake(_: *const ()) {
        panic!("a user waker panics");
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, noop);
    // SAFETY: the vtable's functions never dereference the (null) data pointer.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// A no-op waker whose drop panics (unless the thread is already panicking): user code, as a
/// custom waker's drop is.
pub fn drop_panicking_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(p: *const ()) -> RawWaker {
        RawWaker::new(p, &VTABLE)
    }
    fn noop(_: *const ()) {}
    fn drop_panics(_: *const ()) {
        if !std::thread::panicking() {
            panic!("a user waker panics when dropped");
        }
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, drop_panics);
    // SAFETY: the vtable's functions never dereference the (null) data pointer.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// A no-op waker whose last clone's drop runs `hook`: user code inside `Waker::drop`, as a
/// custom waker owning a channel end may run. For one thread only (an `Rc` inside).
pub fn drop_hooked_waker(hook: impl FnOnce() + 'static) -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    struct Hook(std::cell::Cell<Option<Box<dyn FnOnce()>>>);
    impl Drop for Hook {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    // The vtable's functions: `p` comes from `Rc::into_raw` of a live `Rc<Hook>`, whose
    // count they keep (clone adds one, wake and drop give one back).
    unsafe fn clone(p: *const ()) -> RawWaker {
        // SAFETY: `p` is a live `Rc<Hook>`'s pointer (above).
        unsafe { std::rc::Rc::increment_strong_count(p.cast::<Hook>()) };
        RawWaker::new(p, &VTABLE)
    }
    unsafe fn release(p: *const ()) {
        // SAFETY: gives back the count this waker held (above).
        drop(unsafe { std::rc::Rc::from_raw(p.cast::<Hook>()) });
    }
    unsafe fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, release, noop, release);
    let rc = std::rc::Rc::new(Hook(std::cell::Cell::new(Some(Box::new(hook)))));
    // SAFETY: the vtable keeps the `Rc`'s count (above); the tests using it stay on one thread.
    unsafe { Waker::from_raw(RawWaker::new(std::rc::Rc::into_raw(rc).cast(), &VTABLE)) }
}

thread_local! {
    /// What the next clone of a [`hooked_waker`] runs.
    static CLONE_HOOK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// The addresses of the values the tests leak on purpose (a forgotten future, a waker's data
/// that must outlive every clone), kept so that valgrind's memcheck (`scripts/valgrind`, which
/// fails on a definite leak) finds them still reachable and goes on checking the rest.
static LEAKED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// `Box::leak(Box::new(value))`, with the box kept reachable from [`LEAKED`]: never freed,
/// its destructor never run.
pub fn leak<T: 'static>(value: T) -> &'static mut T {
    let leaked = Box::leak(Box::new(value));
    keep(std::ptr::from_mut(leaked) as usize);
    leaked
}

/// `mem::forget(value)` (its destructor never runs, what it owns is never freed), with the
/// value kept reachable from [`LEAKED`] (see [`leak`]). `value` may borrow: what it borrows
/// is free again at once, as with `mem::forget`.
pub fn forget<T>(value: T) {
    keep(Box::into_raw(Box::new(value)) as usize);
}

/// Lists `address` in [`LEAKED`].
fn keep(address: usize) {
    LEAKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(address);
}

/// A no-op waker whose next clone runs `hook` (once) on the cloning thread: user code inside
/// `Waker::clone`, as a custom waker may run, for tests that the runtime clones a waker under
/// none of its own borrows.
pub fn hooked_waker(hook: impl FnOnce() + 'static) -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(p: *const ()) -> RawWaker {
        if let Some(hook) = CLONE_HOOK.with(|h| h.borrow_mut().take()) {
            hook();
        }
        RawWaker::new(p, &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    CLONE_HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    // SAFETY: the vtable's functions never dereference the (null) data pointer.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// Polls `fut` once with `waker`, catching a panic: whether it was pending, or the panic
/// (a test of what user code in a custom waker may do to the poll).
pub fn poll_caught<F: std::future::Future + ?Sized>(
    fut: std::pin::Pin<&mut F>,
    waker: &std::task::Waker,
) -> std::thread::Result<bool> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fut.poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    }))
}

/// A hang guard for a run that must stay on the calling thread (or on an `Arc<Executor>`
/// shared with another thread), where [`run_or_fail`] cannot take the executor: if not
/// [`done`](Watchdog::done) within `limit`, it stops the executor through `handle`, so the
/// run returns and `done` fails the test naming `what`; if even the stop does not end it within
/// another `limit`, it aborts the process rather than hang the suite.
pub struct Watchdog {
    done: Option<std::sync::mpsc::Sender<()>>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    what: String,
}

impl Watchdog {
    pub fn new(handle: xtc_shards::Handle, limit: Duration, what: &str) -> Watchdog {
        use std::sync::mpsc::RecvTimeoutError::Timeout;
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = fired.clone();
        let w = what.to_string();
        let thread = std::thread::spawn(move || {
            if rx.recv_timeout(limit) != Err(Timeout) {
                return;
            }
            f.store(true, std::sync::atomic::Ordering::SeqCst);
            eprintln!("watchdog: {w} still running after {limit:?}: stopping it");
            handle.stop();
            if rx.recv_timeout(limit) == Err(Timeout) {
                eprintln!("watchdog: {w} did not end after a stop either: aborting");
                std::process::abort();
            }
        });
        Watchdog {
            done: Some(tx),
            fired,
            thread: Some(thread),
            what: what.to_string(),
        }
    }

    /// Disarms the watchdog; fails the test if it had to stop the run.
    pub fn done(mut self) {
        self.disarm();
        assert!(
            !self.fired.load(std::sync::atomic::Ordering::SeqCst),
            "hung: {} (the watchdog stopped it)",
            self.what
        );
    }

    fn disarm(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// `struct sock_filter`: one classic BPF instruction of a seccomp filter.
#[cfg(target_arch = "x86_64")]
#[repr(C)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog`.
#[cfg(target_arch = "x86_64")]
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

#[cfg(target_arch = "x86_64")]
const LD_W_ABS: u16 = 0x20; // A = the word of seccomp_data at offset k
#[cfg(target_arch = "x86_64")]
const JEQ_K: u16 = 0x15;
#[cfg(target_arch = "x86_64")]
const AND_K: u16 = 0x54;
#[cfg(target_arch = "x86_64")]
const RET_K: u16 = 0x06;
#[cfg(target_arch = "x86_64")]
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
#[cfg(target_arch = "x86_64")]
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

/// One filter instruction.
#[cfg(target_arch = "x86_64")]
fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

/// Installs `filter` on this thread (and the threads it starts); `false` if this machine does
/// not let the process install one.
#[cfg(target_arch = "x86_64")]
fn install_filter(filter: &[SockFilter]) -> bool {
    let prog = SockFprog {
        len: filter.len() as u16,
        filter: filter.as_ptr(),
    };
    // SAFETY: plain prctl calls; `prog` and the filter it points to outlive the call, which
    // copies them.
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const SockFprog as usize,
                0,
                0,
            ) == 0
    }
}

/// Makes syscall `nr` fail with `errno` on this thread and the threads it starts (a seccomp
/// filter, which stays inside the test that installs it); `false` if this machine does not
/// let the process install a filter (the test then skips).
#[cfg(target_arch = "x86_64")]
pub fn deny_syscall(nr: libc::c_long, errno: u32) -> bool {
    install_filter(&[
        bpf(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        bpf(JEQ_K, 0, 1, nr as u32),
        bpf(RET_K, 0, 0, SECCOMP_RET_ERRNO | errno),
        bpf(RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ])
}

/// Makes `io_uring_enter` fail with `errno` on this thread and the threads it starts when it
/// only submits (no `IORING_ENTER_GETEVENTS` in its flags), so a loop's submits fail while
/// its parks (which wait, and submit what is queued) still work; `false` if this machine does
/// not let the process install a filter (the test then skips).
#[cfg(target_arch = "x86_64")]
pub fn deny_uring_submit_without_wait(errno: u32) -> bool {
    // `seccomp_data`: `nr` at 0, `args[3]` (the flags) at 16 + 3 * 8 (low half, x86_64).
    install_filter(&[
        bpf(LD_W_ABS, 0, 0, 0),
        bpf(JEQ_K, 0, 4, libc::SYS_io_uring_enter as u32),
        bpf(LD_W_ABS, 0, 0, 40),
        bpf(AND_K, 0, 0, 1), // IORING_ENTER_GETEVENTS
        bpf(JEQ_K, 0, 1, 0),
        bpf(RET_K, 0, 0, SECCOMP_RET_ERRNO | errno),
        bpf(RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ])
}

/// Makes `io_uring_enter` fail with `errno` on this thread and the threads it starts whenever
/// it has entries to submit (`to_submit` above 0), waits included, as the kernel refuses a
/// submission it cannot allocate requests for (`EAGAIN`, before it would wait); an enter that
/// only waits still works. `false` if this machine does not let the process install a filter.
#[cfg(target_arch = "x86_64")]
pub fn deny_uring_submit(errno: u32) -> bool {
    // `seccomp_data`: `nr` at 0, `args[1]` (to_submit) at 16 + 1 * 8 (low half, x86_64).
    install_filter(&[
        bpf(LD_W_ABS, 0, 0, 0),
        bpf(JEQ_K, 0, 3, libc::SYS_io_uring_enter as u32),
        bpf(LD_W_ABS, 0, 0, 24),
        bpf(JEQ_K, 1, 0, 0),
        bpf(RET_K, 0, 0, SECCOMP_RET_ERRNO | errno),
        bpf(RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ])
}

/// Keeps a second `tracing` dispatcher registered for the rest of the process. While only one
/// is (the test's scoped subscriber), tracing-core computes a callsite's interest, when the
/// callsite is first hit, from the default dispatcher of the thread that hits it: a callsite
/// first hit by another test's thread (no subscriber) is cached `never`, and the scoped
/// subscriber never sees its events (until another dispatcher is registered). With two
/// registered, every live one is asked.
fn keep_callsite_interest_shared() {
    static KEEP: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    KEEP.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
}

/// A tracing subscriber that runs `.1` for each event of level `.0` logged on the thread it is
/// the default subscriber of (`tracing::subscriber::with_default`); see [`count_events`] and
/// [`panic_on_events`].
pub struct OnEvents<F>(pub tracing::Level, pub F);

/// Counts the events of `level` into `counter`: a test can check that a warning or error was
/// (or was not) logged instead of timing what would log it.
pub fn count_events(
    level: tracing::Level,
    counter: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> OnEvents<impl Fn() + Send + Sync + 'static> {
    keep_callsite_interest_shared();
    OnEvents(level, move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })
}

/// Panics at each event of `level`: user code that panics inside the loop, where xtc logs (the
/// stall watchdog's warning, the one report sink it does not guard as it guards a stall
/// callback).
pub fn panic_on_events(level: tracing::Level) -> OnEvents<impl Fn() + Send + Sync + 'static> {
    keep_callsite_interest_shared();
    OnEvents(level, move || {
        panic!("planted: the subscriber panics on a {level} event")
    })
}

impl<F: Fn() + Send + Sync + 'static> tracing::Subscriber for OnEvents<F> {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == self.0 {
            (self.1)();
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A signal handler of the test's own, and the calls to install and inspect one: for the tests
/// that check how xtc treats a handler the program installed (`preempt_handler_changed`,
/// `io_pool_handler_changed`).
pub mod signals {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// How often [`mine`] ran.
    pub static MINE: AtomicUsize = AtomicUsize::new(0);

    /// The program's own handler: counts its deliveries in [`MINE`].
    pub extern "C" fn mine(_sig: libc::c_int) {
        MINE.fetch_add(1, SeqCst);
    }

    /// [`mine`]'s address, as `sigaction` reports it installed.
    pub fn mine_addr() -> libc::sighandler_t {
        mine as extern "C" fn(libc::c_int) as libc::sighandler_t
    }

    /// Installs [`mine`] for `sig`, as a program that handles `sig` itself does.
    pub fn install_mine(sig: libc::c_int) {
        set_handler(sig, mine_addr());
    }

    /// Sets the disposition of `sig` to `handler` (a function address, `SIG_DFL` or `SIG_IGN`).
    pub fn set_handler(sig: libc::c_int, handler: libc::sighandler_t) {
        // SAFETY: a zeroed sigaction is valid; `handler` is `mine` (async-signal-safe: one
        // atomic add) or a special disposition.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
        }
    }

    /// The handler now installed for `sig`.
    pub fn handler_of(sig: libc::c_int) -> usize {
        // SAFETY: `old` is writable storage for one sigaction; a null new action only reads.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(sig, std::ptr::null(), &mut old), 0);
            old.sa_sigaction
        }
    }
}

/// Runs `n` calls (`call(i)`) that each find their source ready, and fails (naming `what`)
/// unless the loop turned meanwhile: another task spawned now ran, and a timer due before the
/// first call fired, both before the last call. A task awaiting such calls in a loop (a
/// socket its peer keeps full, a ring that never empties, a passed deadline) never returned
/// `Pending` and held its loop for as long as it went on; the cooperative budget makes it
/// yield. Deterministic when every call finds its source ready before the first. Must run
/// inside a task of an xtc loop.
pub async fn turns_during(what: &str, n: usize, mut call: impl AsyncFnMut(usize)) {
    use std::{cell::Cell, rc::Rc};
    let (ran, ticked) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(false)));
    let (r, t) = (ran.clone(), ticked.clone());
    xtc_shards::spawn_local(async move { r.set(true) });
    // The deadline is taken now, not at the timer task's first poll (which comes only when
    // the loop turns).
    let due = Instant::now() + Duration::from_millis(1);
    xtc_shards::spawn_local(async move {
        xtc_shards::time::sleep_until(due).await;
        t.set(true);
    });
    // A blocking wait: the timer is due before the first call.
    std::thread::sleep(Duration::from_millis(5));
    let (mut ran_at, mut ticked_at) = (None, None);
    for i in 0..n {
        call(i).await;
        if ran.get() && ran_at.is_none() {
            ran_at = Some(i);
        }
        if ticked.get() && ticked_at.is_none() {
            ticked_at = Some(i);
        }
    }
    assert!(
        ran_at.is_some() && ticked_at.is_some(),
        "{n} {what} in a row never let the loop turn: another task ran at call {ran_at:?}, a \
         due timer fired at call {ticked_at:?}"
    );
}

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local of the type clock_gettime fills.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Yields of a task on shard 0 of `ex` that busy-loops, checking `yield_if_due` every 50 µs,
/// until it has yielded `want` times or used `cap` of its thread's CPU time (a hang guard, not
/// a window: with another process on the CPU, a thread that runs between kernel ticks gets
/// few of them, and 80 ms of CPU time saw 0 to 2 ticks of a 1 ms preemption about half the
/// time); runs `ex` to its end.
pub fn yields_until(ex: Executor, want: u64, cap: Duration) -> u64 {
    let h = ex
        .spawn_on(0, move || async move {
            let mut yields = 0;
            let start = thread_cpu_time();
            while yields < want && thread_cpu_time() - start < cap {
                burn(Duration::from_micros(50));
                let mut f = xtc_shards::yield_if_due();
                if futures::poll!(&mut f).is_pending() {
                    yields += 1;
                    f.await;
                }
            }
            yields
        })
        .unwrap();
    ex.run().unwrap();
    futures::executor::block_on(h).unwrap()
}

/// Yields of a task on shard 0 of `ex` that busy-loops for 80 ms of its thread's CPU time
/// (not wall time: a descheduled thread gets no ticks), checking `yield_if_due` every 50 µs;
/// runs `ex` to its end. For "no yields" checks: one that expects yields uses
/// [`yields_until`], which has no window to miss.
pub fn yields_in_busy_loop(ex: Executor) -> u64 {
    yields_until(ex, u64::MAX, Duration::from_millis(80))
}

/// A fresh FIFO in the temp dir, named after `prefix` (the test binary's), this process and
/// `tag`.
pub fn fifo(prefix: &str, tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{prefix}-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain system call with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    path
}

/// Opens the FIFO at `fifo` for writing, which waits for a reader that does not come, and
/// gives up after 50 ms: the open's future (on epoll, a blocking-pool job inside `open(2)`) is
/// dropped. Must run inside a task of an xtc loop.
pub async fn give_up_opening_fifo(fifo: &std::path::Path) {
    let mut o = xtc_shards::fs::OpenOptions::new();
    o.write(true);
    let open = xtc_shards::time::timeout(Duration::from_millis(50), o.open(fifo));
    assert!(open.await.is_err(), "nobody reads the FIFO: the open waits");
}

/// The whole case: makes a FIFO ([`fifo`]`(prefix, tag)`), has a task on shard 0 of `exec`
/// drop an `open` of it ([`give_up_opening_fifo`]), runs `exec` as
/// [`run_with_a_dropped_fifo_open`] does, and removes the FIFO.
pub fn drop_a_fifo_open(
    exec: Executor,
    prefix: &str,
    tag: &str,
) -> Result<xtc_shards::Result<()>, String> {
    let path = fifo(prefix, tag);
    let p = path.clone();
    exec.spawn_on(0, move || async move { give_up_opening_fifo(&p).await })
        .unwrap();
    let returned = run_with_a_dropped_fifo_open(exec, &path);
    let _ = std::fs::remove_file(&path);
    returned
}

/// Runs `exec` whose task dropped an `open` for writing of the FIFO at `fifo` that no reader
/// comes to: only the pool job's interrupt ends that `open(2)`, and `run()` waits for the job.
/// `Err` if `run()` had not returned after 10 s (a hang guard, not a timing assertion); the
/// executor is then stopped and a reader opens the FIFO, so that the job, and the test, end.
pub fn run_with_a_dropped_fifo_open(
    exec: Executor,
    fifo: &std::path::Path,
) -> Result<xtc_shards::Result<()>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = exec.handle();
    std::thread::scope(|s| {
        s.spawn(|| tx.send(exec.run()).unwrap());
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => Ok(r),
            Err(_) => {
                handle.stop();
                let _reader = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(fifo);
                let _ = rx.recv_timeout(HANG);
                Err("run() hung on the dropped open: the pool job was not interrupted".into())
            }
        }
    })
}

/// The ids of this process's threads named `name` (`/proc/self/task/*/comm`).
pub fn threads_named(name: &str) -> Vec<libc::pid_t> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (comm.trim() == name).then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// Runs `ex` on a detached thread; `None` if `run()` has not returned within `limit` (the
/// thread is leaked: a run blocked in a shutdown `Drop` cannot be stopped, and
/// [`run_within`]'s scoped thread would block the test for good).
pub fn run_detached(
    ex: std::sync::Arc<Executor>,
    limit: Duration,
) -> Option<xtc_shards::Result<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = ex.run();
        let _ = tx.send(r);
    });
    rx.recv_timeout(limit).ok()
}

/// Runs its closure when dropped (a guard whose `Drop` a loop's shutdown runs).
pub struct OnDrop<F: FnMut()>(pub F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// A read buffer that counts its drops (whether the driver freed, or leaked, what the kernel
/// may still hold).
pub struct Counted(
    pub Vec<u8>,
    pub std::sync::Arc<std::sync::atomic::AtomicUsize>,
);

// SAFETY: the views are the Vec's: stable while it is neither resized nor moved out.
unsafe impl xtc_shards::io::IoBuf for Counted {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0.len()
    }
    fn bytes_total(&self) -> usize {
        self.0.capacity()
    }
}

// SAFETY: as above; `set_init` is called with at most `bytes_total()` initialized bytes.
unsafe impl xtc_shards::io::IoBufMut for Counted {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller's contract.
        unsafe { self.0.set_len(n) }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The CPUs the calling thread may run on.
pub fn affinity() -> Vec<usize> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set; the kernel fills at most `size_of`
    // bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}
