#![allow(clippy::unwrap_used)]
use super::*;
use api::{CA_CERT_KEY, CA_KEY_KEY, PREVIOUS_CA_CERT_KEY, StoredCa};
use athenz_core::crypto::CertInfo;
use std::collections::BTreeMap;
use time::Duration as Days;

/// The Secret and the webhook configuration as a table the replicas share.
#[derive(Default)]
struct Cluster {
    data: BTreeMap<String, Vec<u8>>,
    version: u64,
    bundles: Vec<Vec<u8>>,
    api_down: bool,
    /// Written by "another replica" between this one's read and its write.
    write_first: Option<BTreeMap<String, Vec<u8>>>,
    /// The webhook configuration changes between a read and the bundle's write, this many times.
    bundle_races: usize,
    ca_writes: usize,
    bundle_writes: usize,
}

#[derive(Clone, Default)]
struct Table(Arc<Mutex<Cluster>>);

impl Table {
    fn with_webhooks(n: usize) -> Self {
        let table = Self::default();
        table.lock().bundles = vec![Vec::new(); n];
        table
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.0.lock().unwrap()
    }

    fn down() -> ApiError {
        ApiError::Failed {
            what: "the API".into(),
            reason: "connection refused".into(),
        }
    }
}

impl CaApi for Table {
    async fn read_ca(&self) -> Result<StoredCa, ApiError> {
        let c = self.lock();
        if c.api_down {
            return Err(Self::down());
        }
        Ok(StoredCa {
            data: c.data.clone(),
            version: c.version.to_string(),
        })
    }

    async fn write_ca(
        &self,
        data: BTreeMap<String, Vec<u8>>,
        version: &str,
    ) -> Result<bool, ApiError> {
        let mut c = self.lock();
        if let Some(first) = c.write_first.take() {
            c.data = first;
            c.version += 1;
        }
        if c.version.to_string() != version {
            return Ok(false);
        }
        c.data = data;
        c.version += 1;
        c.ca_writes += 1;
        Ok(true)
    }

    async fn bundles(&self) -> Result<Vec<Vec<u8>>, ApiError> {
        let c = self.lock();
        if c.api_down {
            return Err(Self::down());
        }
        Ok(c.bundles.clone())
    }

    async fn set_bundles(&self, bundle: &[u8]) -> Result<bool, ApiError> {
        let mut c = self.lock();
        if c.bundle_races > 0 {
            c.bundle_races -= 1;
            return Ok(false);
        }
        for b in &mut c.bundles {
            *b = bundle.to_vec();
        }
        c.bundle_writes += 1;
        Ok(true)
    }
}

fn names() -> Vec<String> {
    vec!["athenz-initializer.k8s-admin.svc".into()]
}

fn keeper(table: &Table) -> (Keeper<Table>, Arc<InMemoryIdentity>) {
    let identity = Arc::new(InMemoryIdentity::default());
    (
        Keeper::new(table.clone(), names(), Arc::clone(&identity)),
        identity,
    )
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// The serials of the CAs in a bundle, in order.
fn bundle_serials(bundle: &[u8]) -> Vec<String> {
    athenz_core::crypto::pem_certificates(std::str::from_utf8(bundle).unwrap())
        .unwrap()
        .iter()
        .map(|der| CertInfo::from_der(der).unwrap().serial_hex)
        .collect()
}

fn served(identity: &InMemoryIdentity) -> CertInfo {
    CertInfo::from_der(&identity.current().unwrap().cert[0]).unwrap()
}

/// Whether the served certificate verifies, as the API server verifies it, under `ca_pem`.
fn verifies_under(identity: &InMemoryIdentity, ca_pem: &str, at: OffsetDateTime) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    let roots = tls::root_store(&athenz_core::crypto::pem_certificates(ca_pem).unwrap()).unwrap();
    let verifier = rustls::client::WebPkiServerVerifier::builder(roots)
        .build()
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from(names()[0].clone()).unwrap();
    let leaf = identity.current().unwrap().cert[0].clone();
    verifier
        .verify_server_cert(
            &leaf,
            &[],
            &name,
            &[],
            rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                u64::try_from(at.unix_timestamp()).unwrap() + 1,
            )),
        )
        .is_ok()
}

fn stored_pem(table: &Table) -> String {
    String::from_utf8(table.lock().data[CA_CERT_KEY].clone()).unwrap()
}

fn stored_serial(table: &Table) -> String {
    let pem = String::from_utf8(table.lock().data[CA_CERT_KEY].clone()).unwrap();
    CertInfo::from_pem(&pem).unwrap().serial_hex
}

#[tokio::test]
async fn an_empty_secret_gets_a_ca_every_webhook_its_bundle_and_the_replica_a_certificate() {
    let table = Table::with_webhooks(2);
    let (keeper, identity) = keeper(&table);
    assert!(identity.current().is_none());
    let report = keeper.check(now()).await.unwrap();
    assert_eq!(report.new_ca.as_deref(), Some("the Secret holds no CA yet"));
    assert!(report.bundle_written && report.new_serving);
    let ca = stored_serial(&table);
    for bundle in &table.lock().bundles {
        assert_eq!(bundle_serials(bundle), std::slice::from_ref(&ca));
    }
    let leaf = served(&identity);
    assert_eq!(leaf.dns_names, names());
    assert_eq!(keeper.serving_not_after(), Some(leaf.not_after));
    // the key is in the Secret, as PKCS#8, and nowhere in the report or the log's fields
    let key = String::from_utf8(table.lock().data[CA_KEY_KEY].clone()).unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    assert!(!format!("{report:?}").contains("PRIVATE"));

    // a second check changes nothing
    let again = keeper.check(now()).await.unwrap();
    assert_eq!(again, CheckReport::default());
    assert_eq!(served(&identity).serial_hex, leaf.serial_hex);
    let writes = {
        let c = table.lock();
        (c.ca_writes, c.bundle_writes)
    };
    assert_eq!(writes, (1, 1));
}

#[tokio::test]
async fn replicas_share_one_ca_and_each_serves_its_own_certificate() {
    let table = Table::with_webhooks(1);
    let (first, first_identity) = keeper(&table);
    let (second, second_identity) = keeper(&table);
    first.check(now()).await.unwrap();
    let report = second.check(now()).await.unwrap();
    assert_eq!(report.new_ca, None);
    assert!(!report.bundle_written);
    let (a, b) = (served(&first_identity), served(&second_identity));
    assert_ne!(a.serial_hex, b.serial_hex);
    assert_ne!(a.public_key_der, b.public_key_der);
    assert_eq!(a.issuer, b.issuer);
    assert_eq!(table.lock().ca_writes, 1);
}

#[tokio::test]
async fn a_replica_that_loses_the_race_uses_the_winners_ca() {
    let table = Table::with_webhooks(1);
    let winner = WebhookCa::generate(now()).unwrap();
    let mut winners = BTreeMap::new();
    winners.insert(CA_CERT_KEY.to_owned(), winner.cert_pem.clone().into_bytes());
    winners.insert(
        CA_KEY_KEY.to_owned(),
        winner.key_pem.expose().as_bytes().to_vec(),
    );
    table.lock().write_first = Some(winners);
    let (keeper, identity) = keeper(&table);
    let report = keeper.check(now()).await.unwrap();
    assert_eq!(report.new_ca, None, "the loser wrote no CA of its own");
    assert_eq!(stored_serial(&table), winner.info.serial_hex);
    assert_eq!(
        bundle_serials(&table.lock().bundles[0]),
        std::slice::from_ref(&winner.info.serial_hex)
    );
    assert_eq!(served(&identity).issuer, winner.info.subject);
}

#[tokio::test]
async fn a_ca_past_two_thirds_is_replaced_and_the_old_one_trusted_until_it_expires() {
    let table = Table::with_webhooks(1);
    let (keeper, identity) = keeper(&table);
    let start = now();
    keeper.check(start).await.unwrap();
    let old = stored_serial(&table);
    let old_leaf = served(&identity);

    // a serving certificate past two-thirds is signed again by the same CA
    let report = keeper.check(start + Days::days(5)).await.unwrap();
    assert!(report.new_serving && report.new_ca.is_none() && !report.bundle_written);
    assert_ne!(served(&identity).serial_hex, old_leaf.serial_hex);

    let rotation = start + Days::days(244);
    let report = keeper.check(rotation).await.unwrap();
    assert!(report.new_ca.unwrap().contains("past two-thirds"));
    let new = stored_serial(&table);
    assert_ne!(new, old);
    // the new CA first, the old one still trusted: certificates it signed keep verifying
    assert_eq!(
        bundle_serials(&table.lock().bundles[0]),
        [new.clone(), old.clone()]
    );
    assert!(report.new_serving);
    assert!(verifies_under(&identity, &stored_pem(&table), rotation));

    // once the old CA has expired it leaves the bundle
    let report = keeper.check(start + Days::days(366)).await.unwrap();
    assert!(report.bundle_written && report.new_ca.is_none());
    assert_eq!(bundle_serials(&table.lock().bundles[0]), [new]);
}

#[tokio::test]
async fn a_hostile_or_broken_secret_is_replaced_and_never_trusted() {
    let other = WebhookCa::generate(now()).unwrap();
    let leaf = other.sign_serving(&names(), now()).unwrap();
    let garbage = b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_vec();
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        (
            "garbage",
            garbage.clone(),
            other.key_pem.expose().as_bytes().to_vec(),
        ),
        (
            "a leaf as CA",
            leaf.cert_pem.clone().into_bytes(),
            leaf.key_pem.expose().as_bytes().to_vec(),
        ),
        (
            "another key",
            other.cert_pem.clone().into_bytes(),
            leaf.key_pem.expose().as_bytes().to_vec(),
        ),
        (
            "oversized",
            vec![b'A'; 2 * 1024 * 1024],
            other.key_pem.expose().as_bytes().to_vec(),
        ),
        ("not UTF-8", vec![0xff, 0xfe, 0x00], vec![0xff]),
    ];
    for (case, cert, key) in cases {
        let table = Table::with_webhooks(1);
        {
            let mut c = table.lock();
            c.data.insert(CA_CERT_KEY.into(), cert.clone());
            c.data.insert(CA_KEY_KEY.into(), key);
            c.data.insert(PREVIOUS_CA_CERT_KEY.into(), garbage.clone());
        }
        let (keeper, identity) = keeper(&table);
        let report = keeper.check(now()).await.unwrap();
        assert!(report.new_ca.is_some(), "{case}");
        let new = stored_serial(&table);
        let bundle = bundle_serials(&table.lock().bundles[0]);
        // only the new CA: the old text is kept as previous only when it is a valid CA
        let kept_previous = table.lock().data.get(PREVIOUS_CA_CERT_KEY).cloned();
        match case {
            "another key" => {
                // a real CA whose key is not the stored one: it may have signed serving
                // certificates that are out there, so it stays trusted until it expires
                assert_eq!(
                    bundle,
                    [new.clone(), other.info.serial_hex.clone()],
                    "{case}"
                );
                assert_eq!(kept_previous, Some(cert), "{case}");
            }
            _ => {
                assert_eq!(bundle, std::slice::from_ref(&new), "{case}");
                assert_eq!(kept_previous, None, "{case}");
            }
        }
        assert!(
            verifies_under(&identity, &stored_pem(&table), now()),
            "{case}"
        );
        assert!(!verifies_under(&identity, &other.cert_pem, now()), "{case}");
    }
}

#[tokio::test]
async fn with_the_api_away_the_served_certificate_stays() {
    let table = Table::with_webhooks(1);
    let (keeper, identity) = keeper(&table);
    // no certificate before the first check succeeds
    table.lock().api_down = true;
    let err = keeper.check(now()).await.unwrap_err();
    assert!(err.to_string().contains("connection refused"), "{err}");
    assert!(identity.current().is_none());
    table.lock().api_down = false;
    keeper.check(now()).await.unwrap();
    let before = served(&identity);
    table.lock().api_down = true;
    keeper.check(now() + Days::days(6)).await.unwrap_err();
    assert_eq!(served(&identity).serial_hex, before.serial_hex);
}

#[tokio::test]
async fn nothing_new_is_served_until_the_bundle_is_written() {
    let table = Table::with_webhooks(1);
    table.lock().bundle_races = 1;
    let (keeper, identity) = keeper(&table);
    let report = keeper.check(now()).await.unwrap();
    assert!(report.new_ca.is_some() && !report.bundle_written && !report.new_serving);
    assert!(identity.current().is_none());
    let report = keeper.check(now()).await.unwrap();
    assert!(report.bundle_written && report.new_serving);
}

#[tokio::test]
async fn replicas_that_keep_writing_the_secret_end_the_check() {
    struct Busy;
    impl CaApi for Busy {
        async fn read_ca(&self) -> Result<StoredCa, ApiError> {
            Ok(StoredCa::default())
        }
        async fn write_ca(&self, _: BTreeMap<String, Vec<u8>>, _: &str) -> Result<bool, ApiError> {
            Ok(false)
        }
        async fn bundles(&self) -> Result<Vec<Vec<u8>>, ApiError> {
            Ok(Vec::new())
        }
        async fn set_bundles(&self, _: &[u8]) -> Result<bool, ApiError> {
            Ok(true)
        }
    }
    let keeper = Keeper::new(Busy, names(), Arc::new(InMemoryIdentity::default()));
    assert!(matches!(keeper.check(now()).await, Err(KeepError::Raced)));
}

#[tokio::test]
async fn a_first_install_trusts_what_the_webhook_trusted_for_an_hour_and_no_longer() {
    // the webhook verified Athenz-issued certificates before (an upgrade from 0.2.0): its bundle
    // holds that CA, a leaf pasted by mistake and an expired CA
    let athenz = WebhookCa::generate(now() - Days::days(1)).unwrap();
    let leaf = athenz.sign_serving(&names(), now()).unwrap();
    let expired = WebhookCa::generate(now() - Days::days(400)).unwrap();
    let table = Table::with_webhooks(2);
    let before = format!("{}{}{}", athenz.cert_pem, leaf.cert_pem, expired.cert_pem);
    table.lock().bundles = vec![before.clone().into_bytes(), before.into_bytes()];
    let (first, identity) = keeper(&table);
    let start = now();
    first.check(start).await.unwrap();
    let ours = stored_serial(&table);
    // replicas still serving Athenz's certificates keep verifying while the Deployment rolls
    for bundle in &table.lock().bundles {
        assert_eq!(
            bundle_serials(bundle),
            [ours.clone(), athenz.info.serial_hex.clone()]
        );
    }
    assert!(verifies_under(&identity, &stored_pem(&table), start));
    // a replica starting later in the hour reads the same set from the Secret
    let (late, _) = keeper(&table);
    let report = late.check(start + Days::minutes(30)).await.unwrap();
    assert!(!report.bundle_written && report.new_ca.is_none());
    // after the hour only our CA is trusted
    let report = first.check(start + ca_set::ADOPTION_WINDOW).await.unwrap();
    assert!(report.bundle_written);
    assert_eq!(bundle_serials(&table.lock().bundles[0]), [ours]);
}

#[tokio::test]
async fn a_broken_window_ends_the_trust_in_what_was_replaced() {
    let athenz = WebhookCa::generate(now()).unwrap();
    let table = Table::with_webhooks(1);
    table.lock().bundles = vec![athenz.cert_pem.clone().into_bytes()];
    let (keeper, _) = keeper(&table);
    keeper.check(now()).await.unwrap();
    assert_eq!(bundle_serials(&table.lock().bundles[0]).len(), 2);
    table
        .lock()
        .data
        .insert(api::PREVIOUS_UNTIL_KEY.into(), b"soon".to_vec());
    let report = keeper.check(now()).await.unwrap();
    assert!(report.bundle_written);
    assert_eq!(bundle_serials(&table.lock().bundles[0]).len(), 1);
    assert!(table.lock().data.contains_key(PREVIOUS_CA_CERT_KEY));
}

#[tokio::test]
async fn a_bundle_rewritten_in_place_of_ours_is_trusted_beside_ours_for_the_window() {
    // a rollback's apply writes the release before's CA over ours while our replicas still serve
    let table = Table::with_webhooks(1);
    let (first, identity) = keeper(&table);
    let start = now();
    first.check(start).await.unwrap();
    let ours = stored_serial(&table);
    let before = WebhookCa::generate(start - Days::days(10)).unwrap();
    table.lock().bundles = vec![before.cert_pem.clone().into_bytes()];
    let report = first.check(start + Days::seconds(10)).await.unwrap();
    assert_eq!(report.adopted, 1);
    assert!(report.bundle_written && !report.new_serving);
    // both sets of replicas are verified while the Deployment rolls
    assert_eq!(
        bundle_serials(&table.lock().bundles[0]),
        [ours.clone(), before.info.serial_hex.clone()]
    );
    assert!(verifies_under(&identity, &stored_pem(&table), start));
    // the other replica reads the same set: nothing to write
    let (second, _) = keeper(&table);
    let report = second.check(start + Days::seconds(20)).await.unwrap();
    assert_eq!((report.adopted, report.bundle_written), (0, false));
    // a CA appended beside ours is not adopted: the bundle is put right
    let rogue = WebhookCa::generate(start).unwrap();
    let appended = [table.lock().bundles[0].clone(), rogue.cert_pem.into_bytes()].concat();
    table.lock().bundles = vec![appended];
    let report = first.check(start + Days::seconds(30)).await.unwrap();
    assert_eq!(report.adopted, 0);
    assert_eq!(
        bundle_serials(&table.lock().bundles[0]),
        [ours.clone(), before.info.serial_hex.clone()]
    );
    // once the window has passed, ours alone
    let report = first
        .check(start + Days::seconds(10) + ca_set::ADOPTION_WINDOW)
        .await
        .unwrap();
    assert!(report.bundle_written);
    assert_eq!(bundle_serials(&table.lock().bundles[0]), [ours]);
}

#[tokio::test]
async fn a_replica_starts_only_once_it_serves_even_after_losing_the_bundle_to_another() {
    // two replicas starting together: the other wrote the webhook configuration between this
    // one's read and its write, so this one's first check succeeds and serves nothing
    let table = Table::with_webhooks(2);
    table.lock().bundle_races = 2;
    let (keeper, identity) = keeper(&table);
    let checks = prometheus_client::metrics::family::Family::<CheckLabels, _>::default();
    let expiry = prometheus_client::metrics::gauge::Gauge::default();
    let task = start(keeper, checks.clone(), expiry.clone()).await.unwrap();
    task.abort();
    let served = served(&identity);
    assert!(
        expiry.get() == served.not_after.unix_timestamp(),
        "{}",
        expiry.get()
    );
    assert_eq!(
        checks.get_or_create(&CheckLabels { outcome: "ok" }).get(),
        3
    );
    let c = table.lock();
    assert_eq!((c.bundle_writes, c.bundles[0].is_empty()), (1, false));
}
