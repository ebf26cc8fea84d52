//! `cargo bench -p athenz-core`: the cryptography and file work every identity costs.
//!
//! Key generation, CSR building, ntoken sign/verify, a mutual-TLS handshake on loopback, the
//! atomic file-set swap — the operations docs/benchmarks.md compares with the crates' own costs —
//! and, as root, the mounts and files of one CSI files-mode volume's life: the node's share of an
//! identity that no implementation of docs/design.md §4.10 can avoid.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, PublicKey, build_csr};
use athenz_core::files::{FileSet, FileSpec};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::ntoken::{NToken, NTokenBuilder, VerifyLimits};
use athenz_core::subject::PodSubject;
use athenz_core::tls::{self, ClientIdentity, ReloadingIdentity};
use athenz_core::volume::{NodeKey, VolumeId};
use criterion::{Criterion, criterion_group, criterion_main};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::HandshakeKind;
use rustls_pki_types::ServerName;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

fn pod_identity() -> CsrIdentity {
    CsrIdentity::for_pod(&PodIdentityInput {
        domain: "media.sports",
        service: "web",
        provider: "k8s.admin.athenz-callback",
        dns_suffix: "athenz.cloud",
        instance_id: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
        pod_ip: Some("10.1.2.3".parse().unwrap()),
        service_ip: None,
    })
    .unwrap()
}

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keygen");
    g.bench_function("p256", |b| {
        b.iter(|| PrivateKey::generate(KeyAlgorithm::P256).unwrap())
    });
    g.sample_size(20).measurement_time(Duration::from_secs(8));
    g.bench_function("rsa2048", |b| {
        b.iter(|| PrivateKey::generate(KeyAlgorithm::Rsa2048).unwrap())
    });
    g.finish();
}

fn csr(c: &mut Criterion) {
    let identity = pod_identity();
    let mut g = c.benchmark_group("csr");
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PrivateKey::generate(alg).unwrap();
        g.bench_function(alg.to_string(), |b| {
            b.iter(|| build_csr(black_box(&identity), &key).unwrap())
        });
    }
    g.bench_function("identity_builder", |b| b.iter(pod_identity));
    g.finish();
}

fn ntoken(c: &mut Criterion) {
    let builder = NTokenBuilder {
        domain: "k8s.admin".into(),
        service: "athenz-callback".into(),
        host: None,
        key_version: "v1".into(),
        key_service: None,
        lifetime: time::Duration::hours(1),
    };
    let now = OffsetDateTime::now_utc();
    let mut g = c.benchmark_group("ntoken");
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PrivateKey::generate(alg).unwrap();
        let public = PublicKey::from_spki_der(&key.public_key_der()).unwrap();
        let token = builder.sign(&key, now).unwrap();
        g.bench_function(format!("sign_{alg}"), |b| {
            b.iter(|| builder.sign(&key, now).unwrap())
        });
        g.bench_function(format!("parse_verify_{alg}"), |b| {
            b.iter(|| {
                NToken::parse(black_box(token.expose()))
                    .unwrap()
                    .verify(&public, now, VerifyLimits::default())
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn ids(c: &mut Criterion) {
    let key = NodeKey::from_bytes([7; 32]);
    let dir = "/var/lib/kubelet/pods/0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c/volumes/athenz~volume-driver/athenz-identity";
    let uri = "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";
    let mut g = c.benchmark_group("ids");
    g.bench_function("volume_id_hmac", |b| {
        b.iter(|| VolumeId::for_mount_dir(&key, black_box(dir)))
    });
    g.bench_function("subject_parse", |b| {
        b.iter(|| PodSubject::parse_uri(black_box(uri)).unwrap())
    });
    g.finish();
}

/// A CA, a server pair on disk and a client pair, made with rcgen directly (the test PKI lives in
/// athenz-testbed, which depends on this crate).
struct Pki {
    _dir: tempfile::TempDir,
    ca_der: Vec<rustls_pki_types::CertificateDer<'static>>,
    server: Arc<ReloadingIdentity>,
    client: ClientIdentity,
    client_chain: Vec<rustls_pki_types::CertificateDer<'static>>,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Bench Root");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let now = OffsetDateTime::now_utc();
    ca_params.not_before = now - time::Duration::hours(1);
    ca_params.not_after = now + time::Duration::days(1);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |cn: &str, dns: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(dns).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(1);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let dir = tempfile::tempdir().unwrap();
    let (server_cert, server_key) = leaf("k8s.admin.athenz-callback", vec!["localhost".into()]);
    std::fs::write(dir.path().join("s.pem"), server_cert).unwrap();
    std::fs::write(dir.path().join("s.key"), server_key).unwrap();
    let server =
        ReloadingIdentity::load(dir.path().join("s.pem"), dir.path().join("s.key")).unwrap();
    let (client_cert, client_key) = leaf("k8s.admin.athenz-zts", Vec::new());
    let client_chain = athenz_core::crypto::pem_certificates(&client_cert).unwrap();
    let client =
        ClientIdentity::Fixed(tls::certified_key_from_pem(&client_cert, &client_key).unwrap());
    Pki {
        _dir: dir,
        ca_der: vec![ca_cert.der().clone()],
        server,
        client,
        client_chain,
    }
}

/// A mutual-TLS handshake over loopback, both ends in this process, the server configured as
/// every daemon's (`tls::server_config`): TLS 1.3 full (the agents' and the API server's
/// clients), and TLS 1.2 as ZTS calls the callback, full and resumed (ZTS's one `SSLContext`
/// resumes, docs/design.md §4.4). Each checks that its handshakes are of the kind it names.
fn handshake(c: &mut Criterion) {
    athenz_core::install_crypto_provider();
    let pki = pki();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server_config = tls::server_config(pki.server.clone(), &pki.ca_der).unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(server_config.config()));
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    black_box(tls::peer_principal(tls.get_ref().1));
                }
            });
        }
    });
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls13 = tls::client_config(&pki.ca_der, Some(pki.client.clone())).unwrap();
    tls13.resumption = rustls::client::Resumption::disabled();
    let as_zts = |resumption: rustls::client::Resumption| {
        let mut config = tls::client_config_expecting_cn_only(
            &pki.ca_der,
            Some(pki.client.clone()),
            "k8s.admin.athenz-callback",
            &[&rustls::version::TLS12],
        )
        .unwrap();
        config.resumption = resumption;
        config
    };
    let cases = [
        ("tls/mutual_handshake_loopback", tls13, HandshakeKind::Full),
        (
            "tls/tls12_as_zts_full",
            as_zts(rustls::client::Resumption::disabled()),
            HandshakeKind::Full,
        ),
        (
            "tls/tls12_as_zts_resumed",
            as_zts(rustls::client::Resumption::default()),
            HandshakeKind::Resumed,
        ),
    ];
    for (bench, config, kind) in cases {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let connect = || {
            rt.block_on(async {
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let tls = connector.connect(name.clone(), tcp).await.unwrap();
                tls.get_ref().1.handshake_kind()
            })
        };
        // the first handshake of a resuming client is full: it makes the session
        connect();
        assert_eq!(connect(), Some(kind), "{bench}");
        c.bench_function(bench, |b| b.iter(connect));
    }
    // what a server adds to each resumed handshake before it serves (docs/design.md §6): the
    // client's chain verified again, now, by the config's verifier (the same WebPKI client
    // verification, here through the agent's check of a presented pair)
    let again = tls::IssuerCheck::new(&pki.ca_der).unwrap();
    again.check(&pki.client_chain).unwrap();
    c.bench_function("tls/resumed_client_verified_again", |b| {
        b.iter(|| again.check(black_box(&pki.client_chain)).unwrap())
    });
}

/// A pod's credential set: key, certificate, CA bundle and ntoken, of their usual sizes.
struct CredentialContents {
    key: Vec<u8>,
    cert: Vec<u8>,
    ca: Vec<u8>,
    token: Vec<u8>,
}

impl CredentialContents {
    fn sized_as_a_pod_s() -> Self {
        Self {
            key: vec![b'k'; 250],
            cert: vec![b'c'; 1800],
            ca: vec![b'a'; 1200],
            token: vec![b't'; 400],
        }
    }

    fn specs(&self) -> [FileSpec<'_>; 4] {
        [
            ("service.key.pem", &self.key, 0o600),
            ("service.cert.pem", &self.cert, 0o644),
            ("ca.cert.pem", &self.ca, 0o644),
            ("ntoken", &self.token, 0o600),
        ]
        .map(|(name, contents, mode)| FileSpec {
            name,
            contents,
            mode,
        })
    }
}

fn file_set(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let set = FileSet::new(dir.path().join("out"));
    let contents = CredentialContents::sized_as_a_pod_s();
    let files = contents.specs();
    c.bench_function("files/swap_4_files_fsync", |b| {
        b.iter(|| set.write(&files, None).unwrap())
    });
}

/// The same set on tmpfs, where a files-mode volume's set lives: the first set in a fresh
/// directory (every publish) and a swap over an earlier one (every rotation). Mounts a tmpfs, so
/// only as root; otherwise it says so and measures nothing.
fn file_set_on_tmpfs(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("files/*_tmpfs: not root, so not measured (it mounts a tmpfs)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    nix::mount::mount(
        Some("bench"),
        tmp.path(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=256m"),
    )
    .unwrap();
    let contents = CredentialContents::sized_as_a_pod_s();
    let files = contents.specs();
    let set = FileSet::new(tmp.path().join("out"));
    c.bench_function("files/swap_4_files_tmpfs", |b| {
        b.iter(|| set.write(&files, None).unwrap())
    });
    let fresh = tmp.path().join("fresh");
    let mut made = 0u64;
    c.bench_function("files/first_set_tmpfs", |b| {
        b.iter_batched(
            || {
                // each set is new in its own directory; the old ones are cleared outside the timing
                if made.is_multiple_of(1000) {
                    let _ = std::fs::remove_dir_all(&fresh);
                    std::fs::create_dir(&fresh).unwrap();
                }
                made += 1;
                let dir = fresh.join(made.to_string());
                std::fs::create_dir(&dir).unwrap();
                FileSet::new(dir)
            },
            |set| set.write(&files, None).unwrap(),
            criterion::BatchSize::SmallInput,
        )
    });
    nix::mount::umount2(tmp.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
}

/// One files-mode volume from publish to unpublish, without its identity: the tmpfs, `data.json`,
/// the first credential set, the agent's `state.json` and `status.json`, the read-only bind at
/// the target, and the unmount and removal
/// (docs/design.md §4.10). Real mounts, so only as root; otherwise it says so and measures nothing.
fn files_volume_lifecycle(c: &mut Criterion) {
    use athenz_core::pod_info::PodInfo;
    use athenz_core::volume::{CsiVolume, VolumeStatusRecord, VolumesDir};
    use athenz_core::volume_mode::VolumeMode;
    use athenz_core::volume_mount::files_mode;
    use athenz_core::volume_mount::{HostDirs, VolumeRequest, unmount_volume};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("files_mode/volume_lifecycle: not root, so not measured (it makes real mounts)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let host = HostDirs::new(VolumesDir::new(root.join("volumes")), root.join("agent"));
    std::fs::create_dir(&host.agent).unwrap();
    host.volumes.ensure().unwrap();
    // kubelet makes the target's parent; the driver makes the target itself
    let pod_dir =
        root.join("pods/0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c/volumes/kubernetes.io~csi/athenz");
    std::fs::create_dir_all(&pod_dir).unwrap();
    let target = pod_dir.join("mount");
    let target_text = target.to_str().unwrap().to_owned();
    let request = VolumeRequest {
        pod: PodInfo {
            namespace: "media-sports".into(),
            pod_name: "web".into(),
            pod_uid: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c".into(),
            service_account: "web".into(),
        },
        read_write: false,
        csi: Some(CsiVolume {
            volume_id: "csi-0123".into(),
            mode: VolumeMode::CsiFiles,
            group: None,
            ip_san: false,
        }),
    };
    let contents = CredentialContents::sized_as_a_pod_s();
    let files = contents.specs();
    let state = serde_json::json!({
        "provider": "k8s.admin.athenz-k8s-identity",
        "instanceId": "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
        "domain": "media-sports",
        "service": "web",
        "podUid": "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
        "certSerial": "3f2a9c0d8e7b6a5f4e3d2c1b0a998877",
        "certExpiry": "2026-11-30T10:00:00Z",
        "updatedAt": "2026-11-29T10:00:00Z",
        "keySource": "agent"
    });
    let next_refresh = time::OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let lifecycle = || {
        std::fs::create_dir(&target).unwrap();
        let pending = files_mode::begin(
            &host,
            &target_text,
            &request,
            files_mode::DEFAULT_FILES_TMPFS_BYTES,
        )
        .unwrap();
        FileSet::new(pending.files_dir())
            .write(&files, None)
            .unwrap();
        // the agent's two records, as a publish writes them: its refresh state and the
        // operator's status (when it re-issues next)
        let paths = pending.paths().clone();
        athenz_core::volume::write_json_record(&paths.state_json, &state).unwrap();
        VolumeStatusRecord::update(&paths.status_json, |r| r.next_refresh = Some(next_refresh))
            .unwrap();
        pending.publish().unwrap();
        unmount_volume(&host, &target_text).unwrap();
        std::fs::remove_dir(&target).unwrap();
    };
    // Wall time includes the unmounts' waits for RCU grace periods, which cost no CPU; the CPU
    // time is what the node pays per volume, so it is measured apart.
    c.bench_function("files_mode/volume_lifecycle", |b| b.iter(lifecycle));
    c.bench_function("files_mode/volume_lifecycle_thread_cpu", |b| {
        b.iter_custom(|iters| {
            let before = thread_cpu();
            for _ in 0..iters {
                lifecycle();
            }
            thread_cpu().saturating_sub(before)
        })
    });
}

/// CPU time of the calling thread, user and kernel (`/proc/thread-self/schedstat`, in ns).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    let ns: u64 = stat.split(' ').next().unwrap().parse().unwrap();
    Duration::from_nanos(ns)
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = keys, csr, ntoken, ids, handshake, file_set, file_set_on_tmpfs, files_volume_lifecycle
}
criterion_main!(benches);
