//! # xtc
//!
//! A thread-per-core, shared-nothing async runtime in the family of Seastar and Glommio: one
//! event loop per core (by default; per CPU where asked), pinned by the hwloc topology; per-core state indexed by
//! [`shard::id()`] and sized by [`shard::count()`].
//!
//! ```
//! use std::{cell::Cell, sync::Arc};
//!
//! let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
//! let hits = Arc::new(xtc::Sharded::new(exec.shard_count(), |_| Cell::new(0u32)));
//! let mut tasks = Vec::new();
//! for shard in 0..exec.shard_count() {
//!     let hits = hits.clone();
//!     tasks.push(exec.spawn_on(shard, move || async move {
//!         // `make` ran on `shard`; this future may be !Send.
//!         let local = xtc::spawn_local(async { xtc::shard::id() });
//!         assert_eq!(local.await.unwrap(), shard);
//!         xtc::time::sleep(std::time::Duration::from_millis(1)).await;
//!         hits.get().set(hits.get().get() + 1);
//!     })?);
//! }
//! exec.run()?; // returns at quiescence: every task done, every timer fired
//! // A task's panic is its handle's, not the run's: check the handles (all done by now).
//! exec.block_on(move || async move {
//!     for t in tasks {
//!         t.await?;
//!     }
//!     Ok::<_, xtc::Error>(())
//! })??;
//! # Ok::<(), xtc::Error>(())
//! ```
//!
//! The engine lives in `xtc-shards` (re-exported here at the root) and the topology, placement
//! and victim orders in `xtc-numa` (re-exported as [`numa`]). The crate docs of
//! [`xtc_shards`] hold what a re-export does not carry over: which call to use where, the
//! invariants, blocking a loop, the table of environment variables and the signals xtc uses
//! (`cargo doc -p xtc --open` builds them beside these). ARCHITECTURE.md describes the loop
//! step and the wake protocol.

pub use xtc_numa as numa;

/// The README's Rust blocks, compiled (and the runnable ones run) as doc tests, so that they
/// cannot go stale; fragments are marked `ignore` there.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub use xtc_shards::*;

/// The names most programs use.
pub mod prelude {
    pub use xtc_shards::{
        shard, spawn, spawn_blocking, spawn_local, submit_to, task::JoinSet, time, yield_now,
        Error, Executor, Handle, JoinHandle, LocalExecutor, ShardLocal, Sharded,
    };
}
