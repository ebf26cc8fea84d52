//! The CSI driver end to end, through the real agent process: `athenz-devstack up --volume
//! csi-files` runs every component as its own process with the agents serving
//! `csi.athenz.io`; the tests play kubelet with the testbed's kubelet-faithful CSI caller.
//!
//! Needs root (the driver mounts tmpfs and bind mounts) and the `athenz-devstack` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "csi/agent_restart.rs"]
mod agent_restart;
mod common;

use athenz_core::crypto::CertInfo;
use athenz_core::files::{CA_FILE, CERT_FILE, FileSet, KEY_FILE, NTOKEN_FILE};
use athenz_devstack::kube::NewPod;
use athenz_testbed::csi_kubelet::{CsiPod, CsiVolume, KubeletCsi};
use common::{Devstack, pending_pod};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::Code;

async fn kubelet(stack: &Devstack) -> KubeletCsi {
    let socket = stack.info.nodes[0].agent.csi_socket.clone().unwrap();
    KubeletCsi::connect(&socket, &stack.kubelet_root())
        .await
        .unwrap()
}

/// The set in the volume, read as a consumer should (through `..data` once): consistent.
fn read_set(target: &Path) -> CertInfo {
    let files = FileSet::new(target)
        .read(&[KEY_FILE, CERT_FILE, CA_FILE, NTOKEN_FILE])
        .unwrap();
    let key =
        athenz_core::crypto::PrivateKey::from_pem(std::str::from_utf8(&files[0]).unwrap()).unwrap();
    let cert = CertInfo::from_pem(std::str::from_utf8(&files[1]).unwrap()).unwrap();
    assert!(
        athenz_core::crypto::key_matches_cert(&key, &cert),
        "a torn set: the key is not the certificate's"
    );
    assert!(!files[2].is_empty() && !files[3].is_empty());
    cert
}

fn under_kubelet_mounts(stack: &Devstack) -> usize {
    athenz_core::volume_mount::mountinfo::MountTable::read()
        .unwrap()
        .under(&stack.kubelet_root())
        .count()
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Files mode by default: one issuance per pod. The certificate names no pod IP, and the
/// pod's IP appearing does not re-issue it (with `ipSAN: "true"` the agent looks every 0.5 s
/// and re-issues at once, as the next test shows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_volume_without_ip_san_is_issued_once() {
    let stack = Devstack::start_with(&["--volume", "csi-files"]);
    let mut kubelet = kubelet(&stack).await;
    let (pod, csi_pod) = pending_pod(&stack, "web-once").await;
    let volume = kubelet
        .publish(&csi_pod, &[("mode", "files")])
        .await
        .unwrap();
    let first = read_set(&volume.target);
    assert!(first.ip_addresses.is_empty(), "{:?}", first.ip_addresses);
    stack.kube.report_running(pod, "10.1.7.8").await.unwrap();
    // ten times the interval at which a volume with an IP SAN is re-issued
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = read_set(&volume.target);
    assert_eq!(
        later.serial_hex, first.serial_hex,
        "re-issued although the volume names no IP"
    );
    assert!(later.ip_addresses.is_empty(), "{:?}", later.ip_addresses);
    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;

    // A first publish reads no kubelet list: the subject is what kubelet's call named, and
    // ZTS's callback checks it with the API server. A publish naming another service account
    // than the pod runs as (which no real kubelet sends) is refused there, and leaves nothing.
    let (_, listed) = pending_pod(&stack, "web-listed").await;
    let claimed = CsiPod {
        service_account: "db".into(),
        ..listed
    };
    let mounts = under_kubelet_mounts(&stack);
    let err = kubelet
        .publish(&claimed, &[("mode", "files")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::PermissionDenied), "{err}");
    let said = err.to_string();
    assert!(
        said.contains("service_account") && said.contains("db"),
        "{said}"
    );
    assert_eq!(
        under_kubelet_mounts(&stack),
        mounts,
        "a refused publish left mounts"
    );
}

/// Files mode with `ipSAN: "true"`, the whole life of a pod: publish before the pod has an IP
/// (the first certificate carries none, read-only files, key 0600), the IP appears and the agent
/// re-issues with it, publish again is OK and with other arguments ALREADY_EXISTS, stats are normal,
/// rotations every second never show a reader a torn set, unpublish leaves nothing, twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_mode_publish_reissue_rotate_unpublish() {
    // every files-mode certificate is re-issued at least every second
    let stack = Devstack::start_with_env(
        &["--volume", "csi-files"],
        &[("CSI_REFRESH_INTERVAL", "1s")],
    );
    let mut kubelet = kubelet(&stack).await;
    assert_eq!(kubelet.node_id(), stack.info.node_name);
    assert!(
        kubelet.probe().await.unwrap(),
        "the agent holds its node identity"
    );
    let (pod, csi_pod) = pending_pod(&stack, "web-files").await;

    let volume = kubelet
        .publish(&csi_pod, &[("mode", "files"), ("ipSAN", "true")])
        .await
        .unwrap();
    let first = read_set(&volume.target);
    assert!(
        first.ip_addresses.is_empty(),
        "no IP yet: {:?}",
        first.ip_addresses
    );
    assert_eq!(first.common_name, "media.sports.web");
    let key_mode = std::fs::metadata(volume.target.join(KEY_FILE)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&key_mode.permissions()) & 0o777,
        0o600
    );
    let planted = std::fs::write(volume.target.join("planted"), b"x").unwrap_err();
    assert_eq!(
        planted.raw_os_error(),
        Some(nix::errno::Errno::EROFS as i32),
        "the pod's view is read-only"
    );

    // the sandbox gets its IP: the agent re-issues with it
    stack.kube.report_running(pod, "10.1.7.7").await.unwrap();
    let target = volume.target.clone();
    wait_for(
        "a certificate with the pod IP",
        Duration::from_secs(15),
        async || {
            read_set(&target).ip_addresses == ["10.1.7.7".parse::<std::net::IpAddr>().unwrap()]
        },
    )
    .await;

    // idempotent; other arguments for the same target are ALREADY_EXISTS
    kubelet
        .publish(&csi_pod, &[("mode", "files"), ("ipSAN", "true")])
        .await
        .unwrap();
    let err = kubelet
        .publish(&csi_pod, &[("mode", "files")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AlreadyExists), "{err}");
    let err = kubelet
        .publish(&csi_pod, &[("mode", "socket")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AlreadyExists), "{err}");

    let stats = kubelet.stats(&volume).await.unwrap();
    assert!(!stats.usage.is_empty());
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{}", condition.message);

    // a reader never sees a torn set while the agent rotates every second
    let serial = read_set(&volume.target).serial_hex;
    let until = Instant::now() + Duration::from_secs(4);
    let mut reads = 0;
    while Instant::now() < until {
        read_set(&volume.target);
        reads += 1;
    }
    let after = read_set(&volume.target).serial_hex;
    assert_ne!(serial, after, "rotated during {reads} reads");

    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;
}

async fn unpublish_leaves_nothing(stack: &Devstack, kubelet: &mut KubeletCsi, volume: &CsiVolume) {
    kubelet.unpublish(volume).await.unwrap();
    assert!(!volume.target.exists());
    assert_eq!(under_kubelet_mounts(stack), 0);
    let left: Vec<_> = std::fs::read_dir(&stack.info.volumes_dir)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    kubelet.unpublish(volume).await.unwrap();
}

/// Socket mode is the flex layout: the real in-pod SIA gets its identity through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_serves_the_real_sia() {
    let stack = Devstack::start_with(&["--volume", "csi-socket"]);
    let mut kubelet = kubelet(&stack).await;
    let new_pod = NewPod {
        namespace: "media-sports".into(),
        name: "web-socket".into(),
        service_account: "web".into(),
        ip: "10.1.7.8".into(),
    };
    let uid = stack
        .kube
        .create_running_pod(&new_pod, &stack.info.node_name)
        .await
        .unwrap();
    let csi_pod = CsiPod {
        namespace: new_pod.namespace.clone(),
        name: new_pod.name.clone(),
        uid: uid.clone(),
        service_account: "web".into(),
        fs_group: None,
    };
    let volume = kubelet
        .publish(&csi_pod, &[("mode", "socket")])
        .await
        .unwrap();
    assert!(volume.target.join("id").exists());
    assert!(volume.target.join("connect/agent.sock").exists());
    // the pod's credentials emptyDir, which kubelet makes before the pod's containers start
    let credentials = stack.dir.path().join("credentials-socket");
    std::fs::create_dir_all(&credentials).unwrap();
    let pod_volume = athenz_devstack::node::PodVolume {
        pod: new_pod,
        uid,
        node: athenz_devstack::node::NodeDirs::first(&stack.info),
        mount_dir: volume.target.clone(),
        credentials_dir: credentials.clone(),
    };
    athenz_devstack::node::sia_init(&stack.info, &pod_volume)
        .await
        .unwrap();
    let cert = read_set(&credentials);
    assert_eq!(
        cert.ip_addresses,
        ["10.1.7.8".parse::<std::net::IpAddr>().unwrap()]
    );
    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;
}

/// Refusals carry their gRPC code and name the field (and `readonly: false` is not one: the
/// volume is read-only regardless); a pod the node may not have an identity for is refused and
/// everything the publish made is gone again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_rollback() {
    let stack = Devstack::start_with(&["--volume", "csi-files", "--nodes", "2"]);
    let mut kubelet = kubelet(&stack).await;
    let (_, csi_pod) = pending_pod(&stack, "web-refused").await;
    let good = kubelet.publish_request(&csi_pod, &[("mode", "files")], false);
    type Change = Box<dyn Fn(&mut athenz_core::csi::v1::NodePublishVolumeRequest)>;
    let cases: Vec<(Change, Code, &str)> = vec![
        (
            Box::new(|r| r.volume_capability = None),
            Code::InvalidArgument,
            "volume_capability",
        ),
        (
            Box::new(|r| r.target_path = "relative".into()),
            Code::InvalidArgument,
            "target_path",
        ),
        (
            Box::new(|r| {
                r.volume_context.remove("csi.storage.k8s.io/ephemeral");
            }),
            Code::FailedPrecondition,
            "ephemeral",
        ),
        (
            Box::new(|r| {
                r.volume_context.remove("csi.storage.k8s.io/pod.uid");
            }),
            Code::FailedPrecondition,
            "podInfoOnMount",
        ),
        (
            Box::new(|r| {
                r.volume_context.insert("mode".into(), "sockets".into());
            }),
            Code::InvalidArgument,
            "mode",
        ),
    ];
    for (change, code, field) in cases {
        let mut req = good.clone();
        change(&mut req);
        let err = kubelet.raw_publish(req).await.unwrap_err();
        assert_eq!(err.code(), Some(code), "{field}: {err}");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    // a pod spec without `csi.readOnly: true` is not refused, and its volume is read-only all
    // the same
    let mut writable = good.clone();
    writable.readonly = false;
    // kubelet makes the target's parent
    std::fs::create_dir_all(Path::new(&good.target_path).parent().unwrap()).unwrap();
    kubelet.raw_publish(writable).await.unwrap();
    let volume = CsiVolume {
        volume_id: good.volume_id.clone(),
        target: good.target_path.clone().into(),
    };
    let planted = std::fs::write(volume.target.join("planted"), b"x").unwrap_err();
    assert_eq!(
        planted.raw_os_error(),
        Some(nix::errno::Errno::EROFS as i32),
        "readonly=false still mounts read-only"
    );
    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;
    // a pod scheduled on node-2: node-1's agent may not get its identity
    let elsewhere = Pod {
        metadata: ObjectMeta {
            name: Some("web-elsewhere".into()),
            namespace: Some("media-sports".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some("web".into()),
            node_name: Some(stack.info.nodes[1].name.clone()),
            ..Default::default()
        }),
        status: None,
    };
    let created = stack.kube.create_pod(&elsewhere).await.unwrap();
    let other = CsiPod {
        name: "web-elsewhere".into(),
        uid: created.metadata.uid.unwrap(),
        ..csi_pod.clone()
    };
    let err = kubelet
        .publish(&other, &[("mode", "files")])
        .await
        .unwrap_err();
    // refused by ZTS's callback: the pod is scheduled on another node than the agent's
    assert_eq!(err.code(), Some(Code::PermissionDenied), "{err}");
    let said = err.to_string();
    assert!(
        said.contains("pod_node") && said.contains(&stack.info.nodes[1].name),
        "{said}"
    );
    let target = kubelet
        .volume_dir(&other.uid, "athenz-identity")
        .join("mount");
    assert!(!target.exists(), "the target is removed again");
    assert_eq!(under_kubelet_mounts(&stack), 0);
    let left = std::fs::read_dir(&stack.info.volumes_dir)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    assert_eq!(left, 0, "no volume dir left behind");
}
