//! Files: open, positional read and write, fsync, statx, close. io_uring does them in the
//! kernel; on epoll they run on the blocking pool (`io/blocking.rs`), with a copy through a
//! pool-owned buffer because the caller's buffer need not be `Send`.
//!
//! Every operation on an open file holds the file's descriptor (`Arc<OwnedFd>`) until it ends,
//! on both drivers: the pool job's closure on epoll, the `Op`'s data on io_uring (which the
//! driver keeps until the completion if the `Op` is dropped). An io_uring entry names the
//! descriptor by number only and waits in the submission queue until the end of the turn: a
//! future polled once and forgotten (`mem::forget`, safe code), its file then dropped, left
//! the entry naming a closed number, and the next file opened took it, so the write landed in
//! that file (or the read took its bytes). The number stays taken now until the operation ends
//! (for good, for a forgotten one: a leak, as of its buffer).

use std::{
    ffi::CString,
    io,
    mem::MaybeUninit,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Arc,
};

use io_uring::{opcode, types};

use super::{backend, backend_or_give_back, cvt, fixed_index, submit};
use crate::io::{blocking, uring::result, BufResult, Driver, IoBuf, IoBufMut};

/// Opens `path` with `open(2)` flags and mode (`O_CLOEXEC` is added).
pub(crate) async fn open(path: CString, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_CLOEXEC;
    let mut path = path;
    loop {
        match backend()? {
            Driver::IoUring => {
                // `IOSQE_ASYNC`: straight to the kernel's worker threads, which open as
                // `open(2)` does. Issued inline, the kernel first tries with `O_NONBLOCK` and
                // returns that result: a write-only open of a FIFO without a reader failed
                // with `ENXIO`, and a read-only one returned before any writer came (its first
                // read: end of file), where `std` and the epoll driver wait. The cost is a hop
                // to a kernel worker per open (tokio runs every open on its blocking pool); a
                // worker blocked in an open is interrupted by the cancel of a dropped `open`
                // future.
                let build = |p: &mut CString| {
                    opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), p.as_ptr())
                        .flags(flags)
                        .mode(mode)
                        .build()
                        .flags(io_uring::squeue::Flags::ASYNC)
                };
                // Interrupted with nothing opened (`cut_by_shutdown`): opened again, on the
                // loop that polls it now. It failed with that error, where epoll's pool job
                // went on and opened.
                let res = match run_to_end(path, build, true).await {
                    Ended::Done(res, _) => res,
                    Ended::Cut(p) => {
                        path = p;
                        continue;
                    }
                    Ended::Refused(e, _) => return Err(e),
                };
                // SAFETY: the kernel returned a fresh descriptor that we now own.
                return result(res).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) });
            }
            Driver::Epoll => {
                return blocking::run(move || {
                    let open = || {
                        // SAFETY: `path` is a live NUL-terminated string.
                        cvt(unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) })
                    };
                    // An open that may wait for a peer (a FIFO, a terminal) is not claimed: a
                    // drop cannot end it by waiting, and only stalled its loop `CALL_WAIT`.
                    let fd = if opens_a_peer(&path) {
                        blocking::retrying(open)
                    } else {
                        blocking::claimed(open)
                    }?;
                    // SAFETY: open returned a fresh descriptor that we now own.
                    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
                })
                .await;
            }
        }
    }
}

/// Whether `path` names something whose `open(2)` may wait for a peer
/// ([`blocking::mode_waits_for_peer`]; a path that cannot be looked at: no, as for `O_CREAT`).
fn opens_a_peer(path: &CString) -> bool {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: a live NUL-terminated path and a local the kernel fills.
    if unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: stat succeeded and filled it.
    blocking::mode_waits_for_peer(unsafe { st.assume_init() }.st_mode)
}

/// Runs `call`, a path operation (`rename`, `unlink`, `mkdir`, ...), as a blocking-pool job on
/// either driver, never signalled ([`blocking::run_uninterrupted`]: such a call waits for no
/// peer, and a signal could only cut a `create_dir_all` halfway on a file system that takes
/// one), and claimed ([`blocking::claimed`]): a drop before the call means no call, after it
/// the drop waits for the call (up to 10 ms), so a dropped operation does not land after a
/// later one. io_uring has
/// opcodes for some of them (`RENAMEAT`, `UNLINKAT`, `MKDIRAT`), from Linux 5.11 and 5.15,
/// above the floor the driver probes for; these calls are rare beside reads and writes, and
/// one path for both drivers keeps them alike (tokio runs them on its pool too). Off any loop
/// (or on one without a driver), the same error as every other file call, before any job.
pub(crate) async fn path_call(
    mut call: impl FnMut() -> io::Result<()> + Send + 'static,
) -> io::Result<()> {
    backend()?;
    blocking::run_uninterrupted(move || blocking::claimed(&mut call)).await
}

/// The kernel's internal "restart the system call" error, which an io_uring worker's
/// interrupted call can complete with (never a real answer).
const ERESTARTSYS: i32 = 512;

/// Whether an io_uring file operation of driver `driver`, still awaited, ended with nothing
/// done because that driver's shutdown cancelled it (the future outlived its loop:
/// `ECANCELED`, or, from the kernel worker it waited in, `EINTR` or `ERESTARTSYS`, which a
/// signal gives too, and `std` retries). It starts again on the loop that polls it now, as
/// epoll's pool job, which a shutdown does not stop, goes on (a read of a FIFO then gets the
/// bytes written meanwhile, where it failed with `ECANCELED`). An `ECANCELED` from a driver
/// still there is the kernel's answer, returned: io-wq cancels an operation that must block
/// when it can start no worker thread (`RLIMIT_NPROC`, a container's `pids.max`), and every
/// try again was cancelled the same way, a call that never ended.
fn cut_by_shutdown(res: i32, driver: u64) -> bool {
    match -res {
        libc::ECANCELED => crate::io::uring::driver_gone(driver),
        libc::EINTR | ERESTARTSYS => true,
        _ => false,
    }
}

/// How an io_uring file operation run by [`run_to_end`] ended; each gives its data back.
enum Ended<T> {
    /// The kernel's result.
    Done(i32, T),
    /// Its driver's shutdown cut it with nothing done ([`cut_by_shutdown`]): the caller starts
    /// it again, on the loop that polls it now.
    Cut(T),
    /// The submit failed.
    Refused(io::Error, T),
}

/// Submits the operation `build` makes of `data` (`is_fd`: its result is a new descriptor,
/// closed if the operation is abandoned) and awaits its end. The one place a file operation
/// tells a shutdown's cut from the kernel's answer, for `open`, `read_at`, `write_at`, `fsync`
/// and `stat`.
async fn run_to_end<T: 'static>(
    data: T,
    build: impl FnOnce(&mut T) -> io_uring::squeue::Entry,
    is_fd: bool,
) -> Ended<T> {
    let op = match submit(data, build) {
        Ok(op) if is_fd => op.result_is_fd(),
        Ok(op) => op,
        Err((e, data)) => return Ended::Refused(e, data),
    };
    let driver = op.driver_id();
    let (res, data) = op.await;
    if cut_by_shutdown(res, driver) {
        Ended::Cut(data)
    } else {
        Ended::Done(res, data)
    }
}

/// A file offset both drivers take the same way. Past `i64::MAX` `pread` fails with `EINVAL`,
/// while io_uring reads `u64::MAX` as "the file's current position" and writes there.
pub(crate) fn check_pos(pos: u64) -> io::Result<()> {
    if pos > i64::MAX as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("file offset {pos} is past the largest one a file can have (i64::MAX)"),
        ));
    }
    Ok(())
}

/// The most one `read(2)`/`write(2)` moves on Linux (`MAX_RW_COUNT`: `INT_MAX` rounded down to
/// a 4 KiB page). The epoll path's copy through a pool buffer is cut to it: the rest of a
/// bigger buffer was allocated (and, for a write, copied) for nothing, which doubled the
/// memory of a huge read or write and could abort the process on an allocation that failed.
pub(crate) const MAX_RW: usize = 0x7fff_f000;

/// The error of an epoll-path copy buffer the allocator refused.
fn no_memory(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("xtc: cannot allocate the {len}-byte copy buffer of a file operation"),
    )
}

/// An empty buffer with room for `len` bytes, allocated fallibly (`OutOfMemory`, not an abort).
fn try_buffer(len: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| no_memory(len))?;
    Ok(v)
}

/// A copy of `buf`'s initialized bytes from `from`, at most one write's worth (`MAX_RW`),
/// allocated fallibly: what a write goes out from on the epoll path, and what `write_all`
/// resends after a short write. Cost: one allocation and a copy of up to `MAX_RW` bytes.
pub(crate) fn copy_for_write<B: IoBuf>(buf: &B, from: usize) -> io::Result<Vec<u8>> {
    let len = buf.bytes_init().saturating_sub(from).min(MAX_RW);
    let mut v = try_buffer(len)?;
    if len > 0 {
        // SAFETY: the first `bytes_init()` bytes of an IoBuf are initialized, and
        // `from + len <= bytes_init()`. Not for `len == 0`: an empty buffer's pointer may be
        // null, which no slice may have.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(buf.stable_ptr().add(from), len) });
    }
    Ok(v)
}

/// io_uring's offset for "the file's current position" (-1), which is also how it reads and
/// writes files without offsets (FIFOs).
const CURRENT: u64 = u64::MAX;

/// Reads into `buf` from its start at file offset `pos` (`None`: at the file's current
/// position, as `read(2)`, the only way to read a FIFO); its length becomes the count read.
pub(crate) async fn read_at<B: IoBufMut>(
    fd: &Arc<OwnedFd>,
    mut buf: B,
    pos: Option<u64>,
) -> BufResult<usize, B> {
    if let Some(Err(e)) = pos.map(check_pos) {
        return (Err(e), buf);
    }
    // Again after a read its driver's shutdown cancelled (`cut_by_shutdown`), on the current
    // loop's driver.
    let res = loop {
        let kind = backend_or_give_back!(buf);
        match kind {
            Driver::IoUring => {
                let raw = fd.as_raw_fd();
                let fixed = fixed_index(&buf);
                // The descriptor travels with the operation (see the module docs).
                let build = |(b, _): &mut (B, Arc<OwnedFd>)| {
                    let (ptr, len) = (
                        b.stable_mut_ptr(),
                        b.bytes_total().min(u32::MAX as usize) as u32,
                    );
                    let at = pos.unwrap_or(CURRENT);
                    match fixed {
                        Some(i) => opcode::ReadFixed::new(types::Fd(raw), ptr, len, i)
                            .offset(at)
                            .build(),
                        None => opcode::Read::new(types::Fd(raw), ptr, len)
                            .offset(at)
                            .build(),
                    }
                };
                match run_to_end((buf, fd.clone()), build, false).await {
                    Ended::Done(res, (b, _fd)) => {
                        buf = b;
                        break result(res).map(|n| n as usize);
                    }
                    Ended::Cut((b, _fd)) => buf = b,
                    Ended::Refused(e, (b, _fd)) => return (Err(e), b),
                }
            }
            Driver::Epoll => {
                let fd = fd.clone();
                let len = buf.bytes_total().min(MAX_RW);
                let r = blocking::run(move || {
                    let mut tmp = try_buffer(len)?;
                    let (raw, dst) = (fd.as_raw_fd(), tmp.as_mut_ptr().cast());
                    let n = blocking::when_ready(raw, libc::POLLIN, || {
                        // SAFETY: `tmp` has `len` writable bytes (its capacity); the Arc keeps the
                        // fd open.
                        cvt(unsafe {
                            match pos {
                                Some(pos) => libc::pread(raw, dst, len, pos as i64),
                                None => libc::read(raw, dst, len),
                            }
                        })
                    })?;
                    // SAFETY: the read initialized the first `n <= len` bytes, within the capacity.
                    unsafe { tmp.set_len(n as usize) };
                    Ok(tmp)
                })
                .await;
                break r.map(|tmp| {
                    if !tmp.is_empty() {
                        // SAFETY: `tmp.len() <= bytes_total()`, and the regions do not overlap
                        // (and are non-null: not for 0 bytes, where an empty buffer's pointer may
                        // be null).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                tmp.as_ptr(),
                                buf.stable_mut_ptr(),
                                tmp.len(),
                            )
                        };
                    }
                    tmp.len()
                });
            }
        }
    };
    if let Ok(n) = res {
        // SAFETY: the first `n <= bytes_total()` bytes were just written.
        unsafe { buf.set_init(n) };
    }
    (res, buf)
}

/// Writes `buf[..bytes_init()]` at file offset `pos` (`None`: at the current position, as
/// `write(2)`) once; returns the count written.
pub(crate) async fn write_at<B: IoBuf>(
    fd: &Arc<OwnedFd>,
    mut buf: B,
    pos: Option<u64>,
) -> BufResult<usize, B> {
    if let Some(Err(e)) = pos.map(check_pos) {
        return (Err(e), buf);
    }
    // Again after a write its driver's shutdown cancelled (`cut_by_shutdown`: nothing was
    // written), on the current loop's driver.
    loop {
        let kind = backend_or_give_back!(buf);
        match kind {
            Driver::IoUring => {
                let raw = fd.as_raw_fd();
                let fixed = fixed_index(&buf);
                // The descriptor travels with the operation (see the module docs).
                let build = |(b, _): &mut (B, Arc<OwnedFd>)| {
                    let (ptr, len) = (b.stable_ptr(), b.bytes_init().min(u32::MAX as usize) as u32);
                    let at = pos.unwrap_or(CURRENT);
                    match fixed {
                        Some(i) => opcode::WriteFixed::new(types::Fd(raw), ptr, len, i)
                            .offset(at)
                            .build(),
                        None => opcode::Write::new(types::Fd(raw), ptr, len)
                            .offset(at)
                            .build(),
                    }
                };
                match run_to_end((buf, fd.clone()), build, false).await {
                    Ended::Done(res, (b, _fd)) => return (result(res).map(|n| n as usize), b),
                    Ended::Cut((b, _fd)) => buf = b,
                    Ended::Refused(e, (b, _fd)) => return (Err(e), b),
                }
            }
            Driver::Epoll => {
                let fd = fd.clone();
                let data = match copy_for_write(&buf, 0) {
                    Ok(data) => data,
                    Err(e) => return (Err(e), buf),
                };
                let r = blocking::run(move || {
                    let (raw, src, len) = (fd.as_raw_fd(), data.as_ptr().cast(), data.len());
                    blocking::when_ready(raw, libc::POLLOUT, || {
                        // SAFETY: `data` is a live buffer of its length; the Arc keeps the fd open.
                        cvt(unsafe {
                            match pos {
                                Some(pos) => libc::pwrite(raw, src, len, pos as i64),
                                None => libc::write(raw, src, len),
                            }
                        })
                    })
                    .map(|n| n as usize)
                })
                .await;
                return (r, buf);
            }
        }
    }
}

/// `fsync` (or `fdatasync`). On io_uring, cut by its driver's shutdown (`cut_by_shutdown`: the
/// future outlived its `block_on`), it runs again on the loop that polls it now, as epoll's
/// pool job goes on: it failed with that `ECANCELED`, an error nobody asked for.
pub(crate) async fn fsync(fd: &Arc<OwnedFd>, data_only: bool) -> io::Result<()> {
    loop {
        match backend()? {
            Driver::IoUring => {
                let raw = fd.as_raw_fd();
                let flags = if data_only {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                // The descriptor travels with the operation (see the module docs).
                let build =
                    |_: &mut Arc<OwnedFd>| opcode::Fsync::new(types::Fd(raw)).flags(flags).build();
                match run_to_end(fd.clone(), build, false).await {
                    Ended::Done(res, _) => return result(res).map(drop),
                    Ended::Cut(_) => continue,
                    Ended::Refused(e, _) => return Err(e),
                }
            }
            Driver::Epoll => {
                let fd = fd.clone();
                return blocking::run(move || {
                    // Retried on EINTR like every pool call but `close` (a FUSE or NFS file
                    // may return it, and a late cancel signal must not fail an uncancelled
                    // job).
                    blocking::retrying(|| {
                        // SAFETY: plain syscall on an fd the Arc keeps open.
                        let rc = unsafe {
                            if data_only {
                                libc::fdatasync(fd.as_raw_fd())
                            } else {
                                libc::fsync(fd.as_raw_fd())
                            }
                        };
                        cvt(rc).map(drop)
                    })
                })
                .await;
            }
        }
    }
}

/// The file's size, kind, permission bits and modification time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    pub(crate) size: u64,
    pub(crate) mode: u32,
    pub(crate) mtime_sec: i64,
    pub(crate) mtime_nsec: u32,
}

/// `statx` of an open file. On io_uring, cut by its driver's shutdown, it runs again on the
/// loop that polls it now, as [`fsync`] does.
pub(crate) async fn stat(fd: &Arc<OwnedFd>) -> io::Result<Stat> {
    loop {
        match backend()? {
            Driver::IoUring => {
                let raw = fd.as_raw_fd();
                let data: Box<MaybeUninit<libc::statx>> = Box::new(MaybeUninit::zeroed());
                // The descriptor travels with the operation (see the module docs).
                let build = |(d, _): &mut (Box<MaybeUninit<libc::statx>>, Arc<OwnedFd>)| {
                    opcode::Statx::new(types::Fd(raw), c"".as_ptr(), d.as_mut_ptr().cast())
                        .flags(libc::AT_EMPTY_PATH)
                        .mask(libc::STATX_BASIC_STATS)
                        .build()
                };
                let (res, d) = match run_to_end((data, fd.clone()), build, false).await {
                    Ended::Done(res, (d, _fd)) => (res, d),
                    Ended::Cut(_) => continue,
                    Ended::Refused(e, _) => return Err(e),
                };
                result(res)?;
                // SAFETY: statx succeeded, so the kernel filled the struct (it started zeroed).
                let s = unsafe { d.assume_init() };
                return Ok(Stat {
                    size: s.stx_size,
                    mode: s.stx_mode as u32,
                    mtime_sec: s.stx_mtime.tv_sec,
                    mtime_nsec: s.stx_mtime.tv_nsec,
                });
            }
            Driver::Epoll => {
                let fd = fd.clone();
                return blocking::run(move || {
                    let mut st = MaybeUninit::<libc::stat>::zeroed();
                    blocking::retrying(|| {
                        // SAFETY: `st` is a live local; the Arc keeps the fd open.
                        cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })
                    })?;
                    // SAFETY: fstat succeeded and filled it.
                    let st = unsafe { st.assume_init() };
                    Ok(Stat {
                        size: st.st_size as u64,
                        mode: st.st_mode,
                        mtime_sec: st.st_mtime,
                        mtime_nsec: st.st_mtime_nsec as u32,
                    })
                })
                .await;
            }
        }
    }
}

/// Closes `fd`, reporting the kernel's error (unlike a drop). Off any loop (or on one without a
/// driver) with a plain `close(2)`, as on epoll: the descriptor is ours and closes either way
/// (the off-loop error, returned after the drop had closed it, told the caller to do what it
/// no longer could, and lost the kernel's answer).
pub(crate) async fn close(fd: OwnedFd) -> io::Result<()> {
    match backend() {
        Ok(Driver::IoUring) => {
            let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
            let op = submit((), |_| opcode::Close::new(types::Fd(raw)).build());
            match op {
                Ok(op) => match (Closing { op: Some(op), raw }).await {
                    // Cancelled before it ran: by its driver's shutdown (the future outlived
                    // its `block_on`; or an entry the kernel never consumed, rule 5), or by
                    // io-wq, which cancels work it can start no worker for. The descriptor is
                    // still open, and still ours: closed here, as on epoll. Returned as is, the
                    // error left it open for good, nobody holding it any more.
                    // (`uring::close_cancelled` tells that from a `->flush` answering
                    // `ECANCELED`, which closed it.)
                    res if res == -libc::ECANCELED => {
                        closed(crate::io::uring::close_cancelled(raw))
                    }
                    res => closed(result(res).map(drop)),
                },
                Err(_) => {
                    // Closed here instead, and that close's answer is the one to give: the
                    // submission's error said the file was not closed, when it was.
                    // SAFETY: we own `raw` (taken from the OwnedFd) and the op never ran.
                    closed(cvt(unsafe { libc::close(raw) }).map(drop))
                }
            }
        }
        Ok(Driver::Epoll) | Err(_) => {
            let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
            // SAFETY: we own `raw`. On the loop's thread, as `File`'s drop is on either
            // driver: close on a local file does not block for long; on a network or FUSE
            // file system its flush may (documented in fs.rs).
            closed(cvt(unsafe { libc::close(raw) }).map(drop))
        }
    }
}

/// A file's io_uring `CLOSE` in flight, resolving to the kernel's result. Dropped before it
/// ends, it is left to run (`Op::detach_closing`), not cancelled as a dropped operation is: the
/// kernel runs the `CLOSE` of a file with a `->flush` (NFS, FUSE, overlay, the root of most
/// containers) on a worker, a cancel took it off the worker's queue before it ran, and the
/// descriptor, already out of its `File`, stayed open for good. One that the kernel did
/// cancel before it ran (`ECANCELED`) is closed here, or, once left to run, by the driver
/// (a shutdown still cancels it, after its grace, or never submits it: rule 5).
struct Closing {
    op: Option<crate::io::uring::Op<()>>,
    /// The descriptor the `CLOSE` names, ours until it has run.
    raw: std::os::fd::RawFd,
}

impl std::future::Future for Closing {
    type Output = i32;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<i32> {
        let op = self.op.as_mut().expect("polled after completion");
        let (res, ()) = std::task::ready!(std::pin::Pin::new(op).poll(cx));
        self.op = None;
        std::task::Poll::Ready(res)
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else {
            return;
        };
        match op.completed() {
            // Closed by the driver if it ends without having run (its shutdown cancels it, or
            // never submits it): `Op::detach_closing`.
            None => op.detach_closing(self.raw),
            Some(res) => {
                drop(op);
                if res == -libc::ECANCELED {
                    // Nobody to tell: the close's future is gone.
                    let _ = crate::io::uring::close_cancelled(self.raw);
                }
            }
        }
    }
}

/// `close`'s answer as the caller should see it: `EINTR` (a signal, such as xtc's preemption
/// tick, during the `->flush` of NFS or FUSE) is success. Linux has released the descriptor by
/// then, whatever the result (close(2)); reported as an error, it invited a retry that could
/// close an unrelated descriptor that reused the number meanwhile. So are the kernel's restart
/// codes ([`RESTART_CODES`]), which an io_uring `CLOSE` passes through where `close(2)` turns
/// them into `EINTR`.
fn closed(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) if e.raw_os_error().is_some_and(|c| RESTART_CODES.contains(&c)) => Ok(()),
        r => r,
    }
}

/// The kernel's internal "restart the system call" codes (`ERESTARTSYS`, `ERESTARTNOINTR`,
/// `ERESTARTNOHAND`, `ERESTART_RESTARTBLOCK`), never seen by a system call's caller.
/// io_uring's `CLOSE` completes with whatever `filp_close` returned, so a `->flush` (NFS,
/// FUSE) that a signal interrupted on a kernel worker (the notification a cancel sends it)
/// ends it with one, though the descriptor left the table before the flush; `close(2)` turns
/// them into `EINTR` ("can't restart close syscall because file table entry was cleared").
const RESTART_CODES: [i32; 4] = [ERESTARTSYS, 513, 514, 516];

#[cfg(test)]
mod tests {
    use super::closed;
    use std::io;

    /// No file here makes `close(2)` return `EINTR` (it takes a filesystem with a `->flush`
    /// and a signal in it), so the mapping is checked on its own.
    #[test]
    fn close_interrupted_is_closed() {
        assert!(closed(Err(io::Error::from_raw_os_error(libc::EINTR))).is_ok());
        assert!(closed(Ok(())).is_ok());
        let bad = closed(Err(io::Error::from_raw_os_error(libc::EBADF))).unwrap_err();
        assert_eq!(bad.raw_os_error(), Some(libc::EBADF));
    }

    /// An io_uring `CLOSE` completes with what `filp_close` returned: unlike `close(2)`, which
    /// turns the kernel's restart codes into `EINTR` ("can't restart close syscall because
    /// file table entry was cleared"), io_uring passes `-ERESTARTSYS` (a worker's `->flush`
    /// interrupted, as by the cancel a dropped driver sends) and its kin through. The
    /// descriptor is gone all the same: `Ok`, as for `EINTR`. They came out as an error of
    /// an unknown code, which invited a retry that could close a reused number.
    #[test]
    fn close_restart_codes_are_closed() {
        for code in [512, 513, 514, 516] {
            let r = crate::io::uring::result(-code).map(drop);
            assert!(closed(r).is_ok(), "-{code}");
        }
    }
}
