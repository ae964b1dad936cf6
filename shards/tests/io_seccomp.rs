//! The epoll driver where a seccomp filter refuses `epoll_pwait2` (syscall 441 on x86_64):
//! with `ENOSYS` (a kernel before 5.11) and with `EPERM` (systemd's `SystemCallFilter=`, older
//! container profiles), it must fall back to `epoll_wait`. The filter applies to the thread
//! that installs it and the threads it starts, so it stays inside each test.

mod common;

use std::{
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use xtc_shards::{io::DriverChoice, net::UdpSocket, Executor};

/// Makes `epoll_pwait2` fail with `errno` on this thread and the threads it starts; `false`
/// if this machine does not let the process install a filter (the test then skips).
#[cfg(target_arch = "x86_64")]
fn deny_epoll_pwait2(errno: u32) -> bool {
    common::deny_syscall(libc::SYS_epoll_pwait2, errno)
}

/// A UDP receive that waits for its datagram, on a forced-epoll executor started from a
/// thread whose `epoll_pwait2` fails with `errno`.
#[cfg(target_arch = "x86_64")]
fn udp_wait_with_pwait2_failing(errno: i32) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if !deny_epoll_pwait2(errno as u32) {
            let _ = tx.send(None);
            return;
        }
        let exec = Executor::builder()
            .shards(1)
            .io_driver(DriverChoice::Epoll)
            .build()
            .unwrap();
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        exec.spawn_on(0, move || async move {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = sock.local_addr().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                s.send_to(b"hello", addr).unwrap();
            });
            let (r, buf) = sock.recv_from(Vec::with_capacity(64)).await;
            r.unwrap();
            *g.lock().unwrap() = Some(buf);
        })
        .unwrap();
        let r = exec.run();
        let got = got.lock().unwrap().take();
        let _ = tx.send(Some((r.is_ok(), got)));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(None) => println!("errno {errno}: no seccomp here; skipped"),
        Ok(Some((ok, got))) => {
            assert!(ok, "errno {errno}: run() failed");
            assert_eq!(got.as_deref(), Some(&b"hello"[..]), "errno {errno}");
        }
        Err(_) => panic!("errno {errno}: the loop never saw the datagram within 20 s"),
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn epoll_falls_back_when_pwait2_is_refused_with_enosys() {
    udp_wait_with_pwait2_failing(libc::ENOSYS);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn epoll_falls_back_when_pwait2_is_refused_with_eperm() {
    udp_wait_with_pwait2_failing(libc::EPERM);
}
