//! How a socket call fails: the status and message the pod is told, and how ZTS's answers map
//! onto them. Below every module that answers a call, so none of them needs the others' types.

use athenz_core::http::{Body, error_response, unavailable_response};
use athenz_core::zts::ZtsError;
use http::{Response, StatusCode};
use std::time::Duration;

/// How long a client is told to wait before retrying a transient failure.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// A failed call: status and message.
#[derive(Debug)]
pub struct Failure {
    /// The HTTP status the socket API answers with.
    pub status: StatusCode,
    pub message: String,
}

pub(crate) fn fail(status: StatusCode, message: impl Into<String>) -> Failure {
    Failure {
        status,
        message: message.into(),
    }
}

impl Failure {
    pub(crate) fn into_response(self) -> Response<Body> {
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            unavailable_response(self.message, RETRY_AFTER)
        } else {
            error_response(self.status, self.message)
        }
    }
}

/// What a pod is told when ZTS did not issue: a refusal (any 4xx but 429, or a client
/// certificate refused in the handshake) is 403, final; only unavailability (no answer, 429,
/// 5xx) is 503, "try again"; an answer that is not ZTS's API is 502.
pub(crate) fn zts_failure(e: ZtsError) -> Failure {
    match &e {
        _ if e.is_transient() => fail(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        ZtsError::Rejected { status, .. } if (400..500).contains(status) => {
            fail(StatusCode::FORBIDDEN, e.to_string())
        }
        ZtsError::CertificateRefused(_) => fail(StatusCode::FORBIDDEN, e.to_string()),
        _ => fail(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(status: u16) -> ZtsError {
        ZtsError::Rejected {
            status,
            code: i32::from(status),
            message: format!("ZTS says {status}: pod_exists: no such pod"),
        }
    }

    /// ZTS's own codes, as Athenz answers them: a provider's 504 or no answer is 504 and,
    /// with overload (503, 429) and server errors (500, 502), means "try again"; every other
    /// answer is a verdict the pod must see with ZTS's message (which names the check).
    #[test]
    fn zts_answers_are_sorted_into_try_again_and_final() {
        for status in [429, 500, 502, 503, 504] {
            let failure = zts_failure(rejected(status));
            assert_eq!(failure.status, StatusCode::SERVICE_UNAVAILABLE, "{status}");
        }
        let unreachable = zts_failure(ZtsError::Unreachable("connection refused".into()));
        assert_eq!(unreachable.status, StatusCode::SERVICE_UNAVAILABLE);
        for status in [400, 401, 403, 404] {
            let failure = zts_failure(rejected(status));
            assert_eq!(failure.status, StatusCode::FORBIDDEN, "{status}");
            assert!(
                failure.message.contains("pod_exists"),
                "{}",
                failure.message
            );
        }
        let refused = zts_failure(ZtsError::CertificateRefused("bad certificate".into()));
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
    }
}
