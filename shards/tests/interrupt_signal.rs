//! The blocking pool's interrupt signal is one per process, fixed by the first executor
//! built, and only by a build that succeeds. Its own test binary: no other executor may be
//! built in the process first.
//!
//! A refused build fixed it (from a review): after `interrupt_signal(SIGRTMIN+1)` was refused
//! for clashing with the default preemption signal, every later builder that did not ask for
//! `SIGRTMIN+1` was refused for good, and its error blamed "the first executor built".

use std::time::Duration;

use xtc_shards::{Error, Executor};

#[test]
fn only_a_build_that_succeeds_fixes_the_interrupt_signal() {
    let rt = libc::SIGRTMIN();
    // Refused: the same signal as the preemption tick (default SIGRTMIN+1).
    let e = Executor::builder()
        .shards(1)
        .interrupt_signal(rt + 1)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("interrupt signal"), "{e}");
    // Refused for a reason of its own.
    let e = Executor::builder()
        .shards(1)
        .interrupt_signal(rt + 5)
        .spin_before_park(Duration::from_secs(5))
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("spin_before_park"), "{e}");
    // Neither fixed anything: this one picks SIGRTMIN+6, and fixes it.
    let ex = Executor::builder()
        .shards(1)
        .interrupt_signal(rt + 6)
        .build()
        .unwrap();
    assert_eq!(ex.interrupt_signal(), rt + 6);
    // A builder that names none gets the one fixed; one that names another is refused.
    let ex = Executor::builder().shards(1).build().unwrap();
    assert_eq!(ex.interrupt_signal(), rt + 6);
    let e = Executor::builder()
        .shards(1)
        .interrupt_signal(rt + 7)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("SIGRTMIN+6 already"), "{e}");
}
