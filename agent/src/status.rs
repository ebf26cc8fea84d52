//! `athenz-identity-agent status`: every identity volume on this node and the state it is in,
//! for an operator (`kubectl exec` into the agent pod) or a script (`--json`).
//!
//! It reads the agent's own records in the volumes dir (`data.json`, `state.json`,
//! `status.json`) and never asks the running agent: it answers when the agent is down or wedged,
//! which is when it is needed, and it adds nothing a pod could reach (the agent socket is mounted
//! into pods; a listing of every pod's identity does not belong there).

use athenz_core::agent_api::KeySource;
use athenz_core::volume::{
    DEFAULT_VOLUMES_DIR, VolumeData, VolumeId, VolumeState, VolumeStatusRecord, VolumesDir,
    read_json_file,
};
use athenz_core::volume_mode::VolumeMode;
use clap::Parser;
use serde::Serialize;
use std::path::PathBuf;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Share of a certificate's lifetime at which a pod's SIA refreshes by default
/// (`athenz_core::refresh::RefreshPolicy`): when a socket-mode refresh is expected.
const SIA_REFRESH_FRACTION: f64 = 0.7;

/// `athenz-identity-agent status`.
#[derive(Debug, Parser)]
#[command(
    name = "athenz-identity-agent status",
    about = "Shows every identity volume on this node: pod, principal, mode, certificate, next refresh, last error"
)]
pub struct StatusArgs {
    /// The agent's volumes dir (the agent's own setting).
    #[arg(long, env = "ATHENZ_VOLUMES_DIR", default_value = DEFAULT_VOLUMES_DIR)]
    pub volumes_dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One volume as the operator sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VolumeReport {
    /// The volume id (the directory name under the volumes dir).
    pub id: String,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// How the volume was made.
    pub mode: VolumeMode,
    /// `domain.service`, once an identity was issued.
    pub principal: Option<String>,
    /// Serial of the certificate issued last, lowercase hex.
    pub cert_serial: Option<String>,
    /// When that certificate expires, RFC 3339.
    pub not_after: Option<String>,
    /// When the next refresh is due, RFC 3339: the agent's own schedule in files mode, the
    /// SIA's default point of the lifetime otherwise.
    pub next_refresh: Option<String>,
    /// Who refreshes: `agent` (files mode) or `pod` (the pod's SIA).
    pub refreshed_by: &'static str,
    /// Where the current certificate's key was made: `pod` (it never left the pod) or `agent`;
    /// none before an identity was issued.
    pub key_source: Option<&'static str>,
    /// The last failure the agent met for this volume, `<RFC 3339 time> <message>`.
    pub last_error: Option<String>,
    /// Nothing below is wrong.
    pub healthy: bool,
    /// What is wrong, if anything.
    pub problem: Option<String>,
}

/// The node's report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeReport {
    /// The volumes dir read.
    pub volumes_dir: String,
    /// One entry per volume, by pod.
    pub volumes: Vec<VolumeReport>,
    /// How many are unhealthy.
    pub unhealthy: usize,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// Reads every volume under `volumes` at `now`. A directory that is not a volume id, or a
/// volume without `data.json` (a mount in progress), is skipped.
pub fn report(volumes: &VolumesDir, now: OffsetDateTime) -> std::io::Result<NodeReport> {
    let mut reports = Vec::new();
    for volume in volumes.recorded()? {
        let paths = &volume.paths;
        let state = read_json_file::<VolumeState>(&paths.state_json).ok();
        let record = VolumeStatusRecord::read(&paths.status_json);
        reports.push(volume_report(
            &volume.id,
            &volume.data,
            state.as_ref(),
            &record,
            now,
        ));
    }
    reports.sort_by(|a, b| a.pod.cmp(&b.pod).then(a.id.cmp(&b.id)));
    Ok(NodeReport {
        volumes_dir: volumes.root().display().to_string(),
        unhealthy: reports.iter().filter(|r| !r.healthy).count(),
        volumes: reports,
    })
}

fn volume_report(
    id: &VolumeId,
    data: &VolumeData,
    state: Option<&VolumeState>,
    record: &VolumeStatusRecord,
    now: OffsetDateTime,
) -> VolumeReport {
    let mode = data.mode();
    let refreshed_by = if mode.runs_sia() { "pod" } else { "agent" };
    let next_refresh = match (refreshed_by, state) {
        ("agent", _) => record.next_refresh,
        (_, Some(s)) => Some(s.updated_at + (s.cert_expiry - s.updated_at) * SIA_REFRESH_FRACTION),
        _ => None,
    };
    let problem = match (state, &record.last_error) {
        (None, None) => Some("no identity issued yet".to_owned()),
        (Some(s), _) if s.cert_expiry <= now => Some(format!(
            "the certificate expired at {}",
            rfc3339(s.cert_expiry)
        )),
        (_, Some(e)) => Some(format!("the last attempt failed: {}", e.message)),
        _ => None,
    };
    VolumeReport {
        id: id.to_string(),
        pod: format!("{}/{}", data.namespace, data.pod_name),
        pod_uid: data.pod_uid.clone(),
        mode,
        principal: state.map(|s| athenz_core::names::principal(&s.domain, &s.service)),
        cert_serial: state.map(|s| s.cert_serial.clone()),
        not_after: state.map(|s| rfc3339(s.cert_expiry)),
        next_refresh: next_refresh.map(rfc3339),
        refreshed_by,
        // states written before the setting existed hold agent-made keys
        key_source: state.map(|s| s.key_source.unwrap_or(KeySource::Agent).as_str()),
        last_error: record
            .last_error
            .as_ref()
            .map(|e| format!("{} {}", rfc3339(e.at), e.message)),
        healthy: problem.is_none(),
        problem,
    }
}

/// The table: one line per volume, then the problems.
pub fn to_text(report: &NodeReport) -> String {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut out = format!(
        "{:<40} {:<10} {:<28} {:<34} {:<20} {:<20} {:<6} {:<6} {}\n",
        "POD", "MODE", "PRINCIPAL", "SERIAL", "NOT AFTER", "NEXT REFRESH", "BY", "KEY", "HEALTHY"
    );
    for v in &report.volumes {
        out.push_str(&format!(
            "{:<40} {:<10} {:<28} {:<34} {:<20} {:<20} {:<6} {:<6} {}\n",
            v.pod,
            v.mode.name(),
            dash(&v.principal),
            dash(&v.cert_serial),
            dash(&v.not_after),
            dash(&v.next_refresh),
            v.refreshed_by,
            v.key_source.unwrap_or("-"),
            if v.healthy { "yes" } else { "NO" },
        ));
    }
    for v in report.volumes.iter().filter(|v| !v.healthy) {
        out.push_str(&format!(
            "{} ({}): {}\n",
            v.pod,
            v.id,
            v.problem.as_deref().unwrap_or("")
        ));
    }
    out.push_str(&format!(
        "{} volumes, {} unhealthy ({})\n",
        report.volumes.len(),
        report.unhealthy,
        report.volumes_dir
    ));
    out
}

/// Runs `athenz-identity-agent status <args>` (`args` without the program name and `status`):
/// prints the report; exit 0 when every volume is healthy, 1 when one is not, 2 when the volumes
/// dir cannot be read.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    use std::io::Write;
    let args = StatusArgs::parse_from(
        std::iter::once(std::ffi::OsString::from("athenz-identity-agent status")).chain(args),
    );
    let report = match report(
        &VolumesDir::new(&args.volumes_dir),
        OffsetDateTime::now_utc(),
    ) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "cannot read the volumes dir {}: {e}",
                args.volumes_dir.display()
            );
            return std::process::ExitCode::from(2);
        }
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report)
            .map(|j| j + "\n")
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot print the report: {e}\"}}\n"))
    } else {
        to_text(&report)
    };
    let printed = std::io::stdout().lock().write_all(text.as_bytes());
    if report.unhealthy == 0 && printed.is_ok() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}
