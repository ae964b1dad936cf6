//! The I/O API at its edges, the same on both drivers: empty reads, Unix paths with a NUL,
//! a Unix listener whose backlog is full, positioned I/O on a FIFO.

mod io_common;

use std::{
    os::{fd::FromRawFd, unix::ffi::OsStrExt},
    path::PathBuf,
    time::Duration,
};

use futures::io::AsyncReadExt;
use io_common::{guard, on_each_driver};
use xtc_shards::{
    fs::OpenOptions,
    net::{UnixListener, UnixStream},
};

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xtc-api-{}-{name}", std::process::id()))
}

/// An empty `AsyncRead` read is `Ok(0)` at once (epoll waited for data first).
#[test]
fn an_empty_async_read_returns_at_once() {
    on_each_driver("an_empty_async_read_returns_at_once", 1, |_| async {
        let (mut a, _b) = UnixStream::pair().unwrap();
        let n = guard("empty AsyncRead", AsyncReadExt::read(&mut a, &mut []))
            .await
            .unwrap();
        assert_eq!(n, 0);
    });
}

/// A Unix socket path with a NUL byte is `InvalidInput`, as in `std`: the kernel would read
/// it as the shorter path before the NUL.
#[test]
fn a_unix_path_with_a_nul_is_refused() {
    on_each_driver(
        "a_unix_path_with_a_nul_is_refused",
        1,
        |driver| async move {
            let short = temp_path(&format!("nul-{driver}"));
            let mut bytes = short.as_os_str().as_bytes().to_vec();
            bytes.extend_from_slice(b"\0tail");
            let with_nul = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
            let e = UnixListener::bind(&with_nul).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert!(!short.exists(), "bound the truncated path");
            let e = UnixStream::connect(&with_nul).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        },
    );
}

/// A path that names no file is refused with `InvalidInput` before any system call, by `bind`
/// and `connect` alike, saying why: an empty path made `bind` succeed, the kernel autobinding
/// the socket to a random abstract name nobody could connect to by path (and `connect` failed
/// with a bare `EINVAL`); an abstract name (a leading NUL) was refused as a path "containing a
/// NUL byte", and a path too long for `sun_path` without saying how long it may be.
#[test]
fn unix_paths_that_name_no_file_are_refused_clearly() {
    on_each_driver(
        "unix_paths_that_name_no_file_are_refused_clearly",
        1,
        |_| async {
            let refused = |r: std::io::Result<()>, what: &str, says: &str| {
                let e = r.expect_err(what);
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{what}: {e}");
                assert!(e.to_string().contains(says), "{what}: {e}");
            };
            refused(UnixListener::bind("").map(drop), "bind(\"\")", "empty");
            refused(
                UnixStream::connect("").await.map(drop),
                "connect(\"\")",
                "empty",
            );
            refused(
                UnixListener::bind("\0xtc-abstract").map(drop),
                "bind of an abstract name",
                "abstract",
            );
            refused(
                UnixStream::connect("\0xtc-abstract").await.map(drop),
                "connect to an abstract name",
                "abstract",
            );
            refused(
                UnixListener::bind("a\0b").map(drop),
                "bind of a path with a NUL byte",
                "NUL",
            );
            let long = std::env::temp_dir().join("x".repeat(200));
            refused(
                UnixListener::bind(&long).map(drop),
                "bind of a 200-byte path",
                "107",
            );
            refused(
                UnixStream::connect(&long).await.map(drop),
                "connect to a 200-byte path",
                "107",
            );
            // The longest path that fits (107 bytes and the NUL) still binds.
            let dir = std::env::temp_dir();
            let base = dir.join(format!("xtc-io-{}-", std::process::id()));
            let pad = 107usize.saturating_sub(base.as_os_str().len());
            if pad > 0 {
                let path =
                    std::path::PathBuf::from(format!("{}{}", base.display(), "p".repeat(pad)));
                assert_eq!(path.as_os_str().len(), 107);
                let _ = std::fs::remove_file(&path);
                let l = UnixListener::bind(&path).expect("a 107-byte path binds");
                assert_eq!(l.local_addr().unwrap().as_pathname(), Some(path.as_path()));
                drop(l);
                std::fs::remove_file(&path).unwrap();
            }
        },
    );
}

/// A Unix listener whose backlog is full answers a non-blocking `connect` with `EAGAIN`;
/// `UnixStream::connect` waits and tries again, as a blocking `connect` would wait, instead
/// of handing the caller `WouldBlock`.
#[test]
fn a_unix_connect_waits_while_the_backlog_is_full() {
    on_each_driver(
        "a_unix_connect_waits_while_the_backlog_is_full",
        1,
        |driver| async move {
            let path = temp_path(&format!("backlog-{driver}"));
            let _ = std::fs::remove_file(&path);
            // A listener with a backlog of 0 that nobody accepts on yet.
            let listener = {
                let l = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
                    .unwrap();
                l.bind(&socket2::SockAddr::unix(&path).unwrap()).unwrap();
                l.listen(0).unwrap();
                // SAFETY: a fresh listening socket whose ownership moves here.
                unsafe {
                    std::os::unix::net::UnixListener::from_raw_fd(
                        std::os::fd::IntoRawFd::into_raw_fd(l),
                    )
                }
            };
            // Accepts once the connects below have met the full backlog.
            let acceptor = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                (0..3)
                    .map(|_| listener.accept().map(|(s, _)| s))
                    .collect::<std::io::Result<Vec<_>>>()
            });
            let mut conns = Vec::new();
            for i in 0..3 {
                let c = guard("connect", UnixStream::connect(&path)).await;
                conns.push(c.unwrap_or_else(|e| panic!("connect {i}: {e}")));
            }
            let accepted = guard("acceptor", async {
                while !acceptor.is_finished() {
                    xtc_shards::time::sleep(Duration::from_millis(1)).await;
                }
                acceptor.join().unwrap()
            })
            .await;
            assert_eq!(accepted.unwrap().len(), 3);
            std::fs::remove_file(&path).unwrap();
        },
    );
}

/// Positioned reads and writes on a FIFO are `ESPIPE` on both drivers (io_uring ignored the
/// offset and read or wrote the pipe).
#[test]
fn positioned_io_on_a_fifo_is_refused() {
    on_each_driver(
        "positioned_io_on_a_fifo_is_refused",
        1,
        |driver| async move {
            let path = temp_path(&format!("fifo-{driver}"));
            let _ = std::fs::remove_file(&path);
            let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: a plain syscall with a valid C string.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            // Read and write: opening a FIFO that way does not wait for a peer (Linux).
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .await
                .unwrap();
            let (w, _) = f.write_at(b"hi".to_vec(), 7).await;
            assert_eq!(w.unwrap_err().raw_os_error(), Some(libc::ESPIPE));
            let (r, _) = f.read_at(Vec::with_capacity(8), 7).await;
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ESPIPE));
            std::fs::remove_file(&path).unwrap();
        },
    );
}

/// A boxed future moved into a waker (test only).
struct SendBox {
    _fut: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
}

// SAFETY: test only: the future is made on the loop thread and dropped there too, with the
// waker that owns it (which never leaves that thread).
unsafe impl Send for SendBox {}

/// A waker that owns a future and does nothing when woken: its drop drops the future.
struct Owning {
    _held: std::sync::Mutex<Option<SendBox>>,
}

impl std::task::Wake for Owning {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// A waker's drop is user code. A custom waker that owns an in-flight read of the same loop,
/// replaced when the next poll brings another waker, drops that read from inside the driver's
/// bookkeeping. The io_uring driver used to hold its table of operations borrowed there
/// ("already borrowed": the loop's thread died).
#[test]
fn a_replaced_waker_may_drop_an_operation_of_the_same_loop() {
    use std::{future::Future, task::Poll};
    on_each_driver("a_replaced_waker_may_drop_an_operation", 1, |_| async {
        let (a, _a_peer) = UnixStream::pair().unwrap();
        let (b, _b_peer) = UnixStream::pair().unwrap();
        let mut read_b: std::pin::Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
            let _ = b.read(vec![0u8; 16]).await;
        });
        std::future::poll_fn(|cx| {
            assert!(read_b.as_mut().poll(cx).is_pending(), "nothing to read yet");
            Poll::Ready(())
        })
        .await;
        let owning = std::sync::Arc::new(Owning {
            _held: std::sync::Mutex::new(Some(SendBox { _fut: read_b })),
        });
        let waker = std::task::Waker::from(owning);
        let mut read_a = Box::pin(a.read(vec![0u8; 16]));
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(read_a.as_mut().poll(&mut cx).is_pending());
        drop(waker); // the driver holds the last clone
        std::future::poll_fn(|cx| {
            assert!(read_a.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
    });
}

/// A driver name that is not one of the accepted ones is an `Err` that names the value and
/// the accepted names (the error type was `()`, which said nothing); the accepted names parse
/// whatever their case and surrounding blanks.
#[test]
fn a_bad_driver_name_is_an_error_that_names_it() {
    use xtc_shards::{io::DriverChoice, Error};
    for (s, want) in [
        ("auto", DriverChoice::Auto),
        (" EPOLL ", DriverChoice::Epoll),
        ("io-uring", DriverChoice::IoUring),
        ("Uring", DriverChoice::IoUring),
    ] {
        assert_eq!(s.parse::<DriverChoice>().unwrap(), want, "{s:?}");
    }
    for bad in ["bogus", "", "epol"] {
        match bad.parse::<DriverChoice>() {
            Err(e @ Error::InvalidArgument(_)) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("{bad:?}")), "{msg}");
                for name in ["auto", "io_uring", "epoll"] {
                    assert!(msg.contains(name), "{msg}");
                }
            }
            other => panic!("{bad:?}: expected Err(InvalidArgument), got {other:?}"),
        }
    }
}

/// Every I/O type lends its descriptor as `AsFd`, the one `AsRawFd` names, so that
/// `socket2::SockRef` (which takes `AsFd`) sets options the stream then has.
#[test]
fn io_types_lend_their_descriptor_as_as_fd() {
    use std::os::fd::{AsFd, AsRawFd};
    use xtc_shards::net::{TcpListener, TcpStream, UdpSocket};
    on_each_driver("io_types_lend_their_descriptor_as_as_fd", 1, |_| async {
        fn same(what: &str, x: &(impl AsFd + AsRawFd)) {
            assert_eq!(x.as_fd().as_raw_fd(), x.as_raw_fd(), "{what}");
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = guard("connect", TcpStream::connect(addr)).await.unwrap();
        same("TcpListener", &listener);
        same("TcpStream", &stream);
        let sock = socket2::SockRef::from(&stream);
        sock.set_nodelay(true).unwrap();
        assert!(stream.nodelay().unwrap(), "an option set through AsFd");
        sock.set_nodelay(false).unwrap();
        assert!(!stream.nodelay().unwrap(), "an option set through AsFd");
        same("UdpSocket", &UdpSocket::bind("127.0.0.1:0").unwrap());
        let (a, _b) = UnixStream::pair().unwrap();
        same("UnixStream", &a);
        let path = temp_path("asfd");
        let _ = std::fs::remove_file(&path);
        same("UnixListener", &UnixListener::bind(&path).unwrap());
        let _ = std::fs::remove_file(&path);
        let file = guard(
            "open",
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(temp_path("asfd-file")),
        )
        .await
        .unwrap();
        same("File", &file);
        let _ = std::fs::remove_file(temp_path("asfd-file"));
    });
}

/// A listener's socket file stays after the listener is dropped (as with `std`): binding the
/// path again is `AddrInUse` with a message that names the path and the remedy, and works
/// once the file is removed.
#[test]
fn a_unix_listener_path_left_behind_names_the_path_and_the_remedy() {
    on_each_driver("a_unix_listener_path_left_behind", 1, |d| async move {
        let path = std::env::temp_dir().join(format!("xtc-left-{}-{d}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "the socket file stays after the drop");
        let e = UnixListener::bind(&path).map(drop).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&path.display().to_string()),
            "names the path: {msg}"
        );
        assert!(msg.contains("remove it"), "says what to do: {msg}");
        std::fs::remove_file(&path).unwrap();
        drop(UnixListener::bind(&path).unwrap());
        let _ = std::fs::remove_file(&path);
    });
}
