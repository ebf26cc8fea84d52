//! What a kind of pod costs beyond its time: the CPU of its identity system's pods on the node
//! and in the control plane, read from their pod cgroups (every container of the pod, restarts
//! and exited init containers included: cgroup v1 `cpuacct` charges every ancestor, so a pod's
//! counter keeps what its finished containers used); the CPU and memory of each measured pod's
//! own identity containers (an SIA init container and sidecar; none for CSI files mode or
//! SPIRE); and the Kubernetes API requests the system caused, from the API server's audit log.
//!
//! The kubelet here uses the cgroupfs driver with the QoS hierarchy (`config::kubelet`): a pod's
//! cgroup is `kubepods/[burstable|besteffort/]pod<uid>`, each container's
//! `pod<uid>/<container id>` (the sandbox's too).

use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Where the kubelets' pod cgroups are, per controller: the host's node's `kubepods`, and each
/// further node's under its cgroup root (`athenz-devstack-<n>/kubepods`, `cluster up --nodes`).
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// `cpuacct`'s `kubepods` of every node.
    cpu: Vec<PathBuf>,
    /// `memory`'s `kubepods` of every node.
    memory: Vec<PathBuf>,
}

/// The QoS classes' parents under `kubepods` (Guaranteed pods sit directly in it).
const QOS_CLASSES: [&str; 3] = ["", "burstable", "besteffort"];

impl Cgroups {
    /// This host's.
    pub fn host() -> Self {
        Self::at(Path::new("/sys/fs/cgroup"))
    }

    /// Under a cgroup v1 mount root (tests give a directory of their own).
    pub fn at(root: &Path) -> Self {
        let kubepods = |controller: &str| {
            let hierarchy = root.join(controller);
            let mut roots = vec![hierarchy.join("kubepods")];
            let mut further: Vec<PathBuf> = std::fs::read_dir(&hierarchy)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(crate::cluster::nodes::NODE_PREFIX)
                })
                .map(|e| e.path().join("kubepods"))
                .collect();
            further.sort();
            roots.extend(further);
            roots
        };
        Self {
            cpu: kubepods("cpuacct"),
            memory: kubepods("memory"),
        }
    }

    /// The pod's cgroup under one of `controller_roots`; the uid is checked before it touches a
    /// path.
    fn pod_dir(controller_roots: &[PathBuf], uid: &str) -> anyhow::Result<PathBuf> {
        if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            bail!("{uid:?} is not a pod uid");
        }
        controller_roots
            .iter()
            .flat_map(|root| {
                QOS_CLASSES
                    .iter()
                    .map(move |qos| root.join(qos).join(format!("pod{uid}")))
            })
            .find(|dir| dir.is_dir())
            .with_context(|| {
                let roots: Vec<String> = controller_roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect();
                format!("no cgroup for pod {uid} under {}", roots.join(" or "))
            })
    }

    /// The CPU seconds pod `uid`'s cgroup has used.
    pub fn pod_cpu_seconds(&self, uid: &str) -> anyhow::Result<f64> {
        cpuacct_seconds(&Self::pod_dir(&self.cpu, uid)?)
    }

    /// What `pod` (as the API server has it, its containers running) used beyond its app
    /// containers and its sandbox: its init containers and sidecars, finished or running.
    pub fn identity_share(&self, pod: &Value) -> anyhow::Result<PodShare> {
        let uid = pod["metadata"]["uid"]
            .as_str()
            .context("the pod has no uid")?;
        let apps = container_ids(&pod["status"]["containerStatuses"]);
        let inits = container_ids(&pod["status"]["initContainerStatuses"]);
        let pod_cpu = Self::pod_dir(&self.cpu, uid)?;
        let mut outside = 0.0;
        for entry in
            std::fs::read_dir(&pod_cpu).with_context(|| format!("listing {}", pod_cpu.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", pod_cpu.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // the app containers and the sandbox (the one container the pod's status does not
            // list) are not the identity's
            if entry.path().is_dir() && !inits.contains(&name) {
                outside += cpuacct_seconds(&entry.path())?;
            }
        }
        let pod_memory = Self::pod_dir(&self.memory, uid)?;
        let mut rss_bytes = 0;
        for id in &inits {
            let stat = pod_memory.join(id).join("memory.stat");
            // an init container that finished has no cgroup left: nothing resident
            if let Ok(text) = std::fs::read_to_string(&stat) {
                rss_bytes +=
                    resident_bytes(&text).with_context(|| format!("reading {}", stat.display()))?;
            }
        }
        if apps.is_empty() {
            bail!("pod {uid} lists no running app container");
        }
        Ok(PodShare {
            cpu_seconds: (cpuacct_seconds(&pod_cpu)? - outside).max(0.0),
            rss_bytes,
        })
    }
}

/// Whether `pod`'s status names a container id for every container and init container of its
/// spec: the kubelet reports them a moment after starting them, and until then the share of a
/// container the status does not name could not be told from the sandbox's.
pub fn status_complete(pod: &Value) -> bool {
    let named = |spec: &str, status: &str| {
        let wanted = pod["spec"][spec].as_array().map_or(0, Vec::len);
        let ids = pod["status"][status]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["containerID"].as_str().is_some_and(|id| !id.is_empty()))
            .count();
        ids == wanted
    };
    named("containers", "containerStatuses") && named("initContainers", "initContainerStatuses")
}

/// A pod's identity containers' use, sampled just before the pod is deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodShare {
    /// CPU seconds.
    pub cpu_seconds: f64,
    /// Resident memory of those still running (anonymous and mapped file pages), bytes.
    pub rss_bytes: u64,
}

/// The container ids in a pod status's container list (`containerd://<id>`).
fn container_ids(statuses: &Value) -> BTreeSet<String> {
    statuses
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["containerID"].as_str())
        .filter_map(|id| id.split_once("://").map(|(_, id)| id.to_owned()))
        .collect()
}

/// A cgroup's `cpuacct.usage` (nanoseconds) in seconds.
fn cpuacct_seconds(dir: &Path) -> anyhow::Result<f64> {
    let file = dir.join("cpuacct.usage");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let ns: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("{} holds {:?}, not nanoseconds", file.display(), text))?;
    Ok(ns as f64 / 1e9)
}

/// Resident bytes in a v1 `memory.stat`: `total_rss` + `total_mapped_file`, what the
/// processes' RSS adds up to.
fn resident_bytes(stat: &str) -> anyhow::Result<u64> {
    let field = |name: &str| -> anyhow::Result<u64> {
        let value = stat
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .with_context(|| format!("no {name} line"))?;
        value
            .trim()
            .parse()
            .with_context(|| format!("{name} is {value:?}"))
    };
    Ok(field("total_rss")? + field("total_mapped_file")?)
}

/// Where one part of a system's CPU is counted.
#[derive(Debug, Clone)]
pub enum CpuSource {
    /// A pod, by uid (all its containers).
    Pod(String),
    /// A process on the host (the dev ZTS).
    Process(u32),
}

/// The dev ZTS's part: the certificate authority's share of ours (a real ZTS carries it).
pub const DEV_ZTS: &str = "dev-zts";

/// A system's long-running parts: on the node (its DaemonSets' pods) and in the control plane
/// (everything else it runs), each named.
#[derive(Debug, Clone, Default)]
pub struct SystemMeter {
    /// Node parts.
    pub node: Vec<(String, CpuSource)>,
    /// Control-plane parts.
    pub control: Vec<(String, CpuSource)>,
}

/// CPU seconds so far, by part.
#[derive(Debug, Clone, Default)]
pub struct CpuSnapshot {
    /// Node parts, by name.
    pub node: BTreeMap<String, f64>,
    /// Control-plane parts, by name.
    pub control: BTreeMap<String, f64>,
}

impl CpuSnapshot {
    /// What each part used since `before`.
    pub fn since(&self, before: &CpuSnapshot) -> CpuSnapshot {
        let minus = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0.0)))
                .collect()
        };
        CpuSnapshot {
            node: minus(&self.node, &before.node),
            control: minus(&self.control, &before.control),
        }
    }

    /// Adds `other` part by part.
    pub fn add(&mut self, other: &CpuSnapshot) {
        for (k, v) in &other.node {
            *self.node.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.control {
            *self.control.entry(k.clone()).or_default() += v;
        }
    }
}

impl SystemMeter {
    /// The parts of the pods in `namespaces` (a pod list per namespace, as the API server
    /// gives it): a DaemonSet's pods are the node's, the rest the control plane's; each named
    /// by its owner (a ReplicaSet's without its hash).
    pub fn from_pod_lists(lists: &[Value]) -> anyhow::Result<Self> {
        let mut meter = Self::default();
        for list in lists {
            for pod in list["items"]
                .as_array()
                .context("a pod list has no items")?
            {
                let uid = pod["metadata"]["uid"]
                    .as_str()
                    .context("a pod has no uid")?;
                let owner = &pod["metadata"]["ownerReferences"][0];
                let owner_name = owner["name"]
                    .as_str()
                    .or(pod["metadata"]["name"].as_str())
                    .unwrap_or("unnamed");
                let part = match owner["kind"].as_str() {
                    Some("ReplicaSet") => owner_name
                        .rsplit_once('-')
                        .map_or(owner_name, |(deployment, _)| deployment),
                    _ => owner_name,
                };
                let entry = (part.to_owned(), CpuSource::Pod(uid.to_owned()));
                if owner["kind"] == "DaemonSet" {
                    meter.node.push(entry);
                } else {
                    meter.control.push(entry);
                }
            }
        }
        Ok(meter)
    }

    /// CPU seconds of every part so far (parts of one name summed).
    pub fn snapshot(&self, cgroups: &Cgroups) -> anyhow::Result<CpuSnapshot> {
        let read = |parts: &[(String, CpuSource)]| -> anyhow::Result<BTreeMap<String, f64>> {
            let mut sums = BTreeMap::new();
            for (name, source) in parts {
                let seconds = match source {
                    CpuSource::Pod(uid) => cgroups.pod_cpu_seconds(uid)?,
                    CpuSource::Process(pid) => crate::procs::Usage::of(*pid).cpu_seconds,
                };
                *sums.entry(name.clone()).or_insert(0.0) += seconds;
            }
            Ok(sums)
        };
        Ok(CpuSnapshot {
            node: read(&self.node)?,
            control: read(&self.control)?,
        })
    }
}

/// The API server's audit log (JSON lines), read by byte ranges: a window is the bytes
/// written between its start and its end.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
}

/// The most audit bytes one window may read (a window logs a few KiB per pod).
const MAX_WINDOW_BYTES: u64 = 512 * 1024 * 1024;

impl AuditLog {
    /// The log at `path`.
    pub fn at(path: PathBuf) -> Self {
        Self { path }
    }

    /// Its length now: where the next window starts.
    pub fn end(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// The requests in bytes `from..to` that the service accounts of `namespaces` caused (see
    /// [`caused_by`]).
    pub fn count(&self, from: u64, to: u64, namespaces: &[&str]) -> anyhow::Result<usize> {
        if to <= from {
            return Ok(0);
        }
        if to - from > MAX_WINDOW_BYTES {
            bail!(
                "{} grew by {} bytes in one window (more than {MAX_WINDOW_BYTES})",
                self.path.display(),
                to - from
            );
        }
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(SeekFrom::Start(from))?;
        let mut bytes = Vec::new();
        file.take(to - from).read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut count = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let event: Value = serde_json::from_str(line)
                .with_context(|| format!("{} has a line that is not JSON", self.path.display()))?;
            if caused_by(&event, namespaces) {
                count += 1;
            }
        }
        Ok(count)
    }
}

/// Whether an audit event is a request the service accounts of `namespaces` caused: one they
/// made, or a SubjectAccessReview the kubelet made for one of them (the kubelet authorizes each
/// caller of its API that way, after its cache).
pub fn caused_by(event: &Value, namespaces: &[&str]) -> bool {
    let groups = event["user"]["groups"].as_array();
    let made = namespaces.iter().any(|ns| {
        let group = format!("system:serviceaccounts:{ns}");
        groups.is_some_and(|g| g.iter().any(|x| x.as_str() == Some(group.as_str())))
    });
    let reviewed = event["objectRef"]["resource"] == "subjectaccessreviews"
        && event["requestObject"]["spec"]["user"]
            .as_str()
            .is_some_and(|user| {
                namespaces
                    .iter()
                    .any(|ns| user.starts_with(&format!("system:serviceaccount:{ns}:")))
            });
    made || reviewed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const UID: &str = "0d5c4b1e-7a7f-4c1e-9a2b-1f2e3d4c5b6a";

    /// A pod cgroup of 0.5 s: app 0.1 s, sandbox 0.01 s, a running sidecar 0.2 s, and 0.19 s of
    /// an init container that finished (its cgroup gone, its usage still in the pod's).
    fn pod_fixture(root: &Path) -> Value {
        let pod = root.join(format!("cpuacct/kubepods/besteffort/pod{UID}"));
        write(&pod.join("cpuacct.usage"), "500000000\n");
        write(&pod.join("app1/cpuacct.usage"), "100000000\n");
        write(&pod.join("pause1/cpuacct.usage"), "10000000\n");
        write(&pod.join("side1/cpuacct.usage"), "200000000\n");
        let memory = root.join(format!("memory/kubepods/besteffort/pod{UID}"));
        write(
            &memory.join("side1/memory.stat"),
            "rss 1\ntotal_cache 7\ntotal_rss 4096\ntotal_mapped_file 1024\n",
        );
        json!({
            "metadata": {"uid": UID},
            "status": {
                "containerStatuses": [{"containerID": "containerd://app1"}],
                "initContainerStatuses": [
                    {"containerID": "containerd://init1"},
                    {"containerID": "containerd://side1"}
                ]
            }
        })
    }

    #[test]
    fn a_pods_share_is_its_init_containers_and_sidecars_not_its_app_or_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let pod = pod_fixture(dir.path());
        let cgroups = Cgroups::at(dir.path());
        let share = cgroups.identity_share(&pod).unwrap();
        assert!((share.cpu_seconds - 0.39).abs() < 1e-9, "{share:?}");
        assert_eq!(share.rss_bytes, 5120);
        assert!((cgroups.pod_cpu_seconds(UID).unwrap() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_status_is_complete_once_every_container_of_the_spec_has_an_id() {
        let mut pod = json!({
            "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "sia"}]},
            "status": {"containerStatuses": [{"containerID": "containerd://a"}],
                       "initContainerStatuses": [{"name": "sia"}]}
        });
        assert!(!status_complete(&pod));
        pod["status"]["initContainerStatuses"][0]["containerID"] = "containerd://s".into();
        assert!(status_complete(&pod));
        pod["status"]["containerStatuses"] = json!([]);
        assert!(!status_complete(&pod));
        assert!(status_complete(&json!({"spec": {"containers": []}})));
    }

    #[test]
    fn hostile_or_broken_cgroups_and_pods_are_errors_that_name_them() {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::at(dir.path());
        for uid in ["../../etc", "", "pod/x", "a b"] {
            let err = cgroups.pod_cpu_seconds(uid).unwrap_err().to_string();
            assert!(err.contains("not a pod uid"), "{uid}: {err}");
        }
        let err = cgroups.pod_cpu_seconds("abc").unwrap_err().to_string();
        assert!(err.contains("no cgroup for pod abc"), "{err}");
        let pod = pod_fixture(dir.path());
        let usage = dir.path().join(format!(
            "cpuacct/kubepods/besteffort/pod{UID}/cpuacct.usage"
        ));
        write(&usage, "lots\n");
        let err = format!("{:#}", cgroups.identity_share(&pod).unwrap_err());
        assert!(err.contains("not nanoseconds"), "{err}");
        let mut no_app = pod_fixture(dir.path());
        no_app["status"]["containerStatuses"] = json!([]);
        let err = cgroups.identity_share(&no_app).unwrap_err().to_string();
        assert!(err.contains("no running app container"), "{err}");
        assert!(resident_bytes("total_rss 1\n").is_err());
        assert!(resident_bytes("total_rss x\ntotal_mapped_file 1\n").is_err());
    }

    #[test]
    fn daemonset_pods_are_the_nodes_and_a_deployments_replicas_share_its_name() {
        let pod = |uid: &str, kind: &str, owner: &str| {
            json!({"metadata": {"uid": uid, "name": "p",
                                "ownerReferences": [{"kind": kind, "name": owner}]}})
        };
        let list = json!({"items": [
            pod("a", "DaemonSet", "athenz-agent"),
            pod("b", "ReplicaSet", "athenz-jwt-service-5d8f9c"),
            pod("c", "ReplicaSet", "athenz-jwt-service-5d8f9c"),
            pod("d", "StatefulSet", "spire-server"),
        ]});
        let meter = SystemMeter::from_pod_lists(&[list]).unwrap();
        let names = |parts: &[(String, CpuSource)]| -> Vec<String> {
            parts.iter().map(|(n, _)| n.clone()).collect()
        };
        assert_eq!(names(&meter.node), ["athenz-agent"]);
        assert_eq!(
            names(&meter.control),
            ["athenz-jwt-service", "athenz-jwt-service", "spire-server"]
        );
        assert!(SystemMeter::from_pod_lists(&[json!({"kind": "Status"})]).is_err());
    }

    #[test]
    fn snapshots_subtract_and_add_part_by_part() {
        let at = |node: f64, zts: f64| CpuSnapshot {
            node: BTreeMap::from([("agent".to_owned(), node)]),
            control: BTreeMap::from([("zts".to_owned(), zts)]),
        };
        let mut total = CpuSnapshot::default();
        total.add(&at(3.0, 2.0).since(&at(1.0, 1.5)));
        total.add(&at(4.0, 2.5).since(&at(3.5, 2.0)));
        assert!((total.node["agent"] - 2.5).abs() < 1e-9);
        assert!((total.control["zts"] - 1.0).abs() < 1e-9);
    }

    #[test]
    fn audit_windows_count_what_a_systems_accounts_caused_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let ours = json!({"user": {"username": "system:serviceaccount:k8s-admin:athenz-callback",
                                    "groups": ["system:serviceaccounts", "system:serviceaccounts:k8s-admin"]},
                          "objectRef": {"resource": "pods"}});
        let kubelet_for_agent = json!({"user": {"username": "system:node:vm", "groups": ["system:nodes"]},
                                       "objectRef": {"resource": "subjectaccessreviews"},
                                       "requestObject": {"spec": {"user": "system:serviceaccount:athenz-system:athenz-agent"}}});
        let kubelet_for_other = json!({"user": {"username": "system:node:vm", "groups": ["system:nodes"]},
                                       "objectRef": {"resource": "subjectaccessreviews"},
                                       "requestObject": {"spec": {"user": "system:serviceaccount:athenz-systemx:a"}}});
        let spire = json!({"user": {"username": "system:serviceaccount:spire:spire-server",
                                     "groups": ["system:serviceaccounts:spire"]}});
        let first = format!("{ours}\n{kubelet_for_agent}\n");
        let second = format!("{kubelet_for_other}\n{spire}\n{ours}\n");
        write(&path, &format!("{first}{second}"));
        let log = AuditLog::at(path.clone());
        let ns = ["athenz-system", "k8s-admin"];
        let split = first.len() as u64;
        assert_eq!(log.count(0, split, &ns).unwrap(), 2);
        assert_eq!(log.count(split, log.end(), &ns).unwrap(), 1);
        assert_eq!(log.count(split, log.end(), &["spire"]).unwrap(), 1);
        assert_eq!(log.count(split, split, &ns).unwrap(), 0);
        write(&path, &format!("{first}not json\n"));
        let err = log.count(0, log.end(), &ns).unwrap_err().to_string();
        assert!(err.contains("not JSON"), "{err}");
        let err = log
            .count(0, MAX_WINDOW_BYTES + 1, &ns)
            .unwrap_err()
            .to_string();
        assert!(err.contains("in one window"), "{err}");
    }
}
