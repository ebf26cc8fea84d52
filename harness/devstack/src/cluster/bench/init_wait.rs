//! Where a pod with an init container spends the time between its init container's start and
//! its app's: the init container's own run, and how long the kubelet took to notice that it had
//! exited. containerd logs when a container started and when its task exited; the kubelet acts
//! on an exit only once its pod lifecycle event generator (PLEG) reports `ContainerDied`, and it
//! finds exits by relisting the runtime, about once a second. So the notice lag is the kubelet's
//! and varies with where its relist stands, whatever the init container did; a kind whose pods'
//! exits happen to meet the relist late pays hundreds of milliseconds that are not its own.
//! Read from the logs of containerd 2 and the kubelet of Kubernetes 1.37; logs that say
//! otherwise give no figures, never wrong ones.

use super::volume_wait::{clock_seconds, klog_seconds, span, text_between};
use crate::bench::Latency;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The init containers' share of one phase of one kind.
#[derive(Debug, Clone, Serialize)]
pub struct InitWaits {
    /// Pods whose init container's start, exit and notice the logs show.
    pub pods: usize,
    /// containerd's `StartContainer … returns successfully` → its task's exit event: what the
    /// init container itself took (ours: the SIA getting and writing the identity).
    pub init_run_ms: Latency,
    /// The exit event → the kubelet's PLEG `ContainerDied`: the kubelet's lag, not the pod's.
    pub exit_noticed_ms: Latency,
    /// `ContainerDied` → the app container's `StartContainer … returns successfully`: the
    /// kubelet starting the native sidecar, then the app.
    pub app_started_ms: Latency,
}

/// What the logs say about one container.
#[derive(Debug, Default, Clone)]
struct Container {
    /// `namespace/pod` and the container's name.
    pod: String,
    name: String,
    started: Option<f64>,
    exited: Option<f64>,
    noticed: Option<f64>,
}

/// Seconds of the day in a containerd line's `time="2026-12-06T07:57:30.879861198Z"`.
fn containerd_seconds(line: &str) -> Option<f64> {
    clock_seconds(line.strip_prefix("time=\"")?.get(11..29)?)
}

/// The text after `key` up to the next escaped quote (`\"`) in a containerd line.
fn escaped<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    text_between(line, key, "\\\"")
}

/// An id: 64 hex digits, as containerd names sandboxes and containers.
fn is_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The containers of pods named `<phase>-<n>` in `namespaces`, from containerd's log.
fn containers(
    containerd_log: &str,
    namespaces: &[&str],
    phase: &str,
) -> BTreeMap<String, Container> {
    let prefix = format!("{phase}-");
    let mut sandboxes: BTreeMap<String, String> = BTreeMap::new();
    let mut containers: BTreeMap<String, Container> = BTreeMap::new();
    for line in containerd_log.lines() {
        let Some(at) = containerd_seconds(line) else {
            continue;
        };
        if line.contains("msg=\"RunPodSandbox for ") && line.contains(" returns sandbox id ") {
            let (Some(name), Some(namespace), Some(id)) = (
                escaped(line, "name:\\\""),
                escaped(line, "namespace:\\\""),
                escaped(line, "returns sandbox id \\\""),
            ) else {
                continue;
            };
            let ours = name
                .strip_prefix(&prefix)
                .is_some_and(|n| n.parse::<u32>().is_ok())
                && namespaces.contains(&namespace);
            if ours && is_id(id) {
                sandboxes.insert(id.to_owned(), format!("{namespace}/{name}"));
            }
        } else if line.contains("msg=\"CreateContainer within sandbox ") {
            let (Some(sandbox), Some(name), Some(id)) = (
                escaped(line, "within sandbox \\\""),
                escaped(line, "for name:\\\""),
                escaped(line, "returns container id \\\""),
            ) else {
                continue;
            };
            if let Some(pod) = sandboxes.get(sandbox).filter(|_| is_id(id)) {
                containers.insert(
                    id.to_owned(),
                    Container {
                        pod: pod.clone(),
                        name: name.to_owned(),
                        ..Container::default()
                    },
                );
            }
        } else if line.contains("msg=\"StartContainer for ")
            && line.contains(" returns successfully")
        {
            if let Some(c) =
                escaped(line, "StartContainer for \\\"").and_then(|id| containers.get_mut(id))
            {
                c.started.get_or_insert(at);
            }
        } else if line.contains("msg=\"received container exit event ")
            && let Some(c) =
                escaped(line, "container_id:\\\"").and_then(|id| containers.get_mut(id))
        {
            c.exited.get_or_insert(at);
        }
    }
    containers
}

/// Adds the kubelet's first `ContainerDied` of each container in `containers`.
fn add_notices(kubelet_log: &str, containers: &mut BTreeMap<String, Container>) {
    for line in kubelet_log.lines().filter(|l| l.starts_with('I')) {
        if !line.contains("\"SyncLoop (PLEG): event for pod\"")
            || !line.contains("\"Type\":\"ContainerDied\"")
        {
            continue;
        }
        let Some(id) = line
            .split("\"Data\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        if let (Some(c), Some(at)) = (containers.get_mut(id), klog_seconds(line)) {
            c.noticed.get_or_insert(at);
        }
    }
}

/// The init containers' waits of each namespace's pods named `<phase>-<n>` that have an init
/// container named one of `init_names` and an app container named `app`; namespaces with none
/// are left out.
pub fn by_namespace(
    containerd_log: &str,
    kubelet_log: &str,
    namespaces: &[&str],
    phase: &str,
    init_names: &[&str],
) -> BTreeMap<String, InitWaits> {
    let mut all = containers(containerd_log, namespaces, phase);
    add_notices(kubelet_log, &mut all);
    let mut pods: BTreeMap<&str, BTreeMap<&str, &Container>> = BTreeMap::new();
    for c in all.values() {
        pods.entry(&c.pod).or_default().insert(&c.name, c);
    }
    let mut samples: BTreeMap<String, [Vec<Duration>; 3]> = BTreeMap::new();
    for (pod, by_name) in &pods {
        let Some(init) = init_names.iter().find_map(|n| by_name.get(n)) else {
            continue;
        };
        let (Some(started), Some(exited), Some(noticed)) =
            (init.started, init.exited, init.noticed)
        else {
            continue;
        };
        let Some(app_started) = by_name.get("app").and_then(|a| a.started) else {
            continue;
        };
        let namespace = pod.split('/').next().unwrap_or_default();
        let [run, notice, app] = samples.entry(namespace.to_owned()).or_default();
        run.push(span(started, exited));
        notice.push(span(exited, noticed));
        app.push(span(noticed, app_started));
    }
    samples
        .into_iter()
        .map(|(namespace, [mut run, mut notice, mut app])| {
            let waits = InitWaits {
                pods: run.len(),
                init_run_ms: Latency::of(&mut run),
                exit_noticed_ms: Latency::of(&mut notice),
                app_started_ms: Latency::of(&mut app),
            };
            (namespace, waits)
        })
        .collect()
}

#[cfg(test)]
mod tests;
