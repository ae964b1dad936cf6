//! Hello from every shard: per-shard state without locks, a local task, a timer, and a
//! cross-shard call, the calls the README's usage example shows. Run: `cargo run --example
//! hello`.

#[path = "shared/print.rs"]
mod print;

use print::{err, out};
use std::{
    cell::Cell,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

fn main() -> std::process::ExitCode {
    main_with(std::env::args_os().skip(1))
}

/// `main` for the arguments `args` (without the program name).
fn main_with(mut args: impl Iterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    // No flags: the environment (XTC_SHARDS, XTC_IO, ...) is its configuration. An argument
    // was ignored, so a mistyped `--shards 4` ran with the default count and exited 0.
    if let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            out(format_args!(
                "usage: hello\n\nTakes no flags: the environment is its configuration, such as \
                 XTC_SHARDS (shard count,\ndefault one per physical core) and XTC_IO=epoll|io_uring \
                 (I/O driver); see the xtc crate docs\nfor every XTC_* variable."
            ));
            return std::process::ExitCode::SUCCESS;
        }
        err(format_args!(
            "hello: unexpected argument {arg:?}; it takes none (set XTC_SHARDS instead)"
        ));
        return std::process::ExitCode::from(2);
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The message (xtc's errors include their causes), through `err`: a `Result`
            // returned from `main` goes through `eprintln!`, which panics on a closed stderr,
            // and through `Debug`, which for errors other than xtc's writes their fields.
            err(format_args!("hello: {e}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the tour and checks it: every shard counted once in its own slot, and every
/// `submit_to` answered by the shard it went to.
fn run() -> Result<(), Box<dyn std::error::Error>> {
    // One shard per allowed physical core by default; XTC_SHARDS etc. override it. Service
    // mode stays off whatever XTC_SERVICE_MODE says: `run()` must return once the work is done
    // (with XTC_SERVICE_MODE=1 it waited for a stop that never came, and hello hung).
    let exec = xtc::Executor::builder()
        .env()?
        .service_mode(false)
        .build()?;
    let hits = Arc::new(xtc::Sharded::new(exec.shard_count(), |_| Cell::new(0u64)));
    let answered = Arc::new(AtomicUsize::new(0));
    for shard in 0..exec.shard_count() {
        let (hits, answered) = (hits.clone(), answered.clone());
        // The closure is Send; it runs on `shard`, so the future it returns may be !Send.
        exec.spawn_on(shard, move || async move {
            let child = xtc::spawn_local(async { xtc::shard::id() });
            assert_eq!(child.await.unwrap(), shard);
            xtc::time::sleep(Duration::from_millis(1)).await;
            hits.get().set(hits.get().get() + 1); // no lock: this slot is this shard's
            let next = (shard + 1) % xtc::shard::count();
            let there = xtc::shard::submit_to(next, || async { xtc::shard::id() }).await;
            if matches!(there, Ok(id) if id == next) {
                answered.fetch_add(1, Ordering::Relaxed);
            }
            out(format_args!(
                "hello from shard {shard} of {}; shard {next} answered {there:?}",
                xtc::shard::count()
            ));
        })?;
    }
    exec.run()?; // returns when every task is done and every timer fired
    let per_shard: Vec<u64> = Arc::into_inner(hits)
        .ok_or("a task still holds the per-shard counters")?
        .into_inner()
        .into_iter()
        .map(Cell::into_inner)
        .collect();
    if per_shard.iter().any(|&n| n != 1) {
        return Err(format!("each shard should have counted itself once: {per_shard:?}").into());
    }
    let answered = answered.load(Ordering::Relaxed);
    if answered != exec.shard_count() {
        return Err(format!(
            "{answered} of {} cross-shard calls were answered by their target",
            exec.shard_count()
        )
        .into());
    }
    for shard in 0..exec.shard_count() {
        let s = exec.loop_stats(shard)?;
        out(format_args!(
            "shard {shard}: {} tasks, {} polls, {} ring messages sent, idle {:.0}%",
            s.tasks_run,
            s.polls,
            s.messages_sent,
            s.idle_rate() * 100.0
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::{Command, ExitCode, Termination};

    /// A failure is printed as its message, and the exit status says it failed (an error
    /// returned from `main` is printed through `Debug`, which for errors other than xtc's
    /// writes their fields). Runs `main` in a child process (this test binary again) with
    /// `XTC_SHARDS=abc`.
    #[test]
    fn an_error_is_printed_as_its_message() {
        const CHILD: &str = "XTC_EXAMPLE_HELLO_CHILD";
        let name = "tests::an_error_is_printed_as_its_message";
        if std::env::var_os(CHILD).is_some() {
            let failed = super::main_with(std::iter::empty()).report() != ExitCode::SUCCESS;
            std::process::exit(if failed { 1 } else { 0 });
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .env("XTC_SHARDS", "abc")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("environment variable XTC_SHARDS=\"abc\" is invalid"),
            "{stderr}"
        );
        assert!(!stderr.contains("Env {"), "{stderr}");
    }

    /// A closed stdout (`hello | head -1`) is no failure: `println!` panicked there ("failed
    /// printing to stdout: Broken pipe") and the run exited 101. The child points its stdout at
    /// a pipe whose read end it closed, then runs `main`.
    #[test]
    fn a_closed_stdout_is_not_a_failure() {
        const CHILD: &str = "XTC_EXAMPLE_HELLO_PIPE_CHILD";
        let name = "tests::a_closed_stdout_is_not_a_failure";
        if std::env::var_os(CHILD).is_some() {
            let mut fds = [0; 2];
            // SAFETY: pipe writes two descriptors into the array, valid for the call; closing
            // the read end and putting the write end on fd 1 touch descriptors this process
            // owns (the test harness prints nothing more: the child exits below).
            unsafe {
                assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                libc::close(fds[0]);
                assert_eq!(libc::dup2(fds[1], 1), 1);
            }
            let ok = super::main_with(std::iter::empty()).report() == ExitCode::SUCCESS;
            // The harness prints no result for a test that exits: this says the test ran.
            eprintln!("{name}: main returned");
            std::process::exit(if ok { 0 } else { 1 });
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .env_remove("XTC_SHARDS")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stderr}", out.status);
        // A name filter that matched nothing would succeed with no test run.
        assert!(
            stderr.contains(&format!("{name}: main returned")),
            "the child did not run {name}: {stderr}"
        );
    }

    /// An argument is refused (exit status 2) before anything runs: `hello` takes none, and a
    /// flag such as `--shards 4` was ignored, the run going ahead with the default count.
    #[test]
    fn an_argument_is_refused() {
        let code = super::main_with(["--shards".into(), "4".into()].into_iter());
        assert_eq!(code, ExitCode::from(2));
    }

    /// `--help` (or `-h`) prints the usage and succeeds: it was refused like any argument
    /// (exit status 2), so asking how to run the example failed.
    #[test]
    fn help_succeeds() {
        for a in ["--help", "-h"] {
            let code = super::main_with([a.into()].into_iter());
            assert_eq!(code, ExitCode::SUCCESS, "{a}");
        }
    }

    /// `XTC_SERVICE_MODE=1` does not keep hello from ending: `run()` waited for a stop that
    /// never came, so hello hung after its greetings. The child runs `main` with it set; the
    /// parent gives it 30 s.
    #[test]
    fn service_mode_from_the_environment_does_not_hang() {
        const CHILD: &str = "XTC_EXAMPLE_HELLO_SERVICE_CHILD";
        let name = "tests::service_mode_from_the_environment_does_not_hang";
        if std::env::var_os(CHILD).is_some() {
            let ok = super::main_with(std::iter::empty()).report() == ExitCode::SUCCESS;
            // The harness prints no result for a test that exits: this says the test ran.
            eprintln!("{name}: main returned");
            std::process::exit(if ok { 0 } else { 1 });
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .env("XTC_SERVICE_MODE", "1")
            .env_remove("XTC_SHARDS")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Read on a thread of its own, so that the child never waits on a full pipe.
        let mut pipe = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
            text
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("hello hung with XTC_SERVICE_MODE=1");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let stderr = stderr.join().unwrap();
        assert!(status.success(), "{status}: {stderr}");
        // A name filter that matched nothing would succeed with no test run.
        assert!(
            stderr.contains(&format!("{name}: main returned")),
            "the child did not run {name}: {stderr}"
        );
    }
}
