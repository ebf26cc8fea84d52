//! The agent's own node identity (docs/design.md §4.9) against the dev ZTS, the real callback and
//! the API stand-in's token review: registered with the pod's token, refreshed with the current
//! certificate and the token file as it is *now* (the kubelet rotates it), not ready until it
//! holds one, serving on while ZTS is away, and resumed from the kept pair after a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::http::Readiness;
use athenz_core::refresh::{Backoff, RefreshPolicy};
use athenz_core::zts::{ZtsClient, ZtsClientConfig};
use athenz_identity_agent::node_identity::{NodeIdentity, NodeIdentitySettings};
use athenz_testbed::fixtures::{AGENT_NAMESPACE, AGENT_PRINCIPAL, PROVIDER};
use athenz_testbed::kube_api::tokens::BoundTokenRequest;
use common::*;
use std::path::Path;
use std::time::Duration;

fn identity(node: &Node, token_file: &Path, keep_dir: Option<&Path>) -> (NodeIdentity, Readiness) {
    identity_as(node, AGENT_PRINCIPAL, token_file, keep_dir)
}

/// The node identity of `principal` on this node, through the ZTS proxy.
fn identity_as(
    node: &Node,
    principal: &str,
    token_file: &Path,
    keep_dir: Option<&Path>,
) -> (NodeIdentity, Readiness) {
    let zts = ZtsClient::new(ZtsClientConfig {
        url: format!("https://127.0.0.1:{}/zts/v1", node.zts_proxy.addr.port()),
        ca: athenz_core::tls::ServerCaBundle::fixed(
            athenz_core::crypto::pem_certificates(node.zts.root_pem()).unwrap(),
        )
        .unwrap(),
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
    })
    .unwrap();
    let readiness = Readiness::default();
    readiness.set(true);
    let identity = NodeIdentity::new(
        NodeIdentitySettings {
            principal: principal.into(),
            provider: PROVIDER.into(),
            dns_suffix: athenz_testbed::fixtures::DNS_SUFFIX.into(),
            node_name: NODE.into(),
            token_file: token_file.to_owned(),
            keep_dir: keep_dir.map(Path::to_owned),
            policy: RefreshPolicy::default(),
            backoff: Backoff::default(),
        },
        zts,
        readiness.clone(),
        &mut prometheus_client::registry::Registry::default(),
    )
    .unwrap();
    (identity, readiness)
}

/// A fresh token of this node's agent pod, as the kubelet writes it.
fn mint(node: &Node) -> String {
    node.kube
        .cluster()
        .mint_token(&BoundTokenRequest {
            namespace: AGENT_NAMESPACE,
            account: "athenz-agent",
            pod_name: &agent_pod_name(),
            pod_uid: None,
            audiences: &["athenz-node".to_owned()],
            expiration_secs: None,
        })
        .unwrap()
        .token
}

/// What ZTS records of this node's agent instance.
fn node_record(node: &Node) -> athenz_testbed::zts::instances::InstanceRecord {
    node.zts
        .instance(&athenz_testbed::zts::instances::InstanceKey {
            provider: PROVIDER.into(),
            domain: "k8s.admin".into(),
            service: "athenz-agent".into(),
            instance_id: NODE.into(),
        })
        .unwrap()
}

fn agent_pod_name() -> String {
    format!("athenz-agent-{NODE}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_then_refreshes_with_the_token_as_it_is_now() {
    let node = node("p256").await;
    let token_file = node.dir.path().join("token-a");
    std::fs::write(&token_file, mint(&node)).unwrap();
    let (id, readiness) = identity(&node, &token_file, None);
    // not ready (and no client certificate) until it holds one
    assert!(!readiness.is_ready());
    assert!(!id.is_valid());
    id.renew_once().await.unwrap();
    assert!(readiness.is_ready() && id.is_valid());
    let first = node_record(&node).current_serial;

    // the kubelet "rotates" the file to something the API server will not authenticate: the
    // refresh reads it and is refused (the old certificate keeps serving)
    std::fs::write(&token_file, "not.a.token").unwrap();
    let err = id.renew_once().await.unwrap_err().to_string();
    assert!(err.contains("node_token"), "{err}");
    assert!(id.is_valid() && readiness.is_ready());
    // an empty, an oversized and a missing token file: refused before anything is sent, named
    for (content, why) in [
        (Some(String::new()), "empty"),
        (Some("a".repeat(20_000)), "over"),
        (None, "No such file"),
    ] {
        match content {
            Some(text) => std::fs::write(&token_file, text).unwrap(),
            None => std::fs::remove_file(&token_file).unwrap(),
        }
        let err = id.renew_once().await.unwrap_err().to_string();
        assert!(err.contains("node token") && err.contains(why), "{err}");
    }
    // a good rotated token: refreshed with the current certificate (a new serial)
    std::fs::write(&token_file, mint(&node)).unwrap();
    id.renew_once().await.unwrap();
    let second = node_record(&node);
    assert_ne!(second.current_serial, first);
    assert_eq!(second.previous_serial.as_deref(), Some(first.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_while_zts_is_away_and_resumes_from_the_kept_pair() {
    let node = node("p256").await;
    let keep = node.dir.path().join("kept");
    let token_file = node.dir.path().join("token-b");
    std::fs::write(&token_file, mint(&node)).unwrap();
    let (id, readiness) = identity(&node, &token_file, Some(&keep));
    id.renew_once().await.unwrap();
    let mode = |f: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(keep.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("node.key.pem"), 0o600);
    assert_eq!(mode("node.cert.pem"), 0o600);

    // ZTS away: renewals fail, the valid certificate keeps serving, readiness holds
    node.zts_proxy.set_down(true).await;
    assert!(id.renew_once().await.is_err());
    assert!(id.is_valid() && readiness.is_ready());

    // a restarted agent, ZTS still away: the kept pair serves at once
    let (restarted, readiness) = identity(&node, &token_file, Some(&keep));
    assert!(!readiness.is_ready());
    assert!(restarted.load_kept());
    assert!(restarted.is_valid() && readiness.is_ready());
    // a kept pair that is not this identity's (another principal) is not used
    let (other, _) = identity_as(&node, "k8s.admin.other-agent", &token_file, Some(&keep));
    assert!(!other.load_kept());
    node.zts_proxy.set_down(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_not_ready_until_zts_answers() {
    let node = node("p256").await;
    node.zts_proxy.set_down(true).await;
    let mut config = node.agent_config.clone();
    config.agent_dir = node.dir.path().join("agent-late");
    let (bound, _) = athenz_identity_agent::start(config, node.shutdown.clone())
        .await
        .unwrap();
    let ready = || async {
        reqwest::get(format!("http://{}/readyz", bound.ops))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(ready().await, 503);
    // a pod asking meanwhile is told to come back (503), not refused
    let id = pod_with_volume(&node, "web-40", &uid(40), "10.1.2.40");
    let err =
        athenz_sia::client::AgentClient::new(bound.socket.clone(), id, Duration::from_secs(10))
            .init()
            .await
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("503") && err.contains("node identity"),
        "{err}"
    );
    node.zts_proxy.set_down(false).await;
    wait_ready(bound.ops).await;
}

/// A pod's request while the agent holds no valid node certificate renews it then and there,
/// rather than wait for the renewal task's backoff (after a long ZTS outage up to a minute, which
/// the pod's own retry would add to). Requests that arrive together share one attempt: ZTS sees
/// one registration for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_asking_without_a_node_identity_renew_it_at_once_in_one_attempt() {
    let node = node("p256").await;
    let token_file = node.dir.path().join("token-d");
    std::fs::write(&token_file, mint(&node)).unwrap();
    let (id, readiness) = identity(&node, &token_file, None);
    let id = std::sync::Arc::new(id);

    // ZTS away: every caller is told no, after one attempt between them
    node.zts_proxy.set_down(true).await;
    let asking = |id: &std::sync::Arc<NodeIdentity>| {
        let id = id.clone();
        tokio::spawn(async move { id.ensure_valid().await })
    };
    let answers: Vec<_> = (0..8).map(|_| asking(&id)).collect();
    for answer in answers {
        assert!(!answer.await.unwrap());
    }
    assert!(!readiness.is_ready());

    // ZTS back: eight pods asking at once, once the failure's backoff has passed (until then
    // they are answered from it), one registration
    node.zts_proxy.set_down(false).await;
    tokio::time::sleep(Backoff::default().delay(0, 1.0)).await;
    let registers = node.zts.requests("register");
    let answers: Vec<_> = (0..8).map(|_| asking(&id)).collect();
    for answer in answers {
        assert!(answer.await.unwrap());
    }
    assert_eq!(node.zts.requests("register") - registers, 1);
    assert!(id.is_valid() && readiness.is_ready());
    // held and valid: asking costs ZTS nothing
    assert!(id.ensure_valid().await);
    assert_eq!(node.zts.requests("register") - registers, 1);
}

/// A pod that hangs up mid-request can neither cancel the node's registration nor make the agent
/// start another: while the agent holds no node certificate and ZTS is slow (300 ms) and failing,
/// 100 requests each abandoned after 50 ms (the client's future dropped, its socket closed) when
/// not answered by then leave ZTS with one register at a time, each run to its end, and each new
/// one at least a backoff step after the last failure.
/// (Broken on purpose: `ensure_valid` awaiting `attempt` itself, as before → 104 registers, two
/// at once, most ended after 50 ms; `not_before` never set → "register 1 started 4 ms after
/// failure 0, within a backoff step 250 ms".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_hang_up_cannot_stack_node_registrations() {
    const SLOW: Duration = Duration::from_millis(300);
    let node = node("p256").await;
    node.zts.registers().set_delay(SLOW);
    node.zts
        .set_instance_fault(Some(http::StatusCode::SERVICE_UNAVAILABLE));
    let since = std::time::Instant::now();
    let mut config = node.agent_config.clone();
    config.agent_dir = node.dir.path().join("agent-hangups");
    let (bound, _) = athenz_identity_agent::start(config, node.shutdown.clone())
        .await
        .unwrap();
    let id = pod_with_volume(&node, "web-41", &uid(41), "10.1.2.41");
    let client =
        athenz_sia::client::AgentClient::new(bound.socket.clone(), id, Duration::from_secs(10));
    // each request either hangs up after 50 ms (an attempt is under way) or is told at once to
    // come back (the last failure's backoff lasts); one request every 50 ms either way
    let mut hung_up = 0;
    for _ in 0..100 {
        let asked = tokio::time::Instant::now();
        match tokio::time::timeout(Duration::from_millis(50), client.init()).await {
            Err(_) => hung_up += 1,
            Ok(answer) => {
                let err = answer.unwrap_err().to_string();
                assert!(
                    err.contains("503") && err.contains("node identity"),
                    "{err}"
                );
                tokio::time::sleep_until(asked + Duration::from_millis(50)).await;
            }
        }
    }
    assert!(hung_up >= 5, "only {hung_up} requests hung up mid-request");
    // the last attempt ends
    tokio::time::sleep(SLOW * 2).await;

    let calls: Vec<_> = node
        .zts
        .registers()
        .calls()
        .into_iter()
        .filter(|c| c.started >= since)
        .collect();
    // each register as (start, length) in ms since the agent started
    let shown: Vec<_> = calls
        .iter()
        .take(12)
        .map(|c| {
            (
                (c.started - since).as_millis(),
                (c.ended - c.started).as_millis(),
            )
        })
        .collect();
    let calls_shown = format!("{} registers, the first: {shown:?}", calls.len());
    assert!(
        calls.len() >= 2,
        "5 s of pods asking made the agent try more than once: {calls_shown}"
    );
    assert_eq!(node.zts.registers().most_at_once(), 1, "{calls_shown}");
    for call in &calls {
        assert!(
            call.ended - call.started >= SLOW,
            "a register was abandoned: {calls_shown}"
        );
    }
    // at least one backoff step (its shortest: the first, without jitter) between a failure and
    // the next attempt, whoever made them
    let step = Backoff::default().delay(0, 0.0);
    for (failure, pair) in calls.windows(2).enumerate() {
        let gap = pair[1].started - pair[0].ended;
        assert!(
            gap >= step,
            "register {} started {gap:?} after failure {failure}, within a backoff step {step:?}",
            failure + 1
        );
    }
    println!("{hung_up} of 100 requests hung up mid-request; {calls_shown}");
    node.zts.set_instance_fault(None);
    node.zts.registers().set_delay(Duration::ZERO);
}
