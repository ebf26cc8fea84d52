//go:build !kube_before_1_34

package main

// Entry points whose signatures changed in Kubernetes 1.34: this file builds 1.34 and later
// (build.sh passes -tags kube_before_1_34 for older releases, which build entry_before_1_34.go).

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func newKubeletCommand() *cobra.Command {
	return kubelet.NewKubeletCommand(context.Background())
}

// applyKubectlVerbosity applies -v before kubectl's command is built, as its main does.
func applyKubectlVerbosity() {
	_, _ = logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args))
}
