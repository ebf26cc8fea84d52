//! A pod as the agent's watch of its node's pending pods delivers it: the fields an early
//! issuance needs (who the pod is, where it is bound, whether it is going, and whether it has a
//! files-mode `csi.athenz.io` volume), parsed without building the rest of the pod.

use athenz_core::pod_fields::MetaFields;
use athenz_core::volume_mode::{IP_SAN_KEY, MODE_KEY, VolumeMode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The CSI driver whose files-mode volumes the agent issues for.
const DRIVER: &str = athenz_csi_driver::DRIVER_NAME;

/// The service account a pod spec without one runs as.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The fields of a watched pod the early issuance reads.
#[derive(Clone, Debug, Default)]
pub struct BoundPod {
    /// Name, namespace, uid and resource version (what the watcher and the store key need).
    metadata: ObjectMeta,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.serviceAccountName` (`default` when the spec names none, as the API server
    /// defaults it).
    pub service_account: String,
    /// The pod has a `csi.athenz.io` volume in files mode, with only the attributes a publish
    /// accepts: the volume a publish will issue for.
    pub has_files_volume: bool,
}

impl BoundPod {
    /// `metadata.uid`.
    pub fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }

    /// `metadata.name`.
    pub fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }
}

#[derive(Deserialize)]
struct PodJson<'a> {
    #[serde(default, borrow)]
    metadata: MetaFields<'a>,
    #[serde(default)]
    spec: Option<SpecJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecJson {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    service_account_name: Option<String>,
    #[serde(default)]
    volumes: Option<Vec<VolumeJson>>,
}

#[derive(Deserialize)]
struct VolumeJson {
    #[serde(default)]
    csi: Option<CsiJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CsiJson {
    #[serde(default)]
    driver: Option<String>,
    #[serde(default)]
    volume_attributes: Option<BTreeMap<String, String>>,
}

impl CsiJson {
    /// A volume a files-mode publish would accept the attributes of.
    fn is_files_volume(&self) -> bool {
        if self.driver.as_deref() != Some(DRIVER) {
            return false;
        }
        let attributes = self.volume_attributes.as_ref();
        let attribute = |key: &str| attributes.and_then(|a| a.get(key)).map(String::as_str);
        let only_known = attributes.is_none_or(|a| {
            a.keys()
                .all(|k| k.as_str() == MODE_KEY || k.as_str() == IP_SAN_KEY)
        });
        only_known
            && VolumeMode::from_csi_attribute(attribute(MODE_KEY)).ok()
                == Some(VolumeMode::CsiFiles)
            && matches!(attribute(IP_SAN_KEY), None | Some("true" | "false"))
    }
}

impl<'de> Deserialize<'de> for BoundPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let PodJson { metadata, spec } = PodJson::deserialize(deserializer)?;
        let text = |field: Option<Cow<'_, str>>| field.map(Cow::into_owned);
        let spec = spec.unwrap_or(SpecJson {
            node_name: None,
            service_account_name: None,
            volumes: None,
        });
        let has_files_volume = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.csi.as_ref())
            .any(CsiJson::is_files_volume);
        Ok(Self {
            terminating: metadata.deletion_timestamp,
            metadata: ObjectMeta {
                namespace: text(metadata.namespace),
                name: text(metadata.name),
                uid: text(metadata.uid),
                resource_version: text(metadata.resource_version),
                ..ObjectMeta::default()
            },
            node_name: spec.node_name,
            service_account: spec
                .service_account_name
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.to_owned()),
            has_files_volume,
        })
    }
}

impl kube::Resource for BoundPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group((): &()) -> Cow<'_, str> {
        "".into()
    }
    fn version((): &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural((): &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_testbed::real_pods::{RealPod, real_pod};
    use serde_json::json;

    /// A real-size pod (containers, env, probes, managed fields) as the API sends it, with
    /// `volume` added to its volumes.
    fn pod_json(volume: serde_json::Value) -> serde_json::Value {
        let mut pod = real_pod(&RealPod {
            namespace: "payments",
            name: "web-0",
            service_account: "web",
            node: "node-a",
        })
        .expect("real pod");
        pod.metadata.uid = Some("uid-of-web-0".into());
        pod.metadata.resource_version = Some("4711".into());
        let mut pod = serde_json::to_value(&pod).expect("json");
        pod["spec"]["volumes"]
            .as_array_mut()
            .expect("a real pod has volumes")
            .push(volume);
        pod
    }

    fn parse(pod: &serde_json::Value) -> BoundPod {
        serde_json::from_value(pod.clone()).expect("a bound pod")
    }

    fn files_volume(attributes: serde_json::Value) -> serde_json::Value {
        json!({"name": "athenz-identity",
               "csi": {"driver": "csi.athenz.io", "readOnly": true, "volumeAttributes": attributes}})
    }

    #[test]
    fn a_real_pod_gives_its_identity_and_its_files_volume() {
        use kube::ResourceExt;
        let json = pod_json(files_volume(json!({"mode": "files"})));
        assert!(
            serde_json::to_vec(&json).expect("bytes").len() > 8 * 1024,
            "a real-size pod"
        );
        let pod = parse(&json);
        assert_eq!(pod.namespace(), Some("payments"));
        assert_eq!(pod.name(), Some("web-0"));
        assert_eq!(pod.uid(), Some("uid-of-web-0"));
        assert_eq!(pod.resource_version().as_deref(), Some("4711"));
        assert_eq!(pod.node_name.as_deref(), Some("node-a"));
        assert_eq!(pod.service_account, "web");
        assert!(!pod.terminating);
        assert!(pod.has_files_volume);
    }

    #[test]
    fn only_a_files_volume_a_publish_would_accept_counts() {
        for (attributes, files) in [
            (json!(null), true),
            (json!({}), true),
            (json!({"mode": "files", "ipSAN": "true"}), true),
            (json!({"ipSAN": "false"}), true),
            (json!({"mode": "socket"}), false),
            (json!({"mode": "both"}), false),
            (json!({"mode": "files", "ipSAN": "yes"}), false),
            (json!({"mode": "files", "extra": "x"}), false),
        ] {
            let pod = parse(&pod_json(files_volume(attributes.clone())));
            assert_eq!(pod.has_files_volume, files, "attributes {attributes}");
        }
        let other_driver = json!({"name": "x", "csi": {"driver": "csi.spiffe.io"}});
        assert!(!parse(&pod_json(other_driver)).has_files_volume);
        let flex = json!({"name": "x", "flexVolume": {"driver": "athenz/identity"}});
        assert!(!parse(&pod_json(flex)).has_files_volume);
    }

    #[test]
    fn a_terminating_pod_and_a_pod_without_spec_are_told_apart() {
        let mut json = pod_json(files_volume(json!({})));
        json["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z");
        assert!(parse(&json).terminating);
        let bare = parse(&json!({"metadata": {"name": "p", "namespace": "n", "uid": "u"}}));
        assert!(!bare.has_files_volume);
        assert_eq!(bare.node_name, None);
        assert_eq!(bare.service_account, "default");
        let empty_account = parse(&json!({"spec": {"serviceAccountName": ""}}));
        assert_eq!(empty_account.service_account, "default");
    }

    #[test]
    fn malformed_and_hostile_pods_are_errors_not_panics() {
        // serde reads a struct from a sequence too: an empty one is a pod that names nobody
        let nobody = parse(&json!([]));
        assert!(nobody.uid().is_none() && !nobody.has_files_volume);
        for bad in [
            json!(["metadata"]),
            json!("pod"),
            json!({"metadata": {"name": 7}}),
            json!({"spec": {"volumes": {"csi": {}}}}),
            json!({"spec": {"volumes": [{"csi": {"driver": 1}}]}}),
            json!({"spec": {"volumes": [{"csi": {"volumeAttributes": {"mode": ["files"]}}}]}}),
            json!({"spec": {"nodeName": {"a": "b"}}}),
        ] {
            assert!(
                serde_json::from_value::<BoundPod>(bad.clone()).is_err(),
                "{bad} parsed"
            );
        }
        // nesting deeper than serde_json's recursion limit is refused, not a stack overflow
        let deep = format!(
            "{{\"spec\":{{\"volumes\":[{{\"csi\":{}1{}}}]}}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(serde_json::from_str::<BoundPod>(&deep).is_err());
        // an oversized pod (thousands of volumes, long names) parses in bounded memory, and a
        // files volume among them is still found
        let mut many = pod_json(files_volume(json!({})));
        let volumes = many["spec"]["volumes"].as_array_mut().expect("volumes");
        for i in 0..5_000 {
            volumes.insert(
                0,
                json!({"name": format!("v{i}-{}", "x".repeat(200)), "emptyDir": {}}),
            );
        }
        assert!(parse(&many).has_files_volume);
    }
}
