//! Kubernetes' own storage e2e suite against `csi.athenz.io` on the real node: `e2e.test` (the
//! test binary of `k8s.io/kubernetes/test/e2e`, built from the pinned module by
//! `harness/real-node/kube/build.sh --e2e`) with a test-driver file, as storage vendors run it against their
//! drivers ("External Storage [Driver: csi.athenz.io]"). The driver serves inline ephemeral
//! volumes only, so the patterns that apply are "CSI Ephemeral-volume"; the others skip
//! themselves from the driver file's capabilities.
//!
//! The suite's pods run `e2epod.GetDefaultTestImage()`, busybox under its registry name; it is
//! built here from Debian's static busybox (every applet a link to it) and imported under that
//! name, since the node pulls nothing.

use super::images::{self, ImageSpec};
use super::{Cluster, ClusterOptions};
use anyhow::{Context, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The image `e2epod.GetDefaultTestImage()` names on Linux in the pinned Kubernetes
/// (test/utils/image/manifest.go: `registry.k8s.io/e2e-test-images`, busybox, its tag).
pub const E2E_BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";

/// How the suite names this driver in each of its specs.
const DRIVER_TAG: &str = "[Driver: csi.athenz.io]";
/// What selects the suite's specs for this driver.
const FOCUS: &str = r"External.Storage \[Driver: csi\.athenz\.io\]";

/// The `e2e.test` built for the pinned Kubernetes.
pub fn default_e2e_test() -> PathBuf {
    super::workspace_path(&format!("target/kube/{}/e2e/e2e.test", super::KUBE_VERSION))
}

/// What the run found.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// This driver's specs that ran and passed, by name.
    pub passed: Vec<String>,
    /// Anything that failed (a spec, or the suite's own setup), with the suite's message.
    pub failed: Vec<(String, String)>,
    /// This driver's specs the suite skipped, with its reason (what they need that a
    /// read-only inline driver does not offer).
    pub skipped: Vec<(String, String)>,
    /// The suite's wall time, seconds.
    pub seconds: f64,
}

/// The test-driver file: `csi.athenz.io` serves one kind of volume, an inline ephemeral one,
/// always mounted read-only (so `ReadOnly: true`: the suite then skips its read/write checks
/// rather than expect writes to land). No storage class, snapshots or topology: the patterns
/// that need them skip.
fn driver_definition() -> serde_json::Value {
    serde_json::json!({
        "DriverInfo": {
            "Name": "csi.athenz.io",
            "SupportedFsType": {"": {}},
            "Capabilities": {
                "persistence": false,
                "exec": false,
                "multipods": true,
                "singleNodeVolume": true,
                "block": false,
                "fsGroup": false,
                "topology": false,
                "controllerExpansion": false,
                "nodeExpansion": false,
                "volumeLimits": false,
                "snapshotDataSource": false,
                "pvcDataSource": false,
                "offlineExpansion": false,
                "onlineExpansion": false,
                "capReadWriteOncePod": false,
                "multiplePVsSameID": false
            }
        },
        "InlineVolumes": [
            {"Attributes": {"mode": "files"}, "ReadOnly": true, "Shared": false}
        ]
    })
}

/// Builds the suite's busybox: the static binary and one link per applet, so `/bin/sh -c
/// "mount | grep …"` runs as in the upstream image.
fn import_busybox(cluster: &Cluster) -> anyhow::Result<()> {
    let busybox = Path::new(super::scenario::BUSYBOX);
    if !busybox.is_file() {
        bail!(
            "{} is missing: apt-get install busybox-static",
            busybox.display()
        );
    }
    let root = cluster.layout.images.join("e2e-busybox-root");
    let bin = root.join("bin");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    std::fs::copy(busybox, bin.join("busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
    let applets = images::run(
        Command::new(busybox).arg("--list"),
        "listing busybox applets",
    )?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        if applet == "busybox" || applet.contains('/') {
            continue;
        }
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .with_context(|| format!("linking applet {applet}"))?;
    }
    let archive = images::build(
        &cluster.layout.images,
        &ImageSpec {
            name: E2E_BUSYBOX.to_owned(),
            files: vec![(root, "/".to_owned())],
            entrypoint: vec!["/bin/sh".to_owned()],
        },
    )?;
    images::import(&cluster.layout, &archive)
}

/// Runs the suite's specs for `csi.athenz.io`; `report_dir` gets its junit report and log.
fn run_suite(cluster: &Cluster, e2e_test: &Path, report_dir: &Path) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(report_dir)
        .with_context(|| format!("creating {}", report_dir.display()))?;
    let driver_file = report_dir.join("csi.athenz.io.json");
    std::fs::write(
        &driver_file,
        serde_json::to_vec_pretty(&driver_definition())?,
    )
    .with_context(|| format!("writing {}", driver_file.display()))?;
    let junit = report_dir.join("junit.xml");
    let log = report_dir.join("e2e.log");
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let started = Instant::now();
    let status = Command::new(e2e_test)
        .arg(format!(
            "--kubeconfig={}",
            cluster.info.kubeconfig.display()
        ))
        .arg("--provider=local")
        .arg(format!("--storage.testdriver={}", driver_file.display()))
        .arg(format!("--ginkgo.focus={FOCUS}"))
        .arg(format!("--ginkgo.junit-report={}", junit.display()))
        .arg("--ginkgo.no-color")
        .arg("--ginkgo.timeout=1h")
        .arg(format!("--report-dir={}", report_dir.display()))
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .status()
        .with_context(|| format!("starting {}", e2e_test.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&junit).with_context(|| {
        format!(
            "{} wrote no report ({status}); its log: {}",
            e2e_test.display(),
            log.display()
        )
    })?;
    let outcome = read_junit(&text, seconds);
    if !status.success() && outcome.failed.is_empty() {
        bail!(
            "{} failed ({status}) with no failed spec in its report; its log: {}",
            e2e_test.display(),
            log.display()
        );
    }
    Ok(outcome)
}

/// This driver's verdicts in the suite's junit report.
fn read_junit(text: &str, seconds: f64) -> Outcome {
    let mut outcome = Outcome {
        passed: Vec::new(),
        failed: Vec::new(),
        skipped: Vec::new(),
        seconds,
    };
    for case in athenz_testbed::junit::cases(text) {
        // the suite's other specs (focus-filtered) and its report hooks say nothing of the driver
        let ours = case.name.contains(DRIVER_TAG);
        if case.passed() || case.skipped() {
            if !ours {
                continue;
            }
            if case.passed() {
                outcome.passed.push(case.name);
            } else {
                outcome.skipped.push((case.name, case.message));
            }
        } else {
            let message = if case.message.is_empty() {
                "(no message)".to_owned()
            } else {
                case.message
            };
            outcome.failed.push((case.name, message));
        }
    }
    outcome
}

/// `cluster storage-e2e`: up, the suite, down. `Ok(false)` when a spec failed or none passed.
pub async fn storage_e2e(
    options: ClusterOptions,
    e2e_test: PathBuf,
    report_dir: Option<PathBuf>,
) -> anyhow::Result<bool> {
    if !e2e_test.is_file() {
        bail!(
            "{} is missing: build it with harness/real-node/kube/build.sh --e2e",
            e2e_test.display()
        );
    }
    let report_dir = report_dir.unwrap_or_else(|| options.state_dir.join("storage-e2e"));
    let mut report = |line: String| println!("{line}");
    let cluster = Cluster::start(&options, &mut report).await?;
    println!(
        "Kubernetes {} with our release up; importing {E2E_BUSYBOX}",
        cluster.info.kubernetes_version
    );
    let outcome = import_busybox(&cluster).and_then(|()| {
        println!("running {} --ginkgo.focus='{FOCUS}'", e2e_test.display());
        run_suite(&cluster, &e2e_test, &report_dir)
    });
    let stopped = cluster.stop(&mut |_| {}).await;
    let outcome = outcome?;
    stopped?;
    for name in &outcome.passed {
        println!("passed  {name}");
    }
    for (name, reason) in &outcome.skipped {
        println!("skipped {name}: {reason}");
    }
    for (name, message) in &outcome.failed {
        println!("FAILED  {name}: {message}");
    }
    println!(
        "storage e2e for csi.athenz.io: {} passed, {} failed, {} skipped by the suite in {:.0} s; report in {}",
        outcome.passed.len(),
        outcome.failed.len(),
        outcome.skipped.len(),
        outcome.seconds,
        report_dir.display()
    );
    Ok(outcome.failed.is_empty() && !outcome.passed.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn junit_verdicts_are_read_per_case() {
        let text = r#"<testsuite><testcase name="[ReportBeforeSuite]" status="passed"></testcase>
<testcase name="[It] a &#39;ro&#39; volume [Driver: csi.athenz.io]" classname="x" status="passed" time="1"></testcase>
<testcase name="[It] another driver&#39;s [Driver: other]" status="passed"></testcase>
<testcase name="[It] rw one [Driver: csi.athenz.io]" status="skipped"><skipped message="needs &quot;rw&quot;"></skipped></testcase>
<testcase name="[It] not ours" status="skipped"><skipped message="focus"></skipped></testcase>
<testcase name="[SynchronizedBeforeSuite]" status="failed"><failure message="no node &lt;ready&gt;&#xA;Got &#34;x&#34;" type="failed">x</failure></testcase></testsuite>"#;
        let outcome = read_junit(text, 1.0);
        assert_eq!(
            outcome.passed,
            ["[It] a 'ro' volume [Driver: csi.athenz.io]"]
        );
        assert_eq!(
            outcome.skipped,
            [(
                "[It] rw one [Driver: csi.athenz.io]".to_owned(),
                "needs \"rw\"".to_owned()
            )]
        );
        assert_eq!(
            outcome.failed,
            [(
                "[SynchronizedBeforeSuite]".to_owned(),
                "no node <ready>\nGot \"x\"".to_owned()
            )]
        );
    }
}
