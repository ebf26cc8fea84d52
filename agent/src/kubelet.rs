//! The node's pods, from the kubelet's `GET /pods`.
//!
//! A real node lists 110 pods in a megabyte or more (full specs, statuses, managed fields), and
//! the agent needs five fields of one of them. So the list is parsed borrowing from the body and
//! skipping everything else (`athenz_core::pod_fields`), and kept as a small index by namespace and name.
//!
//! A pod the index lacks is usually newer than it (the kubelet mounts a new pod's volumes right
//! after listing it), so a miss asks the kubelet again at once. During a rollout pods arrive every
//! few milliseconds: each must get a list made after it arrived, without waiting out a fixed
//! interval, yet misses (a pod not on this node, a kubelet that has not synced) must not hammer
//! the kubelet. A token bucket ([`crate::rate::TokenBucket`]) allows bursts and bounds the sustained rate; and
//! concurrent misses share one list: a caller that finds a list begun after its own miss uses it.

use athenz_core::client::{error_chain, read_limited_into};
use athenz_core::issuance::Registration;
use athenz_core::pod_fields::{PodFields, PodListFields};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest pod list read, in bytes (110 real pods list in 1–2 MB).
const MAX_POD_LIST: usize = 16 * 1024 * 1024;
/// Most pods a list may hold (the kubelet's own `maxPods` default is 110; large nodes run a few
/// hundred).
const MAX_PODS: usize = 5000;

/// The kubelet could not be asked, or answered something that is not a pod list.
#[derive(Debug, thiserror::Error)]
#[error("kubelet: {0}")]
pub struct KubeletError(pub String);

/// A pod as the agent knows it from the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.serviceAccountName` (`default` when absent, as the API server would set it).
    pub service_account: String,
    /// `status.podIP`, if the pod has one yet.
    pub ip: Option<String>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// What the status says of the pod's sandbox (whose network the IP is).
    pub sandbox: Sandbox,
}

/// When this node started (Unix seconds): the kernel's `btime` (`/proc/stat`), which a
/// container sees as its host's.
pub fn node_boot_time() -> Result<i64, KubeletError> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| KubeletError(format!("reading /proc/stat: {e}")))?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| KubeletError("/proc/stat has no btime line".into()))
}

/// The pod's sandbox as its `PodReadyToStartContainers` condition says (Kubernetes 1.29 and
/// later; `PodHasNetwork` before), which the kubelet sets when it has made the sandbox and its
/// network. The kubelet's `/pods` shows the pod as the API server last had it
/// (`pkg/kubelet/kubelet_getters.go`, `Kubelet.GetPods`: only static pods get the kubelet's own
/// status), so after a node restarts the list still holds the IP of the sandbox that died with
/// it until the kubelet reports the new one. The condition's time tells the two apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sandbox {
    /// The status has no such condition (an older cluster): the IP is taken as it is.
    Unknown,
    /// The condition is not `True`: no sandbox is up.
    NotReady,
    /// Up since this time (Unix seconds).
    ReadySince(i64),
}

impl Sandbox {
    fn of(pod: &PodFields<'_>) -> Self {
        let Some(condition) = pod
            .condition("PodReadyToStartContainers")
            .or_else(|| pod.condition("PodHasNetwork"))
        else {
            return Self::Unknown;
        };
        if condition.status.as_deref() != Some("True") {
            return Self::NotReady;
        }
        condition
            .last_transition_time
            .as_deref()
            .and_then(|t| {
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
            })
            .map_or(Self::NotReady, |t| Self::ReadySince(t.unix_timestamp()))
    }

    /// Whether the pod's listed IP is its sandbox's now, on a node up since `boot` (Unix
    /// seconds): a sandbox made before the node started died with it.
    pub fn ip_is_current(self, boot: i64) -> bool {
        match self {
            Self::Unknown => true,
            Self::NotReady => false,
            Self::ReadySince(since) => since >= boot,
        }
    }
}

/// The pods of one list, by namespace and name.
type PodIndex = HashMap<(String, String), Arc<NodePod>>;

/// Parses a kubelet `PodList`, keeping only what the agent uses.
pub fn parse_pod_list(body: &[u8]) -> Result<PodIndex, KubeletError> {
    let list: PodListFields<'_> = serde_json::from_slice(body)
        .map_err(|e| KubeletError(format!("unreadable pod list: {e}")))?;
    if list.items.len() > MAX_PODS {
        return Err(KubeletError(format!(
            "the pod list holds {} pods, more than the {MAX_PODS} a node can run",
            list.items.len()
        )));
    }
    let mut index = HashMap::with_capacity(list.items.len());
    for mut pod in list.items {
        let (Some(namespace), Some(name)) =
            (pod.metadata.namespace.take(), pod.metadata.name.take())
        else {
            continue;
        };
        let sandbox = Sandbox::of(&pod);
        let node_pod = NodePod {
            uid: pod.metadata.uid.as_deref().unwrap_or_default().to_owned(),
            service_account: pod.service_account().to_owned(),
            ip: pod
                .status
                .and_then(|s| s.pod_ip)
                .filter(|ip| !ip.is_empty())
                .map(Cow::into_owned),
            terminating: pod.metadata.deletion_timestamp,
            sandbox,
        };
        index.insert(
            (namespace.into_owned(), name.into_owned()),
            Arc::new(node_pod),
        );
    }
    Ok(index)
}

/// How often misses may make the agent list the node's pods: `burst` lists at once, `per_second`
/// sustained.
pub type ListRate = crate::rate::Rate;

/// One list: when it was asked for (a pod that existed then is in it, if the kubelet knew it),
/// and its pods.
#[derive(Clone)]
struct Snapshot {
    asked_at: Instant,
    pods: Arc<PodIndex>,
}

/// Whether [`PodCache::find`] waits, within its deadline, for the pod's IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpWait {
    /// The caller needs the IP (the socket API's init and refresh): a pod listed without one
    /// is listed again until it has one. On a real kubelet the pod's init container runs
    /// before the kubelet lists the IP its sandbox already has; answering 503 at once made the
    /// SIA wait a whole backoff step (2 s) for what takes the kubelet well under one.
    Wait,
    /// The pod as the list shows it (CSI files mode publishes before the sandbox exists):
    /// an entry with the caller's uid in a list within the TTL is the answer, IP or not. A
    /// newer list would only show the same pod (kubelet mounts its volumes before it makes the
    /// sandbox), and each such list costs the kubelet a serialisation of every pod on the
    /// node and the agent a parse: during a rollout, one list serves the pods it already holds.
    DontWait,
}

/// How often a pod listed without its IP is listed again, at most (all such callers share
/// each list).
const IP_POLL: Duration = Duration::from_millis(50);

/// The cached pod index of this node.
pub struct PodCache {
    client: reqwest::Client,
    url: String,
    /// Bearer token file, read for every list (the kubelet rotates projected tokens).
    token_file: Option<std::path::PathBuf>,
    ttl: Duration,
    /// When this node started (Unix seconds): an entry whose IP is of an older sandbox is not
    /// answered from the cache (see [`Sandbox`]).
    node_boot: i64,
    /// The latest list; read without waiting for a list being fetched.
    latest: std::sync::Mutex<Option<Snapshot>>,
    /// Held by the one caller fetching a list; the others wait for its answer.
    fetching: tokio::sync::Mutex<Lister>,
}

/// What the one caller fetching a list uses: the budget of forced lists, and the body buffer
/// every list is read into.
struct Lister {
    budget: crate::rate::TokenBucket,
    body: Vec<u8>,
}

impl PodCache {
    /// A cache of `<kubelet_url>/pods`, fresh for `ttl`, asked with the bearer token in
    /// `token_file` if any, and listed at most at `rate` when pods it lacks are asked for, on a
    /// node up since `node_boot` (Unix seconds).
    pub fn new(
        client: reqwest::Client,
        kubelet_url: &str,
        token_file: Option<std::path::PathBuf>,
        ttl: Duration,
        rate: ListRate,
        node_boot: i64,
    ) -> Self {
        Self {
            client,
            url: format!("{}/pods", kubelet_url.trim_end_matches('/')),
            token_file,
            ttl,
            node_boot,
            latest: std::sync::Mutex::new(None),
            fetching: tokio::sync::Mutex::new(Lister {
                budget: crate::rate::TokenBucket::new(rate, Instant::now()),
                body: Vec::new(),
            }),
        }
    }

    /// Lists the node's pods, reading the body into `body` (kept between lists: see
    /// [`read_limited_into`]).
    async fn fetch(&self, body: &mut Vec<u8>) -> Result<PodIndex, KubeletError> {
        let mut req = self.client.get(&self.url);
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path)
                .map_err(|e| KubeletError(format!("reading the token {}: {e}", path.display())))?;
            req = req.bearer_auth(token.trim());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| KubeletError(error_chain(&e)))?;
        let status = resp.status();
        read_limited_into(resp, MAX_POD_LIST, body)
            .await
            .map_err(|e| KubeletError(e.to_string()))?;
        if !status.is_success() {
            return Err(KubeletError(format!("GET /pods answered {status}")));
        }
        parse_pod_list(body)
    }

    fn latest(&self) -> Option<Snapshot> {
        self.latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A list asked for after `after` (any list younger than the TTL when `None`), fetching one
    /// if needed. A forced fetch (`after` set) waits for the budget, but not past `deadline`.
    async fn snapshot(
        &self,
        after: Option<Instant>,
        deadline: Instant,
    ) -> Result<Option<Snapshot>, KubeletError> {
        let usable = |s: &Snapshot| match after {
            Some(after) => s.asked_at > after,
            None => s.asked_at.elapsed() <= self.ttl,
        };
        if let Some(s) = self.latest().filter(usable) {
            return Ok(Some(s));
        }
        let mut lister = self.fetching.lock().await;
        // another caller may have fetched while this one waited for the lock
        if let Some(s) = self.latest().filter(usable) {
            return Ok(Some(s));
        }
        if after.is_some() {
            loop {
                match lister.budget.take(Instant::now()) {
                    Ok(()) => break,
                    Err(wait) if Instant::now() + wait > deadline => return Ok(None),
                    Err(wait) => tokio::time::sleep(wait).await,
                }
            }
        }
        let asked_at = Instant::now();
        let pods = Arc::new(self.fetch(&mut lister.body).await?);
        let snapshot = Snapshot { asked_at, pods };
        *self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(snapshot.clone());
        Ok(Some(snapshot))
    }

    /// Pods in the latest list (for the cache-size metric).
    pub fn cached_pods(&self) -> usize {
        self.latest().map_or(0, |s| s.pods.len())
    }

    /// The pod `namespace/name` as a list at most the TTL old shows it (fetched if the latest is
    /// older; never forced, so many volumes watching their pod share one list per TTL).
    pub async fn current(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<NodePod>>, KubeletError> {
        let deadline = Instant::now() + self.ttl;
        let snapshot = self.snapshot(None, deadline).await?;
        Ok(snapshot.and_then(|s| {
            s.pods
                .get(&(namespace.to_owned(), name.to_owned()))
                .map(Arc::clone)
        }))
    }

    /// Finds the pod `namespace/name` with `uid`, waiting up to `wait` for the kubelet to list it.
    ///
    /// An entry from a list asked for before this call that is not yet usable (another uid: the
    /// name was reused; with [`IpWait::Wait`], no IP yet, or the IP of a sandbox older than the
    /// node: the list predates the pod's sandbox) is checked once against a newer list rather
    /// than answered from the cache. The entry is returned whatever its
    /// state once a list newer than the call has it. When no list has it: with
    /// [`Registration::First`] (a new pod the kubelet may not list yet), `None` at the
    /// deadline; with [`Registration::Again`] (a pod that had an identity, so was listed
    /// before), `None` as soon as a list newer than the call lacks it.
    pub async fn find(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        wait: Duration,
        registration: Registration,
        ip_wait: IpWait,
    ) -> Result<Option<Arc<NodePod>>, KubeletError> {
        let called_at = Instant::now();
        let deadline = called_at + wait;
        let key = (namespace.to_owned(), name.to_owned());
        let mut after = None;
        let mut listed_without_ip = None;
        loop {
            let Some(snapshot) = self.snapshot(after, deadline).await? else {
                // no list could be had before the deadline: the latest answer, if there was one
                return Ok(listed_without_ip);
            };
            match snapshot.pods.get(&key) {
                Some(pod) => {
                    let has_ip = pod.ip.is_some() && pod.sandbox.ip_is_current(self.node_boot);
                    if pod.uid == uid && (has_ip || ip_wait == IpWait::DontWait) {
                        return Ok(Some(Arc::clone(pod)));
                    }
                    // a list newer than the call is the answer, unless this pod (not being
                    // deleted) is only waiting for the kubelet to list its sandbox's IP
                    let awaiting_ip = ip_wait == IpWait::Wait
                        && pod.uid == uid
                        && !pod.terminating
                        && Instant::now() < deadline;
                    if snapshot.asked_at >= called_at {
                        if !awaiting_ip {
                            return Ok(Some(Arc::clone(pod)));
                        }
                        listed_without_ip = Some(Arc::clone(pod));
                        let now = Instant::now();
                        tokio::time::sleep(IP_POLL.min(deadline.saturating_duration_since(now)))
                            .await;
                    }
                }
                None if Instant::now() >= deadline => return Ok(None),
                None if registration == Registration::Again && snapshot.asked_at >= called_at => {
                    return Ok(None);
                }
                None => {}
            }
            after = Some(snapshot.asked_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut budget = crate::rate::TokenBucket::new(
            ListRate {
                burst: 3,
                per_second: 10.0,
            },
            start,
        );
        for _ in 0..3 {
            assert_eq!(budget.take(start), Ok(()));
        }
        let wait = budget.take(start).unwrap_err();
        assert!(
            wait > Duration::from_millis(99) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        assert_eq!(budget.take(start + Duration::from_millis(100)), Ok(()));
        assert!(budget.take(start + Duration::from_millis(150)).is_err());
        // a quiet spell refills no more than the burst
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(budget.take(later), Ok(()));
        }
        assert!(budget.take(later).is_err());
    }

    /// After a node restarts, the kubelet lists each pod as the API server last had it: the IP of
    /// the sandbox that died with the node, until it reports the new one. The
    /// `PodReadyToStartContainers` condition's time (or `PodHasNetwork`'s, before 1.29) says
    /// which sandbox the IP is of.
    #[test]
    fn the_sandbox_condition_says_whether_the_listed_ip_is_current() {
        let pod = |conditions: &str| {
            let body = format!(
                r#"{{"items":[{{"metadata":{{"name":"p","namespace":"ns","uid":"u"}},
                "status":{{"podIP":"10.0.0.9","conditions":[{conditions}]}}}}]}}"#
            );
            parse_pod_list(body.as_bytes()).unwrap()[&("ns".to_owned(), "p".to_owned())].sandbox
        };
        let boot = time::macros::datetime!(2026-11-25 12:00:00 UTC).unix_timestamp();
        let ready = pod(
            r#"{"type":"Ready","status":"True","lastTransitionTime":"2026-11-25T13:00:00Z"},
               {"type":"PodReadyToStartContainers","status":"True","lastTransitionTime":"2026-11-25T12:00:05Z"}"#,
        );
        assert_eq!(ready, Sandbox::ReadySince(boot + 5));
        assert!(ready.ip_is_current(boot));
        // a sandbox from before the node's restart
        let before = pod(
            r#"{"type":"PodReadyToStartContainers","status":"True","lastTransitionTime":"2026-11-25T11:59:59Z"}"#,
        );
        assert!(!before.ip_is_current(boot));
        let older_name = pod(
            r#"{"type":"PodHasNetwork","status":"True","lastTransitionTime":"2026-11-20T08:00:00Z"}"#,
        );
        assert!(!older_name.ip_is_current(boot));
        // no sandbox up, or a time that cannot be read: not current
        for not_ready in [
            r#"{"type":"PodReadyToStartContainers","status":"False","lastTransitionTime":"2026-11-25T13:00:00Z"}"#,
            r#"{"type":"PodReadyToStartContainers","status":"True","lastTransitionTime":"yesterday"}"#,
            r#"{"type":"PodReadyToStartContainers","status":"True"}"#,
        ] {
            assert!(!pod(not_ready).ip_is_current(boot), "{not_ready}");
        }
        // a cluster whose statuses lack the condition: the IP is taken as listed
        let unknown =
            pod(r#"{"type":"Ready","status":"True","lastTransitionTime":"2020-01-01T00:00:00Z"}"#);
        assert_eq!(unknown, Sandbox::Unknown);
        assert!(unknown.ip_is_current(boot));
        assert!(node_boot_time().unwrap() > 0);
    }

    #[test]
    fn a_list_keeps_the_fields_the_agent_uses() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
            {"metadata":{"name":"web-1","namespace":"ns","uid":"u-1","labels":{"a":"b"},
              "managedFields":[{"manager":"kubelet","fieldsV1":{"f:status":{}}}]},
             "spec":{"serviceAccountName":"web","containers":[{"name":"app","env":[{"name":"X","value":"\"quoted\""}]}]},
             "status":{"phase":"Running","podIP":"10.0.0.1","podIPs":[{"ip":"10.0.0.1"}]}},
            {"metadata":{"name":"gone","namespace":"ns","uid":"u-2","deletionTimestamp":"2026-01-01T00:00:00Z"},
             "spec":{},"status":{"podIP":""}},
            {"metadata":{"name":"esc\u0061ped","namespace":"ns","uid":"u-3"}},
            {"metadata":{"uid":"nameless"}}
        ]}"#;
        let index = parse_pod_list(body).unwrap();
        assert_eq!(index.len(), 3);
        let web = &index[&("ns".to_owned(), "web-1".to_owned())];
        assert_eq!(
            **web,
            NodePod {
                uid: "u-1".into(),
                service_account: "web".into(),
                ip: Some("10.0.0.1".into()),
                terminating: false,
                sandbox: Sandbox::Unknown,
            }
        );
        let gone = &index[&("ns".to_owned(), "gone".to_owned())];
        assert!(gone.terminating);
        assert_eq!(gone.ip, None, "an empty podIP is no IP");
        assert_eq!(gone.service_account, "default");
        assert!(index.contains_key(&("ns".to_owned(), "escaped".to_owned())));
    }

    #[test]
    fn hostile_lists_are_refused_with_the_reason() {
        for (body, why) in [
            (&b""[..], "unreadable"),
            (b"[]", "unreadable"),
            (b"{\"items\":{}}", "unreadable"),
            (b"{\"items\":[{\"metadata\":{\"name\":7}}]}", "unreadable"),
            (b"{\"items\":[{\"metadata\":{\"name\":\"a\"", "unreadable"),
            (b"{\"kind\":\"Status\",\"code\":403}", "unreadable"),
        ] {
            let err = parse_pod_list(body).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        // deeply nested junk inside a skipped field hits serde_json's recursion limit, not the stack
        let deep = format!(
            "{{\"items\":[{{\"metadata\":{{}},\"spec\":{}{}}}]}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(parse_pod_list(deep.as_bytes()).is_err());
        let many = format!(
            "{{\"items\":[{}]}}",
            vec!["{\"metadata\":{}}"; MAX_PODS + 1].join(",")
        );
        let err = parse_pod_list(many.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("more than"), "{err}");
    }
}
