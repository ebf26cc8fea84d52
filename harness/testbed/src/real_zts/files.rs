//! The files real ZTS starts from, written into its work directory: its keys (ZTS's token key,
//! the ZMS key domains are signed with), its TLS identity and trust as Java key stores, the
//! signer's key store, `athenz.conf`, the container's and ZTS's properties, a console logback
//! configuration, and the signed domains. Every secret file is 0600.

use super::RealZtsError;
use super::domains::y64;
use crate::pki::{CertAuthority, LeafSpec, write_file};
use crate::zts::DevZtsConfig;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The one password of every key store here: they are test material in a 0700 directory, and
/// Athenz's own dev setup (servers/zts/conf) uses one password the same way.
pub(super) const STORE_PASSWORD: &str = "athenz";

/// Where each file is, under the work directory.
pub(super) struct Layout {
    pub(super) work: PathBuf,
}

impl Layout {
    pub(super) fn path(&self, relative: &str) -> PathBuf {
        self.work.join(relative)
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RealZtsError {
    move |source| RealZtsError::Io { what, source }
}

/// Runs a tool, its output in the error when it fails; a missing tool is named.
pub(super) fn run_tool(program: &str, args: &[&str]) -> Result<String, RealZtsError> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| RealZtsError::MissingTool {
            tool: program.to_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(RealZtsError::Command {
            command: format!("{program} {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn text(path: &Path) -> Result<&str, RealZtsError> {
    path.to_str()
        .ok_or_else(|| RealZtsError::Data(format!("{} is not UTF-8", path.display())))
}

/// ZTS's keys: its token signing key and the ZMS key, PKCS#8 PEM; returns their public PEMs.
pub(super) fn write_keys(layout: &Layout) -> Result<(String, String), RealZtsError> {
    let mut publics = Vec::new();
    for name in ["zts_private.pem", "zms_private.pem"] {
        let key = PrivateKey::generate(KeyAlgorithm::P256).map_err(crate::pki::PkiError::from)?;
        let pem = key.to_pkcs8_pem().map_err(crate::pki::PkiError::from)?;
        write_file(
            &layout.path(&format!("keys/{name}")),
            pem.expose().as_bytes(),
            0o600,
        )?;
        publics.push(key.key_pair().public_key_pem());
    }
    let zms = publics.pop().unwrap_or_default();
    let zts = publics.pop().unwrap_or_default();
    Ok((zts, zms))
}

/// ZTS's TLS identity (`principal`, for `listen`'s address and localhost) and the signer it
/// issues with, as PKCS#12 stores; the trust for clients and for providers as JKS stores.
pub(super) fn write_stores(
    layout: &Layout,
    signer: &CertAuthority,
    settings: &DevZtsConfig,
    listen: SocketAddr,
) -> Result<(), RealZtsError> {
    let mut ips = vec![std::net::IpAddr::from([127, 0, 0, 1])];
    if !listen.ip().is_unspecified() && !ips.contains(&listen.ip()) {
        ips.push(listen.ip());
    }
    let own = signer.issue(
        &LeafSpec {
            ip_addresses: ips,
            ..LeafSpec::service(&settings.principal, &["localhost"])
        },
        KeyAlgorithm::P256,
    )?;
    pkcs12(
        layout,
        "certs/zts_keystore.p12",
        "zts",
        &own.chain_pem,
        own.key_pem.expose(),
    )?;
    // KeyStoreCertSignerFactory reads the CA under alias "1" (its default)
    pkcs12(
        layout,
        "certs/signer.p12",
        "1",
        signer.intermediates_pem(),
        signer.key_pem().expose(),
    )?;
    // One trust for clients and providers: ZTS calls providers with its server's TLS context
    // (ZTSUtils.getAthenzServerSSLContext), so in Athenz the two are the same store.
    let mut trusted = vec![signer.root_pem().to_owned(), signer.cert_pem().to_owned()];
    trusted.extend(settings.extra_client_cas.iter().cloned());
    trusted.extend(settings.extra_provider_cas.iter().cloned());
    trust_store(layout, "certs/truststore.jks", &trusted)?;
    Ok(())
}

fn pkcs12(
    layout: &Layout,
    relative: &str,
    alias: &str,
    chain_pem: &str,
    key_pem: &str,
) -> Result<(), RealZtsError> {
    let chain = layout.path(&format!("{relative}.chain.pem"));
    let key = layout.path(&format!("{relative}.key.pem"));
    write_file(&chain, chain_pem.as_bytes(), 0o644)?;
    write_file(&key, key_pem.as_bytes(), 0o600)?;
    let out = layout.path(relative);
    let pass = format!("pass:{STORE_PASSWORD}");
    run_tool(
        "openssl",
        &[
            "pkcs12",
            "-export",
            "-in",
            text(&chain)?,
            "-inkey",
            text(&key)?,
            "-name",
            alias,
            "-passout",
            &pass,
            "-out",
            text(&out)?,
        ],
    )?;
    std::fs::remove_file(&key).map_err(io(format!("removing {}", key.display())))?;
    set_mode(&out, 0o600)
}

/// A JKS trust store of every certificate in `pems` (each a PEM of one or more certificates):
/// keytool, because Java reads a PKCS#12 store's certificates as trusted only with an attribute
/// this machine's OpenSSL 3.0 cannot write.
fn trust_store(layout: &Layout, relative: &str, pems: &[String]) -> Result<(), RealZtsError> {
    let out = layout.path(relative);
    let _ = std::fs::remove_file(&out);
    let mut index = 0;
    for pem in pems {
        for block in pem.split_inclusive("-----END CERTIFICATE-----") {
            let Some(start) = block.find("-----BEGIN CERTIFICATE-----") else {
                continue;
            };
            index += 1;
            let file = layout.path(&format!("{relative}.{index}.pem"));
            write_file(&file, &block.as_bytes()[start..], 0o644)?;
            run_tool(
                "keytool",
                &[
                    "-importcert",
                    "-noprompt",
                    "-storetype",
                    "JKS",
                    "-keystore",
                    text(&out)?,
                    "-storepass",
                    STORE_PASSWORD,
                    "-alias",
                    &format!("ca{index}"),
                    "-file",
                    text(&file)?,
                ],
            )?;
        }
    }
    if index == 0 {
        return Err(RealZtsError::Data(format!(
            "{relative}: no certificate to trust"
        )));
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<(), RealZtsError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("setting the mode of {}", path.display())))
}

/// `athenz.conf`: the ZMS key (its domains' signatures) and ZTS's own (its tokens), both needed
/// ("Unable to initialize public keys" otherwise).
pub(super) fn write_athenz_conf(
    layout: &Layout,
    url: &str,
    zts_public_pem: &str,
    zms_public_pem: &str,
) -> Result<(), RealZtsError> {
    let conf = serde_json::json!({
        "zmsUrl": "https://zms.invalid:4443/",
        "ztsUrl": url,
        "zmsPublicKeys": [{"id": "0", "key": y64(zms_public_pem.as_bytes())}],
        "ztsPublicKeys": [{"id": "0", "key": y64(zts_public_pem.as_bytes())}],
    });
    write_file(
        &layout.path("conf/athenz.conf"),
        conf.to_string().as_bytes(),
        0o644,
    )?;
    Ok(())
}

/// The container's properties (`athenz.prop_file`) and ZTS's (`athenz.zts.prop_file`), each
/// setting of the dev ZTS spelled as Athenz reads it.
pub(super) fn write_properties(
    layout: &Layout,
    home: &Path,
    settings: &DevZtsConfig,
    listen: SocketAddr,
    url: &str,
) -> Result<(), RealZtsError> {
    let p = |relative: &str| layout.path(relative).display().to_string();
    let container = [
        ("athenz.tls_port", listen.port().to_string()),
        ("athenz.port", "0".into()),
        ("athenz.listen_host", listen.ip().to_string()),
        ("athenz.jetty_home", home.display().to_string()),
        ("athenz.access_log_dir", p("logs")),
        ("athenz.ssl_key_store", p("certs/zts_keystore.p12")),
        ("athenz.ssl_key_store_type", "PKCS12".into()),
        ("athenz.ssl_key_store_password", STORE_PASSWORD.into()),
        ("athenz.ssl_trust_store", p("certs/truststore.jks")),
        ("athenz.ssl_trust_store_type", "JKS".into()),
        ("athenz.ssl_trust_store_password", STORE_PASSWORD.into()),
    ];
    let suffixes: Vec<String> = settings
        .service_dns_suffixes
        .iter()
        .map(|s| format!(".{}", s.trim_start_matches('.')))
        .collect();
    let timeout = settings.provider_timeout_ms.to_string();
    let zts = [
        (
            "athenz.zts.authority_classes",
            "com.yahoo.athenz.auth.impl.PrincipalAuthority,com.yahoo.athenz.auth.impl.CertificateAuthority"
                .into(),
        ),
        // the issuer of its tokens, and where its own JWKS is (the default, its host name
        // alone, is no URL)
        ("athenz.zts.oauth_issuer", url.to_owned()),
        // registration without a client certificate: ZTS authenticates POST /instance unless
        // the URI is listed here (ZTSResources.postInstanceRegisterInformation says so); an
        // agent registers with attestation data alone, so a ZTS serving it lists it too
        ("athenz.zts.no_auth_uri_list", "/zts/v1/instance".into()),
        ("athenz.auth.private_key_store.private_key", p("keys/zts_private.pem")),
        ("athenz.auth.private_key_store.private_key_id", "0".into()),
        ("athenz.zts.ssl_key_store", p("certs/zts_keystore.p12")),
        ("athenz.zts.ssl_key_store_type", "PKCS12".into()),
        ("athenz.zts.ssl_key_store_password", STORE_PASSWORD.into()),
        ("athenz.zts.ssl_trust_store", p("certs/truststore.jks")),
        ("athenz.zts.ssl_trust_store_type", "JKS".into()),
        ("athenz.zts.ssl_trust_store_password", STORE_PASSWORD.into()),
        (
            "athenz.zts.cert_signer_factory_class",
            "com.yahoo.athenz.zts.cert.impl.KeyStoreCertSignerFactory".into(),
        ),
        ("athenz.zts.keystore_signer.keystore_path", p("certs/signer.p12")),
        ("athenz.zts.keystore_signer.keystore_password", STORE_PASSWORD.into()),
        // read by BouncyCastle: Athenz's Crypto signs with BouncyCastle's EC key classes, and
        // the JDK's own PKCS12 reader hands it another class ("ECPrivateKeyImpl cannot be cast
        // to BCECPrivateKey", a 500 on every registration)
        ("athenz.zts.keystore_signer.keystore_type", "BCPKCS12".into()),
        ("athenz.zts.keystore_signer.keystore_ca_alias", "1".into()),
        (
            "athenz.zts.certsign_max_expiry_time",
            settings.max_cert_lifetime_minutes.to_string(),
        ),
        (
            "athenz.zts.change_log_store_factory_class",
            "io.athenz.k8s.zts.DomainFilesChangeLogStoreFactory".into(),
        ),
        ("athenz.k8s.domain_files_dir", p("domains/signed")),
        // seconds between looks for changed domain files (Athenz's default: 60)
        (
            "athenz.zts.zms_domain_update_timeout",
            super::DOMAIN_POLL.as_secs().to_string(),
        ),
        (
            "athenz.zts.cert_record_store_factory_class",
            "com.yahoo.athenz.zts.cert.impl.FileCertRecordStoreFactory".into(),
        ),
        ("athenz.zts.cert_file_store_path", p("var")),
        ("athenz.zts.cert_dns_suffix", suffixes.join(",")),
        (
            "athenz.zts.authorized_proxy_users",
            settings.authorized_proxy_users.join(","),
        ),
        ("athenz.zts.oauth_openid_scope", settings.openid_scope.to_string()),
        (
            "athenz.zts.cert_request_verify_ip",
            settings.cert_request_verify_ip.to_string(),
        ),
        (
            "athenz.zts.role_token_max_timeout",
            settings.max_token_expiry_secs.to_string(),
        ),
        ("athenz.instance.provider.client.read_timeout", timeout.clone()),
        ("athenz.instance.provider.client.connect_timeout", timeout),
    ];
    write_file(
        &layout.path("conf/athenz.properties"),
        properties(&container).as_bytes(),
        0o644,
    )?;
    write_file(
        &layout.path("conf/zts.properties"),
        properties(&zts).as_bytes(),
        0o644,
    )?;
    write_file(&layout.path("conf/logback.xml"), LOGBACK.as_bytes(), 0o644)?;
    Ok(())
}

/// Java properties, `name=value` a line; an empty value is left out (Athenz then uses its own
/// default, as it does for a key set to nothing).
fn properties(entries: &[(&str, String)]) -> String {
    entries
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}\n", v.replace('\\', "\\\\")))
        .collect()
}

/// ZTS's log on its standard output (the work directory's `zts.log` keeps it).
const LOGBACK: &str = r#"<configuration>
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} [%thread] %-5level %logger{35} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="OUT"/></root>
</configuration>
"#;

/// The domains as DomainData files, then signed by Athenz's own code with the ZMS key
/// (harness/peers/athenz/zts/store's DomainSigner) into `domains/signed`.
pub(super) fn write_domains(
    layout: &Layout,
    home: &Path,
    settings: &DevZtsConfig,
) -> Result<usize, RealZtsError> {
    // ZMS's timestamps: UTC, milliseconds (RDL's Timestamp)
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    let modified = time::OffsetDateTime::now_utc()
        .format(&format)
        .map_err(|e| RealZtsError::Data(e.to_string()))?;
    let data = super::domains::domain_data(settings, &modified)?;
    let unsigned = layout.path("domains/unsigned");
    std::fs::create_dir_all(&unsigned).map_err(io(format!("creating {}", unsigned.display())))?;
    for (name, domain) in &data {
        write_file(
            &unsigned.join(format!("{name}.json")),
            domain.to_string().as_bytes(),
            0o644,
        )?;
    }
    let classpath = format!("{}/lib/jars/*", home.display());
    run_tool(
        "java",
        &[
            "-cp",
            &classpath,
            "io.athenz.k8s.zts.DomainSigner",
            text(&layout.path("keys/zms_private.pem"))?,
            "0",
            text(&unsigned)?,
            text(&layout.path("domains/signed"))?,
        ],
    )?;
    Ok(data.len())
}

/// The work directory readable by its owner alone: it holds ZTS's keys.
pub(super) fn set_private(work: &Path) -> Result<(), RealZtsError> {
    set_mode(work, 0o700)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(settings: &DevZtsConfig) -> (String, String) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            work: dir.path().to_owned(),
        };
        std::fs::create_dir_all(layout.path("conf")).unwrap();
        let listen = SocketAddr::from(([127, 0, 0, 1], 4443));
        write_properties(
            &layout,
            Path::new("/opt/zts"),
            settings,
            listen,
            "https://127.0.0.1:4443/zts/v1",
        )
        .unwrap();
        (
            std::fs::read_to_string(layout.path("conf/athenz.properties")).unwrap(),
            std::fs::read_to_string(layout.path("conf/zts.properties")).unwrap(),
        )
    }

    #[test]
    fn each_setting_is_spelled_as_athenz_reads_it() {
        let (container, zts) = written(&DevZtsConfig {
            service_dns_suffixes: vec!["athenz.cloud".into(), ".svc".into()],
            authorized_proxy_users: vec!["a.proxy".into(), "b.proxy".into()],
            max_cert_lifetime_minutes: 90,
            provider_timeout_ms: 2_000,
            ..DevZtsConfig::default()
        });
        for line in [
            "athenz.tls_port=4443",
            "athenz.listen_host=127.0.0.1",
            "athenz.jetty_home=/opt/zts",
        ] {
            assert!(
                container.lines().any(|l| l == line),
                "{line} in\n{container}"
            );
        }
        for line in [
            // the suffixes with their leading dot, as ZTS's default ".athenz.cloud"
            "athenz.zts.cert_dns_suffix=.athenz.cloud,.svc",
            "athenz.zts.authorized_proxy_users=a.proxy,b.proxy",
            "athenz.zts.certsign_max_expiry_time=90",
            "athenz.instance.provider.client.read_timeout=2000",
            "athenz.zts.no_auth_uri_list=/zts/v1/instance",
            "athenz.zts.keystore_signer.keystore_type=BCPKCS12",
            "athenz.zts.oauth_issuer=https://127.0.0.1:4443/zts/v1",
            "athenz.zts.change_log_store_factory_class=io.athenz.k8s.zts.DomainFilesChangeLogStoreFactory",
            "athenz.zts.cert_request_verify_ip=false",
        ] {
            assert!(zts.lines().any(|l| l == line), "{line} in\n{zts}");
        }
    }

    #[test]
    fn an_empty_setting_is_left_to_athenz() {
        let (_, zts) = written(&DevZtsConfig::default());
        assert!(!zts.contains("athenz.zts.authorized_proxy_users"), "{zts}");
    }
}
