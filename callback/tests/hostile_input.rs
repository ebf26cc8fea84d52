//! Hostile input to the callback over real mutual TLS: forged tokens (no algorithm, HMAC with the
//! public key, a signature of another key, edited claims), malformed confirmations, and callers
//! it must refuse before reading their request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::identity_jwt::IdentityClaims;
use athenz_testbed::fixtures::{self, DOMAIN, NAMESPACE, POD_UID, SERVICE};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
fn forge(header: serde_json::Value, claims: &IdentityClaims, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).unwrap()),
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tokens_are_denied() {
    let f = start().await;
    let c = claims();
    let public_pem = f.ec.public_key_pem().unwrap();
    // alg none, with and without a signature
    let none = forge(
        serde_json::json!({"alg": "none", "typ": "JWT", "kid": "v1"}),
        &c,
        b"",
    );
    assert_denied(f.confirm(&confirmation(none)).await, "algorithm");
    // HS256 signed with the public key bytes as the HMAC secret
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header {
            kid: Some("v1".into()),
            ..jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256)
        },
        &c,
        &jsonwebtoken::EncodingKey::from_secret(public_pem.as_bytes()),
    )
    .unwrap();
    assert_denied(f.confirm(&confirmation(hs)).await, "algorithm");
    // RS256 token naming the EC key, and ES256 token naming the RSA key
    assert_denied(
        f.confirm(&confirmation(f.rsa.sign("v1", &claims()).unwrap()))
            .await,
        "algorithm",
    );
    assert_denied(
        f.confirm(&confirmation(f.ec.sign("v2", &claims()).unwrap()))
            .await,
        "algorithm",
    );
    // unknown kid, and no kid
    assert_denied(
        f.confirm(&confirmation(f.ec.sign("v9", &claims()).unwrap()))
            .await,
        "kid",
    );
    let no_kid = {
        let t = f.ec.sign("v1", &claims()).unwrap();
        let sig = t.split('.').nth(2).unwrap().to_owned();
        format!(
            "{}.{}.{sig}",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","typ":"JWT"}"#),
            t.split('.').nth(1).unwrap()
        )
    };
    assert_denied(f.confirm(&confirmation(no_kid)).await, "kid");
    // tampered payload: another pod's subject under the original signature
    let genuine = f.ec.sign("v1", &claims()).unwrap();
    let mut parts: Vec<String> = genuine.split('.').map(str::to_owned).collect();
    let other = IdentityClaims {
        sub: format!(
            "pod:{NAMESPACE}/admin?d={DOMAIN}&n={SERVICE}&i={}&u={POD_UID}",
            fixtures::POD_IP
        ),
        ..claims()
    };
    parts[1] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&other).unwrap());
    assert_denied(f.confirm(&confirmation(parts.join("."))).await, "signature");
    // garbage
    assert_denied(f.confirm(&confirmation("a.b.c".into())).await, "algorithm");
    assert_denied(
        f.confirm(&confirmation(String::new())).await,
        "attestation_data",
    );
    // replay: the same token twice
    let once = es256(&f, &claims());
    assert_eq!(f.confirm(&confirmation(once.clone())).await.0, 200);
    assert_denied(f.confirm(&confirmation(once)).await, "jti");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_confirmations_and_refused_callers() {
    let f = start().await;
    for body in [
        "",
        "{",
        "[]",
        r#"{"provider":1}"#,
        r#"{"provider":"p","domain":"d","service":"s","attestationData":"x","attributes":{"a":1}}"#,
    ] {
        let (status, body_json) = f.post("instance", body).await;
        assert_eq!(status, 400, "{body}: {body_json}");
        assert_eq!(body_json["code"], 400);
    }
    // A refresh by certificate alone reaches the provider with attestationData null or absent
    // (ZTSImpl.processProviderX509RefreshRequest passes on what the instance sent): a named
    // refusal, not a malformed request.
    let mut without = serde_json::to_value(confirmation(es256(&f, &claims()))).unwrap();
    for attestation in [None, Some(serde_json::Value::Null)] {
        let object = without.as_object_mut().unwrap();
        object.remove("attestationData");
        if let Some(value) = attestation {
            object.insert("attestationData".into(), value);
        }
        for route in ["instance", "refresh"] {
            assert_denied(
                f.post(route, &without.to_string()).await,
                "attestation_data",
            );
        }
    }
    let c = serde_json::to_string(&confirmation(es256(&f, &claims()))).unwrap();
    // an allowed CA but not a ZTS principal
    let resp = f
        .client(Some("k8s.admin.athenz-agent"))
        .post(format!("{}/instance", f.endpoint))
        .body(c.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    // no client certificate: no session
    assert!(
        f.client(None)
            .post(format!("{}/instance", f.endpoint))
            .body(c.clone())
            .send()
            .await
            .is_err()
    );
    // unknown route
    let resp = f
        .client(Some("sys.auth.zts"))
        .post(format!("{}/other", f.endpoint))
        .body(c)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}
