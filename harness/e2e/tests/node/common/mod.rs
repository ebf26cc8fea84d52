//! A whole node on loopback for the node-path tests and benchmarks: the dev ZTS (behind a proxy
//! the test can cut), the Kubernetes API and kubelet stand-ins, the real jwt-service and callback
//! over mutual TLS, and the real agent on its Unix socket. Volumes are made with athenz-core's
//! layout, as the flex driver makes them (the driver's own tests cover the mounts).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod authz;

use athenz_core::agent_api::KeySource;
use athenz_core::daemon::Shutdown;
use athenz_core::volume::{VolumeData, VolumeId, VolumesDir, write_json_file};
use athenz_testbed::fixtures::{self, PROVIDER};
use athenz_testbed::kube_api::{KubeApi, running_pod};
use athenz_testbed::kubelet::Kubelet;
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use clap::Parser;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const NODE: &str = "node-1";

/// A TCP proxy in front of ZTS that can be cut (new connections refused, open ones closed at
/// once, as when ZTS goes away) and restored.
pub struct Proxy {
    pub addr: SocketAddr,
    down: tokio::sync::watch::Sender<bool>,
    /// Connections being forwarded now.
    open: Arc<AtomicUsize>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (down, watch) = tokio::sync::watch::channel(false);
        let open = Arc::new(AtomicUsize::new(0));
        let counter = open.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if *watch.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut watch = watch.clone();
                let open = counter.clone();
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = watch.wait_for(|down| *down) => {}
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self { addr, down, open }
    }

    /// Cuts (`true`) or restores (`false`) ZTS; when cutting, every open connection is closed
    /// before this returns (within 5 s).
    pub async fn set_down(&self, down: bool) {
        self.down.send_replace(down);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while down && self.open.load(Ordering::SeqCst) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "ZTS connections not closed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

pub struct Node {
    pub dir: tempfile::TempDir,
    pub zts: DevZts,
    pub zts_proxy: Proxy,
    pub kube: KubeApi,
    pub kubelet: Kubelet,
    pub volumes: VolumesDir,
    pub socket: PathBuf,
    pub jwt_ops: SocketAddr,
    pub callback_ops: SocketAddr,
    pub agent_ops: SocketAddr,
    pub public_keys: PathBuf,
    pub shutdown: Shutdown,
    pub jwt_shutdown: Shutdown,
    pub agent_config: athenz_identity_agent::Config,
    /// The agent's arguments other than its directories (to start more agents).
    pub agent_args: Vec<String>,
    /// The agent's `--key-source`, which [`sia`] gives the SIA too.
    pub key_source: KeySource,
    /// Registrations the callback confirmed before any pod asked (the agent's own node identity).
    pub node_registers: f64,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.trigger();
        self.jwt_shutdown.trigger();
    }
}

/// Everything up and wired; `key_algorithm` is the agent's `--key-algorithm`. The agent makes
/// the pods' keys (`--key-source agent`): most tests here drive the socket API by hand with a
/// key pair; [`node_pod_keys`] runs the default, pod-made keys.
pub async fn node(key_algorithm: &str) -> Node {
    node_with(key_algorithm, DevZtsConfig::default()).await
}

/// [`node`] with a dev ZTS configured by `zts_config`.
pub async fn node_with(key_algorithm: &str, zts_config: DevZtsConfig) -> Node {
    node_full(key_algorithm, zts_config, KeySource::Agent).await
}

/// Everything up and wired, the agent and the SIA making keys as `key_source` says.
pub async fn node_pod_keys() -> Node {
    node_full("p256", DevZtsConfig::default(), KeySource::Pod).await
}

async fn node_full(key_algorithm: &str, zts_config: DevZtsConfig, key_source: KeySource) -> Node {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let zts = DevZts::start(zts_config).await.unwrap();
    let zts_proxy = Proxy::start(zts.addr()).await;
    let kube = KubeApi::start().await.unwrap();
    let kubelet = Kubelet::start(kube.cluster().clone(), NODE).await.unwrap();
    let shutdown = Shutdown::new();
    let jwt_shutdown = Shutdown::new();
    let ca = zts.ca_path();
    let cert = |name: &str, cn: &str| {
        zts.ca()
            .write_service_cert(
                d,
                name,
                &LeafSpec {
                    ip_addresses: vec![[127, 0, 0, 1].into()],
                    ..LeafSpec::service(cn, &["localhost"])
                },
            )
            .unwrap()
    };

    // jwt-service
    let keys = d.join("jwt-keys");
    std::fs::create_dir(&keys).unwrap();
    let signing =
        athenz_core::crypto::PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256).unwrap();
    std::fs::write(
        keys.join("v1.pem"),
        signing.to_pkcs8_pem().unwrap().expose(),
    )
    .unwrap();
    let public_keys = d.join("jwt-public");
    std::fs::create_dir(&public_keys).unwrap();
    std::fs::write(
        public_keys.join("v1.pem"),
        signing.key_pair().public_key_pem(),
    )
    .unwrap();
    let jwt_files = cert("jwt", "k8s.admin.athenz-jwt-service");
    let (jwt, _) = athenz_jwt_service::start(
        athenz_jwt_service::Config::try_parse_from([
            "athenz-jwt-service",
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
            &format!("--tls-cert={}", jwt_files.cert.display()),
            &format!("--tls-key={}", jwt_files.key.display()),
            &format!("--client-ca={}", ca.display()),
            &format!("--allowed-principals={}", fixtures::AGENT_PRINCIPAL),
            &format!("--keys-dir={}", keys.display()),
            &format!("--provider={PROVIDER}"),
        ])
        .unwrap(),
        jwt_shutdown.clone(),
    )
    .await
    .unwrap();

    // callback
    let cb_files = cert("callback", PROVIDER);
    let (callback, _) = athenz_callback::start(
        athenz_callback::Config::try_parse_from([
            "athenz-callback",
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
            &format!("--tls-cert={}", cb_files.cert.display()),
            &format!("--tls-key={}", cb_files.key.display()),
            &format!("--client-ca={}", ca.display()),
            "--allowed-principals=sys.auth.zts",
            &format!("--provider={PROVIDER}"),
            &format!("--public-keys-dir={}", public_keys.display()),
            "--keys-reload-interval=1s",
            &format!("--dns-suffix={}", fixtures::DNS_SUFFIX),
            &format!("--admin-domain={}", fixtures::ADMIN_DOMAIN),
            &format!("--kube-api-url={}", kube.url()),
            // the API stand-in serves no watch
            "--pod-cache=false",
            "--replay-cache-size=1000000",
        ])
        .unwrap(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    zts.add_provider(ProviderEntry {
        name: PROVIDER.into(),
        endpoint: format!("https://127.0.0.1:{}", callback.api.port()),
        dns_suffixes: vec![fixtures::DNS_SUFFIX.into()],
        launch: vec!["*".into()],
    })
    .unwrap();

    // agent: its pod on this node, and that pod's projected token (its node identity's attestation)
    let (_, token) = kube.cluster().start_node_agent(NODE).unwrap();
    let node_token = d.join("node-token");
    std::fs::write(&node_token, &token.token).unwrap();
    let agent_dir = d.join("agent");
    let volumes_dir = d.join("volumes");
    let agent_args = vec![
        format!("--kubelet-url={}", kubelet.url()),
        "--pod-wait=3s".to_owned(),
        format!("--jwt-service-url=https://127.0.0.1:{}", jwt.api.port()),
        format!("--node-name={NODE}"),
        format!("--node-token-file={}", node_token.display()),
        // the test process plays every pod; the peer check has its own tests
        "--peer-check=off".to_owned(),
        format!("--jwt-service-ca={}", ca.display()),
        format!(
            "--zts-url=https://127.0.0.1:{}/zts/v1",
            zts_proxy.addr.port()
        ),
        format!("--zts-ca={}", ca.display()),
        format!("--provider={PROVIDER}"),
        format!("--dns-suffix={}", fixtures::DNS_SUFFIX),
        format!("--admin-domain={}", fixtures::ADMIN_DOMAIN),
        format!("--key-algorithm={key_algorithm}"),
        format!("--key-source={key_source}"),
        "--ops-listen=127.0.0.1:0".to_owned(),
        "--upstream-timeout=5s".to_owned(),
    ];
    let agent_config = athenz_identity_agent::Config::try_parse_from(
        [
            "athenz-identity-agent".to_owned(),
            format!("--agent-dir={}", agent_dir.display()),
            format!("--volumes-dir={}", volumes_dir.display()),
        ]
        .into_iter()
        .chain(agent_args.iter().cloned()),
    )
    .unwrap();
    let (agent, _) = athenz_identity_agent::start(agent_config.clone(), shutdown.clone())
        .await
        .unwrap();
    wait_ready(agent.ops).await;
    let node_registers = metric(
        callback.ops,
        r#"athenz_callback_decisions_total{route="instance",outcome="allow",check="none"}"#,
    )
    .await;
    Node {
        node_registers,
        volumes: VolumesDir::new(&volumes_dir),
        socket: agent.socket.clone(),
        jwt_ops: jwt.ops,
        callback_ops: callback.ops,
        agent_ops: agent.ops,
        public_keys,
        zts,
        zts_proxy,
        kube,
        kubelet,
        dir,
        shutdown,
        jwt_shutdown,
        agent_config,
        agent_args,
        key_source,
    }
}

/// Waits (up to 20 s) for a daemon's `/readyz` to answer 200: the agent is ready once it holds
/// its node identity.
pub async fn wait_ready(ops: SocketAddr) {
    let url = format!("http://{ops}/readyz");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if reqwest::get(&url).await.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{url} not ready within 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A running pod on this node and its volume, as the driver would make it; returns the volume id.
pub fn pod_with_volume(node: &Node, name: &str, uid: &str, ip: &str) -> VolumeId {
    node.kube.cluster().put_pod(running_pod(
        fixtures::NAMESPACE,
        name,
        uid,
        fixtures::SERVICE,
        ip,
        NODE,
    ));
    volume_for(node, name, uid)
}

/// A volume for pod `name`/`uid` (the pod itself is not created).
pub fn volume_for(node: &Node, name: &str, uid: &str) -> VolumeId {
    volume_in(&node.volumes, name, uid)
}

/// A volume for pod `name`/`uid` in `volumes`, as the driver makes it.
pub fn volume_in(volumes: &VolumesDir, name: &str, uid: &str) -> VolumeId {
    let key = volumes.load_or_create_node_key().unwrap();
    let mount_dir =
        format!("/var/lib/kubelet/pods/{uid}/volumes/athenz~volume-driver/athenz-identity");
    let id = VolumeId::for_mount_dir(&key, &mount_dir);
    let paths = volumes.volume(&id);
    std::fs::create_dir_all(&paths.mount).unwrap();
    std::fs::write(&paths.id_file, format!("{id}\n")).unwrap();
    write_json_file(
        &paths.data_json,
        &VolumeData {
            namespace: fixtures::NAMESPACE.into(),
            pod_name: name.into(),
            pod_uid: uid.into(),
            service_account: fixtures::SERVICE.into(),
            mount_dir,
            read_write: false,
            created_at: time::OffsetDateTime::now_utc(),
            csi: None,
        },
        0o600,
    )
    .unwrap();
    id
}

/// A uid for pod number `n`.
pub fn uid(n: usize) -> String {
    format!("0b6e4c1e-8f57-4d5e-9a51-{n:012x}")
}

/// A metric's value from a /metrics page (0 when absent).
pub async fn metric(ops: SocketAddr, line_start: &str) -> f64 {
    let text = reqwest::get(format!("http://{ops}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(line_start)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// Pod registers confirmed so far (the callback's allow count on /instance, less the agent's own).
pub async fn registers(node: &Node) -> f64 {
    metric(
        node.callback_ops,
        r#"athenz_callback_decisions_total{route="instance",outcome="allow",check="none"}"#,
    )
    .await
        - node.node_registers
}

/// Confirmations of refreshes so far.
pub async fn refreshes(node: &Node) -> f64 {
    metric(
        node.callback_ops,
        r#"athenz_callback_decisions_total{route="refresh",outcome="allow",check="none"}"#,
    )
    .await
}

/// JWTs signed so far.
pub async fn jwts(node: &Node) -> f64 {
    metric(
        node.jwt_ops,
        r#"athenz_jwt_service_jwts_issued_total{alg="ES256"}"#,
    )
    .await
}

/// A raw HTTP/1.1 exchange on the agent socket (for requests a client library would not send).
pub async fn raw(socket: &std::path::Path, request: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// The `athenz-sia` binary under test.
pub static SIA: std::sync::LazyLock<std::path::PathBuf> =
    std::sync::LazyLock::new(|| athenz_testbed::bins::built("athenz-sia"));

/// `athenz-sia <verb>` for volume `id` of `node`, writing into `out`, with `extra` environment
/// (output piped, killed when dropped).
pub async fn sia(
    node: &Node,
    verb: &str,
    id: &VolumeId,
    out: &Path,
    extra: &[(&str, &str)],
) -> tokio::process::Command {
    let paths = node.volumes.volume(id);
    let mut cmd = tokio::process::Command::new(&*SIA);
    cmd.arg(verb)
        .env("ID_FILE", &paths.id_file)
        .env("ENDPOINT", &node.socket)
        .env("OUT_DIR", out)
        .env("INIT_TIMEOUT", "20s")
        .env("KEY_SOURCE", node.key_source.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// A free loopback port (a process started next binds it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A client of `node`'s agent socket for volume `id`, as the SIA makes one.
pub fn client(node: &Node, id: &VolumeId) -> athenz_sia::client::AgentClient {
    athenz_sia::client::AgentClient::new(
        node.socket.clone(),
        id.clone(),
        std::time::Duration::from_secs(30),
    )
}
