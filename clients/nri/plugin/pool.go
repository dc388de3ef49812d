package plugin

import (
	"context"
	"sort"

	"github.com/containerd/nri/pkg/api"

	"github.com/cod-dbos/cod/clients/nri/rmclient"
)

// sharedPool asks the RM which CPUs no task or elastic group holds exclusively.
// The plugin's own privileged connection reads list_tasks; it is opened per call
// so that an RM restart needs no bookkeeping here.
func (p *Plugin) sharedPool(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RMTimeout)
	defer cancel()
	conn, err := rmclient.Dial(ctx, p.cfg.RMSocket, "")
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var topo struct {
		Machine struct {
			AllowedCPUs []int `json:"allowed_cpus"` // null for a reference machine: all of its PUs
			PUs         []struct {
				ID     int  `json:"id"`
				Online bool `json:"online"`
			} `json:"pus"`
		} `json:"machine"`
	}
	if err := conn.Call(ctx, "get_topology", nil, &topo); err != nil {
		return "", err
	}
	var list struct {
		Tasks []struct {
			Cores      []int          `json:"cores"`
			Properties map[string]any `json:"properties"`
		} `json:"tasks"`
		Groups []struct {
			Cores []int `json:"cores"`
		} `json:"elastic_groups"`
	}
	if err := conn.Call(ctx, "list_tasks", nil, &list); err != nil {
		return "", err
	}
	taken := map[int]bool{}
	for _, t := range list.Tasks {
		if excl, ok := t.Properties["exclusive"].(bool); ok && !excl {
			continue
		}
		for _, c := range t.Cores {
			taken[c] = true
		}
	}
	for _, g := range list.Groups {
		for _, c := range g.Cores {
			taken[c] = true
		}
	}
	all := topo.Machine.AllowedCPUs
	if all == nil {
		for _, pu := range topo.Machine.PUs {
			if pu.Online {
				all = append(all, pu.ID)
			}
		}
	}
	pool := without(all, taken)
	if len(pool) == 0 { // every CPU is held: the pool shares all of them rather than none
		pool = all
	}
	return formatCPUList(pool), nil
}

// poolUpdates sets every shared-pool container to the current pool: all of them
// when force is set (synchronization), else those whose cpuset differs.
func (p *Plugin) poolUpdates(ctx context.Context, force bool) []*api.ContainerUpdate {
	pool, err := p.sharedPool(ctx)
	var updates []*api.ContainerUpdate
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.containers))
	for id := range p.containers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c := p.containers[id]
		switch {
		case c.task != nil:
			if force && c.cpus != "" {
				updates = append(updates, cpusetUpdate(c.id, c.cpus, c.mems))
			}
		case err == nil && (force || c.cpus != pool):
			c.cpus = pool
			updates = append(updates, cpusetUpdate(c.id, c.cpus, ""))
		}
	}
	return updates
}

// applyPool pushes the shared pool's change to the runtime after an allocation changed.
func (p *Plugin) applyPool(ctx context.Context) {
	updates := p.poolUpdates(ctx, false)
	if len(updates) > 0 && p.updater != nil {
		_, _ = p.updater.UpdateContainers(updates)
	}
}

// joinPool gives a new shared-pool container the current pool (all CPUs when the RM cannot say).
func (p *Plugin) joinPool(ctx context.Context, c *container) {
	pool, err := p.sharedPool(ctx)
	if err != nil {
		p.cfg.Logger.Printf("cod-nri: %s keeps the runtime's CPUs: the shared pool is unknown: %v", c, err)
		return
	}
	p.mu.Lock()
	c.cpus = pool
	p.mu.Unlock()
}
