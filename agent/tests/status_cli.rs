//! `athenz-identity-agent status` as the real binary over a volumes dir holding the agent's own
//! records for a flex volume, a CSI files-mode volume whose last rotation failed, and one whose
//! certificate expired: the table, the JSON, and the exit codes a script relies on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::agent_api::KeySource;
use athenz_core::volume::{
    CsiVolume, VolumeData, VolumeId, VolumeState, VolumeStatusRecord, VolumesDir, write_json_file,
};
use athenz_core::volume_mode::VolumeMode;
use std::process::Command;
use time::{Duration, OffsetDateTime};

const AGENT: &str = env!("CARGO_BIN_EXE_athenz-identity-agent");

fn volume(volumes: &VolumesDir, n: u8, csi: Option<VolumeMode>, expires_in: Duration) -> VolumeId {
    let id = VolumeId::parse(&format!("{n:02x}").repeat(32)).unwrap();
    let paths = volumes.volume(&id);
    std::fs::create_dir_all(&paths.dir).unwrap();
    let now = OffsetDateTime::now_utc();
    let uid = format!("0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b{n:02x}");
    write_json_file(
        &paths.data_json,
        &VolumeData {
            namespace: "media-sports".into(),
            pod_name: format!("web-{n}"),
            pod_uid: uid.clone(),
            service_account: "web".into(),
            mount_dir: format!("/var/lib/kubelet/pods/{uid}/volumes/x/y"),
            read_write: false,
            created_at: now,
            csi: csi.map(|mode| CsiVolume {
                volume_id: format!("csi-{n}"),
                mode,
                group: None,
                ip_san: false,
            }),
        },
        0o600,
    )
    .unwrap();
    write_json_file(
        &paths.state_json,
        &VolumeState {
            provider: "k8s.admin.athenz-provider".into(),
            instance_id: uid.clone(),
            domain: "media.sports".into(),
            service: "web".into(),
            pod_uid: uid,
            cert_serial: format!("5e{n:02x}"),
            previous_cert_serial: None,
            cert_expiry: now + expires_in,
            updated_at: now - Duration::minutes(10),
            // flex: the pod made its key; files mode: the agent; volume 3: a state written
            // before the setting existed (shown as agent)
            key_source: match (n, csi) {
                (3, _) => None,
                (_, Some(VolumeMode::CsiFiles)) => Some(KeySource::Agent),
                _ => Some(KeySource::Pod),
            },
        },
        0o600,
    )
    .unwrap();
    id
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(AGENT)
        .arg("status")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn status_lists_every_volume_and_exits_by_their_health() {
    let dir = tempfile::tempdir().unwrap();
    let volumes = VolumesDir::new(dir.path());
    let flex = volume(&volumes, 1, None, Duration::hours(1));
    let dir_arg = dir.path().to_str().unwrap();

    let (code, json, _) = run(&["--volumes-dir", dir_arg, "--json"]);
    assert_eq!(code, 0, "{json}");
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let v = &report["volumes"][0];
    assert_eq!(v["id"], flex.to_string());
    assert_eq!(v["pod"], "media-sports/web-1");
    assert_eq!(v["mode"], "flex");
    assert_eq!(v["principal"], "media.sports.web");
    assert_eq!(v["cert_serial"], "5e01");
    assert_eq!(v["refreshed_by"], "pod");
    assert_eq!(v["key_source"], "pod");
    assert_eq!(v["healthy"], true);

    // a files-mode volume whose last rotation failed, and an expired one
    let files = volume(&volumes, 2, Some(VolumeMode::CsiFiles), Duration::hours(1));
    let next = OffsetDateTime::now_utc() + Duration::minutes(3);
    VolumeStatusRecord::update(&volumes.volume(&files).status_json, |r| {
        r.next_refresh = Some(next);
        r.set_error("503 ZTS unavailable", OffsetDateTime::now_utc());
    })
    .unwrap();
    volume(
        &volumes,
        3,
        Some(VolumeMode::CsiSocket),
        Duration::minutes(-1),
    );
    // not volumes: skipped
    std::fs::create_dir(dir.path().join("not-a-volume")).unwrap();
    std::fs::create_dir(dir.path().join("ab".repeat(32))).unwrap();

    let (code, json, _) = run(&["--volumes-dir", dir_arg, "--json"]);
    assert_eq!(code, 1, "{json}");
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["volumes"].as_array().unwrap().len(), 3, "{json}");
    assert_eq!(report["unhealthy"], 2);
    let files_v = &report["volumes"][1];
    assert_eq!(files_v["mode"], "csi-files");
    assert_eq!(files_v["refreshed_by"], "agent");
    assert_eq!(files_v["key_source"], "agent");
    assert!(
        files_v["last_error"]
            .as_str()
            .unwrap()
            .ends_with("503 ZTS unavailable")
    );
    let expired = &report["volumes"][2];
    assert_eq!(expired["mode"], "csi-socket");
    assert_eq!(expired["key_source"], "agent");
    assert!(
        expired["problem"]
            .as_str()
            .unwrap()
            .starts_with("the certificate expired at")
    );

    // the table: a header, a line per volume, the problems, a summary
    let (code, text, _) = run(&["--volumes-dir", dir_arg]);
    assert_eq!(code, 1);
    assert!(text.starts_with("POD "), "{text}");
    let header = text.lines().next().unwrap();
    assert!(header.contains(" KEY "), "{header}");
    let flex_line = text
        .lines()
        .find(|l| l.starts_with("media-sports/web-1 "))
        .unwrap();
    let columns: Vec<&str> = flex_line.split_whitespace().collect();
    assert_eq!(
        &columns[columns.len() - 3..],
        ["pod", "pod", "yes"],
        "{flex_line}"
    );
    assert!(text.contains("media-sports/web-2"), "{text}");
    assert!(
        text.contains("the last attempt failed: 503 ZTS unavailable"),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("3 volumes, 2 unhealthy ({dir_arg})\n")),
        "{text}"
    );

    // no volumes dir: exit 2 naming it
    let (code, _, err) = run(&["--volumes-dir", "/nonexistent/athenz-volumes"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/athenz-volumes"), "{err}");
}
