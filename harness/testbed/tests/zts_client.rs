//! athenz-core's ZTS client over real TLS against a minimal scripted ZTS: status codes, the
//! `Location` header, the client certificate on instance refresh, the ntoken header on key-based
//! refresh, and every error path keeping ZTS's code and message. (The faithful development ZTS is
//! its own issue; this server only answers what each test scripts.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::http::{Body, ConnInfo, Handler, Listener, Server, error_response, json_response};
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientAuth, ClientIdentity, ReloadingIdentity, read_certs_file};
use athenz_core::zts::{
    Identity, InstanceIdentity, InstanceRef, InstanceRefreshInformation, InstanceRefreshRequest,
    InstanceRegisterInformation, PRINCIPAL_AUTH_HEADER, ZtsClient, ZtsClientConfig, ZtsError,
};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use std::sync::Arc;
use std::time::Duration;

struct ScriptedZts;

impl Handler for ScriptedZts {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let segments: Vec<&str> = path.trim_start_matches("/zts/v1/").split('/').collect();
        match segments.as_slice() {
            ["instance"] => {
                let info: InstanceRegisterInformation = match serde_json::from_slice(req.body()) {
                    Ok(i) => i,
                    Err(e) => return error_response(StatusCode::BAD_REQUEST, e.to_string()),
                };
                match info.domain.as_str() {
                    "deny" => error_response(StatusCode::FORBIDDEN, "provider said no"),
                    "broken" => {
                        let mut r = Response::new(Body::from("oops, not json"));
                        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        r
                    }
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        error_response(StatusCode::OK, "too late")
                    }
                    "huge" => json_response(
                        StatusCode::CREATED,
                        &serde_json::json!({"provider": "x".repeat(2 * 1024 * 1024)}),
                    ),
                    "garbled" => {
                        let mut r = Response::new(Body::from("{not json"));
                        *r.status_mut() = StatusCode::CREATED;
                        r
                    }
                    _ => {
                        let identity = InstanceIdentity {
                            provider: info.provider.clone(),
                            name: format!("{}.{}", info.domain, info.service),
                            instance_id: "uid-1".into(),
                            x509_certificate: Some("CERT".into()),
                            x509_certificate_signer: Some("CA".into()),
                            service_token: info.token.filter(|t| *t).map(|_| Secret::new("TOKEN")),
                            attributes: None,
                        };
                        let mut r = json_response(StatusCode::CREATED, &identity);
                        let location = format!(
                            "/zts/v1/instance/{}/{}/{}/uid-1",
                            info.provider, info.domain, info.service
                        );
                        r.headers_mut()
                            .insert(header::LOCATION, location.parse().unwrap());
                        r
                    }
                }
            }
            ["instance", domain, service, "refresh"] => {
                let Some(token) = req.headers().get(PRINCIPAL_AUTH_HEADER) else {
                    return error_response(StatusCode::UNAUTHORIZED, "no credentials");
                };
                let request: InstanceRefreshRequest = serde_json::from_slice(req.body()).unwrap();
                json_response(
                    StatusCode::OK,
                    &Identity {
                        name: format!("{domain}.{service}"),
                        certificate: request.csr,
                        ca_cert_bundle: Some("CA".into()),
                        service_token: Some(Secret::new(token.to_str().unwrap())),
                    },
                )
            }
            ["instance", provider, domain, service, instance] => {
                let expected = format!("{domain}.{service}");
                if conn.principal.as_deref() != Some(expected.as_str()) {
                    return error_response(
                        StatusCode::FORBIDDEN,
                        format!("principal mismatch: {:?}", conn.principal),
                    );
                }
                json_response(
                    StatusCode::OK,
                    &InstanceIdentity {
                        provider: (*provider).into(),
                        name: expected,
                        instance_id: (*instance).into(),
                        x509_certificate: Some("NEWCERT".into()),
                        ..Default::default()
                    },
                )
            }
            _ => error_response(StatusCode::NOT_FOUND, "no such route"),
        }
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    ca: CertAuthority,
    client: ZtsClient,
}

async fn start() -> Fixture {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new_root("ZTS Root").unwrap();
    let files = ca
        .write_service_cert(
            dir.path(),
            "zts",
            &LeafSpec::service("sys.auth.zts", &["localhost"]),
        )
        .unwrap();
    let identity = ReloadingIdentity::load(&files.cert, &files.key).unwrap();
    let cas = read_certs_file(&files.ca).unwrap();
    let config = tls::server_config_with(identity, &cas, ClientAuth::Optional).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        Server::new(Listener::Tcp(listener), Arc::new(ScriptedZts))
            .with_tls(config)
            .serve(std::future::pending()),
    );
    let client = ZtsClient::new(ZtsClientConfig {
        url: format!("https://localhost:{port}/zts/v1"),
        ca: athenz_core::tls::ServerCaBundle::fixed(cas).unwrap(),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    })
    .unwrap();
    Fixture {
        _dir: dir,
        ca,
        client,
    }
}

fn register_info(domain: &str) -> InstanceRegisterInformation {
    InstanceRegisterInformation {
        provider: "k8s.admin.athenz-callback".into(),
        domain: domain.into(),
        service: "web".into(),
        attestation_data: Secret::new("jwt"),
        csr: "CSR".into(),
        token: Some(true),
        ..Default::default()
    }
}

#[tokio::test]
async fn register_returns_identity_and_location() {
    let f = start().await;
    let registered = f
        .client
        .register(&register_info("media.sports"))
        .await
        .unwrap();
    assert_eq!(
        registered.location.as_deref(),
        Some("/zts/v1/instance/k8s.admin.athenz-callback/media.sports/web/uid-1")
    );
    assert_eq!(registered.identity.name, "media.sports.web");
    assert_eq!(
        registered
            .identity
            .service_token
            .as_ref()
            .map(Secret::expose),
        Some("TOKEN")
    );
}

#[tokio::test]
async fn rejections_keep_code_and_message() {
    let f = start().await;
    match f.client.register(&register_info("deny")).await {
        Err(ZtsError::Rejected {
            status,
            code,
            message,
        }) => {
            assert_eq!((status, code), (403, 403));
            assert_eq!(message, "provider said no");
        }
        other => panic!("{other:?}"),
    }
    match f.client.register(&register_info("broken")).await {
        Err(e @ ZtsError::Rejected { status: 500, .. }) => {
            assert!(e.to_string().contains("oops, not json"), "{e}");
            // a server error is worth another try (the agent answers its pod 503)
            assert!(e.is_transient());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn unreadable_answers_are_errors() {
    let f = start().await;
    let err = f
        .client
        .register(&register_info("garbled"))
        .await
        .unwrap_err();
    assert!(matches!(err, ZtsError::BadResponse { .. }), "{err}");
    let err = f.client.register(&register_info("huge")).await.unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
}

#[tokio::test]
async fn slow_and_unreachable_zts_are_transient() {
    let f = start().await;
    let err = f.client.register(&register_info("slow")).await.unwrap_err();
    assert!(matches!(err, ZtsError::Unreachable(_)), "{err}");
    assert!(err.is_transient());

    // a port nobody listens on
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let cas = athenz_core::crypto::pem_certificates(f.ca.root_pem()).unwrap();
    let closed = ZtsClient::new(ZtsClientConfig {
        url: format!("https://localhost:{port}/zts/v1"),
        ca: athenz_core::tls::ServerCaBundle::fixed(cas).unwrap(),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    })
    .unwrap();
    let err = closed
        .register(&register_info("media.sports"))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
}

#[tokio::test]
async fn invalid_names_are_refused_before_sending() {
    let f = start().await;
    let mut info = register_info("media.sports");
    info.service = "../admin".into();
    let err = f.client.register(&info).await.unwrap_err();
    assert!(matches!(err, ZtsError::BadRequest(_)), "{err}");
}

#[tokio::test]
async fn instance_refresh_presents_the_current_certificate() {
    let f = start().await;
    let issued =
        f.ca.issue(
            &LeafSpec::service("media.sports.web", &[]),
            athenz_core::crypto::KeyAlgorithm::P256,
        )
        .unwrap();
    let current = ClientIdentity::Fixed(
        tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose()).unwrap(),
    );
    let target = InstanceRef {
        provider: "k8s.admin.athenz-callback",
        domain: "media.sports",
        service: "web",
        instance_id: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
    };
    let info = InstanceRefreshInformation {
        csr: Some("CSR".into()),
        ..Default::default()
    };
    let identity = f
        .client
        .refresh_instance(&target, &info, current)
        .await
        .unwrap();
    assert_eq!(identity.name, "media.sports.web");
    assert_eq!(identity.x509_certificate.as_deref(), Some("NEWCERT"));

    // another principal's certificate is refused by the server and surfaced as such
    let other =
        f.ca.issue(
            &LeafSpec::service("media.sports.db", &[]),
            athenz_core::crypto::KeyAlgorithm::P256,
        )
        .unwrap();
    let wrong = ClientIdentity::Fixed(
        tls::certified_key_from_pem(&other.chain_pem, other.key_pem.expose()).unwrap(),
    );
    let err = f
        .client
        .refresh_instance(&target, &info, wrong)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    assert!(err.to_string().contains("principal mismatch"), "{err}");

    let bad_target = InstanceRef {
        instance_id: "../../instance",
        ..target
    };
    let current = ClientIdentity::Fixed(
        tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose()).unwrap(),
    );
    assert!(matches!(
        f.client.refresh_instance(&bad_target, &info, current).await,
        Err(ZtsError::BadRequest(_))
    ));
}

#[tokio::test]
async fn key_based_refresh_sends_the_ntoken_header() {
    let f = start().await;
    let request = InstanceRefreshRequest {
        csr: "CSR".into(),
        expiry_time: Some(60),
        key_id: Some("v1".into()),
    };
    let identity = f
        .client
        .refresh_with_ntoken(
            "k8s.admin",
            "athenz-callback",
            &request,
            &Secret::new("v=S1;d=k8s.admin;n=athenz-callback;s=sig"),
            PRINCIPAL_AUTH_HEADER,
        )
        .await
        .unwrap();
    assert_eq!(identity.name, "k8s.admin.athenz-callback");
    assert_eq!(
        identity.service_token.as_ref().map(Secret::expose),
        Some("v=S1;d=k8s.admin;n=athenz-callback;s=sig")
    );
    // a different header name means ZTS sees no credentials
    let err = f
        .client
        .refresh_with_ntoken(
            "k8s.admin",
            "athenz-callback",
            &request,
            &Secret::new("tok"),
            "X-Other-Auth",
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
}
