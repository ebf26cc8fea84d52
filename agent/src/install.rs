//! Installing the flex volume driver on the host: kubelet finds it at
//! `<plugin-dir>/athenz~volume-driver/athenz-volume-driver`. The new binary is copied to a
//! dot-prefixed temporary name (kubelet ignores dot files) and renamed into place, so kubelet never
//! execs a half-written file; nothing is written when the installed copy is already identical.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Installs `source` as the driver under `plugin_dir`; returns whether anything changed.
pub fn install_driver(source: &Path, plugin_dir: &Path) -> Result<bool, String> {
    let dir = plugin_dir.join("athenz~volume-driver");
    let target = dir.join("athenz-volume-driver");
    let new = fs::read(source).map_err(|e| format!("reading {}: {e}", source.display()))?;
    if fs::read(&target).is_ok_and(|old| old == new) {
        return Ok(false);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let tmp = dir.join(".athenz-volume-driver.tmp");
    fs::write(&tmp, &new).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("setting the mode of {}: {e}", tmp.display()))?;
    fs::rename(&tmp, &target).map_err(|e| format!("installing {}: {e}", target.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_once_and_replaces_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("driver");
        fs::write(&source, b"v1").unwrap();
        let plugins = tmp.path().join("plugins");
        assert!(install_driver(&source, &plugins).unwrap());
        assert!(
            !install_driver(&source, &plugins).unwrap(),
            "identical copy rewritten"
        );
        let target = plugins.join("athenz~volume-driver/athenz-volume-driver");
        assert_eq!(fs::read(&target).unwrap(), b"v1");
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o777,
            0o755
        );
        fs::write(&source, b"v2").unwrap();
        assert!(install_driver(&source, &plugins).unwrap());
        assert_eq!(fs::read(&target).unwrap(), b"v2");
        let names: Vec<_> = fs::read_dir(plugins.join("athenz~volume-driver"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "temporary file left: {names:?}");
    }
}
