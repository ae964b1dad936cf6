use xtc_shards as xtc;

#[test]
fn echo_smoke() {
    for drv in [xtc::io::DriverChoice::IoUring, xtc::io::DriverChoice::Epoll] {
        let exec = xtc::Executor::builder()
            .shards(2)
            .io_driver(drv)
            .build()
            .unwrap();
        let out = exec
            .block_on(|| async {
                let l = xtc::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let server = xtc::spawn_local(async move {
                    let (s, _) = l.accept().await.unwrap();
                    let mut buf = Vec::with_capacity(64);
                    loop {
                        let (n, b) = s.read(buf).await;
                        let n = n.unwrap();
                        if n == 0 {
                            break;
                        }
                        let (r, b) = s.write_all(b).await;
                        r.unwrap();
                        buf = b;
                    }
                });
                let c = xtc::net::TcpStream::connect(addr).await.unwrap();
                let mut got = Vec::new();
                for i in 0..100u32 {
                    let msg = format!("hello {i}").into_bytes();
                    let want = msg.clone();
                    let (r, _) = c.write_all(msg).await;
                    r.unwrap();
                    let (n, b) = c.read(Vec::with_capacity(64)).await;
                    assert_eq!(n.unwrap(), want.len());
                    assert_eq!(b, want);
                    got.push(i);
                }
                drop(c);
                server.await.unwrap();
                (xtc::io::current_driver(), got.len())
            })
            .unwrap();
        println!("{drv:?} -> {out:?}");
        assert_eq!(out.1, 100);
    }
}
