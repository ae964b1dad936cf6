//! A sharded work-queue server (the shape of a beanstalkd or a Redis list used as a queue, one
//! shard per core): every queue is owned by the shard its name hashes to, which
//! keeps its jobs and the GETs waiting for them in a `ShardLocal` (an `Rc` per waiter, a
//! `RefCell` map: no lock, no atomic). Every shard serves connections on its own
//! `SO_REUSEPORT` listener; a request for a queue another shard owns travels there with
//! `shard::submit_to`, and a GET that finds its queue empty WAITS THERE, on the owner: the
//! submitted future parks in the queue's line of waiters until a PUT hands it a job (oldest
//! waiter first) or `--wait` passes, then comes back over the ring mesh with its answer.
//!
//! Protocol, one request per line (requests may be pipelined; replies come in order, so a
//! waiting GET holds up the replies behind it; a last line without its `\n` is answered when
//! the client closes its end), one reply line each:
//!
//! | request | reply |
//! | --- | --- |
//! | `PUT queue payload` (the payload is the rest of the line) | `OK n`, `n` the jobs queued after it (`OK 0`: a waiting GET took it at once), or `FULL` when the queue holds `--max` jobs (nothing is dropped: try again later) |
//! | `GET queue` | `JOB payload` at once if there is one; else it waits up to `--wait` for a PUT, then `NONE` |
//! | `LEN queue` | `LEN n`, the jobs queued |
//! | anything else | `ERR what to send instead` |
//!
//! The queues live in memory: a server that stops loses its jobs. While it runs, each job is
//! handed out once, and waiting GETs are served in the order they arrived. A GET that goes
//! away while it waits gives up its place in line, and a job already handed to it goes to the
//! next waiter, or back to the head of its queue (before the jobs queued since): the GET's
//! future is dropped when its connection is reset while it waits. (A GET sent to another shard
//! cannot be called back: `submit_to` runs its future to the end. Its answer is what is
//! dropped, and a job in it goes back to its queue; the PUT that handed it over may have read
//! `OK 0` meanwhile.) A job is the client's once the write of its `JOB` reply succeeds; a
//! write that fails gives it back too, so a client whose connection broke part-way through
//! that write may have got the job that another client then gets as well. TCP cannot say
//! which bytes a peer read: a queue that must hand each job out exactly once, across broken
//! connections, needs acknowledgements in its protocol. A client that half-closes (`nc -N`)
//! still gets its replies.
//!
//! With `--producers P --consumers C` it also runs P producer and C consumer clients (pinned
//! tasks spread over the shards, over TCP to the server): the producers PUT `--jobs` jobs in
//! all over `--queues` queues, each payload naming its producer and sequence number, and back
//! off on `FULL`; the consumers GET until every job is taken. It then checks that every job
//! was received exactly once and that each consumer got each producer's jobs of a queue in the
//! order they were put, prints where the requests were served, and exits (non-zero if any check
//! failed). The last consumers' GETs wait out `--wait` before they see there is no more work.
//!
//! Run: `cargo run --release --example queue -- --producers 4 --consumers 4 --jobs 10000`
//! (`--help` lists the flags) or serve forever: `cargo run --release --example queue -- --addr
//! 127.0.0.1:7003`, then `printf 'PUT jobs a\nPUT jobs b\nLEN jobs\nGET jobs\nGET jobs\nGET
//! jobs\n' | nc -N 127.0.0.1 7003` (`-N`, OpenBSD netcat's, Debian's and Ubuntu's `nc`: close
//! after the input, so the replies end the run; the last GET waits a second, then `NONE`).
//! (`XTC_SHARDS` sets the shard count, `XTC_IO=epoll` picks the epoll driver.)

#[path = "shared/lines.rs"]
mod lines;
// `shared::parse` knows the flags of one client kind; this example parses its own (producers,
// consumers, the queues' bound and wait), so that parser is unused here.
#[allow(dead_code)]
mod shared;

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, HashMap, VecDeque},
    future::Future,
    net::SocketAddr,
    rc::Rc,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Poll, Waker},
    time::Duration,
};

use futures::future::Either;
use xtc::net::TcpStream;

use lines::{owner, Client, LINE_MAX, PENDING_KEPT, REPLY_CHUNK};

/// Every shard's queues: those whose names hash to it ([`owner`]). Built on each shard at its
/// first use and dropped there when the run ends; a queue with no job and no waiter is removed,
/// so names that came and went cost nothing.
static QUEUES: xtc::ShardLocal<RefCell<HashMap<Vec<u8>, Queue>>> =
    xtc::ShardLocal::new(|_| RefCell::default());

/// One queue, on its owner.
#[derive(Default)]
struct Queue {
    /// Jobs not yet handed out, oldest first. Never non-empty while `waiters` is: a PUT hands
    /// its job to a waiter before it queues one.
    jobs: VecDeque<Vec<u8>>,
    /// GETs waiting for a job, by arrival ticket: the first entry is served first. A map, not a
    /// `VecDeque`, because a waiter that gives up leaves from the middle (in O(log n)).
    waiters: BTreeMap<u64, Rc<Slot>>,
    /// The next waiter's ticket.
    next_ticket: u64,
}

/// Where a PUT leaves a job for one waiting GET, and how it wakes it.
#[derive(Default)]
struct Slot {
    job: RefCell<Option<Vec<u8>>>,
    waker: Cell<Option<Waker>>,
}

impl Queue {
    /// Hands `job` to the oldest waiting GET (taking it out of line) and returns the waker to
    /// wake once the map's borrow is released; `Err(job)` back if none waits.
    fn hand_over(&mut self, job: Vec<u8>) -> Result<Option<Waker>, Vec<u8>> {
        match self.waiters.pop_first() {
            Some((_, slot)) => {
                *slot.job.borrow_mut() = Some(job);
                Ok(slot.waker.take())
            }
            None => Err(job),
        }
    }
}

/// Runs `f` on this shard's queue `name`, made empty if there is none, and removes the queue
/// again if `f` leaves it without jobs and waiters. `None` off any loop or after this shard's
/// run ended (a `Drop` then has nothing to give back to).
fn with_queue<R>(name: &[u8], f: impl FnOnce(&mut Queue) -> R) -> Option<R> {
    let queues = QUEUES.try_get().ok()?;
    let mut map = queues.borrow_mut();
    if !map.contains_key(name) {
        map.insert(name.to_vec(), Queue::default());
    }
    let q = map.get_mut(name)?;
    let r = f(q);
    if q.jobs.is_empty() && q.waiters.is_empty() {
        map.remove(name);
    }
    Some(r)
}

/// Runs `f` on this shard's queue `name`, `None` if there is none (an empty queue is not
/// kept): a LEN of a queue nobody used allocates nothing.
fn peek<R>(name: &[u8], f: impl FnOnce(Option<&Queue>) -> R) -> R {
    match QUEUES.try_get() {
        Ok(queues) => f(queues.borrow().get(name)),
        Err(_) => f(None),
    }
}

/// Puts `job` on queue `name` (on its owner): to the oldest waiting GET, else at the tail
/// unless the queue holds `max` jobs.
fn put(name: &[u8], job: Vec<u8>, max: usize) -> Answer {
    let (answer, wake) = with_queue(name, |q| match q.hand_over(job) {
        Ok(wake) => (Answer::Queued(q.jobs.len()), wake),
        Err(_) if q.jobs.len() >= max => (Answer::Full, None),
        Err(job) => {
            q.jobs.push_back(job);
            (Answer::Queued(q.jobs.len()), None)
        }
    })
    .unwrap_or((Answer::Stopping, None));
    // Woken after the borrow ends: a wake only schedules the task, but nothing needs to run
    // under the borrow.
    if let Some(w) = wake {
        w.wake();
    }
    answer
}

/// Gives back a job that was handed out but never reached its client: to the oldest waiting
/// GET, else at the head of its queue, where it was (past `--max` if PUTs filled the queue
/// meanwhile: a job is never dropped to keep the bound).
fn give_back_here(name: &[u8], job: Vec<u8>) {
    let wake = with_queue(name, |q| match q.hand_over(job) {
        Ok(wake) => wake,
        Err(job) => {
            q.jobs.push_front(job);
            None
        }
    })
    .flatten();
    if let Some(w) = wake {
        w.wake();
    }
}

/// The number of GETs waiting on queue `name` (on its owner); for the tests.
#[cfg(test)]
fn waiting_here(name: &[u8]) -> usize {
    peek(name, |q| q.map_or(0, |q| q.waiters.len()))
}

/// Takes the oldest job of queue `name` (on its owner), waiting up to `wait` for one if it is
/// empty. This future is what a GET from another shard runs on the owner: its wait happens
/// here, parked in the queue's line, not on the asking shard.
async fn take(name: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let joined = with_queue(name, |q| {
        if let Some(job) = q.jobs.pop_front() {
            return Err(Some(job));
        }
        if wait.is_zero() {
            return Err(None);
        }
        let (ticket, slot) = (q.next_ticket, Rc::new(Slot::default()));
        q.next_ticket += 1;
        q.waiters.insert(ticket, slot.clone());
        Ok((ticket, slot))
    });
    let (ticket, slot) = match joined {
        Some(Ok(joined)) => joined,
        Some(Err(now)) => return now,
        None => return None,
    };
    // From here until it returns, `place` leaves the line if this future is dropped, and gives
    // back a job a PUT left in the slot that was not taken yet.
    let place = Place { name, ticket, slot };
    let arrival = std::future::poll_fn(|cx| {
        if place.slot.job.borrow().is_some() {
            return Poll::Ready(());
        }
        place.slot.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    });
    // Past the wait, a job that came in the same turn as the timer is still taken.
    let _ = xtc::time::timeout(wait, arrival).await;
    let job = place.slot.job.borrow_mut().take();
    job
}

/// A GET's place in its queue's line, while it waits on the owner.
struct Place<'a> {
    name: &'a [u8],
    ticket: u64,
    slot: Rc<Slot>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        // Still in line (timed out, or dropped while it waited): leave it, so that no PUT hands
        // a job to a GET that is gone.
        let left = with_queue(self.name, |q| q.waiters.remove(&self.ticket));
        // Handed a job it never took (its future dropped between the PUT's wake and its poll):
        // the job goes to the next waiter, or back to the head of the queue.
        if let Some(job) = self.slot.job.borrow_mut().take() {
            give_back_here(self.name, job);
        }
        drop(left);
    }
}

/// A job on its way from its queue's owner to the connection whose GET took it. If it is
/// dropped before [`open`](Self::open) (the asking connection went away while it waited on
/// another shard, and `submit_to` ran the wait to its end anyway; or the reply arrived as the
/// connection's future was dropped), the job goes back to its queue.
struct Handout {
    name: Vec<u8>,
    owner: usize,
    job: Option<Vec<u8>>,
}

impl Handout {
    /// The job, which is now the client's.
    fn open(mut self) -> Option<Vec<u8>> {
        self.job.take()
    }
}

impl Drop for Handout {
    fn drop(&mut self) {
        let Some(job) = self.job.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        if xtc::shard::try_id() == Some(self.owner) {
            // Dropped on the owner (the asking side's future was gone when the wait ended).
            give_back_here(&name, job);
        } else if let Some(h) = xtc::shard::handle() {
            // Dropped on the asking shard, as the reply arrived. Queued at once over the
            // ring, so a `Drop` may send it; `Err` only once the executor is stopping, when
            // every queue goes anyway.
            let _ = h.send_to(
                self.owner,
                move || async move { give_back_here(&name, job) },
            );
        }
    }
}

/// One request, run on its queue's owner.
#[derive(Debug, PartialEq)]
enum Request {
    Put { name: Vec<u8>, job: Vec<u8> },
    Get { name: Vec<u8> },
    Len { name: Vec<u8> },
}

impl Request {
    fn name(&self) -> &[u8] {
        match self {
            Request::Put { name, .. } | Request::Get { name } | Request::Len { name } => name,
        }
    }
}

/// The owner's answer to one request, sent back to the serving shard.
enum Answer {
    Queued(usize),
    Full,
    Got(Handout),
    Len(usize),
    /// The owner's run ended under the request.
    Stopping,
}

impl Answer {
    /// The reply line, without `\n`. A job handed out is the client's from here on.
    #[cfg(test)]
    fn reply(self) -> Vec<u8> {
        let (line, held) = self.reply_held();
        held.map(Handout::open);
        line
    }

    /// The reply line, and the job in it still held: it is the client's once the line is
    /// written ([`Handout::open`]); dropped (the write failed), it goes back to its queue.
    fn reply_held(self) -> (Vec<u8>, Option<Handout>) {
        let line = match self {
            Answer::Queued(n) => format!("OK {n}").into_bytes(),
            Answer::Full => b"FULL".to_vec(),
            Answer::Got(h) => {
                return match &h.job {
                    Some(job) => ([&b"JOB "[..], job].concat(), Some(h)),
                    None => (b"NONE".to_vec(), None),
                }
            }
            Answer::Len(n) => format!("LEN {n}").into_bytes(),
            Answer::Stopping => b"ERR the server is stopping".to_vec(),
        };
        (line, None)
    }
}

/// The queues' bound and a GET's longest wait (`--max`, `--wait`).
#[derive(Clone, Copy)]
struct Limits {
    max: usize,
    wait: Duration,
}

/// One request line (without its `\n`), or the `ERR` reply for a malformed one.
fn request(line: &[u8]) -> Result<Request, &'static str> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (cmd, rest) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &b""[..]),
    };
    let name = |rest: &[u8]| -> Result<Vec<u8>, &'static str> {
        if rest.is_empty() || rest.contains(&b' ') {
            return Err("ERR a queue name is one word: GET queue, LEN queue");
        }
        Ok(rest.to_vec())
    };
    match cmd {
        b"PUT" => match rest.iter().position(|&b| b == b' ') {
            Some(i) if i > 0 && i + 1 < rest.len() => Ok(Request::Put {
                name: rest[..i].to_vec(),
                job: rest[i + 1..].to_vec(),
            }),
            _ => Err("ERR PUT needs a queue and a payload: PUT queue payload"),
        },
        b"GET" => Ok(Request::Get { name: name(rest)? }),
        b"LEN" => Ok(Request::Len { name: name(rest)? }),
        _ => Err("ERR unknown request; send PUT queue payload, GET queue or LEN queue"),
    }
}

/// Runs `req` on this shard, which owns its queue.
async fn apply(req: Request, limits: Limits) -> Answer {
    match req {
        Request::Put { name, job } => put(&name, job, limits.max),
        Request::Get { name } => {
            let job = take(&name, limits.wait).await;
            Answer::Got(Handout {
                name,
                owner: xtc::shard::id(),
                job,
            })
        }
        Request::Len { name } => Answer::Len(peek(&name, |q| q.map_or(0, |q| q.jobs.len()))),
    }
}

/// Requests served on their queue's own shard, and those sent to the owner, per shard.
/// `Cell`s: each shard counts in its own slot only.
#[derive(Default)]
struct ShardCounts {
    own: Cell<u64>,
    sent: Cell<u64>,
}

type Counts = Arc<xtc::Sharded<ShardCounts>>;

/// The reply to one request: on this shard if it owns the queue, else on the owner through
/// `submit_to` (one ring message each way; a GET's wait, if any, in between on the owner).
#[cfg(test)]
async fn answer(counts: &Counts, limits: Limits, req: Request) -> Vec<u8> {
    let (line, held) = answer_held(counts, limits, req).await;
    held.map(Handout::open);
    line
}

/// [`answer`], with the job in the reply held until the reply is written.
async fn answer_held(counts: &Counts, limits: Limits, req: Request) -> (Vec<u8>, Option<Handout>) {
    let to = owner(req.name());
    let c = counts.get();
    if to == xtc::shard::id() {
        c.own.set(c.own.get() + 1);
        return apply(req, limits).await.reply_held();
    }
    c.sent.set(c.sent.get() + 1);
    match xtc::shard::submit_to(to, move || apply(req, limits)).await {
        Ok(answer) => answer.reply_held(),
        Err(e) => (format!("ERR shard {to}: {e}").into_bytes(), None),
    }
}

/// Writes `replies` (emptied for reuse) and hands the jobs in them to the client; `false`
/// if the write failed, when `held`'s jobs go back to their queues (a failed write may have
/// got part of the replies out: such a job may reach this client and another one).
async fn flush(stream: &TcpStream, replies: &mut Vec<u8>, held: &mut Vec<Handout>) -> bool {
    let (r, mut sent) = stream.write_all(std::mem::take(replies)).await;
    if r.is_err() {
        held.clear(); // dropped: back to their queues
        return false;
    }
    held.drain(..).for_each(|h| drop(h.open()));
    sent.clear();
    *replies = sent;
    true
}

/// Awaits `reply` (a GET, which may wait) while it reads what the peer sends meanwhile into
/// `pending` (pipelined requests, answered next; no more once it holds a line's limit): a
/// read error (the peer reset the connection) drops the GET, so that it gives up its place in
/// line, and returns `None`. An end of stream is a client that has sent everything and waits
/// for its replies (`nc -N`): the GET goes on. A read dropped when the GET wins loses no bytes
/// (`TcpStream::read`): the next read gets them.
async fn unless_reset<R>(
    stream: &TcpStream,
    reply: impl Future<Output = R>,
    pending: &mut Vec<u8>,
) -> Option<R> {
    let mut reply = std::pin::pin!(reply);
    loop {
        if pending.len() > LINE_MAX {
            return Some(reply.await);
        }
        let read = std::pin::pin!(stream.read(Vec::with_capacity(4096)));
        match futures::future::select(reply.as_mut(), read).await {
            Either::Left((r, _)) => return Some(r),
            Either::Right(((Ok(0), _), _)) => return Some(reply.await),
            Either::Right(((Ok(n), b), _)) => pending.extend_from_slice(&b[..n]),
            Either::Right(((Err(_), _), _)) => return None,
        }
    }
}

/// Serves one connection until the peer closes, as `kv` does: every complete line read so far
/// is answered, in order, and the replies go out in one write, or in writes of about
/// [`REPLY_CHUNK`] as they grow. A GET's wait watches the connection ([`unless_reset`]).
async fn serve(stream: TcpStream, limits: Limits, counts: Counts) {
    let _ = stream.set_nodelay(true);
    let mut pending = Vec::new();
    // `pending[..searched]` holds no `\n`: each read's bytes are searched once.
    let mut searched = 0;
    let mut buf = Vec::with_capacity(4096);
    loop {
        // The peer's end of stream: a last request without its `\n` is answered too.
        let Some(eof) = lines::read_more(&stream, &mut buf, &mut pending).await else {
            return;
        };
        let mut replies = Vec::new();
        // The jobs in `replies`, the client's once they are written.
        let mut held: Vec<Handout> = Vec::new();
        let mut start = 0;
        while let Some(i) = pending[searched..].iter().position(|&c| c == b'\n') {
            let end = searched + i;
            searched = end + 1;
            let line = &pending[start..end];
            // A line that ended within the read that took it past the limit is refused too
            // (the check after this loop sees only an unfinished rest).
            let (reply, job) = if line.len() > LINE_MAX {
                (b"ERR line over 1 MiB".to_vec(), None)
            } else {
                match request(line) {
                    Ok(req @ Request::Get { .. }) => {
                        let mut get = std::pin::pin!(answer_held(&counts, limits, req));
                        match futures::poll!(get.as_mut()) {
                            Poll::Ready(reply) => reply,
                            Poll::Pending => {
                                // It waits (or went to another shard): the replies before it
                                // go out first, as the client may wait for them, not for it.
                                // The GET is polled meanwhile: a write that blocks (a client
                                // that does not read) must not keep it in line past `--wait`.
                                let mut done = None;
                                if !replies.is_empty() {
                                    let written =
                                        std::pin::pin!(flush(&stream, &mut replies, &mut held));
                                    let ok = match futures::future::select(written, get.as_mut())
                                        .await
                                    {
                                        Either::Left((ok, _)) => ok,
                                        Either::Right((reply, written)) => {
                                            done = Some(reply);
                                            written.await
                                        }
                                    };
                                    if !ok {
                                        return;
                                    }
                                }
                                match done {
                                    Some(reply) => reply,
                                    None => match unless_reset(&stream, get, &mut pending).await {
                                        Some(reply) => reply,
                                        None => return,
                                    },
                                }
                            }
                        }
                    }
                    Ok(req) => answer_held(&counts, limits, req).await,
                    Err(err) => (err.as_bytes().to_vec(), None),
                }
            };
            held.extend(job);
            replies.extend_from_slice(&reply);
            replies.push(b'\n');
            start = end + 1;
            if replies.len() >= REPLY_CHUNK && !flush(&stream, &mut replies, &mut held).await {
                return;
            }
        }
        pending.drain(..start);
        // A long line's room goes once it is answered.
        if pending.capacity() > PENDING_KEPT && pending.len() <= PENDING_KEPT {
            pending.shrink_to(PENDING_KEPT);
        }
        searched = pending.len();
        if pending.len() > LINE_MAX {
            // The batch's replies first: a GET's wait may have read more than a read's worth
            // (`unless_reset`), so lines answered in this batch can precede the long one.
            replies.extend_from_slice(b"ERR line over 1 MiB\n");
            if !flush(&stream, &mut replies, &mut held).await {
                return;
            }
            lines::close_after_refusal(stream, buf).await;
            return;
        }
        if !replies.is_empty() && !flush(&stream, &mut replies, &mut held).await {
            return;
        }
        if eof {
            return;
        }
    }
}

/// The flags.
struct Options {
    addr: SocketAddr,
    /// Producer and consumer clients; both 0: serve only.
    producers: usize,
    consumers: usize,
    /// Jobs in all, split over the producers.
    jobs: usize,
    queues: usize,
    limits: Limits,
}

/// `--addr` without a self-check: `kv` serves 7001, `proxy` 7002.
const DEFAULT_PORT: u16 = 7003;

/// The text `--help` prints.
const USAGE: &str = "usage: queue [--addr A] [--max M] [--wait MS] \
[--producers P --consumers C --jobs J --queues Q]

  --addr A        address to serve (default 127.0.0.1:7003; with clients, a free port on
                  127.0.0.1)
  --max M         jobs a queue holds before a PUT gets FULL (default 100000)
  --wait MS       milliseconds a GET on an empty queue waits for a PUT before NONE (default
                  1000; 0: answer NONE at once)
  --producers P   also run P producers and C consumers against the server, check that every
  --consumers C   job arrives once and in order, print per-shard stats and exit (either one
                  given: the other defaults to 4; neither: serve until Ctrl-C)
  --jobs J        jobs in all, split over the producers (default 10000)
  --queues Q      queues the producers spread their jobs over (default 4)
  -h, --help      print this and exit

XTC_SHARDS sets the shard count, XTC_IO=epoll|io_uring the I/O driver and RUST_LOG the
log level (default warn); see the xtc crate docs for every XTC_* variable.";

/// Parses the flags (without the program name); `Ok(None)` for `--help`.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let (mut producers, mut consumers) = (None, None);
    let mut o = Options {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        producers: 0,
        consumers: 0,
        jobs: 10_000,
        queues: 4,
        limits: Limits {
            max: 100_000,
            wait: Duration::from_secs(1),
        },
    };
    let mut addr_given = false;
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if matches!(flag.as_str(), "--help" | "-h") {
            return Ok(None);
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || -> Result<usize, String> {
            value.parse().map_err(|e| {
                format!("{flag} takes a whole number such as 1000, not {value:?} ({e})")
            })
        };
        match flag.as_str() {
            "--addr" => {
                o.addr = value.parse().map_err(|e| {
                    format!(
                        "--addr takes an IP address and port such as 127.0.0.1:7003, not \
                         {value:?} ({e})"
                    )
                })?;
                addr_given = true;
            }
            "--producers" => producers = Some(number()?),
            "--consumers" => consumers = Some(number()?),
            "--jobs" => o.jobs = number()?,
            "--queues" => o.queues = number()?,
            "--max" => o.limits.max = number()?,
            "--wait" => o.limits.wait = Duration::from_millis(number()? as u64),
            other => {
                return Err(format!(
                    "unknown flag {other}; flags: --addr A --max M --wait MS --producers P \
                     --consumers C --jobs J --queues Q (--help says more)"
                ))
            }
        }
    }
    if producers.is_some() || consumers.is_some() {
        o.producers = producers.unwrap_or(4);
        o.consumers = consumers.unwrap_or(4);
        // The check keeps a count per job and a task per client: far past these, the run
        // would end in a failed allocation, not in an answer.
        if o.producers.saturating_add(o.consumers) > MAX_CLIENTS
            || o.jobs > MAX_JOBS
            || o.queues > MAX_QUEUES
        {
            return Err(format!(
                "a self-check takes at most {MAX_CLIENTS} clients, {MAX_JOBS} jobs and \
                 {MAX_QUEUES} queues; lower --producers/--consumers, --jobs or --queues"
            ));
        }
        if o.producers == 0 || o.consumers == 0 || o.queues == 0 {
            return Err(
                "a self-check needs at least one producer, one consumer and one queue \
                        (--producers, --consumers, --queues)"
                    .into(),
            );
        }
        if o.limits.max == 0 && o.limits.wait.is_zero() {
            return Err(
                "--max 0 queues nothing and --wait 0 waits for nothing: no job can \
                        pass; raise one of them"
                    .into(),
            );
        }
    } else if !addr_given {
        o.addr.set_port(DEFAULT_PORT);
    }
    Ok(Some(o))
}

/// The self-check's limits (see [`parse`]).
const MAX_CLIENTS: usize = 10_000;
const MAX_JOBS: usize = 100_000_000;
const MAX_QUEUES: usize = 1_000_000;

/// What the producers and consumers of one self-check share (client side, not the server's).
struct Run {
    producers: usize,
    queues: usize,
    jobs: usize,
    /// Jobs the consumers have received.
    taken: AtomicUsize,
    /// Producers still putting: once none is, a consumer that finds every queue empty stops
    /// (a failed producer would otherwise keep the consumers asking for good).
    putting: AtomicUsize,
    /// Each consumer's jobs, `(producer, sequence)`, added when it ends.
    received: Mutex<Vec<(usize, usize)>>,
    fulls: AtomicU64,
    nones: AtomicU64,
    /// When the clients were started, and when the last job was received: the rate, which the
    /// run's own length understates by the last GETs' `--wait`.
    started: std::time::Instant,
    all_taken: std::sync::OnceLock<std::time::Instant>,
}

impl Run {
    /// The jobs producer `p` puts.
    fn jobs_of(&self, p: usize) -> usize {
        self.jobs / self.producers + usize::from(p < self.jobs % self.producers)
    }

    /// The queue of producer `p`'s job `i`: each producer cycles over all queues.
    fn queue_of(&self, p: usize, i: usize) -> usize {
        (p + i) % self.queues
    }
}

/// Producer `p`: PUTs its jobs (`p<p>-<i>` on queue `q<n>`), each after the previous one's
/// reply, so that its jobs of one queue are queued in sequence. It puts to the queues in turn;
/// a queue that answers `FULL` (the server's backpressure) gets that job again on the
/// producer's next turn there, and after a round of `FULL`s the producer sleeps a millisecond.
/// Waiting on the full queue alone, the producers all ended up waiting on full queues while the
/// consumers waited out `--wait` on empty ones. A malformed request must get an `ERR` and leave
/// the connection usable.
async fn producer(
    addr: SocketAddr,
    p: usize,
    run: Arc<Run>,
    progress: shared::Progress,
) -> std::io::Result<()> {
    let mut c = Client::connect(addr, Some(progress)).await?;
    let result = async {
        let bad = c.call("PUSH q0 x\n".into()).await?;
        if !bad.starts_with("ERR ") {
            return Err(std::io::Error::other(format!(
                "a bad request got {bad:?}, want an ERR"
            )));
        }
        let (n, queues) = (run.jobs_of(p), run.queues);
        // This producer's next job for each queue: those of queue `q` are `i` with
        // `queue_of(p, i) == q`, every `queues`-th from the first.
        let mut next: Vec<usize> = (0..queues)
            .map(|q| (q + queues - p % queues) % queues)
            .collect();
        let (mut left, mut q, mut fulls_in_a_row) = (n, p % queues, 0);
        while left > 0 {
            let i = next[q];
            if i >= n {
                q = (q + 1) % queues; // none left for this queue
                continue;
            }
            let line = format!("PUT q{q} p{p}-{i}\n");
            let reply = c.call(line.clone()).await?;
            q = (q + 1) % queues;
            if reply == "FULL" {
                run.fulls.fetch_add(1, Ordering::Relaxed);
                fulls_in_a_row += 1;
                if fulls_in_a_row >= queues {
                    fulls_in_a_row = 0;
                    xtc::time::sleep(Duration::from_millis(1)).await;
                }
                continue;
            }
            let queued = reply.strip_prefix("OK ").map(str::parse::<usize>);
            if !matches!(queued, Some(Ok(_))) {
                return Err(std::io::Error::other(format!("{line:?} got {reply:?}")));
            }
            fulls_in_a_row = 0;
            next[run.queue_of(p, i)] += queues;
            left -= 1;
        }
        Ok(())
    }
    .await;
    run.putting.fetch_sub(1, Ordering::AcqRel);
    result
}

/// Consumer `id`: GETs from one queue while it has jobs, and moves to the next on `NONE`,
/// until every job is taken. Checks each job's queue and that the jobs of each producer on
/// each queue come in the order they were put (a FIFO queue hands them out in that order, so
/// one consumer sees them rising).
async fn consumer(
    addr: SocketAddr,
    id: usize,
    run: Arc<Run>,
    progress: shared::Progress,
) -> std::io::Result<()> {
    let mut c = Client::connect(addr, Some(progress)).await?;
    let fail = |what: String| std::io::Error::other(format!("consumer {id}: {what}"));
    let mut mine = Vec::new();
    // The last sequence number seen, per producer and queue.
    let mut last: HashMap<(usize, usize), usize> = HashMap::new();
    let mut queue = id % run.queues;
    // `NONE`s in a row since the producers finished.
    let mut empty_after_puts = 0;
    while run.taken.load(Ordering::Acquire) < run.jobs {
        let reply = c.call(format!("GET q{queue}\n")).await?;
        if reply == "NONE" {
            run.nones.fetch_add(1, Ordering::Relaxed);
            if run.putting.load(Ordering::Acquire) == 0 {
                empty_after_puts += 1;
                if empty_after_puts > run.queues {
                    break; // every queue empty, and nobody is putting: the check counts
                }
            }
            // On to the longest queue, or the next one if all are empty. Moving on to the
            // next one alone, with fewer consumers than queues and a small `--max`, left them
            // waiting out `--wait` on empty queues while the producers waited on full ones.
            let mut longest = (0, (queue + 1) % run.queues);
            for q in 0..run.queues {
                let len = c.call(format!("LEN q{q}\n")).await?;
                let Some(n) = len.strip_prefix("LEN ").and_then(|n| n.parse().ok()) else {
                    return Err(fail(format!("LEN q{q} got {len:?}")));
                };
                if n > longest.0 {
                    longest = (n, q);
                }
            }
            queue = longest.1;
            continue;
        }
        empty_after_puts = 0;
        let job = reply
            .strip_prefix("JOB p")
            .and_then(|j| j.split_once('-'))
            .and_then(|(p, i)| Some((p.parse::<usize>().ok()?, i.parse::<usize>().ok()?)));
        let Some((p, i)) = job.filter(|&(p, _)| p < run.producers) else {
            return Err(fail(format!("GET q{queue} got {reply:?}")));
        };
        if run.queue_of(p, i) != queue {
            return Err(fail(format!("job p{p}-{i} came from q{queue}")));
        }
        if let Some(before) = last.insert((p, queue), i) {
            if before >= i {
                return Err(fail(format!(
                    "q{queue} handed out p{p}-{i} after p{p}-{before}"
                )));
            }
        }
        mine.push((p, i));
        if run.taken.fetch_add(1, Ordering::AcqRel) + 1 == run.jobs {
            let _ = run.all_taken.set(std::time::Instant::now());
        }
    }
    run.received
        .lock()
        .map_err(|_| fail("a consumer panicked".into()))?
        .extend(mine);
    Ok(())
}

/// The final check: every job put was received exactly once, and every queue is empty.
async fn check_all(addr: SocketAddr, run: Arc<Run>) -> Result<(), String> {
    let received = std::mem::take(&mut *run.received.lock().map_err(|e| e.to_string())?);
    let mut seen: Vec<Vec<u32>> = (0..run.producers)
        .map(|p| vec![0; run.jobs_of(p)])
        .collect();
    let mut problems = Vec::new();
    for &(p, i) in &received {
        match seen.get_mut(p).and_then(|s| s.get_mut(i)) {
            Some(n) => *n += 1,
            None => problems.push(format!("p{p}-{i} was never put")),
        }
    }
    for (p, counts) in seen.iter().enumerate() {
        for (i, &n) in counts.iter().enumerate() {
            match n {
                1 => {}
                0 => problems.push(format!("p{p}-{i} was never received")),
                n => problems.push(format!("p{p}-{i} was received {n} times")),
            }
        }
    }
    let mut c = Client::connect(addr, None)
        .await
        .map_err(|e| format!("LEN: {e}"))?;
    for q in 0..run.queues {
        let reply = c
            .call(format!("LEN q{q}\n"))
            .await
            .map_err(|e| format!("LEN: {e}"))?;
        if reply != "LEN 0" {
            problems.push(format!("q{q} is left with {reply:?}"));
        }
    }
    shared::out(format_args!(
        "{} jobs received of {} put; {} FULL replies (producers backed off), {} GETs waited \
         out --wait (NONE)",
        received.len(),
        run.jobs,
        run.fulls.load(Ordering::Relaxed),
        run.nones.load(Ordering::Relaxed),
    ));
    if problems.is_empty() {
        return Ok(());
    }
    let shown = problems.len().min(10);
    Err(format!(
        "{} problems, first {shown}: {}",
        problems.len(),
        problems[..shown].join("; ")
    ))
}

/// Serves on `exec`, and with producers and consumers given runs them and the checks;
/// returns once the run ends.
fn serve_and_check(exec: &xtc::Executor, o: &Options) -> Result<(), Box<dyn std::error::Error>> {
    let counts: Counts = Arc::new(xtc::Sharded::new(exec.shard_count(), |_| {
        ShardCounts::default()
    }));
    let limits = o.limits;
    let server = {
        let counts = counts.clone();
        shared::listen(exec, o.addr, move |stream, _| {
            serve(stream, limits, counts.clone())
        })?
    };
    let addr = server.addr;
    if o.producers == 0 {
        shared::out(format_args!(
            "queue server on {addr}, at most {} jobs a queue, GETs wait {} ms (Ctrl-C to stop)",
            limits.max,
            limits.wait.as_millis()
        ));
        exec.run()?;
        return server.check();
    }
    let run = Arc::new(Run {
        producers: o.producers,
        queues: o.queues,
        jobs: o.jobs,
        taken: AtomicUsize::new(0),
        putting: AtomicUsize::new(o.producers),
        received: Mutex::new(Vec::new()),
        fulls: AtomicU64::new(0),
        nones: AtomicU64::new(0),
        started: std::time::Instant::now(),
        all_taken: std::sync::OnceLock::new(),
    });
    let producers = o.producers;
    let driven = {
        let (run, last) = (run.clone(), run.clone());
        shared::drive(
            exec,
            o.producers + o.consumers,
            2,
            move |id, progress| {
                let run = run.clone();
                // One future type for both kinds of client.
                if id < producers {
                    Either::Left(producer(addr, id, run, progress))
                } else {
                    Either::Right(consumer(addr, id - producers, run, progress))
                }
            },
            move || check_all(addr, last.clone()),
        )?
    };
    server.check()?;
    shared::out(format_args!(
        "{} producers, {} consumers, {} queues: {} requests in {:.2} s, {}; {} clients \
         failed; final check {}",
        o.producers,
        o.consumers,
        o.queues,
        driven.done,
        driven.secs,
        match run.all_taken.get() {
            Some(at) => {
                let secs = at.duration_since(run.started).as_secs_f64();
                format!(
                    "every job taken {secs:.2} s after the start, {:.0} jobs/s",
                    run.jobs as f64 / secs
                )
            }
            None => format!(
                "{} of {} jobs taken",
                run.taken.load(Ordering::Relaxed),
                run.jobs
            ),
        },
        driven.failed,
        if driven.check_failed {
            "FAILED"
        } else {
            "passed"
        },
    ));
    let counts = Arc::into_inner(counts).ok_or("the shards still hold the counters")?;
    for (shard, c) in counts.into_inner().into_iter().enumerate() {
        let s = exec.loop_stats(shard)?;
        shared::out(format_args!(
            "shard {shard}: {} requests for its own queues, {} sent to their owner; {} ring \
             messages sent, {} received",
            c.own.get(),
            c.sent.get(),
            s.messages_sent,
            s.messages_received,
        ));
    }
    shared::shard_stats(exec)?;
    driven.verdict()
}

fn main() -> std::process::ExitCode {
    shared::logging();
    shared::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Some(o) = parse(shared::args()?)? else {
        shared::out(format_args!("{USAGE}"));
        return Ok(());
    };
    let exec = shared::executor()?;
    shared::out(format_args!(
        "{} shards, I/O driver {}",
        exec.shard_count(),
        exec.io_driver()
    ));
    serve_and_check(&exec, &o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No test may hang the suite: a wait on a condition gives up (and fails) after this.
    const HANG: Duration = Duration::from_secs(30);

    /// Runs `f`'s future on shard 0 of a fresh `shards`-shard executor.
    fn on_shard_0<F, Fut>(shards: usize, f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let exec = xtc::Executor::builder()
            .shards(shards)
            .oversubscribe(true)
            .build()
            .unwrap();
        exec.block_on(f).unwrap();
    }

    /// A queue name that `shard` owns.
    fn name_owned_by(shard: usize) -> Vec<u8> {
        (0..)
            .map(|i| format!("q{i}").into_bytes())
            .find(|n| owner(n) == shard)
            .unwrap()
    }

    fn len_here(name: &[u8]) -> usize {
        peek(name, |q| q.map_or(0, |q| q.jobs.len()))
    }

    /// Every malformed line gets an `ERR` that says what to send, and no input panics:
    /// the fixed cases, then random lines built from the protocol's own bytes.
    #[test]
    fn bad_requests_get_an_err_never_a_panic() {
        let ok = |line: &[u8]| request(line).unwrap();
        assert_eq!(
            ok(b"PUT q a job with spaces\r"),
            Request::Put {
                name: b"q".to_vec(),
                job: b"a job with spaces".to_vec()
            }
        );
        assert_eq!(
            ok(b"GET q"),
            Request::Get {
                name: b"q".to_vec()
            }
        );
        assert_eq!(
            ok(b"LEN q\r"),
            Request::Len {
                name: b"q".to_vec()
            }
        );
        for bad in [
            &b""[..],
            b"\r",
            b"PUT",
            b"PUT ",
            b"PUT q",
            b"PUT q ",
            b"PUT  x",
            b"GET",
            b"GET ",
            b"GET a b",
            b"LEN",
            b"put q x",
            b"FETCH q",
            b"\xff\xfe",
        ] {
            let e = request(bad).expect_err(&String::from_utf8_lossy(bad));
            assert!(e.starts_with("ERR ") && e.len() > 10, "{bad:?}: {e}");
        }
        // A small LCG: the same lines every run.
        let alphabet = b"PUTGETLEN q\r\n\xff ";
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            let len = (x >> 60) as usize;
            let line: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    alphabet[(x >> 33) as usize % alphabet.len()]
                })
                .collect();
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            if let Err(e) = request(&line) {
                assert!(e.starts_with("ERR "), "{line:?}: {e}");
            }
        }
    }

    /// A PUT gets `FULL` once the queue holds `--max` jobs, takes the job again once a GET has
    /// made room, and a bound of 0 passes jobs only to GETs already waiting.
    #[test]
    fn a_put_at_the_bound_gets_full() {
        xtc::LocalExecutor::new().unwrap().block_on(async {
            let reply = |a: Answer| String::from_utf8(a.reply()).unwrap();
            assert_eq!(reply(put(b"q", b"a".to_vec(), 2)), "OK 1");
            assert_eq!(reply(put(b"q", b"b".to_vec(), 2)), "OK 2");
            assert_eq!(reply(put(b"q", b"c".to_vec(), 2)), "FULL");
            assert_eq!(len_here(b"q"), 2);
            assert_eq!(take(b"q", Duration::ZERO).await.as_deref(), Some(&b"a"[..]));
            assert_eq!(reply(put(b"q", b"c".to_vec(), 2)), "OK 2");
            // Bound 0: a rendezvous.
            assert_eq!(reply(put(b"r", b"x".to_vec(), 0)), "FULL");
            let mut get = std::pin::pin!(take(b"r", HANG));
            assert!(futures::poll!(get.as_mut()).is_pending());
            assert_eq!(reply(put(b"r", b"x".to_vec(), 0)), "OK 0");
            assert_eq!(get.await.as_deref(), Some(&b"x"[..]));
            assert_eq!(len_here(b"r"), 0);
        });
    }

    /// Waiting GETs are served in the order they arrived: each one is registered by its first
    /// poll, in a known order, and then three PUTs come.
    #[test]
    fn waiters_are_served_in_arrival_order() {
        xtc::LocalExecutor::new().unwrap().block_on(async {
            let mut gets: Vec<_> = (0..3).map(|_| Box::pin(take(b"q", HANG))).collect();
            for g in &mut gets {
                assert!(futures::poll!(g.as_mut()).is_pending());
            }
            assert_eq!(waiting_here(b"q"), 3);
            for job in ["a", "b", "c"] {
                // Handed straight to a waiter: nothing is queued.
                assert!(matches!(put(b"q", job.into(), 10), Answer::Queued(0)));
            }
            let mut got = Vec::new();
            for g in gets {
                got.push(String::from_utf8(g.await.unwrap()).unwrap());
            }
            assert_eq!(got, ["a", "b", "c"]);
            assert_eq!(len_here(b"q"), 0);
        });
    }

    /// A waiting GET whose future is dropped swallows no job: dropped after a PUT handed it
    /// a job (before it could take it), the job goes to the next waiter; dropped while it
    /// waits, it leaves the line and the next PUT's job stays queued. Every job is taken once.
    #[test]
    fn a_dropped_waiter_swallows_no_job() {
        xtc::LocalExecutor::new().unwrap().block_on(async {
            let mut first = Box::pin(take(b"q", HANG));
            let mut second = Box::pin(take(b"q", HANG));
            assert!(futures::poll!(first.as_mut()).is_pending());
            assert!(futures::poll!(second.as_mut()).is_pending());
            assert!(matches!(put(b"q", b"a".to_vec(), 10), Answer::Queued(0)));
            drop(first); // handed "a", never polled again
            assert_eq!(second.await.as_deref(), Some(&b"a"[..]));

            let mut gone = Box::pin(take(b"q", HANG));
            assert!(futures::poll!(gone.as_mut()).is_pending());
            drop(gone);
            assert_eq!(waiting_here(b"q"), 0);
            assert!(matches!(put(b"q", b"b".to_vec(), 10), Answer::Queued(1)));
            assert_eq!(take(b"q", HANG).await.as_deref(), Some(&b"b"[..]));
            assert_eq!(take(b"q", Duration::ZERO).await, None);
        });
    }

    /// The same across shards: a GET sent to the queue's owner whose asking future is dropped
    /// while it waits there (`submit_to` runs the wait to its end anyway) hands the job it
    /// gets back to the queue, where the next GET takes it, once; and a job whose handout is
    /// dropped on the asking shard goes back to its owner's queue.
    #[test]
    fn a_cross_shard_waiter_that_goes_away_swallows_no_job() {
        on_shard_0(2, || async {
            let counts: Counts = Arc::new(xtc::Sharded::new(2, |_| ShardCounts::default()));
            let limits = Limits {
                max: 10,
                wait: HANG,
            };
            let name = name_owned_by(1);
            let get = |name: &Vec<u8>| Request::Get { name: name.clone() };
            let waiting = |name: Vec<u8>| async move {
                xtc::shard::submit_to(1, move || async move { waiting_here(&name) })
                    .await
                    .unwrap()
            };
            let mut gone = Box::pin(answer(&counts, limits, get(&name)));
            assert!(futures::poll!(gone.as_mut()).is_pending());
            let t0 = std::time::Instant::now();
            while waiting(name.clone()).await == 0 {
                assert!(t0.elapsed() < HANG, "the GET never reached its owner");
                // Polled again in case its first poll only yielded (its task's budget spent).
                assert!(futures::poll!(gone.as_mut()).is_pending());
                xtc::time::sleep(Duration::from_millis(1)).await;
            }
            drop(gone);
            let reply = answer(&counts, limits, put_req(&name, "x")).await;
            assert_eq!(reply, b"OK 0", "the gone GET still waits on the owner");
            assert_eq!(answer(&counts, limits, get(&name)).await, b"JOB x");
            let now = Limits {
                wait: Duration::ZERO,
                ..limits
            };
            assert_eq!(answer(&counts, now, get(&name)).await, b"NONE");

            // A handout dropped here, on shard 0, for a queue of shard 1.
            drop(Handout {
                name: name.clone(),
                owner: 1,
                job: Some(b"y".to_vec()),
            });
            assert_eq!(answer(&counts, limits, get(&name)).await, b"JOB y");
            assert_eq!(answer(&counts, limits, len_req(&name)).await, b"LEN 0");
        });
    }

    fn put_req(name: &[u8], job: &str) -> Request {
        Request::Put {
            name: name.to_vec(),
            job: job.into(),
        }
    }

    fn len_req(name: &[u8]) -> Request {
        Request::Len {
            name: name.to_vec(),
        }
    }

    /// Over TCP: a client that resets its connection while its GET waits gives up its place
    /// in line (the server watches the connection during the wait), so the next PUT's job is
    /// queued for the next GET instead of being written to the dead connection.
    #[test]
    fn a_reset_connection_gives_up_its_get() {
        use std::io::{BufRead as _, Write as _};
        let exec = shared::service_exec(1);
        let handle = exec.handle();
        let counts: Counts = Arc::new(xtc::Sharded::new(1, |_| ShardCounts::default()));
        let limits = Limits {
            max: 10,
            wait: HANG,
        };
        let server = shared::listen(&exec, "127.0.0.1:0".parse().unwrap(), move |s, _| {
            serve(s, limits, counts.clone())
        })
        .unwrap();
        let addr = server.addr;
        let runner = std::thread::spawn(move || exec.run());
        let waiting = || {
            futures::executor::block_on(handle.submit_to(0, || async { waiting_here(b"q") }))
                .unwrap()
        };
        let until = |what: &str, f: &dyn Fn() -> bool| {
            let t0 = std::time::Instant::now();
            while !f() {
                assert!(t0.elapsed() < HANG, "{what}");
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        let mut gone = std::net::TcpStream::connect(addr).unwrap();
        gone.write_all(b"GET q\n").unwrap();
        until("the GET never waited", &|| waiting() == 1);
        close_with_reset(gone);
        until("the reset GET stayed in line", &|| waiting() == 0);
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"PUT q x\nGET q\nLEN q\n").unwrap();
        let mut lines = std::io::BufReader::new(c.try_clone().unwrap()).lines();
        let mut next = || lines.next().unwrap().unwrap();
        assert_eq!(
            [next(), next(), next()],
            ["OK 1", "JOB x", "LEN 0"].map(String::from)
        );
        handle.stop();
        runner.join().unwrap().unwrap();
    }

    /// A server of `shards` shards on `driver` on a thread of its own, its address, a handle
    /// and the thread.
    fn test_server(
        shards: usize,
        driver: xtc::io::DriverChoice,
        limits: Limits,
    ) -> (
        SocketAddr,
        xtc::Handle,
        std::thread::JoinHandle<xtc::Result<()>>,
    ) {
        let exec = xtc::Executor::builder()
            .shards(shards)
            .service_mode(true)
            .oversubscribe(true)
            .io_driver(driver)
            .build()
            .unwrap();
        let handle = exec.handle();
        let counts: Counts = Arc::new(xtc::Sharded::new(shards, |_| ShardCounts::default()));
        let server = shared::listen(&exec, "127.0.0.1:0".parse().unwrap(), move |s, _| {
            serve(s, limits, counts.clone())
        })
        .unwrap();
        let runner = std::thread::spawn(move || exec.run());
        (server.addr, handle, runner)
    }

    fn wait_until(what: &str, limit: Duration, f: &dyn Fn() -> bool) {
        let t0 = std::time::Instant::now();
        while !f() {
            assert!(t0.elapsed() < limit, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One request line over a fresh connection, its reply line.
    fn call_once(addr: SocketAddr, line: &str) -> String {
        use std::io::{BufRead as _, Write as _};
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(line.as_bytes()).unwrap();
        let mut r = String::new();
        std::io::BufReader::new(c).read_line(&mut r).unwrap();
        r.trim_end().to_string()
    }

    fn waiting_on(handle: &xtc::Handle, owner: usize, name: &'static [u8]) -> usize {
        futures::executor::block_on(
            handle.submit_to(owner, move || async move { waiting_here(name) }),
        )
        .unwrap()
    }

    /// Closes `s` with a reset (`SO_LINGER` 0), as a killed client's socket goes.
    fn close_with_reset(s: std::net::TcpStream) {
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt reads one `linger` through the pointer, valid for the call; the
        // descriptor is the open socket `s` owns.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        drop(s);
    }

    /// A client that half-closes (`nc -N`) while its GET waits, and then resets the
    /// connection (killed, SO_LINGER 0), is not watched any more: a PUT hands the job to its
    /// GET, and the JOB reply's write fails (EPIPE/ECONNRESET). The job goes back to its
    /// queue; marked the client's before the write, it was gone (nobody got it, the queue
    /// empty).
    #[test]
    fn a_reset_after_a_half_close_loses_no_job() {
        for driver in [xtc::io::DriverChoice::Auto, xtc::io::DriverChoice::Epoll] {
            let limits = Limits {
                max: 10,
                wait: HANG,
            };
            let (addr, handle, runner) = test_server(1, driver, limits);
            use std::io::Write as _;
            let mut gone = std::net::TcpStream::connect(addr).unwrap();
            gone.write_all(b"GET q\n").unwrap();
            gone.shutdown(std::net::Shutdown::Write).unwrap();
            wait_until("the GET never waited", HANG, &|| {
                waiting_on(&handle, 0, b"q") == 1
            });
            std::thread::sleep(Duration::from_millis(100)); // the server reads the EOF
            close_with_reset(gone);
            std::thread::sleep(Duration::from_millis(100)); // and gets the reset
            assert_eq!(call_once(addr, "PUT q x\n"), "OK 0", "{driver:?}");
            let t0 = std::time::Instant::now();
            let mut len = String::new();
            while t0.elapsed() < Duration::from_secs(5) {
                len = call_once(addr, "LEN q\n");
                if len == "LEN 1" {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            handle.stop();
            runner.join().unwrap().unwrap();
            assert_eq!(
                len, "LEN 1",
                "{driver:?}: the job handed to the reset GET was lost (its write failed)"
            );
        }
    }

    /// A GET that waits reads the client's next bytes meanwhile (`unless_reset`),
    /// up to the line limit. When those are a GET of a queue with a job and then an
    /// unfinished line over the limit, the batch's end finds `pending` over `LINE_MAX` and
    /// refuses the connection. The batch's replies (`NONE`, and `JOB a` for a job taken from
    /// its queue) go out before the `ERR`; written alone, the `ERR` lost them, and job `a`.
    #[test]
    fn an_over_long_line_after_a_waiting_get_keeps_the_replies_before_it() {
        use std::io::{Read as _, Write as _};
        for driver in [xtc::io::DriverChoice::Auto, xtc::io::DriverChoice::Epoll] {
            let limits = Limits {
                max: 10,
                wait: Duration::from_secs(2),
            };
            let (addr, handle, runner) = test_server(1, driver, limits);
            assert_eq!(call_once(addr, "PUT q a\n"), "OK 1");
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(b"GET r\n").unwrap();
            wait_until("the GET never waited", HANG, &|| {
                waiting_on(&handle, 0, b"r") == 1
            });
            // The GET waits 2 s: its connection's next bytes go to `pending` meanwhile.
            let mut first = b"GET q\n".to_vec();
            first.extend(std::iter::repeat(b'x').take(3000));
            s.write_all(&first).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(&vec![b'x'; LINE_MAX]).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            let out = String::from_utf8_lossy(&out).into_owned();
            let len = call_once(addr, "LEN q\n");
            handle.stop();
            runner.join().unwrap().unwrap();
            assert_eq!(
                (out.as_str(), len.as_str()),
                ("NONE\nJOB a\nERR line over 1 MiB\n", "LEN 0"),
                "{driver:?}: replies dropped (and job a taken but never sent)"
            );
        }
    }

    /// A client that does not read its replies holds a job past `--wait`. Its
    /// pipelined `GET mid` (ready, 60 kB) and `GET r` (waits): the GET on `r` joins the line at
    /// its first poll, then the server writes the replies before it, and that write blocks
    /// once the socket buffers are full. The GET is polled meanwhile, so its 50 ms `--wait`
    /// ends it and the next PUT's job goes to a client that asks for it; unpolled, the GET
    /// stayed first in line for good, took that job, and the asking client got `NONE`.
    #[test]
    fn a_client_that_does_not_read_holds_no_job_past_its_wait() {
        use std::io::Write as _;
        let limits = Limits {
            max: 1000,
            wait: Duration::from_millis(50),
        };
        let (addr, handle, runner) = test_server(1, xtc::io::DriverChoice::Auto, limits);
        {
            use std::io::BufRead as _;
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            let mut lines = std::io::BufReader::new(c.try_clone().unwrap()).lines();
            let big = format!("PUT mid {}\n", "x".repeat(60_000));
            for _ in 0..300 {
                c.write_all(big.as_bytes()).unwrap();
                assert!(lines.next().unwrap().unwrap().starts_with("OK "));
            }
        }
        let mut hostage = std::net::TcpStream::connect(addr).unwrap();
        hostage
            .write_all("GET mid\nGET r\n".repeat(300).as_bytes())
            .unwrap();
        // Stuck once `mid` stops going down for 500 ms (each `GET r` waits only 50 ms).
        let len = || call_once(addr, "LEN mid\n");
        let mut last = len();
        let mut since = std::time::Instant::now();
        let t0 = std::time::Instant::now();
        while since.elapsed() < Duration::from_millis(500) {
            assert!(t0.elapsed() < HANG, "the hostage never got stuck");
            std::thread::sleep(Duration::from_millis(20));
            let now = len();
            if now != last {
                (last, since) = (now, std::time::Instant::now());
            }
        }
        assert_ne!(last, "LEN 0", "the buffers never filled");
        let stuck_in_line = waiting_on(&handle, 0, b"r");
        let put = call_once(addr, "PUT r x\n");
        let got = call_once(addr, "GET r\n");
        close_with_reset(hostage);
        handle.stop();
        runner.join().unwrap().unwrap();
        assert_eq!(
            (stuck_in_line, put.as_str(), got.as_str()),
            (0, "OK 1", "JOB x"),
            "a GET of a client that does not read stays in line past --wait and takes the job"
        );
    }

    /// The self-check end to end, with a small bound so that producers meet `FULL`, on two
    /// shards (so requests cross), on each I/O driver, within a bounded time.
    #[test]
    fn the_self_check_passes() {
        for driver in [xtc::io::DriverChoice::Auto, xtc::io::DriverChoice::Epoll] {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let o = Options {
                    addr: "127.0.0.1:0".parse().unwrap(),
                    producers: 3,
                    consumers: 2,
                    jobs: 600,
                    queues: 3,
                    limits: Limits {
                        max: 4,
                        wait: Duration::from_millis(50),
                    },
                };
                let exec = xtc::Executor::builder()
                    .shards(2)
                    .service_mode(true)
                    .oversubscribe(true)
                    .io_driver(driver)
                    .build()
                    .unwrap();
                let _ = tx.send(serve_and_check(&exec, &o).map_err(|e| e.to_string()));
            });
            rx.recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("{driver:?}: the self-check hung"))
                .unwrap_or_else(|e| panic!("{driver:?}: the self-check failed: {e}"));
        }
    }

    /// The flags: defaults, a self-check from one of its flags, and the refusals.
    #[test]
    fn flags_parse_and_bad_ones_are_refused() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(args(&[])).unwrap().unwrap();
        assert_eq!((o.addr.port(), o.producers), (DEFAULT_PORT, 0));
        let o = parse(args(&["--consumers", "2", "--wait", "50"]))
            .unwrap()
            .unwrap();
        assert_eq!((o.producers, o.consumers, o.addr.port()), (4, 2, 0));
        assert_eq!(o.limits.wait, Duration::from_millis(50));
        assert!(parse(args(&["--help"])).unwrap().is_none());
        for bad in [
            &["--jobs", "-1"][..],
            &["--producers", "0"],
            &["--queues", "0", "--consumers", "1"],
            &["--max"],
            &["--frobnicate", "1"],
            &["--producers", "1", "--max", "0", "--wait", "0"],
            &["--producers", "1", "--jobs", "1000000000000"],
            &["--producers", "1", "--queues", "1000000000000"],
            &["--producers", "18446744073709551615", "--consumers", "1"],
        ] {
            assert!(parse(args(bad)).is_err(), "{bad:?}");
        }
    }
}
