//! Victim order per shard: nearest first, rotated ties, NUMA sensitivity 0/1/2.

use xtc_numa::{Error, Placement, Policy, Topology, VictimOrder};

fn order(desc: &str, shards: usize, policy: &Policy, over: bool, sens: u8) -> Vec<Vec<usize>> {
    let t = Topology::synthetic(desc).unwrap();
    let p = Placement::new(&t, shards, policy, over).unwrap();
    let v = VictimOrder::new(&t, &p, sens).unwrap();
    assert_eq!(v.len(), p.len());
    assert_eq!(v.numa_sensitivity(), sens);
    (0..p.len()).map(|s| v.victims(s).to_vec()).collect()
}

#[test]
fn one_node_ties_rotate() {
    let expected = vec![vec![1, 2, 3], vec![2, 3, 0], vec![3, 0, 1], vec![0, 1, 2]];
    for sens in 0..=2 {
        assert_eq!(
            order("core:4 pu:1", 0, &Policy::Compact, false, sens),
            expected
        );
    }
}

#[test]
fn smt_sibling_first() {
    // Shards 0..4 on cores 0..3 (cpus 0 2 4 6), shards 4..8 on their siblings (1 3 5 7).
    let v = order("pack:1 core:4 pu:2", 8, &Policy::Compact, false, 1);
    assert_eq!(v[0], [4, 1, 2, 3, 5, 6, 7]);
    assert_eq!(v[5], [1, 6, 7, 0, 2, 3, 4]);
    assert_eq!(v[7], [3, 0, 1, 2, 4, 5, 6]);
}

#[test]
fn two_nodes_each_sensitivity() {
    // Spread: shards 0 1 2 3 on cpus 0 4 2 6, nodes 0 1 0 1.
    let d = "pack:2 numa:1 core:2 pu:2";
    let s0 = order(d, 4, &Policy::Spread, false, 0);
    assert_eq!(
        s0,
        vec![vec![2, 1, 3], vec![3, 2, 0], vec![0, 3, 1], vec![1, 0, 2]]
    );
    let s1 = order(d, 4, &Policy::Spread, false, 1);
    assert_eq!(s1, vec![vec![2, 1, 3], vec![3, 2, 0], vec![0], vec![1]]);
    let s2 = order(d, 4, &Policy::Spread, false, 2);
    assert_eq!(s2, vec![vec![2], vec![3], vec![0], vec![1]]);
    // Compact: shards 0 1 on node 0, 2 3 on node 1; first of each node: 0 and 2.
    let c1 = order(d, 4, &Policy::Compact, false, 1);
    assert_eq!(c1, vec![vec![1, 2, 3], vec![0], vec![3, 0, 1], vec![2]]);
}

#[test]
fn four_nodes_each_sensitivity() {
    // Spread: shards 0..8 on cpus 0 8 16 24 2 10 18 26, nodes 0 1 2 3 0 1 2 3;
    // nodes 0, 1 in package 0, nodes 2, 3 in package 1.
    let d = "pack:2 numa:2 l3:1 core:4 pu:2";
    let s1 = order(d, 8, &Policy::Spread, false, 1);
    assert_eq!(s1[0], [4, 1, 5, 2, 3, 6, 7]);
    assert_eq!(s1[2], [6, 3, 7, 4, 5, 0, 1]);
    assert_eq!(s1[3], [7, 6, 2, 4, 5, 0, 1]);
    assert_eq!(s1[4], [0]);
    assert_eq!(s1[5], [1]);
    assert_eq!(s1[7], [3]);
    let s0 = order(d, 8, &Policy::Spread, false, 0);
    assert_eq!(s0[0], s1[0]);
    assert_eq!(s0[5], [1, 0, 4, 6, 7, 2, 3]);
    let s2 = order(d, 8, &Policy::Spread, false, 2);
    assert_eq!(s2, (0..8).map(|s| vec![(s + 4) % 8]).collect::<Vec<_>>());
}

#[test]
fn numa_matrix_orders_nodes() {
    // Node 0's nearest other node is node 2 (other package), then node 1, then node 3.
    let matrix = [
        10, 21, 15, 30, 21, 10, 30, 15, 15, 30, 10, 21, 30, 15, 21, 10,
    ];
    let t = Topology::synthetic("pack:2 numa:2 l3:1 core:4 pu:2")
        .unwrap()
        .with_numa_distances(&matrix)
        .unwrap();
    let path = std::env::temp_dir().join(format!("xtc-numa-{}-victims.xml", std::process::id()));
    t.export_xml(&path).unwrap();
    let x = Topology::from_xml(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    // Compact, one shard per core: shards 4n..4n+4 on node n.
    let p = Placement::new(&x, 0, &Policy::Compact, false).unwrap();
    assert_eq!(p.len(), 16);
    let v = VictimOrder::new(&x, &p, 0).unwrap();
    assert_eq!(
        v.victims(0),
        [1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    );
    assert_eq!(
        v.victims(5),
        [6, 7, 4, 12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11]
    );
    let v1 = VictimOrder::new(&x, &p, 1).unwrap();
    assert_eq!(v1.victims(0), v.victims(0));
    assert_eq!(v1.victims(1), [2, 3, 0]);
    assert_eq!(v1.victims(4), v.victims(4));
    let text = v.render();
    assert!(text.contains("[31]"), "{text}"); // MATRIX_BASE 16 + 15
}

#[test]
fn oversubscribed_same_cpu_first() {
    // cpus 0 1 0 1 0
    let v = order("core:2 pu:1", 5, &Policy::Compact, true, 1);
    assert_eq!(v[0], [2, 4, 1, 3]);
    assert_eq!(v[1], [3, 2, 4, 0]);
    assert_eq!(v[2], [4, 0, 3, 1]);
    assert_eq!(v[4], [0, 2, 1, 3]);
}

#[test]
fn single_shard_and_bad_input() {
    let t = Topology::synthetic("core:4 pu:1").unwrap();
    let p = Placement::new(&t, 1, &Policy::Compact, false).unwrap();
    let v = VictimOrder::new(&t, &p, 1).unwrap();
    assert!(v.victims(0).is_empty());
    assert!(v.victims(7).is_empty());
    assert!(v.render().contains("(none)"));
    let e = VictimOrder::new(&t, &p, 3).unwrap_err();
    assert!(matches!(e, Error::BadSensitivity { given: 3 }), "{e}");
    assert!(e.to_string().contains("use 0"), "{e}");
}

#[test]
fn render_groups_by_distance() {
    let t = Topology::synthetic("pack:2 numa:1 core:2 pu:2").unwrap();
    let p = Placement::new(&t, 4, &Policy::Spread, false).unwrap();
    let v = VictimOrder::new(&t, &p, 0).unwrap();
    let text = v.render();
    assert!(
        text.contains("shard   0 (node 0): 2 [4] | 1 3 [6]"),
        "{text}"
    );
}

/// A placement of far more shards than any executor runs (oversubscribed on a large topology,
/// as the demo's `--shards N --oversubscribe` allows) is refused at once: the N·(N−1) victim
/// tables of 65,536 shards computed for hours and ended in an out-of-memory kill.
#[test]
fn a_huge_placement_is_refused_not_computed() {
    let t = Topology::synthetic("pu:1024").unwrap();
    let p = Placement::new(&t, 65_536, &Policy::Compact, true).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(VictimOrder::new(&t, &p, 1).map(|v| v.len()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the victim tables of 65,536 shards were computed, not refused");
    let e = got.unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooManyForVictims {
                shards: 65_536,
                max: xtc_numa::MAX_VICTIM_SHARDS
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("at most"), "{e}");
    // Up to the bound still works (one per PU of an 8,192-PU machine is the largest).
    let t = Topology::synthetic("pu:16").unwrap();
    let p = Placement::new(&t, 32, &Policy::Compact, true).unwrap();
    assert_eq!(VictimOrder::new(&t, &p, 1).unwrap().len(), 32);
}
