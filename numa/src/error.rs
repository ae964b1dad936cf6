//! Errors of `xtc-numa`: values whose message says what to do.

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in `xtc-numa`.
///
/// Every message names the value at fault and says how to fix the request. The enum is
/// `#[non_exhaustive]`: match with a `_` arm. `{:?}` writes the message too (what `Display`
/// writes), so a `main` returning one prints what to do; `{:#?}` puts the variant's name first.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// hwloc refused an operation (topology discovery, parsing a description, export...).
    #[error("hwloc failed to {what}: {detail}; {hint}")]
    Hwloc {
        /// What was being done, e.g. `"load the synthetic topology \"core:4\""`.
        what: String,
        /// hwloc's own error text.
        detail: String,
        /// What to do about it.
        hint: &'static str,
    },

    /// An XML topology file could not be read.
    #[error("cannot read the XML topology {}: {source}; check the path (make one with `lstopo file.xml`)", path.display())]
    XmlFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },

    /// More shards were asked than there are allowed CPUs, and oversubscription is off.
    #[error("{asked} shards asked but only {} allowed; lower shards() or allow oversubscription (in xtc: `Builder::oversubscribe(true)` or `XTC_OVERSUBSCRIBE=1`)", cpus(*allowed))]
    TooManyShards {
        /// Shards asked for.
        asked: usize,
        /// Allowed PUs (hardware threads) in this process's CPU set.
        allowed: usize,
    },

    /// More shards were asked than oversubscription allows (every shard is a thread and a
    /// row of the ring mesh; far more shards than CPUs only multiplies that cost).
    #[error("{asked} shards asked; oversubscription allows at most {max} ({per_cpu} per allowed CPU); lower shards()")]
    OversubscribedTooFar {
        /// Shards asked for.
        asked: usize,
        /// The most allowed here.
        max: usize,
        /// Shards allowed per allowed CPU.
        per_cpu: usize,
    },

    /// The process may not run on any CPU of the topology (empty allowed set).
    #[error("no CPU of the topology is allowed to this process; widen the affinity mask or cpuset (taskset, cgroups)")]
    NoAllowedCpus,

    /// A CPU was named that the process may not run on, or that the topology does not have.
    #[error("CPU {cpu} is not allowed to the calling thread (its affinity mask, within the process's cpuset) or does not exist; pick one of the allowed CPUs {allowed:?}")]
    CpuNotAllowed {
        /// OS index of the CPU asked for.
        cpu: usize,
        /// The allowed CPUs (OS indices), for the message.
        allowed: Vec<usize>,
    },

    /// An explicit CPU list puts more than [`MAX_SHARDS_PER_CPU`](crate::MAX_SHARDS_PER_CPU)
    /// shards on one CPU, even with oversubscription.
    #[error("CPU {cpu} is listed {listed} times; oversubscription allows at most {per_cpu} shards per CPU; spread the list over more CPUs")]
    TooManyOnOneCpu {
        /// OS index of the CPU.
        cpu: usize,
        /// How often the list names it.
        listed: usize,
        /// Shards allowed per CPU.
        per_cpu: usize,
    },

    /// A CPU appears twice in an explicit CPU list without oversubscription.
    #[error("CPU {cpu} is listed twice; list each CPU once or allow oversubscription (in xtc: `Builder::oversubscribe(true)` or `XTC_OVERSUBSCRIBE=1`)")]
    DuplicateCpu {
        /// OS index of the repeated CPU.
        cpu: usize,
    },

    /// An explicit CPU list does not have one CPU per shard (or is empty).
    #[error("{}", cpu_list_length(*listed, *shards))]
    CpuListLength {
        /// Length of the CPU list.
        listed: usize,
        /// Shards asked for.
        shards: usize,
    },

    /// A placement policy string could not be parsed.
    #[error("bad placement policy {0:?}; use \"compact\", \"spread\" or \"cpus:0,2,4\" (a comma-separated list of CPU numbers or ranges such as 0-3,8)")]
    BadPolicy(String),

    /// A NUMA sensitivity outside 0..=2 was given.
    #[error("NUMA sensitivity {given} is out of range; use 0 (steal across nodes), 1 (first shard of each node steals across nodes, the default) or 2 (never across nodes)")]
    BadSensitivity {
        /// The value given.
        given: u8,
    },

    /// A victim order was asked for more shards than
    /// [`MAX_VICTIM_SHARDS`](crate::MAX_VICTIM_SHARDS): its tables grow with the square of the
    /// shard count.
    #[error("a victim order for {shards} shards is too large (its tables grow with the square of the count); use at most {max} shards")]
    TooManyForVictims {
        /// Shards in the placement.
        shards: usize,
        /// The most allowed.
        max: usize,
    },

    /// Binding a thread to a CPU failed in the operating system. With `EPERM` the system
    /// forbids changing thread affinity at all (a seccomp filter such as systemd's
    /// `SystemCallFilter=~@resources`, a sandbox): the message says to turn pinning off.
    #[error("pinning the current thread to CPU {cpu} failed (errno {errno}); {}", pin_hint(*errno))]
    PinFailed {
        /// OS index of the CPU.
        cpu: usize,
        /// The OS error number (0 when none was reported).
        errno: i32,
    },

    /// Pinning was asked on a synthetic or XML topology, which does not describe this machine.
    #[error("cannot pin a thread using a synthetic or XML topology (it is not this machine); use Topology::detect() to pin")]
    SyntheticBind,

    /// A shard index outside the placement was given. No function of this crate returns it
    /// today (`Placement::cpu` answers `None` and `VictimOrder::victims` an empty list for
    /// such an index); kept for callers that report the case with this crate's error type.
    #[error("shard {shard} does not exist; the placement has {shards} shards (0..{shards})")]
    InvalidShard {
        /// The index given.
        shard: usize,
        /// Number of shards in the placement.
        shards: usize,
    },

    /// A NUMA distance matrix does not fit the topology.
    #[error("a NUMA distance matrix needs a topology of at least 2 NUMA nodes (this one has {nodes}) and {expected} values ({nodes} nodes squared); {given} were given. Use a topology with NUMA nodes (a synthetic one such as \"pack:2 numa:2 core:4 pu:2\"), one row per node, sender-major")]
    BadDistanceMatrix {
        /// NUMA nodes in the topology.
        nodes: usize,
        /// Values expected (`nodes * nodes`).
        expected: usize,
        /// Values given.
        given: usize,
    },
}

/// [`Error::CpuListLength`]'s message: asking for 0 shards (the list's length) mends a list of
/// the wrong length, not an empty one.
fn cpu_list_length(listed: usize, shards: usize) -> String {
    if listed == 0 {
        "the CPU list is empty; list one CPU per shard (such as cpus:0,1), or use the compact or \
         spread policy"
            .to_owned()
    } else {
        format!(
            "{} listed for {shards} shards; list exactly one CPU per shard, or ask for \
             0 shards to take the list's length",
            cpus(listed)
        )
    }
}

/// `n` CPUs, in the singular for one ("only 1 CPUs allowed" read wrong).
fn cpus(n: usize) -> String {
    if n == 1 {
        "1 CPU".to_owned()
    } else {
        format!("{n} CPUs")
    }
}

/// What to do about a failed bind, by its errno.
fn pin_hint(errno: i32) -> &'static str {
    if errno == libc::EPERM {
        "this system forbids setting thread affinity (a seccomp filter or a sandbox); turn \
         pinning off (in xtc: `Builder::pin(false)` or `XTC_PIN=0`, which keeps the CPUs the \
         threads inherit)"
    } else {
        "check the CPU is online and in this process's cpuset"
    }
}

impl Error {
    /// Build an [`Error::Hwloc`] from any hwloc error.
    pub(crate) fn hwloc(
        what: impl Into<String>,
        err: impl std::fmt::Display,
        hint: &'static str,
    ) -> Self {
        Error::Hwloc {
            what: what.into(),
            detail: err.to_string(),
            hint,
        }
    }
}

impl Error {
    /// The variant's name, for `{:#?}`.
    fn variant(&self) -> &'static str {
        match self {
            Error::Hwloc { .. } => "Hwloc",
            Error::XmlFile { .. } => "XmlFile",
            Error::TooManyShards { .. } => "TooManyShards",
            Error::OversubscribedTooFar { .. } => "OversubscribedTooFar",
            Error::NoAllowedCpus => "NoAllowedCpus",
            Error::CpuNotAllowed { .. } => "CpuNotAllowed",
            Error::TooManyOnOneCpu { .. } => "TooManyOnOneCpu",
            Error::DuplicateCpu { .. } => "DuplicateCpu",
            Error::CpuListLength { .. } => "CpuListLength",
            Error::BadPolicy(_) => "BadPolicy",
            Error::BadSensitivity { .. } => "BadSensitivity",
            Error::TooManyForVictims { .. } => "TooManyForVictims",
            Error::PinFailed { .. } => "PinFailed",
            Error::SyntheticBind => "SyntheticBind",
            Error::InvalidShard { .. } => "InvalidShard",
            Error::BadDistanceMatrix { .. } => "BadDistanceMatrix",
        }
    }
}

impl std::fmt::Debug for Error {
    /// The message, as `Display` writes it; `{:#?}` prefixes the variant's name (see
    /// [`Error`]). Cost: formatting only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if f.alternate() {
            write!(f, "xtc_numa::Error::{}: {self}", self.variant())
        } else {
            std::fmt::Display::fmt(self, f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{:?}` writes what `Display` writes (a `main` returning the error prints what to do),
    /// `{:#?}` the variant's name and then that.
    #[test]
    fn debug_writes_the_message_and_the_alternate_form_names_the_variant() {
        let e = Error::CpuNotAllowed {
            cpu: 9,
            allowed: vec![0, 1],
        };
        let shown = e.to_string();
        assert!(shown.contains("pick one of the allowed CPUs"), "{shown}");
        assert_eq!(format!("{e:?}"), shown);
        assert_eq!(
            format!("{e:#?}"),
            format!("xtc_numa::Error::CpuNotAllowed: {shown}")
        );
        assert_eq!(
            format!("{:?}", Error::SyntheticBind),
            Error::SyntheticBind.to_string()
        );
    }

    /// One CPU reads in the singular, more in the plural.
    #[test]
    fn counts_of_cpus_read_as_words() {
        let one = Error::TooManyShards {
            asked: 2,
            allowed: 1,
        };
        assert!(one.to_string().contains("only 1 CPU allowed"), "{one}");
        let two = Error::CpuListLength {
            listed: 2,
            shards: 3,
        };
        assert!(
            two.to_string().starts_with("2 CPUs listed for 3 shards"),
            "{two}"
        );
        let single = Error::CpuListLength {
            listed: 1,
            shards: 2,
        };
        assert!(single.to_string().starts_with("1 CPU listed"), "{single}");
    }
}
