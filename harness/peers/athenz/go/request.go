package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strings"
	"time"
)

// request is one request line; which fields matter depends on Op.
type request struct {
	Op          string          `json:"op"`
	URL         string          `json:"url"`
	CA          string          `json:"ca"`
	Cert        string          `json:"cert"`
	Key         string          `json:"key"`
	Provider    string          `json:"provider"`
	Domain      string          `json:"domain"`
	Service     string          `json:"service"`
	InstanceID  string          `json:"instance_id"`
	Ntoken      string          `json:"ntoken"`
	Role        string          `json:"role"`
	ContentType string          `json:"content_type"`
	Form        string          `json:"form"`
	Body        json.RawMessage `json:"body"`
}

// errModelRefuses: the body does not fit the Go ZTS model (a field it does not define, or a value
// its RDL types refuse when decoding), so Athenz's Go client cannot send it.
var errModelRefuses = errors.New("the Go ZTS model refuses the body")

// into reads the body into a ZTS model struct, refusing fields the struct does not define. The
// RDL models decode through their own UnmarshalJSON, which drops unknown fields silently, so the
// body's field names are checked against the struct's JSON names first.
func (r *request) into(model any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &fields); err != nil {
		return fmt.Errorf("%w: %v", errModelRefuses, err)
	}
	known := jsonNames(reflect.TypeOf(model).Elem())
	for name := range fields {
		if !known[name] {
			return fmt.Errorf("%w: the ZTS model has no field '%s'", errModelRefuses, name)
		}
	}
	if err := json.NewDecoder(bytes.NewReader(r.Body)).Decode(model); err != nil {
		return fmt.Errorf("%w: %v", errModelRefuses, err)
	}
	return nil
}

// jsonNames: the JSON field names of a struct type, from its json tags.
func jsonNames(t reflect.Type) map[string]bool {
	names := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name != "" && name != "-" {
			names[name] = true
		}
	}
	return names
}

// transport trusts only the request's CA and presents its certificate when it names one, as an
// Athenz Go SIA configures its ZTS client.
func (r *request) transport() (*http.Transport, error) {
	caPEM, err := os.ReadFile(r.CA)
	if err != nil {
		return nil, fmt.Errorf("reading ca: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("ca %s holds no certificate", r.CA)
	}
	config := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if r.Cert != "" && r.Key != "" {
		pair, err := tls.LoadX509KeyPair(r.Cert, r.Key)
		if err != nil {
			return nil, fmt.Errorf("loading the client certificate: %w", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return &http.Transport{TLSClientConfig: config, ResponseHeaderTimeout: 30 * time.Second}, nil
}
