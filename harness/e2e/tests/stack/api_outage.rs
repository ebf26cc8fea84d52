//! The Kubernetes API down while pods start, through the real binaries (`athenz-devstack up
//! --fault-injection`: the API stand-in closes its port while the faults file says so).
//!
//! Real ZTS passes a provider's 504 on as 504 and turns any other refusal into a final 403
//! (Athenz `ZTSImpl.validateConfirmationData`). So the callback must answer 504 when it cannot
//! reach the API, the agent must turn ZTS's 504 into its 503 "try again", and `athenz-sia init`
//! must wait; while a real "no" from the callback (a pod the API says is gone) must end the init
//! at once with the check named.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_devstack::identity;
use athenz_devstack::node;
use athenz_testbed::faults::Faults;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::Devstack;

const PODS: usize = 30;
const OUTAGE: Duration = Duration::from_secs(20);

fn set_faults(stack: &Devstack, faults: &Faults) {
    faults
        .write(&stack.dir.path().join("state/faults.json"))
        .unwrap();
    // the stand-ins look at the file every 100 ms
    std::thread::sleep(athenz_testbed::faults::POLL * 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_starting_while_the_kubernetes_api_is_down_get_their_identity_when_it_returns() {
    let stack = Arc::new(Devstack::start_with(&["--fault-injection"]));
    // the pods exist and their volumes are mounted before the API goes away
    let mut mounts = tokio::task::JoinSet::new();
    for n in 0..PODS {
        let stack = stack.clone();
        mounts.spawn(async move {
            stack
                .pod(
                    "media-sports",
                    &format!("outage-{n}"),
                    &format!("10.7.0.{}", n + 1),
                )
                .await
        });
    }
    let mut volumes = Vec::new();
    while let Some(volume) = mounts.join_next().await {
        volumes.push(volume.unwrap());
    }

    set_faults(
        &stack,
        &Faults {
            api_unreachable: true,
            ..Faults::default()
        },
    );
    let down_since = Instant::now();
    let mut inits = tokio::task::JoinSet::new();
    for volume in volumes.clone() {
        let stack = stack.clone();
        inits.spawn(async move {
            let result = node::sia_init(&stack.info, &volume).await;
            (volume, result, Instant::now())
        });
    }
    // no init container ends during the outage: neither with an identity nor with an error
    tokio::time::sleep(OUTAGE.saturating_sub(down_since.elapsed())).await;
    assert!(
        inits.try_join_next().is_none(),
        "an init ended while the Kubernetes API was down"
    );
    set_faults(&stack, &Faults::default());
    let back = Instant::now();

    let mut serials = std::collections::BTreeSet::new();
    while let Some(done) = inits.join_next().await {
        let (volume, result, ended) = done.unwrap();
        result.unwrap_or_else(|e| panic!("{}: {e:#}", volume.pod.name));
        assert!(ended >= back - athenz_testbed::faults::POLL * 5);
        let issued = identity::check(&volume.credentials_dir).unwrap();
        serials.insert(issued.serial);
    }
    assert_eq!(serials.len(), PODS, "every pod has its own certificate");
    let metrics = reqwest::get(&stack.info.agent.metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("status=\"503\"") && l.contains("route=\"init\"")),
        "the agent answered 503 (try again) during the outage: {metrics}"
    );

    // A "no" stays final: the API says the pod is gone, the callback denies by name, ZTS
    // answers 403, and the init ends at once, non-zero, naming the check.
    let gone = stack.pod("media-sports", "outage-gone", "10.7.1.1").await;
    set_faults(
        &stack,
        &Faults {
            api_pods_missing: true,
            ..Faults::default()
        },
    );
    let err = node::sia_init(&stack.info, &gone).await.unwrap_err();
    let message = format!("{err:#}");
    // the SIA gave up on the agent's 403, not on its init timeout
    assert!(message.contains("agent refused (403)"), "{message}");
    assert!(message.contains("pod_exists"), "{message}");
    set_faults(&stack, &Faults::default());
    for volume in volumes.iter().chain([&gone]) {
        node::unmount(&stack.info, volume).await.unwrap();
    }
}
