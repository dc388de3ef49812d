// Package plugin is COD's NRI plugin: it registers annotated containers as COD
// tasks with the node's Resource Manager and carries the RM's allocation into
// their cpusets. The RM stays the one decision maker; the plugin only enforces.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/cod-dbos/cod/clients/nri/annotations"
	"github.com/cod-dbos/cod/clients/nri/rmclient"
)

// FailPolicy says what a container gets when its COD registration fails.
type FailPolicy string

const (
	// FailOpen starts the container in the shared pool and logs why.
	FailOpen FailPolicy = "open"
	// FailClosed refuses to create the container.
	FailClosed FailPolicy = "closed"
)

// Config is the plugin's settings (cmd/cod-nri's flags).
type Config struct {
	RMSocket   string        // the RM's Unix socket
	FailPolicy FailPolicy    // what a container gets when registration fails
	RMTimeout  time.Duration // the longest container creation waits for the RM
	Logger     *log.Logger
}

// Updater applies unsolicited container updates (the NRI stub in production).
type Updater interface {
	UpdateContainers([]*api.ContainerUpdate) ([]*api.ContainerUpdate, error)
}

// Event is one thing worth telling an operator about a pod (a refused registration, a bad annotation).
type Event struct {
	Pod, Container, Reason string
}

// Plugin holds the containers it knows and their COD tasks.
type Plugin struct {
	cfg     Config
	updater Updater

	mu         sync.Mutex
	containers map[string]*container // by container id

	events    []Event
	latencies []time.Duration // upcall read -> UpdateContainers returned
	closed    bool
}

type container struct {
	id, name string
	pod      string // namespace/name
	task     *task  // nil: a shared-pool container
	cpus     string // the cpuset last given to the runtime
	mems     string
	created  bool // the runtime has it: changes go through UpdateContainers, not the adjustment
	stopping bool
}

// New returns a plugin; SetUpdater must be called before containers arrive.
func New(cfg Config) *Plugin {
	if cfg.RMTimeout <= 0 {
		cfg.RMTimeout = 2 * time.Second
	}
	if cfg.FailPolicy == "" {
		cfg.FailPolicy = FailOpen
	}
	if cfg.Logger == nil {
		cfg.Logger = log.Default()
	}
	return &Plugin{cfg: cfg, containers: map[string]*container{}}
}

// SetUpdater gives the plugin the runtime's UpdateContainers (the NRI stub).
func (p *Plugin) SetUpdater(u Updater) { p.updater = u }

// Events returns what the plugin reported about pods so far.
func (p *Plugin) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// UpdateLatencies returns, per applied upcall, the time from reading it to the runtime's answer.
func (p *Plugin) UpdateLatencies() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.latencies...)
}

// Close deregisters nothing (the RM forgets a closed connection's tasks) and stops reconnecting.
func (p *Plugin) Close() {
	p.mu.Lock()
	p.closed = true
	var conns []*rmclient.Conn
	for _, c := range p.containers {
		if c.task != nil && c.task.conn != nil {
			conns = append(conns, c.task.conn)
		}
	}
	p.mu.Unlock()
	for _, conn := range conns {
		conn.Close()
	}
}

func (p *Plugin) event(pod, ctr, reason string) {
	p.cfg.Logger.Printf("cod-nri: pod %s container %s: %s", pod, ctr, reason)
	p.mu.Lock()
	p.events = append(p.events, Event{pod, ctr, reason})
	p.mu.Unlock()
}

func podName(pod *api.PodSandbox) string { return pod.GetNamespace() + "/" + pod.GetName() }

// taskName is the COD task (and application) a container becomes: namespace/pod/container.
func taskName(pod *api.PodSandbox, ctr *api.Container) string {
	return podName(pod) + "/" + ctr.GetName()
}

// wholeCPURequest is a Guaranteed container's integer CPU request (quota/period), else 0.
func wholeCPURequest(ctr *api.Container) int {
	cpu := ctr.GetLinux().GetResources().GetCpu()
	quota, period := cpu.GetQuota().GetValue(), cpu.GetPeriod().GetValue()
	if quota <= 0 || period == 0 || uint64(quota)%period != 0 {
		return 0
	}
	return int(uint64(quota) / period)
}

// Synchronize registers the COD containers that already exist and returns every container's cpuset.
func (p *Plugin) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	for _, ctr := range ctrs {
		pod := byID[ctr.GetPodSandboxId()]
		if pod == nil || ctr.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		if _, err := p.admit(ctx, pod, ctr, true); err != nil {
			p.event(podName(pod), ctr.GetName(), "left in the shared pool at synchronization: "+err.Error())
		}
	}
	return p.poolUpdates(ctx, true), nil
}

// CreateContainer registers an annotated container and returns its cpuset and memory nodes.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	c, err := p.admit(ctx, pod, ctr, false)
	if err != nil {
		if p.cfg.FailPolicy == FailClosed {
			p.event(podName(pod), ctr.GetName(), "refused (fail-closed): "+err.Error())
			return nil, nil, err
		}
		p.event(podName(pod), ctr.GetName(), "starts in the shared pool (fail-open): "+err.Error())
	}
	if c != nil && c.task == nil {
		p.joinPool(ctx, c)
	}
	adj := &api.ContainerAdjustment{}
	p.mu.Lock()
	if c != nil { // read and marked in one step, so no upcall falls between the adjustment and UpdateContainers
		if c.cpus != "" {
			adj.SetLinuxCPUSetCPUs(c.cpus)
			if c.mems != "" {
				adj.SetLinuxCPUSetMems(c.mems)
			}
		}
		c.created = true
	}
	p.mu.Unlock()
	return adj, p.poolUpdates(ctx, false), nil
}

// UpdateContainer keeps the plugin's cpuset over a resize that would overwrite it.
func (p *Plugin) UpdateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.containers[ctr.GetId()]
	if c == nil || c.cpus == "" {
		return nil, nil
	}
	return []*api.ContainerUpdate{cpusetUpdate(c.id, c.cpus, c.mems)}, nil
}

// StopContainer deregisters a COD container's task; its CPUs return to the pool.
func (p *Plugin) StopContainer(ctx context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.forget(ctx, ctr.GetId())
	return p.poolUpdates(ctx, false), nil
}

// RemoveContainer forgets a container (deregistering it if StopContainer did not).
func (p *Plugin) RemoveContainer(ctx context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.forget(ctx, ctr.GetId())
	return nil
}

// admit makes the container known: a COD task when annotated, else a pool member.
// It returns the container with its cpuset, and the registration's error if any.
func (p *Plugin) admit(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, created bool) (*container, error) {
	c := &container{id: ctr.GetId(), name: ctr.GetName(), pod: podName(pod), created: created}
	req, aerr := annotations.ForContainer(pod.GetAnnotations(), ctr.GetName(), wholeCPURequest(ctr))
	var err error
	var t *task
	if aerr != nil {
		err = aerr
	} else if req != nil {
		t, err = p.register(ctx, taskName(pod, ctr), req, c)
	}
	p.mu.Lock()
	if t != nil {
		c.task = t
		if c.cpus == "" { // an upcall may have set them already
			c.cpus, c.mems = t.cpuset()
		}
	}
	if old := p.containers[c.id]; old != nil && old.task != nil && old.task != c.task {
		defer old.task.close()
	}
	p.containers[c.id] = c
	p.mu.Unlock()
	if err != nil && p.cfg.FailPolicy == FailClosed && req != nil {
		p.mu.Lock()
		delete(p.containers, c.id)
		p.mu.Unlock()
	}
	return c, err
}

func (p *Plugin) forget(ctx context.Context, id string) {
	p.mu.Lock()
	c := p.containers[id]
	delete(p.containers, id)
	if c != nil {
		c.stopping = true
	}
	p.mu.Unlock()
	if c != nil && c.task != nil {
		c.task.deregister(ctx, p.cfg.RMTimeout)
	}
}

// errNoRM wraps a failure to reach the RM within the timeout.
var errNoRM = errors.New("the COD RM did not answer")

func cpusetUpdate(id, cpus, mems string) *api.ContainerUpdate {
	u := &api.ContainerUpdate{}
	u.SetContainerId(id)
	u.SetLinuxCPUSetCPUs(cpus)
	if mems != "" {
		u.SetLinuxCPUSetMems(mems)
	}
	return u
}

func (c *container) String() string { return fmt.Sprintf("%s/%s (%s)", c.pod, c.name, c.id) }
