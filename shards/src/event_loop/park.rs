//! Parking an idle loop and waking it: the announce → recheck → sleep protocol
//! (invariant 4 in the crate docs).
//!
//! # Sleep protocol
//!
//! State word per loop: bit `SLEEPING` (the loop announced it will block) and bit `NOTIFIED` (a
//! sender took the job of pinging it). Every access to the state word, and to the inbox's
//! `pending` flag by a sender, is a read-modify-write; the stop flag needs none (a stop pings
//! every loop unconditionally), and the consumer clears `pending` under the inbox's lock.
//!
//! 1. **Announce, then recheck.** A loop that found no work swaps the state to `SLEEPING`, then
//!    **rechecks** every source a sender can fill (its inbox `pending` flag, by `fetch_or`; the
//!    stop flag). If any has work it swaps `RUNNING` back and goes back to work without blocking.
//! 2. **Publish, then look.** A sender first makes its work visible (inbox push, which sets
//!    `pending` by `swap`), then does `fetch_or(NOTIFIED)` on the state. Only the sender that
//!    sees exactly `SLEEPING` (sleeping, nobody notified yet) writes the wake ping (eventfd).
//!    Senders that see `RUNNING` or `NOTIFIED` do nothing more: the loop is awake or will be.
//! 3. **Sleep.** After a recheck that found nothing the loop blocks on the ping with its timeout
//!    (next timer), then swaps the state back to `RUNNING` and drains the ping. Going back to
//!    `RUNNING` (here and in rule 1's cancel) is a read-modify-write too: a plain store would
//!    end the release sequence of the `fetch_or` of a sender whose ping was coalesced into an
//!    earlier one (it saw `SLEEPING | NOTIFIED` and wrote none), so the loop's next announce
//!    would read its own store, not synchronize with that sender, and a recheck that reads a
//!    plain atomic (a ring's tail, `ring/mod.rs`) could miss the sender's message and sleep on
//!    it. Found by `loom_ring::loom_ring_backlog_moved_into_the_ring_wakes_the_consumer`; on
//!    x86 a SeqCst store is an `xchg` already, so the swap costs nothing there. The block is the loop's I/O
//!    driver ([`sleep_in`](Parker::sleep_in), io/mod.rs), where the ping's eventfd is
//!    registered; an I/O event may end the block too, which is a plain spurious turn for this
//!    protocol.
//!
//! Why no wake-up is lost: rules 1 and 2 are a Dekker pair, and both sides use read-modify-writes
//! on both words. If the loop's recheck RMW on `pending` came before the sender's `swap` in
//! `pending`'s modification order, that swap reads from it and so synchronizes with it: the
//! loop's earlier `SLEEPING` swap happens-before the sender's `fetch_or` on the state, which
//! therefore sees `SLEEPING` (or `NOTIFIED`, set by a sender whose ping is already on its way) and
//! the ping is written, so the block of rule 3 returns. Otherwise the recheck reads the sender's
//! `true` and the loop does not block. (Plain SeqCst stores and loads would also do on hardware,
//! but loom models SeqCst as acquire/release; with RMWs the argument holds under acquire/release
//! and loom checks it: `loom_park.rs`.) A ping written while the loop was not blocked stays in
//! the eventfd counter and costs at most one spurious turn later.
//!
//! Cost: a sender pays one RMW on the state word (the inbox path already takes a lock); only the
//! first sender after an announce pays a `write(2)`, so bursts of wakes collapse to one syscall.

use std::time::Duration;

use crate::sync::{AtomicU32, Ordering::SeqCst};

const RUNNING: u32 = 0;
const SLEEPING: u32 = 1;
const NOTIFIED: u32 = 2;
const SLEEPING_NOTIFIED: u32 = SLEEPING | NOTIFIED;

/// The wake ping: an eventfd normally, a condvar-backed flag under loom.
#[cfg(not(loom))]
type Ping = crate::sys::EventFd;

#[cfg(loom)]
#[derive(Debug)]
struct Ping {
    flag: crate::sync::Mutex<bool>,
    cv: crate::sync::Condvar,
}

#[cfg(loom)]
impl Ping {
    fn new() -> std::io::Result<Ping> {
        Ok(Ping {
            flag: crate::sync::Mutex::new(false),
            cv: crate::sync::Condvar::new(),
        })
    }
    fn notify(&self) {
        *crate::sync::lock(&self.flag) = true;
        self.cv.notify_one();
    }
    // Loom has no timed waits: a model never relies on a timeout to make progress.
    fn wait(&self, _timeout: Option<Duration>) -> bool {
        let mut f = crate::sync::lock(&self.flag);
        while !*f {
            f = self.cv.wait(f).unwrap();
        }
        true
    }
    fn drain(&self) {
        *crate::sync::lock(&self.flag) = false;
    }
}

/// One loop's sleep state and wake ping.
#[derive(Debug)]
pub(crate) struct Parker {
    state: AtomicU32,
    ping: Ping,
}

impl Parker {
    pub(crate) fn new() -> std::io::Result<Parker> {
        Ok(Parker {
            state: AtomicU32::new(RUNNING),
            ping: Ping::new()?,
        })
    }

    /// Rule 1, first half: announce the intent to sleep. The caller must then recheck its
    /// sources and call [`cancel`](Self::cancel) or [`sleep_in`](Self::sleep_in).
    pub(crate) fn announce(&self) {
        // Clears a stale NOTIFIED left by senders while we ran: the recheck covers their work.
        self.state.swap(SLEEPING, SeqCst);
    }

    /// Rule 1, second half: the recheck found work. A swap, not a store (rule 3).
    pub(crate) fn cancel(&self) {
        self.state.swap(RUNNING, SeqCst);
    }

    /// Rule 3: block until pinged or `timeout` passes. Returns whether it was pinged. The loom
    /// models' wait: [`sleep_in`](Self::sleep_in), the shipping rule 3, with the plain ping
    /// wait as the driver (a loop parks in its I/O driver, whose io_uring read of the eventfd
    /// may take the ping before a plain wait would see it; loom models no driver).
    #[cfg(all(loom, test))]
    pub(crate) fn sleep(&self, timeout: Option<Duration>) -> bool {
        // A ping written after the wait returned stays counted and costs one spurious turn
        // later.
        self.sleep_in(|t, wait| (wait(t), false), timeout)
    }

    /// Rule 3 with the loop's I/O driver as the blocking wait: `wait(timeout)` blocks in the
    /// driver (where the ping's fd is registered) and returns `(pinged, drained)`; a ping the
    /// driver did not consume is drained here. `wait` gets the plain eventfd wait as a
    /// fallback (a loop without a driver).
    pub(crate) fn sleep_in(
        &self,
        wait: impl FnOnce(Option<Duration>, &dyn Fn(Option<Duration>) -> bool) -> (bool, bool),
        timeout: Option<Duration>,
    ) -> bool {
        let (pinged, drained) = wait(timeout, &|t| self.ping.wait(t));
        self.state.swap(RUNNING, SeqCst);
        if pinged && !drained {
            self.ping.drain();
        }
        pinged
    }

    /// The ping's descriptor, for registration in the I/O driver.
    #[cfg(not(loom))]
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.ping.fd()
    }

    /// Under loom there is no descriptor (the loop gets no I/O driver).
    #[cfg(loom)]
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        -1
    }

    /// Rule 2: called by a sender after it published work. Returns whether it wrote the ping.
    pub(crate) fn unpark(&self) -> bool {
        let prev = self.state.fetch_or(NOTIFIED, SeqCst);
        debug_assert!(prev <= SLEEPING_NOTIFIED);
        if prev == SLEEPING {
            self.ping.notify();
            return true;
        }
        false
    }

    /// Pings unconditionally (stop requests, which must reach a loop whatever its state).
    pub(crate) fn force_unpark(&self) {
        self.ping.notify();
    }
}
