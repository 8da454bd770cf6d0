// pause holds a pod sandbox's namespaces for the real node's pods. It does nothing but wait: it
// reaps orphaned children (it is PID 1 when the pod shares a process namespace) and exits on
// SIGINT or SIGTERM. Built by harness/backends/local/realnode/images.py into the pause image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
