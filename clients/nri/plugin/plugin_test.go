package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cod-dbos/cod/clients/nri/plugin"
)

func testDir(t *testing.T) string {
	// Not t.TempDir(): Unix socket paths must stay short.
	dir, err := os.MkdirTemp("", "cod-nri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startNode starts what one Kubernetes node runs: the RM (on the MagnyCours facts), the
// runtime's NRI adaptation and the plugin between them.
func startNode(t *testing.T) (string, *rmDaemon, *runtime, *codPlugin) {
	t.Helper()
	dir := testDir(t)
	rm := startRM(t, dir, "magnycours")
	r := startRuntime(t, dir)
	cp := startPlugin(t, dir, r, plugin.Config{RMSocket: rm.socket, RMTimeout: 20 * time.Second})
	return dir, rm, r, cp
}

func listing3(t *testing.T, slaMs int) map[string]string {
	proc, err := os.ReadFile(filepath.Join(repoRoot(t), "stored_procedures", "examples", "cscs_cost_fn.pl"))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"cod.nri.io/facts":      fmt.Sprintf("db_ntuple(30000000)\ndb_tsize(315)\ndb_nquery(2048)\ndb_nupdate(0)\ndb_rtime(%d)", slaMs),
		"cod.nri.io/procedures": string(proc),
		"cod.nri.io/min-cores":  `{"query": "dbos_cost_function(_, N, _)", "var": "N"}`,
		"cod.nri.io/max-cores":  `{"query": "dbos_cost_function(_, N, _)", "var": "N"}`,
	}
}

func cpuCount(t *testing.T, cpus string) int {
	list, err := plugin.ParseCPUList(cpus)
	if err != nil {
		t.Fatalf("bad cpuset %q: %v", cpus, err)
	}
	return len(list)
}

// The paper's Table 3 on MagnyCours: SLA 2 s, 4 s, 8 s give 8, 4 and 2 cores.
func TestListing3ContainersGetTable3Cores(t *testing.T) {
	_, rm, r, _ := startNode(t)
	ctx := context.Background()
	for _, row := range []struct{ slaMs, cores int }{{2000, 8}, {4000, 4}, {8000, 2}} {
		id, cpus, err := r.createPod(ctx, "tpch", fmt.Sprintf("cscs-%d", row.slaMs), listing3(t, row.slaMs), 0)
		if err != nil {
			t.Fatalf("SLA %d ms: %v", row.slaMs, err)
		}
		if n := cpuCount(t, cpus); n != row.cores {
			t.Fatalf("SLA %d ms: the container got %d CPUs (%s), Table 3 says %d", row.slaMs, n, cpus, row.cores)
		}
		task := fmt.Sprintf("tpch/cscs-%d/db", row.slaMs)
		if got := rm.tasks(t)[task]; sortedCPUList(cpus) != fmt.Sprint(got) {
			t.Fatalf("%s: adjustment %s, the RM's allocation %v", id, cpus, got)
		}
	}
}

// 50 pods (40 COD tasks sharing 48 CPUs, 10 in the shared pool) through create, update and stop.
func TestFiftyPods(t *testing.T) {
	_, rm, r, cp := startNode(t)
	ctx := context.Background()
	var ids []string
	codTask := map[string]string{}
	for i := 0; i < 50; i++ {
		ann := map[string]string{"cod.nri.io/task": "true"}
		if i%5 == 4 {
			ann = nil // a shared-pool pod
		}
		id, _, err := r.createPod(ctx, "fleet", fmt.Sprintf("pod-%02d", i), ann, 1)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		ids = append(ids, id)
		if ann != nil {
			codTask[id] = fmt.Sprintf("fleet/pod-%02d/db", i)
		}
	}
	converged := func() (bool, string) {
		alloc := rm.tasks(t)
		for id, task := range codTask {
			if got, want := sortedCPUList(r.cpusOf(id)), fmt.Sprint(alloc[task]); got != want {
				return false, fmt.Sprintf("%s: runtime cpuset %s, RM allocation %s", task, got, want)
			}
		}
		return true, ""
	}
	eventually(t, 60*time.Second, converged)
	// A resize from the kubelet does not undo the plugin's cpuset.
	for _, id := range ids[:5] {
		before := r.cpusOf(id)
		r.mu.Lock()
		ctr, pod := r.ctrs[id], r.pods[r.ctrs[id].PodSandboxId]
		r.mu.Unlock()
		resp, err := r.a.UpdateContainer(ctx, updateRequest(pod, ctr))
		if err != nil {
			t.Fatal(err)
		}
		r.apply(resp.GetUpdate())
		if after := r.cpusOf(id); after != before {
			t.Fatalf("%s: a resize changed the cpuset from %s to %s", id, before, after)
		}
	}
	// Stop every other COD pod: the others grow, through revocation and acknowledgement.
	stopped := 0
	for _, id := range ids {
		if _, ok := codTask[id]; ok && stopped < 20 {
			if err := r.stopContainer(ctx, id); err != nil {
				t.Fatal(err)
			}
			delete(codTask, id)
			stopped++
		}
	}
	eventually(t, 60*time.Second, converged)
	if n := len(rm.tasks(t)); n != len(codTask) {
		t.Fatalf("the RM holds %d tasks, %d COD containers run", n, len(codTask))
	}
	r.mu.Lock()
	overlaps := append([]string(nil), r.overlap...)
	r.mu.Unlock()
	if len(overlaps) > 0 {
		t.Fatalf("exclusive cpusets overlapped %d times, first: %s", len(overlaps), overlaps[0])
	}
	for _, id := range ids {
		if r.cpusOf(id) != "" || codTask[id] != "" {
			if err := r.stopContainer(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		n := len(rm.tasks(t))
		return n == 0, fmt.Sprintf("%d tasks left on the RM", n)
	})
	reportLatencies(t, cp.p.UpdateLatencies())
}

// reportLatencies logs upcall -> UpdateContainers latencies and writes them where bench/nri_bench.py asks.
func reportLatencies(t *testing.T, lat []time.Duration) {
	if len(lat) == 0 {
		t.Fatal("no upcall reached UpdateContainers")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	figures := map[string]any{"upcalls_applied": len(lat), "median_ms": ms(lat[len(lat)/2]),
		"p99_ms": ms(lat[(len(lat)*99)/100]), "max_ms": ms(lat[len(lat)-1])}
	t.Logf("upcall -> UpdateContainers: %v", figures)
	if out := os.Getenv("COD_NRI_BENCH_JSON"); out != "" {
		b, _ := json.Marshal(figures)
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The RM killed and restarted: the plugin registers its containers again and they converge.
func TestRMRestart(t *testing.T) {
	_, rm, r, _ := startNode(t)
	ctx := context.Background()
	for i, sla := range []int{2000, 4000} {
		if _, _, err := r.createPod(ctx, "db", fmt.Sprintf("p%d", i), listing3(t, sla), 0); err != nil {
			t.Fatal(err)
		}
	}
	rm.kill()
	rm.start()
	eventually(t, 60*time.Second, func() (bool, string) {
		tasks := rm.tasks(t)
		if len(tasks["db/p0/db"]) != 8 || len(tasks["db/p1/db"]) != 4 {
			return false, fmt.Sprintf("tasks on the new RM: %v", tasks)
		}
		if got := sortedCPUList(r.cpusOf("ctr-db-p0")); got != fmt.Sprint(tasks["db/p0/db"]) {
			return false, "the runtime's cpuset " + got + " is not the new RM's allocation"
		}
		return true, ""
	})
}

// The plugin killed and restarted: Synchronize registers the running containers again.
func TestPluginRestart(t *testing.T) {
	dir, rm, r, cp := startNode(t)
	ctx := context.Background()
	if _, _, err := r.createPod(ctx, "db", "a", listing3(t, 2000), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.createPod(ctx, "web", "b", nil, 0); err != nil {
		t.Fatal(err)
	}
	cp.stop()
	eventually(t, 30*time.Second, func() (bool, string) {
		n := len(rm.tasks(t))
		return n == 0, fmt.Sprintf("the RM still holds %d tasks of the stopped plugin", n)
	})
	startPlugin(t, dir, r, plugin.Config{RMSocket: rm.socket, RMTimeout: 20 * time.Second})
	eventually(t, 30*time.Second, func() (bool, string) {
		tasks := rm.tasks(t)
		return len(tasks["db/a/db"]) == 8, fmt.Sprintf("tasks after the restart: %v", tasks)
	})
	if got := cpuCount(t, r.cpusOf("ctr-web-b")); got != 48-8 {
		t.Fatalf("the shared-pool container has %d CPUs, want the 40 no task holds", got)
	}
}

func TestBadInput(t *testing.T) {
	_, rm, r, cp := startNode(t)
	ctx := context.Background()
	cases := []struct {
		pod  string
		ann  map[string]string
		want string // in the event's reason
	}{
		{"typo", map[string]string{"cod.nri.io/min-core": "2"}, "unknown key"},
		{"nan", map[string]string{"cod.nri.io/min-cores": "many"}, "min-cores"},
		{"too-big", map[string]string{"cod.nri.io/min-cores": "100"}, "refused"},
		{"bad-fact", map[string]string{"cod.nri.io/facts": "db-rtime(3000)"}, "refused"},
	}
	for _, tc := range cases {
		id, cpus, err := r.createPod(ctx, "bad", tc.pod, tc.ann, 0)
		if err != nil {
			t.Fatalf("%s: fail-open refused the container: %v", tc.pod, err)
		}
		if cpuCount(t, cpus) != 48 {
			t.Fatalf("%s (%s): got %s, want the shared pool (all 48 CPUs)", tc.pod, id, cpus)
		}
		found := false
		for _, ev := range cp.p.Events() {
			if ev.Pod == "bad/"+tc.pod && strings.Contains(ev.Reason, tc.want) {
				found = true
			}
		}
		if !found {
			t.Fatalf("%s: no event naming the pod and %q: %v", tc.pod, tc.want, cp.p.Events())
		}
	}
	if n := len(rm.tasks(t)); n != 0 {
		t.Fatalf("refused registrations left %d tasks", n)
	}
}

func TestFailClosedAndMissingRM(t *testing.T) {
	dir := testDir(t)
	r := startRuntime(t, dir)
	missing := filepath.Join(dir, "no-rm.sock")
	startPlugin(t, dir, r, plugin.Config{RMSocket: missing, RMTimeout: 300 * time.Millisecond, FailPolicy: plugin.FailClosed})
	ctx := context.Background()
	start := time.Now()
	_, _, err := r.createPod(ctx, "db", "x", map[string]string{"cod.nri.io/task": "true"}, 2)
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("fail-closed without an RM: want a refusal saying the RM did not answer, got %v", err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("container creation waited %s for a missing RM (timeout 300 ms)", waited)
	}
	// A container without COD annotations is never refused, RM or not.
	if _, _, err := r.createPod(ctx, "web", "y", nil, 0); err != nil {
		t.Fatalf("a plain container was refused: %v", err)
	}
}
