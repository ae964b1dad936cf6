//! Owned stream reads whose futures are dropped unfinished (a `select!` whose other branch
//! won): no byte of the stream may be lost, on either driver. On io_uring the receive has
//! been handed to the kernel; the stream keeps it running and gives its bytes to the next
//! read. A receive kept that way must not keep `run()` from returning either. Also: owned
//! calls whose futures outlive their loop's driver (`block_on` returned while they waited),
//! and buffers whose `Drop` uses the stream they were read from.

mod common;
mod io_common;

use std::{
    cell::{Cell, RefCell},
    future::{poll_fn, Future},
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, RawWaker, RawWakerVTable, Waker},
    time::Duration,
};

use io_common::{each_driver, fill, guard, on_each_driver, tcp_pair, NoMemory, Stream};
use xtc_shards::{
    net::{TcpListener, TcpStream, UdpSocket, UnixStream},
    spawn_local,
    time::sleep,
};

/// Polls `fut` once with the task's waker; it must be pending (its receive is in the kernel).
async fn poll_pending<F: Future + ?Sized>(mut fut: std::pin::Pin<&mut F>) {
    let pending = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
    assert!(pending, "it had something to complete with already");
}

/// Polls `fut` once (it must be pending), lets the loop submit it (and, with `settle`, reap
/// a completion that arrives meanwhile), then drops it.
async fn poll_once_then_drop<F: Future>(fut: F, settle: impl Future<Output = ()>) {
    let mut fut = Box::pin(fut);
    poll_pending(fut.as_mut()).await;
    settle.await;
    drop(fut);
}

/// Sets socket option `opt` (`SOL_SOCKET` level) of `s` to `value`.
fn set_sockopt<T>(s: &impl std::os::fd::AsRawFd, opt: libc::c_int, value: T) {
    // SAFETY: a plain setsockopt on an open descriptor, with a live argument of its size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw const value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt({opt})");
}

/// Reads exactly `n` bytes with small owned reads.
async fn read_exactly(s: &TcpStream, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < n {
        let (r, b) = guard("read", s.read(Vec::with_capacity(7))).await;
        let k = r.expect("read");
        assert!(k > 0, "end of stream after {} of {n} bytes", out.len());
        out.extend_from_slice(&b);
    }
    out
}

#[test]
fn a_read_dropped_after_its_data_arrived_loses_nothing() {
    on_each_driver(
        "a_read_dropped_after_its_data_arrived_loses_nothing",
        1,
        |_| async {
            let (a, b) = tcp_pair().await;
            for round in 0..20u8 {
                let msg: Vec<u8> = (0..100u8).map(|i| i ^ round).collect();
                let sent = msg.clone();
                // The peer writes while the read is pending; the loop reaps the completion during
                // the sleep, and only then is the read future dropped.
                poll_once_then_drop(a.read(Vec::with_capacity(4096)), async {
                    let (w, _) = b.write_all(sent).await;
                    w.unwrap();
                    sleep(Duration::from_millis(5)).await;
                })
                .await;
                assert_eq!(read_exactly(&a, msg.len()).await, msg, "round {round}");
            }
            // The stream goes on both ways.
            let (w, _) = a.write_all(b"ok".to_vec()).await;
            w.unwrap();
            assert_eq!(read_exactly(&b, 2).await, b"ok");
        },
    );
}

#[test]
fn a_read_dropped_in_flight_loses_nothing() {
    on_each_driver("a_read_dropped_in_flight_loses_nothing", 1, |_| async {
        let (a, b) = tcp_pair().await;
        for round in 0..20u8 {
            // Dropped before the peer writes: on io_uring the receive is still in the kernel.
            poll_once_then_drop(
                a.read(Vec::with_capacity(4096)),
                sleep(Duration::from_millis(2)),
            )
            .await;
            let msg: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(3) ^ round).collect();
            let (w, _) = b.write_all(msg.clone()).await;
            w.unwrap();
            assert_eq!(read_exactly(&a, msg.len()).await, msg, "round {round}");
        }
    });
}

/// The same through the `futures::io` side: a dropped owned read's bytes come first for an
/// `AsyncRead` too.
#[test]
fn a_dropped_owned_read_is_seen_by_async_read() {
    use futures::io::AsyncReadExt;
    on_each_driver("a_dropped_owned_read_is_seen_by_async_read", 1, |_| async {
        let (mut a, b) = tcp_pair().await;
        poll_once_then_drop(a.read(Vec::with_capacity(64)), async {
            let (w, _) = b.write_all(b"first".to_vec()).await;
            w.unwrap();
            sleep(Duration::from_millis(5)).await;
        })
        .await;
        let (w, _) = b.write_all(b" second".to_vec()).await;
        w.unwrap();
        let mut got = vec![0u8; 12];
        guard("read_exact", a.read_exact(&mut got)).await.unwrap();
        assert_eq!(got, b"first second");
    });
}

#[test]
fn a_unix_read_dropped_after_its_data_arrived_loses_nothing() {
    on_each_driver(
        "a_unix_read_dropped_after_its_data_arrived_loses_nothing",
        1,
        |_| async {
            let (a, b) = UnixStream::pair().unwrap();
            poll_once_then_drop(a.read(Vec::with_capacity(64)), async {
                let (w, _) = b.write_all(b"unix".to_vec()).await;
                w.unwrap();
                sleep(Duration::from_millis(5)).await;
            })
            .await;
            let (r, got) = guard("read", a.read(Vec::with_capacity(64))).await;
            assert_eq!(r.unwrap(), 4);
            assert_eq!(got, b"unix");
        },
    );
}

/// A `recv_from` dropped after the kernel gave it a datagram, then one dropped in flight:
/// each datagram still arrives, through the next `recv_from`.
#[test]
fn a_dropped_recv_from_loses_no_datagram() {
    on_each_driver("a_dropped_recv_from_loses_no_datagram", 1, |_| async {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (to_a, from_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let recv = |want: Vec<u8>, round: u8| {
            let a = &a;
            async move {
                let (r, got) = guard("recv_from", a.recv_from(Vec::with_capacity(64))).await;
                let (n, from) = r.unwrap();
                assert_eq!((n, from), (want.len(), from_b), "round {round}");
                assert_eq!(got, want, "round {round}");
            }
        };
        for round in 0..10u8 {
            let first = vec![round; 10];
            let sent = first.clone();
            poll_once_then_drop(a.recv_from(Vec::with_capacity(64)), async {
                let (w, _) = b.send_to(sent, to_a).await;
                w.unwrap();
                sleep(Duration::from_millis(5)).await;
            })
            .await;
            recv(first, round).await;
            // In flight this time (on epoll, never started).
            poll_once_then_drop(
                a.recv_from(Vec::with_capacity(64)),
                sleep(Duration::from_millis(1)),
            )
            .await;
            let second = vec![round + 100; 20];
            let (w, _) = b.send_to(second.clone(), to_a).await;
            w.unwrap();
            recv(second, round).await;
        }
    });
}

/// A `recv_from` into an empty buffer with a null pointer takes over a kept receive's
/// datagram (truncated to nothing), and one kept with such a buffer hands over its datagram
/// (as received: nothing), without making a slice of the null pointer (undefined behaviour;
/// a debug build aborted on it).
#[test]
fn a_recv_from_into_a_null_empty_buffer_takes_a_kept_datagram() {
    on_each_driver(
        "a_recv_from_into_a_null_empty_buffer_takes_a_kept_datagram",
        1,
        |driver| async move {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let (to_a, from_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
            for dgram in [b"dgram".to_vec(), Vec::new()] {
                let sent = dgram.clone();
                poll_once_then_drop(a.recv_from(Vec::with_capacity(64)), async {
                    let (w, _) = b.send_to(sent, to_a).await;
                    w.unwrap();
                    sleep(Duration::from_millis(5)).await;
                })
                .await;
                let (r, _) = guard("recv_from", a.recv_from(NoMemory)).await;
                assert_eq!(r.unwrap(), (0, from_b), "{dgram:?}");
            }
            // A kept receive into such a buffer hands over its (truncated) datagram too.
            poll_once_then_drop(a.recv_from(NoMemory), async {
                let (w, _) = b.send_to(b"lost".to_vec(), to_a).await;
                w.unwrap();
                sleep(Duration::from_millis(5)).await;
            })
            .await;
            let (r, got) = guard("recv_from", a.recv_from(Vec::with_capacity(64))).await;
            // On epoll the dropped receive never took the datagram.
            let want: &[u8] = if driver == xtc_shards::io::Driver::IoUring {
                b""
            } else {
                b"lost"
            };
            assert_eq!((r.unwrap(), &got[..]), ((want.len(), from_b), want));
            // Nothing is left behind.
            let (w, _) = b.send_to(b"next".to_vec(), to_a).await;
            w.unwrap();
            let (r, got) = guard("recv_from", a.recv_from(Vec::with_capacity(64))).await;
            assert_eq!((r.unwrap().0, &got[..]), (4, &b"next"[..]));
        },
    );
}

/// An empty buffer reads `Ok(0)` at once, as `std` does, on both drivers (io_uring waited for
/// data, then reported 0, the end-of-stream value).
#[test]
fn an_empty_read_returns_at_once() {
    on_each_driver("an_empty_read_returns_at_once", 1, |_| async {
        let (a, _b) = tcp_pair().await;
        let (r, _) = guard("empty read", a.read(Vec::new())).await;
        assert_eq!(r.unwrap(), 0);
    });
}

/// A receive kept by a stream that outlives every task (leaked here; a stream parked in
/// per-shard state is the real case) waits for nobody: `run()` still returns at quiescence.
#[test]
fn run_returns_while_a_leaked_stream_keeps_a_dropped_read() {
    each_driver(
        "run_returns_while_a_leaked_stream_keeps_a_dropped_read",
        1,
        |b| b,
        |driver, exec| {
            exec.spawn_on(0, || async {
                let (a, b) = tcp_pair().await;
                keep_a_read(&a).await;
                std::mem::forget(a);
                std::mem::forget(b);
            })
            .unwrap();
            common::run_or_fail(exec, Duration::from_secs(30), "run with a stray read")
                .unwrap_or_else(|e| panic!("[{driver}]: {e}"));
        },
    );
}

/// A second read that waits for a kept receive and is dropped too leaves nobody waiting:
/// `run()` still returns (the receive went back to counting as in flight).
#[test]
fn run_returns_after_a_second_dropped_read_waited_for_the_kept_one() {
    each_driver(
        "run_returns_after_a_second_dropped_read_waited_for_the_kept_one",
        1,
        |b| b,
        |driver, exec| {
            exec.spawn_on(0, || async {
                let (a, b) = tcp_pair().await;
                for _ in 0..2 {
                    // The second one waits behind the first one's kept receive.
                    keep_a_read(&a).await;
                }
                std::mem::forget(a);
                std::mem::forget(b);
            })
            .unwrap();
            common::run_or_fail(exec, Duration::from_secs(30), "two dropped reads")
                .unwrap_or_else(|e| panic!("[{driver}]: {e}"));
        },
    );
}

/// Task B's read is in flight on a stream shared through an `Rc` when task A's read is
/// dropped: A's receive is cancelled, not kept, so the peer's bytes reach B (kept, it could
/// take them while B, already in the kernel, waited for more).
#[test]
fn a_read_dropped_beside_another_in_flight_does_not_take_its_bytes() {
    on_each_driver(
        "a_read_dropped_beside_another_in_flight_does_not_take_its_bytes",
        1,
        |_| async {
            let (a, b) = tcp_pair().await;
            let a = std::rc::Rc::new(a);
            let a2 = a.clone();
            let reader_b = spawn_local(async move { a2.read(Vec::with_capacity(64)).await });
            sleep(Duration::from_millis(5)).await;
            poll_once_then_drop(
                a.read(Vec::with_capacity(64)),
                sleep(Duration::from_millis(5)),
            )
            .await;
            let (w, _) = b.write_all(b"hello".to_vec()).await;
            w.unwrap();
            let (r, got) = guard("reader B", reader_b).await.unwrap();
            assert_eq!((r.unwrap(), &got[..]), (5, &b"hello"[..]));
        },
    );
}

/// The same for `recv_from`: a datagram must reach the receive already in flight.
#[test]
fn a_recv_from_dropped_beside_another_in_flight_does_not_take_its_datagram() {
    on_each_driver(
        "a_recv_from_dropped_beside_another_in_flight_does_not_take_its_datagram",
        1,
        |_| async {
            let a = std::rc::Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to_a = a.local_addr().unwrap();
            let a2 = a.clone();
            let reader_b = spawn_local(async move { a2.recv_from(Vec::with_capacity(64)).await });
            sleep(Duration::from_millis(5)).await;
            poll_once_then_drop(
                a.recv_from(Vec::with_capacity(64)),
                sleep(Duration::from_millis(5)),
            )
            .await;
            let (w, _) = b.send_to(b"dgram".to_vec(), to_a).await;
            w.unwrap();
            let (r, got) = guard("reader B", reader_b).await.unwrap();
            assert_eq!((r.unwrap().0, &got[..]), (5, &b"dgram"[..]));
        },
    );
}

/// A buffer whose read view (`stable_ptr`) differs from where receives write
/// (`stable_mut_ptr`), as the traits allow.
struct SplitViews(Vec<u8>);

// SAFETY: both pointers stay valid and stable while the buffer lives (the Vec is never
// resized); `bytes_init` is 0, so nothing is claimed initialized at the read view.
unsafe impl xtc_shards::io::IoBuf for SplitViews {
    fn stable_ptr(&self) -> *const u8 {
        self.0[64..].as_ptr()
    }
    fn bytes_init(&self) -> usize {
        0
    }
    fn bytes_total(&self) -> usize {
        64
    }
}

// SAFETY: the write view is the first 64 of the Vec's 128 bytes, all writable.
unsafe impl xtc_shards::io::IoBufMut for SplitViews {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

/// A kept receive's bytes are taken from where the kernel wrote them.
#[test]
fn a_kept_read_hands_on_the_bytes_the_kernel_wrote() {
    on_each_driver(
        "a_kept_read_hands_on_the_bytes_the_kernel_wrote",
        1,
        |_| async {
            let (a, b) = tcp_pair().await;
            poll_once_then_drop(a.read(SplitViews(vec![0xEE; 128])), async {
                let (w, _) = b.write_all(b"abc".to_vec()).await;
                w.unwrap();
                sleep(Duration::from_millis(5)).await;
            })
            .await;
            let (r, got) = guard("read", a.read(Vec::with_capacity(16))).await;
            assert_eq!((r.unwrap(), &got[..]), (3, &b"abc"[..]));
        },
    );
}

/// Two reads of one task (one waker) wait behind a kept receive; one of them is dropped (its
/// `select!` lost) after the other was polled. Leaving the waiter list removed the task's one
/// entry, so the kept receive went back to nobody-waits and the other read slept on while
/// its bytes arrived.
#[test]
fn a_read_left_waiting_beside_a_dropped_one_of_its_task_is_woken() {
    on_each_driver(
        "a_read_left_waiting_beside_a_dropped_one_of_its_task_is_woken",
        1,
        |_| async {
            let (a, b) = tcp_pair().await;
            let a = std::rc::Rc::new(a);
            keep_a_read(&*a).await;
            let a2 = a.clone();
            let reader = spawn_local(async move {
                let kept_read = async { a2.read(Vec::with_capacity(64)).await };
                let dropped_read = async {
                    let read = std::pin::pin!(a2.read(Vec::with_capacity(64)));
                    let timer = std::pin::pin!(sleep(Duration::from_millis(5)));
                    let _ = futures::future::select(read, timer).await;
                };
                futures::join!(kept_read, dropped_read).0
            });
            sleep(Duration::from_millis(20)).await;
            let (w, _) = b.write_all(b"hello".to_vec()).await;
            w.unwrap();
            let (r, got) = guard("the read left waiting", reader).await.unwrap();
            assert_eq!((r.unwrap(), &got[..]), (5, &b"hello"[..]));
        },
    );
}

/// A `recv_from` dropped after its datagram arrived, while another `recv_from` of the socket
/// is in flight, keeps its datagram (cancelled, it lost it): the next call gets it.
#[test]
fn a_recv_from_holding_a_datagram_is_kept_beside_another_in_flight() {
    on_each_driver(
        "a_recv_from_holding_a_datagram_is_kept_beside_another_in_flight",
        1,
        |driver| async move {
            let a = std::rc::Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to_a = a.local_addr().unwrap();
            // The first receive gets the first datagram (reaped during the sleep)...
            let mut first = Box::pin(a.recv_from(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            let (w, _) = b.send_to(b"one".to_vec(), to_a).await;
            w.unwrap();
            sleep(Duration::from_millis(5)).await;
            // ...then a second one goes in flight, and the first is dropped unread.
            let a2 = a.clone();
            let second = spawn_local(async move { a2.recv_from(Vec::with_capacity(64)).await });
            sleep(Duration::from_millis(5)).await;
            drop(first);
            let (w, _) = b.send_to(b"two".to_vec(), to_a).await;
            w.unwrap();
            // Whichever receive took which datagram, both arrive: one at the spawned
            // receive, the other at the next call.
            let (r, got_second) = guard("the receive in flight", second).await.unwrap();
            assert!(r.is_ok(), "[{driver}]");
            let (r, got_next) =
                guard("the next recv_from", a.recv_from(Vec::with_capacity(64))).await;
            assert!(r.is_ok(), "[{driver}]");
            let mut got = vec![got_second, got_next];
            got.sort();
            assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec()], "[{driver}]");
        },
    );
}

/// Many tasks (more than the waiter list once held) wait behind one kept receive: they sleep
/// until the bytes come, and do not keep the loop busy. A capped list that woke everyone to
/// start again made them re-list and overflow it forever.
#[test]
fn many_reads_waiting_behind_a_kept_one_do_not_spin() {
    on_each_driver(
        "many_reads_waiting_behind_a_kept_one_do_not_spin",
        1,
        |driver| async move {
            use std::{cell::Cell, rc::Rc};
            let (a, b) = tcp_pair().await;
            let a = Rc::new(a);
            keep_a_read(&*a).await;
            const READERS: usize = 40;
            let polls = Rc::new(Cell::new(0usize));
            let mut readers = Vec::new();
            for _ in 0..READERS {
                let (a2, p) = (a.clone(), polls.clone());
                readers.push(spawn_local(async move {
                    let mut read = std::pin::pin!(a2.read(Vec::with_capacity(64)));
                    poll_fn(|cx| {
                        p.set(p.get() + 1);
                        read.as_mut().poll(cx)
                    })
                    .await
                    .0
                    .map(drop)
                }));
            }
            sleep(Duration::from_millis(50)).await;
            let n = polls.get();
            drop(b); // the end of the stream ends every read
            for r in readers {
                let _ = guard("a reader", r).await;
            }
            // Once each, plus a few spurious wake-ups at most; the spin made tens of thousands.
            assert!(
                n <= READERS * 3,
                "[{driver}] {n} polls of {READERS} waiting reads"
            );
        },
    );
}

/// A stream read whose bytes arrived is dropped while another read of the stream is in
/// flight: its bytes go to the next read (cancelled, they were lost from the middle of the
/// stream).
#[test]
fn a_finished_read_dropped_beside_another_keeps_its_bytes() {
    on_each_driver(
        "a_finished_read_dropped_beside_another_keeps_its_bytes",
        1,
        |driver| async move {
            let (a, b) = tcp_pair().await;
            let a = std::rc::Rc::new(a);
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            let (w, _) = b.write_all(b"one".to_vec()).await;
            w.unwrap();
            sleep(Duration::from_millis(5)).await;
            let a2 = a.clone();
            let second = spawn_local(async move { a2.read(Vec::with_capacity(64)).await.1 });
            sleep(Duration::from_millis(5)).await;
            drop(first);
            let (w, _) = b.write_all(b"two".to_vec()).await;
            w.unwrap();
            let mut all = guard("the read in flight", second).await.unwrap();
            let (r, next) = guard("the next read", a.read(Vec::with_capacity(64))).await;
            r.unwrap();
            all.extend_from_slice(&next);
            // Which of two concurrent reads gets which bytes is arbitrary; none may be lost.
            assert!(
                all == b"onetwo" || all == b"twoone",
                "[{driver}] got {:?}",
                String::from_utf8_lossy(&all)
            );
        },
    );
}

/// A read whose bytes arrived is dropped while another read of the stream already waits on a
/// receive of its own, and the peer sends nothing more until it gets a reply (one request,
/// one response): the waiting read gets those bytes, as on epoll, where the dropped read took
/// nothing. Kept for the next read call, they woke nobody, so the waiting read slept on while
/// the peer waited for the reply: the conversation hung.
#[test]
fn a_finished_read_dropped_beside_a_waiting_one_wakes_it() {
    on_each_driver(
        "a_finished_read_dropped_beside_a_waiting_one_wakes_it",
        1,
        |driver| async move {
            let (a, b) = tcp_pair().await;
            let a = Rc::new(a);
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            let (w, _) = b.write_all(b"ping".to_vec()).await;
            w.unwrap();
            sleep(Duration::from_millis(5)).await; // the loop reaps the first read's bytes
            let a2 = a.clone();
            let waiting = spawn_local(async move { a2.read(Vec::with_capacity(64)).await });
            sleep(Duration::from_millis(5)).await; // the second read waits in the kernel
            drop(first);
            let (r, got) = xtc_shards::time::timeout(io_common::HANG, waiting)
                .await
                .unwrap_or_else(|_| {
                    panic!("[{driver}] the waiting read never got the dropped read's bytes")
                })
                .unwrap();
            assert_eq!((r.unwrap(), &got[..]), (4, &b"ping"[..]), "[{driver}]");
        },
    );
}

/// Two owned reads, each of which took bytes ("ping" the first, "pong" the second, started
/// while the first had completed unpolled), dropped youngest first: the stream keeps both, and hands their bytes out in
/// the order the socket gave them, not the order they were dropped. Kept in drop order, the
/// next reads got "pong" then "ping" on io_uring; on epoll, where neither took anything, the
/// next read gets "pingpong".
#[test]
fn bytes_of_reads_dropped_in_reverse_come_in_the_order_they_were_received() {
    on_each_driver(
        "bytes_of_reads_dropped_in_reverse_come_in_the_order_they_were_received",
        1,
        |driver| async move {
            let (a, b) = tcp_pair().await;
            let b = b.into_std().unwrap();
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            std::io::Write::write_all(&mut &b, b"ping").unwrap();
            sleep(Duration::from_millis(5)).await; // the first takes "ping"
            let mut seen = Vec::new();
            let mut second = Box::pin(a.read(Vec::with_capacity(64)));
            // On epoll, where the first took nothing, the second reads "ping" at once.
            let polled = poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx))).await;
            if let Poll::Ready((r, got)) = polled {
                assert_eq!(
                    driver.to_string(),
                    "epoll",
                    "the first read's bytes overtaken"
                );
                seen.extend_from_slice(&got[..r.unwrap()]);
            }
            sleep(Duration::from_millis(5)).await; // the second waits in the kernel
            std::io::Write::write_all(&mut &b, b"pong").unwrap();
            sleep(Duration::from_millis(5)).await; // the second takes "pong"
            drop(second);
            drop(first);
            while seen.len() < 8 {
                let (r, got) = guard("a read", a.read(Vec::with_capacity(64))).await;
                let n = r.unwrap();
                assert_ne!(n, 0, "{driver}: the stream ended early");
                seen.extend_from_slice(&got[..n]);
            }
            assert_eq!(
                seen, b"pingpong",
                "{driver}: bytes came out of the stream's order"
            );
        },
    );
}

/// As above, and the peer sends more bytes before the waiting read runs again: those reach
/// the waiting read's own receive, after the dropped read's bytes were already received and
/// kept. The stream's order holds: the dropped read's bytes come first. The waiting read
/// returned its own, later bytes, and the next read the earlier, kept ones (the peer's
/// "ping" "pong" read as "pong" "ping"); on epoll, where the dropped read took nothing, the
/// waiting read gets "ping" first.
#[test]
fn bytes_kept_from_a_dropped_read_come_before_a_waiting_reads_own() {
    on_each_driver(
        "bytes_kept_from_a_dropped_read_come_before_a_waiting_reads_own",
        1,
        |driver| async move {
            let (a, b) = tcp_pair().await;
            let b = b.into_std().unwrap();
            let a = Rc::new(a);
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            std::io::Write::write_all(&mut &b, b"ping").unwrap();
            sleep(Duration::from_millis(5)).await; // the loop reaps the first read's bytes
            let a2 = a.clone();
            let waiting = spawn_local(async move { a2.read(Vec::with_capacity(64)).await });
            sleep(Duration::from_millis(5)).await; // the second read waits in the kernel
            drop(first);
            // Before the waiting read runs again: these reach its own receive.
            std::io::Write::write_all(&mut &b, b"pong").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let (r, got) = guard("the waiting read", waiting).await.unwrap();
            let mut seen = got[..r.unwrap()].to_vec();
            while seen.len() < 8 {
                let (r, got) = guard("a read", a.read(Vec::with_capacity(64))).await;
                seen.extend_from_slice(&got[..r.unwrap()]);
            }
            assert_eq!(&seen[..], b"pingpong", "[{driver}]");
        },
    );
}

/// As above, but what reaches the waiting read's own receive is the end of the stream (the
/// peer shuts its write half) or a reset (the peer closes with a zero linger): the dropped
/// read's bytes, received before it, still come first, then the end or the error. Only a
/// receive that brought bytes queued behind the kept ones; the waiting read returned its end
/// of stream (or reset) at once, ahead of the bytes the peer had sent before it ("ping" read
/// after an `Ok(0)`, or lost behind a reset that made the caller give up).
#[test]
fn bytes_kept_from_a_dropped_read_come_before_a_waiting_reads_end_or_error() {
    for reset in [false, true] {
        on_each_driver(
            "bytes_kept_from_a_dropped_read_come_before_a_waiting_reads_end_or_error",
            1,
            move |driver| async move {
                let (a, b) = tcp_pair().await;
                let b = b.into_std().unwrap();
                let a = Rc::new(a);
                let mut first = Box::pin(a.read(Vec::with_capacity(64)));
                poll_pending(first.as_mut()).await;
                std::io::Write::write_all(&mut &b, b"ping").unwrap();
                sleep(Duration::from_millis(5)).await; // the loop reaps the first read's bytes
                let a2 = a.clone();
                let waiting = spawn_local(async move { a2.read(Vec::with_capacity(64)).await });
                sleep(Duration::from_millis(5)).await; // the second read waits in the kernel
                if reset {
                    set_sockopt(
                        &b,
                        libc::SO_LINGER,
                        libc::linger {
                            l_onoff: 1,
                            l_linger: 0,
                        },
                    );
                    drop(b);
                } else {
                    b.shutdown(std::net::Shutdown::Write).unwrap();
                }
                // The kernel completes the waiting read's receive, not reaped yet: the
                // loop must not run the waiting read before the first is dropped.
                std::thread::sleep(Duration::from_millis(20));
                drop(first);
                let (r, got) = guard("the waiting read", waiting).await.unwrap();
                let n = r.unwrap_or_else(|e| {
                    panic!("[{driver}] reset {reset}: the first read failed ({e}) before the bytes")
                });
                assert_eq!(
                    &got[..n],
                    b"ping",
                    "[{driver}] reset {reset}: the bytes sent first came second"
                );
                let (r, _) = guard("the next read", a.read(Vec::with_capacity(64))).await;
                match r {
                    Ok(0) => {}
                    Err(e) if reset => {
                        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "[{driver}]")
                    }
                    other => panic!("[{driver}] reset {reset}: after the bytes: {other:?}"),
                }
            },
        );
    }
}

/// A read cancelled (dropped beside others in flight) whose cancellation was reaped, then a
/// read that took "ping" dropped, while a third read's own receive took the next bytes,
/// "pong": the third read hands out "ping" first. The kept cancellation, ordered ahead of the
/// kept "ping", stopped the third read from queueing behind it: "pong" came first on
/// io_uring (the kernel serves the receive armed last first, here the one that takes "ping").
#[test]
fn bytes_kept_behind_a_kept_cancellation_come_before_a_waiting_reads_own() {
    on_each_driver(
        "bytes_kept_behind_a_kept_cancellation_come_before_a_waiting_reads_own",
        1,
        |driver| async move {
            let (a, b) = tcp_pair().await;
            let b = b.into_std().unwrap();
            let mut waiting = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(waiting.as_mut()).await;
            let mut cancelled = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(cancelled.as_mut()).await;
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            sleep(Duration::from_millis(5)).await; // all three in the kernel
            drop(cancelled);
            sleep(Duration::from_millis(5)).await; // its cancellation is reaped
            std::io::Write::write_all(&mut &b, b"ping").unwrap();
            sleep(Duration::from_millis(5)).await; // one of the other two takes "ping"
            std::io::Write::write_all(&mut &b, b"pong").unwrap();
            sleep(Duration::from_millis(5)).await; // and the other "pong"
            drop(first);
            let (r, got) = guard("the waiting read", waiting).await;
            let mut seen = got[..r.unwrap()].to_vec();
            while seen.len() < 8 {
                let (r, got) = guard("a read", a.read(Vec::with_capacity(64))).await;
                let n = r.unwrap();
                assert_ne!(n, 0, "{driver}: the stream ended early");
                seen.extend_from_slice(&got[..n]);
            }
            assert_eq!(
                String::from_utf8_lossy(&seen),
                "pingpong",
                "{driver}: bytes came out of the stream's order"
            );
        },
    );
}

/// A read dropped while another owned read of the stream is in flight is not left armed (it
/// could take the bytes the other one waits for), but cancelled. Bytes that reach the socket
/// after the drop looked for a completion and before the kernel handles that cancel still go
/// to its receive (here sent by its waker's drop, which the drop runs in between): its
/// completion was discarded with the receive, and those bytes were lost from the middle of
/// the stream. Now it is cancelled in place and kept, and the next read takes them.
#[test]
fn a_read_dropped_beside_another_keeps_the_bytes_that_beat_its_cancel() {
    on_each_driver(
        "a_read_dropped_beside_another_keeps_the_bytes_that_beat_its_cancel",
        1,
        |driver| async move {
            let (a_std, peer) = std::os::unix::net::UnixStream::pair().unwrap();
            let a = UnixStream::from_std(a_std).unwrap();
            let peer = Rc::new(RefCell::new(Some(peer)));
            let mut first = Box::pin(a.read(Vec::with_capacity(4)));
            poll_pending(first.as_mut()).await;
            let sender = peer.clone();
            // Its last clone, the one its receive holds, is dropped with the read.
            let waker = common::drop_hooked_waker(move || {
                use std::io::Write as _;
                if let Some(p) = sender.borrow_mut().as_mut() {
                    // Enough for both receives, whichever the kernel serves first.
                    p.write_all(b"abcdefgh").unwrap();
                }
            });
            let mut second = Box::pin(a.read(Vec::with_capacity(4)));
            let polled = second.as_mut().poll(&mut Context::from_waker(&waker));
            assert!(polled.is_pending(), "[{driver}] nothing was sent yet");
            drop(waker);
            sleep(Duration::from_millis(2)).await; // both receives submitted
            drop(second);
            let (r, mut all) = guard("the read in flight", first).await;
            assert_eq!(r.unwrap(), 4, "[{driver}]");
            // The end of the stream after the 8 bytes: a lost chunk reads as the end.
            drop(peer.borrow_mut().take());
            let (r, next) = guard("the next read", a.read(Vec::with_capacity(8))).await;
            r.unwrap();
            all.extend_from_slice(&next);
            // Which of two concurrent reads gets which bytes is arbitrary; none may be lost.
            assert!(
                all == b"abcdefgh" || all == b"efghabcd",
                "[{driver}] got {:?}",
                String::from_utf8_lossy(&all)
            );
        },
    );
}

/// A `recv_from` whose datagram the kernel delivered but the loop has not reaped yet, dropped
/// while another receive is in flight: the datagram still arrives.
#[test]
fn an_unreaped_datagram_of_a_dropped_recv_from_is_not_lost() {
    on_each_driver(
        "an_unreaped_datagram_of_a_dropped_recv_from_is_not_lost",
        1,
        |driver| async move {
            let a = std::rc::Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let to_a = a.local_addr().unwrap();
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for round in 0..20u8 {
                let a2 = a.clone();
                let other =
                    spawn_local(async move { a2.recv_from(Vec::with_capacity(64)).await.1 });
                let mut first = Box::pin(a.recv_from(Vec::with_capacity(64)));
                poll_pending(first.as_mut()).await;
                sleep(Duration::from_millis(3)).await;
                // Sent from this thread: no loop turn (no reap) before the drop.
                tx.send_to(&[round, 1], to_a).unwrap();
                tx.send_to(&[round, 2], to_a).unwrap();
                drop(first);
                let got1 = guard("the other receive", other).await.unwrap();
                let (r, got2) =
                    guard("the next recv_from", a.recv_from(Vec::with_capacity(64))).await;
                r.unwrap();
                let mut both = vec![got1, got2];
                both.sort();
                assert_eq!(
                    both,
                    vec![vec![round, 1], vec![round, 2]],
                    "[{driver}] round {round}"
                );
            }
        },
    );
}

/// A buffer whose `Drop` reads the stream it was read from (user code may), recording what it
/// saw.
struct ReadingOnDrop {
    v: Vec<u8>,
    stream: Option<std::rc::Rc<TcpStream>>,
    seen: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
}

// SAFETY: the views are the Vec's: stable while it is neither resized nor moved out.
unsafe impl xtc_shards::io::IoBuf for ReadingOnDrop {
    fn stable_ptr(&self) -> *const u8 {
        self.v.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.v.len()
    }
    fn bytes_total(&self) -> usize {
        self.v.capacity()
    }
}

// SAFETY: as above; `set_init` is called with at most `bytes_total()` initialized bytes.
unsafe impl xtc_shards::io::IoBufMut for ReadingOnDrop {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.v.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller's contract: the first `n <= capacity` bytes are initialized.
        unsafe { self.v.set_len(n) }
    }
}

impl Drop for ReadingOnDrop {
    fn drop(&mut self) {
        let Some(s) = self.stream.take() else { return };
        let mut read = std::pin::pin!(s.read(Vec::with_capacity(16)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let seen = match read.as_mut().poll(&mut cx) {
            Poll::Ready((r, b)) => format!(
                "{:?} {}",
                r.map_err(|e| e.kind()),
                String::from_utf8_lossy(&b)
            ),
            Poll::Pending => "pending".into(),
        };
        self.seen.borrow_mut().push(seen);
    }
}

/// A finished read dropped beside another read in flight hands its bytes to the stream, then
/// drops its buffer; that buffer's `Drop` reading the stream must find it whole (it found the
/// internal buffer taken out under a stale position: an overflow, and in release builds a
/// read out of bounds).
#[test]
fn a_buffer_drop_that_reads_the_stream_finds_it_whole() {
    on_each_driver(
        "a_buffer_drop_that_reads_the_stream_finds_it_whole",
        1,
        |driver| async move {
            if driver == xtc_shards::io::Driver::Epoll {
                // epoll reads in the poll: no read is ever in flight to be dropped.
                return;
            }
            let (a, b) = tcp_pair().await;
            let a = std::rc::Rc::new(a);
            let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            poll_pending(first.as_mut()).await;
            b.write_all(b"hello".to_vec()).await.0.unwrap();
            sleep(Duration::from_millis(5)).await;
            let reading = || ReadingOnDrop {
                v: Vec::with_capacity(64),
                stream: Some(a.clone()),
                seen: seen.clone(),
            };
            let mut other = Box::pin(a.read(Vec::with_capacity(64)));
            let mut third = Box::pin(a.read(reading()));
            poll_pending(other.as_mut()).await;
            poll_pending(third.as_mut()).await;
            // Finished, beside reads in flight: its "hello" goes to the stream's buffer.
            drop(first);
            let (r, he) = guard("a short read", a.read(Vec::with_capacity(2))).await;
            assert_eq!((r.unwrap(), &he[..]), (2, &b"he"[..]), "[{driver}]");
            b.write_all(b"world".to_vec()).await.0.unwrap();
            sleep(Duration::from_millis(5)).await;
            drop(third);
            drop(other);
            let seen = seen.borrow().clone();
            // The buffer's `Drop` ran to its end (a panic in it is caught and logged, and
            // recorded nothing), and its read got unread bytes, in order: the rest of
            // "hello", not what the short read already took.
            assert_eq!(seen.len(), 1, "[{driver}] {seen:?}");
            assert!(
                seen[0].starts_with("Ok(") && seen[0].contains("llo") && !seen[0].contains("he"),
                "[{driver}] {seen:?}"
            );
        },
    );
}

/// A read dropped alone (kept by the stream on io_uring) whose buffer's `Drop` reads the
/// stream: the next read takes the kept read's bytes and then drops its buffer, whose read must
/// find the stream whole and get the rest of the bytes. The buffer was dropped while that read
/// held the stream's state mutably borrowed: its read panicked (`already borrowed`, caught
/// and logged, so nothing was recorded).
#[test]
fn a_kept_reads_buffer_drop_that_reads_the_stream_finds_it_whole() {
    on_each_driver(
        "a_kept_reads_buffer_drop_that_reads_the_stream_finds_it_whole",
        1,
        |driver| async move {
            let (a, b) = tcp_pair().await;
            let a = std::rc::Rc::new(a);
            let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let first = a.read(ReadingOnDrop {
                v: Vec::with_capacity(64),
                stream: Some(a.clone()),
                seen: seen.clone(),
            });
            // The only read: kept by the stream on io_uring (on epoll, dropped with its
            // future, its buffer's read finds nothing yet).
            poll_once_then_drop(first, sleep(Duration::from_millis(2))).await;
            b.write_all(b"hello".to_vec()).await.0.unwrap();
            sleep(Duration::from_millis(5)).await;
            let (r, got) = guard("read", a.read(Vec::with_capacity(2))).await;
            assert_eq!((r.unwrap(), &got[..]), (2, &b"he"[..]), "[{driver}]");
            let seen = seen.borrow().clone();
            assert_eq!(
                seen.len(),
                1,
                "[{driver}] the buffer's Drop panicked: {seen:?}"
            );
            if driver == xtc_shards::io::Driver::IoUring {
                // Dropped after the short read took its two bytes: its read gets the rest.
                assert_eq!(seen[0], "Ok(3) llo", "[{driver}]");
            }
        },
    );
}

/// `shutdown` with a write-behind send in flight submits and reaps the ring to see whether the
/// send is done; a cancelled read's buffer dropped by that reap, whose `Drop` reads the
/// stream, must find it whole. The reap ran while `shutdown` held the stream's state borrowed:
/// the buffer's read panicked (`already borrowed`, caught and logged). The cancelled read is
/// one of another stream, dropped with it (a read of this one dropped beside another is kept
/// by the stream until its next read, its buffer with it).
#[test]
fn a_buffer_dropped_by_shutdowns_reap_finds_the_stream_whole() {
    use futures::io::AsyncWriteExt;
    on_each_driver(
        "a_buffer_dropped_by_shutdowns_reap_finds_the_stream_whole",
        1,
        |driver| async move {
            if driver == xtc_shards::io::Driver::Epoll {
                return; // no write-behind, and no read in flight to cancel
            }
            let (mut a, b) = tcp_pair().await;
            fill(&a);
            let n = guard("write", AsyncWriteExt::write(&mut a, b"tail"))
                .await
                .unwrap();
            assert_eq!(n, 4); // reported written; its send waits for room
            let a = std::rc::Rc::new(a);
            let (c, _d) = tcp_pair().await;
            let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let mut r1 = Box::pin(a.read(Vec::with_capacity(64)));
            let mut r2 = Box::pin(c.read(ReadingOnDrop {
                v: Vec::with_capacity(64),
                stream: Some(a.clone()),
                seen: seen.clone(),
            }));
            poll_pending(r1.as_mut()).await;
            poll_pending(r2.as_mut()).await;
            xtc_shards::yield_now().await; // both submitted
            drop(r2); // kept by `c`...
            drop(c); // ...and cancelled with it, its buffer held until the cancel completes
            sleep(Duration::from_millis(0)).await;
            std::thread::sleep(Duration::from_millis(20)); // the cancel completes in the kernel
            let shut = a.shutdown(std::net::Shutdown::Write); // reaps: drops r2's buffer
            assert!(shut.is_err(), "write-behind still in flight");
            drop(r1);
            drop(b);
            let seen = seen.borrow().clone();
            assert_eq!(
                seen.len(),
                1,
                "[{driver}] the buffer's Drop panicked: {seen:?}"
            );
        },
    );
}

/// An `AsyncRead` polled on an idle stream with a new waker each time (a combinator that
/// makes one per attempt) keeps one waker listed, not one per poll.
#[test]
fn an_async_read_polled_with_new_wakers_keeps_one_listed() {
    on_each_driver(
        "an_async_read_polled_with_new_wakers_keeps_one_listed",
        1,
        |driver| async move {
            use futures::io::AsyncRead;
            use std::sync::Arc;
            struct Counted;
            impl std::task::Wake for Counted {
                fn wake(self: Arc<Self>) {}
            }
            let (mut a, _b) = tcp_pair().await;
            let mut wakers = Vec::new();
            for _ in 0..1_000 {
                let w = Arc::new(Counted);
                let waker = std::task::Waker::from(w.clone());
                let mut buf = [0u8; 16];
                let r = std::pin::Pin::new(&mut a)
                    .poll_read(&mut std::task::Context::from_waker(&waker), &mut buf);
                assert!(r.is_pending());
                wakers.push(w);
            }
            let listed = wakers.iter().filter(|w| Arc::strong_count(w) > 1).count();
            assert!(listed <= 1, "[{driver}] {listed} wakers listed");
        },
    );
}

/// An owned `write_all` that waited behind a stalled write-behind send (`AsyncWrite`, a peer
/// that does not read) and timed out leaves the waiter list: with the stream left alive
/// (leaked here) and nobody waiting, `run()` still returns.
#[test]
fn run_returns_after_an_owned_write_behind_a_stalled_send_is_dropped() {
    each_driver(
        "run_returns_after_an_owned_write_behind_a_stalled_send_is_dropped",
        1,
        |b| b,
        |driver, exec| {
            exec.spawn_on(0, || async {
                use futures::io::AsyncWriteExt;
                let (mut a, b) = tcp_pair().await;
                set_sockopt(&a, libc::SO_SNDBUF, 4096 as libc::c_int);
                set_sockopt(&b, libc::SO_RCVBUF, 4096 as libc::c_int);
                // Far more than the two socket buffers hold: on io_uring the write-behind
                // send stays in the kernel; on epoll the write just takes what fits.
                let n = AsyncWriteExt::write(&mut a, &[7u8; 1 << 20]).await.unwrap();
                assert!(n > 0);
                let waited =
                    xtc_shards::time::timeout(Duration::from_millis(5), a.write_all(vec![1u8; 8]))
                        .await;
                assert!(waited.is_err(), "the owned write did not wait");
                std::mem::forget(a);
                std::mem::forget(b);
            })
            .unwrap();
            common::run_or_fail(exec, Duration::from_secs(30), "a dropped owned write")
                .unwrap_or_else(|e| panic!("[{driver}]: {e}"));
        },
    );
}

/// Two owned reads in flight: the first gets "hello", the second the peer's reset; both are
/// dropped, in either order. The stream still reads "hello", then the reset, then the end:
/// the error is neither lost (a cut stream looking cleanly ended) nor reported before bytes
/// received ahead of it.
#[test]
fn a_dropped_reads_reset_comes_after_the_bytes_before_it() {
    on_each_driver(
        "a_dropped_reads_reset_comes_after_the_bytes_before_it",
        1,
        |driver| async move {
            if driver == xtc_shards::io::Driver::Epoll {
                // epoll reads in the poll: no read is ever in flight to be dropped.
                return;
            }
            for order in 0..2 {
                let (a, b) = tcp_pair().await;
                let mut first = Box::pin(a.read(Vec::with_capacity(64)));
                let mut second = Box::pin(a.read(Vec::with_capacity(64)));
                poll_pending(first.as_mut()).await;
                poll_pending(second.as_mut()).await;
                b.write_all(b"hello".to_vec()).await.0.unwrap();
                sleep(Duration::from_millis(5)).await;
                // A reset: linger 0, then close.
                let linger = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                set_sockopt(&b, libc::SO_LINGER, linger);
                drop(b);
                sleep(Duration::from_millis(5)).await;
                if order == 0 {
                    drop(second);
                    drop(first);
                } else {
                    drop(first);
                    drop(second);
                }
                let mut seen = Vec::new();
                for _ in 0..3 {
                    let (r, buf) = guard("a read", a.read(Vec::with_capacity(64))).await;
                    match r {
                        Ok(0) => {
                            seen.push("end".to_string());
                            break;
                        }
                        Ok(_) => seen.push(String::from_utf8_lossy(&buf).into_owned()),
                        Err(e) => seen.push(format!("{:?}", e.kind())),
                    }
                }
                assert_eq!(
                    seen,
                    ["hello", "ConnectionReset", "end"],
                    "[{driver}] drop order {order}"
                );
            }
        },
    );
}

/// A stream that outlives its loop's driver (returned from `LocalExecutor::block_on`, used
/// in the next one) with a kept receive whose bytes arrived before the driver went: the next
/// read returns those bytes. The driver's shutdown used to keep the result to itself, so the
/// read failed with `ECANCELED` and the bytes were gone.
#[test]
fn a_kept_read_that_outlives_its_driver_still_hands_over_its_bytes() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, b) = ex.block_on(async {
        let (a, b) = UnixStream::pair().unwrap();
        poll_once_then_drop(a.read(Vec::with_capacity(16)), async {}).await;
        let (r, _) = b.write_all(b"hello".to_vec()).await;
        r.unwrap();
        sleep(Duration::from_millis(50)).await; // the kept receive completes and is reaped
        (a, b)
    });
    let (r, buf) = ex.block_on(async move {
        let r = guard("read in the next block_on", a.read(Vec::with_capacity(16))).await;
        drop(b);
        r
    });
    let n = r.unwrap_or_else(|e| panic!("read after the driver changed: {e}"));
    assert_eq!(&buf[..n], b"hello");
}

/// The same through `AsyncRead`, whose receive in flight outlives the driver.
#[test]
fn an_async_read_that_outlives_its_driver_still_hands_over_its_bytes() {
    use futures::io::AsyncReadExt;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut a, b) = ex.block_on(async {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut tmp = [0u8; 16];
        poll_once_then_drop(AsyncReadExt::read(&mut a, &mut tmp), async {}).await;
        let (r, _) = b.write_all(b"hello".to_vec()).await;
        r.unwrap();
        sleep(Duration::from_millis(50)).await;
        (a, b)
    });
    let got = ex.block_on(async move {
        let mut tmp = [0u8; 16];
        let r = guard(
            "AsyncRead in the next block_on",
            AsyncReadExt::read(&mut a, &mut tmp),
        );
        let n = r
            .await
            .unwrap_or_else(|e| panic!("AsyncRead after the driver changed: {e}"));
        drop(b);
        tmp[..n].to_vec()
    });
    assert_eq!(got, b"hello");
}

/// A write-behind send the kernel completed before the driver went: the next `flush` (in the
/// next `block_on`) succeeds. It used to report `ECANCELED` for bytes the peer had received.
#[test]
fn a_write_behind_that_outlives_its_driver_flushes_cleanly() {
    use futures::io::AsyncWriteExt;
    use std::io::Read as _;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut a, b) = ex.block_on(async {
        let (mut a, b) = UnixStream::pair().unwrap();
        AsyncWriteExt::write(&mut a, b"x").await.unwrap();
        sleep(Duration::from_millis(20)).await; // the send completes in the kernel
        (a, b)
    });
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    let mut got = [0u8; 1];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"x");
    ex.block_on(async move { guard("flush", AsyncWriteExt::flush(&mut a)).await })
        .unwrap_or_else(|e| panic!("flush of a delivered write: {e}"));
}

/// A kept receive that nothing arrived for before its driver went (the shutdown cancelled it):
/// the next read, in the next `block_on`, waits for data as any read does, rather than
/// reporting the shutdown's `ECANCELED`.
#[test]
fn a_kept_read_cancelled_by_its_drivers_shutdown_is_not_an_error() {
    use futures::io::AsyncReadExt;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, mut c, b, d) = ex.block_on(async {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut c, d) = UnixStream::pair().unwrap();
        poll_once_then_drop(a.read(Vec::with_capacity(16)), async {}).await;
        let mut tmp = [0u8; 16];
        poll_once_then_drop(AsyncReadExt::read(&mut c, &mut tmp), async {}).await;
        (a, c, b, d)
    });
    let (owned, via_trait) = ex.block_on(async move {
        let (r, _) = b.write_all(b"late".to_vec()).await;
        r.unwrap();
        let (r, _) = d.write_all(b"late".to_vec()).await;
        r.unwrap();
        let (r, buf) = guard("owned read", a.read(Vec::with_capacity(16))).await;
        let owned = r.map(|n| buf[..n].to_vec());
        let mut tmp = [0u8; 16];
        let via_trait = guard("AsyncRead", AsyncReadExt::read(&mut c, &mut tmp))
            .await
            .map(|n| tmp[..n].to_vec());
        (owned, via_trait)
    });
    assert_eq!(owned.unwrap(), b"late");
    assert_eq!(via_trait.unwrap(), b"late");
}

/// Fills `a`'s socket (`fill`), then writes `b"tail"` through `AsyncWrite`: on io_uring it is
/// reported written at once, its send waiting for room that never comes in this run; on
/// epoll (no write-behind) the write itself waits, and times out unwritten. The bytes filled
/// and the tail's bytes reported written (4 or 0).
async fn fill_then_write_tail(a: &mut UnixStream) -> (usize, usize) {
    let filled = fill(a);
    let tail = xtc_shards::time::timeout(
        Duration::from_millis(100),
        futures::io::AsyncWriteExt::write(a, b"tail"),
    )
    .await
    .map_or(0, |n| n.unwrap());
    assert!(tail == 4 || tail == 0, "{tail}");
    (filled, tail)
}

/// A write-behind send that found the socket full (the peer not reading) when its driver
/// went: the shutdown cancels it before it sent anything (`ECANCELED`). In the next
/// `block_on`, `shutdown(Write)` still refuses to overtake it, and `flush` sends it again, so
/// the peer gets every byte reported written, once. The flush used to fail with `ECANCELED`;
/// then, once it resent, the shutdown took the `ECANCELED` for a failed send and let the FIN
/// go out first.
#[test]
fn a_write_behind_cancelled_by_its_drivers_shutdown_is_sent_again_before_the_fin() {
    use futures::io::AsyncWriteExt;
    use std::io::Read as _;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut a, b, filled, tail) = ex.block_on(async {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (filled, tail) = fill_then_write_tail(&mut a).await;
        (a, b, filled, tail)
    });
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        b.read_to_end(&mut all).unwrap();
        all
    });
    let shut = ex.block_on(async move {
        // Refused with WouldBlock while AsyncWrite bytes are unsent (documented).
        let shut = a.shutdown(std::net::Shutdown::Write);
        guard("flush", AsyncWriteExt::flush(&mut a))
            .await
            .unwrap_or_else(|e| panic!("flush after the driver changed: {e}"));
        AsyncWriteExt::close(&mut a).await.unwrap();
        shut
    });
    let all = reader.join().unwrap();
    if tail > 0 {
        assert!(
            shut.is_err(),
            "shutdown(Write) went out ahead of unsent bytes"
        );
    }
    assert_eq!(all.len(), filled + tail, "bytes lost or sent twice");
    assert!(all[..filled].iter().all(|&x| x == 0));
    assert_eq!(&all[filled..], &b"tail"[..tail]);
}

type ReadFut = std::pin::Pin<Box<dyn Future<Output = std::io::Result<Vec<u8>>>>>;

/// Reads `a` into `seen` until it holds `len` bytes; the stream must not end first.
async fn read_up_to(a: &UnixStream, seen: &mut Vec<u8>, len: usize) {
    while seen.len() < len {
        let (r, got) = guard("a read", a.read(Vec::with_capacity(16))).await;
        let n = r.unwrap();
        assert_ne!(n, 0, "the stream ended early");
        seen.extend_from_slice(&got[..n]);
    }
}

fn owned_read(s: &std::rc::Rc<UnixStream>) -> ReadFut {
    let s = s.clone();
    Box::pin(async move {
        let (r, b) = s.read(Vec::with_capacity(16)).await;
        r.map(|n| b[..n].to_vec())
    })
}

/// Two owned reads of one stream in flight when their driver goes (both cancelled by its
/// shutdown: nothing received). In the next `block_on`, the first is dropped while the other
/// is still in flight: its `ECANCELED` is no error of the stream's. It was stashed as one, and
/// a later read of the healthy stream failed with it.
#[test]
fn a_read_cancelled_by_its_drivers_shutdown_is_not_stashed_as_a_stream_error() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, b, f1, f2) = ex.block_on(async {
        let (a, b) = UnixStream::pair().unwrap();
        let a = std::rc::Rc::new(a);
        let mut f1 = owned_read(&a);
        let mut f2 = owned_read(&a);
        let pending = poll_fn(|cx| {
            Poll::Ready(f1.as_mut().poll(cx).is_pending() && f2.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(pending);
        xtc_shards::yield_now().await; // submitted
        (a, b, f1, f2)
    });
    let (r3, r4) = ex.block_on(async move {
        drop(f1); // f2 in flight: not kept, its (orphan) result taken now
        drop(f2); // the last: kept
        let (w, _) = b.write_all(b"hello".to_vec()).await;
        w.unwrap();
        let r3 = guard("read 3", owned_read(&a)).await;
        let (w, _) = b.write_all(b"world".to_vec()).await;
        w.unwrap();
        let r4 = guard("read 4", owned_read(&a)).await;
        (r3, r4)
    });
    assert_eq!(r3.unwrap(), b"hello");
    assert_eq!(r4.expect("a spurious error on a healthy stream"), b"world");
}

/// An owned read still awaited (not dropped) when its `block_on` returns, and awaited to its
/// end in the next one: it gets the bytes sent meanwhile, as on epoll. On io_uring the
/// driver's shutdown cancels its receive (nothing received), and it failed with that
/// `ECANCELED`; it is submitted again on the new loop now.
#[test]
fn a_read_future_that_outlives_its_driver_still_reads() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, b, mut f) = ex.block_on(async {
        let (a, b) = UnixStream::pair().unwrap();
        let a = std::rc::Rc::new(a);
        let mut f = owned_read(&a);
        poll_pending(f.as_mut()).await;
        xtc_shards::yield_now().await; // submitted
        (a, b, f)
    });
    let r = ex.block_on(async move {
        let (w, _) = b.write_all(b"hello".to_vec()).await;
        w.unwrap();
        let r = guard("read", f.as_mut()).await;
        drop(a);
        r
    });
    assert_eq!(r.expect("a read awaited across block_on"), b"hello");
}

type WriteFut = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>>>>;

/// Fills `a`'s socket (`fill`), then starts an owned `write` (`all`: `write_all`) of
/// `b"tail"`, which waits for room that never comes in this run: its future, polled once,
/// and the bytes filled.
async fn fill_then_owned_write(a: &std::rc::Rc<UnixStream>, all: bool) -> (WriteFut, usize) {
    let filled = fill(&**a);
    let a = a.clone();
    let mut f: WriteFut = Box::pin(async move {
        if all {
            a.write_all(b"tail".to_vec()).await.0
        } else {
            let (r, _) = a.write(b"tail".to_vec()).await;
            assert_eq!(r?, 4, "a short send of 4 bytes");
            Ok(())
        }
    });
    poll_pending(f.as_mut()).await;
    xtc_shards::yield_now().await; // submitted
    (f, filled)
}

/// Owned `write` and `write_all` still awaited when their `block_on` returns, their sockets
/// full: awaited to their end in the next `block_on` while the peers read, they send their
/// bytes once, as on epoll. On io_uring the driver's shutdown cancels their sends (nothing
/// sent), and they failed with that `ECANCELED`; they are submitted again on the new loop now.
#[test]
fn owned_writes_that_outlive_their_driver_still_send() {
    use std::io::Read as _;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (streams, writes) = ex.block_on(async {
        let mut streams = Vec::new();
        let mut writes = Vec::new();
        for all in [false, true] {
            let (a, b) = UnixStream::pair().unwrap();
            let a = std::rc::Rc::new(a);
            let (f, filled) = fill_then_owned_write(&a, all).await;
            streams.push((a, b, filled));
            writes.push(f);
        }
        (streams, writes)
    });
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (a, b, filled) in streams {
        let mut b = b.into_std().unwrap();
        b.set_nonblocking(false).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        readers.push((
            filled,
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let r = b.read_to_end(&mut all);
                (r.map_err(|e| e.to_string()), all)
            }),
        ));
        writers.push(a);
    }
    let results = ex.block_on(async move {
        let mut results = Vec::new();
        for f in writes {
            results.push(guard("owned write", f).await);
        }
        drop(writers); // the peers see the end of the stream
        results
    });
    for (i, ((filled, reader), r)) in readers.into_iter().zip(results).enumerate() {
        let what = ["write", "write_all"][i];
        r.unwrap_or_else(|e| panic!("{what} awaited across block_on: {e}"));
        let (r, all) = reader.join().unwrap();
        r.expect("read to end");
        assert_eq!(all.len(), filled + 4, "{what}: bytes lost or sent twice");
        assert_eq!(&all[filled..], b"tail", "{what}");
    }
}

/// A `recv_from` still awaited (not dropped) when its `block_on` returns, awaited to its end
/// in the next one: it gets the datagram sent meanwhile, as on epoll. On io_uring it failed
/// with the driver shutdown's `ECANCELED` (nothing received).
#[test]
fn a_recv_from_that_outlives_its_driver_still_receives() {
    type RecvFut = std::pin::Pin<Box<dyn Future<Output = std::io::Result<Vec<u8>>>>>;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (addr, mut f) = ex.block_on(async {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let mut f: RecvFut = Box::pin(async move {
            let (r, b) = s.recv_from(Vec::with_capacity(64)).await;
            r.map(|(n, _)| b[..n].to_vec())
        });
        poll_pending(f.as_mut()).await;
        xtc_shards::yield_now().await; // submitted
        (addr, f)
    });
    let r = ex.block_on(async move {
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(b"dgram", addr).unwrap();
        guard("recv_from", f.as_mut()).await
    });
    assert_eq!(r.expect("a recv_from awaited across block_on"), b"dgram");
}

/// A `recv_from` whose datagram ("one") its driver reaped is carried into the next
/// `block_on` and dropped there while another `recv_from` waits on the new driver, which then
/// takes "two": the datagrams come out in the order the socket gave them. Kept results are
/// placed by (driver id, place), but the waiting call compared its own result only with kept
/// ones of its own driver, so "two" came out before the earlier driver's "one".
#[test]
fn a_datagram_kept_from_an_earlier_driver_comes_before_a_waiting_recv_froms_own() {
    type RecvFut = Pin<Box<dyn Future<Output = std::io::Result<Vec<u8>>>>>;
    fn recv(s: &Rc<UdpSocket>) -> RecvFut {
        let s = s.clone();
        Box::pin(async move {
            let (r, b) = s.recv_from(Vec::with_capacity(64)).await;
            r.map(|(n, _)| b[..n].to_vec())
        })
    }
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (s, addr, first) = ex.block_on(async {
        let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let addr = s.local_addr().unwrap();
        let mut first = recv(&s);
        poll_pending(first.as_mut()).await;
        sleep(Duration::from_millis(5)).await; // in the kernel
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(b"one", addr).unwrap();
        sleep(Duration::from_millis(5)).await; // received and reaped; not polled again
        (s, addr, first)
    });
    let got = ex.block_on(async move {
        let mut second = recv(&s);
        // On epoll "one" is still in the socket (nothing took it), and this takes it at once.
        let mut early = None;
        poll_fn(|cx| {
            if let Poll::Ready(r) = second.as_mut().poll(cx) {
                early = Some(r);
            }
            Poll::Ready(())
        })
        .await;
        sleep(Duration::from_millis(5)).await; // in the kernel
        drop(first); // its "one" is kept (io_uring)
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(b"two", addr).unwrap();
        let a = match early {
            Some(r) => r.unwrap(),
            None => guard("the waiting recv_from", second).await.unwrap(),
        };
        let b = guard("the next recv_from", recv(&s)).await.unwrap();
        [a, b]
    });
    assert_eq!(
        got,
        [b"one".to_vec(), b"two".to_vec()],
        "datagrams came out of the socket's order"
    );
}

/// An `accept` still awaited when its `block_on` returns, awaited to its end in the next one:
/// it takes the connection made meanwhile, as on epoll. On io_uring it failed with the driver
/// shutdown's `ECANCELED` (no connection taken).
#[test]
fn an_accept_that_outlives_its_driver_still_accepts() {
    type AcceptFut = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>>>>;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (addr, mut f) = ex.block_on(async {
        let l = xtc_shards::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut f: AcceptFut = Box::pin(async move { l.accept().await.map(drop) });
        poll_pending(f.as_mut()).await;
        xtc_shards::yield_now().await; // submitted
        (addr, f)
    });
    let r = ex.block_on(async move {
        let c = std::net::TcpStream::connect(addr).unwrap();
        let r = guard("accept", f.as_mut()).await;
        drop(c);
        r
    });
    r.expect("an accept awaited across block_on");
}

/// A UDP socket's kept receive (a `recv_from` dropped while waiting) cancelled by its
/// driver's shutdown: the next `recv_from`, in the next `block_on`, receives the datagram sent
/// to it. It failed with `ECANCELED`.
#[test]
fn a_kept_udp_receive_cancelled_by_its_drivers_shutdown_is_not_an_error() {
    use xtc_shards::net::UdpSocket;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let sock = ex.block_on(async {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut f = Box::pin(s.recv_from(Vec::with_capacity(64)));
        let pending = poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx).is_pending())).await;
        assert!(pending);
        xtc_shards::yield_now().await;
        drop(f); // the only receive: kept by the socket
        s
    });
    let addr = sock.local_addr().unwrap();
    let r = ex.block_on(async move {
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(b"dgram", addr).unwrap();
        let (r, b) = guard("recv_from", sock.recv_from(Vec::with_capacity(64))).await;
        r.map(|(n, _)| b[..n].to_vec())
    });
    assert_eq!(r.expect("recv_from after the driver changed"), b"dgram");
}

/// The same send, the stream then dropped (without a flush) in the next `block_on`: the bytes
/// `poll_write` reported written still reach the peer, as a dropped stream's send does (it is
/// detached). The drop used to free the cancelled send's buffer, and the peer saw the stream
/// end without them.
#[test]
fn a_cancelled_write_behind_is_delivered_when_the_stream_is_dropped_in_the_next_loop() {
    use std::io::Read as _;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut a, b, filled, tail) = ex.block_on(async {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (filled, tail) = fill_then_write_tail(&mut a).await;
        (a, b, filled, tail)
    });
    let _ = &mut a;
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let r = b.read_to_end(&mut all);
        (r.map_err(|e| e.to_string()), all)
    });
    ex.block_on(async move {
        // Dropped in a live loop, without flush: the write-behind bytes must still go
        // (detached), as they do for a stream whose send was never cancelled.
        drop(a);
        xtc_shards::time::sleep(Duration::from_millis(500)).await;
    });
    let (r, all) = reader.join().unwrap();
    r.expect("read to end");
    assert_eq!(all.len(), filled + tail, "bytes reported written were lost");
    assert_eq!(&all[filled..], &b"tail"[..tail]);
}

/// A waker's clone is user code too: here one that drops another pending accept of this loop,
/// whose drop cancels its operation. The driver cloned the waker while it held its own state
/// borrowed (io_uring's operation slots, epoll's waiter lists), and the cancel borrowed it
/// again ("already borrowed"); now it clones first.
#[test]
fn a_wakers_clone_that_drops_another_operation_runs_outside_the_drivers_borrow() {
    on_each_driver(
        "a_wakers_clone_that_drops_another_operation_runs_outside_the_drivers_borrow",
        1,
        |driver| async move {
            let a = TcpListener::bind("127.0.0.1:0").unwrap();
            let b = TcpListener::bind("127.0.0.1:0").unwrap();
            let a = std::rc::Rc::new(a);
            let other = {
                let a = a.clone();
                Box::pin(async move { a.accept().await.map(|_| ()) })
            };
            let mut other: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>>>> = other;
            poll_pending(other.as_mut()).await;
            let other = std::rc::Rc::new(std::cell::RefCell::new(Some(other)));
            let dropped = other.clone();
            let waker = common::hooked_waker(move || drop(dropped.borrow_mut().take()));
            let mut mine = Box::pin(b.accept());
            let polled = common::poll_caught(mine.as_mut(), &waker);
            assert!(
                matches!(polled, Ok(true)),
                "[{driver}] the accept's poll panicked"
            );
            assert!(other.borrow().is_none(), "[{driver}] the clone ran");
        },
    );
}

/// A waker's clone is user code that may use the stream being waited on: here an owned
/// `write` waits for the `AsyncWrite` bytes still being sent (io_uring write-behind), and the
/// clone shuts the stream down. The clone ran while the stream's state was borrowed ("already
/// mutably borrowed").
#[test]
fn a_wakers_clone_under_a_write_behind_wait_may_use_the_stream() {
    on_each_driver(
        "a_wakers_clone_under_a_write_behind_wait_may_use_the_stream",
        1,
        |driver| async move {
            let (mut a, _b) = UnixStream::pair().unwrap();
            fill(&a);
            // io_uring: reported written at once, its send waiting for room (write-behind);
            // epoll: it waits, and the timeout drops it unwritten.
            let _ = xtc_shards::time::timeout(
                Duration::from_millis(100),
                futures::io::AsyncWriteExt::write(&mut a, b"tail"),
            )
            .await;
            let a = std::rc::Rc::new(a);
            let user = a.clone();
            let ran = std::rc::Rc::new(std::cell::Cell::new(false));
            let ran_in_clone = ran.clone();
            let waker = common::hooked_waker(move || {
                ran_in_clone.set(true);
                let _ = user.shutdown(std::net::Shutdown::Write);
            });
            let mut w = Box::pin(a.write(b"x".to_vec()));
            let polled = common::poll_caught(w.as_mut(), &waker);
            assert!(polled.is_ok(), "[{driver}] the write's poll panicked");
            assert!(ran.get(), "[{driver}] the clone ran");
            common::forget(w);
        },
    );
}

thread_local! {
    /// Whether the waker of `recording_waker` was woken.
    static WOKEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`common::hooked_waker`] that also records its wake in [`WOKEN`].
fn recording_waker(hook: impl FnOnce() + 'static) -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    let hooked = common::hooked_waker(hook);
    fn clone(p: *const ()) -> RawWaker {
        // SAFETY: `p` is the hooked waker's `Waker`, boxed and leaked below for the test.
        let inner = unsafe { &*(p as *const Waker) };
        drop(inner.clone()); // runs the hook
        RawWaker::new(p, &VTABLE)
    }
    fn wake(_: *const ()) {
        WOKEN.with(|w| w.set(true));
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, noop);
    WOKEN.with(|w| w.set(false));
    let inner: &'static Waker = common::leak(hooked);
    // SAFETY: the data pointer is a leaked, never-freed `Waker`; the vtable's functions only
    // read it.
    unsafe { Waker::from_raw(RawWaker::new((inner as *const Waker).cast(), &VTABLE)) }
}

/// An owned `write` waiting behind an `AsyncWrite` send (io_uring write-behind) lists its
/// waker with the send's waiters; the clone for the list is user code, here one that makes
/// room for the send and then reaps the driver (a `shutdown` of another stream), so the send
/// completes while the task is not listed yet. Its wake found nobody, and the task was listed
/// after it, on a list nothing would wake again: the write hung. Now the task is woken.
#[test]
fn a_send_completed_while_the_waker_is_cloned_still_wakes_the_task() {
    use futures::io::AsyncWriteExt;
    on_each_driver(
        "a_send_completed_while_the_waker_is_cloned_still_wakes_the_task",
        1,
        |driver| async move {
            if driver != xtc_shards::io::Driver::IoUring {
                return; // no write-behind on epoll
            }
            let (a_std, mut a_peer) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut a = UnixStream::from_std(a_std).unwrap();
            let (mut b, _b_peer) = UnixStream::pair().unwrap();
            let mut a_peer_reader = a_peer.try_clone().unwrap();
            fill(&a);
            fill(&b);
            // Both: reported written at once, the send waiting for room (write-behind).
            assert_eq!(AsyncWriteExt::write(&mut a, b"tail").await.unwrap(), 4);
            assert_eq!(AsyncWriteExt::write(&mut b, b"tail").await.unwrap(), 4);
            xtc_shards::yield_now().await; // submitted
            let waker = recording_waker(move || {
                use std::io::Read as _;
                // Room for `a`'s send: drain its peer...
                a_peer.set_nonblocking(true).unwrap();
                let mut sink = [0u8; 65536];
                while a_peer.read(&mut sink).is_ok_and(|n| n > 0) {}
                std::thread::sleep(Duration::from_millis(50));
                // ...then reap the driver: `b`'s shutdown is refused (bytes behind), but it
                // reaps, and `a`'s completion is dispatched.
                for _ in 0..5 {
                    let _ = b.shutdown(std::net::Shutdown::Write);
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let a = std::rc::Rc::new(a);
            let mut w = Box::pin(a.write(b"x".to_vec()));
            let first = w.as_mut().poll(&mut std::task::Context::from_waker(&waker));
            assert!(first.is_pending(), "pending at first");
            // Let the loop turn and reap whatever comes.
            sleep(Duration::from_millis(300)).await;
            let woken = WOKEN.with(std::cell::Cell::get);
            // Did the send the write waited for complete? Its "tail" reached the peer.
            let mut got = Vec::new();
            {
                use std::io::Read as _;
                let mut sink = [0u8; 65536];
                while let Ok(n) = a_peer_reader.read(&mut sink) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&sink[..n]);
                }
            }
            assert!(
                woken || !got.ends_with(b"tail"),
                "lost wake-up: the send the write waited for completed, but its task was never \
                 woken"
            );
            common::forget(w);
        },
    );
}

/// What an [`armed_waker`]'s next clone runs, once set.
type Hook = Rc<RefCell<Option<Box<dyn FnOnce()>>>>;

/// A waker that wakes `inner` (recording it in `woken`) and whose clones, once `hook` holds a
/// closure, run it (once): armed when the test says so.
fn armed_waker(inner: Waker, woken: Rc<Cell<bool>>, hook: Hook) -> Waker {
    struct Armed {
        inner: Waker,
        hook: Hook,
        woken: Rc<Cell<bool>>,
    }
    fn clone(p: *const ()) -> RawWaker {
        // SAFETY: `p` is the leaked `Armed` below.
        let w = unsafe { &*(p as *const Armed) };
        let hook = w.hook.borrow_mut().take();
        if let Some(hook) = hook {
            hook();
        }
        RawWaker::new(p, &VTABLE)
    }
    fn wake(p: *const ()) {
        // SAFETY: as in `clone`.
        let w = unsafe { &*(p as *const Armed) };
        w.woken.set(true);
        w.inner.wake_by_ref();
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, noop);
    let w: &'static Armed = common::leak(Armed { inner, hook, woken });
    // SAFETY: the data pointer is a leaked, never-freed `Armed`, used on this thread only.
    unsafe { Waker::from_raw(RawWaker::new((w as *const Armed).cast(), &VTABLE)) }
}

/// Leaves a kept read on `a` (io_uring): an owned read polled once, submitted, and dropped.
async fn keep_a_read(a: &impl Stream) {
    poll_once_then_drop(
        a.read(Vec::with_capacity(64)),
        sleep(Duration::from_millis(2)),
    )
    .await;
}

/// Waits until `woken` is set by the waker under test (`HANG` at most, a hang guard); whether
/// it was.
async fn woken_in_time(woken: &Cell<bool>) -> bool {
    let set = poll_fn(|_| {
        if woken.get() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    xtc_shards::time::timeout(io_common::HANG, set)
        .await
        .is_ok()
}

/// Two owned reads wait behind a kept (dropped) read of the stream. The second one's waker
/// clone, run by `Listing::finish` after the borrow, drops the first: its `BehindWait` leaves
/// the list, finds it empty (the second is not listed yet) and unwaits the kept receive. The
/// second was then listed on a list whose operation woke nobody: its read hung. Now the
/// emptying counts as a wake, and the second polls again.
#[test]
fn a_read_listed_after_its_clone_emptied_the_list_is_woken() {
    on_each_driver(
        "a_read_listed_after_its_clone_emptied_the_list_is_woken",
        1,
        |driver| async move {
            if driver != xtc_shards::io::Driver::IoUring {
                return; // no shared operations on epoll
            }
            let (a, b) = UnixStream::pair().unwrap();
            let a = Rc::new(a);
            keep_a_read(&a).await;
            // F2: waits behind the kept read, listed with the task's waker.
            let a2 = a.clone();
            let mut f2: Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
                let _ = a2.read(Vec::with_capacity(64)).await;
            });
            poll_pending(f2.as_mut()).await;
            let f2 = Rc::new(RefCell::new(Some(f2)));
            // F1: polled with a waker whose clone drops F2.
            let mut f1 = Box::pin(a.read(Vec::with_capacity(64)));
            let woken = Rc::new(Cell::new(false));
            let first = poll_fn(|cx| {
                let dropped = f2.clone();
                let hook: Hook = Rc::new(RefCell::new(Some(Box::new(move || {
                    drop(dropped.borrow_mut().take())
                }))));
                let w = armed_waker(cx.waker().clone(), woken.clone(), hook);
                Poll::Ready(f1.as_mut().poll(&mut Context::from_waker(&w)).is_pending())
            })
            .await;
            assert!(first, "F1 pending at first");
            assert!(f2.borrow().is_none(), "the clone dropped F2");
            // Data for the kept read: its completion must wake F1's waker.
            let (w, _) = b.write_all(b"hello".to_vec()).await;
            w.unwrap();
            assert!(
                woken_in_time(&woken).await,
                "lost wake-up: the read F1 waited for completed, F1's waker never woken"
            );
            let (r, got) = f1.await;
            assert_eq!((r.unwrap(), &got[..]), (5, &b"hello"[..]));
        },
    );
}

/// Two owned reads of one task (one waker, one list entry) wait behind a kept receive; one of
/// them is then handed to another task and polled there (`BehindWait::note`: a new waker).
/// `note` left the old waker's entry, the one the other read relied on, without waking it:
/// the kept receive's completion woke only the moved read's task, and the read left in the
/// first task slept for ever, even as more bytes arrived. Entries now count their waits.
#[test]
fn a_read_whose_sibling_moved_to_another_waker_is_still_woken() {
    on_each_driver(
        "a_read_whose_sibling_moved_to_another_waker_is_still_woken",
        1,
        |driver| async move {
            if driver != xtc_shards::io::Driver::IoUring {
                return; // no shared operations on epoll
            }
            let (a, b) = UnixStream::pair().unwrap();
            let a = Rc::new(a);
            keep_a_read(&a).await;
            let (a1, a2) = (a.clone(), a.clone());
            let first = spawn_local(async move {
                let mut moved: Pin<Box<dyn Future<Output = Vec<u8>>>> = Box::pin(async move {
                    let (r, got) = a1.read(Vec::with_capacity(64)).await;
                    r.unwrap();
                    got
                });
                let mut stays = Box::pin(async move {
                    let (r, got) = a2.read(Vec::with_capacity(64)).await;
                    r.unwrap();
                    got
                });
                // Both wait behind the kept read, listed under this task's waker.
                poll_pending(moved.as_mut()).await;
                poll_pending(stays.as_mut()).await;
                // One goes on in another task, polled there with that task's waker.
                let other = spawn_local(moved);
                let mine = stays.await;
                (mine, other.await.unwrap())
            });
            sleep(Duration::from_millis(20)).await;
            let (w, _) = b.write_all(b"hello".to_vec()).await;
            w.unwrap();
            sleep(Duration::from_millis(20)).await;
            let (w, _) = b.write_all(b"world".to_vec()).await;
            w.unwrap();
            let got = xtc_shards::time::timeout(io_common::HANG, first).await;
            let (x, y) = got
                .expect("lost wake-up: a read waiting behind the kept one was never woken")
                .unwrap();
            let mut both = vec![x, y];
            both.sort();
            assert_eq!(both, vec![b"hello".to_vec(), b"world".to_vec()]);
        },
    );
}

/// An owned read waiting behind a kept receive, polled with a new waker each time (a
/// combinator that makes one per poll, each waking the task): it must not keep its task
/// busy. (A `note` that woke the waker it leaves would re-poll it for ever.)
#[test]
fn an_owned_read_polled_with_new_wakers_does_not_spin() {
    on_each_driver(
        "an_owned_read_polled_with_new_wakers_does_not_spin",
        1,
        |driver| async move {
            use std::sync::Arc;
            struct Fwd(Waker);
            impl std::task::Wake for Fwd {
                fn wake(self: Arc<Self>) {
                    self.0.wake_by_ref();
                }
            }
            let (a, b) = UnixStream::pair().unwrap();
            let a = Rc::new(a);
            keep_a_read(&a).await;
            let polls = Rc::new(Cell::new(0usize));
            let (a2, p) = (a.clone(), polls.clone());
            let reader = spawn_local(async move {
                let mut read = std::pin::pin!(a2.read(Vec::with_capacity(64)));
                // Kept, so that each poll's waker is a new one (no address reused).
                let mut made = Vec::new();
                poll_fn(|cx| {
                    p.set(p.get() + 1);
                    let w = Waker::from(Arc::new(Fwd(cx.waker().clone())));
                    made.push(w.clone());
                    if p.get() == 1 {
                        cx.waker().wake_by_ref(); // one spurious wake-up: a second poll
                    }
                    read.as_mut().poll(&mut Context::from_waker(&w))
                })
                .await
            });
            sleep(Duration::from_millis(50)).await;
            let n = polls.get();
            let (w, _) = b.write_all(b"hello".to_vec()).await;
            w.unwrap();
            let (r, got) = guard("the read", reader).await.unwrap();
            assert_eq!((r.unwrap(), &got[..]), (5, &b"hello"[..]));
            assert!(n <= 5, "[{driver}] {n} polls of one waiting read");
        },
    );
}

/// Two owned reads of one waker wait behind a kept read. F2 is listed and counts on the
/// waker's entry; F1, polled with the same waker, finds the entry already there (no
/// `Listing`), and a clone of the waker made in that poll (user code) dropped F2: F2's release
/// took the entry's last count, removed it, emptied the list and unwaited the kept receive,
/// and F1, finding no entry to count on, was woken by nothing. F1's poll makes no clone any
/// more (a wait counts on the entry its poll found, by id); F2 is then dropped after it, and
/// F1, counting on the same entry, must still be woken.
#[test]
fn a_read_whose_notes_clone_drops_its_sibling_is_woken() {
    on_each_driver(
        "a_read_whose_notes_clone_drops_its_sibling_is_woken",
        1,
        |driver| async move {
            if driver != xtc_shards::io::Driver::IoUring {
                return; // no shared operations on epoll
            }
            let (a, b) = UnixStream::pair().unwrap();
            let a = Rc::new(a);
            keep_a_read(&a).await;
            let woken = Rc::new(Cell::new(false));
            let hook: Hook = Rc::new(RefCell::new(None));
            let task = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
            let w = armed_waker(task, woken.clone(), hook.clone());
            let a2 = a.clone();
            let f2: Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
                let _ = a2.read(Vec::with_capacity(64)).await;
            });
            let f2 = Rc::new(RefCell::new(Some(f2)));
            // F2 waits behind the kept read, listed under `w` (counted on its entry).
            let pending = f2
                .borrow_mut()
                .as_mut()
                .unwrap()
                .as_mut()
                .poll(&mut Context::from_waker(&w))
                .is_pending();
            assert!(pending, "F2 pending at first");
            // F1, same waker: already listed; `note`'s clone drops F2.
            let dropped = f2.clone();
            *hook.borrow_mut() = Some(Box::new(move || drop(dropped.borrow_mut().take())));
            let mut f1 = Box::pin(a.read(Vec::with_capacity(64)));
            let first = f1.as_mut().poll(&mut Context::from_waker(&w)).is_pending();
            assert!(first, "F1 pending at first");
            // Not by a clone in F1's poll (none is made): dropped now.
            drop(f2.borrow_mut().take());
            let (wr, _) = b.write_all(b"hello".to_vec()).await;
            wr.unwrap();
            assert!(
                woken_in_time(&woken).await,
                "lost wake-up: the read F1 waited for completed, F1's waker never woken"
            );
            let (r, got) = f1.await;
            assert_eq!((r.unwrap(), &got[..]), (5, &b"hello"[..]));
        },
    );
}

/// A waker each of whose clones is a new allocation (`will_wake` false between clones; the
/// `Waker` docs allow it). Wakes `inner`.
fn allocating_waker(inner: Waker) -> Waker {
    fn clone(p: *const ()) -> RawWaker {
        // SAFETY: `p` is a live `Box<Waker>` made below.
        let w = unsafe { &*(p as *const Waker) };
        RawWaker::new(Box::into_raw(Box::new(w.clone())).cast(), &VTABLE)
    }
    fn wake(p: *const ()) {
        // SAFETY: as in `clone`; consumed.
        unsafe { Box::from_raw(p as *mut Waker) }.wake();
    }
    fn wake_by_ref(p: *const ()) {
        // SAFETY: as in `clone`.
        unsafe { &*(p as *const Waker) }.wake_by_ref();
    }
    fn drop_it(p: *const ()) {
        // SAFETY: as in `clone`; consumed.
        drop(unsafe { Box::from_raw(p as *mut Waker) });
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_it);
    // SAFETY: the vtable above keeps the `Box<Waker>` contract.
    unsafe {
        Waker::from_raw(RawWaker::new(
            Box::into_raw(Box::new(inner)).cast(),
            &VTABLE,
        ))
    }
}

/// A read waiting behind a kept receive, polled with a waker whose clones never `will_wake`
/// each other, then dropped: its entry (a clone) was never matched by its count (another
/// clone), stayed with no count, and kept the kept receive waited for: `run()` never returned.
/// Counts now find their entry by id.
#[test]
fn run_returns_after_a_read_with_an_allocating_waker_is_dropped() {
    each_driver(
        "run_returns_after_a_read_with_an_allocating_waker_is_dropped",
        1,
        |b| b,
        |driver, exec| {
            exec.spawn_on(0, || async {
                let (a, b) = tcp_pair().await;
                keep_a_read(&a).await;
                {
                    let mut r = Box::pin(a.read(Vec::with_capacity(64)));
                    let task = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
                    let w = allocating_waker(task);
                    let _ = r.as_mut().poll(&mut Context::from_waker(&w));
                }
                std::mem::forget(a);
                std::mem::forget(b);
            })
            .unwrap();
            common::run_or_fail(exec, Duration::from_secs(10), "a dropped read's waker")
                .unwrap_or_else(|e| panic!("[{driver}]: {e}"));
        },
    );
}

thread_local! {
    /// A read future parked by the test, for [`DropsStash`] to drop.
    static STASH: RefCell<Option<Pin<Box<dyn Future<Output = ()>>>>> = const { RefCell::new(None) };
    /// An allocation made right after that drop: where a freed receive buffer would go again.
    static AFTER: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

const STASHED_CAP: usize = 512;

/// Drops `guard` on this thread while its loop is hidden (`context::off_loop`): queued in
/// another executor's task, swept when that executor is dropped here.
fn drop_in_a_sweep<G: Send + 'static>(guard: G) {
    let other = xtc_shards::Executor::builder().shards(1).build().unwrap();
    other
        .spawn_on(0, move || {
            let _guard = guard;
            async {}
        })
        .unwrap();
    drop(other);
}

/// `Send`, so it may ride in another executor's queued closure; its `Drop` drops the stashed
/// read of this thread and allocates a buffer of the same size at once.
struct DropsStash;

impl Drop for DropsStash {
    fn drop(&mut self) {
        drop(STASH.with(|s| s.borrow_mut().take()));
        AFTER.with(|a| *a.borrow_mut() = Some(vec![0xAA; STASHED_CAP]));
    }
}

/// An executor dropped inside a task sweeps its queued tasks with this thread's loop hidden
/// (`context::off_loop`), and their `Drop` is user code that may drop this loop's own I/O: a
/// read whose receive the kernel holds. The driver lookup saw no loop and took the operation
/// for an orphan of a driver that was gone: its buffer was freed with the receive still armed,
/// and the kernel then wrote the peer's bytes into whatever took that memory next.
#[test]
fn io_dropped_while_its_loop_is_hidden_is_cancelled_on_it() {
    on_each_driver(
        "io_dropped_while_its_loop_is_hidden_is_cancelled_on_it",
        1,
        |driver| async move {
            let (a_std, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            // Keeps the socket open once `a` closes its descriptor.
            let _a_dup = a_std.try_clone().unwrap();
            let a = UnixStream::from_std(a_std).unwrap();
            let mut read: Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
                let _ = a.read(Vec::<u8>::with_capacity(STASHED_CAP)).await;
            });
            poll_pending(read.as_mut()).await;
            // The loop parks: the receive reaches the kernel.
            sleep(Duration::from_millis(5)).await;
            STASH.with(|s| *s.borrow_mut() = Some(read));
            drop_in_a_sweep(DropsStash);
            let after = AFTER
                .with(|a| a.borrow_mut().take())
                .expect("the sweep ran the drop");
            std::io::Write::write_all(&mut b, &[b'K'; 64]).unwrap();
            sleep(Duration::from_millis(50)).await;
            let written = after.iter().filter(|&&c| c == b'K').count();
            assert_eq!(
                written, 0,
                "[{driver}] the kernel wrote {written} bytes into memory nobody lent it"
            );
        },
    );
}

thread_local! {
    /// Reads parked by the test, for [`DropsReads`] to drop in order.
    static READS: RefCell<Vec<Pin<Box<dyn Future<Output = ()>>>>> = const { RefCell::new(Vec::new()) };
    /// A pool of this loop's, for [`DropsPool`] to drop.
    static POOL: RefCell<Option<xtc_shards::io::FixedBufPool>> = const { RefCell::new(None) };
}

/// Drops the stashed reads, first to last.
struct DropsReads;

impl Drop for DropsReads {
    fn drop(&mut self) {
        for r in READS.with(|r| std::mem::take(&mut *r.borrow_mut())) {
            drop(r);
        }
    }
}

/// Drops the stashed pool.
struct DropsPool;

impl Drop for DropsPool {
    fn drop(&mut self) {
        drop(POOL.with(|p| p.borrow_mut().take()));
    }
}

/// Two owned reads of one stream, the second holding the receive that got the bytes, dropped
/// while their loop is hidden: the drop reaps first so that a completed receive keeps its
/// bytes for the next read. The reap saw no loop and did nothing, the completed receive was
/// dropped as if in flight, and its bytes were lost.
#[test]
fn reads_dropped_while_their_loop_is_hidden_keep_their_bytes() {
    on_each_driver(
        "reads_dropped_while_their_loop_is_hidden_keep_their_bytes",
        1,
        |driver| async move {
            let (a_std, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            let a = Rc::new(UnixStream::from_std(a_std).unwrap());
            let read = |a: Rc<UnixStream>| -> Pin<Box<dyn Future<Output = ()>>> {
                Box::pin(async move {
                    let _ = a.read(Vec::<u8>::with_capacity(64)).await;
                })
            };
            let (mut r1, mut r2) = (read(a.clone()), read(a.clone()));
            poll_pending(r1.as_mut()).await;
            sleep(Duration::from_millis(5)).await;
            poll_pending(r2.as_mut()).await;
            sleep(Duration::from_millis(5)).await;
            // Completed in the kernel's queue, not reaped yet.
            std::io::Write::write_all(&mut b, b"hello").unwrap();
            READS.with(|r| *r.borrow_mut() = vec![r2, r1]);
            drop_in_a_sweep(DropsReads);
            let (n, buf) =
                xtc_shards::time::timeout(io_common::HANG, a.read(Vec::<u8>::with_capacity(64)))
                    .await
                    .unwrap_or_else(|_| panic!("[{driver}] the bytes were lost"));
            assert_eq!(&buf[..n.unwrap()], b"hello", "[{driver}]");
        },
    );
}

thread_local! {
    /// A socket of this loop, for [`RecvsFromStash`] to receive on.
    static UDP: RefCell<Option<Rc<UdpSocket>>> = const { RefCell::new(None) };
    /// What that receive's first poll gave.
    static RECV_OUTCOME: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Polls a `recv_from` of the stashed socket once and records what it gave.
struct RecvsFromStash;

impl Drop for RecvsFromStash {
    fn drop(&mut self) {
        let s = UDP.with(|u| u.borrow_mut().take()).expect("stashed");
        let mut fut = Box::pin(s.recv_from(vec![0u8; 16]));
        let outcome = match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Pending => "pending".to_string(),
            Poll::Ready((Ok((n, _)), _)) => format!("a datagram of {n} bytes"),
            Poll::Ready((Err(e), _)) => format!("error: {e}"),
        };
        RECV_OUTCOME.with(|o| *o.borrow_mut() = Some(outcome));
    }
}

/// A `recv_from` made while its loop is hidden (a `Drop` run by another executor's sweep),
/// with a receive a dropped `recv_from` left kept and still in the kernel: it took the kept
/// receive over and waited for it, on a loop that does not turn until the section ends (a
/// `Drop` that blocked on it waited for good), where a stream's read, and an `accept` with a
/// kept accept, fail at once with the off-loop error. Nothing is lost: the kept receive stays
/// for the next `recv_from`.
#[test]
fn a_recv_from_while_its_loop_is_hidden_does_not_wait_for_a_kept_receive() {
    on_each_driver(
        "a_recv_from_while_its_loop_is_hidden",
        1,
        |driver| async move {
            let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let addr = s.local_addr().unwrap();
            let mut kept = Box::pin(s.recv_from(vec![0u8; 16]));
            poll_pending(kept.as_mut()).await;
            sleep(Duration::from_millis(5)).await; // the receive reaches the kernel
                                                   // No await from here to the sweep: its cancellation is not reaped.
            drop(kept);
            UDP.with(|u| *u.borrow_mut() = Some(s.clone()));
            drop_in_a_sweep(RecvsFromStash);
            let outcome = RECV_OUTCOME
                .with(|o| o.borrow_mut().take())
                .expect("the sweep ran the drop");
            assert!(
                outcome.starts_with("error: xtc I/O used off any xtc loop"),
                "[{driver}] a recv_from on a hidden loop gave {outcome:?}"
            );
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.send_to(b"one", addr).unwrap();
            let (r, b) = xtc_shards::time::timeout(io_common::HANG, s.recv_from(vec![0u8; 16]))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] the datagram was lost"));
            let (n, _) = r.unwrap();
            assert_eq!(&b[..n], b"one", "[{driver}]");
        },
    );
}

/// A registered buffer pool dropped while its loop is hidden is unregistered: the lookup saw
/// no loop and left the registration, so no pool could be registered on that loop again.
#[test]
fn a_pool_dropped_while_its_loop_is_hidden_is_unregistered() {
    on_each_driver(
        "a_pool_dropped_while_its_loop_is_hidden_is_unregistered",
        1,
        |driver| async move {
            let pool = xtc_shards::io::FixedBufPool::register(4, 4096).unwrap();
            POOL.with(|p| *p.borrow_mut() = Some(pool));
            drop_in_a_sweep(DropsPool);
            assert!(
                POOL.with(|p| p.borrow().is_none()),
                "the sweep ran the drop"
            );
            let again = xtc_shards::io::FixedBufPool::register(4, 4096);
            assert!(again.is_ok(), "[{driver}] {:?}", again.err());
        },
    );
}

thread_local! {
    /// A stream kept past its loop, dropped by this thread-local's destructor at thread exit.
    static KEPT_STREAM: RefCell<Option<UnixStream>> = const { RefCell::new(None) };
}

/// A stream in a thread-local is dropped by that thread-local's destructor at thread exit,
/// after its loop is gone; its driver lookup must not touch a thread-local that is already
/// destroyed. The list of loops `off_loop` hides was a thread-local with a destructor, read
/// by every lookup off a loop: the drop panicked inside a destructor, which aborts the
/// process. With `pending`, a read is dropped first, so the stream also keeps a receive.
fn a_stream_in_a_thread_local_is_dropped_at_thread_exit(pending: bool) {
    std::thread::spawn(move || {
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let other = ex.block_on(async move {
            let pair = |data: bool| {
                let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
                if data {
                    std::io::Write::write_all(&mut b, b"x").unwrap();
                }
                (UnixStream::from_std(a).unwrap(), b)
            };
            let (kept, peer1) = pair(!pending);
            if pending {
                let mut read = Box::pin(kept.read(Vec::with_capacity(8)));
                poll_pending(read.as_mut()).await;
            } else {
                let _ = kept.read(Vec::with_capacity(8)).await;
            }
            // This thread-local's destructor is registered now, before any lookup off a loop.
            KEPT_STREAM.with(|k| *k.borrow_mut() = Some(kept));
            // Used, so that its drop off the loop has a driver to look up.
            let (other, peer2) = pair(true);
            let _ = other.read(Vec::with_capacity(8)).await;
            std::mem::forget((peer1, peer2));
            other
        });
        // A lookup off any loop (the stream's driver is gone).
        drop(other);
        drop(ex);
    })
    .join()
    .expect("the thread exited cleanly");
}

#[test]
fn a_stream_in_a_thread_local_is_dropped_at_thread_exit_after_a_read() {
    a_stream_in_a_thread_local_is_dropped_at_thread_exit(false);
}

#[test]
fn a_stream_in_a_thread_local_is_dropped_at_thread_exit_with_a_kept_receive() {
    a_stream_in_a_thread_local_is_dropped_at_thread_exit(true);
}

/// A write-behind send that found the socket full when its driver went (the shutdown cancelled
/// it), then, in the next `block_on`, a read for the peer's answer, with no `flush` between:
/// the peer answers only once it has every byte reported written. On epoll those bytes are in
/// the socket already; on io_uring the cancelled send must go out again without waiting for a
/// `flush`, or the request/response exchange hangs (the peer waits for the tail, the stream
/// for the answer). Owned `read` and `AsyncRead` alike.
fn a_write_behind_cut_by_its_drivers_shutdown_reaches_the_peer_before_a_read(via_trait: bool) {
    use std::io::{Read as _, Write as _};
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut a, b, filled, tail) = ex.block_on(async {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (filled, tail) = fill_then_write_tail(&mut a).await;
        (a, b, filled, tail)
    });
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let peer = std::thread::spawn(move || {
        let mut all = vec![0u8; filled + tail];
        let got = b.read_exact(&mut all);
        if got.is_ok() {
            // Fails only if the stream was dropped first (the read gave up).
            let _ = b.write_all(b"ok");
        }
        // Kept open until the reader is done (a read timeout ends it otherwise).
        let mut rest = [0u8; 1];
        let _ = b.read(&mut rest);
        got.map(|()| all)
    });
    let answer = ex.block_on(async move {
        let answer = xtc_shards::time::timeout(io_common::HANG, async {
            if via_trait {
                let mut two = [0u8; 2];
                futures::io::AsyncReadExt::read_exact(&mut a, &mut two)
                    .await
                    .map(|()| two.to_vec())
            } else {
                let (r, buf) = a.read(Vec::with_capacity(2)).await;
                r.map(|n| buf[..n].to_vec())
            }
        })
        .await;
        drop(a);
        answer
    });
    let all = peer.join().unwrap();
    let answer = answer.unwrap_or_else(|_| {
        panic!(
            "the read hung: the peer got {:?} bytes of {} (tail {tail})",
            all.as_ref().map(Vec::len),
            filled + tail
        )
    });
    assert_eq!(answer.unwrap(), b"ok");
    let all = all.unwrap();
    assert!(all[..filled].iter().all(|&x| x == 0));
    assert_eq!(&all[filled..], &b"tail"[..tail]);
}

#[test]
fn a_write_behind_cut_by_its_drivers_shutdown_reaches_the_peer_before_an_owned_read() {
    a_write_behind_cut_by_its_drivers_shutdown_reaches_the_peer_before_a_read(false);
}

#[test]
fn a_write_behind_cut_by_its_drivers_shutdown_reaches_the_peer_before_an_async_read() {
    a_write_behind_cut_by_its_drivers_shutdown_reaches_the_peer_before_a_read(true);
}

/// `shutdown` is a plain system call, and works off any loop: on a stream returned from
/// `LocalExecutor::block_on` whose write-behind send completed before its driver went, a
/// `shutdown(Write)` made outside any loop goes out (the peer sees the end after the bytes).
/// It failed as off any loop: the check that the send is done first reaped a driver, and
/// there was none, although the send's result was there (the driver left it to the stream).
#[test]
fn shutdown_off_any_loop_after_a_write_behind_that_completed() {
    use futures::io::AsyncWriteExt;
    use std::io::Read as _;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut a, b) = ex.block_on(async {
        let (mut a, b) = UnixStream::pair().unwrap();
        AsyncWriteExt::write(&mut a, b"x").await.unwrap();
        sleep(Duration::from_millis(20)).await; // the send completes in the kernel
        (a, b)
    });
    a.shutdown(std::net::Shutdown::Write)
        .unwrap_or_else(|e| panic!("shutdown off any loop: {e}"));
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = Vec::new();
    b.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"x");
    ex.block_on(async move { AsyncWriteExt::flush(&mut a).await })
        .unwrap_or_else(|e| panic!("flush of a delivered write: {e}"));
}

/// A TCP `connect` still awaited when its `block_on` returns (the listener's accept queue
/// full, so its handshake waits for a SYN retransmit), awaited to its end in the next one: it
/// connects once the listener has room, as on epoll. On io_uring the driver's shutdown
/// cancels its `CONNECT` (the socket's handshake goes on), and it failed with that
/// `ECANCELED`.
#[test]
fn a_connect_that_outlives_its_driver_still_connects() {
    type ConnectFut = std::pin::Pin<Box<dyn Future<Output = std::io::Result<TcpStream>>>>;
    let listener =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    listener
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
    listener.listen(0).unwrap();
    let listener = std::net::TcpListener::from(listener);
    let addr = listener.local_addr().unwrap();
    // Fill the accept queue (one connection): the next connection's SYN is dropped until it
    // has room again.
    let fillers: Vec<std::net::TcpStream> = (0..1)
        .map(|_| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_nonblocking(true).unwrap();
            let _ = s.connect(&addr.into()); // EINPROGRESS
            s.into()
        })
        .collect();
    for s in &fillers {
        // Until its handshake is done (writable), so the queue is full.
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(s),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: a live local pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, 60_000) };
        assert_eq!(rc, 1, "the filler did not connect");
    }
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (mut f, _) = ex.block_on(async move {
        let mut f: ConnectFut = Box::pin(TcpStream::connect(addr));
        poll_pending(f.as_mut()).await;
        sleep(Duration::from_millis(20)).await; // submitted, waiting for the handshake
        (f, ())
    });
    let r = ex.block_on(async move {
        // Room in the queue: the connection's next SYN is taken.
        listener.set_nonblocking(true).unwrap();
        let mut taken = Vec::new();
        while let Ok((s, _)) = listener.accept() {
            taken.push(s);
        }
        let r = guard("connect", f.as_mut()).await;
        drop((fillers, taken, listener));
        r
    });
    let s = r.expect("a connect awaited across block_on");
    drop(s);
}

/// A read dropped alone whose task's waker, dropped when the receive is kept (`Op::unwait`),
/// runs user code that starts and drops another read of the same stream: that read was kept
/// first, then the first one took its place, and the second receive, already queued to the
/// kernel, was cancelled behind it; the bytes it took (those behind the first one's) were lost,
/// and the next read waited for them for good.
#[test]
fn a_read_kept_while_its_wakers_drop_keeps_another_loses_nothing() {
    on_each_driver(
        "a_read_kept_while_its_wakers_drop_keeps_another_loses_nothing",
        1,
        |driver| async move {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let a = Rc::new(TcpStream::from_std(l.accept().unwrap().0).unwrap());
            let a2 = a.clone();
            let waker = common::drop_hooked_waker(move || {
                let mut again = Box::pin(a2.read(Vec::with_capacity(64)));
                let _ = again.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            });
            let mut first = Box::pin(a.read(Vec::with_capacity(64)));
            assert!(first
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            drop(waker); // the driver's slot holds the only clone now
            sleep(Duration::from_millis(5)).await; // the receive reaches the kernel
            use std::io::Write as _;
            (&peer).write_all(b"one").unwrap();
            std::thread::sleep(Duration::from_millis(50)); // completed, not reaped
            (&peer).write_all(b"two").unwrap();
            drop(first);
            let mut got = Vec::new();
            while got.len() < 6 {
                let r = xtc_shards::time::timeout(
                    Duration::from_secs(5),
                    a.read(Vec::with_capacity(64)),
                )
                .await;
                let Ok((r, b)) = r else {
                    panic!(
                        "[{driver}] bytes lost: got only {:?}",
                        String::from_utf8_lossy(&got)
                    );
                };
                assert!(r.unwrap() > 0, "[{driver}] end of stream");
                got.extend_from_slice(&b);
            }
            assert_eq!(got, b"onetwo", "[{driver}]");
        },
    );
}

/// An `AsyncRead` with a large slice takes what is queued in one receive on io_uring too (up
/// to 256 KiB), as epoll's `recv` does: at 8 KiB a receive, each one a `Pending` and a loop
/// turn, futures' `read_to_end` (which zero-fills its spare capacity after every `Pending`)
/// slowed with the square of the body, 8.5 s for 4 MiB in a debug build.
#[test]
fn an_async_read_takes_what_is_queued_in_one_receive() {
    use futures::io::AsyncReadExt;
    on_each_driver(
        "an_async_read_takes_what_is_queued_in_one_receive",
        1,
        |driver| async move {
            let (a_std, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut a = UnixStream::from_std(a_std).unwrap();
            let sent: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
            // A Unix stream queues the bytes on the receiver at the write: all 64 KiB wait.
            std::io::Write::write_all(&mut peer, &sent).unwrap();
            let mut got = vec![0; 128 * 1024];
            let n = guard("the read", AsyncReadExt::read(&mut a, &mut got))
                .await
                .unwrap();
            assert_eq!(
                n,
                sent.len(),
                "[{driver}] one read took {n} of the queued bytes"
            );
            assert_eq!(got[..n], sent[..], "[{driver}]");
        },
    );
}

/// Unwraps `a` with `into_std`, reading (with `read`) whatever it refuses for: bytes it holds
/// that no read has returned. Returns the `std` socket and what those reads got.
async fn into_std_reading_first<S, T, F: Future<Output = Vec<u8>>>(
    mut a: S,
    into_std: impl Fn(S) -> Result<T, xtc_shards::net::IntoStdError<S>>,
    read: impl Fn(Rc<S>) -> F,
) -> (T, Vec<u8>) {
    let mut got = Vec::new();
    for _ in 0..10 {
        match into_std(a) {
            Ok(s) => return (s, got),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("into_std again") || msg.contains("later"),
                    "{msg}"
                );
                let s = Rc::new(e.into_inner());
                got.extend(guard("read the refused bytes", read(s.clone())).await);
                a = Rc::into_inner(s).unwrap();
            }
        }
    }
    panic!("into_std refused ten times");
}

/// `into_std` loses no byte a dropped read's kept receive took (io_uring): it refuses, the
/// next read returns them, and then it unwraps. It used to cancel that receive and drop what
/// it held, so the `std` stream went on from the middle.
#[test]
fn into_std_loses_no_byte_of_a_dropped_read() {
    use std::io::Read;
    on_each_driver(
        "into_std_loses_no_byte_of_a_dropped_read",
        1,
        |driver| async move {
            let (a, b) = UnixStream::pair().unwrap();
            poll_once_then_drop(a.read(Vec::with_capacity(64)), async {
                let (w, _) = b.write_all(b"kept".to_vec()).await;
                w.unwrap();
                sleep(Duration::from_millis(5)).await;
            })
            .await;
            let (w, _) = b.write_all(b" rest".to_vec()).await;
            w.unwrap();
            drop(b);
            let (s, mut got) = into_std_reading_first(a, UnixStream::into_std, |s| async move {
                let (r, buf) = s.read(Vec::with_capacity(64)).await;
                r.unwrap();
                buf
            })
            .await;
            s.set_nonblocking(false).unwrap();
            (&s).read_to_end(&mut got).unwrap();
            assert_eq!(got, b"kept rest", "[{driver}]");
        },
    );
}

/// A dropped read whose receive is still in the kernel (nothing sent yet) does not stop
/// `into_std`: its cancellation settles with nothing taken, and the bytes sent after go to
/// the `std` stream.
#[test]
fn into_std_after_a_read_dropped_in_flight_unwraps() {
    use std::io::Read;
    on_each_driver(
        "into_std_after_a_read_dropped_in_flight_unwraps",
        1,
        |driver| async move {
            let (a, b) = UnixStream::pair().unwrap();
            poll_once_then_drop(
                a.read(Vec::with_capacity(64)),
                sleep(Duration::from_millis(2)),
            )
            .await;
            let s = a
                .into_std()
                .unwrap_or_else(|e| panic!("[{driver}] refused with nothing received: {e}"));
            let (w, _) = b.write_all(b"after".to_vec()).await;
            w.unwrap();
            drop(b);
            let mut got = Vec::new();
            s.set_nonblocking(false).unwrap();
            (&s).read_to_end(&mut got).unwrap();
            assert_eq!(got, b"after", "[{driver}]");
        },
    );
}

/// `into_std` with bytes `AsyncWrite` reported written still being sent (io_uring's
/// write-behind send, waiting for room in a full socket): it refuses, saying to flush, and
/// leaves the send running; after `flush` it unwraps, and the peer gets every byte reported
/// written, then the `std` stream's. It cancelled that send, so bytes `poll_write` had
/// reported written never reached the peer. On epoll `AsyncWrite` writes straight into the
/// socket (a full one: nothing reported written), so nothing is held and it unwraps at once.
#[test]
fn into_std_loses_no_byte_reported_written() {
    on_each_driver(
        "into_std_loses_no_byte_reported_written",
        1,
        |driver| async move {
            let (a, b) = UnixStream::pair().unwrap();
            let b = b.into_std().unwrap();
            b.set_nonblocking(false).unwrap();
            unwrap_after_write_behind(driver, "unix", a, b, |a| {
                UnixStream::into_std(a).inspect(|s| s.set_nonblocking(false).unwrap())
            })
            .await;
            let (a, b) = tcp_pair().await;
            let b = b.into_std().unwrap();
            b.set_nonblocking(false).unwrap();
            unwrap_after_write_behind(driver, "tcp", a, b, |a| {
                TcpStream::into_std(a).inspect(|s| s.set_nonblocking(false).unwrap())
            })
            .await;
        },
    );
}

/// `into_std` after a receive brought a connection reset that no read has reported yet (a
/// dropped owned read's kept receive, and the `AsyncRead` side's receive, io_uring): it
/// refuses, and the next read reports the reset; then it unwraps. It unwrapped at once,
/// dropping the error the kernel had handed over only once, so the `std` stream read a clean
/// end of stream (a cut stream that looked complete). On epoll nothing takes the error: the
/// `std` stream reports it.
#[test]
fn into_std_loses_no_read_error() {
    use futures::io::AsyncReadExt;
    on_each_driver("into_std_loses_no_read_error", 1, |driver| async move {
        for trait_side in [false, true] {
            let (mut a, b) = tcp_pair().await;
            let reset = async {
                // A reset, not a FIN: an abortive close.
                set_sockopt(
                    &b,
                    libc::SO_LINGER,
                    libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    },
                );
                drop(b);
                // The loop reaps the receive's completion meanwhile.
                sleep(Duration::from_millis(20)).await;
            };
            if trait_side {
                let mut buf = [0u8; 16];
                let mut read = AsyncReadExt::read(&mut a, &mut buf);
                poll_pending(Pin::new(&mut read)).await;
                drop(read);
                reset.await;
            } else {
                poll_once_then_drop(a.read(Vec::with_capacity(16)), reset).await;
            }
            let mut reported = false;
            let mut refusals = 0;
            let s = loop {
                match a.into_std() {
                    Ok(s) => break s,
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains("into_std again"), "[{driver}] {msg}");
                        refusals += 1;
                        assert!(refusals < 10, "[{driver}] refused ten times: {msg}");
                        a = e.into_inner();
                        let r = if trait_side {
                            let mut buf = [0u8; 16];
                            guard("the read", AsyncReadExt::read(&mut a, &mut buf)).await
                        } else {
                            guard("the read", a.read(Vec::with_capacity(16))).await.0
                        };
                        match r {
                            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {
                                reported = true;
                            }
                            other => panic!("[{driver}] the read after a refusal: {other:?}"),
                        }
                    }
                }
            };
            if !reported {
                let r = std::io::Read::read(&mut &s, &mut [0u8; 16]);
                assert_eq!(
                    r.as_ref().map_err(|e| e.raw_os_error()),
                    Err(Some(libc::ECONNRESET)),
                    "[{driver}, trait side {trait_side}] the connection reset was lost: \
                     the std stream read {r:?}"
                );
            }
        }
    });
}

/// `into_std` after a write-behind send failed (its peer gone: `EPIPE`) with nobody told yet:
/// it refuses, saying to flush, and the flush reports the error; then it unwraps. It dropped
/// the send, error and all, so the caller never learned that bytes reported written were
/// not delivered. On epoll the write itself reports the error.
#[test]
fn into_std_loses_no_failed_write_behind_error() {
    use futures::io::AsyncWriteExt;
    on_each_driver(
        "into_std_loses_no_failed_write_behind_error",
        1,
        |driver| async move {
            let (mut a, b) = UnixStream::pair().unwrap();
            drop(b);
            let wrote = poll_fn(|cx| {
                Poll::Ready(futures::io::AsyncWrite::poll_write(
                    Pin::new(&mut a),
                    cx,
                    b"lost",
                ))
            })
            .await;
            let a = match wrote {
                // io_uring: reported written; its send fails in the kernel.
                Poll::Ready(Ok(4)) => {
                    let e = a
                        .into_std()
                        .map(drop)
                        .expect_err("into_std dropped a failed send's error");
                    assert!(e.to_string().contains("flush()"), "[{driver}] {e}");
                    let mut a = e.into_inner();
                    let flushed = guard("the flush", AsyncWriteExt::flush(&mut a)).await;
                    assert_eq!(
                        flushed.unwrap_err().raw_os_error(),
                        Some(libc::EPIPE),
                        "[{driver}]"
                    );
                    a
                }
                Poll::Ready(Err(e)) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "[{driver}]");
                    a
                }
                other => panic!("[{driver}] write to a closed peer: {other:?}"),
            };
            a.into_std().expect("nothing left to report");
        },
    );
}

/// [`into_std_loses_no_byte_reported_written`] on one stream `a` whose peer is `peer`: fills
/// `a`'s socket, writes `b"tail"` through `AsyncWrite`, unwraps `a` (flushing while it
/// refuses, with the peer reading), writes `b"X"` on the `std` stream (`into_std` makes it
/// blocking), and checks what the peer got.
async fn unwrap_after_write_behind<S, T, P>(
    driver: xtc_shards::io::Driver,
    kind: &str,
    mut a: S,
    peer: P,
    into_std: impl Fn(S) -> Result<T, xtc_shards::net::IntoStdError<S>>,
) where
    S: futures::io::AsyncWrite + Unpin + std::os::fd::AsRawFd,
    T: std::io::Write,
    P: std::io::Read + Send + 'static,
{
    use futures::io::AsyncWriteExt;
    let filled = fill(&a);
    // One poll: io_uring reports it written at once (its send waits for room); epoll finds
    // the socket full, and the write is dropped unwritten.
    let reported = poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut a).poll_write(cx, b"tail") {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => 0,
        })
    })
    .await;
    if driver == xtc_shards::io::Driver::IoUring {
        assert_eq!(reported, 4, "[{driver} {kind}] write-behind");
    }
    let read_all = |mut p: P| {
        std::thread::spawn(move || {
            let mut all = Vec::new();
            p.read_to_end(&mut all).unwrap();
            all
        })
    };
    let mut peer = Some(peer);
    let mut reader = None;
    let mut refusals = 0;
    let mut s = loop {
        match into_std(a) {
            Ok(s) => break s,
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("flush"), "[{driver} {kind}] {msg}");
                refusals += 1;
                assert!(refusals < 10, "[{driver} {kind}] refused ten times: {msg}");
                a = e.into_inner();
                // The peer reads from now on, so the send can finish.
                if let Some(p) = peer.take() {
                    reader = Some(read_all(p));
                }
                guard("the flush", AsyncWriteExt::flush(&mut a))
                    .await
                    .unwrap();
            }
        }
    };
    if driver == xtc_shards::io::Driver::IoUring && kind == "unix" {
        // A Unix socket's buffer does not grow: the send still waited for room.
        assert!(
            refusals > 0,
            "[{driver} {kind}] into_std unwrapped with a send in flight"
        );
    }
    let reader = match peer.take() {
        Some(p) => read_all(p),
        None => reader.expect("started at the refusal"),
    };
    s.write_all(b"X").unwrap();
    drop(s);
    let all = reader.join().unwrap();
    assert_eq!(
        all.len(),
        filled + reported + 1,
        "[{driver} {kind}] the peer got {} bytes; {filled} filled, {reported} reported written, 1 written on the std stream",
        all.len()
    );
    assert!(all[..filled].iter().all(|&x| x == 0), "[{driver} {kind}]");
    assert_eq!(
        &all[filled..filled + reported],
        &b"tail"[..reported],
        "[{driver} {kind}]"
    );
    assert_eq!(all[filled + reported], b'X', "[{driver} {kind}]");
}

/// Bytes the `AsyncRead` side read ahead (a read dropped while it waited leaves its receive,
/// sized for its buffer, to the next read, which asked for less) are not lost by `into_std`
/// either (TCP this time).
#[test]
fn into_std_loses_no_byte_of_the_async_read_ahead() {
    use futures::io::AsyncReadExt;
    use std::io::Read;
    on_each_driver(
        "into_std_loses_no_byte_of_the_async_read_ahead",
        1,
        |driver| async move {
            let (mut a, b) = tcp_pair().await;
            let mut big = [0u8; 64];
            let dropped = xtc_shards::time::timeout(
                Duration::from_millis(10),
                AsyncReadExt::read(&mut a, &mut big),
            )
            .await;
            assert!(dropped.is_err(), "nothing was sent yet");
            let (w, _) = b.write_all(b"hello world".to_vec()).await;
            w.unwrap();
            sleep(Duration::from_millis(5)).await;
            let mut small = [0u8; 4];
            guard("small read", AsyncReadExt::read_exact(&mut a, &mut small))
                .await
                .unwrap();
            assert_eq!(&small, b"hell");
            drop(b);
            let (s, mut got) = into_std_reading_first(a, TcpStream::into_std, |s| async move {
                let (r, buf) = s.read(Vec::with_capacity(64)).await;
                r.unwrap();
                buf
            })
            .await;
            s.set_nonblocking(false).unwrap();
            (&s).read_to_end(&mut got).unwrap();
            assert_eq!(got, b"o world", "[{driver}]");
        },
    );
}

/// A datagram a dropped `recv_from`'s kept receive took is not lost by `into_std`: it
/// refuses, `recv_from` returns it, and then it unwraps.
#[test]
fn udp_into_std_loses_no_kept_datagram() {
    on_each_driver(
        "udp_into_std_loses_no_kept_datagram",
        1,
        |driver| async move {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to_a = a.local_addr().unwrap();
            poll_once_then_drop(a.recv_from(Vec::with_capacity(64)), async {
                let (w, _) = b.send_to(b"kept".to_vec(), to_a).await;
                w.unwrap();
                sleep(Duration::from_millis(5)).await;
            })
            .await;
            let (w, _) = b.send_to(b"next".to_vec(), to_a).await;
            w.unwrap();
            let (s, got) = into_std_reading_first(a, UdpSocket::into_std, |s| async move {
                let (r, buf) = s.recv_from(Vec::with_capacity(64)).await;
                r.unwrap();
                buf
            })
            .await;
            let mut rest = Vec::new();
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            while rest.len() + got.len() < 8 {
                let mut buf = [0u8; 64];
                let n = s.recv(&mut buf).unwrap();
                rest.extend_from_slice(&buf[..n]);
            }
            let mut all = got;
            all.extend(rest);
            assert_eq!(all, b"keptnext", "[{driver}]");
        },
    );
}

/// An error a dropped `recv`'s kept receive got (`ECONNREFUSED`: a connected socket's
/// datagram met a closed port) is not lost by `into_std`: it refuses, `recv` returns the
/// error, and then it unwraps. It dropped the kept receive, error and all, and the kernel
/// reports such an error once: the `std` socket never saw it. On epoll nothing takes it: the
/// `std` socket reports it.
#[test]
fn udp_into_std_loses_no_kept_error() {
    on_each_driver("udp_into_std_loses_no_kept_error", 1, |driver| async move {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(closed.local_addr().unwrap()).unwrap();
        drop(closed);
        poll_once_then_drop(a.recv(Vec::with_capacity(64)), async {
            let (w, _) = a.send(b"anyone?".to_vec()).await;
            w.unwrap();
            // The port unreachable comes back; the loop reaps the receive's completion.
            sleep(Duration::from_millis(20)).await;
        })
        .await;
        let mut a = a;
        let mut reported = false;
        let mut refusals = 0;
        let s = loop {
            match a.into_std() {
                Ok(s) => break s,
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains("into_std again"), "[{driver}] {msg}");
                    refusals += 1;
                    assert!(refusals < 10, "[{driver}] refused ten times: {msg}");
                    a = e.into_inner();
                    let (r, _) = guard("the recv", a.recv(Vec::with_capacity(64))).await;
                    match r {
                        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => reported = true,
                        other => panic!("[{driver}] the recv after a refusal: {other:?}"),
                    }
                }
            }
        };
        if !reported {
            let r = s.recv(&mut [0u8; 64]);
            assert_eq!(
                r.as_ref().map_err(|e| e.raw_os_error()),
                Err(Some(libc::ECONNREFUSED)),
                "[{driver}] the refused connection's error was lost: the std socket read {r:?}"
            );
        }
    });
}

/// `into_std` off any loop, on a stream whose loop has gone: a kept receive that took bytes
/// makes it refuse (and a read there hands them out), one the driver's shutdown cancelled
/// with nothing does not; neither waits for a loop that no longer turns.
#[test]
fn into_std_off_the_loop_settles_kept_reads() {
    use std::io::Read;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (full, full_peer, empty, _empty_peer) = ex.block_on(async {
        let (a, b) = UnixStream::pair().unwrap();
        poll_once_then_drop(a.read(Vec::with_capacity(16)), async {}).await;
        let (r, _) = b.write_all(b"hello".to_vec()).await;
        r.unwrap();
        let (c, d) = UnixStream::pair().unwrap();
        poll_once_then_drop(c.read(Vec::with_capacity(16)), async {}).await;
        sleep(Duration::from_millis(50)).await; // the first kept receive completes
        (a, b, c, d)
    });
    drop(ex);
    let s = empty
        .into_std()
        .unwrap_or_else(|e| panic!("refused with nothing received: {e}"));
    drop(s);
    let mut got = Vec::new();
    let full = match full.into_std() {
        Ok(s) => s, // epoll: nothing was read ahead
        Err(e) => {
            assert!(e.to_string().contains("into_std again"), "{e}");
            let a = e.into_inner();
            {
                let mut read = std::pin::pin!(a.read(Vec::with_capacity(16)));
                let mut cx = Context::from_waker(Waker::noop());
                let Poll::Ready((r, buf)) = read.as_mut().poll(&mut cx) else {
                    panic!("the kept bytes were not handed out at once off the loop");
                };
                r.unwrap();
                got.extend_from_slice(&buf);
            }
            a.into_std().unwrap()
        }
    };
    drop(full_peer);
    full.set_nonblocking(false).unwrap();
    (&full).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"hello");
}

/// Two owned reads in flight: the one armed last takes "ping" and is dropped (kept as what it
/// brought), the other takes "pong" just before its driver goes, and is dropped in the next
/// `block_on`, where its completion has no place in any driver's order. The stream hands out
/// "ping" first. The receive with no place was ordered ahead of every placed one ("pongping"
/// on io_uring), though a driver's shutdown comes after every completion it reaped.
#[test]
fn a_read_that_outlived_its_driver_comes_after_bytes_kept_before_it_went() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, peer, first) = ex.block_on(async {
        let (a, peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = std::rc::Rc::new(UnixStream::from_std(a).unwrap());
        let mut first = owned_read(&a);
        poll_pending(first.as_mut()).await;
        let mut second = owned_read(&a);
        poll_pending(second.as_mut()).await;
        sleep(Duration::from_millis(5)).await; // both in the kernel
        std::io::Write::write_all(&mut &peer, b"ping").unwrap();
        sleep(Duration::from_millis(5)).await; // one takes "ping", reaped
        drop(second);
        std::io::Write::write_all(&mut &peer, b"pong").unwrap();
        std::thread::sleep(Duration::from_millis(20)); // the other may take "pong", unreaped
        (a, peer, first)
    });
    let seen = ex.block_on(async move {
        drop(first);
        let mut seen = Vec::new();
        read_up_to(&a, &mut seen, 8).await;
        drop(peer);
        seen
    });
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "pingpong",
        "bytes came out of the stream's order"
    );
}

/// A read whose receive took "ping" (reaped by its driver) is carried into the next
/// `block_on` and dropped there while another read waits on the new driver, which then takes
/// "pong": the stream hands out "ping" first. The waiting read compared its own completion only
/// with kept bytes of its own driver, so "pong" came first.
#[test]
fn bytes_kept_from_an_earlier_driver_come_before_a_waiting_reads_own() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, peer, first) = ex.block_on(async {
        let (a, peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = std::rc::Rc::new(UnixStream::from_std(a).unwrap());
        let mut first = owned_read(&a);
        poll_pending(first.as_mut()).await;
        sleep(Duration::from_millis(5)).await; // in the kernel
        std::io::Write::write_all(&mut &peer, b"ping").unwrap();
        sleep(Duration::from_millis(5)).await; // received and reaped; not polled again
        (a, peer, first)
    });
    let seen = ex.block_on(async move {
        let mut second = owned_read(&a);
        // On epoll "ping" is still in the socket (nothing took it), and this takes it at once.
        let mut early = None;
        poll_fn(|cx| {
            if let Poll::Ready(r) = second.as_mut().poll(cx) {
                early = Some(r);
            }
            Poll::Ready(())
        })
        .await;
        sleep(Duration::from_millis(5)).await; // in the kernel
        drop(first); // its "ping" is kept (io_uring)
        std::io::Write::write_all(&mut &peer, b"pong").unwrap();
        let mut seen = match early {
            Some(r) => r.unwrap(),
            None => guard("the waiting read", second).await.unwrap(),
        };
        read_up_to(&a, &mut seen, 8).await;
        drop(peer);
        seen
    });
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "pingpong",
        "bytes came out of the stream's order"
    );
}

/// As above, but the read that took "pong" is awaited in the next `block_on`, not dropped:
/// it puts its bytes behind the kept "ping" (`queue_behind_kept`). With no place for its
/// completion once the driver was gone, it returned "pong" first.
#[test]
fn a_read_awaited_after_its_driver_went_comes_after_bytes_kept_before_it_went() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (a, peer, first) = ex.block_on(async {
        let (a, peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = std::rc::Rc::new(UnixStream::from_std(a).unwrap());
        let mut first = owned_read(&a);
        poll_pending(first.as_mut()).await;
        let mut second = owned_read(&a);
        poll_pending(second.as_mut()).await;
        sleep(Duration::from_millis(5)).await; // both in the kernel
        std::io::Write::write_all(&mut &peer, b"ping").unwrap();
        sleep(Duration::from_millis(5)).await; // one takes "ping", reaped
        drop(second);
        std::io::Write::write_all(&mut &peer, b"pong").unwrap();
        std::thread::sleep(Duration::from_millis(20)); // the other may take "pong", unreaped
        (a, peer, first)
    });
    let seen = ex.block_on(async move {
        let mut seen = guard("the read that outlived its driver", first)
            .await
            .unwrap();
        read_up_to(&a, &mut seen, 8).await;
        drop(peer);
        seen
    });
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "pingpong",
        "bytes came out of the stream's order"
    );
}

/// An `fs::read` of a FIFO still awaited (not dropped) when its `block_on` returns, and
/// awaited to its end in the next one: it gets the bytes written meanwhile, as on epoll
/// (whose pool job goes on). On io_uring the driver's shutdown cancels its `READ` (nothing
/// read), and the read failed with that `ECANCELED`, where `open` and the socket calls start
/// again on the new loop.
#[test]
fn a_fifo_read_that_outlives_its_driver_still_reads() {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let path = std::env::temp_dir().join(format!("xtc-io-stray-fifo-{}", std::process::id()));
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain system call with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _cleanup = Cleanup(path.clone());
    // Both ends held open (non-blocking), so `fs::read`'s own open never waits for a peer.
    let mut writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .unwrap();
    type ReadAll = Pin<Box<dyn Future<Output = std::io::Result<Vec<u8>>>>>;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let p = path.clone();
    // How many of this process's descriptors name the FIFO (the writer's, then the read's).
    let opened = move || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| *l == p)
            .count()
    };
    let p = path.clone();
    let (mut f, ()) = ex.block_on(async move {
        let mut f: ReadAll = Box::pin(xtc_shards::fs::read(p));
        // Its open (in a kernel worker), then its read of the empty FIFO, which waits in the
        // kernel.
        let deadline = std::time::Instant::now() + io_common::HANG;
        poll_pending(f.as_mut()).await;
        while opened() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the open never finished"
            );
            sleep(Duration::from_millis(10)).await;
        }
        sleep(Duration::from_millis(20)).await; // the open's completion reaped
        poll_pending(f.as_mut()).await; // the read, submitted at the end of this turn
        sleep(Duration::from_millis(20)).await;
        (f, ())
    });
    // The bytes, then the end of the FIFO (its last writer gone; the read holds it open).
    writer.write_all(b"hello").unwrap();
    drop(writer);
    let r = ex.block_on(async move { guard("the read", f.as_mut()).await });
    assert_eq!(r.expect("a FIFO read awaited across block_on"), b"hello");
}
