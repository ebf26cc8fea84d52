//! A Kubernetes Service for the test bed: one address in front of a Deployment's replicas, as
//! kube-proxy gives ZTS and the agents one address per control-plane service. Each TCP
//! connection goes to the next replica that is not draining (round robin) and is spliced to it
//! byte for byte (TLS passes through untouched, so each replica still sees and checks its real
//! client). A replica being replaced is first marked draining, as an endpoint leaves a Service
//! when its pod starts terminating: new connections go elsewhere, open ones run to their end.

use anyhow::Context;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a connection to a replica may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One replica behind the Service.
#[derive(Debug, Clone)]
struct Endpoint {
    addr: SocketAddr,
    draining: bool,
}

/// The Service: its address and replicas. Dropping it stops accepting.
pub struct Forwarder {
    addr: SocketAddr,
    endpoints: Arc<Mutex<Vec<Endpoint>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    /// Listens on `listen` and forwards to `replicas`.
    pub async fn start(listen: SocketAddr, replicas: &[SocketAddr]) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the Service address {listen}"))?;
        let addr = listener.local_addr()?;
        let endpoints = Arc::new(Mutex::new(
            replicas
                .iter()
                .map(|&addr| Endpoint {
                    addr,
                    draining: false,
                })
                .collect::<Vec<_>>(),
        ));
        let next = Arc::new(AtomicUsize::new(0));
        let table = endpoints.clone();
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let Some(backend) = pick(&table, &next) else {
                    drop(client); // no ready replica: the connection is refused by closing it
                    continue;
                };
                tokio::spawn(splice(client, backend));
            }
        });
        Ok(Self {
            addr,
            endpoints,
            accepting,
        })
    }

    /// The Service's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Marks the replica at `replica` draining (no new connections) or ready again.
    pub fn set_draining(&self, replica: SocketAddr, draining: bool) {
        let mut endpoints = self
            .endpoints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for endpoint in endpoints.iter_mut().filter(|e| e.addr == replica) {
            endpoint.draining = draining;
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// The next replica not draining, round robin.
fn pick(table: &Mutex<Vec<Endpoint>>, next: &AtomicUsize) -> Option<SocketAddr> {
    let endpoints = table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ready: Vec<SocketAddr> = endpoints
        .iter()
        .filter(|e| !e.draining)
        .map(|e| e.addr)
        .collect();
    (!ready.is_empty()).then(|| ready[next.fetch_add(1, Ordering::Relaxed) % ready.len()])
}

/// Copies bytes both ways until either side closes.
async fn splice(mut client: tokio::net::TcpStream, backend: SocketAddr) {
    let Ok(Ok(mut upstream)) =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(backend)).await
    else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A replica that answers every connection with its own name.
    async fn replica(name: &'static str) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let _ = conn.write_all(name.as_bytes()).await;
            }
        });
        addr
    }

    async fn ask(addr: SocketAddr) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn connections_alternate_and_skip_a_draining_replica() {
        let (a, b) = (replica("a").await, replica("b").await);
        let service = Forwarder::start("127.0.0.1:0".parse().unwrap(), &[a, b])
            .await
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(ask(service.addr()).await);
        }
        seen.sort();
        assert_eq!(seen, ["a", "a", "b", "b"]);
        service.set_draining(a, true);
        for _ in 0..3 {
            assert_eq!(ask(service.addr()).await, "b");
        }
        service.set_draining(b, true);
        // no ready replica: the connection is closed at once, with nothing said
        assert_eq!(ask(service.addr()).await, "");
        service.set_draining(a, false);
        assert_eq!(ask(service.addr()).await, "a");
    }
}
