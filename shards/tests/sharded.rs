//! Sharded<T>: per-shard state without locks.

use std::{cell::Cell, sync::Arc};

use xtc_shards::{shard, Executor, LocalExecutor, Sharded};

#[test]
fn each_shard_sees_its_own_slot() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .build()
        .unwrap();
    let state = Arc::new(Sharded::new(2, |i| Cell::new(i as u64 * 1000)));
    let mut handles = Vec::new();
    for i in 0..2 {
        for _ in 0..10 {
            let st = state.clone();
            let h = ex
                .spawn_on(i, move || async move {
                    let c = st.get();
                    c.set(c.get() + 1);
                    xtc_shards::yield_now().await;
                    shard::id()
                })
                .unwrap();
            handles.push((i, h));
        }
    }
    ex.run().unwrap();
    for (i, h) in handles {
        assert_eq!(
            futures::executor::block_on(h).unwrap(),
            i,
            "stayed on its shard"
        );
    }
    let vals: Vec<u64> = Arc::try_unwrap(state)
        .unwrap()
        .into_inner()
        .into_iter()
        .map(Cell::into_inner)
        .collect();
    assert_eq!(vals, vec![10, 1010]);
}

#[test]
fn off_loop_and_out_of_range_give_none() {
    let s = Sharded::new(1, |_| 0u8);
    assert!(s.try_get().is_none());
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .build()
        .unwrap();
    let s = Arc::new(Sharded::new(1, |_| 0u8));
    let s2 = s.clone();
    let h = ex
        .spawn_on(1, move || async move { s2.try_get().is_none() })
        .unwrap();
    ex.run().unwrap();
    assert!(futures::executor::block_on(h).unwrap());
}

#[test]
fn a_slot_belongs_to_one_loop_only() {
    // Two standalone loops on two threads are both "shard 0": only the first claims slot 0.
    let s = Arc::new(Sharded::new(1, |_| Cell::new(0)));
    let s1 = s.clone();
    let first = std::thread::spawn(move || {
        LocalExecutor::new()
            .unwrap()
            .block_on(async move { s1.try_get().is_some() })
    })
    .join()
    .unwrap();
    let s2 = s.clone();
    let second = std::thread::spawn(move || {
        LocalExecutor::new()
            .unwrap()
            .block_on(async move { s2.try_get().is_some() })
    })
    .join()
    .unwrap();
    assert!(first);
    assert!(!second, "another loop must not reach a claimed slot");
}

/// A slot belongs to the first loop that reached it, for good: a later loop, even one whose
/// memory reuses a freed loop's address, gets `None`, so a reference handed out by the first
/// loop (and still held on its thread) is never aliased on another thread.
#[test]
fn a_slot_stays_with_its_first_loop_after_that_loop_is_gone() {
    use std::{cell::Cell, sync::Arc};
    let s = Arc::new(xtc_shards::Sharded::new(1, |_| Cell::new(0u64)));
    let s1 = s.clone();
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    assert!(ex.block_on(async move { s1.try_get().is_some() }));
    drop(ex);
    for _ in 0..16 {
        let s2 = s.clone();
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        assert!(
            ex.block_on(async move { s2.try_get().is_none() }),
            "a new loop was handed the slot of a dropped one"
        );
    }
}

/// `get`'s panic says which of its three causes it met, and what to do about it: it named
/// none and advised `Sharded::new(shard::count(), ..)`, which is exactly the mistake when
/// made off any loop (`count()` is 0 there, so the value has no slot at all).
#[test]
fn get_panics_with_its_cause() {
    fn get_message<T>(s: &Sharded<T>) -> String {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.get();
        }));
        let p = r.expect_err("get did not panic");
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap()
    }
    let empty = Sharded::new(shard::count(), |_| 0u8);
    let off = get_message(&empty);
    assert!(off.contains("off any xtc loop"), "{off}");
    let short = LocalExecutor::new()
        .unwrap()
        .block_on(async move { get_message(&empty) });
    assert!(
        short.contains("runs on shard 0") && short.contains("0 slots"),
        "{short}"
    );
    let small = Arc::new(Sharded::new(1, |_| 0u8));
    let s = small.clone();
    LocalExecutor::new()
        .unwrap()
        .block_on(async move { assert_eq!(*s.get(), 0) });
    let taken = LocalExecutor::new()
        .unwrap()
        .block_on(async move { get_message(&small) });
    assert!(taken.contains("another loop"), "{taken}");
}

/// A count no executor can have is refused before anything is allocated: `try_new` gives
/// `Err(InvalidArgument)`, `new` a panic naming the count. `Sharded::new(1 << 40, ..)` (128 TiB
/// of slots) aborted the process, a failed allocation, which no `catch_unwind` can catch.
#[test]
fn a_count_beyond_any_executor_is_refused_not_allocated() {
    for count in [1usize << 40, usize::MAX] {
        let made = std::cell::Cell::new(0);
        match Sharded::try_new(count, |_| made.set(made.get() + 1)) {
            Err(xtc_shards::Error::InvalidArgument(msg)) => {
                assert!(msg.contains(&count.to_string()), "{msg}");
                assert!(msg.contains("shard_count()"), "{msg}");
            }
            other => panic!("try_new({count}) gave {:?}", other.map(|s| s.len())),
        }
        assert_eq!(made.get(), 0, "no value is made for a refused count");
        let panicked = std::panic::catch_unwind(|| Sharded::new(count, |_| 0u8).len())
            .expect_err("new() of a count beyond any executor must panic");
        let msg = panicked
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(msg.contains(&count.to_string()), "panic message: {msg:?}");
    }
    // The largest count still allowed (64 per CPU on 8192 CPUs, 64 MiB of slots) is made, and
    // one more is refused (under Miri, too slow to interpret, only the refusal).
    let max = xtc_numa::MAX_SHARDS_PER_CPU * 8192;
    assert!(Sharded::try_new(max + 1, |_| ()).is_err());
    if !cfg!(miri) {
        let big = Sharded::try_new(max, |i| i as u32).expect("the largest count is accepted");
        assert_eq!(big.len(), max);
    }
    assert!(Sharded::try_new(0, |_| ()).unwrap().is_empty());
}
