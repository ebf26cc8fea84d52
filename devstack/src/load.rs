//! `athenz-devstack load`: what this system costs the cluster's shared parts at size — the
//! callback (ZTS's provider), the jwt-service and the Kubernetes API.
//!
//! A stack with `--nodes` real agents (each gets its node identity from ZTS through the
//! callback's TokenReview, as in a cluster), `--pods-per-node` real-size pods on each node in
//! the API, then for `--seconds` at `--rate` identities a second, spread over the nodes: each
//! identity is a JWT from the jwt-service, asked with that node's own certificate (the agent →
//! jwt-service path), then a confirmation from the callback over a new mutual-TLS connection
//! with a full handshake, as ZTS makes every one (`ZTSImpl`: a fresh `InstanceHttpProvider` per
//! request). A quarter of the identities are refreshes (the callback's `/refresh`), the rest
//! launches (`/instance`). The API stand-in counts every request (`apiserver_request_total`),
//! so the report says what each identity, each refresh and each node renewal costs the API.

use crate::bench::bench_pod;
use crate::kube::{KubeClient, NewPod, PodSize};
use crate::procs::Usage;
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, bail};
use athenz_core::identity_jwt::{JwtRequest, JwtResponse};
use athenz_core::names::{CsrIdentity, DomainMapper, PodIdentityInput};
use athenz_core::subject::PodSubject;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::{InstanceConfirmation, attr};
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::zts::instance_provider_client::{ProviderClients, ProviderRoute};
use athenz_testbed::zts::registry::ProviderEntry;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every upstream call's timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Identities in flight at most (an open loop that falls behind stops adding).
const MAX_IN_FLIGHT: usize = 512;
/// The confirmation latency a replica must keep to count its throughput (issue 39).
const P99_BOUND_MS: f64 = 50.0;
/// What a node-identity registration or refresh may ask the API (the callback's TokenReview of
/// the agent's token, its reads of the node and of the agent's pod), as `api_requests` names them.
const NODE_RENEWAL_REQUESTS: [&str; 3] = ["POST tokenreviews", "GET nodes", "GET pods"];

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Nodes, each with its agent.
    pub nodes: usize,
    /// Pods on each node.
    pub pods_per_node: usize,
    /// Identities a second.
    pub rate: f64,
    /// How long.
    pub seconds: u64,
    /// Separately built component binaries to run instead of this one.
    pub components: Option<std::path::PathBuf>,
    /// Certificate lifetime in minutes, pods' and nodes' (`None`: the stack's default): short
    /// enough, and the run sees the agents refresh their node identities too.
    pub lifetime_minutes: Option<u32>,
}

/// One replica's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaLoad {
    /// Calls answered 200.
    pub answered: u64,
    /// Calls refused or failed.
    pub failed: u64,
    /// Calls answered per second of the run.
    pub per_second: f64,
    /// Its CPU over the run, seconds.
    pub cpu_seconds: f64,
    /// Calls answered per second of its CPU: what one core of it serves.
    pub per_core_second: f64,
    /// Latency p50, ms (the confirmation: connect, full handshake, answer).
    pub p50_ms: f64,
    /// Latency p99, ms.
    pub p99_ms: f64,
    /// Latency max, ms.
    pub max_ms: f64,
    /// Its peak resident memory, MiB.
    pub peak_rss_mib: f64,
}

/// The callback's figures, named as issue 39 asks.
#[derive(Debug, Clone, Serialize)]
pub struct CallbackLoad {
    /// Confirmations answered per second of the callback's CPU.
    pub confirmations_per_core_second: f64,
    /// Confirmation latency p99, ms.
    pub p99_ms: f64,
    /// Whether p99 stayed within 50 ms at this rate (else the per-core figure is not a capacity).
    pub p99_within_bound: bool,
    /// Everything measured.
    pub replica: ReplicaLoad,
}

/// Kubernetes API requests per pod identity (the node renewals' own requests apart).
#[derive(Debug, Clone, Serialize)]
pub struct ApiPerIdentity {
    /// Per launch confirmed.
    pub issue: f64,
    /// Per refresh confirmed.
    pub refresh: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Nodes (agents).
    pub nodes: usize,
    /// Pods in the API.
    pub pods: usize,
    /// The rate asked for, identities a second.
    pub rate: f64,
    /// Seconds driven.
    pub seconds: f64,
    /// The callback (one replica).
    pub callback: CallbackLoad,
    /// The jwt-service (one replica), its calls over kept-alive mutual TLS as agents make them.
    pub jwt_service: ReplicaLoad,
    /// API requests per identity, as the API stand-in counted them.
    pub api_requests_per_identity: ApiPerIdentity,
    /// TokenReviews per node-identity registration or refresh (the agents' own, over the whole
    /// stack's life).
    pub tokenreviews_per_node_renewal: f64,
    /// Every API request per node-identity registration (its TokenReview and its reads of the
    /// node and of the agent's pod), from the stack's start.
    pub api_requests_per_node_renewal: f64,
    /// Node-identity registrations and refreshes the agents made.
    pub node_renewals: u64,
    /// Every API request during the run, by `verb resource[/subresource]`.
    pub api_requests: BTreeMap<String, u64>,
}

/// One pod the load asks identities for.
struct LoadPod {
    node: usize,
    confirmation: InstanceConfirmation,
    subject: PodSubject,
}

/// Runs the load on a fresh stack in `state_dir`.
pub async fn run(state_dir: &Path, options: &LoadOptions) -> anyhow::Result<LoadReport> {
    if options.nodes == 0 || options.pods_per_node == 0 || options.rate <= 0.0 {
        bail!("--nodes, --pods-per-node and --rate must be above zero");
    }
    let stack = Stack::start(&StackOptions {
        components: options.components.clone(),
        nodes: options.nodes,
        cert_expiry_minutes: options.lifetime_minutes,
        ..StackOptions::new(state_dir.to_owned(), "p256")
    })
    .await?;
    let result = drive(&stack, options).await;
    stack.stop().await;
    result
}

async fn drive(stack: &Stack, options: &LoadOptions) -> anyhow::Result<LoadReport> {
    let info = &stack.info;
    let kube = KubeClient::new(&info.kube_api.url)?;
    // Once the stack is up and before any pod of the load exists, every request the API has
    // served is one of the agents' node registrations: what one costs.
    let at_start = api_requests(&info.kube_api.url).await?;
    let registrations = node_renewals(stack).await?;
    let per_node_renewal = if registrations == 0 {
        0.0
    } else {
        NODE_RENEWAL_REQUESTS
            .iter()
            .map(|k| at_start.get(*k).copied().unwrap_or(0))
            .sum::<u64>() as f64
            / registrations as f64
    };
    let mapper = DomainMapper::new(ADMIN_DOMAIN, Vec::<String>::new())?;
    let mut pods = Vec::new();
    for node in 0..options.nodes {
        for k in 0..options.pods_per_node {
            let pod = bench_pod(node * options.pods_per_node + k);
            let uid = kube
                .create_running_pod_sized(&pod, &info.nodes[node].name, PodSize::Real)
                .await?;
            pods.push(load_pod(node, &pod, &uid, &mapper)?);
        }
    }
    let jwt_clients = info
        .nodes
        .iter()
        .map(|n| {
            let chain = tls::read_certs_file(&n.credentials.cert)?;
            let key = tls::read_key_file(&n.credentials.key)?;
            let cas = tls::read_certs_file(&info.zts.ca)?;
            let config = tls::client_config(
                &cas,
                Some(ClientIdentity::Fixed(tls::certified_key(chain, key)?)),
            )?;
            Ok(reqwest::Client::builder()
                .tls_backend_preconfigured(config)
                .timeout(CALL_TIMEOUT)
                .build()?)
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .context("the nodes' clients for the jwt-service")?;
    let zts = &info.credentials.zts;
    let providers = Arc::new(ProviderClients::new(
        tls::read_certs_file(&info.zts.ca)?,
        ClientIdentity::Fixed(tls::certified_key(
            tls::read_certs_file(&zts.cert)?,
            tls::read_key_file(&zts.key)?,
        )?),
        CALL_TIMEOUT,
    ));
    let provider = Arc::new(ProviderEntry {
        name: PROVIDER.into(),
        endpoint: format!("{}{}", info.callback.url, info.callback.base_path),
        dns_suffixes: vec![DNS_SUFFIX.into()],
        launch: vec!["*".into()],
    });
    let (pods, jwt_clients) = (Arc::new(pods), Arc::new(jwt_clients));
    let jwt_url = Arc::new(format!("{}/v1/jwt", info.jwt_service.url));

    let usage_before = stack.usage();
    let started = Instant::now();
    let total = ((options.rate * options.seconds as f64).ceil() as usize).max(4);
    // three quarters launches, then a quarter refreshes, each phase's API requests apart
    let phases = [
        (ProviderRoute::Instance, total - total / 4),
        (ProviderRoute::Refresh, total / 4),
    ];
    let mut outcomes = Vec::new();
    let mut per_route = Vec::new();
    let mut during = BTreeMap::new();
    let mut first = 0;
    for (route, count) in phases {
        let before = api_requests(&info.kube_api.url).await?;
        let renewals_before = node_renewals(stack).await?;
        let phase = Phase {
            route,
            first,
            count,
            rate: options.rate,
        };
        let done = phase
            .run(&pods, &jwt_clients, &jwt_url, &providers, &provider)
            .await?;
        let after = api_requests(&info.kube_api.url).await?;
        // the agents' node refreshes meanwhile ask the API too: theirs, not the pods'
        let renewed = node_renewals(stack).await?.saturating_sub(renewals_before);
        let requests = after
            .iter()
            .map(|(k, n)| n - before.get(k).copied().unwrap_or(0))
            .sum::<u64>() as f64
            - renewed as f64 * per_node_renewal;
        for (k, n) in &after {
            let added = n - before.get(k).copied().unwrap_or(0);
            if added > 0 {
                *during.entry(k.clone()).or_insert(0) += added;
            }
        }
        let confirmed = done.iter().filter(|o| o.confirm.is_some()).count();
        per_route.push(if confirmed == 0 {
            0.0
        } else {
            requests.max(0.0) / confirmed as f64
        });
        outcomes.extend(done);
        first += count;
    }
    let seconds = started.elapsed().as_secs_f64();
    let usage_after = stack.usage();
    let api_after = api_requests(&info.kube_api.url).await?;

    let cpu = |name: &str| {
        let of = |u: &[(String, Usage)]| {
            u.iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, u)| u.cpu_seconds)
        };
        (of(&usage_after) - of(&usage_before)).max(0.0)
    };
    let rss = |name: &str| {
        usage_after
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, u)| u.peak_rss_kib as f64 / 1024.0)
    };
    let jwt_times: Vec<Option<Duration>> = outcomes.iter().map(|o| o.jwt).collect();
    let confirm_times: Vec<Option<Duration>> = outcomes.iter().map(|o| o.confirm).collect();
    let callback = replica_load(&confirm_times, seconds, cpu("callback"), rss("callback"));
    let jwt_service = replica_load(&jwt_times, seconds, cpu("jwt-service"), rss("jwt-service"));
    let renewals = node_renewals(stack).await?;
    let tokenreviews = api_after.get("POST tokenreviews").copied().unwrap_or(0);
    let per_renewal = |n: u64| {
        if renewals == 0 {
            0.0
        } else {
            n as f64 / renewals as f64
        }
    };
    Ok(LoadReport {
        nodes: options.nodes,
        pods: pods.len(),
        rate: options.rate,
        seconds,
        callback: CallbackLoad {
            confirmations_per_core_second: callback.per_core_second,
            p99_ms: callback.p99_ms,
            p99_within_bound: callback.p99_ms <= P99_BOUND_MS,
            replica: callback,
        },
        jwt_service,
        api_requests_per_identity: ApiPerIdentity {
            issue: per_route[0],
            refresh: per_route[1],
        },
        tokenreviews_per_node_renewal: per_renewal(tokenreviews),
        api_requests_per_node_renewal: per_node_renewal,
        node_renewals: renewals,
        api_requests: during,
    })
}

/// One phase of the run: `count` identities of one route at `rate` a second, the pods taken
/// in turn from `first` on.
struct Phase {
    route: ProviderRoute,
    first: usize,
    count: usize,
    rate: f64,
}

impl Phase {
    async fn run(
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
struct Outcome {
    /// The JWT call, if it succeeded.
    jwt: Option<Duration>,
    /// The confirmation, if it succeeded.
    confirm: Option<Duration>,
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
fn load_pod(
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

/// A replica's figures from its calls' latencies (`None`: failed), the run's length, its CPU
/// and memory.
fn replica_load(times: &[Option<Duration>], seconds: f64, cpu: f64, rss_mib: f64) -> ReplicaLoad {
    let mut ok: Vec<f64> = times
        .iter()
        .flatten()
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    ok.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        if ok.is_empty() {
            return 0.0;
        }
        let i = ((ok.len() as f64 * q).ceil() as usize).clamp(1, ok.len()) - 1;
        ok[i]
    };
    let answered = ok.len() as u64;
    ReplicaLoad {
        answered,
        failed: times.len() as u64 - answered,
        per_second: answered as f64 / seconds.max(f64::EPSILON),
        cpu_seconds: cpu,
        per_core_second: if cpu > 0.0 {
            answered as f64 / cpu
        } else {
            0.0
        },
        p50_ms: quantile(0.5),
        p99_ms: quantile(0.99),
        max_ms: ok.last().copied().unwrap_or(0.0),
        peak_rss_mib: rss_mib,
    }
}

/// The API stand-in's `apiserver_request_total`, summed by `<verb> <resource>[/<subresource>]`
/// over codes.
async fn api_requests(api: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let url = format!("{}/metrics", api.trim_end_matches('/'));
    let text = reqwest::Client::new()
        .get(&url)
        .timeout(CALL_TIMEOUT)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("reading {url}"))?
        .text()
        .await?;
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("{url}: {line}"))?;
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let (verb, resource, sub) = (label("verb"), label("resource"), label("subresource"));
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        *counts.entry(key).or_insert(0) += value.trim().parse::<u64>().unwrap_or(0);
    }
    Ok(counts)
}

/// The agents' node-identity registrations and refreshes that succeeded, from their metrics
/// (`athenz_agent_node_identity_renewals_total{outcome="ok"}`).
async fn node_renewals(stack: &Stack) -> anyhow::Result<u64> {
    let mut total = 0;
    for node in &stack.info.nodes {
        let url = &node.agent.metrics_url;
        let text = reqwest::Client::new()
            .get(url)
            .timeout(CALL_TIMEOUT)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("reading {url}"))?
            .text()
            .await?;
        total += text
            .lines()
            .filter(|l| l.contains("node_identity_renewals_total{") && l.contains("outcome=\"ok\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .sum::<f64>() as u64;
    }
    Ok(total)
}

/// The report for people.
pub fn print_human(report: &LoadReport) {
    let c = &report.callback.replica;
    let j = &report.jwt_service;
    println!(
        "load: {} nodes, {} pods, {:.0} identities/s asked for {:.1} s",
        report.nodes, report.pods, report.rate, report.seconds
    );
    println!(
        "callback     {:>6} confirmed ({} failed), {:.0}/s; {:.0} per core-second; p50 {:.1} ms, p99 {:.1} ms{}; peak RSS {:.1} MiB",
        c.answered,
        c.failed,
        c.per_second,
        c.per_core_second,
        c.p50_ms,
        c.p99_ms,
        if report.callback.p99_within_bound {
            ""
        } else {
            " (over 50 ms: not a capacity)"
        },
        c.peak_rss_mib
    );
    println!(
        "jwt-service  {:>6} signed ({} failed), {:.0}/s; {:.0} per core-second; p50 {:.1} ms, p99 {:.1} ms; peak RSS {:.1} MiB",
        j.answered, j.failed, j.per_second, j.per_core_second, j.p50_ms, j.p99_ms, j.peak_rss_mib
    );
    println!(
        "API          {:.2} requests per identity issued, {:.2} per refresh; {:.2} TokenReviews and {:.2} requests in all per node renewal ({} renewals)",
        report.api_requests_per_identity.issue,
        report.api_requests_per_identity.refresh,
        report.tokenreviews_per_node_renewal,
        report.api_requests_per_node_renewal,
        report.node_renewals
    );
    for (request, n) in &report.api_requests {
        println!("  {request:<28} {n}");
    }
}
