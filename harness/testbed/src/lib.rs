//! `athenz-testbed`: faithful stand-ins for what cannot run on a development machine (Athenz ZTS,
//! the Kubernetes API, the kubelet) and the test PKI, shared by every crate's tests and by the
//! local stack. End-to-end scenarios live in `tests/tests/`.
//!
//! | module | what |
//! |---|---|
//! | [`athenz_clients`] | Athenz's own Java and Go clients as test peers (`harness/peers/athenz/java`, `harness/peers/athenz/go`) |
//! | [`csi_kubelet`] | a CSI caller making kubelet's calls, in kubelet's order, with kubelet's arguments |
//! | [`cgroups`] | kubelet-shaped pod cgroups for processes that play pods (the agent's peer check) |
//! | [`runtime`] | pods as runc or crun make them: a sandbox and OCI-bundle containers in kubelet's cgroup layout |
//! | [`dns`] | a DNS stand-in answering A/AAAA from a table |
//! | [`faults`] | faults a chaos run injects into the stand-ins, through a file they follow |
//! | [`fixtures`] | the sample pod every test talks about |
//! | [`pki`] | root and intermediate CAs; service certificates for generated keys or CSRs |
//! | [`kube_api`] | the Kubernetes API stand-in |
//! | [`kubelet`] | the kubelet stand-in (`GET /pods`) |
//! | [`zts`] | the development ZTS |
//! | [`provider_stub`] | a scripted instance provider that records what ZTS sent it |
//! | [`real_pods`] | pods the size real kubelets list (specs, statuses, managed fields) |
//! | [`process`] | SIGTERM and a bounded wait for real processes |
//! | [`stats`] | latency percentiles for benchmarks |
//! | [`openssl`] | cross-checks with the real `openssl` command-line tool |
//! | [`real_zts`] | Athenz's own ZTS, built from its source, as a process (docs/real-zts.md) |

pub mod athenz_clients;
pub mod bins;
pub mod cgroups;
pub mod csi_kubelet;
pub mod dns;
pub mod faults;
pub mod fixtures;
pub mod grpc;
pub mod junit;
pub mod kube_api;
pub mod kubelet;
pub mod load;
pub mod openssl;
pub mod pki;
pub mod process;
pub mod provider_stub;
pub mod pyjwt;
pub mod real_pods;
pub mod real_zts;
pub mod runtime;
pub mod sds_client;
pub mod stats;
pub mod zts;
