//! A real release upgrade on three real nodes, and its rollback: the previous release (its image
//! built from the commit CHANGELOG.md names, with that commit's own `deploy/image.sh`; its
//! manifests installed with its own docs/operating.md steps), then this release's `deploy/`
//! under the same overlay as docs/operating.md's "Upgrade and rollback" says, the agents'
//! DaemonSet rolling one node at a time while a pod is created every second; then the previous
//! `deploy/` again, the same way.
//!
//! Each way: every pod created meanwhile gets its identity (0 without), the pods made before
//! keep theirs and their next refresh is served (three-minute certificates), ZTS refuses no
//! refresh, and never more than one node is without a Ready agent. The exceptions are the
//! previous release's own defects, each named and printed:
//! - in the upgrade, a connection to a terminating pod of a release that stopped accepting at
//!   SIGTERM ([`STOPS_ACCEPTING_AT_SIGTERM`]): ZTS's to its callback, and the API server's to its
//!   webhook (the pod's creation is then tried again, as a ReplicaSet's controller would); this
//!   release's pods go on accepting for their drain delay, so the rollback allows none;
//! - in the rollback, a refresh without an IP that a previous release's callback refuses
//!   ([`REFUSES_IP_LESS_REFRESH`]);
//! - a refresh a previous release's callback answered 504 because its own API client ended the
//!   call ([`ENDS_CALLS_ON_IDLE_API_CONNECTIONS`]); that pod's next refresh is waited for.
//!
//! During the roll, new pods meet both wires: this release's SIA (the template's image changes
//! at once) on nodes whose agent is still the previous release's, and the previous release's
//! SIAs on upgraded nodes.
//!
//! Needs root, `harness/real-node/kube/build.sh`'s binaries and what both images need; fails
//! naming what is missing, never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::info::ClusterInfo;
use athenz_devstack::cluster::install::{self, NODE_NAMESPACE, WORKLOADS};
use athenz_devstack::cluster::kubectl::Kubectl;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario, Workload};
use athenz_devstack::cluster::{Layout, images, tenant_pods};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;
#[path = "real_cluster_upgrade/refusals.rs"]
mod refusals;
use common::cluster::{require_prerequisites, start_cluster};
use common::nodes::pods_on_every_node;
use common::previous_release::{previous_image, previous_release};
use common::release::build_image;
use refusals::{
    is_callback_connection_refused, is_idle_api_connection_ended, is_ip_less_refresh_refused,
    is_replaced_agent_refused, is_webhook_connection_refused, refresh_refusals, refused_pod,
    zts_log,
};

/// The releases whose Deployments stopped accepting at SIGTERM (no `DRAIN_DELAY_SECONDS`): a
/// rollout replacing their pods can have ZTS's connection to the callback refused, and the API
/// server's to the webhook.
const STOPS_ACCEPTING_AT_SIGTERM: [&str; 1] = ["0.2.0"];

/// Releases whose overlay sets the webhook's caBundle (the Athenz CA; this release's initializer
/// keeps its own CA there). Rolled back to one, this release's replicas still serving are not
/// trusted until their next check (10 s) trusts the restored bundle beside their own: the API
/// server's calls to them then fail verification, and those creations are tried again.
const SETS_THE_WEBHOOK_CA_BUNDLE: [&str; 1] = ["0.2.0"];

/// Releases whose callback refuses a refresh that names no IP for a pod that has one (before
/// files mode's `ipSAN`, 0.3.0). Rolled back to one of them, its callback meets this release's
/// agents on the nodes not yet rolled back, refreshing IP-less files-mode volumes; each such
/// pod's next refresh, by the rolled-back agent with the IP, is served (CHANGELOG 0.3.0).
const REFUSES_IP_LESS_REFRESH: [&str; 1] = ["0.2.0"];

/// Releases whose callback's Kubernetes API client had a read timeout of its call timeout on
/// every connection. That timer starts when a pooled connection goes idle, so a confirmation
/// sent on a connection idle almost that long is ended under it (`client error
/// (SendRequest)`) and answered 504 "cannot tell now" (CHANGELOG 0.3.0, and the callback's test
/// `a_call_on_a_connection_idle_almost_the_call_timeout_is_answered`). Such a callback serves
/// until it is replaced in the upgrade and again after the rollback; each pod it refused this
/// way must have its next refresh served ([`wait_next_refresh_of_refused`]).
const ENDS_CALLS_ON_IDLE_API_CONNECTIONS: [&str; 1] = ["0.2.0"];

/// How many times a pod's creation refused by a webhook pod that stopped accepting or is not yet
/// trusted is tried, a second apart: kube-proxy drops a terminating pod's endpoint within a
/// second or two, and a replica trusts a restored bundle within its 10 s check.
const WEBHOOK_REFUSED_TRIES: u32 = 20;

/// How long a pod created during a roll may take to be Ready.
const POD_READY: Duration = Duration::from_secs(240);

#[test]
fn the_previous_release_rolls_to_this_one_node_by_node_and_back() {
    require_prerequisites();
    let previous = previous_release();
    let previous_image = previous_image(&previous);
    let this_image = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-upgrade-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    let previous_image_arg = previous_image.display().to_string();
    let previous_deploy = previous.deploy.display().to_string();
    let previous_steps = previous.page.display().to_string();
    // three-minute certificates: every pod refreshes during the test
    let (_guard, info) = start_cluster(
        &state_dir,
        &[
            "--image-archive",
            &previous_image_arg,
            "--deploy",
            &previous_deploy,
            "--steps",
            &previous_steps,
            "--cert-minutes",
            "3",
            "--nodes",
            "3",
        ],
        Duration::from_secs(600),
    );
    let previous_ref = images::archive_reference(&previous_image).unwrap();
    let this_ref = images::archive_reference(&this_image).unwrap();
    assert_ne!(
        previous_ref, this_ref,
        "the two releases' images share a name"
    );
    assert_eq!(info.image.as_deref(), Some(previous_ref.as_str()));
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().unwrap();
    let scenario = Scenario::new(&layout, &zts.ca);
    Scenario::import_app_image(&layout).unwrap();
    // this release's image on every node, as an operator pushes it before applying
    images::import(&layout, &this_image).unwrap();
    assert_agents_run(scenario.kubectl(), &previous_ref);
    eprintln!(
        "{} ({}) installed on 3 nodes with its own image and steps",
        previous.version, previous.commit
    );

    let steady = pods_on_every_node(&scenario, &info, "steady");
    let mut serials = serials_of(&scenario, &steady);
    let mut modes: BTreeMap<String, VolumeMode> = steady.iter().flatten().cloned().collect();
    let repo_deploy = athenz_testbed::bins::repo_root().join("deploy");
    for (step, deploy, image) in [
        ("upgrade", repo_deploy.as_path(), &this_ref),
        ("rollback", previous.deploy.as_path(), &previous_ref),
    ] {
        let log_before = zts_log(&layout).len();
        let previous_stops_at_once =
            step == "upgrade" && STOPS_ACCEPTING_AT_SIGTERM.contains(&previous.version.as_str());
        let webhook_may_refuse = previous_stops_at_once
            || (step == "rollback"
                && SETS_THE_WEBHOOK_CA_BUNDLE.contains(&previous.version.as_str()));
        let rolled = roll(
            &scenario,
            &layout,
            &info,
            (step, webhook_may_refuse),
            deploy,
            &zts.url,
            &zts.ca,
        );
        assert_agents_run(scenario.kubectl(), image);
        rolled.check(&scenario, step);
        modes.extend(rolled.created.iter().cloned());
        // the pods made before the roll still hold identities, and their next refresh (due
        // during the roll or after it, through the agents and SIAs now running) is served
        serials = wait_refreshed(&scenario, &steady, &serials, step);
        let log = zts_log(&layout);
        let refused = refresh_refusals(log.get(log_before..).unwrap_or_default());
        // the pods replaced in an upgrade are the previous release's: one that stopped
        // accepting at SIGTERM lets ZTS meet a refused connection to it, which no step of the
        // new release can prevent; the pod's next refresh (waited for above) is served
        let (abrupt, refused): (Vec<String>, Vec<String>) = refused.into_iter().partition(|l| {
            (previous_stops_at_once && is_callback_connection_refused(l))
                || (step == "rollback"
                    && REFUSES_IP_LESS_REFRESH.contains(&previous.version.as_str())
                    && is_ip_less_refresh_refused(l))
        });
        let (idle_ended, refused): (Vec<String>, Vec<String>) =
            refused.into_iter().partition(|l| {
                ENDS_CALLS_ON_IDLE_API_CONNECTIONS.contains(&previous.version.as_str())
                    && is_idle_api_connection_ended(l)
            });
        // an agent the roll replaces may renew its node identity between its pod's deletion
        // and its SIGTERM; the callback refuses it, and its successor (running, checked
        // above) registers its own
        let (replaced, refused): (Vec<String>, Vec<String>) = refused
            .into_iter()
            .partition(|l| is_replaced_agent_refused(l));
        if !replaced.is_empty() {
            eprintln!(
                "{step}: {} node-identity refreshes of agents being replaced were refused, as \
                 they must be:\n{}",
                replaced.len(),
                replaced.join("\n")
            );
        }
        assert!(
            refused.is_empty(),
            "{step}: ZTS refused {} refreshes:\n{}",
            refused.len(),
            refused.join("\n")
        );
        wait_next_refresh_of_refused(&scenario, &modes, &idle_ended, step);
        if !abrupt.is_empty() {
            eprintln!(
                "{step}: {} refreshes met a {} callback pod that had stopped accepting or that \
                 refuses an IP-less refresh, each served on its next try:\n{}",
                abrupt.len(),
                previous.version,
                abrupt.join("\n")
            );
        }
        if !rolled.webhook_refused.is_empty() {
            eprintln!(
                "{step}: {} pod creations met a webhook pod that had stopped accepting or was not \
                 yet trusted, each created on a later try:\n{}",
                rolled.webhook_refused.len(),
                rolled.webhook_refused.join("\n")
            );
        }
        eprintln!(
            "{step}: {} pods created one a second, each with its identity; the agents rolled \
             node by node ({}); {} pods made before refreshed; 0 refreshes refused",
            rolled.created.len(),
            rolled.order.join(", "),
            steady.iter().flatten().count()
        );
    }
}

/// How long a pod's next refresh may take: its three-minute certificate's refresh, and a minute.
const REFRESH_DUE: Duration = Duration::from_secs(240);

/// Waits until each pod's certificate serial differs from `before` (its refresh served), up to
/// [`REFRESH_DUE`]; returns the new serials.
fn wait_refreshed(
    scenario: &Scenario,
    pods: &[Vec<(String, VolumeMode)>],
    before: &BTreeMap<String, String>,
    step: &str,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + REFRESH_DUE;
    loop {
        let now = serials_of(scenario, pods);
        let stale: Vec<&String> = now
            .iter()
            .filter(|(pod, serial)| before.get(*pod) == Some(*serial))
            .map(|(pod, _)| pod)
            .collect();
        if stale.is_empty() {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{step}: not refreshed within {REFRESH_DUE:?} of the roll: {stale:?}"
        );
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// Every agent pod runs `image`.
fn assert_agents_run(kubectl: &Kubectl, image: &str) {
    let pods = kubectl
        .get_json(&[
            "pods",
            "-n",
            NODE_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=athenz-agent",
        ])
        .unwrap();
    let items = pods["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "one agent per node");
    for pod in items {
        assert_eq!(
            pod["spec"]["containers"][0]["image"], image,
            "{}",
            pod["metadata"]["name"]
        );
    }
}

/// Each pod's certificate serial, by pod.
fn serials_of(scenario: &Scenario, pods: &[Vec<(String, VolumeMode)>]) -> BTreeMap<String, String> {
    pods.iter()
        .flatten()
        .map(|(pod, mode)| {
            let identity = scenario
                .check_identity(RESTRICTED_NAMESPACE, pod, *mode)
                .unwrap_or_else(|e| panic!("{pod}: {e:#}"));
            (pod.clone(), identity.serial)
        })
        .collect()
}

/// Waits until each pod named in `refusals` (lines [`is_idle_api_connection_ended`] matched) has
/// a refresh served after now: a refusal a previous release's callback made at random must not
/// leave the pod without its next certificate. Prints the refusals it waited past.
fn wait_next_refresh_of_refused(
    scenario: &Scenario,
    modes: &BTreeMap<String, VolumeMode>,
    refusals: &[String],
    step: &str,
) {
    if refusals.is_empty() {
        return;
    }
    let pods: Vec<(String, VolumeMode)> = refusals
        .iter()
        .map(|line| {
            let pod = refused_pod(line).unwrap_or_else(|| panic!("{step}: no pod named in {line}"));
            let mode = *modes
                .get(pod)
                .unwrap_or_else(|| panic!("{step}: {pod} is none of the test's pods: {line}"));
            (pod.to_owned(), mode)
        })
        .collect();
    let pods = vec![pods];
    let before = serials_of(scenario, &pods);
    wait_refreshed(scenario, &pods, &before, step);
    eprintln!(
        "{step}: {} refreshes met a previous-release callback ending its call on an idle API \
         connection; each pod's next refresh was served:\n{}",
        refusals.len(),
        refusals.join("\n")
    );
}

/// What one roll did: the pods created during it, the order the nodes' agents were replaced,
/// and each creation refused by a terminating previous-release webhook (then tried again).
struct Rolled {
    created: Vec<(String, VolumeMode)>,
    order: Vec<String>,
    webhook_refused: Vec<String>,
}

impl Rolled {
    /// Every pod created during the roll is Ready with its identity.
    fn check(&self, scenario: &Scenario, step: &str) {
        for (pod, mode) in &self.created {
            scenario
                .wait_pod_ready(RESTRICTED_NAMESPACE, pod, POD_READY)
                .unwrap_or_else(|e| panic!("{step}: {e:#}"));
            scenario
                .check_identity(RESTRICTED_NAMESPACE, pod, *mode)
                .unwrap_or_else(|e| panic!("{step}: {pod} has no identity: {e:#}"));
        }
    }
}

/// `deploy` applied under the install's overlay (docs/operating.md's upgrade), while a pod is
/// created every second and the agents are watched: returns once every workload rolled out and
/// 10 s more passed. `webhook_may_refuse`: the webhook's pods being replaced stop accepting at
/// SIGTERM, or are not trusted until their next check,
/// so a creation their webhook refuses to connect is tried again.
fn roll(
    scenario: &Scenario,
    layout: &Layout,
    info: &ClusterInfo,
    (step, webhook_may_refuse): (&str, bool),
    deploy: &Path,
    zts_url: &str,
    zts_ca: &Path,
) -> Rolled {
    let stop = Arc::new(AtomicBool::new(false));
    let creator = {
        let (layout, stop, step) = (layout.clone(), stop.clone(), step.to_owned());
        std::thread::spawn(move || create_one_a_second(&layout, &step, webhook_may_refuse, &stop))
    };
    let watcher = {
        let (layout, stop) = (layout.clone(), stop.clone());
        let nodes: Vec<String> = info.nodes.iter().map(|n| n.name.clone()).collect();
        std::thread::spawn(move || watch_agents(&layout, &nodes, &stop))
    };
    let kubectl = scenario.kubectl();
    install::upgrade(
        install::Installer::Kustomize,
        kubectl,
        &install::checkout_dir(&layout.athenz),
        deploy,
        zts_url,
        zts_ca,
        &install::operator_keys_dir(&layout.athenz),
    )
    .unwrap_or_else(|e| panic!("{step}: {e:#}"));
    for (namespace, workload) in WORKLOADS {
        kubectl
            .wait_rolled_out(namespace, workload, Duration::from_secs(300))
            .unwrap();
    }
    std::thread::sleep(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let (created, webhook_refused) = creator.join().unwrap();
    let order = watcher.join().unwrap();
    Rolled {
        created,
        order,
        webhook_refused,
    }
}

/// Creates a pod every second (csi-socket and csi-files in turn, as a `restricted` namespace's
/// tenants write them) until `stop`; returns them, and each refused connection to the webhook
/// that `webhook_may_refuse` allowed (that creation tried again a second later, up to
/// [`WEBHOOK_REFUSED_TRIES`] times).
fn create_one_a_second(
    layout: &Layout,
    step: &str,
    webhook_may_refuse: bool,
    stop: &AtomicBool,
) -> (Vec<(String, VolumeMode)>, Vec<String>) {
    let kubectl = Kubectl::new(layout);
    let mut created = Vec::new();
    let mut webhook_refused = Vec::new();
    let started = Instant::now();
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (kind, mode) = match i % 2 {
            0 => ("steady-socket", VolumeMode::CsiSocket),
            _ => ("steady-files", VolumeMode::CsiFiles),
        };
        let name = format!("{step}-{i}");
        let mut pod = tenant_pods::restricted_pod(&Workload {
            namespace: RESTRICTED_NAMESPACE,
            service_account: kind,
            mode,
            service: false,
        });
        pod["metadata"]["name"] = name.clone().into();
        let mut tries = 0;
        loop {
            tries += 1;
            match kubectl.apply_manifest(&pod.to_string(), &format!("pod {name}")) {
                Ok(_) => break,
                Err(e) => {
                    let error = format!("{e:#}");
                    if !(webhook_may_refuse
                        && is_webhook_connection_refused(&error)
                        && tries < WEBHOOK_REFUSED_TRIES)
                    {
                        panic!("creating {name} (try {tries}): {error}");
                    }
                    webhook_refused.push(error);
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        created.push((name, mode));
        let next = Duration::from_secs(i + 1);
        if let Some(wait) = next.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    (created, webhook_refused)
}

/// Watches the agents every 250 ms until `stop`: fails if more than one node is ever without a
/// Ready agent; returns the nodes in the order their agent was replaced.
fn watch_agents(layout: &Layout, nodes: &[String], stop: &AtomicBool) -> Vec<String> {
    let kubectl = Kubectl::new(layout);
    let mut first_uid: BTreeMap<String, String> = BTreeMap::new();
    let mut order = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(pods) = kubectl.get_json(&[
            "pods",
            "-n",
            NODE_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=athenz-agent",
        ]) else {
            continue;
        };
        let mut ready_nodes = Vec::new();
        for pod in pods["items"].as_array().into_iter().flatten() {
            let node = pod["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let first = first_uid.entry(node.clone()).or_insert_with(|| uid.clone());
            if *first != uid && !order.contains(&node) {
                order.push(node.clone());
            }
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                ready_nodes.push(node);
            }
        }
        let without: Vec<&String> = nodes.iter().filter(|n| !ready_nodes.contains(n)).collect();
        assert!(
            without.len() <= 1,
            "more than one node without a Ready agent at once: {without:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        order.len(),
        nodes.len(),
        "not every node's agent was replaced: {order:?}"
    );
    order
}
