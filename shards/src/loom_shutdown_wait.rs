//! Loom model of ring rule 3c (`ring/mod.rs`): a foreign wait in a `Drop` that loop A's
//! shutdown runs (`ring::wait_in_shutdown`), on a message A left in ring A→B, against loop B,
//! which holds the ring's consumer end and either drains the ring and then stops, or stops
//! without draining it (past its last drain). The waiter joins the ring's foreign list,
//! announces (`want_space`, by swap) and looks at B's slot in the mesh and at the ring; it
//! polls again at once if either changed. B's drain pops, then swaps the flag and, if it was
//! set, wakes the list (rule 3b); B's `Mesh::give_back` parks its end, then wakes the list.
//! In every interleaving the wait is not left asleep: it either saw the change itself or was
//! woken after it joined. Two expected-fail variants each swap one pair of steps and show the
//! model catches it: the waiter looking before it joins, and `give_back` taking the list
//! before it parks the end.
//!
//! Shipping code driven: the lock (`crate::sync::Mutex`, `crate::sync::lock`) and atomics that
//! `Mesh` uses. Stand-ins: the consumer's slot is a flag (`true` once parked, as
//! `Mesh::consumers` holds `Some`), the ring a message count (its order and hand-over are
//! `loom_evacuate.rs`'s), a waker a wake counter. The steps are transcriptions of
//! `wait_in_shutdown` (after its evacuation), `drain_ring`'s rule 3 tail with `take_foreign`,
//! and `Mesh::give_back`'s consumer half. Not modelled: the evacuation itself and the
//! backlog (`loom_evacuate.rs`), pings (`loom_ring.rs`). Exhaustive; well under a second.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{sync::Arc, thread};

use crate::sync::{lock, AtomicBool, AtomicUsize, Mutex, Ordering::SeqCst};

/// A waker: how many times it was woken.
type Waker = Arc<AtomicUsize>;

/// The executor's side of ring A→B.
#[derive(Default)]
struct Mesh {
    /// B's consumer end: `true` once given back (parked in the mesh).
    parked: Mutex<bool>,
    /// Rule 3b's foreign list of ring A→B.
    foreign: Mutex<Vec<Waker>>,
    /// `want_space[A→B]`.
    want_space: AtomicBool,
    /// Messages in ring A→B.
    ring: AtomicUsize,
}

#[derive(Clone, Copy, PartialEq)]
enum Owner {
    /// B drains the ring, then stops.
    DrainsThenStops,
    /// B stops without another drain.
    Stops,
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Shipped,
    /// The waiter looks at the slot and the ring before it joins the list.
    LookBeforeJoin,
    /// `give_back` takes the list before it parks the end.
    ListBeforePark,
}

/// `wait_in_shutdown` for ring A→B: returns whether the waiter polls again at once.
fn wait(m: &Mesh, w: &Waker, variant: Variant) -> bool {
    let look = |m: &Mesh| *lock(&m.parked) || m.ring.load(SeqCst) == 0;
    let early = variant == Variant::LookBeforeJoin && look(m);
    // `join_foreign`, then the announce.
    lock(&m.foreign).push(w.clone());
    m.want_space.swap(true, SeqCst);
    if variant == Variant::LookBeforeJoin {
        early
    } else {
        look(m)
    }
}

/// Wakes what the list holds (outside its lock, as the shipping code does).
fn wake_list(m: &Mesh) {
    let taken: Vec<Waker> = std::mem::take(&mut *lock(&m.foreign));
    for w in taken {
        w.fetch_add(1, SeqCst);
    }
}

fn owner(m: &Mesh, owner: Owner, variant: Variant) {
    if owner == Owner::DrainsThenStops {
        // `drain_ring`: pop, then rule 3's consumer side.
        if m.ring.load(SeqCst) > 0 {
            m.ring.fetch_sub(1, SeqCst);
            if m.want_space.swap(false, SeqCst) {
                wake_list(m);
            }
        }
    }
    // `Mesh::give_back`.
    if variant == Variant::ListBeforePark {
        wake_list(m);
        *lock(&m.parked) = true;
    } else {
        *lock(&m.parked) = true;
        wake_list(m);
    }
}

fn model(who: Owner, variant: Variant) {
    loom::model(move || {
        let m = Arc::new(Mesh::default());
        m.ring.store(1, SeqCst);
        let b = {
            let m = m.clone();
            thread::spawn(move || owner(&m, who, variant))
        };
        let w: Waker = Arc::new(AtomicUsize::new(0));
        let again = wait(&m, &w, variant);
        b.join().unwrap();
        assert!(
            again || w.load(SeqCst) > 0,
            "the wait sleeps for good: B stopped after its look, and nothing woke it"
        );
    });
}

/// B drains the call, then stops: the drain's swap or the end's parking wakes the wait, or
/// the wait saw the ring empty or the end parked.
#[test]
fn loom_shutdown_wait_on_an_owner_that_drains_then_stops_is_woken() {
    model(Owner::DrainsThenStops, Variant::Shipped);
}

/// B stops past its last drain, the call still in the ring: `give_back` wakes the wait, or
/// the wait saw the end parked.
#[test]
fn loom_shutdown_wait_on_an_owner_that_stops_without_draining_is_woken() {
    model(Owner::Stops, Variant::Shipped);
}

/// Looking before joining, the model finds the lost wake: the wait sees B's end held, B parks
/// it and wakes an empty list, then the wait joins and sleeps.
#[test]
#[should_panic(expected = "sleeps for good")]
fn loom_shutdown_wait_looking_before_joining_is_lost() {
    model(Owner::Stops, Variant::LookBeforeJoin);
}

/// With `give_back` taking the list before it parks the end, the model finds the lost wake:
/// B takes the empty list, the wait joins and sees the end still held, then B parks it.
#[test]
#[should_panic(expected = "sleeps for good")]
fn loom_shutdown_wait_give_back_waking_before_parking_is_lost() {
    model(Owner::Stops, Variant::ListBeforePark);
}
