package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd runs a single-member etcd for the API server from etcd's embed
// package, at the server version matching the etcd client Kubernetes
// requires (go.mod pins both; Debian's etcd is too old). The flags are a
// small subset named as etcd's own, enough for one member on loopback with
// optional client TLS. It runs until SIGTERM or SIGINT and then closes the
// server cleanly, so a test harness can stop it like any other process.
func runEtcd() int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	name := fs.String("name", "default", "member name")
	dataDir := fs.String("data-dir", "", "directory for the WAL and the database (required)")
	listenClient := fs.String("listen-client-urls", "http://127.0.0.1:2379", "comma-separated URLs to serve clients on")
	advertiseClient := fs.String("advertise-client-urls", "", "comma-separated client URLs to advertise (default: --listen-client-urls)")
	listenPeer := fs.String("listen-peer-urls", "http://127.0.0.1:2380", "comma-separated URLs for peer traffic; also advertised (single member)")
	listenMetrics := fs.String("listen-metrics-urls", "", "comma-separated URLs serving only /metrics and /health")
	certFile := fs.String("cert-file", "", "client TLS certificate (https client URLs)")
	keyFile := fs.String("key-file", "", "client TLS key")
	trustedCA := fs.String("trusted-ca-file", "", "CA for client certificates")
	clientCertAuth := fs.Bool("client-cert-auth", false, "require client certificates signed by --trusted-ca-file")
	quota := fs.Int64("quota-backend-bytes", 0, "backend size limit (0: etcd's default)")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	unsafeNoFsync := fs.Bool("unsafe-no-fsync", false, "skip fsync (throwaway test data only)")
	showVersion := fs.Bool("version", false, "print the etcd server version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Printf("etcd Version: %s (embedded)\n", version.Version)
		return 0
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	if *advertiseClient == "" {
		*advertiseClient = *listenClient
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.Logger = "zap"
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}
	cfg.QuotaBackendBytes = *quota
	cfg.UnsafeNoFsync = *unsafeNoFsync
	cfg.ClientTLSInfo.CertFile = *certFile
	cfg.ClientTLSInfo.KeyFile = *keyFile
	cfg.ClientTLSInfo.TrustedCAFile = *trustedCA
	cfg.ClientTLSInfo.ClientCertAuth = *clientCertAuth
	for _, u := range []struct {
		flag, value string
		dst         *[]url.URL
	}{
		{"listen-client-urls", *listenClient, &cfg.ListenClientUrls},
		{"advertise-client-urls", *advertiseClient, &cfg.AdvertiseClientUrls},
		{"listen-peer-urls", *listenPeer, &cfg.ListenPeerUrls},
		{"listen-peer-urls", *listenPeer, &cfg.AdvertisePeerUrls},
		{"listen-metrics-urls", *listenMetrics, &cfg.ListenMetricsUrls},
	} {
		urls, err := parseURLs(u.value)
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd: --%s: %v\n", u.flag, err)
			return 2
		}
		*u.dst = urls
	}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", *listenClient)
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-ctx.Done():
		return 0
	}
	select {
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "etcd: stopping")
		return 0 // the deferred Close stops the server and flushes the WAL
	}
}

// parseURLs parses a comma-separated URL list; an empty string is no URLs.
func parseURLs(s string) ([]url.URL, error) {
	var urls []url.URL
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		u, err := url.Parse(part)
		if err != nil {
			return nil, err
		}
		urls = append(urls, *u)
	}
	return urls, nil
}
