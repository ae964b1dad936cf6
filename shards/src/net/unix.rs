//! Unix-domain streams: [`UnixListener`] and [`UnixStream`].

use std::{
    io,
    net::Shutdown,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    path::Path,
};

use socket2::{Domain, SockAddr, Socket, Type};

use super::{is_exhaustion, is_transient, stream::StreamIo, Backoff, IntoStdError};
use crate::io::{ops, ops::accept::Settled, source::Source, BufResult, IoBuf, IoBufMut};

/// A listening Unix-domain stream socket. `!Send`.
#[derive(Debug)]
pub struct UnixListener {
    /// Accepts dropped unfinished on io_uring, for the next `accept`; before `src`, so they
    /// are cancelled before the descriptor closes.
    kept: ops::accept::Kept,
    src: Source,
}

/// The most bytes a Unix socket path may have: `sun_path` less its terminating NUL.
const MAX_PATH: usize = 107;

/// A Unix socket address for `path`, checked before any system call: an empty path is
/// `InvalidInput` (with `bind` the kernel autobinds the socket to a random abstract name that
/// no one can reach by path; `connect` gets a bare `EINVAL`), as is an abstract name (a leading
/// NUL: not supported, `std`'s `SocketAddrExt` is the way to one), a path with a NUL byte (as in
/// `std`: the kernel would read it as a shorter path, and bind or reach another file), and a
/// path longer than `sun_path` holds ([`MAX_PATH`] bytes).
fn unix_addr(path: &Path) -> io::Result<SockAddr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
    if bytes.is_empty() {
        return invalid(
            "a Unix socket path must not be empty (the kernel would bind the socket to a \
             random abstract name): give a file path"
                .into(),
        );
    }
    if bytes[0] == 0 {
        return invalid(
            "abstract Unix socket names (a leading NUL byte) are not supported: give a file \
             path, or bind a std socket with SocketAddrExt and wrap it with from_std"
                .into(),
        );
    }
    if bytes.contains(&0) {
        return invalid("a Unix socket path must not contain a NUL byte".into());
    }
    if bytes.len() > MAX_PATH {
        return invalid(format!(
            "a Unix socket path may have at most {MAX_PATH} bytes, this one has {}: use a \
             shorter path (a relative one, or a shorter directory)",
            bytes.len()
        ));
    }
    SockAddr::unix(path)
}

impl UnixListener {
    /// Binds to `path` and listens (backlog 1024). Synchronous. The path must not exist
    /// (`AddrInUse`, naming the path): the socket file stays after the listener is dropped,
    /// as with `std`, so a server that binds its path again removes the file first
    /// (`std::fs::remove_file`) once it knows no other server listens there. An empty path,
    /// an abstract name (a leading NUL), a path with a NUL byte and one over 107 bytes are
    /// `InvalidInput` (before any system call).
    /// Cost: `socket`, `bind` and `listen` system calls.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixListener> {
        let path = path.as_ref();
        let addr = unix_addr(path)?;
        let s = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None)?;
        s.bind(&addr).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{}: {e}: a file exists at that path (a listener's socket file stays after \
                     it is dropped): remove it if no server listens there, or bind another path",
                    path.display()
                ),
            ),
            _ => e,
        })?;
        s.listen(1024)?;
        Ok(UnixListener {
            kept: Default::default(),
            src: Source::new(OwnedFd::from(s)),
        })
    }

    /// Waits for a connection (peers of Unix sockets are usually unnamed, so no address is
    /// returned). Descriptor exhaustion backs off as [`TcpListener::accept`](super::TcpListener::accept) does.
    /// Cost: as that one's.
    pub async fn accept(&self) -> io::Result<UnixStream> {
        let mut backoff = Backoff::new();
        loop {
            match ops::accept::accept(&self.src, &self.kept).await {
                Ok((fd, _)) => {
                    backoff.connected();
                    return Ok(UnixStream {
                        io: StreamIo::new_unix(fd),
                    });
                }
                Err(e) if is_exhaustion(&e) => backoff.wait(&e).await,
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The address it listens on. Cost: one `getsockname` system call.
    pub fn local_addr(&self) -> io::Result<std::os::unix::net::SocketAddr> {
        with_std(self.src.fd(), |s| s.local_addr())
    }

    /// Wraps a listener from `std` (switched to non-blocking mode). Cost: one system call.
    pub fn from_std(l: std::os::unix::net::UnixListener) -> io::Result<UnixListener> {
        l.set_nonblocking(true)?;
        Ok(UnixListener {
            kept: Default::default(),
            src: Source::new(OwnedFd::from(l)),
        })
    }

    /// Unwraps into a `std` listener (left in non-blocking mode). As
    /// [`TcpListener::into_std`](super::TcpListener::into_std): loses no connection; if an
    /// accept kept from a dropped `accept` future (io_uring) took one, or its cancellation has
    /// not settled within a second, the listener comes back in the error (`accept`, then try
    /// again). Cost: as that one's.
    pub fn into_std(self) -> Result<std::os::unix::net::UnixListener, IntoStdError<UnixListener>> {
        match self.kept.settle() {
            Settled::Empty => {}
            Settled::Connection => return Err(IntoStdError::new(self, false)),
            Settled::Pending => return Err(IntoStdError::new(self, true)),
        }
        let UnixListener { kept, src } = self;
        drop(kept);
        Ok(std::os::unix::net::UnixListener::from(src.into_fd()))
    }
}

/// Calls `f` on `fd` viewed as a `std` Unix socket (for its address accessors, which decode
/// unnamed and abstract addresses as `std` users expect), without taking ownership of it.
fn with_std<T>(
    fd: RawFd,
    f: impl FnOnce(&std::os::unix::net::UnixStream) -> io::Result<T>,
) -> io::Result<T> {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` is open, owned by a live `Source` for the whole call; `ManuallyDrop` keeps
    // this view from closing it. Only address queries (getsockname/getpeername) are made,
    // which work on listening and connected Unix sockets alike.
    let view =
        std::mem::ManuallyDrop::new(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) });
    f(&view)
}

impl AsRawFd for UnixListener {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}

impl std::os::fd::AsFd for UnixListener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.src.as_fd()
    }
}

/// A Unix-domain stream connection. `!Send`. Same I/O as [`TcpStream`](super::TcpStream).
#[derive(Debug)]
pub struct UnixStream {
    io: StreamIo,
}

impl UnixStream {
    /// Connects to the listener at `path`. Must run on a loop. A listener whose backlog is
    /// full (`EAGAIN`, where a blocking `connect` would wait) is tried again after a pause
    /// (1 ms doubling to 100 ms) until it takes the connection or fails otherwise: wrap the
    /// call in [`timeout`](crate::time::timeout) to bound the wait. Cost: a socket and one
    /// `CONNECT` submission with a boxed address (io_uring) or `connect` (epoll) per attempt;
    /// a path `bind` refuses as `InvalidInput` is refused so here too.
    pub async fn connect(path: impl AsRef<Path>) -> io::Result<UnixStream> {
        let addr = unix_addr(path.as_ref())?;
        let mut backoff = Backoff::new();
        loop {
            let s = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None)?;
            let stream = UnixStream {
                io: StreamIo::new_unix(OwnedFd::from(s)),
            };
            match ops::connect::connect(&stream.io.src, addr.clone()).await {
                Ok(()) => return Ok(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // A fresh socket for the next attempt: the kernel leaves this one
                    // unconnected, but a new one is the state a first attempt starts from.
                    drop(stream);
                    backoff.pause().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A connected pair (`socketpair`), e.g. for tests or to talk to a child process. Both
    /// ends are non-blocking, and [`into_std`](Self::into_std) leaves them so: for a child's
    /// standard input or output, call `set_nonblocking(false)` on the `std` end first (a
    /// child that reads before the parent writes otherwise fails with `EAGAIN`, "Resource
    /// temporarily unavailable"). Cost: one system call.
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = Socket::pair(Domain::UNIX, Type::STREAM.nonblocking(), None)?;
        Ok((
            UnixStream {
                io: StreamIo::new_unix(OwnedFd::from(a)),
            },
            UnixStream {
                io: StreamIo::new_unix(OwnedFd::from(b)),
            },
        ))
    }

    /// Reads into `buf` from its start, as [`TcpStream::read`](super::TcpStream::read) (same
    /// cost, and a dropped read loses nothing either).
    pub async fn read<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        self.io.read(buf).await
    }

    /// Writes `buf[..len]` once, as [`TcpStream::write`](super::TcpStream::write) (same cost,
    /// and not cancellation safe on io_uring either: a dropped write may have sent a prefix of
    /// `buf`).
    pub async fn write<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        self.io.write(buf).await
    }

    /// Writes all of `buf[..len]`, as [`TcpStream::write_all`](super::TcpStream::write_all)
    /// (same cost, and not cancellation safe either: a dropped `write_all` may have sent a
    /// prefix of `buf`, which writing it again sends twice).
    pub async fn write_all<B: IoBuf>(&self, buf: B) -> BufResult<(), B> {
        self.io.write_all(buf).await
    }

    /// Shuts down the read, write or both halves (never blocks; one system call, plus a submit
    /// and a reap on io_uring when an `AsyncWrite` send is in flight). On io_uring, bytes given
    /// to `AsyncWrite` are sent behind the call (`net/stream.rs`): a shutdown of the write half
    /// submits them first, and if the kernel has not taken them all it is refused with
    /// `WouldBlock` rather than lose them. `flush().await` (or `close().await`) waits for them.
    /// A write waiting for room when the write half shuts fails with `BrokenPipe`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.shutdown(how)
    }

    /// This end's address (usually unnamed for a connecting end or a pair). Cost: one
    /// `getsockname` system call.
    pub fn local_addr(&self) -> io::Result<std::os::unix::net::SocketAddr> {
        with_std(self.io.src.fd(), |s| s.local_addr())
    }

    /// The peer's address (the listener's path for a connecting end; usually unnamed for an
    /// accepted one). Cost: one `getpeername` system call.
    pub fn peer_addr(&self) -> io::Result<std::os::unix::net::SocketAddr> {
        with_std(self.io.src.fd(), |s| s.peer_addr())
    }

    /// Wraps a `std` stream (switched to non-blocking mode). Cost: one system call.
    pub fn from_std(s: std::os::unix::net::UnixStream) -> io::Result<UnixStream> {
        s.set_nonblocking(true)?;
        Ok(UnixStream {
            io: StreamIo::new_unix(OwnedFd::from(s)),
        })
    }

    /// Unwraps into a `std` stream (left non-blocking). As
    /// [`TcpStream::into_std`](super::TcpStream::into_std): `AsyncWrite` bytes still being
    /// sent (or a failed send's unreported error), and received bytes (or a receive's error)
    /// no read has returned yet, make it an [`IntoStdError`] that gives the stream back
    /// (flush first, or read them first). Cost: as that one's.
    pub fn into_std(self) -> Result<std::os::unix::net::UnixStream, IntoStdError<UnixStream>> {
        // Writes first: a refusal for them cancels no kept receive.
        if !self.io.settle_writes() {
            return Err(IntoStdError::unflushed(self));
        }
        match self.io.settle_reads() {
            Ok(()) => Ok(std::os::unix::net::UnixStream::from(self.io.into_fd())),
            Err(why) => Err(IntoStdError::unread(self, why)),
        }
    }
}

impl AsRawFd for UnixStream {
    fn as_raw_fd(&self) -> RawFd {
        self.io.src.fd()
    }
}

impl std::os::fd::AsFd for UnixStream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.io.src.as_fd()
    }
}

super::stream::impl_async_io!(UnixStream);
