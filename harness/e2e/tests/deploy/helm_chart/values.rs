//! What the chart's values change: each lands where it names and changes nothing else.

use super::kustomize::key;
use super::render::{callback_volumes, helm_template};
use serde_json::Value;

#[test]
fn the_values_change_what_they_name() {
    let ca = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), ca).unwrap();
    let ca_arg = format!("ztsCa={}", ca_file.path().display());
    let digest = format!("sha256:{}", "ab".repeat(32));
    let digest_arg = format!("image.digest={digest}");
    let chart = helm_template(&[
        "--namespace",
        "k8s-admin",
        "--set-file",
        &ca_arg,
        "--set",
        "ztsUrl=https://zts.example:4443/zts/v1",
        "--set",
        "image.repository=registry.example/athenz",
        "--set",
        &digest_arg,
        "--set",
        "imagePullSecrets[0].name=pull",
        "--set",
        "kubeletAuthorization=nodes/proxy",
        "--set",
        "flexPluginDir=",
        "--set",
        "namespaces.create=false",
        "--set",
        "agent.priorityClassName=node-high",
        "--set",
        "agent.nodeSelector.pool=identity",
        "--set",
        "callback.tolerations[0].key=dedicated",
        "--set",
        "callback.tolerations[0].operator=Exists",
        "--set",
        "jwtService.resources.limits.memory=256Mi",
        "--set",
        "initializer.extraEnv[0].name=RUST_LOG",
        "--set",
        "initializer.extraEnv[0].value=debug",
        "--set",
        "components.networkPolicies=true",
        "--set",
        "networkPolicies.ztsCidrs[0]=192.0.2.10/32",
        "--set",
        "networkPolicies.apiServerCidrs[0]=198.51.100.0/24",
    ]);
    // the Athenz CA is not the webhook's: the initializer writes its own CA there, and a
    // chart that set it would put a stale bundle back on every upgrade
    let webhook = &chart[&key("MutatingWebhookConfiguration", "", "athenz-initializer")];
    assert!(
        webhook["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none(),
        "{webhook}"
    );
    for ns in ["athenz-system", "k8s-admin"] {
        assert_eq!(
            chart[&key("ConfigMap", ns, "athenz-zts-ca")]["data"]["ca.pem"],
            ca
        );
        assert_eq!(
            chart[&key("ConfigMap", ns, "athenz-cluster")]["data"]["ZTS_URL"],
            "https://zts.example:4443/zts/v1"
        );
    }
    let image = format!("registry.example/athenz@{digest}");
    // the image the initializer injects is the workloads' image
    assert_eq!(
        chart[&key("ConfigMap", "k8s-admin", "athenz-cluster")]["data"]["SIA_IMAGE"],
        image.as_str()
    );
    assert!(
        !chart.contains_key(&key("Namespace", "", "k8s-admin")),
        "namespaces.create=false"
    );
    let agent = &chart[&key("DaemonSet", "athenz-system", "athenz-agent")];
    let pod = &agent["spec"]["template"];
    assert_eq!(pod["spec"]["containers"][0]["image"], image.as_str());
    assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "pull");
    assert_eq!(pod["spec"]["priorityClassName"], "node-high");
    assert_eq!(pod["spec"]["nodeSelector"]["pool"], "identity");
    assert_eq!(pod["spec"]["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(
        architectures(pod),
        ["amd64", "arm64"],
        "the image's platforms"
    );
    assert!(
        pod["metadata"]["annotations"]
            .get("checksum/zts-ca")
            .is_none(),
        "a CA change rolls nothing: every part follows the bundle"
    );
    let text = agent.to_string();
    assert!(
        !text.contains("flexvolume") && !text.contains("DRIVER_SOURCE"),
        "{text}"
    );
    let callback = &chart[&key("Deployment", "k8s-admin", "athenz-callback")];
    assert_eq!(
        callback["spec"]["template"]["spec"]["tolerations"][0]["key"],
        "dedicated"
    );
    let jwt = &chart[&key("Deployment", "k8s-admin", "athenz-jwt-service")];
    let main = &jwt["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(main["resources"]["limits"]["memory"], "256Mi");
    assert!(
        main["resources"]["requests"].is_null(),
        "replaced, not merged"
    );
    let initializer = &chart[&key("Deployment", "k8s-admin", "athenz-initializer")];
    let env = initializer["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert_eq!(env.last().unwrap()["name"], "RUST_LOG", "appended last");
    assert_eq!(
        chart[&key("ClusterRole", "", "athenz-agent")]["rules"][0]["resources"],
        serde_json::json!(["nodes/proxy"])
    );
    let egress = &chart[&key("NetworkPolicy", "k8s-admin", "athenz-egress")]["spec"]["egress"];
    assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "192.0.2.10/32");
    assert_eq!(egress[2]["to"][0]["ipBlock"]["cidr"], "198.51.100.0/24");
    assert!(egress[0]["to"].is_null(), "DNS stays by port");
}

/// What a platform team sets per workload and per cluster lands where it names, and an extraEnv
/// entry replaces the base's variable of the same name instead of repeating it.
#[test]
fn the_workload_and_cluster_values_change_what_they_name() {
    let chart = helm_template(&[
        "--set",
        "callback.replicas=3",
        "--set",
        "callback.minAvailable=2",
        "--set",
        "callback.podLabels.team=identity",
        "--set",
        "callback.podAnnotations.example\\.com/owner=platform",
        "--set",
        "callback.topologySpreadConstraints[0].maxSkew=1",
        "--set",
        "callback.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "--set",
        "callback.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "--set",
        "initializer.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "--set",
        "initializer.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "--set",
        "jwtService.serviceAccountAnnotations.iam\\.example/role=signer",
        "--set",
        "kubeletRootDir=/data/kubelet",
        "--set",
        "clusterDomain=corp.internal",
        "--set",
        "agent.earlyIssue=false",
        "--set",
        "agent.extraEnv[0].name=RUST_LOG",
        "--set",
        "agent.extraEnv[0].value=debug",
        "--set",
        "agent.extraEnv[1].name=CSI_SOCKET",
        "--set",
        "agent.extraEnv[1].value=/csi/other.sock",
        "--set",
        "monitoring.podMonitors=true",
        "--set",
        "monitoring.labels.release=kube-prometheus-stack",
        "--set",
        "existingSecrets.athenz-callback-key=vault-callback-key",
        "--set",
        "domainPrefix=acme.",
        "--set",
        "domainAnnotationAllow={acme.*,legacy.billing}",
        "--set",
        "components.domainAnnotations=true",
    ]);
    for ns in ["athenz-system", "k8s-admin"] {
        let settings = &chart[&key("ConfigMap", ns, "athenz-cluster")]["data"];
        assert_eq!(settings["DOMAIN_PREFIX"], "acme.");
        assert_eq!(settings["DOMAIN_SUFFIX"], "");
        assert_eq!(settings["DOMAIN_ANNOTATION_ALLOW"], "acme.*,legacy.billing");
    }
    assert!(
        chart[&key("ClusterRole", "", "athenz-callback")]["rules"]
            .to_string()
            .contains("namespaces")
    );
    let volumes = callback_volumes(&chart);
    assert!(
        volumes.contains("\"secretName\":\"vault-callback-key\""),
        "{volumes}"
    );
    let callback = &chart[&key("Deployment", "k8s-admin", "athenz-callback")];
    assert_eq!(callback["spec"]["replicas"], 3);
    let pod = &callback["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "identity");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "athenz-callback"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/owner"],
        "platform"
    );
    assert!(
        pod["metadata"]["annotations"]
            .get("checksum/zts-ca")
            .is_none()
    );
    assert_eq!(
        pod["spec"]["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    assert!(
        pod["spec"]["affinity"]["podAntiAffinity"].is_object(),
        "the base's affinity unless given"
    );
    assert_eq!(architectures(pod), ["amd64", "arm64"]);
    assert_eq!(
        chart[&key("PodDisruptionBudget", "k8s-admin", "athenz-callback")]["spec"]["minAvailable"],
        2
    );
    let initializer = &chart[&key("Deployment", "k8s-admin", "athenz-initializer")];
    let affinity = &initializer["spec"]["template"]["spec"]["affinity"];
    assert!(
        affinity["podAntiAffinity"].is_null(),
        "replaced: {affinity}"
    );
    assert_eq!(
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "pool",
        "a given nodeAffinity replaces the base's: {affinity}"
    );
    assert_eq!(
        chart[&key("ServiceAccount", "k8s-admin", "athenz-jwt-service")]["metadata"]["annotations"]
            ["iam.example/role"],
        "signer"
    );

    let agent = &chart[&key("DaemonSet", "athenz-system", "athenz-agent")];
    let spec = &agent["spec"]["template"]["spec"];
    let text = spec.to_string();
    assert!(
        text.contains("/data/kubelet/pods") && text.contains("/data/kubelet/plugins_registry"),
        "{text}"
    );
    assert!(!text.contains("/var/lib/kubelet"), "{text}");
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let value = |name: &str| -> Vec<&Value> {
        env.iter()
            .filter(|e| e["name"] == name)
            .map(|e| &e["value"])
            .collect()
    };
    assert_eq!(value("CLUSTER_DOMAIN"), [&Value::from("corp.internal")]);
    assert_eq!(value("CSI_EARLY_ISSUE"), [&Value::from("false")]);
    assert_eq!(
        value("CSI_SOCKET"),
        [&Value::from("/csi/other.sock")],
        "replaced, once"
    );
    assert_eq!(value("RUST_LOG"), [&Value::from("debug")]);
    let mut names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    let all = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all, "a name twice in the agent's env");
    // early issuance off: the agents may no longer list or watch pods
    let rules = &chart[&key("ClusterRole", "", "athenz-agent")]["rules"];
    assert!(
        !rules.to_string().contains("watch"),
        "the pods watch outlived early issuance: {rules}"
    );
    let monitor = &chart[&key("PodMonitor", "athenz-system", "athenz-agent")];
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
}

/// The architectures a pod's required nodeAffinity allows (`kubernetes.io/arch In [...]`).
fn architectures(pod: &Value) -> Vec<String> {
    let terms = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let expression = &terms[0]["matchExpressions"][0];
    assert_eq!(expression["key"], "kubernetes.io/arch", "{terms}");
    assert_eq!(expression["operator"], "In", "{terms}");
    expression["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Every workload runs only on the image's platforms, by default on both; a workload's own
/// affinity without a nodeAffinity keeps that bound, and `image.architectures` narrows it (a
/// registry mirror that holds only one platform).
#[test]
fn every_workload_requires_a_node_of_the_images_architectures() {
    let workloads = [
        ("DaemonSet", "athenz-system", "athenz-agent"),
        ("Deployment", "k8s-admin", "athenz-jwt-service"),
        ("Deployment", "k8s-admin", "athenz-callback"),
        ("Deployment", "k8s-admin", "athenz-initializer"),
    ];
    let chart = helm_template(&[
        "--set",
        "agent.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=1",
        "--set",
        "agent.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey=kubernetes.io/hostname",
    ]);
    for (kind, ns, name) in workloads {
        let pod = &chart[&key(kind, ns, name)]["spec"]["template"];
        assert_eq!(architectures(pod), ["amd64", "arm64"], "{name}");
        assert_eq!(
            pod["spec"]["nodeSelector"],
            serde_json::json!({"kubernetes.io/os": "linux"})
        );
    }
    let agent = &chart[&key("DaemonSet", "athenz-system", "athenz-agent")]["spec"]["template"];
    assert!(
        agent["spec"]["affinity"]["podAffinity"].is_object(),
        "the given affinity kept"
    );

    let amd64_only = helm_template(&["--set", "image.architectures={amd64}"]);
    for (kind, ns, name) in workloads {
        let pod = &amd64_only[&key(kind, ns, name)]["spec"]["template"];
        assert_eq!(architectures(pod), ["amd64"], "{name}");
    }
}
