//! The mutation itself: given a pod, the pod with the identity volume, the credentials volume, the
//! SIA init container, the SIA refresher and the credentials mount in every app container; or,
//! with the CSI driver's files mode, the identity volume alone, mounted read-only in every app
//! container. Pure functions of (template, pod), so every case is tested without a server.

use crate::template::Template;
use athenz_core::volume_mode::{INJECTED_LABEL, IP_SAN_KEY, MODE_KEY, VolumeMode};
use k8s_openapi::api::core::v1::{
    CSIVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, FlexVolumeSource,
    ObjectFieldSelector, Pod, Volume, VolumeMount,
};

/// Name of the identity volume (docs/design.md §4.7), flex or CSI.
pub const IDENTITY_VOLUME: &str = "athenz-identity";
/// The CSI driver (docs/design.md §4.10).
pub const CSI_DRIVER: &str = "csi.athenz.io";
/// Name of the memory-backed credentials volume.
pub const CREDENTIALS_VOLUME: &str = "athenz-credentials";
/// The flex driver.
pub const DRIVER: &str = "athenz/volume-driver";
/// Name of the init container.
pub const INIT_CONTAINER: &str = "athenz-sia-init";
/// Name of the refresher.
pub const REFRESH_CONTAINER: &str = "athenz-sia-refresh";
/// Opt-out annotation.
pub const OPT_OUT_ANNOTATION: &str = "athenz.io/identity";
/// Annotation asking for the refresher's SDS socket (`"true"`), for an Envoy in the pod.
pub const SDS_ANNOTATION: &str = "athenz.io/sds";
/// Name of the memory-backed volume holding the SDS socket.
pub const SDS_VOLUME: &str = "athenz-sds";
/// The socket's name in that volume.
pub const SDS_SOCKET_NAME: &str = "sds.sock";
/// Annotation naming the Athenz roles the pod wants role certificates and tokens for
/// (`<domain>:role.<role>,…`), passed to both SIA containers as `TARGET_DOMAIN_ROLES`.
pub const ROLES_ANNOTATION: &str = "athenz.io/roles";
/// Annotation asking for the refresher's token server on this loopback port.
pub const TOKEN_SERVER_PORT_ANNOTATION: &str = "athenz.io/token-server-port";
/// Annotation asking a csi-files volume's certificate to name the pod's IP (`"true"`) or not
/// (`"false"`), instead of the template's `filesIpSan`: the volume's `ipSAN` attribute.
pub const IP_SAN_ANNOTATION: &str = "athenz.io/ip-san";
/// Annotation choosing the pod's identity volume (`flex`, `csi-socket` or `csi-files`) instead
/// of the template's: a namespace enforcing Pod Security `restricted`, where flex volumes are
/// not allowed, asks for a CSI mode with it.
pub const VOLUME_ANNOTATION: &str = "athenz.io/volume";

/// What the pod asks of the SIA for authorization (docs/design.md §4.11).
#[derive(Debug, Default, PartialEq, Eq)]
struct AuthzRequest {
    /// `TARGET_DOMAIN_ROLES`, as given (validated).
    roles: Option<String>,
    /// The token server's port.
    token_server_port: Option<u16>,
}

impl AuthzRequest {
    fn is_empty(&self) -> bool {
        self.roles.is_none() && self.token_server_port.is_none()
    }
}

fn annotation<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
}

/// Reads and checks the authorization annotations; a bad value is refused naming it.
fn authz_request(pod: &Pod) -> Result<AuthzRequest, Conflict> {
    let shown = |v: &str| v.chars().take(64).collect::<String>();
    let roles = match annotation(pod, ROLES_ANNOTATION).map(str::trim) {
        None | Some("") => None,
        Some(list) => {
            for target in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                athenz_core::names::parse_domain_role("role", target)
                    .map_err(|e| Conflict(format!("annotation {ROLES_ANNOTATION}: {e}")))?;
            }
            Some(list.to_owned())
        }
    };
    let token_server_port = match annotation(pod, TOKEN_SERVER_PORT_ANNOTATION) {
        None => None,
        Some(text) => match text.trim().parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => {
                return Err(Conflict(format!(
                    "annotation {TOKEN_SERVER_PORT_ANNOTATION} must be a port 1-65535, not {:?}",
                    shown(text)
                )));
            }
        },
    };
    Ok(AuthzRequest {
        roles,
        token_server_port,
    })
}

/// Adds the authorization settings to the SIA containers; the template must name ZTS.
fn add_authz(
    t: &Template,
    request: &AuthzRequest,
    init: &mut Container,
    refresher: &mut Container,
) -> Result<(), Conflict> {
    if !t.env.iter().any(|e| e.name == "ZTS_URL") {
        return Err(Conflict(format!(
            "{ROLES_ANNOTATION} / {TOKEN_SERVER_PORT_ANNOTATION}: this cluster's template gives \
             the SIA no ZTS_URL, so it cannot get role certificates or tokens"
        )));
    }
    if let Some(roles) = &request.roles {
        for c in [&mut *init, &mut *refresher] {
            c.env
                .get_or_insert_with(Vec::new)
                .push(value_env("TARGET_DOMAIN_ROLES", roles));
        }
    }
    if let Some(port) = request.token_server_port {
        let env = refresher.env.get_or_insert_with(Vec::new);
        env.push(value_env("TOKEN_SERVER_ADDR", &format!("127.0.0.1:{port}")));
        env.push(value_env("TOKEN_SERVER_REST_API", "true"));
        env.push(value_env("USE_TOKEN_SERVER", "true"));
    }
    Ok(())
}

/// Why a pod is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Annotated `athenz.io/identity: "false"`.
    OptedOut,
    /// Already carries the identity volume.
    AlreadyInjected,
}

/// A pod that cannot be injected (the API server would reject the result).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Conflict(pub String);

/// Decides whether `pod` is skipped.
pub fn skip_reason(pod: &Pod) -> Option<Skip> {
    let opted_out = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPT_OUT_ANNOTATION))
        .is_some_and(|v| v == "false");
    if opted_out {
        return Some(Skip::OptedOut);
    }
    let injected = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vols| vols.iter().any(|v| v.name == IDENTITY_VOLUME));
    injected.then_some(Skip::AlreadyInjected)
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        value: None,
    }
}

fn value_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

fn sia_container(t: &Template, name: &str, verb: &str) -> Container {
    let mut env = vec![
        value_env("ID_FILE", &format!("{}/id", t.identity_mount_path)),
        value_env(
            "ENDPOINT",
            &format!("{}/connect/agent.sock", t.identity_mount_path),
        ),
        value_env("OUT_DIR", &t.credentials_mount_path),
    ];
    if let Some(group) = &t.group {
        env.push(value_env("GROUP", group));
    }
    if t.downward_api {
        env.push(field_env("POD_NAMESPACE", "metadata.namespace"));
        env.push(field_env("POD_NAME", "metadata.name"));
        env.push(field_env("POD_UID", "metadata.uid"));
    }
    env.extend(t.env.iter().cloned());
    let mut args = t.command[1..].to_vec();
    args.push(verb.to_owned());
    Container {
        name: name.to_owned(),
        image: Some(t.image.clone()),
        image_pull_policy: t.image_pull_policy.clone(),
        command: Some(vec![t.command[0].clone()]),
        args: Some(args),
        env: Some(env),
        resources: t.resources.clone(),
        security_context: Some(t.security_context.clone()),
        volume_mounts: Some(vec![
            VolumeMount {
                name: IDENTITY_VOLUME.to_owned(),
                mount_path: t.identity_mount_path.clone(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: CREDENTIALS_VOLUME.to_owned(),
                mount_path: t.credentials_mount_path.clone(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    }
}

/// Whether `pod` asks for SDS (`athenz.io/sds: "true"`); any value but `"true"` or `"false"`
/// is refused, naming it, rather than read as either.
fn wants_sds(pod: &Pod) -> Result<bool, Conflict> {
    match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SDS_ANNOTATION))
        .map(String::as_str)
    {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Conflict(format!(
            "annotation {SDS_ANNOTATION} must be \"true\" or \"false\", not {:?}",
            other.chars().take(64).collect::<String>()
        ))),
    }
}

/// Whether `pod`'s csi-files volume asks for the pod's IP SAN: its [`IP_SAN_ANNOTATION`], else
/// the template's `filesIpSan`. The annotation on a pod whose volume is not csi-files is refused
/// (the SIA's certificate always names the pod's IP), and so is a value other than `"true"` or
/// `"false"`, naming it.
fn wants_ip_san(t: &Template, pod: &Pod, kind: VolumeMode) -> Result<bool, Conflict> {
    let asked = match annotation(pod, IP_SAN_ANNOTATION) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(Conflict(format!(
                "annotation {IP_SAN_ANNOTATION} must be \"true\" or \"false\", not {:?}",
                other.chars().take(64).collect::<String>()
            )));
        }
    };
    if kind != VolumeMode::CsiFiles {
        return match asked {
            None => Ok(false),
            Some(_) => Err(Conflict(format!(
                "annotation {IP_SAN_ANNOTATION}: only a csi-files volume takes it (this pod's \
                 volume is {}, whose SIA certificate always names the pod's IP)",
                kind.name()
            ))),
        };
    }
    Ok(asked.unwrap_or(t.files_ip_san))
}

/// The identity volume `pod` gets: its [`VOLUME_ANNOTATION`], else the template's. The
/// annotation may ask only for a volume the operator allows ([`Template::allows`]); a mode that
/// runs the SIA needs the template's image; any other value is refused, naming it.
fn volume_kind(t: &Template, pod: &Pod) -> Result<VolumeMode, Conflict> {
    let kind = match annotation(pod, VOLUME_ANNOTATION) {
        None => return Ok(t.volume),
        Some(name) => name.parse::<VolumeMode>().map_err(|e| {
            Conflict(format!(
                "annotation {VOLUME_ANNOTATION} must be {}, not {:?}",
                e.expected, e.given
            ))
        })?,
    };
    if !t.allows(kind) {
        return Err(Conflict(format!(
            "annotation {VOLUME_ANNOTATION}: this cluster does not allow {} volumes (its \
             template's allowedVolumes)",
            kind.name()
        )));
    }
    if kind.runs_sia() && t.image.is_empty() {
        return Err(Conflict(format!(
            "annotation {VOLUME_ANNOTATION}: that mode runs the SIA in the pod, and this \
             cluster's template names no SIA image (only csi-files is available)"
        )));
    }
    Ok(kind)
}

/// The pod with everything injected, or why that is impossible.
pub fn inject(t: &Template, pod: &Pod) -> Result<Pod, Conflict> {
    let kind = volume_kind(t, pod)?;
    let sds = wants_sds(pod)?;
    let ip_san = wants_ip_san(t, pod, kind)?;
    let authz = authz_request(pod)?;
    let mut pod = pod.clone();
    // the callback's pod cache holds the pods carrying it (an error below drops this copy)
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(INJECTED_LABEL.to_owned(), kind.name().to_owned());
    let spec = pod
        .spec
        .as_mut()
        .ok_or_else(|| Conflict("the pod has no spec".into()))?;

    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if let Some(v) = volumes
        .iter()
        .find(|v| [CREDENTIALS_VOLUME, IDENTITY_VOLUME, SDS_VOLUME].contains(&v.name.as_str()))
    {
        return Err(Conflict(format!(
            "the pod already has a volume named {:?}",
            v.name
        )));
    }
    volumes.push(identity_volume(kind, ip_san));
    if kind == VolumeMode::CsiFiles {
        if sds {
            return Err(Conflict(format!(
                "{SDS_ANNOTATION}: SDS is served by the SIA refresher, and the pod's volume \
                 (csi-files) runs none; use the files"
            )));
        }
        if !authz.is_empty() {
            return Err(Conflict(format!(
                "{ROLES_ANNOTATION} / {TOKEN_SERVER_PORT_ANNOTATION}: role certificates and \
                 tokens come from the SIA, and the pod's volume (csi-files) runs none"
            )));
        }
        mount_in_apps(spec, IDENTITY_VOLUME, &t.credentials_mount_path)?;
        return Ok(pod);
    }
    volumes.push(memory_volume(CREDENTIALS_VOLUME));

    let taken: Vec<String> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.clone())
        .collect();
    for ours in [INIT_CONTAINER, REFRESH_CONTAINER] {
        if taken.iter().any(|n| n == ours) {
            return Err(Conflict(format!(
                "the pod already has a container named {ours:?}"
            )));
        }
    }

    mount_in_apps(spec, CREDENTIALS_VOLUME, &t.credentials_mount_path)?;

    // The init container runs first, so every later init container and app finds the files; a
    // native refresher starts right after it and keeps running beside the app.
    let mut init_sia = sia_container(t, INIT_CONTAINER, "init");
    let mut refresher = sia_container(t, REFRESH_CONTAINER, "refresh");
    if !authz.is_empty() {
        add_authz(t, &authz, &mut init_sia, &mut refresher)?;
    }
    let mut init = vec![init_sia];
    if sds {
        // the refresher serves the socket; the apps (the Envoy among them) reach it through a
        // read-only mount: connecting to a socket needs no write access to its filesystem
        spec.volumes
            .get_or_insert_with(Vec::new)
            .push(memory_volume(SDS_VOLUME));
        mount_in_apps(spec, SDS_VOLUME, &t.sds_mount_path)?;
        refresher.env.get_or_insert_with(Vec::new).push(value_env(
            "SDS_SOCKET",
            &format!("{}/{SDS_SOCKET_NAME}", t.sds_mount_path),
        ));
        refresher
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: SDS_VOLUME.to_owned(),
                mount_path: t.sds_mount_path.clone(),
                ..VolumeMount::default()
            });
    }
    if t.native_sidecar {
        refresher.restart_policy = Some("Always".to_owned());
        init.push(refresher);
    } else {
        spec.containers.push(refresher);
    }
    let existing = spec.init_containers.take().unwrap_or_default();
    init.extend(existing);
    spec.init_containers = Some(init);
    Ok(pod)
}

/// A memory-backed emptyDir called `name` (credentials and the SDS socket never touch disk).
fn memory_volume(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_owned()),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The identity volume of `kind`: read-only; for CSI, the mode as its attribute, and
/// `ipSAN: "true"` when `ip_san` (csi-files only; the driver's default is false).
fn identity_volume(kind: VolumeMode, ip_san: bool) -> Volume {
    let csi = |mode: &str| {
        let mut attributes =
            std::collections::BTreeMap::from([(MODE_KEY.to_owned(), mode.to_owned())]);
        if ip_san {
            attributes.insert(IP_SAN_KEY.to_owned(), "true".to_owned());
        }
        CSIVolumeSource {
            driver: CSI_DRIVER.to_owned(),
            read_only: Some(true),
            volume_attributes: Some(attributes),
            ..CSIVolumeSource::default()
        }
    };
    let mut volume = Volume {
        name: IDENTITY_VOLUME.to_owned(),
        ..Volume::default()
    };
    match kind.csi_attribute() {
        None => {
            volume.flex_volume = Some(FlexVolumeSource {
                driver: DRIVER.to_owned(),
                read_only: Some(true),
                ..FlexVolumeSource::default()
            });
        }
        Some(mode) => volume.csi = Some(csi(mode)),
    }
    volume
}

/// Every app container mounts volume `name` read-only at `path`.
fn mount_in_apps(
    spec: &mut k8s_openapi::api::core::v1::PodSpec,
    name: &str,
    path: &str,
) -> Result<(), Conflict> {
    for c in &mut spec.containers {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if mounts.iter().any(|m| m.mount_path == path) {
            return Err(Conflict(format!(
                "container {:?} already mounts something at {path}",
                c.name
            )));
        }
        mounts.push(VolumeMount {
            name: name.to_owned(),
            mount_path: path.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(native: bool) -> Template {
        Template::from_yaml(&format!(
            "image: registry.example/athenz-sia:1.0\nnativeSidecar: {native}\n"
        ))
        .unwrap()
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "media-sports"},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]}
        }))
        .unwrap()
    }

    #[test]
    fn native_and_classic_sidecars() {
        let native = inject(&template(true), &pod()).unwrap();
        let spec = native.spec.unwrap();
        let inits = spec.init_containers.unwrap();
        assert_eq!(inits.len(), 2);
        assert_eq!(inits[1].restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.containers.len(), 1);

        let classic = inject(&template(false), &pod()).unwrap();
        let spec = classic.spec.unwrap();
        assert_eq!(spec.init_containers.unwrap().len(), 1);
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[1].name, REFRESH_CONTAINER);
        assert_eq!(
            spec.containers[1].args.as_deref(),
            Some(&["refresh".to_owned()][..])
        );
    }

    #[test]
    fn an_injected_pod_is_labelled_with_its_volume_mode_and_keeps_its_own_labels() {
        let mut labelled = pod();
        labelled.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        for (annotation, mode) in [
            (None, "csi-socket"),
            (Some("csi-files"), "csi-files"),
            (Some("flex"), "flex"),
        ] {
            let mut asking = labelled.clone();
            if let Some(value) = annotation {
                asking.metadata.annotations =
                    Some([(VOLUME_ANNOTATION.to_owned(), value.to_owned())].into());
            }
            let t = Template::from_yaml(
                "image: registry.example/athenz-sia:1.0\n\
                 allowedVolumes: [flex, csi-socket, csi-files]\n",
            )
            .unwrap();
            let injected = inject(&t, &asking).unwrap();
            let labels = injected.metadata.labels.unwrap();
            assert_eq!(labels.get(INJECTED_LABEL).map(String::as_str), Some(mode));
            assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        }
    }

    #[test]
    fn sia_containers_pass_pod_security_restricted_unless_the_template_says_otherwise() {
        let injected = inject(&template(true), &pod()).unwrap();
        let inits = injected.spec.unwrap().init_containers.unwrap();
        assert_eq!(inits.len(), 2);
        for sia in &inits {
            let sc = sia.security_context.as_ref().unwrap();
            // the four checks of the restricted level, and the read-only root
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", sia.name);
            assert_eq!(sc.run_as_non_root, Some(true), "{}", sia.name);
            let drop = sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap();
            assert_eq!(drop, &["ALL".to_owned()], "{}", sia.name);
            assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", sia.name);
        }
        let own = Template::from_yaml(
            "image: registry.example/athenz-sia:1.0\nsecurityContext:\n  runAsUser: 1234\n",
        )
        .unwrap();
        let injected = inject(&own, &pod()).unwrap();
        let init = &injected.spec.unwrap().init_containers.unwrap()[0];
        let sc = init.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_user, Some(1234));
        assert_eq!(
            sc.run_as_non_root, None,
            "the template's own context replaces the default"
        );
        let bad = Template::from_yaml(
            "image: registry.example/athenz-sia:1.0\nsecurityContext:\n  runAsUser: root\n",
        );
        assert!(bad.unwrap_err().to_string().contains("runAsUser"));
    }

    #[test]
    fn the_volume_annotation_chooses_the_mode_and_refuses_what_it_cannot_give() {
        let annotated_volume = |value: &str| with_annotations(&[(VOLUME_ANNOTATION, value)]);
        // the default (csi-socket) template, a pod asking for csi-files: the CSI volume alone
        let files = inject(&template(true), &annotated_volume("csi-files")).unwrap();
        let spec = files.spec.unwrap();
        assert!(spec.init_containers.is_none());
        let volumes = spec.volumes.unwrap();
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].csi.as_ref().unwrap().driver, CSI_DRIVER);
        // csi-socket: the CSI volume and the SIA containers
        let socket = inject(&template(true), &annotated_volume("csi-socket")).unwrap();
        let spec = socket.spec.unwrap();
        assert_eq!(spec.init_containers.unwrap().len(), 2);
        assert!(spec.volumes.unwrap()[0].csi.is_some());
        // flex only where the operator allows it
        let refused = inject(&template(true), &annotated_volume("flex"))
            .unwrap_err()
            .0;
        assert!(refused.contains("does not allow flex"), "{refused}");
        let allowing = Template::from_yaml(
            "image: registry.example/athenz-sia:1.0\nallowedVolumes: [csi-socket, flex]\n",
        )
        .unwrap();
        let flex = inject(&allowing, &annotated_volume("flex")).unwrap();
        assert!(flex.spec.unwrap().volumes.unwrap()[0].flex_volume.is_some());
        let refused = inject(&allowing, &annotated_volume("csi-files"))
            .unwrap_err()
            .0;
        assert!(refused.contains("does not allow csi-files"), "{refused}");
        // a csi-files template has no SIA image to run
        let refused = inject(
            &csi_template("csi-files", false),
            &annotated_volume("csi-socket"),
        );
        assert!(refused.unwrap_err().0.contains("names no SIA image"));
        for bad in ["hostPath", "", &"x".repeat(10_000)] {
            let refused = inject(&template(true), &annotated_volume(bad))
                .unwrap_err()
                .0;
            assert!(refused.contains(VOLUME_ANNOTATION), "{refused}");
            assert!(
                refused.len() < 200,
                "the refusal quotes at most 64 characters"
            );
        }
    }

    #[test]
    fn skips_and_conflicts() {
        let injected = inject(&template(true), &pod()).unwrap();
        assert_eq!(skip_reason(&injected), Some(Skip::AlreadyInjected));
        let mut opted = pod();
        opted.metadata.annotations =
            Some([(OPT_OUT_ANNOTATION.to_owned(), "false".to_owned())].into());
        assert_eq!(skip_reason(&opted), Some(Skip::OptedOut));
        assert_eq!(skip_reason(&pod()), None);

        let mut clash: Pod = pod();
        clash.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "x".into(),
            mount_path: "/var/run/athenz".into(),
            ..VolumeMount::default()
        }]);
        assert!(
            inject(&template(true), &clash)
                .unwrap_err()
                .0
                .contains("already mounts")
        );
        let mut named = pod();
        named.spec.as_mut().unwrap().containers[0].name = INIT_CONTAINER.into();
        assert!(inject(&template(true), &named).is_err());
    }

    fn csi_template(volume: &str, image: bool) -> Template {
        let image = if image {
            "image: registry.example/athenz-sia:1.0\n"
        } else {
            ""
        };
        Template::from_yaml(&format!("volume: {volume}\n{image}")).unwrap()
    }

    #[test]
    fn csi_files_injects_only_the_volume_and_read_only_mounts() {
        let injected = inject(&csi_template("csi-files", false), &pod()).unwrap();
        let spec = injected.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        let csi = volumes[0].csi.as_ref().unwrap();
        assert_eq!(volumes[0].name, IDENTITY_VOLUME);
        assert_eq!(csi.driver, "csi.athenz.io");
        assert_eq!(csi.read_only, Some(true));
        assert_eq!(
            csi.volume_attributes
                .as_ref()
                .unwrap()
                .get(MODE_KEY)
                .map(String::as_str),
            Some("files")
        );
        assert!(spec.init_containers.is_none());
        assert_eq!(spec.containers.len(), 1);
        let mounts = spec.containers[0].volume_mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].name, IDENTITY_VOLUME);
        assert_eq!(mounts[0].mount_path, "/var/run/athenz");
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(skip_reason(&injected), Some(Skip::AlreadyInjected));
    }

    /// The injected identity volume's `ipSAN` attribute, if any.
    fn ip_san_attribute(t: &Template, p: &Pod) -> Option<String> {
        let injected = inject(t, p).unwrap();
        let volumes = injected.spec.unwrap().volumes.unwrap();
        let identity = volumes.iter().find(|v| v.name == IDENTITY_VOLUME).unwrap();
        identity
            .csi
            .as_ref()
            .and_then(|c| c.volume_attributes.as_ref())
            .and_then(|a| a.get(IP_SAN_KEY).cloned())
    }

    #[test]
    fn a_files_volume_names_the_pod_ip_when_the_pod_or_the_template_asks() {
        let files = csi_template("csi-files", false);
        let files_with_ip = Template::from_yaml("volume: csi-files\nfilesIpSan: true\n").unwrap();
        // the template's default: no IP SAN, and no attribute (the driver's default)
        assert_eq!(ip_san_attribute(&files, &pod()), None);
        assert_eq!(
            ip_san_attribute(&files_with_ip, &pod()).as_deref(),
            Some("true")
        );
        // the pod's annotation wins either way
        let asks = with_annotations(&[(IP_SAN_ANNOTATION, "true")]);
        let declines = with_annotations(&[(IP_SAN_ANNOTATION, "false")]);
        assert_eq!(ip_san_attribute(&files, &asks).as_deref(), Some("true"));
        assert_eq!(ip_san_attribute(&files_with_ip, &declines), None);
        // a csi-socket template whose pod asks for csi-files
        let socket = csi_template("csi-socket", true);
        let files_pod = with_annotations(&[
            (VOLUME_ANNOTATION, "csi-files"),
            (IP_SAN_ANNOTATION, "true"),
        ]);
        assert_eq!(
            ip_san_attribute(&socket, &files_pod).as_deref(),
            Some("true")
        );
    }

    #[test]
    fn ip_san_refusals_name_the_annotation_and_the_reason() {
        let files = csi_template("csi-files", false);
        let err = inject(&files, &with_annotations(&[(IP_SAN_ANNOTATION, "yes")])).unwrap_err();
        assert!(
            err.0.contains(IP_SAN_ANNOTATION) && err.0.contains("\"yes\""),
            "{err}"
        );
        // the SIA's modes always name the IP: asking either way is refused, not ignored
        let socket = csi_template("csi-socket", true);
        for value in ["true", "false"] {
            let err =
                inject(&socket, &with_annotations(&[(IP_SAN_ANNOTATION, value)])).unwrap_err();
            assert!(
                err.0.contains(IP_SAN_ANNOTATION) && err.0.contains("csi-socket"),
                "{err}"
            );
        }
        // a template that sets it where no csi-files volume can be had
        let err = Template::from_yaml(
            "image: registry.example/athenz-sia:1.0\nvolume: csi-socket\nallowedVolumes: [csi-socket]\nfilesIpSan: true\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("filesIpSan"), "{err}");
    }

    #[test]
    fn csi_socket_injects_the_csi_volume_and_the_sia() {
        let injected = inject(&csi_template("csi-socket", true), &pod()).unwrap();
        let spec = injected.spec.unwrap();
        let volumes = spec.volumes.unwrap();
        let csi = volumes[0].csi.as_ref().unwrap();
        assert!(volumes[0].flex_volume.is_none());
        assert_eq!(
            csi.volume_attributes
                .as_ref()
                .unwrap()
                .get(MODE_KEY)
                .map(String::as_str),
            Some("socket")
        );
        assert_eq!(volumes[1].name, CREDENTIALS_VOLUME);
        assert_eq!(spec.init_containers.unwrap()[0].name, INIT_CONTAINER);
        assert_eq!(spec.containers[1].name, REFRESH_CONTAINER);
    }

    fn with_annotations(pairs: &[(&str, &str)]) -> Pod {
        let mut p = pod();
        p.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        p
    }

    fn env_of(c: &Container, name: &str) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    fn template_with_zts() -> Template {
        let mut t = template(false);
        t.env
            .push(value_env("ZTS_URL", "https://zts.example:4443/zts/v1"));
        t.env
            .push(value_env("SERVER_CA_CERT", "/etc/athenz/zts-ca.pem"));
        t
    }

    #[test]
    fn roles_and_token_server_port_reach_the_sia_containers() {
        let pod = with_annotations(&[
            (
                ROLES_ANNOTATION,
                "media.sports:role.readers,sys.auth:role.admin",
            ),
            (TOKEN_SERVER_PORT_ANNOTATION, "8880"),
        ]);
        let spec = inject(&template_with_zts(), &pod).unwrap().spec.unwrap();
        let init = &spec.init_containers.as_ref().unwrap()[0];
        let refresher = spec
            .containers
            .iter()
            .find(|c| c.name == REFRESH_CONTAINER)
            .unwrap();
        for c in [init, refresher] {
            assert_eq!(
                env_of(c, "TARGET_DOMAIN_ROLES").as_deref(),
                Some("media.sports:role.readers,sys.auth:role.admin")
            );
            assert!(
                env_of(c, "ZTS_URL").is_some(),
                "the template's ZTS settings"
            );
        }
        assert_eq!(
            env_of(refresher, "TOKEN_SERVER_ADDR").as_deref(),
            Some("127.0.0.1:8880")
        );
        assert_eq!(
            env_of(refresher, "TOKEN_SERVER_REST_API").as_deref(),
            Some("true")
        );
        assert_eq!(
            env_of(refresher, "USE_TOKEN_SERVER").as_deref(),
            Some("true")
        );
        assert_eq!(
            env_of(init, "TOKEN_SERVER_ADDR"),
            None,
            "init serves nothing"
        );
        // no annotations: none of it
        let plain = inject(&template_with_zts(), &super::tests::pod())
            .unwrap()
            .spec
            .unwrap();
        assert!(
            plain
                .containers
                .iter()
                .all(|c| env_of(c, "TARGET_DOMAIN_ROLES").is_none())
        );
    }

    #[test]
    fn bad_authorization_annotations_are_refused_naming_them() {
        for (annotations, says) in [
            (vec![(ROLES_ANNOTATION, "media.sports")], "athenz.io/roles"),
            (
                vec![(ROLES_ANNOTATION, "media.sports:role.a b")],
                "athenz.io/roles",
            ),
            (
                vec![(ROLES_ANNOTATION, "x:role.r,../etc:role.r")],
                "athenz.io/roles",
            ),
            (
                vec![(TOKEN_SERVER_PORT_ANNOTATION, "0")],
                "athenz.io/token-server-port",
            ),
            (
                vec![(TOKEN_SERVER_PORT_ANNOTATION, "70000")],
                "athenz.io/token-server-port",
            ),
            (
                vec![(TOKEN_SERVER_PORT_ANNOTATION, "http")],
                "athenz.io/token-server-port",
            ),
        ] {
            let err = inject(&template_with_zts(), &with_annotations(&annotations)).unwrap_err();
            assert!(err.0.contains(says), "{annotations:?}: {err}");
        }
        // a template without ZTS cannot serve them
        let asked = with_annotations(&[(ROLES_ANNOTATION, "media.sports:role.readers")]);
        assert!(
            inject(&template(false), &asked)
                .unwrap_err()
                .0
                .contains("ZTS_URL")
        );
        // nor can files mode, which runs no SIA
        let err = inject(&csi_template("csi-files", false), &asked).unwrap_err();
        assert!(err.0.contains("csi-files"), "{err}");
    }

    fn annotated(value: &str) -> Pod {
        let mut p = pod();
        p.metadata.annotations = Some([(SDS_ANNOTATION.to_owned(), value.to_owned())].into());
        p
    }

    #[test]
    fn sds_annotation_gives_the_refresher_a_socket_the_apps_can_reach() {
        for native in [true, false] {
            let injected = inject(&template(native), &annotated("true")).unwrap();
            let spec = injected.spec.unwrap();
            let volumes = spec.volumes.unwrap();
            let sds = volumes.iter().find(|v| v.name == SDS_VOLUME).unwrap();
            assert_eq!(
                sds.empty_dir.as_ref().unwrap().medium.as_deref(),
                Some("Memory")
            );
            let refresher = spec
                .init_containers
                .iter()
                .flatten()
                .chain(&spec.containers)
                .find(|c| c.name == REFRESH_CONTAINER)
                .unwrap();
            let env = refresher.env.as_ref().unwrap();
            let socket = env.iter().find(|e| e.name == "SDS_SOCKET").unwrap();
            assert_eq!(
                socket.value.as_deref(),
                Some("/var/run/athenz-sds/sds.sock")
            );
            let mount = |c: &Container| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .find(|m| m.name == SDS_VOLUME)
                    .cloned()
            };
            let served = mount(refresher).unwrap();
            assert_eq!(served.mount_path, "/var/run/athenz-sds");
            assert_ne!(served.read_only, Some(true));
            let app = &spec.containers[0];
            assert_eq!(app.name, "app");
            let reached = mount(app).unwrap();
            assert_eq!(reached.mount_path, "/var/run/athenz-sds");
            assert_eq!(reached.read_only, Some(true));
            // the init container does not serve SDS
            let init = &spec.init_containers.as_ref().unwrap()[0];
            assert_eq!(init.name, INIT_CONTAINER);
            assert!(mount(init).is_none());
            assert!(!init.env.iter().flatten().any(|e| e.name == "SDS_SOCKET"));
        }
        // not asked, or asked "false": nothing of SDS
        for p in [pod(), annotated("false")] {
            let spec = inject(&template(true), &p).unwrap().spec.unwrap();
            assert!(!spec.volumes.unwrap().iter().any(|v| v.name == SDS_VOLUME));
        }
    }

    #[test]
    fn sds_refusals_name_the_reason() {
        let err = inject(&template(true), &annotated("yes please")).unwrap_err();
        assert!(
            err.0.contains("athenz.io/sds") && err.0.contains("yes please"),
            "{err}"
        );
        let err = inject(&csi_template("csi-files", false), &annotated("true")).unwrap_err();
        assert!(err.0.contains("csi-files"), "{err}");
        let mut clash = annotated("true");
        clash.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "x".into(),
            mount_path: "/var/run/athenz-sds".into(),
            ..VolumeMount::default()
        }]);
        let err = inject(&template(true), &clash).unwrap_err();
        assert!(err.0.contains("/var/run/athenz-sds"), "{err}");
        let bad = Template::from_yaml(
            "image: registry.example/athenz-sia:1.0\nsdsMountPath: /var/run/athenz/sds\n",
        )
        .unwrap_err();
        assert!(bad.to_string().contains("sdsMountPath"), "{bad}");
    }

    #[test]
    fn a_pod_with_a_volume_of_our_name_is_a_conflict() {
        let mut clash = pod();
        clash.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: CREDENTIALS_VOLUME.into(),
            ..Volume::default()
        }]);
        for kind in ["flex", "csi-socket"] {
            let err = inject(&csi_template(kind, true), &clash).unwrap_err();
            assert!(err.0.contains("athenz-credentials"), "{err}");
        }
    }
}
