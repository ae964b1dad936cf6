//! The machine as hwloc sees it, reduced to what placement and stealing need.
//!
//! A [`Topology`] wraps a [`hwlocality::Topology`] and, once at construction, extracts a
//! per-PU table (core, L2, L3, NUMA node, package) and the NUMA latency matrix if hwloc
//! has one. Every query after construction reads that table, with no hwloc call, except
//! [`Topology::render_tree`], which walks hwloc's tree for its picture; each query's doc gives
//! its cost (a few allocate: the returned `Vec`s, and [`Topology::allowed_cores`]' scratch
//! list).

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use hwlocality::cpu::binding::CpuBindingFlags;
#[cfg(not(miri))]
use hwlocality::object::distance::AddDistancesFlags;
use hwlocality::object::distance::DistancesKind;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
#[cfg(not(miri))]
use hwlocality::topology::export::xml::XMLExportFlags;

use crate::error::{Error, Result};

/// Added to a NUMA latency matrix value to get the distance between two PUs of different
/// NUMA nodes, so that every cross-node distance is larger than every intra-node level
/// ([`Level::NumaNode`] = 4) and larger than the fallback levels 5 and 6 too.
pub const MATRIX_BASE: u64 = 16;

/// How close two PUs are: the deepest level of the machine they share.
///
/// The discriminant is the value [`Topology::distance`] returns when the topology has no
/// NUMA latency matrix. Levels increase strictly with distance: `Pu` (0) < `Core` (1) <
/// `L2` (2) < `L3` (3) < `NumaNode` (4) < `Package` (5) < `Machine` (6).
///
/// Two PUs in different NUMA nodes are never closer than `Package`, even if hwloc reports a
/// cache that spans both nodes: memory locality wins over cache sharing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The same PU (hardware thread).
    Pu = 0,
    /// SMT siblings: two PUs of one physical core.
    Core = 1,
    /// Different cores sharing an L2 cache.
    L2 = 2,
    /// Different L2s sharing an L3 cache.
    L3 = 3,
    /// Same NUMA node, no shared cache hwloc knows of.
    NumaNode = 4,
    /// Same package (socket), different NUMA nodes.
    Package = 5,
    /// Only the machine in common: different packages (or one NUMA node spanning
    /// packages, which hwloc can report).
    Machine = 6,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Pu => "same PU",
            Level::Core => "same core",
            Level::L2 => "shared L2",
            Level::L3 => "shared L3",
            Level::NumaNode => "same NUMA node",
            Level::Package => "same package",
            Level::Machine => "machine",
        })
    }
}

/// Where a topology came from.
#[derive(Debug, Clone)]
enum Source {
    Detected,
    Synthetic(String),
    Xml(PathBuf),
}

impl Source {
    /// What loading a topology from here is, for an error message.
    fn what(&self) -> String {
        match self {
            Source::Detected => "discover this machine".to_owned(),
            Source::Synthetic(d) => format!("load the synthetic topology {d:?}"),
            Source::Xml(p) => format!("load the XML topology {}", p.display()),
        }
    }
}

/// The largest OS index a PU may have: hwloc's CPU sets hold indexes up to `c_int::MAX`.
const MAX_OS_INDEX: usize = std::ffi::c_int::MAX as usize;

/// What we keep of one PU (hardware thread). Indices are hwloc logical indices.
#[derive(Debug, Clone, Copy)]
struct PuInfo {
    os: usize,
    core: Option<usize>,
    l2: Option<usize>,
    l3: Option<usize>,
    numa: Option<usize>,
    package: Option<usize>,
}

/// A machine topology: packages, NUMA nodes, caches, cores and PUs (hardware threads).
///
/// Build it from the real machine ([`Topology::detect`]), from an hwloc synthetic
/// description ([`Topology::synthetic`], for tests) or from an hwloc XML export
/// ([`Topology::from_xml`]). CPUs are always named by their OS index (the number
/// `taskset` and `/proc/cpuinfo` use); cores and NUMA nodes by their hwloc logical index.
///
/// `Topology` is `Send + Sync`; queries take `&self` and read tables built once by the
/// constructor.
pub struct Topology {
    /// Under Miri, which cannot call hwloc (C), there is no hwloc tree: [`Topology::detect`]
    /// builds the table alone there.
    #[cfg(not(miri))]
    hw: hwlocality::Topology,
    source: Source,
    /// Sorted by OS index.
    pus: Vec<PuInfo>,
    /// Allowed PUs, OS indices, sorted.
    allowed: Vec<usize>,
    packages: usize,
    numa_nodes: usize,
    cores: usize,
    /// `numa_nodes * numa_nodes` latencies (sender-major, by logical index), if hwloc has
    /// a complete NUMA latency matrix.
    matrix: Option<Vec<u64>>,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("source", &self.source)
            .field("packages", &self.packages)
            .field("numa_nodes", &self.numa_nodes)
            .field("cores", &self.cores)
            .field("pus", &self.pus.len())
            .field("allowed_pus", &self.allowed)
            .field("numa_matrix", &self.matrix)
            .finish()
    }
}

/// Run an hwlocality call that may panic on errno values it does not expect (it treats
/// them as unreachable), turning such a panic into [`Error::Hwloc`]: user input must not
/// panic.
fn guarded<T>(
    what: &str,
    hint: &'static str,
    f: impl FnOnce() -> Result<T> + std::panic::UnwindSafe,
) -> Result<T> {
    std::panic::catch_unwind(f).unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "hwlocality panicked".to_owned());
        Err(Error::hwloc(what, detail, hint))
    })
}

fn same<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
    matches!((a, b), (Some(x), Some(y)) if x == y)
}

/// [`Topology::detect`]'s refusal of a topology that hwloc, told so by the environment
/// (`vars`, as `NAME=value` pairs), describes for another machine than this one.
#[cfg(not(miri))]
/// A variable's value read as C's `atoi` reads it, as hwloc reads `HWLOC_THISSYSTEM`: leading
/// whitespace, an optional sign, then digits up to the first other character (none: 0).
fn atoi(v: &str) -> i64 {
    let v = v.trim_start();
    let (neg, digits) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let n = digits
        .bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0i64, |n, d| {
            n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
    if neg {
        -n
    } else {
        n
    }
}

fn not_this_system(vars: &str) -> Error {
    let vars = if vars.is_empty() {
        "hwloc's environment"
    } else {
        vars
    };
    Error::hwloc(
        "discover this machine",
        format!(
            "hwloc describes another machine than this one ({vars}), on which pinning threads \
             would silently do nothing"
        ),
        "unset those HWLOC_ variables (HWLOC_SYNTHETIC, HWLOC_XMLFILE, HWLOC_FSROOT, a \
         HWLOC_THISSYSTEM of 0) to use this machine, or set HWLOC_THISSYSTEM=1 if they describe \
         this machine; for a what-if topology use Topology::synthetic (the demo's --synthetic)",
    )
}

impl Topology {
    /// Discover the machine this process runs on.
    ///
    /// The allowed PUs are hwloc's allowed cpuset (cgroups) intersected with the calling
    /// thread's affinity mask (`sched_getaffinity`), read now: call this before pinning
    /// the calling thread, or its pin will be taken for the process's limit.
    ///
    /// Cost: one full hwloc discovery (reads sysfs; about a millisecond to tens of
    /// milliseconds on big machines). Build it once and share it.
    ///
    /// Under Miri (`cfg(miri)`), which cannot call hwloc, it builds a flat machine instead: one
    /// package and one NUMA node over one single-PU core per CPU of the thread's affinity.
    ///
    /// hwloc reads `HWLOC_SYNTHETIC` and `HWLOC_XMLFILE` from the environment and then
    /// describes that machine instead of this one; threads "pinned" on such a topology are not
    /// pinned at all (hwloc's binding calls succeed and do nothing). So a topology that hwloc
    /// says is not this system is refused, unless `HWLOC_THISSYSTEM=1` says it is (hwloc then
    /// binds on this machine's CPUs by the described numbers); an `HWLOC_SYNTHETIC`
    /// description is checked as [`Topology::synthetic`] checks one first (some descriptions
    /// make hwloc abort the process, or build for minutes). For a what-if topology, call
    /// [`Topology::synthetic`].
    ///
    /// # Errors
    ///
    /// [`Error::Hwloc`] if hwloc cannot discover the machine, if the environment makes it
    /// describe another machine (above), if `HWLOC_SYNTHETIC` holds a description that
    /// [`Topology::synthetic`] refuses, or if `HWLOC_XMLFILE` names a file that
    /// [`Topology::from_xml`] would refuse to read (over 64 MiB, not UTF-8, unreadable, an
    /// object without its CPU or node sets): checked before hwloc, which reads the whole file
    /// however large. Each names the variable.
    #[cfg(not(miri))]
    pub fn detect() -> Result<Topology> {
        let this_system =
            std::env::var_os("HWLOC_THISSYSTEM").is_some_and(|v| atoi(&v.to_string_lossy()) != 0);
        if let Some(desc) = std::env::var_os("HWLOC_SYNTHETIC").filter(|d| !d.is_empty()) {
            let desc = desc.to_string_lossy().into_owned();
            if !this_system {
                return Err(not_this_system(&format!("HWLOC_SYNTHETIC={desc:?}")));
            }
            // Checked before hwloc reads it: the descriptions it aborts on are refused here,
            // with the variable named (the error of `synthetic` alone did not say where the
            // description came from).
            Self::synthetic(&desc).map_err(|e| {
                Error::hwloc(
                    format!("use HWLOC_SYNTHETIC={desc:?}"),
                    e,
                    "fix HWLOC_SYNTHETIC, or unset it to use this machine's topology",
                )
            })?;
        }
        if let Some(path) = std::env::var_os("HWLOC_XMLFILE").filter(|p| !p.is_empty()) {
            let shown = format!("HWLOC_XMLFILE={:?}", path.to_string_lossy());
            // Refused before hwloc reads the file, which it reads whole, however large (a
            // wrong path, `/dev/zero`, was read until memory ran out): not this machine
            // unless `HWLOC_THISSYSTEM=1` says so, and then the file must pass the checks
            // `from_xml` makes (size cap, UTF-8).
            if !this_system {
                return Err(not_this_system(&shown));
            }
            let hint = "point HWLOC_XMLFILE at an lstopo XML export, or unset it";
            let xml = read_xml(Path::new(&path))
                .map_err(|e| Error::hwloc(format!("use {shown}"), e, hint))?;
            if let Some(problem) = xml_missing_sets(&xml) {
                return Err(Error::hwloc(format!("use {shown}"), problem, hint));
            }
        }
        let hw = hwlocality::Topology::new().map_err(|e| {
            Error::hwloc(
                "discover this machine",
                e,
                "check that libhwloc 2.8 or later is installed and /sys is readable",
            )
        })?;
        if !hw.is_this_system() {
            // Whichever of hwloc's variables did it (`HWLOC_XMLFILE`, `HWLOC_FSROOT`, ...).
            let set: Vec<String> = std::env::vars_os()
                .filter_map(|(k, v)| {
                    let k = k.to_string_lossy().into_owned();
                    let v = v.to_string_lossy();
                    // `HWLOC_THISSYSTEM=0` says it by itself; set to true it is no cause.
                    (k.starts_with("HWLOC_") && (k != "HWLOC_THISSYSTEM" || atoi(&v) == 0))
                        .then(|| format!("{k}={v:?}"))
                })
                .collect();
            return Err(not_this_system(&set.join(", ")));
        }
        Self::build(hw, Source::Detected)
    }

    /// Build a topology from an hwloc synthetic description, for tests and what-if runs.
    ///
    /// The description lists levels from the top, each `type:count`, e.g.
    /// `"pack:2 numa:2 l3:1 core:4 pu:2"` (2 packages, each with 2 NUMA nodes, each with
    /// one L3 over 4 cores of 2 PUs: 32 PUs). PU OS indices are 0.. in tree order. Every PU
    /// is allowed. Threads cannot be pinned with it ([`Topology::is_synthetic`]).
    ///
    /// Cost: builds the tree in memory, microseconds per object.
    ///
    /// # Errors
    ///
    /// [`Error::Hwloc`] if hwloc rejects the description, or if it describes more than 8,192
    /// PUs, a level of more than 1,024 objects under one parent, more than 8,192 NUMA nodes
    /// attached with `[numa]` blocks, or names an OS index
    /// (`indexes=`) of 8,192 or more, or more than 24,576 objects over all its levels: hwloc
    /// would spend seconds to minutes and gigabytes building it (it inserts siblings one at a
    /// time: `pu:4096` took 0.9 s here, `pu:16384` 42 s, and 16,384 PUs in small groups
    /// 0.4 s). Real machines stay far below these. [`Error::Hwloc`] for more than 32 levels:
    /// hwloc 2.9 overflows its level array on 126 levels without a NUMA level.
    /// [`Error::Hwloc`] too for a level of memory-side caches (`memcache:2`), which hwloc
    /// parses and then aborts the process on while building it, and for an `indexes=`
    /// interleaving pattern by type (`indexes=core:pack`), or by `step*count` loops whose
    /// counts multiply to a multiple of 2^64, on which hwloc aborts the process too: list the
    /// indexes (`indexes=0,2,1,3`) or give `step*count` loops (`indexes=2*2:1*2`).
    /// [`Error::Hwloc`] as well for a PU level whose `indexes=` list names an OS index twice
    /// (`pu:2(indexes=0,0)`), of which hwloc silently built fewer PUs than described, or whose
    /// list has fewer indexes than PUs (`pack:2 pu:2(indexes=1,0)`), which hwloc silently
    /// ignored (of a longer list it uses the first entries, one per PU, as given), and for a
    /// level with two `indexes=` lists (hwloc uses the last) or a list with an empty entry
    /// (`indexes=0,,1`, which hwloc drops).
    pub fn synthetic(desc: &str) -> Result<Topology> {
        let what = format!("load the synthetic topology {desc:?}");
        let hint =
            "write levels from the top as type:count, e.g. \"pack:2 numa:2 l3:1 core:4 pu:2\"";
        // hwloc builds every object of the description: a few huge counts ran for minutes and
        // ended in an out-of-memory kill, which no error handling survives.
        let Shape {
            pus: objects,
            widest,
            attached,
            levels,
            total,
            memcache,
            pu_attrs,
        } = synthetic_leaves(desc);
        // hwloc parses a memory-side cache level, then aborts the process on an assertion
        // while it builds the tree (hwloc 2.9): refused before hwloc sees it.
        if let Some(level) = memcache {
            return Err(Error::hwloc(
                &what,
                format!(
                    "its level {level:?} is a memory-side cache, which hwloc cannot build in a \
                     synthetic topology (it aborts the process)"
                ),
                "leave memory-side caches out: use levels such as pack, numa, l3, l2, core and pu",
            ));
        }
        if objects > MAX_SYNTHETIC_PUS {
            // A negative count saturates (hwloc's `strtoul` reads `-1` as nearly 2^64): the
            // 39-digit total named nothing the user wrote.
            let described = if objects == u128::MAX {
                "more PUs than can be counted (a count is negative, which hwloc reads as nearly \
                 2^64, or far too large)"
                    .to_owned()
            } else {
                format!("{objects} PUs")
            };
            return Err(Error::hwloc(
                &what,
                format!(
                    "it describes {described}, more than the {MAX_SYNTHETIC_PUS} a synthetic \
                     topology may have"
                ),
                "use smaller counts; real machines have a few thousand PUs at most",
            ));
        }
        // hwloc's cost grows with the square of a level's width as well.
        if widest > MAX_SYNTHETIC_ARITY {
            return Err(Error::hwloc(
                &what,
                format!(
                    "one of its levels has {widest} objects under each parent, more than the \
                     {MAX_SYNTHETIC_ARITY} a synthetic topology may have"
                ),
                "split the level in two, e.g. \"core:4096 pu:1\" as \"numa:4 core:1024 pu:1\"",
            ));
        }
        // hwloc 2.9 writes past the end of its level array for a description of 126 levels
        // without a NUMA level (a heap overflow: the process aborts, or its heap is corrupt),
        // and no real machine has more than about 16.
        if levels > MAX_SYNTHETIC_LEVELS {
            return Err(Error::hwloc(
                &what,
                format!(
                    "it has {levels} levels, more than the {MAX_SYNTHETIC_LEVELS} a synthetic \
                     topology may have"
                ),
                "leave out levels of one object each (group:1); real machines have fewer than 16",
            ));
        }
        // NUMA nodes attached with `[numa]` (one per object of the level before the block)
        // cost hwloc as much: 16,000 took 11 s, and each is 7 bytes of description.
        if attached > MAX_SYNTHETIC_PUS {
            return Err(Error::hwloc(
                &what,
                format!(
                    "its [numa] blocks attach {attached} NUMA nodes, more than the \
                     {MAX_SYNTHETIC_PUS} a synthetic topology may have"
                ),
                "attach fewer NUMA nodes (each [numa] adds one under every object of the level \
                 before it), or make them a level, e.g. \"pack:2 numa:2 core:4 pu:2\"",
            ));
        }
        // Every object costs hwloc a walk of its siblings: levels of one object under a wide
        // one (`pack:8 core:1024 group:1 ... pu:1`) pass the bounds above and took minutes.
        if total > MAX_SYNTHETIC_OBJECTS {
            return Err(Error::hwloc(
                &what,
                format!(
                    "it describes {total} objects over all its levels, more than the \
                     {MAX_SYNTHETIC_OBJECTS} a synthetic topology may have"
                ),
                "leave out levels of one object each (group:1), or use smaller counts",
            ));
        }
        // And every object's CPU set is as large as the largest OS index named.
        let index = synthetic_max_index(desc);
        if index >= MAX_SYNTHETIC_PUS {
            return Err(Error::hwloc(
                &what,
                format!(
                    "it names OS index {index}; a synthetic topology's indexes stay below \
                     {MAX_SYNTHETIC_PUS}"
                ),
                "use smaller indexes; real machines number their PUs below a few thousand",
            ));
        }
        // hwloc uses the last `indexes=` of an attribute block, and drops a list with an
        // empty entry without a word: the checks below read the first list, and a second one
        // (or a gap) built a machine other than the one checked, silently.
        if let Some(problem) = ambiguous_indexes(desc) {
            return Err(Error::hwloc(
                &what,
                format!("its {problem}; hwloc would build another machine than described"),
                "give each level at most one indexes= list, with no empty entry, e.g. \
                 \"core:2 pu:2(indexes=0,2,1,3)\"",
            ));
        }
        // Two PUs with one OS index are one CPU: hwloc merged them (and the objects above them
        // whose CPU sets then matched) or reported invalid information from the operating
        // system and built a mangled tree, silently smaller than described.
        if let Some(index) = pu_attrs.and_then(|a| repeated_index(a, objects)) {
            return Err(Error::hwloc(
                &what,
                format!(
                    "its PU level's indexes= list names OS index {index} twice; hwloc would \
                     merge those PUs and build a smaller machine than described"
                ),
                "give every PU its own OS index, e.g. indexes=0,2,1,3",
            ));
        }
        // hwloc takes an explicit list only with an index for every PU (it uses the first that
        // many), and silently ignores a shorter one: the machine came out numbered 0, 1, 2, ...
        if let Some(listed) = pu_attrs.and_then(listed_indexes) {
            if listed < objects {
                return Err(Error::hwloc(
                    &what,
                    format!(
                        "its PU level's indexes= list has {listed} entries for {objects} PUs; \
                         hwloc would ignore it and number the PUs 0 to {} instead",
                        objects.saturating_sub(1)
                    ),
                    "give one OS index per PU of the whole machine, e.g. \
                     \"core:2 pu:2(indexes=0,2,1,3)\"",
                ));
            }
        }
        // hwloc asserts on (and so aborts the process for) some interleaved index patterns.
        if let Some(indexes) = synthetic_unsafe_interleave(desc) {
            return Err(Error::hwloc(
                &what,
                format!(
                    "its indexes={indexes} is an interleaving pattern that hwloc cannot build (it \
                     aborts the process, or reads memory it never set)"
                ),
                "list the OS indexes instead, e.g. indexes=0,2,1,3, or give step*count loops \
                 whose counts multiply to the level's width, e.g. indexes=2*2:1*2",
            ));
        }
        let hw = guarded(&what, hint, || {
            hwlocality::Topology::builder()
                .from_synthetic(desc)
                .map_err(|e| Error::hwloc(&what, e, hint))?
                .build()
                .map_err(|e| Error::hwloc(&what, e, hint))
        })?;
        Self::build(hw, Source::Synthetic(desc.to_owned()))
    }

    /// Load a topology exported by hwloc as XML (`lstopo file.xml`, or
    /// [`Topology::export_xml`]).
    ///
    /// Such a topology describes some machine, not necessarily this one, so it is treated
    /// like a synthetic one: every PU it marks allowed is allowed, and pinning is refused.
    ///
    /// Cost: reads and parses the file (about 20 ms per 1,000 PUs).
    ///
    /// # Errors
    ///
    /// [`Error::XmlFile`] if the file cannot be read, is not UTF-8, or is larger than
    /// 64 MiB (an `lstopo` export of 8,192 PUs is about 5 MiB; the cap keeps a wrong path
    /// such as `/dev/zero` from reading until memory runs out); [`Error::Hwloc`] if hwloc
    /// cannot parse it, if it gives a PU an OS index above 2^31 − 1 (more than a CPU set
    /// holds), if it gives two PUs the same OS index, or if an object lacks one of its CPU or
    /// node sets (`complete_cpuset`, ...), on which hwloc 2.9 crashes instead of failing.
    /// hwloc (up to 2.14) has other crash bugs on malformed XML: treat the file as trusted
    /// input, as an `lstopo` export is.
    ///
    /// A build of `hwlocality` with debug assertions runs hwloc's consistency check on every
    /// topology it loads, which aborts the process (no `Err`, no panic) on a file whose
    /// objects disagree (a hand-edited PU index); in a debug profile, build it without them:
    /// `[profile.dev.package.hwlocality] debug-assertions = false`, as this workspace does.
    pub fn from_xml(path: impl AsRef<Path>) -> Result<Topology> {
        let path = path.as_ref();
        let xml = read_xml(path).map_err(|source| Error::XmlFile {
            path: path.to_owned(),
            source,
        })?;
        let what = format!("load the XML topology {}", path.display());
        let hint = "give a file written by `lstopo file.xml` or Topology::export_xml";
        if let Some(problem) = xml_missing_sets(&xml) {
            return Err(Error::hwloc(&what, problem, hint));
        }
        let hw = guarded(&what, hint, || {
            hwlocality::Topology::builder()
                .from_xml(&xml)
                .map_err(|e| Error::hwloc(&what, e, hint))?
                .build()
                .map_err(|e| Error::hwloc(&what, e, hint))
        })?;
        Self::build(hw, Source::Xml(path.to_owned()))
    }

    /// Extract the PU table, counts, allowed set and NUMA matrix.
    fn build(hw: hwlocality::Topology, source: Source) -> Result<Topology> {
        // hwlocality panics on a CPU set index above `c_int::MAX` (a caller's bug, to it), and
        // hwloc keeps the OS index an XML file gives a PU even where the PU's CPU set says
        // otherwise: such a PU is refused before any CPU set lookup below.
        if let Some(os) = hw
            .objects_with_type(ObjectType::PU)
            .filter_map(|pu| pu.os_index())
            .find(|&os| os > MAX_OS_INDEX)
        {
            return Err(Error::hwloc(
                source.what(),
                format!(
                    "a PU has OS index {os}, above {MAX_OS_INDEX}, the largest a CPU set holds"
                ),
                "give a file written by `lstopo file.xml` or Topology::export_xml",
            ));
        }
        let numa_objs: Vec<&TopologyObject> = hw.objects_with_type(ObjectType::NUMANode).collect();
        let mut pus: Vec<PuInfo> = hw
            .objects_with_type(ObjectType::PU)
            .filter_map(|pu| {
                let os = pu.os_index()?;
                let logical = |ty| pu.first_ancestor_with_type(ty).map(|o| o.logical_index());
                let numa = numa_objs
                    .iter()
                    .find(|n| n.cpuset().is_some_and(|set| set.is_set(os)))
                    .map(|n| n.logical_index());
                Some(PuInfo {
                    os,
                    core: logical(ObjectType::Core),
                    l2: logical(ObjectType::L2Cache),
                    l3: logical(ObjectType::L3Cache),
                    numa,
                    package: logical(ObjectType::Package),
                })
            })
            .collect();
        pus.sort_by_key(|p| p.os);
        // hwloc keeps the OS indexes an XML file gives too when two PUs share one: that CPU was
        // listed twice among the allowed ones, and placements put two shards on it without
        // oversubscription.
        if let Some(w) = pus.windows(2).find(|w| w[0].os == w[1].os) {
            return Err(Error::hwloc(
                source.what(),
                format!("two PUs have OS index {}; every PU needs its own", w[0].os),
                "give a file written by `lstopo file.xml` or Topology::export_xml",
            ));
        }

        let hw_allowed = hw.allowed_cpuset();
        let mut allowed: Vec<usize> = pus
            .iter()
            .map(|p| p.os)
            .filter(|&os| hw_allowed.is_set(os))
            .collect();
        if matches!(source, Source::Detected) {
            match hw.cpu_binding(CpuBindingFlags::THREAD) {
                Ok(mask) => allowed.retain(|&os| mask.is_set(os)),
                Err(e) => tracing::warn!(
                    error = %e,
                    "cannot read this thread's CPU affinity; using hwloc's allowed cpuset alone"
                ),
            }
        }

        let numa_nodes = numa_objs.len();
        let matrix = Self::numa_matrix(&hw, numa_nodes);
        let packages = hw.objects_with_type(ObjectType::Package).len();
        // A PU that hwloc puts under no Core is a core of its own (as `allowed_cores` and
        // placement count it): a machine without a Core level has as many cores as PUs.
        let cores = hw.objects_with_type(ObjectType::Core).len()
            + pus.iter().filter(|p| p.core.is_none()).count();
        let topo = Topology {
            packages,
            numa_nodes,
            cores,
            pus,
            allowed,
            matrix,
            source,
            #[cfg(not(miri))]
            hw,
        };
        tracing::debug!(topology = ?topo, "topology built");
        Ok(topo)
    }

    /// The last complete NUMA latency matrix hwloc has (bandwidth matrices are skipped:
    /// there a larger value means nearer). hwloc keeps every matrix added, in the order added
    /// (an XML export keeps that order), so the newest one, from
    /// [`Topology::with_numa_distances`], wins over the firmware's or an earlier one.
    fn numa_matrix(hw: &hwlocality::Topology, nodes: usize) -> Option<Vec<u64>> {
        if nodes < 2 {
            return None;
        }
        let all = match hw.distances(None) {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read hwloc distance matrices; using levels");
                return None;
            }
        };
        for d in all.iter().rev() {
            if d.kind().contains(DistancesKind::MEANS_BANDWIDTH) {
                continue;
            }
            let objs: Vec<Option<&TopologyObject>> = d.objects().collect();
            let all_numa = objs
                .iter()
                .all(|o| o.is_some_and(|o| o.object_type() == ObjectType::NUMANode));
            if !all_numa || objs.len() != nodes {
                continue;
            }
            let k = objs.len();
            let values = d.distances();
            let mut matrix = vec![0; nodes * nodes];
            for (i, oi) in objs.iter().flatten().enumerate() {
                for (j, oj) in objs.iter().flatten().enumerate() {
                    matrix[oi.logical_index() * nodes + oj.logical_index()] = values[i * k + j];
                }
            }
            return Some(matrix);
        }
        None
    }

    /// [`with_numa_distances`](Self::with_numa_distances)'s check of the matrix's shape: one
    /// row and column per NUMA node, and at least 2 nodes.
    fn check_distance_matrix(&self, matrix: &[u64]) -> Result<()> {
        let n = self.numa_nodes;
        if n < 2 || matrix.len() != n * n {
            return Err(Error::BadDistanceMatrix {
                nodes: n,
                expected: n * n,
                given: matrix.len(),
            });
        }
        Ok(())
    }

    /// Attach a NUMA latency matrix to this topology, as firmware (ACPI SLIT) would.
    ///
    /// `matrix` has `numa_nodes()²` values in sender-major order by NUMA logical index:
    /// `matrix[i * n + j]` is the latency from node `i` to node `j` (e.g. 10 on the
    /// diagonal, 20 or 30 elsewhere). It replaces any matrix the topology had (from
    /// firmware, an XML file or an earlier call) for [`Topology::distance`]. Useful to test
    /// [`Topology::distance`] and to write XML fixtures with [`Topology::export_xml`].
    ///
    /// Cost: one hwloc topology edit and a rebuild of the PU table.
    ///
    /// # Errors
    ///
    /// [`Error::BadDistanceMatrix`] if the size is wrong or the topology has fewer than 2
    /// NUMA nodes; [`Error::Hwloc`] if hwloc refuses the matrix.
    #[cfg(not(miri))]
    pub fn with_numa_distances(mut self, matrix: &[u64]) -> Result<Topology> {
        self.check_distance_matrix(matrix)?;
        let values = matrix.to_vec();
        let res = self.hw.edit(move |editor| {
            // The name is `None`: hwlocality 1.0.0-alpha.13 stores a dangling name
            // otherwise, which breaks XML export.
            editor.add_distances(
                None,
                DistancesKind::FROM_USER | DistancesKind::MEANS_LATENCY,
                AddDistancesFlags::empty(),
                move |topo| {
                    let nodes = topo
                        .objects_with_type(ObjectType::NUMANode)
                        .map(Some)
                        .collect();
                    (nodes, values)
                },
            )
        });
        res.map_err(|e| {
            Error::hwloc(
                "add a NUMA distance matrix",
                e,
                "give positive latencies, one row per NUMA node",
            )
        })?;
        let Topology {
            hw,
            source,
            allowed,
            ..
        } = self;
        let mut t = Self::build(hw, source)?;
        // The allowed PUs stay those read when the topology was built (`detect`: the thread's
        // affinity then). Rebuilt, they were read again from the calling thread's affinity: on
        // a thread pinned since, `detect().with_numa_distances(..)` allowed that one CPU, and a
        // placement of more shards failed. A distance matrix changes no PU.
        t.allowed = allowed;
        Ok(t)
    }

    /// Write this topology as hwloc XML, loadable with [`Topology::from_xml`] or `lstopo -i`.
    ///
    /// Cost: serializes the whole tree and writes one file.
    ///
    /// # Errors
    ///
    /// [`Error::Hwloc`] if the path is not valid UTF-8 or cannot be written.
    #[cfg(not(miri))]
    pub fn export_xml(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        self.hw
            .export_xml_file(Some(path), XMLExportFlags::empty())
            .map_err(|e| {
                Error::hwloc(
                    format!("export XML to {}", path.display()),
                    e,
                    "check that the path is UTF-8 and its folder is writable",
                )
            })
    }

    /// True when this topology is not the running machine: synthetic or loaded from XML.
    ///
    /// Threads cannot be pinned with such a topology ([`crate::pin_current_thread`]
    /// returns [`Error::SyntheticBind`]). Cost: none.
    pub fn is_synthetic(&self) -> bool {
        !matches!(self.source, Source::Detected)
    }

    /// Number of packages (sockets). Cost: none.
    pub fn packages(&self) -> usize {
        self.packages
    }

    /// Number of NUMA nodes (at least 1 on any real machine). Cost: none.
    pub fn numa_nodes(&self) -> usize {
        self.numa_nodes
    }

    /// Number of physical cores hwloc reports, allowed by the thread's affinity or not; a PU
    /// that hwloc places under no core counts as a core of its own (as in
    /// [`Topology::allowed_cores`]). On a detected machine hwloc leaves out the CPUs the
    /// process's cgroup (`cpuset.cpus`) excludes: they are not counted. Cost: none.
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// OS indices of the PUs (hardware threads) hwloc reports, sorted: on a detected machine,
    /// those the process's cgroup allows (whatever the thread's affinity; see
    /// [`Topology::allowed_pus`]). Cost: one `Vec` allocation.
    pub fn pus(&self) -> Vec<usize> {
        self.pus.iter().map(|p| p.os).collect()
    }

    /// OS indices of the PUs this process may run on, sorted.
    ///
    /// On the real machine: hwloc's allowed cpuset intersected with the affinity mask read
    /// by [`Topology::detect`], so `taskset -c 1` restricts it. Synthetic and XML
    /// topologies: every PU hwloc marks allowed (all, for synthetic ones).
    /// Cost: one `Vec` allocation.
    pub fn allowed_pus(&self) -> Vec<usize> {
        self.allowed.clone()
    }

    /// Whether this process may run on the PU with this OS index. Cost: a binary search.
    pub fn is_allowed(&self, pu: usize) -> bool {
        self.allowed.binary_search(&pu).is_ok()
    }

    /// Number of physical cores with at least one allowed PU.
    ///
    /// A PU that hwloc places under no core counts as a core of its own.
    /// Cost: one pass over the allowed PUs (a binary search each), and a scratch list of one
    /// entry per allowed PU, sorted.
    pub fn allowed_cores(&self) -> usize {
        let mut keys: Vec<(bool, usize)> = self
            .allowed
            .iter()
            .filter_map(|&os| self.info(os))
            .map(|p| p.core.map_or((false, p.os), |c| (true, c)))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }

    /// Logical index of the NUMA node holding this PU (OS index), or `None` for an unknown
    /// PU, and for one whose memory node hwloc left out (a cgroup's `cpuset.mems` that
    /// excludes it, as `docker --cpuset-mems`): such PUs form one group of their own for
    /// [`crate::Placement`] and [`crate::VictimOrder`]. Cost: a binary search.
    pub fn numa_node_of(&self, pu: usize) -> Option<usize> {
        self.info(pu)?.numa
    }

    /// Logical index of the physical core holding this PU (OS index), or `None` for an
    /// unknown PU or one hwloc places under no core. Cost: a binary search.
    pub fn core_of(&self, pu: usize) -> Option<usize> {
        self.info(pu)?.core
    }

    /// Logical index of the package holding this PU (OS index), or `None`. Cost: a binary
    /// search.
    pub fn package_of(&self, pu: usize) -> Option<usize> {
        self.info(pu)?.package
    }

    /// Whether this topology carries a NUMA latency matrix that [`Topology::distance`]
    /// uses across nodes. Cost: none.
    pub fn has_numa_matrix(&self) -> bool {
        self.matrix.is_some()
    }

    /// The deepest level of the machine two PUs (OS indices) share, or `None` if either is
    /// unknown. Cost: two binary searches.
    pub fn level(&self, a: usize, b: usize) -> Option<Level> {
        let (pa, pb) = (self.info(a)?, self.info(b)?);
        // Packages count as shared when hwloc has no package level (both `None`).
        let same_package = pa.package == pb.package;
        let level = if a == b {
            Level::Pu
        } else if pa.numa != pb.numa {
            // Memory locality wins over any cache hwloc reports across nodes.
            if same_package {
                Level::Package
            } else {
                Level::Machine
            }
        } else if same(pa.core, pb.core) {
            Level::Core
        } else if same(pa.l2, pb.l2) {
            Level::L2
        } else if same(pa.l3, pb.l3) {
            Level::L3
        } else if same_package {
            Level::NumaNode
        } else {
            // One NUMA node over several packages: only the machine is common.
            Level::Machine
        };
        Some(level)
    }

    /// How far apart two PUs (OS indices) are; smaller is nearer, `distance(a, a) == 0`.
    ///
    /// - Without a NUMA latency matrix: the [`Level`] they share, as a number: 0 same PU,
    ///   1 SMT siblings, 2 shared L2, 3 shared L3, 4 same NUMA node, 5 same package,
    ///   6 different packages.
    /// - With one ([`Topology::has_numa_matrix`]): within a NUMA node the same levels 0..=4
    ///   (or 6 for PUs of one node in different packages, as without a matrix);
    ///   across nodes [`MATRIX_BASE`] (16) plus the matrix latency from `a`'s node to `b`'s,
    ///   so every cross-node distance is above every intra-node one and the matrix order
    ///   is kept.
    /// - `u64::MAX` if either PU is not in the topology.
    ///
    /// Cost: two binary searches, and for PUs of different NUMA nodes with a matrix two more
    /// and a matrix lookup; no allocation.
    pub fn distance(&self, a: usize, b: usize) -> u64 {
        let Some(level) = self.level(a, b) else {
            return u64::MAX;
        };
        if level > Level::NumaNode {
            if let (Some(m), Some(na), Some(nb)) =
                (&self.matrix, self.numa_node_of(a), self.numa_node_of(b))
            {
                if na == nb {
                    return level as u64;
                }
                if let Some(&v) = m.get(na * self.numa_nodes + nb) {
                    return MATRIX_BASE.saturating_add(v);
                }
            }
        }
        level as u64
    }

    fn info(&self, pu: usize) -> Option<&PuInfo> {
        self.pus
            .binary_search_by_key(&pu, |p| p.os)
            .ok()
            .map(|i| &self.pus[i])
    }

    /// An `lstopo`-like text tree: Machine, Package, Group, NUMANode, L3, L2, Core, PU,
    /// with logical (`L#`) and OS (`P#`) indices; PUs outside this thread's affinity are
    /// marked (those the cgroup excludes are not in the tree at all).
    /// The NUMA latency matrix, if any, follows the tree.
    ///
    /// Cost: walks the hwloc tree once; allocates the string. For humans and logs.
    pub fn render_tree(&self) -> String {
        let mut out = String::new();
        let source = match &self.source {
            Source::Detected => "this machine".to_owned(),
            Source::Synthetic(d) => format!("synthetic {d:?}"),
            Source::Xml(p) => format!("XML {}", p.display()),
        };
        // "1 package", "2 packages".
        let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let _ = writeln!(
            out,
            "Machine ({source}): {}, {}, {}, {}, {} allowed",
            count(self.packages, "package"),
            count(self.numa_nodes, "NUMA node"),
            count(self.cores, "core"),
            count(self.pus.len(), "PU"),
            self.allowed.len()
        );
        #[cfg(not(miri))]
        let root = self.hw.root_object();
        #[cfg(not(miri))]
        for child in root.memory_children().chain(root.normal_children()) {
            self.render_object(child, 1, &mut out);
        }
        #[cfg(miri)]
        self.render_flat(&mut out);
        if let Some(m) = &self.matrix {
            let n = self.numa_nodes;
            let _ = writeln!(out, "NUMA latency matrix (from row node to column node):");
            let _ = write!(out, "      ");
            for j in 0..n {
                let _ = write!(out, " {:>5}", format!("N{j}"));
            }
            out.push('\n');
            for i in 0..n {
                let _ = write!(out, "  {:>4}", format!("N{i}"));
                for j in 0..n {
                    let _ = write!(out, " {:>5}", m[i * n + j]);
                }
                out.push('\n');
            }
        }
        out
    }

    #[cfg(not(miri))]
    fn render_object(&self, obj: &TopologyObject, depth: usize, out: &mut String) {
        let indent = "  ".repeat(depth);
        let li = obj.logical_index();
        let os = obj
            .os_index()
            .map(|p| format!(" P#{p}"))
            .unwrap_or_default();
        let label = match obj.object_type() {
            ObjectType::Package => format!("Package L#{li}{os}"),
            ObjectType::NUMANode => format!("NUMANode L#{li}{os}"),
            ObjectType::L3Cache => format!("L3 L#{li}"),
            ObjectType::L2Cache => format!("L2 L#{li}"),
            ObjectType::L1Cache => format!("L1d L#{li}"),
            ObjectType::Core => format!("Core L#{li}{os}"),
            ObjectType::PU => {
                let note = match obj.os_index() {
                    Some(p) if !self.is_allowed(p) => " (not allowed)",
                    _ => "",
                };
                format!("PU L#{li}{os}{note}")
            }
            other => format!("{other} L#{li}{os}"),
        };
        let _ = writeln!(out, "{indent}{label}");
        for child in obj.memory_children().chain(obj.normal_children()) {
            self.render_object(child, depth + 1, out);
        }
    }
}

#[cfg(not(miri))]
impl Topology {
    /// The wrapped hwloc topology, for binding.
    pub(crate) fn hw(&self) -> &hwlocality::Topology {
        &self.hw
    }
}

/// Miri interprets the program and cannot call into C, so nothing of hwloc runs under it:
/// every multi-shard executor builds a topology with [`Topology::detect`], and stopped there
/// with "unsupported operation" (`scripts/miri`). Under `cfg(miri)` only, `detect` builds a
/// flat machine in Rust instead, from the CPUs Miri gives the calling thread, so the runtime's
/// rings, stealing and cross-shard code run under Miri. What needs hwloc's tree itself
/// (`with_numa_distances`, `export_xml`) fails there with [`Error::Hwloc`]; `synthetic` and
/// `from_xml` still call hwloc, where Miri stops as before.
#[cfg(miri)]
impl Topology {
    /// Under Miri: a flat machine, one package and one NUMA node over one core per CPU the
    /// calling thread may run on (`sched_getaffinity`, which Miri models: as many CPUs as
    /// `-Zmiri-num-cpus`, 1 by default), each core a single PU without caches, every one
    /// allowed. It is this machine as Miri shows it, not a synthetic one: shard threads are
    /// bound to its CPUs ([`crate::pin_current_thread`], `sched_setaffinity` under Miri).
    ///
    /// # Errors
    ///
    /// None under Miri; the signature is the real one's.
    pub fn detect() -> Result<Topology> {
        Ok(Self::flat(miri_cpus()))
    }

    /// A topology of one package and one NUMA node over one single-PU core per CPU of `cpus`
    /// (OS indices, sorted, distinct), all allowed: core `i` holds the `i`-th CPU.
    fn flat(cpus: Vec<usize>) -> Topology {
        let pus = cpus
            .iter()
            .enumerate()
            .map(|(core, &os)| PuInfo {
                os,
                core: Some(core),
                l2: None,
                l3: None,
                numa: Some(0),
                package: Some(0),
            })
            .collect();
        let topo = Topology {
            source: Source::Detected,
            packages: 1,
            numa_nodes: 1,
            cores: cpus.len(),
            pus,
            allowed: cpus,
            matrix: None,
        };
        tracing::debug!(topology = ?topo, "flat topology built (Miri cannot call hwloc)");
        topo
    }

    /// Under Miri the flat topology has one NUMA node, so this is [`Error::BadDistanceMatrix`]
    /// as on the real machine; there is no hwloc tree to attach a matrix to otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::BadDistanceMatrix`], or [`Error::Hwloc`] (Miri cannot call hwloc).
    pub fn with_numa_distances(self, matrix: &[u64]) -> Result<Topology> {
        self.check_distance_matrix(matrix)?;
        Err(Error::hwloc(
            "add a NUMA distance matrix",
            "Miri cannot call hwloc (C)",
            "run this outside Miri",
        ))
    }

    /// Under Miri there is no hwloc tree to export.
    ///
    /// # Errors
    ///
    /// Always [`Error::Hwloc`] (Miri cannot call hwloc).
    pub fn export_xml(&self, path: impl AsRef<Path>) -> Result<()> {
        Err(Error::hwloc(
            format!("export XML to {}", path.as_ref().display()),
            "Miri cannot call hwloc (C)",
            "run this outside Miri",
        ))
    }

    /// The tree of [`Topology::render_tree`] from the table: the flat machine's one package,
    /// NUMA node, cores and PUs.
    fn render_flat(&self, out: &mut String) {
        let _ = writeln!(out, "  Package L#0");
        let _ = writeln!(out, "    NUMANode L#0 P#0");
        for (core, pu) in self.pus.iter().enumerate() {
            let _ = writeln!(out, "    Core L#{core}");
            let note = if self.is_allowed(pu.os) {
                ""
            } else {
                " (not allowed)"
            };
            let _ = writeln!(out, "      PU L#{core} P#{}{note}", pu.os);
        }
    }
}

/// The CPUs the calling thread may run on, as Miri models `sched_getaffinity`; CPU 0 alone if
/// the mask cannot be read or is empty.
#[cfg(miri)]
fn miri_cpus() -> Vec<usize> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set; `sched_getaffinity` writes at most
    // `size_of` bytes of it, and `CPU_ISSET` reads indices below `CPU_SETSIZE` only.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            Vec::new()
        } else {
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    };
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

/// Most PUs a synthetic topology may describe (`Topology::synthetic`), and the bound on the OS
/// indexes it names: above any real machine, well below what makes hwloc take seconds (its
/// cost grows with the square of the PU count; 32,768 PUs took 1.3 s, 65,536 PUs minutes).
const MAX_SYNTHETIC_PUS: u128 = 1 << 13;

/// Most objects one level of a synthetic topology may have under each parent: hwloc inserts
/// siblings one by one, at a cost that grows with the square of their number (`pu:2048` took
/// 0.15 s, `pu:4096` 0.9 s, `pu:8192` 6 s; `pack:8 core:1024 pu:1` 1.5 to 3 s).
const MAX_SYNTHETIC_ARITY: u128 = 1 << 10;

/// Most levels a synthetic topology may have: real machines have fewer than 16, and hwloc 2.9
/// overflows its level array (128 entries) on a description of 126 levels without a NUMA
/// level, aborting the process.
const MAX_SYNTHETIC_LEVELS: u32 = 32;

/// Most objects a synthetic topology may describe over all its levels (every level's objects
/// plus the `[numa]` nodes): three levels of [`MAX_SYNTHETIC_PUS`]. `pack:8 core:1024 pu:1`
/// (16,392) passes; each level of one object under it (`group:1`) added about a second
/// (122 of them: 151 s).
const MAX_SYNTHETIC_OBJECTS: u128 = 3 * MAX_SYNTHETIC_PUS;

/// What [`synthetic_leaves`] reads of a synthetic description.
struct Shape<'a> {
    /// The product of the level counts: how many leaves (PUs) hwloc would build.
    pus: u128,
    /// The largest count: its widest level under one parent.
    widest: u128,
    /// How many NUMA nodes its `[numa]` blocks attach.
    attached: u128,
    /// How many levels it has (`[numa]` blocks not counted).
    levels: u32,
    /// How many objects all its levels hold, the attached NUMA nodes included.
    total: u128,
    /// The type of the first level hwloc reads as a memory-side cache ([`names_memcache`]).
    memcache: Option<&'a str>,
    /// The attribute block of the last level, the PUs' (hwloc requires the last level to be
    /// theirs), if it has one.
    pu_attrs: Option<&'a str>,
}

/// The [`Shape`] of a synthetic description. Walked as hwloc walks it: levels need no space between them (`pack:2core:2pu:2` is
/// three), after an optional root `(attributes)` block, each an optional `type:` then a count read as [`strtoul_prefix`] reads it, then an
/// optional `(attributes)` block; a `[...]` block attaches one NUMA node to every object of the
/// level before it (as many as the product so far). A count too large for `u128` saturates, as
/// do the product and the sums. Where hwloc would stop with a syntax error, so does this.
fn synthetic_leaves(desc: &str) -> Shape<'_> {
    let b = desc.as_bytes();
    let mut i = 0;
    let mut product = 1u128;
    let mut widest = 1u128;
    let mut attached = 0u128;
    let mut levels = 0u32;
    let mut total = 0u128;
    let mut memcache = None;
    let mut last_attrs = None;
    let shape = |product, widest, attached, levels, total: u128, memcache, pu_attrs| Shape {
        pus: product,
        widest,
        attached,
        levels,
        total: total.saturating_add(attached),
        memcache,
        pu_attrs,
    };
    // A root attribute block, `(memory=1GB)2 256 256`, as hwloc reads one first.
    if b.first() == Some(&b'(') {
        match desc.find(')') {
            Some(end) => i = end + 1,
            None => {
                return shape(
                    product, widest, attached, levels, total, memcache, last_attrs,
                )
            }
        }
    }
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        if b[i] == b'[' {
            match desc[i..].find(']') {
                Some(end) => i += end + 1,
                None => break,
            }
            attached = attached.saturating_add(product);
            continue;
        }
        if !b[i].is_ascii_digit() {
            // A level type, up to its ':'.
            match desc[i..].find(':') {
                Some(colon) => {
                    if memcache.is_none() && names_memcache(&b[i..]) {
                        memcache = Some(&desc[i..i + colon]);
                    }
                    i += colon + 1;
                }
                None => break,
            }
        }
        let Some((count, used)) = strtoul_prefix(&desc[i..], 0) else {
            break;
        };
        product = product.saturating_mul(count.max(1));
        widest = widest.max(count);
        levels = levels.saturating_add(1);
        total = total.saturating_add(product);
        i += used;
        last_attrs = None;
        if i < b.len() && b[i] == b'(' {
            match desc[i..].find(')') {
                Some(end) => {
                    last_attrs = Some(&desc[i..=i + end]);
                    i += end + 1;
                }
                None => break,
            }
        }
    }
    shape(
        product, widest, attached, levels, total, memcache, last_attrs,
    )
}

/// The first OS index that an explicit `indexes=a,b,...` list in the attribute block `attrs`
/// names a second time among its first `used` entries (those hwloc uses: one per object of
/// the level), if any (read as [`synthetic_max_index`] reads such a list).
fn repeated_index(attrs: &str, used: u128) -> Option<u128> {
    let mut seen = std::collections::HashSet::new();
    index_lists(attrs)
        .flat_map(|list| list.split(','))
        .filter_map(|n| strtoul_prefix(n, 10).map(|(n, _)| n))
        .take(usize::try_from(used).unwrap_or(usize::MAX))
        .find(|&n| !seen.insert(n))
}

/// What makes a description's `indexes=` lists read differently by hwloc than by the checks
/// of [`Topology::synthetic`], if anything: an attribute block with two `indexes=` (hwloc
/// keeps the last, the checks read the first), or an explicit list with an empty entry
/// (`0,,1`: hwloc drops the whole list; one trailing comma ends the list).
fn ambiguous_indexes(desc: &str) -> Option<String> {
    for block in desc.split('(').skip(1) {
        let block = &block[..block.find(')').unwrap_or(block.len())];
        if block.matches("indexes=").count() > 1 {
            return Some(format!("attribute block ({block}) gives indexes= twice"));
        }
    }
    // One trailing comma is read as the end of the list, by hwloc too.
    index_lists(desc)
        .find(|list| {
            list.strip_suffix(',')
                .unwrap_or(list)
                .split(',')
                .any(str::is_empty)
        })
        .map(|list| format!("indexes={list} list has an empty entry"))
}

/// The explicit `indexes=a,b,...` lists in `text` (digits and commas, up to the `)` or space
/// that ends them), in order: how hwloc's synthetic parser tells a list of OS indexes from
/// an interleaving pattern (`indexes=core:pack`) or `step*count` loops, which are skipped.
fn index_lists(text: &str) -> impl Iterator<Item = &str> {
    text.split("indexes=")
        .skip(1)
        .filter_map(|rest| rest.split(|c: char| c == ')' || c.is_whitespace()).next())
        .filter(|list| !list.is_empty() && list.bytes().all(|c| c.is_ascii_digit() || c == b','))
}

/// How many OS indexes an explicit `indexes=a,b,...` list in the attribute block `attrs`
/// names (read as [`synthetic_max_index`] reads such a list; empty entries, as after a
/// trailing comma, name none); `None` without such a list.
fn listed_indexes(attrs: &str) -> Option<u128> {
    index_lists(attrs)
        .next()
        .map(|list| list.split(',').filter(|n| !n.is_empty()).count() as u128)
}

/// Whether hwloc reads the object type at the start of `s` as a memory-side cache
/// (`HWLOC_OBJ_MEMCACHE`), as its `hwloc_type_sscanf` does: a prefix of `memcache` of at least
/// 5 letters or of `memory-side cache` of at least 8 characters, in any case, ending at a
/// character that is neither a letter nor `-` (`memca:2`, `MemCache:2`, `memory-side:2`). Such a
/// level passes hwloc's synthetic parser, and then hwloc's tree builder fails an assertion that
/// aborts the process (hwloc 2.9): no `Err`, no panic to catch.
fn names_memcache(s: &[u8]) -> bool {
    /// hwloc's `hwloc__type_match(s, ty, min_len) == 0`; `ty` is lowercase. hwloc takes a byte
    /// equal to the type's byte minus 32 as a match (the uppercase letter, and `\r` for `-`).
    fn type_match(s: &[u8], ty: &[u8], min_len: usize) -> bool {
        for (i, &c) in s.iter().enumerate() {
            match ty.get(i) {
                Some(&t) if c == t || c == t.wrapping_sub(32) => {}
                _ => return !(c.is_ascii_alphabetic() || c == b'-') && i >= min_len,
            }
        }
        s.len() >= min_len
    }
    type_match(s, b"memcache", 5) || type_match(s, b"memory-side cache", 8)
}

/// Largest XML topology [`Topology::from_xml`] reads: far above any machine's export (8,192
/// PUs take about 5 MiB), and small enough that a wrong path (`/dev/zero`, a disk image) is
/// refused before it takes much memory.
const MAX_XML_BYTES: u64 = 64 << 20;

/// Reads at most [`MAX_XML_BYTES`] of `path` as UTF-8 text; `InvalidData` beyond that. Any
/// kind of file is read (`/dev/stdin`, a pipe from `lstopo --of xml`), but only so far.
fn read_xml(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_XML_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_XML_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "it is larger than {} MiB, more than any machine's topology export (8,192 PUs \
                 take about 5 MiB)",
                MAX_XML_BYTES >> 20
            ),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
}

/// The first object of an XML topology that lacks one of the CPU and node sets hwloc needs
/// (`cpuset`, `complete_cpuset`, `nodeset`, `complete_nodeset`; I/O and Misc objects have
/// none), described, if any: hwloc 2.9 accepts such an object and then dereferences the
/// missing set while it builds the tree, a crash no error handling survives (fixed in hwloc's
/// development tree only). An `lstopo` export always has them; a hand-edited or truncated
/// file may not. Cost: one pass over the text.
fn xml_missing_sets(xml: &str) -> Option<String> {
    const SETS: [&str; 4] = ["cpuset", "complete_cpuset", "nodeset", "complete_nodeset"];
    const SPECIAL: [&str; 4] = ["Misc", "Bridge", "PCIDev", "OSDev"];
    for (n, tag) in xml.split("<object").skip(1).enumerate() {
        // Up to the tag's end; an attribute value holds no '>' in an export.
        let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
        let attrs = xml_attributes(tag);
        let ty = attrs
            .iter()
            .find(|(k, _)| *k == "type")
            .map_or("", |(_, v)| *v);
        if SPECIAL.contains(&ty) {
            continue;
        }
        if let Some(missing) = SETS.iter().find(|s| !attrs.iter().any(|(k, _)| k == *s)) {
            return Some(format!(
                "its object number {} (type {ty:?}) has no {missing} attribute, which hwloc \
                 needs (it would crash, not fail)",
                n + 1
            ));
        }
    }
    None
}

/// The `name="value"` pairs at the start of an XML tag's text (after its element name), up to
/// the first text that is not one.
fn xml_attributes(tag: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut rest = tag;
    loop {
        rest = rest.trim_start();
        let Some(eq) = rest.find('=') else { break };
        let name = rest[..eq].trim_end();
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '/') {
            break;
        }
        let after = rest[eq + 1..].trim_start();
        let Some(quote) = after.chars().next().filter(|c| *c == '"' || *c == '\'') else {
            break;
        };
        let body = &after[1..];
        let Some(end) = body.find(quote) else { break };
        out.push((name, &body[..end]));
        rest = &body[end + 1..];
    }
    out
}

/// The first `indexes=` value of a synthetic description that hwloc (2.9) cannot process
/// safely, if any. hwloc reads a value up to a space or `)`; one of digits and commas only is
/// an explicit list, which is safe. Any other is an interleaving pattern:
/// - `type:type:...` (`indexes=core:pack`): hwloc looks the types up among levels whose child
///   count it has not all set yet (the PU level's, and beyond it levels never written), and a
///   type that matches a level deeper than the indexed one fails an assertion
///   (`step`), which aborts the process: refused whatever it names;
/// - `step*count:...` (`indexes=2*2:1*2`): hwloc multiplies the counts, each read as `strtol`
///   reads it and cast to 32 bits, in 64 bits, and asserts that the product is not 0; counts
///   whose product wraps to 0 (`1*65536` four times) are refused. A pattern hwloc rejects
///   gracefully (a missing `*`, a zero step or count) is left to it: it ignores the indexes.
fn synthetic_unsafe_interleave(desc: &str) -> Option<&str> {
    desc.split("indexes=").skip(1).find_map(|rest| {
        let value = &rest[..rest.find([' ', ')']).unwrap_or(rest.len())];
        if value.bytes().all(|c| c.is_ascii_digit() || c == b',') {
            return None;
        }
        if !value.as_bytes()[0].is_ascii_digit() {
            return Some(value);
        }
        // hwloc's loop over `step*count` pairs, each ended by ':', or by ')' or ' ' for the
        // last (the value's end here).
        let mut product = 1u64;
        let mut tmp = value;
        loop {
            let (step, used) = strtol_u32(tmp)?;
            if step == 0 || tmp.as_bytes().get(used) != Some(&b'*') {
                return None;
            }
            let after = &tmp[used + 1..];
            let (count, used) = strtol_u32(after)?;
            if count == 0 {
                return None;
            }
            product = product.wrapping_mul(u64::from(count));
            match after.as_bytes().get(used) {
                None => break,
                Some(b':') => tmp = &after[used + 1..],
                Some(_) => return None,
            }
        }
        (product == 0).then_some(value)
    })
}

/// The number at the start of `s` as `(unsigned) strtol(s, .., 0)` reads it in C (a 64-bit
/// `long`, saturated, then cut to 32 bits), and how many bytes it took; `None` without digits.
fn strtol_u32(s: &str) -> Option<(u32, usize)> {
    let start = s.len() - s.trim_start().len();
    let t = &s[start..];
    let (negative, sign) = match t.as_bytes().first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let digits = &t[sign..];
    if digits.starts_with(|c: char| c.is_whitespace() || c == '+' || c == '-') {
        return None;
    }
    let (magnitude, used) = strtoul_prefix(digits, 0)?;
    let value = if negative {
        i64::try_from(magnitude).map_or(i64::MIN, |m| -m)
    } else {
        i64::try_from(magnitude).unwrap_or(i64::MAX)
    };
    Some((value as u32, start + sign + used))
}

/// The largest OS index an explicit `indexes=a,b,...` list of a synthetic description names
/// (0 if none). hwloc sizes every object's CPU set to the largest index, so a few PUs numbered
/// near 2^32 took gigabytes. hwloc reads a list of digits and commas only as explicit indexes,
/// each in base 10 (a leading 0 is no octal there); other lists are interleaving patterns
/// (`2*4:1*2`), which number PUs below their count ([`synthetic_leaves`] bounds that), or are
/// ignored.
fn synthetic_max_index(desc: &str) -> u128 {
    index_lists(desc)
        .flat_map(|list| list.split(','))
        .filter_map(|n| strtoul_prefix(n, 10).map(|(n, _)| n))
        .max()
        .unwrap_or(0)
}

/// The number at the start of `s` as C's `strtoul(s, .., base)` reads it (base 0 or 10), and
/// how many bytes it took; `None` without digits. Base 0 is how hwloc reads synthetic counts:
/// `0x` hexadecimal, a leading `0` octal, else decimal. Leading whitespace and a sign are
/// taken; a `-` makes `strtoul` wrap around to nearly 2^64, so it saturates here, as does a
/// number too large for `u128`.
fn strtoul_prefix(s: &str, base: u32) -> Option<(u128, usize)> {
    let start = s.len() - s.trim_start().len();
    let t = &s[start..];
    let (negative, signed) = match t.as_bytes().first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let t = &t[signed..];
    let hex = base == 0 && (t.starts_with("0x") || t.starts_with("0X"));
    let (digits, radix, prefix) = if hex {
        (&t[2..], 16, 2)
    } else if base == 0 && t.len() > 1 && t.starts_with('0') {
        (&t[1..], 8, 1)
    } else {
        (t, 10, 0)
    };
    let end = digits
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(digits.len());
    if end == 0 {
        // No digits after a prefix: strtoul takes the "0" alone (a bare "0x" reads as 0).
        return t.starts_with('0').then_some((0, start + signed + 1));
    }
    let n = u128::from_str_radix(&digits[..end], radix).unwrap_or(u128::MAX);
    let n = if negative && n != 0 { u128::MAX } else { n };
    Some((n, start + signed + prefix + end))
}
