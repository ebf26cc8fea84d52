//! The token cache behind the token server and the token files: one slot per distinct request
//! (kind, domain, roles, proxy principal, expiry bounds), filled once however many ask at once,
//! renewed before expiry, and still served from its last good token while ZTS is away.
//!
//! Single flight: a request that finds no usable token notes how many fetches its slot has
//! seen, then queues on the slot's fetch lock. The first in line fetches; everyone queued
//! behind it sees the count moved and takes that outcome (the token, or the error) instead of
//! asking ZTS again. The fetch runs on its own task, so a caller that gives up (timeout,
//! disconnect) does not cancel it for the others.

use super::zts::{FetchError, Token, ZtsAccess, unix_now};
use athenz_core::refresh::{Backoff, random_unit};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A token kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// OAuth2 access token.
    Access,
    /// Role token.
    Role,
}

impl Kind {
    /// The name k8s-athenz-sia uses (file suffixes, metric labels).
    pub fn name(self) -> &'static str {
        match self {
            Self::Access => "accesstoken",
            Self::Role => "roletoken",
        }
    }
}

/// What identifies one cached token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenKey {
    /// Access or role token.
    pub kind: Kind,
    /// The domain.
    pub domain: String,
    /// The roles, sorted, each once (empty: the whole domain / all the caller's roles).
    pub roles: Vec<String>,
    /// On behalf of this principal.
    pub proxy_for_principal: Option<String>,
    /// Role tokens: the least lifetime asked for, seconds.
    pub min_expiry: Option<u64>,
    /// The most lifetime asked for, seconds (access tokens: `expires_in`).
    pub max_expiry: Option<u64>,
}

impl TokenKey {
    /// A key with `roles` normalised (sorted, each once), so `a,b` and `b,a` share a slot.
    pub fn new(kind: Kind, domain: &str, roles: impl IntoIterator<Item = String>) -> Self {
        let mut roles: Vec<String> = roles.into_iter().collect();
        roles.sort();
        roles.dedup();
        Self {
            kind,
            domain: domain.to_owned(),
            roles,
            proxy_for_principal: None,
            min_expiry: None,
            max_expiry: None,
        }
    }

    /// The roles as one label value (`a,b`).
    pub fn roles_label(&self) -> String {
        self.roles.join(",")
    }
}

/// How the cache behaves.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    /// A token is fetched again once this old (`--token-refresh-interval`).
    pub refresh_interval: Duration,
    /// A token with less life left than this is not handed out when a new one can be had.
    pub min_remaining: Duration,
    /// Most slots; past it, requests for new keys are refused (expired ones are dropped first).
    pub max_entries: usize,
    /// Waits between failed fetches of one slot.
    pub backoff: Backoff,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_secs(30 * 60),
            min_remaining: Duration::from_secs(60),
            max_entries: 256,
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(60),
            },
        }
    }
}

/// Why the cache gave no token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    /// ZTS gave none (and no earlier token is still valid).
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// Every slot is in use by a token still valid.
    #[error("the token cache is full ({0} distinct requests); not fetching another")]
    Full(usize),
}

#[derive(Default)]
struct SlotState {
    token: Option<Token>,
    /// Fetches finished for this slot.
    attempts: u64,
    /// The last fetch's error, when it failed.
    last_error: Option<FetchError>,
    failures: u32,
    /// No new fetch before this after a failure.
    retry_at: Option<Instant>,
}

struct Slot {
    state: Mutex<SlotState>,
    fetching: tokio::sync::Mutex<()>,
    /// A configured target: never evicted, renewed in the background.
    pinned: bool,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The cache.
pub struct TokenCache {
    zts: Arc<ZtsAccess>,
    policy: CachePolicy,
    slots: Mutex<HashMap<TokenKey, Arc<Slot>>>,
}

/// One cached token as the metrics show it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its key.
    pub key: TokenKey,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
    /// Bytes of the token.
    pub len: usize,
}

impl TokenCache {
    /// An empty cache fetching through `zts`; `pinned` keys (the configured targets) are kept and
    /// renewed in the background.
    pub fn new(zts: Arc<ZtsAccess>, policy: CachePolicy, pinned: &[TokenKey]) -> Arc<Self> {
        let slots = pinned
            .iter()
            .map(|k| (k.clone(), Arc::new(new_slot(true))))
            .collect();
        Arc::new(Self {
            zts,
            policy,
            slots: Mutex::new(slots),
        })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot(&self, key: &TokenKey) -> Result<Arc<Slot>, CacheError> {
        let mut slots = self.slots();
        if let Some(slot) = slots.get(key) {
            return Ok(slot.clone());
        }
        if slots.len() >= self.policy.max_entries {
            let now = unix_now();
            slots.retain(|_, s| {
                s.pinned || s.state().token.as_ref().is_some_and(|t| t.expires_at > now)
            });
            if slots.len() >= self.policy.max_entries {
                return Err(CacheError::Full(self.policy.max_entries));
            }
        }
        let slot = Arc::new(new_slot(false));
        slots.insert(key.clone(), slot.clone());
        Ok(slot)
    }

    /// Whether `token` may be handed out without asking ZTS.
    fn fresh(&self, token: &Token, now: i64) -> bool {
        token.generation == self.zts.generation()
            && token.expires_at - now > self.policy.min_remaining.as_secs() as i64
    }

    /// What a slot holds after a fetch: its token while it is still valid (fresh, just fetched
    /// however short its life, or the last good one while ZTS fails), else the failure.
    fn outcome(&self, state: &SlotState, now: i64) -> Option<Result<Token, CacheError>> {
        match (&state.token, &state.last_error) {
            (Some(t), _) if t.expires_at > now => Some(Ok(t.clone())),
            (_, Some(e)) => Some(Err(e.clone().into())),
            _ => None,
        }
    }

    /// The token for `key`: from the cache when fresh, else fetched (once for all who ask at
    /// the same time).
    pub async fn get(self: &Arc<Self>, key: &TokenKey) -> Result<Token, CacheError> {
        let slot = self.slot(key)?;
        let seen = {
            let state = slot.state();
            let now = unix_now();
            if let Some(t) = &state.token
                && self.fresh(t, now)
            {
                return Ok(t.clone());
            }
            if state.retry_at.is_some_and(|at| Instant::now() < at)
                && let Some(outcome) = self.outcome(&state, now)
            {
                return outcome;
            }
            state.attempts
        };
        self.fetch_once(slot, key, Some(seen)).await
    }

    /// Fetches into `slot` unless, by the time its fetch lock is ours, a fetch has finished since
    /// `seen` (then that outcome is taken).
    async fn fetch_once(
        self: &Arc<Self>,
        slot: Arc<Slot>,
        key: &TokenKey,
        seen: Option<u64>,
    ) -> Result<Token, CacheError> {
        let this = self.clone();
        let key = key.clone();
        let task = tokio::spawn(async move {
            let _turn = slot.fetching.lock().await;
            if let Some(seen) = seen {
                let state = slot.state();
                if state.attempts != seen
                    && let Some(outcome) = this.outcome(&state, unix_now())
                {
                    return outcome;
                }
            }
            let fetched = this.fetch(&key).await;
            let mut state = slot.state();
            state.attempts += 1;
            match fetched {
                Ok(token) => {
                    state.token = Some(token);
                    state.last_error = None;
                    state.failures = 0;
                    state.retry_at = None;
                }
                Err(e) => {
                    tracing::warn!(domain = %key.domain, roles = %key.roles_label(), kind = key.kind.name(), error = %e, "token fetch failed");
                    let wait = this.policy.backoff.delay(state.failures, random_unit());
                    state.failures = state.failures.saturating_add(1);
                    state.retry_at = Some(Instant::now() + wait);
                    state.last_error = Some(e.clone());
                }
            }
            let now = unix_now();
            this.outcome(&state, now).unwrap_or_else(|| {
                Err(CacheError::Fetch(FetchError::Unavailable(
                    "no token".into(),
                )))
            })
        });
        task.await.unwrap_or_else(|e| {
            Err(CacheError::Fetch(FetchError::Unavailable(format!(
                "the fetch stopped: {e}"
            ))))
        })
    }

    async fn fetch(&self, key: &TokenKey) -> Result<Token, FetchError> {
        let proxy = key.proxy_for_principal.as_deref();
        match key.kind {
            Kind::Access => {
                self.zts
                    .access_token(&key.domain, &key.roles, key.max_expiry, proxy)
                    .await
            }
            Kind::Role => {
                self.zts
                    .role_token(
                        &key.domain,
                        &key.roles,
                        key.min_expiry,
                        key.max_expiry,
                        proxy,
                    )
                    .await
            }
        }
    }

    /// Whether the token in `slot` should be fetched again now.
    fn due(&self, slot: &Slot, now: i64) -> bool {
        let state = slot.state();
        if state.retry_at.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        match &state.token {
            None => slot.pinned,
            Some(t) => {
                let life = (t.expires_at - t.fetched_at).max(0);
                t.generation != self.zts.generation()
                    || now >= t.fetched_at + self.policy.refresh_interval.as_secs() as i64
                    || t.expires_at - now
                        <= (life / 4).max(self.policy.min_remaining.as_secs() as i64)
            }
        }
    }

    /// Fetches again every slot that is due (configured targets without a token, tokens past
    /// the refresh interval, in their last quarter of life, or of an older identity); slots
    /// within their backoff wait. Returns how many pinned slots got a new token.
    pub async fn renew_due(self: &Arc<Self>) -> usize {
        let now = unix_now();
        let due: Vec<(TokenKey, Arc<Slot>)> = self
            .slots()
            .iter()
            .filter(|(_, s)| self.due(s, now))
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        let mut renewed = 0;
        for (key, slot) in due {
            let pinned = slot.pinned;
            let before = slot.state().attempts;
            if self.fetch_once(slot.clone(), &key, None).await.is_ok()
                && pinned
                && slot.state().last_error.is_none()
                && slot.state().attempts > before
            {
                renewed += 1;
            }
        }
        renewed
    }

    /// The token of a pinned key as it is now (for its file), if any.
    pub fn current(&self, key: &TokenKey) -> Option<Token> {
        self.slots().get(key).and_then(|s| s.state().token.clone())
    }

    /// Why `key` has no token of the current identity: its last fetch's error, or that none
    /// was made yet; `None` when it has one.
    pub fn failure(&self, key: &TokenKey) -> Option<FetchError> {
        let slot = self.slots().get(key).cloned()?;
        let state = slot.state();
        if let Some(e) = &state.last_error {
            return Some(e.clone());
        }
        match &state.token {
            Some(t) if t.generation == self.zts.generation() => None,
            _ => Some(FetchError::Unavailable("not fetched yet".into())),
        }
    }

    /// Every cached token.
    pub fn entries(&self) -> Vec<Entry> {
        self.slots()
            .iter()
            .filter_map(|(k, s)| {
                s.state().token.as_ref().map(|t| Entry {
                    key: k.clone(),
                    expires_at: t.expires_at,
                    len: t.raw.expose().len(),
                })
            })
            .collect()
    }

    /// When the next slot becomes due, at the latest `at_most` from now.
    pub fn next_due_in(&self, at_most: Duration) -> Duration {
        let now = unix_now();
        let mut next = at_most;
        for slot in self.slots().values() {
            let state = slot.state();
            let wait = match (&state.retry_at, &state.token) {
                (Some(at), _) => at.saturating_duration_since(Instant::now()),
                (None, None) if slot.pinned => Duration::ZERO,
                (None, None) => continue,
                (None, Some(t)) if t.generation != self.zts.generation() => Duration::ZERO,
                (None, Some(t)) => {
                    let life = (t.expires_at - t.fetched_at).max(0);
                    let renew_at = (t.fetched_at + self.policy.refresh_interval.as_secs() as i64)
                        .min(
                            t.expires_at
                                - (life / 4).max(self.policy.min_remaining.as_secs() as i64),
                        );
                    Duration::from_secs((renew_at - now).max(0) as u64)
                }
            };
            next = next.min(wait);
        }
        next
    }
}

fn new_slot(pinned: bool) -> Slot {
    Slot {
        state: Mutex::new(SlotState::default()),
        fetching: tokio::sync::Mutex::new(()),
        pinned,
    }
}
