//! The callback's vocabulary of outcomes, shared by the pod checks (`checks.rs`) and the node
//! checks (`node.rs`): the settings they read ([`Policy`], [`NodePolicy`]), a named "no"
//! ([`Deny`], answered 403) and a "cannot tell now" ([`Undecided`], answered 504).
//!
//! Why two kinds of refusal: real ZTS passes a provider's 504 on to its client as 504 and turns
//! every other non-200 into a final 403 (Athenz `ZTSImpl.validateConfirmationData` and
//! `processProviderX509RefreshRequest`; `InstanceProviderClient.postInstanceConfirmation` maps no
//! answer to `GATEWAY_TIMEOUT` too). So only a 504 lets a starting pod try again; a 403 ends its
//! init container. A check that could not run (the Kubernetes API unreachable, timing out,
//! answering 5xx or 429) is therefore never a [`Deny`].

use athenz_core::names::DomainMapper;
use jsonwebtoken::Algorithm;

/// A failed check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deny {
    /// The check's name (metric label).
    pub check: &'static str,
    /// Why, for ZTS's logs.
    pub message: String,
}

impl std::fmt::Display for Deny {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.check, self.message)
    }
}

pub(crate) fn deny(check: &'static str, message: impl Into<String>) -> Deny {
    Deny {
        check,
        message: message.into(),
    }
}

/// Settings the checks use.
pub struct Policy {
    /// Our provider name.
    pub provider: String,
    /// Algorithms accepted (ES256, RS256 by default; never none, never HMAC).
    pub algorithms: Vec<Algorithm>,
    /// Expected `aud`.
    pub audience: String,
    /// Expected `iss`, if checked.
    pub issuer: Option<String>,
    /// Allowed clock skew, seconds.
    pub skew_secs: i64,
    /// Longest a token may still be valid, seconds: bounds how long its jti must be remembered.
    pub max_lifetime_secs: i64,
    /// Namespace ↔ domain rules.
    pub mapper: DomainMapper,
    /// DNS suffix of pod SANs.
    pub dns_suffix: String,
    /// Who node agents are, and how their tokens are checked (docs/design.md §4.9).
    pub node: NodePolicy,
}

/// A check that could not be made now: which source failed, and why. Answered 504 so that ZTS
/// answers its client 504 and the pod retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecided {
    /// What could not answer (metric label): `kubernetes_api` or `token_review`.
    pub source: &'static str,
    /// Why, for ZTS's logs and the pod's.
    pub message: String,
}

impl std::fmt::Display for Undecided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot tell now ({}): {}", self.source, self.message)
    }
}

/// Why a confirmation was not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A check said no: 403, final.
    Deny(Deny),
    /// A check could not be made: 504, try again.
    Undecided(Undecided),
}

impl From<Deny> for Refusal {
    fn from(d: Deny) -> Self {
        Self::Deny(d)
    }
}

impl From<Undecided> for Refusal {
    fn from(u: Undecided) -> Self {
        Self::Undecided(u)
    }
}

/// The items of a comma-separated attribute (`sanDNS`, `sanIP`, `sanURI`), trimmed, empty ones
/// skipped.
pub(crate) fn split(value: Option<&String>) -> impl Iterator<Item = &str> {
    value
        .map(String::as_str)
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Who node agents are.
#[derive(Debug, Clone)]
pub struct NodePolicy {
    /// Their Athenz principal, `<admin-domain>.athenz-agent` by default.
    pub principal: String,
    /// The audience their tokens must be for.
    pub audience: String,
    /// Their pods' namespace.
    pub namespace: String,
    /// Their pods' service account.
    pub service_account: String,
}

impl NodePolicy {
    /// Whether `<domain>.<service>` is the node agents' principal.
    pub fn is_agent(&self, domain: &str, service: &str) -> bool {
        self.principal.rsplit_once('.') == Some((domain, service))
    }

    /// `system:serviceaccount:<namespace>:<account>`.
    pub(crate) fn username(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }
}
