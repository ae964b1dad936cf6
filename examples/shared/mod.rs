//! What the example servers (`echo`, `kv`) share: their flags, one `SO_REUSEPORT` listener per
//! shard behind a `ConnBalancer`, and the clients that drive a server and check its replies.

use std::{
    error::Error,
    future::Future,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use xtc::net::{ConnBalancer, TcpListener, TcpStream};

/// The flags: `--addr A --clients N` and one for the work each client does.
pub(crate) struct Args {
    pub(crate) addr: SocketAddr,
    pub(crate) clients: usize,
    pub(crate) per_client: usize,
}

/// Parses the command line. `per_flag` names the work per client (`per_default` without it);
/// serving only (no `--clients`) and no `--addr` listens on `127.0.0.1:default_port`.
pub(crate) fn parse(per_flag: &str, per_default: usize, default_port: u16) -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:0".parse().expect("literal address"),
        clients: 0,
        per_client: per_default,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: Result<String, String>| -> Result<usize, String> {
            v?.parse().map_err(|e| format!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--addr" => a.addr = value?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--clients" => a.clients = number(value)?,
            f if f == per_flag => a.per_client = number(value)?,
            other => {
                return Err(format!(
                    "unknown flag {other}; flags: --addr A --clients N {per_flag} K"
                ))
            }
        }
    }
    if a.clients == 0 && a.addr.port() == 0 {
        a.addr.set_port(default_port);
    }
    Ok(a)
}

/// An executor from the environment (`XTC_SHARDS`, `XTC_IO`, ...), in service mode: it runs
/// until a stop.
pub(crate) fn executor() -> xtc::Result<xtc::Executor> {
    xtc::Executor::builder()
        .env()?
        .service_mode(true)
        .oversubscribe(true)
        .build()
}

/// Has every shard of `exec` serve `addr` with `handler`: one `SO_REUSEPORT` listener per
/// shard, each connection handled on the shard with the fewest open ones. Port 0 picks a free
/// port; the address served is returned. A shard that cannot bind or accept stops the executor.
pub(crate) fn listen<H, Fut>(
    exec: &xtc::Executor,
    addr: SocketAddr,
    handler: H,
) -> Result<SocketAddr, Box<dyn Error>>
where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    // Port 0: learn a free port once, then every shard binds that port with SO_REUSEPORT.
    let addr = if addr.port() == 0 {
        std::net::TcpListener::bind(addr)?.local_addr()?
    } else {
        addr
    };
    let balancer = ConnBalancer::new(exec.shard_count())?;
    for shard in 0..exec.shard_count() {
        let (balancer, handler) = (balancer.clone(), handler.clone());
        exec.spawn_on(shard, move || async move {
            let listener = match TcpListener::bind_reuseport(addr) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("shard {shard}: bind {addr}: {e}");
                    xtc::stop();
                    return;
                }
            };
            if let Err(e) = balancer.serve(listener, handler).await {
                eprintln!("shard {shard}: accept: {e}");
                xtc::stop();
            }
        })?;
    }
    Ok(addr)
}

/// Runs `clients` clients on `exec` (pinned tasks spread over the shards), `client(id)` each;
/// the last one to finish runs `last()` (a check of the server's state) and stops the
/// executor. Returns how many clients (or the last check) failed, and the seconds it took.
pub(crate) fn drive<C, CF, L, LF>(
    exec: &xtc::Executor,
    clients: usize,
    client: C,
    last: L,
) -> xtc::Result<(u64, f64)>
where
    C: Fn(usize) -> CF + Clone + Send + 'static,
    CF: Future<Output = std::io::Result<()>> + 'static,
    L: Fn() -> LF + Clone + Send + 'static,
    LF: Future<Output = Result<(), String>> + 'static,
{
    let left = Arc::new(AtomicUsize::new(clients));
    let failed = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    for id in 0..clients {
        let (left, failed) = (left.clone(), failed.clone());
        let (client, last) = (client.clone(), last.clone());
        exec.spawn_on(id % exec.shard_count(), move || async move {
            if let Err(e) = client(id).await {
                eprintln!("client {id}: {e}");
                failed.fetch_add(1, Ordering::Relaxed);
            }
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                if let Err(e) = last().await {
                    eprintln!("{e}");
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                xtc::stop();
            }
        })?;
    }
    exec.run()?;
    Ok((failed.load(Ordering::Relaxed), t0.elapsed().as_secs_f64()))
}

/// What `main` returns for `result`: an error is printed as its message (xtc's errors include
/// their causes), not as the `Debug` form a `Result` returned from `main` prints.
pub(crate) fn exit_code(result: Result<(), Box<dyn Error>>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
