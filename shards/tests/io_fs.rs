//! Files on both I/O drivers (io_uring in the kernel, epoll through the blocking pool): write
//! and read round trips, positional I/O at offsets, metadata, sync, close, `fs::read` /
//! `fs::write` of 1 MiB, errors for missing files and bad options, and registered buffers on a
//! file.
//!
//! Every test runs its body once per driver (see `io_common::cases`).

mod common;
mod io_common;
use common::run_within;
use io_common::*;

use std::{
    io,
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering::SeqCst},
    time::{Duration, SystemTime},
};

use xtc_shards::{
    fs::{self, File, OpenOptions},
    io::{Driver, FixedBufPool},
    spawn_local,
};

/// A fresh, unique path in the temp dir (removed by [`Cleanup`]).
fn temp_path(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "xtc-io-fs-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, SeqCst)
    ))
}

/// Removes the file when dropped (also when the test fails).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Opens `path` for reading and writing, created empty.
async fn open_scratch(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .await
        .unwrap()
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i.wrapping_mul(13)).wrapping_add(seed.wrapping_mul(5)) % 253) as u8)
        .collect()
}

#[test]
fn write_then_read_round_trip() {
    on_each_driver("write_then_read_round_trip", 1, |_| async {
        let path = temp_path("rt");
        let _c = Cleanup(path.clone());
        let f = File::create(&path).await.unwrap();
        let (r, back) = f.write_at(pattern(1, 10_000), 0).await;
        assert_eq!(r.unwrap(), 10_000);
        assert_eq!(back.len(), 10_000, "the buffer comes back");
        f.sync_all().await.unwrap();
        f.close().await.unwrap();

        let f = File::open(&path).await.unwrap();
        let (r, buf) = f.read_at(Vec::with_capacity(20_000), 0).await;
        assert_eq!(r.unwrap(), 10_000, "a read stops at end of file");
        assert_eq!(buf, pattern(1, 10_000), "the Vec's length is the count");
        // At and past end of file: 0.
        let (r, buf) = f.read_at(Vec::with_capacity(10), 10_000).await;
        assert_eq!(r.unwrap(), 0);
        assert!(buf.is_empty());
        let (r, _) = f.read_at(Vec::with_capacity(10), 1 << 30).await;
        assert_eq!(r.unwrap(), 0);
        // Opened read-only: writes fail.
        let (r, _) = f.write_at(&b"nope"[..], 0).await;
        assert!(r.is_err());
        f.close().await.unwrap();

        // std agrees.
        assert_eq!(std::fs::read(&path).unwrap(), pattern(1, 10_000));
    });
}

/// A byte-string literal (`&'static [u8; N]`) and a `&'static str` are buffers as they are:
/// written whole, and handed back as the same reference.
#[test]
fn static_literals_are_write_buffers() {
    on_each_driver("static_literals_are_write_buffers", 1, |_| async {
        let path = temp_path("lit");
        let _c = Cleanup(path.clone());
        let f = File::create(&path).await.unwrap();
        let (r, back) = f.write_all_at(b"hello, ", 0).await;
        r.unwrap();
        assert_eq!(back, b"hello, ");
        let (r, back) = f.write_all_at("literal\n", 7).await;
        r.unwrap();
        assert_eq!(back, "literal\n");
        let (r, back) = f.write_at(b"", 15).await;
        assert_eq!(r.unwrap(), 0, "an empty literal writes nothing");
        assert!(back.is_empty());
        f.close().await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello, literal\n");
    });
}

#[test]
fn read_at_and_write_at_offsets() {
    on_each_driver("read_at_and_write_at_offsets", 1, |_| async {
        let path = temp_path("offsets");
        let _c = Cleanup(path.clone());
        let f = open_scratch(&path).await;
        // Writes out of order, with a hole.
        let (r, _) = f.write_all_at(vec![b'b'; 100], 100).await;
        r.unwrap();
        let (r, _) = f.write_all_at(vec![b'a'; 100], 0).await;
        r.unwrap();
        let (r, _) = f.write_all_at(&b"tail"[..], 1000).await;
        r.unwrap();
        assert_eq!(f.metadata().await.unwrap().len(), 1004);

        let (r, buf) = f.read_at(Vec::with_capacity(50), 75).await;
        assert_eq!(r.unwrap(), 50);
        let mut want = vec![b'a'; 25];
        want.extend(vec![b'b'; 25]);
        assert_eq!(buf, want);
        // The hole reads as zeros.
        let (r, buf) = f.read_at(Vec::with_capacity(10), 500).await;
        assert_eq!(r.unwrap(), 10);
        assert_eq!(buf, vec![0u8; 10]);
        // A Box<[u8]> is filled from its start.
        let (r, buf) = f.read_at(vec![9u8; 8].into_boxed_slice(), 998).await;
        assert_eq!(r.unwrap(), 6);
        assert_eq!(&buf[..6], b"\0\0tail");
        // Overwrite in the middle; the rest is untouched.
        let (r, _) = f.write_at(&b"XY"[..], 150).await;
        assert_eq!(r.unwrap(), 2);
        let (r, buf) = f.read_at(Vec::with_capacity(4), 149).await;
        assert_eq!(r.unwrap(), 4);
        assert_eq!(buf, b"bXYb");
        f.sync_data().await.unwrap();
        f.close().await.unwrap();

        // Append mode ignores positions for writes.
        let f = OpenOptions::new().append(true).open(&path).await.unwrap();
        let (r, _) = f.write_all_at(&b"+more"[..], 0).await;
        r.unwrap();
        f.close().await.unwrap();
        let all = std::fs::read(&path).unwrap();
        assert_eq!(all.len(), 1009);
        assert!(all.ends_with(b"tail+more"));
    });
}

#[test]
fn metadata_sync_and_close() {
    on_each_driver("metadata_sync_and_close", 1, |_| async {
        let before = SystemTime::now() - Duration::from_secs(5);
        let path = temp_path("meta");
        let _c = Cleanup(path.clone());
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(&path)
            .await
            .unwrap();
        let m = f.metadata().await.unwrap();
        assert!(m.is_file());
        assert!(!m.is_dir());
        assert!(m.is_empty());
        assert_eq!(m.len(), 0);
        // The umask may clear bits, never set them.
        assert_eq!(m.mode() & 0o777 & !0o640, 0, "mode {:o}", m.mode());
        let (r, _) = f.write_all_at(pattern(2, 12_345), 0).await;
        r.unwrap();
        f.sync_all().await.unwrap();
        f.sync_data().await.unwrap();
        let m = f.metadata().await.unwrap();
        assert_eq!(m.len(), 12_345);
        assert!(!m.is_empty());
        assert!(m.modified() >= before, "{:?}", m.modified());
        f.close().await.unwrap();

        // create_new on an existing file fails.
        let e = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        // Neither read nor write: an error before any system call.
        let e = OpenOptions::new().open(&path).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);

        // A directory.
        let d = File::open(std::env::temp_dir()).await.unwrap();
        let m = d.metadata().await.unwrap();
        assert!(m.is_dir());
        assert!(!m.is_file());
        d.close().await.unwrap();

        // Close with an operation's file still shared by another task: Ok, closes later.
        let f = std::rc::Rc::new(File::open(&path).await.unwrap());
        let f2 = f.clone();
        let reader = spawn_local(async move {
            let (r, b) = f2.read_at(Vec::with_capacity(100), 0).await;
            r.unwrap();
            b
        });
        assert_eq!(guard("read", reader).await.unwrap(), pattern(2, 100));
        std::rc::Rc::try_unwrap(f).unwrap().close().await.unwrap();
    });
}

#[test]
fn fs_read_and_write_one_mib() {
    on_each_driver("fs_read_and_write_one_mib", 1, |_| async {
        let path = temp_path("mib");
        let _c = Cleanup(path.clone());
        let data = pattern(3, (1 << 20) + 17);
        fs::write(&path, data.clone()).await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), data.len() as u64);
        let back = fs::read(&path).await.unwrap();
        assert!(back == data, "fs::read differs from what fs::write wrote");
        // Overwrite with less: write truncates.
        fs::write(&path, &b"short"[..]).await.unwrap();
        assert_eq!(fs::read(&path).await.unwrap(), b"short");
        // An empty file.
        fs::write(&path, Vec::new()).await.unwrap();
        assert!(fs::read(&path).await.unwrap().is_empty());
    });
}

/// A sparse file far larger than memory: `fs::read` answers `OutOfMemory`, as `std::fs::read`
/// does, instead of aborting the process in its up-front allocation.
#[test]
fn fs_read_of_a_huge_sparse_file_is_an_error() {
    // With overcommit forced on (`vm.overcommit_memory = 1`) the kernel grants any size below
    // the address space, and the read would really read terabytes of holes.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|v| v.trim() == "1") {
        println!("skipped: vm.overcommit_memory = 1 grants any allocation");
        return;
    }
    on_each_driver("fs_read_of_a_huge_sparse_file_is_an_error", 1, |_| async {
        let path = temp_path("sparse");
        let _c = Cleanup(path.clone());
        let f = std::fs::File::create(&path).unwrap();
        // The largest size the file system takes, from 2^62 bytes (more than any address
        // space) down to 2^43 (8 TiB, far beyond what the kernel's overcommit check grants).
        let took = (43..=62).rev().any(|bits| f.set_len(1u64 << bits).is_ok());
        drop(f);
        if !took {
            println!("skipped: the file system refuses sparse files of 8 TiB and more");
            return;
        }
        let e = fs::read(&path).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory, "{e}");
    });
}

#[test]
fn opening_a_missing_file_is_not_found() {
    on_each_driver("opening_a_missing_file_is_not_found", 1, |_| async {
        let path = temp_path("missing");
        let e = File::open(&path).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = fs::read(&path).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = fs::write(path.join("sub"), &b"x"[..]).await.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ),
            "{e}"
        );
        let e = File::open("bad\0path").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    });
}

#[test]
fn fixed_buf_pool_on_a_file() {
    on_each_driver("fixed_buf_pool_on_a_file", 1, |driver| async move {
        let path = temp_path("fixed");
        let _c = Cleanup(path.clone());
        let pool = FixedBufPool::register(2, 8192).unwrap();
        assert_eq!(pool.is_registered(), driver == Driver::IoUring);
        let f = open_scratch(&path).await;
        let mut wb = pool.take().unwrap();
        assert_eq!(wb.put_slice(&pattern(4, 8192)), 8192);
        let (r, wb) = f.write_at(wb, 4096).await;
        assert_eq!(r.unwrap(), 8192);
        assert_eq!(&wb[..], &pattern(4, 8192)[..], "the data is still there");
        let rb = pool.take().unwrap();
        let (r, rb) = f.read_at(rb, 4096 + 100).await;
        assert_eq!(r.unwrap(), 8092);
        assert_eq!(&rb[..], &pattern(4, 8192)[100..]);
        // A second registration on one io_uring fails.
        if driver == Driver::IoUring {
            assert!(FixedBufPool::register(1, 64).is_err());
        }
        drop((wb, rb, pool));
        f.close().await.unwrap();
        let all = std::fs::read(&path).unwrap();
        assert_eq!(all.len(), 4096 + 8192);
        assert!(all[..4096].iter().all(|&b| b == 0));
    });
}

/// 16,384 buffers of 1 GiB pass the per-buffer checks; 16 TiB in all is more than any machine
/// this runs on. It must be refused at once with an error that says so, on both drivers. It
/// was accepted on epoll (16 TiB of address space, never backed), under an address-space
/// limit (`ulimit -v`) the allocation aborted the process, and the io_uring registration
/// (which pins, and so backs, every page; unaccounted for a root process) would have run the
/// machine out of memory: the test was not run there before the fix.
#[test]
fn a_fixed_buf_pool_larger_than_the_machine_is_refused() {
    on_each_driver(
        "fixed_buf_pool_larger_than_the_machine",
        1,
        |driver| async move {
            // SAFETY: `sysconf` takes no pointers.
            let ram = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) as u128 }
                * unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u128 };
            if ram >= 16_384u128 << 30 {
                println!("skipped: this machine has 16 TiB of memory or more");
                return;
            }
            let e = FixedBufPool::register(16_384, 1 << 30).expect_err("a 16 TiB pool");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{driver}: {e}");
            assert!(e.to_string().contains("memory"), "{driver}: {e}");
            // A pool of a sane size still works, and is usable.
            let pool = FixedBufPool::register(2, 4096).unwrap();
            let mut b = pool.take().unwrap();
            assert_eq!((b.len(), b.capacity()), (0, 4096));
            assert_eq!(b.put_slice(&[7u8; 5000]), 4096);
            assert!(b.iter().all(|&x| x == 7));
        },
    );
}

#[test]
fn many_concurrent_file_operations() {
    on_each_driver("many_concurrent_file_operations", 1, |_| async {
        let path = temp_path("conc");
        let _c = Cleanup(path.clone());
        let f = std::rc::Rc::new(File::create(&path).await.unwrap());
        // 64 tasks write 64 disjoint blocks at once; the blocking pool (epoll) or the ring
        // (io_uring) takes them all.
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let f = f.clone();
                spawn_local(async move {
                    let (r, _) = f.write_all_at(pattern(i, 4096), (i * 4096) as u64).await;
                    r.unwrap();
                })
            })
            .collect();
        for t in tasks {
            guard("a write", t).await.unwrap();
        }
        std::rc::Rc::try_unwrap(f).unwrap().close().await.unwrap();
        let all = fs::read(&path).await.unwrap();
        assert_eq!(all.len(), 64 * 4096);
        for i in 0..64 {
            assert_eq!(
                all[i * 4096..(i + 1) * 4096],
                pattern(i, 4096)[..],
                "block {i}"
            );
        }
    });
}

#[test]
fn fs_read_of_a_file_that_reports_size_zero() {
    on_each_driver("fs_read_of_a_file_that_reports_size_zero", 1, |_| async {
        // procfs files stat as empty but have content: fs::read reads until end of file.
        let got = fs::read("/proc/self/status").await.unwrap();
        let text = String::from_utf8(got).unwrap();
        assert!(text.contains("Name:"), "{text}");
        assert!(text.ends_with('\n'));
    });
}

/// Two opens of one FIFO in flight at once (a reader's open blocks until a writer opens): both
/// complete. On the epoll driver they run on the blocking pool, whose admission used to count
/// an idle thread that already had a wake-up coming as free: with one idle thread, the second
/// open queued behind the first, which waited for it for good.
#[test]
fn concurrent_opens_of_a_fifo_both_complete() {
    on_each_driver("concurrent_opens_of_a_fifo_both_complete", 1, |_| async {
        let path = temp_path("fifo");
        let _c = Cleanup(path.clone());
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain system call with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A finished file operation first, so the pool has an idle thread when both opens go.
        // One name: each `temp_path` call makes a new one, and a second call here left the
        // written file behind in every run.
        let warm = temp_path("warm");
        let _w = Cleanup(warm.clone());
        fs::write(&warm, b"x".to_vec()).await.unwrap();
        xtc_shards::time::sleep(std::time::Duration::from_millis(20)).await;
        let (mut ro, mut wo) = (OpenOptions::new(), OpenOptions::new());
        let reader = ro.read(true).open(&path);
        let writer = wo.write(true).open(&path);
        let (r, w) = guard("both opens of the FIFO", async {
            futures::join!(reader, writer)
        })
        .await;
        r.unwrap();
        w.unwrap();
    });
}

#[test]
fn offsets_past_the_largest_file_offset_are_rejected_alike() {
    on_each_driver(
        "offsets_past_the_largest_file_offset",
        1,
        |driver| async move {
            let path = temp_path("huge-offset");
            let _c = Cleanup(path.clone());
            let f = open_scratch(&path).await;
            let (r, _) = f.write_all_at(&b"0123456789"[..], 0).await;
            r.unwrap();
            // io_uring would take u64::MAX for "the current position" and write at 0.
            for pos in [u64::MAX, i64::MAX as u64 + 1] {
                let (r, _) = f.write_at(&b"XX"[..], pos).await;
                let e = r.expect_err("a write past i64::MAX");
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{driver}: {e}");
                let (r, _) = f.read_at(Vec::with_capacity(4), pos).await;
                assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
                // Also when there is nothing to write (a reviewer saw `Ok` here).
                let (r, _) = f.write_all_at(Vec::new(), pos).await;
                assert_eq!(
                    r.unwrap_err().kind(),
                    io::ErrorKind::InvalidInput,
                    "{driver}"
                );
            }
            assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
        },
    );
}

#[test]
fn modification_times_before_1970_match_std() {
    on_each_driver("modification_times_before_1970", 1, |_| async {
        let path = temp_path("mtime");
        let _c = Cleanup(path.clone());
        std::fs::write(&path, b"x").unwrap();
        // 1.5 s before the epoch: the kernel keeps sec = -2, nsec = 0.5 s.
        let when = libc::timespec {
            tv_sec: -2,
            tv_nsec: 500_000_000,
        };
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a live NUL-terminated path and an array of two timespecs.
        let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [when, when].as_ptr(), 0) };
        assert_eq!(rc, 0, "utimensat: {}", io::Error::last_os_error());
        let want = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(want, SystemTime::UNIX_EPOCH - Duration::from_millis(1500));
        let f = File::open(&path).await.unwrap();
        assert_eq!(f.metadata().await.unwrap().modified(), want);
    });
}

/// A file write whose future is dropped while it runs still lands (or, cancelled in time on
/// io_uring, never does), and `run()` returns only once it has settled: the file's length does
/// not change after `run()` returned. On the epoll driver's blocking pool a dropped job stopped
/// counting as in flight at once, so `run()` returned while its `pwrite` went on.
#[test]
fn run_returns_only_after_a_dropped_file_write_settled() {
    each_driver(
        "run_returns_only_after_a_dropped_file_write_settled",
        1,
        |b| b,
        |driver, exec| {
            let path = temp_path("dropped-write");
            let _cleanup = Cleanup(path.clone());
            let p = path.clone();
            let in_flight = exec
                .spawn_on(0, move || async move {
                    let f = open_scratch(&p).await;
                    let big = vec![7u8; 64 << 20];
                    futures::FutureExt::now_or_never(f.write_at(big, 0)).is_none()
                })
                .unwrap();
            // A dropped job that never settled would keep the loop from quiescence.
            run_or_fail(&exec, "a run with a dropped file write");
            assert!(
                futures::executor::block_on(in_flight).unwrap(),
                "{driver}: a 64 MiB write finished in its first poll (nothing was dropped)"
            );
            let at_return = std::fs::metadata(&path).unwrap().len();
            std::thread::sleep(Duration::from_millis(300));
            let later = std::fs::metadata(&path).unwrap().len();
            assert_eq!(
                at_return, later,
                "{driver}: the write went on after run() returned"
            );
        },
    );
}

/// A FIFO at a fresh path (removed by the returned [`Cleanup`]).
fn fifo(tag: &str) -> (PathBuf, Cleanup) {
    let path = temp_path(tag);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain system call with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    (path.clone(), Cleanup(path))
}

/// `fs::read` and `fs::write` on a FIFO behave as `std`'s: they read to its end and write to
/// it. Both went through positioned I/O, which a FIFO refuses (`ESPIPE`).
#[test]
fn fs_read_and_write_of_a_fifo_work_as_in_std() {
    on_each_driver("fs_read_and_write_of_a_fifo", 1, |driver| async move {
        let (path, _c) = fifo("read");
        let p = path.clone();
        let writer = std::thread::spawn(move || std::fs::write(&p, b"hello"));
        let got = guard("fs::read of a FIFO", fs::read(&path)).await;
        writer.join().unwrap().unwrap();
        assert_eq!(got.unwrap(), b"hello", "{driver}");

        let (path, _c) = fifo("write");
        let p = path.clone();
        let reader = std::thread::spawn(move || std::fs::read(&p));
        guard("fs::write to a FIFO", fs::write(&path, b"world".to_vec()))
            .await
            .unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), b"world", "{driver}");
    });
}

/// Opening a FIFO waits for its peer, as `open(2)` and `std` do: for writing, until a reader
/// comes (io_uring's first, non-blocking try failed at once with `ENXIO`); for reading, until
/// a writer comes (it returned at once, and the first read saw an end of file: `fs::read`
/// returned nothing).
#[test]
fn opening_a_fifo_waits_for_its_peer_as_in_std() {
    on_each_driver(
        "opening_a_fifo_waits_for_its_peer",
        1,
        |driver| async move {
            let (path, _c) = fifo("wopen");
            let p = path.clone();
            let reader = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::read(&p)
            });
            let mut o = OpenOptions::new();
            let f = guard("a write-only open of a FIFO", o.write(true).open(&path)).await;
            let f = f.unwrap_or_else(|e| panic!("{driver}: {e}"));
            drop(f);
            assert_eq!(reader.join().unwrap().unwrap(), b"", "{driver}");

            let (path, _c) = fifo("ropen");
            let p = path.clone();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::write(&p, b"late")
            });
            let got = guard("fs::read of a FIFO before its writer", fs::read(&path)).await;
            writer.join().unwrap().unwrap();
            assert_eq!(got.unwrap(), b"late", "{driver}");
        },
    );
}

/// A file operation dropped while it blocks (an open of a FIFO that no reader comes to,
/// under a timeout) does not keep `run()` from returning. On epoll the pool thread stayed
/// blocked in `open(2)`, and its abandoned job counted as I/O in flight for ever.
#[test]
fn run_returns_after_a_dropped_open_that_blocks() {
    use std::os::unix::fs::OpenOptionsExt;
    each_driver(
        "run_returns_after_a_dropped_open_that_blocks",
        1,
        |b| b,
        |driver, exec| {
            let (path, _c) = fifo(&format!("dropped-open-{driver}"));
            let p = path.clone();
            let timed_out = exec
                .spawn_on(0, move || async move {
                    let mut o = OpenOptions::new();
                    o.write(true);
                    xtc_shards::time::timeout(Duration::from_millis(50), o.open(&p))
                        .await
                        .is_err()
                })
                .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let handle = exec.handle();
            let returned = std::thread::scope(|s| {
                s.spawn(|| tx.send(exec.run()).unwrap());
                let returned = rx.recv_timeout(Duration::from_secs(10));
                if returned.is_err() {
                    // Release the blocked open (a reader comes), so the test ends.
                    handle.stop();
                    let _reader = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&path);
                    let _ = rx.recv_timeout(HANG);
                }
                returned
            });
            returned
                .unwrap_or_else(|_| panic!("{driver}: run() hung on the dropped open"))
                .unwrap();
            assert!(futures::executor::block_on(timed_out).unwrap(), "{driver}");
        },
    );
}

/// Nine FIFO opens in flight at once: eight readers, each blocked until a writer opens, and
/// the writer they wait for. The epoll driver's pool held at most 8 threads, all blocked in
/// the readers' opens, and io_uring's kernel workers were capped at 4 per CPU (8 here): the
/// writer's open queued behind them for good, as did every later file operation.
#[test]
fn nine_concurrent_fifo_opens_complete() {
    on_each_driver(
        "nine_concurrent_fifo_opens_complete",
        1,
        |driver| async move {
            let (path, _c) = fifo(&format!("nine-{driver}"));
            let readers: Vec<_> = (0..8)
                .map(|_| {
                    let p = path.clone();
                    spawn_local(async move { OpenOptions::new().read(true).open(&p).await })
                })
                .collect();
            // Let the readers' opens reach the pool (and block there) first; if one has not, the
            // test only proves less.
            xtc_shards::time::sleep(Duration::from_millis(200)).await;
            let mut options = OpenOptions::new();
            let writer = options.write(true).open(&path);
            let all = async {
                let w = writer.await;
                let mut rs = Vec::new();
                for r in readers {
                    rs.push(r.await);
                }
                (w, rs)
            };
            // A hang guard, not a timing check: this takes milliseconds.
            match xtc_shards::time::timeout(Duration::from_secs(20), all).await {
                Ok((w, rs)) => {
                    w.unwrap();
                    for r in rs {
                        r.unwrap().unwrap();
                    }
                }
                Err(_) => panic!("[{driver}] the writer's open of the FIFO never ran"),
            }
        },
    );
}

/// A dropped `fs::read` of a FIFO takes none of the bytes written after the drop returned. On
/// epoll the pool thread could be between its cancel check and its `read(2)` when the cancel
/// signal came: the signal was spent there, the read then blocked, and it swallowed the next
/// byte written (a few rounds in a thousand) before the loop's next signal got to it.
#[test]
fn a_dropped_fifo_read_takes_no_byte_written_after_the_drop() {
    on_each_driver(
        "a_dropped_fifo_read_takes_no_byte",
        1,
        |driver| async move {
            use std::io::{Read as _, Write as _};
            let (path, _c, mut keep) = fifo_held("dropped-read");
            let mut lost = Vec::new();
            for i in 0..1000 {
                {
                    // Start a read of the empty FIFO, let it run a few turns, drop it.
                    let mut read = Box::pin(fs::read(&path));
                    for _ in 0..(i % 4) {
                        assert!(futures::FutureExt::now_or_never(read.as_mut()).is_none());
                        xtc_shards::yield_now().await;
                    }
                }
                keep.write_all(b"x").unwrap();
                xtc_shards::time::sleep(Duration::from_millis(2)).await;
                let mut b = [0u8; 8];
                match keep.read(&mut b) {
                    Ok(1) => {}
                    other => lost.push((i, format!("{other:?}"))),
                }
            }
            assert!(
                lost.is_empty(),
                "[{driver}] bytes written after a dropped fs::read were taken by it: {lost:?}"
            );
        },
    );
}

/// Opens `path`'s write end once the reader's `open(2)` (a pool thread's, which may not have
/// started yet) waits: a non-blocking open fails with `ENXIO` until then, so this tries again
/// until [`HANG`].
fn open_fifo_writer(path: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let t0 = std::time::Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => return f,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && t0.elapsed() < HANG => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("open the FIFO's write end (its reader waits): {e}"),
        }
    }
}

/// A FIFO of `tag` with both ends held open, non-blocking, by the returned file (nobody reads
/// until the test does): `fs`'s own opens of it never wait for a peer.
fn fifo_held(tag: &str) -> (PathBuf, Cleanup, std::fs::File) {
    use std::os::unix::fs::OpenOptionsExt;
    let (path, c) = fifo(tag);
    let keep = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .unwrap();
    (path, c, keep)
}

/// A dropped write into a FIFO larger than its room stops: nothing more lands once a reader
/// makes room. The fix that keeps a dropped read from taking later bytes blocked the cancel
/// signal through the write(2) itself, so the write went on (983,040 more bytes here) and its
/// abandoned job kept the loop from quiescence until something drained the pipe.
#[test]
fn a_dropped_fifo_write_larger_than_the_room_writes_nothing_after_the_drop() {
    use std::io::Read as _;
    on_each_driver("a_dropped_fifo_write_stops", 1, |driver| async move {
        let (path, _c, mut keep) = fifo_held("dropped-write");
        // 1 MiB into an empty 64 KiB pipe: room for the start, then the write waits.
        let w = xtc_shards::time::timeout(
            Duration::from_millis(200),
            fs::write(&path, vec![7u8; 1 << 20]),
        )
        .await;
        assert!(
            w.is_err(),
            "[{driver}] the write should still wait for room"
        );
        let mut buf = vec![0u8; 1 << 21];
        let _at_drop = keep.read(&mut buf).unwrap_or(0);
        xtc_shards::time::sleep(Duration::from_millis(300)).await;
        let mut after = 0;
        while let Ok(n @ 1..) = keep.read(&mut buf) {
            after += n;
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            after, 0,
            "[{driver}] a dropped write went on writing {after} bytes after the drop"
        );
    });
}

/// A file operation that finished but whose future its task never polls again wakes nobody:
/// a deadlock, reported as on io_uring. The epoll driver counted the job until its result was
/// taken, so the loop never looked idle and `run()` hung.
#[test]
fn a_deadlock_behind_a_finished_unpolled_file_op_is_reported() {
    each_driver(
        "a_deadlock_behind_a_finished_unpolled_file_op_is_reported",
        1,
        |b| b.deadlock_grace(Some(Duration::from_millis(200))),
        |driver, exec| {
            let path = temp_path("deadlock-unpolled");
            let _cleanup = Cleanup(path.clone());
            std::fs::write(&path, b"hello").unwrap();
            let p = path.clone();
            exec.spawn_on(0, move || async move {
                let f = File::open(&p).await.unwrap();
                // One whose first poll finds it unfinished (a pool job can be that quick).
                // Tried for a while, not a number of times: on a loaded machine waking the
                // pool's thread may preempt this one, which then finds the job done at its
                // first poll many times in a row.
                let mut op = Box::pin(f.metadata());
                let limit = std::time::Instant::now() + FIRST_POLL_TRIES;
                while futures::FutureExt::now_or_never(op.as_mut()).is_some() {
                    assert!(
                        std::time::Instant::now() < limit,
                        "every metadata call finished at its first poll"
                    );
                    op = Box::pin(f.metadata());
                }
                // The job ends meanwhile; its future is kept and never polled again.
                xtc_shards::time::sleep(Duration::from_millis(50)).await;
                let _keep = op;
                std::future::pending::<()>().await;
            })
            .unwrap();
            match run_within(&exec, Duration::from_secs(20)) {
                Some(Err(xtc_shards::Error::Deadlock { .. })) => {}
                other => {
                    panic!("[{driver}] expected a deadlock report, got {other:?} (None: hung)")
                }
            }
        },
    );
}

/// `block_on` returns only after a dropped write's job ended (or a second passed), as an
/// io_uring driver waits for its operations: on epoll the pool's `pwrite` went on writing the
/// file after `block_on` had returned.
#[test]
fn block_on_returns_after_a_dropped_write_settled() {
    each_driver(
        "block_on_returns_after_a_dropped_write_settled",
        1,
        |b| b,
        |driver, exec| {
            let path = temp_path("dropped-write-settles");
            let _cleanup = Cleanup(path.clone());
            let p = path.clone();
            let t0 = std::time::Instant::now();
            exec.block_on(move || async move {
                let f = File::create(&p).await.unwrap();
                let big = vec![7u8; 64 << 20];
                let writer = xtc_shards::spawn_local(async move {
                    let _ = f.write_at(big, 0).await;
                });
                xtc_shards::time::sleep(Duration::from_millis(20)).await;
                drop(writer);
            })
            .unwrap();
            let took = t0.elapsed();
            let at_return = std::fs::metadata(&path).unwrap().len();
            std::thread::sleep(Duration::from_millis(500));
            let later = std::fs::metadata(&path).unwrap().len();
            // The wait is capped at a second: a write that outlasts it (on a loaded machine
            // the 64 MiB took longer, seen on one CPU) may go on after `block_on` returned, as
            // documented, and a `block_on` that took the whole second did wait for it. One
            // that did not wait returns some 20 ms in, with the write still going.
            assert!(
                at_return == later || took >= Duration::from_secs(1),
                "[{driver}] the write went on after block_on returned ({took:?} in), \
                 from {at_return} to {later} bytes"
            );
        },
    );
}

/// A file operation whose future outlives its `block_on` (returned out of it, still running:
/// an `open` of a FIFO nobody writes) is its owner's to await: a later, unrelated `block_on` on
/// the thread does not wait for it. The stopping loop waited for every pool job of its thread,
/// so each later `block_on` returned a second late. Observed, not timed: the open cannot end
/// before a reader comes, after the `block_on`s, so a stopping loop that waits for it waits
/// its full second and then logs that it gave up, which the test counts.
#[test]
fn a_later_block_on_does_not_wait_for_an_earlier_runs_live_file_op() {
    let (path, _cleanup) = fifo("escaped-open");
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let p = path.clone();
    // The run hands the still-pending open out, unawaited: what the test is about.
    #[allow(clippy::async_yields_async)]
    let kept = ex.block_on(async move {
        let mut open: std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<File>>>> =
            Box::pin(async move { OpenOptions::new().write(true).open(&p).await });
        assert!(futures::FutureExt::now_or_never(open.as_mut()).is_none());
        open
    });
    let gave_up = std::sync::Arc::new(AtomicUsize::new(0));
    // The warnings logged on this thread (the stopping loop's "... still run after 1s;
    // leaving them" is the one a wait for the open logs; an empty `block_on` logs none).
    let warnings = common::count_events(tracing::Level::WARN, gave_up.clone());
    tracing::subscriber::with_default(warnings, || {
        for _ in 0..3 {
            ex.block_on(async {});
        }
    });
    // A reader releases the blocked open (on the epoll driver's pool).
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        drop(kept);
    }
    assert_eq!(
        gave_up.load(SeqCst),
        0,
        "an unrelated block_on waited for an earlier run's file operation, until it gave up"
    );
}

/// More completions than the completion ring holds (2 × 256) overflow to the kernel's list,
/// which only an enter with GETEVENTS brings back. The loop made one only when it parked, so
/// while another task kept yielding the overflowed reads (and every completion after them)
/// never arrived. (From a review.)
#[test]
fn overflowed_completions_reach_a_busy_loop() {
    on_each_driver(
        "overflowed_completions_reach_a_busy_loop",
        1,
        |_| async move {
            let path = temp_path("cq-overflow");
            let _c = Cleanup(path.clone());
            std::fs::write(&path, vec![7u8; 4096]).unwrap();
            let file = std::rc::Rc::new(File::open(&path).await.unwrap());
            let done = std::rc::Rc::new(std::cell::Cell::new(false));
            let (f2, d2) = (file.clone(), done.clone());
            let reader = spawn_local(async move {
                let reads = (0..700).map(|i| {
                    let f = f2.clone();
                    async move {
                        let (r, _) = f.read_at(Vec::with_capacity(16), (i % 200) as u64).await;
                        r.unwrap()
                    }
                });
                futures::future::join_all(reads).await;
                d2.set(true);
            });
            // A cooperative CPU-bound task: it yields, so the loop never parks.
            let t = std::time::Instant::now();
            while !done.get() && t.elapsed() < Duration::from_secs(5) {
                xtc_shards::yield_now().await;
            }
            let finished = done.get();
            reader.await.unwrap(); // the loop parks now, which flushes; the test ends either way
            assert!(
                finished,
                "700 reads did not complete within 5 s while another task yielded"
            );
        },
    );
}

/// A waker for the pool-job tests below: wakes `task`, then keeps the pool thread inside
/// `wake` until `finished` is set (by the test's task, at its end) and a little longer, for the
/// loop to park: what a pool thread preempted after its job's result went out does on its own.
struct Holding {
    task: std::task::Waker,
    finished: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::task::Wake for Holding {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.task.wake_by_ref();
        let t0 = std::time::Instant::now();
        while !self.finished.load(SeqCst) && t0.elapsed() < HANG {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A hang guard, not a timing assertion: the tests pass however long this is.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A one-shard executor on the epoll driver (the blocking pool's).
fn epoll_exec() -> xtc_shards::Executor {
    match xtc_shards::Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(xtc_shards::io::DriverChoice::Epoll)
        .build()
    {
        Ok(e) => e,
        Err(e) => panic!("build an epoll executor: {e}"),
    }
}

/// A pool job's wake-up outran its end: the loop ran the woken task to completion and parked
/// while the job still counted as in flight (the count dropped only after the wake, on the pool
/// thread), so the loop published `WAITING`, parked without a timeout, and nothing woke it
/// when the count reached zero: `run()` never returned. The waker holds the pool thread inside
/// its `wake` until the task has finished, as a preempted pool thread may.
#[test]
fn run_returns_when_a_file_ops_wake_outruns_its_jobs_end() {
    use std::future::Future;
    use std::sync::{atomic::AtomicBool, Arc};
    use std::task::{Context, Waker};

    let exec = epoll_exec();
    let path = temp_path("wake-outruns-end");
    let _cleanup = Cleanup(path.clone());
    std::fs::write(&path, b"hello").unwrap();
    for round in 0..3 {
        let finished = Arc::new(AtomicBool::new(false));
        let (p, fin) = (path.clone(), finished.clone());
        exec.spawn_on(0, move || async move {
            let f = File::open(&p).await.unwrap();
            // One whose first poll finds it unfinished, so that its job calls our waker
            // (tried for a while: see `FIRST_POLL_TRIES`).
            let limit = std::time::Instant::now() + FIRST_POLL_TRIES;
            let len = loop {
                let mut op = Box::pin(f.metadata());
                let holding = Waker::from(Arc::new(Holding {
                    task: futures::task::noop_waker(),
                    finished: fin.clone(),
                }));
                if op
                    .as_mut()
                    .poll(&mut Context::from_waker(&holding))
                    .is_ready()
                {
                    assert!(
                        std::time::Instant::now() < limit,
                        "every metadata call finished at its first poll"
                    );
                    continue;
                }
                break std::future::poll_fn(|cx| {
                    let holding = Waker::from(Arc::new(Holding {
                        task: cx.waker().clone(),
                        finished: fin.clone(),
                    }));
                    op.as_mut().poll(&mut Context::from_waker(&holding))
                })
                .await
                .unwrap()
                .len();
            };
            assert_eq!(len, 5);
            fin.store(true, SeqCst);
        })
        .unwrap();
        match run_within(&exec, Duration::from_secs(20)) {
            Some(Ok(())) => {}
            other => panic!("round {round}: run() did not return Ok ({other:?}; None: it hung)"),
        }
        assert!(finished.load(SeqCst));
    }
}

/// The same race for a dropped (abandoned) job, which wakes no task when it ends: the loop
/// looks at it again every millisecond only while it is listed as abandoned, and forgot it
/// once it was `done`, which the job marked before it left the in-flight count. A loop that
/// read the count before the job left it and the list after the job was done parked `WAITING`
/// without a timeout, for good. Here the waker the job finds in its slot holds the pool thread
/// between the two.
#[test]
fn run_returns_after_a_dropped_file_op_ends_while_its_loop_parks() {
    use std::future::Future;
    use std::sync::{atomic::AtomicBool, Arc};
    use std::task::{Context, Waker};

    let exec = epoll_exec();
    let path = temp_path("abandoned-end");
    let _cleanup = Cleanup(path.clone());
    std::fs::write(&path, b"hello").unwrap();
    for round in 0..3 {
        let finished = Arc::new(AtomicBool::new(false));
        let (p, fin) = (path.clone(), finished.clone());
        exec.spawn_on(0, move || async move {
            let f = File::open(&p).await.unwrap();
            // By time, not by count (`FIRST_POLL_TRIES`).
            let limit = std::time::Instant::now() + FIRST_POLL_TRIES;
            loop {
                let mut op = Box::pin(f.metadata());
                let holding = Waker::from(Arc::new(Holding {
                    task: futures::task::noop_waker(),
                    finished: fin.clone(),
                }));
                if op
                    .as_mut()
                    .poll(&mut Context::from_waker(&holding))
                    .is_pending()
                {
                    // Dropped unfinished (abandoned), or finished and never collected.
                    break;
                }
                assert!(
                    std::time::Instant::now() < limit,
                    "every metadata call finished at its first poll"
                );
            }
            fin.store(true, SeqCst);
        })
        .unwrap();
        match run_within(&exec, Duration::from_secs(20)) {
            Some(Ok(())) => {}
            other => panic!("round {round}: run() did not return Ok ({other:?}; None: it hung)"),
        }
        assert!(finished.load(SeqCst));
    }
}

/// A job whose future is kept but never polled again (its one poll gave it a waker that
/// reaches no loop) and that ends after its loop parked: the loop had read the job in flight
/// and parked `WAITING` with no timeout, and nothing woke it when the job ended, so the task
/// stuck on the finished job was never reported as a deadlock and `run()` never returned.
#[test]
fn a_deadlock_behind_an_unpolled_file_op_that_ends_later_is_reported() {
    use std::sync::{atomic::AtomicBool, Arc};

    let (path, _cleanup) = fifo("unpolled-ends-later");
    let exec = xtc_shards::Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(xtc_shards::io::DriverChoice::Epoll)
        .deadlock_grace(Some(Duration::from_millis(200)))
        .build()
        .unwrap();
    let kept = Arc::new(AtomicBool::new(false));
    let (p, k) = (path.clone(), kept.clone());
    exec.spawn_on(0, move || async move {
        // Blocks on the pool until a writer comes: its first poll finds it unfinished.
        let mut open = Box::pin(async move { OpenOptions::new().read(true).open(&p).await });
        assert!(futures::FutureExt::now_or_never(open.as_mut()).is_none());
        k.store(true, SeqCst);
        let _keep = open;
        std::future::pending::<()>().await;
    })
    .unwrap();
    let writer = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while !kept.load(SeqCst) && t0.elapsed() < HANG {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Once the loop has parked (a hang guard, not a timing assertion: the test passes
        // however long this is), a writer releases the open.
        std::thread::sleep(Duration::from_millis(300));
        open_fifo_writer(&path)
    });
    let r = run_within(&exec, Duration::from_secs(20));
    drop(writer.join().unwrap());
    match r {
        Some(Err(xtc_shards::Error::Deadlock { .. })) => {}
        other => panic!("expected a deadlock report, got {other:?} (None: hung)"),
    }
}

/// A pool op polled again with another waker cloned that waker under the op's slot lock, which
/// its job takes to store its result and take the waker: a waker whose clone waits for the
/// op's end (user code, as a custom waker's clone is) deadlocked the loop against the pool
/// thread. The clone here waits (a hang guard: the test passes however long the job takes)
/// until the first poll's waker is woken, which the job does only after that lock.
#[test]
fn a_waker_clone_that_waits_for_the_ops_end_does_not_deadlock_it() {
    use std::{
        future::Future,
        sync::atomic::AtomicBool,
        task::{Context, Poll, RawWaker, RawWakerVTable, Waker},
    };

    static IN_CLONE: AtomicBool = AtomicBool::new(false);
    static FIRST_WOKEN: AtomicBool = AtomicBool::new(false);
    static CLONE_TIMED_OUT: AtomicBool = AtomicBool::new(false);
    const FIRST: RawWakerVTable = RawWakerVTable::new(
        |p| RawWaker::new(p, &FIRST),
        |_| FIRST_WOKEN.store(true, SeqCst),
        |_| FIRST_WOKEN.store(true, SeqCst),
        |_| {},
    );
    fn waiting_clone(p: *const ()) -> RawWaker {
        IN_CLONE.store(true, SeqCst);
        let t0 = std::time::Instant::now();
        while !FIRST_WOKEN.load(SeqCst) {
            if t0.elapsed() > Duration::from_secs(10) {
                CLONE_TIMED_OUT.store(true, SeqCst);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        RawWaker::new(p, &SECOND)
    }
    const SECOND: RawWakerVTable = RawWakerVTable::new(waiting_clone, |_| {}, |_| {}, |_| {});

    let (path, _cleanup) = fifo("clone-waits");
    let exec = epoll_exec();
    let p = path.clone();
    let task = exec
        .spawn_on(0, move || async move {
            // Blocks on the pool until a writer comes.
            let mut open = Box::pin(async move { OpenOptions::new().read(true).open(&p).await });
            // SAFETY: the vtables' functions ignore the data pointer.
            let first = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &FIRST)) };
            assert!(open
                .as_mut()
                .poll(&mut Context::from_waker(&first))
                .is_pending());
            // SAFETY: as above.
            let second = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &SECOND)) };
            let polled = open.as_mut().poll(&mut Context::from_waker(&second));
            // Whatever that poll returned, the op ends; the task's own waker takes over.
            let file = match polled {
                Poll::Ready(r) => r,
                Poll::Pending => open.await,
            };
            file.map(drop).map_err(|e| e.to_string())
        })
        .unwrap();
    let writer = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while !IN_CLONE.load(SeqCst) && t0.elapsed() < HANG {
            std::thread::sleep(Duration::from_millis(1));
        }
        open_fifo_writer(&path)
    });
    let r = run_within(&exec, HANG);
    drop(writer.join().unwrap());
    assert!(matches!(r, Some(Ok(()))), "run: {r:?}");
    assert_eq!(futures::executor::block_on(task).unwrap(), Ok(()));
    assert!(
        !CLONE_TIMED_OUT.load(SeqCst),
        "the waker's clone ran under the lock the op's job needed to end"
    );
}

/// A waker for the test below: from the pool thread, after its job ended, first makes the loop
/// take a turn (a no-op task spawned on it), then holds the pool thread, as a preemption may,
/// until `run()` returned (or for a while), and only then wakes `task`.
struct TurnThenWake {
    task: std::task::Waker,
    handle: xtc_shards::Handle,
    returned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::task::Wake for TurnThenWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        drop(self.handle.spawn_on(0, || async {}));
        // A hang guard, not a timing assertion: the test passes however long this is (the
        // loop waits for the wake-up to come); it only fails sooner on a false report.
        let t0 = std::time::Instant::now();
        while !self.returned.load(SeqCst) && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.task.wake_by_ref();
    }
}

/// A pool job whose wake-up is still to go out is not a deadlock: the job left its loop's
/// in-flight count before it woke its task, so a loop that took a turn in between (here a
/// task spawned from the waker, before it wakes) read the task parked with nothing in flight,
/// published `PARKED`, and after the grace period `run()` returned `Err(Deadlock)`, dropping
/// the task its wake-up was coming to.
#[test]
fn a_file_ops_wake_still_to_come_is_not_a_deadlock() {
    use std::future::Future;
    use std::sync::{atomic::AtomicBool, Arc};
    use std::task::Waker;

    let (path, _cleanup) = fifo("wake-to-come");
    let exec = xtc_shards::Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(xtc_shards::io::DriverChoice::Epoll)
        .deadlock_grace(Some(Duration::from_millis(200)))
        .build()
        .unwrap();
    let returned = Arc::new(AtomicBool::new(false));
    let pending = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicBool::new(false));
    let (p, ret, pend, done, handle) = (
        path.clone(),
        returned.clone(),
        pending.clone(),
        opened.clone(),
        exec.handle(),
    );
    exec.spawn_on(0, move || async move {
        // Blocks on the pool until the writer below comes.
        let mut open = Box::pin(async move { OpenOptions::new().read(true).open(&p).await });
        let f = std::future::poll_fn(|cx| {
            let w = Waker::from(Arc::new(TurnThenWake {
                task: cx.waker().clone(),
                handle: handle.clone(),
                returned: ret.clone(),
            }));
            let r = open.as_mut().poll(&mut std::task::Context::from_waker(&w));
            pend.store(r.is_pending(), SeqCst);
            r
        })
        .await
        .unwrap();
        drop(f);
        done.store(true, SeqCst);
    })
    .unwrap();
    // Once the open waits for it (its waker is ours), a writer comes: it blocks until the pool
    // job's open of the read end is there too (no timing involved).
    let writer = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while !pending.load(SeqCst) && t0.elapsed() < HANG {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::fs::OpenOptions::new().write(true).open(&path)
    });
    let r = run_within(&exec, Duration::from_secs(20));
    returned.store(true, SeqCst);
    match r {
        Some(Ok(())) => {}
        other => panic!("expected Ok, got {other:?} (None: hung)"),
    }
    assert!(opened.load(SeqCst));
    drop(writer.join().unwrap().unwrap());
}

/// File operations on the epoll driver run no task of their own: a loop's stats count the
/// tasks its user spawned. The end of a loop's last pool job sent the loop a no-op task to
/// make it look again (`blocking::nudge`), which `LoopStats::tasks_run`, `polls` and
/// `inbox_received` counted: a task doing 20 file operations showed as 20 tasks and more.
#[test]
fn file_ops_on_the_pool_add_no_task_to_the_stats() {
    let exec = epoll_exec();
    let path = temp_path("no-task");
    let _cleanup = Cleanup(path.clone());
    std::fs::write(&path, b"hello").unwrap();
    let p = path.clone();
    exec.spawn_on(0, move || async move {
        let f = File::open(&p).await.unwrap();
        for _ in 0..20 {
            assert_eq!(f.metadata().await.unwrap().len(), 5);
        }
    })
    .unwrap();
    match run_within(&exec, Duration::from_secs(20)) {
        Some(Ok(())) => {}
        other => panic!("run() did not return Ok ({other:?}; None: it hung)"),
    }
    let st = exec.loop_stats(0).unwrap();
    assert_eq!(st.tasks_run, 1, "{st:?}");
}

/// A file write whose future is forgotten (`mem::forget`, safe code) after its first poll, and
/// then its file dropped: the write must not land in whatever file next takes the descriptor's
/// number. On io_uring the write's entry named the descriptor by number only and sat in the
/// submission queue until the end of the turn: the drop closed the number, the next open took
/// it, and the write went into that file (on epoll the pool job kept the descriptor open).
#[test]
fn a_forgotten_write_does_not_land_in_a_file_opened_after_its_files_drop() {
    on_each_driver(
        "a_forgotten_write_does_not_land_elsewhere",
        1,
        |driver| async move {
            let (path, victim) = (temp_path("forgotten"), temp_path("victim"));
            let (_c, _v) = (Cleanup(path.clone()), Cleanup(victim.clone()));
            let f = open_scratch(&path).await;
            let mut write = Box::pin(f.write_at(b"stray".to_vec(), 0));
            // One poll (queued on io_uring, on the pool on epoll), then forgotten.
            let _ = futures::FutureExt::now_or_never(write.as_mut());
            common::forget(write);
            drop(f);
            // Takes the lowest free number: the dropped file's, if that was closed.
            let other = std::fs::File::create(&victim).unwrap();
            // Let the loop turn (and submit what it queued), and the write land if it does.
            for _ in 0..10 {
                xtc_shards::time::sleep(Duration::from_millis(5)).await;
            }
            drop(other);
            assert_eq!(
                std::fs::read(&victim).unwrap(),
                b"",
                "{driver}: a forgotten write landed in a file opened after its own was dropped"
            );
        },
    );
}

/// An `open` still awaited when its `block_on` returns (a FIFO without a writer), awaited to
/// its end in the next one: it opens once a writer comes. On io_uring the driver's shutdown
/// cancels its `OPENAT` (nothing opened), and it failed with that `ECANCELED`.
#[test]
fn an_open_that_outlives_its_driver_still_opens() {
    type OpenFut = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<fs::File>>>>;
    let (path, _c) = fifo("outlives");
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let p = path.clone();
    let (mut f, _) = ex.block_on(async move {
        let mut f: OpenFut = Box::pin(async move { OpenOptions::new().read(true).open(&p).await });
        let pending =
            std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx).is_pending()))
                .await;
        assert!(pending, "a FIFO without a writer opened");
        xtc_shards::time::sleep(Duration::from_millis(20)).await; // submitted, waiting for a writer
        (f, ())
    });
    let writer = std::thread::spawn(move || std::fs::write(&path, b"late"));
    let r = ex.block_on(async move { guard("open", f.as_mut()).await });
    let file = r.expect("an open awaited across block_on");
    // The writer first: its open returns once ours has, and its write fails with EPIPE if
    // no reader is left by then (the pipe's buffer takes the four bytes unread).
    writer.join().unwrap().unwrap();
    drop(file);
}

/// How long a test tries for a pool job whose future's first poll finds it unfinished,
/// starting a fresh one each time: by time, not by count, as on a loaded machine waking the
/// pool's thread may preempt the polling one, which then finds the job done at its first poll
/// for thousands of tries in a row (seen on one CPU, and on two under load: 1,000 tries ran
/// out). A hang guard: the tests pass however long it takes.
const FIRST_POLL_TRIES: Duration = Duration::from_secs(15);

/// Descriptors of this process open on `path` (its `/proc/self/fd` links).
fn fds_on(path: &std::path::Path) -> usize {
    let path = std::fs::canonicalize(path).unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| *l == path)
        .count()
}

/// A waker that, woken (from the pool thread, once the job is done), holds that thread inside
/// its `wake` until `release`, as a preemption may, and says so through `woken`.
struct HoldingWake {
    woken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    release: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::task::Wake for HoldingWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.woken.store(true, SeqCst);
        // A hang guard, not a timing assertion: the test passes however long this is.
        let t0 = std::time::Instant::now();
        while !self.release.load(SeqCst) && t0.elapsed() < HANG {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// An `open` whose pool job is done, and whose future is then dropped unpolled: the descriptor
/// it opened is closed by the drop, so by the time `block_on` returns, as io_uring's driver
/// closes a finished open's descriptor when its `Op` is dropped. The job held the result until
/// its own end, after its wake-up (here a waker that holds the pool thread, as a preemption
/// may), so the file stayed open after `block_on` returned (a FIFO peer saw no end of file, a
/// lock stayed held); a cancelled job that never started held its file's descriptor that way.
#[test]
fn a_dropped_finished_opens_descriptor_is_closed_when_block_on_returns() {
    use std::future::Future;
    use std::sync::{atomic::AtomicBool, Arc};
    use std::task::{Context, Waker};

    let path = temp_path("dropped-finished-open");
    let _cleanup = Cleanup(path.clone());
    std::fs::write(&path, b"x").unwrap();
    let exec = epoll_exec();
    let release = Arc::new(AtomicBool::new(false));
    let (p, rel) = (path.clone(), release.clone());
    let r = exec.block_on(move || async move {
        // Tried for a while (`FIRST_POLL_TRIES`).
        let limit = std::time::Instant::now() + FIRST_POLL_TRIES;
        while std::time::Instant::now() < limit {
            let woken = Arc::new(AtomicBool::new(false));
            let waker = Waker::from(Arc::new(HoldingWake {
                woken: woken.clone(),
                release: rel.clone(),
            }));
            let p = p.clone();
            let mut open = Box::pin(async move { OpenOptions::new().read(true).open(&p).await });
            if open
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready()
            {
                // Finished at its first poll (a pool job can be that quick): again.
                continue;
            }
            // The job is done once it wakes (the result is in; the loop waits for nothing).
            let t0 = std::time::Instant::now();
            while !woken.load(SeqCst) {
                assert!(t0.elapsed() < HANG, "the open never ended");
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(open);
            return true;
        }
        false
    });
    let open_after = fds_on(&path);
    release.store(true, SeqCst);
    assert!(
        r.unwrap(),
        "every open finished at its first poll: nothing was checked"
    );
    assert_eq!(
        open_after, 0,
        "the dropped open's descriptor was still open after block_on returned"
    );
}

/// A write whose future is dropped before its pool job starts (the job is then skipped), its
/// `File` dropped too: once the job is done, the file is closed. The skipped job kept its
/// closure, with the file's descriptor, until its own end, after the wake-up, so `block_on` or
/// `run()` could return with the file of a dropped operation still open (on the old code most
/// rounds found it open; a job that started first lets go of it either way). The job's end is
/// observed as `run()`'s return: a loop is not quiescent while one of its pool jobs is in
/// flight. (This test watched for the job's wake-up of the dropped future's waker instead,
/// which held the pool thread in the bug's window, until a dropped future stopped leaving its
/// waker to the job. Checked after `run()`, it rarely catches the old order: the unit test
/// `blocking::tests::a_jobs_captures_go_while_it_still_counts_in_flight` checks the order
/// itself.)
#[test]
fn a_skipped_jobs_file_is_closed_once_the_job_is_done() {
    use std::future::Future;
    use std::sync::{atomic::AtomicBool, Arc};
    use std::task::{Context, Waker};

    const ROUNDS: usize = 200;
    let path = temp_path("skipped-job");
    let _cleanup = Cleanup(path.clone());
    std::fs::write(&path, b"x").unwrap();
    let (mut checked, mut held) = (0, 0);
    for _ in 0..ROUNDS {
        let exec = epoll_exec();
        let p = path.clone();
        let pending = Arc::new(AtomicBool::new(false));
        let seen = pending.clone();
        exec.spawn_on(0, move || async move {
            let f = OpenOptions::new().write(true).open(&p).await.unwrap();
            let mut write = Box::pin(f.write_at(vec![1u8], 0));
            let waiting = write
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending();
            // Dropped at once: the job most often has not started, and is skipped.
            drop(write);
            drop(f);
            seen.store(waiting, SeqCst);
        })
        .unwrap();
        run_or_fail(&exec, "a run with a skipped file write");
        if pending.load(SeqCst) {
            checked += 1;
            if fds_on(&path) > 0 {
                held += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "every write finished at its first poll: nothing was checked"
    );
    assert_eq!(
        held, 0,
        "{held} of {checked} rounds found the dropped file still open once run() returned"
    );
}

/// A write and a read of an empty buffer whose pointer is null (as the traits allow for 0
/// bytes) move nothing, on both drivers. The epoll path copied the buffer through a slice of
/// that pointer (the write's copy for the pool job, the read's copy back): undefined
/// behaviour, and a debug build aborted on it.
#[test]
fn a_null_empty_buffer_writes_and_reads_nothing() {
    on_each_driver(
        "a_null_empty_buffer_writes_and_reads_nothing",
        1,
        |_| async move {
            let path = temp_path("null-empty");
            let _c = Cleanup(path.clone());
            let f = open_scratch(&path).await;
            let (r, _) = f.write_at(NoMemory, 0).await;
            assert_eq!(r.unwrap(), 0);
            let (r, _) = f.write_all_at(NoMemory, 0).await;
            r.unwrap();
            let (r, _) = f.write_all_at(b"data".to_vec(), 0).await;
            r.unwrap();
            let (r, _) = f.read_at(NoMemory, 0).await;
            assert_eq!(r.unwrap(), 0);
            let (r, got) = f.read_at(Vec::with_capacity(16), 0).await;
            assert_eq!((r.unwrap(), &got[..]), (4, &b"data"[..]));
        },
    );
}

/// `File::close` off any loop (a file kept past its `LocalExecutor::block_on`) closes the
/// file, as a drop does there, and reports what `close(2)` answered. It returned the off-loop
/// error ("use files inside a task") after its drop had closed the file anyway: the caller,
/// its `File` consumed, could do nothing the error said, and the kernel's answer was lost.
#[test]
fn close_off_any_loop_closes_and_reports_the_kernels_answer() {
    let path = temp_path("close-off-loop");
    let _c = Cleanup(path.clone());
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let p = path.clone();
    let f = ex.block_on(async move { File::create(&p).await.unwrap() });
    assert_eq!(fds_on(&path), 1, "the file is open");
    let r = futures::executor::block_on(f.close());
    assert!(r.is_ok(), "close off any loop: {r:?}");
    assert_eq!(fds_on(&path), 0, "the file is closed");
}

/// `sync_all`, `sync_data` and `metadata` still awaited when their `block_on` returns (polled
/// once there, so their entries were queued, then handed out), awaited to their end in the
/// next one: they run there, as a cut `read_at`, `write_at` or `open` does. On io_uring the
/// driver's shutdown cancels them (the kernel runs both on its worker threads, and the cancel
/// takes them off its queue before they start), and they failed with that `ECANCELED`, an
/// error nobody asked for (on epoll their pool jobs go on).
#[test]
fn file_calls_that_outlive_their_driver_still_run() {
    type Call = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<u64>>>>;
    let path = temp_path("outlive-calls");
    let _c = Cleanup(path.clone());
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    for round in 0..8 {
        let p = path.clone();
        let (calls, _file) = ex.block_on(async move {
            let f = std::rc::Rc::new(open_scratch(&p).await);
            f.write_all_at(b"data".to_vec(), 0).await.0.unwrap();
            let (a, b, c) = (f.clone(), f.clone(), f.clone());
            let calls: Vec<(&str, Call)> = vec![
                (
                    "sync_all",
                    Box::pin(async move { a.sync_all().await.map(|()| 4) }),
                ),
                (
                    "sync_data",
                    Box::pin(async move { b.sync_data().await.map(|()| 4) }),
                ),
                (
                    "metadata",
                    Box::pin(async move { c.metadata().await.map(|m| m.len()) }),
                ),
            ];
            // Each polled once: its entry queued (or, rarely, its pool job already done).
            let mut polled: Vec<(&str, Result<io::Result<u64>, Call>)> = Vec::new();
            for (what, mut call) in calls {
                let first =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
                polled.push(match first {
                    std::task::Poll::Ready(r) => (what, Ok(r)),
                    std::task::Poll::Pending => (what, Err(call)),
                });
            }
            (polled, f)
        });
        let got = ex.block_on(async move {
            let mut got = Vec::new();
            for (what, call) in calls {
                got.push(match call {
                    Ok(r) => (what, r),
                    Err(mut call) => (what, guard(what, call.as_mut()).await),
                });
            }
            got
        });
        for (what, r) in got {
            assert_eq!(
                r.unwrap_or_else(|e| panic!("round {round}: {what} awaited across block_on: {e}")),
                4,
                "{what}"
            );
        }
    }
}

/// Runs `body` on a thread of its own with a directory on an overlay filesystem, whose files
/// have a `->flush`, so io_uring runs their `CLOSE` on a kernel worker, where a cancel can
/// stop it before it starts (as NFS, FUSE, and the overlay root of most containers). The
/// mount lives in a mount namespace of that thread alone, made private first, so nothing
/// reaches the machine's mounts. `None` where the process may not (not root, no overlay).
fn on_overlay<R: Send + 'static>(
    body: impl FnOnce(&std::path::Path) -> R + Send + 'static,
) -> Option<R> {
    use std::{ffi::CString, os::unix::ffi::OsStrExt};
    let run = move || {
        // SAFETY: plain syscalls; they change this thread's mount namespace only (made private
        // before anything is mounted in it). A propagation change ignores the filesystem type;
        // it is named all the same, as valgrind's memcheck (`scripts/valgrind`) takes a null
        // one for an error.
        let private = unsafe {
            libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    c"none".as_ptr(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0
        };
        if !private {
            return None;
        }
        let base = temp_path("overlay");
        let dir = |d: &str| base.join(d);
        for d in ["lower", "upper", "work", "merged"] {
            std::fs::create_dir_all(dir(d)).ok()?;
        }
        let opts = CString::new(format!(
            "lowerdir={},upperdir={},workdir={}",
            dir("lower").display(),
            dir("upper").display(),
            dir("work").display()
        ))
        .unwrap();
        let merged = CString::new(dir("merged").as_os_str().as_bytes()).unwrap();
        // SAFETY: live NUL-terminated strings.
        let mounted = unsafe {
            libc::mount(
                c"overlay".as_ptr(),
                merged.as_ptr(),
                c"overlay".as_ptr(),
                0,
                opts.as_ptr().cast(),
            ) == 0
        };
        let r = mounted.then(|| body(&dir("merged")));
        if mounted {
            // SAFETY: a live NUL-terminated string.
            unsafe { libc::umount2(merged.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir_all(&base);
        r
    };
    match std::thread::spawn(run).join() {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A `File::close` future polled once (its `CLOSE` submitted) and dropped, on a file whose
/// close the kernel runs on a worker (a `->flush`: overlay here): the file must still close.
/// The dropped `Op` was cancelled like any other, the cancel took the `CLOSE` off the worker
/// queue before it ran, and the descriptor, already taken out of the `File`, stayed open for
/// good (every one of five, on the overlay root of a typical container too).
#[test]
fn a_dropped_close_still_closes_the_file() {
    let r = on_overlay(|dir| {
        let path = dir.join("dropped-close");
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let p = path.clone();
        let uring = ex.block_on(async move {
            // On epoll the files run on the blocking pool, whose threads may predate this
            // thread's mount namespace (and its close is a plain `close(2)`).
            if xtc_shards::io::current_driver() != Some(Driver::IoUring) {
                return false;
            }
            for _ in 0..5 {
                let f = File::create(&p).await.unwrap();
                let mut close = Box::pin(f.close());
                if let Some(r) = futures::FutureExt::now_or_never(close.as_mut()) {
                    r.unwrap();
                }
                drop(close);
            }
            true
        });
        uring.then(|| fds_on(&path))
    });
    match r {
        None => println!("no private overlay mount here (not root?); skipped"),
        Some(None) => println!("not on io_uring; skipped"),
        Some(Some(left)) => assert_eq!(left, 0, "files left open"),
    }
}

/// The path operations on both drivers: a snapshot written to a temporary file, synced and
/// renamed over the old one (the reader sees the new bytes), a rename's and a removal's errors
/// as std gives them, directories made (nested, again: `Ok`) and removed; off any loop the
/// same error as every other file call (kind `Other`), nothing done.
#[test]
fn path_operations_rename_remove_and_make_directories() {
    on_each_driver("path_operations", 1, |driver| async move {
        let dir = temp_path("dir");
        let _dir = DirCleanup(dir.clone());
        let nested = dir.join("a").join("b");
        fs::create_dir_all(&nested).await.unwrap();
        fs::create_dir_all(&nested).await.unwrap();
        assert!(std::fs::metadata(&nested).unwrap().is_dir(), "[{driver}]");
        let e = fs::create_dir(&nested).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "[{driver}]");
        let e = fs::create_dir(dir.join("x").join("y")).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "[{driver}]");

        let live = nested.join("snapshot");
        let tmp = nested.join("snapshot.tmp");
        fs::write(&live, b"old".to_vec()).await.unwrap();
        let f = File::create(&tmp).await.unwrap();
        let (r, _) = f.write_all_at(b"new snapshot".to_vec(), 0).await;
        r.unwrap();
        f.sync_all().await.unwrap();
        f.close().await.unwrap();
        fs::rename(&tmp, &live).await.unwrap();
        assert_eq!(
            fs::read(&live).await.unwrap(),
            b"new snapshot",
            "[{driver}]"
        );
        assert!(!tmp.exists(), "[{driver}] the temporary file is gone");
        let e = fs::rename(&tmp, &live).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "[{driver}]");

        let e = fs::remove_dir(&nested).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::DirectoryNotEmpty, "[{driver}]");
        fs::remove_file(&live).await.unwrap();
        let e = fs::remove_file(&live).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "[{driver}]");
        fs::remove_dir(&nested).await.unwrap();
        assert!(!nested.exists(), "[{driver}]");
    });
    // Off any loop: refused before any job, nothing made.
    let off = temp_path("off-loop");
    let e = futures::executor::block_on(fs::create_dir_all(&off)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Other, "{e}");
    assert!(!off.exists());
    // A NUL in a path is `InvalidInput`, checked first (on a loop and off any), as `open`'s.
    const BAD: &str = "/tmp/xtc-a\0b";
    let calls = || async {
        vec![
            fs::rename(BAD, "/tmp/xtc-x").await.unwrap_err().kind(),
            fs::rename("/tmp/xtc-x-49", BAD).await.unwrap_err().kind(),
            fs::remove_file(BAD).await.unwrap_err().kind(),
            fs::create_dir(BAD).await.unwrap_err().kind(),
            fs::create_dir_all(BAD).await.unwrap_err().kind(),
            fs::remove_dir(BAD).await.unwrap_err().kind(),
        ]
    };
    let off_loop = futures::executor::block_on(calls());
    let on_loop = xtc_shards::LocalExecutor::new().unwrap().block_on(calls());
    for kinds in [off_loop, on_loop] {
        assert!(
            kinds.iter().all(|k| *k == io::ErrorKind::InvalidInput),
            "{kinds:?}"
        );
    }
}

/// Removes a directory tree when dropped (also when the test fails).
struct DirCleanup(PathBuf);

impl Drop for DirCleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Drops `op` after its first poll and `yields` loop turns: a dropped operation whose job a
/// pool thread may have taken, not yet made its call.
async fn poll_once_and_drop<F: std::future::Future>(op: F, yields: usize) {
    let mut op = Box::pin(op);
    let _ = op
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    for _ in 0..yields {
        xtc_shards::yield_now().await;
    }
    drop(op);
}

/// On the epoll driver, 40 tasks on 2 shards each run `body` 40 times; `body` returns whether
/// a dropped operation landed after a later one it awaited. None may. Before the pool's
/// disk, open and path calls were claimed under the cancel's lock (`blocking::claimed`), a
/// pool thread that took a job and was preempted before its call made it after the drop
/// returned: 5 to 13 of 1,600 rounds here for a write, 1 of 4,800 for a `File::create`.
/// io_uring is left out: a started operation there may complete after a later one (the
/// module docs of `fs`, "A dropped operation").
fn no_dropped_op_lands_late<F, Fut>(test: &str, body: F)
where
    F: Fn(PathBuf, usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = bool> + 'static,
{
    each_driver(
        test,
        2,
        |b| b,
        |driver, exec| {
            if driver != Driver::Epoll {
                return;
            }
            let late = std::sync::Arc::new(AtomicUsize::new(0));
            let mut cleanups = Vec::new();
            for shard in 0..2 {
                for _ in 0..20 {
                    let path = temp_path("late");
                    cleanups.push(Cleanup(path.clone()));
                    let (late, body) = (late.clone(), body.clone());
                    exec.spawn_on(shard, move || async move {
                        for round in 0..40 {
                            if body(path.clone(), round).await {
                                late.fetch_add(1, SeqCst);
                            }
                        }
                    })
                    .unwrap();
                }
            }
            run_within(&exec, Duration::from_secs(60))
                .expect("run() hung")
                .unwrap();
            assert_eq!(
                late.load(SeqCst),
                0,
                "rounds where a dropped operation landed after a later one"
            );
        },
    );
}

#[test]
fn a_dropped_write_never_lands_after_a_later_awaited_one() {
    no_dropped_op_lands_late(
        "a_dropped_write_never_lands_after",
        |path, round| async move {
            const N: usize = 16 * 1024;
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .open(&path)
                .await
                .unwrap();
            let old = (2 * round % 251) as u8;
            poll_once_and_drop(f.write_at(vec![old; N], 0), round % 3).await;
            let (r, _) = f.write_all_at(vec![old + 1; N], 0).await;
            r.unwrap();
            xtc_shards::time::sleep(Duration::from_millis(1)).await;
            let (r, got) = f.read_at(Vec::with_capacity(N), 0).await;
            assert_eq!(r.unwrap(), N);
            got.iter().any(|&b| b != old + 1)
        },
    );
}

#[test]
fn a_dropped_create_never_truncates_a_later_awaited_write() {
    no_dropped_op_lands_late(
        "a_dropped_create_never_truncates",
        |path, round| async move {
            const N: usize = 4096;
            poll_once_and_drop(File::create(&path), round % 3).await;
            fs::write(&path, vec![7u8; N]).await.unwrap();
            xtc_shards::time::sleep(Duration::from_millis(1)).await;
            fs::read(&path).await.unwrap().len() != N
        },
    );
}
