//! A route's refusal (status and ZTS's message) and the request readers that produce one:
//! below the handler and every route module, so they share it without importing each other.

use super::authz;
use super::x509_cert_request::check_parsable;
use athenz_core::crypto::CsrInfo;
use athenz_core::http::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};

/// What ZTS's authentication (`Http.authenticate` in `libs/java/server_common`) answers a request
/// to an authenticated route without credentials it accepts, before the route runs: 401.
pub const INVALID_CREDENTIALS: &str = "Invalid credentials";

/// A refusal: status and message.
#[derive(Debug)]
pub struct Refusal(pub StatusCode, pub String);

/// An authorization refusal keeps the status and message `authz` chose.
impl From<authz::AuthzRefusal> for Refusal {
    fn from(authz::AuthzRefusal(code, message): authz::AuthzRefusal) -> Self {
        Self(
            StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
            message,
        )
    }
}

impl Refusal {
    /// 400.
    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, msg.into())
    }
    /// 401.
    pub fn unauthorized(msg: impl Into<String>) -> Self {
        Self(StatusCode::UNAUTHORIZED, msg.into())
    }
    /// 403.
    pub fn forbidden(msg: impl Into<String>) -> Self {
        Self(StatusCode::FORBIDDEN, msg.into())
    }
    /// 404.
    pub fn not_found(msg: impl Into<String>) -> Self {
        Self(StatusCode::NOT_FOUND, msg.into())
    }
}

/// A route's answer.
pub type Outcome = Result<Response<Body>, Refusal>;

/// The request body as JSON `T`, or 400 naming the type.
pub fn parse_json<T: serde::de::DeserializeOwned>(
    req: &Request<Bytes>,
    what: &str,
) -> Result<T, Refusal> {
    serde_json::from_slice(req.body())
        .map_err(|e| Refusal::bad_request(format!("Invalid {what} object: {e}")))
}

/// A CSR ZTS can read, or 400 "unable to parse PKCS10 CSR".
pub fn parse_csr(pem: &str) -> Result<CsrInfo, Refusal> {
    // Athenz's Crypto.getPKCS10CertRequest: what is no PKCS#10 PEM is "Invalid csr provided"
    let csr = CsrInfo::from_pem(pem)
        .map_err(|_| Refusal::bad_request("unable to parse PKCS10 CSR: Invalid csr provided"))?;
    check_parsable(&csr)
        .map_err(|e| Refusal::bad_request(format!("unable to parse PKCS10 CSR: {}", e.0)))?;
    Ok(csr)
}

/// A decoded `application/x-www-form-urlencoded` body (`+` is a space). As `AccessTokenRequest`
/// does, a component without `=` or whose key or value does not decode is skipped.
pub fn parse_form(body: &[u8]) -> Result<Vec<(String, String)>, Refusal> {
    let text = std::str::from_utf8(body)
        .map_err(|_| Refusal::bad_request("the form is not UTF-8 text"))?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .ok()
            .map(|c| c.into_owned())
    };
    Ok(text
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(k, v)| Some((decode(k)?, decode(v)?)))
        .collect())
}
