//! `POST <base>/instance` and `POST <base>/refresh`: run every check in order; allow = 200 with
//! the confirmation echoed plus `certExpiryTime`; deny = 403 naming the check; malformed = 400;
//! cannot tell now (the Kubernetes API unreachable, timing out, 5xx, 429) = 504, the one answer
//! real ZTS passes on as retryable (see [`crate::decision`]).

use crate::checks;
use crate::checks::ReceivedClaims;
use crate::decision::{Policy, Refusal, Undecided};
use crate::keys::PublicKeys;
use crate::node;
use crate::pod_cache::PodCache;
use crate::pods::{Cluster, PodFacts};
use crate::replay::ReplayCache;
use athenz_core::http::{Body, ConnInfo, Handler, error_response, json_response};
use athenz_core::subject::PodSubject;
use athenz_core::tls::PrincipalAllowList;
use athenz_core::zts::{InstanceConfirmation, attr};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::IpAddr;
use std::sync::Arc;

/// Labels of the decision counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `instance` or `refresh`.
    pub route: &'static str,
    /// `allow`, `deny` (403), `malformed` (400), `undecided` (504: a check could not be made).
    pub outcome: &'static str,
    /// The check that decided (`none` when allowed); for `undecided`, what could not answer
    /// (`kubernetes_api`, `token_review`).
    pub check: &'static str,
}

/// Labels of the pod-read counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodReadLabels {
    /// `cache` (the watch-fed pod cache answered) or `api` (a `GET` of the pod).
    pub source: &'static str,
}

/// What the callback counts.
#[derive(Clone, Debug, Default)]
pub struct CallbackMetrics {
    decisions: Family<DecisionLabels, Counter>,
    pod_reads: Family<PodReadLabels, Counter>,
    replay_entries: Gauge,
}

impl CallbackMetrics {
    /// Registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "decisions",
            "Confirmations decided, by route, outcome and check",
            m.decisions.clone(),
        );
        registry.register(
            "pod_reads",
            "Pods read for a launch or refresh, by source (cache or api)",
            m.pod_reads.clone(),
        );
        registry.register(
            "replay_cache_entries",
            "Token ids held by the replay cache",
            m.replay_entries.clone(),
        );
        m
    }

    fn pod_read(&self, source: &'static str) {
        self.pod_reads
            .get_or_create(&PodReadLabels { source })
            .inc();
    }

    fn record(&self, route: &'static str, outcome: &'static str, check: &'static str) {
        self.decisions
            .get_or_create(&DecisionLabels {
                route,
                outcome,
                check,
            })
            .inc();
    }
}

/// The handler.
pub struct CallbackHandler {
    /// Path prefix, e.g. `/` or `/callback`.
    pub base_path: String,
    /// ZTS principals allowed to call.
    pub allowed: PrincipalAllowList,
    /// Check settings.
    pub policy: Policy,
    /// JWT public keys.
    pub keys: Arc<PublicKeys>,
    /// Seen token ids.
    pub replay: ReplayCache,
    /// The Kubernetes API.
    pub cluster: Cluster,
    /// Namespaces' domains, with the annotations the install honours (read from the API).
    pub domains: athenz_core::names::NamespaceDomains,
    /// The watch-fed pod cache (`None`: every confirmation reads its pod from the API).
    pub pod_cache: Option<PodCache>,
    /// `certExpiryTime` granted, minutes.
    pub cert_expiry_minutes: u32,
    /// Metrics.
    pub metrics: CallbackMetrics,
}

/// A Kubernetes API failure, as the answer "cannot tell now".
fn kubernetes_api(e: impl std::fmt::Display) -> Refusal {
    Refusal::Undecided(Undecided {
        source: "kubernetes_api",
        message: e.to_string(),
    })
}

impl CallbackHandler {
    fn route_of(&self, path: &str) -> Option<&'static str> {
        let rest = path.strip_prefix(self.base_path.trim_end_matches('/'))?;
        match rest {
            "/instance" => Some("instance"),
            "/refresh" => Some("refresh"),
            _ => None,
        }
    }

    /// Runs every check on `c`: a node agent's registration (docs/design.md §4.9) or a pod's
    /// launch or refresh (docs/design.md §4.4).
    async fn confirm(&self, c: &InstanceConfirmation) -> Result<(), Refusal> {
        let p = &self.policy;
        checks::check_provider(p, c)?;
        checks::check_attestation_present(c)?;
        if p.node.is_agent(&c.domain, &c.service) {
            return self.confirm_node(c).await;
        }
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let (subject, claims) = checks::check_request(p, &self.keys, &self.replay, c, now)?;
        if self.domains.reads_annotations() {
            // the namespace's annotation may name its domain (check_request left this check)
            let mapped = self
                .domains
                .domain_of(&subject.namespace)
                .await
                .map_err(|e| match e {
                    athenz_core::names::DomainLookupError::Refused(e) => {
                        Refusal::Deny(crate::decision::deny("namespace", e.to_string()))
                    }
                    unavailable => kubernetes_api(unavailable),
                })?;
            checks::check_mapped_domain(&subject, &mapped)?;
        }
        let pod = self.subject_pod(&subject, &claims).await?;
        checks::check_pod(&subject, pod.as_ref())?;
        if let Some(pod) = &pod {
            checks::check_pod_node(&subject, &claims, pod)?;
        }
        // The service's cluster IP is entitled only if the Service exists; ask only when asked for.
        let service_ip: Option<IpAddr> = if checks::extra_san_ips(&subject, c)?.is_empty() {
            None
        } else {
            self.cluster
                .service(&subject.namespace, &subject.service)
                .await
                .map_err(kubernetes_api)?
                .and_then(|s| s.spec)
                .and_then(|spec| spec.cluster_ip)
                .and_then(|ip| ip.parse().ok())
        };
        checks::check_sans(p, &subject, service_ip, c)?;
        Ok(())
    }

    /// The subject's pod: the cached one when every pod check passes on it, else the API's.
    /// The cache never refuses: a miss, or a cached pod that would be denied (one the cache may
    /// show before its IP, say), is read from the API (docs/design.md §4.4).
    async fn subject_pod(
        &self,
        subject: &PodSubject,
        claims: &ReceivedClaims,
    ) -> Result<Option<PodFacts>, Refusal> {
        let cached = self
            .pod_cache
            .as_ref()
            .and_then(|cache| cache.fresh(&subject.namespace, &subject.name))
            .filter(|pod| {
                checks::check_pod(subject, Some(pod)).is_ok()
                    && checks::check_pod_node(subject, claims, pod).is_ok()
            });
        if let Some(pod) = cached {
            self.metrics.pod_read("cache");
            return Ok(Some(pod));
        }
        self.metrics.pod_read("api");
        self.cluster
            .pod(&subject.namespace, &subject.name)
            .await
            .map_err(kubernetes_api)
    }

    /// A node agent's registration or refresh: its projected service-account token, reviewed by
    /// the API server, must be its own pod's on the node it names (docs/design.md §4.9).
    async fn confirm_node(&self, c: &InstanceConfirmation) -> Result<(), Refusal> {
        let p = &self.policy.node;
        let token = c.attestation_data.expose();
        node::check_token_shape(token)?;
        let review = self
            .cluster
            .review_token(token, &p.audience)
            .await
            .map_err(|e| {
                Refusal::Undecided(Undecided {
                    source: "token_review",
                    message: e.to_string(),
                })
            })?;
        let user = node::check_token_review(p, &review)?;
        node::check_account(p, &user)?;
        let claims = node::check_pod_claims(&user)?;
        let pod = self
            .cluster
            .pod(&p.namespace, &claims.pod_name)
            .await
            .map_err(kubernetes_api)?;
        let node_name = node::check_agent_pod(p, &claims, pod.as_ref())?;
        node::check_instance_id(&node_name, c)?;
        node::check_node_name(&claims, &node_name)?;
        if let Some(uid) = &claims.node_uid {
            let found = self
                .cluster
                .node(&node_name)
                .await
                .map_err(kubernetes_api)?;
            node::check_node_uid(&node_name, uid, found.as_ref())?;
        }
        node::check_sans(&self.policy, &node_name, c)?;
        Ok(())
    }
}

impl Handler for CallbackHandler {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        let Some(route) = self.route_of(req.uri().path()) else {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        };
        if req.method() != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        }
        let principal = conn.principal.as_deref().unwrap_or("");
        if !self.allowed.allows(principal) {
            tracing::warn!(%principal, peer = ?conn.peer, "refused a caller that is not an allowed ZTS");
            self.metrics.record(route, "deny", "caller");
            return error_response(
                StatusCode::FORBIDDEN,
                format!("principal {principal:?} is not an allowed ZTS"),
            );
        }
        let confirmation: InstanceConfirmation = match serde_json::from_slice(req.body()) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.record(route, "malformed", "body");
                return error_response(
                    StatusCode::BAD_REQUEST,
                    format!("invalid InstanceConfirmation: {e}"),
                );
            }
        };
        let outcome = self.confirm(&confirmation).await;
        self.metrics
            .replay_entries
            .set(i64::try_from(self.replay.len()).unwrap_or(i64::MAX));
        match outcome {
            Ok(()) => {
                self.metrics.record(route, "allow", "none");
                tracing::info!(
                    route,
                    domain = %confirmation.domain,
                    service = %confirmation.service,
                    instance = ?confirmation.attributes.get(attr::INSTANCE_ID),
                    "confirmed"
                );
                let mut echo = confirmation;
                echo.attributes.insert(
                    attr::CERT_EXPIRY_TIME.to_owned(),
                    self.cert_expiry_minutes.to_string(),
                );
                json_response(StatusCode::OK, &echo)
            }
            Err(Refusal::Deny(d)) => {
                self.metrics.record(route, "deny", d.check);
                tracing::info!(
                    route,
                    check = d.check,
                    reason = %d.message,
                    domain = %confirmation.domain,
                    service = %confirmation.service,
                    "denied"
                );
                error_response(StatusCode::FORBIDDEN, d.to_string())
            }
            Err(Refusal::Undecided(u)) => {
                self.metrics.record(route, "undecided", u.source);
                tracing::warn!(
                    route,
                    source = u.source,
                    reason = %u.message,
                    domain = %confirmation.domain,
                    service = %confirmation.service,
                    "cannot decide now: answering 504 so that the pod retries"
                );
                error_response(StatusCode::GATEWAY_TIMEOUT, u.to_string())
            }
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        self.route_of(req.uri.path()).unwrap_or("other")
    }
}
