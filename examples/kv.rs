//! A sharded in-memory key-value server, the shape of a Seastar or Glommio store: every shard
//! owns the keys that hash to it, in its own slot of a `Sharded<RefCell<HashMap>>` (no lock,
//! no atomic), and accepts on its own `SO_REUSEPORT` listener (each connection is served on
//! the least-loaded shard, through a `ConnBalancer`). A request for a key
//! another shard owns travels there with `shard::submit_to` and its answer comes back over the
//! ring mesh; a key the serving shard owns is answered on the spot.
//!
//! Protocol, one request per line (requests may be pipelined; a last line without its `\n` is
//! answered when the client closes its end), one reply line each:
//!
//! | request | reply |
//! | --- | --- |
//! | `SET key value` (the value is the rest of the line) | `OK` |
//! | `GET key` | `VALUE value` or `NONE` |
//! | `DEL key` | `DELETED` or `NONE` |
//! | `COUNT` (keys on every shard, in shard order) | `COUNT n0 n1 ..` |
//! | anything else | `ERR what to send instead` |
//!
//! With `--clients N` it also runs N clients (pinned tasks spread over the shards) that each
//! set, read back and delete `--ops` keys of their own and check every reply, then checks the
//! shards' key counts, prints where the keys lived and how many requests crossed shards, and
//! exits (non-zero if any check failed).
//!
//! Run: `cargo run --release --example kv -- --clients 32 --ops 1000` (`--help` lists the flags)
//! or serve forever: `cargo run --release --example kv -- --addr 127.0.0.1:7001`, then
//! `printf 'SET a 1\nGET a\n' | nc -N 127.0.0.1 7001` (`-N`, OpenBSD netcat's, Debian's and Ubuntu's `nc`: close after the input, so the
//! replies end the run).
//! (`XTC_SHARDS` sets the shard count, `XTC_IO=epoll` picks the epoll driver.)

#[path = "shared/lines.rs"]
mod lines;
mod shared;

use std::{
    cell::RefCell,
    collections::HashMap,
    net::SocketAddr,
    sync::{atomic::AtomicU64, atomic::Ordering, Arc},
};

use xtc::net::TcpStream;

use lines::{owner, Client, LINE_MAX, PENDING_KEPT, REPLY_CHUNK};

/// Every shard's part of the store; `get()` is the calling shard's.
/// Leaked: it lives as long as the server, and a closure sent to another shard copies a
/// reference where an `Arc` clone would move a count every shard shares (two atomic
/// read-modify-writes per remote request).
type Store = &'static xtc::Sharded<RefCell<HashMap<Vec<u8>, Vec<u8>>>>;

/// Requests served on the key's own shard, and those that went to another one, per shard.
type Counts = Arc<xtc::Sharded<(AtomicU64, AtomicU64)>>;

/// A request for one key, run on the key's owner.
enum Op {
    Set(Vec<u8>, Vec<u8>),
    Get(Vec<u8>),
    Del(Vec<u8>),
}

impl Op {
    fn key(&self) -> &[u8] {
        match self {
            Op::Set(k, _) | Op::Get(k) | Op::Del(k) => k,
        }
    }
}

enum Request {
    Key(Op),
    Count,
}

/// One request line (without its `\n`), or the `ERR` reply for a malformed one.
fn request(line: &[u8]) -> Result<Request, &'static str> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (cmd, rest) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &b""[..]),
    };
    let key = |rest: &[u8]| -> Result<Vec<u8>, &'static str> {
        if rest.is_empty() || rest.contains(&b' ') {
            return Err("ERR a key is one word: GET key, DEL key");
        }
        Ok(rest.to_vec())
    };
    match cmd {
        b"SET" => {
            let Some(i) = rest.iter().position(|&b| b == b' ') else {
                return Err("ERR SET needs a key and a value: SET key value");
            };
            if i == 0 {
                return Err("ERR SET needs a key and a value: SET key value");
            }
            Ok(Request::Key(Op::Set(
                rest[..i].to_vec(),
                rest[i + 1..].to_vec(),
            )))
        }
        b"GET" => Ok(Request::Key(Op::Get(key(rest)?))),
        b"DEL" => Ok(Request::Key(Op::Del(key(rest)?))),
        b"COUNT" if rest.is_empty() => Ok(Request::Count),
        _ => Err("ERR unknown request; send SET key value, GET key, DEL key or COUNT"),
    }
}

/// Runs `op` against the calling shard's part of the store; the reply line, without `\n`.
fn apply(store: &Store, op: Op) -> Vec<u8> {
    let mut map = store.get().borrow_mut();
    match op {
        Op::Set(k, v) => {
            map.insert(k, v);
            b"OK".to_vec()
        }
        Op::Get(k) => match map.get(&k) {
            Some(v) => [&b"VALUE "[..], v].concat(),
            None => b"NONE".to_vec(),
        },
        Op::Del(k) => match map.remove(&k) {
            Some(_) => b"DELETED".to_vec(),
            None => b"NONE".to_vec(),
        },
    }
}

/// The reply to one request: on this shard if it owns the key, else on the owner through
/// `submit_to` (one ring message each way).
async fn answer(store: &Store, counts: &Counts, req: Request) -> Vec<u8> {
    let op = match req {
        Request::Key(op) => op,
        Request::Count => {
            let store = *store;
            let per_shard =
                xtc::shard::submit_to_all(move || async move { store.get().borrow().len() }).await;
            let mut reply = b"COUNT".to_vec();
            for n in per_shard {
                match n {
                    Ok(n) => reply.extend_from_slice(format!(" {n}").as_bytes()),
                    Err(e) => return format!("ERR {e}").into_bytes(),
                }
            }
            return reply;
        }
    };
    let (local, remote) = counts.get();
    let to = owner(op.key());
    if to == xtc::shard::id() {
        local.fetch_add(1, Ordering::Relaxed);
        return apply(store, op);
    }
    remote.fetch_add(1, Ordering::Relaxed);
    let store = *store;
    match xtc::shard::submit_to(to, move || async move { apply(&store, op) }).await {
        Ok(reply) => reply,
        Err(e) => format!("ERR shard {to}: {e}").into_bytes(),
    }
}

/// Serves one connection until the peer closes: every complete line read so far is answered,
/// in order, and the replies go out in one write, or in writes of about [`REPLY_CHUNK`] as
/// they grow (a read of 4 KiB of pipelined `GET`s of a large value would otherwise buffer
/// hundreds of MiB of replies).
async fn serve(stream: TcpStream, store: Store, counts: Counts) {
    let _ = stream.set_nodelay(true);
    let mut pending = Vec::new();
    // `pending[..searched]` holds no `\n`: each read's bytes are searched once, where a
    // search from the start made a long line cost its length squared over the read size.
    let mut searched = 0;
    let mut buf = Vec::with_capacity(4096);
    loop {
        // The peer's end of stream: a last request without its `\n` is answered too.
        let Some(eof) = lines::read_more(&stream, &mut buf, &mut pending).await else {
            return;
        };
        let mut replies = Vec::new();
        let mut start = 0;
        while let Some(i) = pending[searched..].iter().position(|&c| c == b'\n') {
            let end = searched + i;
            searched = end + 1;
            let line = &pending[start..end];
            // A line that ended within the read that took it past the limit is refused as
            // well: the check below sees only the unfinished rest of each read, so a
            // `SET` of 1 MiB and 3,000 bytes was stored and one of 1 MiB and 5,000 refused.
            let reply = if line.len() > LINE_MAX {
                b"ERR line over 1 MiB".to_vec()
            } else {
                match request(line) {
                    Ok(req) => answer(&store, &counts, req).await,
                    Err(err) => err.as_bytes().to_vec(),
                }
            };
            replies.extend_from_slice(&reply);
            replies.push(b'\n');
            start = end + 1;
            if replies.len() >= REPLY_CHUNK {
                let (r, mut sent) = stream.write_all(replies).await;
                if r.is_err() {
                    return;
                }
                sent.clear();
                replies = sent;
            }
        }
        pending.drain(..start);
        // A long line's room goes once it is answered: kept, every connection that ever sent
        // one held up to 1 MiB for its life.
        if pending.capacity() > PENDING_KEPT && pending.len() <= PENDING_KEPT {
            pending.shrink_to(PENDING_KEPT);
        }
        searched = pending.len();
        if pending.len() > LINE_MAX {
            let _ = stream.write_all(b"ERR line over 1 MiB\n".to_vec()).await;
            lines::close_after_refusal(stream, buf).await;
            return;
        }
        if !replies.is_empty() && stream.write_all(replies).await.0.is_err() {
            return;
        }
        if eof {
            return;
        }
    }
}

/// One client: sets `ops` keys of its own, reads each back, deletes every other one and checks
/// what is left; a malformed request must get an `ERR` and leave the connection usable.
async fn client(
    addr: SocketAddr,
    id: usize,
    ops: usize,
    progress: shared::Progress,
) -> std::io::Result<()> {
    let mut c = Client::connect(addr, Some(progress)).await?;
    let fail = |what: String| std::io::Error::other(what);
    let expect = |got: String, want: &str| {
        if got == want {
            Ok(())
        } else {
            Err(fail(format!("got {got:?}, want {want:?}")))
        }
    };
    for i in 0..ops {
        expect(c.call(format!("SET c{id}-k{i} v {id} {i}\n")).await?, "OK")?;
    }
    let bad = c.call("FETCH x\n".into()).await?;
    if !bad.starts_with("ERR ") {
        return Err(fail(format!("a bad request got {bad:?}, want an ERR")));
    }
    for i in 0..ops {
        let want = format!("VALUE v {id} {i}");
        expect(c.call(format!("GET c{id}-k{i}\n")).await?, &want)?;
    }
    for i in (0..ops).step_by(2) {
        expect(c.call(format!("DEL c{id}-k{i}\n")).await?, "DELETED")?;
    }
    for i in 0..ops {
        let want = if i % 2 == 0 {
            "NONE".to_string()
        } else {
            format!("VALUE v {id} {i}")
        };
        expect(c.call(format!("GET c{id}-k{i}\n")).await?, &want)?;
    }
    Ok(())
}

/// Asks the server for its key counts (`COUNT`, answered through `submit_to_all`) and checks
/// that every shard holds the keys in `want` that it owns, no more and no fewer. Checking the
/// total alone let a key stored on the wrong shard pass (every client reads its keys back
/// through the shard that stored them).
async fn check_count(addr: SocketAddr, want: impl Iterator<Item = String>) -> Result<(), String> {
    let mut want_per_shard = vec![0usize; xtc::shard::count()];
    for key in want {
        want_per_shard[owner(key.as_bytes())] += 1;
    }
    // The final check's request is no client's work: no progress counted.
    let mut c = Client::connect(addr, None)
        .await
        .map_err(|e| format!("COUNT: {e}"))?;
    let reply = c
        .call("COUNT\n".into())
        .await
        .map_err(|e| format!("COUNT: {e}"))?;
    let per_shard: Option<Vec<usize>> = match reply.strip_prefix("COUNT") {
        Some(counts) => counts.split_whitespace().map(|n| n.parse().ok()).collect(),
        None => None,
    };
    match &per_shard {
        Some(n) => shared::out(format_args!("keys left per shard: {n:?}")),
        None => shared::out(format_args!("keys left per shard: no counts in {reply:?}")),
    }
    if per_shard.as_ref() != Some(&want_per_shard) {
        return Err(format!(
            "COUNT replied {reply:?}: want COUNT {}",
            want_per_shard
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    shared::logging();
    shared::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = shared::parse("--ops", 1000, 7001)?;
    let exec = shared::executor()?;
    let shards = exec.shard_count();
    shared::out(format_args!(
        "{shards} shards, I/O driver {}",
        exec.io_driver()
    ));
    let store: Store = Box::leak(Box::new(xtc::Sharded::new(shards, |_| RefCell::default())));
    let counts: Counts = Arc::new(xtc::Sharded::new(shards, |_| Default::default()));
    let server = {
        let counts = counts.clone();
        shared::listen(&exec, args.addr, move |stream, _| {
            serve(stream, store, counts.clone())
        })?
    };
    let addr = server.addr;
    if args.clients == 0 {
        shared::out(format_args!("key-value server on {addr} (Ctrl-C to stop)"));
        exec.run()?;
        return server.check();
    }
    let (clients, ops) = (args.clients, args.per_client);
    let driven = shared::drive(
        &exec,
        clients,
        2,
        move |id, progress| client(addr, id, ops, progress),
        // Every odd key of every client must be left, each on the shard that owns it.
        move || {
            let left = (0..clients)
                .flat_map(move |id| (1..ops).step_by(2).map(move |i| format!("c{id}-k{i}")));
            check_count(addr, left)
        },
    )?;
    let (failed, secs, done) = (driven.failed, driven.secs, driven.done);
    server.check()?;
    // Each client: ops SETs, one bad request, ops GETs, ops/2 DELs, ops GETs; the rate is of
    // the requests answered (with clients failing, fewer than that).
    shared::out(format_args!(
        "{clients} clients, {done} requests in {secs:.2} s: {:.0} requests/s, {failed} failed; \
         final count check {}",
        done as f64 / secs,
        if driven.check_failed {
            "FAILED"
        } else {
            "passed"
        },
    ));
    let counts = Arc::into_inner(counts).ok_or("the shards still hold the counters")?;
    for (shard, (local, remote)) in counts.into_inner().into_iter().enumerate() {
        let s = exec.loop_stats(shard)?;
        shared::out(format_args!(
            "shard {shard}: {} requests for its own keys, {} sent to their owner; \
             {} ring messages sent, {} received",
            local.into_inner(),
            remote.into_inner(),
            s.messages_sent,
            s.messages_received,
        ));
    }
    shared::shard_stats(&exec)?;
    driven.verdict()
}
