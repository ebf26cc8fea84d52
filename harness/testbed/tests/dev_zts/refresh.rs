//! Refreshes: with the client certificate (its principal, instance and serial checked), and
//! key-based with an ntoken, with every rejection.

use super::*;

#[tokio::test]
async fn refresh_with_the_client_certificate() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let first = register(&s, &key).await;
    let next_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let refreshed = s
        .client
        .refresh_instance(
            &target(),
            &refresh_info(pod_csr(&next_key)),
            presenting(&first, &key),
        )
        .await
        .unwrap();
    let old = CertInfo::from_pem(first.x509_certificate.as_deref().unwrap()).unwrap();
    let new = CertInfo::from_pem(refreshed.x509_certificate.as_deref().unwrap()).unwrap();
    assert_eq!(new.public_key_der, next_key.public_key_der());
    assert_ne!(new.serial_hex, old.serial_hex);
    assert!(refreshed.service_token.is_some());
    let record = s.zts.instance(&instance_key(POD_UID)).unwrap();
    assert_eq!(record.current_serial, new.serial_hex);
    assert_eq!(
        record.previous_serial.as_deref(),
        Some(old.serial_hex.as_str())
    );

    let calls = s.provider.recorded();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].path, "/callback/refresh");
    let confirmation = calls[1].confirmation().unwrap();
    assert_eq!(confirmation.attestation_data.expose(), "a-fresh-jwt");
    assert_eq!(confirmation.attributes["instanceId"], POD_UID);
}

#[tokio::test]
async fn refresh_principal_and_instance_mismatches_are_refused() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let first = register(&s, &key).await;

    // another principal's certificate
    let stranger = s
        .zts
        .ca()
        .issue(
            &athenz_testbed::pki::LeafSpec::service("media.sports.db", &[]),
            KeyAlgorithm::P256,
        )
        .unwrap();
    let stranger_id = ClientIdentity::Fixed(
        tls::certified_key_from_pem(&stranger.chain_pem, stranger.key_pem.expose()).unwrap(),
    );
    let (status, message) = rejected(
        s.client
            .refresh_instance(&target(), &refresh_info(pod_csr(&key)), stranger_id)
            .await
            .unwrap_err(),
    );
    // ZTSImpl.postInstanceRefreshInformation: requestError, the path's principal first
    assert_eq!(
        (status, message.as_str()),
        (
            400,
            "Principal mismatch: media.sports.web vs. media.sports.db"
        )
    );

    // CSR for another instance id than the path
    let other_csr = csr_with(&key, |id| {
        *id = CsrIdentity::for_pod(&PodIdentityInput {
            instance_id: "11111111-2222-4333-8444-555555555555",
            ..pod_input()
        })
        .unwrap();
    });
    let (status, message) = rejected(
        s.client
            .refresh_instance(
                &target(),
                &refresh_info(other_csr),
                presenting(&first, &key),
            )
            .await
            .unwrap_err(),
    );
    // X509CertRequest.validateInstanceId, reported by processProviderX509RefreshRequest
    assert_eq!(
        (status, message.as_str()),
        (400, "CSR validation failed - instance id mismatch")
    );

    // the right CSR and path, but the certificate of another instance
    let other_uid = "11111111-2222-4333-8444-555555555555";
    let other_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let other_identity = CsrIdentity::for_pod(&PodIdentityInput {
        instance_id: other_uid,
        ..pod_input()
    })
    .unwrap();
    let mut info = register_info(build_csr(&other_identity, &other_key).unwrap());
    info.token = None;
    let other = s.client.register(&info).await.unwrap().identity;
    let (status, message) = rejected(
        s.client
            .refresh_instance(
                &target(),
                &refresh_info(pod_csr(&key)),
                presenting(&other, &other_key),
            )
            .await
            .unwrap_err(),
    );
    // X509CertRequest.validateInstanceId, reported by processProviderX509RefreshRequest
    assert_eq!(
        (status, message.as_str()),
        (400, "CSR validation failed - instance id mismatch")
    );
}

#[tokio::test]
async fn a_stale_serial_revokes_the_instance() {
    let s = stack(allow()).await;
    let k1 = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let c1 = register(&s, &k1).await;
    let k2 = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let c2 = s
        .client
        .refresh_instance(&target(), &refresh_info(pod_csr(&k2)), presenting(&c1, &k1))
        .await
        .unwrap();
    let k3 = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let c3 = s
        .client
        .refresh_instance(&target(), &refresh_info(pod_csr(&k3)), presenting(&c2, &k2))
        .await
        .unwrap();
    // c1 is two generations old: a copy of it is being used
    let (status, message) = rejected(
        s.client
            .refresh_instance(&target(), &refresh_info(pod_csr(&k1)), presenting(&c1, &k1))
            .await
            .unwrap_err(),
    );
    assert_eq!((status, message.as_str()), (403, "Certificate revoked"));
    // and now even the newest certificate is refused
    let (status, message) = rejected(
        s.client
            .refresh_instance(&target(), &refresh_info(pod_csr(&k3)), presenting(&c3, &k3))
            .await
            .unwrap_err(),
    );
    assert_eq!((status, message.as_str()), (403, "Certificate revoked"));
    assert!(s.zts.instance(&instance_key(POD_UID)).unwrap().revoked);
}

const CONTROL_SERVICE: &str = "k8s.admin.athenz-jwt-service";

fn service_csr(key: &PrivateKey) -> String {
    build_csr(
        &CsrIdentity::for_service("k8s.admin", "athenz-jwt-service", fixtures::DNS_SUFFIX).unwrap(),
        key,
    )
    .unwrap()
}

fn ntoken(
    key: &PrivateKey,
    version: &str,
    issued: time::OffsetDateTime,
    life: time::Duration,
) -> Secret {
    NTokenBuilder {
        domain: "k8s.admin".into(),
        service: "athenz-jwt-service".into(),
        host: None,
        key_version: version.into(),
        key_service: None,
        lifetime: life,
    }
    .sign(key, issued)
    .unwrap()
}

#[tokio::test]
async fn key_based_refresh_with_an_ntoken() {
    let s = stack(allow()).await;
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PrivateKey::generate(alg).unwrap();
        s.zts
            .add_service_key(CONTROL_SERVICE, "v1", &key.key_pair().public_key_pem())
            .unwrap();
        let request = InstanceRefreshRequest {
            csr: service_csr(&key),
            expiry_time: Some(120),
            key_id: Some("v1".into()),
        };
        let now = time::OffsetDateTime::now_utc();
        let identity = s
            .client
            .refresh_with_ntoken(
                "k8s.admin",
                "athenz-jwt-service",
                &request,
                &ntoken(&key, "v1", now, time::Duration::hours(1)),
                PRINCIPAL_AUTH_HEADER,
            )
            .await
            .unwrap();
        assert_eq!(identity.name, CONTROL_SERVICE);
        openssl::verify(
            s.zts.root_pem(),
            s.zts.ca().intermediates_pem(),
            &identity.certificate,
        )
        .unwrap();
        let cert = CertInfo::from_pem(&identity.certificate).unwrap();
        assert_eq!(
            cert.dns_names,
            ["athenz-jwt-service.k8s-admin.athenz.cloud"]
        );
        assert_eq!((cert.not_after - cert.not_before).whole_minutes(), 120);
        assert_eq!(identity.ca_cert_bundle.as_deref(), Some(s.zts.ca_bundle()));
    }
}

#[tokio::test]
async fn key_based_refresh_rejections() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    s.zts
        .add_service_key(CONTROL_SERVICE, "v1", &key.key_pair().public_key_pem())
        .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let good_request = InstanceRefreshRequest {
        csr: service_csr(&key),
        expiry_time: None,
        key_id: Some("v1".into()),
    };
    let call = |request: InstanceRefreshRequest, token: Secret| {
        let client = s.client.clone();
        async move {
            client
                .refresh_with_ntoken(
                    "k8s.admin",
                    "athenz-jwt-service",
                    &request,
                    &token,
                    PRINCIPAL_AUTH_HEADER,
                )
                .await
        }
    };
    let hour = time::Duration::hours(1);

    // unknown key version
    let (status, message) = rejected(
        call(good_request.clone(), ntoken(&key, "v9", now, hour))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("no public key v9"), "{message}");

    // expired token
    let (status, message) = rejected(
        call(
            good_request.clone(),
            ntoken(&key, "v1", now - time::Duration::hours(3), hour),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("expired"), "{message}");

    // tampered token: expiry extended by a second after signing
    let token = ntoken(&key, "v1", now, hour);
    let expires = athenz_core::ntoken::NToken::parse(token.expose())
        .unwrap()
        .expires;
    let tampered = token
        .expose()
        .replace(&format!(";e={expires}"), &format!(";e={}", expires + 1));
    let (status, message) = rejected(
        call(good_request.clone(), Secret::new(tampered))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("signature"), "{message}");

    // a token signed by another key under the registered version
    let other = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let (status, message) = rejected(
        call(good_request.clone(), ntoken(&other, "v1", now, hour))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("signature"), "{message}");

    // the CSR's key is not the registered one
    let (status, message) = rejected(
        call(
            InstanceRefreshRequest {
                csr: service_csr(&other),
                ..good_request.clone()
            },
            ntoken(&key, "v1", now, hour),
        )
        .await
        .unwrap_err(),
    );
    // ZTSImpl.postInstanceRefreshRequest
    assert_eq!(
        (status, message.as_str()),
        (400, "Invalid CSR - public key mismatch")
    );

    // no token at all
    let err = s
        .client
        .refresh_with_ntoken(
            "k8s.admin",
            "athenz-jwt-service",
            &good_request,
            &ntoken(&key, "v1", now, hour),
            "X-Not-The-Header",
        )
        .await
        .unwrap_err();
    assert_eq!(rejected(err).0, 401);
}
