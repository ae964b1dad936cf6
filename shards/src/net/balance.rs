//! [`ConnBalancer`]: serve every accepted connection on the shard with the fewest open ones.
//!
//! `SO_REUSEPORT` spreads connections over the shards' listeners by a hash of the 4-tuple, so
//! with tens of connections one shard easily holds half again as many as another, and since a
//! connection never moves, its clients get proportionally less service for as long as it lives
//! (Seastar's `load_balancing_algorithm::connection_distribution` exists for the same reason).
//! The balancer keeps one open-connection count per shard; a shard that accepts a connection
//! while some other shard serves fewer hands it to the least-loaded one: its descriptor travels
//! in a task over the ring mesh (one ring message, once per connection), and the connection's
//! I/O then runs on that shard only. Counts are heuristics (relaxed atomics): two shards that
//! decide at the same moment may both pick the same target, which the next accepts correct.
//!
//! Written by hand: no crate balances connections over thread-per-core loops.

use std::{
    fmt,
    future::Future,
    io,
    net::SocketAddr,
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc,
    },
};

use super::{TcpListener, TcpStream};
use crate::{task::TaskInfo, MAX_SHARDS};

/// One shard's count on a cache line of its own (each acceptor writes only the counts of the
/// shards it places connections on, and every connection's end writes its shard's).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Count(AtomicUsize);

/// Shared open-connection counts, one per shard; cheap to clone (an `Arc` clone, one atomic
/// increment).
///
/// ```no_run
/// # use xtc_shards as xtc;
/// # fn main() -> xtc::Result<()> {
/// let exec = xtc::Executor::builder().shards(2).service_mode(true).build()?;
/// let balancer = xtc::net::ConnBalancer::new(exec.shard_count())?;
/// for shard in 0..exec.shard_count() {
///     let balancer = balancer.clone();
///     exec.spawn_on(shard, move || async move {
///         let listener = match xtc::net::TcpListener::bind_reuseport("127.0.0.1:7000") {
///             Ok(listener) => listener,
///             // A panic here would end this task only, the shard serving nothing.
///             Err(e) => {
///                 tracing::error!("shard {}: bind: {e}", xtc::shard::id());
///                 return xtc::stop();
///             }
///         };
///         // Runs on whichever shard serves the connection.
///         let served = balancer
///             .serve(listener, |stream, _peer| async move {
///                 let (_, _) = stream.write_all(b"hello\n").await;
///             })
///             .await;
///         if let Err(e) = served {
///             tracing::error!("accept failed: {e}");
///         }
///     })?;
/// }
/// exec.run()
/// # }
/// ```
#[derive(Clone)]
pub struct ConnBalancer {
    open: Arc<[Count]>,
}

impl fmt::Debug for ConnBalancer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnBalancer")
            .field("open", &self.open_connections())
            .finish()
    }
}

/// Where a connection accepted on `here` goes, given each shard's open count: the least-loaded
/// shard (lowest index among equals) when it serves fewer than `here`, else `here`.
fn pick(open: impl IntoIterator<Item = usize>, here: usize) -> usize {
    // The first least-loaded shard, and here's own count: each count read once.
    let mut min = (usize::MAX, here);
    let mut at_here = 0;
    for (shard, n) in open.into_iter().enumerate() {
        if shard == here {
            at_here = n;
        }
        if n < min.0 {
            min = (n, shard);
        }
    }
    if at_here > min.0 {
        min.1
    } else {
        here
    }
}

/// One open connection counted on `shard`; uncounted when dropped (the handler's future ended,
/// or panicked, or was dropped at stop).
struct Open {
    open: Arc<[Count]>,
    shard: usize,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.open[self.shard].0.fetch_sub(1, Relaxed);
    }
}

impl ConnBalancer {
    /// Counts for `shards` shards (the executor's `shard_count()`). `Err(InvalidArgument)` for
    /// 0, and for more shards than any executor can have (`MAX_SHARDS_PER_CPU` times the
    /// 8192 CPUs Linux supports at most). Cost: one allocation of 128 bytes per shard.
    pub fn new(shards: usize) -> crate::Result<ConnBalancer> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(crate::Error::InvalidArgument(format!(
                "ConnBalancer::new({shards}): give the executor's shard_count() (1 to {MAX_SHARDS})"
            )));
        }
        Ok(ConnBalancer {
            open: (0..shards).map(|_| Count::default()).collect(),
        })
    }

    /// The open connections each shard serves now, in shard order. Cost: one `Vec` allocation
    /// and one relaxed load per shard.
    pub fn open_connections(&self) -> Vec<usize> {
        self.open.iter().map(|c| c.0.load(Relaxed)).collect()
    }

    /// Counts a new connection accepted on `here` on the shard that should serve it, and
    /// returns that shard with the count's guard.
    fn place(&self, here: usize) -> Open {
        // Read in place: `open_connections` allocates, once per accepted connection here.
        self.count_on(pick(self.open.iter().map(|c| c.0.load(Relaxed)), here))
    }

    /// Counts one more open connection on `shard`; the guard uncounts it.
    fn count_on(&self, shard: usize) -> Open {
        self.open[shard].0.fetch_add(1, Relaxed);
        Open {
            open: self.open.clone(),
            shard,
        }
    }

    /// Accepts connections on `listener` (bound on the current shard, typically with
    /// [`TcpListener::bind_reuseport`]) until accepting fails, and runs `handler(stream, peer)`
    /// for each as a task on the shard with the fewest open connections; the connection counts
    /// there until the handler's future completes. Transient accept errors are skipped and
    /// descriptor exhaustion backs off, as in [`TcpListener::accept`]; another error is
    /// returned. A full ring to the chosen shard makes the acceptor wait (backpressure);
    /// dropped while it waits, this future has the connection it holds served here, as those
    /// it handed over before are still served. A
    /// connection handed over while the executor stops goes the way of the other tasks: closed
    /// with them, or, if its message reaches a loop that already left its shutdown, kept for
    /// the next `run()` (and counted open) until that run serves it or the executor drops.
    ///
    /// Cost per connection: the counts read (one relaxed load per shard), an atomic add and
    /// subtract on the count and another pair on its guard's `Arc`, one task allocation and a
    /// clone of `handler`, wherever it is served; a handed-over connection adds its
    /// descriptor's release from the accepting loop's driver (as
    /// [`TcpStream::into_std`]'s: an `io_uring_enter` when that loop has entries queued), an
    /// atomic add on the target loop's count of task references, one ring message (a wait for
    /// room in that ring when it is full) and a reference count on the tasks' shared name.
    /// `Err` at once off any xtc loop, or if the balancer was made for another number of shards
    /// than the executor has.
    pub async fn serve<H, Fut>(&self, listener: TcpListener, handler: H) -> io::Result<()>
    where
        H: Fn(TcpStream, SocketAddr) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let here = crate::shard::try_id().ok_or_else(|| {
            io::Error::other("xtc: ConnBalancer::serve called off any xtc loop: run it in a task")
        })?;
        let shards = crate::shard::count();
        if shards != self.open.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "xtc: ConnBalancer for {} shards used on an executor of {shards}: \
                     create it with the executor's shard_count()",
                    self.open.len()
                ),
            ));
        }
        let exec_id = crate::context::with_core(|c| c.shared.exec_id).unwrap_or_default();
        // One name for every connection task handed over, shared by reference count.
        let name: crate::task::TaskName = Arc::new("xtc::net::ConnBalancer connection".into());
        loop {
            let (stream, peer) = listener.accept().await?;
            let open = self.place(here);
            if open.shard == here {
                serve_here(stream, peer, open, &handler);
                continue;
            }
            // Held across the wait for room: dropped there, it is served here (`Accepted`).
            let mut accepted = Accepted {
                conn: Some((stream, peer)),
                here,
                exec_id,
                balancer: self,
                handler: &handler,
            };
            let waited =
                crate::shard::reserve_on(open.shard, "xtc::net::ConnBalancer::serve").await;
            let (stream, peer) = accepted.conn.take().expect("taken only here");
            match waited {
                Ok(owner) => {
                    let fd: OwnedFd = match stream.into_fd() {
                        Ok(fd) => fd,
                        Err(e) => {
                            // Not reached (a stream just accepted has read nothing); if it
                            // ever is, the connection is served here, its bytes kept.
                            drop((owner, open));
                            serve_here(e.into_inner(), peer, self.count_on(here), &handler);
                            continue;
                        }
                    };
                    let handler = handler.clone();
                    // `make` captures only `Send` values (the descriptor, the address, the
                    // handler and the count guard's `Arc`), as `spawn_raw` requires of a task
                    // built on another loop; the stream is rebuilt there.
                    let make = move || {
                        let stream = TcpStream::from_fd(fd);
                        async move {
                            let _open = open;
                            handler(stream, peer).await;
                        }
                    };
                    assert_send(&make);
                    drop(crate::task::spawn_raw(
                        owner,
                        make,
                        TaskInfo::here(Some(name.clone())),
                        0,
                    ));
                }
                Err(_) => {
                    // Not reached (the shard count was checked above); if it ever is, the
                    // connection is served here rather than dropped.
                    drop(open);
                    serve_here(stream, peer, self.count_on(here), &handler);
                }
            }
        }
    }
}

/// A connection `serve` accepted and has not handed over yet: it waits for room in the ring
/// to the shard chosen for it. Dropped with it (`serve`'s future dropped there: a `select!`,
/// a timeout, an abort), the connection is served on the accepting shard, as the connections
/// handed over before the drop still are; it was closed unserved, its client (connected and
/// accepted) reading end of stream with nothing logged. Off that loop (its future dropped
/// by a sweep), the connection is closed with a warning.
struct Accepted<'a, H, Fut>
where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    conn: Option<(TcpStream, SocketAddr)>,
    here: usize,
    /// The executor of the loop `serve` runs on (`LoopShared::exec_id`).
    exec_id: u64,
    balancer: &'a ConnBalancer,
    handler: &'a H,
}

impl<H, Fut> Drop for Accepted<'_, H, Fut>
where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    fn drop(&mut self) {
        let Some((stream, peer)) = self.conn.take() else {
            return;
        };
        let on_its_loop = crate::context::with_core(|c| {
            c.shared.exec_id == self.exec_id && c.index() == self.here
        })
        .unwrap_or(false);
        if on_its_loop {
            serve_here(
                stream,
                peer,
                self.balancer.count_on(self.here),
                self.handler,
            );
        } else {
            tracing::warn!(
                %peer,
                "xtc: ConnBalancer::serve dropped off its loop while it handed a connection \
                 over: the connection is closed unserved"
            );
        }
    }
}

/// Compile-time check that a closure handed to another loop is `Send`.
fn assert_send<T: Send>(_: &T) {}

/// Runs the handler for a connection that stays on this shard (a detached local task). The
/// handler is called inside that task, as on another shard, so a panic in the call is the
/// task's (its loop goes on) and never unwinds the accept loop. Cost: one clone of the handler.
fn serve_here<H, Fut>(stream: TcpStream, peer: SocketAddr, open: Open, handler: &H)
where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handler = handler.clone();
    drop(crate::shard::spawn_local(async move {
        let _open = open;
        handler(stream, peer).await;
    }));
}

#[cfg(test)]
mod tests {
    use super::{pick, ConnBalancer};

    /// A count no executor can have is refused with an error, as 0 is: it panicked (capacity
    /// overflow) or aborted the process (an allocation of 128 bytes per count that failed).
    #[test]
    fn new_refuses_a_count_no_executor_has() {
        for n in [usize::MAX, usize::MAX / 128, 1 << 40] {
            let e = ConnBalancer::new(n).expect_err("no executor has that many shards");
            assert!(matches!(e, crate::Error::InvalidArgument(_)), "{n}: {e}");
        }
        assert_eq!(ConnBalancer::new(3).unwrap().open_connections(), [0, 0, 0]);
    }

    #[test]
    fn pick_keeps_ties_local_and_moves_to_the_least_loaded() {
        assert_eq!(pick([0], 0), 0);
        assert_eq!(pick([3, 3, 3], 1), 1, "a tie stays where it was accepted");
        assert_eq!(pick([4, 3, 3], 0), 1, "lowest index among the least loaded");
        assert_eq!(pick([4, 5, 2], 1), 2);
        assert_eq!(pick([2, 5, 2], 2), 2, "here is among the least loaded");
        assert_eq!(pick([1, 0], 0), 1);
        assert_eq!(pick([0, 1], 0), 0);
    }
}
