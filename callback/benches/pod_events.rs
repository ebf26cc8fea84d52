//! `cargo bench -p athenz-callback --bench pod_events`: the CPU one watch event costs the pod
//! cache, a real-size pod parsed as the cache does ([`WatchedPod`]: the checked fields only)
//! against a full `k8s_openapi` Pod, which is what a generic watcher builds for every event.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use athenz_callback::pod_cache::WatchedPod;
use athenz_testbed::real_pods::{RealPod, real_pod, real_status};
use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use std::hint::black_box;

fn event_json() -> Vec<u8> {
    let mut pod = real_pod(&RealPod {
        namespace: "payments",
        name: "web-7d9f8b6c5-x2x4q",
        service_account: "web",
        node: "node-a",
    })
    .unwrap();
    pod.metadata.uid = Some("0e5a7c1d-3a4b-4c5d-8e9f-0123456789ab".into());
    pod.metadata.resource_version = Some("4711".into());
    pod.status = Some(serde_json::from_value(real_status("10.1.2.3", "192.0.2.10")).unwrap());
    serde_json::to_vec(&pod).unwrap()
}

fn parse(c: &mut Criterion) {
    let json = event_json();
    let mut group = c.benchmark_group(format!("pod watch event ({} bytes)", json.len()));
    group.bench_function("WatchedPod (the cache)", |b| {
        b.iter(|| serde_json::from_slice::<WatchedPod>(black_box(&json)).unwrap());
    });
    group.bench_function("k8s_openapi Pod", |b| {
        b.iter(|| serde_json::from_slice::<Pod>(black_box(&json)).unwrap());
    });
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
