//! What a measured pod is: no identity (two shapes), one of our modes, or SPIRE; and what each
//! kind's pod looks like. Every kind's app container is a probe that prints `ready <unix ns>`
//! (CLOCK_REALTIME, the clock the bench reads too) once it holds a credential verified against
//! its trust bundle and naming the pod's identity, and `final <unix ns>` once it holds the one it
//! keeps (ours: naming the pod's IP too, except in files mode, whose default certificate names
//! none and is final at once, as SPIRE's SVID is).

use super::super::scenario::{self, APP_IMAGE, BUSYBOX, CREDENTIALS, Scenario};
use super::super::spire;
use athenz_core::volume_mode::VolumeMode;
use serde_json::{Value, json};

/// Our probe's image: [`PROBE_GO`], static.
pub const PROBE_IMAGE: &str = "localhost/athenz-devstack/probe:3";

/// Our probe (`probe.go`, beside this file, so it reads and builds as Go; the standard library
/// only, as SPIRE's probe verifies with go-spiffe): stamps `ready` and `final` (see the module
/// docs; with no arguments at once), then waits for SIGTERM.
pub const PROBE_GO: &str = include_str!("probe.go");

/// The identity system whose processes a kind's costs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum System {
    /// Ours: the agent's DaemonSet, the control plane in `k8s-admin`, the dev ZTS.
    Athenz,
    /// SPIRE: spire-agent and the SPIFFE CSI driver, spire-server.
    Spire,
}

/// What a measured pod is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The app alone, no identity: the kubelet's and containerd's own cost (the baseline).
    Bare,
    /// No identity, but the shape the webhook gives flex and csi-socket pods: an init container
    /// (here one that exits at once) and a native sidecar (one that sleeps): what the kubelet
    /// charges for that shape, whoever fills it.
    SameShape,
    /// An identity in this mode of ours.
    Identity(VolumeMode),
    /// A SPIRE SVID through the SPIFFE CSI driver's Workload API socket.
    Spire,
}

impl Kind {
    /// Every kind, in the order one phase measures them: the systems alternate (baseline, ours
    /// in files mode, SPIRE, then the shapes with a sidecar), so drift in the node's state
    /// during the run falls on all of them.
    pub const ALL: [Kind; 6] = [
        Kind::Bare,
        Kind::Identity(VolumeMode::CsiFiles),
        Kind::Spire,
        Kind::SameShape,
        Kind::Identity(VolumeMode::CsiSocket),
        Kind::Identity(VolumeMode::Flex),
    ];

    /// Its name in the report (and its namespace's suffix).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bare => "none",
            Kind::SameShape => "none-same-shape",
            Kind::Identity(mode) => mode.name(),
            Kind::Spire => "spire",
        }
    }

    /// Its key under `systems` in the report, for the kinds that get a credential.
    pub fn system_key(self) -> Option<&'static str> {
        match self {
            Kind::Identity(VolumeMode::CsiFiles) => Some("athenz"),
            Kind::Identity(VolumeMode::CsiSocket) => Some("athenz-sia-csi-socket"),
            Kind::Identity(VolumeMode::Flex) => Some("athenz-sia-flex"),
            Kind::Spire => Some("spire"),
            Kind::Bare | Kind::SameShape => None,
        }
    }

    /// The system whose processes serve it.
    pub fn system(self) -> Option<System> {
        match self {
            Kind::Identity(_) => Some(System::Athenz),
            Kind::Spire => Some(System::Spire),
            Kind::Bare | Kind::SameShape => None,
        }
    }

    /// Our mode, for ours.
    pub fn mode(self) -> Option<VolumeMode> {
        match self {
            Kind::Identity(mode) => Some(mode),
            _ => None,
        }
    }

    /// What the report says the kind's configuration is.
    pub fn configuration(self) -> &'static str {
        match self {
            Kind::Identity(VolumeMode::CsiFiles) => {
                "csi.athenz.io files mode: the agent makes the key and writes key, certificate, CA \
                 and token into the pod's volume; nothing of ours runs in the pod"
            }
            Kind::Identity(VolumeMode::CsiSocket) => {
                "csi.athenz.io socket mode: the webhook injects the SIA as an init container and a \
                 native sidecar; the SIA makes the key in the pod and asks the agent's socket"
            }
            Kind::Identity(VolumeMode::Flex) => {
                "flex volume driver: the SIA init container and sidecar as in socket mode, the \
                 agent's socket bind-mounted by the driver"
            }
            Kind::Spire => {
                "SPIRE 1.13.3: spire-agent DaemonSet (k8s_psat, k8s workload attestor), SPIFFE CSI \
                 driver 0.2.6 for the Workload API socket, registration entries made as \
                 spire_config.entries says; the app fetches its X.509-SVID over the Workload API"
            }
            Kind::Bare => "no identity",
            Kind::SameShape => "no identity, an init container and a native sidecar",
        }
    }

    /// The pod `name` of this kind in `ns`, run as service account `sa`; `spire` is what a
    /// SPIRE pod's probe asks for and how SPIRE's entries are made.
    pub fn pod(
        self,
        scenario: &Scenario,
        ns: &str,
        name: &str,
        sa: &str,
        spire: Option<(&str, spire::Entries)>,
    ) -> anyhow::Result<Value> {
        let container = match self {
            Kind::Spire => {
                let (id, entries) =
                    spire.ok_or_else(|| anyhow::anyhow!("a SPIRE pod needs its SPIFFE ID"))?;
                spire::probe_container(id, entries)
            }
            _ => probe_container(self.mode().map(|mode| Expected {
                spiffe_id: scenario::spiffe_id(ns, sa),
                names_pod_ip: mode != VolumeMode::CsiFiles,
            })),
        };
        let mut pod = scenario.pod_json(ns, name, sa, self.mode(), container)?;
        match self {
            Kind::SameShape => pod["spec"]["initContainers"] = same_shape_init_containers(),
            Kind::Spire => pod["spec"]["volumes"] = json!([spire::workload_api_volume()]),
            _ => {}
        }
        Ok(pod)
    }
}

/// What our probe waits for.
struct Expected {
    /// The SPIFFE ID the certificate names.
    spiffe_id: String,
    /// Whether the final certificate names the pod's IP (not in files mode, whose volume the
    /// bench leaves at its default: no `ipSAN`).
    names_pod_ip: bool,
}

/// Our probe: waits for a credential as `expected` says in the files the mode delivers (none:
/// starts at once).
fn probe_container(expected: Option<Expected>) -> Value {
    let Some(expected) = expected else {
        return json!({"name": "app", "image": PROBE_IMAGE, "imagePullPolicy": "Never"});
    };
    let ip = if expected.names_pod_ip {
        "$(POD_IP)"
    } else {
        "-"
    };
    json!({
        "name": "app",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "args": [CREDENTIALS, expected.spiffe_id, ip],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    })
}

/// An init container that exits at once and a native sidecar that sleeps: the shape of a
/// flex or csi-socket pod, with nothing of ours in it.
/// The name of `none-same-shape`'s init container.
pub const SAME_SHAPE_INIT: &str = "init";

fn same_shape_init_containers() -> Value {
    let busybox = |name: &str, args: &[&str]| {
        json!({
            "name": name,
            "image": APP_IMAGE,
            "imagePullPolicy": "Never",
            "command": [BUSYBOX],
            "args": args,
        })
    };
    let mut sidecar = busybox("sidecar", &["sleep", "3600"]);
    sidecar["restartPolicy"] = "Always".into();
    json!([busybox(SAME_SHAPE_INIT, &["true"]), sidecar])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_name_and_only_credentialed_kinds_a_system() {
        let names: std::collections::BTreeSet<_> = Kind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), Kind::ALL.len());
        for kind in Kind::ALL {
            assert_eq!(
                kind.system().is_some(),
                kind.system_key().is_some(),
                "{kind:?}"
            );
        }
        assert_eq!(Kind::Spire.system(), Some(System::Spire));
        assert_eq!(
            Kind::Identity(VolumeMode::CsiFiles).system_key(),
            Some("athenz")
        );
    }

    #[test]
    fn our_probe_is_given_the_pods_identity_and_ip_and_the_baseline_nothing() {
        let ours = probe_container(Some(Expected {
            spiffe_id: scenario::spiffe_id("bench-csi-socket", "probe"),
            names_pod_ip: true,
        }));
        assert_eq!(
            ours["args"],
            json!([
                CREDENTIALS,
                "spiffe://bench.csi.socket/sa/probe",
                "$(POD_IP)"
            ])
        );
        let files = probe_container(Some(Expected {
            spiffe_id: scenario::spiffe_id("bench-csi-files", "probe"),
            names_pod_ip: false,
        }));
        assert_eq!(files["args"][2], "-", "files mode names no IP by default");
        assert_eq!(
            ours["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP"
        );
        assert!(probe_container(None).get("args").is_none());
    }
}
