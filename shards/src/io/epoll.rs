//! The epoll driver: readiness waits for sockets, edge-triggered, each fd added once.
//!
//! # Readiness protocol
//!
//! Each registered fd has a slot with a *ready* bit per direction (set when the slot is made)
//! and a list of waiting wakers per direction. Everything below runs on the loop's thread, so
//! no event is processed between an operation's system call and its update of the bit.
//!
//! 1. **Try only when ready.** An operation whose direction's bit is set tries its non-blocking
//!    system call. On `EAGAIN`, or on a result that shows the fd drained (a stream read or
//!    write shorter than asked), it clears the bit. An operation whose bit is clear makes no
//!    system call: it waits. A short read is no such proof on a Unix stream (a read stops at
//!    a message carrying descriptors or another sender's credentials, with data queued behind
//!    it), so there only `EAGAIN` clears the read bit; nor after urgent TCP data (a read stops
//!    at the urgent mark), which rule 3 covers.
//! 2. **Wait.** The waiting future adds its waker to the fd's list for its direction. The first
//!    wait on an fd adds it to the epoll set, once, for input, output and hang-up, with
//!    `EPOLLET`. Adding reports readiness the fd already has, and edge-triggered epoll reports
//!    every later arrival of data or buffer space, so a bit cleared by rule 1 is set again by
//!    the next event: no readiness is lost between the failed call and the wait. User code
//!    run before the waker is listed (its clone) may dispatch an event meanwhile (a reap):
//!    the wait then finds the bit set again, lists nothing and tries again.
//! 3. **Fire.** An event sets the bits of the directions it reports (errors and hang-ups set
//!    both), takes their lists and wakes the takers, which retry (rule 1). Events for an fd
//!    nobody waits on only set bits. A reported end of input (`EPOLLRDHUP`), error or hang-up
//!    also sets a *sticky* bit that keeps the direction ready until a call on it gets `EAGAIN`:
//!    one edge can report the last data and the end together, and the end must not wait for an
//!    edge that never comes after a short read cleared the ready bit. `EAGAIN` proves the
//!    direction neither ended (a read at the end returns 0) nor failing (an error that is
//!    reported once, such as a UDP socket's ICMP error, has been consumed), so it clears the
//!    sticky bit too; kept, it made every later call retry `EAGAIN` without ever waiting.
//!    Urgent data (`EPOLLPRI`, registered too) sets a sticky read bit the same way, and so
//!    does a shutdown of this end's write half for writes, with no event ([`Epoll::shut`]: a
//!    Unix stream reports none for it). Nor does a Unix stream report its peer shutting its
//!    read side, which makes its writes fail: while one of its writes waits, a timer of its
//!    source sets the write bit again now and then and wakes the writers ([`Epoll::recheck`]).
//! 4. A waiting future that is dropped removes its waker; a closed source removes its slot and
//!    leaves the epoll set. Entries carry the future's registration id, so a future polled
//!    again keeps one entry and two futures of one task (one waker) on the same fd and
//!    direction keep one each: dropping one cannot unregister the other.
//!
//! Cost: per operation, its system call when the fd is ready, none when it is not; one
//! `epoll_ctl` per fd for its life; one `epoll_wait` per loop turn while anything waits (none
//! while nothing does). A TCP stream that reads one short message per wake-up makes one
//! `recv` per message; a Unix stream, two (the second gets `EAGAIN`). The loop's wake eventfd is registered level-triggered under the token
//! [`PING`] and drained when it fires.

use std::{
    cell::{Cell, RefCell},
    fmt, io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    task::Waker,
    time::Duration,
};

use slab::Slab;

const PING: u64 = u64::MAX;
const MAX_EVENTS: usize = 256;

/// A direction of readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Read,
    Write,
}

/// The ready bit of [`Dir::Read`] in [`Slot::ready`].
const READY_READ: u8 = 1;
/// The ready bit of [`Dir::Write`].
const READY_WRITE: u8 = 2;
/// Sticky: the peer closed its write half (or the fd failed or hung up), so reads always try
/// (rule 3). An edge-triggered event can report new data and the end of the stream at once;
/// a short read that clears [`READY_READ`] must not hide the end, for which no edge follows.
const CLOSED_READ: u8 = 4;
/// Sticky: the fd failed or hung up, so writes always try (they fail at once).
const CLOSED_WRITE: u8 = 8;
/// Sticky: urgent data arrived (`EPOLLPRI`), so reads try until `EAGAIN`. A TCP read stops
/// short at the urgent mark with the bytes behind it queued; no edge follows for them.
const URGENT_READ: u8 = 16;

fn bit(dir: Dir) -> u8 {
    match dir {
        Dir::Read => READY_READ,
        Dir::Write => READY_WRITE,
    }
}

/// The ready bit of `dir` and its sticky closed bit.
fn bits_of(dir: Dir) -> u8 {
    match dir {
        Dir::Read => READY_READ | CLOSED_READ | URGENT_READ,
        Dir::Write => READY_WRITE | CLOSED_WRITE,
    }
}

/// A waiting future's entry: its registration id ([`ANON`] for callers that never remove
/// theirs) and waker.
type Waiter = (u64, Waker);

/// The registration id of callers that do not remove their waker when dropped (the
/// `futures::io` stream path): entries are deduplicated by waker instead.
pub(crate) const ANON: u64 = 0;

#[derive(Debug)]
struct Slot {
    fd: RawFd,
    readers: Vec<Waiter>,
    writers: Vec<Waiter>,
    /// Rule 1's bits: `READY_READ | READY_WRITE`, plus the sticky `CLOSED_*` and
    /// `URGENT_READ` bits.
    ready: u8,
    /// In the epoll set (rule 2).
    added: bool,
}

/// One loop's epoll instance.
pub(crate) struct Epoll {
    id: u64,
    epfd: OwnedFd,
    ping_fd: RawFd,
    slots: RefCell<Slab<Slot>>,
    waiting: Cell<usize>,
    /// The next registration id ([`Epoll::new_registration`]); starts above [`ANON`].
    next_registration: Cell<u64>,
    events: RefCell<Vec<libc::epoll_event>>,
    waits: Cell<u64>,
    fired: Cell<u64>,
    /// Whether `epoll_pwait2` (ns timeouts, kernel 5.11) is available.
    pwait2: Cell<bool>,
}

impl fmt::Debug for Epoll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Epoll")
            .field("id", &self.id)
            .field("waiting", &self.waiting.get())
            .finish()
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Epoll {
    pub(crate) fn new(ping_fd: RawFd) -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; we own the returned descriptor.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Level-triggered: a ping not drained yet keeps the next wait from sleeping. Miri's
        // epoll supports edge-triggered registrations only; there the ping is edge-triggered,
        // which is enough for its single-threaded checks of the task and channel code
        // (`scripts/miri`): every wait that a ping ends drains the eventfd.
        let events = if cfg!(miri) {
            libc::EPOLLIN | libc::EPOLLET
        } else {
            libc::EPOLLIN
        };
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: PING,
        };
        // SAFETY: `ev` is a live local; both descriptors are open.
        cvt(unsafe { libc::epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, ping_fd, &mut ev) })?;
        Ok(Epoll {
            id: super::next_driver_id(),
            epfd,
            ping_fd,
            slots: RefCell::new(Slab::new()),
            waiting: Cell::new(0),
            next_registration: Cell::new(ANON + 1),
            events: RefCell::new(Vec::with_capacity(MAX_EVENTS)),
            waits: Cell::new(0),
            fired: Cell::new(0),
            // Miri models `epoll_wait` but not the raw `epoll_pwait2` system call, and stops
            // at an unsupported one rather than failing it (so the fallback below never ran):
            // every park of a loop under Miri ended the test there, counted as skipped.
            pwait2: Cell::new(!cfg!(miri)),
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.waiting.get()
    }

    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.waits.get(), self.fired.get())
    }

    /// A slot for `fd`; the fd joins the epoll set at its first wait.
    pub(crate) fn register(&self, fd: RawFd) -> usize {
        self.slots.borrow_mut().insert(Slot {
            fd,
            readers: Vec::new(),
            writers: Vec::new(),
            ready: READY_READ | READY_WRITE,
            added: false,
        })
    }

    /// Whether slot `token` exists and is `fd`'s (a source taking up its earlier slot here).
    pub(crate) fn holds(&self, token: usize, fd: RawFd) -> bool {
        self.slots.borrow().get(token).is_some_and(|s| s.fd == fd)
    }

    /// Rule 1: whether `dir` may be ready (a system call is worth trying).
    pub(crate) fn is_ready(&self, token: usize, dir: Dir) -> bool {
        self.slots
            .borrow()
            .get(token)
            .is_none_or(|s| s.ready & bits_of(dir) != 0)
    }

    /// Rule 1: the last call drained `dir` (a short stream read or write). The sticky closed
    /// bit stays: the end of input or an error may have come with the same edge.
    pub(crate) fn clear_ready(&self, token: usize, dir: Dir) {
        if let Some(s) = self.slots.borrow_mut().get_mut(token) {
            s.ready &= !bit(dir);
        }
    }

    /// Rule 1: the last call got `EAGAIN` for `dir`. That also proves `dir` is neither at its
    /// end (a read there returns 0) nor failing, so the closed bit goes too: an `EPOLLERR`
    /// that was consumed (a UDP socket's ICMP error, reported once) would otherwise keep
    /// `dir` "ready" and the caller retrying `EAGAIN` without ever waiting.
    pub(crate) fn clear_would_block(&self, token: usize, dir: Dir) {
        if let Some(s) = self.slots.borrow_mut().get_mut(token) {
            s.ready &= !bits_of(dir);
        }
    }

    /// Rule 3 without an event: this end shut `dir` down (`shutdown(2)`), so calls in that
    /// direction fail at once from now on. Sets the sticky closed bit and wakes the waiters,
    /// which retry (rule 1) and get the error. For what the kernel does not report: a Unix
    /// stream's poll shows no `EPOLLOUT` for a shut write half (TCP's does), so a write that
    /// waited for room waited for good, where a blocking one (and io_uring's) fails with
    /// `EPIPE`. The wakers are woken after the borrow (user code).
    pub(crate) fn shut(&self, token: usize, dir: Dir) {
        let woken: Vec<Waker> = {
            let mut slots = self.slots.borrow_mut();
            let Some(slot) = slots.get_mut(token) else {
                return;
            };
            let list = match dir {
                Dir::Read => {
                    slot.ready |= READY_READ | CLOSED_READ;
                    &mut slot.readers
                }
                Dir::Write => {
                    slot.ready |= READY_WRITE | CLOSED_WRITE;
                    &mut slot.writers
                }
            };
            list.drain(..).map(|(_, w)| w).collect()
        };
        self.waiting.set(self.waiting.get() - woken.len());
        for w in woken {
            crate::task::wake_guarded(w);
        }
    }

    /// Rule 3 without an event, once: `dir` may have changed in a way the kernel does not
    /// report. Sets the (non-sticky) ready bit and wakes the waiters, which retry (rule 1):
    /// an `EAGAIN` clears the bit and they wait again. For a Unix stream whose peer shut its
    /// read side: its writes fail with `EPIPE` from then on, but its poll shows no event for
    /// that (no `EPOLLOUT` while its buffer is full, no hang-up until the peer closes), so a
    /// write waiting for room waited until the peer closed (a blocking one, and io_uring's,
    /// fail at once). Its [`Source`](super::source::Source) rechecks so, now and then, while
    /// a write waits. The wakers are woken after the borrow (user code).
    pub(crate) fn recheck(&self, token: usize, dir: Dir) {
        let woken: Vec<Waker> = {
            let mut slots = self.slots.borrow_mut();
            let Some(slot) = slots.get_mut(token) else {
                return;
            };
            slot.ready |= bit(dir);
            let list = match dir {
                Dir::Read => &mut slot.readers,
                Dir::Write => &mut slot.writers,
            };
            list.drain(..).map(|(_, w)| w).collect()
        };
        self.waiting.set(self.waiting.get() - woken.len());
        for w in woken {
            crate::task::wake_guarded(w);
        }
    }

    /// Whether anyone waits on slot `token` for `dir`.
    pub(crate) fn has_waiters(&self, token: usize, dir: Dir) -> bool {
        self.slots.borrow().get(token).is_some_and(|s| match dir {
            Dir::Read => !s.readers.is_empty(),
            Dir::Write => !s.writers.is_empty(),
        })
    }

    /// Rule 4: the source closes.
    pub(crate) fn deregister(&self, token: usize) {
        let Some(slot) = self.slots.borrow_mut().try_remove(token) else {
            return;
        };
        self.waiting
            .set(self.waiting.get() - slot.readers.len() - slot.writers.len());
        if slot.added {
            // SAFETY: plain syscall on descriptors we hold; a null event is allowed for DEL.
            unsafe {
                libc::epoll_ctl(
                    self.epfd.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    slot.fd,
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Rule 2.
    /// Registers `waker` for `dir` under registration `id` (one per waiting future, from
    /// [`new_registration`](Self::new_registration), or [`ANON`]). A future polled again
    /// keeps one entry (its waker refreshed); two futures of one task waiting on the same fd
    /// and direction have one entry each, so dropping one leaves the other registered.
    ///
    /// `Ok(false)`: nothing registered, `dir` became ready meanwhile (the caller tries its
    /// call again). The waker's clone is user code, run after the caller found `dir` not
    /// ready and before the waker is listed; code that reaps this driver there (a stream's
    /// `shutdown` does, to see whether its write-behind send finished) dispatched the event
    /// then: it set the ready bit and found no waiter, and the waker listed after it waited
    /// for an edge that had come already.
    pub(crate) fn add_waiter(
        &self,
        token: usize,
        dir: Dir,
        waker: &Waker,
        id: u64,
    ) -> io::Result<bool> {
        if self.is_waiting(token, dir, waker, id)? {
            return Ok(true);
        }
        // A waker's clone (and drop) is user code (a custom waker) that may drop another
        // source's future of this loop, which borrows `slots` again: cloned before the borrow.
        let waker = waker.clone();
        let mut slots = self.slots.borrow_mut();
        let slot = slots
            .get_mut(token)
            .ok_or_else(|| io::Error::other("xtc: I/O source used after it was closed"))?;
        if !slot.added {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN
                    | libc::EPOLLOUT
                    | libc::EPOLLRDHUP
                    | libc::EPOLLPRI
                    | libc::EPOLLET) as u32,
                u64: token as u64,
            };
            // SAFETY: `ev` is a live local; the descriptors are open (the slot's fd is closed
            // only after `deregister` where its loop's driver is reachable at the drop; where it
            // is not, the driver is gone, and its epoll set with it).
            let added = cvt(unsafe {
                libc::epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, slot.fd, &mut ev)
            });
            let fd = slot.fd;
            match added {
                Ok(_) => slot.added = true,
                // Already in the set under an earlier slot of this driver that its source no
                // longer names (a guard: a source that waited on a loop run while this one
                // was hidden, `context::off_loop`, takes up its earlier slot here again,
                // `Source::token`): the entry is pointed at this slot instead.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    // SAFETY: as for the ADD above.
                    cvt(unsafe {
                        libc::epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev)
                    })?;
                    slot.added = true;
                    let stale = Self::retire_stale(&mut slots, fd, token);
                    self.waiting.set(self.waiting.get() - stale.len());
                    // The earlier slots get no more events: the futures still waiting there
                    // poll again, and wait on this slot (their source's now). Woken after
                    // the borrow (user code); this waiter is listed then.
                    drop(slots);
                    for w in stale {
                        crate::task::wake_guarded(w);
                    }
                    slots = self.slots.borrow_mut();
                }
                Err(e) => return Err(e),
            }
        }
        let slot = slots
            .get_mut(token)
            .ok_or_else(|| io::Error::other("xtc: I/O source used after it was closed"))?;
        if slot.ready & bits_of(dir) != 0 {
            // An event came during the user code above (the clone, a stale waiter's wake).
            drop(slots);
            drop(waker);
            return Ok(false);
        }
        let list = match dir {
            Dir::Read => &mut slot.readers,
            Dir::Write => &mut slot.writers,
        };
        let mine = list
            .iter_mut()
            .find(|(i, w)| Self::is_mine(*i, w, &waker, id));
        if let Some((_, w)) = mine {
            let old = std::mem::replace(w, waker);
            // Dropped after the borrow, for the same reason as the clone.
            drop(slots);
            drop(old);
            return Ok(true);
        }
        list.push((id, waker));
        self.waiting.set(self.waiting.get() + 1);
        self.waits.set(self.waits.get() + 1);
        Ok(true)
    }

    /// Removes the earlier slots for `fd` still in the epoll set (which their source no longer
    /// names), now that `EPOLL_CTL_MOD` points the descriptor at `token`, and returns the
    /// wakers that waited in them. Left there, those waited for good for events that now
    /// reach `token`, and counted as I/O in flight for good. Their keys may be reused: a
    /// waiting future that still names one removes only its own entry, by its registration
    /// id, which is unique in this driver. Cost: a scan of the slots, on this rare path only.
    fn retire_stale(slots: &mut Slab<Slot>, fd: RawFd, token: usize) -> Vec<Waker> {
        let keys: Vec<usize> = slots
            .iter()
            .filter(|(k, s)| *k != token && s.fd == fd && s.added)
            .map(|(k, _)| k)
            .collect();
        let mut wakers = Vec::new();
        for k in keys {
            let s = slots.remove(k);
            wakers.extend(s.readers.into_iter().chain(s.writers).map(|(_, w)| w));
        }
        wakers
    }

    /// Whether registration `id`'s entry in `list` is `w` (registered as `i`): the same id, or
    /// for [`ANON`] the same waker.
    fn is_mine(i: u64, w: &Waker, waker: &Waker, id: u64) -> bool {
        if id == ANON {
            i == ANON && w.will_wake(waker)
        } else {
            i == id
        }
    }

    /// Whether registration `id` already waits on `token` for `dir` with `waker` (nothing to
    /// store). Runs no user code (`will_wake` compares pointers).
    fn is_waiting(&self, token: usize, dir: Dir, waker: &Waker, id: u64) -> io::Result<bool> {
        let slots = self.slots.borrow();
        let slot = slots
            .get(token)
            .ok_or_else(|| io::Error::other("xtc: I/O source used after it was closed"))?;
        let list = match dir {
            Dir::Read => &slot.readers,
            Dir::Write => &slot.writers,
        };
        Ok(list
            .iter()
            .any(|(i, w)| Self::is_mine(*i, w, waker, id) && w.will_wake(waker)))
    }

    /// A fresh registration id for a waiting future (never [`ANON`]).
    pub(crate) fn new_registration(&self) -> u64 {
        let id = self.next_registration.get();
        self.next_registration.set(id + 1);
        id
    }

    /// Rule 4: the waiting future with registration `id` went away.
    pub(crate) fn remove_waiter(&self, token: usize, dir: Dir, id: u64) {
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = slots.get_mut(token) else {
            return;
        };
        let list = match dir {
            Dir::Read => &mut slot.readers,
            Dir::Write => &mut slot.writers,
        };
        // Ids from `new_registration` are unique, and `add_waiter` keeps one entry per id:
        // at most one goes. Its waker is dropped after the borrow, as in `add_waiter`.
        debug_assert_ne!(id, ANON, "only registered waiters are removed");
        let Some(p) = list.iter().position(|(i, _)| *i == id) else {
            return;
        };
        let gone = list.remove(p);
        self.waiting.set(self.waiting.get() - 1);
        drop(slots);
        drop(gone);
    }

    /// Dispatches ready events without blocking; no system call while nothing waits.
    pub(crate) fn reap(&self) -> usize {
        if self.waiting.get() == 0 {
            return 0;
        }
        self.wait(Some(Duration::ZERO)).1
    }

    /// Blocks until an event, the wake ping or `timeout`.
    pub(crate) fn park(&self, timeout: Option<Duration>) -> (bool, usize) {
        self.wait(timeout)
    }

    fn wait(&self, timeout: Option<Duration>) -> (bool, usize) {
        let mut events = self.events.borrow_mut();
        events.clear();
        let cap = events.capacity().min(MAX_EVENTS) as libc::c_int;
        let (n, refused) = self.epoll_wait(events.as_mut_ptr(), cap, timeout);
        let failed = (n < 0).then(io::Error::last_os_error);
        let ready: Vec<(u64, u32)> = if n > 0 {
            // SAFETY: the kernel initialized the first `n <= cap` entries.
            unsafe { events.set_len(n as usize) };
            events.iter().map(|e| (e.u64, e.events)).collect()
        } else {
            Vec::new()
        };
        // Logged with `events` released, the events copied out: the subscriber is user code.
        drop(events);
        if let Some(err) = refused {
            tracing::debug!("xtc: epoll_pwait2 refused ({err}); using epoll_wait");
        }
        if let Some(err) = failed {
            if err.raw_os_error() != Some(libc::EINTR) {
                tracing::warn!("xtc: epoll_wait failed: {err}");
            }
            return (false, 0);
        }
        if n == 0 {
            return (false, 0);
        }
        let mut pinged = false;
        let mut wakers = Vec::new();
        for (token, bits) in ready {
            if token == PING {
                pinged = true;
                let mut buf = 0u64;
                // SAFETY: reads 8 bytes into a live local from the non-blocking eventfd.
                unsafe { libc::read(self.ping_fd, (&mut buf as *mut u64).cast(), 8) };
                continue;
            }
            let mut slots = self.slots.borrow_mut();
            let Some(slot) = slots.get_mut(token as usize) else {
                continue;
            };
            let err = bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
            let before = wakers.len();
            if err {
                slot.ready |= CLOSED_READ | CLOSED_WRITE;
            } else if bits & libc::EPOLLRDHUP as u32 != 0 {
                slot.ready |= CLOSED_READ;
            }
            if bits & libc::EPOLLPRI as u32 != 0 {
                slot.ready |= URGENT_READ;
            }
            if err || bits & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLPRI) as u32 != 0 {
                slot.ready |= READY_READ;
                wakers.extend(slot.readers.drain(..).map(|(_, w)| w));
            }
            if err || bits & libc::EPOLLOUT as u32 != 0 {
                slot.ready |= READY_WRITE;
                wakers.extend(slot.writers.drain(..).map(|(_, w)| w));
            }
            let woken = wakers.len() - before;
            self.waiting.set(self.waiting.get() - woken);
            // `LoopStats::io_completed`: the waits this event ended (each armed one counted in
            // `waits`), not the event itself: an event no task waited for (the `EPOLLOUT` a
            // socket reports as it joins the set) made the completions outnumber the waits.
            self.fired.set(self.fired.get() + woken as u64);
        }
        let n = wakers.len();
        for w in wakers {
            crate::task::wake_guarded(w);
        }
        (pinged, n)
    }

    fn epoll_wait(
        &self,
        out: *mut libc::epoll_event,
        cap: libc::c_int,
        timeout: Option<Duration>,
    ) -> (libc::c_int, Option<io::Error>) {
        let mut refused = None;
        if self.pwait2.get() {
            let ts = timeout.map(crate::sys::timespec);
            let ts_ptr = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: `out` has room for `cap` events; `ts` is a live local or null (no limit);
            // a null sigmask keeps the thread's mask.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    self.epfd.as_raw_fd(),
                    out,
                    cap,
                    ts_ptr,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            } as libc::c_int;
            if rc >= 0 {
                return (rc, None);
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                return (rc, None);
            }
            // Not only ENOSYS: a seccomp filter that does not know the call (systemd's
            // `SystemCallFilter=`, older container profiles) answers EPERM or EACCES, and
            // treating that as "timed out" left the loop spinning without ever seeing an
            // event. Any other failure here is one `epoll_wait` would report too. The caller
            // logs it (the events' buffer is borrowed here).
            refused = Some(err);
            self.pwait2.set(false);
        }
        // Millisecond resolution, rounded up so a timer is never early.
        let ms = timeout.map_or(-1, |d| {
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        });
        // SAFETY: `out` has room for `cap` events.
        let n = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), out, cap, ms) };
        (n, refused)
    }
}
