//! [`Source`]: a descriptor owned by an I/O object, and its epoll registration; the readiness
//! future of the epoll path (epoll.rs, rules 1–4).

use std::{
    cell::{Cell, RefCell},
    future::Future,
    io,
    marker::PhantomData,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    pin::Pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use super::{
    epoll::{Dir, Epoll},
    ops::poll_add,
    uring::Op,
    Reactor,
};
use crate::context;

/// A descriptor and, on epoll, its slot in the driver that last waited on it. `!Send`.
#[derive(Debug)]
pub(crate) struct Source {
    fd: Option<OwnedFd>,
    /// Whether a short read shows the fd drained (epoll.rs rule 1). Not on a Unix stream,
    /// where a read also stops at a message carrying descriptors or other credentials, with
    /// data queued behind it and no new event to come.
    short_read_drains: bool,
    /// Whether a write that waits for room is also retried now and then, on a timer
    /// ([`WriteRecheck`]): on a Unix stream, whose poll reports no event when the peer shuts
    /// its read side (its writes fail with `EPIPE` from then on).
    recheck_writes: bool,
    /// That timer, one per epoll driver of this thread a write waits in (made at the first
    /// write that waits there): with one for the driver waited in last, a loop run while this
    /// one was hidden (`context::off_loop`) replaced or stopped this loop's, and a write still
    /// waiting here was never rechecked again.
    write_recheck: RefCell<Vec<WriteRecheck>>,
    /// `(driver id, token)` of the epoll registration in use.
    reg: Cell<Option<(u64, usize)>>,
    /// Its registrations in other drivers of this thread, left for `reg` when it waited on
    /// another loop (one run while theirs was hidden, `context::off_loop`): taken up again
    /// when it waits on such a driver again (the descriptor is still in that epoll set under
    /// that slot, whose waiters wait on), and deregistered with `reg` when it closes. Forgotten,
    /// such a slot and the waits left in it stayed in its driver for good, counted as I/O in
    /// flight, so that loop never went idle.
    others: RefCell<Vec<(u64, usize)>>,
    _local: PhantomData<*const ()>,
}

impl Source {
    pub(crate) fn new(fd: OwnedFd) -> Source {
        Source {
            fd: Some(fd),
            short_read_drains: true,
            recheck_writes: false,
            write_recheck: RefCell::new(Vec::new()),
            reg: Cell::new(None),
            others: RefCell::new(Vec::new()),
            _local: PhantomData,
        }
    }

    /// A Unix-domain stream's source: its reads clear readiness only on `EAGAIN` (see
    /// [`Source::short_read_drains`]), and its writes that wait for room are retried on a
    /// timer too ([`Source::recheck_writes`]). Cost: on epoll, one `recv` more per read
    /// wake-up; per write that waits, a timer (a `send` per expiry while it still waits).
    pub(crate) fn unix_stream(fd: OwnedFd) -> Source {
        Source {
            fd: Some(fd),
            short_read_drains: false,
            recheck_writes: true,
            write_recheck: RefCell::new(Vec::new()),
            reg: Cell::new(None),
            others: RefCell::new(Vec::new()),
            _local: PhantomData,
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// The descriptor, borrowed for as long as the source (what the I/O types' `AsFd` gives).
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        // Only `into_fd` (by value) and `Drop` take the descriptor out.
        self.fd
            .as_ref()
            .expect("a Source holds its fd until dropped")
            .as_fd()
    }

    /// The slot of this source in `e`, registering it there first if needed.
    pub(crate) fn token(&self, e: &Epoll) -> usize {
        match self.reg.get() {
            Some((id, t)) if id == e.id() => t,
            current => {
                // Another driver (rare: a loop run while another was hidden, or a later run):
                // the one in use joins `others`, which forgets the drivers that are gone, and
                // a slot this source already has in `e` is taken up again.
                let mut others = self.others.borrow_mut();
                others.extend(current);
                others.retain(|&(id, _)| reachable(id));
                let earlier = others
                    .iter()
                    .position(|&(id, _)| id == e.id())
                    .map(|i| others.swap_remove(i).1);
                drop(others);
                let t = match earlier {
                    Some(t) if e.holds(t, self.fd()) => t,
                    _ => e.register(self.fd()),
                };
                self.reg.set(Some((e.id(), t)));
                t
            }
        }
    }

    fn deregister(&self) {
        let regs = self.reg.take().into_iter().chain(self.others.take());
        for (id, t) in regs {
            // Also on a loop `off_loop` hides: it still owns the registration.
            context::with_own_core(|c| match &c.io {
                Reactor::Epoll(e) if e.id() == id => {
                    e.deregister(t);
                    Some(())
                }
                _ => None,
            });
        }
    }

    /// This end shut `dir` down: on each epoll driver of this thread where it is registered,
    /// the direction turns ready for good and its waiters are woken to fail
    /// ([`Epoll::shut`]). Nothing on io_uring, whose waiting operations see it themselves.
    pub(crate) fn shut(&self, dir: Dir) {
        // Collected first: the wake-ups are user code, which may use this source again.
        let regs: Vec<(u64, usize)> = self
            .reg
            .get()
            .into_iter()
            .chain(self.others.borrow().iter().copied())
            .collect();
        for (id, t) in regs {
            context::with_own_core(|c| match &c.io {
                Reactor::Epoll(e) if e.id() == id => {
                    e.shut(t, dir);
                    Some(())
                }
                _ => None,
            });
        }
    }

    /// Gives up the descriptor (deregistered; io_uring entries naming it submitted first, see
    /// [`submit_queued`](super::submit_queued): its next owner may close it). If that submit
    /// fails (`EAGAIN`, `EBUSY`), the new owner gets a duplicate, and the number the queued
    /// entries name stays open until they are submitted ([`close_after_submit`]): handed
    /// over as it was, it was closed by its new owner and taken by the next socket, and a
    /// dropped write's queued `SEND` went out on that one. Cost: a `dup` only then.
    ///
    /// [`close_after_submit`]: super::close_after_submit
    pub(crate) fn into_fd(mut self) -> OwnedFd {
        self.deregister();
        let fd = self.fd.take().expect("a Source holds its fd until dropped");
        if super::submit_queued() {
            return fd;
        }
        match fd.try_clone() {
            Ok(dup) => {
                super::close_after_submit(fd);
                dup
            }
            Err(e) => {
                tracing::warn!(
                    "xtc: could not duplicate a descriptor given up while io_uring entries \
                     naming it are queued ({e}); handed over as it is"
                );
                fd
            }
        }
    }

    /// Polls a non-blocking call `f` by the readiness protocol (epoll.rs rules 1–3); `drained`
    /// says whether a successful result shows the fd drained for `dir` (a short stream read or
    /// write). Only on the epoll driver.
    ///
    /// `id` is the caller's registration id (`Epoll::new_registration`), for callers that
    /// remove their waker when dropped, or `epoll::ANON`.
    pub(crate) fn poll_ready<R>(
        &self,
        e: &Epoll,
        dir: Dir,
        cx: &mut Context<'_>,
        f: &mut impl FnMut(RawFd) -> io::Result<R>,
        drained: impl Fn(&R) -> bool,
        id: u64,
    ) -> Poll<io::Result<R>> {
        let token = self.token(e);
        if e.is_ready(token, dir) && !context::coop_spend() {
            // Out of budget: yield before the call (dropped while it yields, it did nothing).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let recheck = dir == Dir::Write && self.recheck_writes;
        loop {
            while e.is_ready(token, dir) {
                match f(self.fd()) {
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                        e.clear_would_block(token, dir);
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Ok(r) => {
                        if drained(&r) && (dir == Dir::Write || self.short_read_drains) {
                            e.clear_ready(token, dir);
                        }
                        if recheck {
                            self.write_settled(e, token);
                        }
                        return Poll::Ready(Ok(r));
                    }
                    Err(err) => {
                        if recheck {
                            self.write_settled(e, token);
                        }
                        return Poll::Ready(Err(err));
                    }
                }
            }
            match e.add_waiter(token, dir, cx.waker(), id) {
                Ok(true) => {
                    if recheck {
                        self.arm_write_recheck(e, token);
                    }
                    return Poll::Pending;
                }
                // Ready meanwhile (an event dispatched by user code in the waker's clone).
                Ok(false) => continue,
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }
}

impl Source {
    /// A write of this source waits on slot `token` of `e`: makes sure the recheck timer runs
    /// (its first expiry [`RECHECK_FIRST`] after the first wait, each later one twice as far
    /// up to [`RECHECK_MAX`]), so the write is retried even if no event ever comes for it
    /// ([`Epoll::recheck`]). Runs no user code: the timer's waker is the source's own.
    fn arm_write_recheck(&self, e: &Epoll, token: usize) {
        let mut timers = self.write_recheck.borrow_mut();
        let at = (e.id(), token);
        // Those of drivers gone (a loop run while this one was hidden, ended since) go; those
        // of the others stay, for the writes that wait there.
        timers.retain(|r| r.at.0 == at.0 || reachable(r.at.0));
        let i = match timers.iter().position(|r| r.at.0 == at.0) {
            Some(i) => {
                if timers[i].at != at {
                    // Registered anew in this driver since: the waits are in the new slot.
                    timers[i] = WriteRecheck::new(at);
                }
                i
            }
            None => {
                timers.push(WriteRecheck::new(at));
                timers.len() - 1
            }
        };
        let r = &mut timers[i];
        loop {
            let delay = r.delay;
            let sleep = r.sleep.get_or_insert_with(|| crate::time::sleep(delay));
            match std::pin::Pin::new(sleep).poll(&mut Context::from_waker(&r.waker)) {
                Poll::Pending => return,
                // Fired (its recheck woke the waiters, this one among them, which found no
                // room again): the next one waits longer.
                Poll::Ready(()) => {
                    r.sleep = None;
                    r.delay = (r.delay * 2).min(RECHECK_MAX);
                }
            }
        }
    }

    /// A write of this source finished (sent, or failed) in slot `token` of `e`: that
    /// driver's recheck starts over at [`RECHECK_FIRST`] with the next wait, and its timer
    /// goes if no other write waits there. The timers of other drivers are not this one's to
    /// judge (their writes wait on).
    fn write_settled(&self, e: &Epoll, token: usize) {
        let mut timers = self.write_recheck.borrow_mut();
        let Some(r) = timers.iter_mut().find(|r| r.at == (e.id(), token)) else {
            return;
        };
        r.delay = RECHECK_FIRST;
        if r.sleep.is_some() && !e.has_waiters(token, Dir::Write) {
            r.sleep = None;
        }
    }
}

/// The first recheck of a waiting Unix stream write ([`Source::recheck_writes`]).
const RECHECK_FIRST: Duration = Duration::from_millis(10);
/// The longest time between two rechecks: a write waiting when the peer shut its read side
/// fails within about this long.
const RECHECK_MAX: Duration = Duration::from_secs(1);

/// The timer that retries a Unix stream's waiting writes ([`Source::arm_write_recheck`]).
struct WriteRecheck {
    /// `(driver id, token)` of the slot the writes wait in, which `waker` names.
    at: (u64, usize),
    /// Wakes the slot's writers ([`RecheckWake`]).
    waker: Waker,
    sleep: Option<crate::time::Sleep>,
    delay: Duration,
}

impl WriteRecheck {
    fn new(at: (u64, usize)) -> WriteRecheck {
        WriteRecheck {
            at,
            waker: Waker::from(std::sync::Arc::new(RecheckWake {
                driver: at.0,
                token: at.1,
            })),
            sleep: None,
            delay: RECHECK_FIRST,
        }
    }
}

impl std::fmt::Debug for WriteRecheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRecheck")
            .field("at", &self.at)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

/// The recheck timer's waker: wakes the writers waiting in slot `token` of epoll driver
/// `driver` to try again ([`Epoll::recheck`]). Woken by the loop's timers, on the thread
/// whose loops hold that driver; anywhere else (and once that driver is gone) it does
/// nothing.
struct RecheckWake {
    driver: u64,
    token: usize,
}

impl std::task::Wake for RecheckWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        context::with_own_core(|c| match &c.io {
            Reactor::Epoll(e) if e.id() == self.driver => {
                e.recheck(self.token, Dir::Write);
                Some(())
            }
            _ => None,
        });
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.deregister();
        if let Some(fd) = self.fd.take() {
            // Not before the entries still queued that may name its number are submitted
            // (`close_after_submit`).
            super::close_after_submit(fd);
        }
    }
}

/// Whether epoll driver `id` is alive on this thread (its loop running, or hidden by
/// `context::off_loop`).
pub(crate) fn reachable(id: u64) -> bool {
    context::with_own_core(|c| match &c.io {
        Reactor::Epoll(e) if e.id() == id => Some(()),
        _ => None,
    })
    .is_some()
}

/// A future running `f` on `src` by the readiness protocol; removes its waker when dropped
/// (epoll.rs rule 4).
pub(crate) struct Ready<'a, F, D> {
    src: &'a Source,
    dir: Dir,
    f: F,
    drained: Option<D>,
    /// `(driver id, registration id, token)` while this future may have a waker registered:
    /// the slot it waited in, which its drop (or a poll on another loop) clears. Not the slot
    /// its source names at the
    /// drop: a source used on another loop since (one run while this loop was hidden,
    /// `context::off_loop`) names that loop's slot, and the waker left here counted as a wait
    /// for good, so the loop never went idle.
    reg: Option<(u64, u64, usize)>,
    /// On an io_uring loop (one run while this future's epoll loop was hidden,
    /// `context::off_loop`): the `POLL_ADD` it waits on after its call got `EAGAIN`.
    poll_op: Option<Op<()>>,
}

impl<F, D> Unpin for Ready<'_, F, D> {}

/// Runs the non-blocking call `f` on `src`, waiting for `dir` readiness whenever it would block.
pub(crate) fn ready<R, F: FnMut(RawFd) -> io::Result<R>>(
    src: &Source,
    dir: Dir,
    f: F,
) -> Ready<'_, F, fn(&R) -> bool> {
    Ready {
        src,
        dir,
        f,
        drained: None,
        reg: None,
        poll_op: None,
    }
}

/// [`ready`] for a stream read or write of `len` bytes: a result shorter than `len` shows the
/// fd drained (epoll.rs rule 1), so the next call on it waits for an event first.
pub(crate) fn ready_stream<F: FnMut(RawFd) -> io::Result<usize>>(
    src: &Source,
    dir: Dir,
    len: usize,
    f: F,
) -> Ready<'_, F, impl Fn(&usize) -> bool> {
    Ready {
        src,
        dir,
        f,
        drained: Some(move |n: &usize| short(*n, len)),
        reg: None,
        poll_op: None,
    }
}

/// Whether a stream transfer of `n` of `len` bytes drained its fd: a read or write that moved
/// some bytes but fewer than asked (0 is end of stream, or an empty request: not a hint).
pub(crate) fn short(n: usize, len: usize) -> bool {
    n > 0 && n < len
}

impl<R, F, D> Future for Ready<'_, F, D>
where
    F: FnMut(RawFd) -> io::Result<R>,
    D: Fn(&R) -> bool,
{
    type Output = io::Result<R>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let this = &mut *self;
        let drained = |r: &R| this.drained.as_ref().is_some_and(|d| d(r));
        let dir = this.dir;
        let reg = &mut this.reg;
        // A wait on the running loop only: a loop `context::off_loop` hides would not
        // dispatch its event until the hidden section ends (`with_running_reactor`).
        let res = super::with_running_reactor(|r| match r {
            Reactor::Epoll(e) => {
                // One registration id per future and driver (a future polled on another loop
                // registers anew there). Its wait in the driver it left goes first: that entry
                // is this future's only, and its drop clears only the registration it holds
                // last, so the entry stayed, counted as a wait for as long as the source
                // lived (a future polled on a loop run while its own was hidden,
                // `context::off_loop`, then dropped on its own: that loop never went idle).
                let id = match *reg {
                    Some((driver, id, _)) if driver == e.id() => id,
                    Some((driver, id, t)) => {
                        remove_wait(driver, t, dir, id);
                        e.new_registration()
                    }
                    None => e.new_registration(),
                };
                // The slot `poll_ready` waits in (registered now if the source has none here).
                *reg = Some((e.id(), id, this.src.token(e)));
                // A `POLL_ADD` of an io_uring loop it waited on before is no longer waited for.
                this.poll_op = None;
                Ok(Some(this.src.poll_ready(
                    e,
                    this.dir,
                    cx,
                    &mut this.f,
                    drained,
                    id,
                )))
            }
            _ => {
                // Not epoll (a later io_uring loop of this thread): a wait left on the epoll
                // loop this future came from goes, as above; the call is made below.
                if let Some((driver, id, t)) = reg.take() {
                    remove_wait(driver, t, dir, id);
                }
                Ok(None)
            }
        });
        let res = match res {
            Ok(None) => Ok(this.poll_uring(cx)),
            Ok(Some(p)) => Ok(p),
            Err(e) => Err(e),
        };
        match res {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(r)) => {
                // Done: nothing of ours is left registered (a success or error returned
                // without adding a waiter; one added earlier was taken by the event that woke
                // us). Forgetting the id makes `Drop` skip the removal.
                this.reg = None;
                Poll::Ready(r)
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl<R, F, D> Ready<'_, F, D>
where
    F: FnMut(RawFd) -> io::Result<R>,
{
    /// The call on an io_uring loop: made, and on `EAGAIN` a `POLL_ADD` for the direction is
    /// waited on before it is made again. Returned as it was, that `EAGAIN` reached a caller
    /// who had asked to wait (`WouldBlock` from an `await`).
    fn poll_uring(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        loop {
            if let Some(op) = self.poll_op.as_mut() {
                let (res, ()) = std::task::ready!(Pin::new(op).poll(cx));
                self.poll_op = None;
                // Cancelled by its driver's shutdown (this future outlived that loop): the
                // call answers where the fd stands.
                if res < 0 && res != -libc::ECANCELED {
                    return Poll::Ready(Err(io::Error::from_raw_os_error(-res)));
                }
            }
            match (self.f)(self.src.fd()) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    let fd = self.src.fd();
                    let events = match self.dir {
                        Dir::Read => libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP,
                        Dir::Write => libc::POLLOUT,
                    };
                    match poll_add(fd, events) {
                        Ok(op) => self.poll_op = Some(op),
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                r => return Poll::Ready(r),
            }
        }
    }
}

impl<F, D> Drop for Ready<'_, F, D> {
    fn drop(&mut self) {
        if let Some((driver, reg, t)) = self.reg.take() {
            remove_wait(driver, t, self.dir, reg);
        }
    }
}

/// Removes the wait of registration `reg` for `dir` from slot `t` of epoll driver `driver`, if
/// that driver is alive on this thread (its loop running, or hidden by `context::off_loop`).
/// Registration ids are unique in their driver: if slot `t` went meanwhile (its source
/// registered anew there, `Epoll::retire_stale`) and its key was reused, nothing of another
/// waiter is removed.
fn remove_wait(driver: u64, t: usize, dir: Dir, reg: u64) {
    context::with_own_core(|c| match &c.io {
        Reactor::Epoll(e) if e.id() == driver => {
            e.remove_waiter(t, dir, reg);
            Some(())
        }
        _ => None,
    });
}
