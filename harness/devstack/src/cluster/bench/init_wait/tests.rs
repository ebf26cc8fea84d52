use super::*;

/// containerd's lines for one csi-socket pod of run 28 (/tmp/bench28/logs/containerd.log),
/// trimmed: its sandbox, the SIA's init container, the sidecar and the app.
const CONTAINERD: &str = r#"time="2026-12-06T07:57:30.817134886Z" level=info msg="RunPodSandbox for name:\"sequential-6\"  uid:\"e622b6b4-4934-4840-ac6a-be333fff9889\"  namespace:\"bench-csi-socket\" returns sandbox id \"b09d8cc421067e07c7113d65a365c2b58c7459196820ab39a81d4d6ce5a02dbb\""
time="2026-12-06T07:57:30.820201418Z" level=info msg="CreateContainer within sandbox \"b09d8cc421067e07c7113d65a365c2b58c7459196820ab39a81d4d6ce5a02dbb\" for container name:\"athenz-sia-init\""
time="2026-12-06T07:57:30.825200353Z" level=info msg="CreateContainer within sandbox \"b09d8cc421067e07c7113d65a365c2b58c7459196820ab39a81d4d6ce5a02dbb\" for name:\"athenz-sia-init\" returns container id \"35f6c6bb84a5939bf169d63930c90c784774e3d45e49054636e3f5de2e3e5bf8\""
time="2026-12-06T07:57:30.879861198Z" level=info msg="StartContainer for \"35f6c6bb84a5939bf169d63930c90c784774e3d45e49054636e3f5de2e3e5bf8\" returns successfully"
time="2026-12-06T07:57:30.942155277Z" level=info msg="received container exit event container_id:\"35f6c6bb84a5939bf169d63930c90c784774e3d45e49054636e3f5de2e3e5bf8\"  id:\"35f6c6bb84a5939bf169d63930c90c784774e3d45e49054636e3f5de2e3e5bf8\"  pid:13832  exited_at:{seconds:1796543850  nanos:941832404}"
time="2026-12-06T07:57:31.564718478Z" level=info msg="CreateContainer within sandbox \"b09d8cc421067e07c7113d65a365c2b58c7459196820ab39a81d4d6ce5a02dbb\" for name:\"athenz-sia-refresh\" returns container id \"6019675ea34ab9674f472f16f4ba207f3629b729d34af7ee4f0b04a0061948a6\""
time="2026-12-06T07:57:31.629715575Z" level=info msg="StartContainer for \"6019675ea34ab9674f472f16f4ba207f3629b729d34af7ee4f0b04a0061948a6\" returns successfully"
time="2026-12-06T07:57:31.649312116Z" level=info msg="CreateContainer within sandbox \"b09d8cc421067e07c7113d65a365c2b58c7459196820ab39a81d4d6ce5a02dbb\" for name:\"app\" returns container id \"ca49b6c85d37a85cd7257956ce54f5aa7dc4cd6e3068007c26fc1925d864d068\""
time="2026-12-06T07:57:31.707209098Z" level=info msg="StartContainer for \"ca49b6c85d37a85cd7257956ce54f5aa7dc4cd6e3068007c26fc1925d864d068\" returns successfully"
"#;

/// The kubelet noticing the init container's exit (/tmp/bench28/logs/kubelet.log).
const KUBELET: &str = r#"I1206 07:57:31.555053   13122 kubelet.go:2788] "SyncLoop (PLEG): event for pod" pod="bench-csi-socket/sequential-6" event={"ID":"e622b6b4-4934-4840-ac6a-be333fff9889","Type":"ContainerDied","Data":"35f6c6bb84a5939bf169d63930c90c784774e3d45e49054636e3f5de2e3e5bf8"}
"#;

const INITS: &[&str] = &["init", "athenz-sia-init"];

fn ms(d: f64) -> f64 {
    (d * 1000.0).round() / 1000.0
}

#[test]
fn the_init_containers_run_and_the_kubelets_notice_are_told_apart() {
    let waits = by_namespace(
        CONTAINERD,
        KUBELET,
        &["bench-csi-socket"],
        "sequential",
        INITS,
    );
    let pod = &waits["bench-csi-socket"];
    assert_eq!(pod.pods, 1);
    // started 30.879861, exited 30.942155: the SIA's own 62 ms
    assert_eq!(ms(pod.init_run_ms.p50), 62.294);
    // noticed 31.555053: 613 ms of the kubelet's
    assert_eq!(ms(pod.exit_noticed_ms.p50), 612.898);
    // the app started 31.707209, after the sidecar
    assert_eq!(ms(pod.app_started_ms.p50), 152.156);
}

#[test]
fn other_namespaces_phases_and_unnoticed_exits_give_no_figures() {
    assert!(by_namespace(CONTAINERD, KUBELET, &["bench-flex"], "sequential", INITS).is_empty());
    assert!(by_namespace(CONTAINERD, KUBELET, &["bench-csi-socket"], "churn", INITS).is_empty());
    assert!(by_namespace(CONTAINERD, "", &["bench-csi-socket"], "sequential", INITS).is_empty());
    // a pod without an init container of those names
    assert!(
        by_namespace(
            CONTAINERD,
            KUBELET,
            &["bench-csi-socket"],
            "sequential",
            &["x"]
        )
        .is_empty()
    );
    // an exit the kubelet reported twice counts from the first
    let twice = format!(
        "{KUBELET}{}",
        KUBELET.replace("07:57:31.555053", "07:57:32.555053")
    );
    let waits = by_namespace(
        CONTAINERD,
        &twice,
        &["bench-csi-socket"],
        "sequential",
        INITS,
    );
    assert_eq!(ms(waits["bench-csi-socket"].exit_noticed_ms.p50), 612.898);
}

#[test]
fn garbled_and_hostile_lines_are_skipped() {
    let garbled = concat!(
        "time=\"2026-12\" msg=\"RunPodSandbox for name:\\\"sequential-1\\\" returns sandbox id \\\"ab\\\"\"\n",
        "time=\"2026-12-06T07:57:30.817134886Z\" msg=\"RunPodSandbox for name:\\\"sequential-x\\\"  namespace:\\\"bench-csi-socket\\\" returns sandbox id \\\"b09d8cc421067e07c7113d65a365c2b58c7459196820ab39a81d4d6ce5a02dbb\\\"\"\n",
        "time=\"2026-12-06T07:57:30.817134886Z\" msg=\"RunPodSandbox for name:\\\"sequential-2\\\"  namespace:\\\"bench-csi-socket\\\" returns sandbox id \\\"../../etc\\\"\"\n",
        "time=\"2026-12-06T07:57:30.817134886Z\" msg=\"CreateContainer within sandbox \\\"\n",
        "\u{fffd}\u{0}time=\"\n",
        "I1206 07:57:31.5 \"SyncLoop (PLEG): event for pod\" \"Type\":\"ContainerDied\",\"Data\":\"\n",
    );
    assert!(by_namespace(garbled, garbled, &["bench-csi-socket"], "sequential", INITS).is_empty());
    assert_eq!(
        containerd_seconds("time=\"2026-12-06T07:57:30.879861198Z\" x"),
        Some(7.0 * 3600.0 + 57.0 * 60.0 + 30.879_861_198)
    );
    assert_eq!(containerd_seconds("time=\"2026-12-06T07:5"), None);
    assert!(is_id(&"a".repeat(64)) && !is_id(&"g".repeat(64)) && !is_id("ab"));
}
