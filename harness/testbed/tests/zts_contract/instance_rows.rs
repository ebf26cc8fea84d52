//! The rows of the instance routes (register, refresh, key refresh), and the dispatch of every
//! row to the request it describes (the authorization routes' rows are in `authz_rows`).

use super::*;

/// What a row's request got, and the instance it was about (the row's answer names it as
/// `{instance}`).
pub(super) struct Sent {
    pub(super) reply: Reply,
    pub(super) instance: String,
}

/// Sends the request row `case` describes.
pub(super) async fn run(bed: &Bed, case: &str) -> Sent {
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let uid = fresh_uid();
    let ok_csr = pod_csr(&key, &uid, |_| {});
    let jwt = Some("jwt");
    let reply = match case {
        "register_ok" => register(bed, register_body(PROVIDER, DOMAIN, &ok_csr, jwt)).await,
        "register_unknown_provider" => {
            register(
                bed,
                register_body("k8s.admin.unknown", DOMAIN, &ok_csr, jwt),
            )
            .await
        }
        "register_launch_not_granted" => {
            register(bed, register_body(PROVIDER, "news", &ok_csr, jwt)).await
        }
        "register_no_csr" => register(bed, register_body(PROVIDER, DOMAIN, "", jwt)).await,
        "register_no_attestation" => {
            register(bed, register_body(PROVIDER, DOMAIN, &ok_csr, None)).await
        }
        "register_unparsable_csr" => {
            register(bed, register_body(PROVIDER, DOMAIN, "not a csr", jwt)).await
        }
        "register_two_spiffe_uris" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.push(format!("spiffe://{DOMAIN}/sa/{SERVICE}"));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_cn_mismatch" => {
            let csr = pod_csr(&key, &uid, |id| id.common_name = "media.sports.db".into());
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_no_cn_with_spiffe" => {
            let csr = raw_csr(
                &key,
                "",
                vec![
                    uri(&format!("spiffe://{DOMAIN}/sa/{SERVICE}")),
                    uri(&format!("athenz://instanceid/{PROVIDER}/{uid}")),
                ],
            );
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_dns_outside_suffix" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.dns_names.push("web.evil.example".into())
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_no_instance_id" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.retain(|u| !u.starts_with("athenz://"));
                id.dns_names.retain(|d| !d.contains(".instanceid."));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_spiffe_of_another" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.retain(|u| !u.starts_with("spiffe://"));
                id.uris.push(format!("spiffe://{DOMAIN}/sa/db"));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_uri_wins_over_dns" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.dns_names.retain(|d| !d.contains(".instanceid."));
                id.dns_names
                    .push(format!("{}.instanceid.athenz.{DNS_SUFFIX}", fresh_uid()));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_instance_uri_other_provider" => {
            let csr = raw_csr(
                &key,
                "media.sports.web",
                vec![uri(&format!("athenz://instanceid/other.provider/{uid}"))],
            );
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_unknown_uri_scheme" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.push("https://example.test/x".into())
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_provider_403"
        | "register_provider_400"
        | "register_provider_500"
        | "register_provider_503"
        | "register_provider_504" => {
            let status: u16 = case.rsplit('_').next().unwrap().parse().unwrap();
            let body = register_body(PROVIDER, DOMAIN, &ok_csr, jwt);
            with_decision(bed, deny(status), register(bed, body)).await
        }
        "register_provider_unreachable" => {
            register(bed, register_body(DOWN_PROVIDER, DOMAIN, &ok_csr, jwt)).await
        }
        "register_provider_wrong_cn" => {
            register(bed, register_body(WRONG_CN_PROVIDER, DOMAIN, &ok_csr, jwt)).await
        }
        "register_provider_cert_without_host_name" => {
            let csr = raw_csr(
                &key,
                "media.sports.web",
                vec![uri(&format!(
                    "athenz://instanceid/{NO_HOST_PROVIDER}/{uid}"
                ))],
            );
            register(bed, register_body(NO_HOST_PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_provider_unreadable_200" => {
            let raw = Decision::Raw {
                status: 200,
                body: "<html>ok</html>".into(),
            };
            let body = register_body(PROVIDER, DOMAIN, &ok_csr, jwt);
            with_decision(bed, raw, register(bed, body)).await
        }
        case if case.starts_with("refresh_") => {
            let (reply, instance) = run_refresh(bed, case).await;
            return Sent { reply, instance };
        }
        case if case.starts_with("key_refresh_") => run_key_refresh(bed, case).await,
        case if case.starts_with("access_token_")
            || case.starts_with("role_token_")
            || case.starts_with("jwks_") =>
        {
            authz_rows::run_token(bed, case).await
        }
        case if case.starts_with("role_cert_") => authz_rows::run_role_cert(bed, case).await,
        "status_without_credentials" => deliver(bed, ZtsCall::Status { identity: None }).await,
        "status_ok" => {
            let (identity, _) = service_identity(bed, "media.sports.web");
            deliver(
                bed,
                ZtsCall::Status {
                    identity: Some(identity),
                },
            )
            .await
        }
        other => panic!("the table has a case with no request here: {other}"),
    };
    Sent {
        reply,
        instance: uid,
    }
}

/// A refresh row's reply, and the instance refreshed.
async fn run_refresh(bed: &Bed, case: &str) -> (Reply, String) {
    let (uid, cert, key) = registered(bed).await;
    let new_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let csr = pod_csr(&new_key, &uid, |_| {});
    let body = json!({"csr": csr, "attestationData": "jwt"});
    let me = Some((cert.as_str(), &key));
    let reply = match case {
        "refresh_ok" => refresh(bed, me, &uid, body).await,
        "refresh_no_client_certificate" => refresh(bed, None, &uid, body).await,
        "refresh_no_csr" => refresh(bed, me, &uid, json!({"attestationData": "jwt"})).await,
        "refresh_principal_mismatch" => {
            let db = bed
                .zts
                .ca()
                .issue(
                    &LeafSpec::service("media.sports.db", &[]),
                    KeyAlgorithm::P256,
                )
                .unwrap();
            let db_key = PrivateKey::from_pem(db.key_pem.expose()).unwrap();
            refresh(bed, Some((&db.chain_pem, &db_key)), &uid, body).await
        }
        "refresh_launch_not_granted" => {
            let news = bed
                .zts
                .ca()
                .issue(&LeafSpec::service("news.web", &[]), KeyAlgorithm::P256)
                .unwrap();
            let news_key = PrivateKey::from_pem(news.key_pem.expose()).unwrap();
            let csr = build_csr(
                &CsrIdentity::for_pod(&PodIdentityInput {
                    domain: "news",
                    ..pod_input(&uid)
                })
                .unwrap(),
                &news_key,
            )
            .unwrap();
            let call = ZtsCall::Refresh {
                identity: Some((news.chain_pem.clone(), news.key_pem.expose().to_owned())),
                domain: "news".into(),
                uid: uid.clone(),
                body: json!({"csr": csr, "attestationData": "jwt"}),
            };
            deliver(bed, call).await
        }
        "refresh_csr_invalid" => {
            let csr = pod_csr(&new_key, &uid, |id| {
                id.dns_names.push("web.evil.example".into())
            });
            refresh(bed, me, &uid, json!({"csr": csr, "attestationData": "jwt"})).await
        }
        "refresh_csr_other_instance" => {
            let csr = pod_csr(&new_key, &fresh_uid(), |_| {});
            refresh(bed, me, &uid, json!({"csr": csr, "attestationData": "jwt"})).await
        }
        "refresh_cert_other_instance" => {
            let (_, other_cert, other_key) = registered(bed).await;
            refresh(bed, Some((&other_cert, &other_key)), &uid, body).await
        }
        "refresh_provider_403" | "refresh_provider_504" => {
            let status: u16 = case.rsplit('_').next().unwrap().parse().unwrap();
            with_decision(bed, deny(status), refresh(bed, me, &uid, body)).await
        }
        "refresh_without_attestation" => {
            let answer = refresh(bed, me, &uid, json!({"csr": csr})).await;
            let sent = bed.stub.recorded().last().unwrap().confirmation().unwrap();
            assert!(
                sent.attestation_data.is_empty(),
                "ZTS forwards the absent attestation as absent"
            );
            answer
        }
        "refresh_no_record" => {
            // a certificate from the ZTS CA naming the instance, which ZTS never issued
            let unrecorded_uid = fresh_uid();
            let identity = CsrIdentity::for_pod(&pod_input(&unrecorded_uid)).unwrap();
            let issued = bed
                .zts
                .ca()
                .issue(
                    &LeafSpec {
                        dns_names: identity.dns_names.clone(),
                        uris: identity.uris.clone(),
                        ..LeafSpec::service("media.sports.web", &[])
                    },
                    KeyAlgorithm::P256,
                )
                .unwrap();
            let issued_key = PrivateKey::from_pem(issued.key_pem.expose()).unwrap();
            let csr = pod_csr(&new_key, &unrecorded_uid, |_| {});
            refresh(
                bed,
                Some((&issued.chain_pem, &issued_key)),
                &unrecorded_uid,
                json!({"csr": csr, "attestationData": "jwt"}),
            )
            .await
        }
        "refresh_stale_certificate" => {
            // two refreshes: the first certificate is then neither current nor previous
            let mut held = (
                cert.clone(),
                PrivateKey::from_pem(key.to_pkcs8_pem().unwrap().expose()).unwrap(),
            );
            for _ in 0..2 {
                let next_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
                let csr = pod_csr(&next_key, &uid, |_| {});
                let pem = held.1.to_pkcs8_pem().unwrap();
                let response = client(bed, Some((&held.0, pem.expose())))
                    .post(format!(
                        "{}/instance/{PROVIDER}/{DOMAIN}/{SERVICE}/{uid}",
                        bed.zts.url()
                    ))
                    .json(&json!({"csr": csr, "attestationData": "jwt"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status().as_u16(), 200);
                let identity: Value = response.json().await.unwrap();
                held = (
                    identity["x509Certificate"].as_str().unwrap().to_owned(),
                    next_key,
                );
            }
            refresh(bed, me, &uid, body).await
        }
        other => panic!("the table has a case with no request here: {other}"),
    };
    (reply, uid)
}

async fn run_key_refresh(bed: &Bed, case: &str) -> Reply {
    let key = &bed.service_key;
    match case {
        "key_refresh_ok" => key_refresh(bed, KEY_SERVICE.1, service_csr(key, |_| {})).await,
        "key_refresh_principal_mismatch" => {
            key_refresh(bed, "athenz-callback", service_csr(key, |_| {})).await
        }
        "key_refresh_unparsable_csr" => key_refresh(bed, KEY_SERVICE.1, "garbage".into()).await,
        "key_refresh_data_mismatch" => {
            let csr = service_csr(key, |id| id.common_name = "k8s.admin.other".into());
            key_refresh(bed, KEY_SERVICE.1, csr).await
        }
        "key_refresh_dns_not_service_form" => {
            let csr = service_csr(key, |id| {
                id.dns_names
                    .push(format!("{}.athenz-system.{DNS_SUFFIX}", KEY_SERVICE.1));
            });
            key_refresh(bed, KEY_SERVICE.1, csr).await
        }
        "key_refresh_public_key_mismatch" => {
            let other = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
            key_refresh(bed, KEY_SERVICE.1, service_csr(&other, |_| {})).await
        }
        "key_refresh_ip_mismatch" => {
            let csr = service_csr(key, |id| id.ip_addresses.push([10, 9, 9, 9].into()));
            key_refresh(bed, KEY_SERVICE.1, csr).await
        }
        other => panic!("the table has a case with no request here: {other}"),
    }
}
