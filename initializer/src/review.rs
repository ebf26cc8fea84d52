//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out (the response written by hand:
//! the patch must be a base64 string, which kube's types would write as a byte array).

use crate::mutate::{self, Skip};
use crate::template::Template;
use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The request part of a review.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response.
    pub uid: String,
    /// The object's kind.
    pub kind: GroupVersionKind,
    /// Namespace of the object (set even when the pod's own metadata has none yet).
    #[serde(default)]
    pub namespace: Option<String>,
    /// CREATE, UPDATE, DELETE, CONNECT.
    pub operation: String,
    /// The object.
    #[serde(default)]
    pub object: Option<serde_json::Value>,
}

/// group/version/kind.
#[derive(Debug, Clone, Deserialize)]
pub struct GroupVersionKind {
    /// API group ("" for core).
    #[serde(default)]
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

/// An incoming review.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewIn {
    /// Must be `admission.k8s.io/v1`.
    pub api_version: String,
    /// Must be `AdmissionReview`.
    pub kind: String,
    /// The request.
    pub request: Option<AdmissionRequest>,
}

/// Status of a refusal.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ResponseStatus {
    /// HTTP-like code.
    pub code: u16,
    pub message: String,
}

/// The response part.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid.
    pub uid: String,
    /// Whether the object is admitted.
    pub allowed: bool,
    /// `JSONPatch` when a patch is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Base64 of the JSON patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// Why it is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
}

/// An outgoing review.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewOut {
    /// `admission.k8s.io/v1`.
    pub api_version: &'static str,
    /// `AdmissionReview`.
    pub kind: &'static str,
    /// The answer.
    pub response: AdmissionResponse,
}

/// What happened to a review (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Patched.
    Injected,
    /// Left alone, with the reason.
    Skipped(&'static str),
    /// Refused: the pod cannot be patched.
    Refused,
}

impl Outcome {
    /// The label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Injected => "injected",
            Self::Skipped(why) => why,
            Self::Refused => "refused",
        }
    }
}

/// Why a review could not be read (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadReview(pub String);

/// Decides a review.
pub fn review(
    template: &Template,
    skip_namespaces: &BTreeSet<String>,
    body: &[u8],
) -> Result<(AdmissionReviewOut, Outcome), BadReview> {
    let review: AdmissionReviewIn = serde_json::from_slice(body)
        .map_err(|e| BadReview(format!("not an AdmissionReview: {e}")))?;
    if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
        return Err(BadReview(format!(
            "expected admission.k8s.io/v1 AdmissionReview, got {} {}",
            review.api_version, review.kind
        )));
    }
    let request = review
        .request
        .ok_or_else(|| BadReview("the review has no request".into()))?;
    if request.uid.is_empty() {
        return Err(BadReview("the request has no uid".into()));
    }
    let allow = |outcome: Outcome| {
        Ok((
            reply(AdmissionResponse {
                uid: request.uid.clone(),
                allowed: true,
                patch_type: None,
                patch: None,
                status: None,
            }),
            outcome,
        ))
    };
    let is_pod =
        request.kind.group.is_empty() && request.kind.version == "v1" && request.kind.kind == "Pod";
    if !is_pod {
        return allow(Outcome::Skipped("not_a_pod"));
    }
    if request.operation != "CREATE" {
        return allow(Outcome::Skipped("not_create"));
    }
    let object = request
        .object
        .clone()
        .ok_or_else(|| BadReview("the request has no object".into()))?;
    let pod: Pod = serde_json::from_value(object.clone())
        .map_err(|e| BadReview(format!("the object is not a Pod: {e}")))?;
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_default();
    if skip_namespaces.contains(&namespace) {
        return allow(Outcome::Skipped("system_namespace"));
    }
    match mutate::skip_reason(&pod) {
        Some(Skip::OptedOut) => return allow(Outcome::Skipped("opted_out")),
        Some(Skip::AlreadyInjected) => return allow(Outcome::Skipped("already_injected")),
        None => {}
    }
    let mutated = match mutate::inject(template, &pod) {
        Ok(p) => p,
        Err(conflict) => {
            return Ok((
                reply(AdmissionResponse {
                    uid: request.uid,
                    allowed: false,
                    patch_type: None,
                    patch: None,
                    status: Some(ResponseStatus {
                        code: 403,
                        message: format!("athenz identity cannot be added: {conflict}"),
                    }),
                }),
                Outcome::Refused,
            ));
        }
    };
    // Diff what the API server sent against the mutated pod re-serialised the same way, so fields
    // k8s-openapi does not know are never touched.
    let before = serde_json::to_value(&pod).map_err(|e| BadReview(e.to_string()))?;
    let after = serde_json::to_value(&mutated).map_err(|e| BadReview(e.to_string()))?;
    let patch = json_patch::diff(&before, &after);
    let patch_json = serde_json::to_vec(&patch).map_err(|e| BadReview(e.to_string()))?;
    Ok((
        reply(AdmissionResponse {
            uid: request.uid,
            allowed: true,
            patch_type: Some("JSONPatch".into()),
            patch: Some(base64::engine::general_purpose::STANDARD.encode(patch_json)),
            status: None,
        }),
        Outcome::Injected,
    ))
}

fn reply(response: AdmissionResponse) -> AdmissionReviewOut {
    AdmissionReviewOut {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response,
    }
}
