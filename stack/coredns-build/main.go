// Command coredns is CoreDNS with only the plugins the local stack's cluster DNS uses (eos_stack/node_dns.py):
// CoreDNS's own main links every plugin of its plugin.cfg (route53, azure, clouddns and their cloud SDKs,
// etcd, dnstap, ...), which would add minutes to a cold build for code the stack never runs.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins, each registering itself with Caddy; their order of execution is Directives below.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

// Directives is the plugins' execution order, a subsequence of CoreDNS's plugin.cfg (core/dnsserver/zdirectives.go):
// a request passes through them in this order whatever the order in the Corefile.
var Directives = []string{"bind", "ready", "health", "errors", "log", "cache", "template", "kubernetes"}

func main() {
	if err := dnsserver.SetDirectives(Directives); err != nil {
		log.Fatal(err)
	}
	coremain.Run()
}
