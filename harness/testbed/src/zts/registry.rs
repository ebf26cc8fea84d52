//! What the dev ZTS knows: services with their public keys by version (for key-based refresh),
//! and providers with their endpoint, DNS suffixes and which services each may launch — the parts
//! of Athenz's ZMS data that ZTS consults on the routes this system uses.

use athenz_core::crypto::PublicKey;
use athenz_core::names::{self, NameError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

/// A configuration that cannot be used; names the entry.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// A name is invalid.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A public key does not parse.
    #[error("public key {version} of {service}: {reason}")]
    BadKey {
        /// `domain.service`.
        service: String,
        /// Key version.
        version: String,
        reason: String,
    },
    /// A provider entry is unusable.
    #[error("provider {provider}: {reason}")]
    BadProvider {
        /// Provider name.
        provider: String,
        reason: String,
    },
}

/// A registered service and its public keys (PEM) by version id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntry {
    /// `domain.service`.
    pub name: String,
    /// Key version (`keyId`, the ntoken's `k`) → SubjectPublicKeyInfo PEM.
    #[serde(default)]
    pub public_keys: BTreeMap<String, String>,
}

/// A registered instance provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderEntry {
    /// Provider service name, e.g. `k8s.admin.athenz-callback`; its server certificate CN.
    pub name: String,
    /// Endpoint URL; ZTS appends `/instance` or `/refresh`.
    pub endpoint: String,
    /// DNS suffixes SANs may be under.
    pub dns_suffixes: Vec<String>,
    /// What it may launch: `domain.service`, `domain.*` (any service of the domain or its
    /// subdomains) or `*`.
    pub launch: Vec<String>,
}

impl ProviderEntry {
    /// Whether this provider may launch `domain.service`.
    pub fn may_launch(&self, domain: &str, service: &str) -> bool {
        let principal = names::principal(domain, service);
        self.launch.iter().any(|rule| {
            rule == "*"
                || *rule == principal
                || rule.strip_suffix(".*").is_some_and(|d| {
                    domain == d
                        || domain
                            .strip_prefix(d)
                            .is_some_and(|rest| rest.starts_with('.'))
                })
        })
    }

    /// The allowed suffix a DNS name is under, if any.
    pub fn suffix_of<'a>(&'a self, dns: &str) -> Option<&'a str> {
        self.dns_suffixes.iter().map(String::as_str).find(|suffix| {
            dns.strip_suffix(suffix)
                .is_some_and(|head| head.ends_with('.'))
        })
    }

    fn validate(&self) -> Result<(), RegistryError> {
        names::validate_provider("provider", &self.name)?;
        let bad = |reason: &str| RegistryError::BadProvider {
            provider: self.name.clone(),
            reason: reason.to_owned(),
        };
        if !self.endpoint.starts_with("https://") {
            return Err(bad("endpoint must be an https:// URL"));
        }
        if self.dns_suffixes.is_empty() {
            return Err(bad("no DNS suffix"));
        }
        for suffix in &self.dns_suffixes {
            names::validate_dns_name("provider DNS suffix", suffix)?;
        }
        for rule in &self.launch {
            if rule != "*" {
                let domain_part = rule.strip_suffix(".*").unwrap_or(rule);
                names::validate_domain("launch rule", domain_part)?;
            }
        }
        Ok(())
    }
}

/// The registry itself, validated.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    keys: BTreeMap<String, BTreeMap<String, PublicKey>>,
    providers: BTreeMap<String, ProviderEntry>,
}

impl Registry {
    /// Validates and indexes the entries.
    pub fn new(
        services: &[ServiceEntry],
        providers: &[ProviderEntry],
    ) -> Result<Self, RegistryError> {
        let mut registry = Self::default();
        for service in services {
            for (version, pem) in &service.public_keys {
                registry.add_service_key(&service.name, version, pem)?;
            }
        }
        for provider in providers {
            registry.add_provider(provider.clone())?;
        }
        Ok(registry)
    }

    /// Registers (or replaces) a public key of `domain.service`.
    pub fn add_service_key(
        &mut self,
        service: &str,
        version: &str,
        pem: &str,
    ) -> Result<(), RegistryError> {
        names::split_service_name("service", service)?;
        names::validate_simple_name("key version", version)?;
        let key = PublicKey::from_pem(pem).map_err(|e| RegistryError::BadKey {
            service: service.to_owned(),
            version: version.to_owned(),
            reason: e.to_string(),
        })?;
        self.keys
            .entry(service.to_owned())
            .or_default()
            .insert(version.to_owned(), key);
        Ok(())
    }

    /// Registers (or replaces) a provider.
    pub fn add_provider(&mut self, provider: ProviderEntry) -> Result<(), RegistryError> {
        provider.validate()?;
        self.providers.insert(provider.name.clone(), provider);
        Ok(())
    }

    /// The public key `version` of `domain.service`.
    pub fn service_key(&self, principal: &str, version: &str) -> Option<&PublicKey> {
        self.keys.get(principal)?.get(version)
    }

    /// A provider by name.
    pub fn provider(&self, name: &str) -> Option<&ProviderEntry> {
        self.providers.get(name)
    }

    /// Every provider.
    pub fn providers(&self) -> impl Iterator<Item = &ProviderEntry> {
        self.providers.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(launch: &[&str]) -> ProviderEntry {
        ProviderEntry {
            name: "k8s.admin.athenz-callback".into(),
            endpoint: "https://127.0.0.1:1/callback".into(),
            dns_suffixes: vec!["athenz.cloud".into()],
            launch: launch.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn launch_rules() {
        let p = provider(&["media.sports.web", "news.*"]);
        assert!(p.may_launch("media.sports", "web"));
        assert!(!p.may_launch("media.sports", "db"));
        assert!(p.may_launch("news", "x"));
        assert!(p.may_launch("news.eu", "x"));
        assert!(!p.may_launch("newsx", "x"));
        assert!(provider(&["*"]).may_launch("any.thing", "s"));
        assert!(!provider(&[]).may_launch("media.sports", "web"));
    }

    #[test]
    fn suffixes() {
        let p = provider(&[]);
        assert_eq!(
            p.suffix_of("web.media-sports.athenz.cloud"),
            Some("athenz.cloud")
        );
        assert_eq!(p.suffix_of("athenz.cloud"), None);
        assert_eq!(p.suffix_of("web.evilathenz.cloud"), None);
        assert_eq!(p.suffix_of("web.athenz.cloud.evil"), None);
    }

    #[test]
    fn bad_entries_are_refused() {
        let mut r = Registry::default();
        let mut p = provider(&["*"]);
        p.endpoint = "http://x".into();
        assert!(r.add_provider(p).unwrap_err().to_string().contains("https"));
        let mut p = provider(&["*"]);
        p.dns_suffixes.clear();
        assert!(r.add_provider(p).is_err());
        assert!(r.add_provider(provider(&["a..b"])).is_err());
        let err = r
            .add_service_key("k8s.admin.x", "v1", "not a key")
            .unwrap_err();
        assert!(
            err.to_string().contains("public key v1 of k8s.admin.x"),
            "{err}"
        );
        assert!(r.add_service_key("nodot", "v1", "x").is_err());
    }
}
