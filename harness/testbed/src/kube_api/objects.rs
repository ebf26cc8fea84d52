//! The objects tests put into the stand-in, built as the API server and the kubelet write them:
//! running pods, a node's agent pod, ClusterIP Services, and the marks of deletion and of a
//! pod's sandbox.

use super::tokens;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// A running pod, as the API server reports it.
pub fn running_pod(
    namespace: &str,
    name: &str,
    uid: &str,
    service_account: &str,
    ip: &str,
    node: &str,
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            creation_timestamp: Some(Time(now_timestamp())),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some(service_account.to_owned()),
            node_name: Some(node.to_owned()),
            containers: Vec::new(),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            pod_ip: (!ip.is_empty()).then(|| ip.to_owned()),
            pod_ips: (!ip.is_empty())
                .then(|| vec![k8s_openapi::api::core::v1::PodIP { ip: ip.to_owned() }]),
            ..PodStatus::default()
        }),
    }
}

/// A node's agent pod, as its DaemonSet makes it: `athenz-system/athenz-agent-<node>`, running as
/// the agents' service account on `node` (a new uid each call).
pub fn node_agent_pod(node: &str) -> Pod {
    use crate::fixtures::{AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT};
    running_pod(
        AGENT_NAMESPACE,
        &format!("athenz-agent-{node}"),
        &tokens::uuid_v4(),
        AGENT_SERVICE_ACCOUNT,
        "",
        node,
    )
}

/// A ClusterIP service.
pub fn cluster_ip_service(namespace: &str, name: &str, cluster_ip: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(cluster_ip.to_owned()),
            cluster_ips: Some(vec![cluster_ip.to_owned()]),
            type_: Some("ClusterIP".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Marks a pod as being deleted, as the API server does when deletion starts.
pub fn mark_terminating(pod: &mut Pod) {
    pod.metadata.deletion_timestamp = Some(Time(now_timestamp()));
}

/// Reports the pod's sandbox as the kubelet does once it has made it: `ip`, and the
/// `PodReadyToStartContainers` condition true since `since` (Unix seconds; `None`: now).
pub fn report_sandbox(pod: &mut Pod, ip: &str, since: Option<i64>) {
    let at = since
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or_else(now_timestamp);
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.pod_ip = Some(ip.to_owned());
    status.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
        ip: ip.to_owned(),
    }]);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != "PodReadyToStartContainers");
    conditions.push(k8s_openapi::api::core::v1::PodCondition {
        type_: "PodReadyToStartContainers".into(),
        status: "True".into(),
        last_transition_time: Some(Time(at)),
        ..Default::default()
    });
}

pub(super) fn now_timestamp() -> k8s_openapi::jiff::Timestamp {
    let secs = time::OffsetDateTime::now_utc().unix_timestamp();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}
