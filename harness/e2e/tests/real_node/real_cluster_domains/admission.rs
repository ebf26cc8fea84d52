//! Admission through a ZTS outage (docs/operating.md "Admission without ZTS"): the initializer's
//! own CA is in its Secret and in the webhook's caBundle; its token may change that bundle and
//! nothing else of the webhook (RBAC by name, then the ValidatingAdmissionPolicy), and a bundle
//! changed behind its back is put right; then, with ZTS frozen (SIGSTOP) and every initializer
//! pod deleted, a new Deployment in an opted-in namespace is admitted within 30 s of its apply,
//! and its pods get their identity within 60 s of ZTS's return.

use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::install::CONTROL_NAMESPACE;
use athenz_devstack::cluster::kubectl::Kubectl;
use athenz_devstack::cluster::layout::Processes;
use athenz_devstack::cluster::scenario::Scenario;
use athenz_devstack::cluster::tenant_pods::app_deployment;
use base64::Engine as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// The bound on admission during the outage.
const ADMITTED_WITHIN: Duration = Duration::from_secs(30);
/// The bound on identities once ZTS is back.
const IDENTITY_WITHIN: Duration = Duration::from_secs(60);
/// How long the initializer may take to put a changed bundle right (it checks every 10 s).
const PUT_RIGHT_WITHIN: Duration = Duration::from_secs(30);
const INITIALIZER: &str = "system:serviceaccount:k8s-admin:athenz-initializer";
const REFUSED: &str = "the initializer may change only its webhooks' caBundle";

fn decode(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .unwrap()
}

/// The CA certificate in the initializer's Secret.
fn stored_ca(kubectl: &Kubectl) -> Vec<u8> {
    let secret = kubectl
        .get_json(&["-n", CONTROL_NAMESPACE, "secret", "athenz-initializer-ca"])
        .unwrap();
    decode(
        secret["data"]["ca.crt"]
            .as_str()
            .expect("the Secret holds ca.crt"),
    )
}

/// The webhook's caBundle, decoded.
fn bundle(kubectl: &Kubectl) -> Vec<u8> {
    let hook = kubectl
        .get_json(&["mutatingwebhookconfiguration", "athenz-initializer"])
        .unwrap();
    decode(
        hook["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .unwrap_or_default(),
    )
}

/// An update of the webhook configuration as the initializer's service account makes it (it
/// may `update`, not `patch`): the object read now, changed by `change`, replaced.
fn update_as_initializer(
    kubectl: &Kubectl,
    change: impl FnOnce(&mut serde_json::Value),
) -> anyhow::Result<String> {
    let mut hook = kubectl
        .get_json(&["mutatingwebhookconfiguration", "athenz-initializer"])
        .unwrap();
    change(&mut hook["webhooks"][0]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), hook.to_string()).unwrap();
    let path = file.path().display().to_string();
    kubectl.run(&["--as", INITIALIZER, "replace", "-f", &path])
}

/// A change to one webhook of the configuration.
type WebhookChange = fn(&mut serde_json::Value);

/// SIGCONTs ZTS when dropped, so a failed assertion never leaves it frozen.
struct Frozen(Pid);

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

fn can_i(kubectl: &Kubectl, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i", "--as", INITIALIZER];
    all.extend_from_slice(args);
    // `can-i` exits 1 for "no"
    kubectl.run(&all).is_ok_and(|said| said.trim() == "yes")
}

fn the_grant_is_bounded(kubectl: &Kubectl) {
    assert!(can_i(
        kubectl,
        &["update", "mutatingwebhookconfigurations/athenz-initializer"]
    ));
    assert!(can_i(
        kubectl,
        &[
            "-n",
            CONTROL_NAMESPACE,
            "update",
            "secrets/athenz-initializer-ca"
        ]
    ));
    for denied in [
        &["update", "mutatingwebhookconfigurations/another-webhook"][..],
        &["create", "mutatingwebhookconfigurations"],
        &[
            "-n",
            CONTROL_NAMESPACE,
            "get",
            "secrets/athenz-callback-key",
        ],
        &["-n", CONTROL_NAMESPACE, "create", "secrets"],
        &["-n", CONTROL_NAMESPACE, "list", "secrets"],
    ] {
        assert!(!can_i(kubectl, denied), "the initializer may {denied:?}");
    }
    // what RBAC cannot narrow, the policy does: no change but the caBundle
    let changes: [(&str, WebhookChange); 3] = [
        ("failurePolicy", |w| w["failurePolicy"] = "Ignore".into()),
        ("namespaceSelector", |w| {
            w["namespaceSelector"] = serde_json::json!({})
        }),
        ("service", |w| {
            w["clientConfig"]["service"]["name"] = "elsewhere".into()
        }),
    ];
    for (what, change) in changes {
        let refused = update_as_initializer(kubectl, change)
            .unwrap_err()
            .to_string();
        assert!(refused.contains(REFUSED), "changing {what}: {refused}");
    }
    eprintln!(
        "the initializer's token: its Secret and webhook by name; failurePolicy, namespaceSelector and service refused: {REFUSED}"
    );
}

fn a_changed_bundle_is_put_right(kubectl: &Kubectl, ca: &[u8]) {
    // the same CA twice: allowed (only the bundle changes) and harmless, and not what it keeps
    let doubled = base64::engine::general_purpose::STANDARD.encode([ca, ca].concat());
    update_as_initializer(kubectl, |w| w["clientConfig"]["caBundle"] = doubled.into()).unwrap();
    let changed = Instant::now();
    while bundle(kubectl) != ca {
        assert!(
            changed.elapsed() < PUT_RIGHT_WITHIN,
            "the initializer did not put the bundle right within {PUT_RIGHT_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    eprintln!(
        "a caBundle changed behind the initializer's back was put right in {:.0} s",
        changed.elapsed().as_secs_f64()
    );
}

fn injected(kubectl: &Kubectl, ns: &str, app: &str) -> usize {
    let pods = kubectl
        .get_json(&["-n", ns, "pods", "-l", &format!("app={app}")])
        .unwrap();
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| {
            pod["spec"]["initContainers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["name"] == "athenz-sia-init")
        })
        .count()
}

pub fn goes_on_through_a_zts_outage(scenario: &Scenario, layout: &Layout) {
    let kubectl = scenario.kubectl();
    let ca = stored_ca(kubectl);
    assert!(String::from_utf8_lossy(&ca).starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(
        bundle(kubectl),
        ca,
        "the webhook's caBundle is the Secret's CA"
    );
    the_grant_is_bounded(kubectl);
    a_changed_bundle_is_put_right(kubectl, &ca);

    let (ns, app) = ("outage", "web");
    scenario.ensure_namespace(ns, true).unwrap();
    scenario.ensure_service_account(ns, app).unwrap();
    let processes = Processes::read(&layout.processes_json).expect("processes.json");
    let zts = Pid::from_raw(i32::try_from(processes.components["zts"].pid).unwrap());
    kill(zts, Signal::SIGSTOP).unwrap();
    let frozen = Frozen(zts);
    let stopped = Instant::now();

    let selector = "app.kubernetes.io/name=athenz-initializer";
    kubectl
        .run(&[
            "-n",
            CONTROL_NAMESPACE,
            "delete",
            "pod",
            "-l",
            selector,
            "--wait=true",
            "--timeout=90s",
        ])
        .unwrap();
    kubectl
        .run(&[
            "-n",
            CONTROL_NAMESPACE,
            "wait",
            "--for=condition=Ready",
            "pod",
            "-l",
            selector,
            "--timeout=120s",
        ])
        .unwrap();
    let replaced = stopped.elapsed();
    let applied = Instant::now();
    kubectl
        .apply_manifest(&app_deployment(ns, app, None), "deployment outage/web")
        .unwrap();
    while injected(kubectl, ns, app) < 2 {
        assert!(
            applied.elapsed() < ADMITTED_WITHIN,
            "the Deployment's pods were not admitted within {ADMITTED_WITHIN:?} with ZTS stopped: {}",
            kubectl
                .run(&["-n", ns, "get", "events"])
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let admitted = applied.elapsed();
    // while ZTS is away the pods wait for their identity
    std::thread::sleep(Duration::from_secs(10));
    let ready = kubectl
        .run(&[
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].status.containerStatuses[*].ready}",
        ])
        .unwrap();
    assert!(!ready.contains("true"), "a pod ran without ZTS: {ready}");
    let outage = stopped.elapsed();

    drop(frozen);
    let back = Instant::now();
    kubectl
        .wait_rolled_out(ns, "deployment/web", IDENTITY_WITHIN)
        .unwrap();
    let identities = back.elapsed();
    for pod in scenario.pods_of(ns, app).unwrap() {
        let identity = scenario
            .check_identity(ns, &pod, athenz_core::volume_mode::VolumeMode::CsiSocket)
            .unwrap();
        assert_eq!(identity.principal, "outage.web", "{identity:#?}");
    }
    eprintln!(
        "ZTS stopped {:.0} s: the initializer's pods replaced and Ready in {:.1} s; a new \
         Deployment's 2 pods admitted {:.1} s after its apply; identities {:.1} s after ZTS returned",
        outage.as_secs_f64(),
        replaced.as_secs_f64(),
        admitted.as_secs_f64(),
        identities.as_secs_f64()
    );
}
