//! gRPC clients over Unix sockets, as kubelet dials a CSI driver and Envoy an SDS server.

use hyper_util::rt::TokioIo;
use std::path::Path;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// A new HTTP/2 connection to the gRPC server on `socket`; `timeout` bounds each call (leave it
/// unset for long-lived streams, and bound the waits instead).
pub async fn dial_unix(
    socket: &Path,
    timeout: Option<Duration>,
) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_owned();
    // the URI is required by tonic and ignored: the connector dials the socket
    let mut endpoint = Endpoint::from_static("http://unix.sock");
    if let Some(timeout) = timeout {
        endpoint = endpoint.timeout(timeout);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}
