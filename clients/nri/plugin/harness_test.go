package plugin_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/cod-dbos/cod/clients/nri/plugin"
	"github.com/cod-dbos/cod/clients/nri/rmclient"
)

// repoRoot is the COD checkout this module lives in (its pyproject.toml).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "pyproject.toml")); err == nil {
			return d
		}
	}
	t.Fatalf("no pyproject.toml above %s", dir)
	return ""
}

// codCommand is the `cod` command the tests run the RM with: $COD_BIN, else the checkout's .venv.
func codCommand(t *testing.T) string {
	if bin := os.Getenv("COD_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(repoRoot(t), ".venv", "bin", "cod")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no cod command at %s (run `make setup`, or set COD_BIN): %v", bin, err)
	}
	return bin
}

// rmDaemon is a real COD RM started by a test, on a socket under the test's directory.
type rmDaemon struct {
	t       *testing.T
	cmd     *exec.Cmd
	socket  string
	dir     string
	machine string
}

func startRM(t *testing.T, dir, machine string) *rmDaemon {
	t.Helper()
	rm := &rmDaemon{t: t, socket: filepath.Join(dir, "rm.sock"), dir: dir, machine: machine}
	rm.start()
	t.Cleanup(rm.stop)
	return rm
}

func (rm *rmDaemon) start() {
	rm.t.Helper()
	logFile, err := os.OpenFile(filepath.Join(rm.dir, "rm.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		rm.t.Fatal(err)
	}
	rm.cmd = exec.Command(codCommand(rm.t), "rm", "--socket", rm.socket, "--machine", rm.machine,
		"--enforce", "none", "--state-dir", filepath.Join(rm.dir, "state"), "--no-busy-detect")
	rm.cmd.Stdout, rm.cmd.Stderr = logFile, logFile
	rm.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := rm.cmd.Start(); err != nil {
		rm.t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second) // a busy 2-CPU machine starts the daemon slowly
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := rmclient.Dial(ctx, rm.socket, "")
		cancel()
		if err == nil {
			conn.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	rm.t.Fatalf("the RM did not answer on %s within 90 s; its log:\n%s", rm.socket, rm.log())
}

func (rm *rmDaemon) log() string {
	b, _ := os.ReadFile(filepath.Join(rm.dir, "rm.log"))
	return string(b)
}

// kill ends the daemon at once, as a crash would.
func (rm *rmDaemon) kill() {
	if rm.cmd != nil && rm.cmd.Process != nil {
		_ = syscall.Kill(-rm.cmd.Process.Pid, syscall.SIGKILL)
		_ = rm.cmd.Wait()
		rm.cmd = nil
	}
}

func (rm *rmDaemon) stop() {
	if rm.cmd != nil && rm.cmd.Process != nil {
		_ = syscall.Kill(-rm.cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = rm.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-rm.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		rm.cmd = nil
	}
}

// tasks returns each task's CPUs as the RM holds them (list_tasks).
func (rm *rmDaemon) tasks(t *testing.T) map[string][]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := rmclient.Dial(ctx, rm.socket, "")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var list struct {
		Tasks []struct {
			Task  string `json:"task"`
			Cores []int  `json:"cores"`
		} `json:"tasks"`
	}
	if err := conn.Call(ctx, "list_tasks", nil, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	for _, task := range list.Tasks {
		out[task.Task] = task.Cores
	}
	return out
}

// runtime is NRI's own adaptation (the runtime side containerd embeds) with a container table.
type runtime struct {
	t       *testing.T
	a       *nri.Adaptation
	mu      sync.Mutex
	pods    map[string]*api.PodSandbox
	ctrs    map[string]*api.Container
	cpus    map[string]string // container id -> cpuset the runtime applied
	syncs   int
	updates int
	overlap []string // every moment two COD containers' cpusets overlapped
	cod     map[string]bool
}

func startRuntime(t *testing.T, dir string) *runtime {
	t.Helper()
	logrus.SetLevel(logrus.WarnLevel) // NRI's own info lines drown a failure's message
	r := &runtime{t: t, pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{},
		cpus: map[string]string{}, cod: map[string]bool{}}
	var err error
	r.a, err = nri.New("cod-test-runtime", "0.1", r.synchronize, r.update,
		nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		nri.WithSocketPath(filepath.Join(dir, "nri.sock")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.a.Stop)
	return r
}

func (r *runtime) synchronize(ctx context.Context, cb nri.SyncCB) error {
	r.mu.Lock()
	pods := make([]*api.PodSandbox, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	ctrs := make([]*api.Container, 0, len(r.ctrs))
	for _, c := range r.ctrs {
		ctrs = append(ctrs, c)
	}
	r.mu.Unlock()
	updates, err := cb(ctx, pods, ctrs)
	if err != nil {
		return err
	}
	r.apply(updates)
	r.mu.Lock()
	r.syncs++
	r.mu.Unlock()
	return nil
}

// update applies what it can and, like containerd, returns the updates of containers it does not have.
func (r *runtime) update(_ context.Context, updates []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) {
	var known, failed []*nri.ContainerUpdate
	r.mu.Lock()
	for _, u := range updates {
		if _, ok := r.ctrs[u.GetContainerId()]; ok {
			known = append(known, u)
		} else if !u.GetIgnoreFailure() {
			failed = append(failed, u)
		}
	}
	r.mu.Unlock()
	r.apply(known)
	return failed, nil
}

func (r *runtime) apply(updates []*api.ContainerUpdate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range updates {
		if cpus := u.GetLinux().GetResources().GetCpu().GetCpus(); cpus != "" {
			if _, ok := r.ctrs[u.GetContainerId()]; ok {
				r.cpus[u.GetContainerId()] = cpus
				r.updates++
				if os.Getenv("COD_NRI_TRACE") != "" {
					r.t.Logf("TRACE update %s -> %s", u.GetContainerId(), cpus)
				}
			}
		}
	}
	r.checkOverlap()
}

// checkOverlap records any two COD containers whose cpusets share a CPU (r.mu held).
func (r *runtime) checkOverlap() {
	owner := map[int]string{}
	for id, cpus := range r.cpus {
		if !r.cod[id] {
			continue
		}
		list, _ := plugin.ParseCPUList(cpus)
		for _, c := range list {
			if other, ok := owner[c]; ok {
				r.overlap = append(r.overlap, fmt.Sprintf("CPU %d in %s and %s", c, other, id))
			}
			owner[c] = id
		}
	}
}

func (r *runtime) syncCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncs
}

// createPod runs a pod and creates its one container, as containerd would; it returns the adjustment's cpuset.
func (r *runtime) createPod(ctx context.Context, ns, name string, ann map[string]string, cpuRequest int) (string, string, error) {
	id := ns + "-" + name
	pod := &api.PodSandbox{Id: "pod-" + id, Name: name, Namespace: ns, Uid: "uid-" + id, Annotations: ann}
	ctr := &api.Container{Id: "ctr-" + id, PodSandboxId: pod.Id, Name: "db", State: api.ContainerState_CONTAINER_CREATED,
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{}}}}
	if cpuRequest > 0 {
		ctr.Linux.Resources.Cpu.Quota = &api.OptionalInt64{Value: int64(cpuRequest) * 100000}
		ctr.Linux.Resources.Cpu.Period = &api.OptionalUInt64{Value: 100000}
	}
	if err := r.a.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}); err != nil {
		return "", "", err
	}
	r.mu.Lock()
	r.pods[pod.Id] = pod
	r.mu.Unlock()
	resp, err := r.a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return ctr.Id, "", err
	}
	cpus := resp.GetAdjust().GetLinux().GetResources().GetCpu().GetCpus()
	r.mu.Lock()
	r.ctrs[ctr.Id] = ctr
	for k := range ann {
		if strings.HasPrefix(k, "cod.nri.io/") {
			r.cod[ctr.Id] = true
		}
	}
	if cpus != "" {
		r.cpus[ctr.Id] = cpus
	}
	if os.Getenv("COD_NRI_TRACE") != "" {
		r.t.Logf("TRACE create %s -> %s", ctr.Id, cpus)
	}
	r.checkOverlap()
	r.mu.Unlock()
	r.apply(resp.GetUpdate())
	ctr.State = api.ContainerState_CONTAINER_RUNNING
	return ctr.Id, cpus, nil
}

// stopContainer stops and removes a container and its pod.
func (r *runtime) stopContainer(ctx context.Context, id string) error {
	r.mu.Lock()
	ctr := r.ctrs[id]
	r.mu.Unlock()
	if ctr == nil {
		return fmt.Errorf("no container %s", id)
	}
	r.mu.Lock()
	pod := r.pods[ctr.PodSandboxId]
	r.mu.Unlock()
	// containerd tells NRI plugins after the container's processes are gone: its CPUs are free.
	r.mu.Lock()
	ctr.State = api.ContainerState_CONTAINER_STOPPED
	delete(r.cod, id)
	r.mu.Unlock()
	resp, err := r.a.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return err
	}
	r.apply(resp.GetUpdate())
	if err := r.a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr}); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.ctrs, id)
	delete(r.cpus, id)
	delete(r.pods, pod.Id)
	r.mu.Unlock()
	return nil
}

// cpusOf is the cpuset the runtime last applied to a container.
func (r *runtime) cpusOf(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cpus[id]
}

// codPlugin is the plugin under test, connected to the runtime through NRI's own stub.
type codPlugin struct {
	p    *plugin.Plugin
	stub stub.Stub
}

func startPlugin(t *testing.T, dir string, r *runtime, cfg plugin.Config) *codPlugin {
	t.Helper()
	before := r.syncCount()
	if cfg.Logger == nil {
		cfg.Logger = log.New(testLog{t}, "", 0) // shown only when the test fails
	}
	p := plugin.New(cfg)
	s, err := stub.New(p, stub.WithSocketPath(filepath.Join(dir, "nri.sock")), stub.WithPluginName("cod"),
		stub.WithPluginIdx("90"))
	if err != nil {
		t.Fatal(err)
	}
	p.SetUpdater(s)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cp := &codPlugin{p: p, stub: s}
	t.Cleanup(cp.stop)
	deadline := time.Now().Add(60 * time.Second)
	for r.syncCount() == before {
		if time.Now().After(deadline) {
			t.Fatal("the plugin did not synchronize with the runtime within 60 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cp
}

func (cp *codPlugin) stop() {
	cp.stub.Stop()
	cp.p.Close()
}

// eventually polls cond until it holds or the timeout passes, then fails with what it last said.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sortedCPUList(text string) string {
	list, _ := plugin.ParseCPUList(text)
	sort.Ints(list)
	return fmt.Sprint(list)
}

func updateRequest(pod *api.PodSandbox, ctr *api.Container) *api.UpdateContainerRequest {
	return &api.UpdateContainerRequest{Pod: pod, Container: ctr,
		LinuxResources: &api.LinuxResources{Cpu: &api.LinuxCPU{Cpus: "0-47"}}}
}

// testLog sends the plugin's log lines to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
