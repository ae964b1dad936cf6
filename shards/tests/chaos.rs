//! Randomized soak of the whole runtime: a seeded workload generator that mixes pinned,
//! `spawn_on` and migratable tasks (nested), join / detach / abort (local and from another task
//! or thread) at random points, `submit_to` / `send_to` / `submit_to_all` (some panicking),
//! shared and local channels with random capacities (ends dropped at random), short sleeps and
//! timeouts, `yield_now`, CPU work under `yield_if_due`, scheduling classes, a `ShardLocal`
//! value read on its shard and on every shard by `try_submit_to_all`, a little Unix and TCP I/O over loopback pairs, futures whose `Drop` panics or spawns, `Handle` calls from a
//! plain thread, calls into a second executor, hidden loops (a task drops, or runs with a stop,
//! a second executor whose queued tasks own payloads: their `Drop`s run with the task's loop
//! hidden, `context::off_loop`, and call `spawn_blocking`, send on a shared channel, block on
//! or drop a `JoinHandle` of a task on another shard, run a `LocalExecutor`, spawn through the
//! `Handle`, cancel a sleep of the hidden loop), and knob flips (stealing, eager rebalance,
//! steal backoff, minimum to steal, spin before park, service mode), on a 2–4 shard
//! oversubscribed executor with rings of 1 to 1,024 slots, sometimes preemption, a stall budget
//! and a short deadlock grace. One executor runs one to three rounds; each ends by quiescence
//! (`run()`), by `block_on` returning, or by `stop()` from a task or a thread at a random
//! moment. Tasks are queued between rounds, and after the last.
//!
//! What a seed asks for is deterministic (each task draws from its own generator, forked
//! from its parent's at spawn); the schedule is the OS's. After each round it checks: the
//! run returned in time (a hang names the seed and the unfinished tasks) and `Ok` (no false
//! deadlock report); no task completed twice, and at quiescence every task that was required
//! (not aborted, its call queued) completed; every channel received exactly a prefix of what
//! its sender sent successfully, all of it where the receiver drained to the end; no loop
//! keeps a live task, the roots' handles are resolved, and without any stop so far every ring
//! message sent was received. At the end every value the workload made (futures, messages,
//! `ShardLocal` values) is dropped with the executor, and handles of tasks left to it report
//! cancelled.
//!
//! The default test runs 64 seeds (about a second). More, e.g. 500 seeds from 1000, on epoll:
//! `XTC_IO=epoll XTC_CHAOS_SEEDS=1000..1500 cargo test -p xtc-shards --test chaos -- --nocapture`
//! (one seed: `XTC_CHAOS_SEEDS=1234`; `XTC_CHAOS_VERBOSE=1` prints each round's size).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicIsize, AtomicU32, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    task::{Context, Poll, Wake, Waker},
    time::{Duration, Instant},
};

use xtc_shards::{
    channel, shard, time, yield_now, Builder, Error, Executor, Handle, JoinHandle, LocalExecutor,
};

/// splitmix64: small, seedable, good enough to pick workloads.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
    fn dur(&mut self, max_us: u64) -> Duration {
        Duration::from_micros(self.below(max_us + 1))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Quiesce,
    BlockOn,
    StopTask,
    StopThread,
}

/// A value the workload made: counted while alive.
struct Live(Arc<AtomicIsize>);
impl Live {
    fn new(c: &Arc<AtomicIsize>) -> Live {
        c.fetch_add(1, SeqCst);
        Live(c.clone())
    }
}
impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

#[derive(Default)]
struct TaskRec {
    what: &'static str,
    /// Abort was asked for (completion optional) or the task panics on purpose.
    optional: bool,
    panics: bool,
}

#[derive(Default)]
struct ChanRec {
    kind: &'static str,
    sent_ok: Vec<u64>,
    received: Vec<u64>,
    saw_end: bool,
    drains: bool,
}

struct Soak {
    end: End,
    live: Arc<AtomicIsize>,
    budget: AtomicIsize,
    tasks: Mutex<Vec<TaskRec>>,
    done: Mutex<Vec<u32>>,
    chans: Mutex<Vec<ChanRec>>,
    errors: Mutex<Vec<String>>,
    stopping: AtomicBool,
    /// This executor's handle (for spawns from drops).
    handle: Option<Handle>,
    /// The other executor's handle while it runs (calls across executors).
    other: Mutex<Option<Handle>>,
    /// This round is the executor's current one (a task a later run ran does not stop it).
    active: AtomicBool,
    /// The round may be checked strictly (no stop kept from the last one).
    strict_ok: bool,
    /// No earlier round of this executor ended by a stop.
    no_stop_yet: bool,
    shards: usize,
    submits_started: AtomicU32,
    submits_done: AtomicU32,
    /// Hidden-loop actions this round may still take ([`hidden`]).
    hidden_left: AtomicIsize,
    /// Held by the one payload that blocks its (hidden) loop on a task of another loop: two
    /// loops each blocked on the other's task would wait for good (documented).
    blocker: AtomicBool,
    /// Payload drops that ran hidden, and blocking waits among them (`XTC_CHAOS_VERBOSE`).
    hidden_drops: AtomicU32,
    hidden_blocks: AtomicU32,
}

const MAGIC: u64 = 0x5eed_0000;
const PLANNED: &str = "chaos: planned panic";

impl Soak {
    fn new_task(&self, what: &'static str, panics: bool) -> usize {
        // Made on the other executor (one shard), which is stopped when this round ends.
        let on_other = shard::try_id().is_some() && shard::count() == 1;
        let mut t = self.tasks.lock().unwrap();
        t.push(TaskRec {
            what,
            optional: panics || on_other,
            panics,
        });
        self.done.lock().unwrap().push(0);
        t.len() - 1
    }
    fn optional(&self, id: usize) {
        self.tasks.lock().unwrap()[id].optional = true;
    }
    /// Queued for sure (a `send_to` that returned `Ok`, a `submit_to` closure that started).
    /// A task that completed already stays as it is.
    fn required(&self, id: usize) {
        if shard::try_id().is_some() && shard::count() == 1 {
            return;
        }
        let mut t = self.tasks.lock().unwrap();
        if !t[id].panics {
            t[id].optional = false;
        }
    }
    /// Required whatever thread asks (`required` skips a loop of a one-shard executor, which
    /// a second executor of [`hidden`] may be).
    fn must(&self, id: usize) {
        let mut t = self.tasks.lock().unwrap();
        if !t[id].panics {
            t[id].optional = false;
        }
    }
    fn complete(&self, id: usize) {
        self.done.lock().unwrap()[id] += 1;
    }
    fn error(&self, e: String) {
        self.errors.lock().unwrap().push(e);
    }
    /// Whether another task may be made (bounds each seed's work).
    fn take_budget(&self) -> bool {
        self.budget.fetch_sub(1, SeqCst) > 0
    }
    /// In modes where tasks may be dropped unfinished, outcomes other than success are legal.
    fn strict(&self) -> bool {
        matches!(self.end, End::Quiesce)
            && self.strict_ok
            && self.active.load(SeqCst)
            && !self.stopping.load(SeqCst)
    }
}

/// A child: its id, its handle, what to do with it, and the value it must give.
type Kid = (usize, JoinHandle<u64>, Fate, u64);

type BoxFut = Pin<Box<dyn Future<Output = u64> + Send>>;

#[derive(Clone, Copy, Debug)]
enum Fate {
    Await,
    Detach,
    Abort,
    /// Moved to a migratable task that aborts it after a short sleep, then awaits it.
    RemoteAbort,
    /// Moved to a pinned task on some shard that awaits it.
    RemoteAwait(usize),
}

/// `ShardLocal` values built and dropped, process-wide: equal once every executor is gone
/// (each loop's shutdown drops its run's values).
static LOCAL_BUILT: AtomicUsize = AtomicUsize::new(0);
static LOCAL_DROPPED: AtomicUsize = AtomicUsize::new(0);

/// A shard's value: which shard built it.
struct PerShard(usize);

impl Drop for PerShard {
    fn drop(&mut self) {
        LOCAL_DROPPED.fetch_add(1, SeqCst);
    }
}

static PER_SHARD: xtc_shards::ShardLocal<PerShard> = xtc_shards::ShardLocal::new(|shard| {
    LOCAL_BUILT.fetch_add(1, SeqCst);
    PerShard(shard)
});

/// A task body: a random script of operations, then its completion count and its value.
fn body(s: Arc<Soak>, id: usize, mut rng: Rng, depth: u32, pinned: bool) -> BoxFut {
    Box::pin(async move {
        let _live = Live::new(&s.live);
        // Panics if the future is dropped unfinished (an abort, a stop): user `Drop` code.
        let mut bomb = rng.chance(5).then(|| Bomb(true));
        let mut spawner = (rng.chance(10) && s.handle.is_some()).then(|| SpawnOnDrop {
            s: s.clone(),
            h: s.handle.clone().unwrap(),
            kind: rng.next(),
            armed: true,
        });
        let steps = 1 + rng.below(10);
        let mut kids: Vec<Kid> = Vec::new();
        let panics = s.tasks.lock().unwrap()[id].panics;
        for step in 0..steps {
            // Resolve a child at a random point.
            if !kids.is_empty() && rng.chance(30) {
                let k = rng.below(kids.len() as u64) as usize;
                let kid = kids.swap_remove(k);
                resolve(&s, kid).await;
            }
            let op = rng.below(if depth >= 3 { 5 } else { 22 });
            match op {
                0 => {
                    for _ in 0..rng.below(40) {
                        if rng.chance(50) {
                            yield_now().await;
                        } else {
                            time::sleep(Duration::ZERO).await;
                        }
                    }
                }
                1 => time::sleep(rng.dur(2000)).await,
                2 => {
                    let a = rng.dur(2000);
                    let b = rng.dur(3000);
                    let _ = time::timeout(a, time::sleep(b)).await;
                }
                3 => flip_knob(&mut rng),
                4 if s.end == End::StopTask
                    && rng.chance(3)
                    && s.active.load(SeqCst)
                    && shard::count() > 1 =>
                {
                    s.stopping.store(true, SeqCst);
                    shard::stop();
                }
                4 => yield_now().await,
                5..=7 => {
                    if let Some(kid) = spawn_child(&s, &mut rng, depth) {
                        kids.push(kid);
                    }
                }
                8 => submit(&s, &mut rng, depth).await,
                9 => {
                    if s.take_budget() {
                        let shard_n = rng.below(shard::count() as u64) as usize;
                        // Required once queued: this task may be aborted before.
                        let kid = s.new_task("send_to", false);
                        s.optional(kid);
                        let (s2, r2) = (s.clone(), rng.fork());
                        let f = shard::send_to(shard_n, move || body(s2, kid, r2, depth + 1, true));
                        if rng.chance(20) {
                            // Dropped unpolled or while it waits: never sent then.
                            if let Ok(Ok(())) = time::timeout(rng.dur(100), f).await {
                                s.required(kid);
                            }
                        } else if f.await.is_ok() {
                            s.required(kid);
                        } else if s.strict() {
                            s.error(format!("send_to({shard_n}) failed in task {id}"));
                        }
                    }
                }
                10 => {
                    let ran = Arc::new(AtomicUsize::new(0));
                    let r = ran.clone();
                    let l = Arc::new(Live::new(&s.live));
                    let out = shard::submit_to_all(move || {
                        let _l = &l;
                        r.fetch_add(1, SeqCst);
                        async move { shard::id() }
                    })
                    .await;
                    if out.len() != shard::count() {
                        s.error(format!("submit_to_all gave {} results", out.len()));
                    }
                    for (i, o) in out.iter().enumerate() {
                        match o {
                            Ok(v) if *v == i => {}
                            Ok(v) => s.error(format!("submit_to_all: shard {i} said {v}")),
                            Err(e) if s.strict() => s.error(format!("submit_to_all: {e}")),
                            Err(_) => {}
                        }
                    }
                }
                11 | 12 => shared_channel(&s, &mut rng, depth).await,
                13 => {
                    if let Some(kids2) = local_channel(&s, &mut rng) {
                        kids.extend(kids2);
                    }
                }
                14 => {
                    if let Some(kid) = io_pair(&s, &mut rng) {
                        kids.push(kid);
                    }
                }
                15 => cross(&s, &mut rng, depth).await,
                16 => {
                    // CPU work time-sliced by the preemption tick.
                    let until = Instant::now() + rng.dur(400);
                    while Instant::now() < until {
                        std::hint::spin_loop();
                        xtc_shards::yield_if_due().await;
                    }
                }
                17 => {
                    // A pinned child in a scheduling class of this loop.
                    if s.take_budget() {
                        let class = shard::create_class(
                            1 + rng.below(1000) as u32,
                            rng.chance(50)
                                .then(|| rng.dur(500) + Duration::from_micros(1)),
                        );
                        match class {
                            Ok(c) => {
                                let kid = s.new_task("class child", false);
                                let h = xtc_shards::task::Builder::new()
                                    .name("chaos")
                                    .class(c)
                                    .spawn_local(body(s.clone(), kid, rng.fork(), depth + 1, true));
                                kids.push((kid, h, Fate::Await, MAGIC ^ kid as u64));
                            }
                            Err(e) => s.error(format!("create_class: {e}")),
                        }
                    }
                }
                18 => {
                    if rng.chance(30) {
                        if let Ok(c) = shard::create_class(1 + rng.below(1000) as u32, None) {
                            if let Err(e) = shard::set_class(c) {
                                // A migratable task has no lane.
                                let _ = e;
                            }
                        }
                    }
                    yield_now().await;
                }
                19 => {
                    // This shard's value, then every shard's, by `try_submit_to_all`.
                    let here = PER_SHARD.get().0;
                    if here != shard::id() {
                        s.error(format!("shard {} got shard {here}'s value", shard::id()));
                    }
                    let all = shard::try_submit_to_all(|| async {
                        Ok::<_, xtc_shards::Error>(PER_SHARD.get().0)
                    })
                    .await;
                    match all {
                        Ok(v) if v == (0..shard::count()).collect::<Vec<_>>() => {}
                        Ok(v) => s.error(format!("try_submit_to_all gave {v:?}")),
                        Err(e) if s.strict() => s.error(format!("try_submit_to_all: {e}")),
                        Err(_) => {}
                    }
                }
                20 => kids.extend(hidden(&s, &mut rng, depth).await),
                _ => {
                    if pinned && shard::id() >= shard::count() {
                        s.error("shard id out of range".into());
                    }
                    yield_now().await;
                }
            }
            if panics && step + 1 == steps {
                if let Some(b) = bomb.as_mut() {
                    b.0 = false;
                }
                if let Some(sp) = spawner.as_mut() {
                    sp.armed = false;
                }
                s.complete(id);
                panic!("{PLANNED}");
            }
        }
        for kid in kids {
            resolve(&s, kid).await;
        }
        if let Some(b) = bomb.as_mut() {
            b.0 = false;
        }
        if let Some(sp) = spawner.as_mut() {
            sp.armed = false;
        }
        s.complete(id);
        MAGIC ^ id as u64
    })
}

fn resolve<'a>(s: &'a Arc<Soak>, kid: Kid) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
    Box::pin(resolve_inner(s, kid))
}

async fn resolve_inner(s: &Arc<Soak>, (kid, h, fate, expect): Kid) {
    let panics = s.tasks.lock().unwrap()[kid].panics;
    match fate {
        Fate::Detach => drop(h),
        Fate::Await => match h.await {
            Ok(v) if v == expect => {}
            Ok(v) => s.error(format!("task {kid} gave {v:#x}, expected {expect:#x}")),
            Err(e) if e.is_panic() && panics => {}
            Err(e) if s.strict() => s.error(format!("awaiting task {kid}: {e}")),
            Err(_) => {}
        },
        Fate::RemoteAbort => {
            let (s2, d) = (s.clone(), Duration::from_micros(kid as u64 * 37 % 1500));
            let l = Live::new(&s.live);
            drop(xtc_shards::spawn(async move {
                let _l = l;
                time::sleep(d).await;
                resolve(&s2, (kid, h, Fate::Abort, expect)).await;
            }));
        }
        Fate::RemoteAwait(n) => {
            let s2 = s.clone();
            let l = Live::new(&s.live);
            let spawned = shard::handle()
                .expect("on a loop")
                .spawn_on(n, move || async move {
                    let _l = l;
                    resolve(&s2, (kid, h, Fate::Await, expect)).await;
                });
            if let Err(e) = spawned {
                s.error(format!("spawn_on({n}) for a remote await: {e}"));
            }
        }
        Fate::Abort => {
            h.abort();
            match h.await {
                Ok(v) if v == expect => {}
                Ok(v) => s.error(format!("aborted task {kid} gave {v:#x}")),
                Err(e) if e.is_cancelled() || (e.is_panic() && panics) => {}
                Err(e) => s.error(format!("aborted task {kid}: {e}")),
            }
        }
    }
}

fn spawn_child(s: &Arc<Soak>, rng: &mut Rng, depth: u32) -> Option<Kid> {
    if !s.take_budget() {
        return None;
    }
    let fate = match rng.below(10) {
        0..=4 => Fate::Await,
        5..=6 => Fate::Detach,
        7 => Fate::Abort,
        8 => Fate::RemoteAwait(rng.below(shard::count() as u64) as usize),
        _ => Fate::RemoteAbort,
    };
    let panics = rng.chance(4);
    let kind = rng.below(3);
    let what = ["spawn_local", "spawn_on", "spawn"][kind as usize];
    let count = shard::count();
    let kid = s.new_task(what, panics);
    if matches!(fate, Fate::Abort | Fate::RemoteAbort) {
        s.optional(kid);
    }
    let r = rng.fork();
    let s2 = s.clone();
    let h = match kind {
        0 => shard::spawn_local(body(s2, kid, r, depth + 1, true)),
        1 => {
            let n = rng.below(count as u64) as usize;
            let h = shard::handle().expect("on a loop");
            match h.spawn_on(n, move || body(s2, kid, r, depth + 1, true)) {
                Ok(h) => h,
                Err(e) => {
                    s.optional(kid);
                    s.error(format!("spawn_on({n}): {e}"));
                    return None;
                }
            }
        }
        _ => xtc_shards::spawn(body(s2, kid, r, depth + 1, false)),
    };
    Some((kid, h, fate, MAGIC ^ kid as u64))
}

async fn submit(s: &Arc<Soak>, rng: &mut Rng, depth: u32) {
    if !s.take_budget() {
        return;
    }
    let n = rng.below(shard::count() as u64) as usize;
    let panics = rng.chance(15);
    // Required once its closure starts: this task may be aborted before it is sent.
    let kid = s.new_task("submit_to", panics);
    s.optional(kid);
    let (s2, r2) = (s.clone(), rng.fork());
    let fut = shard::submit_to(n, move || {
        s2.submits_started.fetch_add(1, SeqCst);
        s2.required(kid);
        if panics && r2.0 % 2 == 0 {
            // Panics in the closure itself, before any future exists.
            s2.complete(kid);
            panic!("{PLANNED}");
        }
        let s3 = s2.clone();
        let f = body(s2, kid, r2, depth + 1, true);
        async move {
            let v = f.await;
            s3.submits_done.fetch_add(1, SeqCst);
            v
        }
    });
    let res = if rng.chance(20) {
        time::timeout(rng.dur(1500), fut).await.ok()
    } else {
        Some(fut.await)
    };
    match res {
        None => s.optional(kid), // given up: may or may not run
        Some(Ok(v)) if v == MAGIC ^ kid as u64 => {}
        Some(Ok(v)) => s.error(format!("submit_to({n}) task {kid} gave {v:#x}")),
        Some(Err(Error::Join(e))) if e.is_panic() && panics => {}
        Some(Err(e)) => {
            s.optional(kid);
            if s.strict() {
                s.error(format!("submit_to({n}) task {kid}: {e}"));
            }
        }
    }
}

/// Calls into the other executor (running beside this one for the round), if any.
async fn cross(s: &Arc<Soak>, rng: &mut Rng, depth: u32) {
    let Some(hb) = s.other.lock().unwrap().clone() else {
        return;
    };
    if shard::count() == 1 || !s.take_budget() {
        return;
    }
    let kid = s.new_task("cross", false);
    s.optional(kid);
    let (s2, r2) = (s.clone(), rng.fork());
    let expect = MAGIC ^ kid as u64;
    let r = match rng.below(3) {
        0 => {
            hb.submit_to(0, move || body(s2, kid, r2, depth + 1, true))
                .await
        }
        1 => hb
            .spawn(body(s2, kid, r2, depth + 1, false))
            .await
            .map_err(Error::Join),
        _ => {
            // A channel into the other executor: it consumes, this task produces.
            let (mut tx, mut rx) =
                channel::shared::bounded::<Msg>(1 + rng.below(4) as usize).expect("capacity");
            let ch = new_chan(s, "cross", true);
            let s3 = s2.clone();
            let consumer = hb.spawn_on(0, move || async move {
                let _live = Live::new(&s3.live);
                while let Some(m) = rx.recv().await {
                    s3.chans.lock().unwrap()[ch].received.push(m.seq);
                }
                s3.chans.lock().unwrap()[ch].saw_end = true;
                s3.complete(kid);
                MAGIC ^ kid as u64
            });
            for seq in 0..rng.below(20) {
                let m = Msg {
                    chan: ch,
                    seq,
                    _live: Live::new(&s.live),
                };
                if tx.send(m).await.is_err() {
                    break;
                }
                s.chans.lock().unwrap()[ch].sent_ok.push(seq);
            }
            drop(tx);
            match consumer {
                Ok(j) => j.await.map_err(Error::Join),
                Err(e) => Err(e),
            }
        }
    };
    match r {
        Ok(v) if v == expect => {}
        Ok(v) => s.error(format!("cross task {kid} gave {v:#x}")),
        Err(e) if s.strict() => s.error(format!("cross task {kid}: {e}")),
        Err(_) => {}
    }
}

/// Hidden loops (`context::off_loop`): this task builds a second executor (1–2 shards),
/// queues on it a few tasks (`spawn_on`, `send_to`, `Handle::spawn`) whose closures or futures
/// own payloads, and ends it within this poll: dropped unrun (its sweep), or run, or
/// `block_on`, with a stop kept for it (or a main task that returns at once), then dropped.
/// Each payload's `Drop` ([`Act`]) runs with this loop hidden (a sweep, `run()`'s own last
/// one) or on a loop of the second executor (its shutdown, or its task). What they start is
/// accounted for: a job dropped once started under the hidden loop, which waits for it, and a
/// task spawned on the main executor are required; a channel's consumer drains to its end; a
/// sleep of this loop, cancelled from the drop, would hold a quiescent run for two minutes.
async fn hidden(s: &Arc<Soak>, rng: &mut Rng, depth: u32) -> Vec<Kid> {
    let mut kids = Vec::new();
    // On the main executor only (the other one has a single shard), a few per round.
    if shard::count() < 2 || s.hidden_left.fetch_sub(1, SeqCst) <= 0 || !s.take_budget() {
        return kids;
    }
    let (me, count) = (shard::id(), shard::count());
    let main = shard::handle().expect("on a loop");
    let other = match Builder::new()
        .shards(1 + rng.below(2) as usize)
        .oversubscribe(true)
        .ring_capacity([1, 16][rng.below(2) as usize])
        .build()
    {
        Ok(o) => o,
        Err(e) => {
            s.error(format!("hidden: build the second executor: {e}"));
            return kids;
        }
    };
    let oh = other.handle();
    let strict = s.strict();
    let (jtx, jrx) = std::sync::mpsc::channel();
    let mut acts = Vec::new();
    if rng.chance(40) {
        // A shared channel: a payload sends (room for all), a task anywhere consumes.
        let cap = 1 + rng.below(6);
        let (tx, rx) = channel::shared::bounded::<Msg>(cap as usize).expect("capacity");
        let ch = new_chan(s, "hidden", true);
        let cid = s.new_task("hidden consumer", false);
        let s2 = s.clone();
        let consumer: BoxFut = Box::pin(async move {
            let _live = Live::new(&s2.live);
            let mut rx = rx;
            while let Some(m) = rx.recv().await {
                s2.chans.lock().unwrap()[ch].received.push(m.seq);
            }
            s2.chans.lock().unwrap()[ch].saw_end = true;
            s2.complete(cid);
            MAGIC ^ cid as u64
        });
        let kind = rng.below(3);
        kids.push((
            cid,
            spawn_kind(kind, rng, consumer),
            Fate::Await,
            MAGIC ^ cid as u64,
        ));
        acts.push(Act::Send {
            tx,
            ch,
            n: rng.below(cap + 1),
            wait: rng.chance(50),
        });
    }
    for _ in 0..1 + rng.below(5) {
        let act = match rng.below(6) {
            0 | 1 => {
                let kid = s.new_task("hidden job", false);
                s.optional(kid);
                Act::Blocking {
                    kid,
                    us: rng.below(500),
                    keep: rng.chance(30).then(|| jtx.clone()),
                }
            }
            2 => {
                // A trivial task on another shard of this executor.
                let kid = s.new_task("hidden target", false);
                s.optional(kid);
                let n = (me + 1 + rng.below(count as u64 - 1) as usize) % count;
                let block = strict && rng.chance(60);
                // Sent now (a ring message whose ping waits for the end of this turn, or
                // which waits in this loop's backlog behind a full ring), or from the drop (an
                // inbox push).
                let target = if rng.chance(if block { 70 } else { 50 }) {
                    let s2 = s.clone();
                    match main.spawn_on(n, move || async move {
                        let _live = Live::new(&s2.live);
                        s2.complete(kid);
                        MAGIC ^ kid as u64
                    }) {
                        Ok(j) => {
                            s.required(kid);
                            Target::Sent(j)
                        }
                        Err(e) => {
                            s.error(format!("hidden: spawn_on({n}): {e}"));
                            continue;
                        }
                    }
                } else {
                    Target::Shard(n)
                };
                Act::Join { kid, target, block }
            }
            3 => {
                let kid = s.new_task("hidden local", false);
                s.optional(kid);
                Act::Local {
                    kid,
                    job: rng.below(3) as u8,
                }
            }
            4 => {
                if !s.take_budget() {
                    continue;
                }
                let kid = s.new_task("hidden spawn", false);
                s.optional(kid);
                Act::Spawn {
                    kid,
                    rng: rng.fork(),
                    depth: depth + 1,
                    on: rng.chance(50).then(|| rng.below(count as u64) as usize),
                }
            }
            _ => {
                // Registered on this loop now; the drop cancels it from elsewhere.
                let mut sl = Box::pin(time::sleep(Duration::from_secs(120)));
                let mut cx = Context::from_waker(Waker::noop());
                if sl.as_mut().poll(&mut cx).is_ready() {
                    s.error("hidden: a 120 s sleep was ready".into());
                }
                Act::Sleep(sl)
            }
        };
        acts.push(act);
    }
    drop(jtx);
    // The payloads, spread over a few tasks of the second executor.
    let groups_n = 1 + rng.below(3);
    let mut groups: Vec<Vec<Payload>> = (0..groups_n).map(|_| Vec::new()).collect();
    for act in acts {
        groups[rng.below(groups_n) as usize].push(Payload {
            s: s.clone(),
            act: Some(act),
            _live: Live::new(&s.live),
        });
    }
    let mut handles = Vec::new();
    for g in groups {
        let n = rng.below(oh.shard_count() as u64) as usize;
        let queued = match rng.below(4) {
            // The closure owns them.
            0 => oh
                .spawn_on(n, move || {
                    drop(g);
                    async {}
                })
                .map(Some),
            1 => oh
                .spawn_on(n, move || async move {
                    yield_now().await;
                    drop(g);
                })
                .map(Some),
            2 => oh
                .send_to(n, move || async move {
                    yield_now().await;
                    drop(g);
                })
                .map(|()| None),
            _ => Ok(Some(oh.spawn(async move {
                yield_now().await;
                drop(g);
            }))),
        };
        match queued {
            Ok(j) => handles.extend(j),
            Err(e) => s.error(format!("hidden: queue on the second executor: {e}")),
        }
    }
    // Ends it in this poll.
    let end = rng.below(6);
    let ran = match end {
        0..=2 => Ok(()),
        3 => {
            oh.stop();
            other.run()
        }
        4 => {
            oh.stop();
            match other.block_on(|| async { 7u32 }) {
                Ok(7) | Err(Error::Stopped) => Ok(()),
                Ok(v) => {
                    s.error(format!("hidden: block_on gave {v}"));
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
        _ => other.block_on(|| async { 7u32 }).map(|v| {
            if v != 7 {
                s.error(format!("hidden: block_on gave {v}"));
            }
        }),
    };
    if let Err(e) = ran {
        s.error(format!("hidden: the second executor's run ({end}): {e}"));
    }
    drop(other);
    for mut j in handles {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut j).poll(&mut cx) {
            Poll::Ready(Err(e)) if e.is_cancelled() => {}
            // Its main task returned at once: the others may have run first.
            Poll::Ready(Ok(())) if end == 5 => {}
            other => s.error(format!(
                "hidden: a task of the second executor (end {end}) gave {:?}",
                other.map(|r| r.map_err(|e| e.to_string()))
            )),
        }
    }
    // Jobs handed over by the payloads.
    let jobs: Vec<(usize, xtc_shards::task::SpawnBlocking<()>)> = jrx.try_iter().collect();
    drop(jrx);
    for (kid, job) in jobs {
        match job.await {
            Ok(()) => {}
            Err(e) if s.strict() => s.error(format!("hidden: kept job {kid}: {e}")),
            Err(_) => {}
        }
    }
    kids
}

/// What a payload's `Drop` does ([`hidden`]), where it runs: with the main loop hidden
/// (`shard::try_id()` is `None` there) or on a loop of the second executor.
enum Act {
    /// `spawn_blocking` a short job: its future dropped once the job started (the hidden loop
    /// counts it and waits for it: required then), or handed over (`keep`) to be awaited.
    Blocking {
        kid: usize,
        us: u64,
        keep: Option<std::sync::mpsc::Sender<(usize, xtc_shards::task::SpawnBlocking<()>)>>,
    },
    /// Sends `n` messages (the channel has room for all: never waits), then drops the sender.
    Send {
        tx: channel::shared::Sender<Msg>,
        ch: usize,
        n: u64,
        /// `futures::executor::block_on(send)` rather than `try_send`.
        wait: bool,
    },
    /// A trivial task on another shard of the main executor: its handle dropped, or, hidden
    /// in a strict round, blocked on (`futures::executor::block_on`).
    Join {
        kid: usize,
        target: Target,
        block: bool,
    },
    /// Hidden only (a loop running refuses it): a `LocalExecutor::block_on` that spawns and
    /// awaits; with `job` 1 it hands back a started `spawn_blocking` job, dropped (required:
    /// the hidden loop waits for it), with 2 it awaits one.
    Local { kid: usize, job: u8 },
    /// A task body spawned on the main executor through its `Handle` (on a shard, or
    /// migratable): required.
    Spawn {
        kid: usize,
        rng: Rng,
        depth: u32,
        on: Option<usize>,
    },
    /// A sleep registered on the main loop, cancelled by its drop from elsewhere.
    Sleep(Pin<Box<time::Sleep>>),
}

enum Target {
    /// Spawned by the task (`Handle::spawn_on` from a loop: a ring message).
    Sent(JoinHandle<u64>),
    /// To spawn from the drop, on this shard (an inbox push).
    Shard(usize),
}

struct Payload {
    s: Arc<Soak>,
    act: Option<Act>,
    _live: Live,
}

impl Drop for Payload {
    fn drop(&mut self) {
        let Some(act) = self.act.take() else { return };
        let s = &self.s;
        let hidden = shard::try_id().is_none();
        if hidden {
            s.hidden_drops.fetch_add(1, SeqCst);
        }
        match act {
            Act::Blocking { kid, us, keep } => {
                let (job, started) = blocking_job(s, kid, us);
                match keep {
                    Some(tx) => drop(tx.send((kid, job))),
                    None => {
                        // Dropped before it starts, a job never runs.
                        while !started.load(SeqCst) {
                            std::thread::yield_now();
                        }
                        drop(job);
                        if hidden {
                            s.must(kid);
                        }
                    }
                }
            }
            Act::Send {
                mut tx,
                ch,
                n,
                wait,
            } => {
                for seq in 0..n {
                    let m = Msg {
                        chan: ch,
                        seq,
                        _live: Live::new(&s.live),
                    };
                    let sent = if wait {
                        futures::executor::block_on(tx.send(m)).is_ok()
                    } else {
                        tx.try_send(m).is_ok()
                    };
                    if !sent {
                        break;
                    }
                    s.chans.lock().unwrap()[ch].sent_ok.push(seq);
                }
                drop(tx);
            }
            Act::Join { kid, target, block } => {
                let j = match target {
                    Target::Sent(j) => j,
                    Target::Shard(n) => {
                        let s2 = s.clone();
                        let spawned = s.handle.as_ref().unwrap().spawn_on(n, move || async move {
                            let _live = Live::new(&s2.live);
                            s2.complete(kid);
                            MAGIC ^ kid as u64
                        });
                        match spawned {
                            Ok(j) => {
                                s.must(kid);
                                j
                            }
                            Err(e) => {
                                s.error(format!("hidden: spawn_on({n}) from a drop: {e}"));
                                return;
                            }
                        }
                    }
                };
                // One blocked loop at a time, and only while the run cannot stop (a stopped
                // shard may leave the task queued for a next run that never comes).
                if block
                    && hidden
                    && s.strict()
                    && s.blocker
                        .compare_exchange(false, true, SeqCst, SeqCst)
                        .is_ok()
                {
                    s.hidden_blocks.fetch_add(1, SeqCst);
                    let r = futures::executor::block_on(j);
                    s.blocker.store(false, SeqCst);
                    match r {
                        Ok(v) if v == MAGIC ^ kid as u64 => {}
                        Ok(v) => s.error(format!("hidden: target {kid} gave {v:#x}")),
                        Err(e) => s.error(format!("hidden: blocked on target {kid}: {e}")),
                    }
                } else {
                    drop(j);
                }
            }
            Act::Local { kid, job } => {
                if !hidden {
                    return;
                }
                let ex = match LocalExecutor::new() {
                    Ok(ex) => ex,
                    Err(e) => {
                        s.error(format!("hidden: LocalExecutor::new: {e}"));
                        return;
                    }
                };
                let s2 = s.clone();
                let (v, back) = ex.block_on(async move {
                    let t = shard::spawn_local(async {
                        yield_now().await;
                        5u64
                    });
                    time::sleep(Duration::ZERO).await;
                    let v = t.await.map_or(0, |v| v + 2);
                    match job {
                        1 => (v, Some(blocking_job(&s2, kid, 200))),
                        2 => {
                            let (j, _) = blocking_job(&s2, kid, 200);
                            (v + j.await.map_or(100, |()| 0), None)
                        }
                        _ => (v, None),
                    }
                });
                drop(ex);
                if v != 7 {
                    s.error(format!("hidden: LocalExecutor block_on gave {v}"));
                }
                match back {
                    Some((job, started)) => {
                        while !started.load(SeqCst) {
                            std::thread::yield_now();
                        }
                        drop(job);
                        s.must(kid);
                    }
                    None if job == 2 => s.must(kid),
                    None => {}
                }
            }
            Act::Spawn {
                kid,
                rng,
                depth,
                on,
            } => {
                let h = s.handle.as_ref().unwrap();
                let r = match on {
                    Some(n) => {
                        let b = body(s.clone(), kid, rng, depth, true);
                        h.spawn_on(n, move || b)
                    }
                    None => Ok(h.spawn(body(s.clone(), kid, rng, depth, false))),
                };
                match r {
                    Ok(j) => {
                        s.must(kid);
                        drop(j);
                    }
                    Err(e) => s.error(format!("hidden: Handle spawn from a drop: {e}")),
                }
            }
            Act::Sleep(sl) => drop(sl),
        }
    }
}

/// A `spawn_blocking` job of `us` microseconds that completes `kid`, and its start flag.
fn blocking_job(
    s: &Arc<Soak>,
    kid: usize,
    us: u64,
) -> (xtc_shards::task::SpawnBlocking<()>, Arc<AtomicBool>) {
    let started = Arc::new(AtomicBool::new(false));
    let (st, s2) = (started.clone(), s.clone());
    let job = xtc_shards::spawn_blocking(move || {
        st.store(true, SeqCst);
        std::thread::sleep(Duration::from_micros(us));
        s2.complete(kid);
    });
    (job, started)
}

fn flip_knob(rng: &mut Rng) {
    let Some(h) = shard::handle() else { return };
    flip(&h, rng);
}

fn flip(h: &Handle, rng: &mut Rng) {
    match rng.below(5) {
        0 => h.set_stealing(rng.chance(70)),
        1 => h.set_eager_rebalance(rng.chance(50)),
        2 => h.set_steal_backoff(rng.chance(50)),
        3 => h.set_min_tasks_to_steal(rng.below(4) as usize),
        _ => h.set_spin_before_park([0, 20, 200][rng.below(3) as usize] * Duration::from_micros(1)),
    }
}

/// Spawns a task when dropped armed (a future dropped unfinished: an abort, a stop), from
/// wherever that drop runs: a loop, its shutdown, or `run()`'s sweep on the caller's thread.
struct SpawnOnDrop {
    s: Arc<Soak>,
    h: Handle,
    kind: u64,
    armed: bool,
}
impl Drop for SpawnOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let l = Live::new(&self.s.live);
        let fut = async move {
            let _l = l;
            yield_now().await;
        };
        let on_loop = shard::try_id().is_some();
        let n = self.kind as usize % self.s.shards;
        match self.kind % 5 {
            0 if on_loop => drop(xtc_shards::spawn(fut)),
            1 if on_loop => drop(shard::spawn_local(fut)),
            2 => drop(self.h.spawn_on(n, move || fut)),
            3 => drop(self.h.send_to(n, move || fut)),
            _ => drop(self.h.spawn(fut)),
        }
    }
}

/// Panics when dropped armed.
struct Bomb(bool);
impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 && !std::thread::panicking() {
            panic!("{PLANNED} (drop)");
        }
    }
}

struct Msg {
    chan: usize,
    seq: u64,
    _live: Live,
}

fn new_chan(s: &Soak, kind: &'static str, drains: bool) -> usize {
    let mut c = s.chans.lock().unwrap();
    c.push(ChanRec {
        kind,
        drains,
        ..Default::default()
    });
    c.len() - 1
}

/// A shared channel: this task produces, a child (anywhere) consumes; or the reverse.
async fn shared_channel(s: &Arc<Soak>, rng: &mut Rng, depth: u32) {
    if !s.take_budget() {
        return;
    }
    let cap = 1 + rng.below(8) as usize;
    let (tx, rx) = channel::shared::bounded::<Msg>(cap).expect("capacity");
    let drains = rng.chance(70);
    let ch = new_chan(s, "shared", drains);
    let count = rng.below(24);
    let stop_after = if drains {
        u64::MAX
    } else {
        rng.below(count + 1)
    };
    let reverse = rng.chance(30);
    // Inline in this task (which may be aborted), the consumer completes only with it.
    let kid = s.new_task("shared consumer", false);
    if reverse {
        s.optional(kid);
    }
    let mut crng = rng.fork();
    let s2 = s.clone();
    let consumer = async move {
        let _live = Live::new(&s2.live);
        let mut rx = rx;
        let mut got = 0;
        while got < stop_after {
            match rx.recv().await {
                Some(m) => {
                    if m.chan != ch {
                        s2.error(format!("chan {ch} got a message of chan {}", m.chan));
                    }
                    s2.chans.lock().unwrap()[ch].received.push(m.seq);
                    got += 1;
                }
                None => {
                    s2.chans.lock().unwrap()[ch].saw_end = true;
                    break;
                }
            }
            if crng.chance(20) {
                time::sleep(crng.dur(500)).await;
            }
        }
        drop(rx);
        s2.complete(kid);
        MAGIC ^ kid as u64
    };
    let kind = rng.below(3);
    let (h, prod): (JoinHandle<u64>, Option<_>) = if reverse {
        // The child produces, this task consumes.
        let prod_id = s.new_task("shared producer", false);
        let (s3, r3) = (s.clone(), rng.fork());
        let p = produce(s3, ch, tx, count, r3, prod_id);
        let h = spawn_kind(kind, rng, p);
        let v = consumer.await;
        let _ = v;
        (h, Some(prod_id))
    } else {
        let h = spawn_kind(kind, rng, Box::pin(consumer));
        let pid = s.new_task("shared producer (inline)", false);
        s.optional(pid);
        let _ = produce(s.clone(), ch, tx, count, rng.fork(), pid).await;
        (h, None)
    };
    let _ = depth;
    let (id, expect) = match prod {
        Some(p) => (p, MAGIC ^ p as u64),
        None => (kid, MAGIC ^ kid as u64),
    };
    resolve(s, (id, h, Fate::Await, expect)).await;
}

fn spawn_kind(kind: u64, rng: &mut Rng, f: BoxFut) -> JoinHandle<u64> {
    match kind {
        0 => shard::spawn_local(f),
        1 => {
            let n = rng.below(shard::count() as u64) as usize;
            let h = shard::handle().expect("on a loop");
            h.spawn_on(n, move || f).expect("spawn_on")
        }
        _ => xtc_shards::spawn(f),
    }
}

fn produce(
    s: Arc<Soak>,
    ch: usize,
    mut tx: channel::shared::Sender<Msg>,
    count: u64,
    mut rng: Rng,
    id: usize,
) -> BoxFut {
    Box::pin(async move {
        let _live = Live::new(&s.live);
        for seq in 0..count {
            let m = Msg {
                chan: ch,
                seq,
                _live: Live::new(&s.live),
            };
            if rng.chance(10) {
                match time::timeout(rng.dur(300), tx.send(m)).await {
                    Ok(Ok(())) => s.chans.lock().unwrap()[ch].sent_ok.push(seq),
                    Ok(Err(_)) => break,
                    // Dropped while it waited: the value went with it, unsent. The next one
                    // carries the next number.
                    Err(_) => {}
                }
            } else {
                match tx.send(m).await {
                    Ok(()) => s.chans.lock().unwrap()[ch].sent_ok.push(seq),
                    Err(_) => break,
                }
            }
            if rng.chance(15) {
                yield_now().await;
            }
        }
        drop(tx);
        s.complete(id);
        MAGIC ^ id as u64
    })
}

/// A local channel between two local tasks.
fn local_channel(s: &Arc<Soak>, rng: &mut Rng) -> Option<Vec<Kid>> {
    if !s.take_budget() {
        return None;
    }
    let cap = 1 + rng.below(6) as usize;
    let (tx, mut rx) = channel::local::bounded::<Msg>(cap).expect("capacity");
    let drains = rng.chance(70);
    let ch = new_chan(s, "local", drains);
    let count = rng.below(24);
    let stop_after = if drains {
        u64::MAX
    } else {
        rng.below(count + 1)
    };
    let pid = s.new_task("local producer", false);
    let cid = s.new_task("local consumer", false);
    let (sp, sc) = (s.clone(), s.clone());
    let mut prng = rng.fork();
    let p = shard::spawn_local(async move {
        let _live = Live::new(&sp.live);
        for seq in 0..count {
            let m = Msg {
                chan: ch,
                seq,
                _live: Live::new(&sp.live),
            };
            match tx.send(m).await {
                Ok(()) => sp.chans.lock().unwrap()[ch].sent_ok.push(seq),
                Err(_) => break,
            }
            if prng.chance(20) {
                yield_now().await;
            }
        }
        drop(tx);
        sp.complete(pid);
        MAGIC ^ pid as u64
    });
    let c = shard::spawn_local(async move {
        let _live = Live::new(&sc.live);
        let mut got = 0;
        while got < stop_after {
            match rx.recv().await {
                Some(m) => {
                    sc.chans.lock().unwrap()[ch].received.push(m.seq);
                    got += 1;
                }
                None => {
                    sc.chans.lock().unwrap()[ch].saw_end = true;
                    break;
                }
            }
        }
        drop(rx);
        sc.complete(cid);
        MAGIC ^ cid as u64
    });
    Some(vec![
        (pid, p, Fate::Await, MAGIC ^ pid as u64),
        (cid, c, Fate::Detach, MAGIC ^ cid as u64),
    ])
}

/// An echo over a Unix pair or a TCP loopback connection, in a local task.
fn io_pair(s: &Arc<Soak>, rng: &mut Rng) -> Option<Kid> {
    if !s.take_budget() {
        return None;
    }
    let tcp = rng.chance(40);
    let len = 1 + rng.below(5000) as usize;
    let give_up = rng.chance(15).then(|| rng.dur(1000));
    let kid = s.new_task(if tcp { "tcp echo" } else { "unix echo" }, false);
    let s2 = s.clone();
    let h = shard::spawn_local(async move {
        let _live = Live::new(&s2.live);
        let work = async {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            if tcp {
                let l = xtc_shards::net::TcpListener::bind("127.0.0.1:0")?;
                let addr = l.local_addr()?;
                let server = shard::spawn_local(async move {
                    let (c, _) = l.accept().await?;
                    echo(&c, len).await
                });
                let c = xtc_shards::net::TcpStream::connect(addr).await?;
                let got = talk(&c, payload.clone(), len).await?;
                server.await.map_err(std::io::Error::other)??;
                Ok::<_, std::io::Error>(got == payload)
            } else {
                let (a, b) = xtc_shards::net::UnixStream::pair()?;
                let server = shard::spawn_local(async move { echo(&b, len).await });
                let got = talk(&a, payload.clone(), len).await?;
                server.await.map_err(std::io::Error::other)??;
                Ok(got == payload)
            }
        };
        let r = match give_up {
            Some(d) => time::timeout(d, work).await.ok(),
            None => Some(work.await),
        };
        match r {
            Some(Ok(true)) | None => {}
            Some(Ok(false)) => s2.error(format!("io task {kid}: echo differs")),
            Some(Err(e)) => s2.error(format!("io task {kid}: {e}")),
        }
        s2.complete(kid);
        MAGIC ^ kid as u64
    });
    Some((kid, h, Fate::Await, MAGIC ^ kid as u64))
}

trait Stream {
    fn rd(&self, b: Vec<u8>) -> impl Future<Output = (std::io::Result<usize>, Vec<u8>)>;
    fn wr(&self, b: Vec<u8>) -> impl Future<Output = (std::io::Result<()>, Vec<u8>)>;
}
impl Stream for xtc_shards::net::TcpStream {
    fn rd(&self, b: Vec<u8>) -> impl Future<Output = (std::io::Result<usize>, Vec<u8>)> {
        self.read(b)
    }
    fn wr(&self, b: Vec<u8>) -> impl Future<Output = (std::io::Result<()>, Vec<u8>)> {
        self.write_all(b)
    }
}
impl Stream for xtc_shards::net::UnixStream {
    fn rd(&self, b: Vec<u8>) -> impl Future<Output = (std::io::Result<usize>, Vec<u8>)> {
        self.read(b)
    }
    fn wr(&self, b: Vec<u8>) -> impl Future<Output = (std::io::Result<()>, Vec<u8>)> {
        self.write_all(b)
    }
}

async fn echo<S: Stream>(c: &S, len: usize) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let (r, mut buf) = c.rd(Vec::with_capacity(4096)).await;
        let n = r?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.truncate(n);
        left -= n;
        c.wr(buf).await.0?;
    }
    Ok(())
}

async fn talk<S: Stream>(c: &S, payload: Vec<u8>, len: usize) -> std::io::Result<Vec<u8>> {
    c.wr(payload).await.0?;
    let mut got = Vec::with_capacity(len);
    while got.len() < len {
        let (r, buf) = c.rd(Vec::with_capacity(4096)).await;
        let n = r?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(got)
}

/// Polls `fut` on this plain thread until it is ready or `give_up` is set.
fn poll_until<F: Future>(fut: F, give_up: &AtomicBool) -> Option<F::Output> {
    struct T(std::thread::Thread);
    impl Wake for T {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(T(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        if give_up.load(SeqCst) {
            return None;
        }
        std::thread::park_timeout(Duration::from_millis(1));
    }
}

/// The plain thread's part: `Handle` calls while the executor runs. In quiescence mode the
/// guard sender it holds keeps a task waiting, so the run cannot end before it is done.
fn plain_thread(
    s: Arc<Soak>,
    h: Handle,
    mut rng: Rng,
    guard: channel::shared::Sender<()>,
    run_over: Arc<AtomicBool>,
) {
    let ops = rng.below(30);
    // At quiescence the run goes on while this thread holds the guard: every call resolves.
    let never = AtomicBool::new(false);
    let give_up = if s.strict() { &never } else { &*run_over };
    let mut handles = Vec::new();
    for _ in 0..ops {
        if !s.take_budget() {
            break;
        }
        let n = rng.below(s.shards as u64) as usize;
        match rng.below(6) {
            0 => {
                let kid = s.new_task("thread spawn_on", false);
                let (s2, r2) = (s.clone(), rng.fork());
                match h.spawn_on(n, move || body(s2, kid, r2, 1, true)) {
                    Ok(j) => handles.push((kid, j)),
                    Err(e) => s.error(format!("thread spawn_on: {e}")),
                }
            }
            1 => {
                let kid = s.new_task("thread spawn", false);
                handles.push((kid, h.spawn(body(s.clone(), kid, rng.fork(), 1, false))));
            }
            2 => {
                let kid = s.new_task("thread send_to", false);
                let (s2, r2) = (s.clone(), rng.fork());
                if let Err(e) = h.send_to(n, move || body(s2, kid, r2, 1, true)) {
                    s.error(format!("thread send_to: {e}"));
                }
            }
            3 => {
                let kid = s.new_task("thread submit_to", false);
                let (s2, r2) = (s.clone(), rng.fork());
                let f = h.submit_to(n, move || body(s2, kid, r2, 1, true));
                match poll_until(f, give_up) {
                    Some(Ok(v)) if v == MAGIC ^ kid as u64 => {}
                    Some(Ok(v)) => s.error(format!("thread submit_to gave {v:#x}")),
                    Some(Err(e)) if s.strict() => s.error(format!("thread submit_to: {e}")),
                    _ => {}
                }
            }
            4 => flip(&h, &mut rng),
            _ => std::thread::sleep(rng.dur(1000)),
        }
    }
    for (kid, j) in handles {
        let abort = rng.chance(30);
        if abort {
            s.optional(kid);
            j.abort();
        }
        if abort || rng.chance(50) {
            let t = Instant::now();
            match poll_until(j, give_up) {
                Some(Ok(v)) if v == MAGIC ^ kid as u64 => {}
                Some(Ok(v)) => s.error(format!("thread join gave {v:#x}")),
                Some(Err(e)) if abort && e.is_cancelled() => {}
                Some(Err(e)) if s.strict() => s.error(format!("thread join {kid}: {e}")),
                _ => {}
            }
            if t.elapsed() > Duration::from_secs(20) {
                s.error(format!(
                    "thread join {kid} (abort: {abort}) took {:?}",
                    t.elapsed()
                ));
            }
        }
    }
    if h.service_mode() {
        // Switched off after the last task may have ended: the run must notice quiescence.
        let late = rng.chance(50);
        if late {
            drop(guard);
            std::thread::sleep(rng.dur(3000));
        }
        h.set_service_mode(false);
    } else {
        drop(guard);
    }
}

/// Runs seed `seed`: one executor, run one to three times (rounds), each round with its own
/// workload and ending; `Err` describes what went wrong.
fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xdead_beef);
    let shards = [2, 3, 3, 4, 4][rng.below(5) as usize];
    let ring = [1, 2, 4, 16, 1024][rng.below(5) as usize];
    let rounds = [1, 1, 2, 3][rng.below(4) as usize];
    // A task that waits on another executor may be reported deadlocked after a short grace.
    let short_grace = rng.chance(40);
    let mut ex = Builder::new()
        .shards(shards)
        .oversubscribe(true)
        .ring_capacity(ring)
        .stealing(rng.chance(80))
        .eager_rebalance(rng.chance(40))
        .steal_backoff(rng.chance(40))
        .min_tasks_to_steal(rng.below(3) as usize)
        // Short: a false deadlock report (a transient all-idle moment) shows at once.
        .deadlock_grace(Some(if short_grace {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(5)
        }))
        .spin_before_park([0, 20, 200][rng.below(3) as usize] * Duration::from_micros(1))
        .preempt([0, 0, 100, 1000][rng.below(4) as usize] * Duration::from_micros(1))
        .stall_budget([0, 0, 200, 2000][rng.below(4) as usize] * Duration::from_micros(1))
        .build()
        .map_err(|e| format!("build: {e}"))?;
    let live = Arc::new(AtomicIsize::new(0));
    let mut problems = Vec::new();
    let mut desc = format!("seed {seed}: {shards} shards, ring {ring}");
    // A stop asked by a thread after the run went quiescent is kept for the next run.
    let mut strict_ok = true;
    let mut no_stop_yet = true;
    let mut soaks = Vec::new();
    for round in 0..rounds {
        let end = [
            End::Quiesce,
            End::Quiesce,
            End::BlockOn,
            End::StopTask,
            End::StopThread,
        ][rng.below(5) as usize];
        desc.push_str(&format!(", round {round}: {end:?}"));
        let s = Arc::new(Soak {
            end,
            live: live.clone(),
            budget: AtomicIsize::new(40 + rng.below(700) as isize),
            tasks: Mutex::default(),
            done: Mutex::default(),
            chans: Mutex::default(),
            errors: Mutex::default(),
            stopping: AtomicBool::new(false),
            other: Mutex::new(None),
            handle: Some(ex.handle()),
            active: AtomicBool::new(true),
            strict_ok,
            no_stop_yet,
            shards,
            submits_started: AtomicU32::new(0),
            submits_done: AtomicU32::new(0),
            hidden_left: AtomicIsize::new(rng.below(4) as isize),
            blocker: AtomicBool::new(false),
            hidden_drops: AtomicU32::new(0),
            hidden_blocks: AtomicU32::new(0),
        });
        soaks.push(s.clone());
        if round > 0 {
            // Queued between runs: the next run starts them.
            pre_spawn(&ex.handle(), &s, &mut rng);
        }
        match run_round(ex, &s, rng.fork(), &desc, !short_grace) {
            Some((e, p)) => {
                ex = e;
                problems.extend(p.into_iter().map(|p| format!("round {round}: {p}")));
            }
            None => return Err(format!("HUNG {desc}")),
        }
        s.active.store(false, SeqCst);
        strict_ok = end != End::StopThread;
        no_stop_yet &= end == End::Quiesce;
    }
    // Queued with no run to come, then after the executor is gone: dropped, their handles
    // report cancelled at once.
    let h = ex.handle();
    let last = soaks.last().unwrap().clone();
    let mut orphans = Vec::new();
    for i in 0..rng.below(4) {
        let kid = last.new_task("orphan", false);
        last.optional(kid);
        let (s2, r2) = (last.clone(), rng.fork());
        if i % 2 == 0 {
            orphans.push(h.spawn(body(s2, kid, r2, 0, false)));
        } else if let Ok(j) = h.spawn_on(0, move || body(s2, kid, r2, 0, true)) {
            orphans.push(j);
        }
    }
    drop(ex);
    {
        let kid = last.new_task("after drop", false);
        last.optional(kid);
        orphans.push(h.spawn(body(last.clone(), kid, rng.fork(), 0, false)));
        let s2 = last.clone();
        match h.spawn_on(0, move || body(s2, kid, Rng(0), 0, true)) {
            Ok(j) => orphans.push(j),
            Err(Error::Stopped) => {}
            Err(e) => problems.push(format!("spawn_on after the executor dropped: {e}")),
        }
    }
    for mut j in orphans {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut j).poll(&mut cx) {
            Poll::Ready(Err(e)) if e.is_cancelled() => {}
            other => problems.push(format!(
                "a handle of a task left to the dropped executor gave {:?}",
                other.map(|r| r.map_err(|e| e.to_string()))
            )),
        }
    }
    drop(h);
    // Every round's tasks, those a later run ran included: none completed twice.
    for (round, s) in soaks.iter().enumerate() {
        let done = s.done.lock().unwrap();
        let tasks = s.tasks.lock().unwrap();
        for (i, t) in tasks.iter().enumerate() {
            if done[i] > 1 {
                problems.push(format!(
                    "round {round}: task {i} ({}) completed {} times",
                    t.what, done[i]
                ));
            }
        }
        problems.extend(
            s.errors
                .lock()
                .unwrap()
                .iter()
                .map(|e| format!("round {round} (late): {e}")),
        );
    }
    let (built, dropped) = (LOCAL_BUILT.load(SeqCst), LOCAL_DROPPED.load(SeqCst));
    if built != dropped {
        problems.push(format!(
            "{built} ShardLocal values built and {dropped} dropped, with every executor gone"
        ));
    }
    let left = live.load(SeqCst);
    if left != 0 {
        problems.push(format!(
            "{left} workload values alive after the executor dropped"
        ));
    }
    problems.sort();
    problems.dedup();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{desc}:\n  {}", problems.join("\n  ")))
    }
}

/// Queues a few tasks through `h` while no run is in progress.
fn pre_spawn(h: &Handle, s: &Arc<Soak>, rng: &mut Rng) {
    for _ in 0..rng.below(5) {
        let n = rng.below(s.shards as u64) as usize;
        let (s2, r2) = (s.clone(), rng.fork());
        match rng.below(3) {
            0 => {
                let kid = s.new_task("pre spawn", false);
                drop(h.spawn(body(s2, kid, r2, 0, false)));
            }
            1 => {
                let kid = s.new_task("pre spawn_on", false);
                drop(
                    h.spawn_on(n, move || body(s2, kid, r2, 0, true))
                        .expect("spawn_on"),
                );
            }
            _ => {
                let kid = s.new_task("pre send_to", false);
                h.send_to(n, move || body(s2, kid, r2, 0, true))
                    .expect("send_to");
            }
        }
    }
}

/// One round on `ex`: its workload, its ending, its checks. `None` if it hung (the executor
/// stays with the stuck thread).
fn run_round(
    ex: Executor,
    s: &Arc<Soak>,
    mut rng: Rng,
    desc: &str,
    cross_ok: bool,
) -> Option<(Executor, Vec<String>)> {
    let (end, shards) = (s.end, s.shards);
    let h = ex.handle();
    let mut problems: Vec<String> = Vec::new();
    // The guard: a task that waits for the plain thread to be done.
    let (gtx, mut grx) = channel::shared::bounded::<()>(1).unwrap();
    let gid = s.new_task("guard", false);
    let sg = s.clone();
    let mut guard_task = Some(move || async move {
        let _live = Live::new(&sg.live);
        while grx.recv().await.is_some() {}
        sg.complete(gid);
        MAGIC ^ gid as u64
    });
    let mut roots = Vec::new();
    let roots_n = 1 + rng.below(4);
    if end != End::BlockOn {
        let gh = h.spawn_on(0, guard_task.take().unwrap()).expect("spawn_on");
        roots.push((gid, gh));
        for _ in 0..roots_n {
            let kid = s.new_task("root", false);
            let (s2, r2) = (s.clone(), rng.fork());
            let j = if rng.chance(50) {
                let n = rng.below(shards as u64) as usize;
                h.spawn_on(n, move || body(s2, kid, r2, 0, true))
                    .expect("spawn_on")
            } else {
                h.spawn(body(s2, kid, r2, 0, false))
            };
            roots.push((kid, j));
        }
    }
    // Another executor (one shard, service mode) beside this one for the round.
    let other = (cross_ok && rng.chance(40)).then(|| {
        let b = Builder::new()
            .shards(1)
            .oversubscribe(true)
            .service_mode(true)
            .build()
            .expect("build the other executor");
        *s.other.lock().unwrap() = Some(b.handle());
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _ = tx.send(b.run().map_err(|e| e.to_string()));
        });
        (t, rx)
    });
    // Service mode on for a quiescence round: the plain thread switches it off at its end.
    h.set_service_mode(end == End::Quiesce && rng.chance(30));
    let run_over = Arc::new(AtomicBool::new(false));
    let thread_rng = rng.fork();
    let stopper_delay = rng.dur(8_000);
    let (s_t, h_t, ro) = (s.clone(), h.clone(), run_over.clone());
    let plain = std::thread::spawn(move || plain_thread(s_t, h_t, thread_rng, gtx, ro));
    let stopper = (end == End::StopThread).then(|| {
        let (h2, s2, ro) = (h.clone(), s.clone(), run_over.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            while t.elapsed() < stopper_delay && !ro.load(SeqCst) {
                std::thread::sleep(Duration::from_micros(200));
            }
            s2.stopping.store(true, SeqCst);
            h2.stop();
        })
    });
    if end == End::StopTask {
        let s2 = s.clone();
        h.spawn_on(rng.below(shards as u64) as usize, move || async move {
            time::sleep(stopper_delay).await;
            if s2.active.load(SeqCst) {
                s2.stopping.store(true, SeqCst);
                shard::stop();
            }
        })
        .expect("spawn_on");
    }

    // Run, with a hang guard.
    let (tx, rx) = std::sync::mpsc::channel();
    let main_rng = rng.fork();
    let main_panics = end == End::BlockOn && rng.chance(15);
    let runner = {
        let s = s.clone();
        std::thread::spawn(move || {
            let r = if end == End::BlockOn {
                let s2 = s.clone();
                let guard_task = guard_task.take().unwrap();
                let mid = s.new_task("main", main_panics);
                ex.block_on(move || async move {
                    let g = xtc_shards::spawn_local(guard_task());
                    let v = body(s2.clone(), mid, main_rng, 0, true).await;
                    let _ = g.await;
                    v
                })
                .map(|v| {
                    if v != MAGIC ^ mid as u64 {
                        s.error(format!("main gave {v:#x}"));
                    }
                })
            } else {
                ex.run()
            };
            let _ = tx.send(r.map_err(|e| e.to_string()));
            ex
        })
    };
    let res = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r,
        Err(_) => {
            let done = s.done.lock().unwrap();
            let tasks = s.tasks.lock().unwrap();
            let pending: Vec<String> = tasks
                .iter()
                .enumerate()
                .filter(|(i, _)| done[*i] == 0)
                .map(|(i, t)| format!("{i}:{}", t.what))
                .collect();
            eprintln!("HUNG {desc}; unfinished: {pending:?}");
            drop((done, tasks));
            h.stop();
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(r) => eprintln!("after stop() run gave {r:?}"),
                Err(_) => eprintln!("stop() did not end it either"),
            }
            return None;
        }
    };
    run_over.store(true, SeqCst);
    let ex = runner.join().expect("runner panicked");
    plain.join().expect("plain thread panicked");
    if let Some(t) = stopper {
        t.join().unwrap();
    }
    if let Some((t, rx)) = other {
        let hb = s.other.lock().unwrap().take().unwrap();
        hb.stop();
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => problems.push(format!("the other executor's run: {e}")),
            Err(_) => {
                eprintln!("HUNG {desc}: the other executor");
                return None;
            }
        }
        t.join().expect("other runner panicked");
    }
    problems.extend(s.errors.lock().unwrap().drain(..));
    if main_panics && res.is_ok() {
        problems.push("block_on returned Ok, its main task panicked".into());
    }
    if let Err(e) = &res {
        let stopped_early = e.contains("stopped") && !s.strict_ok;
        let main_panicked = main_panics && e.contains(PLANNED);
        if !stopped_early && !main_panicked {
            problems.push(format!("run/block_on: {e}"));
        }
    }
    let quiesced = end == End::Quiesce && s.strict_ok;
    {
        let done = s.done.lock().unwrap();
        let tasks = s.tasks.lock().unwrap();
        for (i, t) in tasks.iter().enumerate() {
            if quiesced && !t.optional && done[i] != 1 {
                problems.push(format!("task {i} ({}) did not complete", t.what));
            }
        }
        for (i, c) in s.chans.lock().unwrap().iter().enumerate() {
            if !c.sent_ok.starts_with(&c.received) {
                problems.push(format!(
                    "{} chan {i}: received {:?} is not a prefix of sent {:?}",
                    c.kind, c.received, c.sent_ok
                ));
            }
            if c.drains && c.saw_end && c.received != c.sent_ok {
                problems.push(format!(
                    "{} chan {i}: drained to the end but received {:?} of sent {:?}",
                    c.kind, c.received, c.sent_ok
                ));
            }
        }
    }
    for (kid, mut j) in roots {
        // Done or dropped by the run, whichever way it ended: never still pending.
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut j).poll(&mut cx) {
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) if !quiesced && e.is_cancelled() => {}
            Poll::Ready(Err(e)) => problems.push(format!("root {kid} after run(): {e}")),
            Poll::Pending => problems.push(format!("root {kid} still pending after run()")),
        }
    }
    let mut sent = 0;
    let mut received = 0;
    for i in 0..shards {
        let st = ex.loop_stats(i).expect("loop_stats");
        if st.live_tasks != 0 {
            problems.push(format!(
                "loop {i}: {} live tasks after run()",
                st.live_tasks
            ));
        }
        sent += st.messages_sent;
        received += st.messages_received;
    }
    // Without a stop so far every ring message sent was received.
    if s.strict_ok && s.no_stop_yet && end == End::Quiesce && sent != received {
        problems.push(format!("ring messages: {sent} sent, {received} received"));
    }
    if std::env::var_os("XTC_CHAOS_VERBOSE").is_some() {
        let done = s.done.lock().unwrap();
        let chans = s.chans.lock().unwrap();
        eprintln!(
            "{desc}: {} tasks, {} completed, {} chans, {} msgs sent, {} received, {} submits, \
             {} hidden drops, {} hidden blocks",
            done.len(),
            done.iter().filter(|d| **d > 0).count(),
            chans.len(),
            chans.iter().map(|c| c.sent_ok.len()).sum::<usize>(),
            chans.iter().map(|c| c.received.len()).sum::<usize>(),
            s.submits_started.load(SeqCst),
            s.hidden_drops.load(SeqCst),
            s.hidden_blocks.load(SeqCst),
        );
    }
    Some((ex, problems))
}

fn seeds() -> std::ops::Range<u64> {
    match std::env::var("XTC_CHAOS_SEEDS") {
        Ok(v) if v.contains("..") => {
            let (a, b) = v.split_once("..").unwrap();
            a.trim().parse().unwrap()..b.trim().parse().unwrap()
        }
        Ok(v) if !v.trim().is_empty() => {
            let n: u64 = v.trim().parse().unwrap();
            n..n + 1
        }
        _ => 0..64,
    }
}

fn quiet_planned_panics() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let planned = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains(PLANNED));
        if !planned {
            prev(info);
        }
    }));
}

#[test]
fn chaos_soak() {
    quiet_planned_panics();
    let mut failed = Vec::new();
    for seed in seeds() {
        let t = Instant::now();
        let r = run_seed(seed);
        if std::env::var_os("XTC_CHAOS_VERBOSE").is_some() {
            eprintln!(
                "seed {seed}: {:?} in {:?}",
                r.as_ref().map(|_| ()),
                t.elapsed()
            );
        }
        if let Err(e) = r {
            eprintln!("FAIL {e}");
            failed.push(seed);
            if e.starts_with("HUNG") {
                break;
            }
        }
    }
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}
