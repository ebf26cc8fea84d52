// Command athenz-go-harness drives Athenz's Go ZTS client (github.com/AthenZ/athenz/clients/go/zts,
// the client every Athenz Go SIA uses) one request per line: a JSON request on stdin, a JSON
// answer on stdout, the protocol of harness/peers/athenz/java (athenz_testbed::athenz_clients is the Rust
// side). The Rust tests build each request's material; the wire and the decoding are Athenz's.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

// maxLine bounds one request line.
const maxLine = 1 << 20

// answer is one answer line: status and message, decoded on success; or unsendable; or error.
type answer struct {
	Status     int            `json:"status,omitempty"`
	Message    string         `json:"message"`
	Decoded    map[string]any `json:"decoded,omitempty"`
	Unsendable string         `json:"unsendable,omitempty"`
	Error      string         `json:"error,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), maxLine)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		if err := out.Encode(handle(line)); err != nil {
			fmt.Fprintln(os.Stderr, "athenz-go-harness: writing an answer:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "athenz-go-harness: reading requests:", err)
		os.Exit(1)
	}
}

func handle(line []byte) answer {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return answer{Error: "a request that is not JSON: " + err.Error()}
	}
	a, err := call(&req)
	if err != nil {
		return answer{Error: err.Error()}
	}
	return a
}
