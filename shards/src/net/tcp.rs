//! TCP: [`TcpListener`] and [`TcpStream`].

use std::{
    io,
    net::{Shutdown, SocketAddr},
    os::fd::{AsRawFd, OwnedFd, RawFd},
    time::Duration,
};

use socket2::{Domain, SockRef, Socket, Type};

use super::{
    each_addr, ip_addr, is_exhaustion, is_transient, stream::StreamIo, Backoff, IntoStdError,
};
use crate::io::{ops, ops::accept::Settled, source::Source, BufResult, IoBuf, IoBufMut};

/// A listening TCP socket on the current loop's driver. `!Send`.
#[derive(Debug)]
pub struct TcpListener {
    /// Accepts dropped unfinished on io_uring, for the next `accept`; before `src`, so they
    /// are cancelled before the descriptor closes.
    kept: ops::accept::Kept,
    src: Source,
}

fn listener(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.bind(&addr.into()).map_err(|e| match e.kind() {
        // Port 0's `AddrInUse` means the ephemeral range ran out: no socket holds "port 0".
        io::ErrorKind::AddrInUse if reuse_port && addr.port() != 0 => {
            in_use_without_reuseport(addr, &e)
        }
        _ => e,
    })?;
    s.listen(1024)?;
    Ok(s)
}

/// `bind_reuseport`'s `AddrInUse`, saying what holds the port: the kernel's "Address already in
/// use" alone reads as if sharing the port had failed for every caller.
fn in_use_without_reuseport(addr: SocketAddr, e: &io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "{addr}: {e}: a socket that did not set SO_REUSEPORT (a plain `bind`, another \
             program) or one of another user holds it; every listener that shares the port \
             must be bound with `bind_reuseport`"
        ),
    )
}

impl TcpListener {
    /// Binds and listens (backlog 1024, `SO_REUSEADDR`). Synchronous, like `std` and Glommio:
    /// it may be called off any loop. The listener is `!Send`: one bound on a plain thread
    /// serves a [`LocalExecutor`](crate::LocalExecutor) of that thread; to hand it to a shard,
    /// send [`into_std`](Self::into_std)'s listener and rebuild it there with
    /// [`from_std`](Self::from_std) (or bind inside the shard's task). Host names are resolved
    /// synchronously. `Err`: the resolver's error for a name that does not resolve, the last
    /// address's error (`AddrInUse`, ..), or `InvalidInput` if `addr` resolves to an empty
    /// list. Cost per address tried: `socket`, one `setsockopt`, `bind`
    /// and `listen` system calls.
    pub fn bind(addr: impl std::net::ToSocketAddrs) -> io::Result<TcpListener> {
        each_addr(addr, |a| listener(a, false)).map(|s| TcpListener {
            kept: Default::default(),
            src: Source::new(OwnedFd::from(s)),
        })
    }

    /// As [`bind`](Self::bind) with `SO_REUSEPORT`: every shard binds its own listener to the
    /// same address and the kernel spreads incoming connections over them, so each shard
    /// accepts its own (the Seastar / Glommio server layout). Connections never move between
    /// listeners afterwards. Port 0 gives each call a port of its own: to share an ephemeral
    /// port, bind one listener first, read its [`local_addr`](Self::local_addr), and bind the
    /// others to that address. Errors as `bind`'s, with `AddrInUse` on a given port explained
    /// (its message names the address and what holds it; it carries no OS error code); cost
    /// one `setsockopt` more.
    ///
    /// The kernel lets any socket of the same user that sets `SO_REUSEPORT` join the port: a
    /// second copy of the server binds without an error and takes a share of the connections.
    /// To learn that nobody serves the port, bind it once with [`bind`](Self::bind) (or
    /// `std::net::TcpListener::bind`), which fails while anyone holds it, and drop that
    /// listener before the shards bind theirs (a socket that binds in between still joins).
    pub fn bind_reuseport(addr: impl std::net::ToSocketAddrs) -> io::Result<TcpListener> {
        each_addr(addr, |a| listener(a, true)).map(|s| TcpListener {
            kept: Default::default(),
            src: Source::new(OwnedFd::from(s)),
        })
    }

    /// `count` listeners on one address, each with `SO_REUSEPORT`, bound and listening now
    /// (before any shard runs), as `std` listeners (`Send`): hand one to each shard, which
    /// wraps it with [`from_std`](Self::from_std). So every shard's listener exists before
    /// `run()` starts, and a client that connects early waits in a backlog instead of being
    /// refused by a shard that has not bound yet; a bind error comes back here, in `main`,
    /// instead of inside a shard's task. With port 0 the first listener gets a port from the
    /// OS and the others bind that same port. The listeners are non-blocking (as `from_std`
    /// wants them; a plain thread's `accept` on one returns `WouldBlock` at once).
    /// `Err(InvalidInput)` for a `count` of 0 or more than any executor can have (524,288:
    /// 64 shards on each of Linux's 8,192 CPUs at most, as [`ConnBalancer::new`](super::ConnBalancer::new) refuses), else
    /// [`bind_reuseport`](Self::bind_reuseport)'s errors (the listeners bound so far are
    /// closed). What `bind_reuseport` says of a port other sockets join holds here too.
    /// Cost: `count` times `bind_reuseport`'s system calls, plus one `getsockname`.
    ///
    /// ```
    /// # use xtc_shards as xtc;
    /// let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
    /// let listeners = xtc::net::TcpListener::bind_reuseport_many("127.0.0.1:0", exec.shard_count())?;
    /// let addr = listeners[0].local_addr()?;
    /// for (shard, l) in listeners.into_iter().enumerate() {
    ///     exec.spawn_on(shard, move || async move {
    ///         let l = xtc::net::TcpListener::from_std(l).expect("a listener");
    ///         assert_eq!(l.local_addr().unwrap(), addr); // one port for all shards
    ///     })?;
    /// }
    /// exec.run()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind_reuseport_many(
        addr: impl std::net::ToSocketAddrs,
        count: usize,
    ) -> io::Result<Vec<std::net::TcpListener>> {
        if count == 0 || count > crate::MAX_SHARDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bind_reuseport_many: count {count}; pass the number of shards to serve \
                     (Executor::shard_count, 1 to {})",
                    crate::MAX_SHARDS
                ),
            ));
        }
        let first = each_addr(addr, |a| listener(a, true))?;
        // Port 0 is resolved now: the others bind the port the OS gave the first.
        let at = ip_addr(&first.local_addr()?)?;
        let mut all = Vec::with_capacity(count);
        all.push(std::net::TcpListener::from(first));
        for _ in 1..count {
            all.push(listener(at, true)?.into());
        }
        Ok(all)
    }

    /// Waits for a connection. Out of descriptors (`EMFILE`, `ENFILE`), memory (`ENOBUFS`,
    /// `ENOMEM`) or io_uring submission room (`EAGAIN`, `EBUSY`) it backs off (1 ms doubling
    /// to 100 ms) instead of spinning or failing, and logs a warning once per episode for the
    /// process: again after a minute if the episode lasts, or, once an accept got a connection
    /// without running out (the episode over), for the next episode at least 10 s after the
    /// last warning (a server that stays at its limit, or flaps at it as clients come and go,
    /// logs a line every 10 s to a minute, not one per connection or listener).
    /// Connections that failed before they were accepted (`ECONNABORTED`, `EPROTO`,
    /// `ENOPROTOOPT`, the host- and network-unreachable family, and `EINTR`: the errors
    /// accept(2) on Linux passes on from a pending connection) are skipped. Other errors are
    /// returned.
    /// Cost: one `ACCEPT` submission and a boxed peer address (io_uring) or one `accept4` (the
    /// listener joins the loop's epoll set once, at its first wait). On epoll, after 128 calls
    /// that found their socket ready in one poll of the task (accepts that found a connection
    /// waiting, and its other ready I/O: the cooperative budget, `io::COOP_BUDGET`), the next
    /// one yields first (ending its loop's batch), so a backlog a flood of connects keeps full
    /// does not hold the loop: io_uring completes every accept through a loop turn anyway.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let mut backoff = Backoff::new();
        loop {
            match ops::accept::accept(&self.src, &self.kept).await {
                Ok((fd, addr)) => {
                    backoff.connected();
                    return Ok((TcpStream::from_fd(fd), ip_addr(&addr)?));
                }
                Err(e) if is_exhaustion(&e) => backoff.wait(&e).await,
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The bound address (with the port the OS chose for port 0). Cost: one `getsockname`
    /// system call.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&self.src_fd()).local_addr()?)
    }

    fn src_fd(&self) -> BorrowedRaw {
        BorrowedRaw(self.src.fd())
    }

    /// Wraps a listener from `std` (switched to non-blocking mode). Cost: one system call.
    pub fn from_std(l: std::net::TcpListener) -> io::Result<TcpListener> {
        l.set_nonblocking(true)?;
        Ok(TcpListener {
            kept: Default::default(),
            src: Source::new(OwnedFd::from(l)),
        })
    }

    /// Unwraps into a `std` listener (left in non-blocking mode), e.g. to send it to another
    /// shard. Loses no connection: an accept kept from a dropped `accept` future (io_uring
    /// only) was cancelled when its future was dropped, and this waits for that cancellation
    /// to settle. If the accept lost the race and took a connection, which cannot be put back
    /// into the kernel's listen queue, the listener comes back in the error
    /// ([`IntoStdError::into_inner`]): `accept` returns that connection at once, then call
    /// `into_std` again. (Closing it, as before, reset a client that had connected.) The same
    /// error, with nothing taken, if the cancellation has not settled within a second. On
    /// epoll a dropped accept takes nothing: there it is an error only for an accept that an
    /// earlier io_uring loop of this thread kept, whose connection `accept` on epoll returns
    /// too. Cost: a borrow check without a kept accept; with one, a non-blocking reap of the
    /// loop's ring per round until its cancellation settles (usually none or one; the loop
    /// waits meanwhile, a second at most). Either way, the descriptor leaves the driver as a
    /// dropped socket's does: an `epoll_ctl` on epoll once it has waited there, and on
    /// io_uring an `io_uring_enter` when this thread's loops have entries queued (which may
    /// name it; see `ARCHITECTURE.md`, I/O).
    pub fn into_std(self) -> Result<std::net::TcpListener, IntoStdError<TcpListener>> {
        match self.kept.settle() {
            Settled::Empty => {}
            Settled::Connection => return Err(IntoStdError::new(self, false)),
            Settled::Pending => return Err(IntoStdError::new(self, true)),
        }
        let TcpListener { kept, src } = self;
        drop(kept);
        Ok(std::net::TcpListener::from(src.into_fd()))
    }
}

/// A raw fd viewed as `AsFd` for `SockRef` (socket2 only borrows it).
pub(crate) struct BorrowedRaw(pub(crate) RawFd);

impl std::os::fd::AsFd for BorrowedRaw {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the fd belongs to a live Source that outlives this short-lived view.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.0) }
    }
}

/// A TCP connection on the current loop's driver. `!Send`.
///
/// Owned-buffer I/O: [`read`](Self::read), [`write`](Self::write),
/// [`write_all`](Self::write_all); or the `futures::io` traits (internal buffer, see
/// `net/stream.rs`). Several tasks of the loop may read and write through `&TcpStream` (e.g.
/// an `Rc`) at once.
#[derive(Debug)]
pub struct TcpStream {
    io: StreamIo,
}

impl TcpStream {
    pub(crate) fn from_fd(fd: OwnedFd) -> TcpStream {
        TcpStream {
            io: StreamIo::new(fd),
        }
    }

    /// Connects to `addr` (each resolved address in turn, as `std`; the last error if none
    /// connects). Must run on a loop. Cost: a socket and one `CONNECT` submission with a boxed
    /// address (io_uring) or a `connect` and a wait for writability (epoll) per address tried. A
    /// host name is resolved synchronously on the loop's thread (`ToSocketAddrs`, as `bind`): a
    /// slow DNS lookup holds the loop; give a `SocketAddr`, or resolve on the blocking pool or
    /// another thread first, where that matters.
    pub async fn connect(addr: impl std::net::ToSocketAddrs) -> io::Result<TcpStream> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let mut last = None;
        for a in addrs {
            // A family the host lacks (IPv6 disabled: `EAFNOSUPPORT` for `::1` of
            // `localhost`) is one failed address, as in `std`: the next one is tried.
            let s = match Socket::new(Domain::for_address(a), Type::STREAM.nonblocking(), None) {
                Ok(s) => s,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let stream = TcpStream::from_fd(OwnedFd::from(s));
            match ops::connect::connect(&stream.io.src, a.into()).await {
                Ok(()) => return Ok(stream),
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

    /// Reads into `buf` from its start, up to its capacity (`Vec::with_capacity(n)` reads up to
    /// `n` bytes), and sets a `Vec`'s length to the count read. `Ok(0)` is the end of the
    /// stream; an empty `buf` gets `Ok(0)` at once, as with `std`. Dropping the future before
    /// it resolves (a `select!` whose other branch won) loses no bytes on either driver: on
    /// io_uring the stream keeps the receive it submitted running (and `buf` with it), and the
    /// next read (owned or `AsyncRead`) gets what it read first; a read dropped while another
    /// read of the stream is in flight is cancelled, but kept too, so bytes that reached it
    /// before the cancel still go to the next read (see `into_std` too). One exception on
    /// io_uring: a read dropped from inside another call on the same stream (a buffer whose
    /// own `Drop` drops it) is cancelled unkept, so bytes that reached it are lost. Two reads
    /// of one stream in flight at once (a `select!` over two reads of it) may get their bytes
    /// in either order on io_uring: the kernel fills the receive armed last first, and the
    /// one that lost the `select!` hands its earlier bytes to the next read. Read a stream
    /// from one place at a time. Cost: one
    /// `RECV` submission (a [`FixedBuf`](crate::io::FixedBuf) too), or one
    /// `recv` (the socket joins the loop's epoll set once, at its first wait); a dropped read
    /// costs a boxed handle.
    pub async fn read<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        self.io.read(buf).await
    }

    /// Writes `buf[..len]` once; returns the count written (possibly less than all); an empty `buf`
    /// does not wait: one zero-length send answers `Ok(0)`, or the socket's error (`ECONNRESET`,
    /// then `EPIPE`, after a reset), as `std`'s. Not cancellation safe on io_uring: dropping the
    /// future before it resolves (a `select!` whose other branch won) cancels its `SEND`, but one
    /// that completed already, or completes before the kernel handles the cancel, has sent a prefix
    /// of `buf`, and that count is lost with the future (as with tokio-uring's and monoio's owned
    /// writes). Writing the same bytes again after such a drop may send them twice: treat the
    /// stream's position as unknown (close it), or keep the future. On epoll the send runs in the
    /// poll that returns its count, so a dropped `write` sent nothing. Cost: one `SEND` submission
    /// (io_uring) or one `send` (epoll), after any `AsyncWrite` bytes still being sent.
    pub async fn write<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        self.io.write(buf).await
    }

    /// Writes all of `buf[..len]`, completing partial writes. `EPIPE` / `ECONNRESET` when the
    /// peer went away. Not cancellation safe on either driver: dropped before it resolves, it
    /// may have sent a prefix of `buf` (the partial writes it completed, and on io_uring a
    /// `SEND` its drop cancelled too late, see [`write`](Self::write)), and how much is not
    /// reported; a new `write_all` of the same buffer starts from its beginning, so the peer
    /// gets that prefix twice (as with tokio's `write_all`). Cost: as
    /// [`write`](Self::write) per partial write (one, unless the socket buffer fills).
    pub async fn write_all<B: IoBuf>(&self, buf: B) -> BufResult<(), B> {
        self.io.write_all(buf).await
    }

    /// Shuts down the read, write or both halves (never blocks; one system call, plus a submit
    /// and a reap on io_uring when an `AsyncWrite` send is in flight). On io_uring, bytes given
    /// to `AsyncWrite` are sent behind the call (`net/stream.rs`): a shutdown of the write half
    /// submits them first, and if the kernel has not taken them all it is refused with
    /// `WouldBlock` rather than lose them. `flush().await` (or `close().await`) waits for them.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.shutdown(how)
    }

    /// Sets `TCP_NODELAY` (no Nagle batching of small writes). Cost: one `setsockopt`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        SockRef::from(&BorrowedRaw(self.io.src.fd())).set_nodelay(on)
    }

    /// Whether `TCP_NODELAY` is set. Cost: one `getsockopt`.
    pub fn nodelay(&self) -> io::Result<bool> {
        SockRef::from(&BorrowedRaw(self.io.src.fd())).nodelay()
    }

    /// Sets `SO_LINGER`: `Some(Duration::ZERO)` makes the stream's close a reset (`RST`: the
    /// peer's next read or write fails with `ConnectionReset`, and unsent bytes are dropped),
    /// the way a proxy passes on that a stream was cut rather than ended; `None` restores the
    /// default close, which sends what is queued and then a `FIN`. A nonzero linger is
    /// refused (`InvalidInput`): it makes `close(2)` wait up to that long for the peer's
    /// acknowledgement, and the stream is closed on its loop's thread, which the wait would
    /// hold. Cost: one `setsockopt`.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        if linger.is_some_and(|d| !d.is_zero()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TcpStream::set_linger: only Some(Duration::ZERO) (close with a reset) or None \
                 (the default close): a nonzero linger would block the loop's thread in close",
            ));
        }
        SockRef::from(&BorrowedRaw(self.io.src.fd())).set_linger(linger)
    }

    /// `SO_LINGER` as [`set_linger`](Self::set_linger) left it (`None`: the default close).
    /// Cost: one `getsockopt`.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        SockRef::from(&BorrowedRaw(self.io.src.fd())).linger()
    }

    /// The peer's address. Cost: one `getpeername`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&BorrowedRaw(self.io.src.fd())).peer_addr()?)
    }

    /// This end's address. Cost: one `getsockname`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&BorrowedRaw(self.io.src.fd())).local_addr()?)
    }

    /// Wraps a connected `std` stream (switched to non-blocking mode): the way to receive a
    /// connection another shard accepted. Cost: one system call.
    pub fn from_std(s: std::net::TcpStream) -> io::Result<TcpStream> {
        s.set_nonblocking(true)?;
        Ok(TcpStream::from_fd(OwnedFd::from(s)))
    }

    /// Unwraps into a `std` stream (left non-blocking), e.g. to hand it to another shard.
    /// Loses no byte `AsyncWrite` reported written: while its write-behind send (io_uring) is
    /// still in flight, or left bytes unsent, or failed with an error not reported yet, the
    /// stream comes back in the error, its send still running: `flush().await`, then call
    /// `into_std` again. (It does not wait for the send itself: a peer that does not read
    /// would hold the loop for good. Cancelling it, as before, lost those bytes.) Loses no
    /// received byte: a receive the stream keeps (io_uring: a dropped read's, left to the next
    /// read, or the `AsyncRead` side's read ahead of its caller) is cancelled, and this waits
    /// for the cancellation to settle. If it, or an earlier one, took bytes that no read has
    /// returned yet, which cannot go back to the kernel, the stream comes back in the error
    /// ([`IntoStdError::into_inner`]): read them (the next read returns them at once), then
    /// call `into_std` again. (Dropping them, as before, lost them from the middle of the
    /// stream.) The same for an error such a receive got (a connection reset) that no read
    /// has reported: the kernel reports it once, and the `std` stream would read a clean end
    /// of stream instead; the next read returns it. The same error, with nothing lost, if the
    /// cancellation has not settled within a second. On epoll nothing is read ahead: there it is an error only for bytes that an
    /// earlier io_uring loop of this thread took. Cost: a borrow and two checks without such
    /// receives or bytes; with a receive in flight, a non-blocking reap of the loop's ring per
    /// round until its cancellation settles (usually none or one; the loop waits meanwhile).
    /// Either way, the descriptor leaves the driver as a dropped socket's does: an `epoll_ctl`
    /// on epoll once it has waited there, and on io_uring an `io_uring_enter` when this
    /// thread's loops have entries queued (which may name it).
    pub fn into_std(self) -> Result<std::net::TcpStream, IntoStdError<TcpStream>> {
        self.into_fd().map(std::net::TcpStream::from)
    }

    /// Unwraps into the descriptor (deregistered from this loop's driver); as
    /// [`into_std`](Self::into_std).
    pub(crate) fn into_fd(self) -> Result<OwnedFd, IntoStdError<TcpStream>> {
        // Writes first: a refusal for them cancels no kept receive.
        if !self.io.settle_writes() {
            return Err(IntoStdError::unflushed(self));
        }
        match self.io.settle_reads() {
            Ok(()) => Ok(self.io.into_fd()),
            Err(why) => Err(IntoStdError::unread(self, why)),
        }
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.io.src.fd()
    }
}

/// For `socket2::SockRef::from(&stream)` and other calls on the socket itself. An option set
/// through it is the caller's business; a read or write through it takes bytes the stream's
/// own reads and writes do not see.
impl std::os::fd::AsFd for TcpStream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.io.src.as_fd()
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}

impl std::os::fd::AsFd for TcpListener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.src.as_fd()
    }
}

super::stream::impl_async_io!(TcpStream);
