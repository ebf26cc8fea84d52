//! The cluster's own `kubectl` (the build's, so its kustomize and API versions match the
//! server), with the admin kubeconfig: how `cluster up` installs, as an operator would.

use super::Layout;
use super::images::run;
use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `kubectl --kubeconfig <admin>`.
#[derive(Debug, Clone)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// The build's kubectl with the cluster's admin kubeconfig.
    pub fn new(layout: &Layout) -> Self {
        Self {
            bin: layout.bin("kubectl"),
            kubeconfig: layout.kubeconfig.clone(),
        }
    }

    /// `bin` with `kubeconfig`: a process of its own that was handed both (the cluster's ZTS).
    pub fn from_parts(bin: PathBuf, kubeconfig: PathBuf) -> Self {
        Self { bin, kubeconfig }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.bin);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

    /// Runs `kubectl <args>`; its stdout, or an error with its output.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        run(
            self.command().args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// Runs `script` with `bash -euo pipefail` in `dir`, as an operator's shell would with
    /// this cluster: `kubectl` on the PATH (this build's) and `KUBECONFIG` the admin's, plus
    /// `env`; its stdout, or an error naming `what` with its output. The script's own commands
    /// carry its timeouts (`rollout status --timeout`).
    pub fn run_script(
        &self,
        script: &str,
        dir: &Path,
        env: &[(&str, &std::ffi::OsStr)],
        what: &str,
    ) -> anyhow::Result<String> {
        let bin_dir = self.bin.parent().unwrap_or(Path::new("."));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(
            std::iter::once(bin_dir.to_path_buf()).chain(std::env::split_paths(&path)),
        )
        .context("the PATH for the script")?;
        let mut command = Command::new("bash");
        command
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(dir)
            .env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig);
        for (name, value) in env {
            command.env(name, value);
        }
        run(&mut command, what)
    }

    /// `kubectl apply -k <dir>` (kustomize, as an operator applies an overlay).
    pub fn apply_kustomization(&self, dir: &Path) -> anyhow::Result<String> {
        run(
            self.command().args(["apply", "-k"]).arg(dir),
            &format!("kubectl apply -k {}", dir.display()),
        )
    }

    /// `kubectl apply -f -` of `manifest`; `what` names it in errors.
    pub fn apply_manifest(&self, manifest: &str, what: &str) -> anyhow::Result<String> {
        self.apply_with(manifest, &[], what)
    }

    /// `kubectl apply --dry-run=server -f -` of `manifest`: admitted (mutating webhooks, Pod
    /// Security and validation included) without being stored.
    pub fn dry_run(&self, manifest: &str, what: &str) -> anyhow::Result<String> {
        self.apply_with(manifest, &["--dry-run=server"], what)
    }

    fn apply_with(&self, manifest: &str, extra: &[&str], what: &str) -> anyhow::Result<String> {
        let mut child = self
            .command()
            .args(["apply", "-f", "-"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("applying {what}: starting kubectl"))?;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(manifest.as_bytes())
            .with_context(|| format!("applying {what}: writing to kubectl"))?;
        let output = child
            .wait_with_output()
            .with_context(|| format!("applying {what}"))?;
        if !output.status.success() {
            anyhow::bail!(
                "applying {what} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// `kubectl get <args> -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.run(&all)?;
        serde_json::from_str(&text).with_context(|| format!("reading kubectl {}", all.join(" ")))
    }

    /// Waits (within `timeout`) until `kind/name` in `namespace` has rolled out: every replica
    /// updated and Ready. The error carries kubectl's account and the workload's pods.
    pub fn wait_rolled_out(
        &self,
        namespace: &str,
        workload: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let timeout = format!("--timeout={}s", timeout.as_secs());
        self.run(&["-n", namespace, "rollout", "status", workload, &timeout])
            .map(|_| ())
            .with_context(|| {
                let pods = self
                    .run(&["-n", namespace, "get", "pods", "-o", "wide"])
                    .unwrap_or_else(|e| format!("{e:#}"));
                format!(
                    "{workload} in {namespace} did not become Ready; its namespace's pods:\n{pods}"
                )
            })
    }
}
