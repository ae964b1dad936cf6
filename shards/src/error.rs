//! Errors: values whose message says what to do (invariant 9 in the crate docs).

use std::{any::Any, fmt};

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in xtc's public API.
///
/// `{:?}` writes the message (what `Display` writes), so a `fn main() -> xtc::Result<()>` that
/// returns one prints what to do, not the variant's fields; `{:#?}` puts the variant's name
/// first. anyhow's `Error` prints the same way.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Topology, placement or pinning failed (see the inner error for what to change).
    #[error(transparent)]
    Numa(#[from] xtc_numa::Error),
    /// A shard index outside `0..count`.
    #[error("shard {shard} does not exist: this executor has {count} shards (valid: 0..{count})")]
    InvalidShard {
        /// The index asked for.
        shard: usize,
        /// How many shards exist.
        count: usize,
    },
    /// An environment variable holds a value xtc cannot use.
    #[error("environment variable {var}={value:?} is invalid: expected {expected}")]
    Env {
        /// The variable's name, e.g. `XTC_SHARDS`.
        var: &'static str,
        /// What it held.
        value: String,
        /// What would be accepted.
        expected: &'static str,
    },
    /// The shard placement is impossible with inputs that came from the environment (each
    /// valid alone, such as `XTC_SHARDS=4096` on a machine with 2 allowed CPUs).
    #[error("{source} (from the environment: {vars}; change or unset them)")]
    EnvPlacement {
        /// The variables that fed the placement, as `NAME=value` separated by spaces.
        vars: String,
        /// Why the placement failed.
        #[source]
        source: xtc_numa::Error,
    },

    /// A builder or knob argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call that needs the current shard (or the task being polled) was made on a thread
    /// that runs no xtc loop (or on a loop thread outside a task's poll).
    #[error(
        "{0} needs to run inside a task of an xtc loop: call it from a task; from other \
         threads, Handle has spawn_on, spawn, submit_to, submit_to_all, send_to and \
         create_class"
    )]
    OffLoop(&'static str),
    /// The platform lacks a feature this call needs.
    #[error("not supported on this platform: {0}")]
    Unsupported(&'static str),
    /// `run()` or `block_on()` was called while the executor is already running: from another
    /// thread, or from inside one of its own tasks.
    #[error(
        "the executor is already running: call run()/block_on() from one thread at a time, and \
         not from inside one of its own tasks (there, .await the future or spawn it instead)"
    )]
    AlreadyRunning,
    /// A shard's thread panicked outside any task: a bug in xtc, or in code xtc runs on the
    /// loop unguarded (a `tracing` subscriber). Its message went to the panic hook (stderr by
    /// default) and to the log (an `error` event, "a shard thread panicked outside any task").
    #[error(
        "{0}: its panic message is on stderr and in the log (a tracing subscriber shows it); \
         please report it, with that message, as a bug in xtc unless it came from your \
         subscriber"
    )]
    ShardPanicked(&'static str),
    /// The executor stopped (or was stopped) before the operation could complete.
    #[error(
        "the executor stopped before this completed (a stop(), or block_on returned): run it \
         again to go on, or build a new one if it was dropped"
    )]
    Stopped,
    /// Every loop went idle while tasks stayed parked with nothing that could wake them.
    #[error("deadlock: every loop stayed idle for the deadlock grace ({grace:?}) but {} task(s) are parked with no timer, I/O or message that could wake them:\n  {}\n(raise XTC_DEADLOCK_GRACE, e.g. to 30s, or Builder::deadlock_grace if they wait on a foreign thread)", tasks.len(), tasks.join("\n  "))]
    Deadlock {
        /// One line per parked task: name (if any), spawn location, shard.
        tasks: Vec<String>,
        /// The deadlock grace the run applied when it decided on the deadlock
        /// (`Handle::deadlock_grace` then): how long every loop had been idle with these
        /// tasks parked, at least.
        grace: std::time::Duration,
    },
    /// A task this call waited for panicked or was cancelled: the main future of `block_on`,
    /// the closure or future of a `submit_to`, or a [`JoinError`] converted with `?`.
    #[error("a task failed: {0}")]
    Join(#[from] JoinError),
    /// An operating-system call failed. A `std::io::Error` converts into this with `?` (its
    /// `what` then reads "I/O"), so a task returning `xtc::Result` can use `?` on the
    /// `std::io::Result`s of [`net`](crate::net) and [`fs`](crate::fs).
    #[error("{what}: {source}")]
    Io {
        /// What xtc was doing.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The variant's name, for `{:#?}`.
    fn variant(&self) -> &'static str {
        match self {
            Error::Numa(_) => "Numa",
            Error::InvalidShard { .. } => "InvalidShard",
            Error::Env { .. } => "Env",
            Error::EnvPlacement { .. } => "EnvPlacement",
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::OffLoop(_) => "OffLoop",
            Error::Unsupported(_) => "Unsupported",
            Error::AlreadyRunning => "AlreadyRunning",
            Error::ShardPanicked(_) => "ShardPanicked",
            Error::Stopped => "Stopped",
            Error::Deadlock { .. } => "Deadlock",
            Error::Join(_) => "Join",
            Error::Io { .. } => "Io",
        }
    }
}

impl fmt::Debug for Error {
    /// The message, as `Display` writes it; `{:#?}` prefixes the variant's name (see
    /// [`Error`]). Cost: formatting only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            write!(f, "xtc::Error::{}: {self}", self.variant())
        } else {
            fmt::Display::fmt(self, f)
        }
    }
}

impl From<std::io::Error> for Error {
    /// [`Error::Io`] with `what` "I/O": the error's own message names the failure. Cost: none
    /// beyond the move.
    fn from(source: std::io::Error) -> Self {
        Error::Io {
            what: "I/O",
            source,
        }
    }
}

impl From<Error> for std::io::Error {
    /// For `?` in code that returns `std::io::Result` (a connection handler calling
    /// [`submit_to`](crate::shard::submit_to)). [`Error::Io`] gives its OS error's kind, with
    /// the message of the whole error; bad input (`InvalidShard`, `InvalidArgument`, `Env`,
    /// `EnvPlacement`) reads `InvalidInput`, `Unsupported` reads `Unsupported`, anything else
    /// (`Stopped` included) `Other`. Not `Interrupted` for `Stopped`: std's `read_exact`,
    /// `write_all`, `io::copy` and most retry loops retry that kind at once, and a reader
    /// that goes through a stopped executor retried for good. An `Error::Io` made from an
    /// `io::Error` by `?` (`what` "I/O") gives that error back as it was, so a round trip
    /// keeps its `raw_os_error()`; any other error stays inside as the source (`get_ref`,
    /// `into_inner`), and its `raw_os_error()` is `None`. Cost: one allocation (none for the
    /// round trip).
    fn from(e: Error) -> Self {
        use std::io::ErrorKind;
        let e = match e {
            Error::Io {
                what: "I/O",
                source,
            } => return source,
            e => e,
        };
        let kind = match &e {
            Error::Io { source, .. } => source.kind(),
            Error::InvalidShard { .. }
            | Error::InvalidArgument(_)
            | Error::Env { .. }
            | Error::EnvPlacement { .. } => ErrorKind::InvalidInput,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Why awaiting a [`JoinHandle`](crate::JoinHandle) gave no value. `Send + Sync`, like
/// [`Error`], so `?` turns either into a `Box<dyn Error + Send + Sync>`.
pub struct JoinError {
    repr: JoinRepr,
}

enum JoinRepr {
    Cancelled,
    Panic(Payload),
}

/// A caught panic's payload, held so that [`JoinError`] is `Sync`: a `Box<dyn Any + Send>` is
/// not, which made `JoinError` and [`Error`] `!Sync`, so neither converted into a
/// `Box<dyn Error + Send + Sync>` (nor an `anyhow::Error`), and threads could not share one.
struct Payload(Box<dyn Any + Send + 'static>);

// SAFETY: through a shared `&Payload` the payload is only read by `payload_message`, which
// calls `type_id` (the blanket `Any` impl, the only one there can be, returns the concrete
// type's constant and reads no data) and then hands out a `&str` of a `&'static str` or a
// `String`, both `Sync`. Everything else (`into_panic`) takes the payload by value, which
// needs `Send` only. tokio's `JoinError` holds its payload the same way (`SyncWrapper`).
unsafe impl Sync for Payload {}

impl JoinError {
    pub(crate) fn cancelled() -> Self {
        JoinError {
            repr: JoinRepr::Cancelled,
        }
    }

    pub(crate) fn panic(payload: Box<dyn Any + Send + 'static>) -> Self {
        JoinError {
            repr: JoinRepr::Panic(Payload(payload)),
        }
    }

    /// The task was aborted, or dropped when its executor stopped. Cost: none.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.repr, JoinRepr::Cancelled)
    }

    /// The task panicked; the panic was caught and its loop went on. Cost: none.
    pub fn is_panic(&self) -> bool {
        matches!(self.repr, JoinRepr::Panic(_))
    }

    /// The panic payload, to re-raise it with `std::panic::resume_unwind`. Cost: none (moves
    /// the box out).
    pub fn into_panic(self) -> Option<Box<dyn Any + Send + 'static>> {
        match self.repr {
            JoinRepr::Panic(p) => Some(p.0),
            JoinRepr::Cancelled => None,
        }
    }

    /// The panic message when the payload is a string, as `panic!("..")` makes it. Cost: one
    /// or two type checks of the payload; no allocation.
    pub fn panic_message(&self) -> Option<&str> {
        match &self.repr {
            JoinRepr::Panic(p) => payload_message(&*p.0),
            JoinRepr::Cancelled => None,
        }
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            JoinRepr::Cancelled => f.write_str("JoinError::Cancelled"),
            JoinRepr::Panic(_) => write!(f, "JoinError::Panic({:?})", self.panic_message()),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            JoinRepr::Cancelled => f.write_str("task was cancelled"),
            JoinRepr::Panic(_) => match self.panic_message() {
                Some(m) => write!(f, "task panicked: {m}"),
                None => f.write_str("task panicked"),
            },
        }
    }
}

impl std::error::Error for JoinError {}

/// A panic payload's message when it is a string, as `panic!("..")` makes it. Downcasts to
/// `Sync` types only (`Payload`'s `Sync` relies on it).
pub(crate) fn payload_message(p: &(dyn Any + Send)) -> Option<&str> {
    p.downcast_ref::<&'static str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a `fn main() -> xtc::Result<()>` prints (`Error: {:?}`) is the message that says
    /// what to do, for an error of xtc and for one of xtc-numa inside it; `{:#?}` names the
    /// variant first.
    #[test]
    fn debug_writes_the_message_and_the_alternate_form_names_the_variant() {
        let errors = [
            Error::Env {
                var: "XTC_SHARDS",
                value: "abc".into(),
                expected: "a shard count",
            },
            Error::Numa(xtc_numa::Error::TooManyShards {
                asked: 2,
                allowed: 1,
            }),
            Error::Stopped,
            Error::from(std::io::Error::from_raw_os_error(libc::EMFILE)),
        ];
        for e in errors {
            let shown = e.to_string();
            assert_eq!(format!("{e:?}"), shown);
            assert_eq!(
                format!("{e:#?}"),
                format!("xtc::Error::{}: {shown}", e.variant())
            );
        }
        let e = Error::Numa(xtc_numa::Error::TooManyShards {
            asked: 2,
            allowed: 1,
        });
        assert!(format!("{e:?}").contains("oversubscribe"), "{e:?}");
        assert!(format!("{e:#?}").starts_with("xtc::Error::Numa: 2 shards asked"));
    }
}
