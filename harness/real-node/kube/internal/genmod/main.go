// Command genmod writes the go.mod of the kube multicall module for one
// Kubernetes release.
//
// k8s.io/kubernetes is not meant to be a dependency: its go.mod requires every
// staging module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces
// each with a directory inside its own tree (=> ./staging/src/k8s.io/...).
// A dependent module ignores those replace lines, so it has to replace every
// staging module with the published v0.<minor>.<patch> that was cut from the
// same release. The list changes between releases (1.36 added cri-streaming
// and streaming), so it is read from the release's own go.mod instead of being
// typed by hand: `go mod download -json` names that file, and
// `go mod edit -json` parses it.
//
// Usage (run from the module directory, before `go mod tidy`):
//
//	go run ./internal/genmod -version v1.37.2 -o go.mod
//	go run ./internal/genmod -pin            # prints the version go.mod pins
//
// Only the standard library is used, so it runs even while go.mod is being
// rewritten.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

const (
	kubernetesModule = "k8s.io/kubernetes"
	etcdClientModule = "go.etcd.io/etcd/client/v3"
	etcdServerModule = "go.etcd.io/etcd/server/v3"
	stagingPrefix    = "./staging/src/"
	defaultModule    = "github.com/athenz-k8s-identity/tests/kube"
)

// goMod is the subset of `go mod edit -json` output that genmod reads.
type goMod struct {
	Module  struct{ Path string }
	Go      string
	Godebug []struct {
		Key, Value string
	}
	Require []struct {
		Path, Version string
	}
	Replace []struct {
		Old, New struct{ Path, Version string }
	}
}

// releaseVersion matches the tags Kubernetes publishes: v1.37.2, v1.37.0-rc.1.
var releaseVersion = regexp.MustCompile(`^v1\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?$`)

func main() {
	version := flag.String("version", "", "k8s.io/kubernetes version to pin, e.g. v1.37.2")
	out := flag.String("o", "", "go.mod file to write (stdout if empty)")
	module := flag.String("module", defaultModule, "module path of the generated go.mod")
	pin := flag.Bool("pin", false, "print the k8s.io/kubernetes version required by ./go.mod (or -modfile) and exit")
	modfile := flag.String("modfile", "go.mod", "go.mod read by -pin")
	flag.Parse()

	if err := run(*version, *out, *module, *pin, *modfile); err != nil {
		fmt.Fprintln(os.Stderr, "genmod:", err)
		os.Exit(1)
	}
}

func run(version, out, module string, pin bool, modfile string) error {
	if pin {
		m, err := parseGoMod(modfile)
		if err != nil {
			return err
		}
		v := requiredVersion(m, kubernetesModule)
		if v == "" {
			return fmt.Errorf("%s does not require %s", modfile, kubernetesModule)
		}
		fmt.Println(v)
		return nil
	}
	if !releaseVersion.MatchString(version) {
		return fmt.Errorf("-version %q is not a Kubernetes release tag (v1.X.Y)", version)
	}
	upstreamPath, err := downloadGoMod(kubernetesModule + "@" + version)
	if err != nil {
		return err
	}
	upstream, err := parseGoMod(upstreamPath)
	if err != nil {
		return err
	}
	text, err := render(module, version, upstream)
	if err != nil {
		return err
	}
	if out == "" {
		_, err = os.Stdout.WriteString(text)
		return err
	}
	return os.WriteFile(out, []byte(text), 0o644)
}

// downloadGoMod fetches a module version through the module proxy and returns
// the path of its go.mod in the module cache.
func downloadGoMod(query string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("go", "mod", "download", "-json", query)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var info struct{ GoMod, Error string }
	if jerr := json.Unmarshal(stdout.Bytes(), &info); jerr == nil && info.Error != "" {
		return "", fmt.Errorf("go mod download %s: %s", query, info.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %v: %s", query, err, stderr.String())
	}
	if info.GoMod == "" {
		return "", fmt.Errorf("go mod download %s: no GoMod in %q", query, stdout.String())
	}
	return info.GoMod, nil
}

// parseGoMod parses a go.mod with the go command's own parser.
func parseGoMod(path string) (*goMod, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("go", "mod", "edit", "-json", path)
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod edit -json %s: %v: %s", path, err, stderr.String())
	}
	var m goMod
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return &m, nil
}

func requiredVersion(m *goMod, path string) string {
	for _, r := range m.Require {
		if r.Path == path {
			return r.Version
		}
	}
	return ""
}

// render builds the go.mod text: the release's go and godebug lines, a
// requirement on the release and on the etcd server at the client's version
// (the embedded etcd must match what the API server was tested with), and one
// replace per staging module.
func render(module, version string, upstream *goMod) (string, error) {
	stagingVersion := "v0." + strings.TrimPrefix(version, "v1.")

	var replaces []string
	for _, r := range upstream.Replace {
		if !strings.HasPrefix(r.New.Path, stagingPrefix) {
			continue
		}
		if r.New.Path != stagingPrefix+r.Old.Path {
			return "", fmt.Errorf("unexpected staging replace %s => %s", r.Old.Path, r.New.Path)
		}
		replaces = append(replaces, fmt.Sprintf("\t%s => %s %s\n", r.Old.Path, r.Old.Path, stagingVersion))
	}
	if len(replaces) == 0 {
		return "", errors.New("no ./staging/src replace lines in " + kubernetesModule + "@" + version)
	}
	sort.Strings(replaces)

	etcd := requiredVersion(upstream, etcdClientModule)
	if etcd == "" {
		return "", fmt.Errorf("%s@%s does not require %s", kubernetesModule, version, etcdClientModule)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "// Generated by internal/genmod from %s@%s's own go.mod; regenerate with\n", kubernetesModule, version)
	fmt.Fprintf(&b, "// build.sh --update-pin --kube-version <version> instead of editing by hand.\n\n")
	fmt.Fprintf(&b, "module %s\n\n", module)
	fmt.Fprintf(&b, "go %s\n\n", upstream.Go)
	for _, d := range upstream.Godebug {
		fmt.Fprintf(&b, "godebug %s=%s\n\n", d.Key, d.Value)
	}
	fmt.Fprintf(&b, "require (\n\t%s %s\n\t%s %s\n)\n\n", kubernetesModule, version, etcdServerModule, etcd)
	fmt.Fprintf(&b, "// Staging modules of %s, each at the tag cut from the same release.\n", version)
	fmt.Fprintf(&b, "replace (\n%s)\n", strings.Join(replaces, ""))
	return b.String(), nil
}
