//! One phase of a load run: identities of one route asked at a rate, each a JWT from the
//! jwt-service with its node's certificate and a confirmation from the callback over a new
//! mutual-TLS connection.

use super::MAX_IN_FLIGHT;
use crate::kube::NewPod;
use anyhow::Context;
use athenz_core::identity_jwt::{JwtRequest, JwtResponse};
use athenz_core::names::{CsrIdentity, DomainMapper, PodIdentityInput};
use athenz_core::subject::PodSubject;
use athenz_core::zts::{InstanceConfirmation, attr};
use athenz_testbed::fixtures::{DNS_SUFFIX, PROVIDER};
use athenz_testbed::zts::instance_provider_client::{ProviderClients, ProviderRoute};
use athenz_testbed::zts::registry::ProviderEntry;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One pod the load asks identities for.
pub(super) struct LoadPod {
    pub(super) node: usize,
    pub(super) confirmation: InstanceConfirmation,
    pub(super) subject: PodSubject,
}

/// One phase of the run: `count` identities of one route at `rate` a second, the pods taken
/// in turn from `first` on.
pub(super) struct Phase {
    pub(super) route: ProviderRoute,
    pub(super) first: usize,
    pub(super) count: usize,
    pub(super) rate: f64,
}

impl Phase {
    pub(super) async fn run(
        &self,
        pods: &Arc<Vec<LoadPod>>,
        jwt_clients: &Arc<Vec<reqwest::Client>>,
        jwt_url: &Arc<String>,
        providers: &Arc<ProviderClients>,
        provider: &Arc<ProviderEntry>,
    ) -> anyhow::Result<Vec<Outcome>> {
        let started = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / self.rate);
        let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        let mut tasks = tokio::task::JoinSet::new();
        let mut skipped = 0;
        for i in 0..self.count {
            tokio::time::sleep_until((started + interval.mul_f64(i as f64)).into()).await;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                skipped += 1; // fallen behind: this identity is not asked for
                continue;
            };
            let (pods, jwt_clients, jwt_url, providers, provider) = (
                pods.clone(),
                jwt_clients.clone(),
                jwt_url.clone(),
                providers.clone(),
                provider.clone(),
            );
            let (route, n) = (self.route, self.first + i);
            tasks.spawn(async move {
                let _permit = permit;
                let pod = &pods[n % pods.len()];
                one_identity(
                    &jwt_clients[pod.node],
                    &jwt_url,
                    &providers,
                    &provider,
                    pod,
                    route,
                )
                .await
            });
        }
        let mut outcomes = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            outcomes.push(joined.context("an identity's task")?);
        }
        // an identity not asked for counts as failed: the rate was not kept
        outcomes.extend((0..skipped).map(|_| Outcome {
            jwt: None,
            confirm: None,
        }));
        Ok(outcomes)
    }
}

/// What one identity took.
pub(super) struct Outcome {
    /// The JWT call, if it succeeded.
    pub(super) jwt: Option<Duration>,
    /// The confirmation, if it succeeded.
    pub(super) confirm: Option<Duration>,
}

async fn one_identity(
    jwt_client: &reqwest::Client,
    jwt_url: &str,
    providers: &ProviderClients,
    provider: &ProviderEntry,
    pod: &LoadPod,
    route: ProviderRoute,
) -> Outcome {
    let mut outcome = Outcome {
        jwt: None,
        confirm: None,
    };
    let asked = Instant::now();
    let Ok(resp) = jwt_client
        .post(jwt_url)
        .json(&JwtRequest {
            subject: pod.subject.clone(),
        })
        .send()
        .await
    else {
        return outcome;
    };
    if !resp.status().is_success() {
        return outcome;
    }
    let Ok(jwt) = resp.json::<JwtResponse>().await else {
        return outcome;
    };
    outcome.jwt = Some(asked.elapsed());
    let mut confirmation = pod.confirmation.clone();
    confirmation.attestation_data = jwt.jwt;
    let asked = Instant::now();
    if providers
        .confirm(provider, route, &confirmation)
        .await
        .is_ok()
    {
        outcome.confirm = Some(asked.elapsed());
    }
    outcome
}

/// The JWT subject and the confirmation ZTS would send for `pod` on `node`.
pub(super) fn load_pod(
    node: usize,
    pod: &NewPod,
    uid: &str,
    mapper: &DomainMapper,
) -> anyhow::Result<LoadPod> {
    let domain = mapper.namespace_to_domain(&pod.namespace)?;
    let subject = PodSubject::new(
        pod.namespace.clone(),
        pod.name.clone(),
        uid.to_owned(),
        domain.clone(),
        pod.service_account.clone(),
        Some(&pod.ip),
    )?;
    let identity = CsrIdentity::for_pod(&PodIdentityInput {
        domain: &domain,
        service: &pod.service_account,
        provider: PROVIDER,
        dns_suffix: DNS_SUFFIX,
        instance_id: uid,
        pod_ip: Some(pod.ip.parse()?),
        service_ip: None,
    })?;
    let mut attributes = BTreeMap::new();
    attributes.insert(attr::INSTANCE_ID.to_owned(), uid.to_owned());
    attributes.insert(attr::CLIENT_IP.to_owned(), "127.0.0.1".to_owned());
    attributes.insert(attr::SAN_DNS.to_owned(), identity.dns_names.join(","));
    attributes.insert(
        attr::SAN_IP.to_owned(),
        identity
            .ip_addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    );
    attributes.insert(attr::SAN_URI.to_owned(), identity.uris.join(","));
    Ok(LoadPod {
        node,
        subject,
        confirmation: InstanceConfirmation {
            provider: PROVIDER.into(),
            domain,
            service: pod.service_account.clone(),
            attestation_data: String::new().into(),
            attributes,
        },
    })
}
