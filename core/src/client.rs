//! Helpers for outgoing HTTP calls made with reqwest (ZTS, providers, the jwt-service).

use thiserror::Error;

/// Why a response body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReadError {
    /// The body is larger than allowed.
    #[error("response is larger than {0} bytes")]
    TooLarge(usize),
    /// The connection failed while reading.
    #[error("reading the response: {0}")]
    Transport(String),
}

/// Reads a whole response body, refusing more than `max` bytes (never trusting Content-Length).
pub async fn read_limited(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, ReadError> {
    // sized once from Content-Length when the server sent one (a pod list is megabytes: growing
    // the buffer chunk by chunk copied it over and over)
    let declared = resp
        .content_length()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    if declared > max {
        return Err(ReadError::TooLarge(max));
    }
    let mut body = Vec::with_capacity(declared);
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ReadError::Transport(error_chain(&e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(ReadError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error and every cause under it, outermost first. `io::Error::source` skips the error an
/// `io::Error` wraps (it answers that error's own source), so the wrapped one is visited too:
/// that is where a TLS alert or a connect failure sits under reqwest and hyper.
pub fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| {
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => e.source(),
        }
    })
}

/// An error and its causes on one line; reqwest's top-level message alone ("error sending
/// request") does not say what failed.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_look_inside_io_errors() {
        #[derive(Debug, Error)]
        #[error("wrapped")]
        struct Wrapped;
        let io = std::io::Error::new(std::io::ErrorKind::InvalidInput, Wrapped);
        let found: Vec<String> = causes(&io).map(ToString::to_string).collect();
        assert_eq!(found, ["wrapped", "wrapped"]);
        assert!(causes(&io).any(|c| c.downcast_ref::<Wrapped>().is_some()));
    }

    #[derive(Debug, Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_includes_causes() {
        let e = Outer(std::io::Error::other("inner cause"));
        assert_eq!(error_chain(&e), "outer: inner cause");
    }
}
