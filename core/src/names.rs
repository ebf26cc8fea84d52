//! Name rules (docs/design.md §3): Athenz names, Kubernetes names, the namespace ↔ domain
//! mapping, and the one builder of a pod's CSR identity.
//!
//! Every boundary that receives a name calls a validator from here, so the rules exist once. Errors
//! name the field that was wrong and quote (escaped, truncated) what was received.

use std::fmt;
use std::net::IpAddr;
use thiserror::Error;

mod domain_mapper;
mod namespace_domains;
pub use domain_mapper::{DOMAIN_ANNOTATION, DomainMapper, DomainPattern};
#[cfg(feature = "kube")]
pub use namespace_domains::KubeNamespaces;
pub use namespace_domains::{AnnotationSource, DomainLookupError, NamespaceDomains};

/// Longest Athenz simple name accepted. A service becomes a DNS label in the SAN, so it must fit one.
pub const MAX_SIMPLE_NAME_LEN: usize = 63;
/// Longest Athenz domain accepted (the length of a DNS name).
pub const MAX_DOMAIN_LEN: usize = 253;
/// Longest Kubernetes DNS label (namespace).
pub const MAX_DNS_LABEL_LEN: usize = 63;
/// Longest Kubernetes DNS subdomain (pod and service-account names).
pub const MAX_DNS_SUBDOMAIN_LEN: usize = 253;

/// A name that broke a rule; says which field, what was wrong and (escaped) what was received.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {field}: {reason} (got {value})")]
pub struct NameError {
    /// The field or setting that held the name, e.g. `domain` or `pod.namespace`.
    pub field: &'static str,
    /// What rule the value broke.
    pub reason: String,
    /// The received value, escaped and truncated so hostile input cannot forge log lines.
    pub value: Quoted,
}

impl NameError {
    /// Builds an error for `field` holding `value`.
    pub fn new(field: &'static str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
            value: Quoted::new(value),
        }
    }
}

/// A received value prepared for an error message: Debug-escaped and cut at 80 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted(String);

impl Quoted {
    const MAX_CHARS: usize = 80;

    /// Escapes and truncates `value`.
    pub fn new(value: &str) -> Self {
        let mut chars = value.chars();
        let head: String = chars.by_ref().take(Self::MAX_CHARS).collect();
        let more = chars.count();
        if more == 0 {
            Self(format!("{head:?}"))
        } else {
            Self(format!("{head:?}… ({more} more characters)"))
        }
    }
}

impl fmt::Display for Quoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::new(field, value, "must not be empty"));
    }
    if value.len() > max {
        return Err(NameError::new(
            field,
            value,
            format!("{} bytes is longer than the limit of {max}", value.len()),
        ));
    }
    Ok(())
}

fn bad_char(field: &'static str, value: &str, pos: usize, ch: char) -> NameError {
    NameError::new(
        field,
        value,
        format!("character {ch:?} at position {pos} is not allowed"),
    )
}

/// Validates an Athenz simple name: `[a-zA-Z0-9_][a-zA-Z0-9_-]*`, at most 63 bytes.
pub fn validate_simple_name(field: &'static str, value: &str) -> Result<(), NameError> {
    check_len(field, value, MAX_SIMPLE_NAME_LEN)?;
    for (pos, ch) in value.char_indices() {
        let ok = ch.is_ascii_alphanumeric() || ch == '_' || (ch == '-' && pos > 0);
        if !ok {
            return Err(bad_char(field, value, pos, ch));
        }
    }
    Ok(())
}

/// Validates an Athenz domain: simple names joined by `.`, at most 253 bytes.
pub fn validate_domain(field: &'static str, value: &str) -> Result<(), NameError> {
    check_len(field, value, MAX_DOMAIN_LEN)?;
    for part in value.split('.') {
        validate_simple_name(field, part).map_err(|e| NameError {
            value: Quoted::new(value),
            reason: format!("label {}: {}", Quoted::new(part), e.reason),
            ..e
        })?;
    }
    Ok(())
}

/// Validates an Athenz role name: simple names joined by `.` (Athenz's entity names), at most
/// 253 bytes.
pub fn validate_role(field: &'static str, value: &str) -> Result<(), NameError> {
    validate_domain(field, value)
}

/// The CSR identity of a role certificate (docs/design.md §3): CN `<domain>:role.<role>`, URIs
/// `spiffe://<domain>/ra/<role>` and `athenz://principal/<principal>` (who asks, and whom ZTS
/// checks membership for).
pub fn role_csr_identity(
    domain: &str,
    role: &str,
    principal: &str,
) -> Result<CsrIdentity, NameError> {
    validate_domain("domain", domain)?;
    validate_role("role", role)?;
    let (p_domain, p_service) = principal
        .rsplit_once('.')
        .ok_or_else(|| NameError::new("principal", principal, "is not <domain>.<service>"))?;
    validate_domain("principal", p_domain)?;
    validate_service("principal", p_service)?;
    Ok(CsrIdentity {
        common_name: format!("{domain}:role.{role}"),
        organizational_unit: None,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        uris: vec![
            format!("spiffe://{domain}/ra/{role}"),
            format!("athenz://principal/{principal}"),
        ],
    })
}

/// Splits a role name as Athenz writes it, `<domain>:role.<role>` (a target of
/// `TARGET_DOMAIN_ROLES`, a role certificate's CN), validating both names.
pub fn parse_domain_role<'a>(
    field: &'static str,
    value: &'a str,
) -> Result<(&'a str, &'a str), NameError> {
    let (domain, role) = value
        .split_once(":role.")
        .ok_or_else(|| NameError::new(field, value, "is not <domain>:role.<role>"))?;
    validate_domain(field, domain)?;
    validate_role(field, role)?;
    Ok((domain, role))
}

/// Validates an Athenz service name (one simple name).
pub fn validate_service(field: &'static str, value: &str) -> Result<(), NameError> {
    validate_simple_name(field, value)
}

/// Validates a full service name `<domain>.<service>` such as a provider
/// (`k8s.admin.athenz-callback`) or a principal; returns `(domain, service)`.
pub fn split_service_name<'a>(
    field: &'static str,
    value: &'a str,
) -> Result<(&'a str, &'a str), NameError> {
    validate_domain(field, value)?;
    value
        .rsplit_once('.')
        .ok_or_else(|| NameError::new(field, value, "must be <domain>.<service>"))
}

/// Validates a provider name: a full Athenz service name.
pub fn validate_provider(field: &'static str, value: &str) -> Result<(), NameError> {
    split_service_name(field, value).map(|_| ())
}

/// Validates a Kubernetes DNS label (RFC 1123): lowercase alphanumerics and `-`, starting and ending
/// with an alphanumeric, at most 63 bytes. Namespaces are DNS labels.
pub fn validate_dns_label(field: &'static str, value: &str) -> Result<(), NameError> {
    check_len(field, value, MAX_DNS_LABEL_LEN)?;
    check_label_chars(field, value, value, 0)
}

fn check_label_chars(
    field: &'static str,
    whole: &str,
    label: &str,
    offset: usize,
) -> Result<(), NameError> {
    if label.is_empty() {
        return Err(NameError::new(field, whole, "empty label"));
    }
    let last = label.len() - 1;
    for (pos, ch) in label.char_indices() {
        let alnum = ch.is_ascii_lowercase() || ch.is_ascii_digit();
        let ok = alnum || (ch == '-' && pos != 0 && pos != last);
        if !ok {
            return Err(bad_char(field, whole, offset + pos, ch));
        }
    }
    Ok(())
}

/// Validates a Kubernetes DNS subdomain (RFC 1123): DNS labels joined by `.`, at most 253 bytes.
/// Pod and service-account names are DNS subdomains.
pub fn validate_dns_subdomain(field: &'static str, value: &str) -> Result<(), NameError> {
    check_len(field, value, MAX_DNS_SUBDOMAIN_LEN)?;
    let mut offset = 0;
    for label in value.split('.') {
        if label.len() > MAX_DNS_LABEL_LEN {
            return Err(NameError::new(field, value, "a label is longer than 63"));
        }
        check_label_chars(field, value, label, offset)?;
        offset += label.len() + 1;
    }
    Ok(())
}

/// Validates a Kubernetes object UID: a lowercase RFC 4122 UUID (`8-4-4-4-12` hex digits).
pub fn validate_uid(field: &'static str, value: &str) -> Result<(), NameError> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    if value.len() != 36 {
        return Err(NameError::new(
            field,
            value,
            "must be a lowercase UUID (36 characters)",
        ));
    }
    let mut groups = value.split('-');
    for want in GROUPS {
        let ok = groups.next().is_some_and(|g| {
            g.len() == want
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !ok {
            return Err(NameError::new(field, value, "must be a lowercase UUID"));
        }
    }
    Ok(())
}

/// Validates a DNS name used as a suffix or host name: labels of letters, digits, `-` and `_`
/// (Athenz domains may hold `_`), no leading dot, at most 253 bytes.
pub fn validate_dns_name(field: &'static str, value: &str) -> Result<(), NameError> {
    check_len(field, value, MAX_DNS_SUBDOMAIN_LEN)?;
    let mut offset = 0;
    for label in value.split('.') {
        if label.is_empty() || label.len() > MAX_DNS_LABEL_LEN {
            return Err(NameError::new(
                field,
                value,
                "each label must hold 1 to 63 characters",
            ));
        }
        for (pos, ch) in label.char_indices() {
            let ok = ch.is_ascii_alphanumeric()
                || ch == '_'
                || (ch == '-' && pos != 0 && pos != label.len() - 1);
            if !ok {
                return Err(bad_char(field, value, offset + pos, ch));
            }
        }
        offset += label.len() + 1;
    }
    Ok(())
}

/// `<domain>.<service>`, the Athenz principal (and certificate CN) of a service.
pub fn principal(domain: &str, service: &str) -> String {
    format!("{domain}.{service}")
}

/// The service's DNS SAN: `<service>.<domain with . → ->.<dns-suffix>`.
pub fn service_dns_name(domain: &str, service: &str, dns_suffix: &str) -> String {
    format!("{service}.{}.{dns_suffix}", domain.replace('.', "-"))
}

/// The instance-id DNS SAN: `<instance-id>.instanceid.athenz.<dns-suffix>`.
pub fn instance_id_dns_name(instance_id: &str, dns_suffix: &str) -> String {
    format!("{instance_id}.instanceid.athenz.{dns_suffix}")
}

/// The SPIFFE URI SAN: `spiffe://<domain>/sa/<service>`.
pub fn spiffe_uri(domain: &str, service: &str) -> String {
    format!("spiffe://{domain}/sa/{service}")
}

/// The instance-id URI SAN: `athenz://instanceid/<provider>/<instance-id>`.
pub fn instance_id_uri(provider: &str, instance_id: &str) -> String {
    format!("athenz://instanceid/{provider}/{instance_id}")
}

/// Validates an instance id: 1–128 characters of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
/// Pod instance ids are UIDs; the wider rule keeps URL paths and DNS labels safe for any provider.
pub fn validate_instance_id(field: &'static str, value: &str) -> Result<(), NameError> {
    check_len(field, value, 128)?;
    for (pos, ch) in value.char_indices() {
        let ok = ch.is_ascii_alphanumeric() || ch == '_' || ((ch == '-' || ch == '.') && pos > 0);
        if !ok {
            return Err(bad_char(field, value, pos, ch));
        }
    }
    Ok(())
}

/// A Kubernetes node name: a DNS subdomain that is also a valid instance id (it is the node
/// agent's instance id, docs/design.md §4.9).
pub fn validate_node_name(field: &'static str, value: &str) -> Result<(), NameError> {
    validate_dns_subdomain(field, value)?;
    validate_instance_id(field, value)
}

/// The instance id a certificate's URIs name under `provider`
/// (`athenz://instanceid/<provider>/<id>`), if exactly one does.
pub fn instance_id_in_uris<'a>(uris: &'a [String], provider: &str) -> Option<&'a str> {
    let prefix = format!("athenz://instanceid/{provider}/");
    let mut ids = uris.iter().filter_map(|u| u.strip_prefix(prefix.as_str()));
    let id = ids.next()?;
    ids.next().is_none().then_some(id)
}

/// What a certificate for a service instance must say about it: the subject and every SAN.
///
/// Built only by [`CsrIdentity::for_pod`] (the agent making a CSR, the callback deciding what a
/// pod is entitled to and the dev ZTS checking a CSR all call it) and
/// [`CsrIdentity::for_service`] (the control-plane SIA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrIdentity {
    /// Subject CN: `<domain>.<service>`.
    pub common_name: String,
    /// Subject OU: the provider, when the identity is issued through one.
    pub organizational_unit: Option<String>,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<IpAddr>,
    /// URI SANs.
    pub uris: Vec<String>,
}

/// Inputs of a pod's certificate identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentityInput<'a> {
    /// Athenz domain (mapped from the namespace).
    pub domain: &'a str,
    /// Athenz service (the service account).
    pub service: &'a str,
    /// Provider name, e.g. `k8s.admin.athenz-callback`.
    pub provider: &'a str,
    /// DNS suffix of the SANs, without a leading dot.
    pub dns_suffix: &'a str,
    /// Instance id: the pod UID.
    pub instance_id: &'a str,
    /// The pod IP (`None` for a pod that has none yet: no pod IP SAN).
    pub pod_ip: Option<IpAddr>,
    /// The cluster IP of the pod's Kubernetes service, when looked up and found.
    pub service_ip: Option<IpAddr>,
}

impl CsrIdentity {
    /// The identity a pod's certificate carries (docs/design.md §3); validates every input.
    pub fn for_pod(input: &PodIdentityInput<'_>) -> Result<Self, NameError> {
        let mut ip_addresses: Vec<IpAddr> = input.pod_ip.into_iter().collect();
        if let Some(ip) = input.service_ip.filter(|ip| Some(*ip) != input.pod_ip) {
            ip_addresses.push(ip);
        }
        Self::for_instance(
            input.domain,
            input.service,
            input.provider,
            input.dns_suffix,
            input.instance_id,
            ip_addresses,
        )
    }

    /// The identity of a node agent (docs/design.md §4.9): the pod shape with the node name as the
    /// instance id and no IP. `principal` is `<admin-domain>.athenz-agent` (or as configured).
    pub fn for_node(
        principal: &str,
        provider: &str,
        dns_suffix: &str,
        node: &str,
    ) -> Result<Self, NameError> {
        validate_node_name("node name", node)?;
        let (domain, service) = split_service_name("node principal", principal)?;
        Self::for_instance(domain, service, provider, dns_suffix, node, Vec::new())
    }

    fn for_instance(
        domain: &str,
        service: &str,
        provider: &str,
        dns_suffix: &str,
        instance_id: &str,
        ip_addresses: Vec<IpAddr>,
    ) -> Result<Self, NameError> {
        validate_domain("domain", domain)?;
        validate_service("service", service)?;
        validate_provider("provider", provider)?;
        validate_dns_name("dns suffix", dns_suffix)?;
        validate_instance_id("instance id", instance_id)?;
        let service_dns = service_dns_name(domain, service, dns_suffix);
        let instance_dns = instance_id_dns_name(instance_id, dns_suffix);
        validate_dns_name("service DNS name", &service_dns)?;
        validate_dns_name("instance id DNS name", &instance_dns)?;
        Ok(Self {
            common_name: principal(domain, service),
            organizational_unit: Some(provider.to_owned()),
            dns_names: vec![service_dns, instance_dns],
            ip_addresses,
            uris: vec![
                spiffe_uri(domain, service),
                instance_id_uri(provider, instance_id),
            ],
        })
    }

    /// The identity of a control-plane service proving ownership of its service key: CN
    /// `<domain>.<service>` and the DNS SAN `<service>.<domain-dashes>.<suffix>`.
    pub fn for_service(domain: &str, service: &str, dns_suffix: &str) -> Result<Self, NameError> {
        validate_domain("domain", domain)?;
        validate_service("service", service)?;
        validate_dns_name("dns suffix", dns_suffix)?;
        let dns = service_dns_name(domain, service, dns_suffix);
        validate_dns_name("service DNS name", &dns)?;
        Ok(Self {
            common_name: principal(domain, service),
            organizational_unit: None,
            dns_names: vec![dns],
            ip_addresses: Vec::new(),
            uris: vec![spiffe_uri(domain, service)],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_csr_identity_names_the_role_and_the_caller_and_refuses_bad_names() {
        let id = role_csr_identity("media.sports", "readers", "media.sports.web").unwrap();
        assert_eq!(id.common_name, "media.sports:role.readers");
        assert_eq!(
            id.uris,
            [
                "spiffe://media.sports/ra/readers",
                "athenz://principal/media.sports.web"
            ]
        );
        for (domain, role, principal, field) in [
            ("media/sports", "readers", "a.b", "domain"),
            ("media.sports", "read ers", "a.b", "role"),
            ("media.sports", "readers/../x", "a.b", "role"),
            ("media.sports", "", "a.b", "role"),
            ("media.sports", "readers", "web", "principal"),
            ("media.sports", "readers", "a.b?c", "principal"),
        ] {
            let err = role_csr_identity(domain, role, principal).unwrap_err();
            assert_eq!(err.field, field, "{domain} {role} {principal}: {err}");
        }
    }

    #[test]
    fn simple_names() {
        for ok in ["a", "_x", "0", "web-app", "A_b-9", &"a".repeat(63)] {
            validate_simple_name("service", ok).unwrap();
        }
        for bad in [
            "",
            "-a",
            "a.b",
            "a/b",
            "a b",
            "é",
            "a\0",
            &"a".repeat(64),
            "..",
            "%2e",
        ] {
            let err = validate_simple_name("service", bad).unwrap_err();
            assert_eq!(err.field, "service", "{bad:?}");
        }
    }

    #[test]
    fn error_names_the_field_and_escapes_the_value() {
        let err = validate_domain("pod.domain", "ok.bad\nline").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("invalid pod.domain:"), "{text}");
        assert!(text.contains("\\n"), "newline must be escaped: {text}");
        let long = validate_domain("domain", &"a".repeat(10_000)).unwrap_err();
        assert!(long.to_string().len() < 300, "{long}");
    }

    #[test]
    fn domains() {
        for ok in ["a", "a.b", "media.sports", "k8s.admin.kube-system", "x_.y-"] {
            validate_domain("domain", ok).unwrap();
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "a/b",
            "a.-b",
            "a b",
            &"a.".repeat(127),
        ] {
            assert!(validate_domain("domain", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn providers_need_a_domain_and_a_service() {
        validate_provider("provider", "k8s.admin.athenz-callback").unwrap();
        assert_eq!(
            split_service_name("p", "a.b.c").unwrap(),
            ("a.b", "c"),
            "the service is the last label"
        );
        assert!(validate_provider("provider", "single").is_err());
        assert!(validate_provider("provider", "a..b").is_err());
    }

    #[test]
    fn kubernetes_names() {
        validate_dns_label("ns", "media-sports").unwrap();
        validate_dns_subdomain("name", "web-7d9f.x").unwrap();
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "a\0"] {
            assert!(validate_dns_label("ns", bad).is_err(), "{bad:?}");
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "A.b",
            "a/b",
            "../x",
            &"a".repeat(254),
        ] {
            assert!(validate_dns_subdomain("name", bad).is_err(), "{bad:?}");
        }
        let long_label = format!("{}.b", "a".repeat(64));
        assert!(validate_dns_subdomain("name", &long_label).is_err());
    }

    #[test]
    fn uids() {
        validate_uid("uid", "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c").unwrap();
        for bad in [
            "",
            "0B6E4C1E-8F57-4D5E-9A51-1F0F3C1A2B3C",
            "0b6e4c1e8f574d5e9a511f0f3c1a2b3c",
            "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3",
            "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3cc",
            "0b6e4c1e-8f57-4d5e-9a5-11f0f3c1a2b3c",
            "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3g",
            "../../../../../../../../../etc/pass",
        ] {
            assert!(validate_uid("uid", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pod_identity_has_every_san() {
        let id = CsrIdentity::for_pod(&PodIdentityInput {
            domain: "media.sports",
            service: "web",
            provider: "k8s.admin.athenz-callback",
            dns_suffix: "athenz.cloud",
            instance_id: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            pod_ip: Some("10.1.2.3".parse().unwrap()),
            service_ip: Some("10.96.0.10".parse().unwrap()),
        })
        .unwrap();
        assert_eq!(id.common_name, "media.sports.web");
        assert_eq!(
            id.organizational_unit.as_deref(),
            Some("k8s.admin.athenz-callback")
        );
        assert_eq!(
            id.dns_names,
            [
                "web.media-sports.athenz.cloud",
                "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c.instanceid.athenz.athenz.cloud"
            ]
        );
        assert_eq!(id.ip_addresses.len(), 2);
        assert_eq!(
            id.uris,
            [
                "spiffe://media.sports/sa/web",
                "athenz://instanceid/k8s.admin.athenz-callback/0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c"
            ]
        );
    }

    #[test]
    fn pod_identity_validates_inputs() {
        let base = PodIdentityInput {
            domain: "media.sports",
            service: "web",
            provider: "k8s.admin.athenz-callback",
            dns_suffix: "athenz.cloud",
            instance_id: "uid-1",
            pod_ip: Some("10.1.2.3".parse().unwrap()),
            service_ip: None,
        };
        assert_eq!(
            CsrIdentity::for_pod(&base).unwrap().ip_addresses,
            [base.pod_ip.unwrap()]
        );
        // a pod without an IP yet: no IP SAN, unless its service's cluster IP was found
        let no_ip = PodIdentityInput {
            pod_ip: None,
            ..base.clone()
        };
        assert!(
            CsrIdentity::for_pod(&no_ip)
                .unwrap()
                .ip_addresses
                .is_empty()
        );
        let service_ip: IpAddr = "10.96.0.10".parse().unwrap();
        let with_service = PodIdentityInput {
            service_ip: Some(service_ip),
            ..no_ip
        };
        assert_eq!(
            CsrIdentity::for_pod(&with_service).unwrap().ip_addresses,
            [service_ip]
        );
        let bad = [
            PodIdentityInput {
                domain: "a..b",
                ..base.clone()
            },
            PodIdentityInput {
                service: "a.b",
                ..base.clone()
            },
            PodIdentityInput {
                provider: "nodot",
                ..base.clone()
            },
            PodIdentityInput {
                dns_suffix: ".athenz.cloud",
                ..base.clone()
            },
            PodIdentityInput {
                instance_id: "../x",
                ..base.clone()
            },
            PodIdentityInput {
                instance_id: "a/b",
                ..base.clone()
            },
        ];
        for input in bad {
            assert!(CsrIdentity::for_pod(&input).is_err(), "{input:?}");
        }
    }

    #[test]
    fn service_identity() {
        let id = CsrIdentity::for_service("k8s.admin", "athenz-callback", "athenz.cloud").unwrap();
        assert_eq!(id.common_name, "k8s.admin.athenz-callback");
        assert_eq!(id.dns_names, ["athenz-callback.k8s-admin.athenz.cloud"]);
        assert_eq!(id.organizational_unit, None);
    }

    #[test]
    fn node_identity_is_the_pod_shape_with_the_node_as_instance() {
        let id = CsrIdentity::for_node(
            "k8s.admin.athenz-agent",
            "k8s.admin.athenz-callback",
            "athenz.cloud",
            "ip-10-0-0-1.ec2.internal",
        )
        .unwrap();
        assert_eq!(id.common_name, "k8s.admin.athenz-agent");
        assert_eq!(
            id.organizational_unit.as_deref(),
            Some("k8s.admin.athenz-callback")
        );
        assert_eq!(
            id.dns_names,
            [
                "athenz-agent.k8s-admin.athenz.cloud",
                "ip-10-0-0-1.ec2.internal.instanceid.athenz.athenz.cloud"
            ]
        );
        assert!(id.ip_addresses.is_empty());
        assert_eq!(
            id.uris,
            [
                "spiffe://k8s.admin/sa/athenz-agent",
                "athenz://instanceid/k8s.admin.athenz-callback/ip-10-0-0-1.ec2.internal"
            ]
        );
        for bad in ["", "Node-1", "node/1", "-node", "node_1", &"n".repeat(254)] {
            let err =
                CsrIdentity::for_node("k8s.admin.athenz-agent", "k8s.p.s", "x.y", bad).unwrap_err();
            assert!(err.to_string().contains("node name"), "{bad}: {err}");
        }
        assert!(CsrIdentity::for_node("agent", "k8s.p.s", "x.y", "n1").is_err());
    }

    #[test]
    fn instance_id_is_read_only_from_our_providers_single_uri() {
        let uris = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let p = "k8s.admin.athenz-callback";
        assert_eq!(
            instance_id_in_uris(
                &uris(&[
                    "spiffe://k8s.admin/sa/athenz-agent",
                    "athenz://instanceid/k8s.admin.athenz-callback/node-1"
                ]),
                p
            ),
            Some("node-1")
        );
        assert_eq!(
            instance_id_in_uris(&uris(&["athenz://instanceid/other.provider/node-1"]), p),
            None
        );
        assert_eq!(instance_id_in_uris(&uris(&[]), p), None);
        assert_eq!(
            instance_id_in_uris(
                &uris(&[
                    "athenz://instanceid/k8s.admin.athenz-callback/node-1",
                    "athenz://instanceid/k8s.admin.athenz-callback/node-2"
                ]),
                p
            ),
            None
        );
    }
}
