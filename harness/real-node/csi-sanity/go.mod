// csi-sanity, the CSI community's conformance suite for a driver's gRPC services
// (github.com/kubernetes-csi/csi-test), built from its published module: harness/e2e/tests/stack/csi_sanity.rs
// runs it against the agent's CSI socket. A module of its own so its gRPC and protobuf versions
// never constrain the node's (harness/real-node/kube). Built by harness/real-node/kube/build.sh; move it with
//   go get -tool github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@vX

module github.com/athenz-k8s-identity/tests/csi-sanity

go 1.26

tool github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity

require (
	github.com/container-storage-interface/spec v1.13.0
	google.golang.org/grpc v1.83.1
)

require (
	github.com/Masterminds/semver/v3 v3.4.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-task/slim-sprig/v3 v3.0.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/pprof v0.0.0-20260402051712-545e8a4df936 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kubernetes-csi/csi-test/v5 v5.6.0 // indirect
	github.com/onsi/ginkgo/v2 v2.32.1 // indirect
	github.com/onsi/gomega v1.42.1 // indirect
	go.uber.org/mock v0.6.0 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	golang.org/x/mod v0.36.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
	golang.org/x/text v0.38.0 // indirect
	golang.org/x/tools v0.45.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
