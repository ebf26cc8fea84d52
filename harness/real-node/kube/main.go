// Command kube is a multicall binary holding the Kubernetes node and control
// plane components, built from Kubernetes' own published Go modules so that
// tests can run a real node without images, a registry or a source checkout.
//
// The component is chosen by the name the binary is started under (a symlink
// or hard link named kubelet, kube-apiserver, ...) or, when started as kube,
// by the first argument:
//
//	kube kubelet --config=/etc/kubelet.yaml
//	ln -s kube kubectl && ./kubectl version --client
//
// Every component runs as its own process, as the upstream binaries do: the
// components register global state (feature gates, metrics, flags) that must
// not be shared, so this binary only dispatches and never starts two of them.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// self is the name under which the binary dispatches on its first argument.
const self = "kube"

func main() {
	name := filepath.Base(os.Args[0])
	if name == self {
		if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
			usage()
			os.Exit(2)
		}
		// Drop our own name so the component sees the argv it would have
		// seen as its own binary: cobra, kubectl's plugin lookup and
		// kubectl's early -v parsing all read os.Args.
		os.Args = os.Args[1:]
		name = os.Args[0]
	}
	run, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown component %q\n", self, name)
		usage()
		os.Exit(2)
	}
	os.Exit(run())
}

func usage() {
	names := make([]string, 0, len(components))
	for n := range components {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: %s COMPONENT [ARGS...], or run it under a component's name\ncomponents: %s\n",
		self, strings.Join(names, ", "))
}
