//! The mount directory kubelet names (docs/design.md §4.1): the id is computed over the string
//! exactly as passed, so the string must already be the one true name of the directory — absolute,
//! normalised, an existing directory, reached through no symlink — and it must not overlap the
//! driver's own directories (mounting into or over them would hide or loop them).

use std::fs;
use std::path::{Component, Path, PathBuf};

/// Longest mount dir accepted (PATH_MAX).
pub const MAX_DIR_LEN: usize = 4096;

/// Checks the text of a mount dir: absolute and normalised (no `.`, `..`, `//` or trailing `/`).
pub fn check_form(dir: &str) -> Result<(), String> {
    let quoted = crate::names::Quoted::new(dir);
    if dir.len() > MAX_DIR_LEN {
        return Err(format!("mount dir is longer than {MAX_DIR_LEN} bytes"));
    }
    if !dir.starts_with('/') || dir == "/" {
        return Err(format!(
            "mount dir {quoted} must be an absolute path below /"
        ));
    }
    if dir.contains('\0') {
        return Err(format!("mount dir {quoted} contains NUL"));
    }
    if dir.ends_with('/') || dir.contains("//") {
        return Err(format!("mount dir {quoted} is not normalised"));
    }
    let normal = Path::new(dir)
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)));
    // `components()` silently drops `.`; look for it in the text as well.
    if !normal || dir.split('/').any(|part| part == ".") {
        return Err(format!(
            "mount dir {quoted} is not normalised (it has . or .. components)"
        ));
    }
    Ok(())
}

/// `path` as the kernel resolves it. A normalised absolute path that `openat2` opens without
/// following any symlink is already its own canonical form, which costs two system calls;
/// `fs::canonicalize` costs a `readlink` per component (about twenty per CSI publish for the
/// target and the two own dirs). Anything else — a symlink on the way, a kernel without
/// `openat2` (before 5.6), a seccomp filter refusing it — is left to `fs::canonicalize`.
fn canonical_path(path: &Path) -> std::io::Result<PathBuf> {
    use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat2};
    if path.to_str().is_some_and(|text| check_form(text).is_ok()) {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        if openat2(AT_FDCWD, path, how).is_ok() {
            return Ok(path.to_owned());
        }
    }
    fs::canonicalize(path)
}

/// Checks the directory on disk: it exists, is a directory, is not a symlink and has no symlink in
/// its path, and is neither inside nor above `volumes_dir` or `agent_dir`.
pub fn check_on_disk(dir: &Path, volumes_dir: &Path, agent_dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    let meta = fs::symlink_metadata(dir).map_err(|e| format!("mount dir {shown}: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(format!("mount dir {shown} is a symlink"));
    }
    if !meta.is_dir() {
        return Err(format!("mount dir {shown} is not a directory"));
    }
    let canonical = canonical_path(dir).map_err(|e| format!("mount dir {shown}: {e}"))?;
    if canonical != dir {
        return Err(format!(
            "mount dir {shown} is reached through a symlink (it is really {})",
            canonical.display()
        ));
    }
    for (what, own) in [("volumes", volumes_dir), ("agent", agent_dir)] {
        let own = canonical_path(own).unwrap_or_else(|_| own.to_owned());
        if canonical.starts_with(&own) || own.starts_with(&canonical) {
            return Err(format!(
                "mount dir {shown} overlaps the {what} dir {}",
                own.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        check_form("/var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity").unwrap();
        for bad in [
            "",
            "/",
            "relative/dir",
            "/a/../b",
            "/a/./b",
            "/a/.",
            "/a//b",
            "/a/b/",
            "/a\0b",
            &format!("/{}", "a".repeat(5000)),
        ] {
            assert!(check_form(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let volumes = root.join("volumes");
        let agent = root.join("agent");
        let pod = root.join("pod");
        for d in [&volumes, &agent, &pod] {
            fs::create_dir(d).unwrap();
        }
        check_on_disk(&pod, &volumes, &agent).unwrap();

        let link = root.join("link");
        std::os::unix::fs::symlink(&pod, &link).unwrap();
        assert!(
            check_on_disk(&link, &volumes, &agent)
                .unwrap_err()
                .contains("symlink")
        );
        let via_link = link.join("sub");
        fs::create_dir(pod.join("sub")).unwrap();
        assert!(
            check_on_disk(&via_link, &volumes, &agent)
                .unwrap_err()
                .contains("through a symlink")
        );
        let file = root.join("file");
        fs::write(&file, b"x").unwrap();
        assert!(
            check_on_disk(&file, &volumes, &agent)
                .unwrap_err()
                .contains("not a directory")
        );
        assert!(check_on_disk(&root.join("missing"), &volumes, &agent).is_err());
        // the cheap path agrees with fs::canonicalize wherever it answers
        for path in [&pod, &link, &via_link, &file, &root.join("pod/../pod")] {
            assert_eq!(
                canonical_path(path).unwrap(),
                fs::canonicalize(path).unwrap(),
                "{}",
                path.display()
            );
        }
        assert!(canonical_path(&root.join("missing")).is_err());
        let inside = volumes.join("x");
        fs::create_dir(&inside).unwrap();
        assert!(
            check_on_disk(&inside, &volumes, &agent)
                .unwrap_err()
                .contains("overlaps")
        );
        assert!(
            check_on_disk(&root, &volumes, &agent)
                .unwrap_err()
                .contains("overlaps")
        );
        assert!(
            check_on_disk(&agent, &volumes, &agent)
                .unwrap_err()
                .contains("overlaps")
        );
    }
}
