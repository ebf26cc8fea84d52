//! The namespace → domain mapping (docs/design.md §2): one implementation, which the agent,
//! the callback and the initializer's checks share, so what a pod is issued and what the
//! callback confirms cannot disagree.

use super::{NameError, validate_dns_label, validate_domain};
use std::collections::BTreeSet;
use std::fmt;

/// The namespace annotation naming the namespace's Athenz domain, honoured for the domains the
/// install allows (`DOMAIN_ANNOTATION_ALLOW`).
pub const DOMAIN_ANNOTATION: &str = "athenz.io/domain";

/// A domain a namespace may name by annotation: exactly one (`acme.payments`), or any below one
/// (`acme.*`: `acme.payments`, `acme.payments.eu`, not `acme` itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainPattern {
    base: String,
    below: bool,
}

impl DomainPattern {
    /// Parses `acme.payments` or `acme.*`.
    pub fn parse(text: &str) -> Result<Self, NameError> {
        let (base, below) = match text.strip_suffix(".*") {
            Some(base) => (base, true),
            None => (text, false),
        };
        validate_domain("domain annotation allow list", base)?;
        Ok(Self {
            base: base.to_owned(),
            below,
        })
    }

    /// Whether `domain` is allowed by this pattern.
    pub fn matches(&self, domain: &str) -> bool {
        if self.below {
            domain
                .strip_prefix(self.base.as_str())
                .is_some_and(|rest| rest.starts_with('.') && rest.len() > 1)
        } else {
            domain == self.base
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.below {
            write!(f, "{}.*", self.base)
        } else {
            f.write_str(&self.base)
        }
    }
}

/// Maps Kubernetes namespaces to Athenz domains and back (docs/design.md §2).
///
/// A system namespace (`kube-*` or one of the configured list) maps to `<admin-domain>.<ns>`. Any
/// other namespace maps by turning each `-` into `.` and then each `..` into `-`
/// (`foo-bar--baz` → `foo.bar-baz`), between the install's prefix and suffix (k8s-athenz-sia's
/// `ATHENZ_PREFIX`/`ATHENZ_SUFFIX`: `acme.` + `payments` = `acme.payments`); the inverse strips
/// them and turns `-` into `--` and then `.` into `-`.
///
/// A namespace may instead name its domain in its [`DOMAIN_ANNOTATION`], for domains whose
/// spelling no namespace has; only a domain the install allows ([`DomainPattern`]s, none by
/// default) is honoured, so a tenant who may annotate its namespace still cannot claim another
/// team's domain ([`DomainMapper::namespace_domain`]).
///
/// The admin domain is reserved for system namespaces: an ordinary namespace whose mapping would
/// land in it (`k8s-admin-kube--system` → `k8s.admin.kube-system`) is refused, otherwise a tenant
/// could name a namespace so that its pods get a system identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainMapper {
    admin_domain: String,
    system_namespaces: BTreeSet<String>,
    prefix: String,
    suffix: String,
    annotation_allow: Vec<DomainPattern>,
}

impl DomainMapper {
    /// Builds a mapper; `system_namespaces` are in addition to every `kube-*` namespace.
    pub fn new<I, S>(admin_domain: &str, system_namespaces: I) -> Result<Self, NameError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        validate_domain("admin domain", admin_domain)?;
        let system_namespaces = system_namespaces
            .into_iter()
            .map(Into::into)
            .collect::<BTreeSet<String>>();
        for ns in &system_namespaces {
            validate_dns_label("system namespace", ns)?;
        }
        Ok(Self {
            admin_domain: admin_domain.to_owned(),
            system_namespaces,
            prefix: String::new(),
            suffix: String::new(),
            annotation_allow: Vec::new(),
        })
    }

    /// This mapper with `prefix` and `suffix` around every tenant namespace's domain (not a
    /// system namespace's). Each is refused when no domain can be made with it.
    pub fn with_affixes(mut self, prefix: &str, suffix: &str) -> Result<Self, NameError> {
        validate_domain("domain prefix", &format!("{prefix}x"))
            .map_err(|e| NameError::new("domain prefix", prefix, e.reason))?;
        validate_domain("domain suffix", &format!("x{suffix}"))
            .map_err(|e| NameError::new("domain suffix", suffix, e.reason))?;
        self.prefix = prefix.to_owned();
        self.suffix = suffix.to_owned();
        Ok(self)
    }

    /// This mapper honouring a namespace's [`DOMAIN_ANNOTATION`] for the domains `patterns`
    /// allow (`acme.payments`, `acme.*`); none given: the annotation is refused.
    pub fn with_annotation_allow<I, S>(mut self, patterns: I) -> Result<Self, NameError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.annotation_allow = patterns
            .into_iter()
            .filter(|p| !p.as_ref().is_empty())
            .map(|p| DomainPattern::parse(p.as_ref()))
            .collect::<Result<_, _>>()?;
        if let Some(p) = self
            .annotation_allow
            .iter()
            .find(|p| self.is_admin_or_below(&p.base))
        {
            return Err(NameError::new(
                "domain annotation allow list",
                &p.to_string(),
                "reaches the admin domain, which is reserved for system namespaces",
            ));
        }
        Ok(self)
    }

    /// Whether any namespace may name its domain by annotation: the callers read namespaces'
    /// annotations only then.
    pub fn honours_annotation(&self) -> bool {
        !self.annotation_allow.is_empty()
    }

    /// The domain of `namespace`, whose [`DOMAIN_ANNOTATION`] is `annotation`: the annotation's
    /// domain when the install allows it, else the mapping. An annotation the install does not
    /// allow is an error naming the rule, never a silent fall back to the mapping: the pod would
    /// otherwise get an identity its namespace did not ask for.
    pub fn namespace_domain(
        &self,
        namespace: &str,
        annotation: Option<&str>,
    ) -> Result<String, NameError> {
        let Some(named) = annotation else {
            return self.namespace_to_domain(namespace);
        };
        validate_dns_label("namespace", namespace)?;
        let refuse = |reason: String| NameError::new("namespace", namespace, reason);
        if self.is_system_namespace(namespace) {
            return Err(refuse(format!(
                "a system namespace maps under the admin domain; its {DOMAIN_ANNOTATION} annotation ({named:?}) is not honoured"
            )));
        }
        validate_domain(DOMAIN_ANNOTATION, named)?;
        if self.is_admin_or_below(named) {
            return Err(refuse(format!(
                "its {DOMAIN_ANNOTATION} annotation names {named:?}, in the admin domain, which is reserved for system namespaces"
            )));
        }
        if self.annotation_allow.is_empty() {
            return Err(refuse(format!(
                "its {DOMAIN_ANNOTATION} annotation names {named:?}, but DOMAIN_ANNOTATION_ALLOW allows no domain by annotation"
            )));
        }
        if !self.annotation_allow.iter().any(|p| p.matches(named)) {
            let allowed: Vec<String> = self
                .annotation_allow
                .iter()
                .map(ToString::to_string)
                .collect();
            return Err(refuse(format!(
                "its {DOMAIN_ANNOTATION} annotation names {named:?}, which DOMAIN_ANNOTATION_ALLOW ({}) does not allow",
                allowed.join(",")
            )));
        }
        Ok(named.to_owned())
    }

    /// The admin domain under which system namespaces live.
    pub fn admin_domain(&self) -> &str {
        &self.admin_domain
    }

    /// Whether `namespace` is a system namespace.
    pub fn is_system_namespace(&self, namespace: &str) -> bool {
        namespace.starts_with("kube-") || self.system_namespaces.contains(namespace)
    }

    fn is_admin_or_below(&self, domain: &str) -> bool {
        domain == self.admin_domain
            || domain
                .strip_prefix(&self.admin_domain)
                .is_some_and(|rest| rest.starts_with('.'))
    }

    /// The Athenz domain of a namespace.
    pub fn namespace_to_domain(&self, namespace: &str) -> Result<String, NameError> {
        validate_dns_label("namespace", namespace)?;
        if self.is_system_namespace(namespace) {
            let domain = format!("{}.{namespace}", self.admin_domain);
            validate_domain("domain", &domain)?;
            return Ok(domain);
        }
        let domain = format!(
            "{}{}{}",
            self.prefix,
            namespace.replace('-', ".").replace("..", "-"),
            self.suffix
        );
        validate_domain("domain", &domain)
            .map_err(|e| NameError::new("namespace", namespace, e.reason))?;
        if self.is_admin_or_below(&domain) {
            return Err(NameError::new(
                "namespace",
                namespace,
                format!(
                    "maps into the admin domain {:?}, which is reserved for system namespaces",
                    self.admin_domain
                ),
            ));
        }
        Ok(domain)
    }

    /// The namespace of an Athenz domain; the exact inverse of [`Self::namespace_to_domain`].
    pub fn domain_to_namespace(&self, domain: &str) -> Result<String, NameError> {
        validate_domain("domain", domain)?;
        if let Some(ns) = domain
            .strip_prefix(&self.admin_domain)
            .and_then(|rest| rest.strip_prefix('.'))
        {
            if validate_dns_label("namespace", ns).is_ok() && self.is_system_namespace(ns) {
                return Ok(ns.to_owned());
            }
            return Err(NameError::new(
                "domain",
                domain,
                "is under the admin domain but names no system namespace",
            ));
        }
        if domain == self.admin_domain {
            return Err(NameError::new(
                "domain",
                domain,
                "the admin domain itself has no namespace",
            ));
        }
        let mapped = domain
            .strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_suffix(self.suffix.as_str()))
            .filter(|rest| !rest.is_empty())
            .ok_or_else(|| {
                NameError::new(
                    "domain",
                    domain,
                    format!(
                        "lacks the mapping's prefix {:?} or suffix {:?}",
                        self.prefix, self.suffix
                    ),
                )
            })?;
        let namespace = mapped.replace('-', "--").replace('.', "-");
        validate_dns_label("namespace", &namespace)
            .map_err(|e| NameError::new("domain", domain, format!("maps to a bad {e}")))?;
        if self.is_system_namespace(&namespace) {
            return Err(NameError::new(
                "domain",
                domain,
                "maps to a system namespace, which lives under the admin domain",
            ));
        }
        Ok(namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapper() -> DomainMapper {
        DomainMapper::new("k8s.admin", ["istio-system", "athenz"]).unwrap()
    }

    #[test]
    fn namespace_to_domain_rules() {
        let m = mapper();
        let cases = [
            ("default", "default"),
            ("media-sports", "media.sports"),
            ("foo-bar--baz", "foo.bar-baz"),
            ("a---b", "a-.b"),
            ("a----b", "a--b"),
            ("a-----b", "a--.b"),
            ("kube-system", "k8s.admin.kube-system"),
            ("kube-public", "k8s.admin.kube-public"),
            ("istio-system", "k8s.admin.istio-system"),
            ("athenz", "k8s.admin.athenz"),
        ];
        for (ns, domain) in cases {
            assert_eq!(m.namespace_to_domain(ns).unwrap(), domain, "{ns}");
            assert_eq!(m.domain_to_namespace(domain).unwrap(), ns, "{domain}");
        }
    }

    #[test]
    fn tenants_cannot_reach_the_admin_domain() {
        let m = mapper();
        for ns in ["k8s-admin-kube--system", "k8s-admin", "k8s-admin-foo"] {
            let err = m.namespace_to_domain(ns).unwrap_err();
            assert!(err.reason.contains("reserved"), "{ns}: {err}");
        }
        // and the inverse refuses domains under the admin domain that are not system namespaces
        assert!(m.domain_to_namespace("k8s.admin.foo").is_err());
        assert!(m.domain_to_namespace("k8s.admin").is_err());
        // nor does an ordinary domain reach a system namespace
        assert!(m.domain_to_namespace("kube.system").is_err());
        assert!(m.domain_to_namespace("istio.system").is_err());
    }

    #[test]
    fn mapping_is_an_exact_inverse_on_every_short_namespace() {
        // Every namespace of up to 6 characters over {a, 1, -}, plus the system ones.
        let m = mapper();
        let alphabet = ['a', '1', '-'];
        let mut names = vec![String::new()];
        let mut checked = 0;
        for _ in 0..6 {
            let mut next = Vec::new();
            for n in &names {
                for c in alphabet {
                    let s = format!("{n}{c}");
                    if validate_dns_label("ns", &s).is_ok() {
                        let domain = m.namespace_to_domain(&s).unwrap();
                        validate_domain("domain", &domain).unwrap();
                        assert_eq!(m.domain_to_namespace(&domain).unwrap(), s);
                        checked += 1;
                    }
                    next.push(s);
                }
            }
            names = next;
        }
        assert!(checked > 300, "{checked}");
    }

    #[test]
    fn domain_to_namespace_rejects_what_no_namespace_maps_to() {
        let m = mapper();
        for bad in [
            "Media.sports",
            "a_b",
            "-a",
            "a-",
            &format!("{}.b", "a".repeat(62)),
        ] {
            assert!(m.domain_to_namespace(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_prefix_and_suffix_surround_tenant_domains_not_system_ones() {
        let m = mapper().with_affixes("acme.", ".prod").unwrap();
        assert_eq!(
            m.namespace_to_domain("payments").unwrap(),
            "acme.payments.prod"
        );
        assert_eq!(
            m.namespace_to_domain("media-sports").unwrap(),
            "acme.media.sports.prod"
        );
        assert_eq!(
            m.namespace_to_domain("kube-system").unwrap(),
            "k8s.admin.kube-system"
        );
        assert_eq!(
            m.domain_to_namespace("acme.payments.prod").unwrap(),
            "payments"
        );
        for bad in ["payments.prod", "acme.payments", "acme..prod", "acme.prod"] {
            assert!(m.domain_to_namespace(bad).is_err(), "{bad}");
        }
        // what makes no domain is refused at start, naming the setting
        let err = mapper().with_affixes("acme..", "").unwrap_err();
        assert_eq!(err.field, "domain prefix", "{err}");
        let err = mapper().with_affixes("", "/x").unwrap_err();
        assert_eq!(err.field, "domain suffix", "{err}");
        // a prefix into the admin domain does not give tenants a system identity
        let into_admin = mapper().with_affixes("k8s.admin.", "").unwrap();
        assert!(
            into_admin
                .namespace_to_domain("x")
                .unwrap_err()
                .reason
                .contains("reserved")
        );
    }

    #[test]
    fn an_annotation_names_the_domain_only_where_the_install_allows_it() {
        let plain = mapper();
        assert!(!plain.honours_annotation());
        let err = plain
            .namespace_domain("payments-prod", Some("acme.payments"))
            .unwrap_err();
        assert!(
            err.reason.contains("allows no domain by annotation"),
            "{err}"
        );

        let m = mapper()
            .with_annotation_allow(["acme.*", "legacy.billing"])
            .unwrap();
        assert!(m.honours_annotation());
        assert_eq!(
            m.namespace_domain("payments-prod", Some("acme.payments"))
                .unwrap(),
            "acme.payments"
        );
        assert_eq!(
            m.namespace_domain("x", Some("legacy.billing")).unwrap(),
            "legacy.billing"
        );
        assert_eq!(
            m.namespace_domain("media-sports", None).unwrap(),
            "media.sports"
        );
        for (named, says) in [
            (
                "bank.vault",
                "DOMAIN_ANNOTATION_ALLOW (acme.*,legacy.billing) does not allow",
            ),
            ("acme", "does not allow"),
            ("legacy.billing.eu", "does not allow"),
            ("k8s.admin.kube-system", "reserved for system namespaces"),
        ] {
            let err = m.namespace_domain("sneaky", Some(named)).unwrap_err();
            assert!(err.reason.contains(says), "{named}: {err}");
            assert_eq!(err.field, "namespace");
        }
        // hostile annotations: not a domain at all
        for hostile in [
            "",
            "../etc",
            "acme.payments\nlog: forged",
            &"a.".repeat(200),
        ] {
            assert!(
                m.namespace_domain("sneaky", Some(hostile)).is_err(),
                "{hostile:?}"
            );
        }
        // a system namespace keeps the admin mapping and says so
        let err = m
            .namespace_domain("kube-system", Some("acme.x"))
            .unwrap_err();
        assert!(err.reason.contains("system namespace"), "{err}");
    }

    #[test]
    fn the_allow_list_is_checked_at_start() {
        for bad in ["acme.**", "*", "acme/x", "k8s.admin.*", "k8s.admin"] {
            assert!(mapper().with_annotation_allow([bad]).is_err(), "{bad}");
        }
        let p = DomainPattern::parse("acme.*").unwrap();
        assert_eq!(p.to_string(), "acme.*");
        assert!(p.matches("acme.a.b") && !p.matches("acme") && !p.matches("acmex.a"));
    }
}
