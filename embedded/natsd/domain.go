package natsd

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// JetStream domains on a NATS network.
//
// nats-server keeps the JetStream of two systems joined by a leafnode apart by itself when
// both sides run JetStream: each denies the unprefixed API ($JS.API.>, and the key-value
// and object-store subjects $KV.> and $OBJ.>) on the link, and maps its own domain's
// prefixed API, $JS.<domain>.API.>, onto $JS.API.> in the account, so that a request
// reaches another system only through that system's domain prefix. The embedded server
// runs without JetStream and lets $JS.API.> through to the bridge's leafnode link (the
// account's empty default domain), which switches that logic off for every leafnode of
// the account, the remotes to other systems too: their JetStream would hear jetgres's
// clients' requests, and a hub drops the link when it sees jetgres's interest in a
// literal $JS.API subject. applyDomain puts the same walls back with configuration alone:
// deny_imports and deny_exports on every leafnode remote, and the domain's mappings.
//
// Gateways take no permissions, and nats-server treats the clusters of a super-cluster
// as one JetStream domain: across a gateway nothing could keep the two apart, so a
// configuration with one is refused.

// jsDomainReserved are the tokens after $JS. that JetStream itself uses: a domain may not
// be one of them, or its API would collide with acks, flow control, snapshots or events.
var jsDomainReserved = []string{"ACK", "FC", "SNAPSHOT", "EVENT"}

// localSubjects never cross a leafnode remote, either way: the JetStream API and the
// key-value and object-store subjects, as nats-server denies them between domains, and
// the subjects jetgres replicas use among themselves.
var localSubjects = []string{"$JS.API.>", "$KV.>", "$OBJ.>", "$JETGRES.>"}

// checkDomain refuses a domain that nats-server would refuse, saying why.
func checkDomain(domain string) error {
	switch {
	case domain == "":
		return nil
	case strings.ContainsAny(domain, " \t\r\n\f.*>"):
		return fmt.Errorf("natsd: JetStream domain %q: may not contain whitespace, '.', '*' or '>'", domain)
	case slices.Contains(jsDomainReserved, domain):
		return fmt.Errorf("natsd: JetStream domain %q is reserved by JetStream (%s)", domain, strings.Join(jsDomainReserved, ", "))
	}
	return nil
}

// checkGateways refuses gateways: see the note on JetStream domains above.
func checkGateways(o *server.Options) error {
	if o.Gateway.Name != "" || o.Gateway.Port != 0 || len(o.Gateway.Gateways) > 0 {
		return errors.New("gateways are not supported: a gateway would carry jetgres's JetStream API to the other cluster's JetStream; join other NATS systems with a leafnode remote")
	}
	return nil
}

// domainMappings are the mappings that make the domain's prefixed API reach the bridge,
// source to destination. The key-value and object-store subjects keep their own roots, so
// they take a token of their own after the prefix.
func domainMappings(domain string) map[string]string {
	pfx := "$JS." + domain + ".API."
	m := map[string]string{pfx + "INFO": "$JS.API.INFO"}
	for _, api := range []string{"STREAM", "CONSUMER", "DIRECT", "META", "SERVER", "ACCOUNT"} {
		m[pfx+api+".>"] = "$JS.API." + api + ".>"
	}
	for _, root := range []string{"$KV", "$OBJ"} {
		m[pfx+root+".>"] = root + ".>"
	}
	return m
}

// applyDomain walls jetgres's JetStream off from other systems' on every leafnode remote
// and, with a domain, makes it reachable through the domain's prefix.
func applyDomain(opts *server.Options, l *slog.Logger) error {
	domain := opts.JetStreamDomain
	if err := checkDomain(domain); err != nil {
		return err
	}
	for _, r := range opts.LeafNode.Remotes {
		r.DenyImports = appendMissing(r.DenyImports, localSubjects...)
		r.DenyExports = appendMissing(r.DenyExports, localSubjects...)
		if domain != "" {
			// Requests for this domain are answered here, never by a namesake elsewhere.
			r.DenyExports = appendMissing(r.DenyExports, "$JS."+domain+".API.>")
		}
	}
	if domain == "" {
		return nil
	}
	acc := globalAccountOptions(opts)
	for src, dest := range domainMappings(domain) {
		if err := acc.AddMapping(src, dest); err != nil {
			return fmt.Errorf("natsd: JetStream domain %q: map %s to %s: %w", domain, src, dest, err)
		}
	}
	l.Info("JetStream domain", "domain", domain, "api", "$JS."+domain+".API", "leafnode_remotes", len(opts.LeafNode.Remotes))
	return nil
}

// globalAccountOptions is the global account of the options, where a configuration's
// top-level mappings already are, added if there is none yet.
func globalAccountOptions(opts *server.Options) *server.Account {
	for _, a := range opts.Accounts {
		if a.Name == globalAccount {
			return a
		}
	}
	a := server.NewAccount(globalAccount)
	opts.Accounts = append(opts.Accounts, a)
	return a
}

func appendMissing(list []string, subjects ...string) []string {
	for _, s := range subjects {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}
