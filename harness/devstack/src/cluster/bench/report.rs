//! The report `cluster bench` prints (JSON, or a table), built from each kind's totals over the
//! run. Latencies use the benches' own [`Latency`] (p50, p90, p99, max, milliseconds).

use super::Phase;
use super::costs::{CpuSnapshot, DEV_ZTS, PodShare};
use super::kinds::Kind;
use crate::bench::Latency;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The JSON `cluster bench` prints.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// Kubernetes version of the node.
    pub kubernetes_version: String,
    /// Pods in the sequential phase, per kind.
    pub sequential_pods: usize,
    /// Milliseconds between two of them.
    pub sequential_interval_ms: f64,
    /// Pods in the burst, per kind.
    pub burst_pods: usize,
    /// `--order-offset`: how far the kinds' order was rotated in this run.
    pub order_offset: usize,
    /// The kinds in the order each phase that ran measured them.
    pub kind_order: BTreeMap<String, Vec<String>>,
    /// The churn phase: seconds of creations, ms between two, ms each pod lives.
    pub churn: ChurnShape,
    /// Created → app started for a pod with no identity, by phase: the kubelet's and
    /// containerd's own share of every figure below.
    pub baseline_pod_start_ms: BTreeMap<String, Latency>,
    /// Created → credential held (no identity: → app started), every kind measured, by phase.
    pub start_ms: BTreeMap<String, BTreeMap<String, Latency>>,
    /// What an init container and a native sidecar that do nothing (`none-same-shape`) cost
    /// per pod, ms of CPU in their cgroups (the runtime's `runc init` runs there): the part of
    /// the SIA modes' `per_pod_cpu_ms` any container of that shape pays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_shape_per_pod_cpu_ms: Option<f64>,
    /// Each identity system measured: `athenz` (files-mode CSI), `athenz-sia-csi-socket` and
    /// `athenz-sia-flex` (our SIA as init container and sidecar), `spire`.
    pub systems: BTreeMap<String, SystemReport>,
    /// The API server's and etcd's CPU over the baseline's windows, by part, ms per pod: what
    /// any pod costs them, against which each system's `kubernetes_cpu_ms_per_credential` reads.
    pub baseline_kubernetes_cpu_ms_per_pod: BTreeMap<String, f64>,
    /// The build of this devstack, whose `zts` subcommand is the ZTS stand-in the bench started
    /// (`release` for figures worth reading: a debug ZTS inflates the CA's share).
    pub dev_zts_build: &'static str,
    /// SPIRE's settings, when it ran ([`crate::cluster::spire::config`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spire_config: Option<BTreeMap<String, String>>,
    /// From the kubelet's log, by kind and phase: the pods that waited past the kubelet's first
    /// 300 ms volume check, and the set-up time of their CSI or flex volume.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub volume_waits: BTreeMap<String, BTreeMap<String, super::volume_wait::VolumeWaits>>,
    /// From containerd's and the kubelet's logs, by kind (those with an init container) and
    /// phase: the init container's own run, the kubelet's lag in noticing its exit, and the
    /// sidecar's and app's start after it. The lag is the kubelet's relist and differs between
    /// kinds by where it stood, not by what the init container did.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub init_waits: BTreeMap<String, BTreeMap<String, super::init_wait::InitWaits>>,
    /// Our node agent's own account, by kind and phase: each upstream it waited on (`kubelet`,
    /// `dns`, `jwt_service`, `zts_register`, `zts_refresh`), its calls and mean milliseconds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub agent_upstream_ms:
        BTreeMap<String, BTreeMap<String, BTreeMap<String, crate::agent_upstreams::Step>>>,
}

/// The churn phase's shape.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChurnShape {
    /// Seconds during which pods are created.
    pub seconds: f64,
    /// Milliseconds between two creations.
    pub interval_ms: f64,
    /// Milliseconds from a pod's creation to its deletion (at least until its credential).
    pub lifetime_ms: f64,
}

/// One system in one configuration, over all its phases of the run.
#[derive(Debug, Serialize)]
pub struct SystemReport {
    /// What was deployed and how the pod gets its credential.
    pub configuration: &'static str,
    /// Credentials delivered (pods measured, all phases).
    pub credentials: usize,
    /// The node agent's peak resident set over the run (ours: athenz-identity-agent, the same
    /// process for every mode; SPIRE: spire-agent), MiB.
    pub agent_peak_rss_mib: f64,
    /// Node CPU per credential: the system's DaemonSet pods (ours: the agent, which is also the
    /// CSI driver; SPIRE: spire-agent and the SPIFFE CSI driver) plus each pod's identity
    /// containers (our SIA init container and sidecar; none in files mode or SPIRE), ms.
    pub node_cpu_ms_per_credential: f64,
    /// Of that, the DaemonSet pods', by name, ms per credential.
    pub node_parts_ms: BTreeMap<String, f64>,
    /// Of that, each pod's identity containers', ms per credential.
    pub per_pod_cpu_ms: f64,
    /// Each pod's identity containers' resident memory before its deletion (the SIA sidecar;
    /// zero where nothing of the system runs in the pod), mean and largest, MiB.
    pub per_pod_rss_mib: MeanMax,
    /// Control-plane CPU per credential, ms: ours the jwt-service, callback and webhook pods
    /// and the dev ZTS process; SPIRE's spire-server.
    pub control_plane_cpu_ms_per_credential: f64,
    /// Of that, by part, ms per credential (`dev-zts` is the share a real ZTS would carry).
    pub control_plane_parts_ms: BTreeMap<String, f64>,
    /// The system's CPU with no pod coming or going, ms per second, measured before the
    /// phases: what it costs a node to run at all, and what the per-credential figures above
    /// include for the time each window lasted.
    pub idle_cpu_ms_per_s: IdleRates,
    /// Node plus control plane, ms per credential.
    pub total_cpu_ms_per_credential: f64,
    /// The same without the certificate authority's share a real deployment runs elsewhere:
    /// ours without the dev ZTS (a real ZTS carries it); SPIRE's server is its own CA and its
    /// attestor, so its figure is its total.
    pub total_cpu_ms_per_credential_without_ca: f64,
    /// The API server's and etcd's CPU over this system's windows, by part, ms per credential
    /// (compare `baseline_kubernetes_cpu_ms_per_pod`).
    pub kubernetes_cpu_ms_per_credential: BTreeMap<String, f64>,
    /// Kubernetes API requests per credential that the system's service accounts made, or
    /// that the kubelet made to authorize them (SubjectAccessReviews), from the audit log.
    pub api_requests_per_credential: f64,
    /// The system's API requests with no pod coming or going, a second, measured before the
    /// phases (ours: the initializer's CA checks, the callback's `/version`): a cost of running
    /// at all, whatever the cluster's size, that the figure above includes for the time each
    /// window lasted.
    pub idle_api_requests_per_s: f64,
    /// `api_requests_per_credential` less the idle rate over the kind's windows: the requests
    /// the credentials themselves caused.
    pub api_requests_per_credential_above_idle: f64,
    /// Created → the app container holding a verified credential naming it, by phase.
    pub time_to_credential_ms: BTreeMap<String, Latency>,
    /// Created → the app container holding the verified credential it keeps, by phase: in flex
    /// and socket mode ours names the pod's IP too; files mode's default (no `ipSAN`) and
    /// SPIRE's first credential is the final one.
    pub time_to_verified_final_credential_ms: BTreeMap<String, Latency>,
}

/// A system with nothing to do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Idle {
    /// Its CPU, ms a second.
    pub cpu_ms_per_s: IdleRates,
    /// Its Kubernetes API requests a second.
    pub api_requests_per_s: f64,
}

/// CPU with nothing to do, ms per second.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct IdleRates {
    /// The node's parts.
    pub node: f64,
    /// The control plane's.
    pub control_plane: f64,
}

/// A mean and a maximum.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MeanMax {
    pub mean: f64,
    pub max: f64,
}

/// What one kind accumulated over its phases.
#[derive(Debug, Default)]
pub struct KindTotals {
    /// Created → a verified credential held, by phase.
    pub times: BTreeMap<Phase, Vec<Duration>>,
    /// Created → the final credential held, by phase.
    pub final_times: BTreeMap<Phase, Vec<Duration>>,
    /// Each pod's identity containers.
    pub shares: Vec<PodShare>,
    /// The system's long-running parts over this kind's windows.
    pub cpu: CpuSnapshot,
    /// API requests the system caused in this kind's windows.
    pub api_requests: usize,
    /// How long this kind's windows lasted, seconds.
    pub window_seconds: f64,
    /// The API server and etcd over this kind's windows (its control-plane parts).
    pub kubernetes: CpuSnapshot,
}

impl KindTotals {
    /// Latencies to a verified credential, by phase name.
    pub fn latencies(&self) -> BTreeMap<String, Latency> {
        by_phase_name(&self.times)
    }

    /// Latencies to the final credential, by phase name.
    pub fn final_latencies(&self) -> BTreeMap<String, Latency> {
        by_phase_name(&self.final_times)
    }

    /// The API server's and etcd's CPU over this kind's windows, by part, ms per pod.
    pub fn kubernetes_ms_per_pod(&self) -> BTreeMap<String, f64> {
        let pods = self.times.values().map(Vec::len).sum::<usize>().max(1) as f64;
        self.kubernetes
            .control
            .iter()
            .map(|(part, seconds)| (part.clone(), seconds * 1e3 / pods))
            .collect()
    }

    /// Mean CPU of each pod's identity containers, ms.
    pub fn per_pod_cpu_ms(&self) -> f64 {
        self.shares.iter().map(|s| s.cpu_seconds).sum::<f64>() * 1e3
            / self.shares.len().max(1) as f64
    }

    /// The system's report for `kind`, with its agent's peak RSS and idle rates.
    pub fn system_report(&self, kind: Kind, agent_peak_rss_mib: f64, idle: Idle) -> SystemReport {
        let credentials = self.times.values().map(Vec::len).sum::<usize>();
        let per = |seconds: f64| seconds * 1e3 / credentials.max(1) as f64;
        let per_parts = |parts: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
            parts.iter().map(|(k, v)| (k.clone(), per(*v))).collect()
        };
        let node_parts = per_parts(&self.cpu.node);
        let control_parts = per_parts(&self.cpu.control);
        let per_pod_cpu_ms = per(self.shares.iter().map(|s| s.cpu_seconds).sum());
        let rss: Vec<f64> = self
            .shares
            .iter()
            .map(|s| s.rss_bytes as f64 / (1024.0 * 1024.0))
            .collect();
        let node_cpu = node_parts.values().sum::<f64>() + per_pod_cpu_ms;
        let control_cpu = control_parts.values().sum::<f64>();
        let ca_share = control_parts.get(DEV_ZTS).copied().unwrap_or(0.0);
        SystemReport {
            total_cpu_ms_per_credential: node_cpu + control_cpu,
            total_cpu_ms_per_credential_without_ca: node_cpu + control_cpu - ca_share,
            kubernetes_cpu_ms_per_credential: self.kubernetes_ms_per_pod(),
            configuration: kind.configuration(),
            credentials,
            agent_peak_rss_mib,
            node_cpu_ms_per_credential: node_cpu,
            node_parts_ms: node_parts,
            per_pod_cpu_ms,
            per_pod_rss_mib: MeanMax {
                mean: rss.iter().sum::<f64>() / rss.len().max(1) as f64,
                max: rss.iter().copied().fold(0.0, f64::max),
            },
            control_plane_cpu_ms_per_credential: control_cpu,
            control_plane_parts_ms: control_parts,
            idle_cpu_ms_per_s: idle.cpu_ms_per_s,
            api_requests_per_credential: self.api_requests as f64 / credentials.max(1) as f64,
            idle_api_requests_per_s: idle.api_requests_per_s,
            api_requests_per_credential_above_idle: (self.api_requests as f64
                - idle.api_requests_per_s * self.window_seconds)
                .max(0.0)
                / credentials.max(1) as f64,
            time_to_credential_ms: self.latencies(),
            time_to_verified_final_credential_ms: self.final_latencies(),
        }
    }
}

/// Each phase's times as latencies, by the phase's name.
fn by_phase_name(times: &BTreeMap<Phase, Vec<Duration>>) -> BTreeMap<String, Latency> {
    times
        .iter()
        .map(|(phase, times)| (phase.name().to_owned(), Latency::of(&mut times.clone())))
        .collect()
}

impl BenchReport {
    /// The report as a table, for people.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let phases = Phase::ALL.map(Phase::name);
        out.push_str(&format!(
            "{:<24} {}\n",
            "created → credential",
            phases.map(|p| format!("{p:>20}")).join("")
        ));
        for (kind, by_phase) in &self.start_ms {
            let cells = phases.map(|p| {
                by_phase.get(p).map_or(format!("{:>20}", "-"), |l| {
                    format!("{:>20}", format!("{:.0} / {:.0} ms", l.p50, l.p99))
                })
            });
            out.push_str(&format!("{kind:<24} {}\n", cells.join("")));
        }
        out.push_str("(p50 / p99)\n\n");
        for (name, s) in &self.systems {
            let finals = phases.map(|p| {
                s.time_to_verified_final_credential_ms
                    .get(p)
                    .map_or(format!("{:>20}", "-"), |l| {
                        format!("{:>20}", format!("{:.0} / {:.0} ms", l.p50, l.p99))
                    })
            });
            out.push_str(&format!(
                "{:<24} {}\n",
                format!("{name}: final"),
                finals.join("")
            ));
        }
        out.push('\n');
        for (name, s) in &self.systems {
            out.push_str(&format!(
                "{name:<22} agent RSS {:.1} MiB, node CPU {:.2} ms/credential (per pod {:.2} ms, \
                 {:.1} MiB), control plane {:.2} ms/credential, total {:.2} ({:.2} without the \
                 CA's share), API {:.2} requests/credential ({:.2} above idle); idle {:.2} ms/s \
                 on the node, {:.2} API requests/s\n",
                s.agent_peak_rss_mib,
                s.node_cpu_ms_per_credential,
                s.per_pod_cpu_ms,
                s.per_pod_rss_mib.mean,
                s.control_plane_cpu_ms_per_credential,
                s.total_cpu_ms_per_credential,
                s.total_cpu_ms_per_credential_without_ca,
                s.api_requests_per_credential,
                s.api_requests_per_credential_above_idle,
                s.idle_cpu_ms_per_s.node,
                s.idle_api_requests_per_s
            ));
        }
        if !self.volume_waits.is_empty() {
            out.push_str(&format!(
                "\n{:<24} {}\n",
                "waited > 1 volume check",
                phases.map(|p| format!("{p:>20}")).join("")
            ));
        }
        for (kind, by_phase) in &self.volume_waits {
            let cells = phases.map(|p| {
                by_phase.get(p).map_or(format!("{:>20}", "-"), |w| {
                    let setup = w
                        .identity_volume_setup_ms
                        .as_ref()
                        .map_or(String::new(), |l| format!(", {:.0} ms", l.p50));
                    format!(
                        "{:>20}",
                        format!(
                            "{} of {}{setup}",
                            w.pods_waiting_more_than_one_check, w.pods
                        )
                    )
                })
            });
            out.push_str(&format!("{kind:<24} {}\n", cells.join("")));
        }
        if !self.volume_waits.is_empty() {
            out.push_str("(pods; the identity volume's set-up p50)\n");
        }
        for (kind, by_phase) in &self.init_waits {
            out.push_str(&format!(
                "\n{kind}: init container's own run / kubelet noticing its exit / app started \
                 after, p50 ms\n"
            ));
            for (phase, w) in by_phase {
                out.push_str(&format!(
                    "  {phase:<12} {:.0} / {:.0} / {:.0} ({} pods)\n",
                    w.init_run_ms.p50, w.exit_noticed_ms.p50, w.app_started_ms.p50, w.pods
                ));
            }
        }
        for (kind, by_phase) in &self.agent_upstream_ms {
            out.push_str(&format!(
                "\n{kind}: the agent's upstream calls, mean ms (calls)\n"
            ));
            for (phase, steps) in by_phase {
                let cells: Vec<String> = steps
                    .iter()
                    .map(|(upstream, step)| {
                        format!("{upstream} {:.1} ({})", step.mean_ms, step.calls)
                    })
                    .collect();
                out.push_str(&format!("  {phase:<12} {}\n", cells.join(", ")));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::volume_mode::VolumeMode;

    #[test]
    fn a_systems_figures_are_per_credential_over_every_phase() {
        let mut totals = KindTotals::default();
        totals.times.insert(
            Phase::Sequential,
            vec![Duration::from_millis(100), Duration::from_millis(300)],
        );
        totals
            .times
            .insert(Phase::Churn, vec![Duration::from_millis(200); 2]);
        totals.shares = vec![
            PodShare {
                cpu_seconds: 0.004,
                rss_bytes: 2 << 20,
            },
            PodShare::default(),
            PodShare::default(),
            PodShare {
                cpu_seconds: 0.004,
                rss_bytes: 4 << 20,
            },
        ];
        totals.cpu.node.insert("athenz-agent".into(), 0.040);
        totals.cpu.control.insert(DEV_ZTS.into(), 0.008);
        totals.cpu.control.insert("athenz-callback".into(), 0.004);
        totals.api_requests = 6;
        totals.window_seconds = 20.0;
        totals.kubernetes.control.insert("etcd".into(), 0.002);
        let report = totals.system_report(
            Kind::Identity(VolumeMode::CsiSocket),
            14.5,
            Idle {
                api_requests_per_s: 0.1,
                ..Idle::default()
            },
        );
        assert!((totals.per_pod_cpu_ms() - 2.0).abs() < 1e-9);
        assert_eq!(report.credentials, 4);
        assert!((report.node_parts_ms["athenz-agent"] - 10.0).abs() < 1e-9);
        assert!((report.per_pod_cpu_ms - 2.0).abs() < 1e-9);
        assert!((report.node_cpu_ms_per_credential - 12.0).abs() < 1e-9);
        assert!((report.control_plane_cpu_ms_per_credential - 3.0).abs() < 1e-9);
        assert!((report.api_requests_per_credential - 1.5).abs() < 1e-9);
        // 6 requests, 2 of them the idle rate's over 20 s
        assert!((report.api_requests_per_credential_above_idle - 1.0).abs() < 1e-9);
        assert!((report.idle_api_requests_per_s - 0.1).abs() < 1e-9);
        // node 12 + control plane 3, of which the dev ZTS 2
        assert!((report.total_cpu_ms_per_credential - 15.0).abs() < 1e-9);
        assert!((report.total_cpu_ms_per_credential_without_ca - 13.0).abs() < 1e-9);
        assert!((report.kubernetes_cpu_ms_per_credential["etcd"] - 0.5).abs() < 1e-9);
        assert!((report.per_pod_rss_mib.mean - 1.5).abs() < 1e-9);
        assert!((report.per_pod_rss_mib.max - 4.0).abs() < 1e-9);
        assert_eq!(
            report.time_to_credential_ms.keys().collect::<Vec<_>>(),
            ["churn", "sequential"]
        );
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["time_to_credential_ms"]["sequential"]["p99"].is_number());
        assert!(json["total_cpu_ms_per_credential_without_ca"].is_number());
    }
}
