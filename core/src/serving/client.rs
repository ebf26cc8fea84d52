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
pub async fn read_limited(resp: reqwest::Response, max: usize) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    read_limited_into(resp, max, &mut body).await?;
    Ok(body)
}

/// [`read_limited`] into `body`, which is cleared first and keeps its capacity: a caller that
/// reads megabyte bodies again and again (the agent's kubelet pod lists) reuses one buffer
/// instead of allocating and freeing megabytes each time, which left the allocator's heap
/// fragmented and the process's memory higher after every list. The buffer gives memory back
/// when a body is much smaller than it.
pub async fn read_limited_into(
    mut resp: reqwest::Response,
    max: usize,
    body: &mut Vec<u8>,
) -> Result<(), ReadError> {
    body.clear();
    // sized once from Content-Length when the server sent one (a pod list is megabytes: growing
    // the buffer chunk by chunk copied it over and over)
    let declared = resp.content_length().and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > max) {
        return Err(ReadError::TooLarge(max));
    }
    if let Some(declared) = declared {
        if body.capacity() > 4 * declared.max(64 * 1024) {
            body.shrink_to(declared);
        }
        body.reserve(declared);
    }
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
    Ok(())
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

    /// A loopback HTTP server answering every request with `body` (chunked when `chunked`).
    async fn serve(body: Vec<u8>, chunked: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    let head = if chunked {
                        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                            .to_owned()
                    } else {
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        )
                    };
                    let _ = conn.write_all(head.as_bytes()).await;
                    if chunked {
                        for part in body.chunks(1000) {
                            let _ = conn
                                .write_all(format!("{:x}\r\n", part.len()).as_bytes())
                                .await;
                            let _ = conn.write_all(part).await;
                            let _ = conn.write_all(b"\r\n").await;
                        }
                        let _ = conn.write_all(b"0\r\n\r\n").await;
                    } else {
                        let _ = conn.write_all(&body).await;
                    }
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn bodies_are_read_within_the_limit_into_a_reused_buffer() {
        let client = reqwest::Client::new();
        let get = |url: String| {
            let client = client.clone();
            async move { client.get(url).send().await.unwrap() }
        };
        let big = vec![b'x'; 1024 * 1024];
        let mut buffer = Vec::new();
        read_limited_into(
            get(serve(big.clone(), false).await).await,
            2 << 20,
            &mut buffer,
        )
        .await
        .unwrap();
        assert_eq!(buffer, big);
        let capacity = buffer.capacity();
        // a body of the same size again: the same allocation
        read_limited_into(
            get(serve(big.clone(), true).await).await,
            2 << 20,
            &mut buffer,
        )
        .await
        .unwrap();
        assert_eq!(buffer, big);
        assert_eq!(buffer.capacity(), capacity);
        // a much smaller one gives the memory back
        read_limited_into(
            get(serve(b"small".to_vec(), false).await).await,
            2 << 20,
            &mut buffer,
        )
        .await
        .unwrap();
        assert_eq!(buffer, b"small");
        assert!(buffer.capacity() < capacity / 4, "{}", buffer.capacity());

        // over the limit, declared or not
        for chunked in [false, true] {
            let err = read_limited_into(
                get(serve(big.clone(), chunked).await).await,
                1000,
                &mut buffer,
            )
            .await
            .unwrap_err();
            assert!(matches!(err, ReadError::TooLarge(1000)), "{err}");
        }
        assert_eq!(
            read_limited(get(serve(b"whole".to_vec(), true).await).await, 10)
                .await
                .unwrap(),
            b"whole"
        );
    }
}
