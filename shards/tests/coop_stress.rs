//! Randomized stress of the cooperative budget (`context::coop_spend`, the channels' 1,024-item
//! runs): ready epoll calls, sleeps past their deadline, `send_to`/`submit_to` with room and
//! channel sends and receives that yield instead of completing, mixed with `select`s over two
//! ready sources, zero timeouts around ready operations, futures dropped right after a
//! `Pending`, and migratable tasks, on 1, 2 and 4 shards and on both drivers (and in a
//! `LocalExecutor`). Every value must arrive once and in order, `run()` must return
//! (quiescent), and no task may be left alive. `XTC_COOP_SEEDS=<n>` runs more seeds.

mod common;
mod io_common;

use std::{
    future::{poll_fn, Future},
    pin::pin,
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    task::Poll,
    time::Duration,
};

use futures::future::{select, Either};
use xtc_shards::{
    channel::{local, shared},
    net::{TcpListener, TcpStream, UdpSocket, UnixStream},
    shard::{send_to, spawn_local, submit_to},
    time::{sleep, timeout},
    Executor, LocalExecutor,
};

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// What a run shares with its checks: live tasks, failures, finished workloads.
#[derive(Default)]
struct Ctx {
    alive: AtomicUsize,
    done: AtomicUsize,
    /// Per caller (shard, migratable): the calls that reported `Ok`.
    sure: Mutex<Vec<(usize, bool, Vec<u64>)>>,
    errors: Mutex<Vec<String>>,
}

impl Ctx {
    fn fail(&self, e: String) {
        self.errors.lock().unwrap().push(e);
    }
}

/// Held by every task: counts it alive until its future is dropped.
struct Live(Arc<Ctx>);

impl Live {
    fn new(c: &Arc<Ctx>) -> Live {
        c.alive.fetch_add(1, SeqCst);
        Live(c.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.alive.fetch_sub(1, SeqCst);
    }
}

/// Polls `f` once with the task's own waker: its output, or `None` (and `f` dropped) if it was
/// pending (after a budget yield, it woke the task; after a real wait, nothing is lost).
async fn poll_once<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    poll_fn(|cx| {
        Poll::Ready(match f.as_mut().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

/// A short zero-or-tiny timeout.
fn tiny(seed: &mut u64) -> Duration {
    if rng(seed) % 2 == 0 {
        Duration::ZERO
    } else {
        Duration::from_micros(rng(seed) % 50)
    }
}

/// Two stream pairs; the reader mixes plain, timed-out, once-polled and `select`ed reads of
/// tiny sizes (so epoll's budget runs out). Each stream carries `0..n` as u32s, in order.
async fn streams(mut seed: u64, ctx: Arc<Ctx>) {
    const N: u32 = 3000;
    let (a1, b1) = UnixStream::pair().unwrap();
    let (a2, b2) = UnixStream::pair().unwrap();
    let mut ws = Vec::new();
    for (k, a) in [a1, a2].into_iter().enumerate() {
        let live = Live::new(&ctx);
        let mut s = seed.wrapping_add(k as u64 + 1) | 1;
        ws.push(spawn_local(async move {
            let _live = live;
            let mut next = 0u32;
            while next < N {
                let m = (1 + rng(&mut s) % 200).min(u64::from(N - next)) as u32;
                let buf: Vec<u8> = (next..next + m).flat_map(u32::to_le_bytes).collect();
                let (r, _) = a.write_all(buf).await;
                r.unwrap();
                next += m;
                if rng(&mut s) % 8 == 0 {
                    sleep(Duration::ZERO).await;
                }
            }
        }));
    }
    let mut got = [Vec::new(), Vec::new()];
    let mut eof = [false, false];
    let b = [&b1, &b2];
    let mut take = |i: usize, r: std::io::Result<usize>, v: Vec<u8>, eof: &mut [bool; 2]| {
        let n = r.unwrap();
        if n == 0 {
            eof[i] = true;
        }
        got[i].extend_from_slice(&v[..n]);
    };
    while !(eof[0] && eof[1]) {
        let i = if eof[0] {
            1
        } else if eof[1] {
            0
        } else {
            (rng(&mut seed) % 2) as usize
        };
        let cap = 1 + (rng(&mut seed) % 16) as usize;
        match rng(&mut seed) % 6 {
            0 | 1 => {
                let (r, v) = b[i].read(Vec::with_capacity(cap)).await;
                take(i, r, v, &mut eof);
            }
            2 => {
                if let Ok((r, v)) =
                    timeout(tiny(&mut seed), b[i].read(Vec::with_capacity(cap))).await
                {
                    take(i, r, v, &mut eof);
                }
            }
            3 => {
                if let Some((r, v)) = poll_once(b[i].read(Vec::with_capacity(cap))).await {
                    take(i, r, v, &mut eof);
                }
            }
            4 if !eof[0] && !eof[1] => {
                let f0 = pin!(b1.read(Vec::with_capacity(cap)));
                let f1 = pin!(b2.read(Vec::with_capacity(cap)));
                match select(f0, f1).await {
                    Either::Left(((r, v), _)) => take(0, r, v, &mut eof),
                    Either::Right(((r, v), _)) => take(1, r, v, &mut eof),
                }
            }
            _ => sleep(Duration::ZERO).await,
        }
    }
    for w in ws {
        w.await.unwrap();
    }
    for (i, g) in got.iter().enumerate() {
        let want: Vec<u8> = (0..N).flat_map(u32::to_le_bytes).collect();
        if *g != want {
            let at = g.iter().zip(&want).position(|(x, y)| x != y);
            ctx.fail(format!(
                "stream {i}: {} bytes of {}, first difference at {at:?}",
                g.len(),
                want.len()
            ));
        }
    }
    ctx.done.fetch_add(1, SeqCst);
}

/// Datagrams `0..N` over a connected UDP pair, at most `W` ahead of the receiver (credits over
/// a local channel), received by mixed calls: in order, each once.
async fn datagrams(mut seed: u64, ctx: Arc<Ctx>) {
    const N: u32 = 1500;
    const W: u32 = 16;
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    let (ctx_tx, mut credits) = local::bounded::<u32>(N as usize).unwrap();
    let live = Live::new(&ctx);
    let sender = spawn_local(async move {
        let _live = live;
        let mut acked = 0;
        for i in 0..N {
            while i >= acked + W {
                acked = credits.recv().await.unwrap();
            }
            let (r, _) = a.send(i.to_le_bytes().to_vec()).await;
            r.unwrap();
        }
    });
    let mut next = 0u32;
    while next < N {
        let got = match rng(&mut seed) % 4 {
            0 => Some(b.recv(Vec::with_capacity(8)).await),
            1 => timeout(tiny(&mut seed), b.recv(Vec::with_capacity(8)))
                .await
                .ok(),
            2 => poll_once(b.recv(Vec::with_capacity(8))).await,
            _ => {
                sleep(Duration::ZERO).await;
                None
            }
        };
        if let Some((r, v)) = got {
            let n = r.unwrap();
            let i = u32::from_le_bytes(v[..n].try_into().unwrap());
            if i != next {
                ctx.fail(format!("datagram {i} where {next} was due"));
                return;
            }
            next += 1;
            let _ = ctx_tx.try_send(next);
        }
    }
    drop(ctx_tx);
    sender.await.unwrap();
    ctx.done.fetch_add(1, SeqCst);
}

/// `K` connections, each sending its number, accepted by plain, timed-out and once-polled
/// accepts: each accepted once.
async fn accepts(mut seed: u64, ctx: Arc<Ctx>) {
    const K: u8 = 24;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let live = Live::new(&ctx);
    let client = spawn_local(async move {
        let _live = live;
        for i in 0..K {
            let s = TcpStream::connect(addr).await.unwrap();
            let (r, _) = s.write_all(vec![i]).await;
            r.unwrap();
        }
    });
    let mut seen = Vec::new();
    while seen.len() < K as usize {
        let got = match rng(&mut seed) % 4 {
            0 => Some(l.accept().await),
            1 => timeout(tiny(&mut seed), l.accept()).await.ok(),
            2 => poll_once(l.accept()).await,
            _ => {
                sleep(Duration::ZERO).await;
                None
            }
        };
        if let Some(r) = got {
            let (s, _) = r.unwrap();
            let (r, v) = s.read(Vec::with_capacity(1)).await;
            assert_eq!(r.unwrap(), 1);
            seen.push(v[0]);
        }
    }
    client.await.unwrap();
    seen.sort_unstable();
    if seen != (0..K).collect::<Vec<_>>() {
        ctx.fail(format!("accepted {seen:?}"));
    }
    ctx.done.fetch_add(1, SeqCst);
}

/// Calls from `src` (pinned, or migratable when `migr`) to random shards by `send_to` and
/// `submit_to`, some under zero timeouts or polled once: each call runs at most once, exactly
/// once if it reported `Ok`, and a pinned caller's calls start in order per target.
async fn calls(src: usize, n: usize, migr: bool, mut seed: u64, ctx: Arc<Ctx>, log: CallLog) {
    const S: u64 = 1000;
    let mut sure = Vec::new();
    let mut seq = 0;
    let mut burst = 0;
    while seq < S {
        let dst = (rng(&mut seed) % n as u64) as usize;
        let l = log.clone();
        let rec = move || {
            l.lock().unwrap().push((src, migr, dst, seq));
            async {}
        };
        // Bursts of plain sends (over 128, the budget of a poll), to the own shard or to one
        // whose ring has room.
        let mode = if burst > 0 {
            burst -= 1;
            0
        } else {
            rng(&mut seed) % 8
        };
        let ok = match mode {
            0 => send_to(dst, rec).await.is_ok(),
            1 => matches!(timeout(Duration::ZERO, send_to(dst, rec)).await, Ok(Ok(()))),
            2 => matches!(poll_once(send_to(dst, rec)).await, Some(Ok(()))),
            3 => submit_to(dst, rec).await.is_ok(),
            4 => matches!(
                timeout(tiny(&mut seed), submit_to(dst, rec)).await,
                Ok(Ok(()))
            ),
            5 => {
                burst = 100 + rng(&mut seed) % 200;
                continue;
            }
            _ => {
                for _ in 0..rng(&mut seed) % 300 {
                    sleep(Duration::ZERO).await;
                }
                continue;
            }
        };
        if ok {
            sure.push(seq);
        }
        seq += 1;
    }
    // Let the last calls run (a send_to resolves once queued).
    for dst in 0..n {
        let _ = submit_to(dst, || async {}).await;
    }
    ctx.sure.lock().unwrap().push((src, migr, sure));
    ctx.done.fetch_add(1, SeqCst);
}

/// After the run: each call ran at most once, exactly once if it reported `Ok` (a migratable
/// caller's calls may leave from several shards: only the run's end waits for them all),
/// and a pinned caller's calls started in order per target.
fn check_calls(ctx: &Ctx, log: &CallLog, n: usize) {
    let log = log.lock().unwrap();
    for (src, migr, sure) in ctx.sure.lock().unwrap().iter() {
        let (src, migr) = (*src, *migr);
        let mine: Vec<_> = log
            .iter()
            .filter(|e| e.0 == src && e.1 == migr)
            .map(|e| (e.2, e.3))
            .collect();
        let mut seqs: Vec<u64> = mine.iter().map(|e| e.1).collect();
        seqs.sort_unstable();
        if seqs.windows(2).any(|w| w[0] == w[1]) {
            ctx.fail(format!(
                "shard {src} (migratable: {migr}): a call ran twice"
            ));
        }
        if let Some(s) = sure.iter().find(|s| seqs.binary_search(s).is_err()) {
            ctx.fail(format!(
                "shard {src} (migratable: {migr}): call {s} reported Ok, never ran"
            ));
        }
        if !migr {
            for dst in 0..n {
                let order: Vec<u64> = mine.iter().filter(|e| e.0 == dst).map(|e| e.1).collect();
                if order.windows(2).any(|w| w[0] > w[1]) {
                    ctx.fail(format!("calls {src}->{dst} out of order: {order:?}"));
                }
            }
        }
    }
}

type CallLog = Arc<Mutex<Vec<(usize, bool, usize, u64)>>>;

/// Sends `0..N` on `tx` by plain, timed-out, once-polled and batched sends.
async fn produce(mut tx: shared::Sender<u64>, mut seed: u64) {
    const N: u64 = 5000;
    let mut it = 0..N;
    let mut pending = None::<u64>;
    loop {
        let v = match pending.take() {
            Some(v) => v,
            None if rng(&mut seed) % 4 == 0 => {
                let k = (rng(&mut seed) % 1500) as usize;
                let _ = timeout(tiny(&mut seed), tx.send_many(it.by_ref().take(k))).await;
                continue;
            }
            None => match it.next() {
                Some(v) => v,
                None => break,
            },
        };
        match rng(&mut seed) % 5 {
            0 => {
                if timeout(tiny(&mut seed), tx.send(v)).await.is_err() {
                    pending = Some(v);
                }
            }
            1 => {
                if poll_once(tx.send(v)).await.is_none() {
                    pending = Some(v);
                }
            }
            2 if rng(&mut seed) % 16 == 0 => {
                sleep(Duration::ZERO).await;
                pending = Some(v);
            }
            _ => tx.send(v).await.unwrap(),
        }
    }
}

/// Receives two streams of `0..N` by plain, batched, timed-out, once-polled and `select`ed
/// receives: each in order, once, and closed after its last value.
async fn consume(mut rx: [shared::Receiver<u64>; 2], mut seed: u64, ctx: Arc<Ctx>) {
    const N: u64 = 5000;
    let mut next = [0u64; 2];
    let mut closed = [false; 2];
    let mut buf = Vec::new();
    let mut bad = None;
    let mut take = |i: usize, v: Option<u64>, next: &mut [u64; 2], closed: &mut [bool; 2]| match v {
        Some(v) if v == next[i] => next[i] += 1,
        Some(v) => {
            bad.get_or_insert(format!("channel {i}: {v} where {} was due", next[i]));
        }
        None => closed[i] = true,
    };
    while !(closed[0] && closed[1]) {
        let i = if closed[0] {
            1
        } else if closed[1] {
            0
        } else {
            (rng(&mut seed) % 2) as usize
        };
        match rng(&mut seed) % 7 {
            0 | 1 => {
                let v = rx[i].recv().await;
                take(i, v, &mut next, &mut closed);
            }
            2 => {
                let k = 1 + (rng(&mut seed) % 300) as usize;
                let got = rx[i].recv_many(&mut buf, k).await;
                if got == 0 {
                    take(i, None, &mut next, &mut closed);
                }
                for v in buf.drain(..) {
                    take(i, Some(v), &mut next, &mut closed);
                }
            }
            3 => {
                if let Ok(v) = timeout(tiny(&mut seed), rx[i].recv()).await {
                    take(i, v, &mut next, &mut closed);
                }
            }
            4 => {
                if let Some(v) = poll_once(rx[i].recv()).await {
                    take(i, v, &mut next, &mut closed);
                }
            }
            5 if !closed[0] && !closed[1] => {
                let [r0, r1] = &mut rx;
                match select(r0.recv(), r1.recv()).await {
                    Either::Left((v, _)) => take(0, v, &mut next, &mut closed),
                    Either::Right((v, _)) => take(1, v, &mut next, &mut closed),
                }
            }
            _ => {
                if rng(&mut seed) % 8 == 0 {
                    for _ in 0..rng(&mut seed) % 300 {
                        sleep(Duration::ZERO).await;
                    }
                }
            }
        }
    }
    if let Some(b) = bad {
        ctx.fail(b);
    } else if next != [N, N] {
        ctx.fail(format!("channels closed after {next:?} of {N}"));
    }
    ctx.done.fetch_add(1, SeqCst);
}

/// A task feeding its own local channel (so every `recv` finds a value), some receives
/// polled once or under a zero timeout.
async fn self_feed(mut seed: u64, ctx: Arc<Ctx>) {
    const N: u64 = 3000;
    let (tx, mut rx) = local::bounded::<u64>(4).unwrap();
    let mut next = 0;
    tx.try_send(0).unwrap();
    let mut sent = 1;
    while next < N {
        let v = match rng(&mut seed) % 4 {
            0 => poll_once(rx.recv()).await.flatten(),
            1 => timeout(Duration::ZERO, rx.recv()).await.ok().flatten(),
            _ => rx.recv().await,
        };
        if let Some(v) = v {
            if v != next {
                ctx.fail(format!("local channel: {v} where {next} was due"));
                return;
            }
            next += 1;
            if sent < N {
                tx.try_send(sent).unwrap();
                sent += 1;
            }
        }
    }
    ctx.done.fetch_add(1, SeqCst);
}

/// Workloads that count as done per shard: five pinned, the migratable caller and one consumer.
const PER_SHARD: usize = 7;

/// Whether shard `me` of `n` starts only its channel ends (one consumer done, not seven).
fn light(me: usize, n: usize) -> bool {
    n > 1 && me == n - 1
}

/// Shard `me`'s workloads; `ends`: the channel ends this shard starts (producers migratable,
/// the consumer pinned or migratable).
async fn shard_main(me: usize, n: usize, seed: u64, ctx: Arc<Ctx>, log: CallLog, ends: Vec<Ends>) {
    let _live = Live::new(&ctx);
    let mut s = seed ^ (me as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut hs = Vec::new();
    let mut pin = |f: std::pin::Pin<Box<dyn Future<Output = ()>>>| {
        let live = Live::new(&ctx);
        hs.push(spawn_local(async move {
            let _live = live;
            f.await
        }));
    };
    // With several shards the last one starts only its channel ends: mostly idle, it steals
    // migratable tasks mid-stream.
    let mut migr = Vec::new();
    if !light(me, n) {
        pin(Box::pin(streams(rng(&mut s), ctx.clone())));
        pin(Box::pin(datagrams(rng(&mut s), ctx.clone())));
        pin(Box::pin(accepts(rng(&mut s), ctx.clone())));
        pin(Box::pin(calls(
            me,
            n,
            false,
            rng(&mut s),
            ctx.clone(),
            log.clone(),
        )));
        pin(Box::pin(self_feed(rng(&mut s), ctx.clone())));
        let (c, l, ss) = (ctx.clone(), log.clone(), rng(&mut s));
        let live = Live::new(&ctx);
        migr.push(xtc_shards::spawn(async move {
            let _live = live;
            calls(me, n, true, ss, c, l).await;
        }));
    }
    for e in ends {
        match e {
            Ends::Produce(tx) => {
                let (ss, live) = (rng(&mut s), Live::new(&ctx));
                migr.push(xtc_shards::spawn(async move {
                    let _live = live;
                    produce(tx, ss).await;
                }));
            }
            Ends::Consume(rx) => {
                let (c, ss, live) = (ctx.clone(), rng(&mut s), Live::new(&ctx));
                let f = async move {
                    let _live = live;
                    consume(rx, ss, c).await;
                };
                if rng(&mut s) % 2 == 0 {
                    migr.push(xtc_shards::spawn(f));
                } else {
                    hs.push(spawn_local(f));
                }
            }
        }
    }
    for h in hs {
        if let Err(e) = h.await {
            ctx.fail(format!("shard {me}: pinned task failed: {e}"));
        }
    }
    for h in migr {
        if let Err(e) = h.await {
            ctx.fail(format!("shard {me}: migratable task failed: {e}"));
        }
    }
}

enum Ends {
    Produce(shared::Sender<u64>),
    Consume([shared::Receiver<u64>; 2]),
}

/// Two channels per shard, consumed in pairs on shard `(i + 1) % n`: the ends per shard.
fn channel_ends(n: usize, seed: &mut u64) -> Vec<Vec<Ends>> {
    let caps = [1usize, 2, 7, 64, 1500, 4096];
    let mut ends: Vec<Vec<Ends>> = (0..n).map(|_| Vec::new()).collect();
    for i in 0..n {
        let (t0, r0) = shared::bounded(caps[(rng(seed) % 6) as usize]).unwrap();
        let (t1, r1) = shared::bounded(caps[(rng(seed) % 6) as usize]).unwrap();
        ends[i].push(Ends::Produce(t0));
        ends[(i + (rng(seed) % n as u64) as usize) % n].push(Ends::Produce(t1));
        ends[(i + 1) % n].push(Ends::Consume([r0, r1]));
    }
    ends
}

fn check(ctx: &Ctx, want_done: usize, what: &str) {
    let errors = ctx.errors.lock().unwrap();
    assert!(errors.is_empty(), "{what}: {errors:#?}");
    assert_eq!(
        ctx.done.load(SeqCst),
        want_done,
        "{what}: workloads finished"
    );
    assert_eq!(ctx.alive.load(SeqCst), 0, "{what}: tasks left alive");
}

/// The seeds to run: `XTC_COOP_SEEDS` of them (1 by default) from `XTC_COOP_SEED0` (0).
fn seeds() -> std::ops::Range<u64> {
    let var = |name, default| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let first = var("XTC_COOP_SEED0", 0);
    first..first + var("XTC_COOP_SEEDS", 1)
}

fn run_seed(exec: &Executor, n: usize, seed: u64, what: &str) {
    let ctx = Arc::new(Ctx::default());
    let log: CallLog = Arc::default();
    let mut s = seed | 1;
    for (me, ends) in channel_ends(n, &mut s).into_iter().enumerate() {
        let (c, l, ss) = (ctx.clone(), log.clone(), rng(&mut s));
        drop(
            exec.spawn_on(me, move || shard_main(me, n, ss, c, l, ends))
                .unwrap(),
        );
    }
    let r = common::run_within(exec, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{what}: run() hung"));
    r.unwrap_or_else(|e| panic!("{what}: run(): {e}"));
    check_calls(&ctx, &log, n);
    check(
        &ctx,
        n * PER_SHARD - usize::from(n > 1) * (PER_SHARD - 1),
        what,
    );
}

#[test]
fn coop_budget_stress_on_each_driver_and_shard_count() {
    for n in [1, 2, 4] {
        // Two shards steal only with eager rebalance (shard 1's parked pinned task keeps it
        // from ever being fully idle); four steal either way.
        let eager = move |b: xtc_shards::Builder| b.eager_rebalance(n == 2);
        io_common::each_driver("coop_stress", n, eager, |driver, exec| {
            for seed in seeds() {
                let seed = 0x2545_f491_4f6c_dd1d ^ (seed << 8 | n as u64);
                run_seed(
                    &exec,
                    n,
                    seed,
                    &format!("{driver}, {n} shards, seed {seed:#x}"),
                );
            }
        });
    }
}

#[test]
fn coop_budget_stress_in_a_local_executor() {
    for seed in seeds() {
        let seed = 0x9e37_79b9_7f4a_7c15 ^ seed << 8;
        let ctx = Arc::new(Ctx::default());
        let log: CallLog = Arc::default();
        let mut s = seed | 1;
        let ends = channel_ends(1, &mut s).pop().unwrap();
        let (c, l, what) = (
            ctx.clone(),
            log.clone(),
            format!("LocalExecutor, seed {seed:#x}"),
        );
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            LocalExecutor::new()
                .unwrap()
                .block_on(shard_main(0, 1, rng(&mut s), c, l, ends));
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{what}: block_on hung"));
        t.join().unwrap();
        check_calls(&ctx, &log, 1);
        check(&ctx, PER_SHARD, &what);
    }
}

/// Runs `fut` to its end the way a foreign executor blocking inside a task does
/// (`futures::executor::block_on`: poll, and poll again once woken, all within the task's
/// one poll), giving up after `limit` polls: `None` then, where that executor spun for good.
fn foreign_block_on<F: Future>(fut: F, limit: u32) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut polls = 0;
    futures::executor::block_on(poll_fn(|cx| {
        polls += 1;
        if polls > limit {
            return Poll::Ready(None);
        }
        fut.as_mut().poll(cx).map(Some)
    }))
}

/// A foreign executor blocking inside a task (`futures::executor::block_on` around a sleep
/// loop, or an epoll read loop over a stream that holds more bytes): the task's poll never
/// ends there, so the budget it spent is never reset, and a budget that kept refusing (each
/// refused call woke the future, which that executor polled again at once) livelocked it,
/// 100% CPU and no progress, after the 128th ready call.
#[test]
fn a_foreign_block_on_inside_a_task_does_not_spin_on_the_spent_budget() {
    const N: usize = 1_000;
    io_common::on_each_driver("foreign_block_on", 1, |driver| async move {
        let slept = foreign_block_on(
            async {
                for _ in 0..N {
                    sleep(Duration::ZERO).await;
                }
            },
            100_000,
        );
        assert!(slept.is_some(), "{driver:?}: {N} passed sleeps never ended");
        if driver != xtc_shards::io::Driver::Epoll {
            // An io_uring read completes through a loop turn, which never comes there.
            return;
        }
        let (a, b) = UnixStream::pair().unwrap();
        let (r, _) = b.write_all(vec![7u8; N]).await;
        r.unwrap();
        let read = foreign_block_on(
            async {
                let mut buf = vec![0u8; 1];
                for i in 0..N {
                    let (r, back) = a.read(buf).await;
                    assert_eq!(r.unwrap(), 1, "read {i}");
                    buf = back;
                }
            },
            100_000,
        );
        assert!(read.is_some(), "{driver:?}: {N} ready reads never ended");
    });
}
