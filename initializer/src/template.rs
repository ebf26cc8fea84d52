//! The injection template (YAML, from a ConfigMap): what to add to pods. Validated at start with
//! errors naming the field, so a bad ConfigMap stops the webhook instead of breaking pods.

use athenz_core::volume_mode::VolumeMode;
use k8s_openapi::api::core::v1::{
    Capabilities, EnvVar, ResourceRequirements, SeccompProfile, SecurityContext,
};
use serde::Deserialize;
use std::path::Path;
use thiserror::Error;

/// The template.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Template {
    /// Which identity volume pods get when they do not ask (and so whether the SIA runs in
    /// them). A CSI mode by default: flex volumes are refused by Pod Security `baseline`.
    #[serde(default)]
    pub volume: VolumeMode,
    /// The volumes a pod's `athenz.io/volume` annotation may ask for; `volume` is always one.
    /// Default: the two CSI modes (and `volume`): flex only where the operator lists it.
    #[serde(default)]
    pub allowed_volumes: Option<Vec<VolumeMode>>,
    /// Image with `athenz-sia`. Default: the install's (`SIA_IMAGE` in the `athenz-cluster`
    /// ConfigMap, which `kustomize edit set image` and the chart's `image` values set), so the
    /// injected containers always run the release the operator installed.
    #[serde(default)]
    pub image: String,
    /// Pull policy of that image.
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    /// Command that runs the SIA (its first argument is then `init` or `refresh`).
    #[serde(default = "default_command")]
    pub command: Vec<String>,
    /// Where the flex volume (id + agent socket) is mounted in the SIA containers.
    #[serde(default = "default_identity_path")]
    pub identity_mount_path: String,
    /// Where the credential files are mounted, in the SIA (read-write) and every app container
    /// (read-only).
    #[serde(default = "default_credentials_path")]
    pub credentials_mount_path: String,
    /// Where the SDS socket dir is mounted, in the refresher (read-write; it serves
    /// `<path>/sds.sock`) and every app container (read-only), for pods annotated
    /// `athenz.io/sds: "true"`.
    #[serde(default = "default_sds_path")]
    pub sds_mount_path: String,
    /// Run the refresher as a native sidecar (an init container with `restartPolicy: Always`,
    /// Kubernetes 1.29+) instead of a classic sidecar container.
    #[serde(default)]
    pub native_sidecar: bool,
    /// Whether the csi-files volumes it injects ask for a certificate naming the pod's IP
    /// (`volumeAttributes.ipSAN: "true"`) when the pod does not say (`athenz.io/ip-san`).
    /// Default false: one issuance per pod, as the pod has no IP when its volume is published;
    /// true costs a second issuance once it has one (docs/design.md §4.10).
    #[serde(default)]
    pub files_ip_san: bool,
    /// Give the SIA containers the pod's namespace, name and uid (POD_NAMESPACE, POD_NAME,
    /// POD_UID) through the downward API.
    #[serde(default = "yes")]
    pub downward_api: bool,
    /// Group (name or gid) the SIA gives read access to the key and ntoken.
    #[serde(default)]
    pub group: Option<String>,
    /// Resources of the SIA containers.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// Extra environment for the SIA containers.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// The SIA containers' securityContext. By default one that Pod Security's `restricted`
    /// level admits, so a tenant namespace enforcing it accepts the injected pods (csi-socket
    /// mode; flex volumes are not allowed there at all): not root, no privilege escalation,
    /// every capability dropped, the runtime's seccomp profile; and a read-only root
    /// filesystem, as the SIA writes only to its volumes.
    #[serde(default = "restricted_security_context")]
    pub security_context: SecurityContext,
}

/// The SIA containers' default securityContext (see [`Template::security_context`]).
pub fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// What the install gives every template: the initializer's own settings, from the
/// `athenz-cluster` ConfigMap, so the image and ZTS are named in one place for both installers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallSettings {
    /// The image holding `athenz-sia` (`SIA_IMAGE`): used when the template names none.
    pub sia_image: Option<String>,
    /// ZTS's base URL (`ZTS_URL`): given to the SIA unless the template's `env` sets its own.
    pub zts_url: Option<String>,
}

fn default_command() -> Vec<String> {
    vec!["athenz-sia".into()]
}
fn default_identity_path() -> String {
    "/var/athenz/identity".into()
}
fn default_credentials_path() -> String {
    "/var/run/athenz".into()
}
fn default_sds_path() -> String {
    "/var/run/athenz-sds".into()
}
fn yes() -> bool {
    true
}

/// The largest template read (a ConfigMap holds at most 1 MiB).
pub const MAX_TEMPLATE: usize = 1024 * 1024;

/// A template that cannot be used; names the field.
#[derive(Debug, Error)]
pub enum TemplateError {
    /// The file could not be read.
    #[error("template {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        reason: String,
    },
    /// A field is invalid.
    #[error("template field {field}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        reason: String,
    },
}

fn field(field: &'static str, reason: impl Into<String>) -> TemplateError {
    TemplateError::Field {
        field,
        reason: reason.into(),
    }
}

impl Template {
    /// Parses and validates YAML, as written (the image may still come from the install: see
    /// [`Template::with_install`]).
    pub fn from_yaml(text: &str) -> Result<Self, TemplateError> {
        if text.len() > MAX_TEMPLATE {
            return Err(TemplateError::Read {
                path: "(yaml)".into(),
                reason: format!("larger than {MAX_TEMPLATE} bytes"),
            });
        }
        let template: Template = serde_saphyr::from_str(text).map_err(|e| TemplateError::Read {
            path: "(yaml)".into(),
            reason: e.to_string(),
        })?;
        template.validate()?;
        Ok(template)
    }

    /// Reads a YAML file, validates it and completes it with the install's settings.
    pub fn from_file(path: &Path, install: &InstallSettings) -> Result<Self, TemplateError> {
        let text = std::fs::read_to_string(path).map_err(|e| TemplateError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_yaml(&text)
            .and_then(|t| t.with_install(install))
            .map_err(|e| match e {
                TemplateError::Read { reason, .. } => TemplateError::Read {
                    path: path.display().to_string(),
                    reason,
                },
                other => other,
            })
    }

    /// The volumes a pod may ask for (see [`Template::allowed_volumes`]).
    pub fn allows(&self, kind: VolumeMode) -> bool {
        kind == self.volume
            || match &self.allowed_volumes {
                Some(allowed) => allowed.contains(&kind),
                None => kind != VolumeMode::Flex,
            }
    }

    /// Whether any volume a pod may get runs the SIA.
    fn any_sia(&self) -> bool {
        VolumeMode::ALL
            .into_iter()
            .any(|k| k.runs_sia() && self.allows(k))
    }

    /// The template with what the install gives: the SIA image when it names none, and ZTS's
    /// URL in the SIA's env when it sets none. Fails, naming the setting, when a volume it allows
    /// runs the SIA and no image is known.
    pub fn with_install(mut self, install: &InstallSettings) -> Result<Self, TemplateError> {
        let sia = self.any_sia();
        if sia && self.image.is_empty() {
            self.image = install.sia_image.clone().unwrap_or_default();
        }
        if sia
            && let Some(url) = install.zts_url.as_deref().filter(|u| !u.is_empty())
            && !self.env.iter().any(|e| e.name == "ZTS_URL")
        {
            self.env.push(EnvVar {
                name: "ZTS_URL".into(),
                value: Some(url.to_owned()),
                value_from: None,
            });
        }
        if sia && (self.image.trim().is_empty() || self.image.contains(char::is_whitespace)) {
            return Err(field(
                "image",
                "must be an image reference (the template's, or the install's SIA_IMAGE)",
            ));
        }
        Ok(self)
    }

    fn validate(&self) -> Result<(), TemplateError> {
        if let Some(allowed) = &self.allowed_volumes
            && !allowed.contains(&self.volume)
        {
            return Err(field(
                "allowedVolumes",
                format!("must include volume ({})", self.volume.name()),
            ));
        }
        // the SIA's settings would be silently ignored: say so instead
        if !self.any_sia()
            && (!self.image.is_empty() || self.group.is_some() || self.native_sidecar)
        {
            return Err(field(
                "volume",
                "csi-files runs nothing in the pod: leave out image, group (the key's group is \
                 the pod's fsGroup) and nativeSidecar",
            ));
        }
        if self.files_ip_san && !self.allows(VolumeMode::CsiFiles) {
            return Err(field(
                "filesIpSan",
                "only csi-files volumes take it, and this template allows none",
            ));
        }
        if self.image.contains(char::is_whitespace) {
            return Err(field("image", "must be an image reference"));
        }
        if let Some(policy) = &self.image_pull_policy
            && !["Always", "IfNotPresent", "Never"].contains(&policy.as_str())
        {
            return Err(field(
                "imagePullPolicy",
                "must be Always, IfNotPresent or Never",
            ));
        }
        if self.command.is_empty() || self.command.iter().any(|c| c.is_empty()) {
            return Err(field("command", "must name the SIA program"));
        }
        for (name, path) in [
            ("identityMountPath", &self.identity_mount_path),
            ("credentialsMountPath", &self.credentials_mount_path),
            ("sdsMountPath", &self.sds_mount_path),
        ] {
            let normal = path.starts_with('/')
                && path.len() > 1
                && !path.ends_with('/')
                && !path
                    .split('/')
                    .skip(1)
                    .any(|c| c.is_empty() || c == "." || c == "..");
            if !normal {
                return Err(field(
                    name,
                    format!("{path:?} must be an absolute, normalised path"),
                ));
            }
        }
        let overlap = |a: &str, b: &str| {
            a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
        };
        if overlap(&self.identity_mount_path, &self.credentials_mount_path) {
            return Err(field(
                "credentialsMountPath",
                "must not overlap identityMountPath",
            ));
        }
        for (name, other) in [
            ("identityMountPath", &self.identity_mount_path),
            ("credentialsMountPath", &self.credentials_mount_path),
        ] {
            if overlap(&self.sds_mount_path, other) {
                return Err(field("sdsMountPath", format!("must not overlap {name}")));
            }
        }
        if let Some(group) = &self.group
            && group.trim().is_empty()
        {
            return Err(field("group", "must not be empty"));
        }
        Ok(())
    }
}
