//! Preemption when the kernel refuses the CPU-time tick's signal handler (a seccomp filter
//! denying `rt_sigaction`): every worker runs without the timer. Its own test binary: the
//! handler is installed once per process, so no other test may run in it.
//!
//! The outcome of the one attempt used to reach only the first worker: the others got `Ok`
//! and armed a timer whose signal (SIGRTMIN+1) still had its default action, which ended the
//! process at the first tick.

mod common;

use std::time::Duration;

use xtc_shards::Executor;

/// Two shards with 1 ms preemption, started from a thread whose `rt_sigaction` fails: both run
/// their CPU-bound task to the end and `run()` returns.
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
        // 50 ms of CPU time on each worker (not wall time, which a loaded machine may give
        // as less than one tick of CPU), so each armed timer would fire.
        ex.spawn_on(s, || async {
            let t0 = common::thread_cpu_time();
            while common::thread_cpu_time() - t0 < Duration::from_millis(50) {
                common::burn(Duration::from_micros(50));
            }
        })
        .unwrap();
    }
    std::thread::spawn(move || {
        if !common::deny_syscall(libc::SYS_rt_sigaction, libc::EPERM as u32) {
            println!("skipped: cannot install a seccomp filter");
            return;
        }
        ex.run().unwrap();
    })
    .join()
    .unwrap();
}
