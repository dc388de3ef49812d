// Command cod-nri is COD's NRI plugin: run it on each node beside containerd
// (or CRI-O) and the COD Resource Manager (docs/kubernetes.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/containerd/nri/pkg/stub"

	"github.com/cod-dbos/cod/clients/nri/plugin"
)

func main() {
	rmSocket := flag.String("rm-socket", "/run/cod/rm.sock", "the COD RM's Unix socket")
	failPolicy := flag.String("fail-policy", "open", "when registration fails: open (shared pool) or closed (refuse the container)")
	rmTimeout := flag.Duration("rm-timeout", 2*time.Second, "the longest container creation waits for the RM")
	nriSocket := flag.String("nri-socket", "", "the runtime's NRI socket (default: NRI's own default)")
	name := flag.String("name", "cod", "the plugin's name")
	idx := flag.String("idx", "90", "the plugin's index (order among NRI plugins)")
	flag.Parse()
	if *failPolicy != string(plugin.FailOpen) && *failPolicy != string(plugin.FailClosed) {
		fmt.Fprintf(os.Stderr, "cod-nri: --fail-policy must be open or closed, not %q\n", *failPolicy)
		os.Exit(2)
	}
	logger := log.New(os.Stderr, "", log.LstdFlags)
	p := plugin.New(plugin.Config{RMSocket: *rmSocket, FailPolicy: plugin.FailPolicy(*failPolicy),
		RMTimeout: *rmTimeout, Logger: logger})
	opts := []stub.Option{stub.WithPluginName(*name), stub.WithPluginIdx(*idx)}
	if *nriSocket != "" {
		opts = append(opts, stub.WithSocketPath(*nriSocket))
	}
	s, err := stub.New(p, opts...)
	if err != nil {
		logger.Fatalf("cod-nri: %v", err)
	}
	p.SetUpdater(s)
	defer p.Close()
	if err := s.Run(context.Background()); err != nil {
		logger.Fatalf("cod-nri: %v", err)
	}
}
