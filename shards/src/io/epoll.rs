//! The epoll driver: readiness waits for sockets, level-triggered and one-shot.
//!
//! # Readiness protocol
//!
//! 1. An operation first tries its non-blocking system call. Only on `EAGAIN` does it wait.
//! 2. **Register, then arm.** The waiting future adds its waker to the fd's reader or writer
//!    list, then arms the fd with `EPOLL_CTL_MOD` (or `ADD` the first time) for the directions
//!    that have waiters, with `EPOLLONESHOT`. Arming is level-triggered, so readiness that
//!    arrived between the failed call and the arming is reported at once: no edge is lost.
//! 3. **Fire.** An event takes the lists of the directions it reports (errors and hang-ups wake
//!    both), re-arms the fd for the directions that still have waiters, and wakes the takers,
//!    which retry their call (rule 1).
//! 4. A waiting future that is dropped removes its waker; a closed source removes its slot.
//!
//! Cost: one `epoll_ctl` per wait that blocks, one `epoll_wait` per loop turn while anything
//! waits (none while nothing does). The loop's wake eventfd is registered level-triggered under
//! the token [`PING`] and drained when it fires.

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

#[derive(Debug)]
struct Slot {
    fd: RawFd,
    readers: Vec<Waker>,
    writers: Vec<Waker>,
    added: bool,
}

/// One loop's epoll instance.
pub(crate) struct Epoll {
    id: u64,
    epfd: OwnedFd,
    ping_fd: RawFd,
    slots: RefCell<Slab<Slot>>,
    waiting: Cell<usize>,
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
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
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
            events: RefCell::new(Vec::with_capacity(MAX_EVENTS)),
            waits: Cell::new(0),
            fired: Cell::new(0),
            pwait2: Cell::new(true),
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
            added: false,
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
    pub(crate) fn add_waiter(&self, token: usize, dir: Dir, waker: &Waker) -> io::Result<()> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots
            .get_mut(token)
            .ok_or_else(|| io::Error::other("xtc: I/O source used after it was closed"))?;
        let list = match dir {
            Dir::Read => &mut slot.readers,
            Dir::Write => &mut slot.writers,
        };
        if list.iter().any(|w| w.will_wake(waker)) {
            return Ok(());
        }
        list.push(waker.clone());
        if let Err(e) = self.arm(token, slot) {
            // Not armed, so no event will take this waker: undo the push, or the loop would
            // count a wait that can never end (and never go quiescent).
            match dir {
                Dir::Read => slot.readers.pop(),
                Dir::Write => slot.writers.pop(),
            };
            return Err(e);
        }
        self.waiting.set(self.waiting.get() + 1);
        self.waits.set(self.waits.get() + 1);
        Ok(())
    }

    fn arm(&self, token: usize, slot: &mut Slot) -> io::Result<()> {
        let mut events = libc::EPOLLONESHOT as u32;
        if !slot.readers.is_empty() {
            events |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        }
        if !slot.writers.is_empty() {
            events |= libc::EPOLLOUT as u32;
        }
        let mut ev = libc::epoll_event {
            events,
            u64: token as u64,
        };
        let op = if slot.added {
            libc::EPOLL_CTL_MOD
        } else {
            libc::EPOLL_CTL_ADD
        };
        // SAFETY: `ev` is a live local; the descriptors are open (the slot's fd is closed only
        // after `deregister`).
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, slot.fd, &mut ev) })?;
        slot.added = true;
        Ok(())
    }

    /// Rule 4: a waiting future went away.
    pub(crate) fn remove_waiter(&self, token: usize, dir: Dir, waker: &Waker) {
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = slots.get_mut(token) else {
            return;
        };
        let list = match dir {
            Dir::Read => &mut slot.readers,
            Dir::Write => &mut slot.writers,
        };
        let before = list.len();
        list.retain(|w| !w.will_wake(waker));
        self.waiting.set(self.waiting.get() - (before - list.len()));
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
        let n = self.epoll_wait(events.as_mut_ptr(), cap, timeout);
        if n <= 0 {
            return (false, 0);
        }
        // SAFETY: the kernel initialized the first `n <= cap` entries.
        unsafe { events.set_len(n as usize) };
        let ready: Vec<(u64, u32)> = events.iter().map(|e| (e.u64, e.events)).collect();
        drop(events);
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
            self.fired.set(self.fired.get() + 1);
            let mut slots = self.slots.borrow_mut();
            let Some(slot) = slots.get_mut(token as usize) else {
                continue;
            };
            let err = bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
            let before = wakers.len();
            if err || bits & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLPRI) as u32 != 0 {
                wakers.append(&mut slot.readers);
            }
            if err || bits & libc::EPOLLOUT as u32 != 0 {
                wakers.append(&mut slot.writers);
            }
            self.waiting
                .set(self.waiting.get() - (wakers.len() - before));
            if !slot.readers.is_empty() || !slot.writers.is_empty() {
                if let Err(e) = self.arm(token as usize, slot) {
                    tracing::warn!("xtc: epoll re-arm failed: {e}");
                    wakers.append(&mut slot.readers);
                    wakers.append(&mut slot.writers);
                }
            }
        }
        let n = wakers.len();
        for w in wakers {
            w.wake();
        }
        (pinged, n)
    }

    fn epoll_wait(
        &self,
        out: *mut libc::epoll_event,
        cap: libc::c_int,
        timeout: Option<Duration>,
    ) -> libc::c_int {
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
            if rc >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
                return rc;
            }
            self.pwait2.set(false);
        }
        // Millisecond resolution, rounded up so a timer is never early.
        let ms = timeout.map_or(-1, |d| {
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        });
        // SAFETY: `out` has room for `cap` events.
        unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), out, cap, ms) }
    }
}
