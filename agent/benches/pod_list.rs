//! `cargo bench -p athenz-identity-agent`: what one kubelet pod list costs the agent.
//!
//! A node with 110 real-size pods (testbed `real_pods`: 8–15 KB each, managed fields included)
//! lists about 1.3 MB. Every pod the agent has not seen yet makes it list once, so during a
//! rollout this is paid per arriving pod. Compared with parsing the same list into
//! k8s-openapi's `PodList` (what a generic client would do).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use athenz_identity_agent::kubelet::parse_pod_list;
use athenz_testbed::real_pods::{RealPod, real_pod, real_status};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn pod_list_json(pods: usize) -> Vec<u8> {
    let items: Vec<serde_json::Value> = (0..pods)
        .map(|n| {
            let mut pod = real_pod(&RealPod {
                namespace: "payments",
                name: &format!("web-7d9f8b6c5-{n:05}"),
                service_account: "web",
                node: "node-a",
            })
            .unwrap();
            pod.metadata.uid = Some(format!("0e5a7c1d-3a4b-4c5d-8e9f-{n:012}"));
            pod.status = Some(
                serde_json::from_value(real_status(
                    &format!("10.1.{}.{}", n / 250, n % 250 + 1),
                    "192.0.2.10",
                ))
                .unwrap(),
            );
            serde_json::to_value(pod).unwrap()
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items
    }))
    .unwrap()
}

fn pod_list(c: &mut Criterion) {
    let mut g = c.benchmark_group("kubelet_pod_list");
    for pods in [10, 110] {
        let json = pod_list_json(pods);
        g.throughput(Throughput::Bytes(json.len() as u64));
        g.bench_function(
            format!("agent_index_{pods}_pods_{}kb", json.len() / 1024),
            |b| b.iter(|| parse_pod_list(black_box(&json)).unwrap()),
        );
        g.bench_function(format!("k8s_openapi_podlist_{pods}_pods"), |b| {
            b.iter(|| {
                serde_json::from_slice::<k8s_openapi::List<k8s_openapi::api::core::v1::Pod>>(
                    black_box(&json),
                )
                .unwrap()
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = pod_list
}
criterion_main!(benches);
