//! The injection template (YAML, from a ConfigMap): what to add to pods. Validated at start with
//! errors naming the field, so a bad ConfigMap stops the webhook instead of breaking pods.

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
    /// Which identity volume pods get (and so whether the SIA runs in them).
    #[serde(default)]
    pub volume: VolumeKind,
    /// Image with `athenz-sia` (not needed with `volume: csi-files`: nothing runs in the pod).
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

/// The identity volume the initializer injects (DESIGN.md 4.7, 4.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeKind {
    /// The flex volume `athenz/volume-driver`, the SIA init container and refresher.
    #[default]
    Flex,
    /// The CSI volume `csi.athenz.io` in socket mode (the flex layout), the same SIA containers.
    CsiSocket,
    /// The CSI volume `csi.athenz.io` in files mode, mounted read-only where the apps read their
    /// credentials: the agent writes and rotates them, no container is added.
    CsiFiles,
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

/// A template that cannot be used; names the field.
#[derive(Debug, Error)]
pub enum TemplateError {
    /// The file could not be read.
    #[error("template {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A field is invalid.
    #[error("template field {field}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// Why.
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
    /// Parses and validates YAML.
    pub fn from_yaml(text: &str) -> Result<Self, TemplateError> {
        let template: Template = serde_saphyr::from_str(text).map_err(|e| TemplateError::Read {
            path: "(yaml)".into(),
            reason: e.to_string(),
        })?;
        template.validate()?;
        Ok(template)
    }

    /// Reads and validates a YAML file.
    pub fn from_file(path: &Path) -> Result<Self, TemplateError> {
        let text = std::fs::read_to_string(path).map_err(|e| TemplateError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_yaml(&text).map_err(|e| match e {
            TemplateError::Read { reason, .. } => TemplateError::Read {
                path: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    fn validate(&self) -> Result<(), TemplateError> {
        if self.volume == VolumeKind::CsiFiles {
            // the SIA's settings would be silently ignored: say so instead
            if !self.image.is_empty() || self.group.is_some() || self.native_sidecar {
                return Err(field(
                    "volume",
                    "csi-files runs nothing in the pod: leave out image, group (the key's \
                     group is the pod's fsGroup) and nativeSidecar",
                ));
            }
        } else if self.image.trim().is_empty() || self.image.contains(char::is_whitespace) {
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
