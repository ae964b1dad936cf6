//! A small blocking thread pool for file operations on the epoll driver (epoll cannot wait on
//! regular files), as tokio does. Threads start on demand, up to [`MAX_THREADS`], and exit after
//! [`IDLE_EXIT`] without work. A job's result comes back through a one-shot slot whose waker
//! the job fires (from the pool thread, so the wake goes through the loop's inbox).

use std::{
    cell::Cell,
    collections::VecDeque,
    future::Future,
    io,
    marker::PhantomData,
    pin::Pin,
    sync::{Arc, Condvar, Mutex, OnceLock},
    task::{Context, Poll, Waker},
    time::Duration,
};

/// Most pool threads at once. Files on epoll are the fallback path; 8 covers a few loops.
const MAX_THREADS: usize = 8;
/// An idle pool thread exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Pool {
    state: Mutex<PoolState>,
    cv: Condvar,
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

thread_local! {
    /// Jobs started from this thread's loop and not yet collected (quiescence: a loop waiting on
    /// one is not idle for good).
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// Jobs of this thread's loop in the pool.
pub(crate) fn in_flight() -> usize {
    IN_FLIGHT.with(|c| c.get())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn worker() {
    let pool = pool();
    let mut st = lock(&pool.state);
    loop {
        if let Some(job) = st.jobs.pop_front() {
            drop(st);
            job();
            st = lock(&pool.state);
            continue;
        }
        st.idle += 1;
        let (g, timeout) = pool
            .cv
            .wait_timeout(st, IDLE_EXIT)
            .unwrap_or_else(|p| p.into_inner());
        st = g;
        st.idle -= 1;
        if timeout.timed_out() && st.jobs.is_empty() {
            st.threads -= 1;
            return;
        }
    }
}

struct Slot<R> {
    result: Option<R>,
    waker: Option<Waker>,
}

/// The future of a pool job; `!Send` (it counts in its loop's in-flight jobs).
pub(crate) struct Blocking<R> {
    slot: Arc<Mutex<Slot<io::Result<R>>>>,
    counted: bool,
    _local: PhantomData<*const ()>,
}

/// Runs `f` on the pool. A panic in `f` comes back as an error.
pub(crate) fn run<R: Send + 'static>(
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> Blocking<R> {
    let slot = Arc::new(Mutex::new(Slot {
        result: None,
        waker: None,
    }));
    let theirs = slot.clone();
    let job: Job = Box::new(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|_| Err(io::Error::other("xtc: a blocking file operation panicked")));
        let waker = {
            let mut s = lock(&theirs);
            s.result = Some(r);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    });
    let pool = pool();
    let spawn = {
        let mut st = lock(&pool.state);
        st.jobs.push_back(job);
        let spawn = st.idle == 0 && st.threads < MAX_THREADS;
        if spawn {
            st.threads += 1;
        }
        spawn
    };
    if spawn {
        let ok = std::thread::Builder::new()
            .name("xtc-blocking".into())
            .spawn(worker)
            .is_ok();
        if !ok {
            lock(&pool.state).threads -= 1;
            tracing::warn!(
                "xtc: could not start a blocking-pool thread; jobs wait for a running one"
            );
        }
    } else {
        pool.cv.notify_one();
    }
    IN_FLIGHT.with(|c| c.set(c.get() + 1));
    Blocking {
        slot,
        counted: true,
        _local: PhantomData,
    }
}

impl<R> Blocking<R> {
    fn uncount(&mut self) {
        if std::mem::take(&mut self.counted) {
            IN_FLIGHT.with(|c| c.set(c.get() - 1));
        }
    }
}

impl<R> Future for Blocking<R> {
    type Output = io::Result<R>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let r = {
            let mut s = lock(&self.slot);
            match s.result.take() {
                Some(r) => Some(r),
                None => {
                    s.waker = Some(cx.waker().clone());
                    None
                }
            }
        };
        match r {
            Some(r) => {
                self.uncount();
                Poll::Ready(r)
            }
            None => Poll::Pending,
        }
    }
}

impl<R> Drop for Blocking<R> {
    fn drop(&mut self) {
        self.uncount();
    }
}
