//! Hello from every shard: per-shard state without locks, a local task, a timer, and a
//! cross-shard call. The README's usage example. Run: `cargo run --example hello`.

use std::{cell::Cell, sync::Arc, time::Duration};

fn main() -> xtc::Result<()> {
    // One shard per allowed physical core by default; XTC_SHARDS etc. override it.
    let exec = xtc::Executor::from_env()?;
    let hits = Arc::new(xtc::Sharded::new(exec.shard_count(), |_| Cell::new(0u64)));
    for shard in 0..exec.shard_count() {
        let hits = hits.clone();
        // The closure is Send; it runs on `shard`, so the future it returns may be !Send.
        exec.spawn_on(shard, move || async move {
            let child = xtc::spawn_local(async { xtc::shard::id() });
            assert_eq!(child.await.unwrap(), shard);
            xtc::time::sleep(Duration::from_millis(1)).await;
            hits.get().set(hits.get().get() + 1); // no lock: this slot is this shard's
            let next = (shard + 1) % xtc::shard::count();
            let there = xtc::shard::submit_to(next, || async { xtc::shard::id() }).await;
            println!(
                "hello from shard {shard} of {}; shard {next} answered {there:?}",
                xtc::shard::count()
            );
        })?;
    }
    exec.run()?; // returns when every task is done and every timer fired
    for shard in 0..exec.shard_count() {
        let s = exec.loop_stats(shard)?;
        println!(
            "shard {shard}: {} tasks, {} polls, {} ring messages sent, idle {:.0}%",
            s.tasks_run,
            s.polls,
            s.messages_sent,
            s.idle_rate() * 100.0
        );
    }
    Ok(())
}
