//! The whole end-to-end on the real node, in order (`cluster demo`, the real-cluster tests):
//! flex allowed in the template as an operator allows it, every workload of [`WORKLOADS`]
//! deployed and each pod's identity checked, then the pod asking for every SIA feature.

use super::features::Features;
use super::scenario::{PodIdentity, Scenario, WORKLOADS};
use anyhow::bail;
use athenz_core::volume_mode::VolumeMode;
use serde::Serialize;
use std::time::{Duration, Instant};

/// What [`Scenario::run_all`] found.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Every pod's identity, the features pod's last.
    pub identities: Vec<PodIdentity>,
    /// What the features pod showed.
    pub features: Features,
    /// How long the template change allowing flex took to reach the initializer.
    #[serde(serialize_with = "seconds")]
    pub template_change: Duration,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Scenario {
    /// Deploys every workload of [`WORKLOADS`] and checks each pod's identity.
    /// Flex is a volume the operator chooses: the template is changed to allow it first (see
    /// [`Scenario::allow_volume`]). Then the pod asking for every SIA feature
    /// ([`Scenario::check_features`]).
    pub fn run_all(&self) -> anyhow::Result<Outcome> {
        let mut identities = Vec::new();
        let flex_ns = WORKLOADS
            .iter()
            .find(|w| w.mode == VolumeMode::Flex)
            .map_or("media-sports", |w| w.namespace);
        self.ensure_namespace(flex_ns, true)?;
        let template_change = self.allow_volume(VolumeMode::Flex, flex_ns)?;
        for workload in &WORKLOADS {
            let started = Instant::now();
            let pods = self.deploy(workload)?;
            if pods.is_empty() {
                bail!(
                    "{} {}: no pods",
                    workload.namespace,
                    workload.service_account
                );
            }
            for pod in pods {
                identities.push(self.check_identity(workload.namespace, &pod, workload.mode)?);
            }
            tracing::debug!(elapsed = ?started.elapsed(), "workload checked");
        }
        let features = self.check_features()?;
        identities.push(features.identity.clone());
        Ok(Outcome {
            identities,
            features,
            template_change,
        })
    }
}
