//! `authorization.k8s.io/v1` SubjectAccessReview in, its status out (docs/design.md §6): the one
//! rule the node authorizer enforces, and nothing else. The review is read leniently where the
//! API server may grow it (unknown fields are ignored) and strictly where the rule looks (a field
//! of the wrong type refuses the whole review: the API server then applies the webhook's
//! `failurePolicy`, Deny).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The user extra a pod-bound service-account token carries: the node its pod is bound to
/// (ServiceAccountTokenPodNodeInfo, GA since Kubernetes 1.32).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The field the agents' watch selects its node's pods by.
pub const NODE_FIELD: &str = "spec.nodeName";
/// Deepest JSON nesting read: a review nests six levels (review, spec, resourceAttributes,
/// fieldSelector, requirements, one requirement, its values); anything far deeper is hostile.
pub const MAX_DEPTH: usize = 16;
/// Most field-selector requirements looked at; a real selector has a handful.
pub const MAX_REQUIREMENTS: usize = 64;

/// An incoming review (only what the rule reads).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    api_version: String,
    kind: String,
    spec: Option<Spec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    extra: Option<BTreeMap<String, Option<Vec<String>>>>,
    #[serde(default)]
    resource_attributes: Option<ResourceAttributes>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceAttributes {
    #[serde(default)]
    verb: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default)]
    field_selector: Option<FieldSelector>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FieldSelector {
    #[serde(default)]
    requirements: Option<Vec<Requirement>>,
}

/// One requirement, as the API server sends it: `=` and `==` arrive as `In` with one value,
/// `!=` as `NotIn`.
#[derive(Debug, Default, Deserialize)]
struct Requirement {
    #[serde(default)]
    key: String,
    #[serde(default)]
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

/// The answer's status.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Status {
    /// Always false: this authorizer never allows, it only denies or has no opinion.
    pub allowed: bool,
    /// True: the request is refused without asking any later authorizer.
    pub denied: bool,
    /// Why (denials only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The outgoing review.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    /// `authorization.k8s.io/v1`.
    pub api_version: &'static str,
    /// `SubjectAccessReview`.
    pub kind: &'static str,
    /// The decision.
    pub status: Status,
}

/// What the authorizer decided (the metric label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not a pod list or watch by the agents' account: no opinion.
    NotGoverned,
    /// The agents' account listing or watching its own node's pods: no opinion (RBAC decides).
    OwnNode,
    /// The agents' account reaching beyond its node: denied, with the reason.
    Denied(String),
}

impl Decision {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotGoverned => "not_governed",
            Self::OwnNode => "own_node",
            Self::Denied(_) => "denied",
        }
    }

    /// The review that answers it.
    pub fn answer(&self) -> ReviewOut {
        let (denied, reason) = match self {
            Self::Denied(reason) => (true, reason.clone()),
            Self::NotGoverned | Self::OwnNode => (false, String::new()),
        };
        ReviewOut {
            api_version: "authorization.k8s.io/v1",
            kind: "SubjectAccessReview",
            status: Status {
                allowed: false,
                denied,
                reason,
            },
        }
    }
}

/// Why a review could not be read (HTTP 400; the API server then applies its failure policy).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReview {
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("the review nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// Not JSON of the review's shape.
    #[error("not a SubjectAccessReview: {0}")]
    Shape(String),
    /// Another API version or kind.
    #[error("expected authorization.k8s.io/v1 SubjectAccessReview, got {0} {1}")]
    Kind(String, String),
    /// No spec.
    #[error("the review has no spec")]
    NoSpec,
}

/// Decides `body` for the agents' account `agent_user` (`system:serviceaccount:<ns>:<name>`).
pub fn decide(agent_user: &str, body: &[u8]) -> Result<Decision, BadReview> {
    if !depth_within(body, MAX_DEPTH) {
        return Err(BadReview::TooDeep);
    }
    let review: ReviewIn =
        serde_json::from_slice(body).map_err(|e| BadReview::Shape(e.to_string()))?;
    if review.api_version != "authorization.k8s.io/v1" || review.kind != "SubjectAccessReview" {
        return Err(BadReview::Kind(review.api_version, review.kind));
    }
    let spec = review.spec.ok_or(BadReview::NoSpec)?;
    Ok(decide_spec(agent_user, spec))
}

fn decide_spec(agent_user: &str, spec: Spec) -> Decision {
    if spec.user.as_deref() != Some(agent_user) {
        return Decision::NotGoverned;
    }
    let Some(attributes) = spec.resource_attributes else {
        return Decision::NotGoverned;
    };
    let is = |field: &Option<String>, value: &str| field.as_deref().unwrap_or_default() == value;
    let verb = attributes.verb.as_deref().unwrap_or_default();
    if !(is(&attributes.group, "")
        && is(&attributes.resource, "pods")
        && is(&attributes.subresource, "")
        && matches!(verb, "list" | "watch"))
    {
        return Decision::NotGoverned;
    }
    let what = format!("{agent_user} may {verb} pods only with the field selector {NODE_FIELD}=");
    let nodes = spec
        .extra
        .unwrap_or_default()
        .remove(NODE_NAME_EXTRA)
        .flatten()
        .unwrap_or_default();
    let node = match nodes.as_slice() {
        [node] if !node.is_empty() => node.as_str(),
        _ => {
            return Decision::Denied(format!(
                "{what}<its node>, and its credential names no node (a token bound to a pod \
                 carries {NODE_NAME_EXTRA})"
            ));
        }
    };
    let requirements = attributes
        .field_selector
        .and_then(|s| s.requirements)
        .unwrap_or_default();
    if requirements.iter().take(MAX_REQUIREMENTS).any(|r| {
        r.key == NODE_FIELD
            && matches!(r.operator.as_str(), "In" | "=" | "==")
            && r.values.as_deref() == Some(&[node.to_owned()][..])
    }) {
        return Decision::OwnNode;
    }
    let found: Vec<String> = requirements
        .iter()
        .filter(|r| r.key == NODE_FIELD)
        .take(4)
        .map(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            match values.len() {
                0..=2 => format!("{} {} {values:?}", r.key, r.operator),
                n => format!("{} {} ({n} values)", r.key, r.operator),
            }
        })
        .collect();
    let got = match (requirements.is_empty(), found.is_empty()) {
        (true, _) => "no field selector".to_owned(),
        (false, true) => format!("no {NODE_FIELD} requirement"),
        (false, false) => found.join(", "),
    };
    Decision::Denied(format!("{what}{node} (its node); got {got}"))
}

/// Whether the JSON text `body` nests objects and arrays at most `max` deep (strings skipped,
/// escapes honoured). Malformed text passes here and is refused by the parser.
pub fn depth_within(body: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in body {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests;
