//! Printing that survives a closed pipe, for every example (`hello` and `pipeline` include this
//! file alone; the servers get it through `shared`).

/// Prints `args` and a newline on stdout, ignoring a closed pipe (`kv ... | head -1`), where
/// `println!` panics ("failed printing to stdout: Broken pipe").
pub(crate) fn out(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{args}");
}

/// Prints `args` and a newline on stderr, ignoring a closed pipe (`kv ... 2>&1 | head -1`),
/// where `eprintln!` panics: inside a client task that panic skipped the run's bookkeeping,
/// and in `main` it turned an error exit into a panic (exit 101).
pub(crate) fn err(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
