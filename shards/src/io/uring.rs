//! The io_uring driver: one ring per loop, operations as owned-data futures.
//!
//! # Operation protocol
//!
//! 1. **Submit.** An operation's data (buffers, addresses) moves into its [`Op`] future, the
//!    submission entry points into that data's heap memory, and a slot `Submitted` is taken in
//!    the driver's slab; the slot key, with the slot's generation in the
//!    high 32 bits, is the entry's `user_data` (so a cancellation names one operation even after
//!    a slot is reused). Entries queue in the
//!    submission ring and reach the kernel at the end of the loop turn (one `io_uring_enter`
//!    for the whole batch), or at once if the ring is full. If that early `io_uring_enter` is
//!    refused for now (`EAGAIN`, `EBUSY`), the entry waits in the driver's overflow queue,
//!    behind the older ones, for the next enter that succeeds: a submit never fails for want
//!    of room, as an operation on epoll never fails that way.
//! 2. **Wait.** Polling the `Op` stores its waker: `Waiting(waker)`. [`Op::unwait`] puts it
//!    back to `Submitted` (an owned stream read whose future was dropped and whose stream
//!    keeps it running: nobody waits for it until the next read polls it).
//! 3. **Complete.** Reaping a completion turns the slot into `Completed(result, place)` (its
//!    place in the order the driver reaped completions) and wakes the waiter; the next poll
//!    removes the slot and returns the result with the data.
//! 4. **Drop early.** An `Op` dropped before its completion moves its data into the slot,
//!    `Ignored(data)`, and submits an `AsyncCancel` for it. The data lives until the
//!    completion (of the operation or of its cancellation) is reaped, so the kernel never
//!    writes into freed memory. No slot is freed while the kernel may still use it.
//!    **4b. Detach.** An `Op` whose operation must still happen (a send whose bytes were
//!    reported written) moves its data into the slot as `Detached(data)` and cancels
//!    nothing; the completion frees it. A detached operation holds no task, so it does not
//!    keep the loop from quiescence; one still in flight when the loop stops gets a grace
//!    to finish, then is cancelled (rule 5), and one still in flight after
//!    [`DETACH_LIMIT_SECS`] is cancelled by the expiry timeout submitted with the detach (a
//!    peer that stopped reading).
//! 5. **Shutdown.** Dropping the driver cancels every operation still in flight (and the
//!    wake-ping read) but the detached sends, whose bytes were reported written: those get up
//!    to [`SHUTDOWN_WAIT`] (one second) to finish, a peer still reading, and are cancelled
//!    only then. It waits up to that long again for the cancellations; what is still
//!    outstanding then is leaked (logged), never freed under the kernel. An entry the kernel
//!    never consumed (still queued, in the ring or its overflow, after refused enters) is not
//!    waited for: once the shutdown stops submitting, its operation ends as cancelled
//!    (`-ECANCELED`), its data freed (a wake-ping read among them is simply not armed). The
//!    reaping and that freeing run user code (a cancelled read's buffer's `Drop`, a waker),
//!    which may drop, poll or detach another `Op` of the driver: the driver stays within its `Op`s' reach until its `Drop`
//!    is done (a thread-local list of drivers being dropped), so such an `Op` is abandoned as
//!    in rule 4, its data kept until its completion. An `Op` may outlive
//!    its driver (a stream returned from `LocalExecutor::block_on` and used in the next one,
//!    with a receive it kept): the driver leaves each live `Op`'s result in
//!    [`ORPHANS`] (a process-wide table, so an `Op` dropped at thread exit still finds it), and the
//!    `Op` resolves to it there, so a receive that completed before the shutdown still hands
//!    over its bytes, and a send still reports what it sent. One whose operation the kernel
//!    still held when the driver gave up never resolves, and its data is leaked with it; so
//!    does one that finds neither its driver nor a record (a driver that shut down records
//!    every live `Op`, so that one is alive but out of reach: a `Core` dropped after its
//!    loop's `Enter` guard, as when a shutdown unwinds, drops its queued tasks before its
//!    driver).
//!
//! The loop's wake eventfd is read by a standing `READ` (token [`PING`]), re-armed at each
//! park, so a cross-shard wake completes the driver's wait. (A kernel that answers that read
//! with `EAGAIN`, honouring the eventfd's `O_NONBLOCK`, gets a `POLL_ADD` instead, and the
//! parker drains the eventfd.) Entries queued during a turn are submitted at its end, before
//! any spin-before-park, so a request never waits for the loop to go to sleep. Park timeouts use the
//! `EXT_ARG` wait timeout (kernel 5.11+) or, before that, a `TIMEOUT` entry, removed
//! (`TIMEOUT_REMOVE`) when the park ends before it fires.

//!
//! # Not used, and why
//!
//! Multishot accept and provided buffer rings are not used. xtc's target servers keep
//! connections open (the echo benchmark opens 64–256 once, then exchanges messages), so accept
//! is off the hot path and one `ACCEPT` per connection costs nothing measurable; provided
//! buffers save memory when many connections sit in a read, at the price of a copy-or-return
//! protocol per message, which the 128-byte request/response benchmark would only slow down.
//! `IORING_SETUP_DEFER_TASKRUN` is not used either: it defers completions until the next
//! `io_uring_enter`, which would cost the per-turn reap a system call.

use std::{
    any::Any,
    cell::{Cell, RefCell},
    fmt,
    future::Future,
    io,
    os::fd::RawFd,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use io_uring::{opcode, squeue, types, IoUring, Probe};
use slab::Slab;

use crate::context;

/// `user_data` of the wake-ping read.
const PING: u64 = u64::MAX;
/// `user_data` of a park timeout entry (kernels without `EXT_ARG`).
const TIMEOUT: u64 = u64::MAX - 1;
/// `user_data` of cancellations (their completions carry nothing we need).
const CANCEL: u64 = u64::MAX - 2;
/// Tag bit of the `user_data` of a detached operation's expiry timeout (rule 4b): the rest is
/// the operation's own `user_data`. Generations are 31 bits, so no operation's has this bit.
const EXPIRY: u64 = 1 << 63;

/// How long a detached operation may run on (rule 4b) before the driver cancels it: a send to
/// a peer that stopped reading must not hold its socket (which cannot close while the send
/// holds it), its buffers and its slot for good. The price: a peer that reads the last write
/// of a dropped stream slower than that (64 KiB at under 6.5 KB/s) gets it cut short, with a
/// plain end of stream. Code that needs every byte delivered whatever the peer's pace flushes
/// (`AsyncWriteExt::flush` or `close`) before dropping, and sees the outcome.
pub(crate) const DETACH_LIMIT_SECS: u64 = 10;
static DETACH_LIMIT: types::Timespec = types::Timespec::new().sec(DETACH_LIMIT_SECS);

/// Submission ring size. The completion ring is twice as large (kernel default), and the
/// kernel buffers overflow beyond that (`IORING_FEAT_NODROP`), so this bounds only how many
/// entries one turn queues before an early submit.
const ENTRIES: u32 = 256;

/// Longest wait while something a wake needs may not be in the kernel ([`retry_bound`]).
const PING_RETRY: Duration = Duration::from_millis(1);

/// A wait of `timeout` (none: forever) cut to [`PING_RETRY`]: while something a wake needs may
/// not be in the kernel (the ping read unarmed, entries left in the overflow, a refused enter).
fn retry_bound(timeout: Option<Duration>) -> Duration {
    timeout.map_or(PING_RETRY, |t| t.min(PING_RETRY))
}

/// The opcodes xtc's operations use; a kernel lacking one gets the epoll driver.
const REQUIRED: &[(u8, &str)] = &[
    (opcode::Read::CODE, "READ"),
    (opcode::Write::CODE, "WRITE"),
    (opcode::ReadFixed::CODE, "READ_FIXED"),
    (opcode::WriteFixed::CODE, "WRITE_FIXED"),
    (opcode::Recv::CODE, "RECV"),
    (opcode::Send::CODE, "SEND"),
    (opcode::RecvMsg::CODE, "RECVMSG"),
    (opcode::SendMsg::CODE, "SENDMSG"),
    (opcode::Accept::CODE, "ACCEPT"),
    (opcode::Connect::CODE, "CONNECT"),
    (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
    (opcode::Timeout::CODE, "TIMEOUT"),
    (opcode::TimeoutRemove::CODE, "TIMEOUT_REMOVE"),
    (opcode::OpenAt::CODE, "OPENAT"),
    (opcode::Statx::CODE, "STATX"),
    (opcode::Fsync::CODE, "FSYNC"),
    (opcode::Close::CODE, "CLOSE"),
    (opcode::PollAdd::CODE, "POLL_ADD"),
];

/// Sets up a small ring and checks the opcodes xtc needs: `Ok` or why io_uring is unusable.
pub(crate) fn probe() -> Result<(), String> {
    let ring =
        IoUring::new(8).map_err(|e| format!("io_uring_setup failed: {e}{}", setup_hint(&e)))?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|e| {
        // EINVAL: an opcode this kernel does not know; anything else (a seccomp filter's
        // EPERM, say) is no sign of its age.
        let why = if e.raw_os_error() == Some(libc::EINVAL) {
            " (kernel older than 5.6)"
        } else {
            ""
        };
        format!("IORING_REGISTER_PROBE failed: {e}{why}")
    })?;
    // Without fast poll (Linux 5.6) a socket operation with nothing to do yet goes to a
    // kernel worker, where the socket's `O_NONBLOCK` answers `EAGAIN` at once: the operations
    // would start again every turn (`nothing_moved`), a busy loop, where epoll waits.
    if !ring.params().is_feature_fast_poll() {
        return Err(
            "the kernel lacks IORING_FEAT_FAST_POLL (Linux before 5.7): socket \
                    operations would answer EAGAIN instead of waiting"
                .into(),
        );
    }
    for &(code, name) in REQUIRED {
        if !probe.is_supported(code) {
            return Err(format!("the kernel lacks IORING_OP_{name}"));
        }
    }
    Ok(())
}

/// What an `io_uring_setup` error means and what to do about it, for logs and `Err`s.
pub(crate) fn setup_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => " (kernel without io_uring)",
        Some(libc::EPERM) => {
            " (denied: a seccomp profile such as Docker's default, or kernel.io_uring_disabled=2)"
        }
        // Without CAP_IPC_LOCK (Docker drops it) the kernel charges each ring's memory to the
        // user's RLIMIT_MEMLOCK, shared by all of the user's processes.
        Some(libc::ENOMEM) => {
            " (RLIMIT_MEMLOCK spent: raise `ulimit -l` (LimitMEMLOCK=, docker --ulimit memlock=), \
             grant CAP_IPC_LOCK, or set XTC_IO=epoll)"
        }
        _ => "",
    }
}

/// A slot of an operation in flight (module doc, rules 1–4).
enum Lifecycle {
    Submitted,
    Waiting(Waker),
    /// The Op was dropped: its data, kept until the completion, and whether a successful
    /// result is a new descriptor that nobody will own (closed when it arrives).
    Ignored(#[allow(dead_code)] Box<dyn Any>, bool),
    /// The Op let its operation run on without it (`Op::detach_send`, `Op::detach_closing`;
    /// rule 4b): its data, kept until the completion, and what its end must look at
    /// ([`Detach`]); nobody reads its result otherwise.
    Detached(#[allow(dead_code)] Box<dyn Any>, Detach),
    /// Its result, and its place in the order the driver reaped completions (the `completed`
    /// count then, [`Op::completed_at`]).
    Completed(i32, u64),
}

/// Logs a detached send ([`Op::detach_send`]) that ended without moving all of its `want`
/// bytes: its stream reported them written, and nothing is left to send the rest. A short
/// result is a warning (the connection lives on, and its peer gets a stream cut short): Linux
/// before 5.19 ignores `MSG_WAITALL` on a send and may complete it short, and a signal may cut
/// one on any kernel. An error (the peer gone, or the expiry's cancel, rule 4b) is a debug
/// line. Nothing to send (`want` 0): nothing.
fn check_detached_send(res: i32, want: u32) {
    if want == 0 {
        return;
    }
    if res >= 0 && (res as u32) < want {
        tracing::warn!(
            "xtc: a send detached at a stream's drop sent {res} of its {want} bytes, and the \
             rest is lost (the kernel completed it short; Linux before 5.19 ignores MSG_WAITALL \
             on a send): flush (or close) a stream before dropping it where every byte must \
             arrive"
        );
    } else if res < 0 {
        tracing::debug!(
            "xtc: a send detached at a stream's drop failed ({}): {want} bytes lost",
            std::io::Error::from_raw_os_error(-res)
        );
    }
}

/// What a detached operation's end must look at ([`Lifecycle::Detached`]).
#[derive(Debug, Clone, Copy)]
enum Detach {
    /// A send that must move this many bytes (from its start offset): fewer is logged
    /// ([`check_detached_send`]).
    Send(u32),
    /// A `CLOSE` of this descriptor, closed here if the operation ends without having run:
    /// cancelled (`-ECANCELED`), or never consumed by the kernel at the shutdown (rule 5).
    Close(RawFd),
}

impl Detach {
    /// The operation ended cancelled before it ran: a `CLOSE`'s descriptor is closed (else it
    /// stayed open for good, its owner having given it up to the `CLOSE`); a send's bytes
    /// are lost, which [`check_detached_send`] logs where the caller calls it.
    fn cancelled_unrun(self) {
        if let Detach::Close(fd) = self {
            // Nobody to tell: a detached close's result goes nowhere.
            let _ = close_cancelled(fd);
        }
    }

    /// The operation's completion with `res`.
    fn ended(self, res: i32) {
        match self {
            Detach::Close(_) if res == -libc::ECANCELED => self.cancelled_unrun(),
            Detach::Close(_) => {}
            Detach::Send(want) => check_detached_send(res, want),
        }
    }
}

/// Closes `fd`, the descriptor of a `CLOSE` that ended with `ECANCELED`, and returns what
/// that close answers. Such an end is io_uring's cancel of an operation that never ran (the
/// descriptor still open, still its owner's), or the error of a `->flush` that itself
/// answered `ECANCELED` (a FUSE server may), which the kernel runs after it took the
/// descriptor out of the table. So it closes only a number still open (`F_GETFD`); one
/// already gone is that flush's error, returned as `close(2)` would. Closed blindly, the
/// second case closed the number twice: by then maybe another thread's new descriptor. (A
/// number another thread reused between the kernel's close and this look is the one case
/// left, and it needs a flush answering `ECANCELED`.) Cost: one `fcntl` and one `close`.
pub(crate) fn close_cancelled(fd: RawFd) -> io::Result<()> {
    // SAFETY: `F_GETFD` reads a descriptor number's flags; no memory is involved.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::from_raw_os_error(libc::ECANCELED));
    }
    // SAFETY: the number is open, and its owner gave it up to a `CLOSE` that never ran (the
    // other reading of `ECANCELED` took it out of the table, which the look above rules out).
    if unsafe { libc::close(fd) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes the descriptor a dropped `accept` or `open` got from the kernel (`res >= 0`), which
/// would otherwise leak, and with it, for `accept`, a connection nobody serves.
fn close_orphan(res: i32, is_fd: bool) {
    if is_fd && res >= 0 {
        // SAFETY: the kernel returned a fresh descriptor for an operation whose future is gone;
        // nothing else knows the number, so we are its only owner.
        unsafe { libc::close(res) };
    }
}

/// What a dropped driver left for one of its live `Op`s ([`ORPHANS`]): `Some((result, place))`,
/// or `None` if the kernel still held the operation.
type Orphan = Option<(i32, u64)>;

/// Rule 5: results of operations whose driver was dropped while their `Op` lived, by (driver
/// id, slot key; driver ids are unique in the process). `Some((res, place))`: completed with
/// `res`, at `place` in its driver's order ([`Op::completed_at`]); `None`: the kernel still
/// held the operation when the driver gave up on it. An entry goes when its `Op` resolves or
/// drops; only a leaked (`mem::forget`) `Op` leaves one behind. A `static`, not a
/// thread-local: an `Op` kept in a thread-local of the program is dropped at thread exit,
/// maybe after a thread-local table was destroyed, and then could not tell a finished
/// operation (its data to free) from one the kernel still held (its data to leak). Cost: a
/// lock per driver drop and per orphaned `Op`'s poll or drop, off every other path.
static ORPHANS: std::sync::Mutex<std::collections::BTreeMap<(u64, usize), Orphan>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// [`ORPHANS`], locked (a panic under the lock left nothing half-done: each use is one map
/// operation).
fn orphans() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<(u64, usize), Orphan>> {
    ORPHANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `res` says the operation transferred nothing and must simply be started again:
/// its driver's shutdown cancelled it (`ECANCELED`, rule 5: the `Op` outlived its loop), or
/// the kernel gave up waiting for its socket (`EAGAIN`). The latter: io_uring polls a socket
/// operation that would block and retries it at each wake-up, but after 128 wake-ups that
/// found nothing (many receives armed on one socket, each datagram waking them all) it runs
/// the operation once more in a kernel worker, where the socket's `O_NONBLOCK` answers
/// `EAGAIN`; a transfer that moved some bytes first completes with their count instead.
/// Nothing else cancels an operation whose `Op` is still there to see the result, so a stream
/// or socket that kept one (a receive, a write-behind send), and an owned-buffer call still
/// awaited (a stream's `read`, `write`, `write_all`, a socket's `recv_from`, `send_to`, a
/// listener's `accept`), starts it again on the current loop (with fresh retries) rather than
/// report the `ECANCELED` or `EAGAIN` (epoll, which waits on, never does). A `connect` goes on
/// after an `ECANCELED` too (its handshake runs on in the kernel: `ops/connect.rs`); its
/// `EAGAIN` is a Unix listener's full backlog, an answer (`UnixStream::connect` retries it).
pub(crate) fn nothing_moved(res: i32) -> bool {
    res == -libc::ECANCELED || res == -libc::EAGAIN
}

/// Whether a failed `io_uring_enter` is the kernel refusing it for now (`EAGAIN`, short of
/// memory for the request; `EBUSY`, completions backed up): nothing reached the kernel, and a
/// later enter submits what is queued (rule 1's overflow).
fn refused_for_now(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
}

/// Logs a failed `io_uring_enter` (`what` failed): a warning, but for one refused for now
/// ([`refused_for_now`]), which loses nothing (what it would have submitted stays queued for
/// the next enter, rule 1), and which every loop turn meets for as long as the kernel refuses:
/// a warning each time flooded the log about a condition the driver handles.
fn log_enter_error(what: &str, e: &io::Error) {
    if refused_for_now(e) {
        tracing::debug!("xtc: {what} refused for now ({e}); kept for the next io_uring_enter");
    } else {
        tracing::warn!("xtc: {what} failed: {e}");
    }
}

/// Rule 5: takes the result a dropped driver left for operation `key`, if any.
fn take_orphan(driver: u64, key: usize) -> Option<Option<i32>> {
    let record = orphans().remove(&(driver, key));
    record.map(|r| r.map(|(res, _)| res))
}

/// Rule 5: the result a dropped driver left for operation `key`, if any, without taking it.
fn peek_orphan(driver: u64, key: usize) -> Option<Orphan> {
    orphans().get(&(driver, key)).copied()
}

/// One loop's io_uring.
pub(crate) struct Uring {
    id: u64,
    ring: RefCell<IoUring>,
    ops: RefCell<Slab<Lifecycle>>,
    /// Generation of each slot (`user_data = generation << 32 | key`): a cancellation names
    /// exactly one operation even after its slot was freed and reused.
    gens: RefCell<Vec<u32>>,
    next_gen: Cell<u32>,
    ping_fd: RawFd,
    /// Target of the wake-ping read; boxed so its address is stable.
    ping_buf: Box<Cell<u64>>,
    /// The timespec of the park's `TIMEOUT` entry on kernels without `EXT_ARG`: a field, not
    /// a temporary, because an entry left queued by a failed `io_uring_enter` is submitted by
    /// the next one, which reads it then.
    park_ts: Box<Cell<types::Timespec>>,
    /// A park's `TIMEOUT` entry fired (`-ETIME`) in the latest dispatch; a park that ended
    /// without it removes its entry, which otherwise stayed armed: one per early park piled up
    /// in the kernel and each woke the loop for nothing when it expired.
    park_timeout_fired: Cell<bool>,
    ping_armed: Cell<bool>,
    /// Tests: the next attempts to arm the wake-ping read fail (as a push into a full ring
    /// whose submit fails does).
    #[cfg(test)]
    fail_ping_arm: Cell<bool>,
    pinged: Cell<bool>,
    /// The kernel completed the ping read with `EAGAIN` (older kernels honour the eventfd's
    /// `O_NONBLOCK` in io_uring reads): wait with `POLL_ADD` instead and let the parker drain.
    ping_by_poll: Cell<bool>,
    ext_arg: bool,
    /// The kernel registers and unregisters buffers without quiescing the ring
    /// (`IORING_FEAT_RSRC_TAGS`, Linux 5.13, which came with that rework): before it,
    /// `IORING_(UN)REGISTER_BUFFERS` waited for every request in flight to complete (the
    /// wake-ping read, an idle socket's receive), blocking the loop for good.
    buffers_without_quiesce: bool,
    /// Entries pushed since the last `io_uring_enter`.
    unsubmitted: Cell<bool>,
    /// Entries pushed while the submission ring was full and the kernel refused a submit for
    /// now ([`refused_for_now`]), in push order: each `enter` moves them into the ring, ahead
    /// of anything pushed after them. Failing the push instead, a read, write or send returned
    /// `WouldBlock` out of an `.await`, and an `AsyncCancel` was lost, its operation left armed
    /// in the kernel for good, holding its socket open.
    overflow: RefCell<std::collections::VecDeque<squeue::Entry>>,
    /// The `user_data` of the latest entries pushed into the submission ring, one per ring
    /// place (`sq_pushed` counts them, modulo the ring's size): the kernel consumes entries in
    /// push order, so those it has not consumed yet (`submission().len()`) are the latest
    /// ones. The shutdown settles them as never seen by the kernel (rule 5).
    sq_uds: Box<[Cell<u64>]>,
    sq_pushed: Cell<usize>,
    /// The shutdown settled the entries the kernel never consumed (rule 5): nothing is
    /// submitted any more, so none of them reaches the kernel after its data was freed.
    sealed: Cell<bool>,
    /// Descriptors whose owners closed them while entries were still queued (a failed
    /// `io_uring_enter`), kept open until the queue is empty: a queued entry names its
    /// descriptor by number, which closed would go to the next socket or file opened, and
    /// the entry would then read that one's bytes or write into it ([`Uring::hold`]).
    held: RefCell<Vec<std::rc::Rc<std::os::fd::OwnedFd>>>,
    /// Completions taken from the completion ring and not yet dispatched, in the kernel's
    /// order ([`Uring::dispatch`]).
    pending: RefCell<std::collections::VecDeque<(u64, i32)>>,
    submitted: Cell<u64>,
    completed: Cell<u64>,
    /// Slots in `Lifecycle::Waiting` or `Lifecycle::Ignored` ([`Uring::in_flight`]).
    waited: Cell<usize>,
    /// The shutdown gave up on operations the kernel still held (rule 5): `ping_buf` is
    /// leaked with them.
    shutdown_leaked: Cell<bool>,
}

impl fmt::Debug for Uring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Uring")
            .field("id", &self.id)
            .field("in_flight", &self.ops.borrow().len())
            .finish()
    }
}

fn timespec(d: Duration) -> types::Timespec {
    // The kernel reads the seconds as signed: beyond `i64::MAX` they would be negative, and
    // the wait would fail with `EINVAL` at once (a park that never sleeps).
    types::Timespec::new()
        .sec(d.as_secs().min(i64::MAX as u64))
        .nsec(d.subsec_nanos())
}

/// Creates the ring. Completions need not interrupt the loop (`COOP_TASKRUN`: the loop is the
/// only thread that submits to and reaps its ring, and it enters the kernel every turn it has
/// work), and the kernel flags pending completion work in the SQ ring (`TASKRUN_FLAG`), which
/// `reap` and the spin check; one issuer; and an entry the kernel refuses while preparing it
/// (an `open` of the empty path) does not stop the batch (`SUBMIT_ALL`; [`Uring::enter`]
/// submits the rest itself where that flag is missing). Kernels before 6.0 refuse some of
/// these flags with `EINVAL`: then a plain ring.
/// `IORING_ENTER_GETEVENTS` (the io-uring crate keeps its `sys` module private).
const ENTER_GETEVENTS: u32 = 1;

/// `IORING_ENTER_EXT_ARG`: the enter's argument is an `io_uring_getevents_arg`
/// ([`types::SubmitArgs`]), for a wait with a timeout that submits nothing.
const ENTER_EXT_ARG: u32 = 8;

fn setup_ring() -> io::Result<IoUring> {
    // DEFER_TASKRUN (completion work only at `GETEVENTS` entries) measured no better here.
    let tuned = IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .setup_single_issuer()
        .setup_submit_all()
        .build(ENTRIES);
    match tuned {
        Ok(r) => Ok(r),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::new(ENTRIES),
        Err(e) => Err(e),
    }
}

/// Most kernel workers (io-wq) the ring may run at once for operations that block in the
/// kernel (an `open` of a FIFO waits there for its peer; file operations go there with
/// `IOSQE_ASYNC`). The kernel's default is `min(entries, 4 × CPUs)`: 8 on a 2-CPU machine,
/// where eight opens of FIFOs waiting for writers left the writers' opens queued behind them
/// for good. As many as tokio's blocking pool; workers start only on demand.
const MAX_BLOCKING_WORKERS: u32 = 512;

impl Uring {
    pub(crate) fn new(ping_fd: RawFd) -> io::Result<Uring> {
        let ring = setup_ring()?;
        // [bounded, unbounded]; 0 leaves a limit as it is. Kernels before 5.15 refuse it:
        // they keep their default.
        let mut max = [MAX_BLOCKING_WORKERS, 0];
        if let Err(e) = ring.submitter().register_iowq_max_workers(&mut max) {
            tracing::debug!("xtc: io_uring keeps its default io-wq worker limit: {e}");
        }
        let ext_arg = ring.params().is_feature_ext_arg();
        let buffers_without_quiesce = ring.params().is_feature_resource_tagging();
        // A power of two (the kernel rounds it up), so a place is a mask away.
        let sq_places = (ring.params().sq_entries() as usize).next_power_of_two();
        Ok(Uring {
            id: super::next_driver_id(),
            ring: RefCell::new(ring),
            ops: RefCell::new(Slab::with_capacity(256)),
            gens: RefCell::new(Vec::with_capacity(256)),
            next_gen: Cell::new(0),
            ping_fd,
            ping_buf: Box::new(Cell::new(0)),
            park_ts: Box::new(Cell::new(types::Timespec::new())),
            park_timeout_fired: Cell::new(false),
            ping_armed: Cell::new(false),
            #[cfg(test)]
            fail_ping_arm: Cell::new(false),
            pinged: Cell::new(false),
            ping_by_poll: Cell::new(false),
            ext_arg,
            buffers_without_quiesce,
            unsubmitted: Cell::new(false),
            overflow: RefCell::new(std::collections::VecDeque::new()),
            sq_uds: (0..sq_places).map(|_| Cell::new(0)).collect(),
            sq_pushed: Cell::new(0),
            sealed: Cell::new(false),
            held: RefCell::new(Vec::new()),
            pending: RefCell::new(std::collections::VecDeque::with_capacity(64)),
            submitted: Cell::new(0),
            completed: Cell::new(0),
            waited: Cell::new(0),
            shutdown_leaked: Cell::new(false),
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Operations that will wake a task (`Waiting`) or free a buffer (`Ignored`, cancelled)
    /// when they complete. Not counted: detached ones (rule 4b: they hold no task and must
    /// not keep the loop from quiescence), and operations no task waits for (`Submitted`, a
    /// write-behind send nobody polls yet, or `Completed`, a result not taken yet): their
    /// completion wakes nobody, so a loop whose tasks all wait on something else is parked,
    /// and a deadlock among them is reported. Cost: a load.
    pub(crate) fn in_flight(&self) -> usize {
        self.waited.get()
    }

    /// Replaces a slot's state, keeping the [`in_flight`](Self::in_flight) count; returns the
    /// old state.
    fn set(&self, slot: &mut Lifecycle, new: Lifecycle) -> Lifecycle {
        let counted = |l: &Lifecycle| matches!(l, Lifecycle::Waiting(_) | Lifecycle::Ignored(..));
        let n = self.waited.get() + usize::from(counted(&new));
        let old = std::mem::replace(slot, new);
        self.waited.set(n - usize::from(counted(&old)));
        old
    }

    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.submitted.get(), self.completed.get())
    }

    /// Queues `entry`; submits early if the submission ring is full, and keeps it in the
    /// overflow queue if that submit is refused for now or leaves no room (rule 1).
    ///
    /// # Safety
    /// Every pointer in `entry` must stay valid until its completion is reaped (rule 1/4).
    unsafe fn push(&self, entry: &squeue::Entry) -> io::Result<()> {
        for attempt in 0..2 {
            // Behind the entries already waiting for room, never ahead of them.
            let pushed = self.overflow.borrow().is_empty() && {
                let mut ring = self.ring.borrow_mut();
                // SAFETY: the caller guarantees the entry's pointers outlive the operation.
                let r = unsafe { ring.submission().push(entry) };
                r.is_ok()
            };
            if pushed {
                self.record_in_ring(entry);
            }
            if pushed {
                self.unsubmitted.set(true);
                return Ok(());
            }
            if attempt == 0 {
                match self.enter(0, None) {
                    Ok(()) => {}
                    Err(e) if refused_for_now(&e) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        self.overflow.borrow_mut().push_back(entry.clone());
        self.unsubmitted.set(true);
        Ok(())
    }

    /// Notes the `user_data` of an entry just pushed into the submission ring ([`sq_uds`]).
    ///
    /// [`sq_uds`]: Self::sq_uds
    fn record_in_ring(&self, entry: &squeue::Entry) {
        let n = self.sq_pushed.get();
        self.sq_uds[n & (self.sq_uds.len() - 1)].set(entry.get_user_data());
        self.sq_pushed.set(n.wrapping_add(1));
    }

    /// The `user_data` of every entry queued that the kernel has not consumed: in the
    /// submission ring (the latest pushed, [`sq_uds`](Self::sq_uds)) or in the overflow.
    fn unconsumed(&self) -> std::collections::HashSet<u64> {
        let in_ring = self.ring.borrow_mut().submission().len();
        let (n, places) = (self.sq_pushed.get(), self.sq_uds.len());
        let mut uds: std::collections::HashSet<u64> = (1..=in_ring.min(places))
            .map(|back| self.sq_uds[n.wrapping_sub(back) & (places - 1)].get())
            .collect();
        uds.extend(
            self.overflow
                .borrow()
                .iter()
                .map(squeue::Entry::get_user_data),
        );
        uds
    }

    /// Moves overflowed entries into the submission ring while it has room, oldest first.
    /// Returns whether some are still waiting for room.
    fn fill_from_overflow(&self) -> bool {
        let mut overflow = self.overflow.borrow_mut();
        if overflow.is_empty() {
            return false;
        }
        let mut ring = self.ring.borrow_mut();
        let mut sq = ring.submission();
        while let Some(entry) = overflow.front() {
            // SAFETY: `push` kept the entry, whose caller keeps its pointers valid until its
            // completion is reaped (rule 1/4).
            if unsafe { sq.push(entry) }.is_err() {
                break;
            }
            self.record_in_ring(entry);
            overflow.pop_front();
        }
        !overflow.is_empty()
    }

    /// `io_uring_enter`: submits what is queued and waits for `want` completions or `timeout`.
    /// `EBUSY` (completions backed up) reaps and retries; timeouts and signals are `Ok`. A
    /// submission refused with nothing to reap ([`refused_for_now`]) is returned, after a wait
    /// without submitting of at most [`PING_RETRY`] if `want` asked for one
    /// ([`wait_only`](Self::wait_only)): the kernel refuses before it waits. The
    /// timeout needs `EXT_ARG` (Linux 5.11+); without it the wait has none, so callers then
    /// queue a `TIMEOUT` entry (`park`) or do not wait (`Drop`).
    ///
    /// Without `SUBMIT_ALL` (a plain ring, [`setup_ring`]) the kernel stops a batch at an entry
    /// it refuses while preparing it (posting that entry's error as its completion) and
    /// returns without waiting: the entries behind it stayed queued, the driver took them for
    /// submitted, and they reached the kernel only at some later entry, after their callers
    /// may have closed the descriptors they name (`cancel_now`), a number that may name a new
    /// socket by then. So the enter is repeated while it makes progress and entries are left.
    ///
    /// Overflowed entries ([`overflow`](Self::overflow)) go into the ring first. While some
    /// still wait for room after that, a wait is bounded by [`PING_RETRY`] (or, without
    /// `EXT_ARG`, not made): the wake-ping read or a park's `TIMEOUT` entry may be among them,
    /// not yet in the kernel.
    fn enter(&self, want: usize, timeout: Option<Duration>) -> io::Result<()> {
        if self.sealed.get() {
            // Rule 5: what is queued never reaches the kernel (its data may be freed).
            return Ok(());
        }
        loop {
            let (want, timeout) = if self.fill_from_overflow() && want > 0 {
                if self.ext_arg {
                    (want, Some(retry_bound(timeout)))
                } else {
                    (0, None)
                }
            } else {
                (want, timeout)
            };
            let res = {
                let ring = self.ring.borrow();
                let sub = ring.submitter();
                match timeout {
                    Some(t) if want > 0 && self.ext_arg => {
                        let ts = timespec(t);
                        sub.submit_with_args(want, &types::SubmitArgs::new().timespec(&ts))
                    }
                    _ => sub.submit_and_wait(want),
                }
            };
            match res {
                Ok(n) => {
                    let left = self.queued();
                    if left > 0 && n > 0 {
                        continue; // stopped at a refused entry: submit the rest (and wait)
                    }
                    self.set_unsubmitted(left > 0);
                    return Ok(());
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::ETIME) | Some(libc::EINTR) => {
                        self.set_unsubmitted(self.queued() > 0);
                        return Ok(());
                    }
                    Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                        let had = !self.ring.borrow_mut().completion().is_empty();
                        self.dispatch();
                        if !had {
                            // The kernel refused before it would wait: a park that went on
                            // at once spun at full CPU for as long as it refused. It waits
                            // without submitting instead, bounded: what is queued (the
                            // wake-ping read among it, maybe) is tried again soon.
                            if want > 0 {
                                self.wait_only(want, retry_bound(timeout));
                            }
                            return Err(e);
                        }
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    /// Waits up to `timeout` for `want` completions without submitting anything: after the
    /// kernel refused a submission ([`enter`](Self::enter)), which it does before it would
    /// wait. Without `EXT_ARG` a wait has no timeout: the thread sleeps `timeout` instead.
    /// Its own failure changes nothing: the caller reports the refusal.
    fn wait_only(&self, want: usize, timeout: Duration) {
        if !self.ext_arg {
            std::thread::sleep(timeout);
            return;
        }
        let ts = timespec(timeout);
        let arg = types::SubmitArgs::new().timespec(&ts);
        let ring = self.ring.borrow();
        // SAFETY: nothing to submit; `arg` is the crate's `io_uring_getevents_arg` (a
        // transparent wrapper, of the size the kernel checks), pointing at a live timespec, and
        // no signal mask; both outlive the call.
        let r = unsafe {
            ring.submitter().enter(
                0,
                want.min(u32::MAX as usize) as u32,
                ENTER_GETEVENTS | ENTER_EXT_ARG,
                Some(&arg),
            )
        };
        // The subscriber is user code: nothing of the driver's is borrowed while it runs.
        drop(ring);
        if let Err(e) = r {
            tracing::debug!("xtc: io_uring wait without submitting ended: {e}");
        }
    }

    /// Entries queued and not yet consumed by the kernel (in the ring or its overflow).
    fn queued(&self) -> usize {
        self.ring.borrow_mut().submission().len() + self.overflow.borrow().len()
    }

    /// Starts an operation: `build` makes its entry from `data` (which the operation then owns).
    /// On failure the data comes back with the error.
    pub(crate) fn submit<T: 'static>(
        &self,
        mut data: T,
        build: impl FnOnce(&mut T) -> squeue::Entry,
    ) -> Result<Op<T>, (io::Error, T)> {
        let entry = build(&mut data);
        let key = self.ops.borrow_mut().insert(Lifecycle::Submitted);
        let gen = self.next_gen.get();
        // 31 bits: the top bit of a `user_data` tags expiry timeouts (`EXPIRY`).
        self.next_gen.set(gen.wrapping_add(1) & 0x7FFF_FFFF);
        {
            let mut gens = self.gens.borrow_mut();
            if gens.len() <= key {
                gens.resize(key + 1, 0);
            }
            gens[key] = gen;
        }
        let entry = entry.user_data(self.user_data(key));
        // SAFETY: the entry points into `data`'s heap memory (or the caller's 'static data),
        // which the returned Op owns until the completion is reaped, or hands to the slot
        // (rule 4). If the push fails the kernel never saw the entry.
        if let Err(e) = unsafe { self.push(&entry) } {
            self.ops.borrow_mut().remove(key);
            return Err((e, data));
        }
        self.submitted.set(self.submitted.get() + 1);
        Ok(Op {
            key,
            driver: self.id,
            data: Some(data),
            result_is_fd: false,
            _local: std::marker::PhantomData,
        })
    }

    /// The `user_data` of the operation in slot `key`.
    fn user_data(&self, key: usize) -> u64 {
        let gen = self.gens.borrow().get(key).copied().unwrap_or(0);
        (gen as u64) << 32 | key as u64
    }

    /// Submits queued entries without waiting, then dispatches completions. When the kernel
    /// flags completion work it holds (`IORING_SQ_TASKRUN`), the entry asks for events
    /// (`GETEVENTS`, waiting for none) so that work runs and its completions can be reaped.
    pub(crate) fn reap(&self) -> usize {
        // Completion work pending in the kernel (TASKRUN), or completions the full ring pushed
        // to the kernel's overflow list (CQ_OVERFLOW): only an enter with GETEVENTS brings
        // them in. Overflowed ones waited for the loop to park, so a loop kept busy (one task
        // yielding) never saw them, nor any later completion queued behind them.
        let taskrun = {
            let mut ring = self.ring.borrow_mut();
            let sq = ring.submission();
            sq.taskrun() || sq.cq_overflow()
        };
        if taskrun && !self.sealed.get() {
            let mut ring = self.ring.borrow_mut();
            // Creating and dropping the queue view publishes its tail.
            let to_submit = ring.submission().len() as u32;
            // SAFETY: `enter` with no argument struct; the SQEs it submits were pushed by
            // `push`, whose callers keep their pointers valid (rule 1).
            let r = unsafe {
                ring.submitter()
                    .enter::<libc::sigset_t>(to_submit, 0, ENTER_GETEVENTS, None)
            };
            drop(ring);
            match r {
                Ok(_) if self.queued() > 0 => {
                    // Stopped at an entry refused while being prepared (see `enter`).
                    if let Err(e) = self.enter(0, None) {
                        log_enter_error("io_uring submit", &e);
                    }
                }
                Ok(_) => self.set_unsubmitted(false),
                Err(e) => log_enter_error("io_uring enter", &e),
            }
        } else if self.unsubmitted.get() {
            if let Err(e) = self.enter(0, None) {
                log_enter_error("io_uring submit", &e);
            }
        }
        self.dispatch()
    }

    /// Submits queued entries, if any, without waiting. Returns whether none is left queued
    /// (`false` after a failed `io_uring_enter`).
    pub(crate) fn submit_pending(&self) -> bool {
        if self.unsubmitted.get() {
            if let Err(e) = self.enter(0, None) {
                log_enter_error("io_uring submit", &e);
            }
        }
        !self.unsubmitted.get()
    }

    /// Records whether entries are left queued; once none is, the descriptors held for them
    /// ([`hold`](Self::hold)) close.
    fn set_unsubmitted(&self, left: bool) {
        self.unsubmitted.set(left);
        if !left && !self.held.borrow().is_empty() {
            // Taken out first: closing is a system call, not user code, but the borrow ends
            // before it all the same.
            let held = std::mem::take(&mut *self.held.borrow_mut());
            drop(held);
        }
    }

    /// Keeps `fd` open until the entries queued now are submitted, if any are (see
    /// [`held`](Self::held)). Cost: a push, only after a failed submit.
    pub(crate) fn hold(&self, fd: &std::rc::Rc<std::os::fd::OwnedFd>) {
        if self.unsubmitted.get() {
            self.held.borrow_mut().push(fd.clone());
        }
    }

    /// Completions to reap, or completion work the kernel holds for the next entry
    /// (`IORING_SQ_TASKRUN`, see [`setup_ring`]).
    pub(crate) fn has_completions(&self) -> bool {
        let mut ring = self.ring.borrow_mut();
        if !ring.completion().is_empty() {
            return true;
        }
        let sq = ring.submission();
        sq.taskrun() || sq.cq_overflow()
    }

    /// Moves every available completion to its slot (rule 3). Returns how many there were.
    ///
    /// Re-entrant: dropping an abandoned operation's buffer is user code, which may drop a
    /// stream and so submit (`abandon`, `detach`), and a submit into a backed-up ring reaps,
    /// which dispatches again; so does a waker (user code) that reaps (`io::reap_now`). So
    /// the completions wait in `pending`, each taken out (not borrowed) as it is dispatched,
    /// and a nested pass appends what the kernel posted since behind those its outer pass has
    /// not dispatched yet, and dispatches from the front: completions get their places in the
    /// kernel's order (a nested pass that took its own batch first placed newer completions
    /// before older ones, and a stream handed out two receives' bytes swapped); with nothing
    /// new it still dispatches those, so a nested reap (a drop that asks whether its operation
    /// finished) sees every completion taken from the ring. The entries this pass itself
    /// queues (expiry cancels, timer removals) are pushed after it.
    fn dispatch(&self) -> usize {
        {
            let mut ring = self.ring.borrow_mut();
            let cq = ring.completion();
            let mut pending = self.pending.borrow_mut();
            if cq.is_empty() && pending.is_empty() {
                // The common reap of a busy loop: nothing completed (every turn reaps,
                // `Reactor::reap`).
                return 0;
            }
            pending.extend(cq.map(|c| (c.user_data(), c.result())));
        }
        let mut expired = Vec::new();
        let mut settled = Vec::new();
        let mut n = 0;
        loop {
            let next = self.pending.borrow_mut().pop_front();
            let Some((ud, res)) = next else { break };
            match ud {
                PING => {
                    self.ping_armed.set(false);
                    if res == -libc::EAGAIN && !self.ping_by_poll.get() {
                        self.ping_by_poll.set(true);
                    } else {
                        self.pinged.set(true);
                    }
                }
                TIMEOUT => {
                    if res == -libc::ETIME {
                        self.park_timeout_fired.set(true);
                    }
                }
                CANCEL => {}
                ud if ud & EXPIRY != 0 => expired.push(ud & !EXPIRY),
                ud => {
                    let key = key_of(ud);
                    if self.user_data(key) != ud {
                        continue; // not the operation that holds the slot now
                    }
                    n += 1;
                    self.completed.set(self.completed.get() + 1);
                    let mut ops = self.ops.borrow_mut();
                    let Some(slot) = ops.get_mut(key) else {
                        continue;
                    };
                    match self.set(slot, Lifecycle::Completed(res, self.completed.get())) {
                        Lifecycle::Waiting(w) => {
                            drop(ops);
                            crate::task::wake_guarded(w);
                        }
                        Lifecycle::Ignored(data, is_fd) => {
                            ops.remove(key);
                            drop(ops);
                            close_orphan(res, is_fd);
                            drop_buffer(data);
                        }
                        Lifecycle::Detached(data, tail) => {
                            ops.remove(key);
                            drop(ops);
                            settled.push(ud);
                            // Its log line is user code (a `tracing` subscriber): a panic
                            // there unwound out of this pass with `expired` and `settled`
                            // still to do (expiries never cancelled, timers never removed).
                            crate::task::guarded(
                                "a log line at a detached operation's end panicked",
                                || tail.ended(res),
                            );
                            drop_buffer(data);
                        }
                        Lifecycle::Submitted | Lifecycle::Completed(..) => {}
                    }
                }
            }
        }
        for ud in expired {
            self.expire(ud);
        }
        for ud in settled {
            self.remove_expiry(ud);
        }
        n
    }

    /// Removes the expiry timer of the detached operation `ud`, which settled: it would
    /// otherwise hold a kernel timer, and wake the loop, for the rest of the limit.
    fn remove_expiry(&self, ud: u64) {
        let entry = opcode::TimeoutRemove::new(EXPIRY | ud)
            .build()
            .user_data(CANCEL);
        // SAFETY: a timeout removal carries no pointers.
        if let Err(e) = unsafe { self.push(&entry) } {
            tracing::warn!("xtc: could not remove the expiry of a detached operation: {e}");
        }
    }

    /// Parks until a completion, the wake ping or `timeout`. Returns whether the ping fired,
    /// whether it was drained, and how many operations completed.
    pub(crate) fn park(&self, timeout: Option<Duration>) -> (bool, bool, usize) {
        self.pinged.set(false);
        if !self.ping_armed.get() {
            let entry = if self.ping_by_poll.get() {
                opcode::PollAdd::new(types::Fd(self.ping_fd), libc::POLLIN as u32).build()
            } else {
                opcode::Read::new(types::Fd(self.ping_fd), self.ping_buf.as_ptr().cast(), 8).build()
            }
            .user_data(PING);
            #[cfg(test)]
            let refused = self.fail_ping_arm.get();
            #[cfg(not(test))]
            let refused = false;
            let pushed = if refused {
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            } else {
                // SAFETY: `ping_buf` is a boxed field of the driver, alive until the driver's
                // Drop has reaped this read's completion (rule 5); the eventfd outlives the loop.
                unsafe { self.push(&entry) }
            };
            match pushed {
                Ok(()) => self.ping_armed.set(true),
                Err(e) => tracing::warn!("xtc: could not arm the wake-ping read: {e}"),
            }
        }
        // Without the ping read a cross-shard wake (an eventfd write) ends no wait: the park
        // is bounded instead, and the next one arms it again, so a wake is late by at most
        // PING_RETRY rather than lost until some I/O completes.
        let timeout = if self.ping_armed.get() {
            timeout
        } else {
            Some(retry_bound(timeout))
        };
        let want = if self.has_completions() { 0 } else { 1 };
        let mut timeout_entry = false;
        let res = match timeout {
            Some(t) if !self.ext_arg && want > 0 && !t.is_zero() => {
                self.park_ts.set(timespec(t));
                let entry = opcode::Timeout::new(self.park_ts.as_ptr())
                    .build()
                    .user_data(TIMEOUT);
                self.park_timeout_fired.set(false);
                // SAFETY: the kernel copies the timespec while preparing the entry, when it is
                // submitted (the enter below, or a later one if this one fails), and `park_ts`
                // is a boxed field of the driver, which submits nothing after it is gone.
                let pushed = unsafe { self.push(&entry) };
                timeout_entry = pushed.is_ok();
                pushed.and_then(|()| self.enter(want, None))
            }
            Some(t) if t.is_zero() => self.enter(0, None),
            t => self.enter(want, t),
        };
        if let Err(e) = res {
            log_enter_error("io_uring wait", &e);
        }
        let n = self.dispatch();
        if timeout_entry && !self.park_timeout_fired.get() {
            // Ended early (I/O or the ping): the entry goes, submitted with the next entries
            // and ahead of the next park's (so that one is not the entry removed). Its
            // completion (`-ECANCELED`, or `-ETIME` if it fired first) is ignored.
            let remove = opcode::TimeoutRemove::new(TIMEOUT)
                .build()
                .user_data(CANCEL);
            // SAFETY: a timeout removal carries no pointers.
            if let Err(e) = unsafe { self.push(&remove) } {
                tracing::warn!("xtc: could not remove a park's timeout: {e}");
            }
        }
        (self.pinged.get(), !self.ping_by_poll.get(), n)
    }

    /// Whether buffers can be registered without stalling the loop (see
    /// [`buffers_without_quiesce`](Self::buffers_without_quiesce)).
    pub(crate) fn registers_buffers(&self) -> bool {
        self.buffers_without_quiesce
    }

    /// Registers the buffers of a `FixedBufPool`, `size` bytes each; returns this driver's id.
    pub(crate) fn register_buffers(&self, bufs: &[Vec<u8>], size: usize) -> io::Result<u64> {
        let iov: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: size.min(b.capacity()),
            })
            .collect();
        // SAFETY: each iovec covers (part of) a live heap block of the pool, which keeps them
        // (without reallocating) until it unregisters them in its Drop.
        unsafe { self.ring.borrow().submitter().register_buffers(&iov) }.map_err(|e| {
            match e.raw_os_error() {
                Some(libc::EBUSY) => io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "this loop already has a registered FixedBufPool: drop it first (a \
                     pool stays registered while one of its buffers is out, in a dropped \
                     read the kernel has not finished with among them)",
                ),
                Some(libc::ENOMEM) => io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "registering a FixedBufPool of {} x {size} bytes: {e} (registered \
                         buffers are pinned, and unless the process has CAP_IPC_LOCK the \
                         kernel counts every page a buffer touches, whole, against \
                         RLIMIT_MEMLOCK, `ulimit -l`, {}, with what this user's rings have \
                         registered already: these buffers touch {}; use fewer, larger buffers, or raise \
                         the limit)",
                        bufs.len(),
                        memlock_limit(),
                        pages_touched(&iov),
                    ),
                ),
                _ => e,
            }
        })?;
        Ok(self.id)
    }

    fn poll_op(&self, key: usize, cx: &mut Context<'_>) -> Poll<i32> {
        if let Some(done) = self.poll_op_settled(key, cx.waker()) {
            return done;
        }
        // A waker's clone and drop are user code (a custom waker) that may drop an Op of this
        // loop, which borrows `ops` again, or even reap: both run outside the borrow, and the
        // slot is looked at afresh after the clone.
        let waker = cx.waker().clone();
        let mut ops = self.ops.borrow_mut();
        let slot = ops
            .get_mut(key)
            .expect("an Op's slot lives until the Op takes its result");
        if let Lifecycle::Completed(res, _) = slot {
            let res = *res;
            ops.remove(key);
            drop(ops);
            drop(waker);
            return Poll::Ready(res);
        }
        let old = self.set(slot, Lifecycle::Waiting(waker));
        drop(ops);
        drop(old);
        Poll::Pending
    }

    /// [`poll_op`](Self::poll_op) without a waker to store: the result if it completed,
    /// `Pending` if `waker` is already the one waiting, `None` if a clone must be stored.
    fn poll_op_settled(&self, key: usize, waker: &Waker) -> Option<Poll<i32>> {
        let mut ops = self.ops.borrow_mut();
        let slot = ops
            .get_mut(key)
            .expect("an Op's slot lives until the Op takes its result");
        match slot {
            Lifecycle::Completed(res, _) => {
                let res = *res;
                ops.remove(key);
                Some(Poll::Ready(res))
            }
            Lifecycle::Waiting(w) if w.will_wake(waker) => Some(Poll::Pending),
            _ => None,
        }
    }

    /// Forgets the waker of an operation nobody waits for any more (rule 3's `Waiting` back
    /// to `Submitted`), so it stops counting as I/O in flight, and hands that waker out for
    /// the caller to drop after the slab's borrow (and any borrow of its own).
    fn unwait(&self, key: usize) -> Option<Waker> {
        let mut ops = self.ops.borrow_mut();
        let slot = ops.get_mut(key)?;
        if !matches!(slot, Lifecycle::Waiting(_)) {
            return None;
        }
        match self.set(slot, Lifecycle::Submitted) {
            Lifecycle::Waiting(w) => Some(w),
            _ => None,
        }
    }

    /// Cancels operation `key` if it is still in flight, leaving its slot and its `Op` in
    /// place: the `Op` resolves to the cancellation (`-ECANCELED`) or to the result that won the
    /// race. Submitted now (the caller's next step may be anything).
    fn cancel_in_place(&self, key: usize) {
        let in_flight = matches!(
            self.ops.borrow().get(key),
            Some(Lifecycle::Submitted | Lifecycle::Waiting(_))
        );
        if !in_flight {
            return;
        }
        self.cancel_now(self.user_data(key));
    }

    /// Queues an `AsyncCancel` of the operation whose `user_data` is `ud`.
    fn push_cancel(&self, ud: u64) {
        let entry = opcode::AsyncCancel::new(ud).build().user_data(CANCEL);
        // SAFETY: a cancellation carries no pointers.
        if let Err(e) = unsafe { self.push(&entry) } {
            tracing::warn!("xtc: could not queue an AsyncCancel: {e}");
        }
    }

    /// [`push_cancel`](Self::push_cancel), submitted now, not at the end of the turn: the
    /// caller may close the operation's descriptor next (a stream dropped with its read), and
    /// an entry still queued would then name whatever the number means by the time it is
    /// submitted (the next socket or file opened), reading its bytes or writing ours into it.
    /// Submitted, the operation holds its own reference to the file.
    fn cancel_now(&self, ud: u64) {
        self.push_cancel(ud);
        if let Err(e) = self.enter(0, None) {
            log_enter_error("io_uring submit of a cancellation", &e);
        }
    }

    /// The result of a reaped completion, without taking it.
    fn peek_op(&self, key: usize) -> Option<i32> {
        match self.ops.borrow().get(key) {
            Some(Lifecycle::Completed(res, _)) => Some(*res),
            _ => None,
        }
    }

    /// Rules 4 and 4b: an Op gives its data to its slot, which `keep` makes of it, while the
    /// operation is in flight: `Some(old state)`, whose waker (user code, which may panic)
    /// the caller drops once it has done what the kernel needs (the cancel, the expiry).
    /// Already completed (or gone), the slot is freed, a descriptor it returned closed
    /// (`is_fd`), the data dropped, and `None` returned.
    fn hand_over(
        &self,
        key: usize,
        data: Box<dyn Any>,
        is_fd: bool,
        keep: impl FnOnce(Box<dyn Any>) -> Lifecycle,
    ) -> Option<Lifecycle> {
        let mut ops = self.ops.borrow_mut();
        match ops.get_mut(key) {
            Some(Lifecycle::Completed(res, _)) => {
                let res = *res;
                ops.remove(key);
                drop(ops);
                close_orphan(res, is_fd);
            }
            Some(slot) => {
                // A replaced waker is dropped after the borrow, as in `poll_op`.
                let old = self.set(slot, keep(data));
                drop(ops);
                return Some(old);
            }
            None => drop(ops),
        }
        drop_buffer(data);
        None
    }

    /// Whether the slot of operation `ud` still holds it, detached (not settled, not reused).
    fn is_detached(&self, ud: u64) -> bool {
        let key = key_of(ud);
        self.user_data(key) == ud
            && matches!(self.ops.borrow().get(key), Some(Lifecycle::Detached(..)))
    }

    /// An Op that lets its operation finish unobserved: its data (the buffer) stays with the
    /// driver until the completion, and nothing is cancelled. Submitted now, as in `abandon`:
    /// the caller may close the descriptor next.
    /// `tail`: what its end must look at ([`Detach`]).
    fn detach(&self, key: usize, data: Box<dyn Any>, tail: Detach) {
        if self.peek_op(key) == Some(-libc::ECANCELED) {
            // Already cancelled: its slot goes in `hand_over`.
            tail.cancelled_unrun();
        }
        let Some(old) = self.hand_over(key, data, false, |d| Lifecycle::Detached(d, tail)) else {
            return;
        };
        let ud = self.user_data(key);
        let expiry = opcode::Timeout::new(&DETACH_LIMIT)
            .build()
            .user_data(EXPIRY | ud);
        // SAFETY: the entry points at a `static` timespec (the kernel reads it when the entry
        // is submitted, just below).
        if let Err(e) = unsafe { self.push(&expiry) } {
            tracing::warn!("xtc: could not queue the expiry of a detached operation: {e}");
        }
        // A push into a full ring submits, and may reap: if that settled the operation, its
        // timer removal went out before the timer itself. Remove it again, now behind it.
        if !self.is_detached(ud) {
            self.remove_expiry(ud);
        }
        if let Err(e) = self.enter(0, None) {
            log_enter_error("io_uring submit of a detached operation", &e);
        }
        // The waker it replaced, last: its drop may panic (see `abandon`).
        drop(old);
    }

    /// Rule 4b: a detached operation's time is up: cancel it if it still runs (the slot may
    /// hold another operation by now; the generation in `ud` tells).
    fn expire(&self, ud: u64) {
        if !self.is_detached(ud) {
            return;
        }
        self.push_cancel(ud);
    }

    /// Rule 4: the Op gave up. `is_fd`: a successful result is a descriptor to close.
    fn abandon(&self, key: usize, data: Box<dyn Any>, is_fd: bool) {
        let Some(old) = self.hand_over(key, data, is_fd, |d| Lifecycle::Ignored(d, is_fd)) else {
            return;
        };
        self.cancel_now(self.user_data(key));
        // The waker it replaced, last: its drop is user code, and a panic in it (which goes on
        // to the Op's owner) must not skip the cancel, or the operation stayed armed for good.
        drop(old);
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // Rule 5. The reaping below runs user code (a buffer's `Drop`, a waker), which may drop,
        // poll or detach another `Op` of this driver: it still reaches the driver
        // (`with_uring`), so such an `Op` is abandoned as on a running loop (rule 4) and its
        // data lives until its completion, rather than taken for an orphan of a driver that is
        // gone, with no record yet, and freed under the kernel.
        let mut unwinding = None;
        {
            let this: &Uring = self;
            let frame = Dropping {
                driver: this,
                outer: DROPPING.with(Cell::get),
            };
            // Takes `frame` out of the list before it goes, also on unwind.
            let _unlink = Unlink(frame.outer);
            DROPPING.with(|d| d.set(&frame));
            // A panic out of the shutdown (its logs run the program's tracing subscriber, user
            // code) left operations the kernel may still hold: their data is leaked with
            // everything else, never freed by the drop glue below while the kernel may use it.
            let shut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| this.shut_down()));
            if let Err(payload) = shut {
                if let Ok(mut ops) = this.ops.try_borrow_mut() {
                    for slot in ops.drain() {
                        std::mem::forget(slot);
                    }
                }
                this.shutdown_leaked.set(true);
                unwinding = Some(payload);
            }
        }
        if self.shutdown_leaked.get() {
            std::mem::forget(std::mem::replace(
                &mut self.ping_buf,
                Box::new(Cell::new(0)),
            ));
        }
        if let Some(payload) = unwinding {
            // Re-raised, unless this drop runs in another unwind (a panic out of a drop then
            // aborts the process): that one goes on, and this payload is dropped.
            if !std::thread::panicking() {
                std::panic::resume_unwind(payload);
            }
        }
    }
}

thread_local! {
    /// Drivers of this thread in their `Drop` (rule 5), innermost first: a list through the
    /// `Dropping` nodes on their `drop` frames. A raw pointer, so the thread-local has no
    /// destructor (an `Op` may be dropped by another thread-local's destructor at thread exit).
    static DROPPING: Cell<*const Dropping> = const { Cell::new(std::ptr::null()) };
}

/// A driver in its `Drop`, in the `DROPPING` list.
struct Dropping {
    driver: *const Uring,
    /// The next one out (a driver dropped by user code another driver's drop ran).
    outer: *const Dropping,
}

/// Restores the `DROPPING` list to `self.0` when dropped.
struct Unlink(*const Dropping);

impl Drop for Unlink {
    fn drop(&mut self) {
        DROPPING.with(|d| d.set(self.0));
    }
}

impl Uring {
    /// Rule 5, run by `Drop` while the driver is in the `DROPPING` list.
    fn shut_down(&self) {
        // Detached operations are sends whose bytes a stream already reported
        // written: they get the first second to finish (a peer still reading), and only what
        // is left of them then is cancelled. Cancelled at once, as before, they lost those
        // bytes whenever the executor stopped while the peer's window was full.
        let is_detached = |l: &Lifecycle| matches!(l, Lifecycle::Detached(..));
        let mut others: Vec<u64> = self.keys_where(|l| !is_detached(l));
        if self.ping_armed.get() {
            others.push(PING);
        }
        self.cancel_all(others);
        // Wait only for what the kernel still holds: a `Completed` slot stays until its `Op`
        // is polled or dropped, which may be after this driver is gone (an `Op` can outlive
        // its loop, e.g. in a stream returned from `LocalExecutor::block_on`); waiting for it
        // here stalled every such drop for the full second.
        self.settle(Instant::now() + SHUTDOWN_WAIT, true);
        let late = self.keys_where(is_detached);
        if !late.is_empty() {
            tracing::warn!(
                "xtc: {} send(s) already reported written did not finish within {:?} of \
                 shutdown (a peer not reading); cancelled",
                late.len(),
                SHUTDOWN_WAIT
            );
            self.cancel_all(late);
            self.settle(Instant::now() + SHUTDOWN_WAIT, false);
        }
        self.settle_unconsumed();
        // Rule 5: what a live `Op` will ask for. `Completed` and `Submitted`/`Waiting` slots
        // are live `Op`s' (`Ignored` and `Detached` ones hold the data of `Op`s that are gone).
        {
            let mut o = orphans();
            for (key, l) in self.ops.borrow().iter() {
                match l {
                    Lifecycle::Completed(res, at) => {
                        // Its place too: a stream's kept receives are ordered by it.
                        o.insert((self.id, key), Some((*res, *at)));
                    }
                    Lifecycle::Submitted | Lifecycle::Waiting(_) => {
                        o.insert((self.id, key), None);
                    }
                    Lifecycle::Ignored(..) | Lifecycle::Detached(..) => {}
                }
            }
        }
        let left = self
            .ops
            .borrow()
            .iter()
            .filter(|(_, l)| !matches!(l, Lifecycle::Completed(..)))
            .count();
        if left > 0 || self.ping_armed.get() {
            tracing::error!(
                "xtc: {left} io_uring operation(s) did not complete at shutdown; \
                 their buffers are leaked rather than freed under the kernel"
            );
            for slot in self.ops.borrow_mut().drain() {
                std::mem::forget(slot);
            }
            self.shutdown_leaked.set(true);
        }
    }
}

impl Uring {
    /// The `user_data` of every slot whose state passes `pick` (shutdown, rule 5).
    fn keys_where(&self, pick: impl Fn(&Lifecycle) -> bool) -> Vec<u64> {
        self.ops
            .borrow()
            .iter()
            .filter(|(_, l)| pick(l))
            .map(|(k, _)| self.user_data(k))
            .collect()
    }

    /// Queues a cancellation of each operation in `keys` (shutdown, rule 5).
    fn cancel_all(&self, keys: Vec<u64>) {
        for k in keys {
            self.push_cancel(k);
        }
    }

    /// Submits and reaps until the kernel holds no operation of this driver (and no wake-ping
    /// read), or until `deadline` (shutdown, rule 5). An operation whose entry the kernel has
    /// not consumed yet (still queued after a refused `io_uring_enter`) is not in the kernel:
    /// waiting for it only spent the whole deadline while the kernel refused. But a detached
    /// send's, with `submit_detached`: its bytes were reported written, so it gets its grace
    /// to reach the kernel (rule 4b).
    fn settle(&self, deadline: Instant, submit_detached: bool) {
        let in_kernel = || {
            let unconsumed = self.unconsumed();
            (self.ping_armed.get() && !unconsumed.contains(&PING))
                || self.ops.borrow().iter().any(|(k, l)| {
                    !matches!(l, Lifecycle::Completed(..))
                        && (!unconsumed.contains(&self.user_data(k))
                            || (submit_detached && matches!(l, Lifecycle::Detached(..))))
                })
        };
        while in_kernel() && Instant::now() < deadline {
            if self.ext_arg {
                let _ = self.enter(1, Some(Duration::from_millis(10)));
            } else {
                // No wait timeout before Linux 5.11: a wait for a completion that never comes
                // would never reach the deadline. Submit, and poll every millisecond.
                let _ = self.enter(0, None);
                std::thread::sleep(Duration::from_millis(1));
            }
            self.dispatch();
        }
    }
}

impl Uring {
    /// Rule 5, once the shutdown stops submitting: the entries the kernel never consumed
    /// (queued after a refused `io_uring_enter`, in the ring or its overflow) never will, as
    /// nothing is submitted any more (`sealed`). Their operations end here, as cancelled: a
    /// live `Op`'s slot completes with `-ECANCELED` (its [`ORPHANS`] result), the data of one
    /// that is gone is freed, and a wake-ping read among them is not armed. They were taken
    /// for operations the kernel held: leaked, their `Op`s pending for good.
    fn settle_unconsumed(&self) {
        self.sealed.set(true);
        let unconsumed = self.unconsumed();
        self.overflow.borrow_mut().clear();
        if unconsumed.contains(&PING) {
            self.ping_armed.set(false);
        }
        let mut wakers = Vec::new();
        let mut freed = Vec::new();
        // Detached sends among them: logged after the borrow (a subscriber is user code).
        let mut unsent = Vec::new();
        {
            let mut ops = self.ops.borrow_mut();
            let keys: Vec<usize> = ops
                .iter()
                .filter(|&(k, _)| unconsumed.contains(&self.user_data(k)))
                .map(|(k, _)| k)
                .collect();
            for key in keys {
                let Some(slot) = ops.get_mut(key) else {
                    continue;
                };
                match slot {
                    Lifecycle::Submitted | Lifecycle::Waiting(_) => {
                        self.completed.set(self.completed.get() + 1);
                        let done = Lifecycle::Completed(-libc::ECANCELED, self.completed.get());
                        if let Lifecycle::Waiting(w) = self.set(slot, done) {
                            wakers.push(w);
                        }
                    }
                    Lifecycle::Ignored(..) | Lifecycle::Detached(..) => {
                        // Through `set`, so the in-flight count drops with it.
                        let old = self.set(slot, Lifecycle::Submitted);
                        ops.remove(key);
                        match old {
                            Lifecycle::Ignored(data, _) => freed.push(data),
                            Lifecycle::Detached(data, tail) => {
                                // A `CLOSE` that never ran; a send that never went out (its
                                // bytes lost: logged, as a detached send that failed is).
                                tail.cancelled_unrun();
                                if let Detach::Send(want) = tail {
                                    unsent.push(want);
                                }
                                freed.push(data);
                            }
                            _ => {}
                        }
                    }
                    Lifecycle::Completed(..) => {}
                }
            }
        }
        for want in unsent {
            check_detached_send(-libc::ECANCELED, want);
        }
        // User code (a buffer's `Drop`, a waker), after the borrow: it may reach this driver.
        for data in freed {
            drop_buffer(data);
        }
        for w in wakers {
            crate::task::wake_guarded(w);
        }
    }
}

/// How long a dropping driver waits for its operations (rule 5): first for detached sends to
/// finish, then for the cancellations of whatever is left.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// `RLIMIT_MEMLOCK` (soft), for a refused registration's error. Cost: a `getrlimit`.
fn memlock_limit() -> String {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit`, a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return "unknown".into();
    }
    if rl.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} bytes here", rl.rlim_cur)
    }
}

/// The pages the kernel pins (and counts) for registered buffers `iov`: every page each one
/// touches, whole (a small buffer takes a page; one that crosses a page boundary, two), as
/// "N pages (B bytes)", for a refused registration's error. Cost: a `sysconf`.
fn pages_touched(iov: &[libc::iovec]) -> String {
    // SAFETY: `sysconf` takes no pointers and has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    let pages: usize = iov
        .iter()
        .filter(|v| v.iov_len > 0)
        .map(|v| {
            let start = v.iov_base as usize;
            let last = start + (v.iov_len - 1);
            last / page - start / page + 1
        })
        .sum();
    format!("{pages} pages ({} bytes)", pages.saturating_mul(page))
}

/// Unregisters the fixed buffers of driver `id` if it is alive on this thread (also hidden by
/// `context::off_loop`: a pool dropped then stayed registered, and no other could be); a
/// driver that is gone took its registration with it.
pub(crate) fn unregister_buffers(id: u64) {
    with_uring(id, |u| {
        if let Err(e) = u.ring.borrow().submitter().unregister_buffers() {
            tracing::warn!("xtc: unregistering fixed buffers failed: {e}");
        }
    });
}

/// An operation in flight; resolves to the kernel's result (`res`, negative errno) and the
/// operation's data.
pub(crate) struct Op<T: 'static> {
    key: usize,
    driver: u64,
    data: Option<T>,
    /// A successful result is a new descriptor (`accept`, `openat`): if the Op is dropped
    /// before it takes the result, the driver closes it.
    result_is_fd: bool,
    /// `!Send`: an operation must be polled and dropped on the loop that submitted it.
    _local: std::marker::PhantomData<*const ()>,
}

impl<T> fmt::Debug for Op<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op").field("key", &self.key).finish()
    }
}

impl<T> Unpin for Op<T> {}

impl<T> Op<T> {
    /// Marks a successful result as a new descriptor that the driver closes if this Op is
    /// dropped before it takes the result.
    pub(crate) fn result_is_fd(mut self) -> Op<T> {
        self.result_is_fd = true;
        self
    }

    /// The kernel's result if its completion has been reaped, without taking it (the Op still
    /// resolves to it). `None` while in flight, and off its loop. Cost: one slab lookup.
    pub(crate) fn completed(&self) -> Option<i32> {
        match with_uring(self.driver, |u| u.peek_op(self.key)) {
            Some(res) => res,
            None => peek_orphan(self.driver, self.key)
                .flatten()
                .map(|(res, _)| res),
        }
    }

    /// Lets a send run to its end without this Op (no cancellation): the driver keeps its
    /// data until the completion and discards the result but for a check that it moved all of
    /// its `bytes` (from its start offset; fewer is logged, `check_detached_send`, as nothing
    /// sends the rest). For a send whose bytes were already reported written (`AsyncWrite`).
    /// Off its loop (driver gone) the data is dropped, or leaked if that driver recorded the
    /// operation as still in the kernel (`orphan_dropped`).
    pub(crate) fn detach_send(self, bytes: usize) {
        self.detach_unrun(Detach::Send(u32::try_from(bytes).unwrap_or(u32::MAX)));
    }

    /// Detaches (as [`detach_send`](Self::detach_send)) the `CLOSE` of `fd` whose future was
    /// dropped (`ops::file::Closing`), which its owner gave up to it: if the
    /// operation ends without having run (cancelled, by its driver's shutdown, its expiry or
    /// io-wq; or never consumed by the kernel, rule 5), the driver closes `fd`, which
    /// otherwise stayed open for good, nobody holding it any more.
    pub(crate) fn detach_closing(self, fd: RawFd) {
        self.detach_unrun(Detach::Close(fd));
    }

    fn detach_unrun(mut self, tail: Detach) {
        if let Some(data) = self.data.take() {
            let key = self.key;
            let mut data = Some(data);
            let on_driver = with_uring(self.driver, |u| {
                u.detach(key, Box::new(data.take().expect("taken once")), tail)
            });
            if on_driver.is_none() {
                // Its driver is gone (rule 5): free what the kernel no longer holds (and
                // close what a `CLOSE` it cancelled left open).
                if peek_orphan(self.driver, key).flatten().map(|(res, _)| res)
                    == Some(-libc::ECANCELED)
                {
                    tail.cancelled_unrun();
                }
                orphan_dropped(self.driver, key, false, data);
            }
        }
    }

    /// Declares that no task waits for this operation until it is polled again: its
    /// completion wakes nobody, and it no longer counts as I/O in flight, so it neither keeps
    /// the loop from quiescence nor hides a deadlock (the `Submitted` state of a write-behind
    /// send). For a receive kept by its stream after its future was dropped. Cost: one slab
    /// lookup.
    pub(crate) fn unwait(&self) {
        drop(self.unwait_later());
    }

    /// [`unwait`](Self::unwait), handing out the waker it forgets instead of dropping it: a
    /// waker's drop is user code, which the caller runs once it has put this `Op` where that
    /// code finds it (a stream's kept receive). Runs no user code itself.
    pub(crate) fn unwait_later(&self) -> Option<Waker> {
        let key = self.key;
        with_uring(self.driver, |u| u.unwait(key)).flatten()
    }

    /// Cancels the operation if it is still in the kernel, and keeps this `Op`: it resolves to
    /// `-ECANCELED` (see [`nothing_moved`]) or to the result that won the race, so a result the
    /// kernel produced is never lost to the cancel (an `ACCEPT`'s connection). Nothing once
    /// its driver is gone (whose shutdown cancelled it). Cost: one `AsyncCancel`, submitted
    /// at once.
    pub(crate) fn cancel_in_place(&self) {
        let key = self.key;
        let _ = with_uring(self.driver, |u| u.cancel_in_place(key));
    }

    /// Where its completion, once reaped and until its result is taken, stands in the order
    /// its driver reaped completions: `(driver id, place)`. Of two operations of one driver
    /// on one socket, the one with the lower place completed first (a stream socket hands
    /// its bytes out in that order). Once the driver is gone, the place it had when the
    /// driver went (rule 5: a completion its shutdown reaped has one too). `None` before the
    /// completion was reaped, or after the result was taken. Cost: two borrows.
    pub(crate) fn completed_at(&self) -> Option<(u64, u64)> {
        let (driver, key) = (self.driver, self.key);
        with_uring(driver, |u| match u.ops.borrow().get(key) {
            Some(Lifecycle::Completed(_, at)) => Some((u.id, *at)),
            _ => None,
        })
        .unwrap_or_else(|| {
            peek_orphan(driver, key)
                .flatten()
                .map(|(_, at)| (driver, at))
        })
    }

    /// The data the operation holds (its buffer), until it resolves.
    pub(crate) fn data(&self) -> Option<&T> {
        self.data.as_ref()
    }

    /// The id of the driver this operation runs on, for [`driver_gone`] once it resolved.
    pub(crate) fn driver_id(&self) -> u64 {
        self.driver
    }
}

/// Whether driver `id` is gone from this thread (rule 5): an `-ECANCELED` one of its
/// operations resolved to then may be its shutdown's cut, while on a driver still there it
/// is the kernel's own answer (io-wq, the kernel's worker threads, cancels a file operation
/// that must block when it can start no worker: a thread limit). Cost: a thread-local read.
pub(crate) fn driver_gone(id: u64) -> bool {
    with_uring(id, |_| ()).is_none()
}

/// Whether driver `id` is alive on this thread but is not the running loop's: that of a loop
/// `context::off_loop` hides (the caller runs on a loop run inside that section, a swept
/// drop's `LocalExecutor::block_on`), or one in its `Drop`. Such a driver is reaped only once
/// its loop turns again (or its drop settles it): a call here that waits for one of its
/// operations still in the kernel waits until then, for good if the section waits for the
/// call. Cost: a thread-local read when it is the running loop's.
pub(crate) fn driver_elsewhere(id: u64) -> bool {
    let running = context::with_core(|c| matches!(&c.io, super::Reactor::Uring(u) if u.id == id));
    running != Some(true) && !driver_gone(id)
}

/// Runs `f` on driver `id` if it is alive: the current loop's, that of a loop of this thread
/// hidden by `context::off_loop`, or one in its `Drop` (rule 5: its loop has left, and its
/// shutdown runs user code) (the only other places it can be: a driver belongs to one thread
/// and `Op`s are `!Send`). `None` means the driver is gone (rule 5), or alive but out of reach
/// (a `Core` dropped after its loop's `Enter` guard): its `Op`s tell the two apart by the
/// record a shutdown leaves, and take no record for "still in the kernel".
fn with_uring<R>(id: u64, f: impl FnOnce(&Uring) -> R) -> Option<R> {
    let mut f = Some(f);
    let on_loop = context::with_own_core(|c| match &c.io {
        super::Reactor::Uring(u) if u.id == id => f.take().map(|f| f(u)),
        _ => None,
    });
    if on_loop.is_some() {
        return on_loop;
    }
    let mut node = DROPPING.with(Cell::get);
    while !node.is_null() {
        // SAFETY: `Uring::drop` put `node` in the list from its own stack frame and takes it
        // out (its `Unlink` guard, also on unwind) before that frame goes; we are inside that
        // call (`Op`s are `!Send`, so on its thread), so the node is alive. Its `driver` came
        // from a shared borrow of the driver that `drop` holds, and uses only as shared, while
        // the node is listed.
        let (driver, outer) = unsafe { ((*node).driver, (*node).outer) };
        // SAFETY: see above.
        let u = unsafe { &*driver };
        if u.id == id {
            return f.take().map(|f| f(u));
        }
        node = outer;
    }
    None
}

impl<T: 'static> Future for Op<T> {
    type Output = (i32, T);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(i32, T)> {
        let (key, driver) = (self.key, self.driver);
        match with_uring(driver, |u| u.poll_op(key, cx)) {
            Some(Poll::Ready(res)) => {
                Poll::Ready((res, self.data.take().expect("polled after completion")))
            }
            Some(Poll::Pending) => Poll::Pending,
            // Its loop's driver is gone (rule 5): the result it left.
            None => match take_orphan(driver, key) {
                Some(Some(res)) => {
                    Poll::Ready((res, self.data.take().expect("polled after completion")))
                }
                Some(None) => {
                    // The kernel may still write into the data: it is never handed back (the
                    // record goes back for this Op's drop, which leaks the data).
                    orphans().insert((driver, key), None);
                    Poll::Pending
                }
                // No record, and no driver reachable: a driver that shut down records every
                // live `Op`, so its driver is alive but out of reach (a `Core` dropped after
                // its loop's `Enter` guard, as when its shutdown unwinds), and the kernel may
                // still write into the data. Never handed back: this `Op` waits (nothing wakes
                // it) and its drop leaks the data.
                None => Poll::Pending,
            },
        }
    }
}

/// Rule 5: an Op whose driver is gone lets go of `data`: freed, with a descriptor it got
/// closed, unless the kernel still held the operation when the driver gave up (then leaked).
/// Leaked too without a record: a driver that shut down records every live `Op`, so one that
/// recorded nothing is alive but out of reach (a `Core` dropped after its loop's `Enter`
/// guard, as when its shutdown unwinds: its queued tasks drop before its driver), and the
/// kernel may still write into the data; freed, it was written after free.
fn orphan_dropped<T: 'static>(driver: u64, key: usize, is_fd: bool, data: Option<T>) {
    match take_orphan(driver, key) {
        Some(None) | None => std::mem::forget(data),
        Some(Some(res)) => {
            close_orphan(res, is_fd);
            drop_buffer(Box::new(data));
        }
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        if let Some(data) = self.data.take() {
            let (key, is_fd) = (self.key, self.result_is_fd);
            let mut data = Some(data);
            let on_driver = with_uring(self.driver, |u| {
                u.abandon(key, Box::new(data.take().expect("taken once")), is_fd)
            });
            if on_driver.is_none() {
                orphan_dropped(self.driver, key, is_fd, data);
            }
        }
    }
}

/// The slot key in an operation's `user_data` (its low 32 bits; the generation is above).
fn key_of(ud: u64) -> usize {
    (ud & 0xFFFF_FFFF) as usize
}

/// Drops the data of an operation the driver freed itself (rule 4): a user buffer's `Drop` is
/// user code, run here in the loop's own code, so a panic in it is logged, not propagated.
fn drop_buffer(data: Box<dyn Any>) {
    crate::task::guarded("an I/O buffer panicked while being dropped", || drop(data));
}

/// Converts a completion result to `io::Result`.
pub(crate) fn result(res: i32) -> io::Result<u32> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `CLOSE` that ended with `ECANCELED` either never ran (the number still ours: closed
    /// now) or ran a `->flush` that answered `ECANCELED` after the kernel took the number out
    /// of the table (nothing to close: that flush's error is the answer). The second case was
    /// closed again, which answered `EBADF`, or, had the number been reused meanwhile, closed
    /// another owner's descriptor. No filesystem here answers a flush so; the number is made
    /// high so no other test's descriptor can take it.
    #[test]
    fn a_cancelled_close_closes_only_a_number_still_open() {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open("/dev/null").unwrap();
        let high = 900 + (std::process::id() % 97) as RawFd;
        // SAFETY: duplicates an open descriptor onto a number no test uses.
        assert_eq!(unsafe { libc::dup2(f.as_raw_fd(), high) }, high);
        close_cancelled(high).expect("a CLOSE that never ran: the number is closed here");
        // SAFETY: reads a number's flags.
        assert!(unsafe { libc::fcntl(high, libc::F_GETFD) } < 0, "closed");
        let e = close_cancelled(high).expect_err("gone already: the flush's error");
        assert_eq!(e.raw_os_error(), Some(libc::ECANCELED));
    }

    /// A non-blocking eventfd (a driver's wake ping) and a pipe, for a test to close.
    fn eventfd_and_pipe() -> (i32, [i32; 2]) {
        // SAFETY: eventfd and pipe take no pointers but the live array; the caller owns the
        // descriptors.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        let mut pipe = [0; 2];
        // SAFETY: as above.
        let rc = unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0);
        (efd, pipe)
    }

    /// Rule 5 with the driver alive but out of reach: an `Op` that finds neither its driver
    /// nor a record of it leaks its data. Before the fix it freed it, taking "no record" for
    /// "nothing in the kernel", while a read still waited there (from a review: a `Core`
    /// dropped after its `Enter` guard, as when a shutdown unwinds, drops its queued tasks, and
    /// their `Op`s, before its driver).
    #[test]
    fn an_op_dropped_while_its_driver_is_out_of_reach_keeps_its_data() {
        // A driver alive but no loop's (as a `Core`'s, dropped after its `Enter` guard when a
        // shutdown unwinds): an `Op` dropped now finds neither it nor a record of it.
        let (efd, pipe) = eventfd_and_pipe();
        let Ok(u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        use std::rc::Rc;
        struct Flagged(Rc<Cell<bool>>, Vec<u8>);
        impl Drop for Flagged {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let freed = Rc::new(Cell::new(false));
        let op = u
            .submit(Flagged(freed.clone(), vec![0; 16]), |f| {
                opcode::Read::new(types::Fd(pipe[0]), f.1.as_mut_ptr(), 16).build()
            })
            .map_err(|(e, _)| e)
            .unwrap();
        u.submit_pending(); // the read waits in the kernel for bytes nobody writes
        assert!(driver_gone(u.id), "the driver is out of the Op's reach");
        drop(op);
        assert!(
            !freed.get(),
            "the buffer was freed while the kernel still held its read"
        );
        drop(u); // cancels the read; the leaked buffer stays leaked
        for fd in [efd, pipe[0], pipe[1]] {
            // SAFETY: our descriptors, closed once.
            unsafe { libc::close(fd) };
        }
    }

    /// Rule 5 with user code in the driver's drop: the cancelled read `a`'s buffer, dropped
    /// when the shutdown reaps its completion, owns another operation `b` of the driver (a
    /// buffer may own a stream, or a future, that keeps one). `b` is a large file read in a
    /// kernel worker, which a cancellation does not stop. `b`'s data must live until `b`'s own
    /// completion is reaped. Before the fix, the dropping driver was out of its `Op`s' reach
    /// (`with_uring` found no loop) and had recorded nothing in `ORPHANS` yet: `b`'s data was
    /// freed while the kernel was still copying the file into it.
    #[test]
    fn an_op_dropped_by_user_code_in_the_drivers_drop_keeps_its_data_until_it_completes() {
        use std::{os::fd::AsRawFd, rc::Rc};
        const N: usize = 64 << 20;
        // The memory `b` reads into, lent from a region that outlives the test (so what the
        // kernel does with it after `b`'s data let go of it is seen, not a crash).
        let region: &'static mut [u8] = Box::leak(vec![0u8; N].into_boxed_slice());
        let base = region.as_mut_ptr() as usize;
        let path = std::env::temp_dir().join(format!("xtc-uring-drop-{}", std::process::id()));
        std::fs::write(&path, vec![0xABu8; N]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (efd, pipe) = eventfd_and_pipe();
        let Ok(u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        /// `b`'s data: the lent region. Its drop gives the region back, whose owner reuses it
        /// at once (zeroes it).
        struct Lent {
            base: usize,
            released: Rc<Cell<bool>>,
        }
        impl Drop for Lent {
            fn drop(&mut self) {
                self.released.set(true);
                // SAFETY: the region is leaked, so always mapped; only the kernel (if the
                // driver let go of `b` too early) writes into it too.
                unsafe { std::ptr::write_bytes(self.base as *mut u8, 0, N) };
            }
        }
        /// `a`'s data: its buffer, and the operation `b` it owns.
        struct Owner {
            buf: Vec<u8>,
            _b: Op<Lent>,
        }
        let released = Rc::new(Cell::new(false));
        let lent = Lent {
            base,
            released: released.clone(),
        };
        let fd = file.as_raw_fd();
        let b = u
            .submit(lent, |l| {
                opcode::Read::new(types::Fd(fd), l.base as *mut u8, N as u32)
                    .build()
                    .flags(squeue::Flags::ASYNC)
            })
            .map_err(|(e, _)| e)
            .unwrap();
        let b_key = b.key;
        u.submit_pending(); // `b` runs in a kernel worker from now
        let owner = Owner {
            buf: vec![0; 16],
            _b: b,
        };
        let mut a = u
            .submit(owner, |o| {
                opcode::Read::new(types::Fd(pipe[0]), o.buf.as_mut_ptr(), 16).build()
            })
            .map_err(|(e, _)| e)
            .unwrap();
        // What `Op::drop` does on its loop: the data goes to the slot, the read is cancelled.
        let data = a.data.take().unwrap();
        u.abandon(a.key, Box::new(data), false);
        drop(a);
        let id = u.id;
        drop(u);
        assert!(
            released.get(),
            "`b`'s data was never freed, though its read completed"
        );
        assert!(
            !region.contains(&0xAB),
            "the kernel wrote into `b`'s data after it was freed"
        );
        assert_eq!(
            take_orphan(id, b_key),
            None,
            "a record for an Op that is gone"
        );
        // SAFETY: the descriptors are ours; the ring that used them is gone.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
            libc::close(efd);
        }
    }

    /// An entry the kernel refuses while preparing it (an `open` of the empty path fails in
    /// `getname`) stops the batch there unless the ring has `IORING_SETUP_SUBMIT_ALL`: the
    /// entries behind it stayed queued while the driver took the batch for submitted, until
    /// some later `io_uring_enter`. A write queued behind it must be done after one submit.
    #[test]
    fn entries_behind_one_refused_at_setup_are_submitted_too() {
        // The ring `setup_ring` makes, and a plain one (a kernel without `SUBMIT_ALL`).
        for plain in [false, true] {
            refused_entry_then_write(plain);
        }
    }

    fn refused_entry_then_write(plain: bool) {
        // SAFETY: eventfd and pipe2 take no pointers but the live array; the descriptors are
        // ours and closed below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        let mut pipe = [0; 2];
        // SAFETY: as above.
        let rc = unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert_eq!(rc, 0);
        let Ok(mut u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        if plain {
            u.ring = RefCell::new(IoUring::new(ENTRIES).unwrap());
        }
        let open = u
            .submit(std::ffi::CString::default(), |p| {
                opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), p.as_ptr()).build()
            })
            .map_err(|(e, _)| e)
            .unwrap();
        let write = u
            .submit(b"x".to_vec(), |b| {
                opcode::Write::new(types::Fd(pipe[1]), b.as_ptr(), 1).build()
            })
            .map_err(|(e, _)| e)
            .unwrap();
        u.submit_pending();
        u.reap();
        let queued = u.queued();
        let mut got = 0u8;
        // SAFETY: reads at most one byte into a live local.
        let n = unsafe { libc::read(pipe[0], (&raw mut got).cast(), 1) };
        assert_eq!(
            (n, queued),
            (1, 0),
            "plain ring: {plain}: the write behind the refused open was left queued"
        );
        let open_res = u.peek_op(open.key);
        assert!(matches!(open_res, Some(r) if r < 0), "{open_res:?}");
        drop(u);
        drop((open, write));
        // SAFETY: the descriptors are ours; the ring that used them is gone.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
            libc::close(efd);
        }
    }

    /// A park with a timeout beyond `i64::MAX` seconds (a timer as far away as `Duration`
    /// goes) sleeps until pinged. The seconds used to reach the kernel as a negative number:
    /// the wait failed with `EINVAL` at once, every park, a loop spinning instead of sleeping.
    #[test]
    fn a_park_with_a_huge_timeout_sleeps() {
        // SAFETY: eventfd takes no pointers; the descriptor is ours and closed below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        let Ok(u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        // Set just before the ping: a park that returns with it unset ended without one. (A
        // bound on the park's length raced the pinger's start against the clock read.)
        let pinged = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = pinged.clone();
        let pinger = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live local to the eventfd, still open (closed
            // only after this thread is joined).
            let w = unsafe { libc::write(efd, (&one as *const u64).cast(), 8) };
            assert_eq!(w, 8);
        });
        let t = std::time::Instant::now();
        u.park(Some(Duration::MAX));
        let took = t.elapsed();
        let woke_by_ping = pinged.load(std::sync::atomic::Ordering::SeqCst);
        pinger.join().unwrap();
        assert!(
            woke_by_ping,
            "a park with timeout Duration::MAX returned after {took:?}, before the ping"
        );
        drop(u);
        // SAFETY: the descriptor is ours; the ring that used it is gone.
        unsafe { libc::close(efd) };
    }

    /// Kernels without `EXT_ARG` (before 5.11) park with a `TIMEOUT` entry: a park that a
    /// ping ends early must remove it. Forced here on a kernel that has `EXT_ARG`. Before the
    /// fix, 50 pinged parks left 50 entries armed, whose expiry 100 ms later ended a long park
    /// at once.
    #[test]
    fn early_parks_leave_no_timeout_entry_armed() {
        // SAFETY: eventfd takes no pointers; the descriptor is ours and closed below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        let Ok(mut u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        u.ext_arg = false;
        let ping = || {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live local to the eventfd.
            let w = unsafe { libc::write(efd, (&one as *const u64).cast(), 8) };
            assert_eq!(w, 8);
        };
        for _ in 0..50 {
            ping();
            let (pinged, _, _) = u.park(Some(Duration::from_millis(100)));
            assert!(pinged);
        }
        // Whatever the removals completed with, reaped now.
        std::thread::sleep(Duration::from_millis(20));
        u.reap();
        let t = std::time::Instant::now();
        let (pinged, _, _) = u.park(Some(Duration::from_millis(600)));
        let took = t.elapsed();
        assert!(!pinged);
        assert!(
            took >= Duration::from_millis(400),
            "a 600 ms park ended after {took:?}: an earlier park's timeout was still armed"
        );
        drop(u);
        // SAFETY: the descriptor is ours; the ring that used it is gone.
        unsafe { libc::close(efd) };
    }
    /// Completions are places in the order the driver reaped them (`Op::completed_at`), which
    /// must be the kernel's: a stream hands out the bytes of two receives in that order. A
    /// waker woken by `dispatch` is user code that may reap again (a drop that calls
    /// `io::reap_now`): that nested pass took the completions posted since and placed them
    /// before those still waiting in the outer pass's batch, which the kernel completed first.
    #[test]
    fn a_reap_nested_in_a_dispatch_keeps_the_kernels_order() {
        use std::{rc::Rc, sync::Arc, task::Wake};
        thread_local! {
            static HOOK: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
        }
        struct Hooked;
        impl Wake for Hooked {
            fn wake(self: Arc<Self>) {
                if let Some(h) = HOOK.with(|h| h.borrow_mut().take()) {
                    h();
                }
            }
        }
        // SAFETY: eventfd and pipe2 take no pointers but the live arrays; the descriptors are
        // ours and closed below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        let mut pipes = [[0; 2]; 3];
        for p in &mut pipes {
            // SAFETY: as above.
            let rc = unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) };
            assert_eq!(rc, 0);
        }
        let Ok(u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        let u = Rc::new(u);
        let read = |fd: RawFd| {
            u.submit(vec![0u8; 1], |b| {
                opcode::Read::new(types::Fd(fd), b.as_mut_ptr(), 1).build()
            })
            .map_err(|(e, _)| e)
            .unwrap()
        };
        let (a, b, c) = (read(pipes[0][0]), read(pipes[1][0]), read(pipes[2][0]));
        u.submit_pending();
        let write = |fd: RawFd| {
            // SAFETY: writes one byte from a live static.
            let w = unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
            assert_eq!(w, 1);
        };
        // `a`'s waker: `c` completes now, after `b`, and is reaped at once.
        let waker = Waker::from(Arc::new(Hooked));
        let mut cx = Context::from_waker(&waker);
        assert!(u.poll_op(a.key, &mut cx).is_pending());
        let nested = u.clone();
        let wfd = pipes[2][1];
        HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                write(wfd);
                nested.reap();
            }))
        });
        // `a` then `b` complete, and both completions are in the queue before one dispatch.
        write(pipes[0][1]);
        write(pipes[1][1]);
        u.enter(2, None).unwrap();
        u.dispatch();
        for _ in 0..100 {
            if u.peek_op(c.key).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            u.reap();
        }
        let at = |op: &Op<Vec<u8>>| match u.ops.borrow().get(op.key) {
            Some(Lifecycle::Completed(_, at)) => *at,
            _ => panic!("not completed"),
        };
        let (at_a, at_b, at_c) = (at(&a), at(&b), at(&c));
        assert!(
            at_a < at_b && at_b < at_c,
            "completions placed out of the kernel's order: a {at_a}, b {at_b}, c {at_c}"
        );
        drop((a, b, c));
        drop(u);
        // SAFETY: the descriptors are ours; the ring that used them is gone.
        unsafe {
            for p in pipes {
                libc::close(p[0]);
                libc::close(p[1]);
            }
            libc::close(efd);
        }
    }
    /// A park whose wake-ping read could not be armed (a push into a full ring whose submit
    /// failed) waited with nothing watching the eventfd: with no timer, a cross-shard wake
    /// (the eventfd write of a waker that saw the loop announce sleep) was lost until some
    /// I/O completed. The park is bounded then, and the wake is seen.
    #[test]
    fn a_park_whose_ping_read_could_not_be_armed_still_sees_a_wake() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: eventfd takes no pointers; the descriptor is ours, closed below.
            let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
            let Ok(u) = Uring::new(efd) else {
                let _ = tx.send(()); // no io_uring here: nothing to check
                return;
            };
            u.fail_ping_arm.set(true);
            let waker = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let one = 1u64;
                // SAFETY: writes 8 bytes from a live local to our eventfd.
                let w = unsafe { libc::write(efd, (&one as *const u64).cast(), 8) };
                assert_eq!(w, 8);
            });
            loop {
                u.park(None);
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a live local from our (non-blocking) eventfd.
                if unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) } == 8 {
                    break;
                }
            }
            waker.join().unwrap();
            drop(u);
            // SAFETY: the descriptor is ours; the ring that watched it is gone.
            unsafe { libc::close(efd) };
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "a park without its ping read never saw the wake"
        );
    }

    /// Rule 4 with a waker whose drop panics (user code): the dropped `Op`'s slot let go of
    /// that waker before the `AsyncCancel` was queued, so the panic skipped the cancel, and the
    /// receive stayed armed in the kernel for good: `Ignored`, counted as I/O in flight (the
    /// loop never quiescent), its socket held open by the kernel.
    #[test]
    fn an_op_dropped_with_a_waker_that_panics_when_dropped_is_still_cancelled() {
        use std::{sync::Arc, task::Wake};
        struct Panicky;
        impl Wake for Panicky {
            fn wake(self: Arc<Self>) {}
        }
        impl Drop for Panicky {
            fn drop(&mut self) {
                panic!("a waker that panics when dropped");
            }
        }
        // SAFETY: eventfd and pipe2 take no pointers but the live array; the descriptors are
        // ours and closed below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        let mut pipe = [0; 2];
        // SAFETY: as above.
        let rc = unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0);
        let Ok(u) = Uring::new(efd) else {
            return; // no io_uring here: nothing to check
        };
        let mut a = u
            .submit(vec![0u8; 16], |b| {
                opcode::Read::new(types::Fd(pipe[0]), b.as_mut_ptr(), 16).build()
            })
            .map_err(|(e, _)| e)
            .unwrap();
        u.submit_pending();
        {
            // The slot's clone is the last one once this one goes.
            let waker = Waker::from(Arc::new(Panicky));
            let mut cx = Context::from_waker(&waker);
            assert!(u.poll_op(a.key, &mut cx).is_pending());
        }
        assert_eq!(u.in_flight(), 1);
        // What `Op::drop` does on its loop; the waker's drop panics in it.
        let data = a.data.take().unwrap();
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            u.abandon(a.key, Box::new(data), false)
        }));
        assert!(dropped.is_err(), "the waker's drop did not panic");
        drop(a);
        // A hang guard: the loop ends as soon as the cancel completes.
        let deadline = Instant::now() + Duration::from_secs(60);
        while u.in_flight() > 0 && Instant::now() < deadline {
            u.park(Some(Duration::from_millis(10)));
        }
        assert_eq!(
            u.in_flight(),
            0,
            "the dropped read was never cancelled: it stays armed in the kernel"
        );
        drop(u);
        // SAFETY: the descriptors are ours; the ring that used them is gone.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
            libc::close(efd);
        }
    }

    /// A detached send's end is looked at: one that moved fewer bytes than it had to (a short
    /// completion, which kernels before 5.19 may give: they ignore `MSG_WAITALL` on a send)
    /// is a warning, as its rest is lost with nothing left to send it; a failed one a debug
    /// line; a full one, or an operation that is no send, nothing. The driver freed a short
    /// detached send's buffer without a word.
    #[test]
    fn a_detached_send_that_ends_short_is_warned_about() {
        let (levels, seen) = crate::test_log::Levels::new();
        let at = move || {
            let c = |i: usize| seen[i].load(std::sync::atomic::Ordering::SeqCst);
            (c(0), c(1))
        };
        tracing::subscriber::with_default(levels, || {
            check_detached_send(4096, 4096);
            assert_eq!(at(), (0, 0), "a send that moved all its bytes");
            check_detached_send(0, 0);
            check_detached_send(-libc::ECANCELED, 0);
            assert_eq!(at(), (0, 0), "no send (a CLOSE)");
            check_detached_send(1000, 4096);
            assert_eq!(at(), (1, 0), "a short send loses its rest: a warning");
            check_detached_send(0, 4096);
            assert_eq!(at(), (2, 0), "nothing sent at all, no error: a warning");
            check_detached_send(-libc::ECONNRESET, 4096);
            check_detached_send(-libc::ECANCELED, 4096);
            assert_eq!(
                at(),
                (2, 2),
                "a failed send (peer gone, expiry): debug lines"
            );
        });
    }
}
