//! A small blocking thread pool for file operations on the epoll driver (epoll cannot wait on
//! regular files), as tokio does. Threads start on demand, up to [`MAX_THREADS`], and exit after
//! [`IDLE_EXIT`] without work. A job's result comes back through a one-shot slot whose waker
//! the job fires (from the pool thread, so the wake goes through the loop's inbox). Where no
//! thread can be started (a process or cgroup thread limit), a job runs on its loop's thread
//! if the pool has no thread at all, and otherwise waits for a running thread, or for a later
//! submission that manages to start one: nothing retries on its own, so a job whose peer (the
//! other end of a FIFO) holds every running thread waits for that later submission.
//!
//! # Cancellation
//!
//! Dropping a job's future cancels the job, as io_uring cancels a dropped operation: a job
//! not started yet never runs (still queued, it is taken out of the queue and dropped; taken
//! by a thread meanwhile, it is skipped, ending with `ECANCELED`), and one blocked in an interruptible
//! system call (an `open` or `read` of a FIFO that no peer comes to) is interrupted by a
//! signal ([`interrupt_signal`], a no-op handler without `SA_RESTART`) sent to its pool
//! thread. A job's blocking calls go through [`retrying`], which retries `EINTR` unless its
//! job was cancelled, so a signal that lands late, in the thread's next job, only costs that
//! job a retry. Reads and writes of pipes first wait for their descriptor in `ppoll(2)`, with
//! the signal unblocked only there, and a cancel waits for a call that already found its
//! descriptor ready ([`when_ready`]): a dropped read takes no byte written after the drop.
//! Calls the kernel does not interrupt (a `pwrite` to a disk file) complete, and the loop
//! waits for them before it counts as idle, as it waits for an io_uring completion, and a
//! stopping loop waits for those of dropped operations (up to [`SHUTDOWN_WAIT`]) before it
//! leaves ([`settle`]).

use std::{
    cell::RefCell,
    collections::VecDeque,
    future::Future,
    io,
    marker::PhantomData,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst},
        Arc, Condvar, Mutex, OnceLock,
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

/// Most pool threads at once, as tokio's default: a job may block until another job runs (an
/// `open` of a FIFO waits for its peer's), and with 8 threads eight such opens left the
/// ninth, their peer, queued behind them for good. Threads start only on demand and exit
/// after [`IDLE_EXIT`].
const MAX_THREADS: usize = 512;
/// An idle pool thread exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Pool {
    state: Mutex<PoolState>,
    cv: Condvar,
}

#[derive(Default)]
struct PoolState {
    /// Queued jobs with their ids (`NEXT_JOB`), oldest first.
    jobs: VecDeque<(u64, Job)>,
    threads: usize,
    idle: usize,
    /// Idle threads already notified and not yet awake: a job pushed while every idle thread
    /// has a wake-up coming must start a thread of its own (as tokio counts `num_notify`), or
    /// it waits behind the job that wake-up is for (two opens of one FIFO would deadlock).
    notified: usize,
}

/// The CPUs pool threads run on: the union of the allowed CPUs of every executor built so far
/// (recorded before any loop pins its thread), with a generation that grows with it. A pool
/// thread is started from a loop thread and would otherwise inherit that loop's single-CPU
/// pinning: all of them on one core, competing with that loop. A union, not the first build's
/// set: an executor built on a narrowed thread (inside a pinned shard's task) recorded one CPU,
/// and every later executor's jobs ran there for the process's life.
static POOL_CPUS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Grows each time [`POOL_CPUS`] does; a pool thread rebinds when it sees a new one.
static POOL_CPUS_GEN: AtomicU64 = AtomicU64::new(0);

/// Adds the allowed CPUs of a built executor's topology to the pool's (a synthetic topology
/// names no real CPU: nothing). Cost: a lock and a merge, per build.
pub(crate) fn set_topology(topo: Arc<xtc_numa::Topology>) {
    if topo.is_synthetic() {
        return;
    }
    let mut cpus = lock(&POOL_CPUS);
    let before = cpus.len();
    for cpu in topo.allowed_pus() {
        if !cpus.contains(&cpu) {
            cpus.push(cpu);
        }
    }
    if cpus.len() != before {
        cpus.sort_unstable();
        POOL_CPUS_GEN.fetch_add(1, SeqCst);
    }
}

/// Binds the calling pool thread to the pool's CPUs if they changed since it last looked
/// (`seen`: the generation it bound to). Cost: an atomic load; on a change, a lock and a
/// `sched_setaffinity`.
fn unpin_from_loop(seen: &mut u64) {
    let generation = POOL_CPUS_GEN.load(SeqCst);
    if generation == *seen {
        return;
    }
    *seen = generation;
    let cpus = lock(&POOL_CPUS).clone();
    if cpus.is_empty() {
        return;
    }
    if let Err(e) = crate::sys::set_thread_cpus(&cpus) {
        // Once per process at warning level (the jobs then run on fewer CPUs than the
        // executors allow, beside their loops); every later failure at debug level.
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !WARNED.swap(true, SeqCst) {
            tracing::warn!(
                "xtc: a blocking-pool thread keeps its CPU affinity (binding to {cpus:?}: {e}); \
                 its jobs run on fewer CPUs than the executors allow (a cgroup's cpuset that \
                 shrank since the executor was built?)"
            );
        } else {
            tracing::debug!(
                "xtc: blocking-pool thread keeps its affinity (binding to {cpus:?}: {e})"
            );
        }
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

thread_local! {
    /// Jobs started from this thread's loops that have not ended (queued or running, their
    /// future alive or abandoned): a loop with one is not idle for good, as its result (or its
    /// effect on a file) is still to come. A job takes itself off when it ends, once its result
    /// is in its slot, it is marked `done` and its wake-up went out, and the job that takes the
    /// count to zero then [`nudge`]s the loops that read it (`Homes`, their wake pings): nothing
    /// else wakes a loop when
    /// the count falls, and a loop that read the count before (its woken task ended meanwhile,
    /// or the job was abandoned, or its waker reaches no loop) parked `WAITING` for good. Off
    /// the count before its wake-up, a job left a gap in which a loop taking a turn read its
    /// waiting task parked on nothing (`PARKED`, with the count at zero) and, the wake-up held
    /// up past the grace period (a preempted pool thread), reported a deadlock. Counting until
    /// the result was
    /// *taken* instead kept a loop whose task never polled a finished job busy for good: its
    /// deadlock was never reported.
    static PENDING: std::cell::OnceCell<Arc<AtomicUsize>> = const { std::cell::OnceCell::new() };
    /// Loop threads: the controls of the abandoned jobs of this thread's loops (their future was dropped
    /// before their result came) that may still run. Their `pwrite` or `open` may still land,
    /// so the loop is not idle until they end ([`abandoned`]; the job that empties the loop's
    /// count [`nudge`]s it). While one that a signal may end runs, the loop parks for at most
    /// [`ABANDONED_RECHECK`], signals them again (a signal can land just before the blocking
    /// call) and looks again. Those that ended are
    /// forgotten there, and by a drop that finds the list doubled (a busy loop never parks).
    /// Each is tagged with the loop that abandoned it ([`running_loop`]): a thread may run
    /// several loops, one after another (`LocalExecutor`s) or one inside another (a
    /// `LocalExecutor` run inside a drop that another executor's sweep runs while this thread's
    /// loop is hidden), and a loop that waited for every
    /// job of its thread waited its second, and warned, at each end for a job an earlier or an
    /// enclosing loop had abandoned.
    static ABANDONED: RefCell<Vec<(u64, Arc<Ctl>)>> = const { RefCell::new(Vec::new()) };
    /// Pool threads: the control of the job this thread runs ([`retrying`]).
    static RUNNING: RefCell<Option<Arc<Ctl>>> = const { RefCell::new(None) };
}

/// What a loop and a pool thread share to cancel one job.
#[derive(Default)]
struct Ctl {
    state: Mutex<CtlState>,
    /// A cancel may signal the job's thread ([`run`]); a `spawn_blocking` job
    /// ([`run_uninterrupted`]) is never signalled, so its loop need not look at it again
    /// while it runs ([`park_timeout`]).
    interruptible: bool,
}

#[derive(Default)]
struct CtlState {
    /// The pool thread running the job, while it runs.
    thread: Option<libc::pthread_t>,
    /// The address of that thread's [`DELIVERED`] flag, while it runs the job.
    delivered: usize,
    /// An interrupt was sent to the job's thread: another is sent only once the handler ran
    /// since (a real-time signal queues, one per send, until the thread takes it).
    signalled: bool,
    /// The job's future was dropped: it is not started, and its blocking calls give up on
    /// `EINTR`.
    cancelled: bool,
    /// The job ended (or was skipped).
    done: bool,
    /// The job is inside the read or write [`when_ready`] found its descriptor ready for, or
    /// a [`claimed`] call: a cancel waits for it to end ([`wait_call`]).
    calling: bool,
    /// The count (`PENDING`) of the thread that submitted the job, taken (once) by the
    /// job's end (`Ended`).
    own: Option<Arc<AtomicUsize>>,
    /// The counts of other loops that polled the job's future and wait on it, each with the
    /// loop to nudge, released with the job's own at its end (`Ended`). A `spawn_blocking`
    /// future is `Send`: started off any loop, or in an earlier run (whose thread is gone),
    /// and awaited by a task, no loop counted it, the awaiting loop looked parked on nothing,
    /// and a job longer than the deadlock grace ended the run with `Err(Deadlock)`.
    waiting: Vec<(
        Arc<AtomicUsize>,
        std::sync::Weak<crate::event_loop::LoopShared>,
    )>,
}

/// The signal that interrupts a cancelled job's blocking call, one per process as the pool
/// is: fixed by the first executor built (`Builder::interrupt_signal`, `XTC_INTERRUPT_SIGNAL`;
/// a build that fails fixes nothing) or the pool's first use, by default
/// [`default_interrupt_signal`]. Cost: one load once fixed.
fn interrupt_signal() -> libc::c_int {
    *INTERRUPT_SIGNAL.get_or_init(default_interrupt_signal)
}

static INTERRUPT_SIGNAL: OnceLock<libc::c_int> = OnceLock::new();

/// The third real-time signal glibc leaves to applications (`sys/cputimer.rs` uses the
/// second).
fn default_interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

/// The interrupt signal fixed for the process, or the default one while none is, without
/// fixing it (a getter that fixed the default would refuse a later build asking for another).
pub(crate) fn interrupt_signal_now() -> libc::c_int {
    INTERRUPT_SIGNAL
        .get()
        .copied()
        .unwrap_or_else(default_interrupt_signal)
}

/// The interrupt signal a build asking for `wanted` (`None`: the one fixed, or the default)
/// would get, without fixing it; `Err` if `wanted` is no real-time signal, or another one is
/// fixed already. `build()` checks with this first and fixes the signal
/// ([`fix_interrupt_signal`]) only once nothing else can fail: a refused build fixed it, and
/// every later builder that did not ask for the same one was refused.
pub(crate) fn check_interrupt_signal(wanted: Option<libc::c_int>) -> crate::Result<libc::c_int> {
    let Some(sig) = wanted else {
        return Ok(interrupt_signal_now());
    };
    let sig = crate::sys::check_rt_signal("interrupt_signal", sig)?;
    match INTERRUPT_SIGNAL.get() {
        Some(&fixed) if fixed != sig => Err(already_fixed(sig, fixed)),
        _ => Ok(sig),
    }
}

/// Fixes the process's interrupt signal to `sig`, which [`check_interrupt_signal`] gave;
/// `Err` if another thread's build fixed another one since that check.
pub(crate) fn fix_interrupt_signal(sig: libc::c_int) -> crate::Result<()> {
    let fixed = *INTERRUPT_SIGNAL.get_or_init(|| sig);
    if fixed != sig {
        return Err(already_fixed(sig, fixed));
    }
    Ok(())
}

/// The error of a build that asks for interrupt signal `sig` while `fixed` is the process's.
fn already_fixed(sig: libc::c_int, fixed: libc::c_int) -> crate::Error {
    crate::Error::InvalidArgument(format!(
        "interrupt_signal {} asked for, but this process's blocking pool interrupts with {} \
         already (fixed by the first executor built, or the pool's first use, by a \
         LocalExecutor say): the signal is one per process; ask for the same one, or set it \
         on the first builder",
        crate::sys::signal_name(sig),
        crate::sys::signal_name(fixed)
    ))
}

thread_local! {
    /// Set by the interrupt handler on the thread that took the signal: an interrupt sent
    /// there is no longer pending (see `CtlState::signalled`). Const, no destructor: a plain
    /// TLS access, async-signal-safe.
    static DELIVERED: std::sync::atomic::AtomicBool =
        const { std::sync::atomic::AtomicBool::new(true) };
}

extern "C" fn on_interrupt(_sig: libc::c_int) {
    // The signal exists to make the blocking call return `EINTR`; it also says it arrived.
    DELIVERED.with(|d| d.store(true, std::sync::atomic::Ordering::Release));
}

/// Installs the interrupt signal's handler, unless the program has one of its own there.
fn install_interrupt_handler() -> io::Result<()> {
    // No `SA_RESTART`, so the interrupted call returns `EINTR`. Only threads running a pool job
    // are ever sent this signal: pool threads, and a loop thread that runs a job itself when no
    // pool thread could be started (nothing cancels that job while it runs).
    let sig = interrupt_signal();
    crate::sys::install_signal_handler(
        sig,
        &crate::sys::signal_name(sig),
        on_interrupt,
        0,
        "a dropped file operation that blocks on the epoll driver is not interrupted (give \
         xtc another signal with XTC_INTERRUPT_SIGNAL or Builder::interrupt_signal to get \
         that back)",
    )
}

/// Installs the interrupt signal's handler once; `false` if that failed (jobs are then not
/// interrupted, only skipped when not started).
fn interrupt_handler_installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let installed = install_interrupt_handler();
        if let Err(e) = &installed {
            tracing::warn!(
                "xtc: could not install the blocking pool's interrupt signal handler ({e}); a \
                 dropped file operation that blocks keeps its loop busy until it ends"
            );
        }
        installed.is_ok()
    })
}

/// Whether a job may be sent the interrupt signal now: xtc's handler was installed, and still
/// is, or is again where the program gave the signal back (its default action, or ignored)
/// since. Looked at before each signal, as the program may change the disposition after xtc
/// installed its handler: decided once, a handler the program installed since then got xtc's
/// interrupts, and a disposition reset to the default (which ends the process) ended it at the
/// next cancel. A handler the program installed itself is kept, and the job is not
/// interrupted (one warning). Cost: two `sigaction` calls.
fn interrupt_handler_current() -> bool {
    if !interrupt_handler_installed() {
        return false;
    }
    match install_interrupt_handler() {
        Ok(()) => true,
        Err(e) => {
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "xtc: the blocking pool's interrupt signal is no longer xtc's ({e}); a \
                     dropped file operation that blocks keeps its loop busy until it ends"
                );
            }
            false
        }
    }
}

/// Signals the pool thread running `ctl`'s job, if it still runs; `false` once it ended.
fn interrupt(ctl: &Ctl) -> bool {
    let mut st = lock(&ctl.state);
    if st.done {
        return false;
    }
    if let Some(thread) = st.thread {
        // SAFETY: the flag is a thread-local of `thread`, which runs this job (and so lives)
        // while `thread` is set, under this lock.
        let delivered = unsafe { &*(st.delivered as *const std::sync::atomic::AtomicBool) };
        if st.signalled && !delivered.load(std::sync::atomic::Ordering::Acquire) {
            // The last one is still queued: the thread is in a call that does not take it
            // yet (uninterruptible), and another would only queue behind it.
            return true;
        }
        if interrupt_handler_current() {
            delivered.store(false, std::sync::atomic::Ordering::Release);
            st.signalled = true;
            // SAFETY: `thread` runs this job (it clears the field under this lock before it
            // moves on), so it is a live thread; the signal has xtc's handler installed.
            unsafe { libc::pthread_kill(thread, interrupt_signal()) };
        }
    }
    true
}

/// Signals the abandoned jobs of loop `tag` ([`running_loop`]) that still run, and forgets
/// those that ended.
fn interrupt_abandoned(tag: u64) {
    let _ = ABANDONED.try_with(|v| {
        v.borrow_mut().retain(|(t, ctl)| {
            if *t == tag {
                interrupt(ctl)
            } else {
                !lock(&ctl.state).done
            }
        })
    });
}

/// The `Core::id` of the loop running on this thread, the tag of the jobs it abandons; 0 when
/// none runs: a plain thread, or a section where `context::off_loop` hides the loop (an
/// executor's sweep, whose abandoned jobs no loop waits for at its end, or `run()`'s drop of
/// its parked migratable tasks, after which that thread [`settle`]s every tag-0 job). Cost: a
/// thread-local read.
fn running_loop() -> u64 {
    crate::context::with_core(|c| c.id).unwrap_or(0)
}

/// Runs a pool job's blocking call, retrying `EINTR` unless the job was cancelled (then the
/// interrupted call's `EINTR` ends it). Not for `close`, which must never be retried.
pub(crate) fn retrying<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) && !job_cancelled() => continue,
            r => return r,
        }
    }
}

/// Runs a pool job's read (`events` = `POLLIN`) or write (`POLLOUT`) of `fd` so that a
/// cancel cannot slip past it, for descriptors whose calls wait for a peer (pipes, FIFOs,
/// character devices): the interrupt signal is blocked while the job checks whether it was
/// cancelled and unblocked only inside `ppoll(2)`, which does both atomically; once `fd` is
/// ready the job checks again and marks itself `calling` under the same lock, unblocks the
/// signal, and makes the call; a cancel that finds it there waits for that call
/// ([`wait_call`]). A read then does not block (`fd` has data), so a dropped read takes no
/// byte written after its drop returned; a write larger than the room blocks, and the
/// cancel's signal (or the loop's re-signal) interrupts it, as before.
/// [`retrying`] alone had a gap: a signal that landed between its cancel check and a FIFO's
/// `read(2)` was spent there, and the read then blocked and took the next bytes written.
///
/// Regular files and block devices skip this (their calls do not wait for a peer): a write is
/// [`claimed`], so a cancel either comes first (no call) or waits for the call; a read (which
/// changes nothing a later operation sees) is not waited for. Without xtc's handler a pipe's
/// call is neither (nothing can end it: a wait for it only held the loop `CALL_WAIT`).
/// Left open: a cancel whose signal lands between the claim and a call that then blocks (a
/// write larger than the room, or a read whose data another reader of the pipe took) is
/// spent; the cancel waits for the call at most [`CALL_WAIT`], and the loop's re-signal
/// ([`ABANDONED_RECHECK`]) ends it after that, so such a write may still move bytes for about
/// a millisecond after the drop returned. And `open(2)` of a FIFO, which has no `ppoll` form,
/// keeps [`retrying`]'s gap.
///
/// Cost: an `fstat` and two locks; for a pipe, also three `pthread_sigmask` and one `ppoll`.
pub(crate) fn when_ready<T>(
    fd: std::os::fd::RawFd,
    events: libc::c_short,
    mut call: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let Some(ctl) = RUNNING.with(|r| r.borrow().clone()) else {
        return retrying(call);
    };
    if !waits_for_peer(fd) {
        // A positioned read of a file changes nothing a later operation sees: its drop need
        // not wait for it (only a write, which may land late, is claimed).
        return if events == libc::POLLIN {
            retrying(call)
        } else {
            claimed(call)
        };
    }
    if !interrupt_handler_installed() {
        // Nothing can end a call that waits for a peer: a claim would only make the drop
        // wait its full `CALL_WAIT` on the loop's thread, for nothing.
        return retrying(call);
    }
    // SAFETY: zeroed `sigset_t`s are valid for `sigemptyset`/`pthread_sigmask` to fill; the
    // calls only read and write these locals.
    let old = unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, interrupt_signal());
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        old
    };
    let mut during = old;
    // SAFETY: `during` is a valid set (a copy of the thread's mask).
    unsafe { libc::sigdelset(&mut during, interrupt_signal()) };
    let cancelled = || io::Error::from_raw_os_error(libc::ECANCELED);
    let r = loop {
        if lock(&ctl.state).cancelled {
            break Err(cancelled());
        }
        let mut pfd = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one live `pollfd`, no timeout, a valid signal set.
        let rc = unsafe { libc::ppoll(&mut pfd, 1, std::ptr::null(), &during) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break Err(e);
        }
        if rc == 0 {
            continue;
        }
        // Ready (or an error or hang-up, which the call reports). `ppoll` returns readiness
        // even when a cancel's signal came too: look at the flag, and claim the call.
        {
            let mut st = lock(&ctl.state);
            if st.cancelled {
                break Err(cancelled());
            }
            st.calling = true;
        }
        // The call itself stays interruptible, as outside this function: a write larger than
        // the room `POLLOUT` promised blocks, and a cancel that comes after the claim (or
        // `park_timeout`'s re-signal) must still reach it. With the signal left blocked, a
        // dropped FIFO write went on writing as a reader made room, and kept `run()` from
        // returning. A read that found data does not block (one reader), so it ends either way.
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        let r = retrying(&mut call);
        lock(&ctl.state).calling = false;
        break r;
    };
    // SAFETY: restores the mask saved above (again, after a call: the same mask); a pending
    // interrupt is delivered now, to the no-op handler.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// Runs a pool job's call that does not wait for a peer (a regular file's `pwrite`, an
/// `open`, a path operation) claimed under the lock a cancel takes: a job a thread took
/// before its future's drop either sees the cancel and makes no call (`ECANCELED`), or the
/// cancel waits for the call ([`wait_call`], up to [`CALL_WAIT`]). Unclaimed, a job preempted
/// between its start and its call made it after the drop returned, and a dropped write (or
/// `O_TRUNC` open, or unlink) landed after a later one the caller had awaited. Cost: two
/// locks of the job's control block (none off the pool: a job run on its loop's thread).
pub(crate) fn claimed<T>(call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let Some(ctl) = RUNNING.with(|r| r.borrow().clone()) else {
        return retrying(call);
    };
    {
        let mut st = lock(&ctl.state);
        if st.cancelled {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        st.calling = true;
    }
    let r = retrying(call);
    lock(&ctl.state).calling = false;
    r
}

/// Whether `fd`'s reads and writes may wait for a peer ([`mode_waits_for_peer`]; an `fstat`
/// that fails says yes: the careful path works for any kind).
fn waits_for_peer(fd: std::os::fd::RawFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a live local the kernel fills.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return true;
    }
    // SAFETY: fstat succeeded and filled it.
    mode_waits_for_peer(unsafe { st.assume_init() }.st_mode)
}

/// Whether a file of mode `mode` (`st_mode`) may make its reads, writes and `open(2)` wait for
/// a peer: anything but a regular file, a directory or a block device (a FIFO, a socket, a
/// terminal or other character device).
pub(crate) fn mode_waits_for_peer(mode: libc::mode_t) -> bool {
    !matches!(
        mode & libc::S_IFMT,
        libc::S_IFREG | libc::S_IFDIR | libc::S_IFBLK
    )
}

/// How long a cancel waits for a call its job started: a pipe read or write [`when_ready`]
/// found ready (which does not block unless another reader or writer of the same pipe got
/// there first), or a [`claimed`] call (a disk write, an open, a path operation).
const CALL_WAIT: Duration = Duration::from_millis(10);

/// A cancel (the job's future dropped on its loop): waits for the job's started call, if any,
/// to end, so that a pipe read takes nothing written after the drop returns and a claimed
/// call does not land after an operation issued after it. Bounded by [`CALL_WAIT`]; yields
/// the CPU while it waits (microseconds for a pipe call, which does not block; a disk call
/// as long as the disk takes).
fn wait_call(ctl: &Ctl) {
    let deadline = std::time::Instant::now() + CALL_WAIT;
    // `done` too: a call that panicked (unwound past its claim) left `calling` set.
    while {
        let st = lock(&ctl.state);
        st.calling && !st.done
    } && std::time::Instant::now() < deadline
    {
        std::thread::yield_now();
    }
}

/// Whether the job this pool thread runs was cancelled.
fn job_cancelled() -> bool {
    RUNNING.with(|r| {
        r.borrow()
            .as_ref()
            .is_some_and(|c| lock(&c.state).cancelled)
    })
}

/// How often a loop with abandoned jobs (`ABANDONED`) looks whether they ended.
const ABANDONED_RECHECK: Duration = Duration::from_millis(1);

/// This thread's count of jobs that have not ended (`PENDING`); `None` while the thread-local
/// is being destroyed at thread exit.
fn pending() -> Option<Arc<AtomicUsize>> {
    PENDING
        .try_with(|p| p.get_or_init(Default::default).clone())
        .ok()
}

/// Jobs of this thread's loop in the pool that have not ended, the abandoned ones included.
pub(crate) fn in_flight() -> usize {
    PENDING
        .try_with(|p| p.get().map_or(0, |n| n.load(SeqCst)))
        .unwrap_or(0)
}

/// How long a loop that stops waits for its jobs that still run (abandoned ones: every task
/// was dropped), as an io_uring driver waits for its operations: a `pwrite` of a dropped write
/// must not land after `block_on` or `run()` returned.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// A stopping loop's wait for its abandoned jobs, those whose future was dropped (see
/// [`SHUTDOWN_WAIT`]): signals them (a blocked `open` of a FIFO gives up) and looks again every
/// [`ABANDONED_RECHECK`]. Logs the jobs still running when it gives up. A job whose future is
/// still alive (kept past the run, in a thread-local or returned from `block_on`) is its
/// owner's to await, not waited for: waiting for every job of the thread made each later
/// `block_on` on it a second late. Only the jobs loop `tag` abandoned ([`running_loop`]).
/// Cost: a thread-local read when none was abandoned.
pub(crate) fn settle(tag: u64) {
    let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
    while abandoned(tag) > 0 {
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                "xtc: {} dropped blocking job(s) (file operations, spawn_blocking) of a stopping loop still run after \
                 {:?}; leaving them",
                abandoned(tag),
                SHUTDOWN_WAIT
            );
            return;
        }
        interrupt_abandoned(tag);
        std::thread::sleep(ABANDONED_RECHECK);
    }
}

/// Jobs that loop `tag` abandoned (their future is gone) and that still run. Jobs that ended,
/// whatever their loop, are forgotten here. Cost: a thread-local borrow, and a lock per abandoned job.
fn abandoned(tag: u64) -> usize {
    // `try_with`: at thread exit, after this thread-local is gone, nothing is abandoned.
    ABANDONED
        .try_with(|v| {
            let mut v = v.borrow_mut();
            v.retain(|(_, ctl)| !lock(&ctl.state).done);
            v.iter().filter(|(t, _)| *t == tag).count()
        })
        .unwrap_or(0)
}

/// The loop's park `timeout`, cut to [`ABANDONED_RECHECK`] while an abandoned job that a
/// signal may end runs: the signal can land just before its blocking call, so the loop sends
/// it again soon. Its end needs no look: the job that empties the loop's count [`nudge`]s it.
/// An abandoned `spawn_blocking` job is never signalled, so it cuts nothing: a
/// `timeout(d, spawn_blocking(..))` that gave up woke its loop every millisecond for as long
/// as the user's job ran. Cost: as [`abandoned`].
pub(crate) fn park_timeout(timeout: Option<Duration>) -> Option<Duration> {
    let tag = running_loop();
    // `try_with`: at thread exit, after this thread-local is gone, nothing is abandoned.
    let signalled = ABANDONED
        .try_with(|v| {
            let mut v = v.borrow_mut();
            v.retain(|(_, ctl)| !lock(&ctl.state).done);
            v.iter().any(|(t, ctl)| *t == tag && ctl.interruptible)
        })
        .unwrap_or(false);
    if !signalled {
        return timeout;
    }
    interrupt_abandoned(tag);
    Some(timeout.map_or(ABANDONED_RECHECK, |t| t.min(ABANDONED_RECHECK)))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unblocks the interrupt signal on the calling pool thread. A thread starts with the mask of
/// the one that spawned it (a loop thread, which has that of the thread that called `run()` or
/// `block_on`); a program that takes its signals with `signalfd` or `sigwait` blocks them all
/// there first, and then a cancel's signal stayed pending for good: a dropped `open` of a FIFO
/// that no peer came to kept its loop busy, and `run()` from returning, for good.
///
/// Only once xtc's handler is installed (as `CpuTimer::arm` does for its own signal): the
/// default action of a real-time signal ends the process, and a thread that took the signal
/// before the first pipe read or cancel installed the handler was one the kernel could route a
/// interrupt signal sent to the process to. Without the handler (the program has its own) the
/// thread keeps the program's mask, and cancels are not interrupted, as documented.
fn unblock_interrupt() {
    if !interrupt_handler_installed() {
        return;
    }
    if let Err(e) = crate::sys::unblock_signal(interrupt_signal()) {
        tracing::warn!(
            "xtc: a blocking-pool thread could not unblock its interrupt signal ({e}); a \
             dropped file operation that blocks there is not interrupted"
        );
    }
}

fn worker() {
    let mut bound = 0;
    unpin_from_loop(&mut bound);
    unblock_interrupt();
    let pool = pool();
    let mut st = lock(&pool.state);
    loop {
        if let Some((_, job)) = st.jobs.pop_front() {
            drop(st);
            // A build since the last job may have widened the pool's CPUs.
            unpin_from_loop(&mut bound);
            job();
            st = lock(&pool.state);
            continue;
        }
        st.idle += 1;
        let (g, timeout) = pool
            .cv
            .wait_timeout(st, IDLE_EXIT)
            .unwrap_or_else(|p| p.into_inner());
        st = g;
        st.idle -= 1;
        // Whether this wake-up was a notification or not, one fewer is pending.
        st.notified = st.notified.saturating_sub(1);
        if timeout.timed_out() && st.jobs.is_empty() {
            st.threads -= 1;
            return;
        }
    }
}

struct Slot<R> {
    result: Option<R>,
    waker: Option<Waker>,
}

/// The future of a pool job; `!Send` (its job counts in its loop's, this thread's, jobs).
pub(crate) struct Blocking<R> {
    slot: Arc<Mutex<Slot<io::Result<R>>>>,
    ctl: Arc<Ctl>,
    /// The job's id in the pool's queue (`PoolState::jobs`), to take it out unrun when the
    /// future is dropped before a thread took it.
    id: u64,
    /// Its result was taken.
    collected: bool,
    _local: PhantomData<*const ()>,
}

/// Runs `f` on the pool. A panic in `f` comes back as an error.
pub(crate) fn run<R: Send + 'static>(
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> Blocking<R> {
    submit(f, true)
}

/// Runs `f`, the user's own code (`task::spawn_blocking`), on the pool: as [`run`], but a
/// cancel never signals its thread. A file operation's calls are the pool's own and retry or
/// end on the signal's `EINTR` ([`retrying`]); the user's calls may not expect one (a `read`
/// that returns `Interrupted` to code that treats it as an error), so a dropped job that
/// already started runs to its end, and a stopping loop waits for it as for any dropped job
/// ([`settle`], up to [`SHUTDOWN_WAIT`]).
pub(crate) fn run_uninterrupted<R: Send + 'static>(
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> Blocking<R> {
    submit(f, false)
}

/// [`run`] and [`run_uninterrupted`]: `interruptible` says whether a cancel may signal the
/// job's thread.
fn submit<R: Send + 'static>(
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
    interruptible: bool,
) -> Blocking<R> {
    let slot = Arc::new(Mutex::new(Slot {
        result: None,
        waker: None,
    }));
    let theirs = slot.clone();
    let ctl = Arc::new(Ctl {
        interruptible,
        ..Ctl::default()
    });
    let their_ctl = ctl.clone();
    /// Takes its job off its loop's count when the job ends (runs, is skipped, or is dropped
    /// unrun), after the job's wake-up went out (see `PENDING`), and [`nudge`]s its loops
    /// (`Homes`) if that was the thread's last. On every path: a job dropped unrun (`unqueue`) by a future dropped
    /// off its loop's thread (a `spawn_blocking` future is `Send`: a stolen task's, or one
    /// sent to a plain thread) took the count to zero and woke nobody, and its loop, parked
    /// `WAITING` on it, stayed parked for good (`run()` never returned).
    struct Ended {
        /// The loops to nudge when the thread's last job ends: the one that submitted it,
        /// and those `context::off_loop` hid on this thread when it was submitted, which read
        /// the same count (`PENDING` is the thread's).
        homes: Homes,
        /// Where the counts the job is on are (`own`, `waiting`).
        ctl: Arc<Ctl>,
    }
    impl Ended {
        /// Takes the job off the counts it is on (once: they are taken from its control
        /// block), nudging each loop it was the last of.
        fn end(&mut self) {
            let (own, waiting) = {
                let mut c = lock(&self.ctl.state);
                // Ended, whichever way it went (already marked on every path that runs or
                // skips the job): no poll joins a count from here on (`wait_here`).
                c.done = true;
                (c.own.take(), std::mem::take(&mut c.waiting))
            };
            for (n, home) in waiting {
                if n.fetch_sub(1, SeqCst) == 1 {
                    nudge(&home);
                }
            }
            if own.is_some_and(|n| n.fetch_sub(1, SeqCst) == 1) {
                self.homes
                    .first
                    .iter()
                    .chain(&self.homes.hidden)
                    .for_each(nudge);
            }
        }
    }
    impl Drop for Ended {
        fn drop(&mut self) {
            self.end();
        }
    }
    let counter = pending();
    if let Some(n) = &counter {
        n.fetch_add(1, SeqCst);
    }
    lock(&ctl.state).own = counter;
    /// What a job holds, in one struct so that a job dropped unrun (`unqueue`) drops it in
    /// field order: the operation and its captures (the file's descriptor) before the count
    /// (`ended`) falls. A closure's captures drop in an order the language does not promise.
    struct Captures<F, T> {
        f: F,
        theirs: Arc<Mutex<Slot<T>>>,
        their_ctl: Arc<Ctl>,
        ended: Ended,
    }
    let caps = Captures {
        f,
        theirs,
        their_ctl,
        ended: Ended {
            homes: Homes::here(),
            ctl: ctl.clone(),
        },
    };
    let job: Job = Box::new(move || {
        let Captures {
            f,
            theirs,
            their_ctl,
            mut ended,
        } = caps;
        let start = {
            let mut c = lock(&their_ctl.state);
            if !c.cancelled && interruptible {
                // SAFETY: no preconditions.
                c.thread = Some(unsafe { libc::pthread_self() });
                c.delivered = DELIVERED.with(|d| d as *const _ as usize);
            }
            !c.cancelled
        };
        let r = if start {
            RUNNING.with(|r| *r.borrow_mut() = Some(their_ctl.clone()));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                crate::task::drop_payload(p);
                Err(io::Error::other("xtc: a blocking file operation panicked"))
            });
            RUNNING.with(|r| *r.borrow_mut() = None);
            r
        } else {
            // Its captures (the file's descriptor) go now, before the job counts as done.
            // Guarded: a `spawn_blocking` closure's captures are the user's, whose `Drop` may
            // panic; unguarded, that unwound the pool thread out of its loop (a slot of the
            // pool lost for good, the job never marked done, its loop re-parking every
            // millisecond and waiting a second at every stop).
            crate::task::guarded(
                "a cancelled blocking job's captures panicked while being dropped",
                || drop(f),
            );
            Err(io::Error::from_raw_os_error(libc::ECANCELED))
        };
        let waker = {
            let mut s = lock(&theirs);
            s.result = Some(r);
            s.waker.take()
        };
        // The result is the future's from here on: dropped with it (a descriptor an `open`
        // opened closes at the future's drop, or here, before the job counts as done, if the
        // future is gone). Kept until the job's end, after its wake-up (user code, or a
        // preemption), it stayed open after a dropped future's `block_on` or `run()` returned.
        // Guarded: with the future gone the result is dropped here, on the pool thread, and a
        // `spawn_blocking` result is the user's value (or a panic payload), whose `Drop` may
        // panic; unguarded, that unwound the pool thread out of its loop, uncounted.
        crate::task::guarded(
            "a blocking job's unclaimed result panicked while being dropped",
            || drop(theirs),
        );
        {
            // From here on no interrupt is sent to this thread for this job.
            let mut c = lock(&their_ctl.state);
            c.thread = None;
            c.done = true;
        }
        if let Some(w) = waker {
            crate::task::wake_guarded(w);
        }
        // Off the loop's count only after its wake-up went out, then a nudge if it was the
        // last (see `PENDING`): off before, a loop that took a turn in between read its task
        // parked on nothing and reported a deadlock while the wake-up was still to come.
        ended.end();
    });
    static NEXT_JOB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = NEXT_JOB.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pool = pool();
    let spawn = {
        let mut st = lock(&pool.state);
        st.jobs.push_back((id, job));
        if st.idle > st.notified {
            st.notified += 1;
            false
        } else if st.threads < MAX_THREADS {
            st.threads += 1;
            true
        } else {
            false
        }
    };
    if spawn {
        if let Err(e) = std::thread::Builder::new()
            .name("xtc-blocking".into())
            .spawn(worker)
        {
            let mut st = lock(&pool.state);
            st.threads -= 1;
            let ours = st.jobs.iter().position(|(j, _)| *j == id);
            if st.threads == 0 && ours.is_some() {
                // No thread will take our job: run it here rather than strand it (its future
                // would never resolve, and the loop would never go quiescent). Only ours:
                // another loop's job may wait for a task of this loop (two opens of a FIFO),
                // and running it here could block this loop for good. Those wait for the next
                // submission, which tries to start a thread again.
                let (_, job) = st
                    .jobs
                    .remove(ours.unwrap_or_default())
                    .expect("found above");
                drop(st);
                tracing::warn!(
                    "xtc: could not start a blocking-pool thread ({e}); running this blocking job \
                     on the loop's thread"
                );
                // It blocks the loop's thread inside its turn: the turn's deferred wakes go
                // first, or a job that waits on another shard (fed by a message sent this turn
                // to a sleeping one, whose ping waits for the turn's end) waited for good.
                crate::context::before_blocking_the_turn();
                job();
            } else {
                drop(st);
                tracing::warn!(
                    "xtc: could not start a blocking-pool thread ({e}); jobs wait for a running one"
                );
            }
        }
    } else {
        pool.cv.notify_one();
    }
    Blocking {
        slot,
        ctl,
        id,
        collected: false,
        _local: PhantomData,
    }
}

/// Takes the job `id` out of the pool's queue if no thread has taken it yet.
fn unqueue(id: u64) -> Option<Job> {
    let mut st = lock(&pool().state);
    let at = st.jobs.iter().position(|(j, _)| *j == id)?;
    st.jobs.remove(at).map(|(_, job)| job)
}

/// The loops of this thread that read its job count (`PENDING`), for a job's end to
/// [`nudge`]: the running one, and the ones `context::off_loop` hides. A hidden loop
/// left out (a job submitted in a drop run by another executor's sweep, or by a loop run
/// inside such a drop, which is gone when the job ends) parked `WAITING` on a count back at
/// zero, never woken: `run()` never returned.
struct Homes {
    /// The loop running on this thread (none off any loop, the first hidden one if none runs).
    first: Option<std::sync::Weak<crate::event_loop::LoopShared>>,
    /// Empty (no allocation) unless a loop is hidden.
    hidden: Vec<std::sync::Weak<crate::event_loop::LoopShared>>,
}

impl Homes {
    /// Cost: a thread-local read; with a loop hidden, a walk of the hidden ones and a `Vec`.
    fn here() -> Homes {
        let mut homes = Homes {
            first: None,
            hidden: Vec::new(),
        };
        crate::context::with_own_core(|c| {
            let w = Arc::downgrade(&c.shared);
            match homes.first {
                None => homes.first = Some(w),
                Some(_) => homes.hidden.push(w),
            }
            None::<()>
        });
        homes
    }
}

/// Makes the loop whose last pool job just ended take a turn, by its wake ping: a loop that
/// read the job in flight parked `WAITING`, with no timeout, and a job's end wakes nobody but
/// the waker its future left in its slot, which may reach no loop (a future polled once with a
/// no-op waker, then kept unpolled: a task stuck on it is a deadlock to report, and went
/// unreported, `run()` hanging). The ping is written whatever the loop's state (as a stop's):
/// a loop parked wakes and reads the count again, one not parked yet finds the ping when it
/// parks, and a loop busy, stopping or between runs takes at most one spurious turn. A no-op
/// task sent instead showed in the loop's stats (`tasks_run`, `polls`, `inbox_received`) as a
/// task per file operation nobody spawned, and one sent as a run stopped ran in the next run.
/// Cost, when a loop's count of jobs falls to zero: an eventfd write.
fn nudge(home: &std::sync::Weak<crate::event_loop::LoopShared>) {
    if let Some(home) = home.upgrade() {
        home.parker.force_unpark();
    }
}

impl<R> Future for Blocking<R> {
    type Output = io::Result<R>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        // The waker is cloned, and a replaced one dropped, outside the slot's lock: both are
        // user code for a future polled with a custom waker, and the job takes this lock to
        // store its result and take the waker, so a clone that waits for the job's end held
        // the pool thread and the loop against each other for good. Cost: a second lock only
        // when the waker changed since the last poll.
        let r = {
            let mut s = lock(&self.slot);
            match s.result.take() {
                Some(r) => Some(r),
                None if s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) => None,
                None => {
                    drop(s);
                    let fresh = cx.waker().clone();
                    let mut s = lock(&self.slot);
                    // The job may have ended meanwhile: then its result is here (and it woke
                    // the old waker, if any).
                    match s.result.take() {
                        Some(r) => {
                            let old = s.waker.take();
                            drop(s);
                            drop((old, fresh));
                            Some(r)
                        }
                        None => {
                            let old = s.waker.replace(fresh);
                            drop(s);
                            drop(old);
                            None
                        }
                    }
                }
            }
        };
        match r {
            Some(r) => {
                self.collected = true;
                Poll::Ready(r)
            }
            None => {
                wait_here(&self.ctl);
                Poll::Pending
            }
        }
    }
}

/// A loop that polled a job's future and waits on it counts the job in its work in flight
/// (`PENDING`) until the job ends, if the job is not on its count already (see
/// `CtlState::waiting`). Cost: a thread-local read, and a lock of the job's control block on
/// a loop.
fn wait_here(ctl: &Ctl) {
    let Some(home) = crate::context::with_core(|c| Arc::downgrade(&c.shared)) else {
        return;
    };
    let Some(mine) = pending() else {
        return;
    };
    let mut c = lock(&ctl.state);
    let counted = c.own.as_ref().is_some_and(|o| Arc::ptr_eq(o, &mine))
        || c.waiting.iter().any(|(n, _)| Arc::ptr_eq(n, &mine));
    // Once `done`, the job's end has taken (or is taking) the list: it counts no more.
    if !c.done && !counted {
        mine.fetch_add(1, SeqCst);
        c.waiting.push((mine, home));
    }
}

impl<R> Drop for Blocking<R> {
    fn drop(&mut self) {
        if self.collected {
            return;
        }
        // The waker a poll left in the slot goes with the future, taken under the lock and
        // dropped after it (a waker's drop is user code, see `poll`). Left there, it kept the
        // task that dropped this future (its allocation and its home loop) alive until the job
        // ended, which a job the pool cannot interrupt (the program owns the interrupt signal, or a
        // call the signal does not end) may never do, and the job's end then woke the task for
        // nothing. A job that ends later finds no waker and wakes nobody.
        let waker = lock(&self.slot).waker.take();
        drop(waker);
        if !lock(&self.ctl.state).done {
            // Still queued or running: cancelled (see the module docs). Until it ends it keeps
            // the loop from quiescence (`PENDING`), as its effect may still land; the loop
            // looks at it again soon (`abandoned`).
            lock(&self.ctl.state).cancelled = true;
            // Not taken by a thread yet (queued behind a full pool): out of the queue, and
            // dropped here, unrun. Its `Ended` guard takes it off the loop's count and its
            // captures (the file's descriptor) go now. Left queued (it would only have been
            // skipped), it kept the loop from quiescence, parking 1 ms at a time, and
            // `run()` waited a second for it at stop, with the descriptor open after
            // `File::close` returned. A job a thread took meanwhile is not found: it sees
            // `cancelled` and is skipped, or is interrupted below. Cost: a lock of the pool
            // and a walk of its queue, empty unless every pool thread is busy.
            if let Some(job) = unqueue(self.id) {
                // Skipped, as a thread that found it cancelled would have marked it; marked
                // first, so a panic in the captures' drop (user code, going on to whoever
                // drops this future) leaves the job ended, not running for good.
                lock(&self.ctl.state).done = true;
                drop(job);
                return;
            }
            if interrupt(&self.ctl) {
                wait_call(&self.ctl);
                // `try_with`: a future dropped by another thread-local's destructor at thread
                // exit, after this one's, must not panic there (that aborts the process).
                let _ = ABANDONED.try_with(|v| {
                    let mut v = v.borrow_mut();
                    // Forget those that ended whenever the list has doubled, not only when the
                    // loop parks (`park_timeout`): a loop kept busy never parks, and its list
                    // grew by one per dropped job for as long as it stayed busy. Cost:
                    // amortized one lock per drop.
                    if v.len() >= 64 && v.len().is_power_of_two() {
                        v.retain(|(_, ctl)| !lock(&ctl.state).done);
                    }
                    v.push((running_loop(), self.ctl.clone()));
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `retrying` retries a call `EINTR` cut short, as a late interrupt signal (meant for the
    /// thread's last job) cuts one, unless the running job was cancelled: then `EINTR` ends
    /// it. And it passes other errors and results on untouched.
    #[test]
    fn a_call_cut_by_a_signal_is_retried_unless_its_job_was_cancelled() {
        let eintr = || Err::<u32, _>(io::Error::from_raw_os_error(libc::EINTR));
        let ctl = Arc::new(Ctl::default());
        RUNNING.with(|r| *r.borrow_mut() = Some(ctl.clone()));

        let mut calls = 0;
        let r = retrying(|| {
            calls += 1;
            if calls < 3 {
                eintr()
            } else {
                Ok(5)
            }
        });
        assert_eq!(
            (r.unwrap(), calls),
            (5, 3),
            "EINTR retried until the call ends"
        );

        let mut calls = 0;
        let r = retrying(|| {
            calls += 1;
            Err::<u32, _>(io::Error::from_raw_os_error(libc::EAGAIN))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EAGAIN));
        assert_eq!(calls, 1, "another error is not retried");

        lock(&ctl.state).cancelled = true;
        let mut calls = 0;
        let r = retrying(|| {
            calls += 1;
            eintr()
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EINTR));
        assert_eq!(calls, 1, "a cancelled job's EINTR ends the call");

        // Off any job (no control): retried, as nothing can be cancelled.
        RUNNING.with(|r| *r.borrow_mut() = None);
        let mut calls = 0;
        let r = retrying(|| {
            calls += 1;
            if calls < 2 {
                eintr()
            } else {
                Ok(1)
            }
        });
        assert_eq!((r.unwrap(), calls), (1, 2));
    }

    /// Signals queued for this real user (`SigQ:` of /proc/self/status, the first number).
    fn queued_signals() -> usize {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s.lines().find(|l| l.starts_with("SigQ:")).unwrap();
        l[5..].trim().split('/').next().unwrap().parse().unwrap()
    }

    /// A cancelled job whose thread does not take the interrupt (a call the signal cannot
    /// cut: an `fsync` in uninterruptible sleep; here, the signal blocked) is sent one
    /// interrupt, not one per look: each send of a real-time signal queues, charged to the
    /// user's `RLIMIT_SIGPENDING` that every process of the user shares, and a loop that
    /// parked often queued hundreds per 40 ms fsync. Once the thread took it, the next look
    /// sends again. From the signals audit.
    #[test]
    fn an_interrupt_not_yet_taken_is_not_sent_again() {
        use std::sync::{atomic::Ordering::Acquire, mpsc};
        assert!(interrupt_handler_installed());
        let sig = interrupt_signal();
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let job = std::thread::spawn(move || {
            // SAFETY: a zeroed `sigset_t` is valid; these calls change this thread's mask only.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                let flag = DELIVERED.with(|d| d as *const _ as usize);
                tx.send((libc::pthread_self(), flag)).unwrap();
                go_rx.recv().unwrap();
                // Takes what is pending: the handler runs and marks it taken.
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
            DELIVERED.with(|d| d.load(Acquire))
        });
        let (thread, flag) = rx.recv().unwrap();
        let ctl = Ctl::default();
        {
            let mut st = lock(&ctl.state);
            st.thread = Some(thread);
            st.delivered = flag;
            st.cancelled = true;
        }
        let before = queued_signals();
        for _ in 0..500 {
            assert!(interrupt(&ctl), "the job still runs");
        }
        let queued = queued_signals().saturating_sub(before);
        // Other tests' signals come and go meanwhile; 500 sends would show.
        assert!(
            queued < 100,
            "{queued} interrupts queued for one job that had not taken the first"
        );
        go_tx.send(()).unwrap();
        assert!(
            job.join().unwrap(),
            "the handler marked the interrupt taken"
        );
        lock(&ctl.state).thread = None;
    }

    /// CPUs the calling thread may run on.
    fn affinity() -> Vec<usize> {
        crate::sys::thread_cpus().expect("sched_getaffinity")
    }

    /// A job's closure (its captures: an operation's file descriptor) is dropped while the job
    /// still counts among its loop's jobs in flight, whether it ran or was skipped (its future
    /// dropped before it started): dropped after the job's end, a dropped operation's file
    /// could still be open when `run()` (which waits for that count) returned. `io_fs`'s test of
    /// a skipped write's file watched for the job's wake-up of the dropped future, which a
    /// dropped future no longer leaves behind; this looks at the count itself.
    #[test]
    fn a_jobs_captures_go_while_it_still_counts_in_flight() {
        use std::sync::atomic::AtomicBool;
        /// Records the loop's count of jobs in flight when the closure's captures drop.
        struct Probe {
            count: Arc<AtomicUsize>,
            seen: Arc<AtomicUsize>,
        }
        impl Drop for Probe {
            fn drop(&mut self) {
                self.seen.store(self.count.load(SeqCst), SeqCst);
            }
        }
        let (skipped, ran) = std::thread::spawn(|| {
            let count = pending().expect("the thread-local lives");
            let (mut skipped, mut ran) = (0, 0);
            for _ in 0..200 {
                let seen = Arc::new(AtomicUsize::new(usize::MAX));
                let went = Arc::new(AtomicBool::new(false));
                let probe = Probe {
                    count: count.clone(),
                    seen: seen.clone(),
                };
                let w = went.clone();
                let job = run(move || {
                    let _held = &probe;
                    w.store(true, SeqCst);
                    Ok(())
                });
                // Most often before a pool thread took the job: skipped.
                drop(job);
                let t0 = std::time::Instant::now();
                while count.load(SeqCst) != 0 {
                    assert!(t0.elapsed() < Duration::from_secs(60), "a job never ended");
                    std::thread::yield_now();
                }
                let at_drop = seen.load(SeqCst);
                assert!(
                    at_drop != usize::MAX,
                    "a job's captures were still alive when it stopped counting"
                );
                assert!(
                    at_drop >= 1,
                    "a job's captures went after it stopped counting"
                );
                if went.load(SeqCst) {
                    ran += 1;
                } else {
                    skipped += 1;
                }
            }
            (skipped, ran)
        })
        .join()
        .unwrap();
        assert!(skipped > 0, "no job was skipped in 200 rounds ({ran} ran)");
    }

    /// A job a pool thread took, held between its start and its claimed call while its
    /// future is dropped, makes no call: a dropped write (or `O_TRUNC` open, or unlink) that
    /// a thread was about to make landed after the operations the program issued next.
    #[test]
    fn a_claimed_call_whose_job_was_cancelled_first_is_not_made() {
        use std::sync::{atomic::AtomicBool, mpsc};
        std::thread::spawn(|| {
            let count = pending().expect("the thread-local lives");
            let (taken_tx, taken) = mpsc::channel();
            let gate = Arc::new((Mutex::new(false), Condvar::new()));
            let called = Arc::new(AtomicBool::new(false));
            let (g, c) = (gate.clone(), called.clone());
            let job = run(move || {
                let _ = taken_tx.send(());
                let (open, cv) = &*g;
                let mut o = lock(open);
                while !*o {
                    o = cv
                        .wait(o)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                drop(o);
                claimed(|| {
                    c.store(true, SeqCst);
                    Ok(())
                })
            });
            taken.recv().expect("a pool thread takes the job");
            drop(job);
            *lock(&gate.0) = true;
            gate.1.notify_all();
            let t0 = std::time::Instant::now();
            while count.load(SeqCst) != 0 {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "the job never ended"
                );
                std::thread::yield_now();
            }
            assert!(
                !called.load(SeqCst),
                "the call was made after its job's future was dropped"
            );
        })
        .join()
        .unwrap();
    }

    /// Abandoned jobs that ended are forgotten as more jobs are abandoned, not only when the
    /// loop parks (`park_timeout`) or stops (`settle`): a loop kept busy never parks, and its
    /// list of abandoned jobs (a file operation under a timeout that fires, each) grew for as
    /// long as it stayed busy.
    #[test]
    fn ended_abandoned_jobs_are_forgotten_on_a_loop_that_never_parks() {
        const ROUNDS: usize = 1000;
        let len = std::thread::spawn(|| {
            for _ in 0..ROUNDS {
                let gate = Arc::new((Mutex::new(false), Condvar::new()));
                let g = gate.clone();
                let job = run(move || {
                    let (open, cv) = &*g;
                    let timeout = Duration::from_secs(60);
                    drop(cv.wait_timeout_while(lock(open), timeout, |o| !*o).unwrap());
                    Ok(())
                });
                let ctl = job.ctl.clone();
                // Dropped while it waits on the gate: abandoned. (Dropped while still queued,
                // it would leave the queue unrun, and never be listed.)
                let t0 = std::time::Instant::now();
                while lock(&ctl.state).thread.is_none() {
                    assert!(
                        t0.elapsed() < Duration::from_secs(60),
                        "a job never started"
                    );
                    std::thread::yield_now();
                }
                drop(job);
                *lock(&gate.0) = true;
                gate.1.notify_all();
                let t0 = std::time::Instant::now();
                while !lock(&ctl.state).done {
                    assert!(t0.elapsed() < Duration::from_secs(60), "a job never ended");
                    std::thread::yield_now();
                }
            }
            ABANDONED.with(|v| v.borrow().len())
        })
        .join()
        .unwrap();
        assert!(
            len < 128,
            "{len} ended jobs of {ROUNDS} abandoned still listed (nothing parked to forget them)"
        );
    }

    /// A pool thread started from a pinned loop thread runs on every allowed CPU, not on the
    /// loop's one (it inherited the pinning).
    #[test]
    fn pool_threads_do_not_inherit_a_loops_pinning() {
        let topo = Arc::new(xtc_numa::Topology::detect().expect("the running machine"));
        let all = topo.allowed_pus();
        if all.len() < 2 {
            println!("skipped: one allowed CPU");
            return;
        }
        set_topology(topo.clone());
        let (got, jobs, before, after) = std::thread::spawn(move || {
            xtc_numa::pin_current_thread(&topo, all[0]).expect("pin");
            assert_eq!(affinity().len(), 1, "the submitting thread is pinned");
            // Enough jobs at once that at least one new pool thread starts from here (while
            // the pool is not full): each job waits until all are submitted, so none ends and
            // frees its thread for the next one before the count below is taken. More jobs
            // than the pool has threads: other tests of this process leave idle ones, which
            // take jobs first.
            let threads = || lock(&pool().state).threads;
            let before = threads();
            let n = before + 8;
            let gate = Arc::new((Mutex::new(false), Condvar::new()));
            let jobs: Vec<_> = (0..n)
                .map(|_| {
                    let gate = gate.clone();
                    run(move || {
                        let (open, cv) = &*gate;
                        let g = lock(open);
                        let timeout = Duration::from_secs(60);
                        drop(cv.wait_timeout_while(g, timeout, |o| !*o).unwrap());
                        Ok(affinity().len())
                    })
                })
                .collect();
            let after = threads();
            *lock(&gate.0) = true;
            gate.1.notify_all();
            let got = jobs
                .into_iter()
                .map(|j| futures_lite::future::block_on(j).unwrap())
                .collect::<Vec<_>>();
            (got, n, before, after)
        })
        .join()
        .unwrap();
        // Pool threads exit only after `IDLE_EXIT` idle: none left between the two counts.
        assert!(
            after > before,
            "no pool thread was started from the pinned thread ({before} -> {after}): nothing \
             was checked"
        );
        assert_eq!(got.len(), jobs);
        assert!(
            got.iter().all(|&n| n > 1),
            "pool threads pinned to one CPU: {got:?}"
        );
    }
}
