package classfilter

import (
	"context"
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

const label = "mtp-operator.io/traffic-class"

// the parameters as the operator renders them for examples/traffic-classes.yaml plus a default
const rendered = `{
  "classLabel": "mtp-operator.io/traffic-class",
  "contextLengthLabel": "llm-d.ai/context-length-range",
  "classes": [
    {"name": "code", "header": {"name": "x-mtp-class", "value": "code"}},
    {"name": "finance", "header": {"name": "x-mtp-class", "value": "finance"}},
    {"name": "long", "promptTokens": {"min": 513, "max": 2147483647}},
    {"name": "mid", "promptTokens": {"min": 128, "max": 512}},
    {"name": "short", "promptTokens": {"min": 0, "max": 127}}
  ],
  "defaultClass": "general"
}`

func mustFilter(t *testing.T, raw string) *Filter {
	t.Helper()
	p, err := Factory("traffic-class", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Filter)
}

func pod(name, class string) fwksched.Endpoint {
	labels := map[string]string{"mtp-operator.io/resource": "r"}
	if class != "" {
		labels[label] = class
	}
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{PodName: name, Address: "10.0.0." + name,
		Port: "8000", Labels: labels}, nil, nil)
}

func completion(prompt string, headers map[string]string) *fwksched.LLMRequest {
	return &fwksched.LLMRequest{Headers: headers, Body: &fwksched.LLMRequestBody{
		Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: prompt}}}}
}

func names(es []fwksched.Endpoint) string {
	var out []string
	for _, e := range es {
		out = append(out, e.GetMetadata().PodName)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestClassOf(t *testing.T) {
	f := mustFilter(t, rendered)
	chars := func(n int) string { return strings.Repeat("x", n) }
	cases := []struct {
		name    string
		req     *fwksched.LLMRequest
		want    string
		wantLen int64
	}{
		{"header class wins over length", completion(chars(4000), map[string]string{"x-mtp-class": "code"}), "code", 1000},
		{"second value of the same header", completion("hi", map[string]string{"x-mtp-class": "finance"}), "finance", 1},
		{"header name case-insensitive", completion("hi", map[string]string{"X-MTP-Class": "code"}), "code", 1},
		{"unknown header value: by length", completion(chars(600), map[string]string{"x-mtp-class": "legal"}), "mid", 150},
		{"value is case-sensitive", completion(chars(8), map[string]string{"x-mtp-class": "Code"}), "short", 2},
		// 127 tokens = 508 chars (round(508/4)); 128 tokens starts at 510 chars (round(127.5) = 128)
		{"short upper end", completion(chars(508), nil), "short", 127},
		{"mid lower end", completion(chars(510), nil), "mid", 128},
		{"mid upper end", completion(chars(2048), nil), "mid", 512},
		{"long", completion(chars(2054), nil), "long", 514},
		{"empty prompt is 0 tokens: short", completion("", nil), "short", 0},
		{"chat messages joined", &fwksched.LLMRequest{Body: &fwksched.LLMRequestBody{
			ChatCompletions: &fwksched.ChatCompletionsRequest{Messages: []fwksched.Message{
				{Role: "user", Content: fwksched.Content{Raw: chars(1000)}},
				{Role: "user", Content: fwksched.Content{Raw: chars(1000)}}}}}}, "mid", 501},
		{"tokenized prompt counts tokens", &fwksched.LLMRequest{
			Body:            &fwksched.LLMRequestBody{Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: chars(4000)}}},
			TokenizedPrompt: &fwksched.TokenizedPrompt{TokenIDs: make([]uint32, 100)}}, "short", 100},
		{"no body: request size / 4", &fwksched.LLMRequest{RequestSizeBytes: 4000}, "long", 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := PromptTokens(c.req); got != c.wantLen {
				t.Errorf("PromptTokens = %d, want %d", got, c.wantLen)
			}
			if got := f.ClassOf(c.req); got != c.want {
				t.Errorf("ClassOf = %q, want %q", got, c.want)
			}
		})
	}
}

func TestDefaultClassAndNoDefault(t *testing.T) {
	headerOnly := `{"classLabel": "` + label + `", "classes": [
	  {"name": "code", "header": {"name": "x-mtp-class", "value": "code"}}], "defaultClass": "general"}`
	f := mustFilter(t, headerOnly)
	if got := f.ClassOf(completion("hello", nil)); got != "general" {
		t.Fatalf("no match: got %q, want the default class", got)
	}
	noDefault := `{"classLabel": "` + label + `", "classes": [
	  {"name": "code", "header": {"name": "x-mtp-class", "value": "code"}},
	  {"name": "short", "promptTokens": {"min": 0, "max": 10}}]}`
	f = mustFilter(t, noDefault)
	pods := []fwksched.Endpoint{pod("1", "code"), pod("2", "short"), pod("3", "")}
	if got := names(f.Filter(context.Background(), nil, completion(strings.Repeat("x", 400), nil), pods)); got != "1,2,3" {
		t.Fatalf("no class and no default: every pod stays, got %s", got)
	}
}

func TestFilterKeepsThePodsOfTheClass(t *testing.T) {
	f := mustFilter(t, rendered)
	pods := []fwksched.Endpoint{pod("1", "code"), pod("2", "short"), pod("3", "short"),
		pod("4", "long"), pod("5", "general"), pod("6", "")}
	ctx := context.Background()
	for _, c := range []struct {
		req  *fwksched.LLMRequest
		want string
	}{
		{completion("hi", map[string]string{"x-mtp-class": "code"}), "1"},
		{completion("hi", nil), "2,3"},
		{completion(strings.Repeat("x", 4000), nil), "4"},
		// mid has no pod here: every pod stays rather than none
		{completion(strings.Repeat("x", 1000), nil), "1,2,3,4,5,6"},
	} {
		if got := names(f.Filter(ctx, fwksched.NewCycleState(), c.req, pods)); got != c.want {
			t.Errorf("class %s: kept %s, want %s", f.ClassOf(c.req), got, c.want)
		}
	}
	// the default class
	g := mustFilter(t, `{"classLabel": "`+label+`", "classes": [
	  {"name": "code", "header": {"name": "x-mtp-class", "value": "code"}}], "defaultClass": "general"}`)
	if got := names(g.Filter(ctx, nil, completion("hi", nil), pods)); got != "5" {
		t.Errorf("default class: kept %s, want 5", got)
	}
}

func TestParametersRefused(t *testing.T) {
	for name, raw := range map[string]string{
		"none":                       ``,
		"null":                       `null`,
		"unknown field":              `{"classLabel": "l", "classes": [], "weights": {}}`,
		"no class label":             `{"classes": [{"name": "a", "header": {"name": "h", "value": "v"}}]}`,
		"class without a match":      `{"classLabel": "l", "classes": [{"name": "a"}]}`,
		"class with both matches":    `{"classLabel": "l", "classes": [{"name": "a", "header": {"name": "h", "value": "v"}, "promptTokens": {"min": 0, "max": 1}}]}`,
		"range upside down":          `{"classLabel": "l", "classes": [{"name": "a", "promptTokens": {"min": 9, "max": 3}}]}`,
		"repeated name":              `{"classLabel": "l", "classes": [{"name": "a", "header": {"name": "h", "value": "v"}}, {"name": "a", "header": {"name": "h", "value": "w"}}]}`,
		"field name in another case": `{"classLabel": "l", "classes": [], "defaultclass": "x"}`,
		"repeated field":             `{"classLabel": "l", "classLabel": "m", "classes": []}`,
		"unknown nested field":       `{"classLabel": "l", "classes": [{"name": "a", "header": {"name": "h", "value": "v", "regex": true}}]}`,
	} {
		if _, err := Factory("f", json.RawMessage(raw), nil); err == nil {
			t.Errorf("%s: accepted %s", name, raw)
		}
	}
}

// The operator's rendered EndpointPickerConfig (a copy in testdata) decodes with the EPP's own
// strict loader, and its class filter's parameters with this plugin's factory.
func TestTheOperatorsRenderedConfigLoads(t *testing.T) {
	raw, err := os.ReadFile("testdata/traffic-classes-epp-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := loader.LoadRawConfig(raw, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, p := range cfg.Plugins {
		if p.Type != Type {
			continue
		}
		found++
		pl, err := Factory(p.Name, p.Parameters, nil)
		if err != nil {
			t.Fatal(err)
		}
		f := pl.(*Filter)
		if got := f.ClassOf(completion("hi", map[string]string{"x-mtp-class": "finance"})); got != "finance" {
			t.Errorf("header class: %q", got)
		}
		if got := f.ClassOf(completion(strings.Repeat("x", 3000), nil)); got != "long" {
			t.Errorf("long prompt: %q", got)
		}
	}
	if found != 1 {
		t.Fatalf("%d plugins of type %s in the rendered config", found, Type)
	}
	var profileRefs []string
	for _, sp := range cfg.SchedulingProfiles {
		for _, p := range sp.Plugins {
			profileRefs = append(profileRefs, p.PluginRef)
		}
	}
	if len(profileRefs) == 0 || profileRefs[0] != "traffic-class" {
		t.Fatalf("the class filter is not first in the profile: %v", profileRefs)
	}
}
