// Package annotations reads a pod's COD annotations into a task request.
//
// Every key is `cod.nri.io/<key>` for all of a pod's containers, or
// `cod.nri.io/<key>.<container>` for one of them (which wins). A container is a
// COD task when any key applies to it; the others stay in the shared pool.
// docs/kubernetes.md lists the keys.
package annotations

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Prefix starts every COD annotation key.
const Prefix = "cod.nri.io/"

// The keys a pod may carry.
const (
	KeyTask       = "task"              // "true": a COD task with the defaults
	KeyMinCores   = "min-cores"         // integer, or {"query": GOAL, "var": V}
	KeyMaxCores   = "max-cores"         // integer, or derived
	KeyWorkingSet = "working-set-bytes" // integer bytes per CPU, or derived
	KeyPriority   = "priority"          // integer -1000..1000, or derived
	KeySensitive  = "sensitive"         // comma list of numa, cache
	KeyExclusive  = "exclusive"         // true (default) or false
	KeyFacts      = "facts"             // JSON list of facts, or one fact per line
	KeyProcedures = "procedures"        // Prolog clauses (the application's stored procedures)
)

var knownKeys = map[string]bool{KeyTask: true, KeyMinCores: true, KeyMaxCores: true, KeyWorkingSet: true,
	KeyPriority: true, KeySensitive: true, KeyExclusive: true, KeyFacts: true, KeyProcedures: true}

// Request is what the plugin registers for one container.
type Request struct {
	Properties map[string]any // register_task's properties (numbers or derived queries)
	Facts      []string
	Procedures []string
}

// Error names the pod's annotation that was wrong and why.
type Error struct {
	Key    string
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("annotation %s%s: %s", Prefix, e.Key, e.Reason) }

// ForContainer returns the container's request, or nil when no COD key applies to it.
// defaultMinCores is the container's whole-CPU request (0 when it has none), used
// when min-cores is not given.
func ForContainer(podAnnotations map[string]string, container string, defaultMinCores int) (*Request, error) {
	values, err := collect(podAnnotations, container)
	if err != nil || len(values) == 0 {
		return nil, err
	}
	req := &Request{Properties: map[string]any{}}
	for _, key := range sortedKeys(values) {
		if err := apply(req, key, values[key]); err != nil {
			return nil, err
		}
	}
	if _, ok := req.Properties["min_cores"]; !ok && defaultMinCores > 0 {
		req.Properties["min_cores"] = defaultMinCores
	}
	return req, nil
}

// collect gathers the keys that apply to the container, per-container keys winning.
func collect(ann map[string]string, container string) (map[string]string, error) {
	values := map[string]string{}
	perContainer := map[string]string{}
	for k, v := range ann {
		if !strings.HasPrefix(k, Prefix) {
			continue
		}
		key := strings.TrimPrefix(k, Prefix)
		if base, ctr, ok := strings.Cut(key, "."); ok {
			if !knownKeys[base] {
				return nil, &Error{key, "unknown key (known: " + strings.Join(sortedKeys(knownKeys), ", ") + ")"}
			}
			if ctr == container {
				perContainer[base] = v
			}
			continue
		}
		if !knownKeys[key] {
			return nil, &Error{key, "unknown key (known: " + strings.Join(sortedKeys(knownKeys), ", ") + ")"}
		}
		values[key] = v
	}
	for k, v := range perContainer {
		values[k] = v
	}
	return values, nil
}

func apply(req *Request, key, value string) error {
	switch key {
	case KeyTask:
		if value != "true" && value != "false" {
			return &Error{key, fmt.Sprintf("%q is not true or false", value)}
		}
	case KeyMinCores, KeyMaxCores, KeyWorkingSet, KeyPriority:
		v, err := numberOrDerived(value)
		if err != nil {
			return &Error{key, err.Error()}
		}
		req.Properties[strings.ReplaceAll(key, "-", "_")] = v
	case KeySensitive:
		var list []string
		for _, s := range strings.Split(value, ",") {
			s = strings.TrimSpace(s)
			if s != "numa" && s != "cache" {
				return &Error{key, fmt.Sprintf("%q is not numa or cache", s)}
			}
			list = append(list, s)
		}
		req.Properties["sensitive"] = list
	case KeyExclusive:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return &Error{key, fmt.Sprintf("%q is not true or false", value)}
		}
		req.Properties["exclusive"] = b
	case KeyFacts:
		facts, err := factList(value)
		if err != nil {
			return &Error{key, err.Error()}
		}
		req.Facts = facts
	case KeyProcedures:
		if strings.TrimSpace(value) == "" {
			return &Error{key, "empty"}
		}
		req.Procedures = []string{value}
	}
	return nil
}

// numberOrDerived reads an integer, or a derived property {"query": GOAL, "var": V}.
func numberOrDerived(value string) (any, error) {
	value = strings.TrimSpace(value)
	if n, err := strconv.Atoi(value); err == nil {
		return n, nil
	}
	var derived struct {
		Query string `json:"query"`
		Var   string `json:"var"`
	}
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&derived); err != nil || derived.Query == "" || derived.Var == "" {
		return nil, fmt.Errorf("%q is neither an integer nor {\"query\": GOAL, \"var\": NAME}", clip(value))
	}
	return map[string]string{"query": derived.Query, "var": derived.Var}, nil
}

// factList reads a JSON list of strings, or one fact per non-empty line.
func factList(value string) ([]string, error) {
	trimmed := strings.TrimSpace(value)
	if strings.HasPrefix(trimmed, "[") {
		var facts []string
		if err := json.Unmarshal([]byte(trimmed), &facts); err != nil {
			return nil, fmt.Errorf("not a JSON list of strings: %v", err)
		}
		return facts, nil
	}
	var facts []string
	for _, line := range strings.Split(value, "\n") {
		if line = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(line), ".")); line != "" {
			facts = append(facts, line)
		}
	}
	if len(facts) == 0 {
		return nil, fmt.Errorf("no facts")
	}
	return facts, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
