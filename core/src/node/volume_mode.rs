//! How a pod's identity volume works: the one type for the volume mode everywhere (the
//! initializer's template and annotation, the agent's status, the CSI driver's records, the local
//! stack and the real-node harness), and the only place its spellings are written.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The CSI attribute that picks the mode (`volumeAttributes.mode`).
pub const MODE_KEY: &str = "mode";
/// The CSI attribute that makes a files-mode certificate name the pod's IP
/// (`volumeAttributes.ipSAN`, `"true"` or `"false"`, default false). The volume is published
/// before the pod has an IP, so an IP SAN costs a second issuance once it has one.
pub const IP_SAN_KEY: &str = "ipSAN";
/// The label the initializer puts on each pod it gives an identity volume, valued with the
/// volume's mode: the callback's pod cache holds only the pods carrying it (its default
/// selector), and an operator finds them with `kubectl get pods -l athenz.io/identity-volume`.
/// A pod without it (a hand-written volume) is still confirmed, from a read of the pod.
pub const INJECTED_LABEL: &str = "athenz.io/identity-volume";

/// The three ways a pod gets its identity volume (docs/design.md §4.1, §4.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, clap::ValueEnum)]
pub enum VolumeMode {
    /// The flex volume `athenz/volume-driver`: the pod's SIA talks to the agent socket.
    Flex,
    /// The CSI volume `csi.athenz.io` in socket mode: the flex layout, made by the agent's CSI
    /// driver, so admitted by Pod Security `restricted`. The initializer's default.
    #[default]
    CsiSocket,
    /// The CSI volume in files mode: the agent writes and rotates the credential files itself;
    /// nothing runs in the pod.
    CsiFiles,
}

/// A volume mode spelled in none of the known ways.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown volume mode {given:?} (expected {expected})")]
pub struct UnknownVolumeMode {
    /// What was given (truncated to 64 characters).
    pub given: String,
    /// The spellings accepted where it was given.
    pub expected: &'static str,
}

impl UnknownVolumeMode {
    fn new(given: &str, expected: &'static str) -> Self {
        Self {
            given: given.chars().take(64).collect(),
            expected,
        }
    }
}

impl VolumeMode {
    /// Every mode, in the order documentation lists them.
    pub const ALL: [Self; 3] = [Self::Flex, Self::CsiSocket, Self::CsiFiles];

    /// Their names, in the order of [`Self::ALL`].
    pub const NAMES: [&'static str; 3] = ["flex", "csi-socket", "csi-files"];

    /// Its name in the initializer's template, the `athenz.io/volume` annotation, the agent's
    /// status, and the devstack's flags.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Whether the volume is the CSI driver's (so the agents must serve CSI).
    pub fn is_csi(self) -> bool {
        self != Self::Flex
    }

    /// Whether pods with this volume run the SIA containers (everything but files mode).
    pub fn runs_sia(self) -> bool {
        self != Self::CsiFiles
    }

    /// Its CSI `volumeAttributes.mode` value (`socket` or `files`, also what a publish records),
    /// `None` for flex.
    pub fn csi_attribute(self) -> Option<&'static str> {
        match self {
            Self::Flex => None,
            Self::CsiSocket => Some("socket"),
            Self::CsiFiles => Some("files"),
        }
    }

    /// The mode a CSI `volumeAttributes.mode` names; absent means files mode (nothing to
    /// inject, the safest default for a hand-written volume).
    pub fn from_csi_attribute(value: Option<&str>) -> Result<Self, UnknownVolumeMode> {
        match value {
            None | Some("files") => Ok(Self::CsiFiles),
            Some("socket") => Ok(Self::CsiSocket),
            Some(other) => Err(UnknownVolumeMode::new(other, "socket or files")),
        }
    }
}

impl fmt::Display for VolumeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VolumeMode {
    type Err = UnknownVolumeMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.name() == s)
            .ok_or_else(|| UnknownVolumeMode::new(s, "flex, csi-socket or csi-files"))
    }
}

impl Serialize for VolumeMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for VolumeMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        // serde's own wording for an enum, as a derived one would say
        name.parse()
            .map_err(|_| serde::de::Error::unknown_variant(&name, &Self::NAMES))
    }
}

/// Serde for a CSI volume's recorded mode, in its `volumeAttributes.mode` spelling (`socket`,
/// `files`), as `data.json` has always stored it: `#[serde(with = "csi_attribute")]`.
pub mod csi_attribute {
    use super::VolumeMode;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `socket` or `files`; a flex mode is not a CSI volume's and is refused.
    pub fn serialize<S: Serializer>(mode: &VolumeMode, serializer: S) -> Result<S::Ok, S::Error> {
        match mode.csi_attribute() {
            Some(value) => serializer.serialize_str(value),
            None => Err(serde::ser::Error::custom("a flex volume has no CSI mode")),
        }
    }

    /// Reads `socket` or `files`.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<VolumeMode, D::Error> {
        let value = String::deserialize(deserializer)?;
        VolumeMode::from_csi_attribute(Some(&value)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parse_serde_and_display() {
        for mode in VolumeMode::ALL {
            assert_eq!(mode.name().parse::<VolumeMode>(), Ok(mode));
            assert_eq!(mode.to_string(), mode.name());
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(serde_json::from_str::<VolumeMode>(&json).unwrap(), mode);
            let clap_name = clap::ValueEnum::to_possible_value(&mode).unwrap();
            assert_eq!(clap_name.get_name(), mode.name(), "clap and the docs agree");
        }
    }

    #[test]
    fn unknown_names_are_refused_naming_what_was_given() {
        for bad in [
            "",
            "Flex",
            "csi_files",
            "csi-files ",
            "files",
            "x".repeat(10_000).as_str(),
        ] {
            let err = bad.parse::<VolumeMode>().unwrap_err();
            assert!(err.given.len() <= 64, "{err}");
            assert!(
                err.to_string().contains("flex, csi-socket or csi-files"),
                "{err}"
            );
        }
        assert!(serde_json::from_str::<VolumeMode>("\"hostPath\"").is_err());
        assert!(serde_json::from_str::<VolumeMode>("3").is_err());
    }

    #[test]
    fn csi_attributes_map_both_ways_and_refuse_flex() {
        assert_eq!(
            VolumeMode::from_csi_attribute(None),
            Ok(VolumeMode::CsiFiles)
        );
        for mode in [VolumeMode::CsiSocket, VolumeMode::CsiFiles] {
            assert_eq!(
                VolumeMode::from_csi_attribute(mode.csi_attribute()),
                Ok(mode)
            );
        }
        assert_eq!(VolumeMode::Flex.csi_attribute(), None);
        let err = VolumeMode::from_csi_attribute(Some("flex")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown volume mode \"flex\" (expected socket or files)"
        );

        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Record {
            #[serde(with = "csi_attribute")]
            mode: VolumeMode,
        }
        let files = Record {
            mode: VolumeMode::CsiFiles,
        };
        assert_eq!(
            serde_json::to_string(&files).unwrap(),
            r#"{"mode":"files"}"#
        );
        assert_eq!(
            serde_json::from_str::<Record>(r#"{"mode":"socket"}"#)
                .unwrap()
                .mode,
            VolumeMode::CsiSocket
        );
        assert!(
            serde_json::to_string(&Record {
                mode: VolumeMode::Flex
            })
            .is_err()
        );
        assert!(serde_json::from_str::<Record>(r#"{"mode":"csi-files"}"#).is_err());
    }
}
