//! One phase of one kind: creating its pods (one per interval, all at once, or a steady churn
//! of creations and deletions), timing each from its creation to its probe's `ready` line (a
//! verified credential) and `final` line (the one it keeps), and sampling each pod's identity
//! containers just before the pod is deleted.

use super::Phase;
use super::arrivals;
use super::costs::{self, Cgroups, PodShare};
use super::kinds::Kind;
use crate::cluster::health::Checker;
use crate::cluster::scenario::Scenario;
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

/// How long one pod may take to hold its credential before the bench gives up.
const POD_LIMIT: Duration = Duration::from_secs(120);
/// How long a running pod's status may take to name its containers.
const STATUS_LIMIT: Duration = Duration::from_secs(30);
/// How often pending pods' probes are asked.
const POLL: Duration = Duration::from_millis(200);
/// The service account every measured pod runs as.
pub const SERVICE_ACCOUNT: &str = "probe";

/// How a churn phase runs.
#[derive(Debug, Clone, Copy)]
pub struct Churn {
    /// How long pods keep being created.
    pub duration: Duration,
    /// One pod created this often.
    pub interval: Duration,
    /// Each pod is deleted this long after its creation (or once it holds its credential, if
    /// that is later).
    pub lifetime: Duration,
}

/// The pods of one kind in its namespace.
pub struct Workload<'a> {
    /// Pod manifests and kubectl.
    pub scenario: &'a Scenario,
    /// The API server.
    pub api: &'a Checker,
    /// Where the pods' cgroups are.
    pub cgroups: &'a Cgroups,
    pub kind: Kind,
    pub ns: String,
    /// Its pods, but for their names: made once, as a controller's template is (making a
    /// csi-socket pod reads the webhook's template from the cluster, too slow to do per pod
    /// at churn rate).
    pub prototype: serde_json::Value,
}

/// What one phase measured.
#[derive(Debug, Default)]
pub struct PhaseOutcome {
    /// Each pod's created → a verified credential held.
    pub times: Vec<Duration>,
    /// Each pod's created → its final credential held (ours: naming its IP too where the mode's
    /// certificate does).
    pub final_times: Vec<Duration>,
    /// Each pod's identity containers, sampled before its deletion.
    pub shares: Vec<PodShare>,
}

impl Workload<'_> {
    fn pods_path(&self) -> String {
        format!("/api/v1/namespaces/{}/pods", self.ns)
    }

    /// Pod `name`.
    fn pod(&self, name: &str) -> serde_json::Value {
        let mut pod = self.prototype.clone();
        pod["metadata"]["name"] = name.into();
        pod
    }

    /// Creates pod `name`; returns when the API server was asked.
    async fn create(&self, name: &str) -> anyhow::Result<SystemTime> {
        let pod = self.pod(name);
        let at = SystemTime::now();
        self.api.api_post(&self.pods_path(), &pod).await?;
        Ok(at)
    }

    /// When pod `name`'s probe held a verified credential and its final one, once it holds
    /// the final one.
    async fn ready(&self, name: &str) -> Option<Stamps> {
        let log = self
            .api
            .api_text(&format!("{}/{name}/log?container=app", self.pods_path()))
            .await?;
        Stamps::of(&log)
    }

    /// Pod `name`'s identity containers now, once its status names all its containers.
    async fn share(&self, name: &str) -> anyhow::Result<PodShare> {
        let deadline = Instant::now() + STATUS_LIMIT;
        let pod = loop {
            let pod = self
                .api
                .api_json(&format!("{}/{name}", self.pods_path()))
                .await
                .with_context(|| format!("reading pod {}/{name}", self.ns))?;
            if costs::status_complete(&pod) {
                break pod;
            }
            if Instant::now() > deadline {
                bail!(
                    "pod {}/{name}'s status named not all its containers within {STATUS_LIMIT:?}",
                    self.ns
                );
            }
            tokio::time::sleep(POLL).await;
        };
        self.cgroups
            .identity_share(&pod)
            .with_context(|| format!("pod {}/{name}", self.ns))
    }

    /// Runs `phase`: its pods created, timed, sampled and deleted (all gone when it returns).
    pub async fn run(
        &self,
        phase: Phase,
        count: usize,
        interval: Duration,
        churn: Churn,
    ) -> anyhow::Result<PhaseOutcome> {
        let mut outcome = match phase {
            Phase::Sequential => self.created_then_timed(phase, count, interval).await?,
            Phase::Burst => {
                self.created_then_timed(phase, count, Duration::ZERO)
                    .await?
            }
            Phase::Churn => self.churn(churn).await?,
        };
        if phase != Phase::Churn {
            for name in (0..count).map(|i| pod_name(phase, i)) {
                outcome.shares.push(self.share(&name).await?);
            }
        }
        self.delete_all()?;
        Ok(outcome)
    }

    /// `count` pods created `interval` apart, each a little later within the kubelet's loop
    /// period (`arrivals`; zero: all at once, each its own request), then each one's time.
    async fn created_then_timed(
        &self,
        phase: Phase,
        count: usize,
        interval: Duration,
    ) -> anyhow::Result<PhaseOutcome> {
        let mut created = BTreeMap::new();
        if interval.is_zero() {
            let mut sends = tokio::task::JoinSet::new();
            let at = SystemTime::now();
            for i in 0..count {
                let name = pod_name(phase, i);
                let pod = self.pod(&name);
                let (api, path) = (self.api.clone(), self.pods_path());
                sends.spawn(async move { api.api_post(&path, &pod).await });
                created.insert(name, at);
            }
            while let Some(sent) = sends.join_next().await {
                sent.context("a pod's creation task")??;
            }
        } else {
            let start = tokio::time::Instant::now();
            for i in 0..count {
                tokio::time::sleep_until(start + arrivals::arrival(i, interval)).await;
                let name = pod_name(phase, i);
                created.insert(name.clone(), self.create(&name).await?);
            }
        }
        let deadline = Instant::now() + POD_LIMIT;
        let mut outcome = PhaseOutcome::default();
        while !created.is_empty() {
            if Instant::now() > deadline {
                bail!(
                    "{} pods never held a credential within {POD_LIMIT:?}: {:?}",
                    created.len(),
                    created.keys().collect::<Vec<_>>()
                );
            }
            let mut done = Vec::new();
            for (name, at) in &created {
                if let Some(stamps) = self.ready(name).await {
                    outcome.record(&stamps, *at);
                    done.push(name.clone());
                }
            }
            for name in done {
                created.remove(&name);
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(outcome)
    }

    /// Pods created one per `churn.interval` for `churn.duration` (each a little later within
    /// the kubelet's loop period, `arrivals`), each deleted once it is
    /// `churn.lifetime` old and holds its credential; creation and deletion overlap, as in a
    /// rollout or a batch of short jobs. Creating keeps its own pace: it runs beside the
    /// watching (which asks every pending pod's probe, slower the more there are).
    async fn churn(&self, churn: Churn) -> anyhow::Result<PhaseOutcome> {
        if churn.interval.is_zero() {
            bail!("a churn needs an interval between its pods (--churn-interval): 0 given");
        }
        let (created_tx, mut created_rx) = tokio::sync::mpsc::unbounded_channel();
        let create = async move {
            let started = tokio::time::Instant::now();
            let mut i = 0;
            // one pod per interval, the first at once and the last at the phase's end
            while churn.interval.mul_f64(i as f64) <= churn.duration {
                tokio::time::sleep_until(started + arrivals::arrival(i, churn.interval)).await;
                let name = pod_name(Phase::Churn, i);
                let at = self.create(&name).await?;
                // the watcher outlives this loop, so the send only fails if it failed first
                let pod = ChurnPod {
                    name,
                    created_at: at,
                    created: Instant::now(),
                    ready: None,
                };
                if created_tx.send(pod).is_err() {
                    break;
                }
                i += 1;
            }
            anyhow::Ok(())
        };
        let watch = async {
            let mut live: Vec<ChurnPod> = Vec::new();
            let mut outcome = PhaseOutcome::default();
            let mut creating = true;
            loop {
                loop {
                    match created_rx.try_recv() {
                        Ok(pod) => live.push(pod),
                        Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                        Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                            creating = false;
                            break;
                        }
                    }
                }
                for pod in live.iter_mut().filter(|p| p.ready.is_none()) {
                    if let Some(stamps) = self.ready(&pod.name).await {
                        outcome.record(&stamps, pod.created_at);
                        pod.ready = Some(stamps.final_);
                    } else if pod.created.elapsed() > POD_LIMIT {
                        bail!(
                            "pod {}/{} never held a credential within {POD_LIMIT:?}",
                            self.ns,
                            pod.name
                        );
                    }
                }
                let mut kept = Vec::new();
                for pod in live.drain(..) {
                    if pod.ready.is_some() && pod.created.elapsed() >= churn.lifetime {
                        outcome.shares.push(self.share(&pod.name).await?);
                        self.api
                            .api_delete(&format!("{}/{}", self.pods_path(), pod.name))
                            .await?;
                    } else {
                        kept.push(pod);
                    }
                }
                live = kept;
                if !creating && live.iter().all(|p| p.ready.is_some()) {
                    break;
                }
                tokio::time::sleep(POLL).await;
            }
            for pod in &live {
                outcome.shares.push(self.share(&pod.name).await?);
            }
            anyhow::Ok(outcome)
        };
        let ((), outcome) = tokio::try_join!(create, watch)?;
        Ok(outcome)
    }

    /// Deletes every pod in the namespace and waits until they are gone (volumes unmounted).
    fn delete_all(&self) -> anyhow::Result<()> {
        self.scenario.kubectl().run(&[
            "-n",
            &self.ns,
            "delete",
            "pods",
            "--all",
            "--wait=true",
            "--timeout=180s",
        ])?;
        Ok(())
    }
}

/// A churn pod until its deletion.
struct ChurnPod {
    name: String,
    /// When the API server was asked to create it (the probe's clock).
    created_at: SystemTime,
    /// The same moment, for its age.
    created: Instant,
    /// When its probe held its final credential.
    ready: Option<SystemTime>,
}

impl PhaseOutcome {
    /// A pod created at `created` whose probe stamped `stamps`.
    fn record(&mut self, stamps: &Stamps, created: SystemTime) {
        let since = |t: SystemTime| t.duration_since(created).unwrap_or_default();
        self.times.push(since(stamps.ready));
        self.final_times.push(since(stamps.final_));
    }
}

/// A probe's two stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamps {
    /// A verified credential naming the pod's identity.
    pub ready: SystemTime,
    /// The credential it keeps.
    pub final_: SystemTime,
}

impl Stamps {
    /// The stamps in a probe's log, once it has both (a `final` before `ready` is refused).
    pub fn of(log: &str) -> Option<Self> {
        let ready = stamp(log, "ready")?;
        let final_ = stamp(log, "final")?;
        (final_ >= ready).then_some(Self { ready, final_ })
    }
}

/// The name of a phase's `i`th pod.
fn pod_name(phase: Phase, i: usize) -> String {
    format!("{}-{i}", phase.name())
}

/// The time in a probe's first `<word> <unix ns>` line.
fn stamp(log: &str, word: &str) -> Option<SystemTime> {
    let ns: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix(word)?.strip_prefix(' '))?
        .trim()
        .parse()
        .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probes_stamps_are_its_times_and_anything_else_is_none() {
        let stamps = Stamps::of("ready 1795697829123456789\nfinal 1795697829623456789\n").unwrap();
        let at = |ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
        assert_eq!(stamps.ready, at(1_795_697_829_123_456_789));
        assert_eq!(stamps.final_, at(1_795_697_829_623_456_789));
        // not final yet
        assert!(Stamps::of("ready 1795697829123456789\n").is_none());
        // final before ready: not a probe's log
        assert!(Stamps::of("ready 2\nfinal 1\n").is_none());
        assert!(Stamps::of("").is_none());
        assert!(Stamps::of("ready soon\nfinal soon\n").is_none());
        assert!(Stamps::of("readyx 1\nfinal 1\n").is_none());
        assert!(Stamps::of("ready 99999999999999999999999\nfinal 1\n").is_none());
        assert!(Stamps::of(&"x".repeat(1 << 20)).is_none());
    }
}
