//! Every SIA feature on the installed release, as a tenant uses it (docs/operating.md, "Install", step 6):
//! a pod in a namespace enforcing Pod Security `restricted`, with no mode annotation (the
//! template's default, a CSI mode), asking for a role certificate, the token server and SDS.
//! Nothing of the devstack reaches into it: its SIA finds ZTS's URL in the environment the
//! initializer gives it and ZTS's CA beside its agent's socket, as on any installed cluster.
//!
//! The pod is Ready only when each feature works, checked from inside it:
//! - its SDS client, an init container after the injected refresher (`athenz-sia status
//!   --sds-socket --wait`, from the release image), got the service certificate and CA from the
//!   socket and verified one with the other;
//! - its app's readiness probe finds the role certificate and gets an access token from the
//!   token server (k8s-athenz-sia's REST API).
//!
//! Then the test reads them itself: the role certificate verifies to the ZTS CA and names the
//! role; the access token's claims name the pod's principal and the role.
//!
//! It also holds the operator's template changes the real node checks: allowing a volume
//! (`allowedVolumes`) reaches the initializer with no restart, and pods are admitted throughout.

use super::install::CONTROL_NAMESPACE;
use super::scenario::{
    BUSYBOX, CREDENTIALS, PodIdentity, RESTRICTED_NAMESPACE, Scenario, Workload,
};
use super::tenant_pods::{app_container, restricted_pod};
use crate::initializer_template::with_allowed_volumes;
use anyhow::{Context, bail};
use athenz_core::crypto::CertInfo;
use athenz_core::volume_mode::VolumeMode;
use serde::Serialize;
use std::time::{Duration, Instant};

/// The tenant pod asking for every feature.
pub const FEATURES: Workload = Workload {
    namespace: RESTRICTED_NAMESPACE,
    service_account: "auditor",
    mode: VolumeMode::CsiSocket,
    service: false,
};
/// Its role (the dev ZTS makes every `bank.vault.*` a member).
pub const ROLE_DOMAIN: &str = "bank.vault";
/// The role's name.
pub const ROLE: &str = "auditors";
/// The token server's loopback port.
pub const TOKEN_SERVER_PORT: u16 = 4080;
/// Where the SDS socket's volume is mounted (the base template's `sdsMountPath`).
const SDS_DIR: &str = "/var/run/athenz-sds";
/// How long the pod may take to be Ready (two ZTS calls beyond the identity).
const READY: Duration = Duration::from_secs(180);
/// How long a template change may take to reach the initializer: the kubelet's ConfigMap
/// volume update (its sync period, about a minute) plus the initializer's re-read (10 s).
pub const TEMPLATE_PROPAGATION: Duration = Duration::from_secs(240);

/// What the features pod showed.
#[derive(Debug, Clone, Serialize)]
pub struct Features {
    /// Its identity, checked as every pod's is.
    pub identity: PodIdentity,
    /// The role certificate's subject CN (`<domain>:role.<role>`).
    pub role_certificate: String,
    /// The access token's `scp` claim.
    pub access_token_scope: Vec<String>,
    /// The principal the SDS socket's certificate names.
    pub sds_principal: String,
}

impl Scenario {
    /// Deploys [`FEATURES`] and checks each feature (see the module docs).
    pub fn check_features(&self) -> anyhow::Result<Features> {
        let ns = FEATURES.namespace;
        let sa = FEATURES.service_account;
        self.ensure_restricted_namespace(ns)?;
        self.ensure_service_account(ns, sa)?;
        let sia_image = self.installed_sia_image()?;
        self.kubectl().apply_manifest(
            &features_pod(&sia_image).to_string(),
            &format!("pod {ns}/{sa}"),
        )?;
        self.wait_pod_ready(ns, sa, READY).with_context(|| {
            let logs = self
                .kubectl()
                .run(&["logs", "-n", ns, sa, "--all-containers", "--tail=20"])
                .unwrap_or_default();
            format!("the features pod; its containers' logs:\n{logs}")
        })?;
        let identity = self.check_identity(ns, sa, VolumeMode::CsiSocket)?;
        let exec = |args: &[&str]| {
            let mut all = vec!["exec", "-n", ns, sa, "-c", "app", "--", BUSYBOX];
            all.extend_from_slice(args);
            self.kubectl().run(&all)
        };
        let target = format!("{ROLE_DOMAIN}:role.{ROLE}");
        let role_pem = exec(&["cat", &format!("{CREDENTIALS}/rolecerts/{target}.cert.pem")])?;
        let ca_pem = exec(&["cat", &format!("{CREDENTIALS}/ca.cert.pem")])?;
        let root = std::fs::read_to_string(self.zts_ca())
            .with_context(|| format!("reading {}", self.zts_ca().display()))?;
        athenz_testbed::openssl::verify(&root, &ca_pem, &role_pem).map_err(|e| {
            anyhow::anyhow!("{ns}/{sa}: the role certificate does not verify to the ZTS CA: {e}")
        })?;
        let role = CertInfo::from_pem(&role_pem).context("parsing the role certificate")?;
        if role.common_name != target {
            bail!(
                "{ns}/{sa}: the role certificate names {} not {target}",
                role.common_name
            );
        }
        let answer = exec(&[
            "wget",
            "-q",
            "-O",
            "-",
            "--header",
            "Content-Type: application/json",
            "--post-data",
            &format!(r#"{{"domain":"{ROLE_DOMAIN}","role":"{ROLE}"}}"#),
            &format!("http://127.0.0.1:{TOKEN_SERVER_PORT}/accesstoken"),
        ])?;
        let scope = access_token_scope(&answer, &identity.principal)
            .with_context(|| format!("{ns}/{sa}: the token server's answer {answer:?}"))?;
        if !scope.iter().any(|s| s == ROLE) {
            bail!("{ns}/{sa}: the access token's scp {scope:?} does not name {ROLE}");
        }
        let sds = self
            .kubectl()
            .run(&["logs", "-n", ns, sa, "-c", "sds-client"])?;
        let sds_principal = sds_principal(&sds)
            .with_context(|| format!("{ns}/{sa}: the SDS client's report:\n{sds}"))?;
        if sds_principal != identity.principal {
            bail!(
                "{ns}/{sa}: SDS served {sds_principal}, the files hold {}",
                identity.principal
            );
        }
        Ok(Features {
            identity,
            role_certificate: role.common_name,
            access_token_scope: scope,
            sds_principal,
        })
    }

    /// Makes the installed template allow `volume` in `athenz.io/volume` (as an operator edits
    /// the ConfigMap) when it does not yet, then waits until the initializer uses it: a pod
    /// asking for it in `probe_ns` is admitted (a server-side dry run). Meanwhile a pod with no
    /// annotation must be admitted every time: pod creation never fails while the template
    /// changes. Returns how long the change took to reach the initializer.
    pub fn allow_volume(&self, volume: VolumeMode, probe_ns: &str) -> anyhow::Result<Duration> {
        let text = self.installed_template_text()?;
        let template = athenz_initializer::template::Template::from_yaml(&text)?;
        if template.allows(volume) {
            return Ok(Duration::ZERO);
        }
        let allowed: Vec<VolumeMode> = [
            VolumeMode::CsiSocket,
            VolumeMode::CsiFiles,
            VolumeMode::Flex,
        ]
        .into_iter()
        .filter(|v| *v == volume || text.contains(v.name()))
        .collect();
        let changed = with_allowed_volumes(&text, &allowed);
        let patch = serde_json::json!({"data": {"template.yaml": changed}}).to_string();
        self.kubectl().run(&[
            "patch",
            "configmap",
            "-n",
            CONTROL_NAMESPACE,
            "athenz-initializer-template",
            "--type",
            "merge",
            "-p",
            &patch,
        ])?;
        let started = Instant::now();
        let probe = |annotation: Option<&str>| {
            let mut pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "template-probe", "namespace": probe_ns},
                "spec": {"containers": [app_container()]},
            });
            if let Some(volume) = annotation {
                pod["metadata"]["annotations"] = serde_json::json!({
                    athenz_initializer::mutate::VOLUME_ANNOTATION: volume
                });
            }
            self.kubectl()
                .dry_run(&pod.to_string(), &format!("a pod in {probe_ns}"))
        };
        // Each replica of the webhook reads its own copy of the ConfigMap, updated by its own
        // kubelet sync, and each dry run reaches one replica the Service picks: one allowed
        // probe says only that one replica has the new template. Allowed probes in a row make a
        // replica still on the old one all but certain to have been asked (2^-ALLOWED_IN_A_ROW
        // with two replicas); a refusal starts the count again.
        const ALLOWED_IN_A_ROW: u32 = 10;
        let mut allowed_in_a_row = 0;
        loop {
            probe(None).context("a pod with no annotation while the template changed")?;
            match probe(Some(volume.name())) {
                Ok(_) => {
                    allowed_in_a_row += 1;
                    if allowed_in_a_row == ALLOWED_IN_A_ROW {
                        return Ok(started.elapsed());
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(_) if allowed_in_a_row > 0 => allowed_in_a_row = 0,
                Err(e) if started.elapsed() > TEMPLATE_PROPAGATION => {
                    return Err(e.context(format!(
                        "the template allowing {volume} did not reach the initializer within \
                         {TEMPLATE_PROPAGATION:?}"
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_secs(2)),
            }
        }
    }
}

/// The features pod: restricted, no mode annotation; roles, token server and SDS asked for; an
/// SDS client (the release's `athenz-sia status`) as an init container after the injected
/// refresher; the app's readiness needs the role certificate and an access token.
fn features_pod(sia_image: &str) -> serde_json::Value {
    let mut pod = restricted_pod(&FEATURES);
    let annotations = &mut pod["metadata"]["annotations"];
    *annotations = serde_json::json!({
        athenz_initializer::mutate::ROLES_ANNOTATION: format!("{ROLE_DOMAIN}:role.{ROLE}"),
        athenz_initializer::mutate::TOKEN_SERVER_PORT_ANNOTATION: TOKEN_SERVER_PORT.to_string(),
        athenz_initializer::mutate::SDS_ANNOTATION: "true",
    });
    let ready = format!(
        "{BUSYBOX} test -s '{CREDENTIALS}/rolecerts/{ROLE_DOMAIN}:role.{ROLE}.cert.pem' && \
         {BUSYBOX} wget -q -O - --header 'Content-Type: application/json' \
         --post-data '{{\"domain\":\"{ROLE_DOMAIN}\",\"role\":\"{ROLE}\"}}' \
         http://127.0.0.1:{TOKEN_SERVER_PORT}/accesstoken | {BUSYBOX} grep -q access_token"
    );
    pod["spec"]["containers"][0]["readinessProbe"] = serde_json::json!({
        "exec": {"command": [BUSYBOX, "sh", "-c", ready]},
        "periodSeconds": 2,
        "timeoutSeconds": 10,
    });
    let security = pod["spec"]["containers"][0]["securityContext"].clone();
    pod["spec"]["initContainers"] = serde_json::json!([{
        "name": "sds-client",
        "image": sia_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["athenz-sia", "status", "--sds-socket",
                    format!("{SDS_DIR}/{}", athenz_initializer::mutate::SDS_SOCKET_NAME),
                    "--wait", "60s"],
        "securityContext": security,
        "volumeMounts": [{"name": athenz_initializer::mutate::SDS_VOLUME,
                          "mountPath": SDS_DIR, "readOnly": true}],
    }]);
    pod
}

/// The `scp` claim of the access token in a token server answer, once its `sub` is `principal`.
fn access_token_scope(answer: &str, principal: &str) -> anyhow::Result<Vec<String>> {
    use base64::Engine as _;
    let answer: serde_json::Value = serde_json::from_str(answer).context("not JSON")?;
    let token = answer["access_token"].as_str().context("no access_token")?;
    let payload = token.split('.').nth(1).context("not a JWT")?;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .context("the JWT's payload is not base64url")?,
    )
    .context("the JWT's payload is not JSON")?;
    if claims["sub"] != principal {
        bail!("the token's sub is {} not {principal}", claims["sub"]);
    }
    Ok(claims["scp"]
        .as_array()
        .context("no scp claim")?
        .iter()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect())
}

/// The principal line of `athenz-sia status`'s report, once it says healthy.
fn sds_principal(report: &str) -> anyhow::Result<String> {
    let field = |name: &str| {
        report
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if field("healthy:").as_deref() != Some("yes") {
        bail!("the SDS client did not report healthy");
    }
    field("principal:").context("no principal in the report")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_servers_answer_is_read_strictly() {
        use base64::Engine as _;
        let b64 = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let token = |claims: serde_json::Value| {
            serde_json::json!({"access_token": format!("{}.{}.sig", b64(serde_json::json!({})), b64(claims))})
                .to_string()
        };
        let good = token(serde_json::json!({"sub": "bank.vault.auditor", "scp": ["auditors"]}));
        assert_eq!(
            access_token_scope(&good, "bank.vault.auditor").unwrap(),
            vec!["auditors"]
        );
        for (answer, named) in [
            ("not json".to_owned(), "JSON"),
            ("{}".to_owned(), "access_token"),
            (r#"{"access_token":"opaque"}"#.to_owned(), "JWT"),
            (r#"{"access_token":"a.!!!.c"}"#.to_owned(), "base64"),
            (good.clone(), "sub"),
            (token(serde_json::json!({"sub": "x"})), "sub"),
        ] {
            let principal = if answer == good {
                "someone.else"
            } else {
                "bank.vault.auditor"
            };
            let err = format!("{:#}", access_token_scope(&answer, principal).unwrap_err());
            assert!(err.contains(named), "{answer}: {err}");
        }
        let no_scope = token(serde_json::json!({"sub": "bank.vault.auditor"}));
        assert!(access_token_scope(&no_scope, "bank.vault.auditor").is_err());
    }

    #[test]
    fn the_sds_report_must_say_healthy() {
        assert_eq!(
            sds_principal(
                "out dir:     sds:/x\nhealthy:     yes\nprincipal:   bank.vault.auditor\n"
            )
            .unwrap(),
            "bank.vault.auditor"
        );
        assert!(sds_principal("healthy:     NO\nprincipal:   bank.vault.auditor\n").is_err());
        assert!(sds_principal("").is_err());
    }
}
