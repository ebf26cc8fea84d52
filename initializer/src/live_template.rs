//! The template as the webhook uses it: read at start, then read again whenever its file changes
//! (a ConfigMap volume is updated by the kubelet within about a minute), so a change reaches new
//! pods without a restart. A file that does not parse or validate is never used: the webhook
//! keeps injecting the last good template, logs why and counts the failure, so pod creation never
//! fails because of a bad edit.

use crate::template::{InstallSettings, Template, TemplateError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Labels of the reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `changed` (a new template is in use) or `refused` (the last good one stays).
    pub outcome: &'static str,
}

/// The template in use, its file and the text it was read from.
#[derive(Debug)]
pub struct LiveTemplate {
    path: PathBuf,
    install: InstallSettings,
    current: RwLock<(String, Arc<Template>)>,
    /// Reloads by outcome.
    pub reloads: Family<ReloadLabels, Counter>,
}

impl LiveTemplate {
    /// Reads `path`; a template that cannot be used stops the start, naming the field.
    pub fn load(path: &Path, install: InstallSettings) -> Result<Self, TemplateError> {
        let text = read(path)?;
        let template = Template::from_file(path, &install)?;
        Ok(Self {
            path: path.to_owned(),
            install,
            current: RwLock::new((text, Arc::new(template))),
            reloads: Family::default(),
        })
    }

    /// A template made in memory (tests, benches): never reloaded.
    pub fn fixed(template: Template) -> Self {
        Self {
            path: PathBuf::new(),
            install: InstallSettings::default(),
            current: RwLock::new((String::new(), Arc::new(template))),
            reloads: Family::default(),
        }
    }

    /// The template to inject now.
    pub fn get(&self) -> Arc<Template> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()).1)
    }

    /// Reads the file again: a changed, valid template is used from now on. Returns whether it
    /// changed; an error leaves the last good template in use.
    pub fn reload(&self) -> Result<bool, TemplateError> {
        let text = read(&self.path)?;
        if text == self.current.read().unwrap_or_else(|p| p.into_inner()).0 {
            return Ok(false);
        }
        let template = Template::from_yaml(&text)
            .and_then(|t| t.with_install(&self.install))
            .map_err(|e| match e {
                TemplateError::Read { reason, .. } => TemplateError::Read {
                    path: self.path.display().to_string(),
                    reason,
                },
                other => other,
            })?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (text, Arc::new(template));
        Ok(true)
    }

    /// Checks the file every `interval` until the task is aborted.
    pub fn spawn_watcher(self: Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        athenz_core::periodic::every(interval, move || {
            let outcome = match self.reload() {
                Ok(false) => return,
                Ok(true) => {
                    tracing::info!(path = %self.path.display(), "the template changed; injecting the new one");
                    "changed"
                }
                Err(e) => {
                    tracing::error!(error = %e, "kept the last good template");
                    "refused"
                }
            };
            self.reloads.get_or_create(&ReloadLabels { outcome }).inc();
        })
    }
}

fn read(path: &Path) -> Result<String, TemplateError> {
    let error = |reason: String| TemplateError::Read {
        path: path.display().to_string(),
        reason,
    };
    let len = std::fs::metadata(path)
        .map_err(|e| error(e.to_string()))?
        .len();
    if len > crate::template::MAX_TEMPLATE as u64 {
        return Err(error(format!(
            "larger than {} bytes",
            crate::template::MAX_TEMPLATE
        )));
    }
    std::fs::read_to_string(path).map_err(|e| error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::volume_mode::VolumeMode;

    fn install() -> InstallSettings {
        InstallSettings {
            sia_image: Some("registry.example/athenz:2".into()),
            zts_url: Some("https://zts.example:4443/zts/v1".into()),
        }
    }

    #[test]
    fn a_changed_template_is_used_and_a_bad_one_refused_keeping_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("template.yaml");
        std::fs::write(&path, "volume: csi-socket\n").unwrap();
        let live = LiveTemplate::load(&path, install()).unwrap();
        let first = live.get();
        assert_eq!(first.volume, VolumeMode::CsiSocket);
        assert_eq!(
            first.image, "registry.example/athenz:2",
            "the install's image"
        );
        assert!(first.env.iter().any(|e| e.name == "ZTS_URL"
            && e.value.as_deref() == Some("https://zts.example:4443/zts/v1")));
        assert!(!live.reload().unwrap());

        std::fs::write(&path, "volume: csi-files\nallowedVolumes: [csi-files]\n").unwrap();
        assert!(live.reload().unwrap());
        assert_eq!(live.get().volume, VolumeMode::CsiFiles);
        assert!(live.get().image.is_empty(), "nothing runs in the pod");

        for bad in [
            "volume: nfs\n",
            "volume: csi-files\nallowedVolumes: [csi-socket]\n",
            "{{{{",
            "unknownField: 1\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = live.reload().unwrap_err().to_string();
            assert!(err.contains("template"), "{bad}: {err}");
            assert_eq!(live.get().volume, VolumeMode::CsiFiles, "{bad}");
        }
        std::fs::write(&path, "x".repeat(crate::template::MAX_TEMPLATE + 1)).unwrap();
        assert!(
            live.reload()
                .unwrap_err()
                .to_string()
                .contains("larger than")
        );
        std::fs::remove_file(&path).unwrap();
        assert!(live.reload().is_err());
        assert_eq!(live.get().volume, VolumeMode::CsiFiles);
    }

    #[test]
    fn a_template_that_runs_the_sia_needs_an_image_from_somewhere() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("template.yaml");
        std::fs::write(&path, "volume: csi-socket\n").unwrap();
        let err = LiveTemplate::load(&path, InstallSettings::default()).unwrap_err();
        assert!(err.to_string().contains("SIA_IMAGE"), "{err}");
        // the template's own image wins over the install's
        std::fs::write(&path, "image: mine:1\n").unwrap();
        assert_eq!(
            LiveTemplate::load(&path, install()).unwrap().get().image,
            "mine:1"
        );
    }
}
