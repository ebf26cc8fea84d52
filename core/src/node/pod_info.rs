//! The pod a volume is mounted for, as the kubelet names it: the flex driver gets it in its
//! mount options (`kubernetes.io/pod.namespace`, …) and the CSI driver in the volume context
//! (`csi.storage.k8s.io/pod.namespace`, …). The same rules apply to both
//! (docs/design.md §4.1, §4.10), so they live here once.

use crate::names::{self, NameError};
use thiserror::Error;

/// The keys one kubelet interface uses for the pod's fields.
#[derive(Debug, Clone, Copy)]
pub struct PodInfoKeys {
    /// Namespace key.
    pub namespace: &'static str,
    /// Pod name key.
    pub name: &'static str,
    /// Pod UID key.
    pub uid: &'static str,
    /// Service-account name key.
    pub service_account: &'static str,
}

/// The flex driver's option keys.
pub const FLEX_KEYS: PodInfoKeys = PodInfoKeys {
    namespace: "kubernetes.io/pod.namespace",
    name: "kubernetes.io/pod.name",
    uid: "kubernetes.io/pod.uid",
    service_account: "kubernetes.io/serviceAccount.name",
};

/// The CSI volume-context keys kubelet sends with `podInfoOnMount: true`.
pub const CSI_KEYS: PodInfoKeys = PodInfoKeys {
    namespace: "csi.storage.k8s.io/pod.namespace",
    name: "csi.storage.k8s.io/pod.name",
    uid: "csi.storage.k8s.io/pod.uid",
    service_account: "csi.storage.k8s.io/serviceAccount.name",
};

/// Why the pod's fields were refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PodInfoError {
    /// A required key is missing or empty.
    #[error("{0:?} is missing or empty")]
    Missing(&'static str),
    /// A name broke its Kubernetes rule.
    #[error(transparent)]
    Name(#[from] NameError),
}

impl PodInfoError {
    /// The key that was wrong.
    pub fn key(&self) -> &'static str {
        match self {
            Self::Missing(key) => key,
            Self::Name(e) => e.field,
        }
    }
}

/// The pod a volume is for, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace (DNS label, ≤ 63).
    pub namespace: String,
    /// Pod name (DNS subdomain, ≤ 253).
    pub pod_name: String,
    /// Pod UID (lowercase RFC 4122 UUID).
    pub pod_uid: String,
    /// Service account (DNS subdomain).
    pub service_account: String,
}

impl PodInfo {
    /// Reads and validates the four fields through `get` under `keys`; errors name the key.
    pub fn from_attributes<'a>(
        keys: &PodInfoKeys,
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Self, PodInfoError> {
        let required = |key: &'static str| {
            get(key)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .ok_or(PodInfoError::Missing(key))
        };
        let namespace = required(keys.namespace)?;
        names::validate_dns_label(keys.namespace, &namespace)?;
        let pod_name = required(keys.name)?;
        names::validate_dns_subdomain(keys.name, &pod_name)?;
        let pod_uid = required(keys.uid)?;
        names::validate_uid(keys.uid, &pod_uid)?;
        let service_account = required(keys.service_account)?;
        names::validate_dns_subdomain(keys.service_account, &service_account)?;
        Ok(Self {
            namespace,
            pod_name,
            pod_uid,
            service_account,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn csi_context() -> HashMap<&'static str, &'static str> {
        HashMap::from([
            ("csi.storage.k8s.io/pod.namespace", "media-sports"),
            ("csi.storage.k8s.io/pod.name", "web-7d9f"),
            (
                "csi.storage.k8s.io/pod.uid",
                "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            ),
            ("csi.storage.k8s.io/serviceAccount.name", "web"),
            ("csi.storage.k8s.io/ephemeral", "true"),
        ])
    }

    #[test]
    fn the_same_rules_under_either_interface_keys() {
        let ctx = csi_context();
        let pod = PodInfo::from_attributes(&CSI_KEYS, |k| ctx.get(k).copied()).unwrap();
        assert_eq!(pod.namespace, "media-sports");
        assert_eq!(pod.pod_uid, "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c");
        let flex: HashMap<String, &str> = ctx
            .iter()
            .map(|(k, v)| (k.replace("csi.storage.k8s.io/", "kubernetes.io/"), *v))
            .collect();
        let again = PodInfo::from_attributes(&FLEX_KEYS, |k| flex.get(k).copied()).unwrap();
        assert_eq!(again, pod);
    }

    #[test]
    fn hostile_values_are_refused_naming_the_key() {
        for (key, value, why) in [
            ("csi.storage.k8s.io/pod.namespace", "", "missing"),
            (
                "csi.storage.k8s.io/pod.namespace",
                "../etc",
                "pod.namespace",
            ),
            ("csi.storage.k8s.io/pod.namespace", "Media", "pod.namespace"),
            ("csi.storage.k8s.io/pod.name", "web/../x", "pod.name"),
            (
                "csi.storage.k8s.io/pod.uid",
                "0B6E4C1E-8F57-4D5E-9A51-1F0F3C1A2B3C",
                "pod.uid",
            ),
            ("csi.storage.k8s.io/pod.uid", "0b6e4c1e", "pod.uid"),
            (
                "csi.storage.k8s.io/serviceAccount.name",
                "a\nb",
                "serviceAccount.name",
            ),
        ] {
            let mut ctx = csi_context();
            ctx.insert(key, value);
            let err = PodInfo::from_attributes(&CSI_KEYS, |k| ctx.get(k).copied()).unwrap_err();
            assert_eq!(err.key(), key, "{value:?}");
            assert!(err.to_string().contains(why), "{err}");
        }
        let long = "a".repeat(300);
        let mut ctx = csi_context();
        ctx.insert("csi.storage.k8s.io/pod.name", &long);
        let err = PodInfo::from_attributes(&CSI_KEYS, |k| ctx.get(k).copied()).unwrap_err();
        assert!(err.to_string().contains("pod.name"), "{err}");
        let mut ctx = csi_context();
        ctx.remove("csi.storage.k8s.io/pod.uid");
        let err = PodInfo::from_attributes(&CSI_KEYS, |k| ctx.get(k).copied()).unwrap_err();
        assert_eq!(err, PodInfoError::Missing("csi.storage.k8s.io/pod.uid"));
    }
}
