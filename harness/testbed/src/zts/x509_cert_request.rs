//! The CSR rules ZTS applies before it asks a provider anything, as Athenz's
//! `X509CertRequest` and `X509ServiceCertRequest` (`servers/zts/.../cert/`) apply them with ZTS's
//! default settings (`athenz.zts.validate_cert_uri_schemes=false`):
//!
//! - the instance id comes from the first `athenz://instanceid/<provider>/<id>` URI (the
//!   provider part is skipped, not compared), else from a `<id>.instanceid.athenz.<suffix>` DNS
//!   name (`X509CertUtils.extractRequestInstanceIdFromURI` / `...FromDnsNames`); none is
//!   "InstanceId cannot be empty";
//! - the CN is the principal, compared ignoring case (`validateCommonName`); an empty CN is
//!   allowed only with a SPIFFE URI;
//! - every DNS SAN is under a suffix the provider or service may use (`validateDnsNames`);
//! - at most one SPIFFE URI (more is a CSR that cannot be parsed: `extractSpiffeURI`), and if
//!   present one of the accepted forms (`validateSpiffeURI`);
//! - any other URI is accepted (URI schemes are only checked when ZTS is configured to).
//!
//! On refresh the instance id must also match the path and the presented certificate
//! (`X509CertRequest.validateInstanceId`, [`validate_instance_id`]).
//!
//! One rule is the dev ZTS's own and stricter: the instance id must be a valid path segment,
//! since it becomes one in the `Location` of the new instance (our clients never send another).

use athenz_core::crypto::{CertInfo, CsrInfo};
use athenz_core::names;

/// `ZTS_CERT_INSTANCE_ID_URI`.
const INSTANCE_ID_URI: &str = "athenz://instanceid/";

/// `ZTS_CERT_INSTANCE_ID_DNS`.
const INSTANCE_ID_DNS: &str = ".instanceid.athenz.";

/// Why a CSR cannot even be read as one (ZTS: "unable to parse PKCS10 CSR: ...").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unparsable(pub String);

/// The instance id in URIs and DNS names, as `X509CertUtils.extractRequestInstanceId` finds it.
pub(super) fn instance_id_in(uris: &[String], dns_names: &[String]) -> Option<String> {
    let from_uri = uris.iter().find_map(|uri| {
        let rest = uri.strip_prefix(INSTANCE_ID_URI)?;
        rest.split_once('/').map(|(_, id)| id.to_owned())
    });
    from_uri.or_else(|| {
        dns_names
            .iter()
            .find_map(|dns| dns.find(INSTANCE_ID_DNS).map(|at| dns[..at].to_owned()))
    })
}

/// The instance id a certificate names (`X509CertUtils.extractRequestInstanceId`).
pub fn instance_id_of_certificate(cert: &CertInfo) -> Option<String> {
    instance_id_in(&cert.uris, &cert.dns_names)
}

/// Refresh: the CSR's instance id must be the path's and the presented certificate's
/// (`X509CertRequest.validateInstanceId`).
pub fn validate_instance_id(csr_instance: &str, path_instance: &str, cert: &CertInfo) -> bool {
    csr_instance == path_instance
        && instance_id_of_certificate(cert).as_deref() == Some(csr_instance)
}

/// At most one SPIFFE URI (`X509CertRequest.extractSpiffeURI`); more is a CSR ZTS cannot parse.
pub fn check_parsable(csr: &CsrInfo) -> Result<(), Unparsable> {
    if csr
        .uris
        .iter()
        .filter(|u| u.starts_with("spiffe://"))
        .count()
        > 1
    {
        return Err(Unparsable("Invalid SPIFFE URI present in CSR".into()));
    }
    Ok(())
}

/// Checks an instance CSR (register or refresh) for `domain.service` launched by `provider`
/// whose DNS suffixes are `suffixes`; returns the instance id it names, or ZTS's reason
/// (what follows "CSR validation failed - ").
pub fn check_instance_csr(
    csr: &CsrInfo,
    domain: &str,
    service: &str,
    suffixes: &[String],
) -> Result<String, String> {
    let id = instance_id_in(&csr.uris, &csr.dns_names)
        .filter(|id| !id.is_empty())
        .ok_or("InstanceId cannot be empty")?;
    check_common(csr, domain, service, suffixes)?;
    names::validate_instance_id("instance id", &id).map_err(|e| e.to_string())?;
    Ok(id)
}

/// Checks a CSR for key-based refresh of `domain.service` (`ZTSUtils.verifyCertificateRequest`):
/// the common rules, no instance id URI, and every DNS name of one of the two forms
/// `ZTSUtils.validateCertReqDNSNames` allows: `<service>.<domain-with-dashes>.<suffix>` for a
/// suffix of ZTS's `athenz.zts.cert_dns_suffix` list (`suffixes`), or one naming an instance id
/// (`.instanceid.athenz.`). So `athenz-initializer.k8s-admin.svc` is allowed to
/// `k8s.admin.athenz-initializer` with `svc` among the suffixes, and
/// `athenz-initializer.athenz-system.svc` never is.
pub fn check_service_csr(
    csr: &CsrInfo,
    domain: &str,
    service: &str,
    suffixes: &[String],
) -> Result<(), String> {
    check_common(csr, domain, service, suffixes)?;
    if csr.uris.iter().any(|u| u.starts_with(INSTANCE_ID_URI)) {
        return Err("a service certificate carries no instance id".into());
    }
    let prefix = format!("{service}.{}.", domain.replace('.', "-"));
    if let Some(dns) = csr
        .dns_names
        .iter()
        .find(|dns| !dns.starts_with(&prefix) && !dns.contains(INSTANCE_ID_DNS))
    {
        return Err(format!("Invalid dnsName SAN entry: {dns}"));
    }
    Ok(())
}

fn check_common(
    csr: &CsrInfo,
    domain: &str,
    service: &str,
    suffixes: &[String],
) -> Result<(), String> {
    let principal = names::principal(domain, service);
    // the CN is required, SPIFFE URI or not (real ZTS refuses a CSR without one:
    // harness/testbed/data/zts-recorded.json, register_no_cn_with_spiffe)
    if !csr.common_name.eq_ignore_ascii_case(&principal) {
        return Err("Unable to validate CSR common name".into());
    }
    let spiffe = csr.uris.iter().find(|u| u.starts_with("spiffe://"));
    for dns in &csr.dns_names {
        let allowed = suffixes.iter().any(|suffix| {
            dns.strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
        });
        if !allowed {
            return Err(format!(
                "{dns} does not end with provider/service configured suffix or hostname"
            ));
        }
    }
    if let Some(uri) = spiffe
        && !spiffe_matches(uri, domain, service)
    {
        return Err("Unable to validate Service SPIFFE URI".into());
    }
    Ok(())
}

/// Accepted SPIFFE forms: `spiffe://<domain>/sa/<service>` and
/// `spiffe://<trust-domain>/ns/<namespace>/sa/<service>`.
fn spiffe_matches(uri: &str, domain: &str, service: &str) -> bool {
    let Some(rest) = uri.strip_prefix("spiffe://") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [d, "sa", s] => *d == domain && *s == service,
        [trust_domain, "ns", ns, "sa", s] => {
            names::validate_dns_name("trust domain", trust_domain).is_ok()
                && names::validate_dns_label("namespace", ns).is_ok()
                && *s == service
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(cn: &str, dns: &[&str], uris: &[&str]) -> CsrInfo {
        CsrInfo {
            common_name: cn.into(),
            organizational_units: Vec::new(),
            dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
            ip_addresses: Vec::new(),
            uris: uris.iter().map(|s| (*s).to_owned()).collect(),
            emails: Vec::new(),
            public_key_der: Vec::new(),
            subject_attributes: vec![format!("CN={cn}")],
            der: Vec::new(),
        }
    }

    fn check(c: &CsrInfo) -> Result<String, String> {
        check_instance_csr(c, "media.sports", "web", &["athenz.cloud".to_owned()])
    }

    #[test]
    fn good_pod_csr() {
        let c = csr(
            "media.sports.web",
            &[
                "web.media-sports.athenz.cloud",
                "uid-1.instanceid.athenz.athenz.cloud",
            ],
            &[
                "spiffe://media.sports/sa/web",
                "athenz://instanceid/k8s.admin.athenz-callback/uid-1",
            ],
        );
        assert_eq!(check(&c).unwrap(), "uid-1");
        // DNS name alone carries the id too
        let c = csr(
            "media.sports.web",
            &["uid-2.instanceid.athenz.athenz.cloud"],
            &[],
        );
        assert_eq!(check(&c).unwrap(), "uid-2");
        // SPIFFE namespace form; the CN compared ignoring case
        let c = csr(
            "Media.Sports.Web",
            &[],
            &[
                "spiffe://cluster.local/ns/media-sports/sa/web",
                "athenz://instanceid/k8s.admin.athenz-callback/u",
            ],
        );
        assert_eq!(check(&c).unwrap(), "u");
    }

    /// Where Athenz is lenient with its default settings, so is the dev ZTS: the URI wins over
    /// the DNS name without comparing them (`extractInstanceId`), the provider in the URI is
    /// skipped (`extractRequestInstanceIdFromURI`), unknown URI schemes pass
    /// (`validateSanUriSchemes` with `validate_cert_uri_schemes=false`), and an empty CN passes
    /// with a SPIFFE URI (`X509ServiceCertRequest.validate`).
    #[test]
    fn what_athenz_accepts_is_accepted() {
        let id = "athenz://instanceid/k8s.admin.athenz-callback/uid-1";
        let uri_wins = csr(
            "media.sports.web",
            &["uid-9.instanceid.athenz.athenz.cloud"],
            &[id],
        );
        assert_eq!(check(&uri_wins).unwrap(), "uid-1");
        let other_provider = csr(
            "media.sports.web",
            &[],
            &["athenz://instanceid/other.provider/uid-1"],
        );
        assert_eq!(check(&other_provider).unwrap(), "uid-1");
        let unknown_scheme = csr("media.sports.web", &[], &[id, "https://x"]);
        assert_eq!(check(&unknown_scheme).unwrap(), "uid-1");
    }

    #[test]
    fn rejections_say_why_in_athenz_words() {
        let id = "athenz://instanceid/k8s.admin.athenz-callback/uid-1";
        let cases = [
            (
                csr("media.sports.db", &[], &[id]),
                "Unable to validate CSR common name",
            ),
            (csr("", &[], &[id]), "Unable to validate CSR common name"),
            (
                csr("", &[], &[id, "spiffe://media.sports/sa/web"]),
                "Unable to validate CSR common name",
            ),
            (
                csr("media.sports.web", &["web.evil.com"], &[id]),
                "web.evil.com does not end with provider/service configured suffix",
            ),
            (
                csr("media.sports.web", &["athenz.cloud"], &[id]),
                "does not end with provider/service configured suffix",
            ),
            (
                csr("media.sports.web", &[], &[]),
                "InstanceId cannot be empty",
            ),
            (
                csr("media.sports.web", &[], &[id, "spiffe://other/sa/web"]),
                "Unable to validate Service SPIFFE URI",
            ),
            (
                csr(
                    "media.sports.web",
                    &[],
                    &[id, "spiffe://media.sports/sa/db"],
                ),
                "Unable to validate Service SPIFFE URI",
            ),
            (
                csr(
                    "media.sports.web",
                    &[],
                    &["athenz://instanceid/k8s.admin.athenz-callback/../x"],
                ),
                "instance id",
            ),
        ];
        for (c, why) in cases {
            let err = check(&c).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
        let two_spiffe = csr(
            "media.sports.web",
            &[],
            &[
                id,
                "spiffe://media.sports/sa/web",
                "spiffe://media.sports/sa/web",
            ],
        );
        assert_eq!(
            check_parsable(&two_spiffe).unwrap_err().0,
            "Invalid SPIFFE URI present in CSR"
        );
    }

    fn cert(dns: &[&str], uris: &[&str]) -> CertInfo {
        CertInfo {
            common_name: "media.sports.web".into(),
            organizational_units: Vec::new(),
            dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
            ip_addresses: Vec::new(),
            uris: uris.iter().map(|s| (*s).to_owned()).collect(),
            serial_hex: "1".into(),
            not_before: time::OffsetDateTime::UNIX_EPOCH,
            not_after: time::OffsetDateTime::UNIX_EPOCH,
            issuer: String::new(),
            subject: String::new(),
            is_ca: false,
            public_key_der: Vec::new(),
        }
    }

    #[test]
    fn refresh_instance_id_from_the_certificate_uri_or_dns_name() {
        let by_uri = cert(&[], &["athenz://instanceid/any.provider/uid-1"]);
        assert_eq!(
            instance_id_of_certificate(&by_uri).as_deref(),
            Some("uid-1")
        );
        assert!(validate_instance_id("uid-1", "uid-1", &by_uri));
        assert!(!validate_instance_id("uid-1", "uid-2", &by_uri), "path");
        assert!(
            !validate_instance_id("uid-2", "uid-2", &by_uri),
            "certificate"
        );
        let by_dns = cert(&["uid-3.instanceid.athenz.athenz.cloud"], &[]);
        assert!(validate_instance_id("uid-3", "uid-3", &by_dns));
        let neither = cert(&["web.media-sports.athenz.cloud"], &[]);
        assert_eq!(instance_id_of_certificate(&neither), None);
        assert!(!validate_instance_id("uid-3", "uid-3", &neither));
    }

    #[test]
    fn service_csrs() {
        let suffixes = ["athenz.cloud".to_owned()];
        let ok = csr(
            "k8s.admin.cb",
            &["cb.k8s-admin.athenz.cloud"],
            &["spiffe://k8s.admin/sa/cb"],
        );
        check_service_csr(&ok, "k8s.admin", "cb", &suffixes).unwrap();
        let with_id = csr("k8s.admin.cb", &[], &["athenz://instanceid/p.q/x"]);
        assert!(check_service_csr(&with_id, "k8s.admin", "cb", &suffixes).is_err());

        // ZTSUtils.validateCertReqDNSNames: <service>.<domain-with-dashes>.<suffix> only
        let svc = ["athenz.cloud".to_owned(), "svc".to_owned()];
        let in_cluster = csr("k8s.admin.cb", &["cb.k8s-admin.svc"], &[]);
        check_service_csr(&in_cluster, "k8s.admin", "cb", &svc).unwrap();
        for (dns, why) in [
            ("cb.athenz-system.svc", "another namespace's Service name"),
            ("other.k8s-admin.athenz.cloud", "another service's name"),
            ("cb.k8s-admin.svc.evil.example", "outside every suffix"),
        ] {
            let bad = csr("k8s.admin.cb", &[dns], &[]);
            let refused = check_service_csr(&bad, "k8s.admin", "cb", &svc);
            assert!(refused.is_err(), "{dns}: {why}");
        }
        let named_instance = csr("k8s.admin.cb", &["x.instanceid.athenz.athenz.cloud"], &[]);
        check_service_csr(&named_instance, "k8s.admin", "cb", &svc).unwrap();
    }
}
