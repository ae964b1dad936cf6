//! Files on the current loop's I/O driver: [`File`], [`read()`], [`write()`], [`OpenOptions`],
//! and the path operations [`rename`], [`remove_file`], [`create_dir`], [`create_dir_all`] and
//! [`remove_dir`] (blocking-pool jobs on both drivers).
//!
//! On io_uring every call is one submission; on epoll each runs on a blocking thread pool (up
//! to 512 threads, started on demand: epoll cannot wait on regular files), with one copy
//! through a pool buffer. Two exceptions: closing (a `File`'s drop on either driver,
//! [`File::close`] on epoll) calls `close(2)` on the loop's thread, which on a network or FUSE
//! file system flushes and may hold the loop that long; and where a pool thread cannot be
//! started (a process or cgroup thread limit) while the pool has no thread at all, a call runs
//! on the loop's thread, where an `open` of a FIFO blocks the whole loop until its peer comes
//! (logged as a warning); with some pool thread alive, it waits in the queue for one. A file's first positioned call adds one `lseek` system call (whether
//! it takes offsets). Positional I/O only (`read_at`, `write_at`): there is no shared cursor,
//! so concurrent operations on one file never race on it. `!Send`, like the other I/O types.
//! Called off any xtc loop (or on a loop without an I/O driver), every operation but
//! [`File::close`] fails with an `io::Error` of kind `Other` saying so, unless a check of its
//! arguments fails first (an offset past `i64::MAX`, a bad [`OpenOptions`] combination, a path
//! with a NUL byte: `InvalidInput`; a positioned call on a FIFO: `ESPIPE`) or it has nothing to
//! do (an empty `write_all_at` returns `Ok`); none panics.
//!
//! # A dropped operation
//!
//! Dropping an operation's future (a `timeout` around it, a lost `select!` branch) cancels it
//! if it has not started. One that has started may still take effect, and then *when* matters
//! to the program's next operation on the same file or path:
//! - on epoll, the drop waits for a started write or open of a file to return (up to 10 ms:
//!   a call that takes longer, a large write to a slow disk, may land after the drop
//!   returned), so an operation issued after the drop comes after it (a FIFO's open or read
//!   is interrupted instead, where xtc's interrupt handler is installed);
//! - on io_uring, a started read or write runs on in the kernel (a cancel interrupts only a
//!   call that waits, such as a FIFO's open), and one the kernel handed to a worker thread
//!   (an `OPENAT` always is) may complete after an operation submitted later;
//! - the path operations ([`rename`], [`remove_file`], ..) run on the pool on both drivers,
//!   and their drop waits as on epoll.
//!
//! So where order matters (a write retried after a timeout, a file created again over one
//! whose creation was dropped), do not drop a started write or open: put the timeout around
//! the whole sequence, or write the retry to a new file and [`rename`] it into place.
//!
//! A write to a FIFO (or pipe) whose reader is gone is a `write(2)`, on both drivers, and the
//! kernel answers it with `SIGPIPE` as well as `EPIPE` (there is no `MSG_NOSIGNAL` for
//! files; `xtc::net`'s sockets never raise it). A Rust `main` ignores `SIGPIPE`, so the call
//! returns the `EPIPE` error; a program that restores the default action (or a C host) dies.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::io::{
    ops::file::{self, Stat},
    BufResult, IoBuf, IoBufMut,
};

/// An open file. Dropping it closes the descriptor synchronously (or, while an operation whose
/// future was dropped still runs, when that ends); [`close`](Self::close) reports the kernel's
/// error.
#[derive(Debug)]
pub struct File {
    // An Arc so an operation in flight (a blocking-pool job on epoll, an `Op`'s data on
    // io_uring) keeps the descriptor open, and its number taken, until it ends.
    fd: Arc<OwnedFd>,
    /// Whether the descriptor takes offsets (not a FIFO, socket or tty), asked once with
    /// `lseek` at the first positioned call: io_uring's `READ`/`WRITE` ignore the offset of a
    /// non-seekable file, where `pread`/`pwrite` (the epoll path) fail with `ESPIPE`.
    seekable: std::cell::OnceCell<bool>,
    _local: std::marker::PhantomData<*const ()>,
}

/// Size, kind, permissions and modification time of a file ([`File::metadata`]). Plain data:
/// its accessors read fields, with no system call.
#[derive(Debug, Clone, Copy)]
pub struct Metadata {
    stat: Stat,
}

impl Metadata {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.stat.size
    }

    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.stat.size == 0
    }

    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.stat.mode & libc::S_IFMT == libc::S_IFREG
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.stat.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// `st_mode`: type and permission bits.
    pub fn mode(&self) -> u32 {
        self.stat.mode
    }

    /// Last modification time.
    pub fn modified(&self) -> SystemTime {
        // The kernel's time is `sec + nsec` with `0 <= nsec < 1e9`, `sec` possibly negative
        // (before 1970): the nanoseconds always count forward.
        let secs = Duration::from_secs(self.stat.mtime_sec.unsigned_abs());
        let nanos = Duration::from_nanos(u64::from(self.stat.mtime_nsec));
        let whole = if self.stat.mtime_sec >= 0 {
            SystemTime::UNIX_EPOCH.checked_add(secs)
        } else {
            SystemTime::UNIX_EPOCH.checked_sub(secs)
        };
        // Checked: no panic on a timestamp at the edge of the representable range.
        whole
            .and_then(|t| t.checked_add(nanos))
            .or(whole)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// How to open a file, as [`std::fs::OpenOptions`]. Its setters only record the choice; the
/// combination is checked by [`open`](Self::open).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    create: bool,
    truncate: bool,
    append: bool,
    create_new: bool,
    mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// Nothing set (open fails until read, write or append is); mode 0o666 (before the
    /// umask). The combinations `std` refuses are refused the same way, with `InvalidInput`.
    /// Cost: none (a few plain fields, no allocation); each setter below is one field store.
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            create: false,
            truncate: false,
            append: false,
            create_new: false,
            mode: 0o666,
        }
    }

    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }

    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }

    /// Create if missing.
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }

    /// Create, failing if it exists.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }

    /// Truncate to 0 on open.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }

    /// `O_APPEND`.
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }

    /// Permission bits for a created file.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// The `open(2)` flags, refusing what `std` refuses (`InvalidInput`): no access mode, and
    /// create, truncate or create-new on a read-only open, truncate with append (unless
    /// create-new): a read-only "truncate" would empty the file through a handle that cannot
    /// write.
    fn flags(&self) -> io::Result<i32> {
        let invalid = |what: &str| {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("OpenOptions: {what}"),
            ))
        };
        let acc = match (self.read, self.write, self.append) {
            (true, false, false) => libc::O_RDONLY,
            (false, true, false) => libc::O_WRONLY,
            (true, true, false) => libc::O_RDWR,
            (false, _, true) => libc::O_WRONLY | libc::O_APPEND,
            (true, _, true) => libc::O_RDWR | libc::O_APPEND,
            (false, false, false) => return invalid("set read, write and/or append"),
        };
        match (self.write, self.append) {
            (false, false) if self.truncate || self.create || self.create_new => {
                return invalid("create, truncate and create_new need write or append")
            }
            (_, true) if self.truncate && !self.create_new => {
                return invalid("truncate and append together (use one, or create_new)")
            }
            _ => {}
        }
        let creation = if self.create_new {
            libc::O_CREAT | libc::O_EXCL
        } else {
            (if self.create { libc::O_CREAT } else { 0 })
                | (if self.truncate { libc::O_TRUNC } else { 0 })
        };
        Ok(acc | creation)
    }

    /// Opens `path`. `InvalidInput` for a combination `std` refuses (see [`new`](Self::new))
    /// or a path with a NUL byte; otherwise the kernel's error (`NotFound`, `AlreadyExists`
    /// for `create_new`, ..). Cost: a copy of the path, and one `OPENAT` submission (run on a
    /// kernel worker thread, `IOSQE_ASYNC`, so a FIFO's open waits as `open(2)` does), or a
    /// blocking-pool job on epoll.
    pub async fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        let flags = self.flags()?;
        let path = cstr(path.as_ref())?;
        let fd = file::open(path, flags, self.mode).await?;
        Ok(File::from_fd(fd))
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| nul_in_path())
}

/// `p`, owned for a pool job, or `InvalidInput` for a NUL in it, checked before anything else
/// as every call's arguments are (the module docs).
fn owned_path(p: &Path) -> io::Result<PathBuf> {
    if p.as_os_str().as_bytes().contains(&0) {
        return Err(nul_in_path());
    }
    Ok(p.to_owned())
}

fn nul_in_path() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte")
}

impl File {
    fn from_fd(fd: OwnedFd) -> File {
        File {
            fd: Arc::new(fd),
            seekable: std::cell::OnceCell::new(),
            _local: std::marker::PhantomData,
        }
    }

    /// Whether the file takes offsets. Cost: one `lseek` per file, at its first call.
    fn seekable(&self) -> bool {
        *self.seekable.get_or_init(|| {
            // SAFETY: a plain syscall on our open descriptor; it moves no offset (0 from the
            // current position).
            let r = unsafe { libc::lseek(self.fd.as_raw_fd(), 0, libc::SEEK_CUR) };
            !(r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESPIPE))
        })
    }

    /// `Err(ESPIPE)` (kind `NotSeekable`) for a file without offsets, on both drivers, as
    /// `pread` answers.
    fn check_seekable(&self) -> io::Result<()> {
        if self.seekable() {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::ESPIPE))
        }
    }

    /// Opens an existing file for reading. Cost: as [`OpenOptions::open`].
    pub async fn open(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(path).await
    }

    /// Creates (or truncates) a file for writing. Cost: as [`OpenOptions::open`].
    pub async fn create(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .await
    }

    /// Reads into `buf` from its start at offset `pos`, up to its capacity; a `Vec`'s length
    /// becomes the count read (0 at end of file). A file without offsets (a FIFO) is
    /// `Err(ESPIPE)` on both drivers, an offset past `i64::MAX` is `InvalidInput`. Cost: one
    /// `READ` (`READ_FIXED` for a [`FixedBuf`](crate::io::FixedBuf)) submission, or on epoll
    /// a pool job that reads into a buffer it allocates (up to the capacity, at most 2 GiB)
    /// and a copy out of it.
    pub async fn read_at<B: IoBufMut>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        if let Err(e) = self.check_seekable() {
            return (Err(e), buf);
        }
        file::read_at(&self.fd, buf, Some(pos)).await
    }

    /// Writes `buf[..len]` at offset `pos` once; returns the count written. A file without
    /// offsets (a FIFO) is `Err(ESPIPE)` on both drivers, an offset past `i64::MAX` is
    /// `InvalidInput`. Not cancellation safe: dropping the future after its first poll cancels
    /// the write, but one the kernel (io_uring) or a pool thread (epoll) already started
    /// may still land, and its count is lost with the future (on io_uring possibly after a
    /// later write: see the module docs, "A dropped operation"). Cost: one `WRITE` (`WRITE_FIXED`
    /// for a [`FixedBuf`](crate::io::FixedBuf)) submission, or on epoll a copy (one
    /// allocation, at most 2 GiB) into a pool job.
    pub async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        if let Err(e) = self.check_seekable() {
            return (Err(e), buf);
        }
        file::write_at(&self.fd, buf, Some(pos)).await
    }

    /// Writes all of `buf[..len]` starting at offset `pos`; `WriteZero` if a write takes no
    /// byte, and otherwise the errors of [`write_at`](Self::write_at). Cost: as
    /// [`write_at`](Self::write_at), once unless the write comes back short; the rest then
    /// goes through a copy of the remaining bytes (at most 2 GiB, what one write moves) per
    /// further write.
    pub async fn write_all_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<(), B> {
        // The offset too, before an empty `buf` writes nothing: as `write_at` does.
        if let Err(e) = self.check_seekable().and_then(|()| file::check_pos(pos)) {
            return (Err(e), buf);
        }
        self.write_all(buf, Some(pos)).await
    }

    /// `write_all_at`, or with `None` at the current position (a FIFO; `fs::write`).
    async fn write_all<B: IoBuf>(&self, mut buf: B, pos: Option<u64>) -> BufResult<(), B> {
        let total = buf.bytes_init();
        let mut done = 0usize;
        while done < total {
            // Remaining bytes through a slice copy only after a short write (rare on files).
            if done == 0 {
                let (r, b) = file::write_at(&self.fd, buf, pos).await;
                buf = b;
                match r {
                    Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                    Ok(n) => done += n,
                    Err(e) => return (Err(e), buf),
                }
            } else {
                // At most what one write moves (`file::MAX_RW`): a copy of all the rest of a
                // huge buffer, again after each write, was allocated for bytes the write left.
                let rest = match file::copy_for_write(&buf, done) {
                    Ok(rest) => rest,
                    Err(e) => return (Err(e), buf),
                };
                let at = match pos.map(|p| p.checked_add(done as u64)) {
                    None => None,
                    Some(Some(at)) => Some(at),
                    Some(None) => {
                        let e = io::Error::new(io::ErrorKind::InvalidInput, "file offset overflow");
                        return (Err(e), buf);
                    }
                };
                let (r, _) = file::write_at(&self.fd, rest, at).await;
                match r {
                    Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                    Ok(n) => done += n,
                    Err(e) => return (Err(e), buf),
                }
            }
        }
        (Ok(()), buf)
    }

    /// Flushes data and metadata to the device (`fsync`). Cost: one `FSYNC` submission, or a
    /// pool job on epoll, plus the device's own flush time.
    pub async fn sync_all(&self) -> io::Result<()> {
        file::fsync(&self.fd, false).await
    }

    /// Flushes data (`fdatasync`). Cost: as [`sync_all`](Self::sync_all).
    pub async fn sync_data(&self) -> io::Result<()> {
        file::fsync(&self.fd, true).await
    }

    /// Size, kind, permissions, modification time. Cost: one `STATX` submission and a boxed
    /// result (io_uring) or an `fstat` on the blocking pool (epoll).
    pub async fn metadata(&self) -> io::Result<Metadata> {
        file::stat(&self.fd).await.map(|stat| Metadata { stat })
    }

    /// Closes the file and reports the kernel's error (except `EINTR`: Linux has closed the
    /// descriptor by then, so that is `Ok`, and a retry could only close another file). If an operation is still in flight (one
    /// whose future was dropped: on the epoll driver's pool, or in the kernel on io_uring), the
    /// descriptor closes when it ends, and this returns `Ok`. Its future dropped before it ends,
    /// the file still closes (io_uring lets the `CLOSE` run). Cost: one `CLOSE` submission, or
    /// one `close` on epoll and off any loop (where, unlike the other calls, it works: a
    /// `File` kept past its loop closes as its drop would, reporting the kernel's error).
    pub async fn close(self) -> io::Result<()> {
        match Arc::try_unwrap(self.fd) {
            Ok(fd) => file::close(fd).await,
            Err(_) => Ok(()),
        }
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::os::fd::AsFd for File {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Reads a whole file (a FIFO: to its end). Cost: open, an `lseek`, one `metadata` (not for
/// a FIFO), the result allocated at the file's size, then reads into a fresh chunk of 64 KiB
/// to 16 MiB each, copied into the result, until one returns 0 (so at least two for a
/// non-empty file, one for an empty one), and close.
/// As [`std::fs::read`], a size that cannot be allocated (a huge sparse file) is an
/// `Err(OutOfMemory)`, not an abort.
pub async fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    const MIN_CHUNK: usize = 64 * 1024;
    const MAX_CHUNK: usize = 16 * 1024 * 1024;
    let f = File::open(path).await?;
    // A FIFO (or another file without offsets) has no size: it is read from where it is to
    // its end, as `std::fs::read` does.
    let seekable = f.seekable();
    let size = if seekable {
        usize::try_from(f.metadata().await?.len()).unwrap_or(usize::MAX)
    } else {
        0
    };
    let mut out = Vec::new();
    out.try_reserve_exact(size).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("xtc::fs::read: cannot allocate {size} bytes for the file"),
        )
    })?;
    loop {
        let want = size.saturating_add(1).saturating_sub(out.len());
        let chunk = Vec::with_capacity(want.clamp(MIN_CHUNK, MAX_CHUNK));
        let at = seekable.then_some(out.len() as u64);
        let (r, chunk) = file::read_at(&f.fd, chunk, at).await;
        match r? {
            0 => break,
            _ => out.extend_from_slice(&chunk),
        }
    }
    f.close().await?;
    Ok(out)
}

/// Creates or truncates `path` and writes `data` to it (a FIFO: writes to it). Cost: a copy
/// of `data` unless it is a `Vec<u8>` or `String` already, open, an `lseek`, one
/// [`File::write_all_at`], close.
pub async fn write(path: impl AsRef<Path>, data: impl Into<Vec<u8>>) -> io::Result<()> {
    let f = File::create(path).await?;
    // At offset 0, or, for a FIFO (no offsets), where it is, as `std::fs::write` does.
    let pos = f.seekable().then_some(0);
    let (r, _) = f.write_all(data.into(), pos).await;
    r?;
    f.close().await
}

/// Renames `from` to `to`, replacing `to` if it exists (`rename(2)`, atomic within one file
/// system: the last step of a snapshot written to a temporary file and synced), as
/// [`std::fs::rename`]. Dropped before its job starts, nothing is renamed; once started it
/// completes, and the drop waits for it (up to 10 ms), so an operation issued after the drop
/// comes after it. Cost: two path copies and a job on the blocking pool, on either driver (see
/// the module docs; no io_uring opcode is used for path operations).
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    let (from, to) = (owned_path(from.as_ref())?, owned_path(to.as_ref())?);
    file::path_call(move || std::fs::rename(&from, &to)).await
}

/// Removes a file (or a symbolic link, not what it points to), as [`std::fs::remove_file`].
/// Cancellation and cost as [`rename`].
pub async fn remove_file(path: impl AsRef<Path>) -> io::Result<()> {
    let path = owned_path(path.as_ref())?;
    file::path_call(move || std::fs::remove_file(&path)).await
}

/// Creates a directory (its parent must exist), as [`std::fs::create_dir`]. Cancellation and
/// cost as [`rename`].
pub async fn create_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let path = owned_path(path.as_ref())?;
    file::path_call(move || std::fs::create_dir(&path)).await
}

/// Creates a directory and every missing parent, `Ok` if it exists already, as
/// [`std::fs::create_dir_all`]. Cancellation and cost as [`rename`] (one job for the whole
/// path).
pub async fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let path = owned_path(path.as_ref())?;
    file::path_call(move || std::fs::create_dir_all(&path)).await
}

/// Removes an empty directory, as [`std::fs::remove_dir`]. Cancellation and cost as
/// [`rename`].
pub async fn remove_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let path = owned_path(path.as_ref())?;
    file::path_call(move || std::fs::remove_dir(&path)).await
}

#[cfg(test)]
mod tests {
    use super::OpenOptions;

    /// Every combination of the six switches: ours is refused (`InvalidInput`) exactly where
    /// `std`'s is, on an existing file.
    #[test]
    fn open_options_refuse_what_std_refuses() {
        let path = std::env::temp_dir().join(format!("xtc-open-options-{}", std::process::id()));
        std::fs::write(&path, b"keep").unwrap();
        for bits in 0..64u32 {
            let on = |i: u32| bits & (1 << i) != 0;
            let mut std_opts = std::fs::OpenOptions::new();
            std_opts
                .read(on(0))
                .write(on(1))
                .append(on(2))
                .truncate(on(3))
                .create(on(4))
                .create_new(on(5));
            let mut ours = OpenOptions::new();
            ours.read(on(0))
                .write(on(1))
                .append(on(2))
                .truncate(on(3))
                .create(on(4))
                .create_new(on(5));
            let std_refuses = matches!(
                std_opts.open(&path),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput
            );
            let ours_refuses = ours.flags().is_err();
            assert_eq!(ours_refuses, std_refuses, "switches {bits:06b}");
            // Whatever std accepted must not have been emptied by an accepted read-only open.
            if !on(1) && !on(2) {
                assert_eq!(std::fs::read(&path).unwrap(), b"keep", "{bits:06b}");
            } else {
                std::fs::write(&path, b"keep").unwrap();
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}
