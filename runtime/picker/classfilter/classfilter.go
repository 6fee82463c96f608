// Package classfilter is the endpoint picker's traffic-class filter, plugin type
// `mtp-traffic-class-filter`: it keeps the pods of the request's traffic class.
//
// Its parameters are what the operator renders (operator/mtp_operator/routing.py,
// class_filter_parameters) into the EndpointPickerConfig of the ConfigMap `<name>-epp-config`:
//
//	classLabel: mtp-operator.io/traffic-class
//	contextLengthLabel: llm-d.ai/context-length-range
//	classes:
//	- {name: code, header: {name: x-mtp-class, value: code}}
//	- {name: short, promptTokens: {min: 0, max: 127}}
//	defaultClass: general
//
// A request takes the first class in that list whose header (name, case-insensitive, and
// value) it carries, else the first prompt-length range (tokens, both ends included) its
// prompt length falls in, else the default class; the filter keeps the pods whose classLabel
// is that class. No class and no default: every pod stays. A class with no pod among the
// candidates: every pod stays too (a request is never left without a pod; it logs that).
package classfilter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log"
	kjson "sigs.k8s.io/json"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// Type is the plugin type the operator's EndpointPickerConfig names.
const Type = "mtp-traffic-class-filter"

// CharactersPerToken is the prompt-length estimate's ratio: the same 4 characters (bytes) per
// token as the EPP's own SimpleTokenEstimator (requestdataproducer/inflightload).
const CharactersPerToken = 4.0

var _ fwksched.Filter = &Filter{}

// Header is a header class's match: the request carries this header with this value.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Range is a length class's prompt length in tokens, both ends included.
type Range struct {
	Min int64 `json:"min"`
	Max int64 `json:"max"`
}

// Class is one traffic class: a header class or a length class.
type Class struct {
	Name         string  `json:"name"`
	Header       *Header `json:"header,omitempty"`
	PromptTokens *Range  `json:"promptTokens,omitempty"`
}

// Parameters are the plugin's parameters, exactly as the operator renders them.
type Parameters struct {
	ClassLabel string `json:"classLabel"`
	// ContextLengthLabel names the label length-class pods carry ("min-max"); informational
	// here (the class label decides), accepted so that the rendered config loads as it is.
	ContextLengthLabel string  `json:"contextLengthLabel,omitempty"`
	Classes            []Class `json:"classes"`
	DefaultClass       string  `json:"defaultClass,omitempty"`
}

// Filter is the plugin.
type Filter struct {
	typedName fwkplugin.TypedName
	params    Parameters
}

// Factory is the plugin's factory for the EPP's plugin registry.
func Factory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	p, err := ParseParameters(raw)
	if err != nil {
		return nil, fmt.Errorf("%s plugin %q: %w", Type, name, err)
	}
	return New(name, p), nil
}

// ParseParameters decodes and checks the parameters; unknown fields are refused, so a
// renderer that drifts from this parser fails at the picker's start, not silently.
func ParseParameters(raw json.RawMessage) (Parameters, error) {
	var p Parameters
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return p, errors.New("parameters are required (classLabel, classes)")
	}
	// case-sensitive, no unknown or repeated fields: Kubernetes' own strict decoding
	strict, err := kjson.UnmarshalStrict(raw, &p, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return p, fmt.Errorf("parameters: %w", err)
	}
	if len(strict) > 0 {
		return p, fmt.Errorf("parameters: %w", errors.Join(strict...))
	}
	if p.ClassLabel == "" {
		return p, errors.New("parameters: classLabel is required")
	}
	seen := map[string]bool{}
	for i, c := range p.Classes {
		switch {
		case c.Name == "":
			return p, fmt.Errorf("parameters: classes[%d].name is required", i)
		case seen[c.Name]:
			return p, fmt.Errorf("parameters: classes[%d].name %q is repeated", i, c.Name)
		case (c.Header == nil) == (c.PromptTokens == nil):
			return p, fmt.Errorf("parameters: classes[%d] (%s) needs exactly one of header, promptTokens", i, c.Name)
		case c.Header != nil && c.Header.Name == "":
			return p, fmt.Errorf("parameters: classes[%d].header.name is required", i)
		case c.PromptTokens != nil && (c.PromptTokens.Min < 0 || c.PromptTokens.Max < c.PromptTokens.Min):
			return p, fmt.Errorf("parameters: classes[%d].promptTokens: need 0 <= min <= max, got %d-%d",
				i, c.PromptTokens.Min, c.PromptTokens.Max)
		}
		seen[c.Name] = true
	}
	return p, nil
}

// New returns the filter with these parameters.
func New(name string, p Parameters) *Filter {
	if name == "" {
		name = Type
	}
	return &Filter{typedName: fwkplugin.TypedName{Type: Type, Name: name}, params: p}
}

// TypedName returns the plugin's type and name.
func (f *Filter) TypedName() fwkplugin.TypedName { return f.typedName }

// PromptTokens is the picker's estimate of a request's prompt length in tokens: the token
// count when the EPP has tokenized the prompt (an external tokenizer plugin), else the prompt
// text's length in bytes / 4, rounded (the EPP's SimpleTokenEstimator's ratio; the text is
// what the EPP's parser extracts: a completion's prompt, or chat messages' contents joined by
// spaces), else the whole body's size / 4.
func PromptTokens(r *fwksched.LLMRequest) int64 {
	if r == nil {
		return 0
	}
	if r.TokenizedPrompt != nil && len(r.TokenizedPrompt.TokenIDs) > 0 {
		return int64(len(r.TokenizedPrompt.TokenIDs))
	}
	if r.Body != nil {
		return int64(math.Round(float64(len(r.Body.PromptText())) / CharactersPerToken))
	}
	return int64(math.Round(float64(r.RequestSizeBytes) / CharactersPerToken))
}

func header(r *fwksched.LLMRequest, name string) (string, bool) {
	if v, ok := r.Headers[name]; ok {
		return v, true
	}
	for k, v := range r.Headers { // Envoy sends lower-case names; anything else, fold
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// ClassOf is the request's class ("" for none): the first header class whose header it
// carries, else the first range its prompt length falls in, else the default class.
func (f *Filter) ClassOf(r *fwksched.LLMRequest) string {
	if r != nil && r.Headers != nil {
		for _, c := range f.params.Classes {
			if c.Header == nil {
				continue
			}
			if v, ok := header(r, c.Header.Name); ok && strings.TrimSpace(v) == c.Header.Value {
				return c.Name
			}
		}
	}
	n := int64(-1)
	for _, c := range f.params.Classes {
		if c.PromptTokens == nil {
			continue
		}
		if n < 0 {
			n = PromptTokens(r)
		}
		if c.PromptTokens.Min <= n && n <= c.PromptTokens.Max {
			return c.Name
		}
	}
	return f.params.DefaultClass
}

// Filter keeps the pods of the request's class (see the package comment).
func (f *Filter) Filter(ctx context.Context, _ *fwksched.CycleState, r *fwksched.LLMRequest,
	endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	class := f.ClassOf(r)
	logger := log.FromContext(ctx).WithValues("plugin", f.typedName.String(), "class", class)
	if class == "" {
		logger.V(1).Info("no traffic class: every pod stays", "promptTokens", PromptTokens(r))
		return endpoints
	}
	kept := make([]fwksched.Endpoint, 0, len(endpoints))
	for _, e := range endpoints {
		if e == nil || e.GetMetadata() == nil {
			continue
		}
		if e.GetMetadata().Labels[f.params.ClassLabel] == class {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		logger.Info("no pod of the request's traffic class among the candidates: every pod stays",
			"candidates", len(endpoints))
		return endpoints
	}
	logger.V(1).Info("kept the pods of the request's traffic class", "kept", len(kept),
		"candidates", len(endpoints))
	return kept
}
