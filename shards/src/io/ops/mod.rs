//! The operations, one file per family, each with its io_uring and its epoll path side by side
//! (io/mod.rs). Every function runs on the current loop's driver.

pub(crate) mod accept;
pub(crate) mod connect;
pub(crate) mod file;
pub(crate) mod msg;
pub(crate) mod rw;

use std::io;

use super::{current_kind, uring::Op, Driver};

/// Puts `item`, a kept operation, into `kept`, oldest first: by `number`, its place from when
/// it was first kept (an operation a later call took from `kept` and dropped again goes back
/// there, not behind younger ones), or, kept for the first time, at the back with the next
/// number from `next`. Shared by a listener's kept accepts (`accept::Kept`) and a UDP socket's
/// kept receives: each hands out the one that completed first ([`next_kept`]), else the
/// oldest, so connections and datagrams keep the kernel's order. Cost: a binary search of `kept` (usually empty or one long).
pub(crate) fn keep_in_order<T>(
    kept: &mut std::collections::VecDeque<(u64, T)>,
    next: &std::cell::Cell<u64>,
    number: Option<u64>,
    item: T,
) {
    let n = number.unwrap_or_else(|| {
        let n = next.get();
        next.set(n + 1);
        n
    });
    let at = kept.partition_point(|&(m, _)| m < n);
    kept.insert(at, (n, item));
}

/// Of the operations in `kept`, the one to hand out next: the one whose completion was reaped
/// first (`place`: `Op::completed_at`, see [`earliest`]), or,
/// with none reaped, the front one. Kept in the order they were dropped, two operations that
/// completed in the other order came out swapped (a receive that took "one", dropped after
/// one that took "two" from the same socket, came second), and a reaped one waited behind
/// one still in the kernel, which can only complete after it. `None` when `kept` is empty.
/// Cost: a scan of `kept` (usually empty or one long).
pub(crate) fn next_kept<T>(
    kept: &std::collections::VecDeque<(u64, T)>,
    place: impl Fn(&T) -> Option<(u64, u64)>,
) -> Option<usize> {
    if kept.is_empty() {
        return None;
    }
    Some(earliest(kept, place).unwrap_or(0))
}

/// Of the operations in `kept`, the one whose completion `place` reaped first: by driver,
/// then by place in that driver's order (a socket moves to a loop made after the one it
/// left, and driver ids count up: `next_driver_id`, so the completions of an earlier driver,
/// reaped by its shutdown at the latest, came first); `None` with none known. Compared only
/// within the first known one's driver, an accept that took the first client just before
/// its driver went came after one a later driver reaped.
pub(crate) fn earliest<T>(
    kept: &std::collections::VecDeque<(u64, T)>,
    place: impl Fn(&T) -> Option<(u64, u64)>,
) -> Option<usize> {
    let mut best: Option<(usize, (u64, u64))> = None;
    for (i, (_, item)) in kept.iter().enumerate() {
        let Some(at) = place(item) else { continue };
        if best.is_none_or(|(_, b)| at < b) {
            best = Some((i, at));
        }
    }
    best.map(|(i, _)| i)
}

/// Where a call's own result, reaped at `own` (`Op::completed_at`), goes in `kept` when a
/// kept operation that `took` something (a connection, a datagram) was reaped before it, by
/// its driver or by an earlier one of the thread (places compare as (driver id, place), as in
/// [`earliest`]; compared within one driver only, a datagram an earlier driver reaped came
/// after a later driver's): `(index, number)`, right behind the last such one and with its number,
/// so the queue stays in number order ([`keep_in_order`] puts one given back before those of
/// an equal number). `None` if none was: the result is the call's to return. Handed out at
/// once, it came before what the kernel had handed the kept one earlier. Shared by a
/// listener's accepts and a UDP socket's receives. Cost: a scan of `kept` (usually empty).
pub(crate) fn behind_earlier<T>(
    kept: &std::collections::VecDeque<(u64, T)>,
    own: (u64, u64),
    took: impl Fn(&T) -> bool,
    place: impl Fn(&T) -> Option<(u64, u64)>,
) -> Option<(usize, u64)> {
    let i = kept
        .iter()
        .rposition(|(_, item)| took(item) && place(item).is_some_and(|at| at < own))?;
    Some((i + 1, kept[i].0))
}

/// The end of a dropped, cancelled-in-place operation that is kept (a listener's accept, a UDP
/// socket's receive): [`keep_in_order`] in `kept`, and only then drops `waker`, the one the
/// operation forgot (`Op::unwait_later`). A waker's drop is user code, which may use the same
/// socket: dropped first, it could keep an operation of its own ahead of this one (which took
/// the next connection or datagram), and the next calls handed the two out swapped. If `kept`
/// is borrowed (a waker's or buffer's drop inside a call that holds it), `item` is dropped
/// instead, after the waker: its `Op`'s own drop then ends what won the cancel's race.
pub(crate) fn keep_dropped<T>(
    kept: &std::cell::RefCell<std::collections::VecDeque<(u64, T)>>,
    next: &std::cell::Cell<u64>,
    number: Option<u64>,
    item: T,
    waker: Option<std::task::Waker>,
) {
    let item = match kept.try_borrow_mut() {
        Ok(mut kept) => {
            keep_in_order(&mut kept, next, number, item);
            None
        }
        Err(_) => Some(item),
    };
    drop(waker);
    drop(item);
}

/// The calls of a socket that keeps dropped operations (a listener's accepts, a UDP socket's
/// receives) that wait on an operation of their own, by id: each kept operation wakes them
/// ([`wake_all`](Self::wake_all)), since it may hold (or still get, before its cancel lands)
/// what one of them waits for, a connection or a datagram, and, unwaited, wakes nobody when
/// it does; a woken call that finds operations kept cancels its own in place (so it keeps
/// its buffer) and, once that resolved with nothing, takes the kept ones over, in order,
/// as the next call would. Cost: nothing while no operation is kept; a waker clone per
/// waiting call, and a vector scan per poll, while some calls wait.
#[derive(Debug, Default)]
pub(crate) struct OwnWaiters {
    waiting: std::cell::RefCell<Vec<(u64, std::task::Waker)>>,
    /// The id of the next entry.
    next: std::cell::Cell<u64>,
}

impl OwnWaiters {
    /// Lists `waker` as a call waiting on an operation of its own, under `id` if it has one
    /// already; returns its id. The clone and a replaced waker's drop (user code) run outside
    /// the borrow.
    pub(crate) fn wait(&self, id: Option<u64>, waker: &std::task::Waker) -> u64 {
        if let Some(id) = id {
            let same = self
                .waiting
                .borrow()
                .iter()
                .any(|(i, w)| *i == id && w.will_wake(waker));
            if same {
                return id;
            }
        }
        let id = id.unwrap_or_else(|| {
            let id = self.next.get();
            self.next.set(id + 1);
            id
        });
        let waker = waker.clone();
        let mut waiting = self.waiting.borrow_mut();
        let old = match waiting.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => Some(std::mem::replace(w, waker)),
            None => {
                waiting.push((id, waker));
                None
            }
        };
        drop(waiting);
        drop(old);
        id
    }

    /// Takes entry `id` off the list, if it is still there (a wake takes them all); its waker
    /// is dropped outside the borrow.
    pub(crate) fn leave(&self, id: u64) {
        let mut waiting = self.waiting.borrow_mut();
        let old = waiting
            .iter()
            .position(|(i, _)| *i == id)
            .map(|at| waiting.swap_remove(at));
        drop(waiting);
        drop(old);
    }

    /// Wakes every listed call (an operation was just kept); each lists itself again when it
    /// waits on.
    pub(crate) fn wake_all(&self) {
        let waiting = std::mem::take(&mut *self.waiting.borrow_mut());
        for (_, w) in waiting {
            crate::task::wake_guarded(w);
        }
    }
}

/// The error of a call of a socket on a loop run while the loop of this thread whose driver
/// runs the socket's kept `what` (a dropped call's operation, still in the kernel) is hidden
/// (`context::off_loop`: a swept drop's `LocalExecutor::block_on`): that driver is reaped only
/// once its loop turns again, after the section, so waiting for it from here waited for good
/// (the section waited for the call). `to_do`: the call to make on the socket's own loop.
pub(crate) fn kept_elsewhere_error(what: &str, to_do: &str) -> io::Error {
    io::Error::other(format!(
        "xtc: this socket's kept {what} runs on the I/O driver of a loop of this thread that is \
         hidden while an executor frees its tasks, and cannot be waited for from a loop run \
         meanwhile; {to_do} on the socket's own loop"
    ))
}

/// Whether `op` is still in the kernel of a driver the running loop cannot wait on
/// ([`uring::driver_elsewhere`](super::uring::driver_elsewhere): a loop of this thread that
/// `context::off_loop` hides). Cost: a thread-local read, and a slab lookup for a driver
/// that is not the running loop's.
pub(crate) fn waits_elsewhere<T>(op: &Op<T>) -> bool {
    super::uring::driver_elsewhere(op.driver_id()) && op.completed().is_none()
}

/// Which path to take: `Err` off any loop or on a loop without a driver.
pub(crate) fn backend() -> io::Result<Driver> {
    current_kind()
}

/// [`backend`] for an operation that owns its buffer: on an error, returns `(Err, buf)` from
/// the calling function, handing the buffer back.
macro_rules! backend_or_give_back {
    ($buf:expr) => {
        match $crate::io::ops::backend() {
            Ok(kind) => kind,
            Err(e) => return (Err(e), $buf),
        }
    };
}
pub(crate) use backend_or_give_back;

/// Starts an io_uring operation on the current loop (the caller checked the backend); on
/// failure the data comes back with the error.
pub(crate) fn submit<T: 'static>(
    data: T,
    build: impl FnOnce(&mut T) -> io_uring::squeue::Entry,
) -> Result<Op<T>, (io::Error, T)> {
    let mut data = Some(data);
    // This thread's loop (the first `with_own_core` finds, as `with_reactor`), also hidden by
    // `context::off_loop`.
    let mut build = Some(build);
    let r = crate::context::with_own_core(|c| {
        Some(match &c.io {
            super::Reactor::Uring(u) => build
                .take()
                .map(|build| u.submit(data.take().expect("taken once"), build)),
            _ => None,
        })
    })
    .flatten();
    match r {
        Some(r) => r,
        None => Err((
            io::Error::other(
                "xtc: this loop has no io_uring (the driver changed under an operation)",
            ),
            data.take().expect("not taken"),
        )),
    }
}

/// Starts an io_uring `POLL_ADD` for `events` (`POLLIN`, `POLLOUT`, ..) on `fd`: its
/// completion says the descriptor became ready (or failed). For a call that must wait on an
/// io_uring loop where xtc has no operation of its own for it.
pub(crate) fn poll_add(fd: std::os::fd::RawFd, events: i16) -> io::Result<Op<()>> {
    submit((), |_| {
        io_uring::opcode::PollAdd::new(io_uring::types::Fd(fd), events as u16 as u32).build()
    })
    .map_err(|(e, ())| e)
}

/// The registered-buffer index of `buf` if it is registered with the io_uring that [`submit`]
/// uses (the first loop `with_own_core` finds: the running one, if any). Only that ring:
/// with a loop run while the pool's own was hidden (`context::off_loop`), the pool's driver
/// was found among the hidden loops, and the running loop submitted a fixed operation naming
/// a buffer its ring never registered (`EFAULT`).
pub(crate) fn fixed_index<B: super::IoBuf>(buf: &B) -> Option<u16> {
    let (id, index) = buf.fixed_index()?;
    crate::context::with_own_core(|c| {
        Some(match &c.io {
            super::Reactor::Uring(u) if u.id() == id => Some(index),
            _ => None,
        })
    })
    .flatten()
}

/// `-1` → the thread's errno as `io::Error`.
pub(crate) fn cvt<T: PartialOrd + Default>(rc: T) -> io::Result<T> {
    if rc < T::default() {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
