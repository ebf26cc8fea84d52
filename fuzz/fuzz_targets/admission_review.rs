//! The initializer's reading of an AdmissionReview (docs/design.md §4.7) and the patch it answers
//! with, against the deploy template's settings (roles need ZTS_URL, so that path is reachable).
#![no_main]

use athenz_initializer::review::review;
use athenz_initializer::template::Template;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::sync::OnceLock;

const TEMPLATE: &str = "\
image: athenz-k8s-identity:latest
imagePullPolicy: IfNotPresent
command: [athenz-sia]
identityMountPath: /var/athenz/identity
credentialsMountPath: /var/run/athenz
sdsMountPath: /var/run/athenz-sds
nativeSidecar: true
downwardApi: true
env:
  - name: ZTS_URL
    value: https://zts.athenz.example:4443/zts/v1
";

fn template() -> &'static (Template, BTreeSet<String>) {
    static T: OnceLock<(Template, BTreeSet<String>)> = OnceLock::new();
    T.get_or_init(|| {
        (
            Template::from_yaml(TEMPLATE).expect("template"),
            ["kube-system".to_owned()].into(),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let (template, skip) = template();
    if let Ok((answer, _)) = review(template, skip, data) {
        // whatever was decided goes back as JSON the API server can read
        let json = serde_json::to_vec(&answer).expect("serialisable review");
        assert!(serde_json::from_slice::<serde_json::Value>(&json).is_ok());
    }
});
