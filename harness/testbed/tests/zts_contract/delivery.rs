//! How a row's request reaches the dev ZTS: as any client would make it ([`ZtsCall`]), sent with
//! reqwest, or through one of Athenz's own clients (harness/peers/athenz/java, harness/peers/athenz/go) when the
//! bed has one, so the same rows check both the dev ZTS and our reading of Athenz's wire.

use super::{Bed, KEY_SERVICE};
use athenz_testbed::athenz_clients::{AthenzClient, ClientAnswer, request};
use athenz_testbed::fixtures::{PROVIDER, SERVICE};
use serde_json::{Value, json};

/// An HTTPS client trusting only the dev ZTS root, presenting `identity` (chain PEM, key PEM).
pub(super) fn client(bed: &Bed, identity: Option<(&str, &str)>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(bed.zts.root_pem().as_bytes()).unwrap();
    let mut builder = reqwest::Client::builder().tls_certs_only([ca]);
    if let Some((chain, key)) = identity {
        let pem = format!("{chain}{key}");
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

/// What a row's request got: status and message (empty for an answer without one), a success
/// as Athenz's client decoded it (none when sent with reqwest), and the body as sent (none when
/// sent through an Athenz client).
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) message: String,
    pub(super) decoded: Option<Value>,
    pub(super) body: Option<Value>,
}

/// Status and message (empty for an answer without one); a request ZTS refused before any
/// HTTP answer (its TLS handshake) is status 0 with the error as the message.
pub(super) async fn send(request: reqwest::RequestBuilder) -> Reply {
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            return Reply {
                status: 0,
                message: format!("no HTTP answer: {error:?}"),
                decoded: None,
                body: None,
            };
        }
    };
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body["message"].as_str().unwrap_or_default().to_owned();
    Reply {
        status,
        message,
        decoded: None,
        body: Some(body),
    }
}

/// A client identity: certificate chain PEM and key PEM.
pub(super) type Identity = (String, String);

/// A row's request, as any client would make it.
pub(super) enum ZtsCall {
    Register(Value),
    Refresh {
        identity: Option<Identity>,
        domain: String,
        uid: String,
        body: Value,
    },
    KeyRefresh {
        ntoken: String,
        body: Value,
    },
    AccessToken {
        identity: Identity,
        content_type: String,
        form: String,
    },
    RoleToken {
        identity: Identity,
        domain: String,
        role: String,
    },
    RoleCert {
        identity: Identity,
        body: Value,
    },
    Jwks,
    Status {
        identity: Option<Identity>,
    },
}

/// Sends `call` with reqwest, or through the bed's Athenz client when it has one.
pub(super) async fn deliver(bed: &Bed, call: ZtsCall) -> Reply {
    match &bed.athenz {
        Some(athenz) => deliver_via_athenz(bed, &mut *athenz.lock().await, call).await,
        None => deliver_via_reqwest(bed, call).await,
    }
}

pub(super) async fn deliver_via_reqwest(bed: &Bed, call: ZtsCall) -> Reply {
    let url = bed.zts.url();
    let with = |identity: &Option<Identity>| {
        client(
            bed,
            identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        )
    };
    let request = match call {
        ZtsCall::Register(body) => with(&None).post(format!("{url}/instance")).json(&body),
        ZtsCall::Refresh {
            identity,
            domain,
            uid,
            body,
        } => with(&identity)
            .post(format!(
                "{url}/instance/{PROVIDER}/{domain}/{SERVICE}/{uid}"
            ))
            .json(&body),
        ZtsCall::KeyRefresh { ntoken, body } => with(&None)
            .post(format!(
                "{url}/instance/{}/{}/refresh",
                KEY_SERVICE.0, KEY_SERVICE.1
            ))
            .header("Athenz-Principal-Auth", ntoken)
            .json(&body),
        ZtsCall::AccessToken {
            identity,
            content_type,
            form,
        } => with(&Some(identity))
            .post(format!("{url}/oauth2/token"))
            .header("content-type", content_type)
            .body(form),
        ZtsCall::RoleToken {
            identity,
            domain,
            role,
        } => with(&Some(identity)).get(format!("{url}/domain/{domain}/token?role={role}")),
        ZtsCall::RoleCert { identity, body } => with(&Some(identity))
            .post(format!("{url}/rolecert"))
            .json(&body),
        ZtsCall::Jwks => with(&None).get(format!("{url}/oauth2/keys?rfc=true")),
        ZtsCall::Status { identity } => with(&identity).get(format!("{url}/status")),
    };
    send(request).await
}

/// The same request through Athenz's client: its model carries the body, its client sends it,
/// and a success must decode in its model (the decoded fields are the reply's, for the row's
/// answer to be compared with). An unsendable request is status 0.
pub(super) async fn deliver_via_athenz(
    bed: &Bed,
    athenz: &mut AthenzClient,
    call: ZtsCall,
) -> Reply {
    if let ZtsCall::Status { .. } = call {
        // neither harness asks for ZTS's status: an operator's probe, not a client's call
        return Reply {
            status: 0,
            message: String::new(),
            decoded: None,
            body: None,
        };
    }
    let ca = athenz.file(bed.zts.root_pem()).unwrap();
    let mut fields = json!({"url": bed.zts.url(), "ca": ca});
    let present = |athenz: &mut AthenzClient, fields: &mut Value, (cert, key): Identity| {
        fields["cert"] = athenz.file(&cert).unwrap().into();
        fields["key"] = athenz.file(&key).unwrap().into();
    };
    let op = match call {
        ZtsCall::Register(body) => {
            fields["body"] = body;
            "register"
        }
        ZtsCall::Refresh {
            identity,
            domain,
            uid,
            body,
        } => {
            if let Some(identity) = identity {
                present(athenz, &mut fields, identity);
            }
            fields["provider"] = PROVIDER.into();
            fields["domain"] = domain.into();
            fields["service"] = SERVICE.into();
            fields["instance_id"] = uid.into();
            fields["body"] = body;
            "refresh"
        }
        ZtsCall::KeyRefresh { ntoken, body } => {
            fields["domain"] = KEY_SERVICE.0.into();
            fields["service"] = KEY_SERVICE.1.into();
            fields["ntoken"] = ntoken.into();
            fields["body"] = body;
            "key_refresh"
        }
        ZtsCall::AccessToken {
            identity,
            content_type,
            form,
        } => {
            present(athenz, &mut fields, identity);
            fields["content_type"] = content_type.into();
            fields["form"] = form.into();
            "access_token"
        }
        ZtsCall::RoleToken {
            identity,
            domain,
            role,
        } => {
            present(athenz, &mut fields, identity);
            fields["domain"] = domain.into();
            fields["role"] = role.into();
            "role_token"
        }
        ZtsCall::RoleCert { identity, body } => {
            present(athenz, &mut fields, identity);
            fields["body"] = body;
            "role_cert"
        }
        ZtsCall::Jwks => "jwks",
        ZtsCall::Status { .. } => unreachable!("answered above"),
    };
    let answer = athenz.call(&request(op, fields)).await.unwrap();
    if let ClientAnswer::Answered {
        status, decoded, ..
    } = &answer
    {
        assert!(
            *status >= 300 || decoded.is_some(),
            "{op}: a {status} that {} did not decode",
            athenz.harness().name()
        );
    }
    let (status, message) = answer.status_and_message();
    let decoded = match answer {
        ClientAnswer::Answered { decoded, .. } => decoded,
        ClientAnswer::Unsendable(_) => None,
    };
    Reply {
        status,
        message,
        decoded,
        body: None,
    }
}
