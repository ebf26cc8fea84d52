//! The CSR rules ZTS applies before it asks a provider anything (DESIGN.md 4.5): the CN is the
//! principal, every DNS SAN is under an allowed suffix, the instance id comes from the
//! `athenz://instanceid/<provider>/<id>` URI (else the `<id>.instanceid.athenz.<suffix>` DNS
//! name), and there is at most one SPIFFE URI, of an accepted form.

use athenz_core::crypto::CsrInfo;
use athenz_core::names;

/// Checks an instance CSR (register or refresh) for `domain.service` launched by `provider`
/// whose DNS suffixes are `suffixes`; returns the instance id it names.
pub fn check_instance_csr(
    csr: &CsrInfo,
    provider: &str,
    domain: &str,
    service: &str,
    suffixes: &[String],
) -> Result<String, String> {
    check_common(csr, domain, service, suffixes)?;
    let uri_prefix = format!("athenz://instanceid/{provider}/");
    let mut from_uri = None;
    for uri in &csr.uris {
        if uri.starts_with("athenz://instanceid/") {
            let id = uri
                .strip_prefix(&uri_prefix)
                .ok_or_else(|| format!("instance id URI {uri} is not for provider {provider}"))?;
            if from_uri.replace(id.to_owned()).is_some() {
                return Err("more than one instance id URI".into());
            }
        }
    }
    let mut from_dns = None;
    for dns in &csr.dns_names {
        if let Some((id, _)) = dns.split_once(".instanceid.athenz.")
            && from_dns.replace(id.to_owned()).is_some()
        {
            return Err("more than one instance id DNS name".into());
        }
    }
    let id = match (from_uri, from_dns) {
        (Some(u), Some(d)) if u != d => {
            return Err(format!("instance id URI ({u}) and DNS name ({d}) disagree"));
        }
        (Some(u), _) => u,
        (None, Some(d)) => d,
        (None, None) => return Err("no instance id in the CSR".into()),
    };
    names::validate_instance_id("instance id", &id).map_err(|e| e.to_string())?;
    Ok(id)
}

/// Checks a CSR for key-based refresh of `domain.service`.
pub fn check_service_csr(
    csr: &CsrInfo,
    domain: &str,
    service: &str,
    suffixes: &[String],
) -> Result<(), String> {
    check_common(csr, domain, service, suffixes)?;
    if csr
        .uris
        .iter()
        .any(|u| u.starts_with("athenz://instanceid/"))
    {
        return Err("a service certificate carries no instance id".into());
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
    if csr.common_name != principal {
        return Err(format!(
            "CSR CN {:?} is not the principal {principal:?}",
            csr.common_name
        ));
    }
    for dns in &csr.dns_names {
        let allowed = suffixes.iter().any(|suffix| {
            dns.strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
        });
        if !allowed {
            return Err(format!("DNS name {dns} is not under an allowed suffix"));
        }
    }
    let mut spiffe = 0;
    for uri in &csr.uris {
        if uri.starts_with("athenz://instanceid/") {
            continue;
        }
        if uri.starts_with("spiffe://") {
            spiffe += 1;
            if spiffe > 1 {
                return Err("more than one SPIFFE URI".into());
            }
            if !spiffe_matches(uri, domain, service) {
                return Err(format!("SPIFFE URI {uri} does not name {principal}"));
            }
            continue;
        }
        return Err(format!("URI {uri} is not an accepted SAN"));
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
            public_key_der: Vec::new(),
            der: Vec::new(),
        }
    }

    const P: &str = "k8s.admin.athenz-callback";

    fn check(c: &CsrInfo) -> Result<String, String> {
        check_instance_csr(c, P, "media.sports", "web", &["athenz.cloud".to_owned()])
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
        // SPIFFE namespace form
        let c = csr(
            "media.sports.web",
            &[],
            &[
                "spiffe://cluster.local/ns/media-sports/sa/web",
                "athenz://instanceid/k8s.admin.athenz-callback/u",
            ],
        );
        assert_eq!(check(&c).unwrap(), "u");
    }

    #[test]
    fn rejections_say_why() {
        let id = "athenz://instanceid/k8s.admin.athenz-callback/uid-1";
        let cases = [
            (csr("media.sports.db", &[], &[id]), "CN"),
            (
                csr("media.sports.web", &["web.evil.com"], &[id]),
                "allowed suffix",
            ),
            (
                csr("media.sports.web", &["athenz.cloud"], &[id]),
                "allowed suffix",
            ),
            (csr("media.sports.web", &[], &[]), "no instance id"),
            (
                csr(
                    "media.sports.web",
                    &[],
                    &[
                        id,
                        "spiffe://media.sports/sa/web",
                        "spiffe://media.sports/sa/web",
                    ],
                ),
                "more than one SPIFFE",
            ),
            (
                csr("media.sports.web", &[], &[id, "spiffe://other/sa/web"]),
                "does not name",
            ),
            (
                csr(
                    "media.sports.web",
                    &[],
                    &[id, "spiffe://media.sports/sa/db"],
                ),
                "does not name",
            ),
            (
                csr(
                    "media.sports.web",
                    &[],
                    &["athenz://instanceid/other.provider/uid-1"],
                ),
                "not for provider",
            ),
            (
                csr("media.sports.web", &[], &[id, "https://x"]),
                "not an accepted",
            ),
            (
                csr(
                    "media.sports.web",
                    &["uid-9.instanceid.athenz.athenz.cloud"],
                    &[id],
                ),
                "disagree",
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
    }
}
