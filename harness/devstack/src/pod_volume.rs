//! A pod's identity volume of whichever kind the stack gives ([`VolumeMode`]), set up as a node
//! does it and read where the pod reads its credentials:
//!
//! - flex: kubelet execs the flex driver, then the pod's `athenz-sia init` writes the files into
//!   the pod's memory volume;
//! - CSI socket: kubelet's `NodePublishVolume` (the flex layout), then the same SIA;
//! - CSI files: kubelet's `NodePublishVolume` alone; the agent has written the files into the
//!   volume before it answers, and no process runs in the pod.

use crate::kube::NewPod;
use crate::node::{self, NodeDirs, PodVolume};
use crate::stack::StackInfo;
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use athenz_testbed::csi_kubelet::{CsiPod, CsiVolume, KubeletCsi};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where one pod's mount → files time went.
#[derive(Debug, Clone, Copy)]
pub struct PodTimes {
    /// From the first mount call to the files being there.
    pub total: Duration,
    /// The mount as kubelet does it: the flex driver's process, or the `NodePublishVolume` call
    /// (in files mode, everything); with kubelet's own steps (the mount dir, the pod's memory
    /// volume for its SIA).
    pub mount: Duration,
    /// The pod's `athenz-sia init`, when one runs.
    pub sia: Option<node::SiaInit>,
}

/// One pod's mounted identity volume.
#[derive(Debug, Clone)]
pub struct MountedVolume {
    pub pod: NewPod,
    pub uid: String,
    /// What is mounted.
    pub mount: Mount,
}

/// What is mounted for a pod, by volume kind.
#[derive(Debug, Clone)]
pub enum Mount {
    /// The flex volume and the SIA's credentials volume.
    Flex(PodVolume),
    /// The CSI volume in socket mode and the SIA's credentials volume (`sia.mount_dir` is the
    /// CSI target).
    CsiSocket {
        /// The CSI volume.
        csi: CsiVolume,
        /// The SIA's view of it.
        sia: PodVolume,
    },
    /// The CSI volume in files mode: the credentials themselves.
    CsiFiles {
        /// The CSI volume.
        csi: CsiVolume,
    },
}

impl MountedVolume {
    /// Where the pod reads its key, certificate, CA and token.
    pub fn credentials_dir(&self) -> &Path {
        match &self.mount {
            Mount::Flex(volume) | Mount::CsiSocket { sia: volume, .. } => &volume.credentials_dir,
            Mount::CsiFiles { csi } => &csi.target,
        }
    }

    /// The SIA's view of the volume, when the pod runs one.
    pub fn sia(&self) -> Option<&PodVolume> {
        match &self.mount {
            Mount::Flex(volume) | Mount::CsiSocket { sia: volume, .. } => Some(volume),
            Mount::CsiFiles { .. } => None,
        }
    }

    /// The CSI volume, when it is one.
    pub fn csi(&self) -> Option<&CsiVolume> {
        match &self.mount {
            Mount::Flex(_) => None,
            Mount::CsiSocket { csi, .. } | Mount::CsiFiles { csi } => Some(csi),
        }
    }
}

/// Kubelet on the stack's first node, for pods with `kind`'s volume.
#[derive(Debug, Clone)]
pub struct NodeKubelet {
    kind: VolumeMode,
    kubelet_root: PathBuf,
    csi: Option<KubeletCsi>,
}

impl NodeKubelet {
    /// The volume kind it mounts.
    pub fn kind(&self) -> VolumeMode {
        self.kind
    }

    /// Its CSI caller, when the kind is a CSI one.
    pub fn csi(&self) -> Option<&KubeletCsi> {
        self.csi.as_ref()
    }
}

impl NodeKubelet {
    /// Registers the node's CSI driver when `kind` is a CSI kind (the stack must serve it).
    pub async fn new(
        info: &StackInfo,
        kind: VolumeMode,
        kubelet_root: &Path,
    ) -> anyhow::Result<Self> {
        let csi = if kind.is_csi() {
            let socket = info
                .nodes
                .first()
                .and_then(|node| node.agent.csi_socket.as_ref())
                .context("the stack's agent serves no CSI socket: start it with that --volume")?;
            Some(KubeletCsi::connect(socket, kubelet_root).await?)
        } else {
            None
        };
        Ok(Self {
            kind,
            kubelet_root: kubelet_root.to_owned(),
            csi,
        })
    }

    /// Mounts the pod's volume and has its credentials written as the pod would (see the module
    /// doc); returns how long that took, from the first mount call to the files being there.
    pub async fn give_identity(
        &self,
        info: &StackInfo,
        pod: &NewPod,
        uid: &str,
    ) -> anyhow::Result<(PodTimes, MountedVolume)> {
        let started = Instant::now();
        let (mount, driver, sia) = match &self.csi {
            None => {
                let volume = node::mount(info, &self.kubelet_root, pod, uid).await?;
                let driver = started.elapsed();
                let sia = node::sia_init(info, &volume).await?;
                (Mount::Flex(volume), Some(driver), Some(sia))
            }
            Some(kubelet) => {
                // a kubelet with the CSI driver serves the CSI modes only
                let mode = self
                    .kind
                    .csi_attribute()
                    .context("a flex volume on a CSI kubelet")?;
                let csi = kubelet
                    .clone()
                    .publish(&csi_pod(pod, uid), &[("mode", mode)])
                    .await
                    .with_context(|| format!("publishing the volume of {}", pod.name))?;
                if self.kind == VolumeMode::CsiSocket {
                    let sia = PodVolume {
                        pod: pod.clone(),
                        uid: uid.to_owned(),
                        node: NodeDirs::first(info),
                        mount_dir: csi.target.clone(),
                        credentials_dir: node::credentials_volume(&self.kubelet_root, uid)?,
                    };
                    let publish = started.elapsed();
                    let init = node::sia_init(info, &sia).await?;
                    (Mount::CsiSocket { csi, sia }, Some(publish), Some(init))
                } else {
                    // the publish is the whole: its time is the total's
                    (Mount::CsiFiles { csi }, None, None)
                }
            }
        };
        let total = started.elapsed();
        let times = PodTimes {
            total,
            mount: driver.unwrap_or(total),
            sia,
        };
        let mounted = MountedVolume {
            pod: pod.clone(),
            uid: uid.to_owned(),
            mount,
        };
        Ok((times, mounted))
    }

    /// Unmounts as kubelet does when the pod goes.
    pub async fn take_down(&self, info: &StackInfo, mounted: &MountedVolume) -> anyhow::Result<()> {
        let unpublish = |csi: &CsiVolume| {
            let kubelet = self.csi.clone();
            let csi = csi.clone();
            async move {
                kubelet
                    .context("a CSI volume without a CSI driver")?
                    .unpublish(&csi)
                    .await
                    .with_context(|| format!("unpublishing {}", csi.volume_id))
            }
        };
        match &mounted.mount {
            Mount::Flex(volume) => node::unmount(info, volume).await,
            Mount::CsiSocket { csi, sia } => {
                node::remove_pod_side(info, sia).await?;
                unpublish(csi).await
            }
            Mount::CsiFiles { csi } => unpublish(csi).await,
        }
    }
}

/// The pod as kubelet describes it to a CSI driver.
pub fn csi_pod(pod: &NewPod, uid: &str) -> CsiPod {
    CsiPod {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: uid.to_owned(),
        service_account: pod.service_account.clone(),
        fs_group: None,
    }
}
