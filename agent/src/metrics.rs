//! The agent's own metrics (request counts and latencies come from the HTTP layer).

/// Labels of the upstream latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UpstreamLabels {
    /// `kubelet`, `dns`, `jwt_service`, `zts_register` or `zts_refresh`.
    pub upstream: &'static str,
}

/// The agent's own metrics (request counts and latencies come from the HTTP layer).
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    upstream: prometheus_client::metrics::family::Family<
        UpstreamLabels,
        prometheus_client::metrics::histogram::Histogram,
    >,
    pub(crate) cached_pods: prometheus_client::metrics::gauge::Gauge,
    pub(crate) cert_expiry: prometheus_client::metrics::gauge::Gauge,
    pub(crate) peer_checks: prometheus_client::metrics::family::Family<
        PeerCheckLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    keys_taken: prometheus_client::metrics::family::Family<
        KeySourceLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    key_pool_ready: prometheus_client::metrics::gauge::Gauge,
    issued: prometheus_client::metrics::family::Family<
        IssuedLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    key_source: prometheus_client::metrics::family::Family<
        KeySourceSettingLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    tunnels: prometheus_client::metrics::family::Family<
        TunnelLabels,
        prometheus_client::metrics::counter::Counter,
    >,
}

/// Labels of the identities-issued counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct IssuedLabels {
    /// `init`, `refresh` (through the agent), `attestation` (a pod refreshing with ZTS itself),
    /// `csi_publish` or `csi_rotation`.
    pub verb: &'static str,
    /// Where the key was made: `pod` or `agent`.
    pub key_source: &'static str,
}

/// Labels of the key-source setting gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KeySourceSettingLabels {
    /// The agent's `--key-source` for socket volumes.
    pub key_source: &'static str,
}

/// Labels of the tunnel counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct TunnelLabels {
    /// `opened`, `refused` or `unreachable` (ZTS did not accept the connection).
    pub outcome: &'static str,
}

/// Labels of the pod-key counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KeySourceLabels {
    /// `pool` (made ahead) or `on_path` (made while the pod waited).
    pub source: &'static str,
}

/// Labels of the peer-check counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PeerCheckLabels {
    /// `match`, `mismatch` (another pod or none) or `unknown` (the caller could not be identified).
    pub outcome: &'static str,
    /// `enforce` or `log`.
    pub mode: &'static str,
}

impl AgentMetrics {
    /// Registers the metrics.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self {
            upstream: prometheus_client::metrics::family::Family::new_with_constructor(|| {
                prometheus_client::metrics::histogram::Histogram::new([
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ])
            }),
            cached_pods: Default::default(),
            cert_expiry: Default::default(),
            peer_checks: Default::default(),
            keys_taken: Default::default(),
            key_pool_ready: Default::default(),
            issued: Default::default(),
            key_source: Default::default(),
            tunnels: Default::default(),
        };
        registry.register(
            "identities_issued",
            "Pod identities issued, by call and by where the key was made",
            m.issued.clone(),
        );
        registry.register(
            "key_source",
            "Where socket-mode pods' keys are made (the --key-source setting): 1 for the value in force",
            m.key_source.clone(),
        );
        registry.register(
            "zts_tunnels",
            "CONNECT tunnels to ZTS asked for by pods, by outcome",
            m.tunnels.clone(),
        );
        registry.register(
            "pod_keys",
            "Pod keys handed out, by where they were made",
            m.keys_taken.clone(),
        );
        registry.register(
            "key_pool_ready",
            "RSA keys made ahead and ready",
            m.key_pool_ready.clone(),
        );
        registry.register(
            "peer_checks",
            "Callers on the socket checked against their volume's pod, by outcome",
            m.peer_checks.clone(),
        );
        registry.register(
            "upstream_duration_seconds",
            "Upstream call latency",
            m.upstream.clone(),
        );
        registry.register(
            "kubelet_cached_pods",
            "Pods in the cached kubelet list",
            m.cached_pods.clone(),
        );
        registry.register(
            "last_certificate_expiry_seconds",
            "Expiry (Unix time) of the last certificate issued",
            m.cert_expiry.clone(),
        );
        m
    }

    /// Shows the `--key-source` in force.
    pub fn set_key_source(&self, source: athenz_core::agent_api::KeySource) {
        self.key_source
            .get_or_create(&KeySourceSettingLabels {
                key_source: source.as_str(),
            })
            .set(1);
    }

    /// Counts an identity issued.
    pub(crate) fn issued(&self, verb: &'static str, source: athenz_core::agent_api::KeySource) {
        self.issued
            .get_or_create(&IssuedLabels {
                verb,
                key_source: source.as_str(),
            })
            .inc();
    }

    /// Counts a tunnel asked for.
    pub(crate) fn tunnel(&self, outcome: &'static str) {
        self.tunnels.get_or_create(&TunnelLabels { outcome }).inc();
    }

    pub(crate) fn key_taken(&self, source: crate::key_pool::KeySource, ready: usize) {
        self.keys_taken
            .get_or_create(&KeySourceLabels {
                source: source.label(),
            })
            .inc();
        self.key_pool_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    pub(crate) fn observe(&self, upstream: &'static str, started: std::time::Instant) {
        self.upstream
            .get_or_create(&UpstreamLabels { upstream })
            .observe(started.elapsed().as_secs_f64());
    }
}
