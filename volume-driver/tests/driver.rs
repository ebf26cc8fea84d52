//! The real driver binary, run as kubelet runs it, against real bind mounts in temporary
//! directories. Needs root (CI runs as root); without it every test fails and says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::volume::{NodeKey, VolumeId};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;

const DRIVER: &str = env!("CARGO_BIN_EXE_athenz-volume-driver");
const UID: &str = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";

fn options(uid: &str) -> String {
    format!(
        r#"{{"kubernetes.io/fsType":"","kubernetes.io/readwrite":"ro","kubernetes.io/pvOrVolumeName":"athenz-identity","kubernetes.io/pod.name":"web-7d9f","kubernetes.io/pod.namespace":"media-sports","kubernetes.io/pod.uid":"{uid}","kubernetes.io/serviceAccount.name":"web"}}"#
    )
}

fn require_root() {
    let uid = fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    assert_eq!(
        uid.ok(),
        Some(0),
        "the volume driver tests make real bind mounts and must run as root (CI does)"
    );
}

/// A node in a temporary directory: volumes dir, agent dir, kubelet pods dir.
struct Node {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    volumes: PathBuf,
    agent: PathBuf,
}

struct Output {
    stdout: String,
    stderr: String,
    code: i32,
}

impl Node {
    fn new() -> Self {
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let volumes = root.join("volumes");
        let agent = root.join("agent");
        fs::create_dir(&agent).unwrap();
        fs::create_dir(root.join("pods")).unwrap();
        Self {
            _tmp: tmp,
            root,
            volumes,
            agent,
        }
    }

    /// A fresh pod volume dir, as kubelet makes it.
    fn pod_dir(&self, n: usize) -> PathBuf {
        let dir = self.root.join(format!(
            "pods/{n}/volumes/athenz~volume-driver/athenz-identity"
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(DRIVER);
        cmd.args(args)
            .env("ATHENZ_VOLUMES_DIR", &self.volumes)
            .env("ATHENZ_AGENT_DIR", &self.agent);
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = self.command(args).output().unwrap();
        Output {
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
            code: out.status.code().unwrap(),
        }
    }

    fn mount(&self, dir: &Path) -> Output {
        self.run(&["mount", dir.to_str().unwrap(), &options(UID)])
    }

    fn unmount(&self, dir: &Path) -> Output {
        self.run(&["unmount", dir.to_str().unwrap()])
    }

    fn id_of(&self, dir: &Path) -> VolumeId {
        let bytes: [u8; 32] = fs::read(self.volumes.join(".node-key"))
            .unwrap()
            .try_into()
            .unwrap();
        VolumeId::for_mount_dir(&NodeKey::from_bytes(bytes), dir.to_str().unwrap())
    }

    /// Mount points below this node's root.
    fn mounts(&self) -> Vec<PathBuf> {
        athenz_core::volume_mount::mountinfo::MountTable::read()
            .unwrap()
            .under(&self.root)
            .map(Path::to_owned)
            .collect()
    }

    /// Volume directories (not the driver's dot-files).
    fn volume_dirs(&self) -> Vec<String> {
        match fs::read_dir(&self.volumes) {
            Err(_) => Vec::new(),
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| !n.starts_with('.'))
                .collect(),
        }
    }
}

impl Drop for Node {
    /// Never leave mounts behind, even when a test fails.
    fn drop(&mut self) {
        let mut mounts = self.mounts();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

const SUCCESS: &str = "{\"status\":\"Success\"}\n";

fn assert_reply(out: &Output, stdout: &str, code: i32) {
    assert_eq!(out.stdout, stdout);
    assert_eq!(out.stderr, "", "stderr must stay empty");
    assert_eq!(out.code, code);
}

fn assert_failure(out: &Output, needle: &str) {
    assert_eq!(out.stderr, "", "stderr must stay empty");
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.stdout);
    let reply: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(reply["status"], "Failure");
    let message = reply["message"].as_str().unwrap();
    assert!(message.contains(needle), "{needle:?} not in {message:?}");
}

#[test]
fn exact_output_of_every_command() {
    let node = Node::new();
    assert_reply(
        &node.run(&["init"]),
        "{\"status\":\"Success\",\"capabilities\":{\"attach\":false}}\n",
        0,
    );
    for unsupported in [
        "attach",
        "detach",
        "getvolumename",
        "isattached",
        "mountdevice",
    ] {
        assert_reply(
            &node.run(&[unsupported, "x"]),
            &format!(
                "{{\"status\":\"Not supported\",\"message\":\"\\\"{unsupported}\\\" is not supported by athenz/volume-driver\"}}\n"
            ),
            0,
        );
    }
    assert_reply(
        &node.run(&[]),
        "{\"status\":\"Failure\",\"message\":\"no command given: expected init, mount or unmount\"}\n",
        1,
    );
    assert_reply(
        &node.run(&["init", "extra"]),
        "{\"status\":\"Failure\",\"message\":\"init takes no arguments\"}\n",
        1,
    );
    assert_reply(
        &node.run(&["mount", "/x"]),
        "{\"status\":\"Failure\",\"message\":\"mount takes 2 arguments (<mount dir> <options json>), got 1\"}\n",
        1,
    );
    assert_reply(
        &node.run(&["mount", "/x", "{}", "extra"]),
        "{\"status\":\"Failure\",\"message\":\"mount takes 2 arguments (<mount dir> <options json>), got 3\"}\n",
        1,
    );
    assert_reply(
        &node.run(&["unmount"]),
        "{\"status\":\"Failure\",\"message\":\"unmount takes 1 argument (<mount dir>), got 0\"}\n",
        1,
    );
    let dir = node.pod_dir(1);
    assert_reply(&node.mount(&dir), SUCCESS, 0);
    assert_reply(&node.unmount(&dir), SUCCESS, 0);
    // non-UTF-8 arguments
    let out = node
        .command(&[])
        .arg(std::ffi::OsStr::from_encoded_bytes_unchecked_safe(
            b"mo\xffunt",
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{\"status\":\"Failure\",\"message\":\"arguments must be UTF-8\"}\n"
    );
    assert!(out.stderr.is_empty());
}

/// `OsStr::from_encoded_bytes_unchecked` is unsafe; on Unix `OsStrExt::from_bytes` is the safe way.
trait FromBytes {
    fn from_encoded_bytes_unchecked_safe(bytes: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(bytes: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(bytes)
    }
}

#[test]
fn the_pods_view() {
    let node = Node::new();
    let dir = node.pod_dir(1);
    let listener = UnixListener::bind(node.agent.join("agent.sock")).unwrap();
    assert_reply(&node.mount(&dir), SUCCESS, 0);
    let id = node.id_of(&dir);

    // what the pod sees
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["connect", "id"]);
    assert_eq!(
        fs::read_to_string(dir.join("id")).unwrap(),
        format!("{id}\n")
    );
    assert!(!dir.join("data.json").exists());

    // read-only everywhere, inside connect too
    for target in [dir.join("new"), dir.join("connect/new")] {
        let err = fs::write(&target, b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(30), "{}: {err}", target.display());
    }
    assert_eq!(
        fs::remove_file(dir.join("id")).unwrap_err().raw_os_error(),
        Some(30)
    );
    assert_eq!(
        fs::create_dir(dir.join("connect/d"))
            .unwrap_err()
            .raw_os_error(),
        Some(30)
    );

    // the agent's socket is reachable through the view
    let mut client = UnixStream::connect(dir.join("connect/agent.sock")).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    // the host side
    let volume = node.volumes.join(id.as_str());
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&volume), 0o700);
    assert_eq!(mode(&volume.join("data.json")), 0o600);
    assert_eq!(mode(&volume.join("mount/id")), 0o444);
    assert_eq!(mode(&node.volumes), 0o700);
    assert_eq!(mode(&node.volumes.join(".node-key")), 0o600);
    let data: serde_json::Value =
        serde_json::from_slice(&fs::read(volume.join("data.json")).unwrap()).unwrap();
    assert_eq!(data["podUid"], UID);
    assert_eq!(data["mountDir"], dir.to_str().unwrap());
    assert_eq!(data["namespace"], "media-sports");
    assert_eq!(data["serviceAccount"], "web");

    // exactly one mount of each kind
    let mut mounts = node.mounts();
    mounts.sort();
    let mut expected = vec![
        dir.clone(),
        dir.join("connect"),
        volume.join("mount/connect"),
    ];
    expected.sort();
    assert_eq!(mounts, expected);

    assert_reply(&node.unmount(&dir), SUCCESS, 0);
    assert!(node.mounts().is_empty());
    assert!(!volume.exists());
    assert!(
        node.agent.join("agent.sock").exists(),
        "unmount touched the agent dir"
    );
}

#[test]
fn idempotent_mount_and_unmount() {
    let node = Node::new();
    let dir = node.pod_dir(1);
    fs::write(node.agent.join("keep"), b"agent file").unwrap();
    for _ in 0..3 {
        assert_reply(&node.mount(&dir), SUCCESS, 0);
    }
    assert_eq!(node.mounts().len(), 3, "{:?}", node.mounts());
    assert_eq!(node.volume_dirs().len(), 1);
    // an extra mount stacked by hand (as a crashed earlier run might leave) is cleaned up
    nix::mount::mount(
        Some(&node.agent),
        &dir,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    assert_reply(&node.mount(&dir), SUCCESS, 0);
    assert_eq!(node.mounts().len(), 3, "{:?}", node.mounts());
    for _ in 0..2 {
        assert_reply(&node.unmount(&dir), SUCCESS, 0);
    }
    assert!(node.mounts().is_empty());
    assert!(node.volume_dirs().is_empty());
    assert_eq!(fs::read(node.agent.join("keep")).unwrap(), b"agent file");
    // never mounted; and a dir that no longer exists
    assert_reply(&node.unmount(&node.pod_dir(2)), SUCCESS, 0);
    assert_reply(&node.unmount(&node.root.join("pods/9/gone")), SUCCESS, 0);
}

#[test]
fn failures_leave_nothing_behind() {
    // missing agent dir
    let node = Node::new();
    let dir = node.pod_dir(1);
    fs::remove_dir(&node.agent).unwrap();
    assert_failure(&node.mount(&dir), "agent dir");
    assert!(node.mounts().is_empty());
    assert!(node.volume_dirs().is_empty());

    // unwritable volumes dir: on a read-only bind mount
    let node = Node::new();
    let dir = node.pod_dir(1);
    fs::create_dir(&node.volumes).unwrap();
    nix::mount::mount(
        Some(&node.volumes),
        &node.volumes,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    nix::mount::mount(
        None::<&str>,
        &node.volumes,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND
            | nix::mount::MsFlags::MS_REMOUNT
            | nix::mount::MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
    let out = node.mount(&dir);
    assert_failure(&out, "Read-only file system");
    assert_eq!(
        node.mounts(),
        std::slice::from_ref(&node.volumes),
        "only the test's own mount"
    );
    assert!(node.volume_dirs().is_empty());
}

#[test]
fn hostile_input_is_refused_and_leaves_nothing() {
    let node = Node::new();
    let dir = node.pod_dir(1);
    let d = dir.to_str().unwrap();
    let good = options(UID);
    let link = node.root.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    fs::create_dir_all(node.volumes.join("inside")).unwrap();
    let inside = node.volumes.join("inside");
    // The kernel refuses a single exec argument over 128 KiB (MAX_ARG_STRLEN), so kubelet cannot
    // pass more; the largest it can pass is used here, and 1 MiB is checked in-process below.
    let big = "x".repeat(127 * 1024);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![d.into(), "not json".into()], "not valid JSON"),
        (vec![d.into(), "[1,2]".into()], "must be a JSON object"),
        (
            vec![d.into(), good.replace("\"web-7d9f\"", "42")],
            "must be a string",
        ),
        (
            vec![d.into(), good.replace("kubernetes.io/pod.uid", "other")],
            "pod.uid\" is missing",
        ),
        (
            vec![d.into(), good.replace(UID, "")],
            "pod.uid\" is missing",
        ),
        (
            vec![d.into(), good.replace("web-7d9f", &"a".repeat(300))],
            "pod.name",
        ),
        (
            vec![d.into(), good.replace("media-sports", "../../etc")],
            "pod.namespace",
        ),
        (vec!["relative/dir".into(), good.clone()], "absolute"),
        (vec![format!("{d}/../1"), good.clone()], "not normalised"),
        (vec![format!("{d}/"), good.clone()], "not normalised"),
        (vec![link.to_str().unwrap().into(), good.clone()], "symlink"),
        (
            vec![inside.to_str().unwrap().into(), good.clone()],
            "overlaps the volumes dir",
        ),
        (vec![d.into(), format!("{{\"k\":\"{big}\"}}")], "65536"),
        (vec![big.clone(), good.clone()], "longer than 4096"),
    ];
    for (args, needle) in cases {
        let mut argv = vec!["mount"];
        argv.extend(args.iter().map(String::as_str));
        assert_failure(&node.run(&argv), needle);
        assert!(node.mounts().is_empty(), "{needle}: mounts left behind");
        assert_eq!(
            node.volume_dirs(),
            ["inside"],
            "{needle}: volume left behind"
        );
    }
    assert_failure(&node.run(&["mount", d, &good, &big]), "got 3");
    assert_failure(&node.run(&["unmount", "rel"]), "absolute");
    assert_failure(&node.run(&["unmount", link.to_str().unwrap()]), "symlink");

    // 1 MiB arguments, in-process (exec cannot carry them)
    let mib = "y".repeat(1 << 20);
    let host = athenz_volume_driver::HostDirs::new(
        athenz_core::volume::VolumesDir::new(&node.volumes),
        node.agent.clone(),
    );
    for args in [
        vec!["mount", d, mib.as_str()],
        vec!["mount", mib.as_str(), good.as_str()],
        vec!["unmount", mib.as_str()],
    ] {
        let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        let reply = athenz_volume_driver::run(&args, &host);
        assert_eq!(reply.exit_code(), 1);
        let message = reply.message.unwrap();
        assert!(
            message.len() < 300,
            "the reply echoes the hostile input: {} bytes",
            message.len()
        );
    }
    assert!(node.mounts().is_empty());
    assert_eq!(node.volume_dirs(), ["inside"]);
}

#[test]
fn concurrent_mounts_and_unmounts_from_many_processes() {
    let node = Node::new();
    let dirs: Vec<PathBuf> = (0..50).map(|n| node.pod_dir(n)).collect();
    let run_all = |verb: &str| {
        let children: Vec<_> = dirs
            .iter()
            .map(|dir| {
                let mut cmd = node.command(&[verb, dir.to_str().unwrap()]);
                if verb == "mount" {
                    cmd.arg(options(UID));
                }
                cmd.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), SUCCESS);
            assert!(out.stderr.is_empty());
        }
    };
    run_all("mount");
    assert_eq!(node.mounts().len(), 150);
    // one node key: every volume's id is the HMAC of its dir under the key now on disk
    let mut ids: Vec<String> = dirs.iter().map(|d| node.id_of(d).to_string()).collect();
    ids.sort();
    let mut on_disk = node.volume_dirs();
    on_disk.sort();
    assert_eq!(ids, on_disk);
    let leftovers: Vec<String> = fs::read_dir(&node.volumes)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".node-key."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    run_all("unmount");
    assert!(node.mounts().is_empty());
    assert!(node.volume_dirs().is_empty());
}
