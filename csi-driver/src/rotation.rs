//! Files mode keeps a pod's credentials fresh with no process in the pod (docs/design.md §4.10):
//! one task per published volume re-issues the identity
//!
//! - at the usual fraction of the certificate's lifetime (with jitter), retrying failures with
//!   exponential backoff while the old set stays in place;
//! - for a volume whose certificate names the pod's IP (`ipSAN: "true"`), as soon as the
//!   kubelet lists a pod IP the certificate lacks: the first certificate is issued before the
//!   pod has an IP, and a new sandbox may change it. The IP is looked at every
//!   [`IpWatch::without_ip`] until the certificate carries one, then every [`IpWatch::with_ip`].
//!   A volume without an IP SAN is issued once and looked at only when its refresh is due.
//!
//! A re-issue presents the pair the volume holds (a refresh); a refusal of that (e.g. the
//! certificate expired while the agent was down) falls back to a fresh registration. Each task
//! records the volume's health, which `NodeGetVolumeStats` and the metrics report. Unpublish
//! stops the task; after an agent restart [`Rotation::resume`] finds the volumes again.

use crate::{CurrentPair, IssueError, Issuer};
use athenz_core::agent_api::IdentityResponse;
use athenz_core::crypto::CertInfo;
use athenz_core::files::{CERT_FILE, FileSet, KEY_FILE, Owner, write_credentials};
use athenz_core::issuance::Registration;
use athenz_core::refresh::{Backoff, RefreshPolicy};
use athenz_core::secret::Secret;
use athenz_core::volume::{RecordedVolume, VolumeData, VolumeId, VolumeStatusRecord, VolumesDir};
use athenz_core::volume_mode::VolumeMode;
use athenz_core::volume_mount::mountinfo::MountTable;
use athenz_core::volume_mount::{files_mode, seal};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use time::OffsetDateTime;
use tokio::time::Instant;

/// How often the pod's IP is looked at.
#[derive(Debug, Clone, Copy)]
pub struct IpWatch {
    /// While the certificate has no IP (the pod is starting): soon after the sandbox is up.
    pub without_ip: Duration,
    /// Once it has one (a new sandbox may change it).
    pub with_ip: Duration,
}

impl Default for IpWatch {
    fn default() -> Self {
        Self {
            without_ip: Duration::from_millis(500),
            with_ip: Duration::from_secs(30),
        }
    }
}

/// A volume's health, as `NodeGetVolumeStats` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// When the certificate in the volume expires.
    pub not_after: OffsetDateTime,
    /// The last re-issue's failure, cleared by the next success.
    pub last_error: Option<String>,
    /// Re-issues that succeeded.
    pub rotations: u64,
}

impl Health {
    /// Why the volume is abnormal now, if it is.
    pub fn abnormal(&self, now: OffsetDateTime) -> Option<String> {
        if self.not_after <= now {
            return Some(format!(
                "the certificate expired at {}{}",
                self.not_after,
                self.last_error
                    .as_deref()
                    .map(|e| format!("; the last refresh failed: {e}"))
                    .unwrap_or_default()
            ));
        }
        self.last_error
            .as_deref()
            .map(|e| format!("the last refresh failed: {e}"))
    }
}

/// What a certificate says that rotation needs.
#[derive(Debug, Clone)]
struct CertSummary {
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    ips: Vec<IpAddr>,
}

impl From<&CertInfo> for CertSummary {
    fn from(info: &CertInfo) -> Self {
        Self {
            not_before: info.not_before,
            not_after: info.not_after,
            ips: info.ip_addresses.clone(),
        }
    }
}

struct Tracked {
    task: tokio::task::AbortHandle,
    gate: Arc<WriteGate>,
    health: Arc<Mutex<Health>>,
    /// The volume's pod (namespace, name), for [`Rotation::expiries`].
    pod: (String, String),
}

/// When a tracked volume's certificate expires, and whose it is: the agent's per-volume gauge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeExpiry {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// When the certificate now in the volume expires.
    pub not_after: OffsetDateTime,
}

impl Tracked {
    /// Stops the task for good: once this returns, no write of it runs or will start.
    fn stop(&self) {
        self.gate.close();
        self.task.abort();
    }
}

/// Orders a volume's writes against its unpublish. Aborting the rotation task is not enough: a
/// task already past its last await is inside its synchronous write and finishes it, and if
/// unpublish has detached the tmpfs by then, the set (private key included) lands by path in the
/// host directory beneath it. Every write runs under this lock and only while the gate is open;
/// [`WriteGate::close`] takes the same lock, so it waits for a write in progress and no write
/// starts after it.
#[derive(Debug, Default)]
struct WriteGate {
    closed: Mutex<bool>,
}

impl WriteGate {
    fn write(&self, write: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
        let closed = lock(&self.closed);
        if *closed {
            return Err("the volume was unpublished: nothing written".into());
        }
        write()
    }

    fn close(&self) {
        *lock(&self.closed) = true;
    }

    fn is_closed(&self) -> bool {
        *lock(&self.closed)
    }
}

/// The rotation tasks of the files-mode volumes on this node.
pub struct Rotation<I: Issuer> {
    issuer: Arc<I>,
    policy: RefreshPolicy,
    backoff: Backoff,
    ip_watch: IpWatch,
    tracked: Mutex<HashMap<VolumeId, Tracked>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `answer` into the files dir as one set (core::files: a reader never sees a torn set):
/// key and ntoken 0600, or 0640 with `group` as their group (the pod's fsGroup).
pub fn write_set(
    files: &Path,
    answer: &IdentityResponse,
    group: Option<u32>,
) -> Result<(), String> {
    let owner = group.map(|gid| Owner {
        uid: None,
        gid: Some(gid),
    });
    // files mode: the agent made the key, so an answer always carries it
    let creds = answer
        .credentials_with_key()
        .ok_or("the issuer's answer carries no key (files mode needs an agent-made key)")?;
    write_credentials(&FileSet::new(files), &creds, owner)
        .map_err(|e| format!("writing the credentials into {}: {e}", files.display()))
}

/// The leaf of an answer.
fn leaf_info(cert_pem: &str) -> Result<CertInfo, String> {
    CertInfo::from_pem(cert_pem).map_err(|e| format!("the issued certificate: {e}"))
}

impl<I: Issuer> Rotation<I> {
    /// No volumes yet.
    pub fn new(issuer: Arc<I>, policy: RefreshPolicy, backoff: Backoff, ip_watch: IpWatch) -> Self {
        Self {
            issuer,
            policy,
            backoff,
            ip_watch,
            tracked: Mutex::new(HashMap::new()),
        }
    }

    /// Starts (or restarts) rotating volume `id`, whose set in `files` holds `cert`.
    pub fn track(
        self: &Arc<Self>,
        id: VolumeId,
        data: VolumeData,
        files: PathBuf,
        cert: &CertInfo,
    ) {
        let health = Arc::new(Mutex::new(Health {
            not_after: cert.not_after,
            last_error: None,
            rotations: 0,
        }));
        let gate = Arc::new(WriteGate::default());
        let pod = (data.namespace.clone(), data.pod_name.clone());
        let task = tokio::spawn(Arc::clone(self).run(
            id.clone(),
            data,
            files,
            CertSummary::from(cert),
            Arc::clone(&gate),
            Arc::clone(&health),
        ));
        let old = lock(&self.tracked).insert(
            id,
            Tracked {
                task: task.abort_handle(),
                gate,
                health,
                pod,
            },
        );
        if let Some(old) = old {
            old.stop();
        }
    }

    /// Starts rotating volume `id` from the certificate of the set already in `files` (after a
    /// restart, or a publish that finds the volume in place but untracked).
    pub fn track_from_disk(
        self: &Arc<Self>,
        id: VolumeId,
        data: VolumeData,
        files: &Path,
    ) -> Result<(), String> {
        let set = FileSet::new(files)
            .read(&[CERT_FILE])
            .map_err(|e| format!("reading the set in {}: {e}", files.display()))?;
        let cert = leaf_info(&String::from_utf8_lossy(&set[0]))?;
        // found again: sealed (an earlier release's volume, or one a stopping agent opened)
        if let Err(e) = seal::seal(files) {
            tracing::warn!(%id, error = %e.0, "files-mode volume not sealed");
        }
        self.track(id, data, files.to_owned(), &cert);
        Ok(())
    }

    /// Stops rotating volume `id` (unpublish). When it returns, no write into the volume's files
    /// is running or will start, so the caller may unmount them.
    pub fn forget(&self, id: &VolumeId) {
        let old = lock(&self.tracked).remove(id);
        if let Some(old) = old {
            old.stop();
        }
    }

    /// Stops rotating every volume (the agent is stopping). When it returns, no write of a
    /// rotation is running or will start.
    pub fn stop_all(&self) {
        for (_, tracked) in lock(&self.tracked).drain() {
            tracked.stop();
        }
    }

    /// Whether volume `id` is being rotated.
    pub fn is_tracked(&self, id: &VolumeId) -> bool {
        lock(&self.tracked).contains_key(id)
    }

    /// The health of volume `id`, if tracked.
    pub fn health(&self, id: &VolumeId) -> Option<Health> {
        lock(&self.tracked).get(id).map(|t| lock(&t.health).clone())
    }

    /// How many volumes are tracked, and how many of them are abnormal now.
    pub fn counts(&self) -> (usize, usize) {
        let now = OffsetDateTime::now_utc();
        let tracked = lock(&self.tracked);
        let abnormal = tracked
            .values()
            .filter(|t| lock(&t.health).abnormal(now).is_some())
            .count();
        (tracked.len(), abnormal)
    }

    /// Each tracked volume's certificate expiry, the earliest first (ties by namespace and pod),
    /// at most `limit` of them: the ones an operator must see first.
    pub fn expiries(&self, limit: usize) -> Vec<VolumeExpiry> {
        let mut all: Vec<VolumeExpiry> = lock(&self.tracked)
            .values()
            .map(|t| VolumeExpiry {
                namespace: t.pod.0.clone(),
                pod: t.pod.1.clone(),
                not_after: lock(&t.health).not_after,
            })
            .collect();
        all.sort_by(|a, b| {
            (a.not_after, &a.namespace, &a.pod).cmp(&(b.not_after, &b.namespace, &b.pod))
        });
        all.truncate(limit);
        all
    }

    /// After an agent restart: finds the files-mode volumes in `volumes` whose tmpfs is still
    /// mounted and resumes rotating them from the set on disk. Returns how many; volumes that
    /// cannot be resumed (lost mounts after a reboot, an unreadable set) are left for kubelet's
    /// next publish or unpublish, and logged.
    pub fn resume(self: &Arc<Self>, volumes: &VolumesDir) -> usize {
        let Ok(recorded) = volumes.recorded() else {
            return 0;
        };
        let table = match MountTable::read() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the mount table; files-mode volumes not resumed");
                return 0;
            }
        };
        let mut resumed = 0;
        for RecordedVolume { id, paths, data } in recorded {
            if data.mode() != VolumeMode::CsiFiles {
                continue;
            }
            if !files_mode::tmpfs_mounted(&table, &paths) {
                tracing::warn!(%id, "files-mode volume lost its tmpfs (a reboot?); left for kubelet");
                continue;
            }
            match self.track_from_disk(id.clone(), data, &paths.files) {
                Ok(()) => resumed += 1,
                Err(e) => tracing::warn!(%id, error = %e, "files-mode volume not resumed"),
            }
        }
        resumed
    }

    async fn run(
        self: Arc<Self>,
        id: VolumeId,
        data: VolumeData,
        files: PathBuf,
        mut cert: CertSummary,
        gate: Arc<WriteGate>,
        health: Arc<Mutex<Health>>,
    ) {
        let group = data.csi.as_ref().and_then(|c| c.group);
        // `files` is `<volume dir>/files`; the operator's record sits beside it (status.json)
        let record = files.parent().map(|dir| dir.join("status.json"));
        let mut failures: u32 = 0;
        loop {
            let wait = if failures == 0 {
                self.policy.delay(
                    cert.not_before,
                    cert.not_after,
                    OffsetDateTime::now_utc(),
                    athenz_core::random::unit(),
                )
            } else {
                self.backoff.delay_before_expiry(
                    failures - 1,
                    athenz_core::random::unit(),
                    cert.not_after,
                    OffsetDateTime::now_utc(),
                )
            };
            if let Some(record) = &record {
                let last_error = lock(&health).last_error.clone();
                let next = OffsetDateTime::now_utc() + wait;
                // under the gate, as every write: unpublish must find the directory quiet
                let updated = gate.write(|| {
                    VolumeStatusRecord::update(record, |r| {
                        r.next_refresh = Some(next);
                        match &last_error {
                            Some(e) => r.set_error(e, OffsetDateTime::now_utc()),
                            None => r.last_error = None,
                        }
                    })
                    .map_err(|e| e.to_string())
                });
                if let Err(e) = updated {
                    tracing::debug!(%id, error = %e, "status record not written");
                }
            }
            let reason = self
                .wait_for_reason(&data, &cert, Instant::now() + wait)
                .await;
            let rotated = self.rotate_once(&id, &data, &files, group, &gate).await;
            if gate.is_closed() {
                return;
            }
            match rotated {
                Ok(info) => {
                    tracing::info!(%id, reason, expires = %info.not_after, "files-mode identity re-issued");
                    cert = CertSummary::from(&info);
                    failures = 0;
                    let mut h = lock(&health);
                    h.not_after = info.not_after;
                    h.last_error = None;
                    h.rotations += 1;
                }
                Err(e) => {
                    tracing::warn!(%id, reason, error = %e, "files-mode re-issue failed; the old set stays");
                    failures = failures.saturating_add(1);
                    lock(&health).last_error = Some(e);
                }
            }
        }
    }

    /// Sleeps until the refresh is due or, for a volume that names the pod's IP, the pod's IP is
    /// one the certificate lacks; says which.
    async fn wait_for_reason(
        &self,
        data: &VolumeData,
        cert: &CertSummary,
        due: Instant,
    ) -> &'static str {
        if !data.csi.as_ref().is_some_and(|c| c.ip_san) {
            tokio::time::sleep_until(due).await;
            return "refresh due";
        }
        loop {
            let poll = if cert.ips.is_empty() {
                self.ip_watch.without_ip
            } else {
                self.ip_watch.with_ip
            };
            let now = Instant::now();
            if now >= due {
                return "refresh due";
            }
            tokio::time::sleep(poll.min(due - now)).await;
            if Instant::now() >= due {
                return "refresh due";
            }
            if let Ok(Some(ip)) = self.issuer.pod_ip(data).await
                && !cert.ips.contains(&ip)
            {
                return "pod IP changed";
            }
        }
    }

    /// One re-issue: refresh with the pair on disk, or register anew when that is refused.
    async fn rotate_once(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        files: &Path,
        group: Option<u32>,
        gate: &WriteGate,
    ) -> Result<CertInfo, String> {
        let _serialised = self.issuer.lock_volume(id).await;
        if gate.is_closed() {
            // unpublished while this task waited for the volume
            return Err("the volume was unpublished".to_owned());
        }
        let current = FileSet::new(files)
            .read(&[KEY_FILE, CERT_FILE])
            .map_err(|e| format!("reading the current set: {e}"))
            .map(|mut set| {
                let cert = String::from_utf8_lossy(&set.remove(1)).into_owned();
                let key = String::from_utf8_lossy(&set.remove(0)).into_owned();
                CurrentPair {
                    key_pem: Secret::new(key),
                    cert_pem: cert,
                }
            });
        let answer = match current {
            Ok(pair) => match self.issuer.reissue(id, data, &pair).await {
                Err(IssueError {
                    transient: false,
                    message,
                }) => {
                    tracing::info!(%id, refusal = %message, "refresh refused; registering anew");
                    self.issuer.issue(id, data, Registration::Again).await
                }
                other => other,
            },
            Err(e) => {
                tracing::warn!(%id, error = %e, "registering anew");
                self.issuer.issue(id, data, Registration::Again).await
            }
        }
        .map_err(|e| e.message)?;
        // the tmpfs takes writes only during this one (docs/design.md §4.10)
        gate.write(|| seal::write_sealed(files, || write_set(files, &answer.answer, group)))?;
        Ok(answer.cert)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::issuance::Issued;

    /// An issuer whose re-issue blocks its worker thread (no await) until released: the rotation
    /// task is mid-poll, past anything an abort could interrupt, when the volume is unpublished.
    struct StalledIssuer {
        entered: std::sync::mpsc::SyncSender<()>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
        answer: Issued,
    }

    impl Issuer for StalledIssuer {
        type VolumeLock = ();

        async fn lock_volume(&self, _: &VolumeId) {}

        async fn issue(
            &self,
            _: &VolumeId,
            _: &VolumeData,
            _: Registration,
        ) -> Result<Issued, IssueError> {
            Err(IssueError {
                transient: false,
                message: "not in this test".into(),
            })
        }

        async fn reissue(
            &self,
            _: &VolumeId,
            _: &VolumeData,
            _: &CurrentPair,
        ) -> Result<Issued, IssueError> {
            self.entered.send(()).unwrap();
            lock(&self.release)
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            Ok(self.answer.clone())
        }

        async fn pod_ip(&self, _: &VolumeData) -> Result<Option<IpAddr>, IssueError> {
            Ok(None)
        }

        fn ready(&self) -> bool {
            true
        }
    }

    fn identity(serial: u64) -> IdentityResponse {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(["pod.example".to_owned()]).unwrap();
        params.serial_number = Some(serial.into());
        let cert = params.self_signed(&key).unwrap();
        IdentityResponse {
            key_pem: Some(Secret::new(key.serialize_pem())),
            cert_pem: cert.pem(),
            ca_cert_pem: cert.pem(),
            ntoken: Secret::new("v=S1;d=media;n=web;s=sig".to_owned()),
            expires_at: "2030-01-01T00:00:00Z".into(),
        }
    }

    fn serial_on_disk(files: &Path) -> String {
        let set = FileSet::new(files).read(&[CERT_FILE]).unwrap();
        leaf_info(&String::from_utf8_lossy(&set[0]))
            .unwrap()
            .serial_hex
    }

    /// Regression (CI, stop 26): unpublish raced a rotation that was inside its write; the set was
    /// written after the tmpfs was detached, onto the host directory beneath, and the unpublish
    /// failed with "Directory not empty". Once `forget` returns, nothing is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_write_after_forget_returns_even_mid_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let files = dir.path().join("files");
        std::fs::create_dir(&files).unwrap();
        let first = identity(0x0a);
        write_set(&files, &first, None).unwrap();
        assert_eq!(serial_on_disk(&files), "a");

        let (entered_tx, entered) = std::sync::mpsc::sync_channel(1);
        let (release, release_rx) = std::sync::mpsc::channel();
        let issuer = Arc::new(StalledIssuer {
            entered: entered_tx,
            release: Mutex::new(release_rx),
            answer: {
                let answer = identity(0x0b);
                let cert = leaf_info(&answer.cert_pem).unwrap();
                Issued { answer, cert }
            },
        });
        let policy = RefreshPolicy {
            min_delay: Duration::from_millis(1),
            ..RefreshPolicy::default()
        };
        let rotation = Arc::new(Rotation::new(
            issuer,
            policy,
            Backoff::default(),
            IpWatch::default(),
        ));
        let id = VolumeId::parse(&"ab".repeat(32)).unwrap();
        let data = volume_data(None);
        let mut due_now = leaf_info(&first.cert_pem).unwrap();
        due_now.not_after = OffsetDateTime::now_utc() - time::Duration::seconds(1);
        rotation.track(id.clone(), data, files.clone(), &due_now);

        let stopper = Arc::clone(&rotation);
        let stopped = tokio::task::spawn_blocking(move || {
            entered.recv_timeout(Duration::from_secs(10)).unwrap();
            stopper.forget(&id);
            release.send(()).unwrap();
        });
        stopped.await.unwrap();
        // the stalled task now carries on; without the gate it writes serial b within microseconds
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            serial_on_disk(&files),
            "a",
            "a set was written after forget returned"
        );
        assert!(!rotation.is_tracked(&VolumeId::parse(&"ab".repeat(32)).unwrap()));
    }

    /// An issuer that only answers the pod's IP, counting how often it was asked.
    struct IpOnlyIssuer {
        ip: Option<IpAddr>,
        asked: std::sync::atomic::AtomicUsize,
    }

    impl Issuer for IpOnlyIssuer {
        type VolumeLock = ();

        async fn lock_volume(&self, _: &VolumeId) {}

        async fn issue(
            &self,
            _: &VolumeId,
            _: &VolumeData,
            _: Registration,
        ) -> Result<Issued, IssueError> {
            unreachable!("not in this test")
        }

        async fn reissue(
            &self,
            _: &VolumeId,
            _: &VolumeData,
            _: &CurrentPair,
        ) -> Result<Issued, IssueError> {
            unreachable!("not in this test")
        }

        async fn pod_ip(&self, _: &VolumeData) -> Result<Option<IpAddr>, IssueError> {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(self.ip)
        }

        fn ready(&self) -> bool {
            true
        }
    }

    /// A volume of pod default/web, published by the CSI driver as `csi` says.
    fn volume_data(csi: Option<athenz_core::volume::CsiVolume>) -> VolumeData {
        VolumeData {
            namespace: "default".into(),
            pod_name: "web".into(),
            pod_uid: "uid".into(),
            service_account: "web".into(),
            mount_dir: "/var/lib/kubelet/pods/uid/volumes/x".into(),
            read_write: false,
            created_at: OffsetDateTime::now_utc(),
            csi,
        }
    }

    fn files_volume(ip_san: bool) -> VolumeData {
        volume_data(Some(athenz_core::volume::CsiVolume {
            volume_id: "csi-0123".into(),
            mode: VolumeMode::CsiFiles,
            group: None,
            ip_san,
        }))
    }

    /// A volume without an IP SAN is issued once: the rotation neither asks for the pod's IP nor
    /// re-issues before the refresh is due, even once the pod has an IP. One with an IP SAN
    /// re-issues as soon as the kubelet lists an IP its certificate lacks.
    #[tokio::test(start_paused = true)]
    async fn only_a_volume_that_names_the_pod_ip_watches_it() {
        let issuer = Arc::new(IpOnlyIssuer {
            ip: Some("10.244.0.7".parse().unwrap()),
            asked: Default::default(),
        });
        let rotation = Rotation::new(
            Arc::clone(&issuer),
            RefreshPolicy::default(),
            Backoff::default(),
            IpWatch::default(),
        );
        let now = OffsetDateTime::now_utc();
        let without_ip = CertSummary {
            not_before: now,
            not_after: now + time::Duration::hours(1),
            ips: vec![],
        };
        let started = Instant::now();
        let due = started + Duration::from_secs(2520);
        let reason = rotation
            .wait_for_reason(&files_volume(false), &without_ip, due)
            .await;
        assert_eq!(reason, "refresh due");
        assert!(Instant::now() >= due);
        assert_eq!(
            issuer.asked.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the pod's IP was looked at for a volume that does not name it"
        );

        let started = Instant::now();
        let reason = rotation
            .wait_for_reason(
                &files_volume(true),
                &without_ip,
                started + Duration::from_secs(2520),
            )
            .await;
        assert_eq!(reason, "pod IP changed");
        assert!(Instant::now() - started <= IpWatch::default().without_ip);
        assert_eq!(issuer.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The per-volume expiries name each volume's pod, the earliest first, at most the limit,
    /// and follow a rotation's new certificate and an unpublish.
    #[tokio::test]
    async fn expiries_name_each_volumes_pod_earliest_first_and_are_bounded() {
        let issuer = Arc::new(IpOnlyIssuer {
            ip: None,
            asked: Default::default(),
        });
        let rotation = Arc::new(Rotation::new(
            issuer,
            RefreshPolicy::default(),
            Backoff::default(),
            IpWatch::default(),
        ));
        let dir = tempfile::tempdir().unwrap();
        let id = |n: u8| VolumeId::parse(&format!("{n:064x}")).unwrap();
        let mut later = None;
        for (n, pod) in [(1, "late"), (2, "soon"), (3, "middle")] {
            let mut data = files_volume(false);
            data.pod_name = pod.into();
            let mut cert = leaf_info(&identity(u64::from(n)).cert_pem).unwrap();
            cert.not_after = OffsetDateTime::now_utc()
                + time::Duration::hours(match pod {
                    "soon" => 1,
                    "middle" => 2,
                    _ => 3,
                });
            if pod == "late" {
                later = Some(cert.not_after);
            }
            rotation.track(id(n), data, dir.path().join(pod), &cert);
        }
        let pods = |limit| -> Vec<String> {
            rotation
                .expiries(limit)
                .into_iter()
                .map(|e| format!("{}/{}", e.namespace, e.pod))
                .collect()
        };
        assert_eq!(pods(10), ["default/soon", "default/middle", "default/late"]);
        assert_eq!(pods(2), ["default/soon", "default/middle"], "bounded");
        assert_eq!(rotation.expiries(10)[2].not_after, later.unwrap());
        rotation.forget(&id(2));
        assert_eq!(pods(10), ["default/middle", "default/late"]);
    }

    #[test]
    fn health_names_what_is_wrong() {
        let now = OffsetDateTime::now_utc();
        let fine = Health {
            not_after: now + time::Duration::hours(1),
            last_error: None,
            rotations: 3,
        };
        assert_eq!(fine.abnormal(now), None);
        let failing = Health {
            last_error: Some("ZTS answered 503".into()),
            ..fine.clone()
        };
        assert!(failing.abnormal(now).unwrap().contains("ZTS answered 503"));
        let expired = Health {
            not_after: now - time::Duration::seconds(1),
            ..failing
        };
        let why = expired.abnormal(now).unwrap();
        assert!(why.contains("expired") && why.contains("503"), "{why}");
    }
}
