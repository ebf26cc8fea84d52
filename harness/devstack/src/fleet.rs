//! The pods `soak` and `chaos` run for a long time: each mounted as kubelet would, given its
//! identity, and (unless its volume is csi-files) with its SIA refresh sidecar running; and the
//! census of their credential sets, read as an application reads them.

use crate::bench::bench_pod;
use crate::kube::{KubeClient, NewPod, PodSize};
use crate::pod_volume::{MountedVolume, NodeKubelet};
use crate::pods::PodContainer;
use crate::stack::Stack;
use anyhow::Context;
use athenz_core::crypto::{CertInfo, PrivateKey, key_matches_cert};
use athenz_core::files::{CERT_FILE, FileSet, KEY_FILE};
use athenz_core::volume_mode::VolumeMode;
use std::time::{Duration, Instant};

/// Kubelet's crash-loop backoff: the first restart of a container that exited waits 10 s, each
/// further one twice as long, up to five minutes.
pub(crate) const CRASH_LOOP_FIRST: Duration = Duration::from_secs(10);
const CRASH_LOOP_MAX: Duration = Duration::from_secs(300);

/// A pod's refresh sidecar, restarted as kubelet restarts it.
pub struct Sidecar {
    /// The running (or exited) container.
    pub process: PodContainer,
    /// How many times it has exited.
    pub exits: u32,
    /// When kubelet's backoff lets it start again, while it is down.
    restart_at: Option<Instant>,
}

impl Sidecar {
    fn new(process: PodContainer) -> Self {
        Self {
            process,
            exits: 0,
            restart_at: None,
        }
    }

    /// Restarts it when it has exited and kubelet's backoff has passed; says whether it did.
    async fn restart_as_kubelet_would(&mut self, now: Instant) -> anyhow::Result<bool> {
        match self.restart_at {
            Some(at) if now >= at => {
                self.restart_at = None;
                self.process.restart_if_exited().await
            }
            Some(_) => Ok(false),
            None => {
                if self.process.check_alive().is_err() {
                    self.exits += 1;
                    self.restart_at = Some(now + crash_loop_delay(self.exits));
                }
                Ok(false)
            }
        }
    }
}

/// Kubelet's wait before restarting a container after its `exits`-th exit.
fn crash_loop_delay(exits: u32) -> Duration {
    CRASH_LOOP_FIRST
        .saturating_mul(2u32.saturating_pow(exits.saturating_sub(1).min(16)))
        .min(CRASH_LOOP_MAX)
}

/// Running pods with their identities.
pub struct Fleet {
    kubelet: NodeKubelet,
    /// Their volumes, pod by pod.
    pub volumes: Vec<MountedVolume>,
    /// Their refresh sidecars (none in csi-files mode), pod by pod.
    pub refreshers: Vec<Sidecar>,
}

/// One read of every pod's set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Census {
    /// Each pod's certificate serial (`None`: unreadable).
    pub serials: Vec<Option<String>>,
    /// Pods whose certificate has expired.
    pub expired: Vec<usize>,
    /// Pods whose certificate has less than a quarter of its validity left: its refresh (due at
    /// about 70 %) is overdue.
    pub overdue: Vec<usize>,
    /// Pods whose key is not their certificate's (a torn set).
    pub torn: Vec<usize>,
    /// Pods whose set could not be read, with why.
    pub unreadable: Vec<(usize, String)>,
    /// Each readable pod's share of its certificate's lifetime already gone, by pod.
    pub lifetime_used: Vec<Option<f64>>,
}

impl Census {
    /// Every pod holds a readable, unexpired, consistent set.
    pub fn all_healthy(&self) -> bool {
        self.expired.is_empty() && self.torn.is_empty() && self.unreadable.is_empty()
    }
}

impl Fleet {
    /// Creates real-size pods numbered `pods` (distinct numbers for distinct fleets of one
    /// stack), gives each its identity one after the other, and starts the refresh sidecars.
    pub async fn start(
        stack: &Stack,
        pods: std::ops::Range<usize>,
        volume: VolumeMode,
    ) -> anyhow::Result<Self> {
        let info = &stack.info;
        let kube = KubeClient::new(&info.kube_api.url)?;
        let kubelet = NodeKubelet::new(info, volume, &stack.state_dir.join("kubelet")).await?;
        let mut volumes = Vec::new();
        for n in pods {
            let pod = bench_pod(n);
            let uid = kube
                .create_running_pod_sized(&pod, &info.node_name, PodSize::Real)
                .await?;
            let (_, mounted) = kubelet.give_identity(info, &pod, &uid).await?;
            volumes.push(mounted);
        }
        let logs = stack.state_dir.join("logs");
        let mut refreshers = Vec::new();
        for mounted in &volumes {
            if let Some(volume) = mounted.sia() {
                refreshers.push(Sidecar::new(
                    crate::node::sia_refresh(info, volume, "24h", &logs, &[]).await?,
                ));
            }
        }
        Ok(Self {
            kubelet,
            volumes,
            refreshers,
        })
    }

    /// A power loss to the pods: every sidecar killed at once, every pod's sandbox and
    /// containers gone (their cgroups removed as the runtime's state would be after a reboot).
    pub async fn power_off(&mut self, stack: &Stack) -> anyhow::Result<()> {
        for sidecar in &mut self.refreshers {
            let _ = sidecar.process.kill().await;
        }
        for mounted in &self.volumes {
            if let Some(volume) = mounted.sia() {
                crate::node::remove_pod_side(&stack.info, volume).await?;
            }
        }
        Ok(())
    }

    /// How pod `i` is started again after a node restart ([`Restart::run`], on its own task as
    /// kubelet's pod workers run in parallel), with `pod` carrying its new IP.
    pub fn restart(&self, stack: &Stack, i: usize, pod: &NewPod) -> Restart {
        Restart {
            kubelet: self.kubelet.clone(),
            info: stack.info.clone(),
            logs: stack.state_dir.join("logs"),
            index: i,
            pod: pod.clone(),
            uid: self.volumes[i].uid.clone(),
        }
    }

    /// Puts pod `i` back as [`Restart::run`] left it.
    pub fn restarted(&mut self, restarted: Restarted) {
        if let (Some(process), Some(sidecar)) =
            (restarted.sidecar, self.refreshers.get_mut(restarted.index))
        {
            *sidecar = Sidecar::new(process);
        }
        self.volumes[restarted.index] = restarted.mounted;
    }

    /// Reads every pod's set now.
    pub fn census(&self) -> Census {
        let now = time::OffsetDateTime::now_utc();
        let mut census = Census::default();
        for (i, mounted) in self.volumes.iter().enumerate() {
            match read_set(mounted) {
                Ok((info, matches)) => {
                    if info.not_after <= now {
                        census.expired.push(i);
                    } else if (info.not_after - now) * 4 < info.not_after - info.not_before {
                        census.overdue.push(i);
                    }
                    if !matches {
                        census.torn.push(i);
                    }
                    let lifetime = (info.not_after - info.not_before).as_seconds_f64();
                    census.lifetime_used.push(
                        (lifetime > 0.0)
                            .then(|| (now - info.not_before).as_seconds_f64() / lifetime),
                    );
                    census.serials.push(Some(info.serial_hex));
                }
                Err(e) => {
                    census.unreadable.push((i, format!("{e:#}")));
                    census.serials.push(None);
                    census.lifetime_used.push(None);
                }
            }
        }
        census
    }

    /// The first refresher that has exited, as an error naming it with its log.
    pub fn dead_refresher(&mut self) -> Option<String> {
        self.refreshers
            .iter_mut()
            .find_map(|s| s.process.check_alive().err().map(|e| format!("{e:#}")))
    }

    /// Restarts refreshers that exited as kubelet restarts a sidecar — after its crash-loop
    /// backoff (10 s, doubling, at most 5 min), not at once, which would hide what an exit
    /// costs a pod; returns how many it restarted now.
    pub async fn restart_exited_refreshers(&mut self) -> anyhow::Result<usize> {
        let now = Instant::now();
        let mut restarted = 0;
        for s in &mut self.refreshers {
            if s.restart_as_kubelet_would(now).await? {
                restarted += 1;
            }
        }
        Ok(restarted)
    }

    /// How many times the refreshers have exited in all.
    pub fn sidecar_exits(&self) -> u32 {
        self.refreshers.iter().map(|s| s.exits).sum()
    }

    /// Stops the sidecars and unmounts every volume as kubelet does when pods go.
    pub async fn stop(mut self, stack: &Stack) -> anyhow::Result<()> {
        for r in &mut self.refreshers {
            r.process.stop().await;
        }
        for mounted in &self.volumes {
            self.kubelet.take_down(&stack.info, mounted).await?;
        }
        Ok(())
    }
}

/// The pod's set, read as an application reads it (one consistent read): its certificate and
/// whether the key beside it is that certificate's.
pub fn read_set(mounted: &MountedVolume) -> anyhow::Result<(CertInfo, bool)> {
    let set = FileSet::new(mounted.credentials_dir())
        .read(&[KEY_FILE, CERT_FILE])
        .context("reading the credential set")?;
    let info = CertInfo::from_pem(&String::from_utf8_lossy(&set[1]))?;
    let key = PrivateKey::from_pem(&String::from_utf8_lossy(&set[0]))?;
    let matches = key_matches_cert(&key, &info);
    Ok((info, matches))
}

/// A pod to start again after a node restart, as kubelet does: its volume mounted or published
/// anew, its init container run, its sidecar started (a new one, no crash-loop back-off).
pub struct Restart {
    kubelet: NodeKubelet,
    info: crate::stack::StackInfo,
    logs: std::path::PathBuf,
    index: usize,
    pod: NewPod,
    uid: String,
}

/// A pod started again.
pub struct Restarted {
    index: usize,
    mounted: MountedVolume,
    sidecar: Option<PodContainer>,
}

impl Restart {
    /// Starts the pod again. Kubelet retries a failed NodePublishVolume with exponential
    /// back-off, 500 ms doubling to 2 min 2 s (`pkg/util/goroutinemap/exponentialbackoff`): a
    /// publish fails while the API still holds the pod's old IP and the agent, seeing that IP
    /// stale, leaves it out.
    pub async fn run(self) -> anyhow::Result<Restarted> {
        let mut wait = Duration::from_millis(500);
        let deadline = Instant::now() + Duration::from_secs(150);
        let mounted = loop {
            match self
                .kubelet
                .give_identity(&self.info, &self.pod, &self.uid)
                .await
            {
                Ok((_, mounted)) => break mounted,
                Err(e) if self.kubelet.csi().is_some() && Instant::now() + wait < deadline => {
                    tracing::info!(pod = %self.pod.name, error = %format!("{e:#}"), retry_in = ?wait, "publishing failed; kubelet retries");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(122));
                }
                Err(e) => return Err(e),
            }
        };
        let sidecar = match mounted.sia() {
            Some(volume) => {
                Some(crate::node::sia_refresh(&self.info, volume, "24h", &self.logs, &[]).await?)
            }
            None => None,
        };
        Ok(Restarted {
            index: self.index,
            mounted,
            sidecar,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_loop_backoff_is_kubelets() {
        let secs: Vec<u64> = (1..=7).map(|n| crash_loop_delay(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(crash_loop_delay(u32::MAX), CRASH_LOOP_MAX);
    }
}
