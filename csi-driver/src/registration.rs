//! kubelet's plugin registration, done by the driver itself: the job csi-node-driver-registrar
//! does for most CSI drivers. kubelet watches its `plugins_registry` directory; for a socket
//! there serving `pluginregistration.Registration` it asks `GetInfo` (a CSI plugin, its name,
//! the CSI socket's path as kubelet dials it on the host, the CSI versions), checks the plugin
//! (`NodeGetInfo` on that socket) and reports the outcome with `NotifyRegistrationStatus`.
//!
//! Why not the registrar sidecar: the whole exchange is two calls, and the registrar is another
//! image on every node (pulled, patched and scanned) for them; the agent already serves gRPC on a
//! Unix socket. The socket is `<dir>/csi.athenz.io-reg.sock`, the registrar's naming, so a node
//! moving from the sidecar to this keeps one registration.

use crate::DRIVER_NAME;
use athenz_core::csi::pluginregistration::{
    self as api, CSI_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus,
    RegistrationStatusResponse, registration_server::RegistrationServer,
};
use athenz_core::unix_socket::{self, Access, BindError, Limits};
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::path::{Path, PathBuf};
use tonic::codegen::Service;
use tonic::{Request, Response, Status};

/// CSI versions offered to kubelet (it takes the highest it supports; 1.x is all there is).
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];
/// Largest message accepted (kubelet's are a few dozen bytes).
const MAX_MESSAGE: usize = 16 * 1024;

/// The registration socket's path for `driver` in kubelet's `plugins_registry` directory `dir`.
pub fn socket_in(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// What kubelet is told, and what it answered.
#[derive(Clone, Debug)]
pub struct PluginRegistration {
    /// The CSI driver's name (ours is [`DRIVER_NAME`]; the devstack's bench registers the
    /// SPIFFE CSI driver with this too).
    driver: String,
    /// The CSI socket's path on the host, as kubelet dials it (not as this container sees it).
    kubelet_endpoint: String,
    /// 1 once kubelet reported the plugin registered, 0 after it reported a failure, -1 before
    /// it said anything.
    registered: Gauge,
}

impl PluginRegistration {
    /// Registration of our driver's CSI socket kubelet reaches at `kubelet_endpoint`;
    /// `registered` is the gauge that follows kubelet's verdict (starts at -1: not told yet).
    pub fn new(kubelet_endpoint: String, registered: Gauge) -> Self {
        Self::of_driver(DRIVER_NAME.to_owned(), kubelet_endpoint, registered)
    }

    /// The same for another CSI driver, named `driver`.
    pub fn of_driver(driver: String, kubelet_endpoint: String, registered: Gauge) -> Self {
        registered.set(-1);
        Self {
            driver,
            kubelet_endpoint,
            registered,
        }
    }
}

#[tonic::async_trait]
impl api::registration_server::Registration for PluginRegistration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN.to_owned(),
            name: self.driver.clone(),
            endpoint: self.kubelet_endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            self.registered.set(1);
            tracing::info!(endpoint = %self.kubelet_endpoint, "kubelet registered the CSI driver");
        } else {
            // kubelet tries again when the socket is made anew (an agent restart), as it does
            // for the registrar, which exits on this
            self.registered.set(0);
            tracing::error!(endpoint = %self.kubelet_endpoint, error = %status.error, "kubelet refused to register the CSI driver");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds `driver`'s registration socket in `dir` (kubelet's `plugins_registry`; 0660, a stale
/// one replaced).
pub fn bind(dir: &Path, driver: &str) -> Result<tokio::net::UnixListener, BindError> {
    unix_socket::bind(
        &socket_in(dir, driver),
        Access {
            mode: 0o660,
            gid: None,
        },
    )
}

/// Serves `registration` on `listener` until `stop` completes.
pub async fn serve(
    listener: tokio::net::UnixListener,
    registration: PluginRegistration,
    stop: impl Future<Output = ()>,
) {
    let server = RegistrationServer::new(registration).max_decoding_message_size(MAX_MESSAGE);
    let route = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let mut server = server.clone();
        async move {
            let path = req.uri().path();
            if path.starts_with("/pluginregistration.Registration/") {
                server.call(req).await
            } else {
                Ok(tonic::Status::unimplemented(format!(
                    "this socket serves pluginregistration.Registration only (asked {path})"
                ))
                .into_http())
            }
        }
    });
    let limits = Limits {
        connections: 8,
        streams_per_connection: 8,
        grace: std::time::Duration::from_secs(2),
        name: "CSI registration",
    };
    // a real kubelet's registration client sends the socket's path as :authority
    unix_socket::serve_http2_normalizing_authority(listener, route, limits, stop).await;
}
