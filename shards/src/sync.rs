//! The one place atomics and locks are imported from: `std` normally, `loom` under `--cfg loom`, so
//! the loom models in `loom_*` check the code that ships (STYLE.md rule 5). `Arc` is not part of
//! any protocol here and always comes from `std`.

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex,
};

/// Locks a mutex, ignoring poisoning: every critical section in this crate leaves the protected
/// data consistent before anything that could panic, so a poisoned lock holds valid data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;
#[cfg(not(loom))]
pub(crate) use std::sync::MutexGuard;

/// The pause of a spin-wait: `spin_loop` normally; under loom a yield, so the model lets the
/// thread being waited for run instead of exploring the spin for ever.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
