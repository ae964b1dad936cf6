//! [`ShardLocal<T>`]: one value per shard and run, built on its shard, for any `T`.
//!
//! Written here rather than taken from a crate: the values must live in the loop (built by
//! the loop's thread, dropped by its shutdown, with the shard API still answering), which no
//! thread-local crate knows about.

use std::{
    any::Any,
    fmt,
    rc::Rc,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

use crate::{context::with_core, Error, Result};

/// Per-shard state of any type, `!Send` ones included (an `Rc`, a `RefCell` of I/O objects,
/// a `channel::local` end): each shard's value is built on that shard by the initializer, the
/// first time a task there asks for it, and dropped there by the loop's shutdown at the end of
/// the run, after the loop's tasks (so a task's `Drop` may still use it). A later run builds it
/// again. Seastar's `sharded<T>` service, without its `start`/`stop` calls.
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
    /// shared state). Cost: one allocation for the closure.
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
    /// Cost: a thread-local read, a table lookup and a reference-count increment (no atomic);
    /// at the first use on a shard, the initializer and one allocation. A migratable task
    /// that moves to another shard keeps the `Rc` it had, which is the old shard's value (the
    /// `Rc` is `!Send`, so a task holding one across an `.await` cannot be migratable: the
    /// compiler keeps it pinned); it asks again for the new shard's.
    ///
    /// # Panics
    /// If the initializer uses this same `ShardLocal` on its shard (it would build itself
    /// for ever).
    pub fn try_get(&self) -> Result<Rc<T>> {
        let id = self.id();
        let found = with_core(|core| core.shard_local(id)).ok_or(Error::OffLoop(
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
                with_core(|core| core.shard_local_store(id, value.clone()));
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
                with_core(|core| core.shard_local_unmark(self.0));
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

/// What a loop's table holds for one [`ShardLocal`] (`context::Core::shard_local`).
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

/// A loop's values: slot `id - 1` for each id used on it, and whether its shutdown dropped
/// them. Lives in the loop's `Core`, so it is dropped with it, on the loop's thread.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) slots: Vec<Slot>,
    pub(crate) closed: bool,
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
        if self.slots.len() < id {
            self.slots.resize_with(id, Slot::default);
        }
        match &mut self.slots[id - 1] {
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
        if let Some(slot) = self.slots.get_mut(id - 1) {
            *slot = Slot::Ready(value);
        }
    }

    pub(crate) fn unmark(&mut self, id: usize) {
        if let Some(slot @ Slot::Building) = self.slots.get_mut(id - 1) {
            *slot = Slot::Empty;
        }
    }

    /// Closes the table and hands out its values, for the caller to drop (outside the borrow:
    /// a value's `Drop` may look here again).
    pub(crate) fn close(&mut self) -> Vec<Slot> {
        self.closed = true;
        std::mem::take(&mut self.slots)
    }
}
