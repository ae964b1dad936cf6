//! The real machine: detection, the allowed set under `taskset`, pinning.

mod common;

use std::process::Command;

use xtc_numa::{pin_current_thread, Error, Placement, Policy, Topology};

/// Set in the child process that `allowed_set_follows_taskset` starts under `taskset -c 0`.
const CHILD_ENV: &str = "XTC_NUMA_TASKSET_CHILD";

#[test]
fn detect_this_machine() {
    let t = Topology::detect().unwrap();
    assert!(!t.is_synthetic());
    assert!(t.numa_nodes() >= 1);
    let allowed = t.allowed_pus();
    assert!(!allowed.is_empty());
    assert!(allowed.iter().all(|p| t.pus().contains(p)));
    assert!(t.allowed_cores() >= 1 && t.allowed_cores() <= allowed.len());
    let p = Placement::new(&t, 0, &Policy::Compact, false).unwrap();
    assert_eq!(p.len(), t.allowed_cores());
    assert!(t.render_tree().contains("this machine"));
}

#[test]
fn allowed_set_follows_taskset() {
    if std::env::var_os(CHILD_ENV).is_some() {
        // In the child, restricted to CPU 0.
        let t = Topology::detect().unwrap();
        assert_eq!(t.allowed_pus(), vec![0]);
        assert_eq!(t.allowed_cores(), 1);
        let e = Placement::new(&t, 2, &Policy::Compact, false).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooManyShards {
                    asked: 2,
                    allowed: 1
                }
            ),
            "{e}"
        );
        let p = Placement::new(&t, 2, &Policy::Compact, true).unwrap();
        assert_eq!(p.cpus(), &[0, 0]);
        if t.pus().contains(&1) {
            let e = pin_current_thread(&t, 1).unwrap_err();
            assert!(matches!(e, Error::CpuNotAllowed { cpu: 1, .. }), "{e}");
        }
        return;
    }
    if Command::new("taskset").arg("--version").output().is_err() {
        println!("note: taskset (util-linux) not found; skipping the allowed-set check");
        return;
    }
    if !Topology::detect().unwrap().allowed_pus().contains(&0) {
        println!("note: CPU 0 is not allowed to this process; skipping the allowed-set check");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("taskset")
        .args(["-c", "0"])
        .arg(exe)
        .args(["allowed_set_follows_taskset", "--exact", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    common::assert_child_passed(&out);
}

#[test]
fn pin_to_an_allowed_cpu() {
    // In a thread of its own, so the pin does not leak into other tests.
    std::thread::spawn(|| {
        let t = Topology::detect().unwrap();
        let cpu = t.allowed_pus()[0];
        pin_current_thread(&t, cpu).unwrap();
        // detect() reads the calling thread's affinity: now just `cpu`.
        assert_eq!(Topology::detect().unwrap().allowed_pus(), vec![cpu]);
    })
    .join()
    .unwrap();
}

#[test]
fn pin_refuses_bad_requests() {
    let t = Topology::detect().unwrap();
    let e = pin_current_thread(&t, 100_000).unwrap_err();
    assert!(
        matches!(e, Error::CpuNotAllowed { cpu: 100_000, .. }),
        "{e}"
    );
    let s = Topology::synthetic("core:2 pu:1").unwrap();
    let e = pin_current_thread(&s, 0).unwrap_err();
    assert!(matches!(e, Error::SyntheticBind), "{e}");
    assert!(e.to_string().contains("Topology::detect()"), "{e}");
}
