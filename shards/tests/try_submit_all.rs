//! `try_submit_to_all` (inside a task and through `Handle`) and `xtc::Error` into
//! `std::io::Error`: one flat `Result<Vec<T>, E>` for a fallible call on every shard.

mod common;
use common::*;

use std::{
    io,
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    time::Duration,
};

use xtc_shards::{shard, Error};

/// Every shard's value, in shard order, from inside a task (3 shards, oversubscribed here).
#[test]
fn gives_every_shards_value_in_shard_order() {
    let ex = exec(3);
    let out = ex
        .block_on(|| async {
            shard::try_submit_to_all(|| async {
                xtc_shards::yield_now().await;
                Ok::<_, Error>(shard::id() * 7)
            })
            .await
        })
        .unwrap();
    assert_eq!(out.unwrap(), vec![0, 7, 14]);
}

/// A call that fails gives its own error, the first in shard order; the others still ran to
/// their end before the future resolved (a slow later shard included).
#[test]
fn gives_the_first_failure_after_every_call_finished() {
    let ex = exec(3);
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let (out, seen) = ex
        .block_on(move || async move {
            let d2 = d.clone();
            let out = shard::try_submit_to_all(move || async move {
                let d = d2;
                let me = shard::id();
                if me == 2 {
                    xtc_shards::time::sleep(Duration::from_millis(50)).await;
                }
                d.fetch_add(1, SeqCst);
                match me {
                    0 => Ok(me),
                    n => Err(io::Error::other(format!("shard {n} failed"))),
                }
            })
            .await;
            (out, d.load(SeqCst))
        })
        .unwrap();
    let err = out.unwrap_err();
    assert_eq!(
        err.to_string(),
        "shard 1 failed",
        "the first failure in shard order"
    );
    assert_eq!(seen, 3, "every call had finished when the future resolved");
    assert_eq!(done.load(SeqCst), 3);
}

/// A panic on a shard comes back as xtc's `Join` error, converted into the call's error type.
#[test]
fn a_panic_is_xtcs_join_error_converted() {
    let ex = exec(2);
    let out = ex
        .block_on(|| async {
            shard::try_submit_to_all(|| async {
                if shard::id() == 1 {
                    panic!("shard 1 panics on purpose");
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
            .await
        })
        .unwrap();
    let err = out.unwrap_err();
    let xtc = err
        .downcast_ref::<Error>()
        .expect("the panic comes back as an xtc::Error");
    assert!(matches!(xtc, Error::Join(j) if j.is_panic()), "{xtc:#?}");
}

/// From a plain thread, through the `Handle` (the target's inbox), while the executor runs.
#[test]
fn through_the_handle_from_a_plain_thread() {
    let ex = exec(2);
    let h = ex.handle();
    let caller = std::thread::spawn(move || {
        let ok = futures::executor::block_on(
            h.try_submit_to_all(|| async { Ok::<_, io::Error>(shard::id() + 1) }),
        );
        let bad = futures::executor::block_on(h.try_submit_to_all(|| async {
            if shard::id() == 0 {
                Ok(())
            } else {
                Err(Error::InvalidArgument("shard 1 refuses".into()))
            }
        }));
        h.stop();
        (ok, bad)
    });
    ex.set_service_mode(true);
    ex.run().unwrap();
    let (ok, bad) = caller.join().unwrap();
    assert_eq!(ok.unwrap(), vec![1, 2]);
    assert!(matches!(bad, Err(Error::InvalidArgument(m)) if m == "shard 1 refuses"));
}

/// Off any loop the future is xtc's `OffLoop`, converted: into an `io::Error` of kind `Other`
/// whose source is the `xtc::Error`.
#[test]
fn off_any_loop_is_off_loop_converted() {
    let out = futures::executor::block_on(shard::try_submit_to_all(|| async {
        Ok::<_, io::Error>(())
    }));
    let err = out.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::Other);
    let inner = err.get_ref().and_then(|e| e.downcast_ref::<Error>());
    assert!(matches!(inner, Some(Error::OffLoop(_))), "{err:?}");
    assert!(
        err.to_string()
            .contains("xtc::shard::try_submit_to_all needs to run inside a task"),
        "{err}"
    );
}

/// `xtc::Error` into `std::io::Error`: an OS error keeps its kind, bad input reads
/// `InvalidInput`, `Unsupported` its own kind, a stop `Other` (not `Interrupted`, which std's
/// `read_exact` and retry loops retry for good); the message is xtc's.
#[test]
fn xtc_errors_convert_into_io_errors_by_kind() {
    let kind = |e: Error| io::Error::from(e).kind();
    assert_eq!(
        kind(Error::Io {
            what: "bind",
            source: io::ErrorKind::AddrInUse.into()
        }),
        io::ErrorKind::AddrInUse
    );
    assert_eq!(
        kind(Error::InvalidShard { shard: 5, count: 2 }),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        kind(Error::InvalidArgument("x".into())),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(kind(Error::Stopped), io::ErrorKind::Other);
    assert_eq!(kind(Error::Unsupported("x")), io::ErrorKind::Unsupported);
    assert_eq!(kind(Error::AlreadyRunning), io::ErrorKind::Other);
    let e = io::Error::from(Error::InvalidShard { shard: 5, count: 2 });
    assert!(e.to_string().contains("shard 5 does not exist"), "{e}");
    // `?` in an io::Result function.
    fn handler(shard: usize) -> io::Result<()> {
        Err(Error::InvalidShard { shard, count: 2 })?
    }
    assert_eq!(handler(9).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    // An io::Error that went through `?` into xtc::Error and back keeps its OS error code
    // (wrapped, `raw_os_error()` read `None`); one xtc made with its own context stays wrapped.
    let round = io::Error::from(Error::from(io::Error::from_raw_os_error(libc::EPIPE)));
    assert_eq!(round.raw_os_error(), Some(libc::EPIPE));
    let bind = io::Error::from(Error::Io {
        what: "bind",
        source: io::Error::from_raw_os_error(libc::EADDRINUSE),
    });
    assert!(bind.to_string().contains("bind"), "{bind}");
}
