//! The socket caller is a process of the volume's pod (docs/design.md §4.2): its cgroup names
//! the pod UID the volume was mounted for.

use super::Attestor;
use crate::failure::{Failure, fail};
use crate::metrics::PeerCheckLabels;
use athenz_core::http::ConnInfo;
use athenz_core::peer::PeerCheck;
use athenz_core::volume::{VolumeData, VolumeId};
use http::StatusCode;

impl Attestor {
    /// 403 unless the caller on `conn` runs in volume `id`'s pod; `log` mode lets a mismatch
    /// through and logs it.
    pub fn check_peer(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        conn: &ConnInfo,
    ) -> Result<(), Failure> {
        let mode = match self.peer_check {
            PeerCheck::Off => return Ok(()),
            PeerCheck::Enforce => "enforce",
            PeerCheck::Log => "log",
        };
        let caller = match &conn.peer_process {
            Some(Ok(process)) => process.pod_uid().map_err(|e| e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("the caller is not a local process".to_owned()),
        };
        let (outcome, refusal) = match caller {
            Ok(uid) if uid == data.pod_uid => ("match", None),
            Ok(uid) => (
                "mismatch",
                Some(format!(
                    "the caller runs in pod {uid}, but volume {id} belongs to pod {}",
                    data.pod_uid
                )),
            ),
            Err(why) => (
                "unknown",
                Some(format!(
                    "cannot tell which pod the caller runs in ({why}); volume {id} belongs to pod {}",
                    data.pod_uid
                )),
            ),
        };
        self.metrics
            .peer_checks
            .get_or_create(&PeerCheckLabels { outcome, mode })
            .inc();
        match refusal {
            None => Ok(()),
            Some(why) if self.peer_check == PeerCheck::Log => {
                tracing::warn!(%id, peer = ?conn.peer, reason = %why, "peer check failed (log mode: allowed)");
                Ok(())
            }
            Some(why) => Err(fail(StatusCode::FORBIDDEN, why)),
        }
    }
}
