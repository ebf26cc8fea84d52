//! `athenz-node-authorizer`: a deny-only authorization webhook (docs/design.md §6) that scopes
//! the agents' pod list and watch to their own node. RBAC grants `list`/`watch` on every pod (it
//! cannot name a node); the API server's structured authorization configuration sends this
//! webhook only the agents' pod lists and watches whose field selector is not their node (its
//! CEL `matchConditions`, deploy/node-authorizer/), and the webhook denies unless the review's
//! field selector has `spec.nodeName` equal to the node the caller's pod-bound token names
//! (`authentication.kubernetes.io/node-name`). Everything else gets no opinion: it never allows.
//!
//! It serves `POST /authorize` over mutual TLS: the API server presents the client certificate
//! of the webhook's kubeconfig, whose principal must be on `--allowed-principals`.

pub mod review;

use athenz_core::daemon::{Bound, OpsArgs, Shutdown, StartError, TlsServerArgs};
use athenz_core::http::{
    Body, ConnInfo, Handler, HttpMetrics, Readiness, ServerLimits, error_response, json_response,
};
use athenz_core::tls::PrincipalAllowList;
use bytes::Bytes;
use clap::Parser;
use http::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::Arc;
use std::time::Duration;

/// Largest review accepted: a SubjectAccessReview is a few hundred bytes to a few KiB (the
/// user's groups and extra, the selectors); anything past 64 KiB is not one.
pub const MAX_REVIEW: usize = 64 * 1024;
/// Time allowed to receive a review's body (the API server's own webhook timeout is shorter).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// The route the webhook's kubeconfig names.
pub const ROUTE: &str = "/authorize";

/// Command line of `athenz-node-authorizer`; every flag has an environment fallback.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "athenz-node-authorizer",
    version,
    about = "Authorization webhook scoping the agents' pod list and watch to their node"
)]
pub struct Config {
    /// The agents' account whose pod lists and watches are scoped:
    /// `system:serviceaccount:<namespace>:<name>`.
    #[arg(
        long,
        env = "AGENT_USER",
        default_value = "system:serviceaccount:athenz-system:athenz-agent"
    )]
    pub agent_user: String,
    /// Server certificate, client CA and allowed principals (the API server's client
    /// certificate from the webhook's kubeconfig).
    #[command(flatten)]
    pub tls: TlsServerArgs,
    /// Operations endpoint and logging.
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// Labels of the decision counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `denied`, `own_node`, `not_governed` or `malformed`.
    pub outcome: &'static str,
}

/// The webhook handler.
pub struct AuthorizerHandler {
    /// `system:serviceaccount:<ns>:<name>` of the agents.
    pub agent_user: String,
    /// Who may call (the API server's client certificate).
    pub allowed: PrincipalAllowList,
    /// Decisions by outcome.
    pub decisions: Family<DecisionLabels, Counter>,
}

impl Handler for AuthorizerHandler {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        if req.uri().path() != ROUTE {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        }
        if req.method() != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        }
        let principal = conn.principal.as_deref().unwrap_or("");
        if !self.allowed.allows(principal) {
            tracing::warn!(%principal, "refused a caller that is not allowed");
            return error_response(
                StatusCode::FORBIDDEN,
                format!("principal {principal:?} may not call"),
            );
        }
        match review::decide(&self.agent_user, req.body()) {
            Ok(decision) => {
                self.count(decision.label());
                if let review::Decision::Denied(reason) = &decision {
                    tracing::info!(%reason, "denied");
                }
                json_response(StatusCode::OK, &decision.answer())
            }
            Err(bad) => {
                self.count("malformed");
                tracing::warn!(error = %bad, "refused a review it could not read");
                error_response(StatusCode::BAD_REQUEST, bad.to_string())
            }
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        if req.uri.path() == ROUTE {
            "authorize"
        } else {
            "other"
        }
    }
}

impl AuthorizerHandler {
    fn count(&self, outcome: &'static str) {
        self.decisions
            .get_or_create(&DecisionLabels { outcome })
            .inc();
    }
}

/// Checks `user` is a service account's name, `system:serviceaccount:<namespace>:<name>`.
pub fn validate_agent_user(user: &str) -> Result<(), String> {
    let parts = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'));
    match parts {
        Some((namespace, name))
            if athenz_core::names::validate_dns_label("namespace", namespace).is_ok()
                && athenz_core::names::validate_dns_subdomain("name", name).is_ok() =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{user:?} is not system:serviceaccount:<namespace>:<name>"
        )),
    }
}

/// Starts the webhook; it runs until `shutdown` is triggered.
pub async fn start(
    config: Config,
    shutdown: Shutdown,
) -> Result<(Bound, tokio::task::JoinHandle<()>), StartError> {
    validate_agent_user(&config.agent_user)
        .map_err(|e| StartError::new("--agent-user (AGENT_USER)", e))?;
    let mut tls = config.tls.load().await?;
    tls.limits = ServerLimits {
        max_body: MAX_REVIEW,
        body_timeout: BODY_TIMEOUT,
        ..tls.limits
    };
    let api = tls
        .local_addr()
        .map_err(|e| StartError::new("--listen (LISTEN)", e))?;
    let ops_listener = config.ops.bind().await?;
    let mut registry = prometheus_client::registry::Registry::with_prefix("athenz_node_authorizer");
    let http_metrics = HttpMetrics::register_tls(&mut registry);
    let decisions = Family::<DecisionLabels, Counter>::default();
    registry.register(
        "decisions",
        "SubjectAccessReviews answered, by outcome (denied: the agents' account beyond its node)",
        decisions.clone(),
    );
    let handler = Arc::new(AuthorizerHandler {
        agent_user: config.agent_user.clone(),
        allowed: tls.allowed.clone(),
        decisions,
    });
    let readiness = Readiness::default();
    readiness.set(true);
    let (bound, task) = athenz_core::daemon::spawn_serving(
        api,
        ops_listener,
        registry,
        readiness,
        Vec::new(),
        tls.serve(handler, http_metrics, shutdown.wait()),
        &shutdown,
    )?;
    tracing::info!(api = %bound.api, ops = %bound.ops, agent = %config.agent_user, "node authorizer listening");
    Ok((bound, task))
}

/// The `athenz-node-authorizer` command: parses `args` (the program name first; a bad setting
/// exits 2 with clap's message) and serves until SIGTERM.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::io::Result<()> {
    athenz_core::daemon::parse_and_run(
        args,
        |c: &Config| athenz_core::daemon::RunSettings::from_ops(&c.ops),
        start,
    )
}
