// Command extproc-probe drives an endpoint picker as Envoy's ext_proc filter does (one gRPC
// stream: the request headers, then the body with end_of_stream) and prints, as one JSON
// line, the endpoint the picker chose: the `x-gateway-destination-endpoint` header it sets and
// the same key in its dynamic metadata (namespace `envoy.lb`), or its immediate response.
//
//	extproc-probe --addr 127.0.0.1:9002 [--plaintext] [-H x-mtp-class=code] \
//	    [--path /v1/completions] [--model m] (--prompt TEXT | --prompt-chars N | --body JSON)
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const endpointKey = "x-gateway-destination-endpoint"

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ",") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// Result is what the probe prints.
type Result struct {
	Endpoint         string            `json:"endpoint,omitempty"`         // the header the picker set
	MetadataEndpoint string            `json:"metadataEndpoint,omitempty"` // envoy.lb metadata
	SetHeaders       map[string]string `json:"setHeaders,omitempty"`
	ImmediateStatus  int               `json:"immediateStatus,omitempty"` // the picker refused
	ImmediateBody    string            `json:"immediateBody,omitempty"`
	Error            string            `json:"error,omitempty"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9002", "the picker's ext-proc address")
	plaintext := flag.Bool("plaintext", false, "no TLS (the picker's --secure-serving=false); "+
		"by default TLS without verification, as the picker's self-signed certificate needs")
	path := flag.String("path", "/v1/completions", "the request's :path")
	model := flag.String("model", "model", "the body's model")
	prompt := flag.String("prompt", "", "the completion's prompt")
	promptChars := flag.Int("prompt-chars", -1, "a prompt of this many characters instead")
	body := flag.String("body", "", "the whole request body instead")
	timeout := flag.Duration("timeout", 10*time.Second, "for the whole exchange")
	var headers headerFlags
	flag.Var(&headers, "H", "a request header name=value (repeatable)")
	flag.Parse()

	res := run(*addr, *plaintext, *path, requestBody(*body, *model, *prompt, *promptChars), headers, *timeout)
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if res.Error != "" || res.Endpoint == "" {
		os.Exit(1)
	}
}

func requestBody(body, model, prompt string, chars int) []byte {
	if body != "" {
		return []byte(body)
	}
	if chars >= 0 {
		prompt = strings.Repeat("a", chars)
	}
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	return b
}

func run(addr string, plaintext bool, path string, body []byte, headers []string,
	timeout time.Duration) Result {
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed
	if plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return Result{Error: err.Error()}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return Result{Error: err.Error()}
	}

	// as Envoy sends them: pseudo-headers and lower-case names, values as raw bytes
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")},
		{Key: ":path", RawValue: []byte(path)},
		{Key: ":authority", RawValue: []byte("inference-gateway")},
		{Key: ":scheme", RawValue: []byte("http")},
		{Key: "content-type", RawValue: []byte("application/json")},
		{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))},
	}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok {
			return Result{Error: fmt.Sprintf("-H %q: want name=value", h)}
		}
		hs = append(hs, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}},
	}}); err != nil {
		return Result{Error: "sending headers: " + err.Error()}
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
	}}); err != nil {
		return Result{Error: "sending body: " + err.Error()}
	}

	var res Result
	for {
		resp, err := stream.Recv()
		if err != nil {
			res.Error = "receiving: " + err.Error()
			return res
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			res.ImmediateStatus = int(ir.GetStatus().GetCode())
			res.ImmediateBody = string(ir.GetBody())
			res.Error = "immediate response"
			return res
		}
		if lb := resp.GetDynamicMetadata().GetFields()["envoy.lb"]; lb != nil {
			res.MetadataEndpoint = lb.GetStructValue().GetFields()[endpointKey].GetStringValue()
		}
		if rh := resp.GetRequestHeaders(); rh != nil {
			res.SetHeaders = map[string]string{}
			for _, o := range rh.GetResponse().GetHeaderMutation().GetSetHeaders() {
				v := string(o.GetHeader().GetRawValue())
				if v == "" {
					v = o.GetHeader().GetValue()
				}
				res.SetHeaders[o.GetHeader().GetKey()] = v
				if o.GetHeader().GetKey() == endpointKey {
					res.Endpoint = v
				}
			}
		}
		if resp.GetRequestBody() != nil { // the body comes back after the headers: done
			_ = stream.CloseSend()
			return res
		}
	}
}
