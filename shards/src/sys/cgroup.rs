//! The CPU quota of this process's cgroup (a CFS bandwidth limit: `docker --cpus`, a
//! Kubernetes CPU limit), for the default shard count (`Builder::shards(0)`).
//!
//! Written here rather than taken from a crate: `std::thread::available_parallelism` reads the
//! same quota but folds it into one number with the affinity mask and SMT threads, where xtc
//! counts physical cores of the hwloc topology; the crates that read cgroups whole (cgroups-rs)
//! bring far more than two files.
//!
//! cgroup v2: `cpu.max` ("max 100000", or "QUOTA PERIOD" in microseconds) of the process's
//! cgroup and of each ancestor up to the mount's root, the smallest limit winning. cgroup v1:
//! `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`, the same way, in the hierarchy that
//! holds the `cpu` controller. Paths come from `/proc/self/cgroup` and `/proc/self/mountinfo`;
//! a path that is not under the mount's root (a container that sees the host's path) is read at
//! the mount point itself, the container's own cgroup. Anything missing or unreadable means no
//! limit.

use std::path::{Path, PathBuf};

/// The CPUs the quota allows, rounded down as `std::thread::available_parallelism` rounds them
/// (2.5 CPUs of quota: 2; at least 1), or `None` where no quota applies or none can be read.
/// Rounded up, the shards over the quota's whole CPUs all ran, and all were throttled. `root` is `/` (tests give a directory that mimics one). Cost: a
/// few small file reads; called once per `build()` with a default shard count.
pub(crate) fn cpu_limit(root: &Path) -> Option<usize> {
    // As bytes: mountinfo writes a mount's path raw but for four escapes, and a cgroup's name
    // may be any bytes; one such line elsewhere made the whole file unreadable as UTF-8, and
    // the quota was lost.
    let read = |p: &str| {
        let bytes = std::fs::read(root.join(p.trim_start_matches('/'))).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    };
    let groups = read("proc/self/cgroup")?;
    let mounts = read("proc/self/mountinfo")?;
    let mut best: Option<f64> = None;
    for line in groups.lines() {
        // "ID:CONTROLLERS:PATH"; v2's line is "0::PATH".
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "cpu") {
            continue;
        }
        let Some((mount_root, mount_point)) = mount_of(&mounts, v2, path) else {
            continue;
        };
        let dir = cgroup_dir(root, &mount_root, &mount_point, path);
        let limit = walk_up(&dir, &root.join(mount_point.trim_start_matches('/')), v2);
        best = match (best, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    best.map(|cpus| (cpus.floor() as usize).max(1))
}

/// The root and mount point of the cgroup2 mount (`v2`) or of the v1 mount holding the `cpu`
/// controller, from `/proc/self/mountinfo` (its `\NNN` escapes undone): the first whose root
/// holds the cgroup `path`, else the first of the kind.
fn mount_of(mountinfo: &str, v2: bool, path: &str) -> Option<(String, String)> {
    let mut mounts = mountinfo.lines().filter_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS"
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let fstype = right.next()?;
        let _source = right.next();
        let opts = right.next().unwrap_or("");
        let ours = if v2 {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup" && opts.split(',').any(|o| o == "cpu")
        };
        ours.then(|| Some((unescape(fields.get(3)?), unescape(fields.get(4)?))))
            .flatten()
    });
    let first = mounts.next()?;
    let holds = |(root, _): &(String, String)| {
        root == "/"
            || path
                .strip_prefix(root.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if holds(&first) {
        return Some(first);
    }
    Some(mounts.find(holds).unwrap_or(first))
}

/// A mountinfo field with its octal escapes (`\040` for a space, `\011`, `\012`, `\134`)
/// undone.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(
                    d.iter()
                        .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of cgroup `path` under its mount: `path` made relative to the mount's root;
/// the mount point itself when `path` is not under that root (it names the host's hierarchy).
fn cgroup_dir(root: &Path, mount_root: &str, mount_point: &str, path: &str) -> PathBuf {
    let base = root.join(mount_point.trim_start_matches('/'));
    let rel = if mount_root == "/" {
        Some(path)
    } else {
        path.strip_prefix(mount_root)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
    }
    // `/../x`: a cgroup outside the namespace's root, not under this mount at all.
    .filter(|rel| !rel.split('/').any(|c| c == ".."));
    match rel {
        Some(rel) if base.join(rel.trim_start_matches('/')).is_dir() => {
            base.join(rel.trim_start_matches('/'))
        }
        _ => base,
    }
}

/// The smallest limit, in CPUs, of `dir` and its ancestors up to `top` (the mount point).
fn walk_up(dir: &Path, top: &Path, v2: bool) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut at = Some(dir);
    while let Some(d) = at {
        let limit = if v2 {
            std::fs::read_to_string(d.join("cpu.max"))
                .ok()
                .and_then(|s| quota_v2(&s))
        } else {
            let quota = std::fs::read_to_string(d.join("cpu.cfs_quota_us")).ok();
            let period = std::fs::read_to_string(d.join("cpu.cfs_period_us")).ok();
            quota.zip(period).and_then(|(q, p)| quota_v1(&q, &p))
        };
        if let Some(l) = limit {
            best = Some(best.map_or(l, |b| b.min(l)));
        }
        if d == top {
            break;
        }
        at = d.parent().filter(|p| p.starts_with(top));
    }
    best
}

/// CPUs allowed by a v2 `cpu.max` ("max PERIOD": none; "QUOTA PERIOD").
fn quota_v2(cpu_max: &str) -> Option<f64> {
    let mut it = cpu_max.split_whitespace();
    let (quota, period) = (it.next()?, it.next()?);
    ratio(quota.parse().ok()?, period.parse().ok()?)
}

/// CPUs allowed by v1's `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`.
fn quota_v1(quota: &str, period: &str) -> Option<f64> {
    let quota: i64 = quota.trim().parse().ok()?;
    ratio(u64::try_from(quota).ok()?, period.trim().parse().ok()?)
}

fn ratio(quota: u64, period: u64) -> Option<f64> {
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_files_parse_to_cpus() {
        assert_eq!(quota_v2("max 100000\n"), None);
        assert_eq!(quota_v2("150000 100000\n"), Some(1.5));
        assert_eq!(quota_v2("garbage"), None);
        assert_eq!(quota_v2("0 100000"), None);
        assert_eq!(quota_v1("-1\n", "100000\n"), None);
        assert_eq!(quota_v1("200000\n", "100000\n"), Some(2.0));
        assert_eq!(quota_v1("200000", "0"), None);
    }

    /// A fake root directory, removed when dropped (a failed assertion included).
    struct Fake(PathBuf);

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    impl std::ops::Deref for Fake {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    /// A fake root with `proc/self/{cgroup,mountinfo}` and the cgroup files `files` (path
    /// under the root, content).
    fn fake_root(tag: &str, cgroup: &str, mountinfo: &str, files: &[(&str, &str)]) -> Fake {
        let root = std::env::temp_dir().join(format!("xtc-cgroup-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::write(root.join("proc/self/cgroup"), cgroup).unwrap();
        std::fs::write(root.join("proc/self/mountinfo"), mountinfo).unwrap();
        for (path, content) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        Fake(root)
    }

    const V2_MOUNT: &str = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";

    /// v2: the smallest limit on the way up wins (the pod's 2.5 CPUs over the container's
    /// none), rounded down; none anywhere is no limit.
    #[test]
    fn a_v2_quota_of_an_ancestor_counts() {
        let root = fake_root(
            "v2",
            "0::/pod/ctr\n",
            V2_MOUNT,
            &[
                ("sys/fs/cgroup/cpu.max", "max 100000\n"),
                ("sys/fs/cgroup/pod/cpu.max", "250000 100000\n"),
                ("sys/fs/cgroup/pod/ctr/cpu.max", "max 100000\n"),
            ],
        );
        assert_eq!(cpu_limit(&root), Some(2));
        std::fs::write(root.join("sys/fs/cgroup/pod/cpu.max"), "max 100000\n").unwrap();
        assert_eq!(cpu_limit(&root), None);
    }

    /// v1 in a container: `/proc/self/cgroup` names the host's path, which does not exist
    /// under the container's mount; the mount point itself is the container's cgroup.
    #[test]
    fn a_v1_quota_of_a_container_is_read_at_its_mount_point() {
        let root = fake_root(
            "v1",
            "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n",
            "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
             32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n",
            &[
                ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000\n"),
                ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"),
            ],
        );
        assert_eq!(cpu_limit(&root), Some(1), "half a CPU counts as one");
        std::fs::write(
            root.join("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
            "-1\n",
        )
        .unwrap();
        assert_eq!(cpu_limit(&root), None);
    }

    /// Two cgroup2 mounts, the first of another subtree: the one whose root holds the
    /// process's path is read; a mount point with a space (`\040` in mountinfo) is found.
    #[test]
    fn the_mount_that_holds_the_path_is_read() {
        let root = fake_root(
            "mounts",
            "0::/ctr\n",
            "29 23 0:26 /other /mnt/other rw - cgroup2 cgroup2 rw\n\
             30 23 0:27 / /my\\040cg rw - cgroup2 cgroup2 rw\n",
            &[
                ("my cg/ctr/cpu.max", "100000 100000\n"),
                ("mnt/other/cpu.max", "max 100000\n"),
            ],
        );
        assert_eq!(cpu_limit(&root), Some(1));
        assert_eq!(unescape(r"/a\040b\134c\0"), "/a b\\c\\0");
    }

    /// A line elsewhere that is not UTF-8 (mountinfo writes a mount's path raw but for four
    /// escapes: a vfat stick named in Latin-1; a cgroup name may be any bytes but `/`) costs
    /// nothing: read as text, either file failed whole, and the quota was lost.
    #[test]
    fn a_line_that_is_not_utf8_elsewhere_keeps_the_quota() {
        let root = fake_root(
            "latin1",
            "0::/a\n",
            V2_MOUNT,
            &[("sys/fs/cgroup/a/cpu.max", "200000 100000\n")],
        );
        let mut mounts = V2_MOUNT.as_bytes().to_vec();
        mounts.extend_from_slice(b"50 23 8:17 / /media/caf\xe9 rw,relatime - vfat /dev/sdb1 rw\n");
        std::fs::write(root.join("proc/self/mountinfo"), &mounts).unwrap();
        assert_eq!(cpu_limit(&root), Some(2), "a mount's name elsewhere");
        std::fs::write(root.join("proc/self/cgroup"), b"4:memory:/caf\xe9\n0::/a\n").unwrap();
        assert_eq!(cpu_limit(&root), Some(2), "another hierarchy's cgroup name");
    }

    /// A process outside its cgroup namespace's root reads `0::/../sib`: not under the mount,
    /// so read at the mount point, never beside it (joined as it was, the walk up read the
    /// sibling's `cpu.max` and the mount's parent's).
    #[test]
    fn a_path_above_the_namespace_root_is_read_at_the_mount_point() {
        let root = fake_root(
            "dotdot",
            "0::/../sib\n",
            "30 23 0:27 / /sys/fs/cgroup/ns rw - cgroup2 cgroup2 rw\n",
            &[
                ("sys/fs/cgroup/ns/cpu.max", "max 100000\n"),
                ("sys/fs/cgroup/sib/cpu.max", "100000 100000\n"),
                ("sys/fs/cgroup/cpu.max", "100000 100000\n"),
            ],
        );
        assert_eq!(cpu_limit(&root), None);
        std::fs::write(root.join("sys/fs/cgroup/ns/cpu.max"), "300000 100000\n").unwrap();
        assert_eq!(cpu_limit(&root), Some(3));
    }

    /// Nothing readable (no `/proc`, no mount): no limit, no error.
    #[test]
    fn missing_files_mean_no_limit() {
        let root = fake_root("none", "0::/\n", "", &[]);
        assert_eq!(cpu_limit(&root), None);
        assert_eq!(cpu_limit(Path::new("/nonexistent-xtc-root")), None);
    }
}
