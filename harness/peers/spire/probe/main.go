// Command probe is the app container of a SPIRE pod in `athenz-devstack cluster bench --systems
// spire`: it asks the SPIRE agent's Workload API (the socket the SPIFFE CSI driver mounts) for
// its X.509 SVID until it has one that verifies against the bundle it got with it and names the
// SPIFFE ID given as its argument, then prints `ready <unix ns>` and `final <unix ns>` (the same
// moment: an SVID is final as fetched; CLOCK_REALTIME, as the Athenz probe stamps) and waits for
// SIGTERM.
//
// How it waits for an SVID the agent does not have yet is its third argument:
//   - `fetch` (the default): a failed fetch is retried after 20 ms. With entries made before the
//     pods (SPIRE's CLI) the first fetch is served, and the retry only shortens a rare wait.
//   - `source`: as a workload on go-spiffe's X509Source waits (its watch, retried on go-spiffe's
//     default backoff: 1 s, then 2 s, 3 s...). With entries spire-controller-manager makes per
//     pod, each SVID comes seconds after its pod starts; retried every 20 ms, every attempt was
//     a workload attestation (a kubelet pod list) for the agent, 195 ms of its CPU per SVID,
//     which no workload written against go-spiffe would cost it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// retry is the pause after a failed fetch.
const retry = 20 * time.Millisecond

// limit bounds the whole wait: the bench gives up on a pod after 120 s.
const limit = 150 * time.Second

func main() {
	if len(os.Args) != 3 && len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: probe <workload API address, unix:///…> <expected SPIFFE ID> [fetch|source]")
		os.Exit(2)
	}
	wait := "fetch"
	if len(os.Args) == 4 {
		wait = os.Args[3]
	}
	if wait != "fetch" && wait != "source" {
		fmt.Fprintln(os.Stderr, "probe: the way to wait is fetch or source, not", wait)
		os.Exit(2)
	}
	want, err := spiffeid.FromString(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe: the expected SPIFFE ID:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last error
	if wait == "source" {
		last = fromSource(ctx, os.Args[1], want)
	} else {
		for ctx.Err() == nil {
			if last = fetch(ctx, os.Args[1], want); last == nil {
				break
			}
			time.Sleep(retry)
		}
	}
	if last != nil {
		fmt.Fprintln(os.Stderr, "probe: no SVID within", limit, "last error:", last)
		os.Exit(1)
	}
	now := time.Now().UnixNano()
	fmt.Printf("ready %d\nfinal %d\n", now, now)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}

// fromSource waits for the first SVID as go-spiffe's X509Source does, then checks it; the
// source stays open.
func fromSource(ctx context.Context, addr string, want spiffeid.ID) error {
	source, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(addr)))
	if err != nil {
		return err
	}
	// kept open, as a workload keeps it, for the SVIDs that replace this one; the process's
	// exit closes it
	svid, err := source.GetX509SVID()
	if err != nil {
		return err
	}
	if svid.ID != want {
		return fmt.Errorf("the SVID names %s, not %s", svid.ID, want)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, source); err != nil {
		return fmt.Errorf("the SVID does not verify: %w", err)
	}
	return nil
}

// fetch makes one Workload API call and checks what it got.
func fetch(ctx context.Context, addr string, want spiffeid.ID) error {
	x509, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		return err
	}
	svid := x509.DefaultSVID()
	if svid.ID != want {
		return fmt.Errorf("the SVID names %s, not %s", svid.ID, want)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, x509.Bundles); err != nil {
		return fmt.Errorf("the SVID does not verify: %w", err)
	}
	return nil
}
