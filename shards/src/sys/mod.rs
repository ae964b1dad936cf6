//! Raw system calls, each behind a small safe type.

pub(crate) mod cgroup;
pub(crate) mod cputimer;
// Under loom the parker is a loom model, not an eventfd.
#[cfg_attr(loom, allow(dead_code))]
mod eventfd;
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use eventfd::EventFd;

/// The CPUs the calling thread may run on (`sched_getaffinity`), below `cpu_set_t`'s 1,024;
/// `None` if the mask cannot be read. Cost: one system call and a scan of the 1,024 bits.
pub(crate) fn thread_cpus() -> Option<Vec<usize>> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set; the kernel writes at most `size_of`
    // bytes of it, and `CPU_ISSET` reads indices below `CPU_SETSIZE` only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some(
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect(),
        )
    }
}

/// The real-time signals a program may give xtc for its own use: glibc's `SIGRTMIN ..=
/// SIGRTMAX` (glibc keeps the kernel's first two or three for its threads).
pub(crate) fn rt_signals() -> std::ops::RangeInclusive<libc::c_int> {
    libc::SIGRTMIN()..=libc::SIGRTMAX()
}

/// `sig` as the program would write it: `SIGRTMIN+3` for a real-time signal, else its number.
pub(crate) fn signal_name(sig: libc::c_int) -> String {
    if rt_signals().contains(&sig) {
        match sig - libc::SIGRTMIN() {
            0 => "SIGRTMIN".to_string(),
            k => format!("SIGRTMIN+{k}"),
        }
    } else {
        format!("signal {sig}")
    }
}

/// A real-time signal from text: `SIGRTMIN+3`, `RTMIN+3`, `SIGRTMIN`, `SIGRTMAX-2` (any case,
/// blanks allowed at the ends and around the sign, as in `SIGRTMIN + 3`) or the signal's
/// number. `None` for anything else, a blank inside a name or number (`3 5` is not 35), or a
/// number outside [`rt_signals`].
pub(crate) fn parse_rt_signal(text: &str) -> Option<libc::c_int> {
    let words: Vec<&str> = text.split_whitespace().collect();
    // Two words that meet with no sign between them would run together into another name or
    // number ("3 5" into 35): refused, as every other variable refuses such a value.
    let glued = words.windows(2).any(|w| {
        let signed = |c: char| c == '+' || c == '-';
        !w[0].ends_with(signed) && !w[1].starts_with(signed)
    });
    if glued {
        return None;
    }
    let t = words.concat().to_ascii_uppercase();
    let t = t.strip_prefix("SIG").unwrap_or(&t);
    let sig = if let Some(rest) = t.strip_prefix("RTMIN") {
        libc::SIGRTMIN().checked_add(offset(rest)?)?
    } else if let Some(rest) = t.strip_prefix("RTMAX") {
        libc::SIGRTMAX().checked_add(offset(rest)?)?
    } else {
        t.parse().ok()?
    };
    rt_signals().contains(&sig).then_some(sig)
}

/// `+3` → 3, `-2` → -2, `` → 0 (a sign is required before a number; `parse` refuses a second
/// sign or none but digits after it).
fn offset(rest: &str) -> Option<libc::c_int> {
    match rest.as_bytes().first() {
        None => Some(0),
        Some(b'+' | b'-') => rest.parse().ok(),
        Some(_) => None,
    }
}

/// `Ok(sig)` if `sig` is a real-time signal a program may give xtc, else an `InvalidArgument`
/// naming the builder setting `what` and the range to pick from.
pub(crate) fn check_rt_signal(what: &str, sig: libc::c_int) -> crate::Result<libc::c_int> {
    if rt_signals().contains(&sig) {
        return Ok(sig);
    }
    Err(crate::Error::InvalidArgument(format!(
        "{what} {sig} is not a real-time signal this program may use: pick one from SIGRTMIN \
         ({}) to SIGRTMAX ({}), such as SIGRTMIN+3 (libc::SIGRTMIN() + 3)",
        libc::SIGRTMIN(),
        libc::SIGRTMAX()
    )))
}

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
/// the whole address space stands for the stack. The floor check of inline joins still runs
/// there, on the addresses of Miri's locals, which do not follow the nesting, so an inline
/// join may be skipped at random under Miri (always safe: the join then waits, as one past
/// its budget does); `INLINE_BUDGET` bounds the nesting (interpreted frames do not use the
/// host's stack).
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

#[cfg(test)]
mod tests {
    use super::{parse_rt_signal, signal_name};

    #[test]
    fn real_time_signals_parse_in_the_forms_programs_write() {
        let min = libc::SIGRTMIN();
        let max = libc::SIGRTMAX();
        for (text, want) in [
            ("SIGRTMIN+3", Some(min + 3)),
            ("sigrtmin + 3", Some(min + 3)),
            ("RTMIN+1", Some(min + 1)),
            ("SIGRTMIN", Some(min)),
            ("SIGRTMAX-2", Some(max - 2)),
            ("rtmax", Some(max)),
            (&(min + 5).to_string(), Some(min + 5)),
            // Outside the range a program may use, or not a signal at all.
            ("SIGRTMIN-1", None),
            ("SIGRTMAX+1", None),
            ("10", None),
            ("SIGUSR1", None),
            ("SIGRTMIN+", None),
            ("SIGRTMIN+-3", None),
            ("SIGRTMIN+99999999999", None),
            ("", None),
            // Blanks at the ends and around the sign only: inside a number or name they would
            // make another signal of it ("3 5" read as 35 before).
            (" SIGRTMIN + 3 ", Some(min + 3)),
            ("SIGRTMAX -1", Some(max - 1)),
            (&format!("\t{}\n", min + 5), Some(min + 5)),
            (&format!("{} {}", (min + 5) / 10, (min + 5) % 10), None),
            ("3\t6", None),
            ("SIG RTMIN+3", None),
            ("SIGRTMIN+1 0", None),
        ] {
            assert_eq!(parse_rt_signal(text), want, "{text:?}");
        }
        assert_eq!(signal_name(min + 3), "SIGRTMIN+3");
        assert_eq!(signal_name(min), "SIGRTMIN");
        assert_eq!(signal_name(10), "signal 10");
        assert_eq!(parse_rt_signal(&signal_name(max)), Some(max));
    }
}
