//! What kubelet asks in `NodePublishVolume`, checked before anything touches a path
//! (docs/design.md §4.10): an inline ephemeral, mount-access volume with the pod's info, a known
//! `mode` (and, in files mode, `ipSAN`), and nothing else; it is always mounted read-only. Every
//! refusal names the field.

use athenz_core::csi::v1::{NodePublishVolumeRequest, volume_capability};
use athenz_core::names::Quoted;
use athenz_core::pod_info::{CSI_KEYS, PodInfo, PodInfoError};
use athenz_core::volume::CsiVolume;
use athenz_core::volume_mode::VolumeMode;
use athenz_core::volume_mount::VolumeRequest;
use athenz_core::volume_mount::mount_dir;
use tonic::{Code, Status};

/// The volume-context key kubelet sets for an inline ephemeral volume.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";
pub use athenz_core::volume_mode::{IP_SAN_KEY, MODE_KEY};
/// Longest `volume_id` accepted (kubelet's are `csi-` + 64 hex).
pub const MAX_VOLUME_ID_LEN: usize = 128;
/// Most volume-context entries accepted (kubelet sends five, a pod spec one).
pub const MAX_CONTEXT_ENTRIES: usize = 32;
/// Prefix of the keys kubelet adds to the volume context.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// A checked publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// `target_path`, exactly as kubelet sent it (the volume id is computed over it).
    pub target: String,
    /// What to mount and record.
    pub request: VolumeRequest,
}

impl Publish {
    /// The mode asked for.
    pub fn mode(&self) -> VolumeMode {
        self.request
            .csi
            .as_ref()
            .map_or(VolumeMode::CsiFiles, |c| c.mode)
    }
}

fn invalid(message: impl Into<String>) -> Status {
    Status::new(Code::InvalidArgument, message.into())
}

/// Checks `volume_id` (required, printable, bounded).
pub fn check_volume_id(volume_id: &str) -> Result<(), Status> {
    if volume_id.is_empty() {
        return Err(invalid("volume_id is required"));
    }
    if volume_id.len() > MAX_VOLUME_ID_LEN
        || !volume_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(invalid(format!(
            "volume_id {} is not an id kubelet makes (at most {MAX_VOLUME_ID_LEN} of [A-Za-z0-9._-])",
            Quoted::new(volume_id)
        )));
    }
    Ok(())
}

/// Checks `target_path` (required, absolute, normalised).
pub fn check_target_path(target: &str) -> Result<(), Status> {
    if target.is_empty() {
        return Err(invalid("target_path is required"));
    }
    mount_dir::check_form(target).map_err(|e| invalid(format!("target_path: {e}")))
}

impl Publish {
    /// Checks a `NodePublishVolume` request.
    pub fn from_request(req: &NodePublishVolumeRequest) -> Result<Self, Status> {
        check_volume_id(&req.volume_id)?;
        check_target_path(&req.target_path)?;
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        let group = match &capability.access_type {
            Some(volume_capability::AccessType::Mount(mount)) => {
                parse_group(&mount.volume_mount_group)?
            }
            Some(volume_capability::AccessType::Block(_)) => {
                return Err(invalid(
                    "volume_capability.block: only mount access is supported",
                ));
            }
            None => return Err(invalid("volume_capability.access_type is required (mount)")),
        };
        use volume_capability::access_mode::Mode;
        match capability
            .access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok())
        {
            Some(
                Mode::SingleNodeWriter
                | Mode::SingleNodeReaderOnly
                | Mode::SingleNodeSingleWriter
                | Mode::SingleNodeMultiWriter,
            ) => {}
            Some(other) => {
                return Err(invalid(format!(
                    "volume_capability.access_mode {other:?}: the volume exists on one node only"
                )));
            }
            None => return Err(invalid("volume_capability.access_mode is required")),
        }
        // `readonly` is not required: the volume is mounted read-only whatever the pod spec says
        // (`read_write: false` below), since its content is the agent's alone. Refusing `false`
        // would only fail pods (and Kubernetes' own storage e2e suite, which never sets
        // `csi.readOnly`) at mount time for a flag that changes nothing.
        let context = &req.volume_context;
        if context.len() > MAX_CONTEXT_ENTRIES {
            return Err(invalid(format!(
                "volume_context has {} entries, more than {MAX_CONTEXT_ENTRIES}",
                context.len()
            )));
        }
        if context.get(EPHEMERAL_KEY).map(String::as_str) != Some("true") {
            return Err(Status::failed_precondition(format!(
                "volume_context {EPHEMERAL_KEY:?} must be \"true\": csi.athenz.io serves inline ephemeral volumes only (volumeLifecycleModes: [Ephemeral])"
            )));
        }
        if let Some(key) = context.keys().find(|k| {
            !k.starts_with(KUBELET_PREFIX) && ![MODE_KEY, IP_SAN_KEY].contains(&k.as_str())
        }) {
            return Err(invalid(format!(
                "volume_context has unknown attribute {} (the known ones are {MODE_KEY:?} and {IP_SAN_KEY:?})",
                Quoted::new(key)
            )));
        }
        let mode = VolumeMode::from_csi_attribute(context.get(MODE_KEY).map(String::as_str))
            .map_err(|e| {
                invalid(format!(
                    "volume_context {MODE_KEY:?} must be \"files\" or \"socket\" (got {})",
                    Quoted::new(&e.given)
                ))
            })?;
        let ip_san = parse_ip_san(context.get(IP_SAN_KEY).map(String::as_str), mode)?;
        let pod = PodInfo::from_attributes(&CSI_KEYS, |k| context.get(k).map(String::as_str))
            .map_err(|e| match e {
                PodInfoError::Missing(key) => Status::failed_precondition(format!(
                    "volume_context {key:?} is missing: the CSIDriver object must set podInfoOnMount: true"
                )),
                PodInfoError::Name(e) => invalid(format!("volume_context {e}")),
            })?;
        Ok(Self {
            target: req.target_path.clone(),
            request: VolumeRequest {
                pod,
                read_write: false,
                csi: Some(CsiVolume {
                    volume_id: req.volume_id.clone(),
                    mode,
                    group,
                    ip_san,
                }),
            },
        })
    }
}

/// `ipSAN`: `"true"` or `"false"`, files mode only (in socket mode the SIA in the pod asks for
/// its certificate, always with the pod's IP).
fn parse_ip_san(text: Option<&str>, mode: VolumeMode) -> Result<bool, Status> {
    let Some(text) = text else {
        return Ok(false);
    };
    if mode != VolumeMode::CsiFiles {
        return Err(invalid(format!(
            "volume_context {IP_SAN_KEY:?} is for mode \"files\" only (in socket mode the SIA's certificate always names the pod's IP)"
        )));
    }
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(invalid(format!(
            "volume_context {IP_SAN_KEY:?} must be \"true\" or \"false\" (got {})",
            Quoted::new(other)
        ))),
    }
}

/// `volume_mount_group`: the pod's fsGroup, a numeric gid (empty: none).
fn parse_group(text: &str) -> Result<Option<u32>, Status> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u32>().map(Some).map_err(|_| {
        invalid(format!(
            "volume_capability.mount.volume_mount_group must be a numeric gid (got {})",
            Quoted::new(text)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::csi::v1::VolumeCapability;
    use athenz_core::csi::v1::volume_capability::{
        AccessMode, AccessType, BlockVolume, MountVolume,
    };

    const UID: &str = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";

    /// What kubelet sends for `csi: {driver: csi.athenz.io, readOnly: true, volumeAttributes:
    /// {mode: files}}` with podInfoOnMount (pkg/volume/csi/csi_mounter.go).
    pub(crate) fn kubelet_request() -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: format!("csi-{}", "ab".repeat(32)),
            target_path: format!(
                "/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/athenz-identity/mount"
            ),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            readonly: true,
            volume_context: [
                (MODE_KEY, "files"),
                ("csi.storage.k8s.io/pod.name", "web-7d9f"),
                ("csi.storage.k8s.io/pod.namespace", "media-sports"),
                ("csi.storage.k8s.io/pod.uid", UID),
                ("csi.storage.k8s.io/serviceAccount.name", "web"),
                (EPHEMERAL_KEY, "true"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn kubelet_publish_is_accepted() {
        let p = Publish::from_request(&kubelet_request()).unwrap();
        assert_eq!(p.mode(), VolumeMode::CsiFiles);
        assert_eq!(p.request.pod.pod_uid, UID);
        assert_eq!(p.request.csi.as_ref().unwrap().group, None);
        let mut socket = kubelet_request();
        socket
            .volume_context
            .insert(MODE_KEY.into(), "socket".into());
        assert_eq!(
            Publish::from_request(&socket).unwrap().mode(),
            VolumeMode::CsiSocket
        );
        let mut default = kubelet_request();
        default.volume_context.remove(MODE_KEY);
        assert_eq!(
            Publish::from_request(&default).unwrap().mode(),
            VolumeMode::CsiFiles
        );
        let mut grouped = kubelet_request();
        grouped.volume_capability = Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                volume_mount_group: "2000".into(),
                ..Default::default()
            })),
            access_mode: Some(AccessMode { mode: 7 }),
        });
        let p = Publish::from_request(&grouped).unwrap();
        assert_eq!(p.request.csi.unwrap().group, Some(2000));
    }

    #[test]
    fn a_files_volume_names_the_pod_ip_only_when_asked() {
        let ip_san = |value: Option<&str>| {
            let mut req = kubelet_request();
            if let Some(v) = value {
                req.volume_context.insert(IP_SAN_KEY.into(), v.into());
            }
            Publish::from_request(&req)
                .unwrap()
                .request
                .csi
                .unwrap()
                .ip_san
        };
        assert!(
            !ip_san(None),
            "one issuance unless the pod spec asks for the IP"
        );
        assert!(!ip_san(Some("false")));
        assert!(ip_san(Some("true")));
    }

    /// A pod spec without `csi.readOnly: true` still gets a read-only volume: the flag is
    /// accepted either way and never makes the mount writable.
    #[test]
    fn readonly_false_is_accepted_and_still_mounts_read_only() {
        let mut writable = kubelet_request();
        writable.readonly = false;
        let p = Publish::from_request(&writable).unwrap();
        assert!(
            !p.request.read_write,
            "the identity volume is never writable"
        );
        assert_eq!(
            p.request,
            Publish::from_request(&kubelet_request()).unwrap().request
        );
    }

    #[test]
    fn every_refusal_names_its_field_and_code() {
        type Change = Box<dyn Fn(&mut NodePublishVolumeRequest)>;
        let cases: Vec<(Change, Code, &str)> = vec![
            (
                Box::new(|r| r.volume_id.clear()),
                Code::InvalidArgument,
                "volume_id",
            ),
            (
                Box::new(|r| r.volume_id = "a/b".into()),
                Code::InvalidArgument,
                "volume_id",
            ),
            (
                Box::new(|r| r.volume_id = "v".repeat(200)),
                Code::InvalidArgument,
                "volume_id",
            ),
            (
                Box::new(|r| r.target_path.clear()),
                Code::InvalidArgument,
                "target_path",
            ),
            (
                Box::new(|r| r.target_path = "relative/mount".into()),
                Code::InvalidArgument,
                "target_path",
            ),
            (
                Box::new(|r| r.target_path = "/var/lib/kubelet/../etc".into()),
                Code::InvalidArgument,
                "target_path",
            ),
            (
                Box::new(|r| r.target_path = format!("/{}", "a".repeat(5000))),
                Code::InvalidArgument,
                "target_path",
            ),
            (
                Box::new(|r| r.volume_capability = None),
                Code::InvalidArgument,
                "volume_capability",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_type =
                        Some(AccessType::Block(BlockVolume {}))
                }),
                Code::InvalidArgument,
                "volume_capability.block",
            ),
            (
                Box::new(|r| r.volume_capability.as_mut().unwrap().access_type = None),
                Code::InvalidArgument,
                "access_type",
            ),
            (
                Box::new(|r| r.volume_capability.as_mut().unwrap().access_mode = None),
                Code::InvalidArgument,
                "access_mode",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: 5 })
                }),
                Code::InvalidArgument,
                "access_mode",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_mode =
                        Some(AccessMode { mode: 99 })
                }),
                Code::InvalidArgument,
                "access_mode",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_type =
                        Some(AccessType::Mount(MountVolume {
                            volume_mount_group: "wheel".into(),
                            ..Default::default()
                        }))
                }),
                Code::InvalidArgument,
                "volume_mount_group",
            ),
            (
                Box::new(|r| {
                    r.volume_context.remove(EPHEMERAL_KEY);
                }),
                Code::FailedPrecondition,
                EPHEMERAL_KEY,
            ),
            (
                Box::new(|r| {
                    r.volume_context
                        .insert(EPHEMERAL_KEY.into(), "false".into());
                }),
                Code::FailedPrecondition,
                EPHEMERAL_KEY,
            ),
            (
                Box::new(|r| {
                    r.volume_context.insert(MODE_KEY.into(), "both".into());
                }),
                Code::InvalidArgument,
                "\"mode\"",
            ),
            (
                Box::new(|r| {
                    r.volume_context.insert(IP_SAN_KEY.into(), "yes".into());
                }),
                Code::InvalidArgument,
                "\"ipSAN\" must be",
            ),
            (
                Box::new(|r| {
                    r.volume_context.insert(MODE_KEY.into(), "socket".into());
                    r.volume_context.insert(IP_SAN_KEY.into(), "true".into());
                }),
                Code::InvalidArgument,
                "\"ipSAN\" is for mode \"files\" only",
            ),
            (
                Box::new(|r| {
                    r.volume_context.insert("mdoe".into(), "files".into());
                }),
                Code::InvalidArgument,
                "mdoe",
            ),
            (
                Box::new(|r| {
                    r.volume_context.remove("csi.storage.k8s.io/pod.uid");
                }),
                Code::FailedPrecondition,
                "podInfoOnMount",
            ),
            (
                Box::new(|r| {
                    r.volume_context
                        .insert("csi.storage.k8s.io/pod.namespace".into(), "../etc".into());
                }),
                Code::InvalidArgument,
                "csi.storage.k8s.io/pod.namespace",
            ),
            (
                Box::new(|r| {
                    r.volume_context
                        .insert("csi.storage.k8s.io/pod.uid".into(), UID.to_uppercase());
                }),
                Code::InvalidArgument,
                "csi.storage.k8s.io/pod.uid",
            ),
            (
                Box::new(|r| {
                    for i in 0..40 {
                        r.volume_context
                            .insert(format!("csi.storage.k8s.io/x{i}"), "y".into());
                    }
                }),
                Code::InvalidArgument,
                "entries",
            ),
        ];
        for (change, code, field) in cases {
            let mut req = kubelet_request();
            change(&mut req);
            let err = Publish::from_request(&req).unwrap_err();
            assert_eq!(err.code(), code, "{field}: {}", err.message());
            assert!(err.message().contains(field), "{field}: {}", err.message());
        }
    }
}
