//! A per-thread CPU-time interval timer (`timer_create(CLOCK_THREAD_CPUTIME_ID)`) that delivers a
//! signal to its own thread, whose handler only sets a thread-local flag (`preempt.rs`).

use std::{io, time::Duration};

/// The signal the timers use unless the program picks another (`Builder::preempt_signal`,
/// `XTC_PREEMPT_SIGNAL`): the second real-time signal glibc leaves to applications.
pub(crate) fn default_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

thread_local! {
    /// Set by the signal handler when this thread's CPU-time tick fires.
    pub(crate) static DUE: std::sync::atomic::AtomicBool =
        const { std::sync::atomic::AtomicBool::new(false) };
}

extern "C" fn on_tick(_sig: libc::c_int) {
    // Async-signal-safe: a const-initialised thread-local without destructor is a plain TLS
    // access, and a relaxed store is one instruction.
    DUE.with(|d| d.store(true, std::sync::atomic::Ordering::Relaxed));
}

/// Installs the tick handler (`SA_RESTART`, so most interrupted system calls of unrelated code
/// restart; those `signal(7)` never restarts, such as `poll`, `epoll_wait`, `nanosleep` and
/// timed futex waits, fail with `EINTR`, as `Handle::set_preempt` says), at every arm: the disposition is looked at each time, not once per process, as the
/// program may change it after an earlier run installed xtc's handler (decided once, a handler
/// the program installed since then received every tick of the later timers, and a disposition
/// reset to the default ended the process at the first tick). Each caller gets the outcome of
/// its own attempt, so no timer is armed after a refused `sigaction` (its signal would still
/// have the default action). A handler the program installed itself is kept, and preemption is
/// refused with an error saying so. Cost: two `sigaction` calls per arm.
fn install_handler(sig: libc::c_int) -> io::Result<()> {
    super::install_signal_handler(
        sig,
        &super::signal_name(sig),
        on_tick,
        libc::SA_RESTART,
        "give xtc's tick another real-time signal (XTC_PREEMPT_SIGNAL, \
         Builder::preempt_signal), or leave XTC_PREEMPT (Builder::preempt) at 0",
    )
}

/// An armed CPU-time timer of the calling thread; disarmed and deleted on drop.
#[derive(Debug)]
pub(crate) struct CpuTimer {
    id: libc::timer_t,
}

impl CpuTimer {
    /// Arms a timer that fires every `interval` of this thread's CPU time, delivering `sig`
    /// (a real-time signal) to this thread.
    pub(crate) fn arm(interval: Duration, sig: libc::c_int) -> io::Result<CpuTimer> {
        install_handler(sig)?;
        // A worker inherits the signal mask of the thread that called `run()`; a program that
        // takes its signals with `sigwait` or `signalfd` blocks them all first, and then the
        // tick stayed pending for good and preemption was silently off. Unblocked on this
        // thread only (the signal targets it alone).
        super::unblock_signal(sig)?;
        // The thread-local's first touch happens here, not in the handler, and a stale tick
        // from an earlier timer on this thread is cleared.
        DUE.with(|d| d.store(false, std::sync::atomic::Ordering::Relaxed));
        // SAFETY: a zeroed sigevent is a valid starting point; we fill the fields Linux reads for
        // SIGEV_THREAD_ID (signal number, target thread).
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = sig;
        // SAFETY: gettid has no preconditions.
        sev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `sev` and `id` are live locals; on success the kernel writes the timer id.
        let rc = unsafe { libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut id) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let ts = libc::timespec {
            tv_sec: interval.as_secs() as libc::time_t,
            tv_nsec: interval.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        // SAFETY: `id` is the timer just created; `spec` is a live local.
        let rc = unsafe { libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: deleting the timer we created.
            unsafe { libc::timer_delete(id) };
            return Err(e);
        }
        Ok(CpuTimer { id })
    }
}

impl Drop for CpuTimer {
    fn drop(&mut self) {
        // SAFETY: the timer was created by `arm` and is deleted exactly once.
        unsafe { libc::timer_delete(self.id) };
    }
}
