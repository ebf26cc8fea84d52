//! The webhook's serving certificate without ZTS (docs/design.md §4.7): the initializer keeps
//! its own CA in a Secret, puts it in its MutatingWebhookConfiguration's `caBundle`, and each
//! replica serves a certificate it signs for itself with a key that stays in its memory. Pod
//! admission then needs the API server and an initializer replica, never ZTS: a replica started
//! during a ZTS outage of any length is serving within a second.
//!
//! Each check (at start, then every [`CHECK_EVERY`]):
//! 1. the CA: the Secret's, or a new one when it has none, an unusable one, or one past
//!    two-thirds of its life; what it replaces stays trusted for a bounded time (`ca_set`).
//!    Replicas racing to write it are ordered by the Secret's `resourceVersion`: the loser
//!    reads the winner's.
//! 2. the bundle: the CA, then the replaced ones while trusted, in every webhook's
//!    `caBundle`; written only when it differs.
//! 3. the serving certificate: signed again once the CA changed or it is past two-thirds of its
//!    life, and only after step 2 (the API server trusts the CA before it is shown one).
//!
//! A failed check (the API away) keeps what is served and tries again at the next; the serving
//! certificate lives [`pki::SERVING_LIFETIME`], far longer than any retry.

pub mod api;
mod ca_set;
pub mod pki;

use api::{ApiError, CaApi};
use athenz_core::tls::{self, InMemoryIdentity};
use ca_set::CaSet;
use pki::{PkiError, ServingPair, WebhookCa};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use time::OffsetDateTime;

/// How often a replica checks the CA, the bundle and its serving certificate: two reads of the
/// API per replica. Short, because it bounds how long the webhook refuses pods after someone
/// else rewrote its caBundle (a rollback's apply) before the replicas trust both again.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);
/// Writes of the Secret lost to another replica before a check gives up until the next.
const MAX_RACES: usize = 3;
/// The pause at start before checking again after a write lost to another replica (the other
/// replica's write is done by then; the next check reads it).
const AFTER_A_LOST_RACE: Duration = Duration::from_millis(200);

/// Why a check did not finish.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    /// The Kubernetes API.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Making or reading a certificate.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// Other replicas kept writing the Secret.
    #[error("the CA Secret changed under this replica {MAX_RACES} times running")]
    Raced,
    /// The signed pair could not be served.
    #[error("serving the new certificate: {0}")]
    Serving(String),
}

/// What one check did, for the log and the metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// A new CA was written to the Secret (and why).
    pub new_ca: Option<String>,
    /// The webhooks' bundle was written.
    pub bundle_written: bool,
    /// A new serving certificate is served.
    pub new_serving: bool,
    /// CAs someone else wrote into the webhooks, now trusted for the adoption window.
    pub adopted: usize,
}

/// Keeps one replica's serving certificate, the shared CA and the webhooks' bundle in step.
pub struct Keeper<A> {
    api: A,
    dns_names: Vec<String>,
    identity: Arc<InMemoryIdentity>,
    serving: Mutex<Option<ServingPair>>,
}

impl<A: CaApi> Keeper<A> {
    /// Serves, through `identity`, certificates for `dns_names` under the CA kept through `api`.
    pub fn new(api: A, dns_names: Vec<String>, identity: Arc<InMemoryIdentity>) -> Self {
        Self {
            api,
            dns_names,
            identity,
            serving: Mutex::new(None),
        }
    }

    /// The serving certificate's end, once one is served.
    pub fn serving_not_after(&self) -> Option<OffsetDateTime> {
        self.lock_serving().as_ref().map(|p| p.info.not_after)
    }

    fn lock_serving(&self) -> std::sync::MutexGuard<'_, Option<ServingPair>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One check at `now` (see the module's steps).
    pub async fn check(&self, now: OffsetDateTime) -> Result<CheckReport, KeepError> {
        let mut report = CheckReport::default();
        let mut cas = self.ca(now, &mut report).await?;
        let bundles = self.api.bundles().await?;
        if bundles.iter().any(|b| !cas.held_by(b)) {
            let foreign = cas.foreign(&bundles, now);
            if !foreign.is_empty() {
                let Some(adopted) = self.adopt(foreign, now, &mut report).await? else {
                    // the Secret changed meanwhile: the next check starts from it
                    return Ok(report);
                };
                cas = adopted;
            }
        }
        let bundle = cas.bundle(now);
        if bundles.iter().any(|b| *b != bundle) {
            if !self.api.set_bundles(&bundle).await? {
                // changed meanwhile: serve nothing new until the bundle is known to be right
                return Ok(report);
            }
            report.bundle_written = true;
        }
        let renew = self
            .lock_serving()
            .as_ref()
            .is_none_or(|pair| pair.due(&cas.current, now));
        if renew {
            let pair = cas.current.sign_serving(&self.dns_names, now)?;
            let key = tls::certified_key_from_pem(&pair.cert_pem, pair.key_pem.expose())
                .map_err(|e| KeepError::Serving(e.to_string()))?;
            self.identity.set(key);
            *self.lock_serving() = Some(pair);
            report.new_serving = true;
        }
        Ok(report)
    }

    /// The CA to use: the stored one, or a new one written in its place.
    async fn ca(&self, now: OffsetDateTime, report: &mut CheckReport) -> Result<CaSet, KeepError> {
        for _ in 0..MAX_RACES {
            let stored = self.api.read_ca().await?;
            let why = match ca_set::stored(&stored.data, now) {
                Ok(set) => return Ok(set),
                Err(why) => why,
            };
            let set = CaSet::replacing(WebhookCa::generate(now)?, &stored.data, now);
            if self.api.write_ca(set.to_data(), &stored.version).await? {
                tracing::info!(serial = %set.current.info.serial_hex, reason = %why, "wrote a new webhook CA");
                report.new_ca = Some(why);
                return Ok(set);
            }
        }
        Err(KeepError::Raced)
    }

    /// Trusts `foreign`, found in the webhooks in place of the CA in use, for the adoption
    /// window (recorded in the Secret, so every replica writes the same bundle); `None` when
    /// the Secret changed since it was read.
    async fn adopt(
        &self,
        foreign: Vec<(athenz_core::crypto::CertInfo, String)>,
        now: OffsetDateTime,
        report: &mut CheckReport,
    ) -> Result<Option<CaSet>, KeepError> {
        let stored = self.api.read_ca().await?;
        let Ok(mut set) = ca_set::stored(&stored.data, now) else {
            return Ok(None);
        };
        let serials: Vec<String> = foreign.iter().map(|(i, _)| i.serial_hex.clone()).collect();
        set.adopt(foreign, now);
        if !self.api.write_ca(set.to_data(), &stored.version).await? {
            return Ok(None);
        }
        tracing::warn!(
            ?serials,
            window = ?ca_set::ADOPTION_WINDOW,
            "the webhook's caBundle held CAs someone else wrote in place of ours (a rollout of \
             another release?): trusted beside ours for the window"
        );
        report.adopted = serials.len();
        Ok(Some(set))
    }
}

/// The longest a replica waits at start for its first certificate (the API server down or the
/// Secret missing) before it exits and kubelet starts it again.
pub const FIRST_CHECK_WITHIN: Duration = Duration::from_secs(60);

/// Checks at start until a certificate is served (at most [`FIRST_CHECK_WITHIN`]), then every
/// [`CHECK_EVERY`] until the process ends; `expiry` follows the served certificate's end.
pub async fn start<A: CaApi + 'static>(
    keeper: Keeper<A>,
    checks: prometheus_client::metrics::family::Family<
        CheckLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    expiry: prometheus_client::metrics::gauge::Gauge,
) -> Result<tokio::task::JoinHandle<()>, KeepError> {
    let keeper = Arc::new(keeper);
    let record = {
        let keeper = Arc::clone(&keeper);
        move |result: &Result<CheckReport, KeepError>| {
            let outcome = match result {
                Ok(_) => "ok",
                Err(_) => "failed",
            };
            checks.get_or_create(&CheckLabels { outcome }).inc();
            if let Some(end) = keeper.serving_not_after() {
                expiry.set(end.unix_timestamp());
            }
        }
    };
    let until = tokio::time::Instant::now() + FIRST_CHECK_WITHIN;
    // A check can succeed and serve nothing: it lost the Secret or the bundle to another
    // replica starting at the same moment. The replica is not done (and not Ready) until it
    // serves a certificate; until then every handshake would be refused.
    while keeper.serving_not_after().is_none() {
        let result = keeper.check(OffsetDateTime::now_utc()).await;
        record(&result);
        let (pause, error) = match result {
            Ok(report) => {
                log(&report);
                (AFTER_A_LOST_RACE, KeepError::Raced)
            }
            Err(e) => (Duration::from_secs(2), e),
        };
        if keeper.serving_not_after().is_some() {
            break;
        }
        if tokio::time::Instant::now() + pause >= until {
            return Err(error);
        }
        tracing::warn!(error = %error, ?pause, "no serving certificate yet; trying again");
        tokio::time::sleep(pause).await;
    }
    Ok(tokio::spawn(async move {
        let mut every = tokio::time::interval(CHECK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let result = keeper.check(OffsetDateTime::now_utc()).await;
            record(&result);
            match result {
                Ok(report) => log(&report),
                Err(e) => {
                    tracing::warn!(error = %e, "webhook CA check failed; serving what it has")
                }
            }
        }
    }))
}

fn log(report: &CheckReport) {
    if report.bundle_written {
        tracing::info!("wrote the webhook CA bundle");
    }
    if report.new_serving {
        tracing::info!("serving a new webhook certificate");
    }
}

/// Labels of the check counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct CheckLabels {
    /// `ok` or `failed`.
    pub outcome: &'static str,
}

#[cfg(test)]
mod tests;
