//! Athenz authorization for the pod (docs/design.md §4.11): role certificates and tokens for the
//! configured targets, fetched from ZTS with the pod's own certificate, written with the service
//! credentials as one set, renewed before expiry, and served by the token server.

pub mod cache;
pub mod metrics;
pub mod server;
pub mod targets;
pub mod zts;

use athenz_core::crypto::CertInfo;
use athenz_core::files::{FileSet, Owner, secret_mode};
use athenz_core::refresh::{Backoff, random_unit};
use athenz_core::secret::Secret;
use cache::{CachePolicy, Kind, TokenCache, TokenKey};
use server::TokenServer;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use targets::{DomainRole, TokenTypes};
use zts::{FetchError, ZtsAccess, unix_now};

/// Directory of the role certificates in the credential set.
pub const ROLE_CERTS_DIR: &str = "rolecerts";
/// Directory of the token files in the credential set.
pub const TOKENS_DIR: &str = "tokens";

/// A role certificate held for the next write.
#[derive(Debug, Clone)]
struct RoleCert {
    pem: String,
    not_before: i64,
    not_after: i64,
    /// The identity generation whose key it certifies.
    generation: u64,
}

/// Per-target retry state of role certificates.
#[derive(Debug, Default, Clone, Copy)]
struct Retry {
    failures: u32,
    at: Option<Instant>,
}

/// A target that could not be served, and why.
#[derive(Debug, Clone)]
pub struct TargetFailure {
    /// The file it was for, e.g. `rolecerts/media.sports:role.readers.cert.pem`.
    pub file: String,
    pub error: FetchError,
}

impl std::fmt::Display for TargetFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.error)
    }
}

/// Role certificates and tokens of the configured targets.
pub struct Authz {
    targets: Vec<DomainRole>,
    types: TokenTypes,
    zts: Arc<ZtsAccess>,
    cache: Arc<TokenCache>,
    default_expiry: u64,
    role_certs: Mutex<BTreeMap<DomainRole, RoleCert>>,
    role_cert_retry: Mutex<BTreeMap<DomainRole, Retry>>,
    backoff: Backoff,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Authz {
    /// Authorization for `targets` through `zts`; `default_expiry` (seconds, 0 for ZTS's) is
    /// asked for the targets' tokens and for requests that name none.
    pub fn new(
        zts: Arc<ZtsAccess>,
        targets: Vec<DomainRole>,
        types: TokenTypes,
        policy: CachePolicy,
        default_expiry: u64,
    ) -> Self {
        let pinned: Vec<TokenKey> = targets
            .iter()
            .flat_map(|t| target_keys(types, t, default_expiry).map(|(_, k)| k))
            .collect();
        let cache = TokenCache::new(zts.clone(), policy, &pinned);
        Self {
            targets,
            types,
            zts,
            cache,
            default_expiry,
            role_certs: Mutex::default(),
            role_cert_retry: Mutex::default(),
            backoff: policy.backoff,
        }
    }

    /// The configured targets.
    pub fn targets(&self) -> &[DomainRole] {
        &self.targets
    }

    /// The token cache (for the token server and the metrics).
    pub fn cache(&self) -> &Arc<TokenCache> {
        &self.cache
    }

    /// Presents a new service identity to ZTS and gets, with it, every target's role
    /// certificate and tokens. What could not be had is returned (the earlier role certificates
    /// and tokens, if any, stay in use).
    pub async fn rotate(
        &self,
        key_pem: &Secret,
        cert_pem: &str,
    ) -> Result<Vec<TargetFailure>, String> {
        self.zts.set_identity(key_pem, cert_pem)?;
        lock(&self.role_cert_retry).clear();
        let (_, mut failures) = self.renew_role_certs(true).await;
        failures.extend(self.renew_tokens().await.1);
        Ok(failures)
    }

    /// Renews what is due (tokens and role certificates in the last part of their life, or
    /// missing): how many target files changed, and what failed. Call [`Self::rotate`] first.
    pub async fn renew(&self) -> (usize, Vec<TargetFailure>) {
        let (certs, mut failures) = self.renew_role_certs(false).await;
        let (tokens, token_failures) = self.renew_tokens().await;
        failures.extend(token_failures);
        (certs + tokens, failures)
    }

    async fn renew_tokens(&self) -> (usize, Vec<TargetFailure>) {
        let renewed = self.cache.renew_due().await;
        let mut failures = Vec::new();
        for target in &self.targets {
            for (kind, key) in target_keys(self.types, target, self.default_expiry) {
                if let Some(error) = self.cache.failure(&key) {
                    failures.push(TargetFailure {
                        file: token_file(target, kind),
                        error,
                    });
                }
            }
        }
        (renewed, failures)
    }

    fn role_cert_due(&self, target: &DomainRole, now: i64, generation: u64) -> bool {
        match lock(&self.role_certs).get(target) {
            None => true,
            Some(c) => {
                c.generation != generation || c.not_after - now <= (c.not_after - c.not_before) / 4
            }
        }
    }

    async fn renew_role_certs(&self, rotating: bool) -> (usize, Vec<TargetFailure>) {
        let mut failures = Vec::new();
        let mut renewed = 0;
        let generation = self.zts.generation();
        for target in &self.targets {
            let waiting = lock(&self.role_cert_retry)
                .get(target)
                .and_then(|r| r.at)
                .is_some_and(|at| Instant::now() < at);
            if (!rotating && waiting) || !self.role_cert_due(target, unix_now(), generation) {
                continue;
            }
            match self.zts.role_certificate(target).await {
                Ok(pem) => {
                    let info = CertInfo::from_pem(&pem).ok();
                    lock(&self.role_certs).insert(
                        target.clone(),
                        RoleCert {
                            not_before: info.as_ref().map_or(0, |i| i.not_before.unix_timestamp()),
                            not_after: info.as_ref().map_or(0, |i| i.not_after.unix_timestamp()),
                            pem,
                            generation,
                        },
                    );
                    lock(&self.role_cert_retry).remove(target);
                    renewed += 1;
                }
                Err(error) => {
                    let mut retries = lock(&self.role_cert_retry);
                    let retry = retries.entry(target.clone()).or_default();
                    retry.at =
                        Some(Instant::now() + self.backoff.delay(retry.failures, random_unit()));
                    retry.failures = retry.failures.saturating_add(1);
                    tracing::warn!(target = %target.name(), error = %error, "role certificate not renewed");
                    failures.push(TargetFailure {
                        file: role_cert_file(target),
                        error,
                    });
                }
            }
        }
        (renewed, failures)
    }

    /// How long until something is due, at most `at_most`.
    pub fn next_due_in(&self, at_most: Duration) -> Duration {
        let mut next = self.cache.next_due_in(at_most);
        let now = unix_now();
        let generation = self.zts.generation();
        let retries = lock(&self.role_cert_retry);
        for target in &self.targets {
            let wait = match retries.get(target).and_then(|r| r.at) {
                Some(at) => at.saturating_duration_since(Instant::now()),
                None => match lock(&self.role_certs).get(target) {
                    Some(c) if c.generation == generation => {
                        let renew_at = c.not_after - (c.not_after - c.not_before) / 4;
                        Duration::from_secs((renew_at - now).max(0) as u64)
                    }
                    _ => Duration::ZERO,
                },
            };
            next = next.min(wait);
        }
        next
    }

    /// The files of the targets for the credential set: role certificates 0644, tokens with the
    /// key's mode. A file not had now is carried over from `set` as it is on disk (so a failed
    /// renewal never removes what an earlier one wrote).
    pub fn files(&self, set: &FileSet, owner: Option<Owner>) -> Vec<(String, Vec<u8>, u32)> {
        let mut files = Vec::new();
        let carried = |name: &str| set.read(&[name]).ok().and_then(|mut v| v.pop());
        let certs = lock(&self.role_certs);
        for target in &self.targets {
            let name = role_cert_file(target);
            let pem = certs.get(target).map(|c| c.pem.clone().into_bytes());
            if let Some(bytes) = pem.or_else(|| carried(&name)) {
                files.push((name, bytes, 0o644));
            }
            for (kind, key) in target_keys(self.types, target, self.default_expiry) {
                let name = token_file(target, kind);
                let token = self
                    .cache
                    .current(&key)
                    .map(|t| t.raw.expose().as_bytes().to_vec());
                if let Some(bytes) = token.or_else(|| carried(&name)) {
                    files.push((name, bytes, secret_mode(owner)));
                }
            }
        }
        files
    }
}

/// The pinned keys of one target, by kind.
fn target_keys(
    types: TokenTypes,
    target: &DomainRole,
    default_expiry: u64,
) -> impl Iterator<Item = (Kind, TokenKey)> {
    let kinds = [
        types.access.then_some(Kind::Access),
        types.role.then_some(Kind::Role),
    ];
    let target = target.clone();
    kinds
        .into_iter()
        .flatten()
        .map(move |kind| (kind, TokenServer::target_key(kind, &target, default_expiry)))
}

/// `rolecerts/<d>:role.<r>.cert.pem`.
pub fn role_cert_file(target: &DomainRole) -> String {
    format!("{ROLE_CERTS_DIR}/{}.cert.pem", target.name())
}

/// `tokens/<d>:role.<r>.accesstoken` or `.roletoken`.
pub fn token_file(target: &DomainRole, kind: Kind) -> String {
    format!("{TOKENS_DIR}/{}.{}", target.name(), kind.name())
}
