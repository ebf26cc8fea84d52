//! A ZTS outage longer than the certificates live, seen from a pod's refresh sidecar: the real
//! `athenz-sia refresh`, the real agent, jwt-service and callback, and the dev ZTS behind a proxy
//! the test cuts. When ZTS answers again, both the pod's certificate and the agent's own node
//! certificate have expired; the sidecar's first attempt after that must give the pod a valid
//! identity, not spend a backoff step learning that the agent has none yet (chaos `zts-stopped`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::{CertInfo, KeyAlgorithm};
use athenz_core::daemon::Shutdown;
use athenz_core::files::{CERT_FILE, Credentials, FileSet, KEY_FILE, credential_files};
use athenz_core::secret::Secret;
use athenz_testbed::pki::LeafSpec;
use common::*;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

/// Longest the test waits for anything.
const WAIT: Duration = Duration::from_secs(30);
/// What the sidecar logs when an attempt fails, and when one succeeds (sia/src/run.rs).
const FAILED: &str = "refresh failed";
const RENEWED: &str = "identity refreshed";

/// The sidecar's stderr, line by line, with the instant each line was read.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Instant, String)>>>);

impl Log {
    fn follow(&self, stderr: tokio::process::ChildStderr) {
        let lines = self.0.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                lines.lock().unwrap().push((Instant::now(), line));
            }
        });
    }

    /// Lines read after `since` that contain `needle`.
    fn after(&self, since: Instant, needle: &str) -> Vec<(Instant, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, line)| *at > since && line.contains(needle))
            .cloned()
            .collect()
    }

    async fn wait_for(&self, since: Instant, needle: &str) -> Instant {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some((at, _)) = self.after(since, needle).first() {
                    return *at;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the sidecar never logged {needle:?}: {}", self.text()))
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap();
        lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Replaces the pod's set with one whose certificate (same names, signed by ZTS's CA) expired a
/// minute ago, as a set left from before a long outage is.
fn expire_the_pods_set(node: &Node, out: &Path) -> CertInfo {
    let issued =
        CertInfo::from_pem(&std::fs::read_to_string(out.join(CERT_FILE)).unwrap()).unwrap();
    let spec = LeafSpec {
        common_name: issued.common_name.clone(),
        organizational_units: issued.organizational_units.clone(),
        dns_names: issued.dns_names.clone(),
        ip_addresses: issued.ip_addresses.clone(),
        uris: issued.uris.clone(),
        emails: Vec::new(),
        validity: -time::Duration::minutes(1),
        backdate: time::Duration::minutes(2),
    };
    let expired = node.zts.ca().issue(&spec, KeyAlgorithm::P256).unwrap();
    let ntoken = Secret::new(std::fs::read_to_string(out.join("ntoken")).unwrap());
    let creds = Credentials {
        key_pem: Some(&expired.key_pem),
        cert_pem: &expired.chain_pem,
        ca_pem: node.zts.root_pem(),
        ntoken: &ntoken,
    };
    FileSet::new(out)
        .write(&credential_files(&creds, None), None)
        .unwrap();
    CertInfo::from_pem(&expired.cert_pem).unwrap()
}

/// The agent's failed node registrations so far (its /metrics).
async fn node_registrations_failed(ops: SocketAddr) -> f64 {
    metric(
        ops,
        r#"athenz_agent_node_identity_renewals_total{kind="register",outcome="error"}"#,
    )
    .await
}

/// After an outage longer than every certificate's life: the pod's set and the agent's node
/// certificate have both run out. The agent here is one that started during the outage and
/// has been failing to register its node identity long enough that its own next attempt is
/// 8–16 s away (the sixth backoff step); the sidecar has just started and retries within a
/// second. ZTS comes back right after one of the sidecar's failures. Its next attempt must
/// give the pod a valid identity: one backoff step of its own, not its step plus the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_whose_certificate_expired_while_zts_was_away_renews_at_its_first_attempt_after()
{
    let node = node_pod_keys().await;
    let id = pod_with_volume(&node, "web-9", &uid(9), "10.1.4.9");
    let out = node.dir.path().join("out-web-9");
    let init = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );

    node.zts_proxy.set_down(true).await;
    let expired = expire_the_pods_set(&node, &out);
    let mut config = node.agent_config.clone();
    config.agent_dir = node.dir.path().join("agent-2");
    let agent_shutdown = Shutdown::new();
    let (agent, _) = athenz_identity_agent::start(config, agent_shutdown.clone())
        .await
        .unwrap();
    // the agent's renewal task fails six times in a row: 0.25–0.5 s, 0.5–1, 1–2, 2–4, 4–8 s
    // apart, and 8–16 s until its seventh attempt
    tokio::time::timeout(Duration::from_secs(40), async {
        while node_registrations_failed(agent.ops).await < 6.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agent's node registrations did not fail six times while ZTS was away");

    let socket = agent.socket.display().to_string();
    let mut sidecar = sia(&node, "refresh", &id, &out, &[("ENDPOINT", &socket)])
        .await
        .spawn()
        .unwrap();
    let log = Log::default();
    log.follow(sidecar.stderr.take().unwrap());
    let started = Instant::now();
    log.wait_for(started, FAILED).await;
    assert!(
        !log.after(started, "no valid node identity").is_empty(),
        "the sidecar's failure does not name the agent's missing node identity:\n{}",
        log.text()
    );
    // ZTS answers again while the sidecar waits its first backoff step (0.25–0.5 s)
    node.zts_proxy.set_down(false).await;
    let back = Instant::now();

    let renewed_at = log.wait_for(back, RENEWED).await;
    let failed_after: Vec<_> = log
        .after(back, FAILED)
        .into_iter()
        .filter(|(at, _)| *at < renewed_at)
        .collect();
    assert!(
        failed_after.is_empty(),
        "attempts failed after ZTS answered again, before the pod was renewed: {failed_after:?}\n{}",
        log.text()
    );
    let renewed =
        CertInfo::from_pem(&std::fs::read_to_string(out.join(CERT_FILE)).unwrap()).unwrap();
    assert_ne!(renewed.serial_hex, expired.serial_hex);
    assert!(renewed.is_valid_at(time::OffsetDateTime::now_utc()));
    assert_eq!(renewed.common_name, expired.common_name);
    assert_eq!(renewed.uris, expired.uris);
    // the pod's new key, not the expired set's, is on disk with the new certificate
    let key = athenz_core::crypto::PrivateKey::from_pem(
        &std::fs::read_to_string(out.join(KEY_FILE)).unwrap(),
    )
    .unwrap();
    assert!(athenz_core::crypto::key_matches_cert(&key, &renewed));
    sidecar.kill().await.unwrap();
    agent_shutdown.trigger();
}
