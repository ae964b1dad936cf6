//! The steal thresholds (HPX's `min_tasks_to_steal` and starvation override), as a pure function
//! so the semantics are unit-tested apart from any timing.

/// After this many consecutive looks at a victim that was short (non-empty but below the
/// minimum), the thief steals from it anyway (HPX's starvation override).
pub(crate) const STARVATION_LOOKS: u32 = 16;

/// Whether a thief steals from a victim with `queued` tasks, given the minimum, how many times in
/// a row it found this victim short, and whether this is its first steal after a wake by new work.
pub(crate) fn should_steal(queued: usize, min: usize, short_looks: u32, fresh_wake: bool) -> bool {
    queued > 0 && (queued >= min || fresh_wake || short_looks + 1 >= STARVATION_LOOKS)
}

/// One look at a victim with `queued` tasks: whether to steal from it, updating `short_looks`,
/// the count of looks in a row that found it short. A victim found empty starts the count over
/// (its shortness was not sustained: HPX counts consecutive short looks), as does a steal.
pub(crate) fn look(queued: usize, min: usize, short_looks: &mut u32, fresh_wake: bool) -> bool {
    if queued == 0 {
        *short_looks = 0;
        return false;
    }
    if !should_steal(queued, min, *short_looks, fresh_wake) {
        *short_looks += 1;
        return false;
    }
    *short_looks = 0;
    true
}

/// Rule 3's waiver of the minimum across a thief's looks. The look right after a park that a
/// ping for new migratable work ended ignores the minimum. A spawner pings before it queues
/// its task, so that look may find every victim empty: the waiver then passes to the next
/// look, and to that one only (a waiver kept from a kept waiver lasted until work came,
/// however much later, with no ping to this loop). A pure state machine, kept apart from the
/// loop so its lifetime is unit-tested. Cost: two byte writes per look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Waiver {
    /// The last look could not use a waiver from a real wake: the next look has it.
    kept: bool,
    /// The current look was begun right after a wake by a work ping.
    woke: bool,
}

impl Waiver {
    /// A look begins; `woke`: the loop's last park was ended by a ping for new migratable work
    /// (taken from `Core::fresh_wake`). Returns whether this look ignores the minimum.
    pub(crate) fn begin(&mut self, woke: bool) -> bool {
        let fresh = woke | self.kept;
        *self = Waiver { kept: false, woke };
        fresh
    }

    /// The look begun by [`begin`](Self::begin) ended: `seen_work`, whether any victim had
    /// work queued (whether or not it was taken). Only a look begun by a real wake that saw
    /// nothing keeps the waiver, for the next look.
    pub(crate) fn end(&mut self, seen_work: bool) {
        *self = Waiver {
            kept: self.woke && !seen_work,
            woke: false,
        };
    }

    /// Stealing was switched off, or a park decision passed its look (rule 2: the loop owns a
    /// timer or a parked pinned task): a waiver from before does not outlive it. Passed over,
    /// a kept waiver lasted until the loop next looked, however much later (seconds, for a
    /// loop that then waited on its timer), and that look took work below the minimum on a
    /// wake long gone.
    pub(crate) fn clear(&mut self) {
        *self = Waiver::default();
    }
}

/// Eager rebalance's nudge (steal rule 4): which idle peer of the `loops` loops `me` pings for
/// the migratable work it just queued: one that is not busy and may steal from `me` (`me` is
/// in its own victim list), the nearest in `me`'s victim order (`victims(me)`) first, then
/// the loops `me` does not steal from, by index. At NUMA sensitivity 1 a loop of another node
/// steals across nodes only if it is its node's first, so the nearest idle loop there may be
/// one that cannot take the work; pinging it woke a loop for nothing while an idle loop that
/// could steal slept on. And a loop that steals only within its node has no other node's
/// loop in its own list, while those nodes' first loops may steal from it: looking at its
/// list alone left them asleep. `None` when no idle loop can steal from `me`. Cost: a walk of
/// the loops, `me`'s list first (the rest each checked against that list), and of each idle
/// candidate's list until one names `me`: at most about 2·N² compares, once per nudge; at
/// once for a same-node candidate, which is always allowed.
pub(crate) fn nudge_target<'a>(
    me: usize,
    loops: usize,
    victims: impl Fn(usize) -> &'a [usize],
    busy: impl Fn(usize) -> bool,
) -> Option<usize> {
    let mine = victims(me);
    mine.iter()
        .copied()
        .chain((0..loops).filter(|v| *v != me && !mine.contains(v)))
        .find(|&v| !busy(v) && victims(v).contains(&me))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Victim lists of six loops on three NUMA nodes of two ({0,1}, {2,3}, {4,5}) at
    /// sensitivity 1: a node's first loop also steals from the other nodes, the others only
    /// within their node.
    fn three_nodes(me: usize) -> &'static [usize] {
        const LISTS: [&[usize]; 6] = [
            &[1, 2, 3, 4, 5],
            &[0],
            &[3, 4, 5, 0, 1],
            &[2],
            &[5, 0, 1, 2, 3],
            &[4],
        ];
        LISTS[me]
    }

    #[test]
    fn the_nudge_goes_to_the_nearest_idle_loop_that_may_steal() {
        // Loop 1 idle: the same node's loop, always allowed.
        assert_eq!(nudge_target(0, 6, three_nodes, |_| false), Some(1));
        // Loop 1 busy, loop 2 (node 1's first) idle: it may steal across nodes.
        assert_eq!(nudge_target(0, 6, three_nodes, |v| v == 1), Some(2));
        // Loops 1 and 2 busy: loop 3 is idle but steals only within its node; loop 4, the
        // first of node 2, gets the ping.
        assert_eq!(nudge_target(0, 6, three_nodes, |v| v <= 2), Some(4));
        // Only non-first loops of other nodes idle: nobody can take the work.
        assert_eq!(nudge_target(0, 6, three_nodes, |v| v != 3 && v != 5), None);
        // A non-first loop steals within its node only, but other nodes' first loops may
        // steal from it: its node's other loop first, then those.
        assert_eq!(nudge_target(3, 6, three_nodes, |_| false), Some(2));
        assert_eq!(nudge_target(3, 6, three_nodes, |v| v == 2), Some(0));
        assert_eq!(nudge_target(3, 6, three_nodes, |v| v <= 2), Some(4));
        // Only loops that may not steal from it idle: nobody.
        assert_eq!(nudge_target(3, 6, three_nodes, |v| v != 1 && v != 5), None);
    }

    #[test]
    fn empty_victims_are_never_stolen_from() {
        assert!(!should_steal(0, 0, 100, true));
    }

    #[test]
    fn minimum_applies() {
        assert!(should_steal(1, 0, 0, false));
        assert!(should_steal(4, 4, 0, false));
        assert!(!should_steal(3, 4, 0, false));
    }

    #[test]
    fn starvation_override_on_the_sixteenth_short_look() {
        let min = 10;
        for looks in 0..STARVATION_LOOKS - 1 {
            assert!(!should_steal(2, min, looks, false), "look {}", looks + 1);
        }
        assert!(should_steal(2, min, STARVATION_LOOKS - 1, false));
    }

    /// The override counts short looks in a row: a look that finds the victim empty starts
    /// the count over, and so does a steal.
    #[test]
    fn an_empty_look_or_a_steal_starts_the_starvation_count_over() {
        let (min, mut looks) = (10, 0);
        for _ in 0..STARVATION_LOOKS - 1 {
            assert!(!look(2, min, &mut looks, false));
        }
        assert!(
            !look(0, min, &mut looks, false),
            "an empty victim is not stolen from"
        );
        for n in 0..STARVATION_LOOKS - 1 {
            assert!(
                !look(2, min, &mut looks, false),
                "short look {} after the reset",
                n + 1
            );
        }
        assert!(
            look(2, min, &mut looks, false),
            "the 16th short look in a row steals"
        );
        assert_eq!(looks, 0, "a steal starts the count over");
        assert!(!look(2, min, &mut looks, false));
        assert!(
            look(12, min, &mut looks, false),
            "a victim at the minimum is stolen from"
        );
        assert_eq!(looks, 0);
    }

    #[test]
    fn a_freshly_woken_thief_ignores_the_minimum() {
        assert!(should_steal(1, 1000, 0, true));
    }

    /// A wake's waiver is spent by the first look that sees work, and a look that sees none
    /// passes it to the next look only: a kept waiver is not kept again.
    #[test]
    fn a_waiver_lasts_until_work_is_seen_or_one_look_more() {
        let mut w = Waiver::default();
        assert!(!w.begin(false), "no wake, no waiver");
        w.end(false);
        assert!(
            !w.begin(false),
            "an empty look without a wake keeps nothing"
        );
        w.end(false);

        // Woken, and the first look sees work: spent there.
        assert!(w.begin(true));
        w.end(true);
        assert!(!w.begin(false), "spent by the look that saw work");
        w.end(false);

        // Woken, every victim still empty: the next look has it, the one after does not.
        assert!(w.begin(true));
        w.end(false);
        assert!(w.begin(false), "kept for the next look");
        w.end(false);
        assert!(
            !w.begin(false),
            "kept once only, not again by an empty look"
        );
        w.end(false);

        // A kept waiver that meets another wake: that wake's own look, which may keep again.
        assert!(w.begin(true));
        w.end(false);
        assert!(w.begin(true));
        w.end(false);
        assert!(w.begin(false));
        w.end(true);
        assert!(!w.begin(false));
        w.end(false);

        // Stealing switched off, or a decision that does not look, drops a kept waiver.
        assert!(w.begin(true));
        w.end(false);
        w.clear();
        assert!(!w.begin(false), "cleared with stealing off");
    }
}
