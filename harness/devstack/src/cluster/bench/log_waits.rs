//! What the node's own logs say about a run's pods, by kind and phase: how long each identity
//! volume took to set up and how many of the kubelet's volume checks a pod waited
//! ([`volume_wait`]), and where a pod with an init container spent the time between its init
//! container's start and its app's ([`init_wait`]). Read at the end of `cluster bench`, and by
//! `cluster log-waits` from the state dir of a run that has ended.

use super::kinds::{self, Kind};
use super::{Phase, init_wait, volume_wait};
use crate::cluster::components::{CONTAINERD, KUBELET};
use anyhow::Context;
use athenz_initializer::mutate::INIT_CONTAINER;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The figures, by kind name, then phase name.
#[derive(Debug, Clone, Serialize)]
pub struct LogWaits {
    /// Identity volumes' set-up and the kubelet's volume checks.
    pub volume_waits: BTreeMap<String, BTreeMap<String, volume_wait::VolumeWaits>>,
    /// Init containers' own run, the kubelet's lag in noticing their exit, the app's start.
    pub init_waits: BTreeMap<String, BTreeMap<String, init_wait::InitWaits>>,
}

impl LogWaits {
    /// Reads the kubelet's and containerd's logs in `logs` for each kind's namespace.
    pub fn read(logs: &Path, namespaces: &[(Kind, String)]) -> anyhow::Result<Self> {
        let read = |component: &str| {
            let path = logs.join(format!("{component}.log"));
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
        };
        let (kubelet_log, containerd_log) = (read(KUBELET)?, read(CONTAINERD)?);
        let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
        let init_names = [kinds::SAME_SHAPE_INIT, INIT_CONTAINER];
        let mut volume_waits = BTreeMap::new();
        let mut init_waits = BTreeMap::new();
        for (kind, namespace) in namespaces {
            let volumes = volume_wait::by_phase(&kubelet_log, namespace, &phases);
            if !volumes.is_empty() {
                volume_waits.insert(kind.name().to_owned(), volumes);
            }
            let inits: BTreeMap<String, init_wait::InitWaits> = phases
                .iter()
                .filter_map(|phase| {
                    init_wait::by_namespace(
                        &containerd_log,
                        &kubelet_log,
                        &[namespace],
                        phase,
                        &init_names,
                    )
                    .remove(namespace)
                    .map(|waits| ((*phase).to_owned(), waits))
                })
                .collect();
            if !inits.is_empty() {
                init_waits.insert(kind.name().to_owned(), inits);
            }
        }
        Ok(Self {
            volume_waits,
            init_waits,
        })
    }

    /// The figures of every kind's namespace (`bench-<kind>`) in the logs of the run whose state
    /// dir is `state_dir`.
    pub fn of_run(state_dir: &Path) -> anyhow::Result<Self> {
        let layout = crate::cluster::Layout::existing(state_dir)?;
        let namespaces: Vec<(Kind, String)> = Kind::ALL
            .into_iter()
            .map(|kind| (kind, format!("bench-{}", kind.name())))
            .collect();
        Self::read(&layout.logs, &namespaces)
    }
}
