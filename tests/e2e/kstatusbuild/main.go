// Build module for the e2e kstatus verdicts: never imported, only built by
// tests/e2e/harness/kstatus.py. Reads a JSON array of Kubernetes objects on stdin and prints,
// one JSON object a line, kstatus's verdict on each (sigs.k8s.io/cli-utils/pkg/kstatus/status,
// the library Flux, kpt and Config Sync use for resources without health expressions).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

func main() {
	// apimachinery's decoder turns JSON integers into int64, as unstructured objects need.
	var objects []map[string]interface{}
	raw, err := io.ReadAll(os.Stdin)
	if err == nil {
		err = utiljson.Unmarshal(raw, &objects)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-verdict: stdin is not a JSON array of objects: %v\n", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objects {
		res, err := status.Compute(&unstructured.Unstructured{Object: obj})
		v := verdict{}
		if err != nil {
			v.Error = err.Error()
		} else {
			v.Status = res.Status.String()
			v.Message = res.Message
		}
		if err := out.Encode(v); err != nil {
			os.Exit(1)
		}
	}
}
