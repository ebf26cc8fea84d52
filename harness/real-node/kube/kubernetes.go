package main

import (

	// Time zone data for CronJob's spec.timeZone (the apiserver validates
	// it, the controller-manager schedules with it); a minimal host or
	// container may have no /usr/share/zoneinfo.
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	// The same side-effect registrations each upstream main performs:
	// --logging-format=json, client-go's request metrics and the
	// kubernetes_build_info metric.
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"

	// kubectl's exec/OIDC credential plugins, as in the upstream kubectl.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

// components maps a component name to its entry point; each returns the
// process exit code. The cobra command constructors are the ones the
// upstream binaries use, so flags, config files and --version behave the same.
var components = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":        func() int { return cli.Run(newKubeletCommand()) },
	"kube-proxy":     func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubectl":        runKubectl,
	"etcd":           runEtcd,
}

// runKubectl mirrors the upstream kubectl main: -v is applied before the
// command is built (plugin lookup and .kuberc loading already log), and
// errors are printed kubectl's way rather than by cobra.
func runKubectl() int {
	applyKubectlVerbosity()
	if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err) // exits
	}
	return 0
}
