//! The agent's kubelet client against the kubelet stand-in: rotated bearer tokens, pods that
//! arrive one after another, concurrent misses, and pods that never come — counting the lists
//! the kubelet served.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::issuance::Registration;
use athenz_identity_agent::kubelet::{IpWait, ListRate, NodePod, PodCache};
use athenz_testbed::kube_api::{Cluster, KubeApi, running_pod};
use athenz_testbed::kubelet::Kubelet;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn uid(n: usize) -> String {
    format!("0b6e4c1e-8f57-4d5e-9a51-{n:012x}")
}

fn put(cluster: &Cluster, n: usize) {
    cluster.put_pod(running_pod(
        "media-sports",
        &format!("web-{n}"),
        &uid(n),
        "web",
        "10.1.2.3",
        "node-1",
    ));
}

async fn kubelet() -> (KubeApi, Kubelet) {
    let api = KubeApi::start().await.unwrap();
    let kubelet = Kubelet::start(api.cluster().clone(), "node-1")
        .await
        .unwrap();
    (api, kubelet)
}

fn cache(
    kubelet: &Kubelet,
    ttl: Duration,
    rate: ListRate,
    token: Option<std::path::PathBuf>,
) -> PodCache {
    PodCache::new(reqwest::Client::new(), &kubelet.url(), token, ttl, rate, 0)
}

/// Pod `web-<n>` (uid `uid(n)`), waiting up to 5 s.
async fn find_web(
    cache: &PodCache,
    n: usize,
) -> Result<Option<Arc<NodePod>>, athenz_identity_agent::kubelet::KubeletError> {
    cache
        .find(
            "media-sports",
            &format!("web-{n}"),
            &uid(n),
            Duration::from_secs(5),
            Registration::First,
            IpWait::DontWait,
        )
        .await
}

const GENEROUS: ListRate = ListRate {
    burst: 20,
    per_second: 50.0,
};

#[tokio::test]
async fn a_rotated_token_is_used_without_a_restart() {
    let (api, kubelet) = kubelet().await;
    put(api.cluster(), 1);
    kubelet.controls().require_token(Some("token-1"));
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-1\n").unwrap();
    let cache = cache(&kubelet, Duration::ZERO, GENEROUS, Some(token_file.clone()));
    let wait = Duration::from_millis(200);
    let found = cache
        .find(
            "media-sports",
            "web-1",
            &uid(1),
            wait,
            Registration::First,
            IpWait::DontWait,
        )
        .await
        .unwrap();
    assert_eq!(found.unwrap().uid, uid(1));

    // the kubelet rotates the token: the file changes, the next list presents the new one
    kubelet.controls().require_token(Some("token-2"));
    let err = cache
        .find(
            "media-sports",
            "web-1",
            &uid(1),
            wait,
            Registration::First,
            IpWait::DontWait,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("401"), "{err}");
    std::fs::write(&token_file, "token-2\n").unwrap();
    assert!(
        cache
            .find(
                "media-sports",
                "web-1",
                &uid(1),
                wait,
                Registration::First,
                IpWait::DontWait
            )
            .await
            .unwrap()
            .is_some()
    );

    // a token file that disappears is an error naming it, not an anonymous request
    std::fs::remove_file(&token_file).unwrap();
    let err = cache
        .find(
            "media-sports",
            "web-1",
            &uid(1),
            wait,
            Registration::First,
            IpWait::DontWait,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("token"), "{err}");
}

#[tokio::test]
async fn pods_arriving_one_after_another_each_get_a_new_list_at_once() {
    let (api, kubelet) = kubelet().await;
    // a long TTL: only misses make the cache list again
    let cache = cache(&kubelet, Duration::from_secs(60), GENEROUS, None);
    for n in 0..10 {
        put(api.cluster(), n);
        let found = find_web(&cache, n).await.unwrap();
        assert_eq!(found.unwrap().uid, uid(n));
    }
    // one list per arrival, none more (the old agent waited 25 ms between two forced lists)
    assert_eq!(kubelet.controls().requests(), 10);
    // a pod already listed is answered from the cache
    assert!(find_web(&cache, 3).await.unwrap().is_some());
    assert_eq!(kubelet.controls().requests(), 10);
}

#[tokio::test]
async fn concurrent_misses_share_lists() {
    let (api, kubelet) = kubelet().await;
    for n in 0..50 {
        put(api.cluster(), n);
    }
    kubelet.controls().set_delay(Duration::from_millis(20));
    let cache = Arc::new(cache(&kubelet, Duration::from_secs(60), GENEROUS, None));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..50 {
        let cache = cache.clone();
        tasks.spawn(async move { find_web(&cache, n).await });
    }
    while let Some(found) = tasks.join_next().await {
        assert!(found.unwrap().unwrap().is_some());
    }
    // the first list (made before any other caller) holds every pod; at most a second one for
    // callers that missed while it was being fetched
    assert!(
        kubelet.controls().requests() <= 2,
        "{}",
        kubelet.controls().requests()
    );
}

/// A refresh's pod (listed once, so `Registration::Again`) missing from a list made after the question
/// is answered as gone at once: one list, not the whole wait.
#[tokio::test]
async fn a_gone_pod_is_answered_by_the_first_newer_list() {
    let (_api, kubelet) = kubelet().await;
    let cache = cache(&kubelet, Duration::from_secs(60), GENEROUS, None);
    let found = cache
        .find(
            "media-sports",
            "deleted",
            &uid(0),
            Duration::from_secs(30),
            Registration::Again,
            IpWait::DontWait,
        )
        .await
        .unwrap();
    assert!(found.is_none());
    assert_eq!(kubelet.controls().requests(), 1);
}

#[tokio::test]
async fn a_pod_that_never_comes_costs_at_most_the_budget() {
    let (_api, kubelet) = kubelet().await;
    let rate = ListRate {
        burst: 3,
        per_second: 10.0,
    };
    let cache = cache(&kubelet, Duration::from_secs(60), rate, None);
    let started = Instant::now();
    let found = cache
        .find(
            "media-sports",
            "never",
            &uid(0),
            Duration::from_millis(500),
            Registration::First,
            IpWait::DontWait,
        )
        .await
        .unwrap();
    assert!(found.is_none());
    let elapsed = started.elapsed().as_secs_f64();
    // the burst, then at most the rate for the time waited
    let allowed = 3 + (elapsed * 10.0).ceil() as usize;
    let served = kubelet.controls().requests();
    assert!(
        served >= 3 && served <= allowed,
        "{served} lists in {elapsed:.3} s"
    );
}

#[tokio::test]
async fn a_pod_the_kubelet_lists_late_is_found_within_the_wait() {
    let (api, kubelet) = kubelet().await;
    put(api.cluster(), 7);
    kubelet.controls().hide("media-sports", "web-7");
    let cache = Arc::new(cache(&kubelet, Duration::from_secs(60), GENEROUS, None));
    let finder = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .find(
                    "media-sports",
                    "web-7",
                    &uid(7),
                    Duration::from_secs(5),
                    Registration::First,
                    IpWait::DontWait,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    kubelet.controls().show("media-sports", "web-7");
    let found = finder.await.unwrap().unwrap();
    assert_eq!(found.unwrap().uid, uid(7));
}

/// A cached entry without an IP answers a caller that takes none (CSI files mode: kubelet
/// mounts before the sandbox exists), with no new list; a caller that needs the IP, or whose
/// pod the entry is not (the name was reused), gets a list made after its call.
#[tokio::test]
async fn a_cached_entry_is_checked_against_a_new_list_only_when_it_cannot_answer() {
    let (api, kubelet) = kubelet().await;
    let cluster = api.cluster();
    // listed before its sandbox had an IP
    cluster.put_pod(running_pod(
        "media-sports",
        "web-1",
        &uid(1),
        "web",
        "",
        "node-1",
    ));
    // listed, then deleted and recreated under the same name
    put(cluster, 2);
    let cache = cache(&kubelet, Duration::from_secs(60), GENEROUS, None);
    let wait = Duration::from_secs(5);
    let find = |name: &'static str, n: usize, ip_wait: IpWait| {
        let cache = &cache;
        async move {
            cache
                .find(
                    "media-sports",
                    name,
                    &uid(n),
                    wait,
                    Registration::First,
                    ip_wait,
                )
                .await
                .unwrap()
                .unwrap()
        }
    };
    let early = find("web-1", 1, IpWait::DontWait).await;
    assert_eq!(
        early.ip, None,
        "a list newer than the call is answered as it is"
    );
    put(cluster, 1);
    cluster.put_pod(running_pod(
        "media-sports",
        "web-2",
        &uid(22),
        "web",
        "10.1.2.4",
        "node-1",
    ));
    let served = kubelet.controls().requests();

    let cached = find("web-1", 1, IpWait::DontWait).await;
    assert_eq!(cached.ip, None, "the cached entry, as it was listed");
    assert_eq!(
        kubelet.controls().requests(),
        served,
        "a caller that takes no IP made the kubelet list again"
    );
    let now = find("web-1", 1, IpWait::Wait).await;
    assert_eq!(now.ip.as_deref(), Some("10.1.2.3"));
    assert_eq!(kubelet.controls().requests(), served + 1);
    let replaced = find("web-2", 2, IpWait::DontWait).await;
    assert_eq!(
        replaced.uid,
        uid(22),
        "the new pod, for the caller to refuse"
    );
    assert_eq!(kubelet.controls().requests(), served + 2);
}

/// On a real kubelet a pod's init container runs before the kubelet lists the IP its sandbox
/// has: a caller that needs the IP waits for a list that shows it (within its wait) instead of
/// taking the IP-less entry; one that does not takes the entry as it is.
#[tokio::test]
async fn a_pod_listed_before_its_ip_is_waited_for_by_a_caller_that_needs_the_ip() {
    let (api, kubelet) = kubelet().await;
    put(api.cluster(), 1);
    assert!(api.cluster().update_pod("media-sports", "web-1", |pod| {
        pod.status.as_mut().unwrap().pod_ip = None;
        pod.status.as_mut().unwrap().pod_ips = None;
    }));
    let cache = cache(&kubelet, Duration::ZERO, GENEROUS, None);
    let wait = Duration::from_secs(5);
    let as_listed = cache
        .find(
            "media-sports",
            "web-1",
            &uid(1),
            wait,
            Registration::First,
            IpWait::DontWait,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(as_listed.ip, None);

    let cluster = api.cluster().clone();
    let ip_later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.update_pod("media-sports", "web-1", |pod| {
            pod.status.as_mut().unwrap().pod_ip = Some("10.1.2.3".into());
        })
    });
    let started = Instant::now();
    let found = cache
        .find(
            "media-sports",
            "web-1",
            &uid(1),
            wait,
            Registration::First,
            IpWait::Wait,
        )
        .await
        .unwrap()
        .unwrap();
    assert!(ip_later.await.unwrap());
    // the list that answered shows the IP: the wait ended on it, not at the deadline
    assert_eq!(found.ip.as_deref(), Some("10.1.2.3"));
    // lists 50 ms apart, not at the budget's 50 a second (plus the first two of each call)
    let lists = kubelet.controls().requests() as u128;
    let most = started.elapsed().as_millis() / 50 + 3;
    assert!(lists <= most, "{lists} lists in {:?}", started.elapsed());

    // an IP that never comes: the entry as last listed at the deadline, not "not on this node"
    assert!(api.cluster().update_pod("media-sports", "web-1", |pod| {
        pod.status.as_mut().unwrap().pod_ip = None;
    }));
    let short = Duration::from_millis(300);
    let last = cache
        .find(
            "media-sports",
            "web-1",
            &uid(1),
            short,
            Registration::First,
            IpWait::Wait,
        )
        .await
        .unwrap();
    assert_eq!(last.unwrap().ip, None);
}
