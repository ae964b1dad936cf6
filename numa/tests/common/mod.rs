//! What the integration tests share: checking a test rerun in a child process.

/// Asserts that a child process running one test (`TEST --exact --test-threads=1`) succeeded
/// and ran it, with the child's output in the message otherwise.
pub(crate) fn assert_child_passed(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "child ran no test:\n{stdout}");
}
