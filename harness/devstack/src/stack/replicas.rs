//! Control-plane Deployments with more than one replica (`StackOptions::control_plane_replicas`):
//! each replica of the jwt-service and the callback on its own ports, behind one Service
//! address ([`crate::forwarder`]) that ZTS and the agents are given, and rolled one replica at
//! a time as a Deployment's rolling update does.

use super::launch::run_daemon;
use crate::forwarder::Forwarder;
use crate::procs::{Process, Stopped, free_port};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// One replica of a Deployment.
#[derive(Debug, Clone)]
pub struct Replica {
    /// Its process's name in the stack.
    pub process: String,
    /// Where it listens (behind the Service).
    pub addr: SocketAddr,
    /// Its readiness URL.
    pub ready_url: String,
}

/// A Deployment's replicas and the Service in front of them.
pub struct Deployment {
    /// `jwt-service` or `callback`.
    pub name: &'static str,
    /// Its Service.
    pub service: Forwarder,
    /// Its replicas.
    pub replicas: Vec<Replica>,
}

/// The process name of replica `r` (0-based) of `deployment`: the first keeps the plain name,
/// so faults and reports that name the component reach it.
pub fn replica_name(deployment: &str, r: usize) -> String {
    if r == 0 {
        deployment.to_owned()
    } else {
        format!("{deployment}-{}", r + 1)
    }
}

/// Ports (listen, ops) for `count` replicas: with one, the Service's own `port` and `ops` (no
/// Service in between, as the stack always ran); with more, new ones.
fn replica_ports(count: usize, port: u16, ops: u16) -> anyhow::Result<Vec<(u16, u16)>> {
    if count <= 1 {
        return Ok(vec![(port, ops)]);
    }
    (0..count)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect()
}

/// How to start one Deployment of the control plane.
pub struct ReplicaSet {
    /// Its name, and its first replica's process name.
    pub deployment: &'static str,
    /// The binary in the stack's bin directory.
    pub binary: &'static str,
    /// Replicas.
    pub count: usize,
    /// The address ZTS or the agents are given (the only replica's own, or the Service's).
    pub service_port: u16,
    /// The only replica's ops port (more replicas get their own).
    pub ops_port: u16,
}

impl ReplicaSet {
    /// Starts every replica (its arguments from `args(port, ops)`), each ready before the next,
    /// into `processes`; with more than one, the Service in front of them.
    pub async fn start(
        &self,
        bin: &Path,
        logs: &Path,
        processes: &mut Vec<Process>,
        args: impl Fn(u16, u16) -> Vec<String>,
    ) -> anyhow::Result<Option<Deployment>> {
        let mut replicas = Vec::new();
        for (r, (port, ops)) in replica_ports(self.count, self.service_port, self.ops_port)?
            .into_iter()
            .enumerate()
        {
            let name = replica_name(self.deployment, r);
            processes.push(run_daemon(bin, &name, self.binary, args(port, ops), ops, logs).await?);
            replicas.push(Replica {
                process: name,
                addr: ([127, 0, 0, 1], port).into(),
                ready_url: format!("http://127.0.0.1:{ops}/readyz"),
            });
        }
        if replicas.len() < 2 {
            return Ok(None);
        }
        let service = Forwarder::start(
            ([127, 0, 0, 1], self.service_port).into(),
            &replicas.iter().map(|r| r.addr).collect::<Vec<_>>(),
        )
        .await?;
        Ok(Some(Deployment {
            name: self.deployment,
            service,
            replicas,
        }))
    }
}

/// What rolling one replica did.
#[derive(Debug, Clone)]
pub struct Rolled {
    /// The replica's process.
    pub process: String,
    /// How the old one ended.
    pub stopped: Stopped,
}

impl super::Stack {
    /// Rolls `deployment` one replica at a time, as a Deployment's rolling update with
    /// `maxUnavailable: 1` does: the replica leaves the Service (no new connections), is
    /// replaced ([`super::Stack::replace`]: SIGTERM, its drain within `grace`, the same build
    /// started again), rejoins once ready, and the next waits `pause` (`minReadySeconds`).
    pub async fn roll(
        &mut self,
        deployment: &str,
        grace: Duration,
        pause: Duration,
    ) -> anyhow::Result<Vec<Rolled>> {
        let replicas = self
            .deployments
            .iter()
            .find(|d| d.name == deployment)
            .map(|d| d.replicas.clone())
            .ok_or_else(|| {
                anyhow::anyhow!("{deployment} runs one replica: start the stack with more")
            })?;
        let mut rolled = Vec::new();
        for replica in replicas {
            self.set_draining(deployment, replica.addr, true);
            let replaced = self
                .replace(&replica.process, None, grace, &replica.ready_url)
                .await;
            self.set_draining(deployment, replica.addr, false);
            rolled.push(Rolled {
                process: replica.process.clone(),
                stopped: replaced?,
            });
            tokio::time::sleep(pause).await;
        }
        Ok(rolled)
    }

    fn set_draining(&self, deployment: &str, replica: SocketAddr, draining: bool) {
        for d in self.deployments.iter().filter(|d| d.name == deployment) {
            d.service.set_draining(replica, draining);
        }
    }
}
