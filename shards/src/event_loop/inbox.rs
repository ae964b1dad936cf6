//! The MPSC inbox of a loop: how threads other than the loop's own hand it work (spawns from
//! outside, wakes of its pinned tasks fired elsewhere).
//!
//! A mutex-protected `Vec` swapped out whole by the consumer: one lock per loop turn that finds
//! work, no allocation in steady state (the loop hands back its drained, empty vector), and a
//! `pending` flag so an empty inbox costs the loop one atomic load and no lock. Cross-shard traffic
//! between workers goes through the SPSC ring mesh; the inbox carries the rarer foreign traffic,
//! where a lock-free queue would buy little.

use crate::sync::{lock, AtomicBool, AtomicU64, Mutex, Ordering::SeqCst};

/// Multi-producer, single-consumer queue with the counters quiescence detection needs.
#[derive(Debug)]
pub(crate) struct Inbox<T> {
    queue: Mutex<Vec<T>>,
    /// Set by a read-modify-write after every push, cleared under the lock by the consumer.
    /// Rules 1 and 2 of `park.rs` touch it only by read-modify-write.
    pending: AtomicBool,
    /// Messages ever pushed. Incremented before the push, so an in-flight message is counted.
    pushed: AtomicU64,
    /// Messages ever taken by the consumer (written only by it).
    popped: AtomicU64,
}

impl<T> Inbox<T> {
    pub(crate) fn new() -> Self {
        Inbox {
            queue: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            pushed: AtomicU64::new(0),
            popped: AtomicU64::new(0),
        }
    }

    /// Appends `value`. Callable from any thread.
    pub(crate) fn push(&self, value: T) {
        self.pushed.fetch_add(1, SeqCst);
        let mut q = lock(&self.queue);
        q.push(value);
        // Rule 2 of park.rs: an RMW, so the loop's RMW recheck is ordered against it.
        self.pending.swap(true, SeqCst);
    }

    /// Whether a push has happened since the last drain: a plain load, for the busy path.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(SeqCst)
    }

    /// The same question as a read-modify-write, for the recheck of rule 1 of `park.rs`.
    pub(crate) fn recheck(&self) -> bool {
        self.pending.fetch_or(false, SeqCst)
    }

    /// Moves everything queued into `out` (which must be empty) and returns how many. The
    /// owning loop calls this, and, once the executor is closed, whatever thread sweeps it
    /// (`ExecShared::drop_if_closed`, from any thread that spawns after the close): several
    /// at once then.
    pub(crate) fn drain_into(&self, out: &mut Vec<T>) -> usize {
        debug_assert!(out.is_empty());
        if !self.pending.load(SeqCst) {
            return 0;
        }
        let mut q = lock(&self.queue);
        std::mem::swap(&mut *q, out);
        self.pending.store(false, SeqCst);
        let n = out.len() as u64;
        // Under the lock, so two sweeping threads cannot lose each other's count: a plain
        // load + store, published SeqCst for the quiescence check.
        self.popped.store(self.popped.load(SeqCst) + n, SeqCst);
        drop(q);
        n as usize
    }

    /// Takes out the first queued message that `pred` picks, counted as taken by the consumer
    /// (it was pushed, and will not be drained). For a stopping loop whose drop waits on a task
    /// kept here for this loop's next run (`ring::wait_in_shutdown`), with this loop stopped:
    /// several threads may call it, as they may sweep. Cost: a lock and a scan.
    pub(crate) fn take_where(&self, pred: impl Fn(&T) -> bool) -> Option<T> {
        let mut q = lock(&self.queue);
        let i = q.iter().position(pred)?;
        let taken = q.remove(i);
        self.popped.store(self.popped.load(SeqCst) + 1, SeqCst);
        Some(taken)
    }

    /// Messages ever pushed, counting pushes still in flight (a stopping loop's bound on what
    /// it drains, `event_loop::shutdown`).
    pub(crate) fn pushed(&self) -> u64 {
        self.pushed.load(SeqCst)
    }

    /// Whether the consumer has taken at least `n` messages in all.
    pub(crate) fn popped_at_least(&self, n: u64) -> bool {
        self.popped.load(SeqCst) >= n
    }

    /// (pushed, popped), for the quiescence double collect.
    pub(crate) fn counts(&self) -> (u64, u64) {
        // popped first: a message popped after this read was pushed before the pushed read, so
        // the pair can show pushed > popped (not quiescent) but never a false balance.
        let popped = self.popped.load(SeqCst);
        let pushed = self.pushed.load(SeqCst);
        (pushed, popped)
    }
}
