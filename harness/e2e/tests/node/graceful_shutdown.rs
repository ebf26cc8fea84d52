//! SIGTERM drains a server built with athenz-core's HTTP layer: the request in flight when the
//! signal arrives is answered, then the server stops accepting. Runs in its own test binary so the
//! signal reaches only this process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::http::{
    Body, ConnInfo, Handler, Listener, Server, json_response, termination_signal,
};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Takes 500 ms to answer.
struct Slow;

impl Handler for Slow {
    async fn handle(&self, _req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        json_response(StatusCode::OK, &"done")
    }
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        Server::new(Listener::Tcp(listener), Arc::new(Slow)).serve(termination_signal()),
    );
    // let the server install its signal handlers before anything is sent
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // a real SIGTERM from a real `kill`
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "in-flight request dropped: {answer}"
    );
    assert!(answer.ends_with("\"done\""), "{answer}");

    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server did not stop after draining")
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still accepting"
    );
}
