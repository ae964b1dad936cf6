//! Raw system calls, each behind a small safe type.

pub(crate) mod cputimer;
// Under loom the parker is a loom model, not an eventfd.
#[cfg_attr(loom, allow(dead_code))]
mod eventfd;
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use eventfd::EventFd;

/// Lowers the calling thread's timer slack, so a loop parked until a timer deadline wakes within
/// a few microseconds of it instead of the default 50 µs (see prctl(2), PR_SET_TIMERSLACK).
/// Cost: the kernel may coalesce fewer wake-ups of this thread. Failure is harmless and ignored.
pub(crate) fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(
            "PR_SET_TIMERSLACK failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A `Duration` as a kernel `timespec` (seconds saturate at `i64::MAX`), for the timed waits
/// of the eventfd fallback and epoll.
pub(crate) fn timespec(d: std::time::Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}
