//! `xtc-numa`: the machine's shape, where shards run, and whom they steal from.
//!
//! This crate gives the xtc runtime four things, and knows nothing of tasks, loops or
//! queues:
//!
//! 1. [`Topology`]: the machine as hwloc (through `hwlocality`) sees it: packages, NUMA
//!    nodes, L3 and L2 caches, cores and PUs (hardware threads), which PUs this process may
//!    use, and how far apart two PUs are. It can also be built from an hwloc synthetic
//!    description (`"pack:2 numa:2 l3:1 core:4 pu:2"`) or an XML export, to test
//!    placement for machines you do not have.
//! 2. [`Placement`]: which CPU each of N shards runs on, following a [`Policy`]
//!    (compact, spread, or an explicit CPU list), one shard per physical core before SMT
//!    siblings, allowed CPUs only.
//! 3. [`VictimOrder`]: for each shard, the shards it may steal from, nearest first, with
//!    HPX's NUMA sensitivity (0, 1, 2) deciding who may steal across NUMA nodes.
//! 4. [`pin_current_thread`]: bind the calling thread to its CPU.
//!
//! # Distances
//!
//! [`Topology::distance`] orders pairs of PUs by the deepest level of the machine they
//! share ([`Level`]), strictly increasing:
//!
//! | value | level |
//! | --- | --- |
//! | 0 | the same PU |
//! | 1 | SMT siblings (same core) |
//! | 2 | shared L2 |
//! | 3 | shared L3 |
//! | 4 | same NUMA node |
//! | 5 | same package, another NUMA node |
//! | 6 | another package |
//!
//! When hwloc has a NUMA latency matrix (firmware SLIT, or an XML file that carries one),
//! pairs in different nodes get [`MATRIX_BASE`] (16) plus the matrix latency instead, so
//! cross-node distances follow the matrix and stay above every intra-node level.
//!
//! # Example
//!
//! ```
//! use xtc_numa::{Placement, Policy, Topology, VictimOrder};
//!
//! let topo = Topology::synthetic("pack:2 core:2 pu:2")?;
//! let placement = Placement::new(&topo, 0, &Policy::Compact, false)?; // one per core
//! assert_eq!(placement.cpus(), &[0, 2, 4, 6]);
//! let victims = VictimOrder::new(&topo, &placement, 0)?;
//! assert_eq!(victims.victims(0), &[1, 2, 3]); // same package first
//! # Ok::<(), xtc_numa::Error>(())
//! ```
//!
//! Placement and victim orders are computed once, at executor start, into plain slices;
//! binding runs once per thread that binds itself (each loop, each blocking-pool thread).

mod error;
mod pin;
mod placement;
mod topology;
mod victims;

pub use error::{Error, Result};
pub use pin::{bind_current_thread, pin_current_thread};
pub use placement::{Placement, Policy, MAX_SHARDS_PER_CPU};
pub use topology::{Level, Topology, MATRIX_BASE};
pub use victims::{VictimOrder, DEFAULT_NUMA_SENSITIVITY, MAX_VICTIM_SHARDS};
