//! The initializer's template as an operator edits it: the one change both the one-machine
//! stack (flex allowed for its kubelet stand-ins) and the real node (`allowedVolumes` changed
//! while pods are admitted) make to the text deploy/ ships.

use athenz_core::volume_mode::VolumeMode;

/// `text` (a template) with its `allowedVolumes` line set to `allowed`, or one added.
pub fn with_allowed_volumes(text: &str, allowed: &[VolumeMode]) -> String {
    let names: Vec<&str> = allowed.iter().map(|mode| mode.name()).collect();
    let line = format!("allowedVolumes: [{}]", names.join(", "));
    let mut found = false;
    let mut out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("allowedVolumes:") {
                found = true;
                line.clone()
            } else {
                l.to_owned()
            }
        })
        .collect();
    if !found {
        out.push(line);
    }
    out.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_volumes_are_set_or_added() {
        let text = "volume: csi-socket\nallowedVolumes: [csi-socket, csi-files]\nimage: x\n";
        assert_eq!(
            with_allowed_volumes(
                text,
                &[
                    VolumeMode::CsiSocket,
                    VolumeMode::CsiFiles,
                    VolumeMode::Flex
                ]
            ),
            "volume: csi-socket\nallowedVolumes: [csi-socket, csi-files, flex]\nimage: x\n"
        );
        assert_eq!(
            with_allowed_volumes("volume: csi-socket", &[VolumeMode::Flex]),
            "volume: csi-socket\nallowedVolumes: [flex]\n"
        );
    }
}
