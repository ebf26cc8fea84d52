//! The rows of the authorization routes (access tokens, role tokens, the JWKS, role
//! certificates): the request each row describes.

use super::*;

async fn token(bed: &Bed, principal: &str, content_type: &str, body: &'static str) -> Reply {
    let (identity, _) = service_identity(bed, principal);
    deliver(
        bed,
        ZtsCall::AccessToken {
            identity,
            content_type: content_type.into(),
            form: body.into(),
        },
    )
    .await
}

pub(super) const FORM: &str = "application/x-www-form-urlencoded";

/// A role-certificate CSR for `media.sports:role.readers` with `sans`.
fn role_csr(key: &PrivateKey, sans: Vec<SanType>) -> String {
    raw_csr(key, "media.sports:role.readers", sans)
}

async fn role_cert(bed: &Bed, principal: &str, body: impl FnOnce(&PrivateKey) -> Value) -> Reply {
    let (identity, key) = service_identity(bed, principal);
    deliver(
        bed,
        ZtsCall::RoleCert {
            identity,
            body: body(&key),
        },
    )
    .await
}

pub(super) async fn run_token(bed: &Bed, case: &str) -> Reply {
    let web = "media.sports.web";
    let form = |body: &'static str| token(bed, web, FORM, body);
    match case {
        "access_token_ok" => form("grant_type=client_credentials&scope=media.sports%3Arole.readers").await,
        "access_token_k8s_athenz_sia" => {
            // GenerateAccessTokenRequestString (pkg/token/athenz.go): url.Values sorted by key,
            // the scope naming the roles, openid and the SIA's own service
            form("expires_in=3600&grant_type=client_credentials&scope=media.sports%3Arole.readers+openid+media.sports%3Aservice.web").await
        }
        "access_token_bad_expires_in" => {
            form("grant_type=client_credentials&scope=media.sports:domain&expires_in=soon").await
        }
        "access_token_unknown_scope_items_skipped" => {
            form("grant_type=client_credentials&scope=media.sports:domain+something+media.sports:group.g").await
        }
        "access_token_wrong_content_type" => {
            token(bed, web, "application/json", r#"{"grant_type":"client_credentials"}"#).await
        }
        "access_token_empty_body" => form("").await,
        "access_token_no_grant_type" => form("scope=media.sports:domain").await,
        "access_token_unknown_grant_type" => {
            form("grant_type=password&scope=media.sports:domain").await
        }
        "access_token_no_scope" => form("grant_type=client_credentials").await,
        "access_token_no_domain_in_scope" => form("grant_type=client_credentials&scope=openid").await,
        "access_token_two_domains" => {
            form("grant_type=client_credentials&scope=a:domain+b:domain").await
        }
        "access_token_openid_without_service" => {
            form("grant_type=client_credentials&scope=openid+media.sports:domain").await
        }
        "access_token_unknown_domain" => form("grant_type=client_credentials&scope=weather:domain").await,
        "access_token_not_a_member" => {
            form("grant_type=client_credentials&scope=media.sports:role.writers").await
        }
        "access_token_proxy_not_authorized" => {
            form("grant_type=client_credentials&scope=media.sports:role.readers&proxy_for_principal=finance.ledger").await
        }
        "role_token_ok" => {
            let (identity, _) = service_identity(bed, web);
            let call = ZtsCall::RoleToken {
                identity,
                domain: DOMAIN.into(),
                role: "readers".into(),
            };
            deliver(bed, call).await
        }
        "jwks_ok" => deliver(bed, ZtsCall::Jwks).await,
        "role_token_not_a_member" => {
            let (identity, _) = service_identity(bed, web);
            let call = ZtsCall::RoleToken {
                identity,
                domain: DOMAIN.into(),
                role: "writers".into(),
            };
            deliver(bed, call).await
        }
        other => panic!("the table has a case with no request here: {other}"),
    }
}

pub(super) async fn run_role_cert(bed: &Bed, case: &str) -> Reply {
    let web = "media.sports.web";
    let principal_uri = |p: &str| uri(&format!("athenz://principal/{p}"));
    match case {
        "role_cert_every_optional_field" => {
            role_cert(bed, PROXY, |key| {
                json!({
                    // the certificate is the proxied principal's; the proxy user URI names the
                    // caller (ZTSImpl.processRoleCertificateRequest)
                    "csr": role_csr(key, vec![
                        principal_uri("finance.ledger"),
                        uri(&format!("athenz://proxyuser/{PROXY}")),
                        uri("spiffe://media.sports/ra/readers"),
                    ]),
                    "expiryTime": 60,
                    "proxyForPrincipal": "finance.ledger",
                    "prevCertNotBefore": "2026-11-24T00:00:00.000Z",
                    "prevCertNotAfter": "2026-11-25T00:00:00.000Z",
                    "x509CertSignerKeyId": "zts-dev",
                })
            })
            .await
        }
        "role_cert_unknown_field" => {
            role_cert(bed, web, |key| {
                json!({"csr": role_csr(key, vec![principal_uri(web)]), "notAField": true})
            })
            .await
        }
        "role_cert_signer_key_id_not_simple_name" => {
            role_cert(bed, web, |key| {
                json!({"csr": role_csr(key, vec![principal_uri(web)]), "x509CertSignerKeyId": "zts.dev"})
            })
            .await
        }
        "role_cert_principal_as_email" => {
            role_cert(bed, web, |key| {
                // under the suffix: ZTS wants the email's host to end with ".<suffix>"
                json!({"csr": role_csr(key, vec![SanType::Rfc822Name(format!("{web}@mail.{DNS_SUFFIX}").as_str().try_into().unwrap())])})
            })
            .await
        }
        "role_cert_dns_and_ip_sans" => {
            role_cert(bed, web, |key| {
                json!({"csr": role_csr(key, vec![
                    principal_uri(web),
                    SanType::DnsName("anything.example".try_into().unwrap()),
                    SanType::IpAddress([10, 1, 2, 3].into()),
                ])})
            })
            .await
        }
        "role_cert_cn_not_a_role" => {
            role_cert(bed, web, |key| {
                json!({"csr": raw_csr(key, web, vec![principal_uri(web)])})
            })
            .await
        }
        "role_cert_unknown_domain" => {
            role_cert(bed, web, |key| {
                json!({"csr": raw_csr(key, "weather:role.readers", vec![principal_uri(web)])})
            })
            .await
        }
        "role_cert_not_a_member" => {
            role_cert(bed, web, |key| {
                json!({"csr": raw_csr(key, "media.sports:role.writers", vec![principal_uri(web)])})
            })
            .await
        }
        "role_cert_other_principal" => {
            role_cert(bed, web, |key| {
                json!({"csr": role_csr(key, vec![principal_uri("media.sports.api")])})
            })
            .await
        }
        "role_cert_two_emails" => {
            let email = |e: &str| SanType::Rfc822Name(e.try_into().unwrap());
            role_cert(bed, web, |key| {
                json!({"csr": role_csr(key, vec![
                    email(&format!("{web}@{DNS_SUFFIX}")),
                    email(&format!("{web}@mail.{DNS_SUFFIX}")),
                ])})
            })
            .await
        }
        "role_cert_proxy_not_authorized" => {
            role_cert(bed, web, |key| {
                json!({
                    "csr": role_csr(key, vec![principal_uri("finance.ledger"), uri(&format!("athenz://proxyuser/{web}"))]),
                    "proxyForPrincipal": "finance.ledger",
                })
            })
            .await
        }
        other => panic!("the table has a case with no request here: {other}"),
    }
}
