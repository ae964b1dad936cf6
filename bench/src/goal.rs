//! The speed goals the project's issues set, judged on one run's figures and printed in one
//! format, so that `scripts/bench` can gather every binary's verdicts into a single scoreboard
//! (`target/bench-goals.md`).
//!
//! A goal is reported, never asserted: the machines are shared and noisy, and a verdict is one
//! run's reading. Each verdict is one line:
//!
//! ```text
//! goal #4 | stream: xtc/raw, one message per call | >= 0.50x | 0.40x | NOT met
//! ```
//!
//! The issue's number, what is compared, the goal, this run's figure, and `met`, `NOT met` or
//! `n/a` (no figure, or none that can be compared; the figure's cell says why). The `goal #`
//! prefix is what `scripts/bench` looks for; the cells are separated by ` | ` so the line is a
//! Markdown table row once its prefix is cut.

/// One goal's verdict in one run. Cheap: a few short strings, built once per goal per run.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// The issue that sets the goal.
    pub issue: u32,
    /// What is compared, e.g. `spawn+join: xtc/monoio`.
    pub what: String,
    /// The goal as written, e.g. `>= 1.50x` or `< 200 us`.
    pub target: String,
    /// This run's figure, or `n/a: why`.
    pub measured: String,
    /// Whether the figure meets the goal; `None` where there is no figure to judge.
    pub met: Option<bool>,
}

impl Goal {
    /// A ratio goal: `measured` (a ratio, `None` if a value is missing) at most or at least
    /// `target`. Printed with an `x` suffix, two decimals.
    pub fn ratio(
        issue: u32,
        what: impl Into<String>,
        at_most: bool,
        target: f64,
        measured: Option<f64>,
    ) -> Goal {
        Goal::value(issue, what, at_most, target, "x", measured)
    }

    /// A goal on a value in `unit` (`"x"` for a ratio, printed without a space; `""` for a bare
    /// number; any other unit after a space): `measured` at most or at least `target`. `None`:
    /// no figure.
    pub fn value(
        issue: u32,
        what: impl Into<String>,
        at_most: bool,
        target: f64,
        unit: &str,
        measured: Option<f64>,
    ) -> Goal {
        let fmt = |v: f64| {
            if unit == "x" {
                format!("{v:.2}x")
            } else if unit.is_empty() {
                crate::fmt_num(v)
            } else {
                format!("{} {unit}", crate::fmt_num(v))
            }
        };
        let sign = if at_most { "<=" } else { ">=" };
        Goal {
            issue,
            what: what.into(),
            target: format!("{sign} {}", fmt(target)),
            measured: measured.map_or_else(|| "n/a: a value is missing".to_string(), fmt),
            // A NaN figure (0/0) meets nothing, and is no verdict either.
            met: measured.filter(|v| !v.is_nan()).map(|v| {
                if at_most {
                    v <= target
                } else {
                    v >= target
                }
            }),
        }
    }

    /// A goal whose verdict the caller made (a figure with no single number, or one with no
    /// comparable peer figure): the three cells as given.
    pub fn judged(
        issue: u32,
        what: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        met: Option<bool>,
    ) -> Goal {
        Goal {
            issue,
            what: what.into(),
            target: target.into(),
            measured: measured.into(),
            met,
        }
    }

    /// `met`, `NOT met` or `n/a`.
    pub fn word(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "n/a",
        }
    }

    /// The verdict line (see the module docs). A `|` inside a cell would split it in two, so
    /// it is written as `/` there.
    pub fn line(&self) -> String {
        let cell = |s: &str| s.replace('|', "/");
        format!(
            "goal #{} | {} | {} | {} | {}",
            self.issue,
            cell(&self.what),
            cell(&self.target),
            cell(&self.measured),
            self.word()
        )
    }
}

/// Prints `goals` under a heading, one verdict line each, indented by two spaces (the
/// binaries' note style); nothing if there are none.
pub fn print_goals(goals: &[Goal]) {
    if goals.is_empty() {
        return;
    }
    println!("  goals of the issues (reported, not asserted; scripts/bench gathers them):");
    for g in goals {
        println!("  {}", g.line());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_goal_is_judged_in_its_direction() {
        let at_least = Goal::ratio(4, "stream: xtc/raw", false, 0.5, Some(0.4));
        assert_eq!(
            at_least.line(),
            "goal #4 | stream: xtc/raw | >= 0.50x | 0.40x | NOT met"
        );
        assert_eq!(
            Goal::ratio(4, "s", false, 0.5, Some(0.5)).met,
            Some(true),
            "the bound itself meets an at-least goal"
        );
        let at_most = Goal::ratio(5, "fib: xtc/tokio", true, 0.1, Some(0.08));
        assert_eq!(at_most.met, Some(true));
        assert_eq!(at_most.word(), "met");
        assert_eq!(
            Goal::ratio(5, "fib", true, 0.1, Some(0.11)).met,
            Some(false)
        );
    }

    #[test]
    fn a_missing_or_undefined_figure_is_no_verdict() {
        let missing = Goal::ratio(3, "spawn", false, 1.5, None);
        assert_eq!(missing.met, None);
        assert!(missing.line().ends_with("| n/a: a value is missing | n/a"));
        assert_eq!(Goal::ratio(3, "x", true, 1.0, Some(f64::NAN)).met, None);
    }

    #[test]
    fn a_unit_goal_and_a_judged_goal_print_their_cells() {
        let g = Goal::value(
            3,
            "sleep(1ms) overshoot p99",
            true,
            200.0,
            "us",
            Some(130.0),
        );
        assert_eq!(g.target, "<= 200.0 us");
        assert_eq!(g.measured, "130.0 us");
        assert_eq!(g.met, Some(true));
        let j = Goal::judged(3, "yield: xtc/monoio", ">= 1.30x", "n/a: a|b", None);
        assert_eq!(
            j.line(),
            "goal #3 | yield: xtc/monoio | >= 1.30x | n/a: a/b | n/a",
            "a `|` in a cell would split the row"
        );
    }
}
