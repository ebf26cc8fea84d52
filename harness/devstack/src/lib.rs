//! `athenz-devstack`: the whole athenz-k8s-identity system on one machine (docs/design.md §5).
//!
//! - `demo`: three pods in two namespaces get identities through every real component; one is
//!   refreshed, one deleted and refused; everything is unmounted and stopped.
//! - `up --state-dir DIR`: the same stack until Ctrl-C, described in `DIR/stack.json`.
//! - `bench --pods N --concurrency C|--arrival T --pod-size real|minimal --key p256|rsa2048
//!   --volume flex,csi-socket,csi-files`: the full path for N pods, measured, per volume kind.
//! - `zts --state-dir DIR`: the development ZTS alone.
//! - `cluster up|demo|bench|down --state-dir DIR`: a real single-node Kubernetes cluster from
//!   Kubernetes' own modules with our release installed as an operator installs it
//!   (docs/design.md §5.1).
//!
//! Every component runs as its own process: this binary executed under the component's name.
//!
//! The modules are a library so the end-to-end tests in `tests/tests/` drive the stack the same
//! way (create pods, mount through the real driver, run the real SIA, check the files).

// A command-line tool: printing reports is its job (the workspace forbids it in the components).
#![allow(clippy::print_stdout, clippy::print_stderr)]
// A test harness's binary and the library its own tests share, not an API for others: an item has
// a doc where it says something (why, a unit, a format), not one that repeats its name.
#![allow(missing_docs)]

pub mod agent_upstreams;
pub mod bench;
pub mod chaos;
pub mod cluster;
pub mod crossnode;
pub mod demo;
pub mod fleet;
pub mod forwarder;
pub mod handshake;
pub mod identity;
pub mod initializer_template;
pub mod json_file;
pub mod kube;
pub mod load;
pub mod multicall;
pub mod node;
pub mod pod_dirs;
pub mod pod_volume;
pub mod pods;
pub mod procs;
pub mod scrape;
pub mod soak;
pub mod stack;
pub mod stack_json;
pub mod userns;
