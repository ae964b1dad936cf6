//! The wake ping of a parked loop: an eventfd the loop blocks on with `ppoll`, so the same fd can
//! later be registered in the I/O driver.

use std::{io, os::fd::RawFd, time::Duration};

/// An eventfd in non-blocking mode. Writes add to its counter; a read drains it.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: RawFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; we own the returned descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EventFd { fd })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    /// Adds one to the counter, making the fd readable. Never blocks: the counter would have to
    /// reach 2^64 - 2 first.
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our own open descriptor.
        let rc = unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
        if rc != 8 {
            tracing::warn!("eventfd write failed: {}", io::Error::last_os_error());
        }
    }

    /// Blocks until the fd is readable or `timeout` passes (`None`: no limit); returns whether it
    /// is readable (the caller drains it). Returns early, harmlessly, on a signal.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = timeout.map(super::timespec);
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `pfd` and `ts` are live locals for the duration of the call; a null timeout
        // means "wait forever" and a null sigmask keeps the thread's mask.
        let rc = unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, std::ptr::null()) };
        rc > 0
    }

    /// Resets the counter to zero without blocking.
    pub(crate) fn drain(&self) {
        let mut buf: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local from our own non-blocking descriptor;
        // EAGAIN (counter already zero) is the expected failure and is ignored.
        let _ = unsafe { libc::read(self.fd, (&mut buf as *mut u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor and close it exactly once.
        unsafe { libc::close(self.fd) };
    }
}
