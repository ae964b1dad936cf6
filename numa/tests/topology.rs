//! Topology queries and distances on synthetic and XML topologies.

mod common;

use xtc_numa::{Error, Level, Placement, Policy, Topology, VictimOrder, MATRIX_BASE};

/// A unique temporary file path for this test process.
fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("xtc-numa-{}-{name}", std::process::id()))
}

/// The 4-node machine with a NUMA latency matrix where node 0's nearest other node is
/// node 2, in the *other* package: the matrix must win over the levels.
const FOUR_NODES: &str = "pack:2 numa:2 l3:1 core:4 pu:2";
const MATRIX: [u64; 16] = [
    10, 21, 15, 30, //
    21, 10, 30, 15, //
    15, 30, 10, 21, //
    30, 15, 21, 10, //
];

#[test]
fn one_node_no_smt() {
    let t = Topology::synthetic("core:4 pu:1").unwrap();
    assert!(t.is_synthetic());
    assert_eq!(t.numa_nodes(), 1);
    assert_eq!(t.cores(), 4);
    assert_eq!(t.pus(), vec![0, 1, 2, 3]);
    assert_eq!(t.allowed_pus(), vec![0, 1, 2, 3]);
    assert_eq!(t.allowed_cores(), 4);
    assert_eq!(t.numa_node_of(3), Some(0));
    assert_eq!(t.core_of(2), Some(2));
    assert_eq!(t.numa_node_of(4), None);
    assert_eq!(t.distance(1, 1), 0);
    assert_eq!(t.distance(0, 3), Level::NumaNode as u64);
    assert!(!t.has_numa_matrix());
}

#[test]
fn one_node_smt() {
    let t = Topology::synthetic("pack:1 core:4 pu:2").unwrap();
    assert_eq!((t.packages(), t.numa_nodes(), t.cores()), (1, 1, 4));
    assert_eq!(t.pus(), (0..8).collect::<Vec<_>>());
    assert_eq!(t.allowed_cores(), 4);
    assert_eq!(t.core_of(5), Some(2));
    assert_eq!(t.level(4, 5), Some(Level::Core));
    assert_eq!(t.distance(4, 5), 1);
    assert_eq!(t.distance(0, 2), 4);
    assert_eq!(t.distance(0, 100), u64::MAX);
}

#[test]
fn no_core_level_one_node_over_packages() {
    // hwloc puts one NUMA node over both packages and no Core objects: each PU is a core.
    let t = Topology::synthetic("pack:2 pu:2").unwrap();
    // Each PU counts as a core, as for `allowed_cores` (this was 0).
    assert_eq!((t.packages(), t.numa_nodes(), t.cores()), (2, 1, 4));
    assert_eq!(t.allowed_cores(), 4);
    assert_eq!(t.core_of(0), None);
    assert_eq!(t.distance(0, 1), Level::NumaNode as u64);
    assert_eq!(t.distance(0, 2), Level::Machine as u64);
}

#[test]
fn caches_order_distances() {
    // 2 L2s of 2 cores of 2 PUs under one L3.
    let t = Topology::synthetic("pack:1 l3:1 l2:2 core:2 pu:2").unwrap();
    assert_eq!(t.distance(0, 0), 0);
    assert_eq!(t.distance(0, 1), 1);
    assert_eq!(t.distance(0, 2), 2);
    assert_eq!(t.distance(0, 4), 3);
    assert_eq!(t.level(0, 4), Some(Level::L3));
}

#[test]
fn two_packages_two_nodes() {
    let t = Topology::synthetic("pack:2 numa:1 core:2 pu:2").unwrap();
    assert_eq!((t.packages(), t.numa_nodes(), t.cores()), (2, 2, 4));
    assert_eq!(t.numa_node_of(3), Some(0));
    assert_eq!(t.numa_node_of(4), Some(1));
    assert_eq!(t.package_of(7), Some(1));
    assert_eq!(t.distance(0, 1), 1);
    assert_eq!(t.distance(0, 2), 4);
    assert_eq!(t.distance(0, 4), 6);
    assert_eq!(t.level(0, 4), Some(Level::Machine));
}

#[test]
fn four_nodes_levels() {
    let t = Topology::synthetic(FOUR_NODES).unwrap();
    assert_eq!((t.packages(), t.numa_nodes(), t.cores()), (2, 4, 16));
    assert_eq!(t.pus().len(), 32);
    assert_eq!(t.allowed_cores(), 16);
    assert_eq!(
        (0..32)
            .step_by(8)
            .map(|p| t.numa_node_of(p))
            .collect::<Vec<_>>(),
        vec![Some(0), Some(1), Some(2), Some(3)]
    );
    assert_eq!(t.distance(0, 1), 1); // SMT sibling
    assert_eq!(t.distance(0, 2), 3); // shared L3
    assert_eq!(t.distance(0, 8), 5); // other node, same package
    assert_eq!(t.distance(0, 16), 6); // other package
                                      // Strictly increasing levels.
    let ds = [0, 1, 2, 8, 16].map(|b| t.distance(0, b));
    assert!(ds.windows(2).all(|w| w[0] < w[1]), "{ds:?}");
}

#[test]
fn render_tree_shows_the_machine() {
    let t = Topology::synthetic(FOUR_NODES).unwrap();
    let tree = t.render_tree();
    assert!(tree.starts_with("Machine"), "{tree}");
    assert!(
        tree.contains("2 packages, 4 NUMA nodes, 16 cores, 32 PUs"),
        "{tree}"
    );
    assert_eq!(tree.matches("Package ").count(), 2, "{tree}");
    assert_eq!(tree.matches("NUMANode ").count(), 4, "{tree}");
    assert_eq!(tree.matches("L3 ").count(), 4, "{tree}");
    assert_eq!(tree.matches("Core ").count(), 16, "{tree}");
    assert_eq!(tree.matches("PU ").count(), 32, "{tree}");
    assert!(tree.contains("PU L#31 P#31"), "{tree}");
}

#[test]
fn matrix_distances_survive_xml() {
    let t = Topology::synthetic(FOUR_NODES)
        .unwrap()
        .with_numa_distances(&MATRIX)
        .unwrap();
    assert!(t.has_numa_matrix());
    let path = temp_path("matrix.xml");
    t.export_xml(&path).unwrap();
    let x = Topology::from_xml(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    for topo in [&t, &x] {
        assert!(topo.is_synthetic());
        assert!(topo.has_numa_matrix());
        assert_eq!(topo.allowed_pus().len(), 32);
        assert_eq!(topo.numa_nodes(), 4);
        // Intra-node: levels.
        assert_eq!(topo.distance(0, 0), 0);
        assert_eq!(topo.distance(0, 1), 1);
        assert_eq!(topo.distance(0, 2), 3);
        // Cross-node: MATRIX_BASE + matrix; node 2 (other package) nearer than node 1.
        assert_eq!(topo.distance(0, 16), MATRIX_BASE + 15);
        assert_eq!(topo.distance(0, 8), MATRIX_BASE + 21);
        assert_eq!(topo.distance(0, 24), MATRIX_BASE + 30);
        assert_eq!(topo.distance(8, 24), MATRIX_BASE + 15);
        assert!(topo.distance(0, 16) > Level::Machine as u64);
    }
    assert!(x.render_tree().contains("NUMA latency matrix"));
}

/// A second matrix replaces the first, as it does once exported and loaded again: hwloc keeps
/// every matrix added, and the first one found was used, so the new one was accepted (`Ok`)
/// and ignored.
#[test]
fn a_second_matrix_replaces_the_first() {
    let t = Topology::synthetic(FOUR_NODES)
        .unwrap()
        .with_numa_distances(&MATRIX)
        .unwrap();
    assert_eq!(t.distance(0, 16), MATRIX_BASE + 15);
    let flat: Vec<u64> = (0..16).map(|k| if k % 5 == 0 { 10 } else { 40 }).collect();
    let t = t.with_numa_distances(&flat).unwrap();
    let path = temp_path("second-matrix.xml");
    t.export_xml(&path).unwrap();
    let x = Topology::from_xml(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    for topo in [&t, &x] {
        assert_eq!(topo.distance(0, 16), MATRIX_BASE + 40);
        assert_eq!(topo.distance(0, 8), MATRIX_BASE + 40);
        assert!(
            topo.render_tree().contains("   40"),
            "{}",
            topo.render_tree()
        );
    }
}

#[test]
fn bad_matrix_and_inputs_are_errors() {
    let t = Topology::synthetic(FOUR_NODES).unwrap();
    let e = t.with_numa_distances(&[10, 20]).unwrap_err();
    assert!(matches!(
        e,
        Error::BadDistanceMatrix {
            nodes: 4,
            expected: 16,
            given: 2
        }
    ));
    let e = Topology::synthetic("pack:2 bogus:3").unwrap_err();
    assert!(matches!(e, Error::Hwloc { .. }), "{e}");
    assert!(e.to_string().contains("bogus"), "{e}");
    let e = Topology::from_xml(temp_path("does-not-exist.xml")).unwrap_err();
    assert!(matches!(e, Error::XmlFile { .. }), "{e}");
    let garbage = temp_path("garbage.xml");
    std::fs::write(&garbage, "this is not <xml").unwrap();
    let e = Topology::from_xml(&garbage).unwrap_err();
    let _ = std::fs::remove_file(&garbage);
    assert!(matches!(e, Error::Hwloc { .. }), "{e}");
}

#[test]
fn topology_is_send_sync_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<Topology>();
    check::<xtc_numa::Placement>();
    check::<xtc_numa::VictimOrder>();
    let t = Topology::synthetic("core:2 pu:1").unwrap();
    assert!(format!("{t:?}").contains("Topology"));
}

/// A core whose PUs hwloc puts in two NUMA nodes is still one core: one shard per core
/// before any SMT sibling (it counted as one core per node, and took two shards).
#[test]
fn a_core_spanning_numa_nodes_gets_one_shard_before_siblings() {
    let t = Topology::synthetic("pack:2 core:2 numa:2 pu:2").unwrap();
    assert_eq!(t.allowed_cores(), 4);
    let p = Placement::new(&t, 0, &Policy::Compact, false).unwrap();
    let mut cores: Vec<_> = p.cpus().iter().map(|&c| t.core_of(c).unwrap()).collect();
    cores.sort_unstable();
    cores.dedup();
    assert_eq!(cores.len(), p.len(), "shards on {:?} share cores", p.cpus());
}

/// Victims of the thief's own NUMA node come before any other node's, also when a node spans
/// packages (then, without a latency matrix, its members are as far by distance as another
/// node's, and came mixed with them).
#[test]
fn same_node_victims_come_first_when_a_node_spans_packages() {
    let t = Topology::synthetic("numa:2 pack:2 core:2 pu:2").unwrap();
    let p = Placement::new(&t, 0, &Policy::Compact, false).unwrap();
    let v = VictimOrder::new(&t, &p, 0).unwrap();
    for thief in 0..p.len() {
        let node = p.numa_node(thief);
        let list = v.victims(thief);
        let first_other = list
            .iter()
            .position(|&s| p.numa_node(s) != node)
            .unwrap_or(list.len());
        assert!(
            list[first_other..].iter().all(|&s| p.numa_node(s) != node),
            "shard {thief}: {list:?}\n{}",
            v.render()
        );
    }
}

/// A synthetic description with huge counts is an error at once, not minutes of hwloc
/// building objects until the process runs out of memory.
#[test]
fn a_huge_synthetic_topology_is_an_error() {
    let t0 = std::time::Instant::now();
    let e = Topology::synthetic("pack:65536 core:65536 pu:65536").unwrap_err();
    assert!(e.to_string().contains("PUs"), "{e}");
    // hwloc also reads bare counts, hexadecimal and octal ones (`strtoul(.., 0)`), and counts
    // of any length: each was read as 1 and passed, and hwloc then built the tree (90,000
    // PUs took 40 s here).
    for huge in [
        "300 300",
        "pack:0x101 pu:0x100",
        "pack:0401 pu:0400",
        "pack:2 pu:1000000000000000000000000000000000000000000",
    ] {
        let e = Topology::synthetic(huge).unwrap_err();
        assert!(e.to_string().contains("PUs"), "{huge}: {e}");
    }
    assert!(Topology::synthetic("pack:4 numa:2 core:16 pu:2").is_ok());
    assert!(Topology::synthetic("2 2 pu:0x2").is_ok());
    // Signed counts too (`strtoul` takes a sign; a `-` wraps to nearly 2^64): each was read
    // as 1, and "pack:+2 core:+200 pu:+170" built 68,000 PUs in 15 s and 1.4 GB.
    for signed in [
        "pack:+2 core:+200 pu:+170",
        "pu:-18446744073709481616",
        "pu:+0x10001",
    ] {
        let e = Topology::synthetic(signed).unwrap_err();
        assert!(e.to_string().contains("PUs"), "{signed}: {e}");
    }
    assert!(Topology::synthetic("pack:+2 pu:+2").is_ok());
    // A negative count is named as one, not as a 39-digit number of PUs.
    let e = Topology::synthetic("pack:2 pu:-1").unwrap_err().to_string();
    assert!(
        e.contains("negative") && !e.contains(&u128::MAX.to_string()),
        "{e}"
    );
    // hwloc needs no space between levels, after a count or an attribute block: each of these
    // was read as one level and built (131,072 PUs).
    for glued in ["pack:4core:128pu:256", "pack:2(memory=1)core:200pu:170"] {
        let e = Topology::synthetic(glued).unwrap_err();
        assert!(e.to_string().contains("PUs"), "{glued}: {e}");
    }
    assert_eq!(
        Topology::synthetic("pack:2core:2pu:2").unwrap().pus().len(),
        8
    );
    // After a root attribute block too: "()65537" built 65,537 PUs for minutes.
    for rooted in ["()65537", "(memory=1GB)2 256 256", "()4 128 pu:256"] {
        let e = Topology::synthetic(rooted).unwrap_err();
        assert!(e.to_string().contains("PUs"), "{rooted}: {e}");
    }
    println!("refused in {:?}", t0.elapsed());
}

/// hwloc's cost grows with the square of a level's width and of the PU count: a flat
/// `pu:16384` under the old 65,536-PU bound ran 42 s, `pu:65536` about half an hour. Wide
/// levels and more than 8,192 PUs are refused at once; nesting the same PUs still works.
#[test]
fn a_wide_or_large_synthetic_topology_is_an_error() {
    for (desc, says) in [
        ("core:2048 pu:1", "objects under each parent"),
        ("pack:2 pu:1025", "objects under each parent"),
        ("pu:8193", "PUs"),
        ("pack:16 core:1024 pu:1", "PUs"),
    ] {
        let e = Topology::synthetic(desc).unwrap_err();
        assert!(e.to_string().contains(says), "{desc}: {e}");
    }
    assert_eq!(Topology::synthetic("pu:1024").unwrap().pus().len(), 1024);
    assert_eq!(
        Topology::synthetic("pack:2 numa:2 core:16 pu:2")
            .unwrap()
            .pus()
            .len(),
        128
    );
}

/// NUMA nodes attached with `[numa]` count too: each block adds one node under every object of
/// the level before it, and hwloc's cost grows faster than their number (16,000 took 11 s
/// here, 7 bytes of description each). The guard skipped the blocks, so a long description of
/// them ran for hours; it is refused at once now, and a few attached nodes still load.
#[test]
fn many_attached_numa_nodes_are_an_error() {
    let many = format!("pack:8 core:2 {}pu:1", "[numa] ".repeat(20_000));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Topology::synthetic(&many).map(|t| t.numa_nodes()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("320,000 attached NUMA nodes were built, not refused");
    let e = got.unwrap_err();
    assert!(e.to_string().contains("NUMA nodes"), "{e}");
    // One per object of the level before each block: 2 x 8,000 nodes.
    let e = Topology::synthetic("pack:8 core:1000 [numa] [numa] pu:1").unwrap_err();
    assert!(e.to_string().contains("NUMA nodes"), "{e}");
    let t = Topology::synthetic("pack:4 [numa] [numa] core:2 pu:1").unwrap();
    assert_eq!(t.numa_nodes(), 8);
}

/// A synthetic description naming huge OS indexes is an error at once: hwloc sizes every
/// object's CPU set to the largest index, and two PUs numbered 0 and 10^9 took 2.7 s and
/// 1.2 GB (a few dozen near 2^32, tens of GB).
#[test]
fn huge_synthetic_os_indexes_are_an_error() {
    // hwloc reads an explicit list in base 10: a leading 0 is no octal there.
    for huge in [
        "pack:1 pu:2(indexes=0,1000000000)",
        "pack:1 pu:2(indexes=0,099999999)",
    ] {
        let e = Topology::synthetic(huge).unwrap_err();
        assert!(e.to_string().contains("OS index"), "{huge}: {e}");
    }
    let t = Topology::synthetic("pack:1 pu:2(indexes=0,7)").unwrap();
    assert_eq!(t.pus().len(), 2);
}

/// `from_xml` reads a bounded amount: a path to an endless stream (`/dev/zero`) or an
/// oversized file is an `Err` naming the limit, not a read that grows until the process is
/// killed for memory.
#[test]
fn an_endless_or_huge_xml_file_is_an_error() {
    let e = Topology::from_xml("/dev/zero").unwrap_err();
    assert!(matches!(e, Error::XmlFile { .. }), "{e}");
    assert!(e.to_string().contains("MiB"), "{e}");

    // A sparse file just over the limit: no disk space used.
    let big = temp_path("huge.xml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(64 * 1024 * 1024 + 1).unwrap();
    drop(f);
    let e = Topology::from_xml(&big).unwrap_err();
    let _ = std::fs::remove_file(&big);
    assert!(matches!(e, Error::XmlFile { .. }), "{e}");
    assert!(e.to_string().contains("64 MiB"), "{e}");
}

/// An XML file may name a PU OS index above what hwloc's CPU sets hold (2^31 − 1); hwloc keeps
/// it (the PU's CPU set disagrees), and looking it up in a CPU set panicked in hwlocality
/// ("Bitmap index is out of the accepted 0..=c_int::MAX range"): an `Err` naming the index
/// now. Runs in debug builds too: the workspace builds hwlocality without debug assertions
/// (`Cargo.toml`), whose consistency check would otherwise abort the process on this file first.
#[test]
fn an_xml_pu_os_index_beyond_cpu_sets_is_an_error() {
    let xml = synthetic_xml("pu:2", "pu-index-good.xml");
    let edited = xml.replacen(
        "type=\"PU\" os_index=\"1\"",
        "type=\"PU\" os_index=\"3000000000\"",
        1,
    );
    assert_ne!(edited, xml, "the export's format changed: {xml}");
    let e = from_xml_text(&edited, "pu-index-bad.xml").unwrap_err();
    assert!(matches!(e, Error::Hwloc { .. }), "{e}");
    assert!(e.to_string().contains("3000000000"), "{e}");
}

/// An XML file may give two PUs the same OS index (hwloc keeps what the file says); the
/// topology listed that CPU twice among the allowed ones, and a placement without
/// oversubscription put two shards on it (8 shards on 7 CPUs passed). An `Err` naming the
/// index now.
#[test]
fn an_xml_pu_os_index_given_twice_is_an_error() {
    let xml = synthetic_xml("core:4 pu:2", "pu-twice-good.xml");
    let edited = xml.replacen(
        "type=\"PU\" os_index=\"5\"",
        "type=\"PU\" os_index=\"4\"",
        1,
    );
    assert_ne!(edited, xml, "the export's format changed: {xml}");
    let e = from_xml_text(&edited, "pu-twice-bad.xml").unwrap_err();
    assert!(matches!(e, Error::Hwloc { .. }), "{e}");
    assert!(e.to_string().contains("OS index 4"), "{e}");
}

/// Set, to the test's name, in the child process that [`in_child`] starts.
const CHILD_ENV: &str = "XTC_NUMA_TEST_CHILD";

/// Whether this is the child process of test `name`. In the parent, runs that test again in a
/// child process, fails unless it passed there, and returns false: a description on which
/// hwloc aborts the process then fails that test alone, with hwloc's message.
fn in_child(name: &str) -> bool {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .unwrap();
    common::assert_child_passed(&out);
    false
}

/// A synthetic level of memory-side caches, under any spelling hwloc takes for one, is an
/// `Err`: hwloc parsed it and then aborted the process on an assertion while building the tree
/// (no `Err`, no panic to catch), so a mistyped `--synthetic` ended the whole program.
#[test]
fn a_memory_side_cache_level_is_an_error() {
    if !in_child("a_memory_side_cache_level_is_an_error") {
        return;
    }
    for desc in [
        "memcache:2 pu:2",
        "pack:2 MemCache:1 core:2 pu:1",
        "memca:1 pu:1",
        "pack:1memca:1pu:1",
        "(memory=1GB)memcache:1 pu:1",
        "pack:2 memcache:2 [numa] pu:2",
        "memory-side:1 pu:1",
        "Memory-Side Cache:1 pu:1",
    ] {
        match Topology::synthetic(desc) {
            Err(e @ Error::Hwloc { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("memory-side cache"), "{desc}: {msg}");
            }
            other => panic!("{desc}: expected Err(Hwloc), got {other:?}"),
        }
    }
    // Names hwloc does not take for a memory-side cache are left to hwloc, as before.
    assert!(Topology::synthetic("memc:2 pu:2").is_err());
    assert!(Topology::synthetic("memory:2 pu:2").is_err());
    assert_eq!(
        Topology::synthetic("pack:2 [numa] core:2 pu:2")
            .unwrap()
            .pus()
            .len(),
        8
    );
}

/// An `indexes=` interleaving pattern hwloc cannot process is an `Err`: by type
/// (`indexes=core` on a level above the cores) hwloc failed its `step` assertion, and by
/// `step*count` loops whose counts multiply to 2^64 its `nbs` one, either way aborting the
/// process. Explicit lists and ordinary loops still work.
#[test]
fn an_index_interleaving_hwloc_aborts_on_is_an_error() {
    if !in_child("an_index_interleaving_hwloc_aborts_on_is_an_error") {
        return;
    }
    for desc in [
        "pack:2(indexes=core) core:2 pu:2",
        "pack:2 [numa(indexes=core)] core:2 pu:1",
        "pack:2 core:2 pu:2(indexes=core:pack)",
        "pu:2(indexes=1*65536:1*65536:1*65536:1*65536)",
        "pu:4(indexes=1*0x10000:1*0200000:1*65536:1*65536)",
        "pu:4(indexes=1*-65536:1*65536:1*65536:1*65536)",
    ] {
        match Topology::synthetic(desc) {
            Err(e @ Error::Hwloc { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("interleaving") && msg.contains("indexes=0,2,1,3"),
                    "{desc}: {msg}"
                );
            }
            other => panic!("{desc}: expected Err(Hwloc), got {other:?}"),
        }
    }
    // An explicit list renumbers the PUs; step*count loops are taken as before.
    let t = Topology::synthetic("pack:1 core:2 pu:2(indexes=0,2,1,3)").unwrap();
    assert_eq!(t.core_of(2), Some(0));
    assert_eq!(
        Topology::synthetic("pack:2 core:2 pu:2(indexes=2*2:1*2:4*2)")
            .unwrap()
            .pus(),
        (0..8).collect::<Vec<_>>()
    );
    assert!(Topology::synthetic("pu:4(indexes=1*2:2*2)").is_ok());
}

/// A PU level whose `indexes=` list has fewer indexes than PUs is an `Err`: hwloc ignored such
/// a list without a word and numbered the PUs 0, 1, 2, ... (`pack:2 core:2 pu:2(indexes=3,2)`
/// came out as PUs 0 to 7). From a review. Of a longer list hwloc uses the first entries, one
/// per PU, so that one (and a trailing comma) is taken, and only those entries must differ.
#[test]
fn a_pu_index_list_shorter_than_the_pus_is_an_error() {
    for (desc, listed, pus) in [
        ("pack:2 core:2 pu:2(indexes=3,2)", 2, 8),
        ("pu:3(indexes=0,1,)", 2, 3),
        ("pack:2 pu:2(indexes=3,2,1) [numa]", 3, 4),
    ] {
        match Topology::synthetic(desc) {
            Err(e @ Error::Hwloc { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("has {listed} entries for {pus} PUs")),
                    "{desc}: {msg}"
                );
            }
            other => panic!("{desc}: expected Err(Hwloc), got {other:?}"),
        }
    }
    let t = Topology::synthetic("pack:2 core:2 pu:2(indexes=7,6,5,4,3,2,1,0)").unwrap();
    assert_eq!(t.pus().len(), 8);
    let t = Topology::synthetic("pack:2 pu:2(indexes=0,2,1,3,9)").unwrap();
    assert_eq!(t.pus(), vec![0, 1, 2, 3]);
    let t = Topology::synthetic("pu:2(indexes=5,4,)").unwrap();
    assert_eq!(t.pus(), vec![4, 5]);
    let t = Topology::synthetic("pu:2(indexes=0,1,1)").unwrap();
    assert_eq!(t.pus(), vec![0, 1]);
}

/// A synthetic description whose PU level lists an OS index twice is an `Err`: hwloc merged
/// those PUs into one and built a smaller machine than described (`pu:2(indexes=0,0)` had one
/// PU, `pack:2 pu:2(indexes=0,1,0,1)` one package), or printed a banner about invalid
/// information from the operating system and built a mangled tree (a PU under no core). Other
/// levels may repeat an OS index, as cores of different packages do on Linux.
#[test]
fn a_pu_os_index_listed_twice_is_an_error() {
    for desc in [
        "pu:2(indexes=0,0)",
        "pack:2 pu:2(indexes=0,1,0,1)",
        "core:2 pu:2(indexes=0,1,1,2)",
        "2 2(indexes=0,0,1,1)",
        "pack:2 pu:2(indexes=0,1,2,1) [numa]",
    ] {
        match Topology::synthetic(desc) {
            Err(e @ Error::Hwloc { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("OS index 1 twice") || msg.contains("OS index 0 twice"),
                    "{desc}: {msg}"
                );
                assert!(msg.contains("its own OS index"), "{desc}: {msg}");
            }
            other => panic!("{desc}: expected Err(Hwloc), got {other:?}"),
        }
    }
    // Distinct PU indexes, and repeated ones on other levels, are taken as before.
    let t = Topology::synthetic("pack:2 pu:2(indexes=3,2,1,0)").unwrap();
    assert_eq!(t.pus(), vec![0, 1, 2, 3]);
    let t = Topology::synthetic("pack:2 core:2(indexes=0,1,0,1) pu:1").unwrap();
    assert_eq!((t.packages(), t.cores(), t.pus().len()), (2, 4, 4));
}

/// 126 levels and no NUMA level is an `Err`: hwloc 2.9, inserting its NUMA level, copied one
/// level past the end of its 128-entry array (a heap overflow; a fortified libhwloc aborts the
/// process). Levels are capped at 32. From an audit.
#[test]
fn a_synthetic_description_of_126_levels_is_an_error() {
    if !in_child("a_synthetic_description_of_126_levels_is_an_error") {
        return;
    }
    let desc = "group:1 ".repeat(125) + "pu:1";
    match Topology::synthetic(&desc) {
        Err(e @ Error::Hwloc { .. }) => assert!(e.to_string().contains("126 levels"), "{e}"),
        other => panic!("expected Err(Hwloc), got {other:?}"),
    }
    assert!(Topology::synthetic(&("group:1 ".repeat(30) + "pu:2")).is_ok());
}

/// Levels of one object each under a wide level are an `Err` past 24,576 objects in all: they
/// passed every bound (width, PUs) and hwloc spent about a second per level (122 of them under
/// `pack:8 core:1024`: 151 s). `pack:8 core:1024 pu:1` still loads. From an audit.
#[test]
fn many_objects_over_all_levels_are_an_error() {
    let e = Topology::synthetic("pack:8 core:1024 group:1 group:1 pu:1").unwrap_err();
    assert!(e.to_string().contains("objects over all its levels"), "{e}");
    assert_eq!(
        Topology::synthetic("pack:8 core:1024 pu:1")
            .unwrap()
            .pus()
            .len(),
        8192
    );
}

/// An XML object without one of its CPU or node sets is an `Err`: hwloc 2.9 accepted it and
/// then crashed (SIGSEGV) building the tree, through `from_xml` and through `HWLOC_XMLFILE`.
/// From an audit.
#[test]
fn an_xml_object_without_one_of_its_sets_is_an_error() {
    if !in_child("an_xml_object_without_one_of_its_sets_is_an_error") {
        return;
    }
    let xml = synthetic_xml("pack:1 core:2 pu:1", "sets-good.xml");
    for attr in ["complete_cpuset", "complete_nodeset"] {
        // The first ` attr="value"` gone.
        let at = xml.find(&format!(" {attr}=\"")).expect(attr);
        let value = at + attr.len() + 3;
        let end = value + xml[value..].find('"').unwrap() + 1;
        let edited = format!("{}{}", &xml[..at], &xml[end..]);
        match from_xml_text(&edited, &format!("sets-bad-{attr}.xml")) {
            Err(e @ Error::Hwloc { .. }) => assert!(e.to_string().contains(attr), "{e}"),
            other => panic!("{attr}: expected Err(Hwloc), got {other:?}"),
        }
    }
    // The export itself loads.
    assert_eq!(from_xml_text(&xml, "sets-good.xml").unwrap().pus().len(), 2);
}

/// An attribute block with two `indexes=` lists, or a list with an empty entry, is an `Err`:
/// hwloc uses the last list (the checks read the first) and drops a list with a gap, so
/// `pu:2(indexes=0,1 indexes=1,1)` built a machine of one PU. From an audit.
#[test]
fn ambiguous_index_lists_are_an_error() {
    for desc in [
        "pu:2(indexes=0,1 indexes=1,1)",
        "core:2 pu:2(indexes=0,1,2,3 indexes=3,3,1,0)",
        "pu:3(indexes=0,,1,2)",
        "pu:2(indexes=,0,1)",
    ] {
        match Topology::synthetic(desc) {
            Err(Error::Hwloc { .. }) => {}
            other => panic!("{desc}: expected Err(Hwloc), got {other:?}"),
        }
    }
    // One trailing comma ends a list, for hwloc too.
    assert_eq!(
        Topology::synthetic("pu:2(indexes=1,0,)").unwrap().pus(),
        vec![0, 1]
    );
}

/// An XML export of `desc` with the root's `attr` (`allowed_cpuset`, `allowed_nodeset`) set to
/// `mask`, loaded back: a machine whose cgroup or affinity leaves some of it out.
fn with_root_mask(desc: &str, attr: &str, mask: &str) -> Topology {
    let name = format!("mask-{attr}-{mask}.xml");
    let xml = synthetic_xml(desc, &name);
    let key = format!(" {attr}=\"");
    let at = xml.find(&key).expect(attr) + key.len();
    let end = at + xml[at..].find('"').unwrap();
    from_xml_text(&format!("{}{mask}{}", &xml[..at], &xml[end..]), &name).unwrap()
}

/// hwloc's XML export of the synthetic machine `desc`, as text (through a temporary file
/// named `name`, removed again).
fn synthetic_xml(desc: &str, name: &str) -> String {
    let path = temp_path(name);
    Topology::synthetic(desc)
        .unwrap()
        .export_xml(&path)
        .unwrap();
    let xml = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    xml
}

/// `Topology::from_xml` of `xml`, written to a temporary file named `name` (removed again).
fn from_xml_text(xml: &str, name: &str) -> xtc_numa::Result<Topology> {
    let path = temp_path(name);
    std::fs::write(&path, xml).unwrap();
    let t = Topology::from_xml(&path);
    let _ = std::fs::remove_file(&path);
    t
}

/// A memory node the cgroup leaves out (`cpuset.mems`, as `docker --cpuset-mems`) is gone from
/// the tree: its PUs, still known, have no node, and form a group of their own for placement
/// and the victim order, kept apart from node 0 at sensitivity 2. As documented on
/// `numa_node_of`; from an audit.
#[test]
fn pus_whose_memory_node_is_left_out_have_no_node_and_group_together() {
    let t = with_root_mask("pack:2 numa:1 core:2 pu:1", "allowed_nodeset", "0x00000001");
    assert_eq!(t.numa_nodes(), 1);
    assert_eq!(t.pus(), vec![0, 1, 2, 3]);
    assert_eq!(t.numa_node_of(0), Some(0));
    assert_eq!(t.numa_node_of(2), None);
    assert_eq!(t.numa_node_of(3), None);
    let p = Placement::new(&t, 2, &Policy::Spread, false).unwrap();
    assert_eq!(
        p.cpus(),
        &[0, 2],
        "spread over node 0 and the node-less group"
    );
    let p = Placement::new(&t, 4, &Policy::Compact, false).unwrap();
    let v = VictimOrder::new(&t, &p, 2).unwrap();
    for (shard, victims) in [(0, vec![1]), (1, vec![0]), (2, vec![3]), (3, vec![2])] {
        assert_eq!(
            v.victims(shard),
            &victims[..],
            "shard {shard}, sensitivity 2"
        );
    }
}

/// Spread over nodes of different sizes (the affinity leaves node 1 one core of three): shard
/// `i` goes to node `i % nodes` while every node has cores left, then to the rest in order.
/// From an audit.
#[test]
fn spread_over_nodes_of_different_sizes() {
    let t = with_root_mask("pack:2 numa:1 core:3 pu:1", "allowed_cpuset", "0x0000000f");
    assert_eq!(t.allowed_pus(), vec![0, 1, 2, 3]);
    let p = Placement::new(&t, 4, &Policy::Spread, false).unwrap();
    assert_eq!(p.cpus(), &[0, 3, 1, 2]);
    let nodes: Vec<_> = p.cpus().iter().map(|&c| t.numa_node_of(c)).collect();
    assert_eq!(nodes, vec![Some(0), Some(1), Some(0), Some(0)]);
}
