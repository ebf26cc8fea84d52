//! The stand-in's pods, each with a revision.

use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// The pods, each with a revision that changes whenever it may have changed (any write or
/// mutable access), so readers that cache a pod's encoding compare one number instead of the
/// whole pod (the kubelet stand-in did that for every pod of every list: most of its CPU with
/// real-size pods).
#[derive(Default)]
pub(super) struct PodStore {
    pub(super) pods: BTreeMap<(String, String), (Pod, u64)>,
    last_revision: u64,
}

impl PodStore {
    fn next_revision(&mut self) -> u64 {
        self.last_revision += 1;
        self.last_revision
    }

    pub(super) fn insert(&mut self, key: (String, String), pod: Pod) {
        let revision = self.next_revision();
        self.pods.insert(key, (pod, revision));
    }

    pub(super) fn get(&self, key: &(String, String)) -> Option<&Pod> {
        self.pods.get(key).map(|(pod, _)| pod)
    }

    /// The pod to change: counted as changed.
    pub(super) fn get_mut(&mut self, key: &(String, String)) -> Option<&mut Pod> {
        let revision = self.next_revision();
        self.pods.get_mut(key).map(|(pod, seen)| {
            *seen = revision;
            pod
        })
    }

    pub(super) fn remove(&mut self, key: &(String, String)) -> Option<Pod> {
        self.pods.remove(key).map(|(pod, _)| pod)
    }

    pub(super) fn contains_key(&self, key: &(String, String)) -> bool {
        self.pods.contains_key(key)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values().map(|(pod, _)| pod)
    }
}
