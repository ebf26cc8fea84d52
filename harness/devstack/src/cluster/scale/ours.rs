//! Our parts on the scaled cluster, started and stopped as one: the initializer in the pods'
//! path ([`super::webhook`]), the callback with ZTS's way to it ([`super::callback`]), the
//! jwt-service ([`super::jwt`]), and every node's agent watch ([`super::agents`]). Each point measures the control plane once with them
//! stopped and once with them running, in the same run (docs/benchmarks.md, "A cluster at
//! Kubernetes' limits").

use super::jwt::{JwtService, RunTrust};
use super::{agents, callback, webhook};
use crate::procs::Process;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The callback's binary in the release.
const CALLBACK: &str = "athenz-callback";

/// What starting our parts needs, fixed for the run.
pub struct Setup {
    pub release_bin: PathBuf,
    pub dir: PathBuf,
    pub logs: PathBuf,
    pub initializer_kubeconfig: PathBuf,
    pub callback_kubeconfig: PathBuf,
    pub agents_kubeconfig: PathBuf,
    /// Where the API server reaches the initializer (this host's address, a port of its own).
    pub webhook_at: (Ipv4Addr, u16),
    /// The initializer's template and settings, as deploy/ ships them.
    pub webhook_config: (String, Vec<(String, String)>),
    /// The run's CA and JWT key (the callback's and the jwt-service's).
    pub trust: Arc<RunTrust>,
}

impl Setup {
    /// The release's binary `name`, which must be there.
    fn binary(&self, name: &str) -> anyhow::Result<PathBuf> {
        let binary = self.release_bin.join(name);
        anyhow::ensure!(
            binary.is_file(),
            "no {name} at {} (deploy/image.sh writes the release's binaries into target/image/bin)",
            binary.display()
        );
        Ok(binary)
    }
}

/// Our parts, running until [`Ours::stop`] (or dropped: every process is killed).
pub struct Ours {
    pub initializer: webhook::Initializer,
    pub callback_process: Process,
    /// The callback's ops address (`/metrics`).
    pub callback_ops: String,
    /// ZTS's way to the callback.
    pub callback: Arc<callback::Callback>,
    pub jwt_process: Process,
    /// The agents' way to the jwt-service.
    pub jwt: Arc<JwtService>,
    pub agents: agents::SimulatedAgents,
    /// How long the agents took to start their watches (then, with the wait, until every
    /// watch was open).
    pub agents_started_seconds: f64,
}

impl Ours {
    /// Starts the initializer, then the callback (as shipped: its cache of pending pods) and
    /// the jwt-service, then one agent watch for each of `agents`.
    pub async fn start(setup: &Setup, agents: &[agents::AgentPod]) -> anyhow::Result<Self> {
        let initializer = webhook::start(
            &setup.binary("athenz-initializer")?,
            &setup.initializer_kubeconfig,
            setup.webhook_at,
            &setup.webhook_config,
            &setup.dir,
            &setup.logs,
        )
        .await?;
        let (callback_process, callback_ops, callback) = callback::Callback::start(
            (CALLBACK, &setup.binary(CALLBACK)?),
            &setup.callback_kubeconfig,
            &[],
            (&setup.trust, &setup.dir),
            &setup.logs,
        )
        .await?;
        let (jwt_process, jwt) = JwtService::start(
            &setup.binary("athenz-jwt-service")?,
            Arc::clone(&setup.trust),
            &setup.dir,
            &setup.logs,
        )
        .await?;
        let started = Instant::now();
        let agents = agents::SimulatedAgents::start(&setup.agents_kubeconfig, agents).await?;
        Ok(Self {
            initializer,
            callback_process,
            callback_ops,
            callback: Arc::new(callback),
            jwt_process,
            jwt: Arc::new(jwt),
            agents,
            agents_started_seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The processes of ours whose cost is measured.
    pub fn processes(&self) -> [&Process; 3] {
        [
            &self.initializer.process,
            &self.callback_process,
            &self.jwt_process,
        ]
    }

    /// Stops every part: the agents' watches end, the processes are asked to stop.
    pub async fn stop(mut self) {
        drop(self.agents);
        self.jwt_process.stop().await;
        self.callback_process.stop().await;
        self.initializer.process.stop().await;
    }
}

/// A second callback whose cache holds every injected pod, not just the pending ones: what one
/// replica's memory would be with the cache full, and what its first list (a relist's cost)
/// takes. Started with `--pod-cache-fields=` (no field selector).
pub async fn start_full_cache(
    setup: &Setup,
) -> anyhow::Result<(Process, String, callback::Callback)> {
    let dir: &Path = &setup.dir.join("full-cache");
    std::fs::create_dir_all(dir)?;
    callback::Callback::start(
        (
            "athenz-callback-full-cache",
            &setup.release_bin.join(CALLBACK),
        ),
        &setup.callback_kubeconfig,
        &["--pod-cache-fields=".to_owned()],
        (&setup.trust, dir),
        &setup.logs,
    )
    .await
}
