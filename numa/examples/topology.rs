//! Print a machine's tree, a shard placement and each shard's victim order.
//!
//! ```text
//! cargo run -p xtc-numa --example topology -- [--shards N] [--synthetic "desc" | --xml FILE]
//!     [--policy compact|spread|cpus:0,2,4] [--sensitivity 0|1|2] [--oversubscribe]
//! ```
//!
//! With no arguments it describes the real machine, one shard per allowed core.

use std::io::Write as _;
use std::process::ExitCode;

use xtc_numa::{
    Level, Placement, Policy, Topology, VictimOrder, DEFAULT_NUMA_SENSITIVITY, MATRIX_BASE,
};

const USAGE: &str = "\
usage: topology [--shards N] [--synthetic \"DESC\" | --xml FILE] [--policy POLICY]
                [--sensitivity 0|1|2] [--oversubscribe]

  --shards N         number of shards; 0 (default) = one per allowed physical core
  --synthetic DESC   an hwloc synthetic topology, e.g. \"pack:2 numa:2 l3:1 core:4 pu:2\"
  --xml FILE         an hwloc XML topology (lstopo file.xml)
  --policy POLICY    compact (default), spread, or cpus:0,2,4 (ranges too: cpus:0-3,8)
  --sensitivity S    NUMA sensitivity: 0 steal across nodes, 1 (default) only the first
                     shard of each node does, 2 never
  --oversubscribe    allow more shards than allowed CPUs
Without --synthetic or --xml, the real machine is used.";

/// Parsed command line.
#[derive(Debug)]
struct Args {
    shards: usize,
    synthetic: Option<String>,
    xml: Option<std::path::PathBuf>,
    policy: Policy,
    sensitivity: u8,
    oversubscribe: bool,
}

/// Parses the command line. Arguments come as `OsString`s: `std::env::args` panicked on one
/// that is not Unicode, and an XML file's path need not be.
fn parse_args(mut it: impl Iterator<Item = std::ffi::OsString>) -> Result<Args, String> {
    let mut args = Args {
        shards: 0,
        synthetic: None,
        xml: None,
        policy: Policy::default(),
        sensitivity: DEFAULT_NUMA_SENSITIVITY,
        oversubscribe: false,
    };
    while let Some(flag) = it.next() {
        let mut raw = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let mut value = |name: &str| {
            raw(name)?
                .into_string()
                .map_err(|v| format!("{name} takes text, not {v:?}"))
        };
        let Some(flag) = flag.to_str() else {
            return Err(format!("unknown argument {flag:?}"));
        };
        match flag {
            "--shards" => {
                let v = value("--shards")?;
                args.shards = v
                    .parse()
                    .map_err(|_| format!("--shards takes a number, not {v:?}"))?;
            }
            "--synthetic" => args.synthetic = Some(value("--synthetic")?),
            "--xml" => args.xml = Some(raw("--xml")?.into()),
            "--policy" => args.policy = value("--policy")?.parse().map_err(|e| format!("{e}"))?,
            "--sensitivity" => {
                let v = value("--sensitivity")?;
                args.sensitivity = match v.parse::<u8>() {
                    Ok(s) if s <= 2 => s,
                    _ => return Err(format!("--sensitivity takes 0, 1 or 2, not {v:?}")),
                };
            }
            "--oversubscribe" => args.oversubscribe = true,
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.synthetic.is_some() && args.xml.is_some() {
        return Err("give --synthetic or --xml, not both".to_owned());
    }
    Ok(args)
}

/// Write to stdout, ignoring a closed pipe (`topology | head`).
fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn run(args: &Args) -> xtc_numa::Result<()> {
    let topo = match (&args.synthetic, &args.xml) {
        (Some(desc), _) => Topology::synthetic(desc)?,
        (_, Some(path)) => Topology::from_xml(path)?,
        _ => Topology::detect()?,
    };
    out(&topo.render_tree());
    out("\n");
    let placement = Placement::new(&topo, args.shards, &args.policy, args.oversubscribe)?;
    out(&placement.render(&topo));
    out("\n");
    let victims = VictimOrder::new(&topo, &placement, args.sensitivity)?;
    out(&victims.render());
    out(&legend(&victims));
    Ok(())
}

/// What the victim table's numbers mean: an idle shard (a thief) tries the shards on its line
/// left to right; the number in brackets after each group is how far those shards are from it.
fn legend(victims: &VictimOrder) -> String {
    let levels = [
        Level::Pu,
        Level::Core,
        Level::L2,
        Level::L3,
        Level::NumaNode,
        Level::Package,
        Level::Machine,
    ]
    .map(|l| format!("{} {l}", l as u64))
    .join(", ");
    let who = match victims.numa_sensitivity() {
        0 => "every shard may steal from every NUMA node",
        1 => "only the first shard of each NUMA node looks beyond its own node",
        _ => "no shard steals from another NUMA node",
    };
    format!(
        "  (an idle shard tries the shards on its line left to right; [n] after a group is its \
         distance: {levels}; {MATRIX_BASE}+d another NUMA node, d from the latency matrix; \
         sensitivity {}: {who})\n",
        victims.numa_sensitivity()
    )
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            if msg.is_empty() {
                // --help
                out(USAGE);
                out("\n");
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // The placement errors speak of xtc's builder and environment, which this program
            // does not read: name its own flags, or the fix they suggest does nothing here.
            let hint = match e {
                xtc_numa::Error::TooManyShards { .. } => "lower --shards or add --oversubscribe",
                xtc_numa::Error::OversubscribedTooFar { .. } => "lower --shards",
                xtc_numa::Error::DuplicateCpu { .. } => {
                    "list each CPU once in --policy cpus:.. or add --oversubscribe"
                }
                _ => "",
            };
            if !hint.is_empty() {
                eprintln!("here: {hint}");
            }
            ExitCode::from(1)
        }
    }
}
