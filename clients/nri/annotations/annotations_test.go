package annotations

import (
	"errors"
	"reflect"
	"testing"
)

func TestForContainer(t *testing.T) {
	listing3 := `{"query": "dbos_cost_function(_, N, _)", "var": "N"}`
	cases := []struct {
		name      string
		ann       map[string]string
		container string
		defMin    int
		want      *Request
		wantKey   string // the annotation an error names
	}{
		{"no COD keys: shared pool", map[string]string{"other.io/x": "1"}, "db", 2, nil, ""},
		{"opt in with defaults", map[string]string{Prefix + "task": "true"}, "db", 2,
			&Request{Properties: map[string]any{"min_cores": 2}}, ""},
		{"opt in without a whole-CPU request", map[string]string{Prefix + "task": "true"}, "db", 0,
			&Request{Properties: map[string]any{}}, ""},
		{"numbers and lists", map[string]string{Prefix + "min-cores": "3", Prefix + "max-cores": "6",
			Prefix + "sensitive": "numa, cache", Prefix + "exclusive": "false"}, "db", 2,
			&Request{Properties: map[string]any{"min_cores": 3, "max_cores": 6,
				"sensitive": []string{"numa", "cache"}, "exclusive": false}}, ""},
		{"per-container key wins", map[string]string{Prefix + "min-cores": "3", Prefix + "min-cores.db": "5"}, "db", 0,
			&Request{Properties: map[string]any{"min_cores": 5}}, ""},
		{"another container's key does not apply", map[string]string{Prefix + "min-cores.sidecar": "5"}, "db", 0, nil, ""},
		{"derived min-cores (Listing 3)", map[string]string{Prefix + "min-cores": listing3,
			Prefix + "facts": "db_ntuple(30000000)\ndb_rtime(2000).\n"}, "db", 0,
			&Request{Properties: map[string]any{"min_cores": map[string]string{"query": "dbos_cost_function(_, N, _)", "var": "N"}},
				Facts: []string{"db_ntuple(30000000)", "db_rtime(2000)"}}, ""},
		{"facts as a JSON list", map[string]string{Prefix + "facts": `["a(1)", "b(2)"]`}, "db", 0,
			&Request{Properties: map[string]any{}, Facts: []string{"a(1)", "b(2)"}}, ""},
		{"bad number", map[string]string{Prefix + "min-cores": "three"}, "db", 0, nil, "min-cores"},
		{"derived without var", map[string]string{Prefix + "min-cores": `{"query": "x(N)"}`}, "db", 0, nil, "min-cores"},
		{"unknown key", map[string]string{Prefix + "min-core": "2"}, "db", 0, nil, "min-core"},
		{"unknown per-container key", map[string]string{Prefix + "cpus.db": "2"}, "db", 0, nil, "cpus.db"},
		{"bad sensitivity", map[string]string{Prefix + "sensitive": "disk"}, "db", 0, nil, "sensitive"},
		{"bad boolean", map[string]string{Prefix + "exclusive": "yes please"}, "db", 0, nil, "exclusive"},
		{"bad facts list", map[string]string{Prefix + "facts": `["a(1)", 2]`}, "db", 0, nil, "facts"},
		{"empty procedures", map[string]string{Prefix + "procedures": "  "}, "db", 0, nil, "procedures"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ForContainer(tc.ann, tc.container, tc.defMin)
			if tc.wantKey != "" {
				var aerr *Error
				if !errors.As(err, &aerr) || aerr.Key != tc.wantKey {
					t.Fatalf("want an error naming %q, got %v", tc.wantKey, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}
