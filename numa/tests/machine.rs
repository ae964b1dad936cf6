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

/// Set in the child processes of `detect_refuses_a_machine_hwloc_was_told_to_describe`:
/// which case the child runs.
const HWLOC_ENV_CHILD: &str = "XTC_NUMA_HWLOC_ENV_CHILD";

/// hwloc describes the machine of `HWLOC_SYNTHETIC` (or `HWLOC_XMLFILE`) instead of this one
/// when the variable is set, and its binding calls then succeed without pinning anything:
/// `detect` took that machine for this one, so pinning silently did nothing, and a
/// description hwloc aborts on (`memcache:2`) ended the process. Now: refused with an error
/// naming the variable; with `HWLOC_THISSYSTEM=1` (the description is of this machine) a
/// valid one is used, and an aborting one is refused before hwloc sees it. Each case runs in
/// a child process (the environment is process-wide).
#[test]
fn detect_refuses_a_machine_hwloc_was_told_to_describe() {
    if let Some(case) = std::env::var_os(HWLOC_ENV_CHILD) {
        let r = Topology::detect();
        match case.to_str().unwrap() {
            "synthetic" => {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("HWLOC_SYNTHETIC"), "{e}");
                assert!(e.contains("unset"), "the error says what to do: {e}");
            }
            "xml" => {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("HWLOC_XMLFILE="), "{e}");
                assert!(
                    e.contains("HWLOC_THISSYSTEM=1"),
                    "the error says what to do: {e}"
                );
            }
            "aborting" => {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("memory-side cache"), "{e}");
                assert!(e.contains("HWLOC_SYNTHETIC="), "names the variable: {e}");
            }
            "xml-endless" => {
                // `/dev/zero` as this machine's XML: refused after the size cap, not read
                // until memory runs out (hwloc reads the whole file).
                let e = r.unwrap_err().to_string();
                assert!(e.contains("HWLOC_XMLFILE=\"/dev/zero\""), "{e}");
                assert!(e.contains("MiB"), "says why: {e}");
            }
            "this-system-zero" => {
                // hwloc's own variable says "not this system": named, with what to do.
                let e = r.unwrap_err().to_string();
                assert!(e.contains("HWLOC_THISSYSTEM=\"0\""), "{e}");
                assert!(
                    e.contains("a HWLOC_THISSYSTEM of 0"),
                    "says what to do: {e}"
                );
            }
            "xml-missing-set" => {
                // An object without its `complete_cpuset`: refused before hwloc, which
                // crashed (SIGSEGV) building the tree.
                let e = r.unwrap_err().to_string();
                assert!(e.contains("HWLOC_XMLFILE="), "{e}");
                assert!(e.contains("complete_cpuset"), "says why: {e}");
            }
            "this-system" => {
                let t = r.unwrap();
                assert_eq!(t.pus().len(), 2, "the described machine: {:?}", t.pus());
            }
            "distances" => {
                // Two nodes of one PU each, described as this machine's CPUs 0 and 1: the
                // allowed PUs stay those `detect` read, whatever this thread is pinned to
                // when a distance matrix is added (it re-read this thread's affinity).
                let t = r.unwrap();
                assert_eq!(t.allowed_pus(), vec![0, 1]);
                pin_current_thread(&t, 0).unwrap();
                let t = t.with_numa_distances(&[10, 20, 20, 10]).unwrap();
                assert_eq!(
                    t.allowed_pus(),
                    vec![0, 1],
                    "the pin narrowed the allowed PUs"
                );
                Placement::new(&t, 2, &Policy::Compact, false).unwrap();
            }
            other => panic!("unknown case {other}"),
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // An XML file of another machine, as `lstopo file.xml` writes one.
    let xml = std::env::temp_dir().join(format!("xtc-numa-other-{}.xml", std::process::id()));
    Topology::synthetic("pack:1 core:2 pu:1")
        .unwrap()
        .export_xml(&xml)
        .unwrap();
    let out = Command::new(&exe)
        .args([
            "detect_refuses_a_machine_hwloc_was_told_to_describe",
            "--exact",
            "--test-threads=1",
        ])
        .env(HWLOC_ENV_CHILD, "xml")
        .env("HWLOC_XMLFILE", &xml)
        .env_remove("HWLOC_SYNTHETIC")
        .env_remove("HWLOC_THISSYSTEM")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&xml);
    common::assert_child_passed(&out);
    let out = Command::new(&exe)
        .args([
            "detect_refuses_a_machine_hwloc_was_told_to_describe",
            "--exact",
            "--test-threads=1",
        ])
        .env(HWLOC_ENV_CHILD, "xml-endless")
        .env("HWLOC_XMLFILE", "/dev/zero")
        .env("HWLOC_THISSYSTEM", "1")
        .env_remove("HWLOC_SYNTHETIC")
        .output()
        .unwrap();
    common::assert_child_passed(&out);
    let bad = std::env::temp_dir().join(format!("xtc-numa-noset-{}.xml", std::process::id()));
    Topology::synthetic("pack:1 core:2 pu:1")
        .unwrap()
        .export_xml(&bad)
        .unwrap();
    let good = std::fs::read_to_string(&bad).unwrap();
    let at = good.find(" complete_cpuset=\"").unwrap();
    let end = at + " complete_cpuset=\"".len();
    let end = end + good[end..].find('"').unwrap() + 1;
    std::fs::write(&bad, format!("{}{}", &good[..at], &good[end..])).unwrap();
    let out = Command::new(&exe)
        .args([
            "detect_refuses_a_machine_hwloc_was_told_to_describe",
            "--exact",
            "--test-threads=1",
        ])
        .env(HWLOC_ENV_CHILD, "xml-missing-set")
        .env("HWLOC_XMLFILE", &bad)
        .env("HWLOC_THISSYSTEM", "1")
        .env_remove("HWLOC_SYNTHETIC")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bad);
    common::assert_child_passed(&out);
    let mut cmd = Command::new(&exe);
    cmd.args([
        "detect_refuses_a_machine_hwloc_was_told_to_describe",
        "--exact",
        "--test-threads=1",
    ])
    .env(HWLOC_ENV_CHILD, "this-system-zero")
    .env("HWLOC_THISSYSTEM", "0");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HWLOC_") && k != "HWLOC_THISSYSTEM" {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("HWLOC_SYNTHETIC")
        .env_remove("HWLOC_XMLFILE");
    common::assert_child_passed(&cmd.output().unwrap());
    for (case, desc, this_system) in [
        ("synthetic", "pack:1 core:2 pu:1", false),
        ("aborting", "memcache:2 pu:2", true),
        ("this-system", "pack:1 core:2 pu:1", true),
        ("distances", "pack:1 numa:2 core:1 pu:1", true),
    ] {
        if case == "distances"
            && !Topology::detect()
                .unwrap()
                .allowed_pus()
                .starts_with(&[0, 1])
        {
            println!("note: CPUs 0 and 1 are not both allowed here; skipping the distances case");
            continue;
        }
        let mut cmd = Command::new(&exe);
        cmd.args([
            "detect_refuses_a_machine_hwloc_was_told_to_describe",
            "--exact",
            "--test-threads=1",
        ])
        .env(HWLOC_ENV_CHILD, case)
        .env("HWLOC_SYNTHETIC", desc)
        .env_remove("HWLOC_XMLFILE");
        if this_system {
            cmd.env("HWLOC_THISSYSTEM", "1");
        } else {
            cmd.env_remove("HWLOC_THISSYSTEM");
        }
        common::assert_child_passed(&cmd.output().unwrap());
    }
}
