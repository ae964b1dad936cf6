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
