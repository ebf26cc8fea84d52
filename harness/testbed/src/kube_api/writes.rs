//! The write routes of the Kubernetes API stand-in: create, replace, merge-patch and delete of pods
//! and services on the real API paths, with the real server's answers (201 on create, 409
//! `AlreadyExists`, 404 `NotFound`, 400 `BadRequest`, 422 `Invalid`), so a script can add a pod and
//! mount its volume through the real driver.

use super::{Cluster, key_of, not_found, now_timestamp, status, with_kind};
use athenz_core::http::{Body, json_response};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Pod, PodStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Answers a write request, or `None` when the path is not a write route (the caller answers).
pub(super) fn handle(cluster: &Cluster, req: &Request<Bytes>) -> Option<Response<Body>> {
    let segments: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    let grace_zero = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "gracePeriodSeconds=0" || kv == "gracePeriodSeconds%3D0")
    });
    let method = req.method().clone();
    let body = req.body();
    Some(match (method, segments.as_slice()) {
        (Method::POST, ["api", "v1", "namespaces", ns, "pods"]) => create_pod(cluster, ns, body),
        (Method::PUT, ["api", "v1", "namespaces", ns, "pods", name]) => {
            replace_pod(cluster, ns, name, body, false)
        }
        (Method::PUT, ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            replace_pod(cluster, ns, name, body, true)
        }
        (Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name])
        | (Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            patch_pod(cluster, ns, name, req)
        }
        (Method::DELETE, ["api", "v1", "namespaces", ns, "pods", name]) => {
            delete_pod(cluster, ns, name, grace_zero)
        }
        (
            Method::POST,
            [
                "api",
                "v1",
                "namespaces",
                ns,
                "serviceaccounts",
                sa,
                "token",
            ],
        ) => super::tokens::token_request(cluster, ns, sa, body),
        (Method::POST, ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
            super::tokens::token_review(cluster, body)
        }
        (Method::POST, ["api", "v1", "namespaces", ns, "services"]) => {
            create_service(cluster, ns, body)
        }
        (Method::PUT, ["api", "v1", "namespaces", ns, "services", name]) => {
            replace_service(cluster, ns, name, body)
        }
        (Method::DELETE, ["api", "v1", "namespaces", ns, "services", name]) => {
            match cluster.delete_service(ns, name) {
                Some(service) => json_response(StatusCode::OK, &with_kind(service, "Service")),
                None => not_found("services", name),
            }
        }
        _ => return None,
    })
}

/// A refused write: the status code, the Kubernetes reason and the message.
struct Refused(StatusCode, &'static str, String);

impl Refused {
    fn into_response(self) -> Response<Body> {
        status(self.0, self.1, self.2)
    }
}

fn bad_request(message: String) -> Response<Body> {
    status(StatusCode::BAD_REQUEST, "BadRequest", message)
}

fn invalid(message: String) -> Response<Body> {
    status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
}

/// Parses a body into a Kubernetes object, naming the kind when it is not one.
fn parse<T: DeserializeOwned>(body: &[u8], kind: &str) -> Result<T, Refused> {
    serde_json::from_slice(body).map_err(|e| {
        Refused(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("the body is not a valid {kind}: {e}"),
        )
    })
}

/// Checks the object's namespace and name against the path and fills the namespace in.
fn check_meta(meta: &mut ObjectMeta, namespace: &str, name: Option<&str>) -> Result<(), Refused> {
    match meta.namespace.as_deref() {
        None | Some("") => meta.namespace = Some(namespace.to_owned()),
        Some(ns) if ns == namespace => {}
        Some(ns) => {
            return Err(Refused(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "the namespace of the object ({ns}) does not match the namespace on the \
                     request ({namespace})"
                ),
            ));
        }
    }
    let object_name = meta.name.as_deref().unwrap_or_default();
    if athenz_core::names::validate_dns_name("metadata.name", object_name).is_err() {
        return Err(Refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "metadata.name: Invalid value: {object_name:?}: a lowercase RFC 1123 subdomain \
                 is required"
            ),
        ));
    }
    if let Some(name) = name
        && object_name != name
    {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the name of the object ({object_name}) does not match the name on the URL \
                 ({name})"
            ),
        ));
    }
    Ok(())
}

/// A uid in the API server's form (a random UUID).
fn new_uid() -> String {
    let hex = athenz_core::random::hex_name::<16>();
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

fn created<T: Serialize>(object: T, kind: &str) -> Response<Body> {
    json_response(StatusCode::CREATED, &with_kind(object, kind))
}

fn create_pod(cluster: &Cluster, namespace: &str, body: &[u8]) -> Response<Body> {
    let mut pod: Pod = match parse(body, "Pod") {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_meta(&mut pod.metadata, namespace, None) {
        return r.into_response();
    }
    if pod.spec.is_none() {
        return invalid("spec: Required value".into());
    }
    let key = key_of(&pod.metadata);
    let mut store = cluster.write();
    if store.pods.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("pods \"{}\" already exists", key.1),
        );
    }
    // The server owns these: a new uid and creation time, and the status starts over (kubelet
    // reports the real one through the status subresource).
    pod.metadata.uid = Some(new_uid());
    pod.metadata.creation_timestamp = Some(Time(now_timestamp()));
    pod.metadata.deletion_timestamp = None;
    pod.metadata.resource_version = Some("1".into());
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..PodStatus::default()
    });
    store.pods.insert(key, pod.clone());
    created(pod, "Pod")
}

fn replace_pod(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    body: &[u8],
    status_only: bool,
) -> Response<Body> {
    let mut update: Pod = match parse(body, "Pod") {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_meta(&mut update.metadata, namespace, Some(name)) {
        return r.into_response();
    }
    let mut store = cluster.write();
    let Some(current) = store.pods.get_mut(&(namespace.to_owned(), name.to_owned())) else {
        return not_found("pods", name);
    };
    if let Some(uid) = update.metadata.uid.as_deref()
        && current.metadata.uid.as_deref() != Some(uid)
    {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Precondition failed: UID in precondition: {uid}"),
        );
    }
    if status_only {
        current.status = update.status;
    } else {
        // identity and lifecycle stay the server's
        update.metadata.uid = current.metadata.uid.clone();
        update.metadata.creation_timestamp = current.metadata.creation_timestamp.clone();
        update.metadata.deletion_timestamp = current.metadata.deletion_timestamp.clone();
        update.status = current.status.clone();
        *current = update;
    }
    json_response(StatusCode::OK, &with_kind(current.clone(), "Pod"))
}

/// JSON merge patch (RFC 7386; `application/merge-patch+json`, also accepted for the strategic
/// form, which is the same for the fields this stand-in's clients change).
fn patch_pod(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    req: &Request<Bytes>,
) -> Response<Body> {
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !matches!(
        content_type,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format: {content_type:?}"),
        );
    }
    let patch: serde_json::Value = match serde_json::from_slice(req.body()) {
        Ok(p) => p,
        Err(e) => return bad_request(format!("the patch is not JSON: {e}")),
    };
    let mut store = cluster.write();
    let Some(current) = store.pods.get_mut(&(namespace.to_owned(), name.to_owned())) else {
        return not_found("pods", name);
    };
    let mut value = match serde_json::to_value(&*current) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("cannot encode the pod: {e}")),
    };
    json_patch::merge(&mut value, &patch);
    let mut patched: Pod = match serde_json::from_value(value) {
        Ok(p) => p,
        Err(e) => return invalid(format!("the patched pod is not valid: {e}")),
    };
    if key_of(&patched.metadata) != (namespace.to_owned(), name.to_owned())
        || patched.metadata.uid != current.metadata.uid
    {
        return invalid("metadata.name, metadata.namespace and metadata.uid are immutable".into());
    }
    patched.metadata.deletion_timestamp = current.metadata.deletion_timestamp.clone();
    *current = patched;
    json_response(StatusCode::OK, &with_kind(current.clone(), "Pod"))
}

fn delete_pod(cluster: &Cluster, namespace: &str, name: &str, now: bool) -> Response<Body> {
    let key = (namespace.to_owned(), name.to_owned());
    let mut store = cluster.write();
    if now {
        return match store.pods.remove(&key) {
            Some(pod) => json_response(StatusCode::OK, &with_kind(pod, "Pod")),
            None => not_found("pods", name),
        };
    }
    match store.pods.get_mut(&key) {
        Some(pod) => {
            if pod.metadata.deletion_timestamp.is_none() {
                pod.metadata.deletion_timestamp = Some(Time(now_timestamp()));
                pod.metadata.deletion_grace_period_seconds = Some(30);
            }
            json_response(StatusCode::OK, &with_kind(pod.clone(), "Pod"))
        }
        None => not_found("pods", name),
    }
}

fn create_service(cluster: &Cluster, namespace: &str, body: &[u8]) -> Response<Body> {
    let mut service: Service = match parse(body, "Service") {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_meta(&mut service.metadata, namespace, None) {
        return r.into_response();
    }
    let key = key_of(&service.metadata);
    let mut store = cluster.write();
    if store.services.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("services \"{}\" already exists", key.1),
        );
    }
    service.metadata.uid = Some(new_uid());
    service.metadata.creation_timestamp = Some(Time(now_timestamp()));
    store.services.insert(key, service.clone());
    created(service, "Service")
}

fn replace_service(cluster: &Cluster, namespace: &str, name: &str, body: &[u8]) -> Response<Body> {
    let mut update: Service = match parse(body, "Service") {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_meta(&mut update.metadata, namespace, Some(name)) {
        return r.into_response();
    }
    let mut store = cluster.write();
    let Some(current) = store
        .services
        .get_mut(&(namespace.to_owned(), name.to_owned()))
    else {
        return not_found("services", name);
    };
    update.metadata.uid = current.metadata.uid.clone();
    update.metadata.creation_timestamp = current.metadata.creation_timestamp.clone();
    *current = update;
    json_response(StatusCode::OK, &with_kind(current.clone(), "Service"))
}
