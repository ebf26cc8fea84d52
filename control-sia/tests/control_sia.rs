//! The real `athenz-control-sia` binary against the development ZTS: every key format, the
//! failures it must surface, the ntoken rewritten before it expires, files kept when ZTS is down,
//! SIGTERM, and outputs judged by `openssl verify`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_control_sia::{ControlSia, Settings};
use athenz_core::crypto::{CertInfo, PublicKey, pem_certificates};
use athenz_core::ntoken::{NToken, VerifyLimits};
use athenz_testbed::openssl;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_athenz-control-sia");
const PRINCIPAL: &str = "k8s.admin.athenz-callback";

/// Key formats, each made by openssl: (name, openssl genkey args, PEM header).
const FORMATS: [(&str, &[&str], &str); 4] = [
    (
        "ec-pkcs8",
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ],
        "BEGIN PRIVATE KEY",
    ),
    (
        "ec-sec1",
        &["ecparam", "-name", "prime256v1", "-genkey", "-noout"],
        "BEGIN EC PRIVATE KEY",
    ),
    (
        "rsa-pkcs1",
        &["genrsa", "-traditional", "2048"],
        "BEGIN RSA PRIVATE KEY",
    ),
    (
        "rsa-pkcs8",
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ],
        "BEGIN PRIVATE KEY",
    ),
];

struct Fixture {
    zts: DevZts,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Self {
        Self::with(DevZtsConfig::default()).await
    }

    async fn with(config: DevZtsConfig) -> Self {
        let zts = DevZts::start(config).await.unwrap();
        Self {
            zts,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Writes a key dir with a fresh key of `format`, version `version`; returns its public PEM.
    fn key_dir(&self, name: &str, args: &[&str], version: &str) -> (PathBuf, String) {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let key = openssl::run(args, b"").unwrap();
        std::fs::write(dir.join("service.key"), &key).unwrap();
        std::fs::write(dir.join("service.version"), format!("{version}\n")).unwrap();
        let public = openssl::run(&["pkey", "-pubout"], key.as_bytes()).unwrap();
        (dir, public)
    }

    fn out_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("out-{name}"))
    }

    fn command(&self, verb: &str, key_dir: &Path, out: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.arg(verb)
            .env("KEY_DIR", key_dir)
            .env("DOMAIN", "k8s.admin")
            .env("SERVICE", "athenz-callback")
            .env("ZTS_URL", self.zts.url())
            .env("ZTS_CA_FILE", self.zts.ca_path())
            .env("DNS_SUFFIX", "athenz.cloud")
            .env("OUT_DIR", out)
            .env("INIT_TIMEOUT", "5s")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    async fn init(&self, key_dir: &Path, out: &Path) -> (i32, String) {
        let out = self.command("init", key_dir, out).output().await.unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn read(out: &Path, name: &str) -> String {
    std::fs::read_to_string(out.join(name)).unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_with_every_key_format_writes_a_verified_set() {
    let f = Fixture::new().await;
    for (name, args, header) in FORMATS {
        let (key_dir, public) = f.key_dir(name, args, "v1");
        assert!(read(&key_dir, "service.key").contains(header), "{name}");
        f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
        let out = f.out_dir(name);
        let (code, stderr) = f.init(&key_dir, &out).await;
        assert_eq!(code, 0, "{name}: {stderr}");

        let chain = read(&out, "service.cert.pem");
        let ca = read(&out, "ca.cert.pem");
        let token = read(&out, "ntoken");
        assert_eq!(mode(&out.join("service.cert.pem")), 0o644);
        assert_eq!(mode(&out.join("ca.cert.pem")), 0o644);
        assert_eq!(mode(&out.join("ntoken")), 0o600);
        assert!(
            !out.join("service.key.pem").exists(),
            "the service key is not copied"
        );

        // leaf + intermediate; openssl verifies the leaf against the written CA file
        let certs = pem_certificates(&chain).unwrap();
        assert_eq!(certs.len(), 2, "{name}: leaf and intermediate");
        let leaf = athenz_core::crypto::der_to_pem(&certs[0]);
        let intermediate = athenz_core::crypto::der_to_pem(&certs[1]);
        openssl::verify(&ca, &intermediate, &leaf).unwrap();
        let info = CertInfo::from_pem(&chain).unwrap();
        assert_eq!(info.common_name, PRINCIPAL);
        assert_eq!(info.dns_names, ["athenz-callback.k8s-admin.athenz.cloud"]);

        let token = NToken::parse(&token).unwrap();
        assert_eq!(token.principal(), PRINCIPAL);
        assert_eq!(token.key_version, "v1");
        token
            .verify(
                &PublicKey::from_pem(&public).unwrap(),
                time::OffsetDateTime::now_utc(),
                VerifyLimits::default(),
            )
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zts_refusals_are_surfaced_clearly() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];

    // unknown key version
    let (key_dir, public) = f.key_dir(name, args, "v9");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let (code, stderr) = f.init(&key_dir, &f.out_dir("v9")).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("401") && stderr.contains("no public key v9"),
        "{stderr}"
    );
    assert!(!f.out_dir("v9").join("service.cert.pem").exists());

    // a key that is not the registered one: ZTS cannot verify the ntoken it signed
    let (other_dir, _) = f.key_dir("other", args, "v1");
    let (code, stderr) = f.init(&other_dir, &f.out_dir("other")).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("401") && stderr.contains("signature"),
        "{stderr}"
    );
}

/// Settings for the callback's service key in `key_dir` against the fixture's ZTS.
fn settings_for(f: &Fixture, key_dir: &Path, out: &Path) -> Settings {
    Settings {
        key_dir: key_dir.to_owned(),
        domain: "k8s.admin".into(),
        service: "athenz-callback".into(),
        zts_url: f.zts.url().into(),
        zts_ca: f.zts.ca_path(),
        dns_suffix: "athenz.cloud".into(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        auth_header: "Athenz-Principal-Auth".into(),
        lifetime_minutes: Some(60),
        out_dir: out.to_owned(),
        group: None,
        ntoken_lifetime: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(86_400),
        host: None,
        init_timeout: Duration::from_secs(5),
        zts_timeout: Duration::from_secs(5),
        log_format: athenz_core::telemetry::LogFormat::Human,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csr_key_and_expired_tokens_are_rejected_by_zts() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v1");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let settings = |out: &Path| settings_for(&f, &key_dir, out);
    let sia = ControlSia::new(settings(&f.out_dir("a")).load().unwrap()).unwrap();

    // an ntoken issued three hours ago has expired
    let err = sia
        .request_certificate(time::OffsetDateTime::now_utc() - time::Duration::hours(3))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("401") && text.contains("expired"), "{text}");

    // the registered key changes under the same version: the CSR's key is no longer it
    let (_, rotated_public) = f.key_dir("rotated", args, "v1");
    f.zts
        .add_service_key(PRINCIPAL, "v1", &rotated_public)
        .unwrap();
    let err = sia
        .request_certificate(time::OffsetDateTime::now_utc())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");

    // a valid ntoken of the registered key, but a CSR made with another key
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let stranger =
        athenz_core::crypto::PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256).unwrap();
    let csr = athenz_core::crypto::build_csr(
        &athenz_core::names::CsrIdentity::for_service(
            "k8s.admin",
            "athenz-callback",
            "athenz.cloud",
        )
        .unwrap(),
        &stranger,
    )
    .unwrap();
    let client = athenz_core::zts::ZtsClient::new(athenz_core::zts::ZtsClientConfig {
        url: f.zts.url().into(),
        ca: athenz_core::tls::ServerCaBundle::fixed(pem_certificates(f.zts.root_pem()).unwrap())
            .unwrap(),
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let err = client
        .refresh_with_ntoken(
            "k8s.admin",
            "athenz-callback",
            &athenz_core::zts::InstanceRefreshRequest {
                csr,
                expiry_time: None,
                key_id: Some("v1".into()),
            },
            &sia.ntoken(time::OffsetDateTime::now_utc()).unwrap(),
            athenz_core::zts::PRINCIPAL_AUTH_HEADER,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(
        err.to_string()
            .contains("Invalid CSR - public key mismatch"),
        "{err}"
    );

    // and with the right key the requested lifetime is honoured
    let issued = sia
        .request_certificate(time::OffsetDateTime::now_utc())
        .await
        .unwrap();
    // (to the minute: ZTS starts a certificate when it signs it)
    assert_eq!(
        (issued.info.not_after - issued.info.not_before).whole_minutes(),
        60
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_startup_errors_naming_the_setting() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, _) = f.key_dir(name, args, "v1");
    let out = f.out_dir("bad");
    let run = |cmd: &mut tokio::process::Command| {
        let fut = cmd.output();
        async move {
            let o = fut.await.unwrap();
            (
                o.status.code().unwrap(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    };

    let (code, stderr) = run(f
        .command("init", &key_dir, &out)
        .env("ZTS_CA_FILE", "/nonexistent/ca.pem"))
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--zts-ca (ZTS_CA_FILE)") && stderr.contains("/nonexistent/ca.pem"),
        "{stderr}"
    );

    let garbage = f.dir.path().join("garbage");
    std::fs::create_dir_all(&garbage).unwrap();
    std::fs::write(garbage.join("service.key"), "not a key").unwrap();
    std::fs::write(garbage.join("service.version"), "v1").unwrap();
    let (code, stderr) = run(&mut f.command("init", &garbage, &out)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--key-dir (KEY_DIR)") && stderr.contains("service.key"),
        "{stderr}"
    );

    let no_version = f.dir.path().join("noversion");
    std::fs::create_dir_all(&no_version).unwrap();
    std::fs::copy(key_dir.join("service.key"), no_version.join("service.key")).unwrap();
    let (code, stderr) = run(&mut f.command("init", &no_version, &out)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--key-dir (KEY_DIR)") && stderr.contains("key version"),
        "{stderr}"
    );

    let (code, stderr) = run(f
        .command("init", &key_dir, &out)
        .env("DOMAIN", "bad..domain"))
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--domain (DOMAIN)"), "{stderr}");

    let (code, stderr) = run(f
        .command("init", &key_dir, &out)
        .env("ZTS_URL", "http://plain"))
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--zts-url (ZTS_URL)"), "{stderr}");
    assert!(!out.exists(), "nothing written on a start-up error");
}

/// Waits (bounded) until `check` holds.
async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_rewrites_the_ntoken_before_it_expires_and_survives_zts_outages() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v1");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let out = f.out_dir("refresh");
    let mut child = f
        .command("refresh", &key_dir, &out)
        .env("NTOKEN_LIFETIME", "4s")
        .spawn()
        .unwrap();
    eventually("the first set", Duration::from_secs(10), || {
        out.join("ntoken").exists()
    })
    .await;
    let first_cert = read(&out, "service.cert.pem");
    let first_text = read(&out, "ntoken");
    let first = NToken::parse(&first_text).unwrap();

    // replaced at half life, well before it expires
    eventually("a new ntoken", Duration::from_secs(10), || {
        std::fs::read_to_string(out.join("ntoken")).is_ok_and(|t| t != first_text)
    })
    .await;
    let replaced_at = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!(
        replaced_at < first.expires,
        "replaced at {replaced_at}, expired at {}",
        first.expires
    );
    let second = NToken::parse(&read(&out, "ntoken")).unwrap();
    assert!(second.issued >= first.issued && second.expires > first.expires);
    assert_eq!(
        read(&out, "service.cert.pem"),
        first_cert,
        "a token rewrite keeps the certificate"
    );

    // ZTS goes away: the files stay and the ntoken (signed locally) keeps being renewed
    f.zts.stop().await;
    let before = read(&out, "ntoken");
    eventually(
        "an ntoken while ZTS is down",
        Duration::from_secs(10),
        || std::fs::read_to_string(out.join("ntoken")).is_ok_and(|t| t != before),
    )
    .await;
    assert_eq!(read(&out, "service.cert.pem"), first_cert);

    // SIGTERM: exit 0
    let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_reissues_the_certificate() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v1");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let out = f.out_dir("reissue");
    // a refresh interval of 2 s caps the wait whatever the certificate's lifetime
    let mut child = f
        .command("refresh", &key_dir, &out)
        .env("REFRESH_INTERVAL", "2s")
        .spawn()
        .unwrap();
    eventually("the first set", Duration::from_secs(10), || {
        out.join("ntoken").exists()
    })
    .await;
    let first = CertInfo::from_pem(&read(&out, "service.cert.pem")).unwrap();
    eventually("a new certificate", Duration::from_secs(15), || {
        std::fs::read_to_string(out.join("service.cert.pem"))
            .ok()
            .and_then(|pem| CertInfo::from_pem(&pem).ok())
            .is_some_and(|c| c.serial_hex != first.serial_hex)
    })
    .await;
    let second = read(&out, "service.cert.pem");
    openssl::verify(
        &read(&out, "ca.cert.pem"),
        "",
        &athenz_core::crypto::der_to_pem(&pem_certificates(&second).unwrap()[0]),
    )
    .unwrap();
    let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
}

/// Extra SANs for the names clients use: a DNS name of the one form ZTS issues to a key-based
/// certificate (`<service>.<domain-with-dashes>.<suffix>`, ZTSUtils.validateCertReqDNSNames)
/// and the caller's own IP are issued; an IP that is not the caller's, a name outside ZTS's
/// suffixes and a name under them of another form are refused by ZTS; a malformed name is a
/// setting error before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_dns_and_ip_sans() {
    // a ZTS told to check a request's IP SANs against the caller's address (Athenz's
    // athenz.zts.cert_request_verify_ip; off by default, when any IP SAN passes)
    let f = Fixture::with(DevZtsConfig {
        cert_request_verify_ip: true,
        ..DevZtsConfig::default()
    })
    .await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v1");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let settings = |dns: Vec<String>, ips: Vec<std::net::IpAddr>| Settings {
        dns_names: dns,
        ip_addresses: ips,
        ..settings_for(&f, &key_dir, &f.out_dir("sans"))
    };
    let now = time::OffsetDateTime::now_utc();
    let sia = ControlSia::new(
        settings(
            vec!["athenz-callback.k8s-admin.athenz.cloud".into()],
            vec!["127.0.0.1".parse().unwrap()],
        )
        .load()
        .unwrap(),
    )
    .unwrap();
    let issued = sia.request_certificate(now).await.unwrap();
    let cert = issued.info;
    assert!(
        cert.dns_names
            .contains(&"athenz-callback.k8s-admin.athenz.cloud".to_owned()),
        "{:?}",
        cert.dns_names
    );
    assert_eq!(
        cert.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );

    let sia = ControlSia::new(
        settings(Vec::new(), vec!["10.9.9.9".parse().unwrap()])
            .load()
            .unwrap(),
    )
    .unwrap();
    let err = sia.request_certificate(now).await.unwrap_err().to_string();
    // Athenz's words (ZTSImpl.postInstanceRefreshRequest)
    assert!(
        err.contains("400") && err.contains("Invalid CSR - IP address mismatch"),
        "{err}"
    );

    for outside in [
        "callback.example.org",
        // under the suffix, but not the service's own name (another namespace's Service)
        "athenz-callback.athenz-system.athenz.cloud",
    ] {
        let sia =
            ControlSia::new(settings(vec![outside.into()], Vec::new()).load().unwrap()).unwrap();
        let err = sia.request_certificate(now).await.unwrap_err().to_string();
        assert!(
            err.contains("Invalid CSR - data mismatch"),
            "{outside}: {err}"
        );
    }

    let err = settings(vec!["bad name!".into()], Vec::new())
        .load()
        .unwrap_err()
        .to_string();
    assert!(err.contains("--dns-name (DNS_NAMES)"), "{err}");
}

#[path = "control_sia/ops.rs"]
mod ops;
