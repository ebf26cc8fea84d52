//! The cluster's tenants as a ZMS administrator registers them for Athenz's own ZTS: each
//! namespace opted in (`athenz.io/identity=enabled`) is the domain it maps to (docs/design.md
//! §2), each of its service accounts a service of that domain, and the provider may launch every
//! service of it. The dev ZTS needs none of this (its provider launches anything it is asked
//! to); real ZTS refuses an instance of a domain or service it does not hold, so with
//! `--zts athenz` the cluster's ZTS process follows the API and signs its domains again as
//! namespaces and service accounts appear (docs/real-zts.md). Once ZTS has had the time to load
//! them it lists every service account it has acted on in [`SEEN_FILE`], which the scenarios
//! wait for before they start a tenant's pods, as a platform team registers a domain before its
//! namespace is used.

use super::kubectl::Kubectl;
use athenz_core::names::{self, DomainMapper};
use athenz_testbed::real_zts::DomainUpdate;
use athenz_testbed::zts::DevZtsConfig;
use athenz_testbed::zts::registry::ServiceEntry;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the API is asked (two `kubectl get` a round).
const ROUND: Duration = Duration::from_secs(2);
/// How long one `kubectl get` may take.
const REQUEST_TIMEOUT: &str = "--request-timeout=10s";
/// More tenants than this in one answer is not a cluster this harness makes: the rest are
/// left out, said so in the log.
const MAX_TENANTS: usize = 10_000;

/// The label that opts a namespace in (the initializer's namespace selector, deploy/base).
pub const OPT_IN: &str = "athenz.io/identity=enabled";

/// The opted-in services, as `(domain, service)`.
pub type Tenants = BTreeSet<(String, String)>;

/// In the ZTS's state dir: `{"seen": ["<namespace>/<service account>", ...]}`, every service
/// account of an opted-in namespace registered (or left out, named in the log) and loaded by
/// ZTS. Written empty at start: its presence says the cluster's ZTS is Athenz's.
pub const SEEN_FILE: &str = "tenants.json";
/// How long ZTS may take to sign and load one update.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(120);

/// What [`SEEN_FILE`] holds.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seen {
    /// `<namespace>/<service account>`.
    pub seen: BTreeSet<String>,
}

/// What one round of `kubectl`'s answers says.
#[derive(Debug, Default)]
pub struct Registrations {
    /// The services to register.
    pub tenants: Tenants,
    /// Every service account of an opted-in namespace, registered or not, as
    /// `<namespace>/<name>` ([`SEEN_FILE`]).
    pub seen: BTreeSet<String>,
    /// Why each one left out was.
    pub skipped: Vec<String>,
}

/// The tenants in `kubectl`'s two answers: `namespaces` (the opted-in namespaces' names,
/// separated by white space) and `service_accounts` (`<namespace>/<name>` a line, every
/// namespace's). A namespace that maps to no tenant domain (a system namespace, one mapping
/// into the admin domain, a malformed name) or a service account that is no Athenz service name
/// is left out and named in `skipped`; it is seen all the same.
pub fn registrations(
    mapper: &DomainMapper,
    namespaces: &str,
    service_accounts: &str,
) -> Registrations {
    let opted_in: BTreeSet<&str> = namespaces.split_whitespace().collect();
    let Registrations {
        mut tenants,
        mut seen,
        mut skipped,
    } = Registrations::default();
    for line in service_accounts.lines().filter(|l| !l.trim().is_empty()) {
        let Some((namespace, account)) = line.trim().split_once('/') else {
            skipped.push(format!("{line:?}: not <namespace>/<name>"));
            continue;
        };
        if !opted_in.contains(namespace) {
            continue;
        }
        seen.insert(line.trim().to_owned());
        if mapper.is_system_namespace(namespace) {
            skipped.push(format!("namespace {namespace:?}: a system namespace"));
            continue;
        }
        let domain = match mapper.namespace_to_domain(namespace) {
            Ok(domain) => domain,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        if let Err(e) = names::validate_service("service account", account) {
            skipped.push(e.to_string());
            continue;
        }
        if tenants.len() == MAX_TENANTS {
            skipped.push(format!("more than {MAX_TENANTS} services"));
            break;
        }
        tenants.insert((domain, account.to_owned()));
    }
    Registrations {
        tenants,
        seen,
        skipped,
    }
}

/// `base` with `tenants` registered: the provider launches every service of each tenant domain
/// (`<domain>.*`), and each service exists (without keys: its instances prove themselves
/// through the provider).
pub fn settings_with(base: &DevZtsConfig, tenants: &Tenants) -> DevZtsConfig {
    let mut settings = base.clone();
    let domains: BTreeSet<&str> = tenants.iter().map(|(d, _)| d.as_str()).collect();
    for provider in &mut settings.providers {
        provider
            .launch
            .extend(domains.iter().map(|d| format!("{d}.*")));
    }
    settings
        .services
        .extend(tenants.iter().map(|(domain, service)| ServiceEntry {
            name: format!("{domain}.{service}"),
            public_keys: Default::default(),
        }));
    settings
}

/// Asks the API every [`ROUND`] and sends `base` with the tenants found whenever they change,
/// until `updates` is closed; once ZTS has loaded them, writes what it has seen to `seen_file`.
/// A failed round is logged and tried again (the API server may be restarting).
pub async fn follow(
    kubectl: Kubectl,
    mapper: DomainMapper,
    base: DevZtsConfig,
    updates: tokio::sync::mpsc::Sender<DomainUpdate>,
    seen_file: PathBuf,
) {
    let mut known: Option<Tenants> = None;
    let mut written: Option<BTreeSet<String>> = None;
    write_seen(&seen_file, &mut written, BTreeSet::new());
    loop {
        let asked = kubectl.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let namespaces = asked.run(&[
                "get",
                "namespaces",
                "-l",
                OPT_IN,
                REQUEST_TIMEOUT,
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ])?;
            let accounts = asked.run(&[
                "get",
                "serviceaccounts",
                "--all-namespaces",
                REQUEST_TIMEOUT,
                "-o",
                "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
            ])?;
            anyhow::Ok((namespaces, accounts))
        })
        .await;
        match answer {
            Ok(Ok((namespaces, accounts))) => {
                let Registrations {
                    tenants,
                    seen,
                    skipped,
                } = registrations(&mapper, &namespaces, &accounts);
                if known.as_ref() != Some(&tenants) {
                    for reason in &skipped {
                        tracing::warn!(%reason, "not registered with ZTS");
                    }
                    let (done, loaded) = tokio::sync::oneshot::channel();
                    let update = DomainUpdate {
                        settings: settings_with(&base, &tenants),
                        done: Some(done),
                    };
                    if updates.send(update).await.is_err() {
                        return;
                    }
                    match tokio::time::timeout(UPDATE_TIMEOUT, loaded).await {
                        Ok(Ok(Ok(()))) => {
                            tracing::info!(services = tenants.len(), "tenants registered with ZTS");
                            known = Some(tenants);
                        }
                        Ok(Ok(Err(e))) => tracing::error!(error = %e, "registering the tenants"),
                        Ok(Err(_)) => return,
                        Err(_) => tracing::error!("ZTS did not load the tenants' domains in time"),
                    }
                }
                if known.is_some() {
                    write_seen(&seen_file, &mut written, seen);
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "asking the API for the tenants"),
            Err(e) => tracing::warn!(error = %e, "asking the API for the tenants"),
        }
        tokio::time::sleep(ROUND).await;
    }
}

/// Writes `seen` to `file` when it differs from what was `written` last; a failure is logged
/// (the scenarios then wait on, and say what they waited for).
fn write_seen(file: &Path, written: &mut Option<BTreeSet<String>>, seen: BTreeSet<String>) {
    if written.as_ref() == Some(&seen) {
        return;
    }
    let record = Seen { seen };
    match crate::json_file::write_atomically(file, &record) {
        Ok(()) => *written = Some(record.seen),
        Err(e) => tracing::warn!(error = %e, "writing {}", file.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_testbed::zts::registry::ProviderEntry;

    fn mapper() -> DomainMapper {
        DomainMapper::new("k8s.admin", ["athenz-system"]).unwrap()
    }

    #[test]
    fn each_opted_in_namespace_is_a_domain_and_its_accounts_its_services() {
        let Registrations {
            tenants, skipped, ..
        } = registrations(
            &mapper(),
            "media-sports bank-vault\n",
            "media-sports/api\nmedia-sports/default\nbank-vault/stats\nnews-feed/web\n",
        );
        let expected: Tenants = [
            ("bank.vault", "stats"),
            ("media.sports", "api"),
            ("media.sports", "default"),
        ]
        .into_iter()
        .map(|(d, s)| (d.to_owned(), s.to_owned()))
        .collect();
        assert_eq!(tenants, expected, "news-feed is not opted in");
        assert!(skipped.is_empty(), "{skipped:?}");
    }

    #[test]
    fn what_is_no_tenant_is_left_out_by_name() {
        let long = "a".repeat(300);
        let Registrations {
            tenants, skipped, ..
        } = registrations(
            &mapper(),
            &format!("kube-system athenz-system k8s-admin-x Bad_NS {long} shop"),
            &format!(
                "kube-system/coredns\nathenz-system/agent\nk8s-admin-x/evil\nBad_NS/x\n\
                 {long}/y\nshop/../etc\nshop/no slash here\nno-slash\n\nshop/cart\n"
            ),
        );
        assert_eq!(
            tenants.into_iter().collect::<Vec<_>>(),
            [("shop".to_owned(), "cart".to_owned())]
        );
        let said = skipped.join("\n");
        for reason in [
            "\"kube-system\": a system namespace",
            "\"athenz-system\": a system namespace",
            "admin domain",
            "Bad_NS",
            "../etc",
            "\"no-slash\": not <namespace>/<name>",
        ] {
            assert!(said.contains(reason), "{reason} missing from {said}");
        }
    }

    #[test]
    fn seen_are_the_opted_in_namespaces_accounts_registered_or_not() {
        let seen = registrations(
            &mapper(),
            "bank-vault k8s-admin-evil",
            "bank-vault/stats\nk8s-admin-evil/evil\nnews-feed/web\n",
        )
        .seen;
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["bank-vault/stats", "k8s-admin-evil/evil"]
        );
    }

    #[test]
    fn registering_grants_launch_per_domain_and_adds_each_service() {
        let base = DevZtsConfig {
            providers: vec![ProviderEntry {
                name: "k8s.admin.athenz-callback".into(),
                endpoint: "https://callback".into(),
                dns_suffixes: vec!["athenz.cloud".into()],
                launch: vec!["k8s.admin.athenz-agent".into()],
            }],
            ..DevZtsConfig::default()
        };
        let tenants: Tenants = [("media.sports", "api"), ("media.sports", "web")]
            .into_iter()
            .map(|(d, s)| (d.to_owned(), s.to_owned()))
            .collect();
        let settings = settings_with(&base, &tenants);
        assert_eq!(
            settings.providers[0].launch,
            ["k8s.admin.athenz-agent", "media.sports.*"]
        );
        let services: Vec<&str> = settings.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(services, ["media.sports.api", "media.sports.web"]);
        assert_eq!(settings_with(&base, &Tenants::new()), base);
    }
}
