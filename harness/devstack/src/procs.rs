//! The stack's long-running processes: started with their output in a log file, watched for
//! readiness, measured from /proc, restarted if they die (as kubelet restarts a container), and
//! stopped with SIGTERM (SIGKILL after a grace period).

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long a process may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How to start one process (kept to restart it).
#[derive(Debug, Clone)]
pub struct Command {
    /// Short name (log file, reports).
    pub name: String,
    pub program: PathBuf,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Working directory (this process's if none).
    pub cwd: Option<PathBuf>,
    /// Its usage counts its live descendants too: for a process that runs its server as a
    /// child (Athenz's ZTS, a Java process under the `zts` command).
    pub with_descendants: bool,
}

impl Command {
    /// A command with no extra environment.
    pub fn new(name: &str, program: &Path, args: Vec<String>) -> Self {
        Self {
            name: name.to_owned(),
            program: program.to_owned(),
            args,
            env: Vec::new(),
            cwd: None,
            with_descendants: false,
        }
    }
}

/// A running process of the stack.
pub struct Process {
    /// How it was started.
    pub command: Command,
    child: tokio::process::Child,
    log: PathBuf,
}

fn spawn_child(command: &Command, log: &Path) -> anyhow::Result<tokio::process::Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone().context("duplicating the log file")?;
    let mut process = tokio::process::Command::new(&command.program);
    if let Some(dir) = &command.cwd {
        process.current_dir(dir);
    }
    process
        .args(&command.args)
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", command.program.display()))
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn start(command: Command, log_dir: &Path) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{}.log", command.name));
        let child = spawn_child(&command, &log)?;
        Ok(Self {
            command,
            child,
            log,
        })
    }

    /// Its pid (0 once reaped).
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Fails (with its log) if it has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait().context("checking a process")? {
            bail!(
                "{} exited ({status}); its log ({}):\n{}",
                self.command.name,
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Restarts it if it has exited; says whether it did.
    pub fn restart_if_exited(&mut self) -> anyhow::Result<bool> {
        if self
            .child
            .try_wait()
            .context("checking a process")?
            .is_none()
        {
            return Ok(false);
        }
        self.child = spawn_child(&self.command, &self.log)?;
        Ok(true)
    }

    /// Kills it at once (SIGKILL) and reaps it, as a power loss ends it.
    pub async fn kill_now(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Starts it again after [`Process::kill_now`], with `--<flag>=<value>` in place of any
    /// earlier value of that flag.
    pub fn start_again_with(&mut self, flag: &str, value: &str) -> anyhow::Result<()> {
        let prefix = format!("--{flag}=");
        self.command.args.retain(|a| !a.starts_with(&prefix));
        self.command.args.push(format!("{prefix}{value}"));
        self.child = spawn_child(&self.command, &self.log)?;
        Ok(())
    }

    /// Stops it as kubelet stops a container in a rolling update (SIGTERM, `grace` to drain and
    /// exit by itself, then SIGKILL) and starts `program` (another build; the same binary when
    /// `None`) in its place with the same arguments, environment and log, so on the same state
    /// and sockets. Says how the old one ended.
    pub async fn replace(
        &mut self,
        program: Option<&Path>,
        grace: Duration,
    ) -> anyhow::Result<Stopped> {
        let asked = Instant::now();
        let pid = self.child.id().context("the process was already reaped")?;
        kill(
            Pid::from_raw(i32::try_from(pid).context("a pid")?),
            Signal::SIGTERM,
        )
        .with_context(|| format!("SIGTERM to {}", self.command.name))?;
        let stopped = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => Stopped::ByItself {
                status: status.context("waiting for the process")?,
                after: asked.elapsed(),
            },
            Err(_) => {
                let _ = self.child.kill().await;
                Stopped::Killed {
                    after: asked.elapsed(),
                }
            }
        };
        if let Some(program) = program {
            self.command.program = program.to_owned();
        }
        self.child = spawn_child(&self.command, &self.log)?;
        Ok(stopped)
    }

    /// Waits until `ready()` holds, failing if the process exits or [`READY_TIMEOUT`] passes.
    pub async fn wait_until<F, Fut>(&mut self, what: &str, mut ready: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if ready().await {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "{} was not {what} after {READY_TIMEOUT:?}; its log:\n{}",
                    self.command.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `GET <url>` answers 200.
    pub async fn wait_http_ok(&mut self, url: &str) -> anyhow::Result<()> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .context("building an HTTP client")?;
        self.wait_until("ready", || {
            let request = client.get(url).send();
            async move { request.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await
    }

    /// Waits until `path` exists.
    pub async fn wait_file(&mut self, path: &Path) -> anyhow::Result<()> {
        self.wait_until("ready", || std::future::ready(path.exists()))
            .await
    }

    /// Waits for it to exit by itself within `limit`; returns whether it succeeded.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<bool> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => Ok(status.context("waiting for a process")?.success()),
            Err(_) => {
                let _ = self.child.start_kill();
                bail!(
                    "{} did not finish within {limit:?}; its log:\n{}",
                    self.command.name,
                    self.log_tail()
                )
            }
        }
    }

    /// What /proc says of it now (and of its live descendants, when its command says so).
    pub fn usage(&self) -> Usage {
        if self.command.with_descendants {
            Usage::of_tree(self.pid())
        } else {
            Usage::of(self.pid())
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within the grace period.
    pub async fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            if tokio::time::timeout(STOP_GRACE, self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// How a process asked to stop ended.
#[derive(Debug, Clone, Copy)]
pub enum Stopped {
    /// It exited within the grace period, this long after SIGTERM.
    ByItself {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// From SIGTERM to its exit.
        after: Duration,
    },
    /// It was still running at the end of the grace period and was killed.
    Killed {
        /// From SIGTERM to the kill.
        after: Duration,
    },
}

/// CPU time and memory of one process, from /proc.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Usage {
    /// User + system CPU seconds so far.
    pub cpu_seconds: f64,
    /// Resident set now, KiB.
    pub rss_kib: u64,
    /// Peak resident set (VmHWM), KiB.
    pub peak_rss_kib: u64,
    /// Open file descriptors now.
    pub fds: u64,
    /// Threads now.
    pub threads: u64,
}

impl Usage {
    /// Reads /proc/<pid>; zeros if it is gone.
    pub fn of(pid: u32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // fields after the command name, which is in parentheses and may hold spaces
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|i| fields.get(*i).and_then(|v| v.parse::<u64>().ok()))
            .sum();
        Self {
            // the larger: /proc/<pid>/stat also counts threads that have exited
            cpu_seconds: threads_cpu_seconds(pid)
                .unwrap_or(0.0)
                .max(ticks as f64 / clock_ticks_per_second()),
            rss_kib: field("VmRSS:"),
            peak_rss_kib: field("VmHWM:"),
            fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.count() as u64)
                .unwrap_or(0),
            threads: field("Threads:"),
        }
    }
}

impl Usage {
    /// `pid` and its live descendants, summed (peaks too: an upper bound of the tree's peak).
    pub fn of_tree(pid: u32) -> Self {
        let mut total = Self::of(pid);
        for child in children_of(pid) {
            let u = Self::of_tree(child);
            total.cpu_seconds += u.cpu_seconds;
            total.rss_kib += u.rss_kib;
            total.peak_rss_kib += u.peak_rss_kib;
            total.fds += u.fds;
            total.threads += u.threads;
        }
        total
    }
}

/// The processes whose parent is `pid` (field 4 of /proc/<pid>/stat).
fn children_of(pid: u32) -> Vec<u32> {
    pids_where(|dir| {
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        let parent: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(parent == pid)
    })
}

/// The pids in /proc whose directory `test` holds true of (a process gone meanwhile: false).
fn pids_where(test: impl Fn(&Path) -> Option<bool>) -> Vec<u32> {
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc_dir
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            test(&entry.path()).unwrap_or(false).then_some(pid)
        })
        .collect()
}

/// CPU time of a process's live threads in nanoseconds from `/proc/<pid>/task/*/schedstat`
/// (its first field), as seconds: /proc/<pid>/stat counts in 10 ms ticks, too coarse for a
/// daemon that spends a few hundred milliseconds on a run. Threads that exited are not counted
/// (the daemons' runtimes keep theirs); `None` when the kernel has no schedstat.
fn threads_cpu_seconds(pid: u32) -> Option<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

/// USER_HZ, the unit of /proc's CPU times: 100 on every Linux architecture (the kernel fixes it
/// for user space whatever its internal tick rate).
fn clock_ticks_per_second() -> f64 {
    100.0
}

/// A free loopback port for a server of the stack, which binds it moments later.
///
/// Chosen at random below the kernel's ephemeral range (`ip_local_port_range`, 32768 and up by
/// default): a port the kernel hands out for `bind(0)` or an outgoing connection could be taken
/// by someone else's connection between this check and the server's bind; these cannot. Each port
/// handed out is also reserved for the life of this process by a lock on
/// `<tmp>/athenz-devstack-ports-<uid>/<port>.lock`, so stacks started side by side (the end-to-end
/// tests run several at once) never pick the same port in the moment before its server binds it;
/// the kernel drops the lock when the process ends, however it ends.
pub fn free_port() -> anyhow::Result<u16> {
    static RESERVED: std::sync::Mutex<Vec<nix::fcntl::Flock<std::fs::File>>> =
        std::sync::Mutex::new(Vec::new());
    // per user: another user's directory is not ours to write
    let dir = reservations_dir();
    let can_reserve = std::fs::create_dir_all(&dir).is_ok();
    for _ in 0..200 {
        let port = 20_000 + (athenz_core::random::unit() * 12_000.0) as u16;
        // a directory this process cannot write (e.g. a user namespace's root over the real
        // root's files) only loses the reservation, never the port
        // a lock file this process cannot create or write (a user namespace's root over the
        // real root's files: the same directory, as its euid is 0 there) is still opened to
        // read, and its lock taken: a stack run as a normal user then respects the ports the
        // real root's stacks hold instead of racing them for the bind
        let path = dir.join(format!("{port}.lock"));
        let file = can_reserve
            .then(|| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .or_else(|_| std::fs::File::open(&path))
                    .ok()
            })
            .flatten();
        let lock = match file {
            Some(file) => {
                match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => Some(lock),
                    Err(_) => continue, // another stack holds it
                }
            }
            None => None,
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            if let Some(lock) = lock {
                RESERVED
                    .lock()
                    .map_err(|_| anyhow::anyhow!("port reservations poisoned"))?
                    .push(lock);
            }
            return Ok(port);
        }
    }
    anyhow::bail!("no free loopback port between 20000 and 32000")
}

/// Where this user's stacks reserve their ports.
fn reservations_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "athenz-devstack-ports-{}",
        nix::unistd::geteuid().as_raw()
    ))
}

/// Restarts each of `processes` that has exited, as a supervisor restarts a crashed daemon;
/// returns the names of those restarted.
pub fn restart_exited(processes: &mut [Process]) -> anyhow::Result<Vec<String>> {
    let mut restarted = Vec::new();
    for process in processes {
        if process.restart_if_exited()? {
            restarted.push(process.command.name.clone());
        }
    }
    Ok(restarted)
}

/// The pids of the processes named `name` on this host (argv[0]'s file name): how the benches
/// find the daemons a DaemonSet started (ours, spire-agent, the SPIFFE CSI driver), one per node.
pub fn pids_named(name: &str) -> Vec<u32> {
    pids_where(|dir| {
        let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
        let argv0 = cmdline.split(|b| *b == 0).next()?;
        let file = Path::new(std::str::from_utf8(argv0).ok()?).file_name()?;
        Some(file == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_counts_its_live_children() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        assert!(children_of(me).contains(&child.id()));
        let alone = Usage::of(me);
        let tree = Usage::of_tree(me);
        assert!(tree.threads > alone.threads, "{tree:?} vs {alone:?}");
        assert!(tree.rss_kib > alone.rss_kib);
        child.kill().unwrap();
        let _ = child.wait();
    }

    #[test]
    fn usage_of_this_process_and_of_none() {
        // burn a little CPU so the count is not zero
        let mut x = 0u64;
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        let me = Usage::of(std::process::id());
        assert!(me.rss_kib > 0 && me.peak_rss_kib >= me.rss_kib);
        assert!(me.cpu_seconds > 0.0);
        let gone = Usage::of(u32::MAX);
        assert_eq!((gone.rss_kib, gone.peak_rss_kib), (0, 0));
        assert_eq!(gone.cpu_seconds, 0.0);
    }

    #[test]
    fn free_ports_are_below_the_ephemeral_range() {
        let port = free_port().unwrap();
        assert!((20_000..32_000).contains(&port));
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }

    /// A port handed out is locked for this process's life: another process cannot take its
    /// lock (a second open file description here stands for it), and this one never hands it out
    /// again.
    #[test]
    fn handed_out_ports_stay_reserved() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
        let path = reservations_dir().join(format!("{}.lock", ports[0]));
        let other = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        assert!(
            nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err(),
            "the reservation is not held"
        );
    }
}
