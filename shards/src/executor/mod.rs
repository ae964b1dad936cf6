//! The executor: its loops, the threads that run them, and the handle that reaches them.

mod builder;
pub(crate) use builder::resolve_io;
pub(crate) mod quiesce;

use std::{
    cell::Cell,
    future::Future,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

pub use builder::{
    Builder, DEFAULT_DEADLOCK_GRACE, DEFAULT_REPLY_SPIN, DEFAULT_SPIN_BEFORE_PARK,
    MAX_SPIN_BEFORE_PARK,
};

/// The resolved settings an `ExecShared` starts from (the public `Builder` stays separate).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) service_mode: bool,
    pub(crate) deadlock_grace: Option<Duration>,
    pub(crate) ring_capacity: usize,
    pub(crate) spin_before_park: Duration,
    pub(crate) reply_spin: Duration,
    pub(crate) victims: [Vec<Vec<usize>>; 3],
    pub(crate) stealing: bool,
    pub(crate) eager_rebalance: bool,
    pub(crate) steal_backoff: bool,
    pub(crate) numa_sensitivity: u8,
    pub(crate) min_tasks_to_steal: usize,
    pub(crate) preempt: Duration,
    /// The real-time signal of the loops' CPU-time timers.
    pub(crate) preempt_signal: libc::c_int,
    pub(crate) stall_budget: Duration,
    pub(crate) io_driver: crate::io::Driver,
    /// A [`LocalExecutor`](crate::LocalExecutor)'s: stop requests do nothing
    /// (`ExecShared::request_stop`).
    pub(crate) local: bool,
    /// Where each shard runs (`None` for a `LocalExecutor`, which places nothing).
    pub(crate) placement: Option<Placement>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            service_mode: false,
            deadlock_grace: None,
            ring_capacity: crate::ring::DEFAULT_RING_CAPACITY,
            spin_before_park: Duration::ZERO,
            reply_spin: Duration::ZERO,
            victims: Default::default(),
            stealing: true,
            eager_rebalance: false,
            steal_backoff: false,
            io_driver: crate::io::Driver::Epoll,
            numa_sensitivity: xtc_numa::DEFAULT_NUMA_SENSITIVITY,
            min_tasks_to_steal: 0,
            preempt: Duration::ZERO,
            preempt_signal: crate::sys::cputimer::default_signal(),
            stall_budget: Duration::ZERO,
            local: false,
            placement: None,
        }
    }
}
use xtc_numa::{Placement, Topology, VictimOrder};

use crate::{
    context::{self, Core},
    event_loop::{self, LoopShared},
    ring::Mesh,
    steal::Migratable,
    sync::{fence, lock, AtomicBool, AtomicU32, AtomicU64, Condvar, Mutex, Ordering::*},
    task::{self, JoinHandle, TaskInfo},
    Error, LoopStats, Result,
};

/// Why the executor stopped (first reason wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum StopReason {
    None = 0,
    Requested = 1,
    Quiescent = 2,
    Deadlock = 3,
    MainDone = 4,
}

const GRACE_OFF: u64 = u64::MAX;

/// State shared by the loops, the coordinator and every [`Handle`].
#[derive(Debug)]
pub(crate) struct ExecShared {
    pub(crate) loops: Vec<Arc<LoopShared>>,
    pub(crate) mesh: Mesh,
    spin_before_park_ns: AtomicU64,
    reply_spin_ns: AtomicU64,
    pub(crate) stop: AtomicBool,
    stop_reason: AtomicU32,
    service_mode: AtomicBool,
    deadlock_grace_ns: AtomicU64,
    /// The grace the coordinator applied when it decided on a deadlock (`Error::Deadlock`'s
    /// `grace`): the knob may change after the decision, in the shutdown's drops.
    pub(crate) deadlock_grace_applied: AtomicU64,
    running: AtomicBool,
    /// Counts the runs claimed (`claim_run`): `block_on`'s main task stops only the run it
    /// was queued for, not a later one that finds it still queued after a failed start.
    runs: AtomicU64,
    /// Tests only: the shard whose worker reports a pin failure (`usize::MAX`: none), so the
    /// failed-start paths can be exercised on any machine.
    #[cfg(test)]
    pub(crate) fail_pin: std::sync::atomic::AtomicUsize,
    /// Tests only: the shard whose worker panics before it reports its pinning (`usize::MAX`:
    /// none), as a panic in the pinning (or in a tracing subscriber handling its event) would.
    #[cfg(test)]
    pub(crate) panic_pin: std::sync::atomic::AtomicUsize,
    /// Tests only: the shard whose shutdown panics as it begins (`usize::MAX`: none), as a bug
    /// in it would, leaving that loop's parked tasks alive.
    #[cfg(test)]
    pub(crate) panic_shutdown: std::sync::atomic::AtomicUsize,
    /// Tests only: run by the coordinator between finding quiescence and closing, to widen
    /// the window in which a foreign spawn races the decision.
    #[cfg(test)]
    pub(crate) before_closing: Mutex<Option<TestHook>>,
    /// Tests only: run by the coordinator once a deadlock suspect outlasted the grace period,
    /// before it closes, to widen the window in which a foreign wake races the report.
    #[cfg(test)]
    pub(crate) before_deadlock_close: Mutex<Option<TestHook>>,
    /// Tests only: run by each shard thread after its loop's shutdown, before it gives its
    /// ring ends back, to widen the window in which a peer finds the loop still holding them.
    #[cfg(test)]
    pub(crate) after_shutdown: Mutex<Option<Arc<TestHook>>>,
    /// Set by the coordinator while it confirms a quiescent stop (`quiesce.rs`, closing): a
    /// loop leaving idle meanwhile waits for the decision before it takes any work.
    pub(crate) closing: quiesce::Closing,
    /// Set when the `Executor` is dropped: no run can come, so what a `Handle` queues after
    /// that is refused or dropped at once (`Handle::spawn_on`, `Handle::spawn`).
    closed: AtomicBool,
    pub(crate) coord_dirty: Mutex<bool>,
    pub(crate) coord_cv: Condvar,
    pub(crate) deadlock_tasks: Mutex<Vec<String>>,
    pub(crate) migratable: Migratable,
    /// Victim orders for NUMA sensitivity 0, 1 and 2 (xtc-numa), indexed `[level][shard]`.
    victims: [Vec<Vec<usize>>; 3],
    stealing: AtomicBool,
    eager_rebalance: AtomicBool,
    steal_backoff: AtomicBool,
    numa_sensitivity: AtomicU32,
    min_tasks_to_steal: AtomicU64,
    preempt_ns: AtomicU64,
    /// The real-time signal the loops' CPU-time timers deliver (`Builder::preempt_signal`).
    preempt_signal: libc::c_int,
    /// The driver every loop of this executor creates (a loop whose io_uring setup fails falls
    /// back to epoll on its own, logged, and says so in its `LoopStats`).
    pub(crate) io_driver: crate::io::Driver,
    /// A [`LocalExecutor`](crate::LocalExecutor)'s: its loop runs only inside `block_on`,
    /// until the future ends, so a stop request does nothing (`request_stop`).
    local: bool,
    /// Where each shard runs, for [`Handle::placement`] and `shard::cpu` / `numa_node` (a copy
    /// of the `Executor`'s; `None` for a `LocalExecutor`).
    pub(crate) placement: Option<Placement>,
}

impl ExecShared {
    pub(crate) fn new(n: usize, config: &Config) -> Result<Self> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = Instant::now();
        let (migratable, steal_shared) = Migratable::new(n);
        let loops = steal_shared
            .into_iter()
            .enumerate()
            .map(|(i, steal)| {
                LoopShared::new(i, id, base, steal)
                    .map(Arc::new)
                    .map_err(|source| Error::Io {
                        what: "creating a loop's wake eventfd",
                        source,
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        for l in &loops {
            l.stall
                .budget_ns
                .store(duration_ns(config.stall_budget), SeqCst);
        }
        Ok(ExecShared {
            loops,
            mesh: Mesh::new(n, config.ring_capacity),
            spin_before_park_ns: AtomicU64::new(duration_ns(config.spin_before_park)),
            reply_spin_ns: AtomicU64::new(duration_ns(config.reply_spin)),
            stop: AtomicBool::new(false),
            stop_reason: AtomicU32::new(StopReason::None as u32),
            service_mode: AtomicBool::new(config.service_mode),
            deadlock_grace_ns: AtomicU64::new(grace_to_ns(config.deadlock_grace)),
            deadlock_grace_applied: AtomicU64::new(0),
            running: AtomicBool::new(false),
            runs: AtomicU64::new(0),
            #[cfg(test)]
            fail_pin: std::sync::atomic::AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            panic_pin: std::sync::atomic::AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            panic_shutdown: std::sync::atomic::AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            before_closing: Mutex::new(None),
            #[cfg(test)]
            before_deadlock_close: Mutex::new(None),
            #[cfg(test)]
            after_shutdown: Mutex::new(None),
            closing: quiesce::Closing::default(),
            closed: AtomicBool::new(false),
            coord_dirty: Mutex::new(false),
            coord_cv: Condvar::new(),
            deadlock_tasks: Mutex::new(Vec::new()),
            migratable,
            victims: config.victims.clone(),
            stealing: AtomicBool::new(config.stealing),
            eager_rebalance: AtomicBool::new(config.eager_rebalance),
            steal_backoff: AtomicBool::new(config.steal_backoff),
            numa_sensitivity: AtomicU32::new(config.numa_sensitivity as u32),
            min_tasks_to_steal: AtomicU64::new(config.min_tasks_to_steal as u64),
            preempt_ns: AtomicU64::new(duration_ns(config.preempt)),
            preempt_signal: config.preempt_signal,
            io_driver: config.io_driver,
            local: config.local,
            placement: config.placement.clone(),
        })
    }

    /// [`ExecShared::new`] in its `Arc`, known to its loops (`LoopShared::exec`).
    pub(crate) fn new_arc(n: usize, config: &Config) -> Result<Arc<Self>> {
        let shared = Arc::new(Self::new(n, config)?);
        for l in &shared.loops {
            l.set_exec(Arc::downgrade(&shared));
        }
        Ok(shared)
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Relaxed)
    }

    /// Sets the stop flag (kept until the run it stops ends, `RunClaim`). Nothing for a
    /// [`LocalExecutor`](crate::LocalExecutor): no run of its consumes the flag (its loop
    /// ignores it, and `block_on` ends only with its future), so a stop asked inside one stayed
    /// set for good, and its loop looked stopping ever after (a sleep dropped off the loop
    /// sent no cancel, `timer/sleep.rs`).
    pub(crate) fn request_stop(&self, reason: StopReason) {
        if self.local {
            return;
        }
        let _ = self.stop_reason.compare_exchange(
            StopReason::None as u32,
            reason as u32,
            SeqCst,
            SeqCst,
        );
        self.stop.store(true, SeqCst);
        for l in &self.loops {
            l.parker.force_unpark();
        }
        self.poke();
    }

    pub(crate) fn stop_reason(&self) -> u32 {
        self.stop_reason.load(SeqCst)
    }

    /// The reason of a stop this thread has seen through [`stop_requested`](Self::stop_requested)
    /// (a `Relaxed` load, which orders nothing): an `Acquire` load of the flag first reads that
    /// stop's store or a later one, and so orders the reason `request_stop` wrote before it
    /// ahead of the read below. Without it a loop could see the flag and an older reason
    /// (`None` for `Quiescent`), and drop at a quiescent stop what it must keep
    /// (`loom_run.rs`).
    pub(crate) fn seen_stop_reason(&self) -> u32 {
        let _ = self.stop.load(Acquire);
        self.stop_reason.load(SeqCst)
    }

    /// The id of the run claimed last (`claim_run`; 0 before any): a loop stamps it when its
    /// shutdown begins (`LoopShared::shut_run`). Cost: a load.
    pub(crate) fn run_id(&self) -> u64 {
        self.runs.load(SeqCst)
    }

    /// Marks the executor running, or `Err(AlreadyRunning)`; the claim ends (ready for another
    /// run) when the returned guard drops (`loom_run.rs`).
    pub(crate) fn claim_run(&self) -> Result<RunClaim<'_>> {
        if self.running.swap(true, SeqCst) {
            return Err(Error::AlreadyRunning);
        }
        self.runs.fetch_add(1, SeqCst);
        Ok(RunClaim {
            shared: self,
            started: Cell::new(false),
        })
    }

    pub(crate) fn unpark_all(&self) {
        for l in &self.loops {
            l.parker.unpark();
        }
    }

    pub(crate) fn poke(&self) {
        *lock(&self.coord_dirty) = true;
        self.coord_cv.notify_one();
    }

    /// A loop published `EMPTY`: poke the coordinator if every other loop is `EMPTY` too and
    /// the executor is not in service mode (`quiesce.rs`, "Who pokes").
    ///
    /// Cost: one SeqCst load of each loop's status word (plus a lock and a condvar notify when
    /// it pokes, which wakes the coordinator thread).
    pub(crate) fn loop_went_empty(&self, me: usize) {
        // SeqCst, paired with `set_service_mode`'s store and poke: a loop that reads service
        // mode as still on published its EMPTY before the switch, so the check that the switch's
        // poke starts sees it.
        if self.service_mode.load(SeqCst) {
            return;
        }
        let others_empty = self.loops.iter().enumerate().all(|(i, l)| {
            i == me || event_loop::status::kind(l.status.load(SeqCst)) == event_loop::status::EMPTY
        });
        if others_empty {
            self.poke();
        }
    }

    pub(crate) fn service_mode(&self) -> bool {
        self.service_mode.load(Relaxed)
    }

    /// [`service_mode`](Self::service_mode) as the closing coordinator reads it: `SeqCst`,
    /// paired with the setter's store, so a switch whose setter returned before the look is
    /// seen.
    pub(crate) fn service_mode_now(&self) -> bool {
        self.service_mode.load(SeqCst)
    }

    pub(crate) fn spin_before_park(&self) -> Duration {
        Duration::from_nanos(self.spin_before_park_ns.load(Relaxed))
    }

    pub(crate) fn reply_spin(&self) -> Duration {
        Duration::from_nanos(self.reply_spin_ns.load(Relaxed))
    }

    /// The preemption interval in ns (0: off), as last set (`Handle::set_preempt`).
    pub(crate) fn preempt_ns(&self) -> u64 {
        self.preempt_ns.load(Relaxed)
    }

    /// The signal of the loops' CPU-time timers.
    pub(crate) fn preempt_signal(&self) -> libc::c_int {
        self.preempt_signal
    }

    /// Whether this is a [`LocalExecutor`](crate::LocalExecutor)'s (it arms no CPU timer).
    pub(crate) fn is_local(&self) -> bool {
        self.local
    }

    pub(crate) fn stealing(&self) -> bool {
        self.stealing.load(Relaxed)
    }

    /// [`stealing`](Self::stealing) as a spawn's ping for idle thieves reads it: `SeqCst`,
    /// after the count of live migratable tasks rose (also `SeqCst`), against `set_stealing`'s
    /// store and ping: a spawn that reads stealing as still off rose the count before the
    /// switch, so the loops the switch's ping wakes see that count.
    pub(crate) fn stealing_now(&self) -> bool {
        self.stealing.load(SeqCst)
    }

    /// Inline: `xtc::spawn` (`steal::spawn_here`, generic over the future, so built in the
    /// user's crate) reads it on every spawn.
    #[inline]
    pub(crate) fn eager_rebalance(&self) -> bool {
        self.eager_rebalance.load(Relaxed)
    }

    pub(crate) fn steal_backoff(&self) -> bool {
        self.steal_backoff.load(Relaxed)
    }

    pub(crate) fn min_tasks_to_steal(&self) -> usize {
        self.min_tasks_to_steal.load(Relaxed) as usize
    }

    /// Shard `me`'s victims, nearest first, at the current NUMA sensitivity.
    pub(crate) fn victims(&self, me: usize) -> &[usize] {
        let level = (self.numa_sensitivity.load(Relaxed) as usize).min(2);
        self.victims[level].get(me).map_or(&[], Vec::as_slice)
    }

    /// [`deadlock_grace`](Self::deadlock_grace) as the closing coordinator reads it (SeqCst,
    /// paired with the setter's store, as [`service_mode_now`](Self::service_mode_now)).
    pub(crate) fn deadlock_grace_now(&self) -> Option<Duration> {
        match self.deadlock_grace_ns.load(SeqCst) {
            GRACE_OFF => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    pub(crate) fn deadlock_grace(&self) -> Option<Duration> {
        match self.deadlock_grace_ns.load(Relaxed) {
            GRACE_OFF => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// `Err(ShardPanicked)` if a loop is poisoned ([`LoopShared::poisoned`]): its live tasks
    /// were left behind by a shutdown cut short, and run on a new thread, one whose future is
    /// `!Send` would be polled or dropped off its own. Cost: a load per loop.
    fn refuse_if_poisoned(&self) -> Result<()> {
        if self.loops.iter().any(|l| l.poisoned.load(SeqCst)) {
            return Err(Error::ShardPanicked(POISONED));
        }
        Ok(())
    }

    /// Whether the caller runs on a loop of this executor whose shutdown has begun. Cost: a
    /// thread-local read; on a loop, a pointer compare and a borrow.
    fn on_a_stopping_loop(&self) -> bool {
        crate::context::with_core(|c| std::ptr::eq(&*c.exec, self) && c.mesh.borrow().is_stopping())
            .unwrap_or(false)
    }

    pub(crate) fn shard(&self, shard: usize) -> Result<&Arc<LoopShared>> {
        // Built only on the error path: `ok_or` built (and dropped) the error on every call,
        // once per cross-shard call (callgrind: about 40 instructions per `submit_to`).
        self.loops.get(shard).ok_or_else(|| Error::InvalidShard {
            shard,
            count: self.loops.len(),
        })
    }

    /// [`spawn_on`](Self::spawn_on) from any thread, as `Handle::spawn_on` (and the cancel of a
    /// timer dropped away from its loop) do it: `Err(Stopped)` once the `Executor` is dropped,
    /// when no run can come to take the task.
    pub(crate) fn spawn_on_open<F, Fut>(
        &self,
        shard: usize,
        make: F,
        info: TaskInfo,
        class: u32,
    ) -> Result<JoinHandle<Fut::Output>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        if self.closed.load(SeqCst) || Discarding::active_for(self) {
            return Err(Error::Stopped);
        }
        if self
            .loops
            .get(shard)
            .is_some_and(|l| l.poisoned.load(SeqCst))
        {
            // No run can come to take the task, and a poisoned loop's inbox is leaked, not
            // dropped (`LoopShared::poisoned`: its other entries may be wakes of `!Send`
            // tasks): queued, its closure and what it holds (a `Handle` keeping the executor
            // alive, a channel end) were never freed and its `JoinHandle` never resolved. A
            // spawn racing the very panic that poisons the loop can still be queued, as any
            // racing that loop's end.
            return Err(Error::ShardPanicked(POISONED));
        }
        if shard < self.loops.len() && self.on_a_stopping_loop() {
            // A `Drop` that a loop's shutdown runs: refused, as `shard::submit_to` from there
            // is (`ring::reserve`): dropped unrun by the shutdown that finds it, and a `Drop`
            // waiting for it waited on that shutdown, which may wait on this one's.
            return Err(Error::Stopped);
        }
        let h = self.spawn_on_in(shard, make, info, class);
        self.drop_if_closed();
        h
    }

    pub(crate) fn spawn_on<F, Fut>(
        &self,
        shard: usize,
        make: F,
        info: TaskInfo,
    ) -> Result<JoinHandle<Fut::Output>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.spawn_on_in(shard, make, info, 0)
    }

    /// [`spawn_on`](Self::spawn_on) in scheduling class `class` of the target shard (0: the
    /// default lane).
    pub(crate) fn spawn_on_in<F, Fut>(
        &self,
        shard: usize,
        make: F,
        info: TaskInfo,
        class: u32,
    ) -> Result<JoinHandle<Fut::Output>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let home = task::Home::new(self.shard(shard)?);
        Ok(task::spawn_raw(home, make, info, class))
    }
}

/// [`Error::ShardPanicked`]'s message once a loop is poisoned (`LoopShared::poisoned`).
const POISONED: &str = "an earlier run's shard loop panicked while shutting down (a bug in \
    xtc), so this executor cannot run again: build a new one";

fn duration_ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

fn grace_to_ns(g: Option<Duration>) -> u64 {
    g.map_or(GRACE_OFF, |d| duration_ns(d).min(GRACE_OFF - 1))
}

/// A thread-per-core executor: one event loop per shard, each on its own pinned OS thread.
///
/// Build it with [`Executor::builder`] (or [`Executor::from_env`]), queue work with
/// [`spawn_on`](Handle::spawn_on), then [`run`](Self::run) it, or run one main future with
/// [`block_on`](Self::block_on).
///
/// ```
/// # use xtc_shards as xtc;
/// let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
/// for i in 0..2 {
///     exec.spawn_on(i, move || async move {
///         assert_eq!(xtc::shard::id(), i);
///     })?;
/// }
/// exec.run()?; // returns when both tasks are done
/// # Ok::<(), xtc::Error>(())
/// ```
#[derive(Debug)]
pub struct Executor {
    handle: Handle,
    placement: Placement,
    topology: Arc<Topology>,
    /// [`Builder::pin`]: each shard thread on its own CPU, or all on the placement's CPUs.
    pin: bool,
}

impl Executor {
    /// A [`Builder`] with the defaults. Cost: none (no allocation).
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// An executor configured by the `XTC_*` environment variables (see the crate docs):
    /// [`Builder::from_env`] then [`Builder::build`], with their errors (`Err(Env)` naming a
    /// variable with a bad value) and cost.
    pub fn from_env() -> Result<Executor> {
        Builder::from_env()?.build()
    }

    fn from_builder(b: Builder) -> Result<Executor> {
        let topology = match b.topology {
            Some(t) => t,
            None => Arc::new(Topology::detect()?),
        };
        if b.ring_capacity == 0 || b.ring_capacity > crate::ring::MAX_RING_CAPACITY {
            return Err(Error::InvalidArgument(format!(
                "ring_capacity {} is not between 1 and {} messages (default 1024)",
                b.ring_capacity,
                crate::ring::MAX_RING_CAPACITY
            )));
        }
        let preempt_signal = match b.preempt_signal {
            Some(sig) => crate::sys::check_rt_signal("preempt_signal", sig)?,
            None => crate::sys::cputimer::default_signal(),
        };
        // Checked here, fixed for the process only once nothing else can refuse the build.
        let interrupt_signal = crate::io::blocking::check_interrupt_signal(b.interrupt_signal)?;
        if preempt_signal == interrupt_signal {
            let name = crate::sys::signal_name(preempt_signal);
            return Err(Error::InvalidArgument(format!(
                "preempt_signal {name} is also the blocking pool's interrupt signal: give \
                 each its own (XTC_PREEMPT_SIGNAL / Builder::preempt_signal, \
                 XTC_INTERRUPT_SIGNAL / Builder::interrupt_signal)"
            )));
        }
        if b.spin_before_park > MAX_SPIN_BEFORE_PARK {
            return Err(Error::InvalidArgument(format!(
                "spin_before_park {:?} is longer than {:?} (MAX_SPIN_BEFORE_PARK): a spinning \
                 loop is busy, so run() would wait that long after its last task; use 0 to 1s",
                b.spin_before_park, MAX_SPIN_BEFORE_PARK
            )));
        }
        if b.reply_spin > MAX_SPIN_BEFORE_PARK {
            return Err(Error::InvalidArgument(format!(
                "reply_spin {:?} is longer than {:?} (MAX_SPIN_BEFORE_PARK): a spinning loop \
                 is busy, so run() would wait that long after its last task; use 0 to 1s",
                b.reply_spin, MAX_SPIN_BEFORE_PARK
            )));
        }
        // A CPU list is the count when none is set: then the policy's variable sizes things.
        let list = matches!(b.placement, xtc_numa::Policy::Cpus(_));
        let place = |shards| {
            Placement::new(&topology, shards, &b.placement, b.oversubscribe).map_err(|source| {
                match builder::env_inputs(&b.placement_env, |k| {
                    builder::refusal_depends_on(&source, list, k)
                }) {
                    Some(vars) => Error::EnvPlacement { vars, source },
                    None => Error::Numa(source),
                }
            })
        };
        let mut placement = place(b.shards)?;
        // The default count (one shard per allowed physical core) is capped by the cgroup's
        // CPU quota on this machine: more pinned shards than the quota's CPUs all run, and
        // all are throttled. A count asked for, or a CPU list, is left as it is.
        if b.shards == 0 && !list && !topology.is_synthetic() {
            if let Some(limit) = crate::sys::cgroup::cpu_limit(std::path::Path::new("/")) {
                if limit < placement.len() {
                    tracing::info!(
                        "xtc: {limit} shards, not {}: the cgroup's CPU quota allows {limit} CPUs \
                         (set XTC_SHARDS or Builder::shards to choose)",
                        placement.len()
                    );
                    placement = place(limit)?;
                }
            }
        }
        // The ring mesh is allocated up front: N·(N−1) rings of `ring_capacity` pointer slots,
        // each with its bookkeeping, and three N×N victim tables (crate::ring::mesh_bytes).
        let n = placement.len();
        let mesh_bytes = crate::ring::mesh_bytes(n, b.ring_capacity);
        if mesh_bytes > crate::ring::MAX_MESH_BYTES as u128 {
            // Each value may be valid alone: name the variables the sizes came from (the
            // policy only where it is a CPU list, whose length is the count).
            let from_env = builder::env_inputs(&b.placement_env, |k| list || k != "XTC_PLACEMENT")
                .map(|vars| format!(" (from the environment: {vars}; change or unset them)"))
                .unwrap_or_default();
            return Err(Error::InvalidArgument(format!(
                "{n} shards with ring_capacity {} need {} MiB of rings (N·(N−1) rings, 8 bytes a \
                 slot and {} per ring) and victim tables, over the {} MiB limit: lower \
                 ring_capacity or the shard count{from_env}",
                b.ring_capacity,
                mesh_bytes >> 20,
                crate::ring::PER_RING_BYTES,
                crate::ring::MAX_MESH_BYTES >> 20
            )));
        }
        if b.numa_sensitivity > 2 {
            return Err(Error::InvalidArgument(format!(
                "numa_sensitivity {} is not 0, 1 or 2 (HPX levels; default 1)",
                b.numa_sensitivity
            )));
        }
        let mut victims: [Vec<Vec<usize>>; 3] = Default::default();
        for (level, v) in victims.iter_mut().enumerate() {
            let order = VictimOrder::new(&topology, &placement, level as u8)?;
            *v = (0..placement.len())
                .map(|s| order.victims(s).to_vec())
                .collect();
        }
        let shared = ExecShared::new_arc(
            placement.len(),
            &Config {
                service_mode: b.service_mode,
                deadlock_grace: b.deadlock_grace,
                ring_capacity: b.ring_capacity,
                spin_before_park: b.spin_before_park,
                reply_spin: b.reply_spin,
                victims,
                stealing: b.stealing,
                eager_rebalance: b.eager_rebalance,
                steal_backoff: b.steal_backoff,
                numa_sensitivity: b.numa_sensitivity,
                min_tasks_to_steal: b.min_tasks_to_steal,
                preempt: b.preempt,
                preempt_signal,
                stall_budget: b.stall_budget,
                io_driver: builder::resolve_io(b.io_driver)?,
                local: false,
                placement: Some(placement.clone()),
            },
        )?;
        crate::io::blocking::fix_interrupt_signal(interrupt_signal)?;
        // Last, as the signal: a build refused above adds nothing process-wide (the pool's
        // threads bind to the union of the built executors' allowed CPUs; a refused build on a
        // narrowed thread added its one CPU before, and the first build's set was all there was).
        if !topology.is_synthetic() {
            crate::io::blocking::set_topology(topology.clone());
        }
        tracing::debug!(shards = placement.len(), "xtc executor built");
        Ok(Executor {
            handle: Handle { shared },
            placement,
            topology,
            pin: b.pin,
        })
    }

    /// A handle for other threads and tasks: spawn, stop, knobs and stats. Cost: an `Arc` clone.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Where each shard runs. Cost: a field read.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The topology shards were placed on. Cost: a field read.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether shard threads are pinned each to its own CPU ([`Builder::pin`], `XTC_PIN`).
    /// Always false on a topology that is not this machine's ([`Builder::topology`] with a
    /// synthetic or XML one), where no thread is pinned. Cost: a field read.
    pub fn is_pinned(&self) -> bool {
        self.pin && !self.topology.is_synthetic()
    }

    /// Starts one OS thread per shard, each pinned to its CPU (or, with [`Builder::pin`] off,
    /// bound to the placement's CPUs together), and blocks until the executor is
    /// quiescent (every task done, every timer fired or cancelled, every inbox drained of
    /// what was pushed before the end was decided) or [`stop`](Handle::stop) is called. In
    /// service mode it returns only after `stop`. A foreign spawn racing that end is kept for
    /// the next run ([`Handle::spawn_on`]).
    ///
    /// Returns `Err(Deadlock)` when every loop idles with tasks parked that nothing can wake
    /// (after the deadlock grace period); those tasks are dropped. Work spawned before `run` is
    /// processed when the loops start; the executor can be run again after `run` returns.
    /// `Err(AlreadyRunning)` while another `run` or `block_on` of this executor is in
    /// progress; `Err(Io)` if a shard thread cannot be spawned and `Err(Numa)` if one cannot
    /// be pinned (then no loop runs, and the queued work stays for the next run).
    /// `Err(ShardPanicked)` if a loop's thread panicked outside any task (a bug in xtc): the
    /// run ends there. If that panic also cut the loop's shutdown short, the loop's remaining
    /// tasks are leaked (their futures may be `!Send`, tied to the loop's thread) and every
    /// later run of this executor returns `Err(ShardPanicked)` too. A panic of
    /// the quiescence coordinator itself (a bug in xtc) stops and joins the loops, then
    /// resumes in the caller. A panic inside a task is the task's ([`crate::JoinError`]), never the
    /// run's. Cost: one thread spawn and pin per shard, joined before `run` returns; the calling
    /// thread runs the quiescence coordinator, asleep on a condition variable meanwhile.
    pub fn run(&self) -> Result<()> {
        let claim = self.claim_run()?;
        self.run_inner(&claim)
    }

    /// [`ExecShared::claim_run`].
    fn claim_run(&self) -> Result<RunClaim<'_>> {
        self.handle.shared.claim_run()
    }

    fn run_inner(&self, claim: &RunClaim<'_>) -> Result<()> {
        let shared = &self.handle.shared;
        shared.refuse_if_poisoned()?;
        lock(&shared.deadlock_tasks).clear();
        // Every loop is BUSY, in a new epoch, before any thread of this run looks: a loop that
        // left the last run showing an idle kind (a stop landing just after an idle tick)
        // would otherwise look idle to the coordinator and to its peers' last-EMPTY poke while
        // its first turn drains the inbox and runs, a false quiescence.
        for ls in &shared.loops {
            event_loop::restart_status(&ls.status);
        }
        // Called inside a task of another executor, this run blocks that loop's thread, inside
        // its turn, until it stops: the turn's deferred wakes (ring pings, end-of-turn
        // flushes, rebalance nudge) go now. Left for the turn's end, a call sent to a sleeping
        // shard just before, awaited by this run's tasks, was never woken: a false
        // `Err(Deadlock)`, or a hang with the report off.
        crate::context::before_blocking_the_turn();
        let (tx, rx) = std::sync::mpsc::channel::<xtc_numa::Result<()>>();
        // No loop starts before every shard thread is up and pinned: a run that fails to start
        // then runs nothing, and the work queued for it stays queued (for a later run, or
        // freed with the executor). Loops that started at once ran, and then dropped, tasks
        // and queued spawns while another shard's pinning failed.
        let gate = Arc::new(StartGate::default());
        let mut threads = Vec::with_capacity(shared.loops.len());
        let mut failure: Option<Error> = None;
        // `pin(false)`: every shard may run on any CPU of the placement (each listed once).
        let floating: Option<Arc<[usize]>> = (!self.pin).then(|| {
            let mut cpus = self.placement.cpus().to_vec();
            cpus.sort_unstable();
            cpus.dedup();
            cpus.into()
        });
        for (i, ls) in shared.loops.iter().enumerate() {
            let ls = ls.clone();
            let exec = shared.clone();
            let cpu = if self.topology.is_synthetic() {
                Binding::None
            } else if let Some(cpus) = &floating {
                Binding::Cpus(cpus.clone())
            } else {
                self.placement.cpu(i).map_or(Binding::None, Binding::Cpu)
            };
            let topo = self.topology.clone();
            let tx = tx.clone();
            let gate = gate.clone();
            let spawned = thread::Builder::new()
                .name(format!("xtc-shard-{i}"))
                .spawn(move || worker(ls, exec, topo, cpu, tx, &gate));
            match spawned {
                Ok(t) => threads.push(t),
                Err(source) => {
                    failure = Some(Error::Io {
                        what: "spawning a shard thread",
                        source,
                    });
                    break;
                }
            }
        }
        drop(tx);
        for _ in 0..threads.len() {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failure.get_or_insert(Error::Numa(e));
                }
                // Every sender is gone with a report missing: a shard thread died (panicked)
                // before it reported. Its loop will never run, so none may start: opened, the
                // gate let the others run, and `run()` waited for good on the dead one.
                Err(_) => {
                    failure.get_or_insert(Error::ShardPanicked(
                        "a shard thread panicked before it started its loop",
                    ));
                    break;
                }
            }
        }
        gate.open(failure.is_none());
        if failure.is_none() {
            claim.started.set(true);
            // A coordinator that unwinds (a bug in xtc) stops and joins the loops before the
            // panic goes on: detached, they ran on past this run, and a later `run()` would
            // drive the same loops on second threads (`Sharded`'s `Sync` argument needs one
            // thread per loop at a time).
            let coordinated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                quiesce::coordinate(shared)
            }));
            if let Err(panic) = coordinated {
                shared.request_stop(StopReason::Requested);
                for t in threads {
                    let _ = t.join();
                }
                std::panic::resume_unwind(panic);
            }
        }
        for t in threads {
            if let Err(payload) = t.join() {
                log_shard_panic(payload);
                failure.get_or_insert(Error::ShardPanicked(
                    "a shard thread panicked outside any task",
                ));
            }
        }
        let deadlock = shared.stop_reason() == StopReason::Deadlock as u32;
        // Filled by the coordinator (migratable tasks) and the loops (pinned ones) when it
        // decided on a deadlock; taken either way, so nothing carries over to a later run.
        let tasks = std::mem::take(&mut *lock(&shared.deadlock_tasks));
        // Off any loop: `run()` may be called inside another executor's task.
        {
            // What these drops spawn through a `Handle` is refused (`Discarding`), as what the
            // loops' own shutdown drops spawn is dropped: it ran in the next, unrelated run.
            let _discarding = Discarding::enter(shared);
            crate::context::off_loop(|| shared.mesh.drop_queued(&shared.loops));
            drop_migratable(shared);
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if deadlock {
            let grace = Duration::from_nanos(shared.deadlock_grace_applied.load(SeqCst));
            return Err(Error::Deadlock { tasks, grace });
        }
        Ok(())
    }

    /// Runs `make()`'s future on shard 0 as the main task, runs the executor, and returns the
    /// future's output. When it completes the executor stops and the remaining tasks are
    /// dropped. `Err(Join)` if the main future panicked, `Err(Stopped)` if the executor stopped
    /// before it completed, `Err(Deadlock)` as for [`run`](Self::run). The main task is named
    /// `main` and spawned here, at the caller's `block_on` call (deadlock and stall reports).
    /// `Err(AlreadyRunning)` while another `run` or `block_on` is in progress, and the start
    /// and `ShardPanicked` errors of `run`. Cost: those of [`run`](Self::run) plus one task allocation and the
    /// main task's name (a `String` in an `Arc`).
    #[track_caller]
    pub fn block_on<F, Fut>(&self, make: F) -> Result<Fut::Output>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        /// Stops the run the main task was queued for when the task ends (or is dropped).
        struct StopOnDrop {
            shared: Arc<ExecShared>,
            run: u64,
        }
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                // Only that run: a main task left queued by a run that failed to start is
                // dropped (aborted, below) by a later run or sweep, which it must not stop.
                if self.shared.runs.load(SeqCst) == self.run {
                    self.shared.request_stop(StopReason::MainDone);
                }
            }
        }
        // Claimed before the main task exists: queued while another thread's `run()` is in
        // progress, it would run there and stop that run when it ends.
        let claim = self.claim_run()?;
        // Before the main task exists: queued on a poisoned shard 0, it was leaked with that
        // loop's inbox, and its guard with the executor (`ExecShared::spawn_on_open`).
        self.handle.shared.refuse_if_poisoned()?;
        let guard = StopOnDrop {
            shared: self.handle.shared.clone(),
            run: self.handle.shared.runs.load(SeqCst),
        };
        let main = self.handle.shared.spawn_on(
            0,
            move || async move {
                let _guard = guard;
                make().await
            },
            TaskInfo::here(Some(Arc::new("main".to_string()))),
        )?;
        let ran = self.run_inner(&claim);
        if ran.is_err() && !main.is_finished() {
            // The run failed to start (a shard could not be pinned, a thread not spawned):
            // the main task may still sit in shard 0's inbox. Aborted, a later run drops it
            // unpolled instead of running `make` as a stray task.
            main.abort();
        }
        drop(claim);
        ran?;
        if !main.is_finished() {
            return Err(Error::Stopped);
        }
        match futures_lite::future::block_on(main) {
            Ok(v) => Ok(v),
            Err(e) if e.is_cancelled() => Err(Error::Stopped),
            Err(e) => Err(Error::Join(e)),
        }
    }
}

/// Logs the panic that ended a shard's thread (`Error::ShardPanicked` points at this event):
/// the loop's own events name no payload, and one that died before its loop started logged
/// nothing, so the message was only on stderr (Rust's panic hook). A subscriber that panics
/// here is contained, and so is the payload's drop (`task::guarded`, `task::drop_payload`).
fn log_shard_panic(payload: Box<dyn std::any::Any + Send>) {
    let msg = crate::error::payload_message(&*payload).unwrap_or("a non-string payload");
    crate::task::guarded("a tracing subscriber panicked", || {
        tracing::error!("xtc: a shard thread panicked outside any task: {msg}")
    });
    crate::task::drop_payload(payload);
}

/// A claim on [`Executor::run`]: while it lives, other `run` and `block_on` calls get
/// `Err(AlreadyRunning)`. Dropping it readies the executor for another run (`loom_run.rs`).
pub(crate) struct RunClaim<'a> {
    shared: &'a ExecShared,
    /// Whether the loops started (`run_inner`). A run that failed to start ran nothing, so it
    /// consumes no stop: that is kept for the next run with the queued work it is to drop.
    pub(crate) started: Cell<bool>,
}

impl Drop for RunClaim<'_> {
    fn drop(&mut self) {
        if self.started.get() {
            self.shared.stop.store(false, SeqCst);
            self.shared
                .stop_reason
                .store(StopReason::None as u32, SeqCst);
        }
        self.shared.running.store(false, SeqCst);
    }
}

impl ExecShared {
    /// Frees the tasks still queued while no loop runs: those spawned and never run (no `run`,
    /// or spawned after it returned, into an inbox or, from a stopping loop, into a ring). Every such task is either an unpolled pinned one, which
    /// owns only its `Send` closure (task protocol rule 2), or a migratable one (`Send`), so
    /// any thread may drop them. Without this, a pinned task in its loop's inbox keeps that
    /// loop's `LoopShared` (its home) alive in a cycle, and everything queued there leaks;
    /// a task holding a `Handle` would keep the whole executor alive.
    pub(crate) fn drop_queued(&self) {
        self.sweep(true);
    }

    /// Drops queued tasks until a round finds none (dropping a closure may queue more, a
    /// `Drop` that spawns): every inbox and injector (where a foreign thread's pushes go), and
    /// with `all` the parked deques and the ring mesh, which only a thread that no run can
    /// race may drain (`drop_queued`). No cap on the rounds: a chain of such drops moves from
    /// loop to loop (`Handle::spawn` places round robin), a round or so per link, and a capped
    /// sweep (it was 8 rounds) left the rest of the chain queued, leaked with the executor
    /// when a task held a `Handle` (the same chain within one loop's injector was already
    /// drained whole by one round).
    ///
    /// Off any loop (`context::off_loop`): it may run inside a task of another executor's loop
    /// (an executor dropped there), which these tasks are nothing to.
    fn sweep(&self, all: bool) {
        // On this frame, and declared before the guard, which unlinks it (also on unwind).
        let node = SweepNode {
            exec: self,
            prev: SWEEPING.with(Cell::get),
        };
        let _sweep = Sweeping::enter(&node);
        crate::context::off_loop(|| {
            let mut batch = Vec::new();
            loop {
                let mut dropped = if all {
                    self.migratable.drop_parked_queues() + self.mesh.drop_queued(&self.loops)
                } else {
                    0
                };
                for l in &self.loops {
                    dropped += l.inbox.drain_into(&mut batch) + l.steal.drop_injected();
                    if l.poisoned.load(SeqCst) {
                        // Wakes of the live tasks of a loop whose shutdown a panic cut short
                        // (`LoopShared::poisoned`): no other thread may drop them.
                        event_loop::leak_all(std::mem::take(&mut batch));
                    }
                    crate::task::cancel_all(batch.drain(..));
                }
                if dropped == 0 {
                    break;
                }
            }
        });
    }

    /// The `Executor` (or `LocalExecutor`) is gone, so no run can come: from now on a `Handle`
    /// refuses or drops what it would queue (`drop_if_closed`), and what is queued is freed.
    pub(crate) fn close(&self) {
        announce_closed(&self.closed);
        self.drop_queued();
        self.drop_stall_callbacks();
    }

    /// Drops every loop's stall callback (each after its lock is released: the closure's
    /// captured state is user code). A callback holding a `Handle` kept the loops, and so the
    /// whole executor, alive in a cycle once the `Executor` was dropped.
    fn drop_stall_callbacks(&self) {
        for l in &self.loops {
            let cb = lock(&l.stall.callback).take();
            // Guarded: a panicking one unwound out of the `Executor`'s drop, and the later
            // loops' callbacks (a `Handle` in them, say) leaked in their cycle.
            crate::task::guarded("a stall callback panicked while being dropped", || drop(cb));
        }
    }

    /// A `Handle` queued work after a check of `closed`: if the `Executor` was dropped
    /// meanwhile, its sweep may have run before the push, so drop what sits in the inboxes
    /// and injectors (where a foreign thread's pushes go) here ([`closed_after_push`], paired
    /// with the drop's [`announce_closed`]: either the sweep sees the push or this sees the
    /// close; `loom_close.rs`). Cost: a fence and a load on the spawn path.
    fn drop_if_closed(&self) {
        if !closed_after_push(&self.closed) {
            return;
        }
        // A task dropped here (or by `drop_queued`) whose `Drop` spawns again lands in the
        // queue being swept, which the outer sweep's loop drains: recursing instead overflowed
        // the stack on a chain of such drops. Only a sweep of this executor: one of another
        // executor (whose swept task's `Drop` spawned here) drains nothing of this one, and
        // what was just queued stayed, its handle unresolved, leaked with this executor.
        if Sweeping::active_for(self) {
            return;
        }
        self.sweep(false);
    }
}

/// The close protocol's first half (`ExecShared::close`): marks the executor closed, then a
/// SeqCst fence, before the sweep reads the queues. With [`closed_after_push`] on the other
/// side it is Dekker's pattern: of the two fences one comes first in their single total order,
/// and the read after the later one sees the write before the earlier (the sweep finds the
/// push, or the pusher finds the close). SeqCst loads and stores alone order the same in
/// C11, but loom models SeqCst accesses as acquire/release and only the fences as SeqCst, so
/// the fences make `loom_close.rs` check the shipping order. Cost: a store and a fence, once
/// per executor.
pub(crate) fn announce_closed(closed: &AtomicBool) {
    closed.store(true, SeqCst);
    fence(SeqCst);
}

/// The close protocol's second half (`ExecShared::drop_if_closed`): after a push into a queue
/// the sweep drains (an inbox, an injector), a SeqCst fence, then whether the executor is
/// closed, in which case the pusher sweeps what it queued itself. Cost: a fence and a load.
pub(crate) fn closed_after_push(closed: &AtomicBool) -> bool {
    fence(SeqCst);
    closed.load(SeqCst)
}

thread_local! {
    /// The executors whose queued tasks this thread is sweeping (`drop_queued`,
    /// `drop_if_closed`): a list through the `SweepNode`s on the stack frames of those sweeps,
    /// innermost first, or null. A raw pointer, so the thread-local has no destructor (an
    /// executor may be dropped, and swept, by another thread-local's destructor).
    static SWEEPING: Cell<*const SweepNode> = const { Cell::new(std::ptr::null()) };
    /// The executors whose stopped runs' leftovers this thread is dropping (`run_inner`, after
    /// the loops stopped): a list through the `DiscardNode`s of the `Discarding` guards alive
    /// on this thread, innermost first, or null.
    static DISCARDING: Cell<*const DiscardNode> = const { Cell::new(std::ptr::null()) };
}

/// Marks this thread as dropping the leftovers of a stopped run of an executor (tasks left in
/// the rings, parked migratable tasks) until dropped: a `Drop` there that spawns on that
/// executor through a `Handle` is refused (`Err(Stopped)`, or a migratable task dropped at
/// once), as the spawns of the drops a stopping loop runs are (`ExecShared::spawn_on_open`).
/// Queued, they ran in the next, unrelated run.
///
/// Holds its node as a raw pointer (`Box::leak`), not a `Box`: the list's pointer to it is
/// a raw pointer too, and a `Box` moved after it was taken (into the guard, out of `enter`)
/// asserted unique access, invalidating it for the reads in `active_for` (Stacked Borrows:
/// Miri reported it in rt_spawn's `LocalExecutor` test).
pub(crate) struct Discarding(std::ptr::NonNull<DiscardNode>);

/// One entry of this thread's list of executors being discarded (`DISCARDING`). Every entry
/// counts, not only the innermost: a `Drop` of executor A's leftovers may run executor B
/// (a nested `run()`), whose own discarding then sits on top of A's, and a `Drop` of B's
/// leftovers that spawns on A is still one of A's stopped run's drops (it was accepted, and
/// ran in A's next run). Only the innermost entry of an executor decides, though: a
/// `LocalExecutor` may be run again from one of its own stopped run's drops (a nested
/// `block_on`), and that run is live (`Discarding::live`).
struct DiscardNode {
    exec: *const ExecShared,
    /// False for a live run nested inside a discarding of the same executor.
    discarding: bool,
    /// Whether `Discarding::drop_injected` is draining the injectors for this node: a spawn
    /// made by one of its drops leaves its task queued for that drain's next look.
    draining: Cell<bool>,
    /// Set by such a spawn: the drain looks again.
    respawned: Cell<bool>,
    prev: *const DiscardNode,
}

impl Discarding {
    /// Cost: one allocation (a node with a stable address), once per `run()`.
    pub(crate) fn enter(exec: &ExecShared) -> Discarding {
        Discarding::push(exec, true)
    }

    /// For a run of `exec` starting on this thread (`LocalExecutor::block_on`): if this thread
    /// is inside a discarding of `exec` (the run is nested in a `Drop` of its stopped run's
    /// leftovers), hides it until dropped, since this run's spawns are its own. Cost: a
    /// thread-local read; an allocation only in that nested case.
    pub(crate) fn live(exec: &ExecShared) -> Option<Discarding> {
        Discarding::active_for(exec).then(|| Discarding::push(exec, false))
    }

    fn push(exec: &ExecShared, discarding: bool) -> Discarding {
        let node = std::ptr::NonNull::from(Box::leak(Box::new(DiscardNode {
            exec,
            discarding,
            draining: Cell::new(false),
            respawned: Cell::new(false),
            prev: DISCARDING.with(Cell::get),
        })));
        DISCARDING.with(|d| d.set(node.as_ptr()));
        Discarding(node)
    }

    /// Whether this thread is dropping a stopped run's leftovers of `exec`. Cost: a
    /// thread-local read (the list is empty outside those drops).
    pub(crate) fn active_for(exec: &ExecShared) -> bool {
        Discarding::with_innermost(exec, |node| node.discarding).unwrap_or(false)
    }

    /// `f` on this thread's innermost entry for `exec`, if any.
    fn with_innermost<R>(exec: &ExecShared, f: impl FnOnce(&DiscardNode) -> R) -> Option<R> {
        let mut p = DISCARDING.with(Cell::get);
        while !p.is_null() {
            // SAFETY: every node in the list is owned by a `Discarding` guard alive on this
            // thread: guards are scoped locals (never moved out of `run_inner` or
            // `LocalExecutor::block_on`, never forgotten), so they drop in reverse order, each
            // unlinking its node first. `f` runs while the caller's frame, below that guard's,
            // is still on the stack, so the node outlives it.
            let node = unsafe { &*p };
            if std::ptr::eq(node.exec, exec) {
                return Some(f(node));
            }
            p = node.prev;
        }
        None
    }

    /// If this thread is dropping a stopped run's leftovers of `exec` (`active_for`), drops
    /// the tasks its injectors hold (a migratable spawn made by one of those drops), until a
    /// look finds that none of its drops spawned again. Flat: a spawn made by a drop this
    /// drain runs (a `Drop` that spawns again) leaves its task queued for this drain's next
    /// look; dropping the injectors from inside each such spawn ran every link of a chain of
    /// them on its predecessor's stack, and a long chain overflowed it. Each look drops what
    /// the injectors held when it began (`StealShared::drop_injected`): plain threads that
    /// kept spawning (`Handle::spawn`) kept a drain "until none is left" going, and `run()`
    /// never returned; their spawns wait for the next run. Cost: a thread-local read outside
    /// those drops.
    pub(crate) fn drop_injected(exec: &ExecShared) {
        Discarding::with_innermost(exec, |node| {
            if !node.discarding {
                return;
            }
            if node.draining.replace(true) {
                node.respawned.set(true);
                return;
            }
            // Lowered also on unwind (the drops are guarded, so none is expected).
            struct Lower<'a>(&'a Cell<bool>);
            impl Drop for Lower<'_> {
                fn drop(&mut self) {
                    self.0.set(false);
                }
            }
            let _lower = Lower(&node.draining);
            loop {
                node.respawned.set(false);
                for l in &exec.loops {
                    l.steal.drop_injected();
                }
                if !node.respawned.get() {
                    break;
                }
            }
        });
    }
}

impl Drop for Discarding {
    fn drop(&mut self) {
        // SAFETY: the node came from `Box::leak` in `push` and only this guard frees it.
        let node = unsafe { Box::from_raw(self.0.as_ptr()) };
        // Guards drop in reverse order (see `active_for`): this node is the list's head.
        DISCARDING.with(|d| {
            debug_assert!(
                std::ptr::eq(d.get(), self.0.as_ptr()),
                "Discarding out of order"
            );
            d.set(node.prev)
        });
    }
}

/// One entry of this thread's list of executors being swept (`SWEEPING`).
struct SweepNode {
    exec: *const ExecShared,
    prev: *const SweepNode,
}

/// Marks this thread as sweeping `node`'s executor until dropped (then the list is as it was
/// found, for nesting). Borrows the node, so it cannot outlive it; never forgotten.
struct Sweeping<'a>(*const SweepNode, std::marker::PhantomData<&'a SweepNode>);

impl Sweeping<'_> {
    /// Links `node` (a local of the caller's frame) until the guard drops.
    fn enter(node: &SweepNode) -> Sweeping<'_> {
        Sweeping(SWEEPING.with(|s| s.replace(node)), std::marker::PhantomData)
    }

    /// Whether this thread is sweeping `exec`. Cost: a thread-local read (the list is empty
    /// outside sweeps).
    fn active_for(exec: &ExecShared) -> bool {
        let mut p = SWEEPING.with(Cell::get);
        while !p.is_null() {
            // SAFETY: every node in the list lives on the frame of a `sweep` call still
            // running on this thread: its `Sweeping` guard, declared after it, unlinks it
            // before the frame ends (also on unwind), and guards drop in reverse order.
            let node = unsafe { &*p };
            if std::ptr::eq(node.exec, exec) {
                return true;
            }
            p = node.prev;
        }
        false
    }
}

impl Drop for Sweeping<'_> {
    fn drop(&mut self) {
        SWEEPING.with(|s| s.set(self.0));
    }
}

impl Drop for ExecShared {
    /// The last `Handle` is gone: tasks spawned through it since the `Executor` was dropped
    /// are freed (see `drop_queued`).
    fn drop(&mut self) {
        self.drop_queued();
    }
}

impl Drop for Executor {
    /// Frees the tasks queued and never run (see `ExecShared::drop_queued`); `run` cannot be
    /// in progress (it borrows the executor). Cost: two or more sweeps, each taking every
    /// ring's consumer lock (N·(N−1) for N shards), each loop's parked-task lists and its inbox
    /// lock, then each loop's stall-callback lock; plus the drops of what they find.
    fn drop(&mut self) {
        self.handle.shared.close();
    }
}

/// After the loops stopped: drops every migratable task still alive (their futures are `Send`,
/// so this thread may), so none leaks. At quiescence there are none.
///
/// Off any loop (`context::off_loop`), as `ExecShared::sweep`: `run()` may be called inside a
/// task of another executor, whose loop these tasks' `Drop` code saw as theirs (a cleanup
/// `spawn_local` there put its task on that unrelated loop).
pub(crate) fn drop_migratable(shared: &ExecShared) {
    if !shared.migratable.any_registered() {
        return;
    }
    crate::context::off_loop(|| drop_registered_migratable(shared));
    // The blocking jobs those drops abandoned (a parked task awaiting `spawn_blocking`) are
    // this thread's now: waited for as a stopping loop waits for its own (up to a second), or
    // their effect could land after `run()` returned. Abandoned with no loop running (tag 0).
    crate::io::blocking::settle(0);
}

fn drop_registered_migratable(shared: &ExecShared) {
    // The parked tasks dropped here end on no loop: each counts in `LoopStats::tasks_run` of
    // the loop it first parked on (its registry shard), cancelled, as a pinned task that a
    // shutdown drops does. No loop of this executor runs now (its run's threads are joined,
    // or a `LocalExecutor`'s loop is gone), so their single-writer counts may be written here.
    SWEEPS.with(|s| s.borrow_mut().push(shared as *const ExecShared));
    let _count = CountDropped;
    // One wake per task is enough: each `Runnable` then surfaces in an injector (this thread
    // is no worker) or is already in a queue drained below.
    shared.migratable.wake_all();
    for round in 0..2_000 {
        if round > 0 && !shared.migratable.any_registered() {
            return;
        }
        for l in &shared.loops {
            l.steal.drop_injected();
        }
        shared.migratable.drop_parked_queues();
        if round < 10 {
            thread::yield_now();
        } else {
            thread::sleep(Duration::from_millis(1));
        }
    }
    tracing::warn!("some migratable tasks could not be dropped at stop (a bug in xtc)");
}

thread_local! {
    /// The executors whose parked migratable tasks this thread is dropping
    /// ([`drop_registered_migratable`]), innermost last.
    static SWEEPS: std::cell::RefCell<Vec<*const ExecShared>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A registered migratable task of `exec` was dropped off any loop: counted in `tasks_run`
/// of its registry shard if a [`drop_registered_migratable`] of `exec` runs on this thread
/// (no loop of `exec` runs then, nested runs being sequential on this thread).
pub(crate) fn count_swept(exec: &ExecShared, shard: usize) {
    let sweeping = SWEEPS
        .try_with(|s| s.borrow().iter().any(|&e| std::ptr::eq(e, exec)))
        .unwrap_or(false);
    if sweeping {
        if let Some(l) = exec.loops.get(shard) {
            crate::stats::bump(&l.stats.tasks_run, 1);
        }
    }
}

/// Pops this thread's [`SWEEPS`] entry (on every way out of the sweep). A nested sweep of the
/// same executor (a task's `Drop` that runs a `LocalExecutor` again) pushes its own entry: each
/// task is counted once, by its own drop, whichever sweep drops it (counted before and after
/// each sweep instead, the nested sweep's drops were counted by both).
struct CountDropped;

impl Drop for CountDropped {
    fn drop(&mut self) {
        SWEEPS.with(|s| s.borrow_mut().pop());
    }
}

/// Tests only: a callback the coordinator (or a shard thread) runs at a point of its protocol.
#[cfg(test)]
pub(crate) struct TestHook(pub(crate) Box<dyn Fn() + Send + Sync>);

#[cfg(test)]
impl std::fmt::Debug for TestHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestHook")
    }
}

/// Holds the shard threads of a run until every one is up and pinned (`run_inner`).
#[derive(Default)]
struct StartGate {
    /// `None` until decided; then whether the loops may start.
    go: Mutex<Option<bool>>,
    cv: Condvar,
}

impl StartGate {
    fn open(&self, go: bool) {
        *lock(&self.go) = Some(go);
        self.cv.notify_all();
    }

    /// Waits for the decision: whether this loop may start.
    fn wait(&self) -> bool {
        let mut g = lock(&self.go);
        loop {
            if let Some(go) = *g {
                return go;
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Where a shard thread is bound when it starts ([`Builder::pin`]).
#[derive(Debug)]
enum Binding {
    /// Its own CPU.
    Cpu(usize),
    /// Any of the placement's CPUs: the OS moves it among them.
    Cpus(Arc<[usize]>),
    /// Left as it is (a synthetic topology describes no real CPUs).
    None,
}

/// Whether every CPU the calling thread may run on is allowed in `topo` (false if the mask
/// cannot be read).
fn inherited_cpus_allowed(topo: &Topology) -> bool {
    crate::sys::thread_cpus()
        .is_some_and(|cpus| !cpus.is_empty() && cpus.iter().all(|&c| topo.is_allowed(c)))
}

fn worker(
    ls: Arc<LoopShared>,
    exec: Arc<ExecShared>,
    topo: Arc<Topology>,
    cpu: Binding,
    tx: std::sync::mpsc::Sender<xtc_numa::Result<()>>,
    gate: &StartGate,
) {
    let pinned = match &cpu {
        Binding::Cpu(cpu) => xtc_numa::pin_current_thread(&topo, *cpu),
        Binding::Cpus(cpus) => xtc_numa::bind_current_thread(&topo, cpus).or_else(|e| {
            // `pin(false)` asks for no CPU of its own: where the system forbids setting
            // affinity (a seccomp filter refusing it with EPERM), the CPUs the thread inherited
            // do, if they are all allowed. Failing here left no way to run on this machine.
            if inherited_cpus_allowed(&topo) {
                tracing::warn!(
                    shard = ls.index,
                    error = %e,
                    "xtc: cannot bind the shard thread to the placement's CPUs; it keeps the \
                     allowed CPUs it inherited"
                );
                Ok(())
            } else {
                Err(e)
            }
        }),
        Binding::None => Ok(()),
    };
    #[cfg(test)]
    let pinned = if exec.fail_pin.load(SeqCst) == ls.index {
        Err(xtc_numa::Error::PinFailed {
            cpu: match &cpu {
                Binding::Cpu(cpu) => *cpu,
                Binding::Cpus(cpus) => cpus.first().copied().unwrap_or(0),
                Binding::None => 0,
            },
            errno: libc::EINVAL,
        })
    } else {
        pinned
    };
    #[cfg(test)]
    if exec.panic_pin.load(SeqCst) == ls.index {
        panic!(
            "planted: shard {} dies before it reports its pinning",
            ls.index
        );
    }
    let ok = pinned.is_ok();
    let _ = tx.send(pinned);
    drop(tx);
    if !ok || !gate.wait() {
        return;
    }
    // The gate is open: the other loops run. From here on, a thread that dies without asking
    // the stop leaves `run()` waiting for good on a loop that never runs (its status stays
    // BUSY), so every panic asks it first: a bug in xtc, or a tracing subscriber that panics
    // on one of the events below (as it may on the pinning's, above).
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::sys::set_timer_slack_ns(1_000);
        Core::new(ls, exec.clone())
    }));
    let core = match started {
        Ok(core) => core,
        Err(payload) => {
            exec.request_stop(StopReason::Requested);
            std::panic::resume_unwind(payload);
        }
    };
    let Some(_enter) = context::enter(&core) else {
        // Not on a fresh thread; refused, this loop would never run.
        exec.request_stop(StopReason::Requested);
        return;
    };
    // A panic here is a bug in xtc (task code, wakers and the drops of futures and buffers
    // are guarded), or a subscriber's: stop the executor so `run()` returns and reports it,
    // rather than waiting on a loop that is gone, and still shut this loop down (its tasks
    // dropped on this thread, its counts published, so a later run can balance them) if that
    // works.
    // Busy + idle from here until the shutdown below has ended (or a panic unwinds).
    let _clock = event_loop::RunClock::start(&core.shared.stats);
    // Dropped before `core` (declared after it): a shutdown cut short poisons the loop before
    // its `Core` gives its ring ends back, so whoever takes them sees the flag.
    let mut shut = ShutdownGuard {
        shared: &core.shared,
        done: false,
    };
    let looped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Armed here, before the first turn, and re-armed by the loop when the interval
        // changes (`preempt::sync_timer`).
        crate::preempt::sync_timer(&core);
        tracing::trace!(shard = core.index(), ?cpu, "shard loop started");
        event_loop::run(&core, true, &|| false)
    }));
    if let Err(payload) = looped {
        // Asked before anything is logged: a subscriber that panics on the error event left
        // the thread without asking it.
        exec.request_stop(StopReason::Requested);
        core.current.set(std::ptr::null());
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            event_loop::shutdown(&core, false)
        }));
        shut.done = closed.is_ok();
        tracing::error!(shard = core.index(), "xtc: a shard loop panicked; stopping");
        if closed.is_err() {
            tracing::error!(shard = core.index(), "xtc: its shutdown panicked too");
        }
        std::panic::resume_unwind(payload);
    }
    let reason = exec.seen_stop_reason();
    if reason == StopReason::Deadlock as u32 {
        let lines: Vec<String> = core
            .registry
            .borrow()
            .iter()
            .map(|(_, e)| {
                let info = e.info();
                let name = info.report_name();
                format!(
                    "task '{name}' spawned at {} on shard {}",
                    info.location,
                    core.index()
                )
            })
            .collect();
        lock(&exec.deadlock_tasks).extend(lines);
    }
    event_loop::shutdown(&core, reason == StopReason::Quiescent as u32);
    shut.done = true;
    #[cfg(test)]
    {
        // Outside the lock: the hooks of two shards may run at once.
        let hook = lock(&exec.after_shutdown).clone();
        if let Some(hook) = hook {
            (hook.0)();
        }
    }
    tracing::trace!(shard = core.index(), "shard loop stopped");
}

/// A worker's (or a `LocalExecutor::block_on`'s) loop between its end and its completed
/// shutdown: dropped before `done` (a panic cut the shutdown short, a bug in xtc), it poisons
/// the loop ([`LoopShared::poisoned`]), whose live tasks were not dropped on its thread.
pub(crate) struct ShutdownGuard<'a> {
    pub(crate) shared: &'a LoopShared,
    pub(crate) done: bool,
}

impl Drop for ShutdownGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.shared.poisoned.store(true, SeqCst);
        }
    }
}

/// Every [`Handle`] method (spawning, stop, knobs, stats) is callable on the executor itself.
impl std::ops::Deref for Executor {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

/// A cheap, cloneable reference to an [`Executor`], usable from any thread (`Send + Sync`):
/// spawn, stop, knobs and stats.
#[derive(Debug, Clone)]
pub struct Handle {
    pub(crate) shared: Arc<ExecShared>,
}

impl Handle {
    /// Capacity of each ring of the mesh (messages per ordered pair of shards). Cost: a field
    /// read.
    pub fn ring_capacity(&self) -> usize {
        self.shared.mesh.capacity()
    }

    /// The I/O driver the loops use ([`crate::io`]): chosen at `build()` from
    /// [`Builder::io_driver`], `XTC_IO` or the io_uring probe. A loop whose own ring cannot
    /// be set up when it starts (without `CAP_IPC_LOCK` the kernel charges rings to
    /// `RLIMIT_MEMLOCK`, which a container may set to 64 KiB) runs epoll instead and logs a
    /// warning saying what to raise; [`LoopStats::io_driver`](crate::LoopStats::io_driver)
    /// tells which driver each loop runs. Cost: a field read.
    pub fn io_driver(&self) -> crate::io::Driver {
        self.shared.io_driver
    }

    /// Where each shard runs: its CPU and NUMA node ([`Executor::placement`], from any
    /// thread); `None` for a [`LocalExecutor`](crate::LocalExecutor)'s handle, which places
    /// nothing. Inside a task, [`shard::cpu`](crate::shard::cpu) and
    /// [`shard::numa_node`](crate::shard::numa_node) read the current shard's. Cost: a field read.
    pub fn placement(&self) -> Option<&Placement> {
        self.shared.placement.as_ref()
    }

    /// Number of shards. Cost: a field read.
    pub fn shard_count(&self) -> usize {
        self.shared.loops.len()
    }

    /// Spawns a task pinned to `shard`. `make` is `Send` and is called on that shard, so the
    /// future it returns may be `!Send`; the task never leaves the shard. Works from any thread,
    /// before `run()` (the task starts when the loops do) and while it runs. A spawn from
    /// another thread that races a quiescent `run()`'s end (the coordinator has already seen
    /// every loop idle) is not run by that `run()`: it stays queued for the next run, and its
    /// `JoinHandle` resolves as cancelled if the `Executor` is dropped first.
    ///
    /// `Err(InvalidShard)` for an out-of-range shard, `Err(ShardPanicked)` for a shard whose
    /// loop's shutdown was cut short by a panic (a bug in xtc; no later run starts, see
    /// [`Executor::run`]), `Err(Stopped)` once the `Executor` is
    /// dropped (through a `Handle`: no run can come), from the `Drop` of a task that a
    /// stopped run drops on the thread in `run()` or `LocalExecutor::block_on` (a parked
    /// migratable one, one left in a ring), and from a `Drop` that one of this executor's
    /// loops runs in its shutdown, whichever shard the spawn is for (the executor is stopping:
    /// queued, the task was dropped unrun, and a `Drop` that waited for it could wait for good,
    /// see "Blocking a loop" in the crate docs). Cost: one allocation; from the shard
    /// itself a thread-local push; from another loop of the same executor a ring push (into a
    /// backlog while the ring is full), with the wake ping, if the shard sleeps, sent at the end
    /// of that loop's turn; from any other thread an inbox push (a short lock) plus a wake ping
    /// (an eventfd write) if the shard sleeps.
    #[track_caller]
    pub fn spawn_on<F, Fut>(&self, shard: usize, make: F) -> Result<JoinHandle<Fut::Output>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.shared
            .spawn_on_open(shard, make, TaskInfo::here(None), 0)
    }

    /// Asks the executor to stop: `run()` returns once every loop has dropped its tasks.
    /// Safe from any thread; idempotent. Cost: an eventfd write per loop, asleep or not (a
    /// forced wake, so no loop can miss the stop), and a lock and condvar notify to wake the
    /// coordinator.
    ///
    /// A stop asked while no `run()` (or `block_on`) is in progress is kept for the next one,
    /// which then stops at once and drops what was queued (its `JoinHandle`s report cancelled):
    /// a stop that races the start of `run()` from another thread is never lost. Each run
    /// clears it when it returns, so a stop is consumed by exactly one run (a run that fails to
    /// start runs nothing and keeps it, with the queued work, for the next).
    ///
    /// What was queued when a loop begins to stop is dropped (its `JoinHandle` reports
    /// cancelled). A spawn from another thread that races the stop ([`spawn_on`](Self::spawn_on),
    /// [`spawn`](Self::spawn)) is lost neither way: it is dropped with the run's tasks, or kept
    /// for the next run, as a spawn made after `run()` returned is (and dropped with the
    /// `Executor` if none comes). So is a `submit_to` or `send_to` that a task still running
    /// sends to a shard that has already finished stopping: it runs in the next run, though
    /// its caller may be gone (`ring::evacuate`). Threads that keep spawning do not hold the
    /// stop up.
    ///
    /// The handle of a [`LocalExecutor`](crate::LocalExecutor) stops nothing: its `block_on`
    /// returns when its future does (it has no other output to give), and no stop is kept.
    pub fn stop(&self) {
        self.shared.request_stop(StopReason::Requested)
    }

    /// Service mode on: `run()` ignores quiescence (and deadlock) and returns only after
    /// `stop()`. Use it for a long-running server whose loops may all idle at times.
    /// Default: off (or `XTC_SERVICE_MODE`). Takes effect at once, from any thread. Cost: an
    /// atomic store, plus a lock and condvar notify that wake the coordinator to recheck.
    pub fn set_service_mode(&self, on: bool) {
        self.shared.service_mode.store(on, SeqCst);
        self.shared.poke();
    }

    /// Whether service mode is on. Cost: an atomic load.
    pub fn service_mode(&self) -> bool {
        self.shared.service_mode()
    }

    /// Sets the deadlock grace period (`None`: never report). Default 5 s (or
    /// `XTC_DEADLOCK_GRACE`); a [`LocalExecutor`](crate::LocalExecutor)'s is `None`, and
    /// setting it there changes nothing (it stays `None`: no coordinator reports). Cost of the call: an
    /// atomic store, a lock and a condvar notify (the coordinator rechecks). While a grace is
    /// set and service mode is off, the coordinator (on the thread that called `run()`) wakes
    /// every `grace / 2` (at least 1 ms, at most 1 s) for the whole run, busy or idle, to
    /// recheck: with the default 5 s grace, one wake-up every 1 s.
    pub fn set_deadlock_grace(&self, grace: Option<Duration>) {
        // No coordinator reads it there: stored, the getter promised a report never made.
        if self.shared.local {
            return;
        }
        self.shared
            .deadlock_grace_ns
            .store(grace_to_ns(grace), SeqCst);
        self.shared.poke();
    }

    /// The deadlock grace period. Cost: an atomic load. Kept in whole nanoseconds in 64 bits,
    /// as [`preempt`](Self::preempt) is: a grace above about 584 years reads back as that.
    pub fn deadlock_grace(&self) -> Option<Duration> {
        self.shared.deadlock_grace()
    }

    /// How long a loop that just did work polls its inbox and rings before it parks. A parked
    /// loop costs its waker a wake-up (about 20–25 µs in a VM, a few µs on bare metal) while a
    /// spinning one answers in well under a microsecond; the price is a full CPU for `spin`
    /// after every burst of work, less what other threads on that CPU take (the spin calls
    /// `sched_yield` every 64 polls). A loop whose turn ran nothing (an idle tick) parks at once.
    /// Default [`DEFAULT_SPIN_BEFORE_PARK`] (20 µs; or `XTC_SPIN_BEFORE_PARK`; 0 in a
    /// [`LocalExecutor`](crate::LocalExecutor)); 0 parks at once;
    /// more than [`MAX_SPIN_BEFORE_PARK`] (1 s) is clamped to it. A spinning loop is busy, so
    /// `run()` returns up to one spin after the last task finished. Takes effect at the next
    /// idle period, from any thread. Cost of the call: an atomic store.
    pub fn set_spin_before_park(&self, spin: Duration) {
        self.shared
            .spin_before_park_ns
            .store(duration_ns(spin.min(MAX_SPIN_BEFORE_PARK)), SeqCst);
    }

    /// The spin-before-park time. Cost: an atomic load.
    pub fn spin_before_park(&self) -> Duration {
        self.shared.spin_before_park()
    }

    /// How long a loop polls before it parks when one of its pinned tasks awaits a
    /// [`submit_to`](crate::shard::submit_to) (or `submit_to_all`) reply from another shard (a
    /// migratable task's reply wakes it on the target's loop, so its own loop does not spin).
    /// First the waiting task itself polls for the reply, for up to `spin` from its first
    /// waiting poll and only while its loop has no other pinned task to run: it sees the
    /// call's task complete without waiting for the reply's wake-up to cross back (a spinning
    /// round trip about 0.85 µs instead of 1.1 µs on the development VM); then the loop spins
    /// as below once it runs out of work:
    /// with the target loop asleep, the reply then lands while the caller still polls and the
    /// round trip pays one wake-up instead of two (`scripts/bench --only rtt` here: p50 from
    /// 62–70 µs without it to 2 µs, the target still parking and pinged every round trip; a
    /// thread woken while its waker's CPU stays busy wakes in about a microsecond on this VM,
    /// against 25–35 µs when both CPUs went idle). Applies when the loop runs out of work
    /// after a poll in which a call's join waited (once per such poll, so once per call for a
    /// task that awaits it alone), unless every such call got its reply meanwhile; with [`set_spin_before_park`](Self::set_spin_before_park)
    /// also due, the longer is used. Cost: up to `spin` of CPU per such poll that leaves its
    /// loop with nothing else to do (the spin ends when the reply, or any other work, arrives;
    /// it yields to other threads every 64 polls); nothing for loops that await no reply. Default [`DEFAULT_REPLY_SPIN`] (50 µs;
    /// or `XTC_REPLY_SPIN`; 0 in a [`LocalExecutor`](crate::LocalExecutor)); 0 parks at once; more than [`MAX_SPIN_BEFORE_PARK`] (1 s) is
    /// clamped to it. Takes effect at the next idle period, from any thread. Cost of the call:
    /// an atomic store.
    pub fn set_reply_spin(&self, spin: Duration) {
        self.shared
            .reply_spin_ns
            .store(duration_ns(spin.min(MAX_SPIN_BEFORE_PARK)), SeqCst);
    }

    /// The reply spin time. Cost: an atomic load.
    pub fn reply_spin(&self) -> Duration {
        self.shared.reply_spin()
    }

    /// Spawns a **migratable** task: a `Send` future placed round-robin over the loops, which
    /// idle loops may steal (nearest first). Works from any thread, before and during `run()`.
    /// Re-read [`shard::id()`](crate::shard::id) after an `.await` to notice a move. Once the
    /// `Executor` is dropped (through a `Handle`) the task is dropped at once and its handle
    /// reports cancelled. Cost: one
    /// allocation, a shared live-task counter update (migratable tasks pay the cross-core
    /// atomics that pinned tasks avoid), a push on the chosen loop's injector with an atomic
    /// add on its count and a wake ping (an eventfd write) if that loop sleeps, a nudge of an
    /// idle peer with eager rebalance on, a ping to every sleeping loop when the live count
    /// rises from zero (so idle loops look for work again), and, the first time the task
    /// parks, a registry insert under a per-shard lock.
    #[track_caller]
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let n = self.shared.loops.len();
        let home = self.shared.migratable.next.fetch_add(1, Relaxed) % n;
        let h = crate::steal::spawn(&self.shared, home, true, fut, TaskInfo::here(None));
        // After the `Executor` is dropped the task is dropped at once: its handle reports
        // cancelled.
        self.shared.drop_if_closed();
        // Spawned by the drop of a stopped run's task: dropped too (`Discarding`), with
        // whatever else the injectors hold, as `drop_migratable` drops it (a foreign spawn
        // that raced the stop).
        Discarding::drop_injected(&self.shared);
        h
    }

    /// Creates a scheduling class on loop `shard` (see [`crate::shard::create_class`]).
    /// `Err(InvalidShard)` out of range, `Err(InvalidArgument)` for shares outside 1..=1000
    /// or a zero latency bound, `Err(Stopped)` once the [`Executor`] is dropped (no run can
    /// use the class, as `spawn_on`). Cost: one allocation of about 64 bytes that is never
    /// freed (a [`Class`](crate::Class) lives as long as the process), a process-wide lock and
    /// the loop's class-list lock, and a wake ping to the loop if it sleeps.
    pub fn create_class(
        &self,
        shard: usize,
        shares: u32,
        latency: Option<Duration>,
    ) -> Result<crate::Class> {
        let l = self.shared.shard(shard)?;
        // Made after the drop, it was never freed and no run could use it.
        if self.shared.closed.load(SeqCst) {
            return Err(Error::Stopped);
        }
        let c = crate::class::create(l, shares, latency)?;
        l.parker.unpark();
        Ok(c)
    }

    /// CPU-time preemption: each worker arms a timer on its own thread's CPU time at this
    /// interval, and a tick makes [`crate::yield_if_due`] yield. Zero disables (the default, or
    /// `XTC_PREEMPT`). Takes effect while the executor runs too: a worker re-arms its timer at
    /// its next loop turn, or at the next `yield_if_due` of the poll it is running, whichever
    /// comes first (a parked worker uses no CPU time, so its timer would not fire anyway).
    /// Cost when on: one signal per interval of CPU time per busy worker (idle workers use no
    /// CPU time, so their timers do not fire); code that never calls `yield_if_due` is
    /// unaffected.
    /// `Err(Unsupported)` where the platform lacks per-thread CPU-time timers (the setting is
    /// stored anyway). A worker whose timer cannot be created at run time (`timer_create`
    /// refused, e.g. by a seccomp filter) logs a warning and runs without preemption. A
    /// [`LocalExecutor`](crate::LocalExecutor) arms no timer: there `yield_if_due` yields only
    /// for a latency class.
    ///
    /// The tick is a signal to the worker thread, with `SA_RESTART`: most system calls it
    /// interrupts restart, but those `signal(7)` never restarts (`poll`, `epoll_wait`,
    /// `nanosleep`, timed futex waits, ...) fail with `EINTR`. xtc's own calls retry; blocking
    /// code a task runs on a worker with preemption on must retry `EINTR` too.
    pub fn set_preempt(&self, interval: Duration) -> Result<()> {
        self.shared
            .preempt_ns
            .store(interval.as_nanos().min(u64::MAX as u128) as u64, SeqCst);
        if cfg!(target_os = "linux") {
            Ok(())
        } else {
            Err(Error::Unsupported(
                "per-thread CPU-time timers (timer_create with CLOCK_THREAD_CPUTIME_ID): leave \
                 the interval at 0 (XTC_PREEMPT=0); latency classes still make yield_if_due \
                 yield",
            ))
        }
    }

    /// The real-time signal of the loops' preemption timers ([`Builder::preempt_signal`];
    /// `SIGRTMIN+1` unless set). Cost: a field read.
    pub fn preempt_signal(&self) -> i32 {
        self.shared.preempt_signal()
    }

    /// The real-time signal that interrupts the blocking pool's cancelled jobs, one per process
    /// ([`Builder::interrupt_signal`]; `SIGRTMIN+2` unless set). Reading it fixes nothing.
    /// Cost: an atomic load.
    pub fn interrupt_signal(&self) -> i32 {
        crate::io::blocking::interrupt_signal_now()
    }

    /// The preemption interval (zero: off). Cost: an atomic load. Kept in whole nanoseconds in
    /// 64 bits: an interval set above `u64::MAX` ns (about 584 years, "never" in practice) reads
    /// back as that, not as the `Duration` given.
    pub fn preempt(&self) -> Duration {
        Duration::from_nanos(self.shared.preempt_ns.load(Relaxed))
    }

    /// Arms the stall watchdog on every loop (zero disarms): a task poll that keeps its loop
    /// longer than `budget` is reported. Cost when armed: one clock read per task poll (the
    /// CPU's time-stamp counter where the CPU and the kernel trust it, about 12 ns with the
    /// difference; else a `clock_gettime`); when not, one branch per poll on a value read once
    /// per turn. Takes effect at the next turn. Default: zero (off), or
    /// [`Builder::stall_budget`] / `XTC_STALL_BUDGET`; read back per loop with
    /// [`stall_budget`](Self::stall_budget).
    /// Cost of the call: one atomic store per loop, O(shards).
    pub fn set_stall_budget(&self, budget: Duration) {
        for l in &self.shared.loops {
            l.stall.budget_ns.store(duration_ns(budget), SeqCst);
        }
    }

    /// Arms the stall watchdog on loop `shard` only (zero disarms), as
    /// [`set_stall_budget`](Self::set_stall_budget) does for every loop. `Err(InvalidShard)` out
    /// of range. Cost of the call: an atomic store.
    pub fn set_loop_stall_budget(&self, shard: usize, budget: Duration) -> Result<()> {
        self.shared
            .shard(shard)?
            .stall
            .budget_ns
            .store(duration_ns(budget), SeqCst);
        Ok(())
    }

    /// The stall budget of loop `shard` (zero: the watchdog is off there), as
    /// [`set_stall_budget`](Self::set_stall_budget) or
    /// [`set_loop_stall_budget`](Self::set_loop_stall_budget) left it. Kept in whole
    /// nanoseconds in 64 bits: a budget above `u64::MAX` ns reads back as that.
    /// `Err(InvalidShard)` out of range. Cost: an atomic load.
    pub fn stall_budget(&self, shard: usize) -> Result<Duration> {
        let ns = self.shared.shard(shard)?.stall.budget_ns.load(SeqCst);
        Ok(Duration::from_nanos(ns))
    }

    /// Installs the stall report sink of loop `shard`, called on that loop after the stalling
    /// poll. Without one, reports go to `tracing::warn!` (task name, spawn site, time held).
    /// The callback is dropped with the `Executor` (at once, if that is already gone), so it
    /// may hold a `Handle`. Replaces (and drops) the loop's previous callback.
    /// `Err(InvalidShard)` out of range. Cost: one `Arc` allocation and a lock of the loop's
    /// callback slot (which the loop takes to report a stall).
    pub fn set_stall_callback<F>(&self, shard: usize, f: F) -> Result<()>
    where
        F: Fn(&crate::StallReport) + Send + Sync + 'static,
    {
        let old = lock(&self.shared.shard(shard)?.stall.callback).replace(Arc::new(f));
        // Installed after the `Executor` was dropped (no run can come to call it): dropped at
        // once, or a callback holding a `Handle` kept the executor alive in a cycle. SeqCst,
        // paired with `close`'s store-then-drop: one of the two sees the other. Before the
        // old one's drop, whose panic would skip it.
        if self.shared.closed.load(SeqCst) {
            self.shared.drop_stall_callbacks();
        }
        // Dropped after the lock: the old callback's captured state is user code, which may
        // install a callback itself (it waited on this thread's own lock for good). Guarded,
        // as the loops and `close` drop theirs.
        crate::task::guarded("a stall callback panicked while being dropped", || {
            drop(old)
        });
        Ok(())
    }

    /// Stalls reported on loop `shard` so far (also after `run()` returns); 0 for a shard that
    /// does not exist (`loop_stats(shard)?.stalls` is the same count, with
    /// `Err(InvalidShard)` out of range). Cost: an atomic load.
    pub fn stall_count(&self, shard: usize) -> u64 {
        self.shared
            .loops
            .get(shard)
            .map_or(0, |l| l.stall.count.load(Relaxed))
    }

    /// Work stealing on or off. Off, no loop takes another loop's queued migratable tasks; a
    /// migratable task still moves to the loop whose task wakes it (steal protocol rule 1),
    /// which pinned ones never do. Default on (`XTC_STEALING`). Cost when on: idle loops scan victims before parking and,
    /// while migratable tasks exist, wake on the idle tick. Takes effect at once, from any thread.
    /// Cost of the call: an atomic store and a wake ping (an eventfd write) to each sleeping
    /// loop, so idle loops re-read the policy.
    pub fn set_stealing(&self, on: bool) {
        self.shared.stealing.store(on, SeqCst);
        // Idle loops re-read the policy now, not at their next wake.
        self.shared.unpark_all();
    }

    /// Whether stealing is on. Cost: an atomic load.
    pub fn stealing(&self) -> bool {
        self.shared.stealing()
    }

    /// Eager rebalance: a loop whose run queue is empty steals before it blocks even if it owns
    /// parked tasks or timers, and queuing a migratable task pings one idle peer that may steal
    /// it (none while stealing is off). Off, a loop steals only when fully idle: no timer and
    /// no parked pinned task. A parked migratable task does not hold its last loop back (its
    /// wake may send it to any loop, and counting it per loop would cost two shared updates per
    /// park and wake of every migratable task). Trades cross-loop migration (cache and NUMA cost) and
    /// wake-ups for using idle capacity under partial load. Default off (`XTC_EAGER_REBALANCE`). Takes effect at once, from any thread.
    /// Cost of the call: an atomic store and a wake ping to each sleeping loop.
    pub fn set_eager_rebalance(&self, on: bool) {
        self.shared.eager_rebalance.store(on, SeqCst);
        // Idle loops re-read the policy now, not at their next wake.
        self.shared.unpark_all();
    }

    /// Whether eager rebalance is on. Cost: an atomic load.
    pub fn eager_rebalance(&self) -> bool {
        self.shared.eager_rebalance()
    }

    /// Steal backoff: an idle loop that found nothing for several ticks grows its idle poll
    /// from 1 ms toward 32 ms; any work resets it. Cuts idle-scan CPU of a mostly idle executor
    /// for up to 32 ms more latency before a deeply idle loop notices stealable work. Default off
    /// (`XTC_STEAL_BACKOFF`). Cost of the call: an atomic store and a wake ping to each
    /// sleeping loop.
    pub fn set_steal_backoff(&self, on: bool) {
        self.shared.steal_backoff.store(on, SeqCst);
        // Idle loops re-read the policy now, not at their next wake.
        self.shared.unpark_all();
    }

    /// Whether steal backoff is on. Cost: an atomic load.
    pub fn steal_backoff(&self) -> bool {
        self.shared.steal_backoff()
    }

    /// NUMA sensitivity, HPX's levels: 0 every loop may steal across NUMA nodes (nearest node
    /// first); 1 only the first loop of each node does; 2 never across nodes. Default 1
    /// (`XTC_NUMA_SENSITIVITY`). `Err(InvalidArgument)` above 2 (the setting is then
    /// unchanged). Cost: an atomic store and a wake ping to each sleeping loop (victim orders
    /// are precomputed by `build()`).
    pub fn set_numa_sensitivity(&self, level: u8) -> Result<()> {
        if level > 2 {
            return Err(Error::InvalidArgument(format!(
                "numa_sensitivity {level} is not 0, 1 or 2"
            )));
        }
        self.shared.numa_sensitivity.store(level as u32, SeqCst);
        // Idle loops re-read the policy now, not at their next wake.
        self.shared.unpark_all();
        Ok(())
    }

    /// The NUMA sensitivity level. Cost: an atomic load.
    pub fn numa_sensitivity(&self) -> u8 {
        self.shared.numa_sensitivity.load(Relaxed) as u8
    }

    /// A victim must have at least this many queued tasks to be stolen from (HPX's
    /// `min_tasks_to_steal`), except after 16 short looks in a row or on a thief's first steal
    /// after a wake by new migratable work (not by a knob setter's ping). Default 0
    /// (`XTC_MIN_TASKS_TO_STEAL`). Higher keeps small bursts local. Cost of the call: an atomic
    /// store and a wake ping to each sleeping loop.
    pub fn set_min_tasks_to_steal(&self, n: usize) {
        self.shared.min_tasks_to_steal.store(n as u64, SeqCst);
        // Idle loops re-read the policy now, not at their next wake.
        self.shared.unpark_all();
    }

    /// The steal threshold. Cost: an atomic load.
    pub fn min_tasks_to_steal(&self) -> usize {
        self.shared.min_tasks_to_steal()
    }

    /// Sends `make` to `shard`, runs the future it returns there, and resolves to its output.
    /// Callable from any thread: off the executor's loops the message goes through the target's
    /// inbox (from a loop, prefer [`crate::shard::submit_to`], which uses the ring mesh and its
    /// backpressure).
    ///
    /// Unlike [`crate::shard::submit_to`], the message is queued by this call, as
    /// [`spawn_on`](Handle::spawn_on) queues, not at the first poll; dropping the returned
    /// future detaches the task. Queued while no `run()` is in progress, or once the target
    /// loop has finished its shutdown (a `run()` that is returning), it runs when the next one
    /// starts, and the future waits for that.
    ///
    /// `Err(InvalidShard)` out of range, `Err(Join)` if it panicked there, `Err(Stopped)` if
    /// the task is dropped before it finishes: the target loop's shutdown (after `stop()`, or
    /// at the end of a `block_on`) drops it, or the `Executor` is dropped with the task still
    /// queued. Cost: as
    /// [`spawn_on`](Handle::spawn_on) plus one wake of the awaiting task.
    #[track_caller]
    pub fn submit_to<F, Fut>(
        &self,
        shard: usize,
        make: F,
    ) -> impl Future<Output = Result<Fut::Output>> + Send + 'static
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let h = self.spawn_on(shard, make);
        async move { crate::shard::join_result(h?.unshared().await) }
    }

    /// Runs `make` on every shard (the closure is cloned once per shard) and collects the
    /// outputs in shard order: [`crate::shard::submit_to_all`] (Seastar's `invoke_on_all`)
    /// for any thread. Every call is queued by this call, as [`submit_to`](Handle::submit_to)
    /// queues each, so they run concurrently; dropping the returned future detaches them.
    /// Each element is what `submit_to` to that shard gives (`Err(Join)` for a call that
    /// panicked there, `Err(Stopped)` for one a stop dropped). Cost: a `submit_to` per
    /// shard, a clone of `make` each, and the output `Vec`.
    #[track_caller]
    pub fn submit_to_all<F, Fut>(
        &self,
        make: F,
    ) -> impl Future<Output = Vec<Result<Fut::Output>>> + Send + 'static
    where
        F: FnOnce() -> Fut + Clone + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        // A loop, not an iterator's closure: `#[track_caller]` passes the caller's location
        // on to each task's spawn site only through direct calls.
        let mut calls = Vec::with_capacity(self.shard_count());
        for i in 0..self.shard_count() {
            calls.push(self.submit_to(i, make.clone()));
        }
        async move {
            let mut out = Vec::with_capacity(calls.len());
            for call in calls {
                out.push(call.await);
            }
            out
        }
    }

    /// [`submit_to_all`](Handle::submit_to_all) of a fallible call, flattened, for any
    /// thread: [`crate::shard::try_submit_to_all`]. `Ok` with every shard's value in shard
    /// order, or the first failure in shard order (the call's own error, or xtc's converted by
    /// `E: From<xtc::Error>`), once every call has finished. Cost: `submit_to_all`'s.
    #[track_caller]
    pub fn try_submit_to_all<F, Fut, T, E>(
        &self,
        make: F,
    ) -> impl Future<Output = std::result::Result<Vec<T>, E>> + Send + 'static
    where
        F: FnOnce() -> Fut + Clone + Send + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let all = self.submit_to_all(make);
        async move { crate::shard::first_failure(all.await) }
    }

    /// Fire-and-forget: queues `make` to run on `shard` and returns once it is queued (as
    /// [`spawn_on`](Handle::spawn_on): between runs, it runs when the next `run()` starts).
    /// `Err(InvalidShard)` out of range, `Err(Stopped)` once the `Executor` is dropped, and
    /// the errors of `spawn_on` (a stopping loop's `Drop`, a poisoned shard).
    /// Cost: as `spawn_on`.
    ///
    /// Order: what one plain thread sends to one shard this way starts in the order sent (the
    /// target's inbox is FIFO), and so does what one loop's tasks send (the ring from that
    /// loop, as [`crate::shard::send_to`]). Nothing is promised between the two paths: not
    /// against what the shards send each other over the ring mesh, and not for a loop thread
    /// whose loop is hidden meanwhile (the `Drop`s of another executor's tasks that a task
    /// drops, or that another executor's `run` ends inside a task: sent from there, a message
    /// goes to the target's inbox, which the target takes before its rings, so it may start
    /// before what that thread's tasks sent earlier).
    #[track_caller]
    pub fn send_to<F, Fut>(&self, shard: usize, make: F) -> Result<()>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.spawn_on(shard, make).map(drop)
    }

    /// A lock-free snapshot of loop `shard`'s counters, readable while running and after
    /// `run()` returns. `Err(InvalidShard)` out of range. Cost: as
    /// described on [`LoopStats`] (atomic loads, two atomic maximums and a clock read, no
    /// lock).
    pub fn loop_stats(&self, shard: usize) -> Result<LoopStats> {
        let l = self.shared.shard(shard)?;
        Ok(l.stats.snapshot(
            l.steal.stolen_from.load(Relaxed),
            l.stall.count.load(Relaxed),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
            Arc,
        },
        time::Duration,
    };

    use crate::event_loop::status;

    /// Adds one to its counter when dropped.
    struct CountDrop(Arc<AtomicUsize>);

    impl Drop for CountDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    /// Two shards, oversubscribed so they run on any machine.
    fn two_shards() -> super::Executor {
        two_shards_with(|b| b)
    }

    /// [`two_shards`] with more knobs set by `knobs`.
    fn two_shards_with(knobs: impl FnOnce(crate::Builder) -> crate::Builder) -> super::Executor {
        knobs(super::Executor::builder().shards(2).oversubscribe(true))
            .build()
            .unwrap()
    }

    /// Puts `hook` in `slot`, to run the first time the coordinator calls it.
    fn set_once(
        slot: &crate::sync::Mutex<Option<super::TestHook>>,
        hook: impl FnOnce() + Send + 'static,
    ) {
        let hook = std::sync::Mutex::new(Some(hook));
        *crate::sync::lock(slot) = Some(super::TestHook(Box::new(move || {
            if let Some(h) = hook.lock().unwrap().take() {
                h();
            }
        })));
    }

    /// Runs `hook` the first time the coordinator is about to close on a quiescent verdict.
    fn before_closing_once(exec: &super::Executor, hook: impl FnOnce() + Send + 'static) {
        set_once(&exec.handle.shared.before_closing, hook);
    }

    /// Removes the hook: it may hold a `Handle`, a cycle through the executor until it goes.
    fn clear_before_closing(exec: &super::Executor) {
        *crate::sync::lock(&exec.handle.shared.before_closing) = None;
    }

    /// Two shards (as [`two_shards`]) with a deadlock grace of `ms` milliseconds.
    fn two_shards_with_grace(ms: u64) -> super::Executor {
        two_shards_with(|b| b.deadlock_grace(Some(Duration::from_millis(ms))))
    }

    /// Runs `hook` the first time the coordinator is about to close on a deadlock verdict.
    fn before_deadlock_close_once(exec: &super::Executor, hook: impl FnOnce() + Send + 'static) {
        set_once(&exec.handle.shared.before_deadlock_close, hook);
    }

    /// Removes the deadlock-close hook (as [`clear_before_closing`]).
    fn clear_before_deadlock_close(exec: &super::Executor) {
        *crate::sync::lock(&exec.handle.shared.before_deadlock_close) = None;
    }

    /// Service mode switched on (its setter returned) while the coordinator closes on a
    /// quiescent verdict: the close takes the verdict back and `run()` waits for `stop()`.
    /// It used to read service mode only before the check, and `run()` returned as quiescent.
    /// (From a review.)
    #[test]
    fn service_mode_switched_on_while_closing_keeps_run_going() {
        let exec = two_shards();
        let handle = exec.handle();
        // The stopper waits for the hook (a stop before the quiescent verdict, on a slow
        // start, ended the run before the hook ran).
        let (acted_tx, acted_rx) = std::sync::mpsc::channel();
        before_closing_once(&exec, move || {
            handle.set_service_mode(true);
            let _ = acted_tx.send(());
        });
        exec.spawn_on(1, || async {}).unwrap();
        let stopped = Arc::new(AtomicBool::new(false));
        let (h, s) = (exec.handle(), stopped.clone());
        let stopper = std::thread::spawn(move || {
            let _ = acted_rx.recv_timeout(Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(300));
            s.store(true, SeqCst);
            h.stop();
        });
        exec.run().unwrap();
        let by_stop = stopped.load(SeqCst);
        stopper.join().unwrap();
        clear_before_closing(&exec);
        assert!(exec.service_mode());
        assert!(
            by_stop,
            "run() ended as quiescent although service mode was on"
        );
    }

    /// A loop that left the last run showing EMPTY (a stop landing just after an idle tick:
    /// planted here) must not look idle while its first turn of the next run works: the
    /// coordinator saw every loop EMPTY with balanced counts and stopped the run under a task.
    #[test]
    fn a_stale_idle_status_from_the_last_run_is_not_quiescence() {
        let exec = two_shards();
        for _ in 0..3 {
            let finished = Arc::new(AtomicBool::new(false));
            let f = finished.clone();
            exec.spawn_on(1, move || async move {
                // A long first poll, then a wait that ends the turn, where a stop would
                // cancel the task.
                std::thread::sleep(Duration::from_millis(300));
                crate::time::sleep(Duration::from_millis(5)).await;
                f.store(true, SeqCst);
            })
            .unwrap();
            // Loop 0 goes EMPTY (and pokes the coordinator) while loop 1 is in that poll.
            exec.spawn_on(0, || crate::time::sleep(Duration::from_millis(50)))
                .unwrap();
            for ls in &exec.handle.shared.loops {
                ls.status.store(1 << 2 | status::EMPTY, SeqCst);
            }
            exec.run().unwrap();
            assert!(
                finished.load(SeqCst),
                "run() returned while the task was alive"
            );
        }
    }
    /// A coordinator that panics (a bug in xtc; the hook stands for it) stops and joins the
    /// loops before `run()` unwinds: they were left running, detached, and a later `run()`
    /// could drive the same loops on second threads.
    #[test]
    fn a_panicking_coordinator_joins_the_loops_before_run_unwinds() {
        let exec = two_shards_with_grace(20);
        let tid = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let t = tid.clone();
        // Parked for good: a deadlock suspect, so the coordinator reaches the hook.
        exec.spawn_on(1, move || async move {
            // SAFETY: gettid takes no arguments and touches no memory.
            t.store(unsafe { libc::gettid() } as i64, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
        before_deadlock_close_once(&exec, || panic!("a coordinator bug"));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exec.run()));
        clear_before_deadlock_close(&exec);
        assert!(
            r.is_err(),
            "the coordinator's panic did not reach run()'s caller"
        );
        let tid = tid.load(SeqCst);
        assert_ne!(tid, 0, "the task never ran");
        // A joined thread's task may linger in /proc for a moment (the join returns once the
        // thread cleared its id, before the kernel releases it); a thread left running stays.
        let task = std::path::PathBuf::from(format!("/proc/self/task/{tid}"));
        let limit = std::time::Instant::now() + Duration::from_secs(10);
        while task.exists() && std::time::Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !task.exists(),
            "shard 1's thread still runs after run() unwound"
        );
    }

    /// A migratable task woken from a foreign thread while the coordinator closes on a
    /// deadlock verdict (the hook wakes it between the grace period's end and the close) is
    /// not reported and dropped: the wake came before the decision, so the coordinator takes
    /// the verdict back and the task runs to its end. A pinned task's foreign wake moves its
    /// loop's inbox count, which the close's snapshot sees; a migratable one's went into an
    /// injector, which no snapshot showed, and unless the woken loop had published its new
    /// epoch first, `run()` returned `Err(Deadlock)` naming the task it had just woken.
    #[test]
    fn a_migratable_wake_racing_the_deadlock_close_is_not_lost() {
        let exec = two_shards_with_grace(50);
        let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
        let woken = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (w, d) = (woken.clone(), done.clone());
        let _task = exec.spawn(async move {
            let mut sent = false;
            std::future::poll_fn(|cx| {
                if w.load(SeqCst) {
                    return std::task::Poll::Ready(());
                }
                if !sent {
                    sent = true;
                    tx.send(cx.waker().clone()).unwrap();
                }
                std::task::Poll::Pending
            })
            .await;
            d.store(true, SeqCst);
        });
        before_deadlock_close_once(&exec, move || {
            let waker = rx.recv().unwrap();
            woken.store(true, SeqCst);
            waker.wake();
        });
        let r = exec.run();
        clear_before_deadlock_close(&exec);
        assert!(r.is_ok(), "the woken task was reported deadlocked: {r:?}");
        assert!(done.load(SeqCst), "the woken task did not run to its end");
    }

    /// The deadlock grace switched off (its setter returned) while the
    /// coordinator closes on a deadlock verdict takes the verdict back, as service mode
    /// switched on does: `run()` waits for `stop()` and reports nothing (it reported the deadlock and
    /// dropped the tasks; found by the Handle audit of stop 49).
    #[test]
    fn grace_switched_off_while_closing_on_a_deadlock_takes_the_verdict_back() {
        let exec = two_shards_with_grace(50);
        exec.spawn_on(1, std::future::pending::<()>).unwrap();
        let handle = exec.handle();
        // The stopper waits for the hook (a stop before the deadlock verdict, on a slow
        // start, ended the run before the hook ran).
        let (acted_tx, acted_rx) = std::sync::mpsc::channel();
        before_deadlock_close_once(&exec, move || {
            handle.set_deadlock_grace(None);
            let _ = acted_tx.send(());
        });
        let h = exec.handle();
        let stopper = std::thread::spawn(move || {
            let _ = acted_rx.recv_timeout(Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(500));
            h.stop();
        });
        let r = exec.run();
        clear_before_deadlock_close(&exec);
        stopper.join().unwrap();
        assert_eq!(exec.deadlock_grace(), None);
        assert!(
            r.is_ok(),
            "reported although the grace was off before the close: {r:?}"
        );
    }

    /// A pinned spawn from a foreign thread that races the quiescent stop (queued, and run,
    /// while the coordinator is between its verdict and the stop; the hook widens that
    /// window) is not cancelled: the coordinator sees the loop leave idle and takes its
    /// verdict back, and the task runs to its end in this run. It used to be polled, park on
    /// its sleep, and be dropped by the stop.
    #[test]
    fn a_spawn_racing_the_quiescent_stop_is_not_cancelled() {
        let exec = two_shards();
        let handle = exec.handle();
        let done = Arc::new(AtomicBool::new(false));
        let joined = Arc::new(std::sync::Mutex::new(None));
        let (d, j) = (done.clone(), joined.clone());
        before_closing_once(&exec, move || {
            let h = handle
                .spawn_on(0, move || async move {
                    // Longer than the hook's wait: still parked when the coordinator decides.
                    crate::time::sleep(Duration::from_millis(200)).await;
                    d.store(true, SeqCst);
                })
                .unwrap();
            *j.lock().unwrap() = Some(h);
            // Time for loop 0 to wake, take the task and park it on its sleep.
            std::thread::sleep(Duration::from_millis(50));
        });
        exec.spawn_on(1, || async {}).unwrap();
        exec.run().unwrap();
        clear_before_closing(&exec);
        let h = joined.lock().unwrap().take().expect("the hook ran");
        assert!(
            futures::executor::block_on(h).is_ok(),
            "the racing task was cancelled by the stop"
        );
        assert!(done.load(SeqCst));
    }

    /// A spawn a running loop sends to a peer that has finished its shutdown but still holds
    /// its ring ends (past its last drain, not yet given back: widened here by a hook) is kept
    /// for the peer's next run, as it is once the peer gave its ends back. The sender's
    /// shutdown found the ring's consumer still taken, waited only for a backlog, and left the
    /// spawn in the ring, where `run()`'s sweep (`Mesh::drop_queued`) dropped it unrun.
    #[test]
    fn a_spawn_left_in_the_ring_of_a_peer_still_leaving_is_kept_for_its_next_run() {
        let exec = two_shards();
        let peer_leaving = Arc::new(AtomicBool::new(false));
        let sender_left = Arc::new(AtomicBool::new(false));
        let (p, l) = (peer_leaving.clone(), sender_left.clone());
        *crate::sync::lock(&exec.handle.shared.after_shutdown) =
            Some(Arc::new(super::TestHook(Box::new(move || {
                if crate::shard::try_id() == Some(0) {
                    l.store(true, SeqCst);
                    return;
                }
                p.store(true, SeqCst);
                // Shard 1 keeps its ring ends until shard 0 has left, or for a while: a
                // sender that waits for them (as it should) is not held for good.
                let t = std::time::Instant::now();
                while !l.load(SeqCst) && t.elapsed() < Duration::from_millis(500) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }))));
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        exec.spawn_on(0, move || async move {
            crate::shard::stop();
            // Shard 1 shuts down while this poll keeps shard 0 busy.
            while !peer_leaving.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Sent before shard 0's own shutdown began: a running task's spawn, onto ring
            // 0 -> 1.
            let h = crate::shard::handle().unwrap();
            drop(
                h.spawn_on(1, move || async move { r.store(true, SeqCst) })
                    .unwrap(),
            );
        })
        .unwrap();
        exec.run().unwrap();
        *crate::sync::lock(&exec.handle.shared.after_shutdown) = None;
        assert!(!ran.load(SeqCst), "shard 1 had stopped");
        exec.run().unwrap();
        assert!(
            ran.load(SeqCst),
            "the spawn sent before the sender's shutdown did not run in the next run"
        );
    }

    /// A run that fails to start (shard 1 not pinned) runs nothing: the tasks queued for it,
    /// pinned and migratable, on every shard, stay queued and run in the next run. Shard 0's
    /// loop started at once and, stopped by the failure, dropped them.
    #[test]
    fn a_run_that_fails_to_start_keeps_the_queued_work_for_the_next() {
        let exec = two_shards();
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut handles = Vec::new();
        for shard in [0, 1, 0] {
            let r = ran.clone();
            handles.push(
                exec.spawn_on(shard, move || async move {
                    crate::time::sleep(Duration::from_millis(10)).await;
                    r.fetch_add(1, SeqCst);
                })
                .unwrap(),
            );
        }
        let r = ran.clone();
        let migratable = exec.spawn(async move {
            r.fetch_add(1, SeqCst);
        });
        exec.handle.shared.fail_pin.store(1, SeqCst);
        let failed = exec.run();
        assert!(
            matches!(failed, Err(crate::Error::Numa(_))),
            "expected the pin failure, got {failed:?}"
        );
        assert_eq!(ran.load(SeqCst), 0, "a loop ran work in a run that failed");
        exec.handle.shared.fail_pin.store(usize::MAX, SeqCst);
        exec.run().unwrap();
        assert_eq!(
            ran.load(SeqCst),
            4,
            "queued work was lost with the failed run"
        );
        for h in handles {
            futures::executor::block_on(h).unwrap();
        }
        futures::executor::block_on(migratable).unwrap();
    }

    /// A stop asked before a run that then fails to start (shard 1 not pinned) is kept for
    /// the next run, as the queued work is: that run stops at once and drops the work. The
    /// failed run used to clear the stop, so the next one ran what the stop was to drop.
    #[test]
    fn a_stop_is_kept_across_a_run_that_fails_to_start() {
        let exec = two_shards();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let h = exec
            .spawn_on(1, move || async move { r.store(true, SeqCst) })
            .unwrap();
        exec.stop();
        exec.handle.shared.fail_pin.store(1, SeqCst);
        let failed = exec.run();
        assert!(
            matches!(failed, Err(crate::Error::Numa(_))),
            "expected the pin failure, got {failed:?}"
        );
        exec.handle.shared.fail_pin.store(usize::MAX, SeqCst);
        exec.run().unwrap();
        assert!(!ran.load(SeqCst), "the stop was lost with the failed run");
        assert!(futures::executor::block_on(h).unwrap_err().is_cancelled());
        // Consumed by that run: the next one runs what is queued.
        let r = ran.clone();
        exec.spawn_on(0, move || async move { r.store(true, SeqCst) })
            .unwrap();
        exec.run().unwrap();
        assert!(ran.load(SeqCst));
    }

    /// A `block_on` whose run fails to start (shard 0 not pinned) leaves its main task in
    /// shard 0's inbox. That task must neither run in a later run (its closure is the caller's,
    /// who got the `Err`) nor stop that later run when it is dropped there.
    #[test]
    fn a_failed_block_on_leaves_nothing_to_run_or_stop_a_later_run() {
        let exec = two_shards();
        exec.handle.shared.fail_pin.store(0, SeqCst);
        let main_ran = Arc::new(AtomicBool::new(false));
        let m = main_ran.clone();
        let failed = exec.block_on(move || async move { m.store(true, SeqCst) });
        assert!(
            matches!(failed, Err(crate::Error::Numa(_))),
            "expected the pin failure, got {failed:?}"
        );
        exec.handle.shared.fail_pin.store(usize::MAX, SeqCst);
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        exec.spawn_on(1, move || async move {
            crate::time::sleep(Duration::from_millis(100)).await;
            f.store(true, SeqCst);
        })
        .unwrap();
        exec.run().unwrap();
        assert!(
            !main_ran.load(SeqCst),
            "the failed block_on's main future ran later"
        );
        assert!(
            finished.load(SeqCst),
            "the later run stopped under a live task"
        );
    }

    /// A shard thread that dies before it reports its pinning (a panic there, in the pinning
    /// or in a tracing subscriber handling its event: planted here) fails the start as a pin
    /// failure does: no loop runs, `run()` returns an error, and the queued work stays for
    /// the next run. The closed channel was taken for "every thread reported": the gate
    /// opened, the other loop ran, and `run()` waited for good on the dead loop's BUSY status.
    #[test]
    fn a_shard_thread_dying_before_it_reports_fails_the_start() {
        let exec = two_shards();
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut handles = Vec::new();
        for shard in [0, 1] {
            let r = ran.clone();
            handles.push(
                exec.spawn_on(shard, move || async move {
                    r.fetch_add(1, SeqCst);
                })
                .unwrap(),
            );
        }
        exec.handle.shared.panic_pin.store(1, SeqCst);
        let handle = exec.handle();
        let failed = std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let exec = &exec;
            s.spawn(move || {
                let _ = tx.send(exec.run());
            });
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(r) => Ok(r),
                Err(_) => {
                    // Hung: stop it, so the test fails instead of hanging.
                    handle.stop();
                    let _ = rx.recv_timeout(Duration::from_secs(60));
                    Err(())
                }
            }
        });
        exec.handle.shared.panic_pin.store(usize::MAX, SeqCst);
        let failed = failed.expect("run() hung after a shard thread died before it started");
        assert!(failed.is_err(), "the start did not fail: {failed:?}");
        assert_eq!(ran.load(SeqCst), 0, "a loop ran work in a run that failed");
        exec.run().unwrap();
        assert_eq!(
            ran.load(SeqCst),
            2,
            "queued work was lost with the failed run"
        );
        for h in handles {
            futures::executor::block_on(h).unwrap();
        }
    }
    /// Where a pinned task's probe says it was polled or dropped on a thread not its own.
    struct OwnThread {
        home: std::thread::ThreadId,
        wrong: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl OwnThread {
        fn check(&self) {
            if std::thread::current().id() != self.home {
                self.wrong.fetch_add(1, SeqCst);
            }
        }
    }

    impl Drop for OwnThread {
        fn drop(&mut self) {
            self.check();
        }
    }

    /// A loop whose shutdown a panic cut short (a bug in xtc, planted here) leaves its parked
    /// tasks alive. Their futures may be `!Send`: a wake that routes one to the loop's inbox
    /// later must neither run it in a later run (on that run's new thread) nor drop it on the
    /// thread that frees the executor. Both happened: later runs went on, and the executor's
    /// drop cancelled what the inbox held.
    #[test]
    fn a_shutdown_cut_short_leaks_its_loops_tasks_and_refuses_later_runs() {
        cut_short(false);
    }

    /// As above, the wake sent by shard 0's shutdown (dropping a task that wakes shard 1's on
    /// drop) through the ring to shard 1: shard 0's evacuation (or the run's sweep of the
    /// rings) dropped it on its own thread.
    #[test]
    fn a_wake_sent_through_a_ring_to_a_loop_whose_shutdown_was_cut_short_is_leaked() {
        cut_short(true);
    }

    struct WakeOnDrop(Option<std::task::Waker>);

    impl Drop for WakeOnDrop {
        fn drop(&mut self) {
            if let Some(w) = self.0.take() {
                w.wake();
            }
        }
    }

    /// Spawns on shard 1 a `!Send` task that parks for good, leaving its waker in `slot`;
    /// each poll or drop of it off shard 1's thread counts in `wrong` ([`OwnThread`]).
    fn park_a_probe_on_shard_1(
        exec: &super::Executor,
        wrong: &Arc<std::sync::atomic::AtomicUsize>,
        slot: &Arc<std::sync::Mutex<Option<std::task::Waker>>>,
    ) -> crate::JoinHandle<()> {
        let (w, s) = (wrong.clone(), slot.clone());
        exec.spawn_on(1, move || async move {
            let probe = OwnThread {
                home: std::thread::current().id(),
                wrong: w,
            };
            // `!Send`, as a pinned task's future may be.
            let _rc = std::rc::Rc::new(());
            futures::future::poll_fn(|cx| {
                probe.check();
                *s.lock().unwrap() = Some(cx.waker().clone());
                std::task::Poll::<()>::Pending
            })
            .await;
        })
        .unwrap()
    }

    /// Shard 1's shutdown panics with a `!Send` task of its parked; it is then woken by shard
    /// 0's shutdown (`in_shutdown`) or from this thread after the run.
    fn cut_short(in_shutdown: bool) {
        let exec = two_shards();
        let wrong = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slot = Arc::new(std::sync::Mutex::new(None::<std::task::Waker>));
        drop(park_a_probe_on_shard_1(&exec, &wrong, &slot));
        let s = slot.clone();
        exec.spawn_on(0, move || async move {
            while s.lock().unwrap().is_none() {
                crate::time::sleep(Duration::from_millis(1)).await;
            }
            let _wake = WakeOnDrop(s.lock().unwrap().clone().filter(|_| in_shutdown));
            crate::stop();
            std::future::pending::<()>().await;
        })
        .unwrap();
        exec.handle.shared.panic_shutdown.store(1, SeqCst);
        // The panic's message is logged on this thread too (`log_shard_panic`), as the error
        // says: the loop's own events carry none.
        let (levels, seen) = crate::test_log::Levels::new();
        let ran = tracing::subscriber::with_default(levels, || exec.run());
        exec.handle.shared.panic_shutdown.store(usize::MAX, SeqCst);
        assert!(
            matches!(ran, Err(crate::Error::ShardPanicked(_))),
            "the planted panic was not reported: {ran:?}"
        );
        assert_eq!(seen[2].load(SeqCst), 1, "errors logged by run()'s thread");
        if !in_shutdown {
            // Routed to shard 1's inbox: this thread is no worker.
            slot.lock().unwrap().take().expect("parked").wake();
        }
        let again = exec.run();
        assert!(
            matches!(again, Err(crate::Error::ShardPanicked(_))),
            "a later run was not refused: {again:?}"
        );
        drop(exec);
        assert_eq!(
            wrong.load(SeqCst),
            0,
            "shard 1's task was polled or dropped off its loop's thread"
        );
    }

    /// Shard 1's shutdown panics (planted) with a `!Send` task U parked; a plain thread then
    /// wakes U (its `Runnable` goes to shard 1's inbox, which is leaked). A Drop that shard 0's
    /// shutdown runs polls U's join handle once: `ring::drop_awaited_kept` must leave the
    /// poisoned loop's inbox alone (it took U's wake out and dropped U on shard 0's thread).
    #[test]
    fn a_shutdown_drops_wait_leaves_a_poisoned_loops_inbox_alone() {
        let exec = two_shards();
        let shared = exec.handle.shared.clone();
        let wrong = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slot = Arc::new(std::sync::Mutex::new(None::<std::task::Waker>));
        let u = park_a_probe_on_shard_1(&exec, &wrong, &slot);
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        struct PollOnDrop(Option<crate::JoinHandle<()>>, std::sync::mpsc::Receiver<()>);
        impl Drop for PollOnDrop {
            fn drop(&mut self) {
                let _ = self.1.recv_timeout(Duration::from_secs(20));
                let mut j = self.0.take().unwrap();
                let _ = futures::executor::block_on(futures::future::poll_immediate(&mut j));
                std::mem::forget(j);
            }
        }
        let s = slot.clone();
        exec.spawn_on(0, move || async move {
            while s.lock().unwrap().is_none() {
                crate::time::sleep(Duration::from_millis(1)).await;
            }
            let _g = PollOnDrop(Some(u), go_rx);
            crate::stop();
            std::future::pending::<()>().await;
        })
        .unwrap();
        let sl = slot.clone();
        let waker_thread = std::thread::spawn(move || {
            let t = std::time::Instant::now();
            while !shared.loops[1].poisoned.load(SeqCst) && t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Shard 1's `Core` gives its ring ends back after the poison.
            std::thread::sleep(Duration::from_millis(100));
            sl.lock().unwrap().take().expect("parked").wake();
            let _ = go_tx.send(());
        });
        exec.handle.shared.panic_shutdown.store(1, SeqCst);
        let ran = exec.run();
        exec.handle.shared.panic_shutdown.store(usize::MAX, SeqCst);
        waker_thread.join().unwrap();
        assert!(
            matches!(ran, Err(crate::Error::ShardPanicked(_))),
            "{ran:?}"
        );
        assert_eq!(
            wrong.load(SeqCst),
            0,
            "shard 1's !Send task was dropped off its loop's thread (by drop_awaited_kept)"
        );
        std::mem::forget(exec);
    }

    /// Once a loop is poisoned (its shutdown panicked, planted here), no run can come to take
    /// a new task: a spawn to it (`spawn_on`, `submit_to`, `send_to`) and a `block_on` are
    /// refused with `ShardPanicked`. Accepted, the spawn was queued in the poisoned loop's
    /// inbox, which is leaked, not dropped: its closure (and what it held) was never freed,
    /// its `JoinHandle` never resolved. A healthy shard still takes spawns, dropped with the
    /// executor.
    #[test]
    fn a_poisoned_loop_refuses_new_work_rather_than_leak_it() {
        let exec = two_shards();
        exec.spawn_on(1, std::future::pending::<()>).unwrap();
        exec.spawn_on(0, || async {
            crate::time::sleep(Duration::from_millis(5)).await;
            crate::stop();
        })
        .unwrap();
        exec.handle.shared.panic_shutdown.store(1, SeqCst);
        let ran = exec.run();
        exec.handle.shared.panic_shutdown.store(usize::MAX, SeqCst);
        assert!(
            matches!(ran, Err(crate::Error::ShardPanicked(_))),
            "{ran:?}"
        );
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = CountDrop(dropped.clone());
        let refused = exec.spawn_on(1, move || async move { drop(d) });
        assert!(
            matches!(refused, Err(crate::Error::ShardPanicked(_))),
            "spawn_on to a poisoned loop: {:?}",
            refused.map(drop)
        );
        assert_eq!(dropped.load(SeqCst), 1, "the refused closure was kept");
        let h = exec.handle();
        assert!(matches!(
            h.send_to(1, || async {}),
            Err(crate::Error::ShardPanicked(_))
        ));
        let call = futures_lite::future::block_on(h.submit_to(1, || async { 1 }));
        assert!(
            matches!(call, Err(crate::Error::ShardPanicked(_))),
            "{call:?}"
        );
        let d = CountDrop(dropped.clone());
        let main = exec.block_on(move || async move { drop(d) });
        assert!(
            matches!(main, Err(crate::Error::ShardPanicked(_))),
            "{main:?}"
        );
        assert_eq!(dropped.load(SeqCst), 2, "block_on's closure was kept");
        let d = CountDrop(dropped.clone());
        let kept = exec.spawn_on(0, move || async move { drop(d) }).unwrap();
        drop(exec);
        assert_eq!(
            dropped.load(SeqCst),
            3,
            "the healthy shard's spawn was not dropped"
        );
        assert!(kept.is_finished());
    }

    /// A loop whose shutdown panics (planted) while its backlog holds the wake of a task
    /// parked on another shard: that wake goes to the other shard's inbox, whose shutdown
    /// drops the task, and `run()` returns `ShardPanicked`. Leaked, the wake never came, the
    /// other shard's shutdown waited for its registered task for good, and `run()` hung.
    #[test]
    fn a_cut_short_shutdown_hands_a_peers_wake_to_the_peer() {
        use std::sync::Mutex;
        let exec = two_shards_with(|b| b.ring_capacity(1));
        let slot = Arc::new(Mutex::new(None::<std::task::Waker>));
        let holding = Arc::new(AtomicBool::new(false));
        let one = exec.handle.shared.loops[1].clone();
        let s = slot.clone();
        // T: parks on shard 0, registered there.
        exec.spawn_on(0, move || async move {
            futures::future::poll_fn(|cx| {
                *s.lock().unwrap() = Some(cx.waker().clone());
                std::task::Poll::<()>::Pending
            })
            .await;
        })
        .unwrap();
        let (s, h) = (slot.clone(), holding.clone());
        exec.spawn_on(0, move || async move {
            while s.lock().unwrap().is_none() {
                crate::yield_now().await;
            }
            // Holds shard 0 (it drains nothing) until shard 1 is poisoned.
            h.store(true, SeqCst);
            let t0 = std::time::Instant::now();
            while !one.poisoned.load(SeqCst) && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .unwrap();
        let (s, h) = (slot.clone(), holding.clone());
        let handle = exec.handle();
        exec.spawn_on(1, move || async move {
            while !h.load(SeqCst) {
                crate::time::sleep(Duration::from_millis(1)).await;
            }
            // Fills the one-slot ring 1 -> 0, then wakes T: its `Runnable` goes to the backlog.
            handle.spawn_on(0, || async {}).unwrap();
            s.lock().unwrap().take().unwrap().wake();
            crate::stop();
        })
        .unwrap();
        exec.handle.shared.panic_shutdown.store(1, SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        let exec = Arc::new(exec);
        let e = exec.clone();
        std::thread::spawn(move || {
            let _ = tx.send(e.run());
        });
        let ran = rx.recv_timeout(Duration::from_secs(30));
        exec.handle.shared.panic_shutdown.store(usize::MAX, SeqCst);
        match ran {
            Ok(Err(crate::Error::ShardPanicked(_))) => {}
            Ok(other) => panic!("the planted panic was not reported: {other:?}"),
            Err(_) => panic!("run() never returned: shard 0 waited for a wake shard 1 leaked"),
        }
    }
}
