//! The scoreboard of one benchmark run: reads the output of any of the benchmark binaries on
//! stdin, keeps their goal verdict lines (`goal #N | ...`, see `xtc_bench::goal`), and writes
//! them, in issue order, as a Markdown table (stdout, and `--md PATH`) and as an SVG chart of how
//! far each goal is from being met (`--svg PATH`). `scripts/bench` pipes every binary's output
//! through it at the end of a run.
//!
//! ```text
//! goals [--md PATH] [--svg PATH] [--note TEXT]  < benchmark output
//! ```
//!
//! `--note` is printed under the title (the run's date, commit and machine). Input without any
//! verdict line prints nothing and writes nothing; it is not an error (a `--only` run of `c2c`
//! judges no goal).

use std::{io::Read as _, path::PathBuf, process::ExitCode};

use xtc_bench::{
    goal::{scoreboard_markdown, scoreboard_svg, Goal, SCOREBOARD_TITLE},
    svg::write_file as write,
};

const USAGE: &str = "usage: goals [--md PATH] [--svg PATH] [--note TEXT]  < benchmark output";

/// The parsed command line.
#[derive(Debug, Default, PartialEq)]
struct Args {
    md: Option<PathBuf>,
    svg: Option<PathBuf>,
    note: String,
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value"));
        match a.as_str() {
            "--md" => out.md = Some(value("--md")?.into()),
            "--svg" => out.svg = Some(value("--svg")?.into()),
            "--note" => out.note = value("--note")?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(out)
}

/// The verdict lines of `text`, sorted by issue (stable: within an issue, as printed).
fn goals_of(text: &str) -> Vec<Goal> {
    let mut goals: Vec<Goal> = text.lines().filter_map(Goal::parse).collect();
    goals.sort_by_key(|g| g.issue);
    goals
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("goals: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("goals: could not read stdin: {e}");
        return ExitCode::FAILURE;
    }
    let goals = goals_of(&text);
    if goals.is_empty() {
        return ExitCode::SUCCESS;
    }
    let md = scoreboard_markdown(&goals, &args.note);
    print!("{md}");
    let mut code = ExitCode::SUCCESS;
    if let Some(path) = &args.md {
        if let Err(e) = write(path, &md) {
            eprintln!("goals: could not write {}: {e}", path.display());
            code = ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.svg {
        let svg = scoreboard_svg(&goals, SCOREBOARD_TITLE, &args.note);
        match write(path, &svg) {
            Ok(()) => println!("chart written to {}", path.display()),
            Err(e) => {
                eprintln!("goals: could not write {}: {e}", path.display());
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_lines_are_picked_out_and_sorted_by_issue() {
        let text = "\
local: ...
  goal #7 | echo | >= 1.20x | 1.06x | NOT met
spawn+join | 1 | 2
  goal #3 | spawn | >= 1.50x | 0.87x | NOT met
  goal #3 | sleep | <= 200.0 us | 83.58 us | met
  goal #x | not a verdict | a | b | met
";
        let g = goals_of(text);
        let order: Vec<(u32, &str)> = g.iter().map(|g| (g.issue, g.what.as_str())).collect();
        assert_eq!(order, [(3, "spawn"), (3, "sleep"), (7, "echo")]);
    }

    #[test]
    fn arguments() {
        let a = |v: &[&str]| parse(v.iter().map(|s| s.to_string()));
        assert_eq!(
            a(&["--md", "m", "--svg", "s", "--note", "n"]),
            Ok(Args {
                md: Some("m".into()),
                svg: Some("s".into()),
                note: "n".into()
            })
        );
        assert_eq!(a(&[]), Ok(Args::default()));
        assert_eq!(a(&["--md"]), Err("--md needs a value".into()));
        assert!(a(&["--bogus"]).unwrap_err().contains("--bogus"));
        assert_eq!(a(&["--help"]), Err(String::new()));
    }
}
