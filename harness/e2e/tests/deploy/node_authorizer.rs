//! deploy/node-authorizer/ agrees with itself and with the daemon: the static pod is a valid Pod of
//! the release's image running the daemon's link with settings it reads, the webhook's kubeconfig
//! reaches it where it listens, and the authorization configuration names the account it scopes.

use super::*;
use clap::CommandFactory;
use k8s_openapi::api::core::v1::Pod;

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy_dir().join("node-authorizer").join(name)).unwrap()
}

#[test]
fn the_node_authorizers_files_agree() {
    let value: Value = serde_saphyr::from_str(&read("static-pod.yaml")).unwrap();
    let pod: Pod = typed("static-pod.yaml", &value);
    let spec = pod.spec.unwrap();
    assert_eq!(spec.host_network, Some(true));
    let container = &spec.containers[0];
    assert_eq!(container.image.as_deref(), Some(IMAGE.as_str()));
    assert_eq!(
        container.command.as_deref(),
        Some(&["athenz-node-authorizer".to_owned()][..])
    );
    let env: BTreeMap<String, String> = container
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    // every variable is one the daemon reads
    let command = athenz_initializer::node_authorizer::Config::command();
    let read_by_it: Vec<String> = command
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    for name in env.keys() {
        assert!(
            read_by_it.contains(name),
            "{name} is not read by the daemon"
        );
    }
    // loopback only, and the kubeconfig and probes reach it there
    let listen = &env["LISTEN"];
    assert!(listen.starts_with("127.0.0.1:"), "{listen}");
    let kubeconfig = read("webhook-kubeconfig.yaml");
    assert!(
        kubeconfig.contains(&format!("server: https://{listen}/authorize\n")),
        "{kubeconfig}"
    );
    let ops_port: i32 = env["OPS_LISTEN"]
        .strip_prefix("127.0.0.1:")
        .unwrap()
        .parse()
        .unwrap();
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe.clone().unwrap().http_get.unwrap();
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(ops_port)
        );
    }
    // the principal the kubeconfig's client certificate must carry, as the comments say
    assert!(kubeconfig.contains(&env["ALLOWED_PRINCIPALS"]));
    // the account the configuration's conditions select is the one the daemon scopes, the
    // agents' own (deploy/base/agent.yaml)
    let config = read("authorization-config.yaml");
    let user = &env["AGENT_USER"];
    assert!(
        config.contains(&format!("request.user == '{user}'")),
        "{user}"
    );
    let agents = agent_account();
    assert_eq!(*user, agents);
    assert!(config.contains("kubeConfigFile: /etc/kubernetes/athenz-node-authorizer/"));
}

/// `system:serviceaccount:<ns>:<name>` of the agents' DaemonSet in deploy/base.
fn agent_account() -> String {
    let o = objects();
    let agent = &o.daemon_sets["athenz-agent"];
    let account = agent
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap()
        .service_account_name
        .unwrap();
    format!(
        "system:serviceaccount:{}:{account}",
        agent.metadata.namespace.clone().unwrap()
    )
}
