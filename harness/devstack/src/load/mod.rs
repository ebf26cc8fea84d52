//! `athenz-devstack load`: what this system costs the cluster's shared parts at size — the
//! callback (ZTS's provider), the jwt-service and the Kubernetes API.
//!
//! A stack with `--nodes` real agents (each gets its node identity from ZTS through the
//! callback's TokenReview, as in a cluster), `--pods-per-node` real-size pods on each node in
//! the API, then for `--seconds` at `--rate` identities a second, spread over the nodes: each
//! identity is a JWT from the jwt-service, asked with that node's own certificate (the agent →
//! jwt-service path), then a confirmation from the callback over a new mutual-TLS connection,
//! as ZTS makes every one (`ZTSImpl`: a fresh `InstanceHttpProvider` per request, all from its
//! one TLS 1.2 `SSLContext`, so a connection resumes an earlier one's session when the replica
//! it reaches still holds it). A quarter of the identities are refreshes (the callback's `/refresh`), the rest
//! launches (`/instance`). The API stand-in counts every request (`apiserver_request_total`),
//! so the report says what each identity, each refresh and each node renewal costs the API.

use crate::bench::bench_pod;
use crate::kube::{KubeClient, PodSize};
use crate::procs::Usage;
use crate::stack::{Stack, StackInfo, StackOptions};
use anyhow::{Context, bail};
use athenz_core::names::DomainMapper;
use athenz_core::tls::{self, ClientIdentity};
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::zts::instance_provider_client::{ProviderClients, ProviderRoute};
use athenz_testbed::zts::registry::ProviderEntry;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod phase;
mod report;
use phase::{LoadPod, Outcome, Phase, load_pod};
use report::replica_load;
pub use report::{ApiPerIdentity, CallbackLoad, LoadReport, ReplicaLoad, print_human};

/// Every upstream call's timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Identities in flight at most (an open loop that falls behind stops adding).
const MAX_IN_FLIGHT: usize = 512;
/// The confirmation latency a replica must keep to count its throughput: a throughput reached
/// only at a worse p99 is no capacity ZTS's callers could rely on.
const P99_BOUND_MS: f64 = 50.0;
/// What a node-identity registration or refresh may ask the API (the callback's TokenReview of
/// the agent's token, its reads of the node and of the agent's pod), as `api_requests` names them.
const NODE_RENEWAL_REQUESTS: [&str; 3] = ["POST tokenreviews", "GET nodes", "GET pods"];

/// What to run: `load`'s options, as its command line gives them.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadOptions {
    /// Nodes, each with its own agent.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// Real-size pods on each node.
    #[arg(long, default_value_t = 20)]
    pub pods_per_node: usize,
    /// Identities a second (three quarters launches, then a quarter refreshes).
    #[arg(long, default_value_t = 300.0)]
    pub rate: f64,
    /// How long to drive, seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Certificate lifetime in minutes, pods' and nodes' (the stack's default otherwise);
    /// with 1 and `--seconds 60` the agents refresh their node identities during the run.
    #[arg(long)]
    pub lifetime_minutes: Option<u32>,
    /// Run each component from its own binary in DIR instead of this one.
    #[arg(long, value_name = "DIR")]
    pub components: Option<std::path::PathBuf>,
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

/// Creates the pods, drives the phases at the rate asked for, and reports what they cost.
async fn drive(stack: &Stack, options: &LoadOptions) -> anyhow::Result<LoadReport> {
    let info = &stack.info;
    let per_node_renewal = requests_per_node_renewal(stack).await?;
    let pods = Arc::new(create_pods(info, options).await?);
    let callers = Callers::of(info)?;
    let usage_before = stack.usage();
    let started = Instant::now();
    let driven = drive_phases(stack, options, &pods, &callers, per_node_renewal).await?;
    let seconds = started.elapsed().as_secs_f64();
    let usage_after = stack.usage();
    let api_after = api_requests(&info.kube_api.url).await?;
    let measured = Measured {
        pods: pods.len(),
        seconds,
        usage_before,
        usage_after,
        driven,
        tokenreviews: api_after.get("POST tokenreviews").copied().unwrap_or(0),
        renewals: node_renewals(stack).await?,
        per_node_renewal,
    };
    Ok(measured.report(options))
}

/// What one node registration or renewal asks the API. Once the stack is up and before any pod
/// of the load exists, every request the API has served is one of the agents' node
/// registrations: what one costs.
async fn requests_per_node_renewal(stack: &Stack) -> anyhow::Result<f64> {
    let at_start = api_requests(&stack.info.kube_api.url).await?;
    let registrations = node_renewals(stack).await?;
    Ok(if registrations == 0 {
        0.0
    } else {
        NODE_RENEWAL_REQUESTS
            .iter()
            .map(|k| at_start.get(*k).copied().unwrap_or(0))
            .sum::<u64>() as f64
            / registrations as f64
    })
}

/// `pods_per_node` real-size pods running on each node, in the API stand-in.
async fn create_pods(info: &StackInfo, options: &LoadOptions) -> anyhow::Result<Vec<LoadPod>> {
    let kube = KubeClient::new(&info.kube_api.url)?;
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
    Ok(pods)
}

/// Who calls the shared parts: each node's agent identity for the jwt-service, and ZTS's
/// provider clients (a new mutual-TLS connection per confirmation) for the callback.
struct Callers {
    jwt_clients: Arc<Vec<reqwest::Client>>,
    jwt_url: Arc<String>,
    providers: Arc<ProviderClients>,
    provider: Arc<ProviderEntry>,
}

impl Callers {
    fn of(info: &StackInfo) -> anyhow::Result<Self> {
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
        let providers = ProviderClients::new(
            tls::read_certs_file(&info.zts.ca)?,
            ClientIdentity::Fixed(tls::certified_key(
                tls::read_certs_file(&zts.cert)?,
                tls::read_key_file(&zts.key)?,
            )?),
            CALL_TIMEOUT,
        );
        let provider = ProviderEntry {
            name: PROVIDER.into(),
            endpoint: format!("{}{}", info.callback.url, info.callback.base_path),
            dns_suffixes: vec![DNS_SUFFIX.into()],
            launch: vec!["*".into()],
        };
        Ok(Self {
            jwt_clients: Arc::new(jwt_clients),
            jwt_url: Arc::new(format!("{}/v1/jwt", info.jwt_service.url)),
            providers: Arc::new(providers),
            provider: Arc::new(provider),
        })
    }
}

/// What the phases did: every identity's calls, the API requests per identity of each route,
/// and every API request made meanwhile.
struct Driven {
    outcomes: Vec<Outcome>,
    per_route: Vec<f64>,
    during: BTreeMap<String, u64>,
}

/// Three quarters launches, then a quarter refreshes, each phase's API requests apart (less
/// the agents' node renewals meanwhile, at `per_node_renewal` requests each).
async fn drive_phases(
    stack: &Stack,
    options: &LoadOptions,
    pods: &Arc<Vec<LoadPod>>,
    callers: &Callers,
    per_node_renewal: f64,
) -> anyhow::Result<Driven> {
    let api = &stack.info.kube_api.url;
    let total = ((options.rate * options.seconds as f64).ceil() as usize).max(4);
    let phases = [
        (ProviderRoute::Instance, total - total / 4),
        (ProviderRoute::Refresh, total / 4),
    ];
    let mut driven = Driven {
        outcomes: Vec::new(),
        per_route: Vec::new(),
        during: BTreeMap::new(),
    };
    let mut first = 0;
    for (route, count) in phases {
        let before = api_requests(api).await?;
        let renewals_before = node_renewals(stack).await?;
        let phase = Phase {
            route,
            first,
            count,
            rate: options.rate,
        };
        let done = phase
            .run(
                pods,
                &callers.jwt_clients,
                &callers.jwt_url,
                &callers.providers,
                &callers.provider,
            )
            .await?;
        let after = api_requests(api).await?;
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
                *driven.during.entry(k.clone()).or_insert(0) += added;
            }
        }
        let confirmed = done.iter().filter(|o| o.confirm.is_some()).count();
        driven.per_route.push(if confirmed == 0 {
            0.0
        } else {
            requests.max(0.0) / confirmed as f64
        });
        driven.outcomes.extend(done);
        first += count;
    }
    Ok(driven)
}

/// What a run measured, with each process's usage before and after it.
struct Measured {
    pods: usize,
    seconds: f64,
    usage_before: Vec<(String, Usage)>,
    usage_after: Vec<(String, Usage)>,
    driven: Driven,
    /// TokenReviews the API served, from the stack's start.
    tokenreviews: u64,
    /// The agents' node registrations and renewals, from the stack's start.
    renewals: u64,
    per_node_renewal: f64,
}

impl Measured {
    fn report(self, options: &LoadOptions) -> LoadReport {
        let cpu = |name: &str| {
            let of = |u: &[(String, Usage)]| {
                u.iter()
                    .find(|(n, _)| n == name)
                    .map_or(0.0, |(_, u)| u.cpu_seconds)
            };
            (of(&self.usage_after) - of(&self.usage_before)).max(0.0)
        };
        let rss = |name: &str| {
            self.usage_after
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, u)| u.peak_rss_kib as f64 / 1024.0)
        };
        let outcomes = &self.driven.outcomes;
        let jwt_times: Vec<Option<Duration>> = outcomes.iter().map(|o| o.jwt).collect();
        let confirm_times: Vec<Option<Duration>> = outcomes.iter().map(|o| o.confirm).collect();
        let seconds = self.seconds;
        let callback = replica_load(&confirm_times, seconds, cpu("callback"), rss("callback"));
        let jwt_service = replica_load(&jwt_times, seconds, cpu("jwt-service"), rss("jwt-service"));
        let tokenreviews_per_node_renewal = if self.renewals == 0 {
            0.0
        } else {
            self.tokenreviews as f64 / self.renewals as f64
        };
        LoadReport {
            nodes: options.nodes,
            pods: self.pods,
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
                issue: self.driven.per_route[0],
                refresh: self.driven.per_route[1],
            },
            tokenreviews_per_node_renewal,
            api_requests_per_node_renewal: self.per_node_renewal,
            node_renewals: self.renewals,
            api_requests: self.driven.during,
        }
    }
}

/// The API stand-in's `apiserver_request_total`, summed by `<verb> <resource>[/<subresource>]`
/// over codes.
async fn api_requests(api: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = crate::scrape::text(&format!("{}/metrics", api.trim_end_matches('/'))).await?;
    let mut counts = BTreeMap::new();
    for (labels, value) in crate::scrape::samples(&text, "apiserver_request_total") {
        let field = |name| crate::scrape::label(labels, name).unwrap_or_default();
        let key = match field("subresource") {
            "" => format!("{} {}", field("verb"), field("resource")),
            sub => format!("{} {}/{sub}", field("verb"), field("resource")),
        };
        // counters are whole numbers
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let value = value as u64;
        *counts.entry(key).or_insert(0) += value;
    }
    Ok(counts)
}

/// The agents' node-identity registrations and refreshes that succeeded, from their metrics
/// (`athenz_agent_node_identity_renewals_total{outcome="ok"}`).
async fn node_renewals(stack: &Stack) -> anyhow::Result<u64> {
    let mut total = 0.0;
    for node in &stack.info.nodes {
        let text = crate::scrape::text(&node.agent.metrics_url).await?;
        total += crate::scrape::samples(&text, "node_identity_renewals_total")
            .filter(|(labels, _)| crate::scrape::label(labels, "outcome") == Some("ok"))
            .map(|(_, v)| v)
            .sum::<f64>();
    }
    // counters are whole numbers
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(total as u64)
}
