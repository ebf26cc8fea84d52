//! The few fields of a Kubernetes pod this system reads, parsed from the JSON the API server
//! (`GET .../pods/{name}`) or the kubelet (`GET /pods`) returns, without building the rest.
//!
//! A real pod's JSON is 8–15 KB (containers, env, probes, volumes, full status, managed fields);
//! a node lists 110 of them in 1–2 MB. The agent reads a few fields of every listed pod and the
//! callback a few of one, for every identity. These types keep the API's field names and
//! nesting (a check reads `pod.spec.node_name` as it would on k8s-openapi's `Pod`), borrow the
//! strings from the body where no JSON escape forces a copy, and let serde skip every other
//! field unread.

use serde::Deserialize;
use serde::de::IgnoredAny;
use std::borrow::Cow;

/// A pod: `metadata`, `spec`, `status`, each with only the fields below.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PodFields<'a> {
    /// `metadata`.
    #[serde(default, borrow)]
    pub metadata: MetaFields<'a>,
    /// `spec`.
    #[serde(default, borrow)]
    pub spec: Option<SpecFields<'a>>,
    /// `status`.
    #[serde(default, borrow)]
    pub status: Option<StatusFields<'a>>,
}

/// `metadata` of [`PodFields`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaFields<'a> {
    /// `metadata.namespace`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub namespace: Option<Cow<'a, str>>,
    /// `metadata.name`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub name: Option<Cow<'a, str>>,
    /// `metadata.uid`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub uid: Option<Cow<'a, str>>,
    /// Whether `metadata.deletionTimestamp` is set (its value does not matter).
    #[serde(default, deserialize_with = "present")]
    pub deletion_timestamp: bool,
    /// `metadata.resourceVersion`: where a watch resumes (the callback's pod cache); no check
    /// reads it.
    #[serde(default, borrow, deserialize_with = "text")]
    pub resource_version: Option<Cow<'a, str>>,
}

/// `spec` of [`PodFields`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecFields<'a> {
    /// `spec.nodeName`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub node_name: Option<Cow<'a, str>>,
    /// `spec.serviceAccountName`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub service_account_name: Option<Cow<'a, str>>,
}

/// `status` of [`PodFields`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct StatusFields<'a> {
    /// `status.phase`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub phase: Option<Cow<'a, str>>,
    /// `status.podIP`.
    #[serde(default, rename = "podIP", borrow, deserialize_with = "text")]
    pub pod_ip: Option<Cow<'a, str>>,
    /// `status.podIPs`.
    #[serde(default, rename = "podIPs", borrow)]
    pub pod_ips: Option<Vec<PodIpFields<'a>>>,
    /// `status.conditions`.
    #[serde(default, borrow)]
    pub conditions: Option<Vec<ConditionFields<'a>>>,
}

/// One entry of `status.conditions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionFields<'a> {
    /// `type`, e.g. `PodReadyToStartContainers`.
    #[serde(default, rename = "type", borrow, deserialize_with = "text")]
    pub kind: Option<Cow<'a, str>>,
    /// `status`: `True`, `False` or `Unknown`.
    #[serde(default, borrow, deserialize_with = "text")]
    pub status: Option<Cow<'a, str>>,
    /// `lastTransitionTime`, RFC 3339.
    #[serde(default, borrow, deserialize_with = "text")]
    pub last_transition_time: Option<Cow<'a, str>>,
}

/// One entry of `status.podIPs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PodIpFields<'a> {
    /// `ip`.
    #[serde(default, borrow)]
    pub ip: Cow<'a, str>,
}

/// A `PodList`'s `items`, each as [`PodFields`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PodListFields<'a> {
    /// `items`.
    #[serde(borrow)]
    pub items: Vec<PodFields<'a>>,
}

/// An optional string, borrowed from the body unless it holds an escape. (serde borrows a
/// `Cow<str>` field itself, but an `Option<Cow<str>>` it always copies.)
fn text<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Text<'a>>::deserialize(d)?.map(|t| t.0))
}

/// A field that is present and not `null`, whatever its value.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<IgnoredAny>::deserialize(d)?.is_some())
}

fn owned(s: Option<Cow<'_, str>>) -> Option<Cow<'static, str>> {
    s.map(|s| Cow::Owned(s.into_owned()))
}

impl PodFields<'_> {
    /// The same fields, no longer borrowing from the body they were parsed from.
    pub fn into_owned(self) -> PodFields<'static> {
        PodFields {
            metadata: MetaFields {
                namespace: owned(self.metadata.namespace),
                name: owned(self.metadata.name),
                uid: owned(self.metadata.uid),
                deletion_timestamp: self.metadata.deletion_timestamp,
                resource_version: owned(self.metadata.resource_version),
            },
            spec: self.spec.map(|s| SpecFields {
                node_name: owned(s.node_name),
                service_account_name: owned(s.service_account_name),
            }),
            status: self.status.map(|s| StatusFields {
                phase: owned(s.phase),
                pod_ip: owned(s.pod_ip),
                pod_ips: s.pod_ips.map(|ips| {
                    ips.into_iter()
                        .map(|p| PodIpFields {
                            ip: Cow::Owned(p.ip.into_owned()),
                        })
                        .collect()
                }),
                conditions: s.conditions.map(|conditions| {
                    conditions
                        .into_iter()
                        .map(|c| ConditionFields {
                            kind: owned(c.kind),
                            status: owned(c.status),
                            last_transition_time: owned(c.last_transition_time),
                        })
                        .collect()
                }),
            }),
        }
    }

    /// `spec.serviceAccountName`, or `default` when absent (as the API server sets it).
    pub fn service_account(&self) -> &str {
        self.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .unwrap_or("default")
    }

    /// The condition of type `kind` in `status.conditions`, if the status has it.
    pub fn condition(&self, kind: &str) -> Option<&ConditionFields<'_>> {
        self.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.kind.as_deref() == Some(kind))
    }

    /// `spec.nodeName`, if the pod is scheduled.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_borrowed_unless_escaped_and_the_rest_is_skipped() {
        let json = br#"{"metadata":{"namespace":"payments","name":"web\u002d0","uid":"u1",
            "managedFields":[{"fieldsV1":{"f:spec":{}}}],"deletionTimestamp":"2026-01-01T00:00:00Z"},
            "spec":{"nodeName":"node-a","containers":[{"name":"app"}]},
            "status":{"phase":"Running","podIP":"10.1.2.3","podIPs":[{"ip":"10.1.2.3"},{"ip":"fd00::3"}]}}"#;
        let pod: PodFields<'_> = serde_json::from_slice(json).unwrap();
        assert!(matches!(
            pod.metadata.namespace,
            Some(Cow::Borrowed("payments"))
        ));
        assert!(matches!(&pod.metadata.name, Some(Cow::Owned(n)) if n == "web-0"));
        assert!(pod.metadata.deletion_timestamp);
        assert_eq!(pod.service_account(), "default");
        assert_eq!(pod.node_name(), Some("node-a"));
        let owned = pod.clone().into_owned();
        assert_eq!(owned, pod);
        let ips: Vec<&str> = owned
            .status
            .as_ref()
            .unwrap()
            .pod_ips
            .iter()
            .flatten()
            .map(|p| &*p.ip)
            .collect();
        assert_eq!(ips, ["10.1.2.3", "fd00::3"]);
    }

    #[test]
    fn a_list_is_its_items() {
        let list: PodListFields<'_> = serde_json::from_slice(
            br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"a"}},{}]}"#,
        )
        .unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[0].metadata.name.as_deref(), Some("a"));
        assert_eq!(list.items[1], PodFields::default());
        assert!(serde_json::from_slice::<PodListFields<'_>>(br#"{"items":{}}"#).is_err());
    }
}
