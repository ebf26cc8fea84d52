//! The mount options kubelet passes: a JSON object of string values. Only the pod's identity is
//! read (namespace, name, uid, service account, readwrite); every other key is ignored.

use athenz_core::names::Quoted;
use athenz_core::pod_info::{FLEX_KEYS, PodInfo, PodInfoError};
use athenz_core::volume_mount::VolumeRequest;
use serde_json::Value;
use thiserror::Error;

/// Largest options argument accepted; kubelet's are a few hundred bytes.
pub const MAX_OPTIONS_LEN: usize = 64 * 1024;

const READ_WRITE: &str = "kubernetes.io/readwrite";

/// Why the options were refused.
#[derive(Debug, Error)]
pub enum OptionsError {
    /// Over [`MAX_OPTIONS_LEN`].
    #[error("mount options are {0} bytes, more than the limit of 65536")]
    TooLarge(usize),
    /// Not JSON.
    #[error("mount options are not valid JSON: {0}")]
    NotJson(String),
    /// JSON but not an object.
    #[error("mount options must be a JSON object")]
    NotObject,
    /// A value that is not a string.
    #[error("mount option {0} must be a string")]
    NotString(Quoted),
    /// A pod field is missing or broke its rule.
    #[error("mount option {0}")]
    Pod(#[from] PodInfoError),
    /// `readwrite` is neither `ro` nor `rw`.
    #[error("mount option {READ_WRITE:?} must be \"ro\" or \"rw\" (got {0})")]
    BadReadWrite(Quoted),
}

/// The pod a volume is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// The pod (the same rules as the CSI driver's pod info).
    pub pod: PodInfo,
    /// Whether kubelet asked for read-write; the pod's view is read-only regardless.
    pub read_write: bool,
}

impl MountOptions {
    /// Parses and validates kubelet's options argument.
    pub fn parse(raw: &str) -> Result<Self, OptionsError> {
        if raw.len() > MAX_OPTIONS_LEN {
            return Err(OptionsError::TooLarge(raw.len()));
        }
        let value: Value =
            serde_json::from_str(raw).map_err(|e| OptionsError::NotJson(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(OptionsError::NotObject);
        };
        // Every value kubelet sends is a string; anything else means the input is not kubelet's.
        if let Some((key, _)) = map.iter().find(|(_, v)| !v.is_string()) {
            return Err(OptionsError::NotString(Quoted::new(key)));
        }
        let pod = PodInfo::from_attributes(&FLEX_KEYS, |k| map.get(k).and_then(Value::as_str))?;
        let read_write = match map.get(READ_WRITE).and_then(Value::as_str) {
            None | Some("") | Some("ro") => false,
            Some("rw") => true,
            Some(other) => return Err(OptionsError::BadReadWrite(Quoted::new(other))),
        };
        Ok(Self { pod, read_write })
    }

    /// What to mount for these options.
    pub fn request(&self) -> VolumeRequest {
        VolumeRequest {
            pod: self.pod.clone(),
            read_write: self.read_write,
            csi: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET: &str = r#"{"kubernetes.io/fsType":"","kubernetes.io/readwrite":"ro","kubernetes.io/pvOrVolumeName":"athenz-identity","kubernetes.io/pod.name":"web-7d9f","kubernetes.io/pod.namespace":"media-sports","kubernetes.io/pod.uid":"0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c","kubernetes.io/serviceAccount.name":"web"}"#;

    #[test]
    fn kubelet_options() {
        let o = MountOptions::parse(KUBELET).unwrap();
        assert_eq!(o.pod.namespace, "media-sports");
        assert_eq!(o.pod.pod_name, "web-7d9f");
        assert_eq!(o.pod.pod_uid, "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c");
        assert_eq!(o.pod.service_account, "web");
        assert!(!o.read_write);
        let extra = KUBELET.replace('}', r#","custom/key":"anything""#) + "}";
        assert_eq!(MountOptions::parse(&extra).unwrap(), o);
        let rw = KUBELET.replace(r#"readwrite":"ro""#, r#"readwrite":"rw""#);
        assert!(MountOptions::parse(&rw).unwrap().read_write);
    }

    #[test]
    fn hostile_options() {
        let cases: Vec<(String, &str)> = vec![
            ("".into(), "not valid JSON"),
            ("{".into(), "not valid JSON"),
            ("[]".into(), "JSON object"),
            ("\"x\"".into(), "JSON object"),
            (KUBELET.replace(r#""web-7d9f""#, "7"), "must be a string"),
            (KUBELET.replace(r#""web-7d9f""#, "null"), "must be a string"),
            (
                KUBELET.replace("kubernetes.io/pod.uid", "x"),
                "pod.uid\" is missing",
            ),
            (
                KUBELET.replace(r#""media-sports""#, r#""""#),
                "pod.namespace\" is missing",
            ),
            (KUBELET.replace("media-sports", "Media"), "pod.namespace"),
            (KUBELET.replace("media-sports", "../etc"), "pod.namespace"),
            (KUBELET.replace("web-7d9f", "web/../x"), "pod.name"),
            (KUBELET.replace("0b6e4c1e", "0B6E4C1E"), "pod.uid"),
            (
                KUBELET.replace(r#""web"}"#, &format!(r#""{}"}}"#, "a".repeat(300))),
                "serviceAccount.name",
            ),
            (KUBELET.replace(r#""ro""#, r#""yes""#), "readwrite"),
            (format!("{{\"k\":\"{}\"}}", "a".repeat(1 << 20)), "65536"),
        ];
        for (raw, why) in cases {
            let err = MountOptions::parse(&raw).unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
    }
}
