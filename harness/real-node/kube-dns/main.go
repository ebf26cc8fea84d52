// Command coredns is the test node's cluster DNS: CoreDNS from its published module, built with
// only the plugins the node's Corefile uses (harness/devstack/src/cluster/dns.rs: errors, health, ready,
// kubernetes, cache), as CoreDNS documents for custom builds. Its own main with
// coredns/coremain, instead of the module's root package with all ~60 plugins, leaves out the
// cloud DNS backends (Route 53, Azure, Cloud DNS), etcd, dnstap and the rest: a cold build on 2
// cores takes minutes less (docs/development.md, "A real node").
package main

import (
	"github.com/coredns/coredns/coremain"

	// The Corefile's plugins; each registers its directive in its init. A directive the
	// Corefile names without its import here fails `coredns` at start with its name.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
