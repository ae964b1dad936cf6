//! Placement: which CPU each of N shards runs on.
//!
//! See [`Placement`] for the rules.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::topology::Topology;

/// Most shards per allowed CPU with oversubscription (tests and small machines use a few; a
/// shard is a thread and a row of the N·(N−1) ring mesh, so a mistyped count of 100,000 would
/// otherwise try to allocate terabytes instead of failing).
pub const MAX_SHARDS_PER_CPU: usize = 64;

/// How shards are laid out on CPUs. Default: [`Policy::Compact`].
///
/// Parse one from a string with [`str::parse`]: `"compact"`, `"spread"`,
/// `"cpus:0,2,4"` or just `"0,2,4"` (ranges like `"0-3"` are accepted too); its
/// [`Display`](fmt::Display) form parses back to the same policy, for every policy a
/// [`Placement`] accepts with at most 65,536 CPUs listed (parsing refuses longer lists; an
/// oversubscribed placement on more than 1,024 allowed CPUs may list more): an empty CPU list
/// displays as `"cpus:"`, which is a parse error (it names no CPU), as `Placement::new`
/// refuses the empty list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Policy {
    /// Fill NUMA node 0's cores first, then node 1's...: nearest shards, shared caches.
    #[default]
    Compact,
    /// Round-robin over NUMA nodes: shard 0 on node 0, shard 1 on node 1...: spreads memory
    /// bandwidth, makes cross-node traffic likelier.
    Spread,
    /// Exactly these CPUs (OS indices), shard `i` on the `i`-th.
    Cpus(Vec<usize>),
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Compact => f.write_str("compact"),
            Policy::Spread => f.write_str("spread"),
            Policy::Cpus(list) => {
                f.write_str("cpus:")?;
                for (i, cpu) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_char(',')?;
                    }
                    write!(f, "{cpu}")?;
                }
                Ok(())
            }
        }
    }
}

/// Most CPUs a `cpus:` list may name (with repeats): far above any machine's count, and
/// small enough that a hostile `XTC_PLACEMENT` cannot ask for much memory.
const MAX_LISTED_CPUS: usize = 1 << 16;

impl FromStr for Policy {
    type Err = Error;

    /// Parse `"compact"`, `"spread"`, `"cpus:LIST"` or `"LIST"`, where `LIST` is a
    /// comma-separated list of CPU numbers or ranges (`"0,2,4"`, `"0-3,8"`). Case and
    /// surrounding spaces are ignored. Cost: a lower-cased copy of `s`, and for a list the
    /// `Vec` of its CPUs (growing as it is filled) and a pass over the items.
    fn from_str(s: &str) -> Result<Policy> {
        let bad = || Error::BadPolicy(s.to_owned());
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "compact" => return Ok(Policy::Compact),
            "spread" => return Ok(Policy::Spread),
            _ => {}
        }
        let list = t.strip_prefix("cpus:").unwrap_or(&t);
        if list.trim().is_empty() {
            return Err(bad());
        }
        let mut cpus = Vec::new();
        for item in list.split(',') {
            // Ranges are capped one by one, and so is the whole list: a long value of wide
            // ranges would otherwise ask for gigabytes before any check ran.
            if cpus.len() > MAX_LISTED_CPUS {
                return Err(bad());
            }
            let item = item.trim();
            let num = |x: &str| x.trim().parse::<usize>().map_err(|_| bad());
            match item.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (num(lo)?, num(hi)?);
                    if lo > hi || hi - lo >= 1 << 16 {
                        return Err(bad());
                    }
                    cpus.extend(lo..=hi);
                }
                None => cpus.push(num(item)?),
            }
        }
        if cpus.len() > MAX_LISTED_CPUS {
            return Err(bad());
        }
        Ok(Policy::Cpus(cpus))
    }
}

/// The CPU of every shard: shard `i` runs on `cpu(i)`.
///
/// # The normal order
///
/// Allowed PUs are grouped by physical core, and cores by NUMA node (node order, then core
/// order). Every core gets one shard on its first allowed PU before any SMT sibling is
/// used; then the second PU of every core that has one, and so on. Within each such round:
///
/// - [`Policy::Compact`] takes the cores of NUMA node 0, then those of node 1, ...: the
///   first shards share a node (and its caches and memory).
/// - [`Policy::Spread`] takes one core of node 0, one of node 1, ..., then the second core
///   of each node, ...: shard `i` lands on node `i % nodes` while every node has cores left.
///
/// With oversubscription, shards beyond the allowed PUs wrap around that order, so CPUs
/// share shards evenly (2 CPUs, 5 shards: 3 and 2).
///
/// Built once at executor start by [`Placement::new`]; queries are slice lookups.
#[derive(Debug, Clone)]
pub struct Placement {
    cpus: Vec<usize>,
    numa: Vec<Option<usize>>,
    policy: Policy,
    oversubscribed: bool,
}

/// One physical core's allowed PUs.
struct CoreSlot {
    numa: Option<usize>,
    pus: Vec<usize>,
}

impl Placement {
    /// Place `shards` shards on the allowed CPUs of `topo` following `policy`.
    ///
    /// `shards == 0` means one shard per allowed physical core (for [`Policy::Cpus`]: one
    /// per listed CPU). Only allowed PUs are used ([`Topology::allowed_pus`]). See the
    /// [`Placement`] docs for the order. With `oversubscribe`, more shards than allowed
    /// PUs share CPUs evenly, and a CPU list may repeat CPUs.
    ///
    /// Cost: sorts the allowed PUs, O(P log P); allocates the table.
    ///
    /// # Errors
    ///
    /// - [`Error::NoAllowedCpus`] if the process may use no CPU of `topo`;
    /// - [`Error::TooManyShards`] if `shards` exceeds the allowed PUs and `oversubscribe`
    ///   is off;
    /// - [`Error::CpuListLength`], [`Error::CpuNotAllowed`], [`Error::DuplicateCpu`] for a
    ///   CPU list that does not fit, and [`Error::TooManyOnOneCpu`] for one that names a CPU
    ///   more than [`MAX_SHARDS_PER_CPU`] times;
    /// - [`Error::OversubscribedTooFar`] beyond [`MAX_SHARDS_PER_CPU`] shards per allowed CPU.
    pub fn new(
        topo: &Topology,
        shards: usize,
        policy: &Policy,
        oversubscribe: bool,
    ) -> Result<Placement> {
        let allowed = topo.allowed_pus();
        if allowed.is_empty() {
            return Err(Error::NoAllowedCpus);
        }
        let cpus = match policy {
            Policy::Cpus(list) => Self::from_list(topo, &allowed, shards, list, oversubscribe)?,
            Policy::Compact | Policy::Spread => {
                let order = normal_order(topo, &allowed, policy == &Policy::Spread);
                let shards = if shards == 0 {
                    topo.allowed_cores()
                } else {
                    shards
                };
                if shards > order.len() && !oversubscribe {
                    return Err(Error::TooManyShards {
                        asked: shards,
                        allowed: order.len(),
                    });
                }
                // Checked before the list of `shards` CPUs is built (a huge count would abort
                // on that allocation first).
                check_ceiling(shards, allowed.len())?;
                order.iter().copied().cycle().take(shards).collect()
            }
        };
        check_ceiling(cpus.len(), allowed.len())?;
        let numa = cpus.iter().map(|&c| topo.numa_node_of(c)).collect();
        // Some CPU carries two shards: more shards than allowed CPUs, or a CPU list that
        // repeats one (comparing the totals alone missed the latter).
        let mut distinct = cpus.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let placement = Placement {
            oversubscribed: distinct.len() < cpus.len(),
            cpus,
            numa,
            policy: policy.clone(),
        };
        tracing::debug!(placement = ?placement, "shards placed");
        Ok(placement)
    }

    fn from_list(
        topo: &Topology,
        allowed: &[usize],
        shards: usize,
        list: &[usize],
        oversubscribe: bool,
    ) -> Result<Vec<usize>> {
        if list.is_empty() || (shards != 0 && list.len() != shards) {
            return Err(Error::CpuListLength {
                listed: list.len(),
                shards,
            });
        }
        // Shards listed per CPU: a duplicate needs oversubscription, and no CPU takes more than
        // MAX_SHARDS_PER_CPU (the total alone let a list put them all on one CPU).
        // At most one entry per allowed CPU (any other fails below): a huge list (a user's
        // own `Policy::Cpus`) is refused before its length sizes anything here.
        let mut listed = std::collections::HashMap::with_capacity(list.len().min(allowed.len()));
        for &cpu in list {
            if !topo.is_allowed(cpu) {
                return Err(Error::CpuNotAllowed {
                    cpu,
                    allowed: allowed.to_vec(),
                });
            }
            let n = listed.entry(cpu).or_insert(0usize);
            *n += 1;
            if *n > 1 && !oversubscribe {
                return Err(Error::DuplicateCpu { cpu });
            }
            if *n > MAX_SHARDS_PER_CPU {
                return Err(Error::TooManyOnOneCpu {
                    cpu,
                    listed: list.iter().filter(|&&c| c == cpu).count(),
                    per_cpu: MAX_SHARDS_PER_CPU,
                });
            }
        }
        Ok(list.to_vec())
    }

    /// Number of shards. Cost: none.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// True if there are no shards (never for a placement built by [`Placement::new`]).
    /// Cost: none.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// OS index of the CPU (PU) of this shard, `None` if there is no such shard.
    /// Cost: a slice lookup.
    pub fn cpu(&self, shard: usize) -> Option<usize> {
        self.cpus.get(shard).copied()
    }

    /// The CPU (OS index) of every shard, indexed by shard. Cost: none.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Logical index of the NUMA node of this shard's CPU, `None` if there is no such
    /// shard or the topology has no NUMA information for it. Cost: a slice lookup.
    pub fn numa_node(&self, shard: usize) -> Option<usize> {
        self.numa.get(shard).copied().flatten()
    }

    /// The policy this placement was built with. Cost: none.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// True if some CPU carries more than one shard: there are more shards than allowed PUs,
    /// or a CPU list names a CPU more than once. Cost: none.
    pub fn is_oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    /// A text table: shard, CPU, core, NUMA node and package (`-` where unknown).
    ///
    /// Cost: allocates the string. For humans and logs.
    pub fn render(&self, topo: &Topology) -> String {
        let opt = |v: Option<usize>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let mut out = format!(
            "placement: {} shards, policy {}{}\n",
            self.len(),
            self.policy,
            if self.oversubscribed {
                ", oversubscribed"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "{:>6} {:>5} {:>5} {:>5} {:>8}",
            "shard", "cpu", "core", "numa", "package"
        );
        for (shard, &cpu) in self.cpus.iter().enumerate() {
            let _ = writeln!(
                out,
                "{:>6} {:>5} {:>5} {:>5} {:>8}",
                shard,
                cpu,
                opt(topo.core_of(cpu)),
                opt(self.numa_node(shard)),
                opt(topo.package_of(cpu)),
            );
        }
        out
    }
}

/// All allowed PUs in the normal order of the module docs.
fn normal_order(topo: &Topology, allowed: &[usize], spread: bool) -> Vec<usize> {
    // Group allowed PUs by core; a PU under no core is a core of its own.
    // Sort key: NUMA node (unknown last), then core (PUs under no core after the cores). A
    // core whose PUs hwloc puts in several nodes belongs to the first of them: keyed by each
    // PU's own node, it counted as one core per node, and took a shard per node before any
    // other core got one.
    let node_of = |pu: usize| topo.numa_node_of(pu).unwrap_or(usize::MAX);
    let mut core_node: std::collections::BTreeMap<usize, usize> = Default::default();
    for &pu in allowed {
        if let Some(c) = topo.core_of(pu) {
            let n = core_node.entry(c).or_insert(usize::MAX);
            *n = (*n).min(node_of(pu));
        }
    }
    let mut keyed: Vec<((usize, u8, usize), usize)> = allowed
        .iter()
        .map(|&pu| match topo.core_of(pu) {
            Some(c) => ((core_node[&c], 0, c), pu),
            None => ((node_of(pu), 1, pu), pu),
        })
        .collect();
    keyed.sort_unstable();
    let mut cores: Vec<CoreSlot> = Vec::new();
    let mut last_key = None;
    for (key, pu) in keyed {
        if last_key == Some(key) {
            if let Some(core) = cores.last_mut() {
                core.pus.push(pu);
            }
        } else {
            cores.push(CoreSlot {
                numa: (key.0 != usize::MAX).then_some(key.0),
                pus: vec![pu],
            });
            last_key = Some(key);
        }
    }
    // Cores per node, in node order (cores are already sorted by node).
    let mut nodes: Vec<Vec<&CoreSlot>> = Vec::new();
    for core in &cores {
        match nodes.last_mut() {
            Some(node) if node.first().is_some_and(|c| c.numa == core.numa) => node.push(core),
            _ => nodes.push(vec![core]),
        }
    }
    let rounds = cores.iter().map(|c| c.pus.len()).max().unwrap_or(0);
    let mut order = Vec::with_capacity(allowed.len());
    for round in 0..rounds {
        let in_round: Vec<Vec<usize>> = nodes
            .iter()
            .map(|node| {
                node.iter()
                    .filter_map(|c| c.pus.get(round).copied())
                    .collect()
            })
            .collect();
        if spread {
            let longest = in_round.iter().map(Vec::len).max().unwrap_or(0);
            for i in 0..longest {
                order.extend(in_round.iter().filter_map(|node| node.get(i).copied()));
            }
        } else {
            order.extend(in_round.into_iter().flatten());
        }
    }
    order
}

/// [`Error::OversubscribedTooFar`] beyond [`MAX_SHARDS_PER_CPU`] shards per allowed CPU.
fn check_ceiling(shards: usize, allowed: usize) -> Result<()> {
    let max = allowed.saturating_mul(MAX_SHARDS_PER_CPU);
    if shards > max {
        return Err(Error::OversubscribedTooFar {
            asked: shards,
            max,
            per_cpu: MAX_SHARDS_PER_CPU,
        });
    }
    Ok(())
}
