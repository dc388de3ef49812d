package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/cod-dbos/cod/clients/nri/annotations"
	"github.com/cod-dbos/cod/clients/nri/rmclient"
)

// allocation is the part of the RM's allocation the plugin enforces (docs/protocol.md, "An allocation").
type allocation struct {
	Task        string `json:"task"`
	Epoch       int64  `json:"epoch"`
	Cores       []int  `json:"cores"`
	MemoryNodes []int  `json:"memory_nodes"`
	Removed     []int  `json:"removed"`
}

// task is one container's COD task: its own connection (so its facts live in
// its own application namespace and its upcalls arrive there).
type task struct {
	p         *Plugin
	name      string
	req       *annotations.Request
	container *container // guarded by p.mu

	mu       sync.Mutex
	conn     *rmclient.Conn
	alloc    allocation
	gone     bool
	hasCores chan struct{} // closed once the allocation gives the task a CPU
}

func (t *task) cpuset() (string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return formatCPUList(t.alloc.Cores), formatCPUList(t.alloc.MemoryNodes)
}

// register connects as the task's application and registers it, enforced by this plugin.
// A newcomer whose CPUs are still being released by others waits for them (at most
// RMTimeout): the plugin applies and acknowledges the others' shrink at once.
func (p *Plugin) register(ctx context.Context, name string, req *annotations.Request, c *container) (*task, error) {
	t := &task{p: p, name: name, req: req, container: c, hasCores: make(chan struct{})}
	if err := t.connect(ctx); err != nil {
		return nil, err
	}
	t.noteCores()
	go t.follow(t.conn)
	select {
	case <-t.hasCores:
	case <-time.After(p.cfg.RMTimeout):
		p.cfg.Logger.Printf("cod-nri: task %s has no CPU yet after %s: it starts without a cpuset of its own", name, p.cfg.RMTimeout)
	case <-ctx.Done():
	}
	return t, nil
}

// noteCores wakes register once the task holds a CPU.
func (t *task) noteCores() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.alloc.Cores) > 0 {
		select {
		case <-t.hasCores:
		default:
			close(t.hasCores)
		}
	}
}

func (t *task) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, t.p.cfg.RMTimeout)
	defer cancel()
	conn, err := rmclient.Dial(ctx, t.p.cfg.RMSocket, t.name)
	if err != nil {
		return fmt.Errorf("%w within %s: %v", errNoRM, t.p.cfg.RMTimeout, err)
	}
	params := map[string]any{"name": t.name, "enforced_by": "client", "properties": t.req.Properties}
	if len(t.req.Facts) > 0 {
		params["facts"] = t.req.Facts
	}
	if len(t.req.Procedures) > 0 {
		params["procedures"] = t.req.Procedures
	}
	var reply struct {
		Allocation allocation `json:"allocation"`
	}
	if err := conn.Call(ctx, "register_task", params, &reply); err != nil {
		conn.Close()
		return fmt.Errorf("registration of %s refused: %w", t.name, err)
	}
	t.mu.Lock()
	t.conn, t.alloc = conn, reply.Allocation
	t.mu.Unlock()
	return nil
}

// follow applies the task's allocation upcalls until its connection ends, then reconnects.
func (t *task) follow(conn *rmclient.Conn) {
	for up := range conn.Upcalls() {
		if up.Method != "allocation_changed" {
			continue
		}
		var a allocation
		if err := json.Unmarshal(up.Params, &a); err != nil || a.Task != t.name {
			continue
		}
		t.apply(a, up.At)
	}
	t.reconnect()
}

// apply gives the container its new CPUs, then tells the RM the removed ones are free.
func (t *task) apply(a allocation, readAt time.Time) {
	t.mu.Lock()
	if a.Epoch < t.alloc.Epoch || t.gone {
		t.mu.Unlock()
		return
	}
	t.alloc = a
	conn := t.conn
	t.mu.Unlock()
	t.noteCores()
	p := t.p
	p.mu.Lock()
	c := t.container
	var update *api.ContainerUpdate
	if c != nil && !c.stopping && len(a.Cores) > 0 {
		c.cpus, c.mems = formatCPUList(a.Cores), formatCPUList(a.MemoryNodes)
		if c.created { // else CreateContainer's adjustment carries them
			update = cpusetUpdate(c.id, c.cpus, c.mems)
		}
	}
	p.mu.Unlock()
	if update != nil && p.updater != nil {
		if err := p.push(c, update); err != nil {
			p.event(c.pod, c.name, "the runtime refused the new cpuset "+c.cpus+": "+err.Error())
			return // not acked: the RM takes the CPUs back at its deadline
		}
		p.mu.Lock()
		p.latencies = append(p.latencies, time.Since(readAt))
		p.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.RMTimeout)
	defer cancel()
	_ = conn.Call(ctx, "ack_allocation", map[string]any{"task": t.name, "epoch": a.Epoch}, nil)
	p.applyPool(ctx)
}

// push gives the runtime one container's update, again while the runtime reports it failed
// (a container the runtime is still creating) and the container is still wanted.
func (p *Plugin) push(c *container, u *api.ContainerUpdate) error {
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		var failed []*api.ContainerUpdate
		failed, err = p.updater.UpdateContainers([]*api.ContainerUpdate{u})
		if err == nil && len(failed) == 0 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("the runtime could not update container %s", c.id)
		}
		p.mu.Lock()
		stopping := c.stopping
		p.mu.Unlock()
		if stopping {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// reconnect registers the task again after its connection ended (the RM restarted), with back-off.
func (t *task) reconnect() {
	delay := 50 * time.Millisecond
	for {
		t.mu.Lock()
		gone := t.gone
		t.mu.Unlock()
		t.p.mu.Lock()
		closed := t.p.closed
		t.p.mu.Unlock()
		if gone || closed {
			return
		}
		time.Sleep(delay)
		if err := t.connect(context.Background()); err == nil {
			t.mu.Lock()
			conn, a := t.conn, t.alloc
			t.mu.Unlock()
			t.p.cfg.Logger.Printf("cod-nri: task %s registered again (CPUs %s)", t.name, formatCPUList(a.Cores))
			t.apply(a, time.Now())
			go t.follow(conn)
			return
		} else if !errors.Is(err, errNoRM) {
			t.p.cfg.Logger.Printf("cod-nri: task %s: %v", t.name, err)
		}
		if delay < 2*time.Second {
			delay *= 2
		}
	}
}

// deregister ends the task; closing its connection is enough for the RM to forget it.
func (t *task) deregister(ctx context.Context, timeout time.Duration) {
	t.mu.Lock()
	t.gone = true
	conn := t.conn
	t.mu.Unlock()
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_ = conn.Call(ctx, "deregister_task", map[string]any{"task": t.name}, nil)
	conn.Close()
}

func (t *task) close() {
	t.mu.Lock()
	t.gone = true
	conn := t.conn
	t.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}
