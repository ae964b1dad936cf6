//! A sharded TCP echo server: one listener per shard with `SO_REUSEPORT`, accepting through a
//! shared `ConnBalancer`, so each connection is served on the shard with the fewest open ones
//! (a shard that accepted more than its share hands the descriptor over once; after that a
//! connection's I/O stays on one shard, with no lock and no cross-shard traffic). With `--clients N`
//! it also runs N clients (pinned tasks spread over the shards) that each do `--rounds`
//! request/response exchanges, checks every echo, prints per-shard I/O stats and exits.
//!
//! Run: `cargo run --release --example echo -- --clients 64 --rounds 1000` (`--help` lists the flags)
//! or serve forever: `cargo run --release --example echo -- --addr 127.0.0.1:7000`
//! (`XTC_IO=epoll` picks the epoll driver, `XTC_SHARDS` the shard count.)

mod shared;

use std::net::SocketAddr;

use xtc::net::TcpStream;

/// Echoes until the peer closes.
async fn serve(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(4096);
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

/// One client: `rounds` exchanges of a 128-byte message, each echo checked.
async fn client(
    addr: SocketAddr,
    id: usize,
    rounds: usize,
    progress: shared::Progress,
) -> std::io::Result<()> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut reply = Vec::with_capacity(128);
    for r in 0..rounds {
        let msg: Vec<u8> = (0..128).map(|i| (id + r + i) as u8).collect();
        let (w, msg) = s.write_all(msg).await;
        w?;
        let mut got = Vec::with_capacity(128);
        while got.len() < 128 {
            let (n, b) = s.read(reply).await;
            let n = n?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            got.extend_from_slice(&b[..n]);
            reply = b;
        }
        if got != msg {
            return Err(std::io::Error::other(format!(
                "client {id}: echo {r} differs"
            )));
        }
        progress.add(1);
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    shared::logging();
    shared::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = shared::parse("--rounds", 1000, 7000)?;
    let exec = shared::executor()?;
    let shards = exec.shard_count();
    shared::out(format_args!(
        "{shards} shards, I/O driver {}",
        exec.io_driver()
    ));
    let server = shared::listen(&exec, args.addr, |stream, _| serve(stream))?;
    let addr = server.addr;
    if args.clients == 0 {
        shared::out(format_args!("echo server on {addr} (Ctrl-C to stop)"));
        exec.run()?;
        return server.check();
    }
    let rounds = args.per_client;
    let driven = shared::drive(
        &exec,
        args.clients,
        2,
        move |id, progress| client(addr, id, rounds, progress),
        || async { Ok(()) },
    )?;
    let (failed, secs, done) = (driven.failed, driven.secs, driven.done);
    server.check()?;
    // The rate of the round trips done (with clients failing, fewer than asked for).
    shared::out(format_args!(
        "{} clients x {rounds} round trips in {secs:.2} s: {:.0} round trips/s, {failed} failed",
        args.clients,
        done as f64 / secs,
    ));
    shared::shard_stats(&exec)?;
    driven.verdict()
}
