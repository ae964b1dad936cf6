//! Raw system calls, each behind a small safe type.

pub(crate) mod cgroup;
pub(crate) mod cputimer;
// Under loom the parker is a loom model, not an eventfd.
#[cfg_attr(loom, allow(dead_code))]
mod eventfd;
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use eventfd::EventFd;

/// Bits in one word of a CPU mask as the kernel reads and writes it (an array of `unsigned
/// long`, `cpu_set_t`'s layout at any size).
const MASK_WORD_BITS: usize = libc::c_ulong::BITS as usize;

/// The CPUs the calling thread may run on (`sched_getaffinity`), of any number: the mask
/// starts at `cpu_set_t`'s 1,024 CPUs and doubles while the kernel's is larger (`EINVAL`).
/// `None` if the mask cannot be read. Cost: one system call (more only past 1,024 CPUs) and a
/// scan of the mask's words.
pub(crate) fn thread_cpus() -> Option<Vec<usize>> {
    let mut words = libc::CPU_SETSIZE as usize / MASK_WORD_BITS;
    loop {
        let mut mask: Vec<libc::c_ulong> = vec![0; words];
        let bytes = words * std::mem::size_of::<libc::c_ulong>();
        // SAFETY: the kernel writes at most `bytes` bytes, the size of `mask`'s buffer, which
        // has `cpu_set_t`'s layout (an array of `unsigned long`) at this size.
        let r = unsafe { libc::sched_getaffinity(0, bytes, mask.as_mut_ptr().cast()) };
        if r == 0 {
            return Some(mask_cpus(&mask));
        }
        let e = std::io::Error::last_os_error();
        // EINVAL: the kernel's mask is larger than ours. 2^20 CPUs is far past any machine.
        if e.raw_os_error() != Some(libc::EINVAL) || words >= (1 << 20) / MASK_WORD_BITS {
            return None;
        }
        words *= 2;
    }
}

/// The CPUs a mask of `unsigned long` words names, in order.
fn mask_cpus(mask: &[libc::c_ulong]) -> Vec<usize> {
    let mut cpus = Vec::new();
    for (w, &word) in mask.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            cpus.push(w * MASK_WORD_BITS + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
    cpus
}

/// A mask of `unsigned long` words naming `cpus` (any numbers), as `sched_setaffinity` reads
/// one.
fn cpus_mask(cpus: &[usize]) -> Vec<libc::c_ulong> {
    let top = cpus.iter().copied().max().unwrap_or(0);
    let mut mask: Vec<libc::c_ulong> = vec![0; top / MASK_WORD_BITS + 1];
    for &cpu in cpus {
        mask[cpu / MASK_WORD_BITS] |= 1 << (cpu % MASK_WORD_BITS);
    }
    mask
}

/// Binds the calling thread to `cpus` (`sched_setaffinity`), of any number: the mask is as
/// long as the highest CPU needs. Cost: one system call and a mask of that size.
pub(crate) fn set_thread_cpus(cpus: &[usize]) -> std::io::Result<()> {
    let mask = cpus_mask(cpus);
    let bytes = mask.len() * std::mem::size_of::<libc::c_ulong>();
    #[cfg(test)]
    affinity_tests::LAST_SET.with(|l| *l.borrow_mut() = Some((bytes, mask.clone())));
    // SAFETY: the kernel reads `bytes` bytes, the size of `mask`'s buffer, which has
    // `cpu_set_t`'s layout (an array of `unsigned long`) at this size; the call changes this
    // thread's mask only.
    let r = unsafe { libc::sched_setaffinity(0, bytes, mask.as_ptr().cast()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod affinity_tests {
    use super::{cpus_mask, mask_cpus, set_thread_cpus, thread_cpus, MASK_WORD_BITS};

    /// A mask names exactly its CPUs, past `cpu_set_t`'s 1,024 too.
    #[test]
    fn masks_hold_cpus_of_any_number() {
        let cpus = vec![0, 3, 63, 64, 1023, 1024, 1500, 4095];
        let mask = cpus_mask(&cpus);
        assert_eq!(mask.len(), 4095 / MASK_WORD_BITS + 1);
        assert_eq!(mask_cpus(&mask), cpus);
        assert_eq!(mask_cpus(&cpus_mask(&[])), Vec::<usize>::new());
    }

    thread_local! {
        /// The size in bytes and the mask of this thread's last `set_thread_cpus` call.
        pub(super) static LAST_SET: std::cell::RefCell<Option<(usize, Vec<libc::c_ulong>)>> =
            const { std::cell::RefCell::new(None) };
    }

    /// Binding to the thread's own CPUs plus one past 1,024 hands the kernel a mask that
    /// names them all, at its full size (truncated to `cpu_set_t`, the set lost every CPU at
    /// 1,024 and above; the kernel, which ignores CPUs it does not have, cannot tell on a
    /// machine with fewer, so the call's arguments are checked), takes, and leaves the
    /// thread's mask as it was.
    #[test]
    fn binding_past_1024_cpus_reaches_the_kernel() {
        let own = thread_cpus().expect("sched_getaffinity");
        let mut wider = own.clone();
        wider.push(1500);
        set_thread_cpus(&wider).expect("sched_setaffinity with a CPU past 1,024");
        let (bytes, mask) = LAST_SET
            .with(|l| l.borrow_mut().take())
            .expect("no call recorded");
        assert_eq!(mask_cpus(&mask), wider);
        assert!(
            bytes * 8 > 1500,
            "a mask of {bytes} bytes cannot name CPU 1,500"
        );
        assert_eq!(thread_cpus().unwrap(), own);
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
