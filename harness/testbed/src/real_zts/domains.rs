//! The dev ZTS's settings as Athenz domain data: what ZMS would hold for the same providers,
//! services and roles, written as ZMS's `DomainData` JSON, one per domain, for
//! `harness/peers/athenz/zts/store`'s signer to sign and real ZTS to load. One source of truth:
//! a test or a node configures a [`DevZtsConfig`] and either ZTS gets the same data.
//!
//! How each setting is spelled in Athenz (servers/zts's `cert/InstanceCertManager.authorizeLaunch`
//! and `cache/DataCache.processLaunchAssertion`):
//! - a provider may launch at all: `sys.auth` grants `launch` on `sys.auth:instance` to a role
//!   holding it;
//! - its DNS suffixes: the same role granted `launch` on `sys.auth:dns.<suffix>`;
//! - its endpoint: `providerEndpoint` of its service in its own domain;
//! - which services it may launch: each tenant domain grants `launch` on `<domain>:service.<s>`
//!   (`service.*` for `domain.*`) to a role holding the provider;
//! - a service's keys: `publicKeys` of the service, each key Y64-encoded PEM;
//! - roles: `<domain>:role.<name>` with the members as written (`*` suffixes included);
//! - the longest certificate: each domain's `serviceCertExpiryMins` and `roleCertExpiryMins`.
//!   ZTS caps a certificate's lifetime there (`ZTSImpl.getServiceCertRequestExpiryTime`);
//!   `athenz.zts.certsign_max_expiry_time` is only the key-store signer's default when neither
//!   the provider, the request nor the domain names one (`KeyStoreCertSigner`).

use super::RealZtsError;
use crate::zts::DevZtsConfig;
use athenz_core::names;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Athenz's own system domain, where providers are authorized.
pub const SYS_AUTH: &str = "sys.auth";

/// One domain's data while it is gathered.
#[derive(Default)]
struct Domain {
    roles: Vec<Value>,
    policies: Vec<Value>,
    services: BTreeMap<String, Value>,
}

/// Every domain the config names, as ZMS's `DomainData` JSON by domain name. `modified` is
/// the RFC 3339 time every object carries (ZTS reads it as the domain's version).
pub fn domain_data(
    config: &DevZtsConfig,
    modified: &str,
) -> Result<BTreeMap<String, Value>, RealZtsError> {
    let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
    domains.entry(SYS_AUTH.to_owned()).or_default();

    for provider in &config.providers {
        let (provider_domain, _) = split_principal(&provider.name)?;
        // sys.auth: may launch at all, and under which DNS suffixes
        let role = format!("{SYS_AUTH}:role.provider.{}", provider.name);
        let sys = domains.entry(SYS_AUTH.to_owned()).or_default();
        sys.roles.push(role_json(
            &role,
            std::slice::from_ref(&provider.name),
            modified,
        ));
        let mut assertions = vec![assertion(&role, &format!("{SYS_AUTH}:instance"))];
        for suffix in &provider.dns_suffixes {
            let suffix = suffix.trim_start_matches('.');
            assertions.push(assertion(&role, &format!("{SYS_AUTH}:dns.{suffix}")));
        }
        sys.policies.push(policy_json(
            &format!("{SYS_AUTH}:policy.provider.{}", provider.name),
            assertions,
            modified,
        ));
        // its own domain: the endpoint ZTS calls
        let service = domains
            .entry(provider_domain.to_owned())
            .or_default()
            .services
            .entry(provider.name.clone())
            .or_insert_with(|| service_json(&provider.name, modified));
        service["providerEndpoint"] = provider.endpoint.clone().into();
        // each tenant: which of its services the provider may launch
        for rule in &provider.launch {
            let (tenant, resource) = launch_grant(rule)?;
            let role = format!("{tenant}:role.launch.{}", provider.name);
            let domain = domains.entry(tenant.clone()).or_default();
            domain.roles.push(role_json(
                &role,
                std::slice::from_ref(&provider.name),
                modified,
            ));
            domain.policies.push(policy_json(
                &format!("{tenant}:policy.launch.{}", provider.name),
                vec![assertion(&role, &resource)],
                modified,
            ));
        }
    }

    for entry in &config.services {
        let (domain, _) = split_principal(&entry.name)?;
        let service = domains
            .entry(domain.to_owned())
            .or_default()
            .services
            .entry(entry.name.clone())
            .or_insert_with(|| service_json(&entry.name, modified));
        let keys: Vec<Value> = entry
            .public_keys
            .iter()
            .map(|(id, pem)| json!({"id": id, "key": y64(pem.as_bytes())}))
            .collect();
        service["publicKeys"] = keys.into();
    }

    for role in &config.roles {
        names::validate_domain("role domain", &role.domain)
            .map_err(|e| RealZtsError::Data(e.to_string()))?;
        let name = format!("{}:role.{}", role.domain, role.role);
        domains
            .entry(role.domain.clone())
            .or_default()
            .roles
            .push(role_json(&name, &role.members, modified));
    }

    Ok(domains
        .into_iter()
        .map(|(name, d)| {
            let data = json!({
                "name": name,
                "modified": modified,
                "roles": d.roles,
                "policies": {
                    "contents": {"domain": name, "policies": d.policies},
                    // DomainSigner signs the policies as ZMS does
                    "signature": "",
                    "keyId": "",
                },
                "services": d.services.into_values().collect::<Vec<_>>(),
                "entities": [],
                "groups": [],
                "serviceCertExpiryMins": config.max_cert_lifetime_minutes,
                "roleCertExpiryMins": config.max_cert_lifetime_minutes,
            });
            (name, data)
        })
        .collect())
}

/// `domain.service` split at its last dot, both parts checked.
fn split_principal(principal: &str) -> Result<(&str, &str), RealZtsError> {
    let (domain, service) = principal
        .rsplit_once('.')
        .ok_or_else(|| RealZtsError::Data(format!("{principal:?} is not domain.service")))?;
    names::validate_domain("domain", domain).map_err(|e| RealZtsError::Data(e.to_string()))?;
    names::validate_service("service", service).map_err(|e| RealZtsError::Data(e.to_string()))?;
    Ok((domain, service))
}

/// The tenant domain and resource of a launch rule: `domain.*` → every service of the domain;
/// `domain.service` → that one. `*` has no Athenz form (a grant lives in one domain).
fn launch_grant(rule: &str) -> Result<(String, String), RealZtsError> {
    if let Some(domain) = rule.strip_suffix(".*") {
        names::validate_domain("domain", domain).map_err(|e| RealZtsError::Data(e.to_string()))?;
        return Ok((domain.to_owned(), format!("{domain}:service.*")));
    }
    if rule == "*" {
        return Err(RealZtsError::Data(
            "the launch rule \"*\" has no Athenz form: each tenant domain grants launch itself; \
             name the domains (domain.*)"
                .into(),
        ));
    }
    let (domain, service) = split_principal(rule)?;
    Ok((domain.to_owned(), format!("{domain}:service.{service}")))
}

fn role_json(name: &str, members: &[String], modified: &str) -> Value {
    let members: Vec<Value> = members.iter().map(|m| json!({"memberName": m})).collect();
    json!({"name": name, "modified": modified, "roleMembers": members})
}

fn policy_json(name: &str, assertions: Vec<Value>, modified: &str) -> Value {
    json!({"name": name, "modified": modified, "assertions": assertions})
}

fn assertion(role: &str, resource: &str) -> Value {
    json!({"role": role, "resource": resource, "action": "launch", "effect": "ALLOW"})
}

fn service_json(name: &str, modified: &str) -> Value {
    json!({"name": name, "modified": modified})
}

/// Athenz's Y64 (`Crypto.ybase64`), how ZMS spells a public key: athenz-core's, the ntokens' own.
pub use athenz_core::ntoken::ybase64_encode as y64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zts::authz::RoleEntry;
    use crate::zts::registry::{ProviderEntry, ServiceEntry};

    fn config() -> DevZtsConfig {
        DevZtsConfig {
            providers: vec![ProviderEntry {
                name: "k8s.admin.athenz-callback".into(),
                endpoint: "https://127.0.0.1:9443/callback".into(),
                dns_suffixes: vec!["athenz.cloud".into()],
                launch: vec!["media.sports.*".into(), "news.web".into()],
            }],
            services: vec![ServiceEntry {
                name: "k8s.admin.athenz-jwt-service".into(),
                public_keys: [("v1".to_owned(), "PEM+/=".to_owned())].into(),
            }],
            roles: vec![RoleEntry {
                domain: "media.sports".into(),
                role: "readers".into(),
                members: vec!["media.sports.web".into(), "finance.*".into()],
            }],
            ..DevZtsConfig::default()
        }
    }

    #[test]
    fn each_setting_lands_where_zts_reads_it() {
        let data = domain_data(&config(), "2026-12-05T00:00:00.000Z").unwrap();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["k8s.admin", "media.sports", "news", "sys.auth"]
        );
        let sys = &data["sys.auth"];
        let resources: Vec<&str> = sys["policies"]["contents"]["policies"][0]["assertions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["resource"].as_str().unwrap())
            .collect();
        assert_eq!(
            resources,
            ["sys.auth:instance", "sys.auth:dns.athenz.cloud"]
        );
        assert_eq!(
            sys["roles"][0]["roleMembers"][0]["memberName"],
            "k8s.admin.athenz-callback"
        );
        let admin = &data["k8s.admin"]["services"];
        assert_eq!(admin[0]["name"], "k8s.admin.athenz-callback");
        assert_eq!(
            admin[0]["providerEndpoint"],
            "https://127.0.0.1:9443/callback"
        );
        assert_eq!(admin[1]["publicKeys"][0]["id"], "v1");
        assert_eq!(admin[1]["publicKeys"][0]["key"], y64(b"PEM+/="));
        let grant = &data["media.sports"]["policies"]["contents"]["policies"][0]["assertions"][0];
        assert_eq!(grant["resource"], "media.sports:service.*");
        assert_eq!(
            grant["role"],
            "media.sports:role.launch.k8s.admin.athenz-callback"
        );
        assert_eq!(
            data["news"]["policies"]["contents"]["policies"][0]["assertions"][0]["resource"],
            "news:service.web"
        );
        // the dev ZTS's longest certificate, where ZTS caps it
        assert_eq!(
            data["news"]["serviceCertExpiryMins"],
            DevZtsConfig::default().max_cert_lifetime_minutes
        );
        assert_eq!(
            data["sys.auth"]["roleCertExpiryMins"],
            DevZtsConfig::default().max_cert_lifetime_minutes
        );
        let readers = &data["media.sports"]["roles"][1];
        assert_eq!(readers["name"], "media.sports:role.readers");
        assert_eq!(readers["roleMembers"][1]["memberName"], "finance.*");
    }

    #[test]
    fn what_athenz_cannot_say_is_refused_by_name() {
        let mut everyone = config();
        everyone.providers[0].launch = vec!["*".into()];
        let err = domain_data(&everyone, "t").unwrap_err().to_string();
        assert!(err.contains("\"*\" has no Athenz form"), "{err}");

        let mut bad = config();
        bad.providers[0].name = "no-dot".into();
        let err = domain_data(&bad, "t").unwrap_err().to_string();
        assert!(err.contains("\"no-dot\" is not domain.service"), "{err}");

        let mut hostile = config();
        hostile.roles[0].domain = "../etc".into();
        assert!(domain_data(&hostile, "t").is_err());
    }

    #[test]
    fn y64_is_athenz_base64() {
        assert_eq!(y64(&[0xfb, 0xff]), "._8-");
    }
}
