//! [`Builder`]: the initial configuration of an [`Executor`], from code or the environment.

use std::time::Duration;

use xtc_numa::{Policy, Topology};

use super::Executor;
use crate::{Error, Result};

/// Default spin-before-park: 20 µs of polling after a loop turn that did work, before parking.
/// Measured here (`scripts/bench --only stream`): a shard-to-shard stream over
/// `channel::shared` goes from ~14 M to ~30 M messages/s because neither side parks between
/// bursts, while an idle loop (a turn that ran nothing) never spins. Cost: up to 20 µs of CPU
/// after each burst of work, so a loop handling one message per millisecond spends ~2 % of its
/// CPU spinning. The spin yields the CPU (`sched_yield`) every 64 polls, so a thread sharing
/// the core (a client, another process) still runs. Set 0 to park at once.
pub const DEFAULT_SPIN_BEFORE_PARK: Duration = Duration::from_micros(20);

/// Default reply spin: how long a loop whose task awaits a `submit_to` reply from another
/// shard polls before it parks (once per wait of the call's join; with the spin-before-park
/// also due, the longer applies). Chosen above one wake-up of the target loop here (20–25 µs in
/// a VM) plus its run: with the target asleep a round trip then pays one wake-up, not two
/// (`scripts/bench --only rtt`, parked rows). Cost: up to 50 µs of CPU per cross-shard call
/// that finds its caller with nothing else to do, yielded to other threads every 64 polls;
/// nothing for loops that await no reply. Set 0 to park at once.
pub const DEFAULT_REPLY_SPIN: Duration = Duration::from_micros(50);

/// Longest spin-before-park (and reply spin) accepted (`Builder::spin_before_park`, `XTC_SPIN_BEFORE_PARK`;
/// `Handle::set_spin_before_park` clamps to it). A spinning loop counts as busy, so `run()`
/// returns up to one spin after the last task finished: a spin of centuries kept it, and the
/// deadlock report, from ever ending.
pub const MAX_SPIN_BEFORE_PARK: Duration = Duration::from_secs(1);

/// Default grace period before an all-parked executor is reported as deadlocked.
/// Long enough that a task waiting a moment on a foreign thread is no false alarm; a wait
/// longer than this on a thread of the program's own is reported (use
/// [`spawn_blocking`](crate::spawn_blocking), whose jobs count as work in flight, or a longer
/// grace).
pub const DEFAULT_DEADLOCK_GRACE: Duration = Duration::from_secs(5);

/// Configures and builds an [`Executor`].
///
/// ```
/// # use xtc_shards as xtc;
/// let exec = xtc::Executor::builder().shards(4).oversubscribe(true).build()?;
/// # Ok::<(), xtc::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "the builder must be built to be useful"]
pub struct Builder {
    pub(crate) shards: usize,
    pub(crate) oversubscribe: bool,
    pub(crate) placement: Policy,
    pub(crate) pin: bool,
    pub(crate) service_mode: bool,
    pub(crate) deadlock_grace: Option<Duration>,
    pub(crate) topology: Option<std::sync::Arc<Topology>>,
    pub(crate) ring_capacity: usize,
    pub(crate) spin_before_park: Duration,
    pub(crate) reply_spin: Duration,
    pub(crate) stealing: bool,
    pub(crate) eager_rebalance: bool,
    pub(crate) steal_backoff: bool,
    pub(crate) numa_sensitivity: u8,
    pub(crate) min_tasks_to_steal: usize,
    pub(crate) preempt: Duration,
    /// `None`: `SIGRTMIN+1`.
    pub(crate) preempt_signal: Option<i32>,
    /// `None`: the one the process has, `SIGRTMIN+2` unless an earlier build fixed another.
    pub(crate) interrupt_signal: Option<i32>,
    pub(crate) stall_budget: Duration,
    /// `None`: `XTC_IO` if set, else auto.
    pub(crate) io_driver: Option<crate::io::DriverChoice>,
    /// The placement and ring mesh inputs that came from the environment (`XTC_SHARDS=4096`,
    /// `XTC_RING_CAPACITY`, ...), named in the error when `build()` finds the placement
    /// impossible or the mesh too large; a setter called after [`env`](Builder::env) takes its
    /// variable off.
    pub(crate) placement_env: Vec<(&'static str, String)>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            shards: 0,
            oversubscribe: false,
            placement: Policy::Compact,
            pin: true,
            service_mode: false,
            deadlock_grace: Some(DEFAULT_DEADLOCK_GRACE),
            topology: None,
            ring_capacity: crate::ring::DEFAULT_RING_CAPACITY,
            spin_before_park: DEFAULT_SPIN_BEFORE_PARK,
            reply_spin: DEFAULT_REPLY_SPIN,
            stealing: true,
            eager_rebalance: false,
            steal_backoff: false,
            numa_sensitivity: xtc_numa::DEFAULT_NUMA_SENSITIVITY,
            min_tasks_to_steal: 0,
            preempt: Duration::ZERO,
            preempt_signal: None,
            interrupt_signal: None,
            stall_budget: Duration::ZERO,
            io_driver: None,
            placement_env: Vec::new(),
        }
    }
}

impl Builder {
    /// A builder with the defaults: one shard per allowed physical core, compact placement, no
    /// oversubscription, service mode off, deadlock grace 5 s (each setter names its default).
    /// Reads no environment variable (see [`from_env`](Self::from_env)), except `XTC_IO`, which
    /// `build()` reads unless [`io_driver`](Self::io_driver) is set. Cost: none (no allocation).
    pub fn new() -> Builder {
        Builder::default()
    }

    /// The defaults overridden by the `XTC_*` environment variables (see the crate docs'
    /// table). A variable holding a bad value is an `Err(Env)` naming it. Cost: as
    /// [`env`](Self::env).
    pub fn from_env() -> Result<Builder> {
        Builder::new().env()
    }

    /// Applies the `XTC_*` environment variables that are set (and not empty) on top of this
    /// builder; a setter called afterwards overrides them. `Err(Env)` naming the first
    /// variable whose value does not parse (or is out of range). Cost: 19 environment reads (each
    /// under std's environment lock) and two small allocations per variable that is set.
    pub fn env(mut self) -> Result<Builder> {
        if let Some(v) = var("XTC_SHARDS") {
            self.shards = v.trim().parse().map_err(|_| Error::Env {
                var: "XTC_SHARDS",
                value: v.clone(),
                expected: "a shard count (0 = one per allowed physical core)",
            })?;
            self.note_env("XTC_SHARDS", v);
        }
        if let Some(v) = var("XTC_PLACEMENT") {
            self.placement = v.trim().parse().map_err(|_| Error::Env {
                var: "XTC_PLACEMENT",
                value: v.clone(),
                expected: "compact, spread, or a list of CPU numbers and ranges such as \
                           cpus:0,2,4 or 0-3,8 (at most 65536 CPUs in a range and in all)",
            })?;
            self.note_env("XTC_PLACEMENT", v);
        }
        if let Some(v) = var("XTC_PIN") {
            self.pin = parse_bool("XTC_PIN", &v)?;
        }
        if let Some(v) = var("XTC_OVERSUBSCRIBE") {
            self.oversubscribe = parse_bool("XTC_OVERSUBSCRIBE", &v)?;
            self.note_env("XTC_OVERSUBSCRIBE", v);
        }
        if let Some(v) = var("XTC_SERVICE_MODE") {
            self.service_mode = parse_bool("XTC_SERVICE_MODE", &v)?;
        }
        if let Some(v) = var("XTC_DEADLOCK_GRACE") {
            self.deadlock_grace = parse_grace("XTC_DEADLOCK_GRACE", &v)?;
        }
        if let Some(v) = var("XTC_RING_CAPACITY") {
            self.ring_capacity = v
                .trim()
                .parse()
                .ok()
                .filter(|&n: &usize| n > 0 && n <= crate::ring::MAX_RING_CAPACITY)
                .ok_or_else(|| Error::Env {
                    var: "XTC_RING_CAPACITY",
                    value: v.clone(),
                    expected: "a number of messages per ring from 1 to 1048576",
                })?;
            self.note_env("XTC_RING_CAPACITY", v);
        }
        if let Some(v) = var("XTC_STEALING") {
            self.stealing = parse_bool("XTC_STEALING", &v)?;
        }
        if let Some(v) = var("XTC_EAGER_REBALANCE") {
            self.eager_rebalance = parse_bool("XTC_EAGER_REBALANCE", &v)?;
        }
        if let Some(v) = var("XTC_STEAL_BACKOFF") {
            self.steal_backoff = parse_bool("XTC_STEAL_BACKOFF", &v)?;
        }
        if let Some(v) = var("XTC_NUMA_SENSITIVITY") {
            self.numa_sensitivity =
                v.trim()
                    .parse()
                    .ok()
                    .filter(|&l: &u8| l <= 2)
                    .ok_or_else(|| Error::Env {
                        var: "XTC_NUMA_SENSITIVITY",
                        value: v.clone(),
                        expected: "0, 1 or 2",
                    })?;
        }
        if let Some(v) = var("XTC_MIN_TASKS_TO_STEAL") {
            self.min_tasks_to_steal = v.trim().parse().map_err(|_| Error::Env {
                var: "XTC_MIN_TASKS_TO_STEAL",
                value: v.clone(),
                expected: "a task count",
            })?;
        }
        if let Some(v) = var("XTC_PREEMPT") {
            self.preempt = parse_duration(&v).ok_or_else(|| Error::Env {
                var: "XTC_PREEMPT",
                value: v.clone(),
                expected: "a whole number with its unit, ns, us, ms or s, such as 1ms or \
                           500us, or 0 (off)",
            })?;
        }
        for (name, slot) in [
            ("XTC_PREEMPT_SIGNAL", &mut self.preempt_signal),
            ("XTC_INTERRUPT_SIGNAL", &mut self.interrupt_signal),
        ] {
            if let Some(v) = var(name) {
                *slot = Some(crate::sys::parse_rt_signal(&v).ok_or_else(|| Error::Env {
                    var: name,
                    value: v.clone(),
                    expected: "a real-time signal: SIGRTMIN+N or SIGRTMAX-N (RTMIN+N also \
                               works), or its number, from SIGRTMIN to SIGRTMAX",
                })?);
            }
        }
        if let Some(v) = var("XTC_STALL_BUDGET") {
            self.stall_budget = parse_duration(&v).ok_or_else(|| Error::Env {
                var: "XTC_STALL_BUDGET",
                value: v.clone(),
                expected: "a whole number with its unit, ns, us, ms or s, such as 10ms, or 0 \
                           (off)",
            })?;
        }
        if let Some(c) = io_choice_from_env()? {
            self.io_driver = Some(c);
        }
        if let Some(spin) = spin_from_env("XTC_REPLY_SPIN")? {
            self.reply_spin = spin;
        }
        if let Some(spin) = spin_from_env("XTC_SPIN_BEFORE_PARK")? {
            self.spin_before_park = spin;
        }
        Ok(self)
    }

    /// Records that placement or mesh input `var` came from the environment (or, with `None`,
    /// that a setter replaced it).
    fn note_env(&mut self, var: &'static str, value: impl Into<Option<String>>) {
        self.placement_env.retain(|(v, _)| *v != var);
        if let Some(value) = value.into() {
            self.placement_env.push((var, value));
        }
    }

    /// Number of shards (loops); 0 (the default) means one per allowed physical core, or with
    /// a CPU list ([`Policy::Cpus`]) one per listed CPU. "Allowed" is the affinity mask of the
    /// thread that calls `build()`, as `std::thread::available_parallelism` reads it: built
    /// on a pinned thread (inside an xtc shard's task, or on a thread the program pinned), the
    /// executor sees that thread's CPUs only, and more shards than those need
    /// [`oversubscribe`](Self::oversubscribe). On this machine's topology the default
    /// is capped by the cgroup's CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`, the
    /// smallest on the way up, rounded down, at least 1: `docker --cpus=2.5` gives at most 2
    /// shards), as `std::thread::available_parallelism` and tokio's default are; `build()` logs the cap
    /// (`tracing`, info). Cost: stores the value (`build()` checks it; with 0 it reads the
    /// quota, a few small files).
    pub fn shards(mut self, n: usize) -> Builder {
        self.shards = n;
        self.note_env("XTC_SHARDS", None);
        self
    }

    /// Allows more shards than allowed CPUs (default off); they then share CPUs evenly. Needed
    /// for 3+ shards on a 2-CPU machine, and for a CPU list ([`Policy::Cpus`]) that names a CPU
    /// twice. Cost: shards on one CPU time-slice through the OS scheduler. At most
    /// [`MAX_SHARDS_PER_CPU`](xtc_numa::MAX_SHARDS_PER_CPU) shards per allowed CPU; `build()`
    /// fails beyond that.
    pub fn oversubscribe(mut self, yes: bool) -> Builder {
        self.oversubscribe = yes;
        self.note_env("XTC_OVERSUBSCRIBE", None);
        self
    }

    /// How shards are placed on CPUs (default [`Policy::Compact`]). Cost: stores the policy
    /// (`build()` computes the placement).
    pub fn placement(mut self, policy: Policy) -> Builder {
        self.placement = policy;
        self.note_env("XTC_PLACEMENT", None);
        self
    }

    /// Whether each shard's thread is bound to the one CPU its placement gave it (default on).
    ///
    /// Off, every shard thread is bound to the placement's CPUs together and the OS scheduler
    /// moves shards among them, as Glommio's `Placement::Unbound` or Seastar's
    /// `--thread-affinity=0` do. Where the system refuses to set affinity (a seccomp filter),
    /// a shard thread instead keeps the CPUs it inherited, if every one is allowed (with a
    /// warning); pinned, such a run fails to start with an error saying to turn pinning off. Shard indices, per-shard state and the ring mesh are the same
    /// either way; stealing still tries victims in the placement's NUMA order. Use it when the
    /// shards' CPUs are shared with other busy threads (a load generator on the same cores, a
    /// container whose CPU quota is below its CPU count): a pinned shard cannot leave a CPU
    /// another thread holds, so its tasks wait for the OS's time slice there (4 ms at HZ=250),
    /// while an idle CPU next to it could have run them.
    ///
    /// Cost of turning it off: the cache and NUMA locality that pinning guarantees (a shard
    /// that migrates finds its caches cold), and `Placement`'s CPUs become where shards may
    /// run rather than where they do.
    pub fn pin(mut self, yes: bool) -> Builder {
        self.pin = yes;
        self
    }

    /// Starts in service mode (default off): `run()` ignores quiescence and returns only after
    /// `stop()`. Cost: stores the value.
    pub fn service_mode(mut self, on: bool) -> Builder {
        self.service_mode = on;
        self
    }

    /// Grace period before an all-parked executor is reported as deadlocked; `None` disables the
    /// report (an all-parked executor then waits forever, like tokio). Default 5 s. A zero
    /// grace is not "off": it reports as soon as two looks about a millisecond apart find the
    /// executor all-parked (`XTC_DEADLOCK_GRACE` refuses `0`; write `off`), and so does any
    /// grace of 1 ms or less (the looks are at least 1 ms apart). Cost: stores the value.
    pub fn deadlock_grace(mut self, grace: Option<Duration>) -> Builder {
        self.deadlock_grace = grace;
        self
    }

    /// Capacity of each ring of the cross-shard mesh, in messages (default 1024; must be
    /// between 1 and [`MAX_RING_CAPACITY`](crate::MAX_RING_CAPACITY), else `build()` fails).
    /// Cost: `N·(N−1)` rings of this many pointer-sized slots (plus about 768 bytes of
    /// bookkeeping each), allocated by `build()`, which fails if they and the N×N victim
    /// tables would take more than 4 GiB (lower this or the shard count). A full ring
    /// makes `submit_to` wait (backpressure).
    pub fn ring_capacity(mut self, messages: usize) -> Builder {
        self.ring_capacity = messages;
        self.note_env("XTC_RING_CAPACITY", None);
        self
    }

    /// Initial stealing setting (see `Handle::set_stealing`; default on).
    /// Cost: stores the value.
    pub fn stealing(mut self, on: bool) -> Builder {
        self.stealing = on;
        self
    }

    /// Initial eager rebalance (see `Handle::set_eager_rebalance`; default off).
    /// Cost: stores the value.
    pub fn eager_rebalance(mut self, on: bool) -> Builder {
        self.eager_rebalance = on;
        self
    }

    /// Initial steal backoff (see `Handle::set_steal_backoff`; default off).
    /// Cost: stores the value.
    pub fn steal_backoff(mut self, on: bool) -> Builder {
        self.steal_backoff = on;
        self
    }

    /// Initial NUMA sensitivity, 0, 1 or 2 (see `Handle::set_numa_sensitivity`; default 1;
    /// above 2 `build()` fails). Cost: stores the value.
    pub fn numa_sensitivity(mut self, level: u8) -> Builder {
        self.numa_sensitivity = level;
        self
    }

    /// Initial steal threshold (see `Handle::set_min_tasks_to_steal`; default 0).
    /// Cost: stores the value.
    pub fn min_tasks_to_steal(mut self, n: usize) -> Builder {
        self.min_tasks_to_steal = n;
        self
    }

    /// Initial preemption interval (see `Handle::set_preempt`, which also says which
    /// interrupted system calls of task code then fail with `EINTR`; default 0, off).
    /// Cost: stores the value.
    pub fn preempt(mut self, interval: Duration) -> Builder {
        self.preempt = interval;
        self
    }

    /// The real-time signal of the loops' CPU-time preemption timers (default `SIGRTMIN+1`,
    /// `libc::SIGRTMIN() + 1`; `XTC_PREEMPT_SIGNAL`). xtc installs its handler on it when a
    /// loop arms its timer (never over a handler the program installed), unblocks it on the
    /// worker threads, and sends it only to them; a signal sent to the whole process may land
    /// on a worker and be taken there, so a program that uses `SIGRTMIN+1` itself (through a
    /// handler, `signalfd` or `sigwait`) gives xtc another one here. `build()` refuses a
    /// signal outside `SIGRTMIN ..= SIGRTMAX`, or the blocking pool's interrupt signal (see
    /// [`interrupt_signal`](Self::interrupt_signal)). Cost: none until preemption is on.
    pub fn preempt_signal(mut self, signal: i32) -> Builder {
        self.preempt_signal = Some(signal);
        self
    }

    /// The real-time signal that interrupts a blocking-pool thread whose file operation was
    /// cancelled (epoll driver; default `SIGRTMIN+2`; `XTC_INTERRUPT_SIGNAL`). The pool is one
    /// per process, and so is this signal: the first executor built fixes it, the default
    /// where its builder named none (as does the pool's first use, by a
    /// [`LocalExecutor`](crate::LocalExecutor) say, at the default; a build refused for any
    /// reason fixes nothing), and `build()` refuses a later builder that asks for another (an
    /// `Err` naming the one in use), a signal outside `SIGRTMIN ..= SIGRTMAX`, or the
    /// preemption signal. The same
    /// rules as [`preempt_signal`](Self::preempt_signal) otherwise: xtc's handler goes only
    /// where the program has none, and a signal sent to the whole process may be taken by a
    /// pool thread. Cost: none.
    pub fn interrupt_signal(mut self, signal: i32) -> Builder {
        self.interrupt_signal = Some(signal);
        self
    }

    /// Initial stall budget of every loop (see `Handle::set_stall_budget`; default 0, off).
    /// Cost: stores the value.
    pub fn stall_budget(mut self, budget: Duration) -> Builder {
        self.stall_budget = budget;
        self
    }

    /// Initial spin-before-park time (see `Handle::set_spin_before_park`; default
    /// [`DEFAULT_SPIN_BEFORE_PARK`]). `build()` refuses more than [`MAX_SPIN_BEFORE_PARK`].
    /// Cost: stores the value.
    pub fn spin_before_park(mut self, spin: Duration) -> Builder {
        self.spin_before_park = spin;
        self
    }

    /// Initial reply spin (see `Handle::set_reply_spin`; default [`DEFAULT_REPLY_SPIN`]).
    /// `build()` refuses more than [`MAX_SPIN_BEFORE_PARK`]. Cost: stores the value.
    pub fn reply_spin(mut self, spin: Duration) -> Builder {
        self.reply_spin = spin;
        self
    }

    /// The I/O driver (default: `XTC_IO` if set, else [`DriverChoice::Auto`]: io_uring where it
    /// works, epoll otherwise). A forced io_uring that is unavailable makes `build()` fail with
    /// the reason; a loop whose own ring fails to set up later still runs epoll, with a warning
    /// (see [`DriverChoice::IoUring`](crate::io::DriverChoice::IoUring)). See [`crate::io`].
    /// Cost: stores the choice (`build()` probes io_uring once per process).
    ///
    /// [`DriverChoice::Auto`]: crate::io::DriverChoice::Auto
    pub fn io_driver(mut self, choice: crate::io::DriverChoice) -> Builder {
        self.io_driver = Some(choice);
        self
    }

    /// Places shards on this topology instead of the detected machine. With a synthetic or XML
    /// topology (a machine that is not this one) loops are **not pinned**: use it to exercise
    /// placement and victim orders of bigger machines, with oversubscription. Default: the
    /// machine's, detected by `build()`. Cost: one allocation (the topology moves into an
    /// `Arc`).
    pub fn topology(mut self, topology: Topology) -> Builder {
        self.topology = Some(std::sync::Arc::new(topology));
        self
    }

    /// Detects the topology (unless one was given), places the shards and creates the loops.
    /// No thread starts until `run()`.
    ///
    /// Errors: `Err(Numa)` if the topology cannot be detected (among other causes, an exported
    /// `HWLOC_XMLFILE` or `HWLOC_SYNTHETIC` that makes hwloc describe another machine, whose
    /// pins would silently do nothing: see `xtc_numa::Topology::detect`) or the placement is impossible
    /// (`Err(EnvPlacement)` naming the variables when some of its inputs came from
    /// [`env`](Self::env)); `Err(InvalidArgument)` for a ring capacity outside
    /// 1..=[`MAX_RING_CAPACITY`](crate::MAX_RING_CAPACITY), a spin or reply spin over
    /// [`MAX_SPIN_BEFORE_PARK`], a NUMA sensitivity above 2, a ring mesh over 4 GiB, a
    /// forced io_uring that is unavailable, a signal outside `SIGRTMIN..=SIGRTMAX`, the
    /// preemption and interrupt signals equal, or an interrupt signal other than the one the
    /// process already uses; `Err(Env)` for a bad `XTC_IO` when
    /// [`io_driver`](Self::io_driver) was not set; `Err(Io)` if a loop's wake-up eventfd cannot
    /// be created.
    ///
    /// Cost: one hwloc discovery unless a topology was given (reads sysfs; about a millisecond,
    /// tens on big machines); the ring mesh (`N·(N−1)` rings, see
    /// [`ring_capacity`](Self::ring_capacity)) and three N×N victim tables, allocated here; one
    /// eventfd per loop; unless the driver is epoll, the first build of the process also
    /// probes io_uring (a small ring set up and torn down, cached for the process).
    pub fn build(self) -> Result<Executor> {
        Executor::from_builder(self)
    }
}

/// The inputs of `env` (a builder's `placement_env`) accepted by `keep`, as `NAME=value`
/// separated by spaces, or `None` if there are none: for an error that their combination
/// caused, each being valid alone.
pub(crate) fn env_inputs(
    env: &[(&'static str, String)],
    keep: impl Fn(&str) -> bool,
) -> Option<String> {
    let vars: Vec<String> = env
        .iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (!vars.is_empty()).then(|| vars.join(" "))
}

/// Whether placement refusal `source` depends on placement input `var` (`list`: the policy is
/// a CPU list, whose length is the count when no count is set), so that an
/// [`Error::EnvPlacement`] names only the variables whose change can help: the policy plays no
/// part in a count refused for `compact` or `spread`, the ring capacity in none, and an empty
/// affinity mask in none of them (then the refusal is a plain [`Error::Numa`]).
pub(crate) fn refusal_depends_on(source: &xtc_numa::Error, list: bool, var: &str) -> bool {
    use xtc_numa::Error as E;
    let count = var == "XTC_SHARDS" || (list && var == "XTC_PLACEMENT");
    match source {
        E::TooManyShards { .. } => count || var == "XTC_OVERSUBSCRIBE",
        // Both need oversubscription on already: turned off, another refusal follows.
        E::OversubscribedTooFar { .. } | E::TooManyForVictims { .. } => count,
        E::CpuNotAllowed { .. } | E::TooManyOnOneCpu { .. } => var == "XTC_PLACEMENT",
        E::DuplicateCpu { .. } => var == "XTC_PLACEMENT" || var == "XTC_OVERSUBSCRIBE",
        E::CpuListLength { .. } => var == "XTC_PLACEMENT" || var == "XTC_SHARDS",
        _ => false,
    }
}

/// A spin duration (`XTC_SPIN_BEFORE_PARK`, `XTC_REPLY_SPIN`) from the environment: `None`
/// when unset, `Err(Env)` naming `name` when it does not parse or exceeds
/// [`MAX_SPIN_BEFORE_PARK`].
fn spin_from_env(name: &'static str) -> Result<Option<Duration>> {
    let Some(v) = var(name) else {
        return Ok(None);
    };
    parse_duration(&v)
        .filter(|d| *d <= MAX_SPIN_BEFORE_PARK)
        .map(Some)
        .ok_or(Error::Env {
            var: name,
            value: v,
            expected: "a duration of at most 1s, a whole number with its unit, ns, us, ms or \
                       s, such as 50us or 1ms, or 0",
        })
}

/// `XTC_IO`, if set: `auto`, `io_uring` or `epoll`.
pub(crate) fn io_choice_from_env() -> Result<Option<crate::io::DriverChoice>> {
    match var("XTC_IO") {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| Error::Env {
            var: "XTC_IO",
            value: v.clone(),
            expected: crate::io::DRIVER_CHOICES,
        }),
    }
}

/// Resolves the builder's (or the environment's) driver choice.
pub(crate) fn resolve_io(choice: Option<crate::io::DriverChoice>) -> Result<crate::io::Driver> {
    let choice = match choice {
        Some(c) => c,
        None => io_choice_from_env()?.unwrap_or_default(),
    };
    crate::io::resolve(choice).map_err(Error::InvalidArgument)
}

/// The value of variable `name`, if set and not empty (the crate docs: an empty variable leaves
/// the builder's value). A value of blanks only is returned, and no parser accepts it: an
/// `Err` naming the variable, as for any other bad value (it read as unset, and the builder's
/// value stood in silently). A value that is not UTF-8 comes back with its bad bytes replaced
/// by U+FFFD, which no parser accepts either: an `Err` naming the variable, not a silent
/// default (`std::env::var(..).ok()` read it as unset).
fn var(name: &'static str) -> Option<String> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(|v| v.to_string_lossy().into_owned())
}

fn parse_bool(name: &'static str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(Error::Env {
            var: name,
            value: v.to_string(),
            expected: "1/0, true/false, on/off or yes/no",
        }),
    }
}

/// Parses a duration such as `500ms`, `5s`, `250us`; a bare number only for 0 (no unit is assumed). (`off` is
/// not a duration: `parse_grace` takes it, for the one variable where it means something.)
fn parse_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    // Case-insensitive, as the crate docs say of every word a variable takes (`5MS`).
    match unit.trim().to_lowercase().as_str() {
        // A bare number only for zero: `XTC_DEADLOCK_GRACE=5`, meant as seconds beside the
        // documented "5 s" default, read as milliseconds and reported a task that waited on a
        // plain thread for 200 ms as deadlocked.
        "" if n == 0 => Some(Duration::ZERO),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        // The micro sign (U+00B5) or the Greek mu (U+03BC; its capital lowers to it).
        "us" | "\u{b5}s" | "\u{3bc}s" => Some(Duration::from_micros(n)),
        "ns" => Some(Duration::from_nanos(n)),
        _ => None,
    }
}

fn parse_grace(name: &'static str, v: &str) -> Result<Option<Duration>> {
    if v.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    // Zero is refused, not read as off: the other duration knobs read 0 as off, and a zero
    // grace reports a deadlock (dropping every parked task) about a millisecond after the
    // executor goes all-parked, so a task waiting on a plain thread ended the run.
    parse_duration(v)
        .filter(|d| !d.is_zero())
        .map(Some)
        .ok_or_else(|| Error::Env {
            var: name,
            value: v.to_string(),
            expected: "off (no report), or a positive whole number with its unit, ns, us, ms \
                       or s, such as 500ms or 5s",
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Every variable the builder reads (each is a string literal `"XTC_..."` in this file's
    /// code, above these tests) has its row in the crate docs' table, and every row names one
    /// it reads: the table is the one place the variables are documented, and a variable added
    /// to the code alone went unlisted.
    #[test]
    fn the_env_table_lists_exactly_the_variables_read() {
        // Names `open` starts and `close` ends, made of capitals and underscores.
        let names = |text: &str, open: &str, close: char| -> BTreeSet<String> {
            text.split(open)
                .skip(1)
                .filter_map(|rest| {
                    let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c == '_'))?;
                    (end > 0 && rest[end..].starts_with(close))
                        .then(|| format!("XTC_{}", &rest[..end]))
                })
                .collect()
        };
        let code = include_str!("builder.rs");
        let code = &code[..code.find("#[cfg(test)]\nmod tests").expect("this module")];
        let read = names(code, "\"XTC_", '"');
        let table: BTreeSet<String> = include_str!("../lib.rs")
            .lines()
            .filter(|l| l.starts_with("//! | `XTC_"))
            .flat_map(|l| names(l, "`XTC_", '`'))
            .collect();
        assert!(read.len() >= 19, "{read:?}");
        assert_eq!(
            read, table,
            "variables read (left) against the table's rows (right)"
        );
    }
}
