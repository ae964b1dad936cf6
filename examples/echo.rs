//! A sharded TCP echo server: one listener per shard with `SO_REUSEPORT`, accepting through a
//! shared `ConnBalancer`, so each connection is served on the shard with the fewest open ones
//! (a shard that accepted more than its share hands the descriptor over once; after that a
//! connection's I/O stays on one shard, with no lock and no cross-shard traffic). With `--clients N`
//! it also runs N clients (pinned tasks spread over the shards) that each do `--rounds`
//! request/response exchanges, checks every echo, prints per-shard I/O stats and exits.
//!
//! Run: `cargo run --release --example echo -- --clients 64 --rounds 1000`
//! or serve forever: `cargo run --release --example echo -- --addr 127.0.0.1:7000`
//! (`XTC_IO=epoll` picks the epoll driver, `XTC_SHARDS` the shard count.)

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use xtc::net::{ConnBalancer, TcpListener, TcpStream};

struct Args {
    addr: SocketAddr,
    clients: usize,
    rounds: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:0".parse().expect("literal address"),
        clients: 0,
        rounds: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match flag.as_str() {
            "--addr" => a.addr = val("--addr")?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--clients" => {
                a.clients = val("--clients")?
                    .parse()
                    .map_err(|e| format!("--clients: {e}"))?
            }
            "--rounds" => {
                a.rounds = val("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            other => {
                return Err(format!(
                    "unknown flag {other}; flags: --addr A --clients N --rounds R"
                ))
            }
        }
    }
    if a.clients == 0 && a.addr.port() == 0 {
        a.addr.set_port(7000);
    }
    Ok(a)
}

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
async fn client(addr: SocketAddr, id: usize, rounds: usize) -> std::io::Result<()> {
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
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let exec = xtc::Executor::builder()
        .env()?
        .service_mode(true)
        .oversubscribe(true)
        .build()?;
    let shards = exec.shard_count();
    println!("{shards} shards, I/O driver {}", exec.io_driver());
    // Port 0: learn a free port once, then every shard binds that port with SO_REUSEPORT.
    let addr = if args.addr.port() == 0 {
        std::net::TcpListener::bind(args.addr)?.local_addr()?
    } else {
        args.addr
    };
    let balancer = ConnBalancer::new(shards)?;
    for shard in 0..shards {
        let balancer = balancer.clone();
        exec.spawn_on(shard, move || async move {
            let listener = match TcpListener::bind_reuseport(addr) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("shard {shard}: bind {addr}: {e}");
                    xtc::stop();
                    return;
                }
            };
            if let Err(e) = balancer.serve(listener, |stream, _| serve(stream)).await {
                eprintln!("shard {shard}: accept: {e}");
                xtc::stop();
            }
        })?;
    }
    if args.clients == 0 {
        println!("echo server on {addr} (Ctrl-C to stop)");
        exec.run()?;
        return Ok(());
    }
    let left = Arc::new(AtomicUsize::new(args.clients));
    let failed = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let rounds = args.rounds;
    for id in 0..args.clients {
        let (left, failed) = (left.clone(), failed.clone());
        exec.spawn_on(id % shards, move || async move {
            if let Err(e) = client(addr, id, rounds).await {
                eprintln!("client {id}: {e}");
                failed.fetch_add(1, Ordering::Relaxed);
            }
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                xtc::stop();
            }
        })?;
    }
    exec.run()?;
    let secs = t0.elapsed().as_secs_f64();
    let total = (args.clients * rounds) as f64;
    println!(
        "{} clients x {rounds} round trips in {secs:.2} s: {:.0} round trips/s, {} failed",
        args.clients,
        total / secs,
        failed.load(Ordering::Relaxed)
    );
    for shard in 0..shards {
        let s = exec.loop_stats(shard)?;
        println!(
            "shard {shard}: {} tasks, {} I/O submitted, {} completed, {} polls, {} parks, idle {:.0}%",
            s.tasks_run,
            s.io_submitted,
            s.io_completed,
            s.polls,
            s.parks,
            100.0 * s.idle_rate()
        );
    }
    if failed.load(Ordering::Relaxed) > 0 {
        return Err("some clients failed".into());
    }
    Ok(())
}
