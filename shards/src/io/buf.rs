//! Owned buffers for completion-based I/O: the operation owns the buffer while the kernel may
//! touch it and gives it back with the result ([`BufResult`]).

use std::{
    cell::RefCell,
    fmt, io,
    ops::{Deref, DerefMut},
    rc::Rc,
};

/// The result of an owned-buffer operation: the outcome and the buffer, returned in every case.
pub type BufResult<T, B> = (io::Result<T>, B);

/// A buffer an I/O operation can read from (`write`, `send`): its bytes `[0, bytes_init())`.
///
/// # Safety
/// While the value is owned by an operation (between the call that takes it and the one that
/// returns it), `stable_ptr()` must keep pointing at the same live memory of at least
/// `bytes_total()` bytes, even when the value itself moves: the kernel reads through it
/// asynchronously, and nothing else may write that memory meanwhile. `bytes_init()` and
/// `bytes_total()` must not change meanwhile either (the kernel has the length from the
/// submission, and xtc reads them again at the completion). `bytes_init()` must not
/// exceed `bytes_total()`, and its bytes must be initialized (they are read, by the kernel
/// and by xtc's copies). `fixed_index` must be left as it is (`None`): only xtc's
/// [`FixedBuf`] names a registered buffer. Heap buffers (`Vec`, `Box<[u8]>`) and `'static`
/// data qualify.
pub unsafe trait IoBuf: 'static {
    /// Start of the buffer.
    fn stable_ptr(&self) -> *const u8;
    /// Initialized bytes, the ones a write sends.
    fn bytes_init(&self) -> usize;
    /// Bytes the buffer can hold, the most a read fills.
    fn bytes_total(&self) -> usize;
    /// Registered-buffer identity `(driver id, index)` for io_uring's fixed operations.
    #[doc(hidden)]
    fn fixed_index(&self) -> Option<(u64, u16)> {
        None
    }
}

/// A buffer an I/O operation can fill (`read`, `recv`): from its start, up to `bytes_total()`.
///
/// # Safety
/// As for [`IoBuf`], for `stable_mut_ptr()` (which must return the same pointer on every call
/// while an operation owns the value: xtc may call it again, and the kernel may be writing
/// through the first one), and the memory must be writable, with nothing else reading or
/// writing it while an operation owns the value (the kernel writes it asynchronously).
pub unsafe trait IoBufMut: IoBuf {
    /// Start of the buffer, writable.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Records that the first `n` bytes now hold data (a `Vec`'s length becomes `n`).
    ///
    /// # Safety
    /// The first `n` bytes must be initialized and `n <= bytes_total()`.
    unsafe fn set_init(&mut self, n: usize);
}

// SAFETY: a Vec's heap block does not move when the Vec value moves, and the operation owns the
// Vec, so nobody can reallocate it while the kernel uses it.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
}

// SAFETY: as for IoBuf; `as_mut_ptr` points at `capacity()` writable bytes.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller guarantees `n <= capacity()` and that `n` bytes are initialized.
        unsafe { self.set_len(n) }
    }
}

// SAFETY: a boxed slice's heap block does not move with the box.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: as for IoBuf; every byte of a boxed slice is initialized and writable.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        // Raw, with no `&mut [u8]` made to bytes the kernel may be writing: `as_mut_ptr`
        // goes through one, and a second call (which the contract allows) invalidated the
        // first pointer under Stacked Borrows.
        (&raw mut **self).cast::<u8>()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

// SAFETY: 'static data never moves or dies.
unsafe impl IoBuf for &'static [u8] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: 'static data never moves or dies. A byte-string literal (`b"..."`) is one of these.
unsafe impl<const N: usize> IoBuf for &'static [u8; N] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        N
    }
    fn bytes_total(&self) -> usize {
        N
    }
}

// SAFETY: 'static data never moves or dies.
unsafe impl IoBuf for &'static str {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

struct PoolInner {
    /// Free buffers by index; `None` while checked out.
    slots: RefCell<Vec<Option<Vec<u8>>>>,
    size: usize,
    /// The io_uring driver the buffers are registered with (its id), if any.
    registered: Option<u64>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if let Some(id) = self.registered {
            super::uring::unregister_buffers(id);
        }
    }
}

/// A set of equal-sized buffers registered with the current loop's io_uring
/// (`io_uring_register_buffers`), so file reads and writes through them skip the
/// per-operation page pinning (`READ_FIXED`, `WRITE_FIXED`). On a socket, and on the epoll
/// driver, they are plain buffers (`RECV`, and `SEND` so a gone peer cannot raise `SIGPIPE`;
/// `io/ops/rw.rs` says why).
///
/// One pool per loop (io_uring allows one registered set per ring); `!Send`, like the loop's
/// other I/O objects. Cost: `count × size` bytes allocated once (`count + 2` allocations: the
/// buffers, their list, the shared pool); on io_uring one `io_uring_register` system call
/// pins them, and another unregisters them when the pool (and every buffer taken from it) is
/// dropped, or the loop's driver closing does (a pool kept past its loop's run is plain
/// buffers from then on: register a new one on the next run's loop); on epoll nothing is
/// pinned.
/// Cloning it is a reference-count increment: the clones share one set of buffers.
#[derive(Clone)]
pub struct FixedBufPool {
    inner: Rc<PoolInner>,
}

impl fmt::Debug for FixedBufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedBufPool")
            .field("size", &self.inner.size)
            .field("registered", &self.is_registered())
            .finish()
    }
}

impl FixedBufPool {
    /// Allocates `count` buffers of `size` bytes and registers them with this loop's driver
    /// (io_uring on Linux 5.13 or later: before that a registration, and its undoing, waited
    /// for every request in flight on the ring, an idle socket's receive among them, which
    /// could block the loop for good; the buffers are plain ones there, as on epoll).
    /// `Err` off any loop, for `count` of 0 or above 16,384 or `size` of 0 or above 1 GiB,
    /// for a total (`count × size`) above the machine's physical memory (`InvalidInput`: the
    /// kernel pins every page of a registered buffer, so such a pool can never be backed),
    /// for memory the allocator refuses (`OutOfMemory`, not an abort), for pinned memory over
    /// `RLIMIT_MEMLOCK` (io_uring, without `CAP_IPC_LOCK`; the kernel counts every page a
    /// buffer touches, whole, so a buffer smaller than a page counts as one, and the error says
    /// how many pages these took), or when this loop already has a registered pool (io_uring,
    /// `AlreadyExists`: drop it first). The buffers are allocated before the driver is looked
    /// at, and freed again on any of these errors. Cost, besides the allocations and the
    /// registration above: two `sysconf` calls (the memory check).
    pub fn register(count: usize, size: usize) -> io::Result<FixedBufPool> {
        if count == 0 || count > 16_384 || size == 0 || size > 1 << 30 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("FixedBufPool::register({count}, {size}): need 1..=16384 buffers of 1 byte..=1 GiB"),
            ));
        }
        // At most 16384 × 1 GiB (2^44): no overflow on a 64-bit target.
        let total = count.saturating_mul(size);
        if let Some(ram) = physical_memory().filter(|&ram| total > ram) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "FixedBufPool::register({count}, {size}): {total} bytes in all, more than \
                     this machine's {ram} bytes of memory (registered buffers are pinned)"
                ),
            ));
        }
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        bufs.try_reserve_exact(count)
            .map_err(|_| out_of_memory(count, size))?;
        for _ in 0..count {
            // Fallible, and empty (as the pool hands them out): the bytes past a buffer's
            // length are only ever written (by the kernel or `put_slice`) before they are read.
            let mut b = Vec::new();
            b.try_reserve_exact(size)
                .map_err(|_| out_of_memory(count, size))?;
            bufs.push(b);
        }
        let registered = super::with_reactor(|r| match r {
            // Before Linux 5.13 a registration (and its undoing) waits until every request
            // in flight completes: plain buffers there.
            super::Reactor::Uring(u) if u.registers_buffers() => {
                u.register_buffers(&bufs, size).map(Some)
            }
            _ => Ok(None),
        })?;
        let slots = bufs.into_iter().map(Some).collect();
        Ok(FixedBufPool {
            inner: Rc::new(PoolInner {
                slots: RefCell::new(slots),
                size,
                registered,
            }),
        })
    }

    /// A free buffer (empty, capacity `size`), or `None` if all are in use. Cost: a scan of
    /// the free list (up to `count` slots) and a reference count.
    pub fn take(&self) -> Option<FixedBuf> {
        let mut slots = self.inner.slots.borrow_mut();
        let (index, slot) = slots.iter_mut().enumerate().find(|(_, s)| s.is_some())?;
        let buf = slot.take()?;
        Some(FixedBuf {
            buf: Some(buf),
            index: index as u16,
            pool: self.inner.clone(),
        })
    }

    /// The size of each buffer. Cost: a field read.
    pub fn buf_size(&self) -> usize {
        self.inner.size
    }

    /// Whether the buffers are registered with io_uring: false on epoll and on kernels before
    /// 5.13 (see [`register`](Self::register)), and false once the
    /// driver that registered them has closed (a pool kept past the
    /// [`LocalExecutor::block_on`](crate::LocalExecutor::block_on) or `run` that made it: its
    /// registration went with that driver, and its buffers are plain ones from then on). Cost:
    /// a field read and, for a registered pool, a thread-local read (a short list walk off
    /// the loop that registered it).
    pub fn is_registered(&self) -> bool {
        self.inner
            .registered
            .is_some_and(|id| !super::uring::driver_gone(id))
    }
}

/// The `OutOfMemory` error of a pool whose buffers the allocator refused.
fn out_of_memory(count: usize, size: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("FixedBufPool::register({count}, {size}): cannot allocate the buffers"),
    )
}

/// The machine's physical memory in bytes, if the OS says. Cost: two `sysconf` calls.
fn physical_memory() -> Option<usize> {
    // SAFETY: `sysconf` takes no pointers and has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (pages, page) = (usize::try_from(pages).ok()?, usize::try_from(page).ok()?);
    (pages > 0 && page > 0).then(|| pages.saturating_mul(page))
}

/// A buffer of a [`FixedBufPool`]; goes back to the pool, emptied, when dropped (no
/// allocation, no system call; unless it held the pool's last reference, the pool itself
/// dropped before it: then the pool's buffers are unregistered, one `io_uring_register`).
/// Derefs to its initialized bytes.
pub struct FixedBuf {
    buf: Option<Vec<u8>>,
    index: u16,
    pool: Rc<PoolInner>,
}

impl fmt::Debug for FixedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedBuf")
            .field("index", &self.index)
            .field("len", &self.len())
            .finish()
    }
}

impl FixedBuf {
    fn vec(&self) -> &Vec<u8> {
        self.buf
            .as_ref()
            .expect("FixedBuf holds its buffer until dropped")
    }

    fn vec_mut(&mut self) -> &mut Vec<u8> {
        self.buf
            .as_mut()
            .expect("FixedBuf holds its buffer until dropped")
    }

    /// The buffer's size (the pool's [`buf_size`](FixedBufPool::buf_size)). Cost: a field
    /// read.
    pub fn capacity(&self) -> usize {
        self.pool.size
    }

    /// Forgets the data (length 0); the memory stays. Cost: a store.
    pub fn clear(&mut self) {
        self.vec_mut().clear();
    }

    /// Appends as much of `data` as fits; returns how many bytes were copied. Never grows
    /// the buffer (no allocation): a copy of the bytes that fit.
    pub fn put_slice(&mut self, data: &[u8]) -> usize {
        let cap = self.pool.size;
        let v = self.vec_mut();
        let n = data.len().min(cap - v.len());
        v.extend_from_slice(&data[..n]);
        n
    }
}

impl Deref for FixedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.vec()
    }
}

impl DerefMut for FixedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.vec_mut()
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        if let Some(mut b) = self.buf.take() {
            // Empty for the next `take`: one connection's bytes must not show up in, or be
            // sent ahead of, another's (the capacity, and the registration, stay).
            b.clear();
            if let Some(slot) = self.pool.slots.borrow_mut().get_mut(self.index as usize) {
                *slot = Some(b);
            }
        }
    }
}

// SAFETY: the Vec's heap block (registered with the kernel) never moves or reallocates: its
// capacity is the pool's size and `put_slice` never grows past it.
unsafe impl IoBuf for FixedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.vec().as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.vec().len()
    }
    fn bytes_total(&self) -> usize {
        self.pool.size
    }
    fn fixed_index(&self) -> Option<(u64, u16)> {
        self.pool.registered.map(|id| (id, self.index))
    }
}

// SAFETY: as for IoBuf; the block has `size` writable bytes.
unsafe impl IoBufMut for FixedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.vec_mut().as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller guarantees `n <= size == capacity` and that `n` bytes are
        // initialized.
        unsafe { self.vec_mut().set_len(n) }
    }
}

/// The buffers as xtc's operations use them, in plain memory (a "kernel" that is a copy), so
/// that Miri checks the pointers the contract hands out (`scripts/miri lib`).
#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `count` unregistered buffers of `size` bytes (the epoll driver's kind).
    fn pool(count: usize, size: usize) -> FixedBufPool {
        let slots = (0..count).map(|_| Some(Vec::with_capacity(size))).collect();
        FixedBufPool {
            inner: Rc::new(PoolInner {
                slots: RefCell::new(slots),
                size,
                registered: None,
            }),
        }
    }

    /// What a read does with its buffer: takes the pointer, takes it again (the contract
    /// allows a second call while the kernel writes through the first), writes through the
    /// first, and records the count.
    fn fake_read<B: IoBufMut>(b: &mut B, data: &[u8]) -> usize {
        let n = data.len().min(b.bytes_total());
        let p = b.stable_mut_ptr();
        let _again = b.stable_mut_ptr();
        // SAFETY: `p` points at `bytes_total() >= n` writable bytes (the trait's contract),
        // which nothing else touches; the `n` bytes are initialized by the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, n);
            b.set_init(n);
        }
        n
    }

    #[test]
    fn std_buffers_take_a_read_through_their_first_pointer() {
        let mut v: Vec<u8> = Vec::with_capacity(4);
        assert_eq!(fake_read(&mut v, b"abcdef"), 4);
        assert_eq!(v, b"abcd");
        // A boxed slice's second pointer used to be made through a `&mut [u8]`, which
        // invalidated the first (Miri, Stacked Borrows).
        let mut bx: Box<[u8]> = vec![0u8; 3].into_boxed_slice();
        assert_eq!(fake_read(&mut bx, b"xy"), 2);
        assert_eq!(&bx[..], b"xy\0");
        let mut empty: Vec<u8> = Vec::new();
        assert_eq!(fake_read(&mut empty, b"z"), 0);
        let st: &'static str = "hé";
        // SAFETY: a `'static str`'s pointer and initialized length (the trait's contract).
        let bytes = unsafe { std::slice::from_raw_parts(st.stable_ptr(), st.bytes_init()) };
        assert_eq!(bytes, "hé".as_bytes());
    }

    #[test]
    fn a_fixed_buf_fills_to_its_size_and_comes_back_empty() {
        let p = pool(2, 8);
        let mut a = p.take().unwrap();
        let mut b = p.take().unwrap();
        assert!(p.take().is_none());
        assert_eq!(a.put_slice(b"0123456789"), 8);
        assert_eq!(&a[..], b"01234567");
        assert_eq!(a.put_slice(b"x"), 0);
        assert_eq!(fake_read(&mut b, b"hello world"), 8);
        assert_eq!(&b[..], b"hello wo");
        assert_eq!((b.bytes_init(), b.bytes_total()), (8, 8));
        b.clear();
        assert!(b.is_empty());
        drop(a);
        let again = p.take().unwrap();
        assert!(again.is_empty(), "a buffer comes back emptied");
        // The pool gone, its buffers still work and drop cleanly.
        drop(p);
        assert_eq!(fake_read(&mut b, b"abc"), 3);
        assert_eq!(&b[..], b"abc");
    }
}
