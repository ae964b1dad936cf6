//! Channels: [`shared`] between shards (its ends are `Send`), [`local`] within one shard (`!Send`,
//! no atomics).
//!
//! Both are bounded: a full channel makes `send` wait (backpressure), and both report closing:
//! `recv` gives `None` once every sender is gone and the channel is empty, `send` gives the value
//! back in a [`SendError`] once the receiver is gone.
//!
//! # Other ways to wait
//!
//! xtc has no oneshot, notify, semaphore or async lock of its own: well-kept crates do those,
//! and their futures work in xtc tasks on any shard, since xtc's wakers may be woken from any
//! thread (a wake from another shard travels over the ring mesh; from a plain thread, through
//! the target loop's inbox). Pick by what is shared:
//!
//! - one value back, once: `futures::channel::oneshot` (its ends are `Send`);
//! - a bounded number of holders (connections, in-flight requests), or an async `Mutex` /
//!   `RwLock` / `Barrier` held across an `.await`: the `async-lock` crate (`Semaphore`, ...);
//!   within one shard, a `RefCell` borrow that ends before the next `.await` needs no lock;
//! - a notification (tokio's `Notify`): the `event-listener` crate, or a [`shared`] or
//!   [`local`] channel of `()`.
//!
//! Each costs what its crate says: atomics, and on a cross-shard wake one ring message (plus a
//! ping if the target sleeps), as any wake does. A blocking wait on one inside a task blocks
//! its loop (see "Blocking a loop" in the crate docs): await them instead.
//!
//! ```
//! # use xtc_shards as xtc;
//! use std::sync::Arc;
//! let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
//! let total = exec.block_on(|| async {
//!     // At most 2 holders at a time, across both shards.
//!     let permits = Arc::new(async_lock::Semaphore::new(2));
//!     let mut waits = Vec::new();
//!     for i in 0..8u64 {
//!         let (tx, rx) = futures::channel::oneshot::channel();
//!         let permits = permits.clone();
//!         xtc::shard::send_to(i as usize % 2, move || async move {
//!             let _held = permits.acquire_arc().await;
//!             xtc::yield_now().await;
//!             let _ = tx.send(i * 10);
//!         })
//!         .await
//!         .expect("both shards run");
//!         waits.push(rx);
//!     }
//!     let mut total = 0;
//!     for rx in waits {
//!         total += rx.await.expect("every call answers");
//!     }
//!     total
//! })?;
//! assert_eq!(total, 280);
//! # Ok::<(), xtc::Error>(())
//! ```

pub mod local;
pub mod shared;

/// Items an end moves in a row without waiting (`send`, `send_many`, `recv`, `recv_many` of
/// [`shared`]; `recv` of [`local`]) before its next call yields first, ending its loop's batch:
/// a consumer whose producer on another shard keeps the ring from ever emptying (or a
/// producer whose consumer keeps it from ever filling, or a task feeding its own local
/// channel) never returned `Pending` and held its loop (timers, the inbox, `submit_to` calls,
/// other tasks) for as long as the stream lasted. 1,024, a benchmark ring's worth: a few
/// microseconds of transfers, where an epoll call's budget (`io::COOP_BUDGET`) counts system
/// calls of about a microsecond each.
const CHANNEL_BUDGET: u32 = 1024;

/// An end's run of items moved without waiting ([`CHANNEL_BUDGET`]): a plain field of the end
/// (its calls take `&mut self`), so the per-message path reads no thread-local.
#[derive(Debug, Default)]
struct Run(u32);

impl Run {
    /// At the budget: the run starts over, the loop's batch ends after this poll and the
    /// task is woken (`context::yield_ending_batch`); the caller returns `Pending` before it
    /// moves anything, so a call dropped while it yields moved nothing. Cost: a compare.
    #[inline]
    fn yield_first(&mut self, cx: &Context<'_>) -> bool {
        if self.0 < CHANNEL_BUDGET {
            return false;
        }
        self.0 = 0;
        crate::context::yield_ending_batch(cx.waker());
        true
    }

    /// `n` items moved without waiting.
    #[inline]
    fn moved(&mut self, n: usize) {
        self.0 = self.0.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// The end waits: the run starts over.
    #[inline]
    fn waited(&mut self) {
        self.0 = 0;
    }
}

use std::{fmt, task::Context};

/// The receiver is gone; the value comes back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sending on a channel whose receiver was dropped")
    }
}

impl<T> std::error::Error for SendError<T> {}

/// Why [`try_send`](shared::Sender::try_send) did not send; the value comes back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum TrySendError<T> {
    /// The channel is full (retrying later is not an error).
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrySendError::Full(_) => "the channel is full: retry later, or await send",
            TrySendError::Closed(_) => "sending on a channel whose receiver was dropped",
        })
    }
}

impl<T> std::error::Error for TrySendError<T> {}

/// Why [`try_recv`](shared::Receiver::try_recv) gave nothing.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum TryRecvError {
    /// Nothing queued now.
    Empty,
    /// Nothing queued and every sender is gone.
    Closed,
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TryRecvError::Empty => "the channel is empty: retry later, or await recv",
            TryRecvError::Closed => "the channel is empty and every sender was dropped",
        })
    }
}

impl std::error::Error for TryRecvError {}

/// Checks a capacity argument: at least 1, and few enough slots of `T` that their bytes fit in
/// an allocation (`isize::MAX`); beyond that rtrb and `Vec` would panic. Within it, a shared
/// channel still allocates its ring up front, and checks that a large one can be allocated
/// (`shared::bounded`).
fn check_capacity<T>(capacity: usize) -> crate::Result<usize> {
    let slot = std::mem::size_of::<T>().max(1);
    if capacity == 0 {
        Err(crate::Error::InvalidArgument(
            "a channel's capacity must be at least 1".into(),
        ))
    } else if capacity > isize::MAX as usize / slot {
        Err(crate::Error::InvalidArgument(format!(
            "a channel capacity of {capacity} slots of {slot} byte(s) does not fit in memory: \
             use a smaller capacity"
        )))
    } else {
        Ok(capacity)
    }
}

/// Drops a dropped receiver's queued values, each in place (a value may be larger than a
/// stack) by `drop_one`, which drops the oldest and returns whether there was one. Each drop
/// runs under `catch_unwind`; the first panic a value's `Drop` raised resumes once all are
/// gone (later payloads are dropped, guarded). A plain drain stopped at the first panic and
/// left the values behind it queued; a collection's own drop goes on after it, but a second
/// panic then aborts the process.
fn drop_queued(mut drop_one: impl FnMut() -> bool) {
    let mut first_panic = None;
    loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut drop_one)) {
            Ok(true) => {}
            Ok(false) => break,
            Err(p) => match first_panic {
                None => first_panic = Some(p),
                Some(_) => crate::task::drop_payload(p),
            },
        }
    }
    if let Some(p) = first_panic {
        std::panic::resume_unwind(p);
    }
}
