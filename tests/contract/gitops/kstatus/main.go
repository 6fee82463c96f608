// kstatus computes the status Flux (and kpt, cli-utils' status poller) gives a resource:
// sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute on the object as the API returns it.
//
// Usage: kstatus < objects.json   (a JSON array of objects)
// Output: a JSON array of {"status": ..., "message": ...} or {"error": ...}, one per object.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		fmt.Fprintln(os.Stderr, "objects:", err)
		os.Exit(1)
	}
	out := make([]result, 0, len(raw))
	for _, r := range raw {
		u := &unstructured.Unstructured{}
		// the apimachinery JSON decoder, as a client reading the API gets the object
		if err := u.UnmarshalJSON(r); err != nil {
			out = append(out, result{Error: err.Error()})
			continue
		}
		res, err := status.Compute(u)
		if err != nil {
			out = append(out, result{Error: err.Error()})
			continue
		}
		out = append(out, result{Status: res.Status.String(), Message: res.Message})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
