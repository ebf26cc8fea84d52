//! Stopping a real process as Kubernetes does: SIGTERM (sent by a real `kill`), then a bounded
//! wait for it to exit.

use std::process::ExitStatus;
use std::time::Duration;

/// Sends SIGTERM to `child` and waits up to `limit` for it to exit; `None` if it did not.
pub async fn terminate(child: &mut tokio::process::Child, limit: Duration) -> Option<ExitStatus> {
    let pid = child.id()?.to_string();
    let sent = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .is_ok_and(|s| s.success());
    if !sent {
        return None;
    }
    tokio::time::timeout(limit, child.wait()).await.ok()?.ok()
}
