//! A CSI caller that does what kubelet does for an inline ephemeral CSI volume
//! (pkg/volume/csi: csi_plugin.go, csi_mounter.go, csi_client.go), so tests and the devstack
//! drive `csi.athenz.io` exactly as a node would:
//!
//! - at registration (the node-driver-registrar, then kubelet): `GetPluginInfo`, `NodeGetInfo`;
//! - per mount: `NodeGetCapabilities` (stage/unstage? volume mount group?), the volume dir
//!   `<root>/pods/<uid>/volumes/kubernetes.io~csi/<volume>/` made 0750 with `vol_data.json`,
//!   then `NodePublishVolume` with `volume_id` = `csi-<sha256(pod uid + volume name)>`, the
//!   target `<volume dir>/mount` (not made: the driver makes it), `readonly`, a mount
//!   capability with access mode `SINGLE_NODE_WRITER`, the pod's fsGroup as
//!   `volume_mount_group` when the driver asks for it, and the volume context: the pod's
//!   `volumeAttributes` plus `csi.storage.k8s.io/{pod.name, pod.namespace, pod.uid,
//!   serviceAccount.name, ephemeral}`;
//! - a failed mount is retried with kubelet's backoff (500 ms doubling, at most 2 m 2 s);
//! - per unmount: `NodeUnpublishVolume`, then the `mount` dir (if the driver left it),
//!   `vol_data.json` and the volume dir are removed.
//!
//! Every call is made on a connection of its own, with kubelet's 2-minute timeout.

use athenz_core::csi::v1::{
    self, NodeGetVolumeStatsResponse, NodePublishVolumeRequest, VolumeCapability,
    identity_client::IdentityClient, node_client::NodeClient, node_service_capability,
    volume_capability,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

/// Kubelet's per-call timeout for CSI node calls (csiTimeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The volume name the initializer gives the identity volume.
pub const VOLUME_NAME: &str = "athenz-identity";

/// A failed call, with the gRPC status when the driver answered.
#[derive(Debug, thiserror::Error)]
pub enum CsiCallError {
    /// The socket could not be reached.
    #[error("connecting to {0}: {1}")]
    Connect(PathBuf, String),
    /// The driver answered with an error.
    #[error("{0:?}: {1}")]
    Status(tonic::Code, String),
    /// Kubelet's own step failed (making the volume dir).
    #[error("{0}")]
    Local(String),
}

impl CsiCallError {
    /// The gRPC code, when the driver answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Status(code, _) => Some(*code),
            _ => None,
        }
    }
}

impl From<tonic::Status> for CsiCallError {
    fn from(s: tonic::Status) -> Self {
        Self::Status(s.code(), s.message().to_owned())
    }
}

/// The pod a volume is mounted for.
#[derive(Debug, Clone)]
pub struct CsiPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Service account.
    pub service_account: String,
    /// `spec.securityContext.fsGroup`.
    pub fs_group: Option<u32>,
}

/// A volume kubelet published.
#[derive(Debug, Clone)]
pub struct CsiVolume {
    /// `csi-<sha256>`.
    pub volume_id: String,
    /// `<volume dir>/mount`.
    pub target: PathBuf,
}

/// Kubelet's view of one CSI driver's socket. Like kubelet's csiDriverClient it dials the socket
/// for every call and closes the connection after it (nodeV1ClientCreator per call), so a
/// driver is measured and tested with the connection churn a node gives it.
#[derive(Debug, Clone)]
pub struct KubeletCsi {
    socket: PathBuf,
    kubelet_root: PathBuf,
    node_id: String,
}

/// `csi-<sha256(pod uid + volume name)>` (kubelet's makeVolumeHandle).
pub fn volume_handle(pod_uid: &str, volume_name: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{pod_uid}{volume_name}").as_bytes());
    format!("csi-{}", athenz_core::volume::hex(&digest))
}

/// A new connection to `socket`.
async fn dial(socket: &Path) -> Result<Channel, CsiCallError> {
    crate::grpc::dial_unix(socket, Some(CALL_TIMEOUT))
        .await
        .map_err(|e| CsiCallError::Connect(socket.to_owned(), e.to_string()))
}

impl KubeletCsi {
    /// Connects to `socket` and registers the driver as kubelet does; `kubelet_root` stands for
    /// `/var/lib/kubelet`.
    pub async fn connect(socket: &Path, kubelet_root: &Path) -> Result<Self, CsiCallError> {
        let channel = dial(socket).await?;
        let info = IdentityClient::new(channel.clone())
            .get_plugin_info(v1::GetPluginInfoRequest {})
            .await?
            .into_inner();
        if info.name != "csi.athenz.io" {
            return Err(CsiCallError::Local(format!(
                "the driver calls itself {:?}",
                info.name
            )));
        }
        let node_id = NodeClient::new(channel)
            .node_get_info(v1::NodeGetInfoRequest {})
            .await?
            .into_inner()
            .node_id;
        Ok(Self {
            socket: socket.to_owned(),
            kubelet_root: kubelet_root.to_owned(),
            node_id,
        })
    }

    /// A node client on a connection of its own, for one call.
    async fn node(&self) -> Result<NodeClient<Channel>, CsiCallError> {
        Ok(NodeClient::new(dial(&self.socket).await?))
    }

    /// The node id the driver reported.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// `Probe`'s readiness (absent means ready).
    pub async fn probe(&mut self) -> Result<bool, CsiCallError> {
        Ok(IdentityClient::new(dial(&self.socket).await?)
            .probe(v1::ProbeRequest {})
            .await?
            .into_inner()
            .ready
            .unwrap_or(true))
    }

    /// The volume dir kubelet uses for `pod`'s `volume_name`.
    pub fn volume_dir(&self, pod_uid: &str, volume_name: &str) -> PathBuf {
        self.kubelet_root
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join("kubernetes.io~csi")
            .join(volume_name)
    }

    async fn node_capabilities(&mut self) -> Result<Vec<i32>, CsiCallError> {
        Ok(self
            .node()
            .await?
            .node_get_capabilities(v1::NodeGetCapabilitiesRequest {})
            .await?
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| {
                c.r#type
                    .map(|node_service_capability::Type::Rpc(rpc)| rpc.r#type)
            })
            .collect())
    }

    /// The request kubelet sends for `pod`'s identity volume with `attributes`.
    pub fn publish_request(
        &self,
        pod: &CsiPod,
        attributes: &[(&str, &str)],
        volume_mount_group: bool,
    ) -> NodePublishVolumeRequest {
        let dir = self.volume_dir(&pod.uid, VOLUME_NAME);
        let mut context: HashMap<String, String> = attributes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (k, v) in [
            ("csi.storage.k8s.io/pod.name", pod.name.as_str()),
            ("csi.storage.k8s.io/pod.namespace", pod.namespace.as_str()),
            ("csi.storage.k8s.io/pod.uid", pod.uid.as_str()),
            (
                "csi.storage.k8s.io/serviceAccount.name",
                pod.service_account.as_str(),
            ),
            ("csi.storage.k8s.io/ephemeral", "true"),
        ] {
            context.insert(k.to_owned(), v.to_owned());
        }
        NodePublishVolumeRequest {
            volume_id: volume_handle(&pod.uid, VOLUME_NAME),
            target_path: dir.join("mount").to_string_lossy().into_owned(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(volume_capability::AccessType::Mount(
                    volume_capability::MountVolume {
                        fs_type: String::new(),
                        mount_flags: Vec::new(),
                        volume_mount_group: match (volume_mount_group, pod.fs_group) {
                            (true, Some(gid)) => gid.to_string(),
                            _ => String::new(),
                        },
                    },
                )),
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }),
            readonly: true,
            ..Default::default()
        }
        .with_context(context)
    }

    /// One mount attempt, as kubelet's SetUpAt makes it.
    pub async fn publish(
        &mut self,
        pod: &CsiPod,
        attributes: &[(&str, &str)],
    ) -> Result<CsiVolume, CsiCallError> {
        use node_service_capability::rpc::Type;
        let caps = self.node_capabilities().await?;
        if caps.contains(&(Type::StageUnstageVolume as i32)) {
            return Err(CsiCallError::Local(
                "the driver asks for NodeStageVolume, which ephemeral volumes never get".into(),
            ));
        }
        let group = caps.contains(&(Type::VolumeMountGroup as i32));
        let dir = self.volume_dir(&pod.uid, VOLUME_NAME);
        make_dir_0750(&dir)?;
        let handle = volume_handle(&pod.uid, VOLUME_NAME);
        let vol_data = serde_json::json!({
            "driverName": "csi.athenz.io",
            "nodeName": self.node_id,
            "specVolID": VOLUME_NAME,
            "volumeHandle": handle,
            "volumeLifecycleMode": "Ephemeral",
        });
        std::fs::write(dir.join("vol_data.json"), vol_data.to_string())
            .map_err(|e| CsiCallError::Local(format!("writing vol_data.json: {e}")))?;
        let request = self.publish_request(pod, attributes, group);
        let target = PathBuf::from(&request.target_path);
        self.node().await?.node_publish_volume(request).await?;
        Ok(CsiVolume {
            volume_id: handle,
            target,
        })
    }

    /// Mounts with kubelet's retries (500 ms doubling up to 2 m 2 s) until `limit` has passed.
    pub async fn publish_retrying(
        &mut self,
        pod: &CsiPod,
        attributes: &[(&str, &str)],
        limit: Duration,
    ) -> Result<CsiVolume, CsiCallError> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut backoff = Duration::from_millis(500);
        loop {
            match self.publish(pod, attributes).await {
                Ok(v) => return Ok(v),
                Err(e) if tokio::time::Instant::now() + backoff > deadline => return Err(e),
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(122));
                }
            }
        }
    }

    /// Unmounts as kubelet's TearDownAt does, then removes what kubelet made.
    pub async fn unpublish(&mut self, volume: &CsiVolume) -> Result<(), CsiCallError> {
        self.node()
            .await?
            .node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                target_path: volume.target.to_string_lossy().into_owned(),
            })
            .await?;
        let _ = std::fs::remove_dir(&volume.target);
        if let Some(dir) = volume.target.parent() {
            let _ = std::fs::remove_file(dir.join("vol_data.json"));
            let _ = std::fs::remove_dir(dir);
        }
        Ok(())
    }

    /// `NodeGetVolumeStats` of a published volume.
    pub async fn stats(
        &mut self,
        volume: &CsiVolume,
    ) -> Result<NodeGetVolumeStatsResponse, CsiCallError> {
        Ok(self
            .node()
            .await?
            .node_get_volume_stats(v1::NodeGetVolumeStatsRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: volume.target.to_string_lossy().into_owned(),
                staging_target_path: String::new(),
            })
            .await?
            .into_inner())
    }

    /// Sends `request` as is (tests of refusals).
    pub async fn raw_publish(
        &mut self,
        request: NodePublishVolumeRequest,
    ) -> Result<(), CsiCallError> {
        self.node().await?.node_publish_volume(request).await?;
        Ok(())
    }
}

trait WithContext {
    fn with_context(self, context: HashMap<String, String>) -> Self;
}

impl WithContext for NodePublishVolumeRequest {
    fn with_context(mut self, context: HashMap<String, String>) -> Self {
        self.volume_context = context;
        self
    }
}

fn make_dir_0750(dir: &Path) -> Result<(), CsiCallError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(|e| CsiCallError::Local(format!("making {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubelet's makeVolumeHandle: sha256 of the uid and the volume name, concatenated.
    #[test]
    fn volume_handle_is_kubelets() {
        let handle = volume_handle("0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c", "athenz-identity");
        assert!(handle.starts_with("csi-"));
        assert_eq!(handle.len(), 4 + 64);
        use sha2::Digest;
        let expected = sha2::Sha256::digest(b"0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3cathenz-identity");
        assert_eq!(&handle[4..], athenz_core::volume::hex(&expected));
    }
}
