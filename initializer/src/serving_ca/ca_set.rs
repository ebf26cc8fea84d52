//! What the Secret holds and what the webhooks' bundle must be: the CA in use, and the CAs it
//! replaced, trusted for a bounded time so that serving certificates they signed, still served
//! by replicas that have not checked yet, keep verifying.
//!
//! Two things are replaced. A CA of ours (at two-thirds of its life, or an unusable one) stays
//! trusted until it expires. CAs someone else wrote into the webhooks in place of ours (the
//! release before, which served Athenz certificates: an upgrade from 0.2.0, or a rollback's
//! apply while this release's replicas are still being replaced) are adopted: trusted beside
//! ours for [`ADOPTION_WINDOW`], enough for a Deployment to replace every replica, and no
//! longer. Neither replica set is then refused while the other is rolled out.

use super::api::{CA_CERT_KEY, CA_KEY_KEY, PREVIOUS_CA_CERT_KEY, PREVIOUS_UNTIL_KEY};
use super::pki::WebhookCa;
use athenz_core::crypto::{CertInfo, der_to_pem, pem_certificates};
use std::collections::BTreeMap;
use time::{Duration, OffsetDateTime};

/// How long the CAs a first install finds in the webhooks stay trusted beside its own.
pub const ADOPTION_WINDOW: Duration = Duration::hours(1);
/// The most replaced CAs kept in the bundle (a bundle is an administrator's, but bounded all
/// the same).
const MAX_PREVIOUS: usize = 8;

/// The CA in use and those it replaced.
pub(super) struct CaSet {
    pub(super) current: WebhookCa,
    /// Replaced CAs, PEM each, with what they say.
    previous: Vec<(CertInfo, String)>,
    /// When the replaced CAs stop being trusted, at the latest (each also at its own end).
    previous_until: Option<OffsetDateTime>,
}

impl CaSet {
    /// The bundle the webhooks must carry at `now`: the CA, then each replaced CA while it is
    /// valid and its window lasts.
    pub(super) fn bundle(&self, now: OffsetDateTime) -> Vec<u8> {
        let mut bundle = self.current.cert_pem.clone();
        if self.previous_until.is_none_or(|until| now < until) {
            for (info, pem) in &self.previous {
                if info.is_valid_at(now) {
                    bundle.push_str(pem);
                }
            }
        }
        bundle.into_bytes()
    }

    /// The Secret's data for this set.
    pub(super) fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let mut data = BTreeMap::new();
        data.insert(
            CA_CERT_KEY.to_owned(),
            self.current.cert_pem.clone().into_bytes(),
        );
        data.insert(
            CA_KEY_KEY.to_owned(),
            self.current.key_pem.expose().as_bytes().to_vec(),
        );
        if !self.previous.is_empty() {
            let pems: String = self.previous.iter().map(|(_, pem)| pem.as_str()).collect();
            data.insert(PREVIOUS_CA_CERT_KEY.to_owned(), pems.into_bytes());
            if let Some(until) = self.previous_until {
                data.insert(
                    PREVIOUS_UNTIL_KEY.to_owned(),
                    until.unix_timestamp().to_string().into_bytes(),
                );
            }
        }
        data
    }

    /// A new set around `next`, replacing what `data` held: its CA, when that is a valid CA,
    /// stays trusted until it expires.
    pub(super) fn replacing(
        next: WebhookCa,
        data: &BTreeMap<String, Vec<u8>>,
        now: OffsetDateTime,
    ) -> Self {
        let ours = data
            .get(CA_CERT_KEY)
            .map(|bytes| valid_cas(&String::from_utf8_lossy(bytes), now))
            .unwrap_or_default();
        Self {
            current: next,
            previous: ours,
            previous_until: None,
        }
    }

    /// Whether `bundle` holds the CA in use.
    pub(super) fn held_by(&self, bundle: &[u8]) -> bool {
        all_cas(bundle)
            .iter()
            .any(|(info, _)| *info == self.current.info)
    }

    /// The CAs of `bundles`, valid at `now`, that this set does not trust at `now`: what
    /// someone else wrote there.
    pub(super) fn foreign(
        &self,
        bundles: &[Vec<u8>],
        now: OffsetDateTime,
    ) -> Vec<(CertInfo, String)> {
        let trusted = |info: &CertInfo| {
            *info == self.current.info
                || (self.previous_until.is_none_or(|until| now < until)
                    && self.previous.iter().any(|(p, _)| p == info))
        };
        let mut found: Vec<(CertInfo, String)> = Vec::new();
        for bundle in bundles {
            for (info, pem) in valid_cas(&String::from_utf8_lossy(bundle), now) {
                if !trusted(&info) && !found.iter().any(|(f, _)| *f == info) {
                    found.push((info, pem));
                }
            }
        }
        found
    }

    /// Trusts `foreign` beside the CA in use for [`ADOPTION_WINDOW`] from `now` (with the
    /// replaced CAs still valid, now under the same bound).
    pub(super) fn adopt(&mut self, foreign: Vec<(CertInfo, String)>, now: OffsetDateTime) {
        let window_open = self.previous_until.is_none_or(|until| now < until);
        let mut previous: Vec<(CertInfo, String)> = match window_open {
            true => std::mem::take(&mut self.previous)
                .into_iter()
                .filter(|(info, _)| info.is_valid_at(now))
                .collect(),
            false => Vec::new(),
        };
        previous.extend(foreign);
        previous.truncate(MAX_PREVIOUS);
        self.previous = previous;
        self.previous_until = Some(now + ADOPTION_WINDOW);
    }
}

/// Every certificate of a bundle, valid or not, CA or not.
fn all_cas(bundle: &[u8]) -> Vec<(CertInfo, String)> {
    pem_certificates(&String::from_utf8_lossy(bundle))
        .unwrap_or_default()
        .iter()
        .filter_map(|der| Some((CertInfo::from_der(der).ok()?, der_to_pem(der))))
        .collect()
}

/// The CA certificates of a PEM text that are valid at `now` (anything else is dropped, never
/// trusted).
fn valid_cas(pem: &str, now: OffsetDateTime) -> Vec<(CertInfo, String)> {
    pem_certificates(pem)
        .unwrap_or_default()
        .iter()
        .filter_map(|der| {
            let info = CertInfo::from_der(der).ok()?;
            (info.is_ca && info.is_valid_at(now)).then(|| (info, der_to_pem(der)))
        })
        .take(MAX_PREVIOUS)
        .collect()
}

/// The set the Secret holds, or why it cannot be used as it is.
pub(super) fn stored(
    data: &BTreeMap<String, Vec<u8>>,
    now: OffsetDateTime,
) -> Result<CaSet, String> {
    let text = |key: &str| {
        data.get(key)
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    };
    let (Some(cert), Some(key)) = (text(CA_CERT_KEY), text(CA_KEY_KEY)) else {
        return Err("the Secret holds no CA yet".to_owned());
    };
    let current = WebhookCa::from_pem(&cert, &key).map_err(|e| e.to_string())?;
    if current.due(now) {
        return Err(format!(
            "the CA (serial {}) is past two-thirds of its life, valid until {}",
            current.info.serial_hex, current.info.not_after
        ));
    }
    // replaced CAs that do not parse are dropped from the bundle, not trusted blindly; a window
    // that does not parse has ended
    let previous = text(PREVIOUS_CA_CERT_KEY)
        .map(|pem| valid_cas(&pem, now))
        .unwrap_or_default();
    let previous_until = text(PREVIOUS_UNTIL_KEY).map(|t| {
        t.trim()
            .parse::<i64>()
            .ok()
            .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    });
    Ok(CaSet {
        current,
        previous,
        previous_until,
    })
}
