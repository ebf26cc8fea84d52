//! The checks of a node agent's registration or refresh (docs/design.md §4.9), one named function
//! each, like the pod checks: the attestation is the agent pod's projected service-account token;
//! the API server reviews it; the pod it is bound to must be the agent's, on the node the
//! certificate will name. So a node's agent can only ever be that node — and the JWTs it asks
//! for then carry that node, which the pod checks hold against the pod's `spec.nodeName`.

use crate::decision::{Deny, NodePolicy, Policy, deny, split};
use crate::pods::PodFacts;
use athenz_core::names::CsrIdentity;
use athenz_core::zts::{InstanceConfirmation, attr};
use k8s_openapi::api::authentication::v1::{TokenReview, UserInfo};
use k8s_openapi::api::core::v1::Node;

/// `status.user.extra` keys a real API server sets for a token bound to a pod.
pub mod extra {
    /// The pod's name.
    pub const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
    /// The pod's UID.
    pub const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
    /// The node's name (with `ServiceAccountTokenPodNodeInfo`, beta 1.30, GA 1.32).
    pub const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
    /// The node's UID (same gate).
    pub const NODE_UID: &str = "authentication.kubernetes.io/node-uid";
    /// `JTI=<uuid>` of the token.
    pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
}

/// Longest token accepted (a projected token is about 1 KiB; a review of a megabyte of garbage
/// would only load the API server).
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// What the review says of the pod the token is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaims {
    /// `pod-name`.
    pub pod_name: String,
    /// `pod-uid`.
    pub pod_uid: String,
    /// `node-name`, when the API server adds node info.
    pub node_name: Option<String>,
    /// `node-uid`, likewise.
    pub node_uid: Option<String>,
}

/// The attestation looks like a JWT (three base64url parts) of a sane size; anything else is not
/// sent to the API server.
pub fn check_token_shape(token: &str) -> Result<(), Deny> {
    let parts: Vec<&str> = token.split('.').collect();
    let base64url = |p: &&str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if token.len() > MAX_TOKEN_LEN {
        return Err(deny(
            "node_token",
            format!("the token is {} bytes, over {MAX_TOKEN_LEN}", token.len()),
        ));
    }
    if parts.len() != 3 || !parts.iter().all(base64url) {
        return Err(deny(
            "node_token",
            "the attestation data is not a service-account token (JWT)",
        ));
    }
    Ok(())
}

/// The API server authenticated the token for our audience; returns the user it names.
pub fn check_token_review(policy: &NodePolicy, review: &TokenReview) -> Result<UserInfo, Deny> {
    let status = review
        .status
        .as_ref()
        .ok_or_else(|| deny("node_token", "the token review has no status"))?;
    if status.authenticated != Some(true) {
        return Err(deny(
            "node_token",
            format!(
                "the API server did not authenticate the token: {}",
                status.error.as_deref().unwrap_or("no reason given")
            ),
        ));
    }
    // An API server that ignores spec.audiences answers with its own; require ours.
    if !status
        .audiences
        .iter()
        .flatten()
        .any(|a| *a == policy.audience)
    {
        return Err(deny(
            "node_token",
            format!("the token is not for audience {:?}", policy.audience),
        ));
    }
    status
        .user
        .clone()
        .ok_or_else(|| deny("node_token", "the token review names no user"))
}

/// The token is the agents' service account's.
pub fn check_account(policy: &NodePolicy, user: &UserInfo) -> Result<(), Deny> {
    let want = policy.username();
    match user.username.as_deref() {
        Some(name) if name == want => Ok(()),
        other => Err(deny(
            "node_account",
            format!("the token is {other:?}'s, not {want:?}'s"),
        )),
    }
}

fn single_extra(user: &UserInfo, key: &str) -> Result<Option<String>, Deny> {
    match user.extra.as_ref().and_then(|e| e.get(key)) {
        None => Ok(None),
        Some(values) if values.len() == 1 && !values[0].is_empty() => Ok(Some(values[0].clone())),
        Some(_) => Err(deny(
            "node_pod_claims",
            format!("the token review's {key} is not one value"),
        )),
    }
}

/// The token is bound to a pod (a projected token, not a legacy Secret token): the review
/// names its pod, and the node where the API server adds that.
pub fn check_pod_claims(user: &UserInfo) -> Result<PodClaims, Deny> {
    let required = |key: &str| {
        single_extra(user, key)?.ok_or_else(|| {
            deny(
                "node_pod_claims",
                format!("the token is bound to no pod (the review has no {key}): use a projected service-account token"),
            )
        })
    };
    Ok(PodClaims {
        pod_name: required(extra::POD_NAME)?,
        pod_uid: required(extra::POD_UID)?,
        node_name: single_extra(user, extra::NODE_NAME)?,
        node_uid: single_extra(user, extra::NODE_UID)?,
    })
}

/// The pod the token is bound to exists with that uid, is not terminating, runs as the agents'
/// account and is scheduled; returns its node (`spec.nodeName`, the authority).
pub fn check_agent_pod(
    policy: &NodePolicy,
    claims: &PodClaims,
    pod: Option<&PodFacts>,
) -> Result<String, Deny> {
    let name = format!("{}/{}", policy.namespace, claims.pod_name);
    let pod =
        pod.ok_or_else(|| deny("node_pod", format!("the agent pod {name} does not exist")))?;
    if pod.metadata.uid.as_deref() != Some(claims.pod_uid.as_str()) {
        return Err(deny(
            "node_pod",
            format!(
                "the agent pod {name} has uid {:?}, not the token's {}",
                pod.metadata.uid, claims.pod_uid
            ),
        ));
    }
    if pod.metadata.deletion_timestamp {
        return Err(deny(
            "node_pod",
            format!("the agent pod {name} is being deleted"),
        ));
    }
    let account = pod.service_account();
    if account != policy.service_account {
        return Err(deny(
            "node_pod",
            format!(
                "the pod {name} runs as {account:?}, not {:?}",
                policy.service_account
            ),
        ));
    }
    pod.node_name()
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| deny("node_pod", format!("the agent pod {name} is on no node")))
}

/// `attributes.instanceId` is the node the agent pod runs on.
pub fn check_instance_id(node: &str, c: &InstanceConfirmation) -> Result<(), Deny> {
    match c.attributes.get(attr::INSTANCE_ID) {
        Some(id) if id == node => Ok(()),
        other => Err(deny(
            "node_instance_id",
            format!("instanceId {other:?} is not the agent pod's node {node:?}"),
        )),
    }
}

/// The token's own node (where the API server names it) agrees with the pod's.
pub fn check_node_name(claims: &PodClaims, node: &str) -> Result<(), Deny> {
    match &claims.node_name {
        Some(named) if named != node => Err(deny(
            "node_name",
            format!("the token was issued on node {named:?}, the agent pod is on {node:?}"),
        )),
        _ => Ok(()),
    }
}

/// The node the token names by uid is the node of that name (not a deleted and re-created one).
pub fn check_node_uid(node: &str, uid: &str, found: Option<&Node>) -> Result<(), Deny> {
    let found = found.ok_or_else(|| deny("node_uid", format!("node {node:?} does not exist")))?;
    if found.metadata.uid.as_deref() == Some(uid) {
        Ok(())
    } else {
        Err(deny(
            "node_uid",
            format!(
                "node {node:?} has uid {:?}, the token names {uid}",
                found.metadata.uid
            ),
        ))
    }
}

/// The requested SANs are exactly the node identity's (no IP, no other name).
pub fn check_sans(policy: &Policy, node: &str, c: &InstanceConfirmation) -> Result<(), Deny> {
    let entitled = CsrIdentity::for_node(
        &policy.node.principal,
        &policy.provider,
        &policy.dns_suffix,
        node,
    )
    .map_err(|e| deny("node_sans", format!("cannot compute the node's names: {e}")))?;
    let asked = |key: &str| {
        let mut v: Vec<&str> = split(c.attributes.get(key)).collect();
        v.sort_unstable();
        v
    };
    fn sorted(v: &[String]) -> Vec<&str> {
        let mut v: Vec<&str> = v.iter().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
    for (key, want) in [
        (attr::SAN_DNS, sorted(&entitled.dns_names)),
        (attr::SAN_URI, sorted(&entitled.uris)),
        (attr::SAN_IP, Vec::new()),
    ] {
        let got = asked(key);
        if got != want {
            return Err(deny(
                "node_sans",
                format!("{key} {got:?} is not the node identity's {want:?}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::authentication::v1::TokenReviewStatus;
    use std::collections::BTreeMap;

    fn policy() -> NodePolicy {
        NodePolicy {
            principal: "k8s.admin.athenz-agent".into(),
            audience: "athenz-node".into(),
            namespace: "athenz-system".into(),
            service_account: "athenz-agent".into(),
        }
    }

    #[test]
    fn the_agent_principal_is_recognised_exactly() {
        let p = policy();
        assert!(p.is_agent("k8s.admin", "athenz-agent"));
        assert!(!p.is_agent("k8s", "admin.athenz-agent"));
        assert!(!p.is_agent("k8s.admin", "athenz-agent2"));
        assert!(!p.is_agent("k8s.adminx", "athenz-agent"));
    }

    #[test]
    fn token_shape_is_checked_before_the_api_server_is_asked() {
        assert!(check_token_shape("aGVhZA.Ym9keQ.c2ln").is_ok());
        for bad in [
            "",
            "a.b",
            "a.b.c.d",
            "a..c",
            "a.b.c d",
            "a.b.c=",
            &format!("{}.b.c", "a".repeat(MAX_TOKEN_LEN)),
        ] {
            assert_eq!(
                check_token_shape(bad).unwrap_err().check,
                "node_token",
                "{bad:?}"
            );
        }
    }

    fn review(authenticated: bool, audiences: &[&str], extra: &[(&str, &str)]) -> TokenReview {
        TokenReview {
            status: Some(TokenReviewStatus {
                authenticated: Some(authenticated),
                audiences: Some(audiences.iter().map(|a| (*a).to_owned()).collect()),
                error: (!authenticated).then(|| "token has expired".to_owned()),
                user: authenticated.then(|| UserInfo {
                    username: Some("system:serviceaccount:athenz-system:athenz-agent".into()),
                    extra: Some(
                        extra
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
                            .collect::<BTreeMap<_, _>>(),
                    ),
                    ..UserInfo::default()
                }),
            }),
            ..TokenReview::default()
        }
    }

    #[test]
    fn reviews_that_do_not_vouch_are_denied_with_their_reason() {
        let p = policy();
        let d = check_token_review(&p, &review(false, &[], &[])).unwrap_err();
        assert!(d.message.contains("token has expired"), "{d}");
        let d = check_token_review(&p, &review(true, &["kubernetes"], &[])).unwrap_err();
        assert!(d.message.contains("athenz-node"), "{d}");
        assert!(check_token_review(&p, &TokenReview::default()).is_err());
        let user = check_token_review(&p, &review(true, &["athenz-node"], &[])).unwrap();
        check_account(&p, &user).unwrap();
        let other = UserInfo {
            username: Some("system:serviceaccount:default:default".into()),
            ..UserInfo::default()
        };
        assert_eq!(check_account(&p, &other).unwrap_err().check, "node_account");
    }

    #[test]
    fn the_token_must_be_bound_to_a_pod() {
        let user = |extra: &[(&str, &str)]| {
            check_token_review(&policy(), &review(true, &["athenz-node"], extra)).unwrap()
        };
        let d = check_pod_claims(&user(&[])).unwrap_err();
        assert_eq!(d.check, "node_pod_claims");
        assert!(d.message.contains("projected"), "{d}");
        let claims = check_pod_claims(&user(&[
            (extra::POD_NAME, "athenz-agent-x"),
            (extra::POD_UID, "u1"),
            (extra::NODE_NAME, "node-1"),
        ]))
        .unwrap();
        assert_eq!(claims.node_name.as_deref(), Some("node-1"));
        assert_eq!(claims.node_uid, None);
        let mut two = user(&[(extra::POD_NAME, "a"), (extra::POD_UID, "u")]);
        two.extra
            .as_mut()
            .unwrap()
            .insert(extra::POD_NAME.into(), vec!["a".into(), "b".into()]);
        assert!(check_pod_claims(&two).is_err());
    }
}
