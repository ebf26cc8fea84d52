//! The CSI Identity and Node gRPC services (docs/design.md §4.10) over a [`Driver`].

use crate::driver::Driver;
use crate::{DRIVER_NAME, Issuer};
use athenz_core::csi::v1::{
    self, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, ProbeRequest, ProbeResponse,
    node_service_capability,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Both services, sharing one driver.
pub struct CsiService<I: Issuer> {
    driver: Arc<Driver<I>>,
}

impl<I: Issuer> CsiService<I> {
    /// Services over `driver`.
    pub fn new(driver: Arc<Driver<I>>) -> Self {
        Self { driver }
    }
}

impl<I: Issuer> Clone for CsiService<I> {
    fn clone(&self) -> Self {
        Self {
            driver: Arc::clone(&self.driver),
        }
    }
}

#[tonic::async_trait]
impl<I: Issuer> v1::identity_server::Identity for CsiService<I> {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    /// No controller service: a node plugin only (`attachRequired: false`).
    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    /// Ready once the agent holds a valid node identity (it cannot issue before).
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.driver.ready()),
        }))
    }
}

fn rpc(kind: node_service_capability::rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    }
}

#[tonic::async_trait]
impl<I: Issuer> v1::node_server::Node for CsiService<I> {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let started = std::time::Instant::now();
        let result = self.driver.publish(&req).await;
        log_outcome(
            "publish",
            &req.volume_id,
            &req.target_path,
            started,
            &result,
        );
        result.map(|()| Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let started = std::time::Instant::now();
        let result = self
            .driver
            .unpublish(&req.volume_id, &req.target_path)
            .await;
        log_outcome(
            "unpublish",
            &req.volume_id,
            &req.target_path,
            started,
            &result,
        );
        result.map(|()| Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        self.driver
            .stats(&req.volume_id, &req.volume_path)
            .map(Response::new)
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Type::GetVolumeStats),
                rpc(Type::VolumeCondition),
                // kubelet then passes the pod's fsGroup as volume_mount_group, the group that
                // may read the key in files mode, instead of changing ownership itself
                rpc(Type::VolumeMountGroup),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.driver.node_id().to_owned(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

fn log_outcome(
    verb: &str,
    volume_id: &str,
    target: &str,
    started: std::time::Instant,
    result: &Result<(), Status>,
) {
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let target = athenz_core::names::Quoted::new(target);
    match result {
        Ok(()) => tracing::info!(verb, volume_id, %target, ms, "csi ok"),
        Err(s) => {
            tracing::info!(verb, volume_id, %target, ms, code = ?s.code(), reason = %s.message(), "csi refused")
        }
    }
}
