//! A watch-fed copy of the pods' [`PodFacts`], so that most confirmations read no pod from the API
//! (docs/design.md §4.4, "Reading the pod").
//!
//! The cache only ever *allows*: the handler takes a cached pod only when every pod check passes
//! on it, and reads the pod from the API otherwise (a miss, a pod the cache shows without its IP
//! yet, or any would-be denial). So a cache that is behind can never refuse a genuine pod. What it
//! can do is allow a pod whose deletion or end is still on its way to the cache; each such fact
//! only ever moves one way (a deletion timestamp appears, the phase ends, the pod goes), so the
//! cache is at most as wrong as a confirmation made that much earlier. Certificates are not
//! revoked when their pod ends either, so that lag is bounded the same way a confirmation's age
//! is: the cache answers only while its watch is synced and the API delivered an event within
//! [`FRESH_WITHIN`]. Any watch error makes it answer nothing until the watch delivers again.
//!
//! Memory: one small entry per pod the selectors match (the names, uid, node, service account,
//! phase and IPs; a few hundred bytes), so 150 000 pods, Kubernetes' tested limit, cost tens of
//! MiB per replica. The default selector is the initializer's label
//! ([`athenz_core::volume_mode::INJECTED_LABEL`]): only the pods it gave an identity volume are
//! watched, and a pod with a hand-written volume is read when confirmed. `--pod-cache-selector ""`
//! watches every pod; `--pod-cache=false` turns the cache off.
//!
//! Phase: by default only pods pending on a node ([`PENDING_ON_A_NODE`]). Every pod's first
//! certificate is confirmed while it is pending on its node (the kubelet publishes a CSI volume,
//! and runs init containers, before the pod's phase moves on), and that is the one confirmation
//! per pod the cache is for; a refresh, hours later, reads its pod, and a pod no node holds yet
//! cannot be confirmed at all. Measured on the real node, a files-mode pod's life is ten watch
//! events of about 6 KB, most of them after it started (its readiness, its deletion and its
//! containers' ends) and one before it was scheduled: those are never sent, so each replica
//! reads four events per pod instead of ten. The set held is the pods starting now.

use crate::pods::PodFacts;
use athenz_core::pod_fields::PodFields;
use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, watcher::Event};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The field selector of the pods held by default: those whose first certificate is still to
/// be confirmed, on the node that will confirm it. A pod enters it when it is bound to a node
/// and leaves it once it runs (phases only move forward); the API server then sends its
/// watchers an addition and a deletion, so the cache takes and drops it.
pub const PENDING_ON_A_NODE: &str = "status.phase=Pending,spec.nodeName!=";

/// Which pods the watch asks for; an empty selector selects every pod.
#[derive(Debug, Clone, Copy)]
pub struct Selectors<'a> {
    /// A label selector.
    pub labels: &'a str,
    /// A field selector (the pod fields the API server indexes, `status.phase` among them).
    pub fields: &'a str,
}

impl Selectors<'_> {
    /// The watcher's configuration for these selectors.
    fn watcher_config(&self) -> watcher::Config {
        let mut config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
        if !self.labels.is_empty() {
            config = config.labels(self.labels);
        }
        if !self.fields.is_empty() {
            config = config.fields(self.fields);
        }
        config
    }
}

/// How recent the watch's last event must be for the cache to answer: the most it can be behind
/// when its connection died without a word (a live watch is milliseconds behind).
pub const FRESH_WITHIN: Duration = Duration::from_secs(30);

/// The server ends each watch after this many seconds and the watcher resumes it from the last
/// resource version (one request; no list). kube-runtime also gives up on a watch silent for
/// this long plus 5 s.
const WATCH_TIMEOUT_SECS: u32 = 290;

type PodKey = (String, String);

#[derive(Default)]
struct State {
    pods: HashMap<PodKey, PodFacts>,
    /// The pods of a (re)list in progress, swapped in when it is done.
    relisting: Option<HashMap<PodKey, PodFacts>>,
    /// A list is complete and no error has come since.
    synced: bool,
    last_event: Option<Instant>,
}

/// The cache; cheap to clone (one shared state).
#[derive(Clone, Default)]
pub struct PodCache {
    state: Arc<Mutex<State>>,
}

impl PodCache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pod's facts if the cache may answer now: synced, and an event within
    /// [`FRESH_WITHIN`]. `None` means "ask the API".
    pub fn fresh(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        let state = self.state();
        let fresh = state.synced
            && state
                .last_event
                .is_some_and(|at| at.elapsed() < FRESH_WITHIN);
        if !fresh {
            return None;
        }
        state
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Pods held (after the first list).
    pub fn len(&self) -> usize {
        self.state().pods.len()
    }

    /// Whether no pod is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes one watcher event.
    pub fn apply(&self, event: Event<WatchedPod>) {
        let mut state = self.state();
        state.last_event = Some(Instant::now());
        match event {
            Event::Init => {
                state.relisting = Some(HashMap::new());
                state.synced = false;
            }
            Event::InitApply(pod) => {
                if let (Some(key), Some(list)) = (key_of(&pod), state.relisting.as_mut()) {
                    list.insert(key, pod.facts);
                }
            }
            Event::InitDone => {
                if let Some(list) = state.relisting.take() {
                    state.pods = list;
                }
                state.synced = true;
            }
            Event::Apply(pod) => {
                if let Some(key) = key_of(&pod) {
                    state.pods.insert(key, pod.facts);
                }
                // a watch resumed after an error delivers from where it stopped: in step again
                state.synced = state.relisting.is_none();
            }
            Event::Delete(pod) => {
                if let Some(key) = key_of(&pod) {
                    state.pods.remove(&key);
                }
                state.synced = state.relisting.is_none();
            }
        }
    }

    /// A watch error: answer nothing until the watch delivers again. Returns whether the cache
    /// was answering until now (to log the change once, not every retry).
    pub fn failed(&self) -> bool {
        std::mem::replace(&mut self.state().synced, false)
    }

    /// Keeps the cache fed from a watch of the pods `selectors` match, calling `on_event` for
    /// each event (the API answered). Errors back off (kube-runtime's default, up to about a
    /// minute) and are logged when the cache stops answering.
    pub fn spawn_watch(
        &self,
        client: kube::Client,
        selectors: &Selectors<'_>,
        on_event: impl Fn() + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let config = selectors.watcher_config();
        let pods: kube::Api<WatchedPod> = kube::Api::all(client);
        let cache = self.clone();
        tokio::spawn(async move {
            let mut events = watcher(pods, config).default_backoff().boxed();
            while let Some(next) = events.next().await {
                match next {
                    Ok(event) => {
                        let was_synced = cache.state().synced;
                        cache.apply(event);
                        on_event();
                        if !was_synced && cache.state().synced {
                            tracing::info!(pods = cache.len(), "pod cache answering");
                        }
                    }
                    Err(e) => {
                        if cache.failed() {
                            tracing::warn!(error = %e, "pod cache stopped answering: every confirmation reads its pod from the API until the watch delivers again");
                        } else {
                            tracing::debug!(error = %e, "pod watch");
                        }
                    }
                }
            }
        })
    }
}

fn key_of(pod: &WatchedPod) -> Option<PodKey> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// A pod as the watch delivers it, parsed with the same field list as a `GET`
/// ([`PodFields`]) and nothing else: every other field, `managedFields` among them, is skipped
/// unread. A full `k8s_openapi` Pod built for every event of every pod cost the callback more
/// CPU than the pod reads the cache saves.
#[derive(Clone, Debug, Default)]
pub struct WatchedPod {
    /// Name, namespace, uid and resource version: what the watcher and the cache key need.
    metadata: ObjectMeta,
    /// What the checks read (no conditions, no resource version: nothing reads them).
    facts: PodFacts,
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut facts = PodFields::deserialize(deserializer)?.into_owned();
        let text = |field: &Option<Cow<'static, str>>| field.as_deref().map(str::to_owned);
        let metadata = ObjectMeta {
            namespace: text(&facts.metadata.namespace),
            name: text(&facts.metadata.name),
            uid: text(&facts.metadata.uid),
            resource_version: facts.metadata.resource_version.take().map(Cow::into_owned),
            ..ObjectMeta::default()
        };
        if let Some(status) = facts.status.as_mut() {
            status.conditions = None;
        }
        Ok(Self { metadata, facts })
    }
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group((): &()) -> Cow<'_, str> {
        "".into()
    }
    fn version((): &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural((): &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_testbed::real_pods::{RealPod, real_pod, real_status};

    /// A real-size pod's JSON, as the API sends it (with a resource version).
    fn pod_json(name: &str, ip: Option<&str>, deleting: bool) -> Vec<u8> {
        let mut pod = real_pod(&RealPod {
            namespace: "payments",
            name,
            service_account: "web",
            node: "node-a",
        })
        .expect("real pod");
        pod.metadata.uid = Some(format!("uid-of-{name}"));
        pod.metadata.resource_version = Some("4711".into());
        if let Some(ip) = ip {
            pod.status =
                Some(serde_json::from_value(real_status(ip, "192.0.2.10")).expect("status"));
        }
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        serde_json::to_vec(&pod).expect("json")
    }

    fn pod(name: &str, ip: Option<&str>, deleting: bool) -> WatchedPod {
        serde_json::from_slice(&pod_json(name, ip, deleting)).expect("a watched pod")
    }

    fn listed(pods: Vec<WatchedPod>) -> PodCache {
        let cache = PodCache::default();
        cache.apply(Event::Init);
        for p in pods {
            cache.apply(Event::InitApply(p));
        }
        cache.apply(Event::InitDone);
        cache
    }

    #[test]
    fn a_watched_pod_holds_what_a_get_of_the_same_pod_parses() {
        use kube::ResourceExt;
        for (ip, deleting) in [(Some("10.1.2.3"), false), (None, true)] {
            let json = pod_json("web-0", ip, deleting);
            assert!(
                json.len() > 8 * 1024,
                "a real-size pod: {} bytes",
                json.len()
            );
            let watched: WatchedPod = serde_json::from_slice(&json).expect("watched");
            let mut parsed = crate::pods::pod_facts(&json).expect("facts");
            // what the cache does not keep: conditions and the resource version
            if let Some(status) = parsed.status.as_mut() {
                status.conditions = None;
            }
            assert_eq!(
                parsed.metadata.resource_version.take().as_deref(),
                Some("4711")
            );
            assert_eq!(watched.facts, parsed);
            assert_eq!(watched.resource_version().as_deref(), Some("4711"));
            assert_eq!(watched.namespace().as_deref(), Some("payments"));
            assert_eq!(watched.name_any(), "web-0");
            assert_eq!(watched.uid().as_deref(), Some("uid-of-web-0"));
        }
    }

    #[test]
    fn a_watched_pod_that_is_not_a_pod_is_an_error_or_ignored() {
        let deep = format!(
            "{{\"metadata\":{{\"labels\":{}1{}}}}}",
            "[".repeat(300),
            "]".repeat(300)
        );
        for bad in [
            &b"{\"metadata\":{\"name\":7}}"[..],
            b"{\"metadata\":",
            b"\"a pod\"",
        ] {
            assert!(
                serde_json::from_slice::<WatchedPod>(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // an object without a name or namespace parses (deep nesting in a field no check reads
        // is skipped, not recursed into), and the cache holds nothing for it
        let cache = listed(vec![]);
        for nameless in [
            &b"[]"[..],
            b"{}",
            b"{\"metadata\":{\"name\":\"web-0\"}}",
            deep.as_bytes(),
        ] {
            let pod: WatchedPod = serde_json::from_slice(nameless).expect("parses");
            cache.apply(Event::Apply(pod));
        }
        assert!(cache.is_empty());
    }

    #[test]
    fn the_watch_asks_for_what_the_selectors_name_and_no_more() {
        let default = Selectors {
            labels: athenz_core::volume_mode::INJECTED_LABEL,
            fields: PENDING_ON_A_NODE,
        }
        .watcher_config();
        assert_eq!(
            default.label_selector.as_deref(),
            Some(athenz_core::volume_mode::INJECTED_LABEL)
        );
        assert_eq!(
            default.field_selector.as_deref(),
            Some("status.phase=Pending,spec.nodeName!=")
        );
        assert_eq!(default.timeout, Some(WATCH_TIMEOUT_SECS));
        let every_pod = Selectors {
            labels: "",
            fields: "",
        }
        .watcher_config();
        assert_eq!(every_pod.label_selector, None);
        assert_eq!(every_pod.field_selector, None);
    }

    #[test]
    fn a_pod_that_leaves_the_selection_leaves_the_cache() {
        // the API server tells a watcher of pending pods that a pod which started
        // running is deleted (it no longer matches); a confirmation then reads it
        let cache = listed(vec![pod("web-0", None, false), pod("web-1", None, false)]);
        cache.apply(Event::Delete(pod("web-0", Some("10.1.2.3"), false)));
        assert_eq!(cache.fresh("payments", "web-0"), None, "it runs now");
        assert!(cache.fresh("payments", "web-1").is_some(), "still starting");
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn it_answers_only_once_a_list_is_complete() {
        let cache = PodCache::default();
        assert_eq!(cache.fresh("payments", "web-0"), None, "nothing listed");
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(pod("web-0", Some("10.1.2.3"), false)));
        assert_eq!(
            cache.fresh("payments", "web-0"),
            None,
            "the list is not done"
        );
        cache.apply(Event::InitDone);
        let facts = cache.fresh("payments", "web-0").expect("listed");
        assert_eq!(facts.metadata.uid.as_deref(), Some("uid-of-web-0"));
        assert_eq!(cache.fresh("payments", "web-9"), None, "never listed");
        assert_eq!(cache.fresh("billing", "web-0"), None, "another namespace");
    }

    #[test]
    fn events_change_deletion_and_ip_and_remove() {
        let cache = listed(vec![pod("web-0", None, false)]);
        assert_eq!(cache.fresh("payments", "web-0").expect("held").status, None);
        cache.apply(Event::Apply(pod("web-0", Some("10.1.2.3"), false)));
        let status = cache.fresh("payments", "web-0").expect("held").status;
        assert_eq!(
            status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.1.2.3"),
            "the IP arrives"
        );
        cache.apply(Event::Apply(pod("web-0", Some("10.1.2.3"), true)));
        assert!(
            cache
                .fresh("payments", "web-0")
                .expect("held")
                .metadata
                .deletion_timestamp
        );
        cache.apply(Event::Delete(pod("web-0", Some("10.1.2.3"), true)));
        assert_eq!(cache.fresh("payments", "web-0"), None, "deleted");
        assert!(cache.is_empty());
    }

    #[test]
    fn a_relist_replaces_what_the_last_one_held() {
        let cache = listed(vec![pod("web-0", None, false), pod("web-1", None, false)]);
        assert_eq!(cache.len(), 2);
        // a 410 Gone: the watcher lists again; web-0 went while it was not watching
        cache.apply(Event::Init);
        assert_eq!(cache.fresh("payments", "web-1"), None, "relisting");
        cache.apply(Event::InitApply(pod("web-1", None, false)));
        cache.apply(Event::InitDone);
        assert_eq!(cache.fresh("payments", "web-0"), None, "gone in the relist");
        assert!(cache.fresh("payments", "web-1").is_some());
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn an_error_silences_it_until_the_watch_delivers_again() {
        let cache = listed(vec![pod("web-0", None, false)]);
        assert!(cache.failed(), "it was answering");
        assert!(!cache.failed(), "a second error changes nothing");
        assert_eq!(cache.fresh("payments", "web-0"), None, "after an error");
        // the resumed watch delivers from where it stopped
        cache.apply(Event::Apply(pod("web-1", None, false)));
        assert!(cache.fresh("payments", "web-0").is_some());
        assert!(cache.fresh("payments", "web-1").is_some());
    }

    #[test]
    fn a_watch_silent_past_the_freshness_window_is_not_answered_from() {
        let cache = listed(vec![pod("web-0", None, false)]);
        assert!(cache.fresh("payments", "web-0").is_some());
        cache.state().last_event =
            Instant::now().checked_sub(FRESH_WITHIN + Duration::from_secs(1));
        assert_eq!(
            cache.fresh("payments", "web-0"),
            None,
            "too long without an event"
        );
        cache.apply(Event::Apply(pod("web-1", None, false)));
        assert!(cache.fresh("payments", "web-0").is_some(), "an event again");
    }
}
