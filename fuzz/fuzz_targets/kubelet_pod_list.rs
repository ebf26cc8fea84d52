//! The agent's reading of the kubelet's `GET /pods` (a `PodList`): only the fields it uses, with
//! a bound on the number of pods.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = athenz_identity_agent::kubelet::parse_pod_list(data);
});
