//! Faults of a pod's credential volume: a files-mode tmpfs filled up, and `athenz-sia init`
//! killed mid-write while a reader checks every set.

use super::set_reader::{SetReader, leftovers};
use super::watch::{Effects, Pods, TICK, Tally, recover, row, supervise};
use super::{Fault, FaultResult};
use crate::procs::Process;
use crate::stack::Stack;
use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The tmpfs of the first files-mode pod's volume: `<volumes dir>/<id>/files`, found through
/// the operator's status report (which names each volume's pod).
pub(super) fn files_tmpfs(stack: &Stack, pods: &Pods) -> anyhow::Result<PathBuf> {
    let volume = pods
        .files
        .volumes
        .first()
        .context("disk-full needs a files-mode pod (--files-pods)")?;
    let node = stack.info.nodes.first().context("a stack without nodes")?;
    let volumes = athenz_core::volume::VolumesDir::new(&node.volumes_dir);
    let report = athenz_identity_agent::status::report(&volumes, time::OffsetDateTime::now_utc())
        .context("reading the agent's volumes")?;
    let entry = report
        .volumes
        .iter()
        .find(|v| v.pod_uid == volume.uid)
        .with_context(|| format!("no volume of pod {} on the node", volume.pod.name))?;
    Ok(node.volumes_dir.join(&entry.id).join("files"))
}

/// Fills `dir`'s filesystem with `name` until it refuses more (ENOSPC); returns the bytes
/// written.
pub(super) fn fill(dir: &Path, name: &str) -> anyhow::Result<u64> {
    use std::io::Write;
    let path = dir.join(name);
    let mut file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut written = 0u64;
    for chunk in [64 * 1024, 4096, 512, 1] {
        let block = vec![0u8; chunk];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => return Err(e).with_context(|| format!("filling {}", path.display())),
            }
        }
    }
    Ok(written)
}

/// A files-mode pod's tmpfs filled up until a rotation of its set failed (at most a
/// lifetime), then emptied: the set it had must stay whole and valid, nothing half-written may
/// be left, and the next rotation must pass.
pub(super) async fn disk_full(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    const FILLER: &str = "chaos-filler";
    let tmpfs = files_tmpfs(stack, pods)?;
    let target = pods.files.volumes[0].credentials_dir().to_owned();
    let status_file = tmpfs.with_file_name("status.json");
    let before = Effects::now(stack, pods);
    let started = time::OffsetDateTime::now_utc();
    let mut tally = Tally::default();
    // the tmpfs is sealed read-only but for the agent's writes (docs/design.md §4.10): the
    // filler goes in, and comes out, through the same opening as a root process on the node
    let sealed = |write: &dyn Fn() -> anyhow::Result<u64>| {
        athenz_core::volume_mount::seal::write_sealed(&tmpfs, || {
            write().map_err(|e| format!("{e:#}"))
        })
        .map_err(anyhow::Error::msg)
    };
    let filled = sealed(&|| fill(&tmpfs, FILLER))?;
    // hold until the agent has met the full disk (its status records the failure) and a
    // little longer, at most a lifetime; remove the filler whatever happened
    let held_since = Instant::now();
    let mut met: Option<Duration> = None;
    let held: anyhow::Result<()> = async {
        while held_since.elapsed() < lifetime
            && met.is_none_or(|at| held_since.elapsed() < at + Duration::from_secs(2))
        {
            if met.is_none() && rotation_failed_since(&status_file, started) {
                met = Some(held_since.elapsed());
            }
            tally.add(&supervise(stack, pods).await?);
            tokio::time::sleep(TICK).await;
        }
        Ok(())
    }
    .await;
    sealed(&|| {
        std::fs::remove_file(tmpfs.join(FILLER)).context("removing the filler")?;
        Ok(0)
    })?;
    held?;
    let recovery = recover(stack, pods, &mut tally).await?;
    let left = stale_entries(&target)?;
    let effects = before.since(stack, pods);
    let mut result = row(
        Fault::DiskFull,
        format!(
            "{filled} bytes filled its tmpfs; {}; {}; {}",
            match met {
                Some(at) => format!("a rotation failed {:.0} s in", at.as_secs_f64()),
                None => "no rotation met the full disk".to_owned(),
            },
            effects.describe(),
            if left.is_empty() {
                "nothing left behind".to_owned()
            } else {
                format!("left behind: {}", left.join(", "))
            }
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= met.is_some() && left.is_empty();
    Ok(result)
}

/// What a writer left in a files-mode volume beyond its set, its links and the one set before
/// it (kept for readers still on it): half-written (`tmp`) entries and older sets.
pub(super) fn stale_entries(dir: &Path) -> anyhow::Result<Vec<String>> {
    let current = std::fs::read_link(dir.join("..data")).context("reading ..data")?;
    let mut older_sets = Vec::new();
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(dir).context("listing the volume")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name == "..data" || Path::new(&name) == current || !name.starts_with("..") {
            continue;
        }
        if name.contains("tmp") {
            stale.push(name);
        } else {
            older_sets.push(name);
        }
    }
    if older_sets.len() > 1 {
        stale.extend(older_sets);
    }
    Ok(stale)
}

/// Whether the volume's status record shows a failure after `since`.
pub(super) fn rotation_failed_since(status_file: &Path, since: time::OffsetDateTime) -> bool {
    let Ok(text) = std::fs::read_to_string(status_file) else {
        return false;
    };
    let Ok(record) = serde_json::from_str::<athenz_core::volume::VolumeStatusRecord>(&text) else {
        return false;
    };
    record.last_error.is_some_and(|e| e.at > since)
}

/// `athenz-sia init` for the first pod, killed at a random point of its run `kills` times, with
/// a reader checking every set it reads; then one init that runs to the end, which must leave
/// nothing but the set in the directory.
pub(super) async fn sia_killed_mid_write(
    stack: &mut Stack,
    pods: &Pods,
    kills: usize,
) -> anyhow::Result<FaultResult> {
    let volume = pods.flex.volumes[0]
        .sia()
        .context("the first pod runs no SIA")?
        .clone();
    let out = volume.credentials_dir.clone();
    let reader = SetReader::start(&out);
    let info = stack.info.clone();
    let mut argv = info.sia.clone();
    argv.push("init".into());
    let argv = crate::node::in_pod(&info, &volume.uid, &argv)?;
    let (program, args) = argv.split_first().context("an empty SIA argv")?;
    let logs = stack.state_dir.join("logs");
    // kill within the span of one whole init, measured now, so most kills land mid-run
    let span = crate::node::sia_init(&info, &volume)
        .await
        .context("a first init")?
        .process;
    let mut exited_first = 0;
    for _ in 0..kills {
        let mut command =
            crate::procs::Command::new("sia-init-killed", Path::new(program), args.to_vec());
        command.cwd = Some(volume.mount_dir.clone());
        command.env = crate::node::sia_env(&stack.info, &volume)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let mut sia = Process::start(command, &logs)?;
        let delay = span.mul_f64(athenz_core::random::unit());
        tokio::time::sleep(delay).await;
        let pid = i32::try_from(sia.pid()).context("a pid")?;
        if pid == 0 || sia.check_alive().is_err() {
            exited_first += 1;
        } else {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = sia.wait_exit(Duration::from_secs(5)).await;
    }
    // one init to the end: it removes what the killed ones left, keeping (by design) the set it
    // replaced, which a reader may still be reading
    let replaced = std::fs::read_link(out.join("..data")).ok();
    let finished = crate::node::sia_init(&info, &volume).await;
    let (reads, torn) = reader.stop();
    finished.context("the init after the kills")?;
    let leftovers = leftovers(&out, replaced.as_deref())?;
    let mut tally = Tally {
        torn,
        ..Tally::default()
    };
    let census = pods.census();
    tally.add(&census);
    let clean = leftovers.is_empty();
    let mut result = row(
        Fault::SiaKilledMidWrite,
        format!(
            "{kills} inits, {} killed mid-run, {exited_first} ended first; {reads} reads; {}",
            kills - exited_first,
            if clean {
                "nothing left behind".to_owned()
            } else {
                format!("left behind: {}", leftovers.join(", "))
            }
        ),
        &tally,
        Some(0.0),
        false,
    );
    result.passed &= clean && reads > 0;
    Ok(result)
}
