//! Issuing a files-mode pod's identity as soon as the pod is bound to this node, before the
//! kubelet's `NodePublishVolume` asks for it (docs/design.md §4.10, "Early issuance").
//!
//! Why: the kubelet starts a pod only once all its volumes are set up, and looks again only every
//! 300 ms. A files-mode publish that registers with ZTS inside the call (the JWT, the Service
//! lookup, ZTS and its callback: tens of milliseconds with a remote ZTS) is the pod's last
//! volume more often than any other, and a pod whose last volume misses a look starts 300 ms
//! later. The kubelet itself needs 100 to 300 ms from the pod's binding to its first mount
//! (its volume populator's and reconciler's loops), so an identity asked for at the binding is
//! ready before the publish comes, and the publish only writes it.
//!
//! Who vouches: the API server, whose watch says the pod is bound to this node (the same fact
//! the kubelet's publish rests on, one step earlier). Nothing is trusted that was not before:
//! ZTS's callback checks the pod with the API server as for every registration (uid, service
//! account, not terminating, on the asking agent's node), and the publish gets the identity only
//! for the same pod (uid, namespace, name, service account) the kubelet names.
//!
//! What it costs: a watch of this node's pending pods that carry the injection label; a key and
//! a certificate in this process's memory from the binding to the publish (at most
//! [`HOLD`], at most [`MAX_HELD`] pods at once); and one issuance wasted for a pod deleted
//! before its publish (counted: `csi_early_issues_total{outcome="dropped"}`). Without the
//! watch (off, no RBAC, the API away) every publish issues itself, as it always did.

mod bound_pod;

pub use bound_pod::BoundPod;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long an identity issued ahead waits for its publish. The kubelet publishes within a
/// second of the binding on a healthy node; a pod whose image pull or admission takes longer
/// still publishes (and issues) itself.
pub const HOLD: Duration = Duration::from_secs(120);

/// Most identities held (or being issued) ahead at once: a node's pod limit (110 by default)
/// with room, so a flood of bindings costs bounded memory and ZTS calls.
pub const MAX_HELD: usize = 256;

/// Labels of the early-issuance counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `taken` (a publish wrote it), `failed` (the publish issued itself), `expired` (no publish
    /// within [`HOLD`]), `dropped` (the pod went after it was issued), `cancelled` (the pod
    /// went while it waited for its slot or was being issued: that work stopped there) or
    /// `overtaken` (its publish came while it still waited for its slot, and issued itself).
    pub outcome: &'static str,
}

/// Which pod an identity was issued for: a publish takes it only for the same one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNames {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Service account.
    pub service_account: String,
}

/// Marked by an early issuance once it holds its slot, when it is being issued rather than
/// waiting for its turn behind other warm-up work: a publish waits only for an issuance under
/// way, and overtakes one still waiting (it registers itself, in real time).
#[derive(Clone, Debug, Default)]
pub struct Started(Arc<AtomicBool>);

impl Started {
    /// One already under way (an issuance that waits for no slot).
    pub fn already() -> Self {
        let started = Self::default();
        started.mark();
        started
    }

    /// The issuance holds its slot now.
    pub fn mark(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_marked(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

struct Entry<T> {
    pod: PodNames,
    /// Whether the issuance has its slot.
    started: Started,
    /// Locked by the issuing task until its answer is in.
    slot: Arc<tokio::sync::Mutex<Option<T>>>,
    /// The issuing task, ended when the pod goes (queued, issuing or holding its answer).
    task: tokio::task::AbortHandle,
}

/// The identities issued (or being issued) ahead, by pod uid.
pub struct EarlyIssues<T> {
    entries: Mutex<HashMap<String, Entry<T>>>,
    hold: Duration,
    outcomes: Family<OutcomeLabels, Counter>,
}

/// The counter of what became of identities issued ahead, registered as `csi_early_issues`.
pub fn register_outcomes(
    registry: &mut prometheus_client::registry::Registry,
) -> Family<OutcomeLabels, Counter> {
    let outcomes = Family::default();
    registry.register(
        "csi_early_issues",
        "Files-mode identities issued when their pod was bound, before its publish, by outcome (taken, failed, expired, dropped, cancelled, overtaken)",
        outcomes.clone(),
    );
    outcomes
}

impl<T: Send + 'static> EarlyIssues<T> {
    /// An empty store whose identities wait `hold` for their publish.
    pub fn new(hold: Duration, outcomes: Family<OutcomeLabels, Counter>) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::default(),
            hold,
            outcomes,
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry<T>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, outcome: &'static str) {
        self.outcomes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Removes `uid`'s entry if it is still the one holding `slot`; whether it did.
    fn remove_if(&self, uid: &str, slot: &Arc<tokio::sync::Mutex<Option<T>>>) -> bool {
        let mut entries = self.entries();
        if entries.get(uid).is_some_and(|e| Arc::ptr_eq(&e.slot, slot)) {
            entries.remove(uid);
            true
        } else {
            false
        }
    }

    /// Identities held or being issued now.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Issues for pod `uid` with `issue` on a task of its own, unless its identity is already
    /// held or being issued, or [`MAX_HELD`] are. `issue` answers `None` when it failed (and
    /// has said why).
    pub fn begin<F>(self: &Arc<Self>, uid: String, pod: PodNames, started: Started, issue: F)
    where
        F: Future<Output = Option<T>> + Send + 'static,
    {
        let slot = Arc::new(tokio::sync::Mutex::new(None));
        let Ok(mut answer) = Arc::clone(&slot).try_lock_owned() else {
            return; // a new lock is never held
        };
        let mut entries = self.entries();
        if entries.contains_key(&uid) || entries.len() >= MAX_HELD {
            return;
        }
        let store = Arc::clone(self);
        let entry_slot = Arc::clone(&slot);
        let key = uid.clone();
        // spawned with the map locked: the task finds its entry in place when it looks
        let task = tokio::spawn(async move {
            let issued = issue.await;
            let Some(issued) = issued else {
                drop(answer);
                if store.remove_if(&uid, &slot) {
                    store.count("failed");
                }
                return;
            };
            *answer = Some(issued);
            let held = store
                .entries()
                .get(&uid)
                .is_some_and(|e| Arc::ptr_eq(&e.slot, &slot));
            if !held {
                // expired or replaced meanwhile: the key goes now
                answer.take();
                return;
            }
            drop(answer);
            tokio::time::sleep(store.hold).await;
            if store.remove_if(&uid, &slot) {
                store.count("expired");
            }
        });
        entries.insert(
            key,
            Entry {
                pod,
                started,
                slot: entry_slot,
                task: task.abort_handle(),
            },
        );
    }

    /// The identity issued ahead for pod `uid`, waiting for it while it is being issued;
    /// `None` when there is none, it failed, or it was issued for another pod than `pod`.
    pub async fn take(&self, uid: &str, pod: &PodNames) -> Option<T> {
        let slot = {
            let entries = self.entries();
            let entry = entries.get(uid)?;
            if entry.pod != *pod {
                tracing::warn!(uid, held = ?entry.pod, asked = ?pod, "an identity issued ahead is for another pod than the publish names; the publish issues its own");
                return None;
            }
            entry.started.is_marked().then(|| Arc::clone(&entry.slot))
        };
        let Some(slot) = slot else {
            // still waiting behind other warm-up work: the publish, real time, goes first
            self.end(uid, "overtaken");
            return None;
        };
        let issued = slot.lock().await.take();
        if issued.is_some() && self.remove_if(uid, &slot) {
            self.count("taken");
        }
        issued
    }

    /// Pod `uid` is gone or going: its issuance is cancelled, waiting for its slot or under
    /// way (counted `cancelled`), or what was issued for it is dropped (`dropped`).
    pub fn forget(&self, uid: &str) {
        let Some(entry) = self.entries().remove(uid) else {
            return;
        };
        entry.task.abort();
        // the issuing task holds the lock until its answer is in
        let issued = entry.slot.try_lock().is_ok_and(|answer| answer.is_some());
        self.count(if issued { "dropped" } else { "cancelled" });
    }

    /// Ends `uid`'s issuance, counted `outcome`.
    fn end(&self, uid: &str, outcome: &'static str) {
        if let Some(entry) = self.entries().remove(uid) {
            entry.task.abort();
            self.count(outcome);
        }
    }
}

/// What a watch event asks of the store.
#[derive(Debug)]
pub enum Step {
    /// Issue for this newly bound pod.
    Issue(Box<BoundPod>),
    /// Drop what was issued for this pod uid.
    Forget(String),
}

/// Which pods the watch has seen, so that only a pod bound while the agent watches gets an
/// early issuance: one already pending when the watch (re)started may have been published by
/// then, and issuing for it again would waste a registration.
#[derive(Debug, Default)]
pub struct Seen {
    pods: HashSet<String>,
    relisting: Option<HashSet<String>>,
}

impl Seen {
    /// The steps one watcher event asks for, on node `node`.
    pub fn on_event(
        &mut self,
        node: &str,
        event: kube::runtime::watcher::Event<BoundPod>,
    ) -> Vec<Step> {
        use kube::runtime::watcher::Event;
        match event {
            Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(pod) => {
                let Some(uid) = pod.uid().map(str::to_owned) else {
                    return Vec::new();
                };
                if let Some(listed) = self.relisting.as_mut() {
                    listed.insert(uid.clone());
                }
                if pod.terminating {
                    vec![Step::Forget(uid)]
                } else {
                    Vec::new()
                }
            }
            Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                // pods that went while the watch was away
                let gone = self
                    .pods
                    .difference(&listed)
                    .map(|uid| Step::Forget(uid.clone()))
                    .collect();
                self.pods = listed;
                gone
            }
            Event::Apply(pod) => {
                let Some(uid) = pod.uid().map(str::to_owned) else {
                    return Vec::new();
                };
                if pod.terminating {
                    self.pods.insert(uid.clone());
                    return vec![Step::Forget(uid)];
                }
                let new = self.pods.insert(uid);
                if new && pod.has_files_volume && pod.node_name.as_deref() == Some(node) {
                    vec![Step::Issue(Box::new(pod))]
                } else {
                    Vec::new()
                }
            }
            Event::Delete(pod) => match pod.uid() {
                Some(uid) => {
                    self.pods.remove(uid);
                    vec![Step::Forget(uid.to_owned())]
                }
                None => Vec::new(),
            },
        }
    }
}

/// The watch's field selector: the pods pending on `node` (a pod enters it when it is bound
/// here and leaves it once it runs, so the agent holds only the pods starting now).
pub fn field_selector(node: &str) -> String {
    format!("spec.nodeName={node},status.phase=Pending")
}

/// The server ends each watch after this many seconds and the watcher resumes it from the last
/// resource version (one request, no list).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// Keeps issuing ahead for the pods the API server binds to `node` (those with the injection
/// label), through `issue`, until the stream ends with the process. Watch errors back off
/// (kube-runtime's default, up to about a minute); meanwhile publishes issue themselves.
pub fn spawn_watch<T, F, Fut>(
    client: kube::Client,
    node: String,
    store: Arc<EarlyIssues<T>>,
    issue: F,
) -> tokio::task::JoinHandle<()>
where
    T: Send + 'static,
    F: Fn(&BoundPod, Started) -> Option<(PodNames, Fut)> + Send + 'static,
    Fut: Future<Output = Option<T>> + Send + 'static,
{
    use futures_util::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let config = watcher::Config::default()
        .timeout(WATCH_TIMEOUT_SECS)
        .fields(&field_selector(&node))
        .labels(athenz_core::volume_mode::INJECTED_LABEL);
    let pods: kube::Api<BoundPod> = kube::Api::all(client);
    tokio::spawn(async move {
        let mut seen = Seen::default();
        let mut failing = false;
        let mut events = watcher(pods, config).default_backoff().boxed();
        while let Some(next) = events.next().await {
            let event = match next {
                Ok(event) => event,
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "watching this node's pods failed: publishes issue themselves until the watch delivers again");
                    }
                    failing = true;
                    continue;
                }
            };
            if std::mem::take(&mut failing) {
                tracing::info!("watching this node's pods again");
            }
            for step in seen.on_event(&node, event) {
                match step {
                    Step::Forget(uid) => store.forget(&uid),
                    Step::Issue(pod) => {
                        let started = Started::default();
                        if let (Some(uid), Some((names, issuing))) =
                            (pod.uid(), issue(&pod, started.clone()))
                        {
                            store.begin(uid.to_owned(), names, started, issuing);
                        }
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests;
