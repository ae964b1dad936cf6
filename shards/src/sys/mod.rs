//! Raw system calls, each behind a small safe type.

pub(crate) mod cputimer;
// Under loom the parker is a loom model, not an eventfd.
#[cfg_attr(loom, allow(dead_code))]
mod eventfd;
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use eventfd::EventFd;

/// Installs `handler` for signal `sig` (named `name` in errors) with `SA_ONSTACK` and `flags`,
/// unless the program already installed a handler of its own there: then `Err`
/// (`AlreadyExists`) naming the signal and `what_to_do`, and the program's handler stays (it
/// was silently replaced before, and the program's own signal went to xtc's handler). The
/// check and the install are two calls, so a handler another thread installs in between is
/// still replaced. `SA_ONSTACK`: the handler runs on the thread's alternate signal stack where
/// one is set up, as a handler that may interrupt any code should. Cost: two `sigaction`
/// calls.
pub(crate) fn install_signal_handler(
    sig: libc::c_int,
    name: &str,
    handler: extern "C" fn(libc::c_int),
    flags: libc::c_int,
    what_to_do: &str,
) -> std::io::Result<()> {
    let ours = handler as usize;
    // SAFETY: `old` is writable storage for one sigaction, which the call fills (a null new
    // action only reads the current one); zeroed is a valid sigaction besides.
    let old = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        old
    };
    if ![libc::SIG_DFL, libc::SIG_IGN, ours].contains(&old.sa_sigaction) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "signal {name} already has a handler installed by this program, and xtc \
                 needs that signal: {what_to_do}"
            ),
        ));
    }
    // SAFETY: a zeroed sigaction is valid (empty mask, no flags); we set an `extern "C"
    // fn(c_int)` handler, which the callers keep async-signal-safe.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ours;
        sa.sa_flags = libc::SA_ONSTACK | flags;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Unblocks signal `sig` on the calling thread only (a thread starts with the mask of the one
/// that spawned it, and a program that takes its signals with `signalfd` or `sigwait` blocks
/// them all first). Cost: one system call.
pub(crate) fn unblock_signal(sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `set` is a live local filled by `sigemptyset` before use; only this thread's mask
    // changes, and the old one is not asked for (null).
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Lowers the calling thread's timer slack, so a loop parked until a timer deadline wakes within
/// a few microseconds of it instead of the default 50 µs (see prctl(2), PR_SET_TIMERSLACK).
/// Cost: the kernel may coalesce fewer wake-ups of this thread. Failure is harmless and ignored.
pub(crate) fn set_timer_slack_ns(ns: u64) {
    // Miri has no `prctl` (to it a foreign function, where it stops), and its clock no slack.
    if cfg!(miri) {
        return;
    }
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

/// The calling thread's stack as (lowest address, size), from `pthread_getattr_np` (for the
/// main thread, as far as the kernel lets it grow); `None` if the C library cannot tell. Code
/// running on a stack of its own (a coroutine's) is not on it. Cost: a system call or two and,
/// for the main thread, a read of /proc/self/maps: call it once per loop run.
#[cfg(not(miri))]
pub(crate) fn thread_stack() -> Option<(usize, usize)> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    // SAFETY: `attr` is writable storage for one attribute object, which
    // `pthread_getattr_np` initialises on success (and only then is it read or destroyed).
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) } != 0 {
        return None;
    }
    let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `attr` was initialised above; `addr` and `size` are valid out-parameters.
    let rc = unsafe { libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size) };
    // SAFETY: `attr` was initialised above and is destroyed once, here.
    unsafe { libc::pthread_attr_destroy(attr.as_mut_ptr()) };
    (rc == 0 && size > 0).then_some((addr as usize, size))
}

/// Miri models no `pthread_getattr_np`, and its locals do not lie on a stack growing down:
/// the whole address space stands for the stack, so `INLINE_BUDGET` alone bounds inline
/// joins' nesting there (interpreted frames do not use the host's stack).
#[cfg(miri)]
pub(crate) fn thread_stack() -> Option<(usize, usize)> {
    Some((0, usize::MAX))
}

/// An address in the calling function's stack frame: where the stack pointer about is (stacks
/// grow down on every target xtc supports, so a smaller value is deeper). Cost: nothing.
#[inline(always)]
pub(crate) fn stack_here() -> usize {
    let marker = 0u8;
    std::hint::black_box(&marker) as *const u8 as usize
}
