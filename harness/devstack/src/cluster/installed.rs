//! What the installed release's ConfigMaps say, read back from the API server: the settings
//! `athenz-cluster` gives the initializer (its environment) and the injection template it reads.
//! The scenario's pods start from them (a csi-socket pod as the webhook makes it), and so do the
//! operator's template changes ([`super::features`]).

use super::install::CONTROL_NAMESPACE;
use super::scenario::Scenario;
use anyhow::Context;
use athenz_initializer::template::{InstallSettings, Template};

impl Scenario {
    /// What the installed initializer gives every template: `SIA_IMAGE` and `ZTS_URL` of its
    /// `athenz-cluster` ConfigMap (its environment).
    pub fn installed_settings(&self) -> anyhow::Result<InstallSettings> {
        let map =
            self.kubectl()
                .get_json(&["configmap", "-n", CONTROL_NAMESPACE, "athenz-cluster"])?;
        let setting = |key: &str| map["data"][key].as_str().map(str::to_owned);
        Ok(InstallSettings {
            sia_image: setting("SIA_IMAGE"),
            zts_url: setting("ZTS_URL"),
        })
    }

    /// The image the installed initializer injects (`SIA_IMAGE` of `athenz-cluster`).
    pub fn installed_sia_image(&self) -> anyhow::Result<String> {
        self.installed_settings()?
            .sia_image
            .context("the athenz-cluster ConfigMap names no SIA_IMAGE")
    }

    /// The installed template's text (its ConfigMap).
    pub fn installed_template_text(&self) -> anyhow::Result<String> {
        let map = self.kubectl().get_json(&[
            "configmap",
            "-n",
            CONTROL_NAMESPACE,
            "athenz-initializer-template",
        ])?;
        map["data"]["template.yaml"]
            .as_str()
            .map(str::to_owned)
            .context("the initializer's ConfigMap has no template.yaml")
    }

    /// The template the installed initializer reads (its ConfigMap).
    pub(super) fn installed_template(&self) -> anyhow::Result<Template> {
        Template::from_yaml(&self.installed_template_text()?)
            .context("reading the installed template")
    }
}
