//! [`ShardLocal<T>`]: one value per shard and run, built on its shard, for any `T`.
//!
//! Written here rather than taken from a crate: the values must live in the loop (built by
//! the loop's thread, dropped by its shutdown, with the shard API still answering), which no
//! thread-local crate knows about.

use std::{
    any::Any,
    collections::HashMap,
    fmt,
    hash::{BuildHasherDefault, Hasher},
    rc::Rc,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

use crate::{context::with_core, Error, Result};

/// Per-shard state of any type, `!Send` ones included (an `Rc`, a `RefCell` of I/O objects,
/// a `channel::local` end): each shard's value is built on that shard by the initializer, the
/// first time a task there asks for it, and dropped there by the loop's shutdown at the end of
/// the run, after the tasks that shutdown drops (so a pinned task's `Drop` may still use it,
/// as may a migratable task's that is queued on the loop then). A migratable task parked at
/// the run's end is dropped later, after every loop has stopped and off any loop: there
/// [`try_get`](Self::try_get) is `Err(OffLoop)`. A later run builds the values again.
/// Seastar's `sharded<T>` service, without its `start`/`stop` calls.
///
/// A value's teardown is its `Drop`, run by the shutdown; there is no async stop step (as
/// Seastar's `stop()`): flush what must reach a peer, a file or another shard before the run
/// ends (a `submit_to_all` of a flush before `stop()`, say). Dropping a `ShardLocal` drops none
/// of its values at once: each shard's stays in its loop until the run ends. Keep them in `static`s or other long-lived places; one made per request
/// costs an entry in each shard's table that used it, until the run ends.
///
/// It holds no value itself (the loops do), so it is `Send + Sync` for every `T` and fits in a
/// `static`: any task of any shard reaches its own shard's value through the same
/// `&'static ShardLocal<T>`, and nothing crosses threads. Compared with [`Sharded`](crate::Sharded):
/// that one holds `Send` values, built up front on the calling thread, kept across runs and
/// readable after `run()` returns; this one holds any value, built lazily on its shard and gone
/// when its run ends. A `thread_local!` does much the same, but a shard thread's values would
/// outlive the loop (dropped at thread exit, where the shard API is gone) and a
/// [`LocalExecutor`](crate::LocalExecutor)'s thread keeps them from one `block_on` to the next.
///
/// ```
/// # use xtc_shards as xtc;
/// use std::{cell::RefCell, collections::HashMap, rc::Rc};
/// use xtc::ShardLocal;
///
/// // One map per shard, reached without locks; `Rc` and `RefCell` are fine.
/// static STORE: ShardLocal<RefCell<HashMap<u64, Rc<str>>>> = ShardLocal::new(|_shard| RefCell::default());
///
/// let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
/// let sizes = exec.block_on(|| async {
///     xtc::shard::try_submit_to_all(|| async {
///         let store = STORE.get();
///         store.borrow_mut().insert(xtc::shard::id() as u64, Rc::from("value"));
///         let len = store.borrow().len();
///         Ok::<_, xtc::Error>(len)
///     })
///     .await
/// })??;
/// assert_eq!(sizes, vec![1, 1]);
/// # Ok::<(), xtc::Error>(())
/// ```
pub struct ShardLocal<T: 'static> {
    init: Init<T>,
    /// This value's slot in every loop's table, once assigned (0: not yet). Ids come from
    /// [`NEXT_ID`] and are never reused.
    id: AtomicUsize,
}

enum Init<T> {
    Fn(fn(usize) -> T),
    Boxed(Box<dyn Fn(usize) -> T + Send + Sync>),
}

/// The next id a [`ShardLocal`] takes (ids start at 1).
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

impl<T: 'static> ShardLocal<T> {
    /// A per-shard value that `init(shard)` builds on each shard at its first use there in a
    /// run. `const`, for a `static`. Cost: nothing until the first use.
    pub const fn new(init: fn(usize) -> T) -> Self {
        ShardLocal {
            init: Init::Fn(init),
            id: AtomicUsize::new(0),
        }
    }

    /// [`new`](Self::new) with an initializer that captures (a configuration, an `Arc` of
    /// shared state). Not `const`: for a `static`, put it in a `std::sync::LazyLock`, or leak
    /// a `Box` of it for a `&'static`. Cost: one allocation for the closure.
    pub fn from_fn(init: impl Fn(usize) -> T + Send + Sync + 'static) -> Self {
        ShardLocal {
            init: Init::Boxed(Box::new(init)),
            id: AtomicUsize::new(0),
        }
    }

    /// This shard's value, built now if this is its first use on this shard in this run.
    /// `Err(OffLoop)` off any loop; `Err(Stopped)` from a `Drop` that runs after the loop's
    /// shutdown dropped its values (another value's drop: the values are dropped in no set
    /// order). A panic in the initializer goes to the caller (the task's `JoinError`); nothing
    /// is stored and the next call tries again.
    ///
    /// Cost: a thread-local read, a hash-map lookup (the hash is one multiplication) and a
    /// reference-count increment (no atomic); at the first use on a shard, the initializer,
    /// one allocation and a map insert. A migratable task
    /// that moves to another shard keeps the `Rc` it had, which is the old shard's value (the
    /// `Rc` is `!Send`, so a task holding one across an `.await` cannot be migratable: the
    /// compiler keeps it pinned); it asks again for the new shard's.
    ///
    /// # Panics
    /// If the initializer uses this same `ShardLocal` on its shard (it would build itself
    /// for ever).
    pub fn try_get(&self) -> Result<Rc<T>> {
        // The id is taken on a loop only: a call off any loop uses none up.
        let found = with_core(|core| core.locals.borrow_mut().lookup(self.id(), core.index()))
            .ok_or(Error::OffLoop(
                "xtc::ShardLocal::get (from other threads, reach each shard's value with \
             Handle::submit_to)",
            ))?;
        let value = match found {
            Lookup::Found(v) => v,
            Lookup::Closed => return Err(Error::Stopped),
            Lookup::Building => panic!(
                "xtc::ShardLocal: its initializer used the same ShardLocal on the same shard \
                 (it would build itself for ever); build what it needs inside the initializer"
            ),
            Lookup::Empty(shard) => {
                let value: Rc<dyn Any> = Rc::new(self.build(shard));
                with_core(|core| core.locals.borrow_mut().store(self.id(), value.clone()));
                value
            }
        };
        Ok(value
            .downcast::<T>()
            .unwrap_or_else(|_| unreachable!("a ShardLocal's slot holds its own type")))
    }

    /// [`try_get`](Self::try_get), for code that runs inside a task. Cost: `try_get`'s.
    ///
    /// # Panics
    /// Off any loop (with what to call instead), after the loop's shutdown dropped its values,
    /// and if the initializer uses this same `ShardLocal` on its shard.
    #[track_caller]
    pub fn get(&self) -> Rc<T> {
        match self.try_get() {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs the initializer for `shard`; its slot reads `Building` meanwhile, and `Empty`
    /// again if it unwinds.
    fn build(&self, shard: usize) -> T {
        struct Unmark(usize);
        impl Drop for Unmark {
            fn drop(&mut self) {
                with_core(|core| core.locals.borrow_mut().unmark(self.0));
            }
        }
        let unmark = Unmark(self.id());
        let value = match &self.init {
            Init::Fn(f) => f(shard),
            Init::Boxed(f) => f(shard),
        };
        std::mem::forget(unmark);
        value
    }

    /// This value's id, assigned at its first use. Cost: one load once assigned.
    fn id(&self) -> usize {
        let id = self.id.load(Relaxed);
        if id != 0 {
            return id;
        }
        let fresh = NEXT_ID.fetch_add(1, Relaxed);
        // The first thread to store wins; a loser's fresh id is never used (ids are plenty).
        match self.id.compare_exchange(0, fresh, Relaxed, Relaxed) {
            Ok(_) => fresh,
            Err(won) => won,
        }
    }
}

impl<T: 'static> fmt::Debug for ShardLocal<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardLocal")
            .field("id", &self.id.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// What a loop's table holds for one [`ShardLocal`] (`Table::lookup`, on `context::Core::locals`).
pub(crate) enum Lookup {
    Found(Rc<dyn Any>),
    /// Nothing yet: build it for this shard.
    Empty(usize),
    /// Its initializer is running on this loop now.
    Building,
    /// The loop's shutdown dropped its values.
    Closed,
}

/// A loop's slot for one [`ShardLocal`].
#[derive(Default)]
pub(crate) enum Slot {
    #[default]
    Empty,
    Building,
    Ready(Rc<dyn Any>),
}

/// A loop's values: a slot for each id used on it, and whether its shutdown dropped them.
/// Lives in the loop's `Core`, so it is dropped with it, on the loop's thread. A map, not a
/// vector indexed by id: ids are process-wide and never reused, so a vector grew with every
/// `ShardLocal` ever made (one made per request cost memory per shard and run for all of
/// them).
#[derive(Default)]
pub(crate) struct Table {
    slots: HashMap<usize, Slot, BuildHasherDefault<IdHasher>>,
    closed: bool,
}

/// The hasher of [`Table`]'s ids: one multiplication (ids are small distinct integers, and
/// the map's own probing takes care of the rest). Cost: a multiply per lookup, where SipHash
/// took tens of nanoseconds.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `usize` keys; FNV-1a for completeness.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, id: usize) {
        self.0 = (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("slots", &self.slots.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl Table {
    pub(crate) fn lookup(&mut self, id: usize, shard: usize) -> Lookup {
        if self.closed {
            return Lookup::Closed;
        }
        match self.slots.entry(id).or_default() {
            Slot::Ready(v) => Lookup::Found(v.clone()),
            Slot::Building => Lookup::Building,
            slot @ Slot::Empty => {
                *slot = Slot::Building;
                Lookup::Empty(shard)
            }
        }
    }

    /// Keeps `value` in slot `id`, marked `Building` by [`lookup`](Self::lookup); a closed
    /// table keeps nothing (the caller's `Rc` is then the value's last).
    pub(crate) fn store(&mut self, id: usize, value: Rc<dyn Any>) {
        if let Some(slot) = self.slots.get_mut(&id) {
            *slot = Slot::Ready(value);
        }
    }

    /// The initializer of `id` unwound: its slot goes.
    pub(crate) fn unmark(&mut self, id: usize) {
        if matches!(self.slots.get(&id), Some(Slot::Building)) {
            self.slots.remove(&id);
        }
    }

    /// Closes the table and hands out its values, for the caller to drop (outside the borrow:
    /// a value's `Drop` may look here again).
    pub(crate) fn close(&mut self) -> Vec<Slot> {
        self.closed = true;
        std::mem::take(&mut self.slots).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Lookup, Table};

    /// A table holds the ids used on its loop only: a high id (many `ShardLocal`s made
    /// before) costs one entry, not a slot for every id below it.
    #[test]
    fn a_table_holds_only_the_ids_used() {
        let mut t = Table::default();
        assert!(matches!(t.lookup(4_000_000, 0), Lookup::Empty(0)));
        t.store(4_000_000, std::rc::Rc::new(1u8));
        assert!(matches!(t.lookup(4_000_000, 0), Lookup::Found(_)));
        assert_eq!(t.slots.len(), 1);
        assert!(matches!(t.lookup(7, 0), Lookup::Empty(0)));
        t.unmark(7);
        assert_eq!(t.slots.len(), 1, "an unwound build leaves no entry");
        assert_eq!(t.close().len(), 1);
        assert!(matches!(t.lookup(4_000_000, 0), Lookup::Closed));
    }
}
