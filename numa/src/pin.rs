//! Binding the calling thread to one CPU, or to a set of them.

#[cfg(not(miri))]
use hwlocality::cpu::binding::{CpuBindingError, CpuBindingFlags};
#[cfg(not(miri))]
use hwlocality::cpu::cpuset::CpuSet;
#[cfg(not(miri))]
use hwlocality::errors::HybridError;

use crate::error::{Error, Result};
use crate::topology::Topology;

/// Bind the calling thread to the CPU with OS index `cpu`, for good.
///
/// Uses hwloc's `set_cpubind` with the `THREAD` flag (`sched_setaffinity` on Linux), so it
/// affects this thread only. The topology must be the running machine, from
/// [`Topology::detect`]: on a synthetic or XML topology hwloc would silently do nothing.
///
/// Cost: one system call and an hwloc CPU-set allocation; the scheduler may migrate the
/// thread right away.
///
/// # Errors
///
/// - [`Error::SyntheticBind`] if `topo.is_synthetic()`;
/// - [`Error::CpuNotAllowed`] if `cpu` is not in [`Topology::allowed_pus`];
/// - [`Error::PinFailed`] with the OS error number if the system refuses.
pub fn pin_current_thread(topo: &Topology, cpu: usize) -> Result<()> {
    bind_current_thread(topo, &[cpu])?;
    tracing::debug!(cpu, "current thread pinned");
    Ok(())
}

/// Bind the calling thread to the CPUs with these OS indices (any of them), for good: what a
/// helper thread started from a pinned one uses to run on every allowed CPU again, instead of
/// the one it inherited.
///
/// Cost and errors: as [`pin_current_thread`] (a refused CPU of `cpus` is named; a failed
/// bind names the first); an empty list is [`Error::NoAllowedCpus`].
#[cfg(not(miri))]
pub fn bind_current_thread(topo: &Topology, cpus: &[usize]) -> Result<()> {
    if topo.is_synthetic() {
        return Err(Error::SyntheticBind);
    }
    if cpus.is_empty() {
        return Err(Error::NoAllowedCpus);
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if !topo.is_allowed(cpu) {
            return Err(Error::CpuNotAllowed {
                cpu,
                allowed: topo.allowed_pus(),
            });
        }
        set.set(cpu);
    }
    let first = cpus[0];
    topo.hw()
        .bind_cpu(&set, CpuBindingFlags::THREAD)
        .map_err(|e| {
            let errno = match &e {
                HybridError::Hwloc(raw) => raw.errno.map_or(0, |n| n.0),
                HybridError::Rust(CpuBindingError::BadCpuSet(_)) => libc::EINVAL,
                HybridError::Rust(CpuBindingError::BadObject(_)) => libc::ENOSYS,
                HybridError::Rust(_) => 0,
            };
            tracing::warn!(cpus = ?cpus, errno, error = %e, "binding the current thread failed");
            Error::PinFailed { cpu: first, errno }
        })?;
    Ok(())
}

/// Under Miri, which cannot call hwloc (C): the same checks, then `sched_setaffinity`, which
/// Miri models per thread over the CPUs it simulates (those of the flat
/// [`Topology::detect`] it builds there).
///
/// # Errors
///
/// As the real one's.
#[cfg(miri)]
pub fn bind_current_thread(topo: &Topology, cpus: &[usize]) -> Result<()> {
    if topo.is_synthetic() {
        return Err(Error::SyntheticBind);
    }
    if cpus.is_empty() {
        return Err(Error::NoAllowedCpus);
    }
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if !topo.is_allowed(cpu) || cpu >= libc::CPU_SETSIZE as usize {
            return Err(Error::CpuNotAllowed {
                cpu,
                allowed: topo.allowed_pus(),
            });
        }
        // SAFETY: `cpu` is below `CPU_SETSIZE` (checked above), so the bit lies in `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a live, initialised `cpu_set_t` of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        tracing::warn!(cpus = ?cpus, errno, "binding the current thread failed");
        return Err(Error::PinFailed {
            cpu: cpus[0],
            errno,
        });
    }
    Ok(())
}
