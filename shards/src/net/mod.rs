//! Networking on the current loop's I/O driver: [`TcpListener`], [`TcpStream`], [`UdpSocket`],
//! [`UnixListener`], [`UnixStream`], and [`ConnBalancer`], which serves each accepted
//! connection on the shard with the fewest open ones.
//!
//! Reads and writes take an owned buffer and give it back with the result
//! ([`BufResult`](crate::io::BufResult)), because io_uring's kernel side uses the memory after
//! the call returns; streams also implement `futures::io::{AsyncRead, AsyncWrite}` for codecs
//! (on the stream itself, used through `&mut`; not on `&TcpStream`: a stream inside a
//! `futures::io::BufReader` is still written with the owned calls through `get_ref()`). Their inherent `read`/`write`/`write_all` (owned buffers) take
//! precedence over `AsyncReadExt`/`AsyncWriteExt`'s methods of the same names: with those
//! traits in scope, call them by path (`AsyncWriteExt::write_all(&mut stream, b"..")`). For a
//! full-duplex copy (a proxy), `futures::io::AsyncReadExt::split` gives read and write halves
//! (behind a lock shared by the two; there is no `split` of xtc's own yet), and
//! `close()` on the write half shuts the stream's write side once its bytes are sent, where
//! `shutdown(Write)` right after an io_uring write-behind would refuse (`WouldBlock`).
//! Every type is `!Send` and belongs to the loop that uses it (see [`crate::io`]). Connection
//! errors (`ECONNRESET`, `EPIPE`) come back as plain `io::Error`s; writes never raise `SIGPIPE`.
//!
//! ```no_run
//! # use xtc_shards as xtc;
//! # fn main() -> xtc::Result<()> {
//! let exec = xtc::Executor::builder().shards(2).service_mode(true).build()?;
//! for shard in 0..exec.shard_count() {
//!     exec.spawn_on(shard, || async {
//!         // One listener per shard; the kernel spreads connections over them.
//!         let listener = match xtc::net::TcpListener::bind_reuseport("127.0.0.1:7000") {
//!             Ok(listener) => listener,
//!             // A panic here would end this task only, the shard serving nothing.
//!             Err(e) => {
//!                 tracing::error!("shard {}: bind: {e}", xtc::shard::id());
//!                 return xtc::stop();
//!             }
//!         };
//!         while let Ok((stream, _peer)) = listener.accept().await {
//!             xtc::spawn_local(async move {
//!                 let mut buf = Vec::with_capacity(4096);
//!                 loop {
//!                     let (n, b) = stream.read(buf).await;
//!                     if !matches!(n, Ok(n) if n > 0) { break; }
//!                     let (w, b) = stream.write_all(b).await;
//!                     if w.is_err() { break; }
//!                     buf = b;
//!                 }
//!             });
//!         }
//!     })?;
//! }
//! exec.run()
//! # }
//! ```

mod balance;
mod stream;
mod tcp;
mod udp;
mod unix;

pub use balance::ConnBalancer;
pub use tcp::{TcpListener, TcpStream};
pub use udp::UdpSocket;
pub use unix::{UnixListener, UnixStream};

use std::{
    fmt, io,
    net::SocketAddr,
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use socket2::SockAddr;

/// The error of `into_std` when unwrapping would lose something the kernel already handed
/// over; the socket comes back unchanged ([`into_inner`](Self::into_inner)).
///
/// - [`TcpListener::into_std`] and [`UnixListener::into_std`]: an `accept` future of the
///   listener was dropped after the kernel had taken a connection for it (io_uring keeps
///   that accept for the listener's next `accept`). The connection cannot go back to the
///   kernel's listen queue, and unwrapping would close it under its client: `accept` (it
///   returns that connection at once, on either driver), and call `into_std` again. On epoll
///   a dropped accept takes nothing: there, only for an accept an earlier io_uring loop of
///   the thread kept.
/// - [`TcpStream::into_std`], [`UnixStream::into_std`] and [`UdpSocket::into_std`]: the
///   socket holds received bytes (a datagram) that no read has returned yet: those of a read
///   whose future was dropped (io_uring keeps its receive for the next read), or the
///   `AsyncRead` side's read-ahead. They cannot go back to the kernel, and unwrapping would
///   drop them: read them (the next read returns them at once, on either driver), and call
///   `into_std` again. The same for an error such a receive got (a connection reset) that
///   no read has reported yet: the kernel reports it only once, so the `std` socket would
///   not see it (a reset stream would read as ended cleanly): read (the next read returns
///   the error at once), and call `into_std` again.
/// - [`TcpStream::into_std`] and [`UnixStream::into_std`] also: bytes the `AsyncWrite` side
///   reported written are still being sent (io_uring's write-behind send, in flight toward a
///   full socket, or a rest it left), or that send failed with an error no `flush` has
///   reported yet. The send is left running: `flush().await` (it waits for the bytes, or
///   reports the error), and call `into_std` again. `into_std` does not wait for the send
///   itself: a peer that does not read would make it wait for good, on the loop. (Cancelling
///   it, as before, lost bytes the caller had been told were written.)
///
/// Either way, the same error with nothing taken if the cancellation of such a kept
/// operation has not settled within a second: try again later.
pub struct IntoStdError<L> {
    /// Boxed: a stream is large, and the `Ok` side of a `Result` should not pay for it.
    inner: Box<L>,
    why: Refused,
}

/// What keeps a socket's receives from handing its descriptor over (`StreamIo::settle_reads`,
/// `UdpSocket::settle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsettled {
    /// A kept receive's cancellation has not settled.
    Pending,
    /// Received bytes (a datagram) no read has returned.
    Unread,
    /// A receive's error (a reset) no read has reported.
    Error,
}

/// Why an `into_std` refused ([`IntoStdError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// A kept accept's cancellation has not settled.
    AcceptPending,
    /// A kept accept holds a connection.
    Connection,
    /// A kept receive's cancellation has not settled.
    ReadPending,
    /// Received bytes (a datagram) no read has returned.
    Unread,
    /// A receive's error no read has reported.
    ReadError,
    /// Bytes `AsyncWrite` reported written are still to be sent, or its send's error is still
    /// to be reported.
    Unflushed,
}

impl<L> IntoStdError<L> {
    /// A listener's: its kept accept is `pending`, or holds a connection.
    pub(crate) fn new(listener: L, pending: bool) -> IntoStdError<L> {
        let why = if pending {
            Refused::AcceptPending
        } else {
            Refused::Connection
        };
        IntoStdError {
            inner: Box::new(listener),
            why,
        }
    }

    /// A stream's or a datagram socket's: its receives are `why` unsettled.
    pub(crate) fn unread(socket: L, why: Unsettled) -> IntoStdError<L> {
        let why = match why {
            Unsettled::Pending => Refused::ReadPending,
            Unsettled::Unread => Refused::Unread,
            Unsettled::Error => Refused::ReadError,
        };
        IntoStdError {
            inner: Box::new(socket),
            why,
        }
    }

    /// A stream's: bytes `AsyncWrite` reported written are still to be sent, or its failed
    /// send's error is still to be reported.
    pub(crate) fn unflushed(socket: L) -> IntoStdError<L> {
        IntoStdError {
            inner: Box::new(socket),
            why: Refused::Unflushed,
        }
    }

    /// The socket, unchanged (its kept accept or receives, and unread bytes, included). Cost:
    /// a move out of the box and its deallocation; no system call.
    pub fn into_inner(self) -> L {
        *self.inner
    }
}

impl<L> fmt::Debug for IntoStdError<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntoStdError")
            .field("why", &self.why)
            .finish_non_exhaustive()
    }
}

impl<L> fmt::Display for IntoStdError<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.why {
            Refused::AcceptPending => {
                "xtc: into_std refused: the cancellation of a dropped accept of this listener \
                 has not settled (it may hold a connection); try again later"
            }
            Refused::Connection => {
                "xtc: into_std refused: a dropped accept of this listener holds a connection \
                 the kernel already accepted; accept it (the next accept returns it), then \
                 call into_std again"
            }
            Refused::ReadPending => {
                "xtc: into_std refused: the cancellation of a receive this socket keeps (a \
                 dropped read's, or the AsyncRead read-ahead) has not settled (it may bring \
                 bytes); try again later"
            }
            Refused::Unread => {
                "xtc: into_std refused: this socket holds received bytes no read has returned \
                 yet (a dropped read's, or the AsyncRead read-ahead), which the std socket \
                 would lose; read them first (the next read returns them at once), then call \
                 into_std again"
            }
            Refused::ReadError => {
                "xtc: into_std refused: a receive of this socket (a dropped read's, or the \
                 AsyncRead read-ahead) got an error (such as a connection reset) that no read \
                 has reported yet, and the kernel reports it only once: the std socket would \
                 not see it (a reset stream would read as ended cleanly); read first (the next \
                 read returns the error at once), then call into_std again"
            }
            Refused::Unflushed => {
                "xtc: into_std refused: bytes written through AsyncWrite (reported written) \
                 are still being sent, or their send failed with an error not reported yet, \
                 and the std stream would lose them; await flush() (it waits for them, or \
                 reports the error), then call into_std again"
            }
        })
    }
}

impl<L> std::error::Error for IntoStdError<L> {}

/// Converts a kernel socket address to an IP one.
pub(crate) fn ip_addr(a: &SockAddr) -> io::Result<SocketAddr> {
    a.as_socket()
        .ok_or_else(|| io::Error::other("xtc: the kernel returned a non-IP socket address"))
}

/// Resolves `addr` (synchronously: literal addresses never block; host names use the system
/// resolver) and tries `f` on each address until one succeeds.
pub(crate) fn each_addr<T>(
    addr: impl std::net::ToSocketAddrs,
    mut f: impl FnMut(SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match f(a) {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolved to nothing",
        )
    }))
}

/// Errors of `accept` that mean "out of descriptors or memory": back off and retry. Also
/// `EAGAIN` and `EBUSY`, a safeguard: those of `io_uring_enter` (the kernel short of memory
/// for the request, or completions backed up) no longer reach an operation, whose entry the
/// driver keeps for its next enter (`io/uring.rs`, rule 1); the `ACCEPT`'s own `EAGAIN` is
/// retried (`nothing_moved`), and epoll's waits for readiness. Returned, one ended a
/// server's accept loop.
pub(crate) fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EAGAIN | libc::EBUSY
        )
    )
}

/// Errors of `accept` that concern only the connection being accepted: skip it. Besides an
/// aborted connection and an interruption, Linux passes the new connection's pending network
/// errors through `accept`, which accept(2) says to treat as `EAGAIN` (retry): `EPROTO`,
/// `ENOPROTOOPT`, `EHOSTDOWN`, `ENONET`, `EHOSTUNREACH`, `ENETUNREACH`, `ENETDOWN`. Ending
/// the accept loop on one of them stopped a server (and a `ConnBalancer` shard) over one
/// client's route. Not `EOPNOTSUPP`, which accept(2) lists too: it is also what a socket that
/// is no stream socket gets, for good, and retrying it never ended.
pub(crate) fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ENETDOWN
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// accept(2)'s retry list is skipped; errors of the listener itself are not.
    #[test]
    fn accept_skips_the_connections_own_errors_only() {
        for errno in [
            libc::ECONNABORTED,
            libc::EINTR,
            libc::EPROTO,
            libc::ENOPROTOOPT,
            libc::EHOSTDOWN,
            libc::ENONET,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::ENETDOWN,
        ] {
            assert!(
                is_transient(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        for errno in [
            libc::EBADF,
            libc::EINVAL,
            libc::ENOTSOCK,
            libc::EMFILE,
            libc::EOPNOTSUPP,
        ] {
            assert!(
                !is_transient(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
    }

    /// Running out (descriptors, memory, io_uring submission room) backs off; a connection's
    /// own errors and the listener's are something else.
    #[test]
    fn accept_backs_off_when_something_runs_out() {
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EAGAIN,
            libc::EBUSY,
        ] {
            assert!(
                is_exhaustion(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        for errno in [libc::ECONNABORTED, libc::EINVAL, libc::EOPNOTSUPP] {
            assert!(
                !is_exhaustion(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
    }

    /// An accept call that stays at the descriptor limit (no descriptor ever frees up for it)
    /// warns again when a warning is due for the process (here `WARNED_AT` cleared, as for a
    /// process that never warned). Only a call's first exhaustion looked at the episode, so a
    /// server stuck at its limit logged one line when it got there and never again, however
    /// long it stayed (the docs promise a warning a minute). A new episode right after a
    /// warning is not warned about.
    #[test]
    fn an_accept_that_stays_at_the_limit_warns_again_when_due() {
        let _backoff = super::backoff_test_lock();
        let (levels, seen) = crate::test_log::Levels::new();
        tracing::subscriber::with_default(levels, || {
            crate::LocalExecutor::new().unwrap().block_on(async move {
                let count = || seen[0].load(std::sync::atomic::Ordering::SeqCst);
                let emfile = io::Error::from_raw_os_error(libc::EMFILE);
                WARNED_AT.store(0, Relaxed);
                let mut backoff = Backoff::new();
                backoff.wait(&emfile).await;
                assert_eq!(count(), 1, "the first exhaustion is warned about");
                backoff.wait(&emfile).await;
                assert_eq!(count(), 1, "the same episode is not warned about again");
                // Another accept got a connection: the episode is over, but the last warning
                // is too recent for the next one (a server flapping at its limit).
                Backoff::new().connected();
                assert!(EPISODE_OVER.load(Relaxed));
                backoff.wait(&emfile).await;
                assert_eq!(
                    count(),
                    1,
                    "a new episode right after a warning is not warned"
                );
                // A warning is due (as for a process that never warned): this call still
                // meets exhaustion.
                WARNED_AT.store(0, Relaxed);
                backoff.wait(&emfile).await;
                assert_eq!(count(), 2, "a warning that is due goes out");
                assert!(!EPISODE_OVER.load(Relaxed), "the warning began an episode");
                backoff.wait(&emfile).await;
                assert_eq!(count(), 2, "once");
            });
        });
        WARNED_AT.store(0, Relaxed);
        EPISODE_OVER.store(false, Relaxed);
    }

    /// When a warning is due: never warned, a minute since the last, or a new episode at
    /// least 10 s after the last warning. Under churn at the limit (clients connecting and
    /// leaving, so some accepts find a descriptor free and end the episode) each new episode
    /// warned: 92 warnings in 3.6 s in a review's measurement.
    #[test]
    fn warnings_are_due_once_a_minute_or_for_a_new_episode_ten_seconds_on() {
        let s = |secs: u64| secs * 1_000 + 1;
        assert!(warn_due(s(5), 0, false), "never warned");
        assert!(!warn_due(s(5), s(0), false), "the same episode");
        assert!(
            !warn_due(s(59), s(0), false),
            "the same episode, under a minute"
        );
        assert!(
            warn_due(s(60), s(0), false),
            "the same episode, a minute on"
        );
        assert!(
            !warn_due(s(9), s(0), true),
            "a new episode, 9 s after the last warning"
        );
        assert!(
            warn_due(s(10), s(0), true),
            "a new episode, 10 s after the last warning"
        );
        assert!(
            !warn_due(s(0), s(5), true),
            "a clock read before the last warning"
        );
    }
}

/// When this process's accepts last warned of exhaustion (descriptors, memory): [`since`]'s
/// milliseconds plus one; 0 if they never did. Process-wide, as the limits are
/// (`RLIMIT_NOFILE` per process, `ENFILE` per system): a server that stays at its limit, each
/// accept taking the descriptor just freed and the next one meeting the limit again, and the
/// shards or listeners that meet it together, log one warning per episode ([`warn_due`]),
/// repeated once a minute while it lasts ([`REWARN`]: an episode no accept ended, its server
/// gone, does not silence the next one for good). Kept per `accept` call, each call began an
/// episode, and a server at its limit logged a warning for every connection it accepted. A
/// heuristic for the log only (relaxed).
static WARNED_AT: AtomicU64 = AtomicU64::new(0);

/// Whether the episode the last warning was for is over: set by an accept that gets a
/// connection without meeting exhaustion (a descriptor was free), cleared by the next warning.
/// Apart from [`WARNED_AT`], so the two can race (an episode's end set just before a warning
/// clears it, or set for the episode a warning has just begun): the next warning then comes
/// after a minute instead of 10 s, or the other way round, and [`REWARN`] bounds either. A
/// heuristic for the log only, as `WARNED_AT`.
static EPISODE_OVER: AtomicBool = AtomicBool::new(false);

/// Held by the unit tests that read [`WARNED_AT`] and [`EPISODE_OVER`] or accept through
/// `Backoff` (whose `connected` writes them): libtest runs a binary's tests in parallel
/// threads, and an accept in another test ended the episode a warning had just begun.
#[cfg(test)]
pub(crate) fn backoff_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long an episode of exhaustion goes without another warning.
const REWARN: Duration = Duration::from_secs(60);

/// How long after a warning a new episode goes without one: a server that flaps at its limit
/// (clients coming and going, so some accepts find a descriptor free and end the episode)
/// warned for every episode, dozens of lines a second.
const REWARN_NEW_EPISODE: Duration = Duration::from_secs(10);

/// Whether a warning is due at `now` ([`since`] plus one) with the last one at `last` (0:
/// none) and its episode `over` or not: never warned, [`REWARN`] since the last, or a new
/// episode [`REWARN_NEW_EPISODE`] since it.
fn warn_due(now: u64, last: u64, over: bool) -> bool {
    let gap = now.saturating_sub(last);
    last == 0
        || gap >= REWARN.as_millis() as u64
        || (over && gap >= REWARN_NEW_EPISODE.as_millis() as u64)
}

/// Milliseconds since the first call (the clock of [`WARNED_AT`]).
fn since() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// The accept loop's back-off while out of descriptors (and a Unix connect's while the
/// listener's backlog is full): doubles from 1 ms to 100 ms.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    /// This call met exhaustion ([`wait`](Self::wait)).
    met: bool,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff {
            next: Duration::from_millis(1),
            met: false,
        }
    }

    /// Logs a warning once per episode of exhaustion when one is due ([`warn_due`]), then
    /// sleeps. Looked at on every exhaustion the call meets, not only its first: a call that
    /// stays at the limit (no descriptor frees up for it) warns again once a minute has
    /// passed, or 10 s after the last warning once another accept ended the episode. Looked
    /// at only once per call, a server stuck at its limit logged one line when it got there
    /// and never again. Cost: the sleep (a timer and at least one loop turn; 1 ms doubling to
    /// 100 ms), a clock read and two relaxed loads, and when a warning is due a
    /// compare-and-swap, a relaxed store and the log line.
    pub(crate) async fn wait(&mut self, e: &io::Error) {
        self.met = true;
        let now = since() + 1;
        let last = WARNED_AT.load(Relaxed);
        if warn_due(now, last, EPISODE_OVER.load(Relaxed))
            && WARNED_AT
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            EPISODE_OVER.store(false, Relaxed);
            let what = match e.raw_os_error() {
                Some(libc::EMFILE) => {
                    "until descriptors free up (raise RLIMIT_NOFILE / ulimit -n for more \
                     connections)"
                }
                Some(libc::ENFILE) => {
                    "until descriptors free up (the system's file table is full: raise \
                     fs.file-max)"
                }
                Some(libc::EAGAIN | libc::EBUSY) => "until io_uring takes submissions again",
                _ => "until memory frees up",
            };
            tracing::warn!(
                "xtc: accept failed: {e}; backing off (1 ms doubling to 100 ms) {what}; \
                 warned again in a minute, or 10 s on once an accept finds room"
            );
        }
        self.pause().await;
    }

    /// An accept got a connection: if this call met no exhaustion, the episode (if any) is
    /// over, and the next one is warned about ([`warn_due`]). Cost: two relaxed loads (a
    /// store only when it ends an episode).
    pub(crate) fn connected(&self) {
        if !self.met && WARNED_AT.load(Relaxed) != 0 && !EPISODE_OVER.load(Relaxed) {
            EPISODE_OVER.store(true, Relaxed);
        }
    }

    /// Sleeps the next pause, silently.
    pub(crate) async fn pause(&mut self) {
        crate::time::sleep(self.next).await;
        self.next = (self.next * 2).min(Duration::from_millis(100));
    }
}
