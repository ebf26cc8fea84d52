//! Which runtime the stack's pods get (`--runtime`), and what stopping the stack removes of
//! their containers.

use super::RuntimeInfo;
use anyhow::Context;
use std::path::Path;

/// The runtime pods get: `asked`, or runc where it is installed and the stack may make pod
/// cgroups (root), else plain processes; with the reason, which `up` and `demo` print.
pub(super) fn choose_runtime(
    asked: Option<athenz_testbed::runtime::RuntimeKind>,
    pod_cgroup_root: Option<&Path>,
    state: &Path,
) -> anyhow::Result<RuntimeInfo> {
    use athenz_testbed::runtime::{OciRuntime, RuntimeKind};
    let (kind, reason) = match (asked, pod_cgroup_root) {
        (Some(kind), _) => (kind, "--runtime".to_owned()),
        (None, None) => (
            RuntimeKind::Process,
            "no pod cgroups can be made here (not root, or a user namespace)".to_owned(),
        ),
        (None, Some(_)) => RuntimeKind::default_here(),
    };
    if kind == RuntimeKind::Process {
        return Ok(RuntimeInfo {
            kind,
            reason,
            state_dir: None,
            cgroup_root: None,
        });
    }
    let cgroup_root = pod_cgroup_root
        .and_then(|root| root.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .with_context(|| {
            format!(
                "--runtime {kind}: a container runtime needs root and a writable cgroup hierarchy"
            )
        })?;
    let state_dir = state.join("runtime");
    // fails now, naming the package, if the runtime is missing
    OciRuntime::find(kind, &state_dir)?;
    Ok(RuntimeInfo {
        kind,
        reason,
        state_dir: Some(state_dir),
        cgroup_root: Some(cgroup_root),
    })
}

/// Kills and deletes every container the stack's pods still have (whoever started them), and
/// removes the stack's cgroup root in every hierarchy.
pub(super) async fn remove_containers(runtime: &RuntimeInfo) {
    let (Some(state_dir), Some(cgroup_root)) = (&runtime.state_dir, &runtime.cgroup_root) else {
        return;
    };
    if let Ok(oci) = athenz_testbed::runtime::OciRuntime::find(runtime.kind, state_dir) {
        for id in oci.list().await.unwrap_or_default() {
            let _ = oci.kill(&id, "KILL").await;
            let _ = oci.delete(&id).await;
        }
    }
    athenz_testbed::cgroups::remove_everywhere(cgroup_root);
}
