//! I/O: one driver per loop, io_uring by default, epoll where io_uring is unavailable or
//! forced (see "Choice of driver" below).
//!
//! # How a loop does I/O
//!
//! Every loop owns a `Reactor`: an io_uring instance (`uring.rs`), an epoll instance
//! (`epoll.rs`), or, if the OS refused both, none (I/O calls then fail with a clear error and the
//! loop parks on its eventfd as before). The reactor *is* the loop's park (event_loop step 6):
//! an idle loop waits in the reactor until a completion or readiness event, its wake eventfd
//! (registered in the reactor) or its timeout, which is the next timer deadline or the idle
//! tick — so timers are served by the driver (an io_uring wait timeout, or epoll_wait's).
//! Completions are also reaped at the start of every loop turn and every `REAP_EVERY` (32) task
//! polls within a turn, so a busy loop still makes I/O progress. Not file operations on epoll:
//! they end on pool threads, whose wake-ups come through the loop's inbox, read once a turn,
//! so a busy loop sees them within a turn (up to `BATCH`, 128 polls), not within 32.
//!
//! * **io_uring** (`uring.rs`): an operation is a submission whose buffers and addresses are
//!   owned by the operation's future. Each in-flight operation has a slot whose state is
//!   `Submitted | Waiting(waker) | Ignored(owned data) | Detached(owned data) |
//!   Completed(result)`. Dropping the future before completion moves its buffers into the
//!   slot (`Ignored`) and submits an `AsyncCancel`: the kernel may still write into them until
//!   the completion arrives, which is when they are freed. A stream's write-behind send and a
//!   dropped `CLOSE` are left to finish instead (`Detached`, `uring.rs` rule 4b). A reactor
//!   dropped at loop shutdown gives detached sends a grace period, cancels the rest and waits
//!   for their completions for a bounded time (about a second each), then leaks what is still
//!   in flight rather than free memory the kernel may still write (`uring.rs` rule 5).
//! * **epoll** (`epoll.rs`): readiness, edge-triggered, each fd added once. An operation tries
//!   its non-blocking system call while its direction's ready bit is set; `EAGAIN` or a short
//!   stream transfer clears the bit, and the waker waits for the next event, which sets it
//!   again (end of input and errors set sticky bits). Files go to a blocking thread pool
//!   (`blocking.rs`, up to 512 threads, started on demand), as tokio does, because epoll
//!   cannot wait on regular files.
//!
//!   A call that finds its fd ready returns at once, without a loop turn: a task reading a
//!   stream whose peer keeps it full (or accepting from a backlog a flood keeps full, or
//!   writing into a socket a fast reader keeps drained) would never return `Pending` and held
//!   its loop for good. So each poll of a task may make `COOP_BUDGET` (128) such ready calls;
//!   the next one yields first, ending the loop's batch (`context::coop_spend`), as tokio's
//!   cooperative budget does. io_uring needs none: each operation completes through a turn.
//!
//! Each operation lives in one file with both backends (`ops/`), so the two paths are read side
//! by side.
//!
//! # Choice of driver
//!
//! [`Builder::io_driver`](crate::Builder::io_driver) or `XTC_IO=auto|io_uring|epoll`; auto
//! probes io_uring once per process (ring setup and an opcode probe) and falls back to epoll
//! when setup fails (`ENOSYS`, `EPERM` under Docker's default seccomp profile,
//! `kernel.io_uring_disabled`), an opcode xtc needs is missing, or the kernel lacks fast poll
//! (before 5.7, a socket operation with nothing to do answers `EAGAIN` instead of waiting). The choice is logged once and
//! readable with [`Handle::io_driver`](crate::Handle::io_driver) and [`current_driver`].
//!
//! # Types are `!Send`
//!
//! I/O objects ([`net`](crate::net), [`fs`](crate::fs)) belong to the loop whose task uses them,
//! like Glommio's and monoio's: their operations are in that loop's reactor. Use them in pinned
//! tasks (`spawn_local`, `spawn_on`); to hand a connection to another shard, convert it with
//! `into_std`, send it (`submit_to`), and rebuild it there with `from_std`.
//!
//! The loop submits and reaps its operations when it turns: an operation awaited inside a task
//! by a foreign executor that blocks the loop's thread (`futures::executor::block_on(s.read(..))`)
//! waits for good, as the loop's own timers do (and tokio's I/O in the same case). Await it in
//! the task; use `into_std` and `std`'s blocking calls where blocking the loop is meant.

pub(crate) mod blocking;
mod buf;
pub(crate) mod epoll;
pub(crate) mod ops;
pub(crate) mod source;
pub(crate) mod uring;

use std::{fmt, io, str::FromStr, sync::OnceLock, time::Duration};

pub use buf::{BufResult, FixedBuf, FixedBufPool, IoBuf, IoBufMut};

use crate::context;

/// A process-unique driver identity (operations and registrations name their driver by it).
pub(crate) fn next_driver_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Task polls between two reaps of the reactor within one loop turn.
pub(crate) const REAP_EVERY: usize = 32;

/// Ready readiness calls (epoll) one poll of a task may make before the next one yields
/// (`context::coop_spend`). 128, as tokio's budget: at about a microsecond per system call, a
/// task holds its loop for a fraction of a millisecond at most before timers, the inbox and
/// other tasks are served.
pub(crate) const COOP_BUDGET: u32 = 128;

/// Which I/O driver a loop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Driver {
    /// io_uring: completion-based, one submission per operation, batched per loop turn.
    IoUring,
    /// epoll: readiness-based, one `epoll_ctl` per descriptor (at its first wait); files on a
    /// blocking thread pool.
    Epoll,
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Driver::IoUring => "io_uring",
            Driver::Epoll => "epoll",
        })
    }
}

/// What the builder asks for: a driver, or the best one available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DriverChoice {
    /// io_uring if this process can set one up and it supports the opcodes xtc uses, else
    /// epoll (logged once).
    #[default]
    Auto,
    /// io_uring or an error from `build()` that says why it is unavailable (its probe ring
    /// cannot be set up, or lacks an opcode xtc uses). A loop whose own ring then cannot be set
    /// up (out of `RLIMIT_MEMLOCK` with many loops, in a container, say) still runs epoll, with
    /// a warning: its [`LoopStats::io_driver`](crate::LoopStats::io_driver) says so.
    IoUring,
    /// epoll, even where io_uring works.
    Epoll,
}

/// What [`DriverChoice`]'s `FromStr` accepts, for error messages.
pub(crate) const DRIVER_CHOICES: &str = "auto, io_uring (or uring, iouring, io-uring) or epoll";

impl FromStr for DriverChoice {
    type Err = crate::Error;

    /// `auto`, `io_uring` (or `uring`, `iouring`, `io-uring`), `epoll`; case-insensitive,
    /// surrounding blanks ignored. Anything else is an
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) that names the value and the
    /// accepted ones (`XTC_IO` turns it into an [`Error::Env`](crate::Error::Env) naming the
    /// variable). Cost: one lowercased copy.
    fn from_str(s: &str) -> crate::Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DriverChoice::Auto),
            "io_uring" | "uring" | "iouring" | "io-uring" => Ok(DriverChoice::IoUring),
            "epoll" => Ok(DriverChoice::Epoll),
            _ => Err(crate::Error::InvalidArgument(format!(
                "unknown I/O driver {s:?}: expected {DRIVER_CHOICES}"
            ))),
        }
    }
}

/// The result of probing io_uring once per process: `Ok` or why it cannot be used.
fn uring_probe() -> &'static Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(uring::probe)
}

/// Resolves a choice to a driver. `Err` names why a forced io_uring is unavailable.
pub(crate) fn resolve(choice: DriverChoice) -> Result<Driver, String> {
    // Once per process, whichever way the driver was chosen: a forced choice logged nothing.
    static LOGGED: std::sync::Once = std::sync::Once::new();
    let forced = |d: Driver| {
        LOGGED.call_once(|| {
            tracing::info!("xtc: I/O driver {d} (forced by XTC_IO or Builder::io_driver)");
        });
        d
    };
    match choice {
        DriverChoice::Epoll => Ok(forced(Driver::Epoll)),
        DriverChoice::IoUring => match uring_probe() {
            Ok(()) => Ok(forced(Driver::IoUring)),
            Err(why) => Err(format!(
                "io_uring was asked for (XTC_IO or Builder::io_driver) but is unavailable: {why}; \
                 use XTC_IO=epoll or DriverChoice::Auto"
            )),
        },
        DriverChoice::Auto => {
            let d = match uring_probe() {
                Ok(()) => Driver::IoUring,
                Err(why) => {
                    LOGGED.call_once(|| {
                        tracing::info!("xtc: io_uring unavailable ({why}); using epoll");
                    });
                    Driver::Epoll
                }
            };
            LOGGED.call_once(|| tracing::info!("xtc: I/O driver {d}"));
            Ok(d)
        }
    }
}

/// One loop's I/O driver.
// One per loop, built once inside the loop's Core and never moved: boxing would only add an
// indirection on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Reactor {
    Uring(uring::Uring),
    Epoll(epoll::Epoll),
    /// Neither could be created (the error says why); the loop parks on its eventfd.
    None(String),
}

impl Reactor {
    /// Creates the driver `kind` for a loop whose wake eventfd is `ping_fd`; falls back to
    /// epoll, then to none, logging why.
    pub(crate) fn new(kind: Driver, ping_fd: std::os::fd::RawFd) -> Reactor {
        if cfg!(loom) {
            return Reactor::None("loom models run without an I/O driver".into());
        }
        if kind == Driver::IoUring {
            match uring::Uring::new(ping_fd) {
                Ok(u) => return Reactor::Uring(u),
                Err(e) => {
                    // The probe passed at build, so this loop's ring alone failed: it runs
                    // epoll, as its `LoopStats::io_driver` says, while the others keep theirs.
                    tracing::warn!(
                        "xtc: io_uring setup failed for a loop ({e}{}); this loop uses epoll",
                        uring::setup_hint(&e)
                    )
                }
            }
        }
        match epoll::Epoll::new(ping_fd) {
            Ok(e) => Reactor::Epoll(e),
            Err(e) => {
                tracing::warn!(
                    "xtc: epoll_create1 failed for a loop ({e}); this loop cannot do I/O"
                );
                Reactor::None(format!(
                    "the loop has no I/O driver (epoll_create1 failed: {e})"
                ))
            }
        }
    }

    pub(crate) fn kind(&self) -> Option<Driver> {
        match self {
            Reactor::Uring(_) => Some(Driver::IoUring),
            Reactor::Epoll(_) => Some(Driver::Epoll),
            Reactor::None(_) => None,
        }
    }

    /// Submits what is queued and dispatches what completed, without blocking. Returns the
    /// number of completions or events dispatched.
    pub(crate) fn reap(&self) -> usize {
        match self {
            Reactor::Uring(u) => u.reap(),
            Reactor::Epoll(e) => e.reap(),
            Reactor::None(_) => 0,
        }
    }

    /// Hands queued io_uring submissions to the kernel (one `io_uring_enter`), if any: at the
    /// end of a loop turn, so an idle loop's spin-before-park does not sit on unsent requests.
    pub(crate) fn submit(&self) {
        if let Reactor::Uring(u) = self {
            u.submit_pending();
        }
    }

    /// Whether completions wait in shared memory (io_uring; a load, no system call).
    pub(crate) fn has_completions(&self) -> bool {
        match self {
            Reactor::Uring(u) => u.has_completions(),
            _ => false,
        }
    }

    /// Operations (or readiness waits, or blocking-pool jobs) that will wake a task later:
    /// while any exist the loop is not quiescent and not deadlocked.
    pub(crate) fn in_flight(&self) -> usize {
        let pool = blocking::in_flight();
        pool + match self {
            Reactor::Uring(u) => u.in_flight(),
            Reactor::Epoll(e) => e.in_flight(),
            Reactor::None(_) => 0,
        }
    }

    /// Parks in the driver until an event, a wake ping or `timeout`. Returns whether the wake
    /// ping fired, whether the driver already drained it, and how many I/O events it
    /// dispatched.
    pub(crate) fn park(
        &self,
        timeout: Option<Duration>,
        fallback: &dyn Fn(Option<Duration>) -> bool,
    ) -> (bool, bool, usize) {
        let timeout = blocking::park_timeout(timeout);
        match self {
            Reactor::Uring(u) => u.park(timeout),
            Reactor::Epoll(e) => {
                let (p, n) = e.park(timeout);
                (p, true, n)
            }
            Reactor::None(_) => (fallback(timeout), false, 0),
        }
    }

    /// Submissions and completions so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        match self {
            Reactor::Uring(u) => u.counts(),
            Reactor::Epoll(e) => e.counts(),
            Reactor::None(_) => (0, 0),
        }
    }
}

/// The I/O driver of the loop running on this thread; `None` off any loop or if the loop has
/// none. Cost: a thread-local read.
pub fn current_driver() -> Option<Driver> {
    context::with_core(|c| c.io.kind()).flatten()
}

/// The error of an I/O call made on a thread that runs no xtc loop, or that starts new I/O
/// while `context::off_loop` hides this thread's loop (see [`with_running_reactor`]).
pub(crate) fn off_loop() -> io::Error {
    if context::loop_hidden() {
        return io::Error::other(
            "xtc I/O used off any xtc loop: this thread's loop is hidden while an executor \
             frees its tasks (a `Drop` run by an executor's drop or the end of its run), and \
             cannot drive I/O started there; start it in a task (spawn_local / spawn_on)",
        );
    }
    io::Error::other(
        "xtc I/O used off any xtc loop: create and use sockets and files inside a task \
         (spawn_local / spawn_on)",
    )
}

/// Runs `f` with the reactor of this thread's loop, or returns the reason there is none. Also
/// while `context::off_loop` hides the loop from the shard API: I/O objects are `!Send`, so
/// this thread's loop is theirs, and a call made then (a stream's drop reaping its receive,
/// resuming a write-behind send) must reach it: seeing no loop, a drop discarded a receive
/// the kernel had completed.
pub(crate) fn with_reactor<R>(f: impl FnOnce(&Reactor) -> io::Result<R>) -> io::Result<R> {
    let mut f = Some(f);
    match context::with_own_core(|c| {
        let f = f.take()?;
        Some(match &c.io {
            Reactor::None(why) => Err(io::Error::other(why.clone())),
            r => f(r),
        })
    }) {
        Some(r) => r,
        None => Err(off_loop()),
    }
}

/// Runs `f` with the reactor of the loop running on this thread, for starting new I/O (an
/// operation, a readiness wait) that must be driven to its end; or returns the reason there is
/// none. Unlike [`with_reactor`] it never reaches a loop `context::off_loop` hides: that loop
/// does not turn until the hidden section ends, so an operation started on it there waited
/// for good if the section waited for it (a `Drop` that blocks on I/O); instead the I/O fails
/// at once with the off-loop error, as on a thread that runs no loop, which is what the
/// section promises. A loop run inside the section (`LocalExecutor::block_on`) is the
/// running one, and does the I/O. Cost: a thread-local read.
pub(crate) fn with_running_reactor<R>(f: impl FnOnce(&Reactor) -> io::Result<R>) -> io::Result<R> {
    match context::with_core(|c| match &c.io {
        Reactor::None(why) => Err(io::Error::other(why.clone())),
        r => f(r),
    }) {
        Some(r) => r,
        None => Err(off_loop()),
    }
}

/// Reaps the drivers of this thread's loops now (the running one's, and those of loops
/// `context::off_loop` hides): completions already in the kernel's queue reach their slots
/// (and wake their tasks). For a drop deciding from whether its operation has finished
/// (`Op::completed` sees only reaped completions). The operation may be a hidden loop's, its
/// object used on a loop run inside the hidden section: reaping only that inner loop, an
/// `into_std` there waited its second for a cancel the kernel had answered at once, and
/// refused. Nothing off a loop. Cost: a reap per loop of the thread.
pub(crate) fn reap_now() {
    context::with_own_core(|c| {
        c.io.reap();
        None::<()>
    });
}

/// Hands the io_uring entries this thread's loops queued (the running one's, and those of loops
/// `context::off_loop` hides) to the kernel now, before a descriptor they may name closes or
/// changes hands: an entry names its descriptor by number only until it is submitted (then
/// the operation holds the file itself), and one left queued until the end of the turn, after
/// its `Op` was forgotten (`mem::forget`, safe code) and its socket closed, went to whatever
/// the number meant by then (a socket made in the same turn). Cost: a thread-local read and a
/// flag per io_uring loop; one `io_uring_enter` only where entries are queued.
///
/// Returns whether every such entry was handed over (`false` after a failed
/// `io_uring_enter`: see [`close_after_submit`]).
pub(crate) fn submit_queued() -> bool {
    let mut all = true;
    context::with_own_core(|c| {
        if let Reactor::Uring(u) = &c.io {
            all &= u.submit_pending();
        }
        None::<()>
    });
    all
}

/// Closes `fd` once no io_uring entry this thread's loops queued can name it: at once if
/// [`submit_queued`] hands them all to the kernel, else when each loop whose submit failed has
/// submitted what it had queued (its next successful `io_uring_enter`, at the latest its
/// park), or has gone. Closed at once, its number went to the next socket or file opened,
/// and the entry started there (a dropped read's receive took that socket's bytes). Cost: a
/// thread-local read and a flag per io_uring loop; after a failed submit, an `Rc` per loop.
pub(crate) fn close_after_submit(fd: std::os::fd::OwnedFd) {
    if submit_queued() {
        return;
    }
    let fd = std::rc::Rc::new(fd);
    context::with_own_core(|c| {
        if let Reactor::Uring(u) = &c.io {
            u.hold(&fd);
        }
        None::<()>
    });
}

/// Which backend the running loop uses (for the `ops` dispatch, which starts new operations:
/// not on a loop `context::off_loop` hides, see [`with_running_reactor`]).
pub(crate) fn current_kind() -> io::Result<Driver> {
    with_running_reactor(|r| Ok(r.kind().expect("with_running_reactor excludes None")))
}
