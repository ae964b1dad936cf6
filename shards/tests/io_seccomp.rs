//! The epoll driver where a seccomp filter refuses `epoll_pwait2` (syscall 441 on x86_64):
//! with `ENOSYS` (a kernel before 5.11) and with `EPERM` (systemd's `SystemCallFilter=`, older
//! container profiles), it must fall back to `epoll_wait`. The filter applies to the thread
//! that installs it and the threads it starts, so it stays inside each test.

use std::{
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use xtc_shards::{io::DriverChoice, net::UdpSocket, Executor};

/// Makes `epoll_pwait2` fail with `errno` on this thread and the threads it starts; `false`
/// if this machine does not let the process install a filter (the test then skips).
#[cfg(target_arch = "x86_64")]
fn deny_epoll_pwait2(errno: u32) -> bool {
    /// `struct sock_filter`.
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    /// `struct sock_fprog`.
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const LD_W_ABS: u16 = 0x20; // A = seccomp_data.nr (offset 0)
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let filter = [
        SockFilter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        SockFilter {
            code: JEQ_K,
            jt: 0,
            jf: 1,
            k: libc::SYS_epoll_pwait2 as u32,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | errno,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ];
    let prog = SockFprog {
        len: filter.len() as u16,
        filter: filter.as_ptr(),
    };
    // SAFETY: plain prctl calls; `prog` and the filter it points to outlive the call, which
    // copies them.
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const SockFprog as usize,
                0,
                0,
            ) == 0
    }
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
