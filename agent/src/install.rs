//! Installing the flex volume driver on the host: for a pod's `flexVolume: {driver:
//! athenz/volume-driver}` kubelet execs `<plugin-dir>/athenz~volume-driver/volume-driver` (the
//! directory is `<vendor>~<driver>`, the executable the driver's own name: a real kubelet probes
//! nothing else). The new binary is copied to a
//! dot-prefixed temporary name (kubelet ignores dot files) and renamed into place, so kubelet never
//! execs a half-written file; nothing is written when the installed copy is already identical.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The driver's directory under the plugin dir: `<vendor>~<driver>`.
pub const DRIVER_DIR: &str = "athenz~volume-driver";
/// The executable kubelet runs in [`DRIVER_DIR`]: the driver's name.
pub const DRIVER_EXECUTABLE: &str = "volume-driver";
/// Where releases up to 0.1.0 put the executable, which no real kubelet runs; removed.
const OLD_EXECUTABLE: &str = "athenz-volume-driver";

/// Installs `source` as the driver under `plugin_dir`; returns whether anything changed.
pub fn install_driver(source: &Path, plugin_dir: &Path) -> Result<bool, String> {
    let dir = plugin_dir.join(DRIVER_DIR);
    let target = dir.join(DRIVER_EXECUTABLE);
    let old = dir.join(OLD_EXECUTABLE);
    let removed_old = fs::remove_file(&old).is_ok();
    let new = fs::read(source).map_err(|e| format!("reading {}: {e}", source.display()))?;
    if fs::read(&target).is_ok_and(|old| old == new) {
        return Ok(removed_old);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let tmp = dir.join(".volume-driver.tmp");
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
        let target = plugins.join("athenz~volume-driver/volume-driver");
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

    #[test]
    fn an_executable_named_as_before_0_1_1_is_replaced_by_the_one_kubelet_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("driver");
        fs::write(&source, b"v1").unwrap();
        let plugins = tmp.path().join("plugins");
        let dir = plugins.join("athenz~volume-driver");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("athenz-volume-driver"), b"v0").unwrap();
        assert!(install_driver(&source, &plugins).unwrap());
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["volume-driver"]);
    }
}
