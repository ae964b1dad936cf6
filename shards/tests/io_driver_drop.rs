//! User code that an io_uring driver's drop runs (it reaps completions: a cancelled read's
//! buffer is dropped then) may drop another operation of that driver: that operation's data
//! must still live until the kernel is done with it.

use std::{
    cell::Cell,
    future::{poll_fn, Future},
    io::Write,
    os::fd::AsRawFd,
    pin::Pin,
    rc::Rc,
    task::Poll,
};

use xtc_shards::{
    io::{Driver, IoBuf, IoBufMut},
    net::UnixStream,
};

/// Size of the file read: long enough that the read is still running at the shutdown.
const N: usize = 64 << 20;

/// Memory lent out of a region that outlives the test (a pool's block): its drop gives the
/// block back, whose owner reuses it at once (zeroes it). What the kernel writes into it
/// afterwards is seen, rather than a crash.
struct Lent {
    base: usize,
    released: Rc<Cell<bool>>,
}

// SAFETY: the block is leaked, so always mapped, and lent to this value alone: stable.
unsafe impl IoBuf for Lent {
    fn stable_ptr(&self) -> *const u8 {
        self.base as *const u8
    }
    fn bytes_init(&self) -> usize {
        0
    }
    fn bytes_total(&self) -> usize {
        N
    }
}

// SAFETY: as above; the block is writable.
unsafe impl IoBufMut for Lent {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.base as *mut u8
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.released.set(true);
        // SAFETY: the block is leaked (always mapped) and ours again.
        unsafe { std::ptr::write_bytes(self.base as *mut u8, 0, N) };
    }
}

/// A read buffer that owns something else (here a future with a read in flight): dropping the
/// buffer drops it.
struct Holder {
    v: Vec<u8>,
    _keep: Pin<Box<dyn Future<Output = ()>>>,
}

// SAFETY: the views are the Vec's: stable while it is neither resized nor moved out.
unsafe impl IoBuf for Holder {
    fn stable_ptr(&self) -> *const u8 {
        self.v.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.v.len()
    }
    fn bytes_total(&self) -> usize {
        self.v.capacity()
    }
}

// SAFETY: as above; `set_init` is called with at most `bytes_total()` initialized bytes.
unsafe impl IoBufMut for Holder {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.v.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller's contract.
        unsafe { self.v.set_len(n) }
    }
}

/// Polls `fut` once; it must be pending.
async fn poll_pending<F: Future + ?Sized>(mut fut: Pin<&mut F>) {
    let pending = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
    assert!(pending, "it had something to complete with already");
}

/// A file read (its pages evicted, so it waits for the disk, which no cancel stops) kept in a
/// future that a stream read's buffer owns; that read is dropped beside another (cancelled,
/// its buffer kept until its completion) as `block_on` returns. The driver's drop reaps that
/// completion and drops the buffer, and so the file read's future. The driver, in its drop,
/// was out of its `Op`s' reach and had not recorded them yet: the file read's buffer was
/// freed while the kernel still copied the file into it.
#[test]
fn a_read_dropped_by_user_code_in_the_drivers_drop_keeps_its_buffer_until_it_completes() {
    let region: &'static mut [u8] = Box::leak(vec![0u8; N].into_boxed_slice());
    let base = region.as_mut_ptr() as usize;
    let path = std::env::temp_dir().join(format!("xtc-driver-drop-{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![0xABu8; N]).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on an open descriptor; no pointers.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }
    let released = Rc::new(Cell::new(false));
    let lent = Lent {
        base,
        released: released.clone(),
    };
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let p = path.clone();
    let ran = ex.block_on(async move {
        if xtc_shards::io::current_driver() != Some(Driver::IoUring) {
            return false; // epoll reads files on its blocking pool: no `Op` to drop
        }
        let file = xtc_shards::fs::File::open(&p).await.unwrap();
        let mut read_file: Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
            let _ = file.read_at(lent, 0).await;
        });
        poll_pending(read_file.as_mut()).await;
        let (c, _d) = UnixStream::pair().unwrap();
        let mut r1 = Box::pin(c.read(Vec::with_capacity(16)));
        let mut r2 = Box::pin(c.read(Holder {
            v: Vec::with_capacity(16),
            _keep: read_file,
        }));
        poll_pending(r1.as_mut()).await;
        poll_pending(r2.as_mut()).await;
        xtc_shards::yield_now().await; // all submitted
        drop(r2); // beside r1: cancelled; its buffer goes when the cancel's completion is reaped
        true
    });
    drop(ex);
    let _ = std::fs::remove_file(&path);
    if !ran {
        return;
    }
    assert!(
        released.get(),
        "the file read's buffer was never given back"
    );
    assert!(
        !region.contains(&0xAB),
        "the kernel wrote into the file read's buffer after it was given back"
    );
}
