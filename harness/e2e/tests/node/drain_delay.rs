//! SIGTERM with a drain delay (`DRAIN_DELAY_SECONDS`, as the Deployments set it): a server goes
//! on accepting new connections and answering them for the delay, so connections routed to it
//! while its Service endpoint is being removed are served, then stops accepting. Runs in its own
//! test binary so the signal reaches only this process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::http::{
    Body, ConnInfo, Handler, Listener, Server, json_response, termination_signal_after,
};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The drain delay under test.
const DELAY: Duration = Duration::from_secs(2);

/// Answers at once.
struct Answers;

impl Handler for Answers {
    async fn handle(&self, _req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        json_response(StatusCode::OK, &"served")
    }
}

/// One request on a new connection: its answer, or the connection's error.
async fn ask(addr: std::net::SocketAddr) -> std::io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut answer))
        .await
        .map_err(std::io::Error::other)??;
    Ok(answer)
}

#[tokio::test]
async fn after_sigterm_new_connections_are_served_for_the_delay_then_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        Server::new(Listener::Tcp(listener), Arc::new(Answers))
            .serve(termination_signal_after(DELAY)),
    );
    // let the server install its signal handlers before the signal
    tokio::time::sleep(Duration::from_millis(100)).await;
    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    // a new connection well inside the delay is accepted and answered
    tokio::time::sleep(DELAY / 4).await;
    let answer = ask(addr).await.expect("refused inside the drain delay");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("\"served\""), "{answer}");
    assert!(
        signalled.elapsed() < DELAY,
        "the check came too late to mean anything"
    );

    // then the server stops, no sooner than the delay, and accepts nothing more
    tokio::time::timeout(DELAY * 3, server)
        .await
        .expect("server did not stop after the delay")
        .unwrap();
    assert!(signalled.elapsed() >= DELAY, "stopped before the delay");
    assert!(ask(addr).await.is_err(), "still accepting after the delay");
}
