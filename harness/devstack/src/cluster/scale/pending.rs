//! ZTS's side of a measured window: a watch of the window's pods, and each pod confirmed
//! through the callback at the moment it is pending on its node with its IP (when its SIA
//! registers), as ZTS asks the provider for every launch, with the identity JWT its node's
//! agent got from the jwt-service.

use super::callback::{Callback, PendingPod};
use super::fleet::{Api, BATCH_LABEL};
use super::jwt::JwtService;
use anyhow::Context;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest watch event read (a pod's is a few KiB).
const MAX_EVENT: usize = 1 << 20;

/// What the confirmations of a window came to.
#[derive(Debug, Default)]
pub struct Confirmed {
    /// Each confirmation's time, the callback's answer included.
    pub took: Vec<Duration>,
    /// Each identity JWT's time from the jwt-service.
    pub jwt_took: Vec<Duration>,
    /// Those the callback refused or did not answer, each with why (the first few).
    pub failed: Vec<String>,
    /// How many failed in all.
    pub failures: usize,
}

/// Starts watching batch `batch`'s pods (before they are made) and confirms each of them once
/// it is pending with its IP, until `expected` were tried or `limit` passed. A watch the API
/// server ends early is opened again (its first events are then the batch's pods as they are,
/// so none is missed; a pod already tried is not tried again).
pub async fn start(
    api: &Api,
    (callback, jwt): (Arc<Callback>, Arc<JwtService>),
    batch: &str,
    expected: usize,
    limit: Duration,
) -> anyhow::Result<tokio::task::JoinHandle<Confirmed>> {
    let path = format!("/api/v1/pods?watch=1&labelSelector={BATCH_LABEL}%3D{batch}");
    let first = api.watch(&timed(&path, limit), limit).await?;
    let api = api.clone();
    Ok(tokio::spawn(async move {
        let deadline = Instant::now() + limit;
        let mut watch = Some(first);
        let mut tried = HashSet::new();
        let mut calls = tokio::task::JoinSet::new();
        let mut ended = Vec::new();
        while tried.len() < expected && Instant::now() < deadline {
            let response = match watch.take() {
                Some(response) => response,
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match api.watch(&timed(&path, left), left).await {
                        Ok(response) => response,
                        Err(e) => {
                            ended.push(format!("{e:#}"));
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    }
                }
            };
            let why = read_watch(response, deadline, |pod| {
                if tried.insert(pod.uid.clone()) {
                    let (callback, jwt) = (Arc::clone(&callback), Arc::clone(&jwt));
                    calls.spawn(async move {
                        let (token, jwt_took) = jwt.jwt_for(&pod.subject()?, &pod.node).await?;
                        Ok((jwt_took, callback.confirm(&pod, token).await?))
                    });
                }
                tried.len() < expected
            })
            .await;
            ended.push(why);
        }
        let mut confirmed = Confirmed::default();
        while let Some(joined) = calls.join_next().await {
            match joined
                .context("a confirmation's task")
                .and_then(|r: anyhow::Result<(Duration, Duration)>| r)
            {
                Ok((jwt_took, took)) => {
                    confirmed.jwt_took.push(jwt_took);
                    confirmed.took.push(took);
                }
                Err(e) => {
                    confirmed.failures += 1;
                    if confirmed.failed.len() < 5 {
                        confirmed.failed.push(format!("{e:#}"));
                    }
                }
            }
        }
        let missed = expected.saturating_sub(tried.len());
        if missed > 0 {
            confirmed.failures += missed;
            ended.truncate(5);
            confirmed.failed.push(format!(
                "{missed} pods were never seen pending with an IP within {limit:?}; the watches ended: {ended:?}"
            ));
        }
        confirmed
    }))
}

/// `path` with the API server's own end to the watch at `limit`.
fn timed(path: &str, limit: Duration) -> String {
    format!("{path}&timeoutSeconds={}", limit.as_secs().max(1))
}

/// Reads one watch until it ends, `deadline`, or `seen` says no more are wanted; `seen` gets
/// each pod pending with its IP. Returns why it stopped.
async fn read_watch(
    mut response: reqwest::Response,
    deadline: Instant,
    mut seen: impl FnMut(PendingPod) -> bool,
) -> String {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline.into(), response.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) => return "ended by the API server".to_owned(),
            Ok(Err(e)) => return format!("{e:#}"),
            Err(_) => return "the window's time passed".to_owned(),
        };
        buffer.extend_from_slice(&chunk);
        if buffer.len() > MAX_EVENT {
            return format!("an event over {MAX_EVENT} bytes");
        }
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if let Some(pod) = pending_pod(&line)
                && !seen(pod)
            {
                return "every pod seen".to_owned();
            }
        }
    }
}

/// The pod of a watch event, if it is pending on a node with its IP.
fn pending_pod(line: &[u8]) -> Option<PendingPod> {
    let event: Value = serde_json::from_slice(line).ok()?;
    let pod = &event["object"];
    if pod["status"]["phase"] != "Pending" || pod["metadata"]["deletionTimestamp"].is_string() {
        return None;
    }
    Some(PendingPod {
        namespace: pod["metadata"]["namespace"].as_str()?.to_owned(),
        name: pod["metadata"]["name"].as_str()?.to_owned(),
        uid: pod["metadata"]["uid"].as_str()?.to_owned(),
        node: pod["spec"]["nodeName"].as_str()?.to_owned(),
        ip: pod["status"]["podIP"].as_str()?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_a_pod_pending_with_its_ip_is_confirmed() {
        let event = |phase: &str, ip: Option<&str>, deleting: bool| {
            let mut pod = serde_json::json!({
                "type": "MODIFIED",
                "object": {
                    "metadata": {"namespace": "scale-tenant-000", "name": "web-000001",
                                 "uid": "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c"},
                    "spec": {"nodeName": "kwok-node-00001"},
                    "status": {"phase": phase},
                }
            });
            if let Some(ip) = ip {
                pod["object"]["status"]["podIP"] = ip.into();
            }
            if deleting {
                pod["object"]["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z".into();
            }
            serde_json::to_vec(&pod).unwrap()
        };
        let pod = pending_pod(&event("Pending", Some("10.64.0.9"), false)).unwrap();
        assert_eq!(pod.node, "kwok-node-00001");
        assert_eq!(pod.ip.to_string(), "10.64.0.9");
        assert!(
            pending_pod(&event("Pending", None, false)).is_none(),
            "no IP yet"
        );
        assert!(pending_pod(&event("Running", Some("10.64.0.9"), false)).is_none());
        assert!(pending_pod(&event("Pending", Some("10.64.0.9"), true)).is_none());
        assert!(pending_pod(&event("Pending", Some("not an ip"), false)).is_none());
        assert!(pending_pod(b"{not json").is_none());
    }
}
