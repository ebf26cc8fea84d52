use super::*;
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio::sync::oneshot;

fn names(name: &str) -> PodNames {
    PodNames {
        namespace: "payments".into(),
        name: name.into(),
        service_account: "web".into(),
    }
}

fn outcome(outcomes: &Family<OutcomeLabels, Counter>, outcome: &'static str) -> u64 {
    outcomes.get_or_create(&OutcomeLabels { outcome }).get()
}

fn store() -> (Arc<EarlyIssues<String>>, Family<OutcomeLabels, Counter>) {
    let outcomes = Family::default();
    (EarlyIssues::new(HOLD, outcomes.clone()), outcomes)
}

/// An issuance that answers when told to.
fn issuance() -> (
    oneshot::Sender<Option<String>>,
    impl Future<Output = Option<String>> + Send + 'static,
) {
    let (answer, answered) = oneshot::channel();
    (answer, async move { answered.await.ok().flatten() })
}

/// A publish of pod `web-0` (uid `uid-1`) taking its identity, on a task of its own.
fn spawn_take(early: &Arc<EarlyIssues<String>>) -> tokio::task::JoinHandle<Option<String>> {
    let early = Arc::clone(early);
    tokio::spawn(async move { early.take("uid-1", &names("web-0")).await })
}

#[tokio::test]
async fn a_publish_waits_for_the_issuance_under_way_and_takes_it_once() {
    let (early, outcomes) = store();
    let (answer, issuing) = issuance();
    early.begin("uid-1".into(), names("web-0"), Started::already(), issuing);
    let taking = spawn_take(&early);
    tokio::task::yield_now().await;
    assert!(!taking.is_finished(), "the publish waits for ZTS's answer");
    answer.send(Some("identity".into())).expect("answered");
    assert_eq!(taking.await.expect("task").as_deref(), Some("identity"));
    assert_eq!(outcome(&outcomes, "taken"), 1);
    assert!(early.is_empty());
    assert_eq!(early.take("uid-1", &names("web-0")).await, None);
}

#[tokio::test]
async fn an_identity_is_taken_only_for_the_pod_it_was_issued_for() {
    let (early, outcomes) = store();
    early.begin("uid-1".into(), names("web-0"), Started::already(), async {
        Some("identity".to_owned())
    });
    tokio::task::yield_now().await;
    let mut other_account = names("web-0");
    other_account.service_account = "admin".into();
    for other in [names("web-1"), other_account] {
        assert_eq!(early.take("uid-1", &other).await, None);
    }
    assert_eq!(early.take("uid-2", &names("web-0")).await, None);
    assert_eq!(outcome(&outcomes, "taken"), 0);
    assert_eq!(
        early.take("uid-1", &names("web-0")).await.as_deref(),
        Some("identity")
    );
}

#[tokio::test]
async fn a_failed_issuance_leaves_the_publish_to_issue_itself() {
    let (early, outcomes) = store();
    let (answer, issuing) = issuance();
    early.begin("uid-1".into(), names("web-0"), Started::already(), issuing);
    let taking = spawn_take(&early);
    answer.send(None).expect("answered");
    assert_eq!(taking.await.expect("task"), None);
    assert_eq!(outcome(&outcomes, "failed"), 1);
    assert!(early.is_empty());
}

#[tokio::test]
async fn a_pod_gone_after_its_issuance_drops_its_identity() {
    let (early, outcomes) = store();
    let (answer, issuing) = issuance();
    early.begin("uid-1".into(), names("web-0"), Started::already(), issuing);
    answer.send(Some("identity".into())).expect("answered");
    tokio::task::yield_now().await;
    early.forget("uid-1");
    assert_eq!(early.take("uid-1", &names("web-0")).await, None);
    assert_eq!(outcome(&outcomes, "dropped"), 1);
    assert_eq!(outcome(&outcomes, "taken"), 0);
    // forgetting a pod nothing was issued for counts nothing
    early.forget("uid-9");
    assert_eq!(outcome(&outcomes, "dropped"), 1);
    assert_eq!(outcome(&outcomes, "cancelled"), 0);
}

/// Counts the issuances alive (started, not yet dropped).
#[derive(Clone, Default)]
struct Alive(Arc<std::sync::atomic::AtomicUsize>);

impl Alive {
    fn enter(&self) -> AliveGuard {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        AliveGuard(self.clone())
    }
    fn now(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct AliveGuard(Alive);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn forget_during_an_issuance_cancels_it() {
    let (early, outcomes) = store();
    let alive = Alive::default();
    let (answer, answered) = oneshot::channel::<Option<String>>();
    let issuing = {
        let alive = alive.clone();
        async move {
            let _alive = alive.enter();
            answered.await.ok().flatten()
        }
    };
    early.begin("uid-1".into(), names("web-0"), Started::already(), issuing);
    tokio::task::yield_now().await;
    assert_eq!(alive.now(), 1, "under way");
    let taking = spawn_take(&early);
    tokio::task::yield_now().await;
    early.forget("uid-1");
    tokio::task::yield_now().await;
    assert_eq!(alive.now(), 0, "the issuance stopped where it was");
    assert!(answer.is_closed(), "nobody waits for its answer any more");
    assert_eq!(
        taking.await.expect("task"),
        None,
        "the publish issues itself"
    );
    assert_eq!(outcome(&outcomes, "cancelled"), 1);
    assert_eq!(outcome(&outcomes, "dropped"), 0);
    assert!(early.is_empty());
}

/// The flood a tenant can make: pods bound to this node and deleted at once. Every issuance
/// waits for a warm-up slot first; the forgotten ones leave the queue, and those under way
/// stop, so no task outlives its pod and at most the warm-up limit ever issue.
#[tokio::test]
async fn a_flood_of_pods_deleted_at_once_costs_at_most_the_warmup_limit() {
    use crate::manager::queue::{Limits, Priority, Queue, QueueMetrics};
    let (early, outcomes) = store();
    let queue = Queue::new(Limits::new(8, 2, 2).unwrap(), QueueMetrics::default());
    let alive = Alive::default();
    let issuing = Alive::default();
    let mut most_issuing = 0;
    for i in 0..500 {
        let (queue, alive, at_zts) = (Arc::clone(&queue), alive.clone(), issuing.clone());
        let started = Started::default();
        let marks = started.clone();
        early.begin(format!("uid-{i}"), names("web-0"), started, async move {
            let _alive = alive.enter();
            let _slot = queue.slot(Priority::Warmup).await;
            marks.mark();
            let _issuing = at_zts.enter();
            std::future::pending::<Option<String>>().await
        });
        tokio::task::yield_now().await;
        most_issuing = most_issuing.max(issuing.now());
        // the API's delete events come in batches: half the pods go at once, the rest later
        if i % 2 == 1 {
            early.forget(&format!("uid-{i}"));
        }
    }
    tokio::task::yield_now().await; // an aborted task is dropped at its next turn
    assert_eq!((issuing.now(), queue.queued()), (2, [0, 248, 0]));
    for i in (0..500).step_by(2) {
        early.forget(&format!("uid-{i}"));
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(most_issuing <= 2, "{most_issuing} issuing at once");
    assert_eq!(
        (alive.now(), issuing.now()),
        (0, 0),
        "no task outlives its pod"
    );
    assert_eq!(queue.in_flight(), [0, 0, 0]);
    assert_eq!(queue.queued(), [0, 0, 0]);
    assert_eq!(outcome(&outcomes, "cancelled"), 500);
    assert!(early.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_identity_no_publish_takes_is_dropped_after_the_hold() {
    let (early, outcomes) = store();
    early.begin("uid-1".into(), names("web-0"), Started::already(), async {
        Some("identity".to_owned())
    });
    tokio::time::sleep(HOLD - Duration::from_secs(1)).await;
    assert_eq!(early.len(), 1, "held until the hold is over");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(early.is_empty());
    assert_eq!(outcome(&outcomes, "expired"), 1);
    assert_eq!(early.take("uid-1", &names("web-0")).await, None);
}

#[tokio::test]
async fn one_issuance_per_pod_and_a_bounded_number_at_once() {
    let (early, _) = store();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = |runs: &Arc<std::sync::atomic::AtomicUsize>| {
        let runs = Arc::clone(runs);
        async move {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<Option<String>>().await
        }
    };
    early.begin(
        "uid-1".into(),
        names("web-0"),
        Started::already(),
        counted(&runs),
    );
    early.begin(
        "uid-1".into(),
        names("web-0"),
        Started::already(),
        counted(&runs),
    );
    for i in 2..MAX_HELD + 10 {
        early.begin(
            format!("uid-{i}"),
            names("web-0"),
            Started::already(),
            counted(&runs),
        );
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(early.len(), MAX_HELD);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), MAX_HELD);
}

fn bound(uid: &str, node: &str, files: bool, terminating: bool) -> BoundPod {
    let volumes = if files {
        json!([{"name": "id", "csi": {"driver": "csi.athenz.io"}}])
    } else {
        json!([{"name": "id", "emptyDir": {}}])
    };
    let mut pod = json!({
        "metadata": {"namespace": "payments", "name": format!("web-{uid}"), "uid": uid},
        "spec": {"nodeName": node, "serviceAccountName": "web", "volumes": volumes},
    });
    if terminating {
        pod["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z");
    }
    serde_json::from_value(pod).expect("pod")
}

fn issued(steps: &[Step]) -> Vec<&str> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Issue(pod) => pod.uid(),
            Step::Forget(_) => None,
        })
        .collect()
}

fn forgotten(steps: &[Step]) -> Vec<&str> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Forget(uid) => Some(uid.as_str()),
            Step::Issue(_) => None,
        })
        .collect()
}

#[test]
fn only_a_pod_bound_while_the_agent_watches_is_issued_for() {
    let mut seen = Seen::default();
    assert!(seen.on_event("node-a", Event::Init).is_empty());
    // pending when the watch started: its volume may be published already
    assert!(
        seen.on_event(
            "node-a",
            Event::InitApply(bound("listed", "node-a", true, false))
        )
        .is_empty()
    );
    assert!(seen.on_event("node-a", Event::InitDone).is_empty());
    let listed_again = seen.on_event(
        "node-a",
        Event::Apply(bound("listed", "node-a", true, false)),
    );
    assert!(issued(&listed_again).is_empty());
    let new = seen.on_event("node-a", Event::Apply(bound("new", "node-a", true, false)));
    assert_eq!(issued(&new), ["new"]);
    // its next status change is not a second binding
    let again = seen.on_event("node-a", Event::Apply(bound("new", "node-a", true, false)));
    assert!(again.is_empty());
    for (uid, node, files) in [("plain", "node-a", false), ("elsewhere", "node-b", true)] {
        let steps = seen.on_event("node-a", Event::Apply(bound(uid, node, files, false)));
        assert!(steps.is_empty(), "{uid} on {node}");
    }
}

#[test]
fn a_pod_going_or_gone_is_forgotten() {
    let mut seen = Seen::default();
    seen.on_event("node-a", Event::Init);
    seen.on_event("node-a", Event::InitDone);
    seen.on_event("node-a", Event::Apply(bound("p1", "node-a", true, false)));
    let deleting = seen.on_event("node-a", Event::Apply(bound("p1", "node-a", true, true)));
    assert_eq!(forgotten(&deleting), ["p1"]);
    // a pod first seen terminating is never issued for
    let born_deleting = seen.on_event("node-a", Event::Apply(bound("p2", "node-a", true, true)));
    assert_eq!(forgotten(&born_deleting), ["p2"]);
    assert!(issued(&born_deleting).is_empty());
    let deleted = seen.on_event("node-a", Event::Delete(bound("p1", "node-a", true, false)));
    assert_eq!(forgotten(&deleted), ["p1"]);
    // a pod that left while the watch was away goes at the relist
    seen.on_event("node-a", Event::Apply(bound("p3", "node-a", true, false)));
    seen.on_event("node-a", Event::Init);
    seen.on_event(
        "node-a",
        Event::InitApply(bound("p2", "node-a", true, true)),
    );
    let relisted = seen.on_event("node-a", Event::InitDone);
    assert_eq!(forgotten(&relisted), ["p3"]);
}

#[test]
fn the_watch_asks_only_for_this_nodes_pending_pods() {
    assert_eq!(
        field_selector("node-a"),
        "spec.nodeName=node-a,status.phase=Pending"
    );
}

/// A publish does not wait behind other pods' warm-up work: an issuance still waiting for its
/// slot is ended (counted `overtaken`) and the publish registers itself in real time; one under
/// way is waited for.
#[tokio::test]
async fn a_publish_overtakes_an_issuance_still_waiting_for_its_turn() {
    use crate::manager::queue::{Limits, Priority, Queue, QueueMetrics};
    let (early, outcomes) = store();
    let queue = Queue::new(Limits::new(8, 1, 1).unwrap(), QueueMetrics::default());
    let alive = Alive::default();
    for uid in ["uid-0", "uid-1"] {
        let (queue, alive) = (Arc::clone(&queue), alive.clone());
        let started = Started::default();
        let marks = started.clone();
        early.begin(uid.into(), names("web-0"), started, async move {
            let _alive = alive.enter();
            let _slot = queue.slot(Priority::Warmup).await;
            marks.mark();
            std::future::pending::<Option<String>>().await
        });
    }
    tokio::task::yield_now().await;
    assert_eq!(
        queue.in_flight(),
        [0, 1, 0],
        "uid-0 under way, uid-1 waiting"
    );
    // uid-1's publish: not waited for
    assert_eq!(early.take("uid-1", &names("web-0")).await, None);
    tokio::task::yield_now().await;
    assert_eq!(outcome(&outcomes, "overtaken"), 1);
    assert_eq!((alive.now(), queue.queued()), (1, [0, 0, 0]));
    // uid-0's publish waits for the issuance under way
    let taking = {
        let early = Arc::clone(&early);
        tokio::spawn(async move { early.take("uid-0", &names("web-0")).await })
    };
    tokio::task::yield_now().await;
    assert!(!taking.is_finished());
    taking.abort();
}
