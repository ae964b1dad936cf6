//! Victim order: for each shard, the other shards it may steal from, nearest first.
//!
//! See [`VictimOrder`] for the rules.

use std::fmt::Write as _;

use crate::error::{Error, Result};
use crate::placement::Placement;
use crate::topology::Topology;

/// The default NUMA sensitivity: only the first shard of each node steals across nodes.
pub const DEFAULT_NUMA_SENSITIVITY: u8 = 1;

/// Most shards a [`VictimOrder`] is built for: one per PU of the largest machine a synthetic
/// topology may describe. Its tables hold N·(N−1) entries of 16 bytes (1 GiB at this bound),
/// so an oversubscribed placement of hundreds of thousands of shards, which
/// [`Placement::new`] accepts on a large topology, would otherwise compute for hours and end
/// in an out-of-memory kill.
pub const MAX_VICTIM_SHARDS: usize = 8192;

/// For every shard, the shards it may steal from, nearest first.
///
/// # Rules
///
/// 1. The candidates of thief `s` are all other shards, those of `s`'s NUMA node first, each
///    part sorted by [`Topology::distance`]`(cpu(s), cpu(other))`, nearest first. Shards
///    sharing `s`'s CPU (oversubscription) have distance 0 and come first. (Without a NUMA
///    latency matrix, a node that spans packages has members as far by distance as another
///    node's: the node comes first all the same.)
/// 2. Ties are rotated per thief: each group of equal distance, in shard order, starts at
///    the first shard after `s` (wrapping around), so thieves with the same candidates do
///    not all try the same victim first. E.g. four shards under one L3: shard 0 tries
///    1 2 3, shard 1 tries 2 3 0, shard 2 tries 3 0 1, shard 3 tries 0 1 2. A tie on
///    another node lies wholly on one side of the shards of a compactly placed node, so
///    those thieves start it at the same victim (at sensitivity 0, where all of them steal
///    across nodes; at the default 1 only one shard per node does, and thieves of different
///    nodes start apart). A rotation by the thief's rank within its node spread those but
///    sent the first shards of several nodes to one victim, and an interleaved placement's
///    thieves to one as well: not adopted.
/// 3. NUMA sensitivity, as HPX's `hpx.numa_sensitive`, limits stealing across NUMA nodes:
///    - 0: every shard may steal across nodes, nearest nodes first;
///    - 1 (the default): only the first shard (lowest index) of each NUMA node steals
///      across nodes (nearest nodes first); the others steal within their node only;
///    - 2: no shard steals across nodes.
///
///    HPX's level 1 lets the first worker reach only the nearest nodes; here it may try
///    every other node, nearest first, so work on a far node is still drained by someone.
///
/// Built once at executor start; [`VictimOrder::victims`] is a slice lookup, so a thief
/// walks its list without computing anything.
#[derive(Debug, Clone)]
pub struct VictimOrder {
    /// `lists[s]`: victims of thief `s`, in order.
    lists: Vec<Vec<usize>>,
    /// `dists[s][k]`: distance from `s` to `lists[s][k]`, for [`VictimOrder::render`].
    dists: Vec<Vec<u64>>,
    numa: Vec<Option<usize>>,
    sensitivity: u8,
}

impl VictimOrder {
    /// Compute every shard's victim list for `placement` on `topo`.
    ///
    /// `numa_sensitivity` is 0, 1 ([`DEFAULT_NUMA_SENSITIVITY`]) or 2, as in the
    /// [`VictimOrder`] docs.
    ///
    /// Cost: O(N² log N) distance lookups and sorting for N shards, and N·(N−1) entries of
    /// 16 bytes (a victim index and its distance, kept for [`render`](Self::render)); done
    /// once.
    ///
    /// # Errors
    ///
    /// [`Error::BadSensitivity`] if `numa_sensitivity > 2`; [`Error::TooManyForVictims`] if
    /// the placement has more than [`MAX_VICTIM_SHARDS`] shards.
    pub fn new(
        topo: &Topology,
        placement: &Placement,
        numa_sensitivity: u8,
    ) -> Result<VictimOrder> {
        if numa_sensitivity > 2 {
            return Err(Error::BadSensitivity {
                given: numa_sensitivity,
            });
        }
        let n = placement.len();
        if n > MAX_VICTIM_SHARDS {
            return Err(Error::TooManyForVictims {
                shards: n,
                max: MAX_VICTIM_SHARDS,
            });
        }
        let numa: Vec<Option<usize>> = (0..n).map(|s| placement.numa_node(s)).collect();
        let first_of_node = |s: usize| numa[..s].iter().all(|&m| m != numa[s]);
        let mut lists = Vec::with_capacity(n);
        let mut dists = Vec::with_capacity(n);
        for thief in 0..n {
            let cross = match numa_sensitivity {
                0 => true,
                1 => first_of_node(thief),
                _ => false,
            };
            let (list, dist) = order_for(topo, placement.cpus(), &numa, thief, cross);
            lists.push(list);
            dists.push(dist);
        }
        Ok(VictimOrder {
            lists,
            dists,
            numa,
            sensitivity: numa_sensitivity,
        })
    }

    /// The shards `shard` may steal from, nearest first; empty for an unknown shard.
    /// Cost: a slice lookup.
    pub fn victims(&self, shard: usize) -> &[usize] {
        self.lists.get(shard).map_or(&[], Vec::as_slice)
    }

    /// Number of shards. Cost: none.
    pub fn len(&self) -> usize {
        self.lists.len()
    }

    /// True if there are no shards. Cost: none.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// The NUMA sensitivity this order was built with. Cost: none.
    pub fn numa_sensitivity(&self) -> u8 {
        self.sensitivity
    }

    /// A heading, then one line per shard: its victims, with `|` between groups of equal
    /// distance (or of different NUMA nodes) and each group's distance in brackets, e.g.
    /// `  shard   0 (node 0): 1 2 3 [3] | 4 5 [36]` (the shard index padded to three places).
    ///
    /// Cost: allocates the string. For humans and logs.
    pub fn render(&self) -> String {
        let mut out = format!("victim order (NUMA sensitivity {}):\n", self.sensitivity);
        for (thief, (list, dist)) in self.lists.iter().zip(&self.dists).enumerate() {
            let node = self.numa[thief].map_or_else(|| "-".to_owned(), |n| n.to_string());
            let _ = write!(out, "  shard {thief:>3} (node {node}):");
            if list.is_empty() {
                out.push_str(" (none)");
            }
            for (k, (&victim, &d)) in list.iter().zip(dist).enumerate() {
                let _ = write!(out, " {victim}");
                // A group ends where the distance or the victim's node changes.
                let next_node = list.get(k + 1).map(|&v| self.numa[v]);
                if dist.get(k + 1) != Some(&d) || next_node.is_some_and(|n| n != self.numa[victim])
                {
                    let _ = write!(out, " [{d}]");
                    if k + 1 < list.len() {
                        out.push_str(" |");
                    }
                }
            }
            out.push('\n');
        }
        out
    }
}

/// Victims of `thief` and their distances, per the rules of [`VictimOrder`].
fn order_for(
    topo: &Topology,
    cpus: &[usize],
    numa: &[Option<usize>],
    thief: usize,
    cross: bool,
) -> (Vec<usize>, Vec<u64>) {
    let mine = cpus[thief];
    // Key: (another node?, distance).
    let mut cands: Vec<((bool, u64), usize)> = (0..cpus.len())
        .filter(|&v| v != thief && (cross || numa[v] == numa[thief]))
        .map(|v| ((numa[v] != numa[thief], topo.distance(mine, cpus[v])), v))
        .collect();
    // Rule 1: own node first, nearest first; shard order within a distance.
    cands.sort_unstable();
    // Rule 2: rotate each equal-key group to start after the thief.
    let mut start = 0;
    while start < cands.len() {
        let k = cands[start].0;
        let end = start + cands[start..].iter().take_while(|c| c.0 == k).count();
        let group = &mut cands[start..end];
        let after = group.iter().position(|c| c.1 > thief).unwrap_or(0);
        group.rotate_left(after);
        start = end;
    }
    cands.into_iter().map(|((_, d), v)| (v, d)).unzip()
}
