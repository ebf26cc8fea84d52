//! The bed every row runs on: the ZTS under test (the dev ZTS, or Athenz's own), the scripted
//! providers it calls, the settings both ZTSs take, and optionally one of Athenz's clients.

use super::*;

pub(super) struct Bed {
    /// When set, each row's request goes through this Athenz client instead of reqwest.
    pub(super) athenz: Option<tokio::sync::Mutex<AthenzClient>>,
    pub(super) zts: ZtsUnderTest,
    pub(super) stub: ProviderStub,
    pub(super) _others: Vec<ProviderStub>,
    pub(super) service_key: PrivateKey,
}

pub(super) async fn bed() -> Bed {
    bed_via(None).await
}

/// The bed on the dev ZTS, its rows sent through Athenz's own `harness` when given.
pub(super) async fn bed_via(harness: Option<Harness>) -> Bed {
    bed_on(false, harness).await
}

/// The bed's settings, the same for either ZTS: the roles the token rows ask about, the proxy
/// user, and the keys the key-refresh rows sign their ntokens with (registered up front, as ZMS
/// would hold them), for the jwt-service and for the callback (the principal-mismatch row).
fn settings(service_key: &PrivateKey) -> DevZtsConfig {
    let role = |r: &str, m: &[&str]| RoleEntry {
        domain: DOMAIN.into(),
        role: r.into(),
        members: m.iter().map(|s| (*s).to_owned()).collect(),
    };
    let public_key = service_key.key_pair().public_key_pem();
    DevZtsConfig {
        provider_timeout_ms: 2_000,
        roles: vec![
            role("readers", &["media.sports.web", PROXY, "finance.*"]),
            role("writers", &["media.sports.api"]),
        ],
        authorized_proxy_users: vec![PROXY.into()],
        services: [KEY_SERVICE.1, "athenz-callback"]
            .iter()
            .map(|service| ServiceEntry {
                name: format!("{}.{service}", KEY_SERVICE.0),
                public_keys: [("v1".to_owned(), public_key.clone())].into(),
            })
            // the services instances are launched as, registered in their domains as ZMS
            // holds them (ZTS refuses an instance of a service its domain does not list)
            .chain([DOMAIN, "news"].iter().map(|domain| ServiceEntry {
                name: format!("{domain}.{SERVICE}"),
                public_keys: Default::default(),
            }))
            .collect(),
        ..DevZtsConfig::default()
    }
}

/// The scripted providers every row may reach, from `ca`: the one that decides, one presenting
/// another service's certificate, one whose certificate names no host; and a closed port.
async fn providers(ca: &CertAuthority) -> (ProviderStub, Vec<ProviderStub>, Vec<ProviderEntry>) {
    let allow = Decision::Allow {
        cert_expiry_minutes: None,
    };
    let stub = ProviderStub::start(ca, PROVIDER, ca.root_pem(), BASE, allow.clone())
        .await
        .unwrap();
    let wrong_cn = ProviderStub::start(ca, PROVIDER, ca.root_pem(), BASE, allow.clone())
        .await
        .unwrap();
    let no_host = ProviderStub::start_with_leaf(
        ca,
        &LeafSpec::service(NO_HOST_PROVIDER, &[]),
        ca.root_pem(),
        BASE,
        allow,
    )
    .await
    .unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let entries = [
        (PROVIDER, stub.endpoint().to_owned()),
        (WRONG_CN_PROVIDER, wrong_cn.endpoint().to_owned()),
        (NO_HOST_PROVIDER, no_host.endpoint().to_owned()),
        (DOWN_PROVIDER, format!("https://127.0.0.1:{closed}{BASE}")),
    ]
    .into_iter()
    .map(|(name, endpoint)| ProviderEntry {
        name: name.into(),
        endpoint,
        dns_suffixes: vec![DNS_SUFFIX.into()],
        launch: vec!["media.sports.*".into()],
    })
    .collect();
    (stub, vec![wrong_cn, no_host], entries)
}

/// The bed on the dev ZTS, or on Athenz's own ZTS when `real` (built by
/// harness/peers/athenz/zts/build); its rows sent through Athenz's `harness` when given.
pub(super) async fn bed_on(real: bool, harness: Option<Harness>) -> Bed {
    let service_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let mut settings = settings(&service_key);
    let (zts, stub, others) = if real {
        // real ZTS reads its providers at start: they are up, and named, first
        let signer = CertAuthority::new_root("Real ZTS Test Root")
            .unwrap()
            .new_intermediate("Real ZTS Test Signer")
            .unwrap();
        let (stub, others, entries) = providers(&signer).await;
        settings.providers = entries;
        let zts = ZtsUnderTest::start_real(&settings, signer).await;
        (zts, stub, others)
    } else {
        let zts = DevZts::start(settings).await.unwrap();
        let (stub, others, entries) = providers(zts.ca()).await;
        for entry in entries {
            zts.add_provider(entry).unwrap();
        }
        (ZtsUnderTest::Dev(zts), stub, others)
    };
    Bed {
        athenz: harness.map(|h| tokio::sync::Mutex::new(AthenzClient::start(h).unwrap())),
        zts,
        stub,
        _others: others,
        service_key,
    }
}
