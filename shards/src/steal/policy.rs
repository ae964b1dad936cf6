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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_freshly_woken_thief_ignores_the_minimum() {
        assert!(should_steal(1, 1000, 0, true));
    }
}
