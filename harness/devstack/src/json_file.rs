//! JSON state files (`stack.json`, `kube.json`, `cluster.json`, `processes.json`): written
//! atomically, so a reader polling for one never sees half of it.

use anyhow::Context;
use serde::Serialize;
use std::path::Path;

/// Writes `value` as JSON to `path` atomically (readers never see half), mode 0644 — the shared
/// writer of athenz-core.
pub fn write_atomically<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    athenz_core::volume::write_json_file(path, value, 0o644)
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads a JSON file into `T`.
pub fn read<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}
