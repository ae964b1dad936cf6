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
//!
//! [`Goal::parse`] reads such a line back; the `goals` binary does, over every benchmark's
//! output, and writes the scoreboard as Markdown ([`scoreboard_markdown`]) and as an SVG chart
//! ([`scoreboard_svg`]) of how far each goal is from being met ([`Goal::reach`]).

/// One goal's verdict in one run. Cheap: a few short strings, built once per goal per run.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// The issue that sets the goal.
    pub issue: u32,
    /// What is compared, e.g. `spawn+join: xtc/monoio`.
    pub what: String,
    /// The goal as written, e.g. `>= 1.50x` or `<= 200 us`.
    pub target: String,
    /// This run's figure, or `n/a: why`.
    pub measured: String,
    /// Whether the figure meets the goal; `None` where there is no figure to judge.
    pub met: Option<bool>,
}

impl Goal {
    /// A ratio goal: `measured` (a ratio, `None` if a value is missing) at most or at least
    /// `target`. Printed with an `x` suffix, two decimals. Cost: as [`value`](Self::value).
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
    /// no figure. A figure that rounds to the target's text but is not the target is printed
    /// with as many more decimals as tell them apart (`0.103x` against `<= 0.10x`, not
    /// `0.10x`), so the printed figure, the verdict and [`reach`](Self::reach) (which reads the
    /// printed cells) agree. Cost: three small string allocations (the cells), a few more in
    /// that case.
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
        // `d` decimals, in the same layout.
        let fixed = |v: f64, d: usize| {
            if unit == "x" {
                format!("{v:.d$}x")
            } else if unit.is_empty() {
                format!("{v:.d$}")
            } else {
                format!("{v:.d$} {unit}")
            }
        };
        let shown = |v: f64| {
            let s = fmt(v);
            if s != fmt(target) || v == target || !v.is_finite() {
                return s;
            }
            (2..=12)
                .map(|d| (fixed(v, d), fixed(target, d)))
                .find(|(a, b)| a != b)
                .map_or(s, |(a, _)| a)
        };
        let sign = if at_most { "<=" } else { ">=" };
        Goal {
            issue,
            what: what.into(),
            target: format!("{sign} {}", fmt(target)),
            measured: measured.map_or_else(|| "n/a: a value is missing".to_string(), shown),
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
    /// comparable peer figure): the three cells as given. Cost: three small string
    /// allocations.
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

    /// `met`, `NOT met` or `n/a`. Cost: none (a static string).
    pub fn word(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "n/a",
        }
    }

    /// The verdict line (see the module docs). A `|` inside a cell would split it in two, so
    /// it is written as `/` there. Cost: one allocation per cell and one for the line.
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

impl Goal {
    /// Reads a verdict line as [`line`](Self::line) writes it (leading whitespace allowed);
    /// `None` for any other line. Cost: a scan of the line and five small allocations.
    pub fn parse(line: &str) -> Option<Goal> {
        let rest = line.trim_start().strip_prefix("goal #")?;
        let cells: Vec<&str> = rest.split(" | ").collect();
        let [issue, what, target, measured, word] = cells[..] else {
            return None;
        };
        let met = match word.trim_end() {
            "met" => Some(true),
            "NOT met" => Some(false),
            "n/a" => None,
            _ => return None,
        };
        Some(Goal {
            issue: issue.trim().parse().ok()?,
            what: what.to_string(),
            target: target.to_string(),
            measured: measured.to_string(),
            met,
        })
    }

    /// How far this run's figure is from the goal, as a factor where 1 is the goal itself and
    /// above 1 is better: figure / target for an at-least goal, target / figure for an at-most
    /// one. Only for goals written `>= N<unit>` or `<= N<unit>` whose figure has the same unit
    /// (what [`ratio`](Self::ratio) and [`value`](Self::value) write); `None` for the others
    /// (a goal the caller judged, a missing figure). Cost: two short string scans.
    pub fn reach(&self) -> Option<f64> {
        let (at_most, target) = if let Some(t) = self.target.strip_prefix("<= ") {
            (true, t)
        } else {
            (false, self.target.strip_prefix(">= ")?)
        };
        let (t, t_unit) = split_number(target)?;
        let (m, m_unit) = split_number(&self.measured)?;
        if t_unit != m_unit {
            return None;
        }
        let reach = if at_most { t / m } else { m / t };
        // A figure of 0 for an at-most goal is as good as it gets: shown at the chart's edge.
        (!reach.is_nan()).then_some(reach)
    }
}

/// `"1.50x"` -> `(1.5, "x")`, `"83.58 us"` -> `(83.58, " us")`: a leading decimal number and
/// what follows it; `None` if the text does not start with one.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    Some((s[..end].parse().ok()?, &s[end..]))
}

/// The scoreboard's title, in its Markdown and on its chart.
pub const SCOREBOARD_TITLE: &str = "xtc speed goals, one scripts/bench run";

/// `goals` as a Markdown document: a title, `note` (the run: date, commit, machine), one table
/// row per goal in the order given, and the count of each verdict. Cost: linear in the
/// goals' text.
pub fn scoreboard_markdown(goals: &[Goal], note: &str) -> String {
    let mut out = format!("# {SCOREBOARD_TITLE}\n\n");
    if !note.is_empty() {
        out.push_str(note);
        out.push_str("\n\n");
    }
    out.push_str(
        "| issue | goal | target | this run | verdict |\n| --- | --- | --- | --- | --- |\n",
    );
    for g in goals {
        out.push_str("| ");
        out.push_str(g.line().trim_start_matches("goal #"));
        out.push_str(" |\n");
    }
    let count = |met| goals.iter().filter(|g| g.met == met).count();
    out.push_str(&format!(
        "\n{} met, {} not met, {} without a verdict.\n",
        count(Some(true)),
        count(Some(false)),
        count(None)
    ));
    out
}

/// The chart's scale: [`Goal::reach`] from `1 / REACH_SPAN` to `REACH_SPAN`, on a log axis
/// centred on the goal (1); figures beyond it are drawn at the edge.
const REACH_SPAN: f64 = 10.0;

/// `goals` as an SVG chart, one row each: the issue and goal, a bar from the goal line to this
/// run's [`Goal::reach`] on a log scale (right of the line: better than the goal; green when
/// met, red when not, grey without a verdict), and the figure against the target. A goal
/// without a `reach` gets its verdict written beside the goal line instead of a bar. Cost:
/// linear in the goals' text (about 350 bytes of SVG per goal).
pub fn scoreboard_svg(goals: &[Goal], title: &str, subtitle: &str) -> String {
    use std::fmt::Write as _;
    const ROW: f64 = 22.0;
    const TOP: f64 = 80.0;
    const LABEL_W: f64 = 470.0;
    const BAR_W: f64 = 300.0;
    const TEXT_W: f64 = 330.0;
    let width = LABEL_W + BAR_W + TEXT_W + 20.0;
    let height = TOP + ROW * goals.len().max(1) as f64 + 30.0;
    let mut s = crate::svg::open(width, height, title, subtitle);
    let x_of = |reach: f64| {
        let r = reach.clamp(1.0 / REACH_SPAN, REACH_SPAN).log10() / REACH_SPAN.log10();
        LABEL_W + BAR_W / 2.0 + r * BAR_W / 2.0
    };
    let mid = x_of(1.0);
    let esc = crate::svg::esc;
    let _ = writeln!(
        s,
        r##"<text x="{mid:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="#333">goal</text>"##,
        TOP - 8.0
    );
    for (edge, label) in [(1.0 / REACH_SPAN, "10x short"), (REACH_SPAN, "10x past")] {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#777">{label}</text>"##,
            x_of(edge),
            TOP - 8.0
        );
    }
    for (i, g) in goals.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let colour = match g.met {
            Some(true) => "#2ca02c",
            Some(false) => "#d62728",
            None => "#999999",
        };
        let _ = writeln!(
            s,
            r#"<text x="10" y="{:.1}" font-size="12">#{} {}</text>"#,
            y + 15.0,
            g.issue,
            esc(&g.what)
        );
        match g.reach() {
            Some(reach) => {
                let x = x_of(reach);
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}"><title>{}: {} against {}</title></rect>"#,
                    x.min(mid),
                    y + 4.0,
                    (x - mid).abs().max(1.0),
                    ROW - 8.0,
                    esc(&g.what),
                    esc(&g.measured),
                    esc(&g.target)
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{colour}">{}</text>"#,
                    mid + 6.0,
                    y + 15.0,
                    g.word()
                );
            }
        }
        let mut figure = format!("{} ({})", g.measured, g.target);
        if figure.chars().count() > 52 {
            figure = figure.chars().take(51).collect::<String>() + "…";
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{colour}">{}</text>"#,
            LABEL_W + BAR_W + 10.0,
            y + 15.0,
            esc(&figure)
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{mid:.1}" y1="{:.1}" x2="{mid:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="3,3"/>"##,
        TOP - 4.0,
        TOP + ROW * goals.len() as f64
    );
    s.push_str("</svg>\n");
    s
}

/// Prints `goals` under a heading, one verdict line each, indented by two spaces (the
/// binaries' note style); nothing if there are none. Cost: one stdout line per goal.
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
    fn a_line_reads_back_into_its_goal() {
        for g in [
            Goal::ratio(4, "stream: xtc/raw", false, 0.5, Some(0.4)),
            Goal::value(3, "sleep p99", true, 200.0, "us", Some(83.58)),
            Goal::ratio(3, "spawn", false, 1.5, None),
            Goal::judged(6, "shares", "3.0 ± 0.15", "3.004", Some(true)),
        ] {
            assert_eq!(
                Goal::parse(&format!("  {}", g.line())),
                Some(g.clone()),
                "{g:?}"
            );
        }
        assert_eq!(
            Goal::parse("goal #x | a | b | c | met"),
            None,
            "no issue number"
        );
        assert_eq!(
            Goal::parse("goal #3 | a | b | c | maybe"),
            None,
            "no verdict word"
        );
        assert_eq!(Goal::parse("goal #3 | a | b | met"), None, "a cell missing");
        assert_eq!(Goal::parse("  spawn / xtc runs: 1 2 3"), None);
    }

    #[test]
    fn reach_is_above_one_exactly_when_a_goal_is_met() {
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        let at_least = Goal::ratio(4, "s", false, 0.5, Some(0.4));
        assert!(close(at_least.reach(), 0.8), "{:?}", at_least.reach());
        let at_most = Goal::ratio(5, "f", true, 0.1, Some(0.05));
        assert!(close(at_most.reach(), 2.0), "{:?}", at_most.reach());
        let us = Goal::value(3, "p99", true, 200.0, "us", Some(400.0));
        assert!(close(us.reach(), 0.5), "{:?}", us.reach());
        // Figures that round to their target's text but miss it (or meet it): printed with the
        // decimals that tell them apart, so the verdict, the figure and the chart agree. Printed
        // as the target, `<= 0.10x | 0.10x | NOT met` drew a met bar for a missed goal.
        let fib = Goal::ratio(5, "fib", true, 0.1, Some(0.103));
        assert_eq!((fib.measured.as_str(), fib.met), ("0.103x", Some(false)));
        let hair = Goal::ratio(3, "s", false, 1.5, Some(1.496));
        assert_eq!(hair.measured, "1.496x");
        let under = Goal::ratio(4, "rtt", true, 2.0, Some(1.9961));
        assert_eq!((under.measured.as_str(), under.met), ("1.996x", Some(true)));
        let spot = Goal::value(3, "p99", true, 200.0, "us", Some(200.04));
        assert_eq!(spot.met, Some(false));
        for g in [&at_least, &at_most, &us, &fib, &hair, &under, &spot] {
            assert_eq!(g.met, g.reach().map(|r| r >= 1.0), "{g:?}");
        }
        // No number to compare: a judged goal, a missing figure, units that differ.
        assert_eq!(
            Goal::judged(6, "s", "3.0 ± 0.15", "3.0", Some(true)).reach(),
            None
        );
        assert_eq!(Goal::ratio(3, "s", false, 1.5, None).reach(), None);
        assert_eq!(Goal::judged(6, "p", "<= 3 %", "2 us", None).reach(), None);
    }

    #[test]
    fn the_scoreboard_counts_and_draws_every_goal() {
        let goals = [
            Goal::ratio(3, "spawn <x>", false, 1.5, Some(0.87)),
            Goal::ratio(5, "steal", false, 1.8, Some(1.94)),
            Goal::judged(3, "yield", ">= 1.30x", "n/a: no figure", None),
        ];
        let md = scoreboard_markdown(&goals, "a run");
        assert!(
            md.contains("| 3 | spawn <x> | >= 1.50x | 0.87x | NOT met |\n"),
            "{md}"
        );
        assert!(
            md.ends_with("1 met, 1 not met, 1 without a verdict.\n"),
            "{md}"
        );
        let svg = scoreboard_svg(&goals, "t", "s");
        assert_eq!(
            svg.matches("<rect").count(),
            1 + 2,
            "background and two bars: {svg}"
        );
        assert!(svg.contains("spawn &lt;x&gt;"), "escaped label");
        assert!(
            svg.contains(">n/a</text>"),
            "the judged goal's word where its bar would be"
        );
        assert!(svg.contains("#d62728") && svg.contains("#2ca02c"));
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
