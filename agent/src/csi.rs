//! The agent's side of the CSI driver (DESIGN.md 4.10): how a files-mode volume gets and renews
//! its identity. The CSI caller is the kubelet, which vouches for the pod (its pod info names
//! the volume's pod), so there is no peer check; everything else is the socket API's path:
//! the pod as the kubelet lists it, the jwt-service, ZTS, the refresh checks and state.json.

use crate::kubelet::Absent;
use crate::service::{Agent, Failure, KeyRequest, PodIp};
use athenz_core::volume::{VolumeData, VolumeId};
use athenz_csi_driver::{CurrentPair, IssueError, Issued, Issuer, Registration};
use http::StatusCode;
use std::net::IpAddr;
use std::sync::Arc;

/// Issues files-mode identities through the agent.
pub struct AgentIssuer {
    /// The agent.
    pub agent: Arc<Agent>,
}

fn issue_error(f: Failure) -> IssueError {
    IssueError {
        // the agent's "try again" (no node identity yet, upstream away, kubelet slow) and its
        // own trouble are transient; its refusals (400/403/404) are not
        transient: f.status.is_server_error() || f.status == StatusCode::TOO_MANY_REQUESTS,
        message: f.message,
    }
}

impl Issuer for AgentIssuer {
    async fn issue(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        registration: Registration,
    ) -> Result<Issued, IssueError> {
        let paths = self.agent.volumes.volume(id);
        let lock = self.agent.lock_for(id).await;
        let _serialised = lock.lock().await;
        let absent = match registration {
            Registration::First => Absent::MayAppear,
            Registration::Again => Absent::Gone,
        };
        self.agent
            // files mode: no process in the pod, so the key is made here whatever --key-source says
            .register(&paths, data, PodIp::Optional, absent, KeyRequest::Agent)
            .await
            .map_err(issue_error)
    }

    async fn reissue(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        current: &CurrentPair,
    ) -> Result<Issued, IssueError> {
        let paths = self.agent.volumes.volume(id);
        let lock = self.agent.lock_for(id).await;
        let _serialised = lock.lock().await;
        self.agent
            .refresh_pair(
                id,
                &paths,
                data,
                &current.key_pem,
                &current.cert_pem,
                PodIp::Optional,
            )
            .await
            .map_err(issue_error)
    }

    async fn pod_ip(&self, data: &VolumeData) -> Result<Option<IpAddr>, IssueError> {
        let pod = self
            .agent
            .pods
            .current(&data.namespace, &data.pod_name)
            .await
            .map_err(|e| IssueError {
                transient: true,
                message: e.to_string(),
            })?;
        // an IP from a sandbox older than the node is not the pod's (see `kubelet::Sandbox`)
        Ok(pod
            .filter(|p| p.uid == data.pod_uid && p.sandbox.ip_is_current(self.agent.node_boot))
            .and_then(|p| p.ip.as_deref().and_then(|ip| ip.parse().ok())))
    }

    fn ready(&self) -> bool {
        self.agent.node.is_valid()
    }
}
