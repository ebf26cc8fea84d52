// Command probe is the app container of the bench's pods of ours (`athenz-devstack cluster
// bench`), and of its pods with no identity. With no argument it starts as an app would and
// stamps at once. With `<dir> <SPIFFE ID> <pod IP or ->` it reads the credential files the pod's
// volume holds (`<dir>/service.cert.pem`, `<dir>/ca.cert.pem`) every millisecond and stamps:
//
//   - `ready <unix ns>` once the certificate verifies against the CA bundle beside it and names
//     the SPIFFE ID (as SPIRE's probe checks its SVID against its bundle and ID);
//   - `final <unix ns>` once such a certificate also names the pod's IP: the credential the pod
//     keeps, for a mode that issues before the pod has its IP and again after. With `-` the
//     certificate is to name no IP (files mode without `ipSAN`), and the first is final.
//
// Stamps use CLOCK_REALTIME, the clock the bench reads too. A file set is verified only when it
// changed since the last look, so the probe's own CPU stays small beside what it measures. Then it
// waits for SIGTERM.
package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// poll is the pause between two looks at the files.
const poll = time.Millisecond

// limit bounds the whole wait: the bench gives up on a pod after 120 s.
const limit = 150 * time.Second

// maxFile bounds what is read of a credential file.
const maxFile = 64 << 10

func main() {
	switch len(os.Args) {
	case 1:
		stamp("ready")
		stamp("final")
		waitForStop()
	case 4:
		os.Exit(watch(os.Args[1], os.Args[2], os.Args[3]))
	default:
		fmt.Fprintln(os.Stderr, "usage: probe [<credentials dir> <SPIFFE ID> <pod IP or ->]")
		os.Exit(2)
	}
}

// watch stamps `ready`, then `final`, as the files in dir come to hold them; 1 if the limit
// passes first.
func watch(dir, spiffeID, podIP string) int {
	var ip net.IP // nil: no IP to wait for
	if podIP != "-" {
		ip = net.ParseIP(podIP)
		if ip == nil {
			fmt.Fprintf(os.Stderr, "probe: the pod IP %q is not an address\n", podIP)
			return 2
		}
	}
	deadline := time.Now().Add(limit)
	var seen []byte
	ready := false
	last := errors.New("no certificate yet")
	for time.Now().Before(deadline) {
		set, err := readSet(dir)
		if err == nil && !bytes.Equal(set.both, seen) {
			seen = set.both
			hasIP, err := set.check(spiffeID, ip)
			if err == nil {
				if !ready {
					stamp("ready")
					ready = true
				}
				if hasIP || ip == nil {
					stamp("final")
					waitForStop()
				}
			}
			last = err
		}
		time.Sleep(poll)
	}
	fmt.Fprintln(os.Stderr, "probe: no final credential within", limit, "last error:", last)
	return 1
}

// fileSet is the certificate file and the CA bundle beside it, as read together.
type fileSet struct {
	cert, ca, both []byte
}

// readSet reads the pair (each at most maxFile bytes).
func readSet(dir string) (fileSet, error) {
	cert, err := readBounded(filepath.Join(dir, "service.cert.pem"))
	if err != nil {
		return fileSet{}, err
	}
	ca, err := readBounded(filepath.Join(dir, "ca.cert.pem"))
	if err != nil {
		return fileSet{}, err
	}
	return fileSet{cert: cert, ca: ca, both: slices.Concat(cert, []byte{0}, ca)}, nil
}

func readBounded(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) > maxFile {
		return nil, fmt.Errorf("%s: over %d bytes", path, maxFile)
	}
	return data, nil
}

// check verifies the leaf (with any intermediates after it) against the bundle and that it names
// spiffeID; says whether it also names ip.
func (s fileSet) check(spiffeID string, ip net.IP) (bool, error) {
	var chain []*x509.Certificate
	rest := s.cert
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return false, fmt.Errorf("the certificate file: %w", err)
		}
		chain = append(chain, cert)
	}
	if len(chain) == 0 {
		return false, errors.New("the certificate file holds no certificate")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.ca) {
		return false, errors.New("the CA bundle holds no certificate")
	}
	intermediates := x509.NewCertPool()
	for _, cert := range chain[1:] {
		intermediates.AddCert(cert)
	}
	leaf := chain[0]
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return false, fmt.Errorf("the certificate does not verify: %w", err)
	}
	if !slices.ContainsFunc(leaf.URIs, func(u *url.URL) bool { return u.String() == spiffeID }) {
		return false, fmt.Errorf("the certificate does not name %s", spiffeID)
	}
	return slices.ContainsFunc(leaf.IPAddresses, ip.Equal), nil
}

// stamp prints `<word> <unix ns>`.
func stamp(word string) {
	fmt.Printf("%s %d\n", word, time.Now().UnixNano())
}

// waitForStop returns never: the process ends at SIGTERM or SIGINT.
func waitForStop() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	os.Exit(0)
}
