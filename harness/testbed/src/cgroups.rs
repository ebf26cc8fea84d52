//! Kubelet-shaped pod cgroups for the processes that play pods, so the agent's peer check
//! (docs/design.md §4.2) runs in `enforce` here as on a node: the stack makes one cgroup directory
//! (`pod_cgroup_root` in stack.json) in a writable hierarchy, and every pod process is started
//! inside `<root>/kubepods-pod<uid_>.slice/cri-containerd-<id>.scope` (the systemd driver's
//! shape), which is removed when the pod goes.

use std::path::{Path, PathBuf};

fn create(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))
}

/// The mount points of the cgroup v2 hierarchy and of the v1 `pids` controller, where mounted.
pub fn hierarchies() -> (Option<PathBuf>, Option<PathBuf>) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return (None, None);
    };
    let (mut v2, mut v1_pids) = (None, None);
    for line in mountinfo.lines() {
        // <id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <type> <source> <super options>
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split(' ').nth(4);
        let mut right = right.split(' ');
        let fstype = right.next();
        let super_options = right.nth(1).unwrap_or("");
        match (fstype, mount_point) {
            (Some("cgroup2"), Some(point)) => v2 = v2.or(Some(PathBuf::from(point))),
            (Some("cgroup"), Some(point)) if super_options.split(',').any(|o| o == "pids") => {
                v1_pids = Some(PathBuf::from(point));
            }
            _ => {}
        }
    }
    (v2, v1_pids)
}

/// The mount point of every cgroup hierarchy: the v2 one and each v1 one (a controller, a
/// set of co-mounted controllers or a named hierarchy such as `name=systemd`).
pub fn all_mount_points() -> Vec<PathBuf> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| left.split(' ').nth(4).map(PathBuf::from))
                .flatten()
        })
        .collect()
}

/// Removes the cgroup `path` (as `/proc/<pid>/cgroup` and `linux.cgroupsPath` name it, from the
/// hierarchy's root) and everything below it, in every hierarchy where it exists: a runtime
/// deletes a container's cgroup but leaves the pod's for the kubelet.
pub fn remove_everywhere(path: &str) {
    let relative = path.trim_start_matches('/');
    if relative.is_empty() || relative.split('/').any(|c| c == "..") {
        return;
    }
    for mount in all_mount_points() {
        let dir = mount.join(relative);
        if dir.is_dir() {
            remove_tree(&dir);
        }
    }
}

/// A cgroup hierarchy to make pod cgroups in: cgroup v2 where it is mounted, else the v1 `pids`
/// controller.
pub fn find_hierarchy() -> Option<PathBuf> {
    let (v2, v1_pids) = hierarchies();
    v2.or(v1_pids)
}

/// Makes `<hierarchy>/athenz-<random>` if this process may move processes there (root with a
/// writable hierarchy); `None` otherwise.
pub fn create_root_in(hierarchy: &Path) -> Option<PathBuf> {
    let root = hierarchy.join(format!("athenz-{}", athenz_core::random::hex_name::<6>()));
    std::fs::create_dir(&root).ok()?;
    let probe = root.join("probe");
    let usable = std::fs::create_dir(&probe).is_ok()
        && probe.join("cgroup.procs").is_file()
        && nix::unistd::geteuid().is_root();
    let _ = std::fs::remove_dir(&probe);
    if usable {
        Some(root)
    } else {
        let _ = std::fs::remove_dir(&root);
        None
    }
}

/// Makes the stack's pod cgroup root, `<hierarchy>/athenz-<random>`, if this process may (root
/// with a writable hierarchy); `None` otherwise.
pub fn create_root() -> Option<PathBuf> {
    create_root_in(&find_hierarchy()?)
}

/// The pod slice of pod `uid` under `root`: `kubepods-pod<uid with _>.slice`.
pub fn pod_slice(root: &Path, uid: &str) -> PathBuf {
    root.join(format!("kubepods-pod{}.slice", uid.replace('-', "_")))
}

/// A container cgroup of pod `uid` in the cgroupfs driver's shape, under `root`:
/// `<root>/kubepods/burstable/pod<uid>/<container id>` (created).
pub fn cgroupfs_container(root: &Path, uid: &str) -> std::io::Result<PathBuf> {
    let dir = root
        .join("kubepods/burstable")
        .join(format!("pod{uid}"))
        .join(athenz_core::random::hex_name::<32>());
    create(&dir)?;
    Ok(dir)
}

/// A new container scope in pod `uid`'s slice (created, with the slice, if missing).
pub fn container_scope(root: &Path, uid: &str) -> std::io::Result<PathBuf> {
    let scope = pod_slice(root, uid).join(format!(
        "cri-containerd-{}.scope",
        athenz_core::random::hex_name::<32>()
    ));
    create(&scope)?;
    Ok(scope)
}

/// `program args…` started inside `cgroup`: a shell writes its own pid into `cgroup.procs` and
/// execs the program, so the program is in the pod's cgroup from its first instruction.
pub fn argv_in_cgroup(cgroup: &Path, program: &str, args: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        r#"echo $$ > "$0/cgroup.procs" && exec "$@""#.to_owned(),
        cgroup.display().to_string(),
        program.to_owned(),
    ];
    argv.extend(args.iter().cloned());
    argv
}

/// Removes `dir` and every cgroup below it, leaf first (a cgroup directory goes with `rmdir`
/// once no process is in it). Processes still inside are moved to the hierarchy's root first.
pub fn remove_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    let (v2, v1_pids) = hierarchies();
    let hierarchy = [v2, v1_pids]
        .into_iter()
        .flatten()
        .find(|h| dir.starts_with(h));
    if let (Ok(procs), Some(hierarchy)) =
        (std::fs::read_to_string(dir.join("cgroup.procs")), hierarchy)
    {
        for pid in procs.lines() {
            let _ = std::fs::write(hierarchy.join("cgroup.procs"), format!("{pid}\n"));
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pod_paths_have_the_systemd_drivers_shape() {
        let root = Path::new("/sys/fs/cgroup/athenz-devstack-x");
        let uid = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";
        let slice = pod_slice(root, uid);
        assert_eq!(
            slice,
            root.join("kubepods-pod0b6e4c1e_8f57_4d5e_9a51_1f0f3c1a2b3c.slice")
        );
        // what the agent's parser reads back from such a path
        let line = format!("0::{}/cri-containerd-ab.scope\n", slice.display());
        assert_eq!(
            athenz_core::peer::pod_uid_from_cgroup(&line)
                .unwrap()
                .as_deref(),
            Some(uid)
        );
    }

    #[test]
    fn the_wrapper_joins_then_execs() {
        let argv = argv_in_cgroup(Path::new("/cg/x"), "/bin/sia", &["init".into()]);
        assert_eq!(argv[0], "/bin/sh");
        assert_eq!(argv[3], "/cg/x");
        assert_eq!(&argv[4..], ["/bin/sia", "init"]);
    }
}
