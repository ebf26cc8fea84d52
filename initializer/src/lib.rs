//! `athenz-initializer`: the mutating admission webhook (docs/design.md §4.7) that adds the
//! identity volume, the credentials volume and the SIA containers to pods as they are created. It
//! sits on the pod-creation path of the whole cluster, so it never patches a pod that did not ask
//! for it, and injecting twice changes nothing.
//!
//! [`node_authorizer`] is the API server's other webhook, run as its own daemon
//! (`athenz-node-authorizer`): the authorization webhook that scopes the agents' pod watch to
//! their node (docs/design.md §6).

pub mod live_template;
pub mod mutate;
pub mod node_authorizer;
pub mod review;
pub mod serving_ca;
pub mod template;

use athenz_core::daemon::{OpsArgs, Shutdown, StartError};
use athenz_core::http::{
    Body, ConnInfo, Handler, HttpMetrics, Listener, Readiness, Server, ServerLimits,
    error_response, json_response,
};
use athenz_core::tls::{self, InMemoryIdentity, PrincipalAllowList, ReloadingIdentity};
use bytes::Bytes;
use clap::Parser;
use http::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Largest review accepted: a pod object may be ~1.5 MiB in etcd; reviews above 2 MiB are refused.
pub const MAX_REVIEW: usize = 2 * 1024 * 1024;

/// Command line of `athenz-initializer`; every flag has an environment fallback.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "athenz-initializer",
    version,
    about = "Admission webhook adding Athenz identity to pods"
)]
pub struct Config {
    /// Address of the webhook (HTTPS).
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Server certificate (PEM), reloaded when it changes: from control SIA, cert-manager or
    /// another issuer. Set this with --tls-key, or --serving-ca-secret instead.
    #[arg(long, env = "TLS_CERT_FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Server key (PEM).
    #[arg(long, env = "TLS_KEY_FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve a certificate from the initializer's own CA, kept in this Secret (NAME in the
    /// pod's own namespace, or NAMESPACE/NAME; created empty by the install) and put in
    /// --webhook-configuration's caBundle: admission then never needs ZTS. Instead of
    /// --tls-cert/--tls-key.
    #[arg(long, env = "SERVING_CA_SECRET", conflicts_with_all = ["tls_cert", "tls_key"], requires_all = ["webhook_configuration", "serving_dns_names"])]
    pub serving_ca_secret: Option<String>,
    /// The MutatingWebhookConfiguration whose caBundle follows the CA (--serving-ca-secret).
    #[arg(long, env = "WEBHOOK_CONFIGURATION", requires = "serving_ca_secret")]
    pub webhook_configuration: Option<String>,
    /// DNS names of the serving certificate (--serving-ca-secret): the webhook Service's,
    /// as the webhook configuration calls it (`<service>.<namespace>.svc`), comma-separated.
    #[arg(
        long,
        env = "SERVING_DNS_NAMES",
        value_delimiter = ',',
        requires = "serving_ca_secret"
    )]
    pub serving_dns_names: Vec<String>,
    /// CA of the client certificate the API server presents. The API server presents one only when
    /// its AdmissionConfiguration gives it a kubeconfig for this webhook; set this (with
    /// --allowed-principals) when it does, and the webhook then refuses every other caller.
    #[arg(long, env = "CLIENT_CA_FILE")]
    pub client_ca: Option<PathBuf>,
    /// Client principals allowed when --client-ca is set, comma-separated.
    #[arg(long, env = "ALLOWED_PRINCIPALS", value_delimiter = ',')]
    pub allowed_principals: Vec<String>,
    /// The injection template (YAML), read again when it changes (every
    /// --tls-reload-interval); a template that does not validate is not used.
    #[arg(long, env = "TEMPLATE_FILE")]
    pub template: PathBuf,
    /// The image holding `athenz-sia`, for templates that name none (the install's: the
    /// `athenz-cluster` ConfigMap's SIA_IMAGE, which kustomize's image override and the chart's
    /// `image` values set).
    #[arg(long, env = "SIA_IMAGE")]
    pub sia_image: Option<String>,
    /// ZTS's base URL, given to the SIA (role certificates, tokens) unless the template's `env`
    /// sets ZTS_URL (the install's: the `athenz-cluster` ConfigMap's ZTS_URL).
    #[arg(long, env = "ZTS_URL")]
    pub zts_url: Option<String>,
    /// Namespaces never injected, comma-separated.
    #[arg(
        long,
        env = "SKIP_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-public,kube-node-lease,athenz-system,k8s-admin"
    )]
    pub skip_namespaces: Vec<String>,
    /// How often the certificate files are checked for changes.
    #[arg(long, env = "TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = athenz_core::refresh::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Operations endpoint and logging.
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// Labels of the review counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// `injected`, `refused`, `malformed` or the skip reason.
    pub outcome: &'static str,
}

/// The webhook handler.
pub struct WebhookHandler {
    /// What to inject (followed as its file changes).
    pub template: Arc<live_template::LiveTemplate>,
    /// Namespaces left alone.
    pub skip_namespaces: BTreeSet<String>,
    /// Who may call, when client certificates are required.
    pub allowed: Option<PrincipalAllowList>,
    /// Reviews by outcome.
    pub reviews: Family<ReviewLabels, Counter>,
}

impl Handler for WebhookHandler {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        if req.uri().path() != "/mutate" {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        }
        if req.method() != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        }
        if let Some(allowed) = &self.allowed {
            let principal = conn.principal.as_deref().unwrap_or("");
            if !allowed.allows(principal) {
                tracing::warn!(%principal, "refused a caller that is not allowed");
                return error_response(
                    StatusCode::FORBIDDEN,
                    format!("principal {principal:?} may not call"),
                );
            }
        }
        let template = self.template.get();
        match review::review(&template, &self.skip_namespaces, req.body()) {
            Ok((answer, outcome)) => {
                self.reviews
                    .get_or_create(&ReviewLabels {
                        outcome: outcome.label(),
                    })
                    .inc();
                json_response(StatusCode::OK, &answer)
            }
            Err(bad) => {
                self.reviews
                    .get_or_create(&ReviewLabels {
                        outcome: "malformed",
                    })
                    .inc();
                error_response(StatusCode::BAD_REQUEST, bad.to_string())
            }
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        if req.uri.path() == "/mutate" {
            "mutate"
        } else {
            "other"
        }
    }
}

pub use athenz_core::daemon::Bound;

/// Starts the webhook; it runs until `shutdown` is triggered.
pub async fn start(
    config: Config,
    shutdown: Shutdown,
) -> Result<(Bound, tokio::task::JoinHandle<()>), StartError> {
    let install = template::InstallSettings {
        sia_image: config.sia_image.clone().filter(|i| !i.is_empty()),
        zts_url: config.zts_url.clone().filter(|u| !u.is_empty()),
    };
    let template = Arc::new(
        live_template::LiveTemplate::load(&config.template, install)
            .map_err(|e| StartError::new("--template (TEMPLATE_FILE)", e))?,
    );
    let mut registry = prometheus_client::registry::Registry::with_prefix("athenz_initializer");
    let mut background = vec![Arc::clone(&template).spawn_watcher(config.tls_reload_interval)];
    let identity: Arc<dyn rustls::server::ResolvesServerCert> =
        match serving_identity(&config, &mut registry).await? {
            ServingIdentity::Files(files) => {
                background.push(files.clone().spawn_watcher(config.tls_reload_interval));
                files
            }
            ServingIdentity::OwnCa(memory, keeper) => {
                background.push(keeper);
                memory
            }
        };
    let (server_config, allowed) = match &config.client_ca {
        Some(ca) => {
            let cas = tls::read_certs_file(ca)
                .map_err(|e| StartError::new("--client-ca (CLIENT_CA_FILE)", e))?;
            let allowed = PrincipalAllowList::new(&config.allowed_principals)
                .map_err(|e| StartError::new("--allowed-principals (ALLOWED_PRINCIPALS)", e))?;
            if allowed.is_empty() {
                return Err(StartError::new(
                    "--allowed-principals (ALLOWED_PRINCIPALS)",
                    "required with --client-ca",
                ));
            }
            (
                tls::server_config(identity.clone(), &cas)
                    .map_err(|e| StartError::new("--client-ca (CLIENT_CA_FILE)", e))?,
                Some(allowed),
            )
        }
        None => (
            tls::server_config_without_client_auth(identity.clone())
                .map_err(|e| StartError::new("--tls-cert (TLS_CERT_FILE)", e))?,
            None,
        ),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| StartError::new("--listen (LISTEN)", format!("{}: {e}", config.listen)))?;
    let api = listener
        .local_addr()
        .map_err(|e| StartError::new("--listen (LISTEN)", e))?;
    let ops_listener = config.ops.bind().await?;
    let http_metrics = HttpMetrics::register_tls(&mut registry);
    let reviews = Family::<ReviewLabels, Counter>::default();
    registry.register("reviews", "Admission reviews, by outcome", reviews.clone());
    registry.register(
        "template_reloads",
        "Template file changes, by outcome (changed: in use; refused: the last good one stays)",
        template.reloads.clone(),
    );
    let handler = Arc::new(WebhookHandler {
        template: Arc::clone(&template),
        skip_namespaces: config
            .skip_namespaces
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect(),
        allowed,
        reviews,
    });
    let readiness = Readiness::default();
    readiness.set(true);
    let server = Server::new(Listener::Tcp(listener), handler)
        .with_tls(server_config)
        .with_limits(ServerLimits {
            max_body: MAX_REVIEW,
            ..ServerLimits::default()
        })
        .with_metrics(http_metrics);
    let (bound, task) = athenz_core::daemon::spawn_serving(
        api,
        ops_listener,
        registry,
        readiness,
        background,
        server.serve(shutdown.wait()),
        &shutdown,
    )?;
    tracing::info!(api = %bound.api, ops = %bound.ops, "initializer listening");
    Ok((bound, task))
}

/// Where the serving certificate comes from.
enum ServingIdentity {
    /// Files another issuer writes (--tls-cert/--tls-key).
    Files(Arc<ReloadingIdentity>),
    /// The initializer's own CA (--serving-ca-secret), with the task keeping it.
    OwnCa(Arc<InMemoryIdentity>, tokio::task::JoinHandle<()>),
}

async fn serving_identity(
    config: &Config,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<ServingIdentity, StartError> {
    let secret_setting = "--serving-ca-secret (SERVING_CA_SECRET)";
    let Some(secret) = &config.serving_ca_secret else {
        let files = "--tls-cert/--tls-key (TLS_CERT_FILE/TLS_KEY_FILE)";
        let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
            return Err(StartError::new(
                files,
                format!("required unless {secret_setting} is set"),
            ));
        };
        let identity = ReloadingIdentity::load(cert, key).map_err(|e| StartError::new(files, e))?;
        return Ok(ServingIdentity::Files(identity));
    };
    let client = kube_client()
        .await
        .map_err(|e| StartError::new(secret_setting, e))?;
    // NAME alone: the Secret in the pod's own namespace (the in-cluster configuration's)
    let qualified = match secret.contains('/') {
        true => secret.clone(),
        false => format!("{}/{secret}", client.default_namespace()),
    };
    let (namespace, name) = qualified
        .split_once('/')
        .filter(|(ns, name)| {
            athenz_core::names::validate_dns_label("namespace", ns).is_ok()
                && athenz_core::names::validate_dns_subdomain("name", name).is_ok()
        })
        .ok_or_else(|| {
            StartError::new(
                secret_setting,
                format!("{secret:?} is not the NAME or NAMESPACE/NAME of a Secret"),
            )
        })?;
    let webhook = config
        .webhook_configuration
        .as_deref()
        .filter(|w| athenz_core::names::validate_dns_subdomain("name", w).is_ok())
        .ok_or_else(|| {
            StartError::new(
                "--webhook-configuration (WEBHOOK_CONFIGURATION)",
                "the name of a MutatingWebhookConfiguration is required with --serving-ca-secret",
            )
        })?;
    let dns_names: Vec<String> = config
        .serving_dns_names
        .iter()
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    if dns_names.is_empty()
        || dns_names
            .iter()
            .any(|n| athenz_core::names::validate_dns_subdomain("DNS name", n).is_err())
    {
        return Err(StartError::new(
            "--serving-dns-names (SERVING_DNS_NAMES)",
            format!(
                "{:?}: DNS names of the webhook Service are required",
                config.serving_dns_names
            ),
        ));
    }
    let api = serving_ca::api::KubeCaApi::new(client, namespace, name, webhook, API_TIMEOUT);
    let memory = Arc::new(InMemoryIdentity::default());
    let keeper = serving_ca::Keeper::new(api, dns_names, Arc::clone(&memory));
    let checks = Family::<serving_ca::CheckLabels, Counter>::default();
    registry.register(
        "serving_ca_checks",
        "Checks of the webhook CA, its caBundle and this replica's serving certificate, by outcome",
        checks.clone(),
    );
    let expiry = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    registry.register(
        "serving_certificate_expiry_seconds",
        "When this replica's serving certificate expires (Unix seconds); renewed at two-thirds of its life",
        expiry.clone(),
    );
    let task = serving_ca::start(keeper, checks, expiry)
        .await
        .map_err(|e| StartError::new(secret_setting, e))?;
    Ok(ServingIdentity::OwnCa(memory, task))
}

/// Each call to the Kubernetes API for the serving CA.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// The in-cluster Kubernetes client (or the kubeconfig's, outside a cluster).
async fn kube_client() -> Result<kube::Client, String> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| format!("no in-cluster config or kubeconfig: {e}"))?;
    config.connect_timeout = Some(API_TIMEOUT);
    config.read_timeout = Some(API_TIMEOUT);
    config.write_timeout = Some(API_TIMEOUT);
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// The `athenz-initializer` command: parses `args` (the program name first; a bad setting exits 2 with
/// clap's message) and serves until SIGTERM. `main` runs it, and so does `athenz-devstack` when it
/// re-executes itself under this name.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::io::Result<()> {
    athenz_core::daemon::parse_and_run(
        args,
        |c: &Config| athenz_core::daemon::RunSettings::from_ops(&c.ops),
        start,
    )
}
