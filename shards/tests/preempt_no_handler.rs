//! Preemption when the kernel refuses the CPU-time tick's signal handler (a seccomp filter
//! denying `rt_sigaction`): every worker runs without the timer. Its own test binary: the
//! handler is installed once per process, so no other test may run in it.
//!
//! The outcome of the one attempt used to reach only the first worker: the others got `Ok`
//! and armed a timer whose signal (SIGRTMIN+1) still had its default action, which ended the
//! process at the first tick.

use std::time::{Duration, Instant};

use xtc_shards::Executor;

#[cfg(target_arch = "x86_64")]
fn deny_rt_sigaction() -> bool {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let filter = [
        SockFilter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        SockFilter {
            code: JEQ_K,
            jt: 0,
            jf: 1,
            k: libc::SYS_rt_sigaction as u32,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ];
    let prog = SockFprog {
        len: filter.len() as u16,
        filter: filter.as_ptr(),
    };
    // SAFETY: plain prctl calls; `prog` outlives them.
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const SockFprog as usize,
                0,
                0,
            ) == 0
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn preemption_with_sigaction_refused_does_not_kill_the_process() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .preempt(Duration::from_millis(1))
        .build()
        .unwrap();
    for s in 0..2 {
        ex.spawn_on(s, || async {
            // CPU time on each worker, so each armed timer fires.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(200) {
                std::hint::spin_loop();
            }
        })
        .unwrap();
    }
    std::thread::spawn(move || {
        if !deny_rt_sigaction() {
            println!("skipped: cannot install a seccomp filter");
            return;
        }
        ex.run().unwrap();
    })
    .join()
    .unwrap();
}
