//! A sharded TCP proxy: every shard accepts on its own `SO_REUSEPORT` listener (behind the
//! shared `ConnBalancer`), opens a connection to the upstream server from the same shard and
//! pipes bytes both ways in one task, so a connection's two sockets, its buffers and both
//! directions live on one shard, with no lock and no cross-shard traffic once the connection is
//! placed (the balancer may hand a new connection to a less loaded shard at accept, once). A
//! half-close is passed on: when one side ends its writes, the proxy shuts down writing on the
//! other side and keeps piping the opposite direction until it ends too, as a TCP proxy must
//! for request/response protocols that close their sending half to say "done". A reset is
//! passed on as a reset (`TcpStream::set_linger(Some(ZERO))`), so a peer whose stream was cut
//! does not read a clean end of it.
//!
//! The upstream here is an echo server on the same executor (its own listener on a free port),
//! so the example is self-contained. With `--clients N` it also runs N clients (pinned tasks
//! spread over the shards) that each stream `--bytes` pseudo-random bytes through the proxy in
//! chunks of varied sizes while reading the echo, then close their sending half, read to the
//! end, and check the echo (its length and a 64-bit checksum of its bytes, in order); it prints the throughput and
//! per-shard I/O stats and exits (non-zero if any check failed).
//!
//! Run: `cargo run --release --example proxy -- --clients 32 --bytes 1000000` (`--help` lists
//! the flags) or serve forever: `cargo run --release --example proxy -- --addr 127.0.0.1:7002`,
//! then `echo hello | nc -N 127.0.0.1 7002`.
//! (`XTC_SHARDS` sets the shard count, `XTC_IO=epoll` picks the epoll driver.)

mod shared;

use std::{io, net::Shutdown, net::SocketAddr, rc::Rc};

use xtc::net::TcpStream;

/// Size of each direction's buffer.
const BUF: usize = 16 * 1024;

/// Copies `from` to `to` until `from` ends, then shuts down `to`'s writing half (the
/// half-close passed on). Returns the bytes copied.
async fn pipe(from: &TcpStream, to: &TcpStream) -> io::Result<u64> {
    let mut buf = Vec::with_capacity(BUF);
    let mut total = 0u64;
    loop {
        let (n, b) = from.read(buf).await;
        let n = n?;
        if n == 0 {
            to.shutdown(Shutdown::Write)?;
            return Ok(total);
        }
        let (w, b) = to.write_all(b).await;
        w?;
        total += n as u64;
        buf = b;
    }
}

/// Makes the close of `s` a reset: its peer reads an error, not a clean end of stream that
/// would pass a cut-off request or response for a whole one.
fn reset_on_close(s: &TcpStream) {
    // Refused only for a socket already gone bad; it then closes as it can.
    let _ = s.set_linger(Some(std::time::Duration::ZERO));
}

/// Serves one client connection: connects upstream from this shard, then pipes both ways in
/// this task. An error on either side (a peer that reset its connection) ends both directions
/// at once (the other one's I/O is dropped) and resets both connections, so that each peer
/// learns the stream was cut, where a clean end of stream passed a cut-off request or response
/// for a whole one; it is that peer's business, not the proxy's, so it is not reported. A
/// failed upstream connect resets the client's connection the same way.
async fn proxy(client: TcpStream, upstream: SocketAddr) {
    let up = match TcpStream::connect(upstream).await {
        Ok(up) => up,
        Err(e) => {
            shared::err(format_args!("proxy: connect to upstream {upstream}: {e}"));
            reset_on_close(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    if futures::future::try_join(pipe(&client, &up), pipe(&up, &client))
        .await
        .is_err()
    {
        reset_on_close(&client);
        reset_on_close(&up);
    }
}

/// The upstream: echoes until the peer ends its writes, then closes.
async fn echo(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(BUF);
    loop {
        let (n, b) = stream.read(buf).await;
        match n {
            Ok(n) if n > 0 => {}
            _ => return,
        }
        let (w, b) = stream.write_all(b).await;
        if w.is_err() {
            return;
        }
        buf = b;
    }
}

/// FNV-1a over a byte stream, fed in pieces.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A small deterministic generator (xorshift64*), so every client's bytes and chunk sizes
/// differ and a run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A task of this shard that is aborted when the guard is dropped still holding it.
struct AbortOnDrop<T: 'static>(Option<xtc::JoinHandle<T>>);

impl<T: 'static> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// One client: streams `bytes` bytes through the proxy in chunks of 1 B to 16 KiB while a
/// task of its own reads the echo, closes its sending half, and checks that the echo, read to
/// its end, has the same length and checksum.
async fn client(
    addr: SocketAddr,
    id: usize,
    bytes: usize,
    progress: shared::Progress,
) -> io::Result<()> {
    let s = Rc::new(TcpStream::connect(addr).await?);
    s.set_nodelay(true)?;
    // Aborted if this client ends early (a write error, or `drive` dropping it after a
    // stall): detached, it kept its connection open until the executor stopped.
    let mut reader = AbortOnDrop(Some({
        let s = s.clone();
        xtc::spawn_local(async move {
            let (mut sum, mut total) = (Fnv::new(), 0usize);
            let mut buf = Vec::with_capacity(BUF);
            loop {
                let (n, b) = s.read(buf).await;
                let n = n?;
                if n == 0 {
                    return Ok::<_, io::Error>((total, sum));
                }
                sum.feed(&b[..n]);
                total += n;
                // Bytes back through the proxy: `drive`'s count of work done.
                progress.add(n as u64);
                buf = b;
            }
        })
    }));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1));
    let mut sent = Fnv::new();
    let mut left = bytes;
    let mut chunk = Vec::with_capacity(BUF);
    while left > 0 {
        let len = (1 + (rng.next() % BUF as u64) as usize).min(left);
        chunk.clear();
        chunk.extend((0..len).map(|_| rng.next() as u8));
        sent.feed(&chunk);
        let (w, c) = s.write_all(chunk).await;
        w?;
        chunk = c;
        left -= len;
    }
    s.shutdown(Shutdown::Write)?;
    let reader = reader.0.take().expect("taken only here");
    let (got, sum) = reader.await.map_err(io::Error::other)??;
    if got != bytes || sum != sent {
        return Err(io::Error::other(format!(
            "client {id}: sent {bytes} bytes (checksum {:x}), the echo had {got} (checksum {:x})",
            sent.0, sum.0
        )));
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    shared::logging();
    shared::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = shared::parse("--bytes", 1_000_000, 7002)?;
    let exec = shared::executor()?;
    let shards = exec.shard_count();
    shared::out(format_args!(
        "{shards} shards, I/O driver {}",
        exec.io_driver()
    ));
    let upstream = shared::listen(&exec, "127.0.0.1:0".parse()?, |stream, _| echo(stream))?;
    let up = upstream.addr;
    let server = shared::listen(&exec, args.addr, move |stream, _| proxy(stream, up))?;
    let addr = server.addr;
    if args.clients == 0 {
        shared::out(format_args!(
            "proxy on {addr} to the echo server on {up} (Ctrl-C to stop)"
        ));
        exec.run()?;
        upstream.check()?;
        return server.check();
    }
    let (clients, bytes) = (args.clients, args.per_client);
    // Each client's connection takes four descriptors here: the client's end and the
    // server's, the proxy's connection upstream and the upstream's end.
    let driven = shared::drive(
        &exec,
        clients,
        4,
        move |id, progress| client(addr, id, bytes, progress),
        || async { Ok(()) },
    )?;
    let (failed, secs, done) = (driven.failed, driven.secs, driven.done);
    upstream.check()?;
    server.check()?;
    // The rate of the bytes that came back (with clients failing, fewer than asked for).
    shared::out(format_args!(
        "{clients} clients x {bytes} bytes through the proxy and back in {secs:.2} s: \
         {:.1} MB/s each way, {failed} failed",
        done as f64 / secs / 1e6,
    ));
    shared::shard_stats(&exec)?;
    driven.verdict()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_does_not_depend_on_how_the_bytes_are_cut() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut whole = Fnv::new();
        whole.feed(&bytes);
        let mut pieces = Fnv::new();
        for c in bytes.chunks(37) {
            pieces.feed(c);
        }
        assert_eq!(whole, pieces);
        let mut other = Fnv::new();
        other.feed(&bytes[1..]);
        assert_ne!(whole, other);
    }
}
