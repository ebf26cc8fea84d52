//! The dev ZTS's authorization routes (docs/design.md §4.11) over real mutual TLS: access tokens
//! for the roles a principal is in, verified by PyJWT (an implementation that shares no code with
//! ours) against the dev ZTS's own JWKS, and every refusal with ZTS's status code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{CertInfo, KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::zts::authz::RoleEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use base64::Engine;
use sha2::Digest;

const DOMAIN: &str = "media.sports";

async fn zts() -> DevZts {
    let role = |r: &str, m: &[&str]| RoleEntry {
        domain: DOMAIN.into(),
        role: r.into(),
        members: m.iter().map(|s| (*s).to_owned()).collect(),
    };
    DevZts::start(DevZtsConfig {
        roles: vec![
            role("readers", &["media.sports.web", "finance.*"]),
            role("writers", &["media.sports.api"]),
        ],
        max_token_expiry_secs: 7200,
        ..DevZtsConfig::default()
    })
    .await
    .unwrap()
}

/// An HTTPS client presenting a certificate of `principal` (or none); also the certificate's DER.
fn client(zts: &DevZts, principal: Option<&str>) -> (reqwest::Client, Vec<u8>) {
    let (http, der, _) = client_and_key(zts, principal);
    (http, der)
}

/// [`client`], with the certificate's private key.
fn client_and_key(
    zts: &DevZts,
    principal: Option<&str>,
) -> (reqwest::Client, Vec<u8>, Option<PrivateKey>) {
    let ca = reqwest::Certificate::from_pem(zts.root_pem().as_bytes()).unwrap();
    let mut builder = reqwest::Client::builder().tls_certs_only([ca]);
    let (mut der, mut key) = (Vec::new(), None);
    if let Some(principal) = principal {
        let issued = zts
            .ca()
            .issue(&LeafSpec::service(principal, &[]), KeyAlgorithm::P256)
            .unwrap();
        der = pem_certificates(&issued.cert_pem).unwrap()[0].to_vec();
        key = Some(PrivateKey::from_pem(issued.key_pem.expose()).unwrap());
        let pem = format!("{}{}", issued.chain_pem, issued.key_pem.expose());
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    (builder.build().unwrap(), der, key)
}

async fn token_request(
    zts: &DevZts,
    http: &reqwest::Client,
    form: &str,
) -> (u16, serde_json::Value) {
    let res = http
        .post(format!("{}/oauth2/token", zts.url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.to_owned())
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

/// Verifies `token` with PyJWT against `jwks` (the key chosen by the token's `kid`).
fn pyjwt_verify(token: &str, jwks: &serde_json::Value, audience: &str) -> serde_json::Value {
    athenz_testbed::pyjwt::verify_es256(token, jwks, audience).unwrap()
}

#[tokio::test]
async fn access_tokens_verify_with_pyjwt_and_are_bound_to_the_client_certificate() {
    let zts = zts().await;
    let (http, cert_der) = client(&zts, Some("media.sports.web"));
    let jwks = zts.fetch_jwks().await.unwrap();

    let (status, body) = token_request(
        &zts,
        &http,
        "grant_type=client_credentials&scope=media.sports%3Arole.readers&expires_in=600",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 600);
    // every role asked for was granted: Athenz sends no scope back
    // (ZTSImpl.processAccessTokenStandardRequest)
    assert!(body.get("scope").is_none(), "{body}");
    let token = body["access_token"].as_str().unwrap();
    let header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["typ"], "at+jwt");
    assert_eq!(header["alg"], "ES256");
    let claims = pyjwt_verify(token, &jwks, DOMAIN);
    assert_eq!(claims["ver"], 1);
    assert_eq!(claims["aud"], DOMAIN);
    for who in ["sub", "uid", "client_id"] {
        assert_eq!(claims[who], "media.sports.web", "{who}");
    }
    assert_eq!(claims["scp"], serde_json::json!(["readers"]));
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        600
    );
    let thumbprint =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(&cert_der));
    assert_eq!(claims["cnf"]["x5t#S256"], thumbprint);
    assert!(claims["iss"].as_str().unwrap().ends_with("/zts/v1"));

    // the whole domain: every role the caller is in; expires_in capped at the maximum
    let (status, body) = token_request(
        &zts,
        &http,
        "grant_type=client_credentials&scope=media.sports:domain&expires_in=999999",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["expires_in"], 7200);
    let claims = pyjwt_verify(body["access_token"].as_str().unwrap(), &jwks, DOMAIN);
    assert_eq!(claims["scp"], serde_json::json!(["readers"]));
    // a prefix member
    let (finance, _) = client(&zts, Some("finance.ledger"));
    let (status, _) = token_request(
        &zts,
        &finance,
        "grant_type=client_credentials&scope=media.sports:domain",
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn every_refusal_has_zts_code_and_reason() {
    let zts = zts().await;
    let (web, _) = client(&zts, Some("media.sports.web"));
    for (form, code, reason) in [
        (
            "grant_type=client_credentials&scope=media.sports:role.writers",
            403,
            "postaccesstokenrequest: principal media.sports.web is not included in the \
             requested role(s) in domain media.sports",
        ),
        (
            "grant_type=client_credentials&scope=media.sports:role.nope",
            403,
            "postaccesstokenrequest: principal media.sports.web is not included",
        ),
        (
            "grant_type=client_credentials&scope=weather:domain",
            404,
            "No such domain",
        ),
        (
            "grant_type=client_credentials&scope=media.sports:roles.x",
            400,
            "No domains in scope",
        ),
        (
            "grant_type=client_credentials&scope=a:domain+b:domain",
            400,
            "Multiple domains in scope",
        ),
        (
            "grant_type=client_credentials",
            400,
            "Invalid request: no scope provided",
        ),
        (
            "grant_type=password&scope=media.sports:domain",
            400,
            "Invalid grant request: password",
        ),
        // an undecodable component is skipped (AccessTokenRequest.decodeString is null)
        (
            "grant_type=client_credentials&scope=%ff",
            400,
            "Invalid request: no scope provided",
        ),
    ] {
        let (status, body) = token_request(&zts, &web, form).await;
        assert_eq!(status, code, "{form}: {body}");
        assert!(
            body["message"].as_str().unwrap().starts_with(reason),
            "{form}: {body}"
        );
        assert_eq!(body["code"], code);
    }
    // no client certificate: 401; not a form: 415 (the resource's @Consumes)
    let (anonymous, _) = client(&zts, None);
    let (status, _) = token_request(
        &zts,
        &anonymous,
        "grant_type=client_credentials&scope=media.sports:domain",
    )
    .await;
    assert_eq!(status, 401);
    let res = web
        .post(format!("{}/oauth2/token", zts.url()))
        .json(&serde_json::json!({"grant_type": "client_credentials"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 415);
}

#[tokio::test]
async fn role_tokens_verify_over_their_exact_text_and_refuse_as_zts_does() {
    use athenz_core::role_token::RoleToken;
    let zts = zts().await;
    let (web, _) = client(&zts, Some("media.sports.web"));
    let get = |query: &str| {
        let url = format!("{}/domain/{DOMAIN}/token{query}", zts.url());
        let web = web.clone();
        async move {
            let res = web.get(url).send().await.unwrap();
            (
                res.status().as_u16(),
                res.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (status, body) = get("?role=readers&minExpiryTime=900&maxExpiryTime=1800").await;
    assert_eq!(status, 200, "{body}");
    let text = body["token"].as_str().unwrap();
    let token = RoleToken::parse(text).unwrap();
    assert_eq!(token.domain, DOMAIN);
    assert_eq!(token.roles, ["readers"]);
    assert_eq!(token.principal, "media.sports.web");
    assert_eq!(token.expires - token.issued, 1800);
    assert_eq!(body["expiryTime"].as_i64().unwrap(), token.expires);
    let public = zts.token_public_key_pem();
    token
        .verify(
            &athenz_core::crypto::PublicKey::from_pem(&public).unwrap(),
            time::OffsetDateTime::now_utc(),
            athenz_core::ntoken::VerifyLimits::default(),
        )
        .unwrap();
    // openssl agrees, over the exact text before ";s="
    let (signed, sig) = text.split_once(";s=").unwrap();
    let sig = athenz_core::ntoken::ybase64_decode(sig).unwrap();
    athenz_testbed::openssl::verify_sha256_signature(&public, &sig, signed.as_bytes()).unwrap();
    // without role: every role the caller is in
    let (status, body) = get("").await;
    assert_eq!(status, 200);
    let all = RoleToken::parse(body["token"].as_str().unwrap()).unwrap();
    assert_eq!(all.roles, ["readers"]);
    for (query, code, reason) in [
        (
            "?role=writers",
            403,
            "getroletoken: principal media.sports.web is not included",
        ),
        ("?role=bad%20role", 400, "invalid role"),
        ("?role=readers&maxExpiryTime=x", 404, "HTTP 404"),
    ] {
        let (status, body) = get(query).await;
        assert_eq!(status, code, "{query}: {body}");
        assert!(
            body["message"].as_str().unwrap().starts_with(reason),
            "{query}: {body}"
        );
    }
    let (status, body) = {
        let res = web
            .get(format!("{}/domain/weather/token", zts.url()))
            .send()
            .await
            .unwrap();
        (
            res.status().as_u16(),
            res.json::<serde_json::Value>().await.unwrap(),
        )
    };
    assert_eq!(status, 404, "{body}");
    let (anonymous, _) = client(&zts, None);
    let res = anonymous
        .get(format!("{}/domain/{DOMAIN}/token", zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);
}

#[tokio::test]
async fn role_certificates_for_members_verify_with_openssl() {
    let zts = zts().await;
    let (web, _, key) = client_and_key(&zts, Some("media.sports.web"));
    let key = key.unwrap();
    let csr_for = |domain: &str, role: &str, principal: &str| {
        let identity = athenz_core::names::role_csr_identity(domain, role, principal).unwrap();
        build_csr(&identity, &key).unwrap()
    };
    let post = |body: serde_json::Value| {
        let web = web.clone();
        let url = format!("{}/rolecert", zts.url());
        async move {
            let res = web.post(url).json(&body).send().await.unwrap();
            (
                res.status().as_u16(),
                res.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let csr = csr_for(DOMAIN, "readers", "media.sports.web");
    let (status, body) = post(serde_json::json!({"csr": csr, "expiryTime": 60})).await;
    assert_eq!(status, 200, "{body}");
    let pem = body["x509Certificate"].as_str().unwrap();
    athenz_testbed::openssl::verify(zts.root_pem(), zts.ca_bundle(), pem).unwrap();
    let cert = CertInfo::from_pem(pem).unwrap();
    assert_eq!(cert.common_name, "media.sports:role.readers");
    assert_eq!(
        cert.uris,
        [
            "spiffe://media.sports/ra/readers",
            "athenz://principal/media.sports.web"
        ]
    );
    assert_eq!(
        cert.public_key_der,
        key.public_key_der(),
        "not over the caller's key"
    );
    assert_eq!(
        (cert.not_after - cert.not_before).whole_minutes(),
        60,
        "60 min from the signing moment"
    );

    // every refusal, with ZTS's code
    let mut other_caller =
        athenz_core::names::role_csr_identity(DOMAIN, "readers", "media.sports.web").unwrap();
    other_caller.uris[1] = "athenz://principal/media.sports.api".into();
    let mut no_spiffe =
        athenz_core::names::role_csr_identity(DOMAIN, "readers", "media.sports.web").unwrap();
    no_spiffe.uris.remove(0);
    let mut service_cn =
        athenz_core::names::role_csr_identity(DOMAIN, "readers", "media.sports.web").unwrap();
    service_cn.common_name = "media.sports.web".into();
    for (csr, code, reason) in [
        (
            csr_for(DOMAIN, "writers", "media.sports.web"),
            403,
            "postrolecertificaterequestext: principal media.sports.web is not included",
        ),
        (
            csr_for("weather", "readers", "media.sports.web"),
            404,
            "No such domain",
        ),
        (
            build_csr(&other_caller, &key).unwrap(),
            400,
            "Unable to validate cert request",
        ),
        (
            build_csr(&service_cn, &key).unwrap(),
            400,
            "Unable to parse PKCS10 CSR: Role Certificate CN is not a valid role",
        ),
        (csr.replace("MII", "MIJ"), 400, "unable to parse"),
    ] {
        let (status, body) = post(serde_json::json!({"csr": csr})).await;
        assert_eq!(status, code, "{body}");
        assert!(
            body["message"].as_str().unwrap().starts_with(reason),
            "{body}"
        );
    }
    // X509RoleCertRequest: a SPIFFE URI is checked only when present, and unknown fields are
    // ignored (Athenz's JSON reader)
    let (status, body) = post(serde_json::json!({
        "csr": build_csr(&no_spiffe, &key).unwrap(),
        "extra": 1
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    let (anonymous, _) = client(&zts, None);
    let res = anonymous
        .post(format!("{}/rolecert", zts.url()))
        .json(&serde_json::json!({"csr": csr}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);
}

#[tokio::test]
async fn athenz_cores_service_client_gets_all_three_and_keeps_zts_refusals() {
    use athenz_core::zts::{RoleCertificateRequest, ZtsClient, ZtsClientConfig, ZtsError};
    let zts = zts().await;
    let issued = zts
        .ca()
        .issue(
            &LeafSpec::service("media.sports.web", &[]),
            KeyAlgorithm::P256,
        )
        .unwrap();
    let key = PrivateKey::from_pem(issued.key_pem.expose()).unwrap();
    let identity = athenz_core::tls::ClientIdentity::Fixed(
        athenz_core::tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose())
            .unwrap(),
    );
    let client = ZtsClient::new(ZtsClientConfig {
        url: zts.url().into(),
        ca: athenz_core::tls::ServerCaBundle::fixed(pem_certificates(zts.root_pem()).unwrap())
            .unwrap(),
        timeout: std::time::Duration::from_secs(10),
        connect_timeout: std::time::Duration::from_secs(5),
    })
    .unwrap()
    .as_service(identity)
    .unwrap();

    let access = client
        .access_token(DOMAIN, &["readers".to_owned()], Some(300), None)
        .await
        .unwrap();
    assert_eq!(access.token_type, "Bearer");
    assert_eq!(access.expires_in, 300);
    assert_eq!(access.scope, None, "every role asked for was granted");
    assert!(!format!("{access:?}").contains(access.access_token.expose()));

    let role = client
        .role_token(DOMAIN, &["readers".to_owned()], Some(60), Some(600), None)
        .await
        .unwrap();
    let parsed = athenz_core::role_token::RoleToken::parse(role.token.expose()).unwrap();
    assert_eq!(parsed.expires, role.expiry_time);
    assert_eq!(parsed.expires - parsed.issued, 600);

    let csr = build_csr(
        &athenz_core::names::role_csr_identity(DOMAIN, "readers", "media.sports.web").unwrap(),
        &key,
    )
    .unwrap();
    let cert = client
        .role_certificate(&RoleCertificateRequest {
            csr,
            expiry_time: 0,
            ..RoleCertificateRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(
        CertInfo::from_pem(&cert.x509_certificate)
            .unwrap()
            .common_name,
        "media.sports:role.readers"
    );

    // ZTS's refusals keep its code and message; bad names are refused before anything is sent
    let err = client
        .access_token(DOMAIN, &["writers".to_owned()], None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ZtsError::Rejected { status: 403, message, .. } if message.contains("is not included in the requested role(s)")),
        "{err}"
    );
    assert!(!err.is_transient());
    let err = client
        .role_token("media/sports", &[], None, None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, ZtsError::BadRequest(_)), "{err}");
}
