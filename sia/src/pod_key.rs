//! The pod's own key and CSR (docs/design.md §4.6, pod-made keys): the key is made here, in the
//! pod, and only the CSR built from the agent's template leaves the process. A new key per issue.

use athenz_core::agent_api::CsrTemplate;
use athenz_core::crypto::{CertInfo, KeyAlgorithm, PrivateKey, build_csr, key_matches_cert};
use athenz_core::secret::Secret;

/// A key made in the pod, with its PEM for the files.
pub struct PodKey {
    key: PrivateKey,
    pem: Secret,
}

impl PodKey {
    /// Makes a key (P-256 ~20 µs; RSA-2048 tens of milliseconds).
    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, String> {
        let key =
            PrivateKey::generate(algorithm).map_err(|e| format!("making the pod's key: {e}"))?;
        let pem = key
            .to_pkcs8_pem()
            .map_err(|e| format!("encoding the pod's key: {e}"))?;
        Ok(Self { key, pem })
    }

    /// A CSR saying exactly what `template` says, signed with this key.
    pub fn csr(&self, template: CsrTemplate) -> Result<String, String> {
        build_csr(&template.into(), &self.key)
            .map_err(|e| format!("building the CSR the agent described: {e}"))
    }

    /// The key, PKCS#8 PEM.
    pub fn pem(&self) -> &Secret {
        &self.pem
    }

    /// Checks that `cert_pem`'s leaf is for this key: a certificate for another key would
    /// leave the pod with files that do not go together.
    pub fn check_certificate(&self, cert_pem: &str) -> Result<CertInfo, String> {
        let info = CertInfo::from_pem(cert_pem).map_err(|e| format!("the new certificate: {e}"))?;
        if !key_matches_cert(&self.key, &info) {
            return Err("the new certificate is not for the key this pod made".into());
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::crypto::CsrInfo;

    #[test]
    fn the_csr_says_what_the_template_says_with_this_key() {
        let template = CsrTemplate {
            common_name: "media.sports.web".into(),
            organizational_unit: Some("k8s.admin.athenz-callback".into()),
            dns_names: vec!["web.media-sports.athenz.cloud".into()],
            ip_addresses: vec!["10.1.0.7".parse().unwrap()],
            uris: vec!["athenz://instanceid/k8s.admin.athenz-callback/u".into()],
        };
        for algorithm in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
            let key = PodKey::generate(algorithm).unwrap();
            let csr = CsrInfo::from_pem(&key.csr(template.clone()).unwrap()).unwrap();
            assert_eq!(csr.common_name, template.common_name);
            assert_eq!(csr.dns_names, template.dns_names);
            assert_eq!(csr.ip_addresses, template.ip_addresses);
            assert_eq!(csr.uris, template.uris);
            let parsed = PrivateKey::from_pem(key.pem().expose()).unwrap();
            assert_eq!(csr.public_key_der, parsed.public_key_der());
        }
        let bad = CsrTemplate {
            dns_names: vec!["not ia5 ✗".into()],
            ..template
        };
        let key = PodKey::generate(KeyAlgorithm::P256).unwrap();
        assert!(key.csr(bad).unwrap_err().contains("CSR"));
    }
}
