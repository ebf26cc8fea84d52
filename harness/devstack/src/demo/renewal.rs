//! The demo's renewal steps: a refresh by the sidecar or by the agent, and the refusals of a
//! deleted pod's (each polled up to 30 s).

use super::*;

/// Runs the real refresh sidecar with a 1 s ceiling until it has replaced the certificate.
pub(super) async fn refresh_by_sidecar(
    stack: &Stack,
    volume: &PodVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefreshReport> {
    let before = identity::check(&volume.credentials_dir)?.serial;
    let mut sidecar = node::sia_refresh(
        &stack.info,
        volume,
        "1s",
        &stack.state_dir.join("logs"),
        &[],
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(now) = identity::check(&volume.credentials_dir)
            && now.serial != before
        {
            break now.serial;
        }
        sidecar.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "the refresh sidecar did not refresh within 30 s:\n{}",
                sidecar.log_tail()
            );
        }
    };
    sidecar.stop().await;
    let clean = sidecar
        .wait_exit(Duration::from_secs(5))
        .await
        .unwrap_or(false);
    print(format!(
        "\nrefresh: athenz-sia refresh replaced {}'s certificate: serial {before} -> {after}; \
         sidecar exited {}",
        volume.pod.name,
        if clean { "0 on SIGTERM" } else { "uncleanly" }
    ));
    Ok(RefreshReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        by: "athenz-sia refresh".into(),
        old_serial: before,
        new_serial: after,
        sidecar_exited_cleanly: Some(clean),
    })
}

/// Waits (at most 30 s) for the agent to rotate a files-mode volume, as it does every
/// [`DEMO_CSI_REFRESH`] in the demo; nothing runs in the pod.
pub(super) async fn refresh_by_agent(
    volume: &MountedVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefreshReport> {
    let dir = volume.credentials_dir();
    let before = identity::check(dir)?.serial;
    let after = poll_30s(
        &format!("the agent did not rotate {}'s files", volume.pod.name),
        async || {
            Ok(identity::check(dir)
                .ok()
                .map(|now| now.serial)
                .filter(|serial| *serial != before))
        },
    )
    .await?;
    print(format!(
        "\nrefresh: the agent rotated {}'s files in place (no process in the pod): serial \
         {before} -> {after}",
        volume.pod.name
    ));
    Ok(RefreshReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        by: "the agent".into(),
        old_serial: before,
        new_serial: after,
        sidecar_exited_cleanly: None,
    })
}

/// After the pod's deletion, asks for a refresh with its current pair, as its sidecar would.
pub(super) async fn refuse_sidecar_refresh(
    stack: &Stack,
    volume: &PodVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefusalReport> {
    let refusal = match node::refresh_once(&stack.info, volume).await? {
        Ok(_) => bail!("the agent refreshed the identity of a deleted pod"),
        Err(refusal) => refusal,
    };
    print(format!(
        "\ndeleted pod {}/{}; its refresh was refused: {refusal}",
        volume.pod.namespace, volume.pod.name
    ));
    Ok(RefusalReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        refusal,
    })
}

/// After the pod's deletion, waits (at most 30 s) for the agent's next rotation of its files to
/// be refused, as kubelet sees it: the volume's condition turns abnormal, with the reason (the
/// pod event an operator reads in `kubectl describe pod`).
pub(super) async fn refuse_agent_rotation(
    kubelet: &NodeKubelet,
    volume: &MountedVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefusalReport> {
    let (csi, csi_volume) = kubelet
        .csi()
        .zip(volume.csi())
        .context("a files-mode volume without its CSI driver")?;
    let refusal = poll_30s(
        &format!(
            "the agent kept rotating the files of deleted pod {}",
            volume.pod.name
        ),
        async || {
            let stats = csi.clone().stats(csi_volume).await?;
            Ok(stats
                .volume_condition
                .filter(|c| c.abnormal)
                .map(|c| c.message))
        },
    )
    .await?;
    print(format!(
        "\ndeleted pod {}/{}; the agent's next rotation was refused; kubelet sees the volume \
         abnormal: {refusal}",
        volume.pod.namespace, volume.pod.name
    ));
    Ok(RefusalReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        refusal,
    })
}
