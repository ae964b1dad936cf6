//! Registering and unregistering a `FixedBufPool` on a loop whose ring
//! already has operations in flight (the wake-ping read armed at the first park, an idle
//! socket's receive). Kernels 5.7 to 5.12 quiesce the whole ring for
//! `IORING_(UN)REGISTER_BUFFERS` (wait until every in-flight request has completed), so both
//! calls block the loop thread until the idle receive completes: for good here.

mod io_common;

use std::{sync::mpsc, time::Duration};

use xtc_shards::{
    io::{DriverChoice, FixedBufPool},
    net::{TcpListener, TcpStream},
    time::sleep,
    Executor,
};

#[test]
fn a_pool_registered_and_dropped_beside_an_idle_read_does_not_block_the_loop() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let exec = match Executor::builder()
            .shards(1)
            .io_driver(DriverChoice::IoUring)
            .build()
        {
            Ok(e) => e,
            Err(e) => {
                println!("no io_uring here ({e}); skipped");
                let _ = tx.send(Ok(()));
                return;
            }
        };
        let r = exec.block_on(|| async {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let accept = xtc_shards::spawn_local(async move { l.accept().await.unwrap().0 });
            let c = TcpStream::connect(addr).await.unwrap();
            let s = accept.await.unwrap();
            // A receive nobody feeds: in flight for the rest of the test.
            let idle = xtc_shards::spawn_local(async move {
                let _ = s.read(Vec::with_capacity(64)).await;
            });
            // Let the loop park once (the wake-ping read is armed there).
            sleep(Duration::from_millis(20)).await;
            let pool = FixedBufPool::register(4, 4096).expect("register");
            sleep(Duration::from_millis(5)).await;
            drop(pool); // unregisters
            idle.abort();
            drop(c);
        });
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r.unwrap(),
        Err(_) => panic!("FixedBufPool::register/drop blocked the loop (ring quiesced)"),
    }
}
