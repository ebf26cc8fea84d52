//go:build kube_before_1_34

package main

// The same entry points as entry_current.go, with the signatures of Kubernetes before 1.34.

import (
	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func newKubeletCommand() *cobra.Command {
	return kubelet.NewKubeletCommand()
}

// applyKubectlVerbosity: kubectl's main before 1.34 applied -v itself while building.
func applyKubectlVerbosity() {}
