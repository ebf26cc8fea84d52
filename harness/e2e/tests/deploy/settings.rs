//! One setting, one value: what the components read from each other agrees.

use super::*;

#[test]
fn settings_agree_across_components() {
    let o = objects();
    let cluster = o.config_maps["athenz-cluster"].data.clone().unwrap();
    let admin = &cluster["ADMIN_DOMAIN"];

    // The template the initializer injects: paths equal to the SIA's defaults.
    let template_yaml = o.config_maps["athenz-initializer-template"]
        .data
        .clone()
        .unwrap()["template.yaml"]
        .clone();
    // as the initializer reads it, with its environment from athenz-cluster (envFrom)
    let install = athenz_initializer::template::InstallSettings {
        sia_image: cluster.get("SIA_IMAGE").cloned(),
        zts_url: cluster.get("ZTS_URL").cloned(),
    };
    let template = athenz_initializer::template::Template::from_yaml(&template_yaml)
        .and_then(|t| t.with_install(&install))
        .unwrap();
    assert_eq!(
        template.volume,
        athenz_core::volume_mode::VolumeMode::CsiSocket
    );
    assert!(!template.allows(athenz_core::volume_mode::VolumeMode::Flex));
    // the SIA's ZTS (role certificates, tokens) is the one every component uses
    let template_zts = template.env.iter().find(|e| e.name == "ZTS_URL");
    assert_eq!(
        template_zts.and_then(|e| e.value.as_deref()),
        Some(cluster["ZTS_URL"].as_str())
    );
    let defaults = match <athenz_sia::Cli as clap::Parser>::try_parse_from(["athenz-sia", "init"])
        .unwrap()
        .command
    {
        athenz_sia::Command::Init(s) => s,
        athenz_sia::Command::Refresh(_) | athenz_sia::Command::Status(_) => unreachable!(),
    };
    let identity = Path::new(&template.identity_mount_path);
    assert_eq!(identity.join("id"), defaults.id_file);
    assert_eq!(
        identity
            .join("connect")
            .join(athenz_core::volume::AGENT_SOCKET_NAME),
        defaults.endpoint
    );
    assert_eq!(
        Path::new(&template.credentials_mount_path),
        defaults.out_dir
    );
    assert_eq!(template.command, ["athenz-sia"]);

    // The agent: its directories are the ones the driver uses with no environment (kubelet runs
    // the driver with none), both on the /var/athenz host path; the flex plugin dir is kubelet's.
    let agent_spec = o.daemon_sets["athenz-agent"]
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap();
    let agent = agent_spec
        .containers
        .iter()
        .find(|c| c.name == "agent")
        .unwrap();
    assert_eq!(
        env(agent, "ATHENZ_AGENT_DIR").unwrap(),
        athenz_core::volume::DEFAULT_AGENT_DIR
    );
    assert_eq!(
        env(agent, "ATHENZ_VOLUMES_DIR").unwrap(),
        athenz_core::volume::DEFAULT_VOLUMES_DIR
    );
    let host_path = |volume: &str| {
        agent_spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .unwrap()
            .host_path
            .clone()
            .unwrap()
            .path
    };
    let mount = |name: &str| {
        agent
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == name)
            .unwrap()
            .mount_path
            .clone()
    };
    assert_eq!(host_path("athenz"), "/var/athenz");
    assert_eq!(mount("athenz"), "/var/athenz");
    assert!(athenz_core::volume::DEFAULT_AGENT_DIR.starts_with("/var/athenz/"));
    assert!(athenz_core::volume::DEFAULT_VOLUMES_DIR.starts_with("/var/athenz/"));
    assert_eq!(
        host_path("flexvolume"),
        "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
    );
    assert_eq!(env(agent, "FLEX_PLUGIN_DIR").unwrap(), mount("flexvolume"));
    // the driver the webhook names is the one the agent installs (vendor~driver/driver)
    assert_eq!(athenz_initializer::mutate::DRIVER, "athenz/volume-driver");
    assert!(
        env(agent, "DRIVER_SOURCE")
            .unwrap()
            .ends_with("/athenz-volume-driver")
    );
    assert!(agent_spec.host_network.unwrap());
    assert!(
        agent_spec
            .tolerations
            .as_ref()
            .unwrap()
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists"))
    );
    assert!(agent.liveness_probe.is_some() && agent.readiness_probe.is_some());
    assert!(
        agent
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()
            .contains_key("memory")
    );

    // The agent's identity (docs/design.md §4.9): no key, no control-sia; a projected token for the
    // audience the callback checks, of the account and namespace the callback expects; hostPID
    // for the peer check; the node name from the downward API.
    let callback_defaults = <athenz_callback::Config as clap::Parser>::try_parse_from([
        "athenz-callback",
        "--tls-cert=c",
        "--tls-key=k",
        "--client-ca=c",
        "--allowed-principals=sys.auth.zts",
        "--provider=a.b",
        "--public-keys-dir=d",
        "--dns-suffix=x.y",
        "--admin-domain=k8s.admin",
    ])
    .unwrap();
    assert!(
        agent_spec.init_containers.is_none(),
        "no control-sia for the agent"
    );
    assert_eq!(agent_spec.host_pid, Some(true));
    assert_eq!(
        agent_spec.service_account_name.as_deref(),
        Some(callback_defaults.agent_service_account.as_str())
    );
    assert_eq!(
        o.daemon_sets["athenz-agent"].metadata.namespace.as_deref(),
        Some(callback_defaults.agent_namespace.as_str())
    );
    let volumes = agent_spec.volumes.clone().unwrap();
    let token_volume = volumes.iter().find(|v| v.name == "node-token").unwrap();
    let token_source = token_volume
        .projected
        .as_ref()
        .unwrap()
        .sources
        .as_ref()
        .unwrap()[0]
        .service_account_token
        .clone()
        .unwrap();
    assert_eq!(
        token_source.audience.as_deref(),
        Some(callback_defaults.node_token_audience.as_str())
    );
    assert_eq!(
        env(agent, "NODE_TOKEN_FILE").unwrap(),
        format!("{}/{}", mount("node-token"), token_source.path)
    );
    let node_name = agent
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .unwrap();
    assert_eq!(
        node_name
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    assert_eq!(env(agent, "PEER_CHECK").as_deref(), Some("enforce"));

    // Principals: the agents' service is what the jwt-service allows; ZTS is what the callback
    // allows; the provider is the callback's service.
    let control_service = |spec: &k8s_openapi::api::core::v1::PodSpec| {
        env(&spec.init_containers.as_ref().unwrap()[0], "SERVICE").unwrap()
    };
    let deployment = |name: &str| {
        o.deployments[name]
            .spec
            .clone()
            .unwrap()
            .template
            .spec
            .unwrap()
    };
    let main = |name: &str| deployment(name).containers[0].clone();
    assert_eq!(
        env(&main("athenz-jwt-service"), "ALLOWED_PRINCIPALS").unwrap(),
        format!("{admin}.athenz-agent")
    );
    assert_eq!(
        env(&main("athenz-callback"), "ALLOWED_PRINCIPALS").unwrap(),
        "sys.auth.zts"
    );
    assert_eq!(
        cluster["PROVIDER"],
        format!(
            "{admin}.{}",
            control_service(&deployment("athenz-callback"))
        )
    );

    // Each server's certificate names its Service, and the webhook calls that Service: the
    // jwt-service's and the callback's from ZTS through control-sia, the initializer's from its
    // own CA.
    let initializer = main("athenz-initializer");
    assert_eq!(
        env(&initializer, "SERVING_DNS_NAMES").unwrap(),
        format!("athenz-initializer.{}.svc", admin.replace('.', "-"))
    );
    assert!(deployment("athenz-initializer").init_containers.is_none());
    for name in ["athenz-jwt-service", "athenz-callback"] {
        let spec = deployment(name);
        assert_eq!(control_service(&spec), name);
        // the Service's in-cluster name, and a name ZTS issues to a key-based service
        // certificate (ZTSUtils.validateCertReqDNSNames: <service>.<domain-with-dashes>.<suffix>,
        // with "svc" among its suffixes): so the namespace is the admin domain with dashes
        let namespace = o.deployments[name].metadata.namespace.clone().unwrap();
        assert_eq!(namespace, admin.replace('.', "-"), "{name}");
        assert_eq!(
            o.services[name].metadata.namespace.as_ref(),
            Some(&namespace)
        );
        for c in spec.init_containers.iter().flatten() {
            assert_eq!(
                env(c, "DNS_NAMES").unwrap(),
                format!("{name}.{namespace}.svc")
            );
        }
        // the native sidecar keeps the certificate fresh
        let sidecar = &spec.init_containers.as_ref().unwrap()[1];
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            sidecar.command.as_ref().unwrap(),
            &["athenz-control-sia", "refresh"]
        );
    }
    let webhook = &o.webhooks[0].webhooks.as_ref().unwrap()[0];
    let target = webhook.client_config.service.as_ref().unwrap();
    assert_eq!(target.name, "athenz-initializer");
    assert_eq!(target.path.as_deref(), Some("/mutate"));
    let port = o.services["athenz-initializer"]
        .spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()[0]
        .port;
    assert_eq!(target.port, Some(port));
    let control_ns = admin.replace('.', "-");
    assert_eq!(target.namespace, control_ns);
    let agent_jwt_url = env(agent, "JWT_SERVICE_URL").unwrap();
    assert!(agent_jwt_url.starts_with(&format!("https://athenz-jwt-service.{control_ns}.svc")));
    // the callback knows where the agents run
    let agent_ns = o.daemon_sets["athenz-agent"]
        .metadata
        .namespace
        .clone()
        .unwrap();
    assert_eq!(
        env(&main("athenz-callback"), "AGENT_NAMESPACE").unwrap(),
        agent_ns
    );
    // neither of our namespaces is ever injected: by the webhook's selector and by the
    // initializer itself
    let skipped = env(&main("athenz-initializer"), "SKIP_NAMESPACES").unwrap();
    let selector = webhook.namespace_selector.as_ref().unwrap();
    let not_in = &selector.match_expressions.as_ref().unwrap()[0];
    assert_eq!(not_in.operator, "NotIn");
    for ns in [&agent_ns, &control_ns] {
        assert!(
            skipped.split(',').any(|s| s == ns.as_str()),
            "{ns}: {skipped}"
        );
        assert!(not_in.values.as_ref().unwrap().contains(ns), "{ns}");
    }
}
