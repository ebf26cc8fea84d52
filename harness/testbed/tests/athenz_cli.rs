//! Athenz's own command-line tools against the dev ZTS, typed as an Athenz user types them: the
//! `utils/` programs of the Athenz Go module (`zts-svccert`, `zts-rolecert`, `zts-accesstoken`),
//! built by harness/peers/athenz/build from the module version the Go harness pins. A service certificate
//! first (through a provider, as a pod gets one, and with a registered key and an ntoken, as a
//! control-plane service does), then, presenting it, a role certificate and an access token. Each
//! answer is checked by a reader that is not ours: certificates by `openssl` (names, and the
//! chain to the dev ZTS root), the access token by PyJWT against the dev ZTS's JWKS and by
//! `zts-accesstoken -validate` against an athenz.conf holding the dev ZTS's public key.
//!
//! Each run prints `athenz-cli: <tool> <what> ok|FAILED` (harness/peers/athenz/run counts them).
//!
//! Seen to fail by breaking the dev ZTS on purpose (then restored): leave the principal's URI out
//! of role certificates → `zts-rolecert role-certificate` fails naming the missing SAN; put
//! "writers" in access tokens' `scp` → `zts-accesstoken access-token` fails on scp.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_testbed::athenz_clients::cli;
use athenz_testbed::fixtures::{DNS_SUFFIX, DOMAIN, PROVIDER, SERVICE};
use athenz_testbed::openssl;
use athenz_testbed::provider_stub::{Decision, ProviderStub};
use athenz_testbed::zts::authz::RoleEntry;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use base64::Engine;
use serde_json::Value;
use sha2::Digest;
use std::path::PathBuf;

/// The lifetime the provider grants the pod's certificate, minutes (its `certExpiryTime`).
const PROVIDER_MINUTES: i64 = 60;

/// A control-plane service with a registered key (`-key-version`).
const KEY_SERVICE: &str = "api";

/// The dev ZTS, a provider that confirms every launch, and the files a user would have at hand.
struct Bed {
    zts: DevZts,
    stub: ProviderStub,
    dir: tempfile::TempDir,
}

impl Bed {
    async fn start() -> Self {
        let zts = DevZts::start(DevZtsConfig {
            roles: vec![RoleEntry {
                domain: DOMAIN.into(),
                role: "readers".into(),
                members: vec![format!("{DOMAIN}.{SERVICE}")],
            }],
            ..DevZtsConfig::default()
        })
        .await
        .unwrap();
        let stub = ProviderStub::start(
            zts.ca(),
            PROVIDER,
            zts.root_pem(),
            "/callback",
            Decision::Allow {
                cert_expiry_minutes: Some(u32::try_from(PROVIDER_MINUTES).unwrap()),
            },
        )
        .await
        .unwrap();
        zts.add_provider(ProviderEntry {
            name: PROVIDER.into(),
            endpoint: stub.endpoint().to_owned(),
            dns_suffixes: vec![DNS_SUFFIX.into()],
            launch: vec![format!("{DOMAIN}.*")],
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), zts.root_pem()).unwrap();
        Self { zts, stub, dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// A new P-256 key in PKCS#8 PEM at `name`; returns the key.
    fn key(&self, name: &str) -> PrivateKey {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        std::fs::write(self.path(name), key.to_pkcs8_pem().unwrap().expose()).unwrap();
        key
    }

    fn read(&self, name: &str) -> Result<String, String> {
        std::fs::read_to_string(self.path(name)).map_err(|e| format!("{name}: {e}"))
    }
}

/// Runs one of Athenz's tools with `args`; its stdout, or why it failed (its stderr: the tools
/// `log.Fatal` their errors).
async fn run_tool(tool: &str, args: &[String]) -> Result<String, String> {
    let binary = cli(tool).map_err(|e| e.to_string())?;
    let out = tokio::process::Command::new(&binary)
        .args(args)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("running {}: {e}", binary.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{tool} {args:?} exited {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// What `openssl x509 -text` says of a certificate, checked: its subject CN, each of `sans` among
/// its SANs, the chain to the dev ZTS root through `signers`, and the minutes left to it
/// (`expect_minutes`, give or take one).
fn check_certificate(
    bed: &Bed,
    pem: &str,
    signers: &str,
    cn: &str,
    sans: &[String],
    expect_minutes: Option<i64>,
) -> Result<(), String> {
    let text = openssl::cert_text(pem)?;
    let subject = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Subject:"))
        .ok_or_else(|| format!("no Subject in {text}"))?;
    if !subject
        .split(',')
        .any(|part| part.trim() == format!("CN = {cn}"))
    {
        return Err(format!("subject {subject:?}, want CN = {cn}"));
    }
    let missing: Vec<&String> = sans
        .iter()
        .filter(|san| !text.contains(san.as_str()))
        .collect();
    if !missing.is_empty() {
        return Err(format!("SANs {missing:?} missing from:\n{text}"));
    }
    openssl::verify(bed.zts.root_pem(), signers, pem)
        .map_err(|e| format!("does not chain to the dev ZTS root: {e}"))?;
    if let Some(minutes) = expect_minutes {
        let cert = athenz_core::crypto::CertInfo::from_pem(pem).map_err(|e| e.to_string())?;
        let left = (cert.not_after - time::OffsetDateTime::now_utc()).whole_minutes();
        if (left - minutes).abs() > 1 {
            return Err(format!("{left} minutes left, want {minutes}"));
        }
    }
    Ok(())
}

/// `zts-svccert` through the provider, as a pod's identity is asked for: a key, the instance, the
/// attestation data in a file; ZTS asks the provider, which grants `PROVIDER_MINUTES`.
async fn svccert_through_the_provider(bed: &Bed) -> Result<(), String> {
    bed.key("web.key.pem");
    let instance = "0b6e4c1e-8f57-4d5e-9a51-000000000001";
    std::fs::write(bed.path("attestation"), "a token the provider checks").unwrap();
    let args = [
        "-zts",
        bed.zts.url(),
        "-cacert",
        &bed.arg("ca.pem"),
        "-private-key",
        &bed.arg("web.key.pem"),
        "-domain",
        DOMAIN,
        "-service",
        SERVICE,
        "-dns-domain",
        DNS_SUFFIX,
        "-provider",
        PROVIDER,
        "-instance",
        instance,
        "-attestation-data",
        &bed.arg("attestation"),
        "-cert-file",
        &bed.arg("web.cert.pem"),
        "-signer-cert-file",
        &bed.arg("web.signer.pem"),
    ]
    .map(str::to_owned);
    run_tool("zts-svccert", &args).await?;
    // what the provider was asked: this instance, with the attestation data as written
    let asked = bed
        .stub
        .recorded()
        .last()
        .ok_or("the provider was not asked")?
        .confirmation()
        .map_err(|e| e.to_string())?;
    if asked.attestation_data.expose() != "a token the provider checks"
        || asked.attributes.get("instanceId").map(String::as_str) != Some(instance)
    {
        return Err(format!("the provider was asked {asked:?}"));
    }
    check_certificate(
        bed,
        &bed.read("web.cert.pem")?,
        &bed.read("web.signer.pem")?,
        &format!("{DOMAIN}.{SERVICE}"),
        &[
            format!("DNS:{SERVICE}.media-sports.{DNS_SUFFIX}"),
            format!("URI:spiffe://{DOMAIN}/sa/{SERVICE}"),
            format!("URI:athenz://instanceid/{PROVIDER}/{instance}"),
        ],
        Some(PROVIDER_MINUTES),
    )
}

/// `zts-svccert` with a registered key: an ntoken signed with it authenticates the request
/// (`-key-version`), the key refresh route issues the certificate.
async fn svccert_with_a_registered_key(bed: &Bed) -> Result<(), String> {
    let key = bed.key("api.key.pem");
    bed.zts
        .add_service_key(
            &format!("{DOMAIN}.{KEY_SERVICE}"),
            "v1",
            &key.key_pair().public_key_pem(),
        )
        .map_err(|e| e.to_string())?;
    let args = [
        "-zts",
        bed.zts.url(),
        "-cacert",
        &bed.arg("ca.pem"),
        "-private-key",
        &bed.arg("api.key.pem"),
        "-key-version",
        "v1",
        "-domain",
        DOMAIN,
        "-service",
        KEY_SERVICE,
        "-dns-domain",
        DNS_SUFFIX,
        "-cert-file",
        &bed.arg("api.cert.pem"),
        "-signer-cert-file",
        &bed.arg("api.signer.pem"),
    ]
    .map(str::to_owned);
    run_tool("zts-svccert", &args).await?;
    check_certificate(
        bed,
        &bed.read("api.cert.pem")?,
        &bed.read("api.signer.pem")?,
        &format!("{DOMAIN}.{KEY_SERVICE}"),
        &[
            format!("DNS:{KEY_SERVICE}.media-sports.{DNS_SUFFIX}"),
            format!("URI:spiffe://{DOMAIN}/sa/{KEY_SERVICE}"),
        ],
        None,
    )
}

/// `zts-rolecert` presenting the pod's service certificate: a certificate of role `readers`
/// naming the principal it was issued to.
async fn rolecert(bed: &Bed) -> Result<(), String> {
    let args = [
        "-zts",
        bed.zts.url(),
        "-cacert",
        &bed.arg("ca.pem"),
        "-svc-key-file",
        &bed.arg("web.key.pem"),
        "-svc-cert-file",
        &bed.arg("web.cert.pem"),
        "-role-domain",
        DOMAIN,
        "-role-name",
        "readers",
        // the CLI writes the email <principal>@<dns-domain>, and ZTS wants its host under a
        // suffix (ends with ".athenz.cloud"), never the suffix itself: real ZTS refuses
        // @athenz.cloud (harness/testbed/data/zts-recorded.json, role_cert_principal_as_email)
        "-dns-domain",
        &format!("mail.{DNS_SUFFIX}"),
        "-role-cert-file",
        &bed.arg("readers.cert.pem"),
    ]
    .map(str::to_owned);
    run_tool("zts-rolecert", &args).await?;
    check_certificate(
        bed,
        &bed.read("readers.cert.pem")?,
        &bed.read("web.signer.pem")?,
        &format!("{DOMAIN}:role.readers"),
        &[
            format!("URI:athenz://principal/{DOMAIN}.{SERVICE}"),
            format!("URI:spiffe://{DOMAIN}/ra/readers"),
        ],
        None,
    )
}

/// `zts-accesstoken` presenting the pod's service certificate, for ten minutes: its JSON answer,
/// and the token verified by PyJWT against the dev ZTS's JWKS, its claims checked. The token
/// when one was issued, and the verdict.
async fn accesstoken(bed: &Bed) -> (Option<String>, Result<(), String>) {
    match issued_token(bed).await {
        Ok(token) => {
            let checked = token_claims(bed, &token).await;
            (Some(token), checked)
        }
        Err(why) => (None, Err(why)),
    }
}

/// The token `zts-accesstoken` prints in its JSON answer, whose other fields are checked.
async fn issued_token(bed: &Bed) -> Result<String, String> {
    let args = [
        "-zts",
        bed.zts.url(),
        "-svc-cacert-file",
        &bed.arg("ca.pem"),
        "-svc-key-file",
        &bed.arg("web.key.pem"),
        "-svc-cert-file",
        &bed.arg("web.cert.pem"),
        "-domain",
        DOMAIN,
        "-roles",
        "readers",
        "-expire-time",
        "10",
    ]
    .map(str::to_owned);
    let out = run_tool("zts-accesstoken", &args).await?;
    let answer: Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("its answer {out:?}: {e}"))?;
    if answer["token_type"] != "Bearer" || answer["expires_in"] != 600 {
        return Err(format!("token_type or expires_in: {answer}"));
    }
    answer["access_token"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no access_token: {answer}"))
}

/// The token verified by PyJWT with the dev ZTS's JWKS, and its claims.
async fn token_claims(bed: &Bed, token: &str) -> Result<(), String> {
    let jwks = bed.zts.fetch_jwks().await?;
    let claims = athenz_testbed::pyjwt::verify_es256(token, &jwks, DOMAIN)?;
    let principal = format!("{DOMAIN}.{SERVICE}");
    let lifetime = claims["exp"].as_i64().unwrap_or(0) - claims["iat"].as_i64().unwrap_or(0);
    // bound to the certificate it was asked with (RFC 8705 x5t#S256)
    let der = athenz_core::crypto::pem_certificates(&bed.read("web.cert.pem")?)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("web.cert.pem holds no certificate")?;
    let thumbprint =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(&der));
    let wrong: Vec<String> = [
        ("sub", claims["sub"] == principal.as_str()),
        ("client_id", claims["client_id"] == principal.as_str()),
        ("aud", claims["aud"] == DOMAIN),
        ("scp", claims["scp"] == serde_json::json!(["readers"])),
        ("exp - iat", lifetime == 600),
        ("cnf", claims["cnf"]["x5t#S256"] == thumbprint.as_str()),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(claim, _)| claim.to_owned())
    .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("claims {wrong:?} wrong: {claims}"))
    }
}

/// `zts-accesstoken -validate` with an athenz.conf holding the dev ZTS's token key (Athenz's
/// YBase64 of its PEM, under the id the token's `kid` names), as a user checks a token offline.
async fn accesstoken_validate(bed: &Bed, token: &str) -> Result<(), String> {
    let header: Value = token
        .split('.')
        .next()
        .and_then(|h| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or("the token's header")?;
    let ybase64 = base64::engine::general_purpose::STANDARD
        .encode(bed.zts.token_public_key_pem())
        .replace('+', ".")
        .replace('/', "_")
        .replace('=', "-");
    let conf = serde_json::json!({
        "ztsUrl": bed.zts.url(),
        "ztsPublicKeys": [{"id": header["kid"], "key": ybase64}],
    });
    std::fs::write(bed.path("athenz.conf"), conf.to_string()).unwrap();
    let args = [
        "-validate",
        "-access-token",
        token,
        "-conf",
        &bed.arg("athenz.conf"),
    ]
    .map(str::to_owned);
    let out = run_tool("zts-accesstoken", &args).await?;
    out.contains("Access Token successfully validated")
        .then_some(())
        .ok_or_else(|| format!("it said: {out}"))
}

/// The case lines (`athenz-cli: <tool> <what> ok|FAILED`, printed by the test) and the failures.
#[derive(Default)]
struct Report {
    lines: Vec<String>,
    failures: Vec<String>,
}

impl Report {
    fn add(&mut self, tool: &str, what: &str, outcome: Result<(), String>) {
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        self.lines
            .push(format!("athenz-cli: {tool} {what} {verdict}"));
        if let Err(why) = outcome {
            self.failures.push(format!("{tool} {what}: {why}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn athenz_clis_get_identities_and_tokens_from_the_dev_zts() {
    let bed = Bed::start().await;
    let mut report = Report::default();
    let pod_certificate = svccert_through_the_provider(&bed).await;
    let have_certificate = pod_certificate.is_ok();
    report.add("zts-svccert", "instance-register", pod_certificate);
    report.add(
        "zts-svccert",
        "key-refresh",
        svccert_with_a_registered_key(&bed).await,
    );
    // the role certificate and the token are asked for with the pod's certificate
    const NEEDS: &str = "needs zts-svccert instance-register's certificate";
    let role = if have_certificate {
        rolecert(&bed).await
    } else {
        Err(NEEDS.to_owned())
    };
    report.add("zts-rolecert", "role-certificate", role);
    let (token, checked) = if have_certificate {
        accesstoken(&bed).await
    } else {
        (None, Err(NEEDS.to_owned()))
    };
    let validated = match &token {
        Some(token) => accesstoken_validate(&bed, token).await,
        None => Err("needs a token from zts-accesstoken access-token".to_owned()),
    };
    report.add("zts-accesstoken", "access-token", checked);
    report.add("zts-accesstoken", "validate", validated);
    for line in &report.lines {
        println!("{line}");
    }
    assert!(
        report.failures.is_empty(),
        "Athenz's tools against the dev ZTS:\n{}",
        report.failures.join("\n")
    );
}
