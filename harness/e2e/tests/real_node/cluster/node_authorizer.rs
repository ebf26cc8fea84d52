//! The node authorizer on the real API server (`cluster up --node-authorizer`; docs/operating.md
//! "Scope the agents' pod watch to their node"): a token of the agents' account bound to a pod on
//! this node lists its node's pods and no other's, nor all; a token bound to no pod lists
//! nothing; another account's grant is untouched; and with the webhook hung, only the violating
//! requests are refused.

use athenz_devstack::cluster::ClusterInfo;
use athenz_devstack::cluster::node_authorizer::NODE_AUTHORIZER;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// The agents' namespace and account, as deploy/base and the authorization configuration name
/// them (no release is installed: the test makes them).
const NAMESPACE: &str = "athenz-system";
const ACCOUNT: &str = "athenz-agent";

/// The account, its cluster-wide pod grant (deploy/base/rbac.yaml's second rule), a pod of it,
/// and for the default account a grant to list pods.
fn objects(image: &str, busybox: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
  {{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "{NAMESPACE}"}}}},
  {{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {{"name": "{ACCOUNT}", "namespace": "{NAMESPACE}"}}}},
  {{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {{"name": "test-pod-lister"}},
    "rules": [{{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}}]}},
  {{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {{"name": "test-pod-lister"}},
    "roleRef": {{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-pod-lister"}},
    "subjects": [{{"kind": "ServiceAccount", "name": "{ACCOUNT}", "namespace": "{NAMESPACE}"}},
                 {{"kind": "ServiceAccount", "name": "default", "namespace": "default"}}]}}]}}"#
    ) + "\n---\n"
        + &format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "agent-stand-in", "namespace": "{NAMESPACE}"}},
  "spec": {{"serviceAccountName": "{ACCOUNT}", "terminationGracePeriodSeconds": 0,
    "containers": [{{"name": "sleep", "image": "{image}", "imagePullPolicy": "Never",
      "command": ["{busybox}", "sleep", "3600"]}}]}}}}"#
        )
}

/// Sends SIGCONT to the authorizer when dropped, so a failing test never leaves it stopped.
struct Resume(Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// `GET /api/v1/pods?<query>` with `token`: the status and the body.
async fn list(info: &ClusterInfo, token: &str, query: &str) -> (u16, String) {
    let ca = std::fs::read_to_string(&info.api_server.ca).unwrap();
    let cas = athenz_core::crypto::pem_certificates(&ca).unwrap();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(athenz_core::tls::client_config(&cas, None).unwrap())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let response = client
        .get(format!("{}/api/v1/pods?{query}", info.api_server.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

fn node_selector(node: &str) -> String {
    format!("fieldSelector=spec.nodeName%3D{node}")
}

/// The checks (see the module docs); `kubectl` runs the admin's kubectl with a stdin.
pub fn check(
    info: &ClusterInfo,
    image: &str,
    busybox: &str,
    kubectl: &dyn Fn(&[&str], Option<&str>) -> String,
) {
    let started = Instant::now();
    for part in objects(image, busybox).split("\n---\n") {
        kubectl(&["apply", "-f", "-"], Some(part));
    }
    let pod = ["-n", NAMESPACE, "get", "pod", "agent-stand-in", "-o"];
    let bound = Instant::now();
    let uid = loop {
        let spec = kubectl(
            &[&pod[..], &["jsonpath={.spec.nodeName} {.metadata.uid}"]].concat(),
            None,
        );
        if let Some((node, uid)) = spec.split_once(' ')
            && node == info.node_name
        {
            break uid.to_owned();
        }
        assert!(
            bound.elapsed() < Duration::from_secs(60),
            "the pod was not bound: {spec:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let token = |args: &[&str]| {
        kubectl(&[&["create", "token"], args].concat(), None)
            .trim()
            .to_owned()
    };
    let agent = token(&[
        ACCOUNT,
        "-n",
        NAMESPACE,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "agent-stand-in",
        "--bound-object-uid",
        &uid,
    ]);
    let unbound = token(&[ACCOUNT, "-n", NAMESPACE]);
    let other_account = token(&["default", "-n", "default"]);
    let own = node_selector(&info.node_name);
    let expect = format!(
        "may list pods only with the field selector spec.nodeName={}",
        info.node_name
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            // its own node, as the agents ask (with the phase), a watch of it, and plain
            for query in [
                own.clone(),
                format!("{own}%2Cstatus.phase%3DPending&labelSelector=athenz.io%2Fidentity-volume"),
                format!("watch=1&timeoutSeconds=1&{own}"),
            ] {
                let (status, body) = list(info, &agent, &query).await;
                assert_eq!(status, 200, "{query}: {body}");
            }
            // another node, no selector, a label selector only: refused, with the reason
            for query in [
                node_selector("another-node"),
                String::new(),
                format!("labelSelector=spec.nodeName%3D{}", info.node_name),
                format!("watch=1&{}", node_selector("another-node")),
                format!("fieldSelector=spec.nodeName%21%3D{}", info.node_name),
            ] {
                let (status, body) = list(info, &agent, &query).await;
                assert_eq!(status, 403, "{query}: {body}");
                assert!(
                    body.contains(&expect) || query.starts_with("watch"),
                    "{query}: {body}"
                );
            }
            // a token bound to no pod names no node
            let (status, body) = list(info, &unbound, &own).await;
            assert_eq!(status, 403, "{body}");
            assert!(body.contains("names no node"), "{body}");
            // another account's grant is untouched
            let (status, body) = list(info, &other_account, "").await;
            assert_eq!(status, 200, "{body}");

            // the webhook hung: the conditions still pick out the violating requests alone
            let pid = *info
                .pids
                .get(NODE_AUTHORIZER)
                .expect("the authorizer's pid");
            let pid = Pid::from_raw(i32::try_from(pid).unwrap());
            kill(pid, Signal::SIGSTOP).unwrap();
            let resume = Resume(pid);
            let (status, body) = list(info, &agent, &own).await;
            assert_eq!(status, 200, "own node, webhook hung: {body}");
            let (status, body) = list(info, &other_account, "").await;
            assert_eq!(status, 200, "another account, webhook hung: {body}");
            // refused as the failure policy says: a deny with the webhook's error, which the
            // API server answers 500 (not 403), naming the error
            let (status, body) = list(info, &agent, &node_selector("yet-another-node")).await;
            assert_eq!(status, 500, "another node, webhook hung: {body}");
            assert!(body.contains("/authorize"), "{body}");
            drop(resume);
        });
    let log = std::fs::read_to_string(info.logs.join(format!("{NODE_AUTHORIZER}.log"))).unwrap();
    assert!(
        log.contains("denied"),
        "the authorizer logged no denial:\n{log}"
    );
    eprintln!(
        "node authorizer: own node allowed, other nodes, no selector and unbound tokens refused, \
         hung webhook refused only the violating list ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}
