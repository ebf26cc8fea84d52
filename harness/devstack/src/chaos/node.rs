//! Faults of the node and its pods, which need pods made by a real container runtime (issue
//! 35): an init container killed by the runtime mid-request and restarted as kubelet restarts
//! it, refresh sidecars killed and restarted as new containers of the same pods, a container of
//! one pod given another pod's identity volume, and a process in no pod given one. The agent's
//! peer check decides the last two from the cgroups the runtime wrote.

use super::set_reader::{SetReader, leftovers};
use super::watch::{Effects, Pods, RECOVERY_BOUND, TICK, Tally, recover, row, supervise};
use super::{Fault, FaultResult};
use crate::node::PodVolume;
use crate::pods::{PodCommand, PodProgram, PodRuntime};
use crate::stack::Stack;
use anyhow::Context;
use athenz_core::files::CERT_FILE;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The SIA's init container started `kills` times and killed by the runtime at a random point
/// of its run (most mid-request), each time run again to its end as kubelet restarts a failed
/// init container, while a reader checks every set it can read. Bounds: no torn set, every
/// restarted init succeeds, nothing of the killed runs is left behind.
pub(super) async fn init_container_killed(
    stack: &mut Stack,
    pods: &mut Pods,
    kills: usize,
) -> anyhow::Result<FaultResult> {
    let kills = kills.max(1);
    let volume = first_sia_volume(pods)?;
    let out = volume.credentials_dir.clone();
    let reader = SetReader::start(&out);
    let info = stack.info.clone();
    let runtime = PodRuntime::of(&info)?;
    // kill within the span of one init's own run (the container's process is running when
    // `start` returns), measured now, so most kills land mid-request
    let span = crate::node::sia_init(&info, &volume)
        .await
        .context("a first init")?
        .own;
    let mut ended_first = 0;
    let mut restarts_failed = 0;
    let mut tally = Tally::default();
    let mut replaced = None;
    for _ in 0..kills {
        let command = PodCommand {
            name: "sia-init-killed",
            program: PodProgram::Sia,
            args: vec!["init".into()],
            env: crate::node::sia_env_in(&info, &runtime.paths(&volume)),
        };
        let logs = stack.state_dir.join("logs");
        let mut init = runtime.start(&info, &volume, &command, &logs).await?;
        tokio::time::sleep(span.mul_f64(athenz_core::random::unit())).await;
        if init.check_alive().is_err() {
            ended_first += 1;
        }
        init.kill().await?;
        init.stop().await;
        // kubelet runs a failed init container again; it removes what the killed one left,
        // keeping (by design) the set it replaces, which a reader may still be reading
        replaced = std::fs::read_link(out.join("..data")).ok();
        if crate::node::sia_init(&info, &volume).await.is_err() {
            restarts_failed += 1;
        }
        tally.add(&supervise(stack, pods).await?);
    }
    let (reads, torn) = reader.stop();
    let leftovers = leftovers(&out, replaced.as_deref())?;
    tally.torn += torn;
    let recovery = recover(stack, pods, &mut tally).await?;
    let mut result = row(
        Fault::InitContainerKilled,
        format!(
            "{kills} init containers killed by {} ({ended_first} had ended first), each run \
             again: {restarts_failed} restarts failed; {reads} reads; {}",
            info.runtime.kind,
            if leftovers.is_empty() {
                "nothing left behind".to_owned()
            } else {
                format!("left behind: {}", leftovers.join(", "))
            }
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= leftovers.is_empty() && restarts_failed == 0 && reads > 0;
    Ok(result)
}

/// Every flex pod's refresh sidecar killed by the runtime; kubelet's crash-loop back-off starts
/// each again as a new container in the same pod, which the agent serves as it served the old
/// one. Bounds: every pod renews after its restart within the recovery bound (plus the 10 s
/// back-off), nothing expires or tears.
pub(super) async fn sidecars_restarted(
    stack: &mut Stack,
    pods: &mut Pods,
) -> anyhow::Result<FaultResult> {
    let before: Vec<Option<String>> = pods
        .flex
        .refreshers
        .iter()
        .map(|s| s.process.container_id())
        .collect();
    let exits_before = pods.flex.sidecar_exits();
    for sidecar in &mut pods.flex.refreshers {
        sidecar.process.kill().await?;
    }
    // from the kills until every pod renewed since (a renewal needs its sidecar back: in flex
    // mode nothing else renews a pod)
    let killed = Instant::now();
    let mut tally = Tally::default();
    let flex = pods.flex.volumes.len();
    let bound = RECOVERY_BOUND + crate::fleet::CRASH_LOOP_FIRST;
    let mut recovery = None;
    while killed.elapsed() < bound * 2 {
        tally.add(&supervise(stack, pods).await?);
        if (0..flex).all(|i| tally.renewed.contains(&i)) {
            recovery = Some(killed.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let restarted = pods.flex.sidecar_exits() - exits_before;
    let after: Vec<Option<String>> = pods
        .flex
        .refreshers
        .iter()
        .map(|s| s.process.container_id())
        .collect();
    let new_ids = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| a.is_some() && b != a)
        .count();
    let sidecars = before.len();
    let mut result = row(
        Fault::SidecarRestarted,
        format!(
            "{sidecars} sidecars killed; {restarted} restarted after kubelet's back-off, \
             {new_ids} as new containers of their pods; every pod renewed after"
        ),
        &tally,
        recovery,
        false,
    );
    result.bound_seconds = bound.as_secs_f64();
    result.passed = tally.torn == 0
        && tally.expired.is_empty()
        && new_ids == sidecars
        && recovery.is_some_and(|r| r <= result.bound_seconds);
    Ok(result)
}

/// For each flex pod A with a neighbour B: a container of A given B's identity volume runs
/// `athenz-sia init`. Bound: every one refused with 403 naming both pods, B's files untouched.
pub(super) async fn foreign_volume(
    stack: &mut Stack,
    pods: &mut Pods,
) -> anyhow::Result<FaultResult> {
    let info = stack.info.clone();
    let volumes = sia_volumes(pods);
    anyhow::ensure!(
        volumes.len() >= 2,
        "foreign-volume needs at least two flex pods"
    );
    let mut refused = 0;
    let mut wrong = Vec::new();
    let mut tally = Tally::default();
    for (a, b) in volumes.iter().zip(volumes.iter().cycle().skip(1)) {
        let b_before = std::fs::read(b.credentials_dir.join(CERT_FILE)).ok();
        let scratch = scratch_dir(
            stack,
            "foreign",
            &format!("{}-with-{}", a.pod.name, b.pod.name),
        )?;
        // A's sandbox and cgroup, B's identity volume
        let foreign = PodVolume {
            mount_dir: b.mount_dir.clone(),
            credentials_dir: scratch,
            ..a.clone()
        };
        match crate::node::sia_init(&info, &foreign).await {
            Err(e) => {
                let text = format!("{e:#}");
                if text.contains("403") && text.contains(&a.uid) && text.contains(&b.uid) {
                    refused += 1;
                } else {
                    wrong.push(format!("{}: {text}", a.pod.name));
                }
            }
            Ok(_) => wrong.push(format!("{} got {}'s identity", a.pod.name, b.pod.name)),
        }
        if std::fs::read(b.credentials_dir.join(CERT_FILE)).ok() != b_before {
            wrong.push(format!("{}'s files changed", b.pod.name));
        }
        tally.add(&supervise(stack, pods).await?);
    }
    let recovery = recover(stack, pods, &mut tally).await?;
    let mut result = row(
        Fault::ForeignVolume,
        format!(
            "{} containers given another pod's volume: {refused} refused (403 naming both pods){}",
            volumes.len(),
            describe(&wrong)
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= wrong.is_empty() && refused == volumes.len();
    Ok(result)
}

/// For each flex pod: `athenz-sia init` as a process in no pod (the host's), given the pod's
/// identity volume. Bound: every one refused with 403 (the agent's `enforce`).
pub(super) async fn host_process(
    stack: &mut Stack,
    pods: &mut Pods,
) -> anyhow::Result<FaultResult> {
    let info = stack.info.clone();
    let volumes = sia_volumes(pods);
    let mut refused = 0;
    let mut wrong = Vec::new();
    let mut tally = Tally::default();
    for volume in &volumes {
        let scratch = stack.state_dir.join("host-process").join(&volume.pod.name);
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        let mut env = crate::node::sia_env(&info, volume);
        env.retain(|(k, _)| *k != "OUT_DIR");
        env.push(("OUT_DIR", scratch.display().to_string()));
        env.push(("INIT_TIMEOUT", "5s".into()));
        let (program, args) = info.sia.split_first().context("an empty SIA argv")?;
        let output = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(program)
                .args(args)
                .arg("init")
                .current_dir(&volume.mount_dir)
                .envs(env.iter().map(|(k, v)| (*k, v)))
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("a host process's init: no answer within 60 s")?
        .context("running the SIA as a host process")?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() && stderr.contains("403") && stderr.contains("no pod's cgroup")
        {
            refused += 1;
        } else {
            wrong.push(format!(
                "{} ({}): {}",
                volume.pod.name,
                output.status,
                stderr.lines().last().unwrap_or_default()
            ));
        }
        tally.add(&supervise(stack, pods).await?);
    }
    let recovery = recover(stack, pods, &mut tally).await?;
    let mut result = row(
        Fault::HostProcess,
        format!(
            "{} host processes given a pod's volume: {refused} refused (403, in no pod's \
             cgroup){}",
            volumes.len(),
            describe(&wrong)
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= wrong.is_empty() && refused == volumes.len();
    Ok(result)
}

/// The flex pods' volumes as their SIAs see them.
fn sia_volumes(pods: &Pods) -> Vec<PodVolume> {
    pods.flex
        .volumes
        .iter()
        .filter_map(|m| m.sia().cloned())
        .collect()
}

/// A directory for what a refused attempt would have written, `<state>/<kind>/<name>`.
fn scratch_dir(stack: &Stack, kind: &str, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = stack.state_dir.join(kind).join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn first_sia_volume(pods: &Pods) -> anyhow::Result<PodVolume> {
    pods.flex
        .volumes
        .first()
        .and_then(|m| m.sia())
        .cloned()
        .context("the first pod runs no SIA")
}

fn describe(wrong: &[String]) -> String {
    if wrong.is_empty() {
        String::new()
    } else {
        format!("; not as bound: {}", wrong.join("; "))
    }
}

/// How long the node is down (time stamps are in whole seconds: it boots in a later one).
const POWER_CYCLE: Duration = Duration::from_millis(1500);
/// How long after a pod's new sandbox the kubelet's status report reaches the API server: the
/// window in which the kubelet still lists the old IP.
const REPORT_DELAY: Duration = Duration::from_secs(2);

/// Every mount point under `roots`, deepest first (from `/proc/self/mountinfo`; a space in a
/// path is `\040` there).
fn mounts_under(roots: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let mut mounts: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| roots.iter().any(|r| p.starts_with(r) && p != r))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(mounts)
}

/// `ip` moved to another subnet: the new sandbox's address.
fn new_ip(ip: &str) -> anyhow::Result<String> {
    let old: std::net::Ipv4Addr = ip.parse().with_context(|| format!("pod IP {ip}"))?;
    let [a, b, c, d] = old.octets();
    Ok(std::net::Ipv4Addr::new(a, b.wrapping_add(1), c, d).to_string())
}

/// One pod through the reboot.
struct Rebooted {
    old_ip: String,
    new_ip: String,
    old_serial: Option<String>,
    /// When the kubelet reported its new sandbox.
    reported: Option<Instant>,
    /// From that report to the pod whole again.
    whole_after: Option<Duration>,
}

/// The node rebooted: the agent, every sidecar and every pod's containers killed at once, every
/// mount of the kubelet's and the agent's gone (the disk kept); then the agent started again
/// (its state on disk, the node's new boot time), and every pod as kubelet restarts it: its
/// volume mounted or published anew, a new sandbox with a new IP — which the kubelet reports
/// to the API server a moment later, so meanwhile it still lists the old one — its init
/// container, its sidecar. Bounds: every pod whole within the recovery bound of its new IP being
/// reported; no certificate issued after the reboot names an old IP; the flex pods' name their
/// new one; the mounts afterwards are the mounts before, nothing stacked or left over.
pub(super) async fn node_rebooted(
    stack: &mut Stack,
    pods: &mut Pods,
) -> anyhow::Result<FaultResult> {
    let info = stack.info.clone();
    let kube = crate::kube::KubeClient::new(&info.kube_api.url)?;
    let roots = [
        stack.state_dir.join("kubelet"),
        info.nodes
            .first()
            .context("a stack without nodes")?
            .volumes_dir
            .clone(),
    ];
    let before = Effects::now(stack, pods);
    let census = pods.census();
    let mut tally = Tally::default();
    tally.add(&census);
    let mounts_before = mounts_under(&roots)?;
    let all: Vec<_> = pods
        .flex
        .volumes
        .iter()
        .chain(&pods.files.volumes)
        .map(|m| m.pod.clone())
        .collect();
    let mut rebooted = all
        .iter()
        .zip(&census.serials)
        .map(|(pod, serial)| {
            Ok(Rebooted {
                old_ip: pod.ip.clone(),
                new_ip: new_ip(&pod.ip)?,
                old_serial: serial.clone(),
                reported: None,
                whole_after: None,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    // power off
    stack.kill_now("agent").await?;
    pods.flex.power_off(stack).await?;
    for mount in &mounts_before {
        let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
    }
    let left = mounts_under(&roots)?;
    anyhow::ensure!(left.is_empty(), "mounts left after the power-off: {left:?}");
    // the machine is down a moment: it boots in a later second than any sandbox it had
    tokio::time::sleep(POWER_CYCLE).await;
    let boot = time::OffsetDateTime::now_utc().unix_timestamp();
    // the kubelet's and the sidecars' restarts are kubelet's, not chaos's supervision's
    let ready = info.agent.metrics_url.replace("/metrics", "/readyz");
    stack
        .start_again_with("agent", "node-boot-time", &boot.to_string(), &ready)
        .await?;

    // kubelet starts every pod again, in parallel; each pod's new IP reaches the API a moment
    // after its sandbox
    let mut restarts = tokio::task::JoinSet::new();
    let flex_count = pods.flex.volumes.len();
    for (i, pod) in all.iter().enumerate() {
        let mut new_pod = pod.clone();
        new_pod.ip = rebooted[i].new_ip.clone();
        let restart = if i < flex_count {
            pods.flex.restart(stack, i, &new_pod)
        } else {
            pods.files.restart(stack, i - flex_count, &new_pod)
        };
        let kube = kube.clone();
        restarts.spawn(async move {
            let report = async {
                tokio::time::sleep(REPORT_DELAY).await;
                kube.report_sandbox(&new_pod.namespace, &new_pod.name, &new_pod.ip)
                    .await?;
                anyhow::Ok(Instant::now())
            };
            let (reported, restarted) = tokio::join!(report, restart.run());
            anyhow::Ok((i, reported?, restarted?))
        });
    }

    // until every pod is whole: a certificate issued since the reboot, for its new IP (flex),
    // never for its old one; each pod's time from its report
    let mut old_ip_issued = Vec::new();
    let started = Instant::now();
    while started.elapsed() < RECOVERY_BOUND * 3
        && (!restarts.is_empty() || rebooted.iter().any(|r| r.whole_after.is_none()))
    {
        while let Some(joined) = restarts.try_join_next() {
            let (i, reported, restarted) = joined.context("a pod's restart")??;
            rebooted[i].reported = Some(reported);
            if i < flex_count {
                pods.flex.restarted(restarted);
            } else {
                pods.files.restarted(restarted);
            }
        }
        // the daemons as kubelet keeps them; the pods' restarts are the tasks above
        stack.restart_exited()?;
        tally.add(&pods.census());
        let sets = pods.flex.volumes.iter().chain(&pods.files.volumes);
        for (i, (mounted, pod)) in sets.zip(rebooted.iter_mut()).enumerate() {
            let Ok((cert, whole)) = crate::fleet::read_set(mounted) else {
                continue;
            };
            let ips: Vec<String> = cert.ip_addresses.iter().map(ToString::to_string).collect();
            let new_cert = Some(&cert.serial_hex) != pod.old_serial.as_ref();
            if new_cert && ips.contains(&pod.old_ip) && !old_ip_issued.contains(&i) {
                old_ip_issued.push(i);
            }
            let named_right = i >= flex_count || ips.contains(&pod.new_ip);
            if let (Some(reported), None) = (pod.reported, pod.whole_after)
                && new_cert
                && whole
                && named_right
                && cert.not_after > time::OffsetDateTime::now_utc()
            {
                pod.whole_after = Some(reported.elapsed());
            }
        }
        tokio::time::sleep(TICK).await;
    }
    anyhow::ensure!(
        restarts.is_empty(),
        "pods still restarting after {:?}",
        RECOVERY_BOUND * 3
    );
    let recovery = recover(stack, pods, &mut tally).await?;
    let mut mounts_after = mounts_under(&roots)?;
    let mut expected = mounts_before.clone();
    mounts_after.sort();
    expected.sort();
    let slowest = rebooted
        .iter()
        .map(|r| r.whole_after.unwrap_or(Duration::MAX))
        .max()
        .unwrap_or_default();
    let all_whole = slowest <= RECOVERY_BOUND;
    let effects = before.since(stack, pods);
    let mut result = row(
        Fault::NodeRebooted,
        format!(
            "{} pods and the agent killed, {} mounts gone; every pod restarted with a new IP \
             reported {} s after its sandbox: {}; {} certificates issued for an old IP; mounts \
             {}; {}",
            rebooted.len(),
            mounts_before.len(),
            REPORT_DELAY.as_secs(),
            if all_whole {
                format!(
                    "all whole, the slowest {:.1} s after its report",
                    slowest.as_secs_f64()
                )
            } else {
                format!(
                    "{} NOT whole within {} s of their report",
                    rebooted
                        .iter()
                        .filter(|r| r.whole_after.is_none_or(|w| w > RECOVERY_BOUND))
                        .count(),
                    RECOVERY_BOUND.as_secs()
                )
            },
            old_ip_issued.len(),
            if mounts_after == expected {
                "as before".to_owned()
            } else {
                format!("{} before, {} after", expected.len(), mounts_after.len())
            },
            effects.describe()
        ),
        &tally,
        recovery,
        // the pods' files went with the reboot's tmpfs: no expiry to judge, only recovery
        true,
    );
    result.passed &= all_whole && old_ip_issued.is_empty() && mounts_after == expected;
    Ok(result)
}
